"""Attention backward on Hopper, in one kernel, as the small functions of the tiles' Gluon pipeline
template (:func:`tilecore.tiles.gluon.persistent_pipeline`, the GEMM's and the forward's).

A tile is 2 BLOCK_N keys of one (batch, kv head). Its K and V blocks are the template's shared
per-tile operands; each of the two consumer warpgroups owns BLOCK_N of the keys and keeps their dK
and dV in registers for the whole tile. The ring streams (Q, dO) blocks of BLOCK_M queries, for
every q head of the kv head's group (grouped-query attention sums there, without atomics). Per step
consumer c, with keys K_c and values V_c:

    S^T  = K_c Q^T,  dP^T = V_c dO^T        wgmma, operands in shared memory
    P^T  = exp2(S^T * scale log2 e - lse log2 e)   (recomputed with the forward's lse)
    dS^T = P^T * (dP^T - delta)             delta = rowsum(O * dO) - dlse, from a preprocess
    dV_c += P^T dO,  dK_c += dS^T Q         wgmma with P^T and dS^T as register operands

With DQ > 0 both consumers also write dS^T to shared memory (a double buffer, two mbarriers:
both halves written; both readers done) and each computes half of dQ's columns (of the step itself,
or of the previous step: see ``_compute``),

    dQ[:, half c] += scale * dS K[:, half c]  wgmma of dS from shared memory (a transposed view),

added to a float32 dQ by TMA reductions: five matmuls per step, none recomputed (FlashAttention-3's
scheme). With DQ = 0 a separate kernel computes dQ (seven matmuls in all).

The step's rows' lse and delta arrive with its Q and dO, by TMA into the stage's side buffer (the
template's ``z_desc``), from a (B * H, 2, N) view of a row-padded buffer that the preprocess writes
(lse with -inf made +inf, so that a row with no key gets p = 0, and delta): read from shared memory
straight into S^T's columns (loaded by pointer they cost three partition barriers a step:
notes/attention, session 14).

Masks: keys past Nk (only the last key block) and, when causal, keys after a query's diagonal
(only blocks crossing it). Query rows past N arrive as zeros, Q, dO, lse and delta alike: their p
is exp(0) = 1 but meets zero dO and zero dP, so they add nothing. Rows with no key at all (lse =
-inf, read as +inf) give p = 0 and zero gradients.

``g``   = (q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, stats_desc, dq_desc, H, N, Nk, GROUP, scale,
           scale_log2e, B * Hkv, kv heads per tile group, ds_smem, ds_full, ds_free, dq_staging)
``cfg`` = (CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM, DQ, KV_REGS[, consumer index])
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from tilecore.tiles.gluon import (head_grouped_tile, mask_scores, needs_mask, persistent_pipeline, tma_reduce_add,
                                  wgmma_layout)

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)


@gluon.jit
def _kv_head(g, bhk):
    """(batch, kv head) of the flat index bhk = batch * Hkv + kv head."""
    hkv = g[8] // g[11]
    return bhk // hkv, bhk % hkv


@gluon.jit
def _tile_kv_head(g, tile):
    """(batch, kv head) of a tile: with grouped heads from the tile (divided once, in _setup); with
    one q head a kv head (GROUP specialized to 1) divided where used, as the kernel was measured
    before grouped heads took the tile's (the same PTX as then)."""
    if g[11] == 1:
        b, hk = _kv_head(g, tile[1])
    else:
        b, hk = tile[5], tile[6]
    return b, hk


