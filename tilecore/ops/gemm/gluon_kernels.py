"""GEMM on Hopper, written as the small functions of the tiles' Gluon pipeline template.

``g``   = (a_desc, b_desc, c_desc, M, N, K, bias_ptr, scale_a_ptr, scale_b_ptr)
``cfg`` = (B_T, GROUP_M, HAS_BIAS, SCALES, CONSUMERS[, consumer index]): B_T means B arrives as
[N, K] (K-major, as fp8 wgmma needs); SCALES is 0 (none), or fp8 scales as 1 + (per-row A) + 2 *
(per-column B); CONSUMERS = 2 splits each tile's rows between two consumer partitions (the
template's), each multiplying its half of the A stage.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma, warpgroup_mma, warpgroup_mma_wait

from tilecore.tiles.gluon import persistent_pipeline, store_tile, wgmma_layout
from tilecore.tiles.schedule import tile_origin


@gluon.constexpr_function
def _bn(b_block, b_t):
    return b_block[0] if b_t else b_block[1]


@gluon.jit
def _setup(g, cfg: gl.constexpr, tile_id):
    BM: gl.constexpr = g[0].block_type.shape[0]
    BN: gl.constexpr = _bn(g[1].block_type.shape, cfg[0])
    BK: gl.constexpr = g[0].block_type.shape[1]
    off_m, off_n = tile_origin(tile_id, g[3], g[4], BM, BN, cfg[1])
    return (off_m, off_n), gl.cdiv(g[5], BK)


@gluon.jit
def _load(g, cfg: gl.constexpr, a_smem, b_smem, bar, tile, kk):
    BK: gl.constexpr = g[0].block_type.shape[1]
    tma.async_copy_global_to_shared(g[0], [tile[0], kk * BK], bar, a_smem)
    if cfg[0]:
        tma.async_copy_global_to_shared(g[1], [tile[1], kk * BK], bar, b_smem)
    else:
        tma.async_copy_global_to_shared(g[1], [kk * BK, tile[1]], bar, b_smem)


@gluon.jit
def _init(g, cfg: gl.constexpr, tile):
    BM: gl.constexpr = g[0].block_type.shape[0] // cfg[4]
    BN: gl.constexpr = _bn(g[1].block_type.shape, cfg[0])
    return gl.zeros([BM, BN], gl.float32, wgmma_layout(BM, BN, gl.num_warps(), g[0].dtype.primitive_bitwidth))


@gluon.jit
def _compute(g, cfg: gl.constexpr, acc, a_smem, b_smem, kk):
    if cfg[0]:
        b = b_smem.permute((1, 0))
    else:
        b = b_smem
    if cfg[4] > 1:
        BM: gl.constexpr = g[0].block_type.shape[0] // cfg[4]
        a_smem = a_smem.slice(cfg[5] * BM, BM)  # this consumer's rows of the A stage
    tok = warpgroup_mma(a_smem, b, acc, is_async=True)
    # keep one wgmma group in flight: the previous step's is done, so its stage can be refilled
    acc, _, _ = warpgroup_mma_wait(1, deps=(tok, a_smem, b_smem))
    return acc


@gluon.jit
def _drain(g, cfg: gl.constexpr, acc):
    return warpgroup_mma_wait(0, deps=(acc,))


@gluon.jit
def _finish(g, cfg: gl.constexpr, acc, tile, c_smem):
    BM: gl.constexpr = g[0].block_type.shape[0] // cfg[4]
    off_m = tile[0]
    if cfg[4] > 1:
        off_m = off_m + cfg[5] * BM
    BN: gl.constexpr = _bn(g[1].block_type.shape, cfg[0])
    layout: gl.constexpr = wgmma_layout(BM, BN, gl.num_warps(), g[0].dtype.primitive_bitwidth)
    if cfg[3] > 0:  # fp8 dequantization: per-tensor scales, or per row of A / per column of B
        if (cfg[3] - 1) % 2 == 1:
            offs_m = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
            acc = acc * gl.expand_dims(gl.load(g[7] + offs_m, mask=offs_m < g[3], other=0.0), 1)
        else:
            acc = acc * gl.load(g[7])
        if (cfg[3] - 1) // 2 == 1:
            offs_n = tile[1] + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
            acc = acc * gl.expand_dims(gl.load(g[8] + offs_n, mask=offs_n < g[4], other=0.0), 0)
        else:
            acc = acc * gl.load(g[8])
    if cfg[2]:
        offs_n = tile[1] + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
        bias = gl.load(g[6] + offs_n, mask=offs_n < g[4], other=0.0)
        acc = acc + gl.expand_dims(bias.to(gl.float32), 0)
    store_tile(acc, g[2], c_smem, off_m, tile[1])


@gluon.jit
def gemm_kernel(a_desc, b_desc, c_desc, M, N, K, bias_ptr, scale_a_ptr, scale_b_ptr,
                B_T: gl.constexpr, GROUP_M: gl.constexpr, HAS_BIAS: gl.constexpr, SCALES: gl.constexpr,
                STAGES: gl.constexpr, CONSUMERS: gl.constexpr = 1):
    g = (a_desc, b_desc, c_desc, M, N, K, bias_ptr, scale_a_ptr, scale_b_ptr)
    cfg: gl.constexpr = gl.constexpr((B_T, GROUP_M, HAS_BIAS, SCALES, CONSUMERS))
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BN: gl.constexpr = _bn(g[1].block_type.shape, cfg[0])
    num_tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
    persistent_pipeline(g, cfg, a_desc, b_desc, c_desc, num_tiles, _setup, _load, _init, _compute,
                        _drain, _finish, STAGES, CONSUMERS=CONSUMERS)
