"""GEMM on the tiles' ``tl`` template (:mod:`tilecore.tiles.pipeline`): the op of gluon_kernels.py with
pointer loads instead of TMA; runs in the interpreter and on any CUDA GPU (the path for GPUs older
than Hopper, and for operands TMA cannot describe).

A tile is C[off_m : off_m + BM, off_n : off_n + BN]; its steps walk K, one [BM, BK] block of A and one
[BK, BN] block of B each. SCALES as in gluon_kernels. With STREAM_K the last wave's tiles are split
along K over every program (tiles.schedule.stream_k_work), their partials meeting in ``workspace``
(float32, a tile per program) under ``flags``.
"""
import triton
import triton.language as tl

from tilecore.tiles import ops
from tilecore.tiles.pipeline import Layout, run, struct
from tilecore.tiles.schedule import (FINAL, NOTHING, PARTIAL, add_partials, publish_partial, stream_k_work,
                                     tile_origin)


@struct
class Stage:
    a: tl.tensor  # [BM, BK]
    b: tl.tensor  # [BK, BN]


@struct
class Tile:
    off_m: object
    off_n: object
    k_first: object  # the unit's first K step
    role: object  # stream-K: WHOLE, PARTIAL, FINAL or NOTHING
    first: object  # stream-K: the first program sharing the tile


@struct
class Gemm:
    a: object
    b: object
    c: object
    bias: object
    scale_a: object
    scale_b: object
    M: object
    N: object
    K: object
    stride_am: object
    stride_ak: object
    stride_bk: object
    stride_bn: object
    stride_cm: object
    stride_cn: object
    workspace: object
    flags: object
    BM: tl.constexpr
    BN: tl.constexpr
    BK: tl.constexpr
    GROUP_M: tl.constexpr
    HAS_BIAS: tl.constexpr
    SCALES: tl.constexpr  # 0: none; fp8: 1 + (per-row A) + 2 * (per-column B)
    STREAM_K: tl.constexpr

    @triton.jit
    def setup(self, unit):
        """The unit's tile and K steps (a whole tile's, or its stream-K share)."""
        tile_id, k_first, steps, role, first = stream_k_work(
            unit, tl.cdiv(self.M, self.BM) * tl.cdiv(self.N, self.BN), tl.cdiv(self.K, self.BK), tl.num_programs(0),
            self.STREAM_K)
        off_m, off_n = tile_origin(tile_id, self.M, self.N, self.BM, self.BN, self.GROUP_M)
        return Tile(off_m, off_n, k_first, role, first), steps

    @triton.jit
    def load(self, tile, step):
        offs_m = (tile.off_m + tl.arange(0, self.BM)).to(tl.int64)
        offs_n = (tile.off_n + tl.arange(0, self.BN)).to(tl.int64)
        offs_k = ((tile.k_first + step) * self.BK + tl.arange(0, self.BK)).to(tl.int64)
        a = tl.load(self.a + offs_m[:, None] * self.stride_am + offs_k[None, :] * self.stride_ak,
                    mask=ops.bounds_mask(offs_m, offs_k, self.M, self.K), other=0.0)
        b = tl.load(self.b + offs_k[:, None] * self.stride_bk + offs_n[None, :] * self.stride_bn,
                    mask=ops.bounds_mask(offs_k, offs_n, self.K, self.N), other=0.0)
        return Stage(a, b)

    @triton.jit
    def start(self, ctx, tile, prev):
        return tl.zeros([self.BM, self.BN], dtype=tl.float32)

    @triton.jit
    def compute(self, ctx, acc, stage, tile, step):
        return ops.mma(stage.a, stage.b, acc)

    @triton.jit
    def wait(self, ctx, acc):
        return acc

    @triton.jit
    def finish(self, ctx, acc, tile):
        if self.STREAM_K:  # the unit may be a share of a tile
            if tile.role == PARTIAL:
                publish_partial(acc, self.workspace, self.flags, tl.program_id(0))
            elif tile.role != NOTHING:
                if tile.role == FINAL:  # the shares of programs tile.first .. this one - 1 come first
                    acc = add_partials(acc, self.workspace, self.flags, tile.first, tl.program_id(0), 1)
                self.epilogue(acc, tile)
        else:
            self.epilogue(acc, tile)

    @triton.jit
    def epilogue(self, acc, tile):
        """Scales (fp8), bias, the cast and the masked store of the tile."""
        offs_m = tile.off_m + tl.arange(0, self.BM)
        offs_n = tile.off_n + tl.arange(0, self.BN)
        if self.SCALES > 0:  # fp8 dequantization: per-tensor scales, or per row of A / per column of B
            if (self.SCALES - 1) % 2 == 1:
                acc = acc * tl.load(self.scale_a + offs_m, mask=offs_m < self.M, other=0.0)[:, None]
            else:
                acc = acc * tl.load(self.scale_a)
            if (self.SCALES - 1) // 2 == 1:
                acc = acc * tl.load(self.scale_b + offs_n, mask=offs_n < self.N, other=0.0)[None, :]
            else:
                acc = acc * tl.load(self.scale_b)
        if self.HAS_BIAS:
            acc = acc + tl.load(self.bias + offs_n, mask=offs_n < self.N, other=0.0).to(tl.float32)[None, :]
        out = ops.cast(acc, self.c.dtype.element_ty)
        ptrs = self.c + offs_m.to(tl.int64)[:, None] * self.stride_cm + offs_n.to(tl.int64)[None, :] * self.stride_cn
        tl.store(ptrs, out, mask=ops.bounds_mask(offs_m, offs_n, self.M, self.N))


@triton.jit
def gemm_kernel(a, b, c, bias, scale_a, scale_b, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                stride_cm, stride_cn, workspace, flags, num_units, BM: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr, SCALES: tl.constexpr,
                STAGES: tl.constexpr, STREAM_K: tl.constexpr = False):
    """``num_units``: the tiles, or with STREAM_K ``tiles.schedule.stream_k_units``."""
    op = Gemm(a, b, c, bias, scale_a, scale_b, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
              stride_cn, workspace, flags, BM, BN, BK, GROUP_M, HAS_BIAS, SCALES, STREAM_K)
    run(op, Layout(STAGES), num_units)
