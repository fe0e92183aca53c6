"""MLA prefill's dK / dV on Hopper with 64 query rows a step (q/k head dim 192, v's 128; issue 35, session 31):
a candidate to the 32-row kernel (gluon_backward.AttentionBackwardPieces), not routed: on the H100 (session 31,
notes/attention/runs/mla_roles_run3_session31_h100.txt) right in 8 float64 checks (errors the 32-row kernel's to two
digits) and, at STAGES 3, at its speed (dK/dV alone 4.824 vs 4.884 ms non-causal, 2.719 vs 2.640 causal, B8 H16
N4096; fwd+bwd 0.884x / 0.885x the 128/128 rate against 0.853x / 0.856x, within the run's spread). STAGES 2: slower.

At 64 rows a step one warpgroup holding a key block's dK (64 x 192: 96 registers a thread) and dV (64 x 128: 64)
with S^T and dP^T (32 each) spills and has ptxas serialize its wgmma (session 27: 820 B). Here the two consumer
warpgroups share one tile of BN = 64 keys and split the step's matmuls by role, so each holds half of them:

    consumer 0 (S):   S^T = K Q^T (three 64-column pieces), P^T (mask, lse), P^T to shared memory, dV += P^T dO
    consumer 1 (dP):  dP^T = V dO^T (two pieces), P^T from shared memory, dS^T = P^T (dP^T - delta), dK += dS^T Q

Each does 20 wgmma of 64 x 64 x 16 a step (S 12 + dV 8; dP 8 + dK 12). Registers: consumer 0 dV 64 + S^T 32,
consumer 1 dK 96 + dP^T 32. P^T goes through a double-buffered float32 [BN, BM] buffer (P rounded nowhere that
the 32-row kernel does not round it) with two mbarriers a buffer: written (consumer 0), read (consumer 1).
The products have N = 64 (S^T, dP^T: the 32-row kernel's 32) and K = 64 (dV, dK: its 32); the tile is half the
keys, so each query row's Q and dO are read twice as often (from L2).

Tiles: (key block of BN, batch * kv head) in head_grouped_tile's order (the heaviest causal blocks first), drawn
from a counter. Steps, masks and window: AttentionBackward's step_rows and probabilities (of its member ``base``);
no softcap (consumer 1 would need the cap's derivative of S: the 32-row kernel serves it). dQ after it, by the
MLA dq kernel as the 32-row path's (dq_from "gluon")."""
from triton.experimental import gluon

from tilecore.ops.attention_backward.gluon_backward import AttentionBackward, KeyTile, operand_layout, stat_columns
from tilecore.ops.attention_mla.gluon_backward import load_pieces
from tilecore.tiles.gluon import Layout, TileOperand, ring, run, stage_struct, struct, wgmma_layout
from tilecore.tiles.gluon.compat import fence_async_shared, gl, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from tilecore.tiles.schedule import head_grouped_tile


@stage_struct
class RowsStage:
    """One step's 64 query rows: Q's three 64-column pieces, the rows' lse and delta, dO's two."""
    q0: object
    q1: object
    q2: object
    stats: object
    do0: object
    do1: object


@struct
class RoleAcc:
    """A consumer's accumulators: consumer 0 dV's two [BN, 64] pieces (a2 unused), consumer 1 dK's three."""
    a0: object
    a1: object
    a2: object


