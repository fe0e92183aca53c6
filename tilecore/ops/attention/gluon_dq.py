"""Attention's dQ on Hopper, its own kernel on the tiles' Gluon pipeline template: the forward's
shape (a tile is 2 BLOCK_M query rows of one (batch, head), the ring streams its K and V blocks,
two consumer warpgroups of BLOCK_M rows each), with the backward's math. Per step, consumer c with
its rows' Q_c, dO_c, lse and delta (delta = rowsum(O * dO) - dlse, from the backward's preprocess):

    S   = Q_c K^T,   dP = dO_c V^T              wgmma, operands in shared memory
    P   = exp2(S * scale log2 e - lse log2 e)    (the forward's probabilities, recomputed)
    dS  = P * (dP - delta)
    dQ += dS K                                   wgmma, dS as the register operand

and dQ * scale is stored once per tile (a plain TMA store: no reduction, unlike the fused dQ of
gluon_backward.py, whose float32 partials every key block adds). With the dK/dV kernel run without
its dQ, that is the backward in seven matmuls per block (S and dP twice), the tl kernels' split,
with both halves on the template. Its tl twin, which the interpreter's tests run, is
kernels_tl.attn_bwd_dq (the same math, a program per query block).

Masks and empty rows as in the forward: keys past Nk and, causal, after a query's diagonal are
masked (a consumer skips the tile's key blocks past its own diagonal); query rows past N arrive as
zeros and rows with no key (lse = -inf) read lse = +inf, so their p, and dQ, are 0.

``g``   = (q_desc, k_desc, v_desc, dq_desc, lse_ptr, H, N, Nk, GROUP, scale_log2e, B * H, heads per group,
           do_desc, delta_ptr, scale)    (the forward's first twelve: its tile order and K/V loads)
``cfg`` = (CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM, False, 2, False, False[, consumer index])  (the forward's)
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from tilecore.tiles.gluon import head_grouped_tile, mask_scores, needs_mask, persistent_pipeline, wgmma_layout

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)


@gluon.jit
def _head(g, bh):
    """(batch, q head, kv head) of the flat index bh = batch * H + q head."""
    b = bh // g[5]
    h = bh % g[5]
    return b, h, h // g[8]


@gluon.jit
def _setup(g, cfg: gl.constexpr, tile_id):
    """The tile (first query row, batch * head, key blocks) and its steps, one a key block, in the
    forward's order: heads in groups (of g[11]) whose K and V stay in L2 together, query block by
    query block across a group's heads; causal, the heaviest blocks first, counted from the last row
    (a short block is the first, which starts at row 0: a TMA coordinate before row 0 traps)."""
    BM: gl.constexpr = cfg[1] * cfg[5]  # the tile's rows: both consumers'
    BN: gl.constexpr = cfg[2]
    N = g[6]
    Nk = g[7]
    bh, mb = head_grouped_tile(tile_id, gl.cdiv(N, BM), g[10], g[11])
    if cfg[0]:
        start_m = gl.maximum(N - (mb + 1) * BM, 0)
        hi = gl.maximum(gl.minimum(Nk, start_m + BM + (Nk - N)), 0)  # query i sees keys <= i + Nk - N
    else:
        start_m = mb * BM
        hi = Nk
    n_blocks = gl.cdiv(hi, BN)
    return (start_m, bh, n_blocks), n_blocks


@gluon.jit
def _load(g, cfg: gl.constexpr, k_smem, v_smem, bar, tile, kk):
    """Step kk's K and V blocks (rows past Nk arrive as zeros)."""
    b, h, hk = _head(g, tile[1])
    tma.async_copy_global_to_shared(g[1], [b, hk, kk * cfg[2], 0], bar, k_smem)
    tma.async_copy_global_to_shared(g[2], [b, hk, kk * cfg[2], 0], bar, v_smem)


@gluon.jit
def _load_q_do(g, cfg: gl.constexpr, bufs, bar, tile):
    """The producer's per-tile load: both consumers' query rows of Q and of dO (rows past N: zeros)."""
    b, h, hk = _head(g, tile[1])
    tma.async_copy_global_to_shared(g[0], [b, h, tile[0], 0], bar, bufs.index(0))
    tma.async_copy_global_to_shared(g[12], [b, h, tile[0], 0], bar, bufs.index(1))


@gluon.jit
def _init(g, cfg: gl.constexpr, tile, bufs):
    """dQ = 0, this consumer's rows' lse (times log2 e; +inf where a row must get p = 0) and delta,
    its first row, and its key blocks (causal: those up to its own rows' diagonal)."""
    BM: gl.constexpr = cfg[1]
    BN: gl.constexpr = cfg[2]
    D: gl.constexpr = cfg[3]
    s_layout: gl.constexpr = wgmma_layout(BM, BN, gl.num_warps())
    first = tile[0] + cfg[-1] * BM
    rows = first + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
    ok = rows < g[6]
    offs = tile[1].to(gl.int64) * g[6] + rows
    lse = gl.load(g[4] + offs, mask=ok, other=float("inf"))
    lse = gl.where(lse == float("-inf"), float("inf"), lse)
    delta = gl.load(g[13] + offs, mask=ok, other=0.0)
    n_own = tile[2]
    if cfg[0]:
        own_hi = gl.maximum(gl.minimum(g[7], first + BM + (g[7] - g[6])), 0)  # query i sees keys <= i + Nk - N
        n_own = gl.minimum(gl.cdiv(own_hi, BN), tile[2])
    dq = gl.zeros([BM, D], gl.float32, wgmma_layout(BM, D, gl.num_warps()))
    return dq, lse * LOG2E, delta, first, n_own


