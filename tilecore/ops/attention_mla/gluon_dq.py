"""MLA prefill's dQ on Hopper (q/k head dim 192, v's 128; issue 35): the Gluon dQ kernel
(:mod:`tilecore.ops.attention_backward.gluon_dq`) with Q's and dO's pieces the tile's shared buffers and K's
and V's the stage's, 64 columns each; its head, setup, start and dS are AttentionDQ's, called on this
op's struct. Runs after :mod:`tilecore.ops.attention_mla.gluon_backward`'s dK and dV."""
from triton.experimental import gluon

from tilecore.tiles.gluon.compat import gl, tma, warpgroup_mma, warpgroup_mma_wait
from tilecore.ops.attention_backward.gluon_dq import AttentionDQ
from tilecore.ops.attention_mla.gluon_backward import load_pieces
from tilecore.tiles.gluon import Layout, TileOperand, ring, run, stage_struct, store_block, struct, wgmma_layout

@stage_struct
class KVPieces:
    """One stage at q/k head dim 192 and v's 128: K's three 64-column pieces, V's two (no power-of-two
    TMA box or shared buffer holds 192 columns)."""
    k0: object  # [1, 1, BN, 64]
    k1: object
    k2: object
    v0: object
    v1: object


@struct
class DQPieces:
    """A consumer's dQ accumulator in three [BM, 64] pieces."""
    dq0: object
    dq1: object
    dq2: object


@struct
class AttentionDQPieces:
    """AttentionDQ at q/k head dim 192 and v's 128 (MLA prefill): the same tiles, steps, masks, window
    and softcap (``base``, an AttentionDQ whose D is a piece's 64 columns and whose descriptors are the
    pieces': its setup, start and ds_operand), with Q's three and dO's two pieces the tile's five shared
    buffers and K's three and V's two the stage's; S and dP chained wgmma over the pieces, dQ one
    accumulator a piece (96 registers a thread, S and dP 32 each)."""
    base: object  # AttentionDQ (q_desc's box [1, 1, 2 BM, 64]: both consumers' rows; k_desc's [1, 1, BN, 64])

    @gluon.jit
    def setup(self, tile_id):
        return AttentionDQ.setup(self.base, tile_id)

    @gluon.jit
    def load(self, stage, bar, tile, step):
        """Step ``step``'s K and V pieces (rows past Nk arrive as zeros)."""
        op = self.base
        b, h, hk = op.head(tile.bh)
        key = (tile.first_block + step) * op.BN if op.WINDOW else step * op.BN
        tma.async_copy_global_to_shared(op.k_desc, [b, hk, key, 0], bar, stage.k0)
        tma.async_copy_global_to_shared(op.k_desc, [b, hk, key, 64], bar, stage.k1)
        tma.async_copy_global_to_shared(op.k_desc, [b, hk, key, 128], bar, stage.k2)
        tma.async_copy_global_to_shared(op.v_desc, [b, hk, key, 0], bar, stage.v0)
        tma.async_copy_global_to_shared(op.v_desc, [b, hk, key, 64], bar, stage.v1)

    @gluon.jit
    def load_tile(self, bufs, bar, tile, consumer):
        """Both consumers' query rows of Q's pieces (buffers 0-2) and dO's (3-4); rows past N: zeros."""
        op = self.base
        b, h, hk = op.head(tile.bh)
        load_pieces(op.q_desc, op.do_desc, [b, h, tile.first], bar, bufs)

    @gluon.jit
    def start(self, ctx, tile, prev):
        st = AttentionDQ.start(self.base, ctx, tile, prev)  # its dq: one [BM, 64] zero piece
        return st.replace(dq=DQPieces(st.dq, st.dq, st.dq))

    @gluon.jit
    def rows(self, ctx, piece: gl.constexpr):
        """This consumer's BM rows of the tile operand's buffer ``piece`` (Q's 0-2, dO's 3-4)."""
        BM: gl.constexpr = self.base.BM
        return ctx.operand.index(piece).reshape([2 * BM, 64]).slice(ctx.index * BM, BM)

    @gluon.jit
    def compute(self, ctx, st, stage, tile, step):
        op = self.base
        BM: gl.constexpr = op.BM
        BN: gl.constexpr = op.BN
        s_layout: gl.constexpr = wgmma_layout(BM, BN, gl.num_warps())
        dq = st.dq
        if (step < st.n_own) & (step >= st.own_first):  # as AttentionDQ.compute
            k0 = stage.k0.reshape([BN, 64])
            k1 = stage.k1.reshape([BN, 64])
            k2 = stage.k2.reshape([BN, 64])
            zeros = gl.zeros([BM, BN], gl.float32, s_layout)
            s_tok = warpgroup_mma(self.rows(ctx, 0), k0.permute((1, 0)), zeros, use_acc=False, is_async=True)
            s_tok = warpgroup_mma(self.rows(ctx, 1), k1.permute((1, 0)), s_tok, is_async=True)
            s_tok = warpgroup_mma(self.rows(ctx, 2), k2.permute((1, 0)), s_tok, is_async=True)
            dp_tok = warpgroup_mma(self.rows(ctx, 3), stage.v0.reshape([BN, 64]).permute((1, 0)), zeros, use_acc=False,
                                   is_async=True)
            dp_tok = warpgroup_mma(self.rows(ctx, 4), stage.v1.reshape([BN, 64]).permute((1, 0)), dp_tok,
                                   is_async=True)
            if op.SOFTCAP:
                s, dp = warpgroup_mma_wait(0, deps=(s_tok, dp_tok))
                ds_op = AttentionDQ.ds_operand(op, s, dp, st, tile, step)
            else:
                s = warpgroup_mma_wait(2, deps=(s_tok,))  # dP's two groups may still run
                ds_op = AttentionDQ.ds_operand(op, s, dp_tok, st, tile, step)  # (its D: a piece's 64)
            dq0 = warpgroup_mma(ds_op, k0, dq.dq0, is_async=True)
            dq1 = warpgroup_mma(ds_op, k1, dq.dq1, is_async=True)
            dq2 = warpgroup_mma(ds_op, k2, dq.dq2, is_async=True)
            dq0, dq1, dq2 = warpgroup_mma_wait(0, deps=(dq0, dq1, dq2))
            dq = DQPieces(dq0, dq1, dq2)
        return st.replace(dq=dq)

    @gluon.jit
    def wait(self, ctx, st):
        return st  # every step ends with its wgmma complete

    @gluon.jit
    def finish(self, ctx, st, tile):
        """dQ * scale of this consumer's rows, piece by piece (rows past N clipped by the TMA stores)."""
        op = self.base
        b, h, hk = op.head(tile.bh)
        store_block(st.dq.dq0, op.dq_desc, ctx.out, [b, h, st.first, 0], op.scale)
        store_block(st.dq.dq1, op.dq_desc, ctx.out, [b, h, st.first, 64], op.scale)
        store_block(st.dq.dq2, op.dq_desc, ctx.out, [b, h, st.first, 128], op.scale)


