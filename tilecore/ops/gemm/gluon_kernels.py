"""GEMM on Hopper, written as the small functions of the tiles' Gluon pipeline template.

``g``   = (a_desc, b_desc, c_desc, M, N, K, bias_ptr, scale_a_ptr, scale_b_ptr, workspace, flags)
``cfg`` = (B_T, GROUP_M, HAS_BIAS, SCALES, CONSUMERS, STREAM_K[, consumer index]): B_T means B
arrives as [N, K] (K-major, as fp8 wgmma needs); SCALES is 0 (none), or fp8 scales as 1 + (per-row
A) + 2 * (per-column B); CONSUMERS = 2 splits each tile's rows between two consumer partitions (the
template's), each multiplying its half of the A stage. STREAM_K: the last wave's tiles are split
along K over every program (``tiles.schedule.stream_k_work``); each consumer's partials meet in
its own workspace slots (program * CONSUMERS + consumer).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma, warpgroup_mma, warpgroup_mma_wait

from tilecore.tiles.gluon import add_partials, persistent_pipeline, publish_partial, store_tile, wgmma_layout
from tilecore.tiles.schedule import FINAL, NOTHING, PARTIAL, stream_k_work, tile_origin


@gluon.constexpr_function
def _bn(b_block, b_t):
    return b_block[0] if b_t else b_block[1]


@gluon.jit
def _setup(g, cfg: gl.constexpr, unit):
    """The unit's tile (off_m, off_n, first K step, stream-K role, first program sharing it) and K steps."""
    BM: gl.constexpr = g[0].block_type.shape[0]
    BN: gl.constexpr = _bn(g[1].block_type.shape, cfg[0])
    BK: gl.constexpr = g[0].block_type.shape[1]
    tile_id, k_first, steps, role, first = stream_k_work(unit, gl.cdiv(g[3], BM) * gl.cdiv(g[4], BN),
                                                         gl.cdiv(g[5], BK), gl.num_programs(0), cfg[5])
    off_m, off_n = tile_origin(tile_id, g[3], g[4], BM, BN, cfg[1])
    return (off_m, off_n, k_first, role, first), steps


@gluon.jit
def _load(g, cfg: gl.constexpr, a_smem, b_smem, bar, tile, kk):
    BK: gl.constexpr = g[0].block_type.shape[1]
    k = (tile[2] + kk) * BK
    tma.async_copy_global_to_shared(g[0], [tile[0], k], bar, a_smem)
    if cfg[0]:
        tma.async_copy_global_to_shared(g[1], [tile[1], k], bar, b_smem)
    else:
        tma.async_copy_global_to_shared(g[1], [k, tile[1]], bar, b_smem)


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
        a_smem = a_smem.slice(cfg[6] * BM, BM)  # this consumer's rows of the A stage
    tok = warpgroup_mma(a_smem, b, acc, is_async=True)
    # keep one wgmma group in flight: the previous step's is done, so its stage can be refilled
    acc, _, _ = warpgroup_mma_wait(1, deps=(tok, a_smem, b_smem))
    return acc


@gluon.jit
def _drain(g, cfg: gl.constexpr, acc):
    return warpgroup_mma_wait(0, deps=(acc,))


@gluon.jit
def _finish(g, cfg: gl.constexpr, acc, tile, c_smem):
    if cfg[5]:  # stream-K: the unit may be part of a tile
        C: gl.constexpr = cfg[4]
        slot = gl.program_id(0) * C  # this consumer's workspace slot
        if C > 1:
            slot += cfg[6]
        if tile[3] == PARTIAL:
            publish_partial(acc, g[9], g[10], slot)
        elif tile[3] != NOTHING:
            if tile[3] == FINAL:  # the shares of programs tile[4] .. this one - 1 come first
                acc = add_partials(acc, g[9], g[10], slot - (gl.program_id(0) - tile[4]) * C, slot, C)
            _epilogue(g, cfg, acc, tile, c_smem)
    else:
        _epilogue(g, cfg, acc, tile, c_smem)


@gluon.jit
def _epilogue(g, cfg: gl.constexpr, acc, tile, c_smem):
    BM: gl.constexpr = g[0].block_type.shape[0] // cfg[4]
    off_m = tile[0]
    if cfg[4] > 1:
        off_m = off_m + cfg[6] * BM
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
def gemm_kernel(a_desc, b_desc, c_desc, M, N, K, bias_ptr, scale_a_ptr, scale_b_ptr, workspace, flags, num_units,
                B_T: gl.constexpr, GROUP_M: gl.constexpr, HAS_BIAS: gl.constexpr, SCALES: gl.constexpr,
                STAGES: gl.constexpr, CONSUMERS: gl.constexpr = 1, STREAM_K: gl.constexpr = False):
    """``num_units``: the tiles, or with STREAM_K ``tiles.schedule.stream_k_units``."""
    g = (a_desc, b_desc, c_desc, M, N, K, bias_ptr, scale_a_ptr, scale_b_ptr, workspace, flags)
    cfg: gl.constexpr = gl.constexpr((B_T, GROUP_M, HAS_BIAS, SCALES, CONSUMERS, STREAM_K))
    persistent_pipeline(g, cfg, a_desc, b_desc, c_desc, num_units, _setup, _load, _init, _compute,
                        _drain, _finish, STAGES, CONSUMERS=CONSUMERS)