@gluon.constexpr_function
def _ds_layout(block_m, head_dim, num_warps):
    """dS as the register (left) operand of the dS K wgmma."""
    return gl.DotOperandLayout(operand_index=0, parent=wgmma_layout(block_m, head_dim, num_warps), k_width=2)


@gluon.jit
def _compute(g, cfg: gl.constexpr, state, k_smem, v_smem, kk, bufs):
    BM: gl.constexpr = cfg[1]
    BN: gl.constexpr = cfg[2]
    D: gl.constexpr = cfg[3]
    s_layout: gl.constexpr = wgmma_layout(BM, BN, gl.num_warps())
    dq, lse2, delta, first, n_own = state
    if kk < n_own:  # causal: the tile's later key blocks are all masked for this consumer's rows
        q = bufs.index(0).reshape([2 * BM, D]).slice(cfg[-1] * BM, BM)
        do = bufs.index(1).reshape([2 * BM, D]).slice(cfg[-1] * BM, BM)
        k = k_smem.reshape([BN, D])
        zeros = gl.zeros([BM, BN], gl.float32, s_layout)
        s_tok = warpgroup_mma(q, k.permute((1, 0)), zeros, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(do, v_smem.reshape([BN, D]).permute((1, 0)), zeros, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok,))  # dP may still run
        start_n = kk * BN
        if needs_mask(first, start_n, BN, g[6], g[7], cfg[0]):
            s = mask_scores(s, s_layout, first, start_n, g[6], g[7], cfg[0], KEY_AXIS=1)
        p = gl.exp2(s * g[9] - gl.expand_dims(lse2, 1))
        dp = warpgroup_mma_wait(0, deps=(dp_tok,))
        ds = p * (dp - gl.expand_dims(delta, 1))
        # the register operand is written with no wgmma running (ptxas serializes every wgmma of a
        # kernel that writes a running wgmma's input registers: its warning C7513)
        ds_op = gl.convert_layout(ds.to(k_smem.dtype), _ds_layout(BM, D, gl.num_warps()))
        dq = warpgroup_mma(ds_op, k, dq)
    return dq, lse2, delta, first, n_own


@gluon.jit
def _drain(g, cfg: gl.constexpr, state):
    return state  # every step ends with its wgmma complete


@gluon.jit
def _finish(g, cfg: gl.constexpr, state, tile, out_smem):
    """dQ * scale of this consumer's rows, through its epilogue buffer (rows past N clipped)."""
    BM: gl.constexpr = cfg[1]
    D: gl.constexpr = cfg[3]
    dq, lse2, delta, first, n_own = state
    b, h, hk = _head(g, tile[1])
    tma.store_wait(0)  # the buffer's previous TMA store has read it
    out_smem.reshape([BM, D]).store((dq * g[14]).to(out_smem.dtype))
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(g[3], [b, h, first, 0], out_smem)


@gluon.jit
def attention_dq_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, qdo_desc, lse_ptr, delta_ptr, H, N, Nk, GROUP,
                        scale, scale_log2e, num_bh, head_group, schedule, CAUSAL: gl.constexpr,
                        STAGES: gl.constexpr):
    """dQ of attention for every (2 query blocks, batch * head); a persistent grid of two consumer
    warpgroups of 4 warps and a producer warp. q_desc/do_desc: the rows of both consumers (their
    boxes), qdo_desc the same box (the per-tile buffers' shape), dq_desc one consumer's rows."""
    BM: gl.constexpr = dq_desc.block_type.shape[2]
    BN: gl.constexpr = k_desc.block_type.shape[2]
    D: gl.constexpr = k_desc.block_type.shape[3]
    gl.static_assert(q_desc.block_type.shape[2] == 2 * BM, "a tile is both consumers' query rows")
    g = (q_desc, k_desc, v_desc, dq_desc, lse_ptr, H, N, Nk, GROUP, scale_log2e, num_bh, head_group, do_desc,
         delta_ptr, scale)
    cfg: gl.constexpr = gl.constexpr((CAUSAL, BM, BN, D, False, 2, False, False))
    num_tiles = gl.cdiv(N, 2 * BM) * num_bh
    persistent_pipeline(g, cfg, k_desc, v_desc, dq_desc, num_tiles, _setup, _load, _init, _compute, _drain, _finish,
                        STAGES, CONSUMERS=2, IN_FLIGHT=0, tile_desc=qdo_desc, load_tile=_load_q_do, TILE_OPERANDS=2,
                        TILE_SHARED=True, schedule=schedule)