@gluon.jit
def attention_dq_mla_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, lse_ptr, delta_ptr, H, N, Nk, GROUP, scale,
                            scale_log2e, num_bh, head_group, schedule, left, right, tanh_scale,
                            CAUSAL: gl.constexpr, STAGES: gl.constexpr, WINDOW: gl.constexpr = False,
                            SOFTCAP: gl.constexpr = 0):
    """dQ at q/k head dim 192 and v's 128 (AttentionDQPieces) for every (2 query blocks, batch * head);
    attention_dq_kernel's grid and options. Every descriptor's box is 64 columns wide; q_desc's and
    do_desc's hold both consumers' rows."""
    gl.static_assert(not (WINDOW and CAUSAL), "causal is folded into the window")
    BM: gl.constexpr = dq_desc.block_type.shape[2]
    gl.static_assert(q_desc.block_type.shape[2] == 2 * BM, "a tile is both consumers' query rows")
    gl.static_assert(q_desc.block_type.shape[3] == 64 and k_desc.block_type.shape[3] == 64, "64-column pieces")
    op = AttentionDQPieces(AttentionDQ(q_desc, k_desc, v_desc, do_desc, dq_desc, lse_ptr, delta_ptr, H, N, Nk, GROUP,
                                       scale, scale_log2e, num_bh, head_group, left, right, tanh_scale, CAUSAL, BM,
                                       k_desc.block_type.shape[2], 64, WINDOW, SOFTCAP))
    layout = Layout(dq_desc, STAGES, CONSUMERS=2, LATE_RELEASE=0, schedule=schedule,
                    tile_operand=TileOperand(q_desc, COUNT=5, SHARED=True))
    run(op, layout, KVPieces(ring(k_desc, STAGES), ring(k_desc, STAGES), ring(k_desc, STAGES), ring(v_desc, STAGES),
                             ring(v_desc, STAGES)), gl.cdiv(N, 2 * BM) * num_bh)
