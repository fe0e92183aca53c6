"""GEMM as the small functions of the tiles' ``tl`` pipeline template: runs in the interpreter, on
any CUDA GPU (the path for GPUs older than Hopper, and for operands TMA cannot describe).

``g``   = (a, b, c, bias, scale_a, scale_b, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
           stride_cm, stride_cn, workspace, flags)
``cfg`` = (BM, BN, BK, GROUP_M, HAS_BIAS, SCALES, STREAM_K), SCALES as in gluon_kernels; with
STREAM_K the last wave's tiles are split along K over every program (tiles.schedule.stream_k_work),
their partials meeting in ``workspace`` (float32, a tile per program) under ``flags``.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tilecore.tiles import ops
from tilecore.tiles.pipeline import persistent_pipeline
from tilecore.tiles.schedule import (FINAL, NOTHING, PARTIAL, add_partials, publish_partial, stream_k_work,
                                     tile_origin)


@triton.jit
def _setup(g, cfg: tl.constexpr, unit):
    """The unit's tile (off_m, off_n, first K step, stream-K role, first program sharing it) and K steps."""
    tile_id, k_first, steps, role, first = stream_k_work(unit, tl.cdiv(g[6], cfg[0]) * tl.cdiv(g[7], cfg[1]),
                                                         tl.cdiv(g[8], cfg[2]), tl.num_programs(0), cfg[6])
    off_m, off_n = tile_origin(tile_id, g[6], g[7], cfg[0], cfg[1], cfg[3])
    return (off_m, off_n, k_first, role, first), steps


@triton.jit
def _init(g, cfg: tl.constexpr, tile):
    return tl.zeros([cfg[0], cfg[1]], dtype=tl.float32)


@triton.jit
def _load(g, cfg: tl.constexpr, tile, kk):
    offs_m = (tile[0] + tl.arange(0, cfg[0])).to(tl.int64)
    offs_n = (tile[1] + tl.arange(0, cfg[1])).to(tl.int64)
    offs_k = ((tile[2] + kk) * cfg[2] + tl.arange(0, cfg[2])).to(tl.int64)
    a = tl.load(g[0] + offs_m[:, None] * g[9] + offs_k[None, :] * g[10],
                mask=ops.bounds_mask(offs_m, offs_k, g[6], g[8]), other=0.0)
    b = tl.load(g[1] + offs_k[:, None] * g[11] + offs_n[None, :] * g[12],
                mask=ops.bounds_mask(offs_k, offs_n, g[8], g[7]), other=0.0)
    return a, b


@triton.jit
def _compute(g, cfg: tl.constexpr, acc, a, b, kk):
    return ops.mma(a, b, acc)


@triton.jit
def _finish(g, cfg: tl.constexpr, acc, tile):
    if cfg[6]:  # stream-K: the unit may be part of a tile
        if tile[3] == PARTIAL:
            publish_partial(acc, g[15], g[16], tl.program_id(0))
        elif tile[3] != NOTHING:
            if tile[3] == FINAL:  # the shares of programs tile[4] .. this one - 1 come first
                acc = add_partials(acc, g[15], g[16], tile[4], tl.program_id(0), 1)
            _epilogue(g, cfg, acc, tile)
    else:
        _epilogue(g, cfg, acc, tile)


@triton.jit
def _epilogue(g, cfg: tl.constexpr, acc, tile):
    offs_m = tile[0] + tl.arange(0, cfg[0])
    offs_n = tile[1] + tl.arange(0, cfg[1])
    if cfg[5] > 0:
        if (cfg[5] - 1) % 2 == 1:
            acc = acc * tl.load(g[4] + offs_m, mask=offs_m < g[6], other=0.0)[:, None]
        else:
            acc = acc * tl.load(g[4])
        if (cfg[5] - 1) // 2 == 1:
            acc = acc * tl.load(g[5] + offs_n, mask=offs_n < g[7], other=0.0)[None, :]
        else:
            acc = acc * tl.load(g[5])
    if cfg[4]:
        acc = acc + tl.load(g[3] + offs_n, mask=offs_n < g[7], other=0.0).to(tl.float32)[None, :]
    out = ops.cast(acc, g[2].dtype.element_ty)
    ptrs = g[2] + offs_m.to(tl.int64)[:, None] * g[13] + offs_n.to(tl.int64)[None, :] * g[14]
    tl.store(ptrs, out, mask=ops.bounds_mask(offs_m, offs_n, g[6], g[7]))


@triton.jit
def gemm_kernel(a, b, c, bias, scale_a, scale_b, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                stride_cm, stride_cn, workspace, flags, num_units, BM: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, GROUP_M: tl.constexpr, HAS_BIAS: tl.constexpr, SCALES: tl.constexpr,
                STAGES: tl.constexpr, STREAM_K: tl.constexpr = False):
    """``num_units``: the tiles, or with STREAM_K ``tiles.schedule.stream_k_units``."""
    g = (a, b, c, bias, scale_a, scale_b, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
         stride_cm, stride_cn, workspace, flags)
    cfg: tl.constexpr = tl.constexpr((BM, BN, BK, GROUP_M, HAS_BIAS, SCALES, STREAM_K))
    persistent_pipeline(g, cfg, num_units, _setup, _init, _load, _compute, _finish, STAGES)
