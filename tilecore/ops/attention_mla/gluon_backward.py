"""MLA prefill's backward on Hopper (q/k head dim 192, v's 128; issue 35): dK and dV by 64-column
pieces, the fixed-length Gluon backward (:mod:`tilecore.ops.attention_backward.gluon_backward`) with every
192- or 128-column operand in pieces (no power-of-two TMA box or shared buffer holds 192 columns).
Its tiles, walk, masks, window and softcap are AttentionBackward's, called on this op's struct; dQ
comes after it from :mod:`tilecore.ops.attention_mla.gluon_dq` (attention's launch.py runs both where
plan.gluon_backward_dims routes MLA's sizes)."""
from triton.experimental import gluon

from tilecore.tiles.gluon.compat import gl, tma, warpgroup_mma, warpgroup_mma_wait
from tilecore.tiles.gluon import Layout, TileOperand, ring, run, stage_struct, store_block, struct, wgmma_layout
from tilecore.ops.attention_backward.gluon_backward import AttentionBackward, operand_layout, stat_columns

@stage_struct
class QStagePieces:
    """One stage at q/k head dim 192 and v's 128: Q's three 64-column pieces, the rows' lse and
    delta, dO's two (no power-of-two TMA box or shared buffer holds 192 columns)."""
    q0: object
    q1: object
    q2: object
    stats: object
    do0: object
    do1: object


@gluon.jit
def load_pieces(desc3, desc2, at, bar, bufs):
    """Rows ``at`` ([batch, head, first row]) of a 192-column operand's three 64-column pieces (desc3) into
    buffers 0-2 of ``bufs`` and of a 128-column one's two (desc2) into 3-4, by TMA on ``bar`` (the MLA
    kernels' tile operands: K and V in the dK/dV kernel, Q and dO in the dq kernel)."""
    for j in gl.static_range(3):
        tma.async_copy_global_to_shared(desc3, [at[0], at[1], at[2], 64 * j], bar, bufs.index(j))
    for j in gl.static_range(2):
        tma.async_copy_global_to_shared(desc2, [at[0], at[1], at[2], 64 * j], bar, bufs.index(3 + j))


@struct
class GradPieces:
    """A consumer's dK (three [BN, 64] pieces) and dV (two) accumulators."""
    dk0: object
    dk1: object
    dk2: object
    dv0: object
    dv1: object