@gluon.jit
def _setup(g, cfg: gl.constexpr, tile_id):
    """The tile (first key, batch * kv head, first query block, query blocks per q head, where its
    walk starts (_step_rows), batch, kv head, the q head its walk starts at, 1 / group size) and its
    steps: every query block that sees one of its keys, for each q head of the group. With grouped
    heads whatever needs a division by a runtime value is here, once a tile: ptxas had recomputed
    the batch and kv head's divisions inside the consumers' step loop, ~170 instructions a step."""
    BM: gl.constexpr = cfg[1]
    BN: gl.constexpr = 2 * cfg[2]  # both consumers' keys
    N = g[9]
    Nk = g[10]
    n_blocks = gl.cdiv(Nk, BN)
    # Order: kv heads in groups (of g[15]) whose Q and dO stay in L2 together; within a group, key
    # block by key block across its heads. Causal, the first key blocks see the most queries, so
    # the heaviest tiles come first and the persistent programs even out.
    bhk, key_block = head_grouped_tile(tile_id, n_blocks, g[14], g[15])
    start_n = key_block * BN
    first_mb = 0
    if cfg[0]:  # query i sees keys j <= i + Nk - N: the first query that sees key start_n
        first_mb = gl.maximum(start_n - (Nk - N), 0) // BM
    per_head = gl.maximum(gl.cdiv(N, BM) - first_mb, 0)
    shift = key_block % gl.maximum(per_head, 1)  # where this tile's walk starts (_step_rows)
    b = bhk
    hk = bhk  # unused with one q head a kv head: _tile_kv_head divides where used
    if g[11] != 1:
        b, hk = _kv_head(g, bhk)
    # with grouped heads, causal: the later key block of a pair (plan.paired_table) walks up
    upward = cfg[0] and 2 * key_block > n_blocks - 1
    return ((start_n, bhk, first_mb, per_head, shift, b, hk, key_block % g[11], 1.0 / g[11], upward),
            per_head * g[11])


@gluon.jit
def _step_rows(g, cfg: gl.constexpr, tile, kk):
    """Step kk's (q head, first query row).

    One q head a kv head (GROUP specialized to 1): the tiles of the head walk its query blocks from
    different starting blocks (the key block's index, wrapping around), so that their dQ
    reductions, running at the same time, add to different rows.

    Grouped heads: every tile walks the query blocks from the last down, and at each block the
    group's q heads (starting at the key block's index, wrapping around). The tiles of a kv head,
    running at the same time, are then at the same query block: between them they use the group's
    rows of a few blocks, which L2 keeps while every tile reads them (notes/attention, session 20).
    Causal, a program runs key blocks in pairs, a heavy one and then a light one (plan.paired_table):
    the light one walks up from its diagonal, so that the second walks of a kv head's programs also
    meet (at block t - 2 when the first walks are at n - 1 - t). kk // G comes from a float32
    reciprocal with one correction each way, exact for kk < 2^24 (plan.steps_exact): an integer
    division by a runtime value is ~25 instructions (session 14)."""
    b, hk = _tile_kv_head(g, tile)
    per_head = tile[3]
    if g[11] == 1:
        head = kk * 0
        walked = kk + tile[4]
        block = tile[2] + gl.where(walked >= per_head, walked - per_head, walked)
    else:
        group = g[11]
        walked = (kk.to(gl.float32) * tile[8]).to(gl.int32)  # kk // group, or one off
        head = kk - walked * group
        walked = gl.where(head >= group, walked + 1, gl.where(head < 0, walked - 1, walked))
        head = kk - walked * group + tile[7]
        head = gl.where(head >= group, head - group, head)
        block = tile[2] + gl.where(tile[9], walked, per_head - 1 - walked)
    return hk * g[11] + head, block * cfg[1]


@gluon.jit
def _load(g, cfg: gl.constexpr, q_bufs, do_smem, bar, tile, kk):
    """Step kk's Q and dO blocks and its rows' lse and delta (rows past N arrive as zeros)."""
    q_smem, stats_smem = q_bufs
    b, hk = _tile_kv_head(g, tile)
    h, start_m = _step_rows(g, cfg, tile, kk)
    tma.async_copy_global_to_shared(g[0], [b, h, start_m, 0], bar, q_smem)
    tma.async_copy_global_to_shared(g[3], [b, h, start_m, 0], bar, do_smem)
    tma.async_copy_global_to_shared(g[6], [b * g[8] + h, 0, start_m], bar, stats_smem)


@gluon.jit
def _load_kv(g, cfg: gl.constexpr, kv_smem, bar, tile):
    """The producer's per-tile load: the tile's K and V blocks (rows past Nk arrive as zeros)."""
    b, hk = _tile_kv_head(g, tile)
    tma.async_copy_global_to_shared(g[1], [b, hk, tile[0], 0], bar, kv_smem.index(0))
    tma.async_copy_global_to_shared(g[2], [b, hk, tile[0], 0], bar, kv_smem.index(1))


