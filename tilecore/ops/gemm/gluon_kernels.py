"""GEMM on Hopper: a layout and callbacks on the tiles template (:mod:`tilecore.tiles.gluon.pipeline`).

A tile is C[off_m : off_m + BM, off_n : off_n + BN]; its steps walk K, one [BM, BK] block of A and one
block of B (as [BK, BN], or as [BN, BK] when ``B_T``: K-major, as fp8 wgmma needs) per stage. Two
consumers split a tile's rows, each multiplying its half of the A stage. With ``STREAM_K`` the last
wave's tiles are split along K over every program (``tiles.schedule.stream_k_work``); each consumer's
partials meet in its own workspace slots (program * CONSUMERS + consumer).
"""
from triton.experimental import gluon

from tilecore.tiles.gluon.compat import gl, tma, warpgroup_mma, warpgroup_mma_wait
from tilecore.tiles.gluon import (Layout, add_cols, fix_up, ring, run, scale_cols, scale_rows, stage_struct,
                                  store_tile, struct, wgmma_layout)
from tilecore.tiles.schedule import FINAL, WHOLE, stream_k_work, tile_origin


@stage_struct
class Stage:
    a: object  # [BM, BK]
    b: object  # [BK, BN], or [BN, BK] with B_T


@struct
class Tile:
    off_m: object
    off_n: object
    k_first: object  # the unit's first K step
    role: object  # stream-K: WHOLE, PARTIAL, FINAL or NOTHING
    first: object  # stream-K: the first program sharing the tile


@struct
class Gemm:
    a_desc: object
    b_desc: object
    c_desc: object
    M: object
    N: object
    K: object
    bias: object
    scale_a: object
    scale_b: object
    workspace: object  # stream-K partials
    flags: object
    B_T: gl.constexpr
    GROUP_M: gl.constexpr
    HAS_BIAS: gl.constexpr
    SCALES: gl.constexpr  # 0: none; fp8: 1 + (per-row A) + 2 * (per-column B)
    CONSUMERS: gl.constexpr
    STREAM_K: gl.constexpr
    BM: gl.constexpr  # a consumer's rows
    BN: gl.constexpr
    BK: gl.constexpr

    @gluon.jit
    def setup(self, unit):
        """The unit's tile and K steps (a whole tile's, or its stream-K share)."""
        tile_id, k_first, steps, role, first = stream_k_work(
            unit, gl.cdiv(self.M, self.BM * self.CONSUMERS) * gl.cdiv(self.N, self.BN), gl.cdiv(self.K, self.BK),
            gl.num_programs(0), self.STREAM_K)
        off_m, off_n = tile_origin(tile_id, self.M, self.N, self.BM * self.CONSUMERS, self.BN, self.GROUP_M)
        return Tile(off_m, off_n, k_first, role, first), steps

    @gluon.jit
    def load(self, stage, bar, tile, step):
        k = (tile.k_first + step) * self.BK
        tma.async_copy_global_to_shared(self.a_desc, [tile.off_m, k], bar, stage.a)
        if self.B_T:
            tma.async_copy_global_to_shared(self.b_desc, [tile.off_n, k], bar, stage.b)
        else:
            tma.async_copy_global_to_shared(self.b_desc, [k, tile.off_n], bar, stage.b)

    @gluon.jit
    def start(self, ctx, tile, prev):
        bits: gl.constexpr = self.a_desc.dtype.primitive_bitwidth  # fp8: a wgmma's K is 32
        return gl.zeros([self.BM, self.BN], gl.float32, wgmma_layout(self.BM, self.BN, gl.num_warps(), bits))

    @gluon.jit
    def compute(self, ctx, acc, stage, tile, step):
        b = stage.b.permute((1, 0)) if self.B_T else stage.b
        a = stage.a.slice(ctx.index * self.BM, self.BM) if self.CONSUMERS > 1 else stage.a  # this consumer's rows
        tok = warpgroup_mma(a, b, acc, is_async=True)
        # one wgmma group left in flight: the previous step's is done, so its stage can be refilled
        acc, _, _ = warpgroup_mma_wait(1, deps=(tok, a, stage.b))
        return acc

    @gluon.jit
    def wait(self, ctx, acc):
        return warpgroup_mma_wait(0, deps=(acc,))

    @gluon.jit
    def finish(self, ctx, acc, tile):
        """Stream-K's fix-up, then dequantization (fp8), bias, and the TMA store of this consumer's rows."""
        if self.STREAM_K:  # the unit may be a share of a tile
            acc = fix_up(acc, tile.role, tile.first, self.workspace, self.flags, self.CONSUMERS, ctx.index)
        if not self.STREAM_K or tile.role == WHOLE or tile.role == FINAL:
            off_m = tile.off_m + ctx.index * self.BM
            if self.SCALES > 0:  # per-tensor scales, or per row of A / per column of B
                acc = scale_rows(acc, self.scale_a, off_m, self.M, (self.SCALES - 1) % 2 == 1)
                acc = scale_cols(acc, self.scale_b, tile.off_n, self.N, (self.SCALES - 1) // 2 == 1)
            if self.HAS_BIAS:
                acc = add_cols(acc, self.bias, tile.off_n, self.N)
            store_tile(acc, self.c_desc, ctx.out, off_m, tile.off_n)


@gluon.jit
def gemm_kernel(a_desc, b_desc, c_desc, M, N, K, bias_ptr, scale_a_ptr, scale_b_ptr, workspace, flags, num_units,
                B_T: gl.constexpr, GROUP_M: gl.constexpr, HAS_BIAS: gl.constexpr, SCALES: gl.constexpr,
                STAGES: gl.constexpr, CONSUMERS: gl.constexpr = 1, STREAM_K: gl.constexpr = False):
    """``num_units``: the tiles, or with STREAM_K ``tiles.schedule.stream_k_units``."""
    BN: gl.constexpr = b_desc.block_type.shape[0] if B_T else b_desc.block_type.shape[1]
    op = Gemm(a_desc, b_desc, c_desc, M, N, K, bias_ptr, scale_a_ptr, scale_b_ptr, workspace, flags, B_T, GROUP_M,
              HAS_BIAS, SCALES, CONSUMERS, STREAM_K, a_desc.block_type.shape[0] // CONSUMERS, BN,
              a_desc.block_type.shape[1])
    stages = Stage(ring(a_desc, STAGES), ring(b_desc, STAGES))
    run(op, Layout(c_desc, STAGES, CONSUMERS=CONSUMERS), stages, num_units)