@struct
class AttentionBackwardPieces:
    """AttentionBackward at q/k head dim 192 and v's 128 (MLA prefill), dK and dV only (dQ by a kernel
    after this one): the same tiles, walk, masks, window and softcap (``base``, an AttentionBackward over
    the pieces' descriptors without dQ: its setup, step_rows and probabilities), with every 192- or
    128-column operand in 64-column pieces: K's three and V's two are the tile operand's five shared
    buffers, Q's and dO's the stage's; S^T and dP^T are chained wgmma over the pieces, dK and dV one
    accumulator a piece. Registers: dK 96 and dV 64 a thread, S^T and dP^T 32 each (D128's fused dQ mode
    holds as many)."""
    base: object  # AttentionBackward (q_desc's box [1, 1, BM, 64]; k_desc's [1, 1, 2 BN, 64]: both consumers' keys)

    @gluon.jit
    def setup(self, tile_id):
        return self.base.setup(tile_id)

    @gluon.jit
    def load(self, stage, bar, tile, step):
        """The step's Q and dO pieces and its rows' lse and delta (rows past N arrive as zeros)."""
        op = self.base
        b, hk = op.tile_kv_head(tile)
        h, start_m = op.step_rows(tile, step)
        tma.async_copy_global_to_shared(op.q_desc, [b, h, start_m, 0], bar, stage.q0)
        tma.async_copy_global_to_shared(op.q_desc, [b, h, start_m, 64], bar, stage.q1)
        tma.async_copy_global_to_shared(op.q_desc, [b, h, start_m, 128], bar, stage.q2)
        tma.async_copy_global_to_shared(op.do_desc, [b, h, start_m, 0], bar, stage.do0)
        tma.async_copy_global_to_shared(op.do_desc, [b, h, start_m, 64], bar, stage.do1)
        tma.async_copy_global_to_shared(op.stats_desc, [b * op.H + h, 0, start_m], bar, stage.stats)

    @gluon.jit
    def load_tile(self, kv_smem, bar, tile, consumer):
        """The tile's K pieces (buffers 0-2) and V pieces (3-4); rows past Nk arrive as zeros."""
        op = self.base
        b, hk = op.tile_kv_head(tile)
        load_pieces(op.k_desc, op.v_desc, [b, hk, tile.start_n], bar, kv_smem)

    @gluon.jit
    def start(self, ctx, tile, prev):
        op = self.base
        acc_layout: gl.constexpr = wgmma_layout(op.BN, 64, gl.num_warps())
        zero = gl.zeros([op.BN, 64], gl.float32, acc_layout)
        return GradPieces(zero, zero, zero, zero, zero)

    @gluon.jit
    def key_rows(self, ctx, piece: gl.constexpr):
        """This consumer's BN rows of the tile operand's buffer ``piece`` (K's 0-2, V's 3-4)."""
        op = self.base
        return ctx.operand.index(piece).reshape([2 * op.BN, 64]).slice(ctx.index * op.BN, op.BN)

    @gluon.jit
    def step_start(self, ctx, stage, tile, step):
        """A step's start: the step's first row and this consumer's first key, Q's three and dO's two [BM, 64]
        pieces, a zero [BN, BM] tile, and S^T = sum_j K_j Q_j^T issued (its token: not waited)."""
        op = self.base
        BM: gl.constexpr = op.BM
        BN: gl.constexpr = op.BN
        h, start_m = op.step_rows(tile, step)
        start_n = tile.start_n + ctx.index * BN
        q0 = stage.q0.reshape([BM, 64])
        q1 = stage.q1.reshape([BM, 64])
        q2 = stage.q2.reshape([BM, 64])
        do0 = stage.do0.reshape([BM, 64])
        do1 = stage.do1.reshape([BM, 64])
        zeros = gl.zeros([BN, BM], gl.float32, wgmma_layout(BN, BM, gl.num_warps()))
        s_tok = warpgroup_mma(self.key_rows(ctx, 0), q0.permute((1, 0)), zeros, use_acc=False, is_async=True)
        s_tok = warpgroup_mma(self.key_rows(ctx, 1), q1.permute((1, 0)), s_tok, is_async=True)
        s_tok = warpgroup_mma(self.key_rows(ctx, 2), q2.permute((1, 0)), s_tok, is_async=True)
        return start_m, start_n, q0, q1, q2, do0, do1, zeros, s_tok

    @gluon.jit
    def compute(self, ctx, st, stage, tile, step):
        """One step of 64 query rows (block_m 64): S^T = sum_j K_j Q_j^T, waited; P^T (with a softcap P^T times the
        cap's derivative 1 - tanh^2) kept in float16 and P^T's register operand made; dP^T = sum_j V_j dO_j^T and dV_j += P^T dO_j
        issued, dP^T waited for alone; dS^T from the float16 P^T and its operand while dV runs; dK_j += dS^T Q_j.
        S^T and dP^T (32 registers a thread each at 64 rows) are never live together: beside dK's 96 and dV's 64
        both spilled 820 B and serialized every wgmma; dP^T first, then S^T, 784 B (sm_90a). Each wgmma's B
        operand (a [64, 64] piece of Q or dO) serves 64 query rows: ~25% fewer shared-memory bytes per FLOP than
        a step of 32 rows (notes/attention). sm_90a causal 172 B spilled (6 scalar spill instructions in the
        step), not serialized; dV waited for with dK (without it under dP^T: 36 B, and slower on the H100)."""
        op = self.base
        BM: gl.constexpr = op.BM
        BN: gl.constexpr = op.BN
        st_layout: gl.constexpr = wgmma_layout(BN, BM, gl.num_warps())
        start_m, start_n, q0, q1, q2, do0, do1, zeros, s_tok = self.step_start(ctx, stage, tile, step)
        s_t = warpgroup_mma_wait(0, deps=(s_tok,))
        p_t, dtanh = op.probabilities(s_t, stat_columns(stage.stats, 0, st_layout), start_n, start_m, tile)
        if op.SOFTCAP:  # dS^T's P^T (1 - tanh^2): one float16 tile kept while dP^T runs, not two
            p16 = (p_t * dtanh.to(gl.float32)).to(gl.float16)
        else:
            p16 = p_t.to(gl.float16)  # P^T kept in 16 bits while dP^T runs (16 registers a thread against 32)
        dp_tok = warpgroup_mma(self.key_rows(ctx, 3), do0.permute((1, 0)), zeros, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(self.key_rows(ctx, 4), do1.permute((1, 0)), dp_tok, is_async=True)
        # P^T's operand is written before dV's products are issued (with no wgmma reading it yet); ptxas keeps the
        # wgmma unserialized with dS^T's operand written while dV runs (sm_90a, checked by test_mla_gluon)
        p_op = gl.convert_layout(p_t.to(stage.q0.dtype), operand_layout(BN, 64, gl.num_warps()))
        dv0 = warpgroup_mma(p_op, do0, st.dv0, is_async=True)
        dv1 = warpgroup_mma(p_op, do1, st.dv1, is_async=True)
        dp_t = warpgroup_mma_wait(2, deps=(dp_tok,))  # dV's two groups may still run
        ds_t = p16.to(gl.float32) * (dp_t - gl.expand_dims(stat_columns(stage.stats, 1, st_layout), 0))
        ds_op = gl.convert_layout(ds_t.to(stage.q0.dtype), operand_layout(BN, 64, gl.num_warps()))
        dk0 = warpgroup_mma(ds_op, q0, st.dk0, is_async=True)
        dk1 = warpgroup_mma(ds_op, q1, st.dk1, is_async=True)
        dk2 = warpgroup_mma(ds_op, q2, st.dk2, is_async=True)
        dk0, dk1, dk2, dv0, dv1 = warpgroup_mma_wait(0, deps=(dk0, dk1, dk2, dv0, dv1))
        return GradPieces(dk0, dk1, dk2, dv0, dv1)

    @gluon.jit
    def wait(self, ctx, st):
        return st  # every step ends with its wgmma complete

    @gluon.jit
    def finish(self, ctx, st, tile):
        """dV's pieces, then dK's (times the scale); rows past Nk clipped by the TMA stores."""
        op = self.base
        b, hk = op.tile_kv_head(tile)
        start_n = tile.start_n + ctx.index * op.BN
        store_block(st.dv0, op.dv_desc, ctx.out, [b, hk, start_n, 0])
        store_block(st.dv1, op.dv_desc, ctx.out, [b, hk, start_n, 64])
        store_block(st.dk0 * op.scale, op.dk_desc, ctx.out, [b, hk, start_n, 0])
        store_block(st.dk1 * op.scale, op.dk_desc, ctx.out, [b, hk, start_n, 64])
        store_block(st.dk2 * op.scale, op.dk_desc, ctx.out, [b, hk, start_n, 128])


@gluon.jit
def attention_bwd_mla_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, stats_desc, H, N, Nk, GROUP, scale,
                             scale_log2e, num_bhk, head_group, schedule, left, right, tanh_scale,
                             CAUSAL: gl.constexpr, STAGES: gl.constexpr, WINDOW: gl.constexpr = False,
                             SOFTCAP: gl.constexpr = 0):
    """dK and dV at q/k head dim 192 and v's 128 (AttentionBackwardPieces) for every (key block,
    batch * kv head); a persistent grid of 2 consumer warpgroups and a producer warp, tiles from
    ``schedule`` (a balanced table) or round-robin. Every descriptor's box is 64 columns wide; a step is
    64 query rows (q_desc's block_m)."""
    gl.static_assert(not (WINDOW and CAUSAL), "causal is folded into the window")
    BM: gl.constexpr = q_desc.block_type.shape[2]
    gl.static_assert(BM == 64, "a step of 64 query rows (AttentionBackwardPieces.compute)")
    BN: gl.constexpr = dk_desc.block_type.shape[2]
    gl.static_assert(k_desc.block_type.shape[2] == 2 * BN, "K and V blocks hold both consumers' keys")
    gl.static_assert(q_desc.block_type.shape[3] == 64 and dk_desc.block_type.shape[3] == 64,
                     "64-column pieces: q/k 192 = 3 x 64, v 128 = 2 x 64")
    # AttentionBackward without dQ (its dq_desc, dS buffers and dQ staging unused: None), D a piece's 64
    op = AttentionBackwardPieces(AttentionBackward(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, stats_desc, None,
                                                   H, N, Nk, GROUP, scale, scale_log2e, num_bhk, head_group, None,
                                                   None, None, None, left, right, tanh_scale, CAUSAL, BM, BN, 64, 0,
                                                   False, WINDOW, SOFTCAP, False))
    layout = Layout(dk_desc, STAGES, CONSUMERS=2, CONSUMER_REGS=240, PRODUCER_REGS=24, LATE_RELEASE=0,
                    tile_operand=TileOperand(k_desc, COUNT=5, SHARED=True), schedule=schedule)
    stages = QStagePieces(ring(q_desc, STAGES), ring(q_desc, STAGES), ring(q_desc, STAGES), ring(stats_desc, STAGES),
                          ring(do_desc, STAGES), ring(do_desc, STAGES))
    run(op, layout, stages, gl.cdiv(Nk, 2 * BN) * num_bhk)