@gluon.jit
def _stat_columns(stats_smem, which: gl.constexpr, st_layout: gl.constexpr):
    """Row statistic ``which`` (0: lse, 1: delta) of the step's rows, from the stage's side buffer,
    as the columns of S^T (in ``st_layout``)."""
    BM: gl.constexpr = stats_smem.shape[2]
    # the unswizzled TMA box is row-major (lse's BM rows, then delta's): the same bytes as a flat vector
    flat = stats_smem._reinterpret(gl.float32, [2 * BM], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    return flat.slice(which * BM, BM).load(gl.SliceLayout(0, st_layout))


@gluon.jit
def _init(g, cfg: gl.constexpr, tile, kv_smem):
    BM: gl.constexpr = cfg[1]
    BN: gl.constexpr = cfg[2]
    D: gl.constexpr = cfg[3]
    acc_layout: gl.constexpr = wgmma_layout(BN, D, gl.num_warps())
    dk = gl.zeros([BN, D], gl.float32, acc_layout)
    dv = gl.zeros([BN, D], gl.float32, acc_layout)
    if cfg[5]:  # this consumer's K and V rows as register operands for the whole tile
        c: gl.constexpr = cfg[-1]
        a_layout: gl.constexpr = _operand_layout(BN, BM, gl.num_warps())
        k_c = kv_smem.index(0).reshape([2 * BN, D]).slice(c * BN, BN).load(a_layout)
        v_c = kv_smem.index(1).reshape([2 * BN, D]).slice(c * BN, BN).load(a_layout)
        return dk, dv, tile, k_c, v_c
    else:
        return dk, dv, tile, 0, 0


@gluon.constexpr_function
def _operand_layout(rows, cols, num_warps):
    """A [rows, k] register tile as the left operand of a wgmma with a [rows, cols] result."""
    return gl.DotOperandLayout(operand_index=0, parent=wgmma_layout(rows, cols, num_warps), k_width=2)


@gluon.jit
def _probabilities(g, cfg: gl.constexpr, s_t, lse, start_n, start_m):
    """P^T (keys x queries) from the scores S^T (keys from start_n, queries from start_m) and the
    rows' lse as its columns (natural log; +inf for rows that must get p = 0)."""
    st_layout: gl.constexpr = s_t.type.layout
    if needs_mask(start_m, start_n, s_t.shape[0], g[9], g[10], cfg[0]):
        s_t = mask_scores(s_t, st_layout, start_m, start_n, g[9], g[10], cfg[0], KEY_AXIS=0)
    return gl.exp2(s_t * g[13] - gl.expand_dims(lse * LOG2E, 0))


@gluon.jit
def _issue_dq(g, cfg: gl.constexpr, kv_smem, step):
    """Issue this consumer's half of dQ = dS K for ring step ``step`` once both halves of its dS
    are in shared memory (buffer step % 2, its use step // 2). For step -1 (a program's first step
    has no previous one) the wait passes at once and the product is never added."""
    DH: gl.constexpr = cfg[3] // 2
    buf = (step + 2) % 2
    mbarrier.wait(g[17].index(buf), ((step + 2) // 2 + 1) & 1)  # (step // 2) & 1, and 1 for step -1
    return _ds_times_k(g, cfg, buf, kv_smem, cfg[-1] * DH, DH)


@gluon.jit
def _ds_times_k(g, cfg: gl.constexpr, buf, kv_smem, first_col: gl.constexpr, COLS: gl.constexpr):
    """dS K[:, first_col : first_col + COLS] for the step in dS buffer ``buf``, issued (dS is read
    through a transposed view of the [keys, queries] buffer)."""
    BM: gl.constexpr = cfg[1]
    k_cols = kv_smem.index(0).reshape([2 * cfg[2], cfg[3]]).slice(first_col, COLS, dim=1)
    return warpgroup_mma(g[16].index(buf).permute((1, 0)), k_cols,
                         gl.zeros([BM, COLS], gl.float32, wgmma_layout(BM, COLS, gl.num_warps())), use_acc=False,
                         is_async=True)


@gluon.jit
def _reduce_dq(g, staging, dq, coord, PENDING: gl.constexpr):
    """Add scale * dq to the float32 dQ at ``coord`` through ``staging`` with one TMA reduction
    (rows past N are dropped), once at most PENDING of this partition's reductions still read
    their buffers (so this buffer's last one has read it)."""
    tma.store_wait(PENDING)
    staging.reshape(dq.shape).store(dq * g[12])
    fence_async_shared()
    gl.thread_barrier()
    tma_reduce_add(g[7], coord, staging)


@gluon.jit
def _add_dq(g, cfg: gl.constexpr, tile, kk, dq):
    """Add scale * dq (this consumer's half of the columns of step kk's rows) to the float32 dQ,
    through this consumer's staging buffer."""
    b, hk = _tile_kv_head(g, tile)
    h, start_m = _step_rows(g, cfg, tile, kk)
    _reduce_dq(g, g[19].index(cfg[-1]), dq, [b, h, start_m, cfg[-1] * (cfg[3] // 2)], 0)


@gluon.jit
def _compute(g, cfg: gl.constexpr, state, q_bufs, do_smem, kk, kv_smem, i):
    """One step; where dQ comes from is cfg[4]:
    0: not here (a dq kernel after this one);
    1 (fused): this step's dQ, once both consumers wrote their dS, then added;
    3 (lagged): the previous step's dQ, issued with this step's dV and dK, after the softmax, when
       S^T and dP^T no longer hold registers: no consumer waits for the other's dS of the same
       step, and dQ is staged and added under dV and dK. A tile's first step multiplies a stale
       buffer (never added) and its last step also takes its own dQ (notes/attention, session 15);
    4 (warpgroup): not in the consumers: they write dS^T as for 1 and 3 and go on; a warpgroup of its
       own (the template's helper: ``_dq_issue``, ``_dq_finish``) computes and adds each step's dQ.
    (The dQ schemes tried and dropped are in notes/attention's decision log.)"""
    BM: gl.constexpr = cfg[1]
    BN: gl.constexpr = cfg[2]
    D: gl.constexpr = cfg[3]
    MODE: gl.constexpr = cfg[4]
    c: gl.constexpr = cfg[-1]  # this consumer: keys [c BN, (c + 1) BN) of the tile
    st_layout: gl.constexpr = wgmma_layout(BN, BM, gl.num_warps())
    q_smem, stats_smem = q_bufs
    dk, dv, tile, k_regs, v_regs = state
    b, hk = _tile_kv_head(g, tile)
    h, start_m = _step_rows(g, cfg, tile, kk)
    start_n = tile[0] + c * BN
    q = q_smem.reshape([BM, D])
    do = do_smem.reshape([BM, D])
    if cfg[5]:
        k_c = k_regs
        v_c = v_regs
    else:
        k_c = kv_smem.index(0).reshape([2 * BN, D]).slice(c * BN, BN)
        v_c = kv_smem.index(1).reshape([2 * BN, D]).slice(c * BN, BN)

    zeros = gl.zeros([BN, BM], gl.float32, st_layout)
    s_tok = warpgroup_mma(k_c, q.permute((1, 0)), zeros, use_acc=False, is_async=True)
    dp_tok = warpgroup_mma(v_c, do.permute((1, 0)), zeros, use_acc=False, is_async=True)
    lse_cols = _stat_columns(stats_smem, 0, st_layout)
    s_t = warpgroup_mma_wait(1, deps=(s_tok,))
    p_t = _probabilities(g, cfg, s_t, lse_cols, start_n, start_m)
    delta_cols = _stat_columns(stats_smem, 1, st_layout)
    dp_t = warpgroup_mma_wait(0, deps=(dp_tok,))
    ds_t = p_t * (dp_t - gl.expand_dims(delta_cols, 0))
    # both register operands are written with no wgmma running: ptxas serializes every wgmma of a
    # kernel that writes a wgmma's input registers while another runs (its warning C7513)
    ds_t = ds_t.to(q_smem.dtype)
    p_op = gl.convert_layout(p_t.to(q_smem.dtype), _operand_layout(BN, D, gl.num_warps()))
    ds_op = gl.convert_layout(ds_t, _operand_layout(BN, D, gl.num_warps()))
    if MODE != 0:
        mbarrier.wait(g[18].index(i % 2), ((i // 2) & 1) ^ 1)  # both read this buffer two steps ago
    if MODE == 3:
        dq_tok = _issue_dq(g, cfg, kv_smem, i - 1)  # read when dV and dK are issued: complete first
    dv_tok = warpgroup_mma(p_op, do, dv, is_async=True)
    if MODE != 1:
        dk_tok = warpgroup_mma(ds_op, q, dk, is_async=True)
    if MODE != 0:
        g[16].index(i % 2).slice(c * BN, BN).store(ds_t)
        fence_async_shared()
        mbarrier.arrive(g[17].index(i % 2))
    # dV and dK complete within the step: left running into the next one, their accumulators are
    # moved (the template's loop) under a running wgmma, and ptxas serializes every wgmma (C7515)
    if MODE == 0 or MODE == 4:
        dv, dk = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok))
    elif MODE == 1:
        # dK is issued after dQ so that dQ's staging and reduction run under it (wgmma groups
        # complete in order): D128 +1-5% (notes/attention, session 14)
        dq_tok = _issue_dq(g, cfg, kv_smem, i)
        dk_tok = warpgroup_mma(ds_op, q, dk, is_async=True)
        dq, dv = warpgroup_mma_wait(1, deps=(dq_tok, dv_tok))
        mbarrier.arrive(g[18].index(i % 2))
        _add_dq(g, cfg, tile, kk, dq)
        dk = warpgroup_mma_wait(0, deps=(dk_tok,))
    else:  # 3 (lagged)
        dq = warpgroup_mma_wait(2, deps=(dq_tok,))  # dV and dK still run
        mbarrier.arrive(g[18].index((i + 1) % 2), pred=i > 0)  # this consumer has read step i - 1's dS
        if kk > 0:
            _add_dq(g, cfg, tile, kk - 1, dq)  # while this step's dV and dK run
        if kk == tile[3] * g[11] - 1:  # the tile's last step: its own dQ now
            dq_tok = _issue_dq(g, cfg, kv_smem, i)
            dq, dv, dk = warpgroup_mma_wait(0, deps=(dq_tok, dv_tok, dk_tok))
            _add_dq(g, cfg, tile, kk, dq)
        else:
            dv, dk = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok))
    return dk, dv, tile, k_regs, v_regs


@gluon.jit
def _dq_issue(g, cfg: gl.constexpr, tile, kk, i, kv_smem):
    """DQ mode 4, the helper warpgroup's step (with ``_dq_finish``): once both consumers wrote step
    i's dS, start the product of dQ's first column piece, dS K[:, piece] (pieces of dq_desc's box
    width, each staged in a buffer of its own and added by a TMA reduction)."""
    mbarrier.wait(g[17].index(i % 2), (i // 2) & 1)
    return _ds_times_k(g, cfg, i % 2, kv_smem, 0, g[7].block_type.shape[3])


@gluon.jit
def _dq_finish(g, cfg: gl.constexpr, tile, kk, i, kv_smem, dq):
    """The rest of ``_dq_issue``'s step: each piece added in turn (one product in flight), the
    step's dS let go once the last one is read."""
    PIECE: gl.constexpr = g[7].block_type.shape[3]
    PIECES: gl.constexpr = cfg[3] // PIECE
    b, hk = _tile_kv_head(g, tile)
    h, start_m = _step_rows(g, cfg, tile, kk)
    for p in gl.static_range(PIECES):
        if p > 0:
            dq = _ds_times_k(g, cfg, i % 2, kv_smem, p * PIECE, PIECE)
        dq = warpgroup_mma_wait(0, deps=(dq,))
        if p == PIECES - 1:
            mbarrier.arrive(g[18].index(i % 2))  # dS read: the consumers may write the buffer again
        # the pieces' reductions go out in order: the last step's of this buffer is PIECES back
        _reduce_dq(g, g[19].index(p), dq, [b, h, start_m, p * PIECE], PIECES - 1)


@gluon.jit
def _drain(g, cfg: gl.constexpr, state):
    return state  # every step ends with its wgmma complete


@gluon.jit
def _finish(g, cfg: gl.constexpr, state, tile, out_smem):
    """dV, then dK (times the scale), through this consumer's epilogue buffer; rows past Nk are
    clipped by the TMA stores."""
    BN: gl.constexpr = cfg[2]
    D: gl.constexpr = cfg[3]
    dk = state[0]
    dv = state[1]
    b, hk = _tile_kv_head(g, tile)
    start_n = tile[0] + cfg[-1] * BN
    for which in gl.static_range(2):
        tma.store_wait(0)  # the buffer's previous TMA store has read it
        if which == 0:
            out_smem.reshape([BN, D]).store(dv.to(out_smem.dtype))
        else:
            out_smem.reshape([BN, D]).store((dk * g[12]).to(out_smem.dtype))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(g[5 - which], [b, hk, start_n, 0], out_smem)


@gluon.constexpr_function
def _ds_layout(dtype):
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=dtype.primitive_bitwidth, rank=2)


@gluon.jit
def attention_bwd_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, stats_desc, dq_desc, H, N, Nk, GROUP,
                         scale, scale_log2e, num_bhk, head_group, schedule, tile_counter, CAUSAL: gl.constexpr,
                         STAGES: gl.constexpr, DQ: gl.constexpr, KV_REGS: gl.constexpr = False):
    """dK and dV (and with DQ 1, 3 or 4, dQ added to dq_desc's float32 tensor: see _compute) for every
    (key block, batch * kv head); a persistent grid of 2 consumer warpgroups of 4 warps and a
    producer warp. Each program takes its tiles from ``schedule`` (a balanced table), round-robin
    (both None), or draws them from ``tile_counter`` as it gets to them (the template's dynamic
    tiles, in tile-id order: the head groups' L2 reuse stays)."""
    BM: gl.constexpr = q_desc.block_type.shape[2]
    BN: gl.constexpr = dk_desc.block_type.shape[2]  # one consumer's keys; k_desc's block holds both
    D: gl.constexpr = q_desc.block_type.shape[3]
    gl.static_assert(k_desc.block_type.shape[2] == 2 * BN, "K and V blocks hold both consumers' keys")
    # dS^T of the step, both consumers' halves, double-buffered, and its barriers: written by both,
    # read by both
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [2, 2 * BN, BM], _ds_layout(q_desc.dtype))
    ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(2):
        mbarrier.init(ds_full.index(j), count=2)
        mbarrier.init(ds_free.index(j), count=1 if DQ == 4 else 2)
    if DQ == 4:  # the dQ warpgroup's column pieces on their way to TMA reductions
        dq_staging = gl.allocate_shared_memory(dq_desc.dtype, [D // dq_desc.block_type.shape[3]] +
                                               dq_desc.block_type.shape, dq_desc.layout)
    elif DQ > 0:  # each consumer's dQ half on its way to a TMA reduction
        dq_staging = gl.allocate_shared_memory(dq_desc.dtype, [2] + dq_desc.block_type.shape, dq_desc.layout)
    else:
        dq_staging = ds_smem  # unused
    g = (q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, stats_desc, dq_desc, H, N, Nk, GROUP, scale, scale_log2e,
         num_bhk, head_group, ds_smem, ds_full, ds_free, dq_staging)
    cfg: gl.constexpr = gl.constexpr((CAUSAL, BM, BN, D, DQ, KV_REGS))
    num_tiles = gl.cdiv(Nk, 2 * BN) * num_bhk
    # with the dQ warpgroup (D = 64 only) four warpgroups share 512 registers a thread: consumers 200,
    # helper 88, producer 24; D = 128's consumers need 224, too many for it (notes/attention, session 17)
    gl.static_assert(DQ != 4 or D == 64, "the dQ warpgroup (DQ 4) fits D = 64")
    persistent_pipeline(g, cfg, q_desc, do_desc, dk_desc, num_tiles, _setup, _load, _init, _compute, _drain,
                        _finish, STAGES, PRODUCER_REGS=24, CONSUMERS=2, CONSUMER_REGS=200 if DQ == 4 else 240,
                        IN_FLIGHT=0, tile_desc=k_desc, load_tile=_load_kv, TILE_OPERANDS=2, TILE_SHARED=True,
                        STEP_INDEX=True, schedule=schedule, z_desc=stats_desc,
                        helper=(_dq_issue, _dq_finish) if DQ == 4 else None, HELPER_REGS=88,
                        tile_counter=tile_counter)
    for j in gl.static_range(2):
        mbarrier.invalidate(ds_full.index(j))
        mbarrier.invalidate(ds_free.index(j))