@struct
class AttentionBackwardRoles:
    # AttentionBackward over the pieces' descriptors (q_desc's box [1, 1, BM, 64], k_desc's and dk_desc's
    # [1, 1, BN, 64]: the tile's keys; BN the tile's 64 keys, D a piece's 64; no dQ: its dS buffers None; no
    # softcap): the walk (step_rows) and masks (probabilities) it calls, the sizes and options its own methods read
    base: object
    p_smem: object  # P^T of a step, float32 [2, BN, BM]
    p_full: object  # consumer 0 wrote it
    p_free: object  # consumer 1 read it

    @gluon.jit
    def setup(self, tile_id):
        """AttentionBackward.setup with a tile of BN keys (its is two consumers' BN): the query blocks that
        see one of the tile's keys, for each q head of the group; grouped heads walk down (no pairs)."""
        n_blocks = gl.cdiv(self.base.Nk, self.base.BN)
        bhk, key_block = head_grouped_tile(tile_id, n_blocks, self.base.num_bhk, self.base.head_group)
        start_n = key_block * self.base.BN
        first_mb = 0
        if self.base.CAUSAL:
            first_mb = gl.maximum(start_n - (self.base.Nk - self.base.N), 0) // self.base.BM
        if self.base.WINDOW:
            first_mb = gl.maximum(start_n - (self.base.Nk - self.base.N) - self.base.right, 0) // self.base.BM
            last_key = gl.minimum(start_n + self.base.BN, self.base.Nk) - 1
            last_row = gl.minimum(self.base.N - 1, last_key - (self.base.Nk - self.base.N) + self.base.left)
            per_head = gl.maximum(gl.cdiv(gl.maximum(last_row + 1, 0), self.base.BM) - first_mb, 0)
        else:
            per_head = gl.maximum(gl.cdiv(self.base.N, self.base.BM) - first_mb, 0)
        shift = key_block % gl.maximum(per_head, 1)
        b = bhk
        hk = bhk
        if self.base.GROUP != 1:
            b, hk = self.base.kv_head(bhk)
        tile = KeyTile(start_n, bhk, first_mb, per_head, shift, b, hk, key_block % self.base.GROUP,
                       1.0 / self.base.GROUP, key_block < 0)
        return tile, per_head * self.base.GROUP

    @gluon.jit
    def load(self, stage, bar, tile, step):
        """The step's Q and dO pieces and its rows' lse and delta (rows past N arrive as zeros)."""
        b, hk = self.base.tile_kv_head(tile)
        h, start_m = self.base.step_rows(tile, step)
        tma.async_copy_global_to_shared(self.base.q_desc, [b, h, start_m, 0], bar, stage.q0)
        tma.async_copy_global_to_shared(self.base.q_desc, [b, h, start_m, 64], bar, stage.q1)
        tma.async_copy_global_to_shared(self.base.q_desc, [b, h, start_m, 128], bar, stage.q2)
        tma.async_copy_global_to_shared(self.base.do_desc, [b, h, start_m, 0], bar, stage.do0)
        tma.async_copy_global_to_shared(self.base.do_desc, [b, h, start_m, 64], bar, stage.do1)
        tma.async_copy_global_to_shared(self.base.stats_desc, [b * self.base.H + h, 0, start_m], bar, stage.stats)

    @gluon.jit
    def load_tile(self, kv_smem, bar, tile, consumer):
        """The tile's K pieces (buffers 0-2) and V pieces (3-4); rows past Nk arrive as zeros."""
        b, hk = self.base.tile_kv_head(tile)
        load_pieces(self.base.k_desc, self.base.v_desc, [b, hk, tile.start_n], bar, kv_smem)

    @gluon.jit
    def start(self, ctx, tile, prev):
        zero = gl.zeros([self.base.BN, 64], gl.float32, wgmma_layout(self.base.BN, 64, gl.num_warps()))
        return RoleAcc(zero, zero, zero)

    @gluon.jit
    def piece(self, ctx, j: gl.constexpr):
        """The tile operand's buffer j (K's 0-2, V's 3-4) as [BN, 64]."""
        return ctx.operand.index(j).reshape([self.base.BN, 64])

    @gluon.jit
    def compute(self, ctx, st, stage, tile, step):
        """One step of this consumer's role (module docstring); every wgmma complete when it returns."""
        BM: gl.constexpr = self.base.BM
        BN: gl.constexpr = self.base.BN
        st_layout: gl.constexpr = wgmma_layout(BN, BM, gl.num_warps())
        a_layout: gl.constexpr = operand_layout(BN, 64, gl.num_warps())
        i = ctx.ring_step
        buf = i % 2
        zeros = gl.zeros([BN, BM], gl.float32, st_layout)
        if ctx.index == 0:
            h, start_m = self.base.step_rows(tile, step)
            s_tok = warpgroup_mma(self.piece(ctx, 0), stage.q0.reshape([BM, 64]).permute((1, 0)), zeros,
                                  use_acc=False, is_async=True)
            s_tok = warpgroup_mma(self.piece(ctx, 1), stage.q1.reshape([BM, 64]).permute((1, 0)), s_tok,
                                  is_async=True)
            s_tok = warpgroup_mma(self.piece(ctx, 2), stage.q2.reshape([BM, 64]).permute((1, 0)), s_tok,
                                  is_async=True)
            lse_cols = stat_columns(stage.stats, 0, st_layout)
            s_t = warpgroup_mma_wait(0, deps=(s_tok,))
            p_t, dtanh = self.base.probabilities(s_t, lse_cols, tile.start_n, start_m, tile)
            mbarrier.wait(self.p_free.index(buf), ((i // 2) & 1) ^ 1)  # consumer 1 read it two steps ago
            self.p_smem.index(buf).store(p_t)
            gl.thread_barrier()  # every warp of this consumer has written its part
            mbarrier.arrive(self.p_full.index(buf))
            p_op = gl.convert_layout(p_t.to(stage.q0.dtype), a_layout)
            dv0 = warpgroup_mma(p_op, stage.do0.reshape([BM, 64]), st.a0, is_async=True)
            dv1 = warpgroup_mma(p_op, stage.do1.reshape([BM, 64]), st.a1, is_async=True)
            dv0, dv1 = warpgroup_mma_wait(0, deps=(dv0, dv1))
            acc = RoleAcc(dv0, dv1, st.a2)
        else:
            dp_tok = warpgroup_mma(self.piece(ctx, 3), stage.do0.reshape([BM, 64]).permute((1, 0)), zeros,
                                   use_acc=False, is_async=True)
            dp_tok = warpgroup_mma(self.piece(ctx, 4), stage.do1.reshape([BM, 64]).permute((1, 0)), dp_tok,
                                   is_async=True)
            delta_cols = stat_columns(stage.stats, 1, st_layout)
            dp_t = warpgroup_mma_wait(0, deps=(dp_tok,))
            mbarrier.wait(self.p_full.index(buf), (i // 2) & 1)
            p_t = self.p_smem.index(buf).load(st_layout)
            gl.thread_barrier()  # every warp of this consumer has read the buffer
            mbarrier.arrive(self.p_free.index(buf))
            ds_t = p_t * (dp_t - gl.expand_dims(delta_cols, 0))
            ds_op = gl.convert_layout(ds_t.to(stage.q0.dtype), a_layout)
            dk0 = warpgroup_mma(ds_op, stage.q0.reshape([BM, 64]), st.a0, is_async=True)
            dk1 = warpgroup_mma(ds_op, stage.q1.reshape([BM, 64]), st.a1, is_async=True)
            dk2 = warpgroup_mma(ds_op, stage.q2.reshape([BM, 64]), st.a2, is_async=True)
            dk0, dk1, dk2 = warpgroup_mma_wait(0, deps=(dk0, dk1, dk2))
            acc = RoleAcc(dk0, dk1, dk2)
        return acc

    @gluon.jit
    def wait(self, ctx, st):
        return st  # every step ends with its wgmma complete

    @gluon.jit
    def store_piece(self, ctx, x, desc, coord):
        """One [BN, 64] piece through this consumer's epilogue buffer (once its last store read it)."""
        tma.store_wait(0)
        ctx.out.reshape([self.base.BN, 64]).store(x.to(ctx.out.dtype))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(desc, coord, ctx.out)

    @gluon.jit
    def finish(self, ctx, st, tile):
        """Consumer 0 dV's pieces, consumer 1 dK's (times the scale); rows past Nk clipped by the TMA stores."""
        b, hk = self.base.tile_kv_head(tile)
        if ctx.index == 0:
            self.store_piece(ctx, st.a0, self.base.dv_desc, [b, hk, tile.start_n, 0])
            self.store_piece(ctx, st.a1, self.base.dv_desc, [b, hk, tile.start_n, 64])
        else:
            self.store_piece(ctx, st.a0 * self.base.scale, self.base.dk_desc, [b, hk, tile.start_n, 0])
            self.store_piece(ctx, st.a1 * self.base.scale, self.base.dk_desc, [b, hk, tile.start_n, 64])
            self.store_piece(ctx, st.a2 * self.base.scale, self.base.dk_desc, [b, hk, tile.start_n, 128])


@gluon.jit
def attention_bwd_mla_roles_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, stats_desc, H, N, Nk, GROUP,
                                   scale, scale_log2e, num_bhk, head_group, tile_counter, left, right, tanh_scale,
                                   CAUSAL: gl.constexpr, STAGES: gl.constexpr, WINDOW: gl.constexpr = False,
                                   SOFTCAP: gl.constexpr = 0):
    """dK and dV at q/k head dim 192 and v's 128 for every (key block of BN, batch * kv head), 64 query rows a
    step split between the two consumers by role (AttentionBackwardRoles); a persistent grid drawing its tiles
    from ``tile_counter``. Every descriptor's box is 64 columns wide; k_desc's and dk_desc's BN rows."""
    gl.static_assert(not (WINDOW and CAUSAL), "causal is folded into the window")
    gl.static_assert(SOFTCAP == 0, "no softcap: the 32-row kernel serves it")
    BM: gl.constexpr = q_desc.block_type.shape[2]
    BN: gl.constexpr = dk_desc.block_type.shape[2]
    gl.static_assert(k_desc.block_type.shape[2] == BN and BM == 64 and BN == 64, "64 keys a tile, 64 rows a step")
    gl.static_assert(q_desc.block_type.shape[3] == 64 and dk_desc.block_type.shape[3] == 64,
                     "64-column pieces: q/k 192 = 3 x 64, v 128 = 2 x 64")
    p_smem = gl.allocate_shared_memory(gl.float32, [2, BN, BM],
                                       gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))
    p_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(2):
        mbarrier.init(p_full.index(j), count=1)
        mbarrier.init(p_free.index(j), count=1)
    base = AttentionBackward(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, stats_desc, None, H, N, Nk, GROUP,
                             scale, scale_log2e, num_bhk, head_group, None, None, None, None, left, right, tanh_scale,
                             CAUSAL, BM, BN, 64, 0, False, WINDOW, SOFTCAP, False)
    op = AttentionBackwardRoles(base, p_smem, p_full, p_free)
    layout = Layout(dk_desc, STAGES, CONSUMERS=2, CONSUMER_REGS=240, PRODUCER_REGS=24, LATE_RELEASE=0,
                    tile_operand=TileOperand(k_desc, COUNT=5, SHARED=True), tile_counter=tile_counter)
    stages = RowsStage(ring(q_desc, STAGES), ring(q_desc, STAGES), ring(q_desc, STAGES), ring(stats_desc, STAGES),
                       ring(do_desc, STAGES), ring(do_desc, STAGES))
    run(op, layout, stages, gl.cdiv(Nk, BN) * num_bhk)
    for j in gl.static_range(2):
        mbarrier.invalidate(p_full.index(j))
        mbarrier.invalidate(p_free.index(j))


def compiled(causal: bool = True, window: bool = False, group: int = 1, stages: int = 2, dtype=None):
    """The kernel compiled for sm_90a without a GPU (TRITON_INTERPRET unset), with the arguments a launch over
    (B, H, N, D) tensors passes (B2 H16 N4096: q/k 192, v 128)."""
    import torch

    from tilecore.ops.attention.launch import row_stats_operand
    from tilecore.tiles.compile import compile_kernel
    from tilecore.tiles.launch import TmaOperand

    dtype = dtype or torch.bfloat16
    q = torch.empty(2, 16, 4096, 192, dtype=dtype)
    k = torch.empty(2, 16 // group, 4096, 192, dtype=dtype)
    v = torch.empty(2, 16 // group, 4096, 128, dtype=dtype)
    stats = torch.empty(32, 2, 4096)
    piece = lambda t: TmaOperand(t, [1, 1, 64, 64]).descriptor()  # noqa: E731
    args = dict(q_desc=piece(q), k_desc=piece(k), v_desc=piece(v), do_desc=piece(v), dk_desc=piece(k),
                dv_desc=piece(v), stats_desc=row_stats_operand(stats, 64).descriptor(), H=16, N=4096, Nk=4096,
                GROUP=group, scale=0.1, scale_log2e=0.1, num_bhk=2 * 16 // group, head_group=8,
                tile_counter=torch.zeros(1, dtype=torch.int32), left=1024 if window else 0, right=0, tanh_scale=0.0,
                CAUSAL=causal and not window, STAGES=stages, WINDOW=window, SOFTCAP=0)
    return compile_kernel(attention_bwd_mla_roles_kernel, args, num_warps=4)


if __name__ == "__main__":  # python -m tilecore.ops.attention_mla.gluon_backward_roles (TRITON_INTERPRET unset)
    import json

    from tilecore.tiles.compile import has_hopper_instructions, resources

    rows = []
    for causal, window, group, stages in ((True, False, 1, 2), (False, False, 1, 2), (True, False, 1, 3),
                                          (False, True, 1, 2), (True, False, 4, 2)):
        c = compiled(causal, window, group, stages)
        rows.append(dict(causal=causal, window=window, group=group, stages=stages, **vars(resources(c)),
                         **has_hopper_instructions(c.asm["ptx"])))
    print(json.dumps(rows))
