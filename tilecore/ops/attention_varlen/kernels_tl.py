"""Portable Triton (``tl``) kernels for packed variable-length batches (``attention_varlen``).

Packed layout (flash-attn's varlen): q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv),
any strides; sequence b owns query rows [cu_q[b], cu_q[b + 1]) and key rows [cu_k[b], cu_k[b + 1]).
lse and delta are float32 (Hq, total_q), contiguous. q head h reads kv head h // GROUP.

Grid of the packed kernels: (blocks, heads), where ``blocks`` is an upper bound on the number of
row blocks over all sequences (cdiv(total, BLOCK) + B: no host sync, the shapes say it) and
CU_BLOCKS (B + 1, int32, on the device) is the running count of each sequence's blocks (made by
torch ops on the device). A program finds its sequence by a binary search of CU_BLOCKS
(``sequence_of_block``), and a program past the last block returns at once. Blocks never straddle
two sequences, so every mask is per sequence.

Masks (flash-attn's, reference.py's): query i of a sequence with N queries and Nk keys sits at key
position i' = i + Nk - N and attends keys j < Nk with i' - left <= j <= i' + right where LEFT /
RIGHT say the bound is on (causal is RIGHT with right = 0). Key blocks wholly outside a block's
window are skipped (the loops' bounds), so a window's cost is proportional to its width; with
UNMASKED_MIDDLE, blocks every row sees whole run without the mask (masked edge, unmasked middle,
masked edge: three loops). softcap
(SOFTCAP): s = softcap * tanh(scale * q.k / softcap), tanh by tanh.approx.f32 on the GPU (SOFTCAP 2),
through exp2 in the interpreter (SOFTCAP 1: neither libdevice nor inline asm runs
in the interpreter); the backward multiplies dS by 1 - tanh^2. Scores are scaled (and capped)
before masking, then taken to base 2 for exp2; the online softmax, the "no key" rule (O = 0,
lse = -inf) and NaN propagation are attention's (kernels_tl.py's docstring).
"""
from __future__ import annotations

import triton
import triton.language as tl

from tilecore.ops.attention.kernels_tl import normalized
from tilecore.ops.attention_varlen.work import write_work_entries
from tilecore.tiles.ops import LOG2E_IN_KERNEL, online_softmax_start, online_softmax_update


@triton.jit
def tanh_approx(x):
    """tanh(x) by the SFU's tanh.approx.f32 (one instruction, relative error ~2^-11; GPU only: inline
    asm does not run in the interpreter)."""
    return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def capped(s, softcap, SOFTCAP: tl.constexpr):
    """softcap tanh(s / softcap) of scaled scores s: SOFTCAP 2 by tanh.approx.f32 (the GPU's), else
    softcap - 2 softcap / (e^(2 s / softcap) + 1) through exp2 (the interpreter's)."""
    if SOFTCAP == 2:
        return softcap * tanh_approx(s * (1.0 / softcap))
    else:
        return softcap - (2.0 * softcap) / (tl.exp2(s * (2.0 * LOG2E_IN_KERNEL / softcap)) + 1.0)


@triton.jit
def tanh_of(capped_s, softcap, SOFTCAP: tl.constexpr):
    """tanh(s / softcap) back from capped(s) (for the derivative 1 - tanh^2)."""
    if SOFTCAP == 2:
        return capped_s * (1.0 / softcap)
    else:
        return capped_s / softcap


@triton.jit
def sequence_of_block(CU_BLOCKS, t, B, SEARCH_STEPS: tl.constexpr):
    """The sequence b whose blocks hold block t: the largest b < B with CU_BLOCKS[b] <= t (a sequence
    with no block has CU_BLOCKS[b] == CU_BLOCKS[b + 1] and is passed over). SEARCH_STEPS >= log2(B) + 1."""
    lo = t * 0
    hi = lo + B - 1
    for _ in tl.static_range(SEARCH_STEPS):
        mid = (lo + hi + 1) // 2
        before = tl.load(CU_BLOCKS + mid) <= t
        lo = tl.where(before, mid, lo)
        hi = tl.where(before, hi, mid - 1)
    return lo


@triton.jit
def query_block(CU_Q, CU_K, CU_BLOCKS, t, B, SEARCH_STEPS: tl.constexpr, BLOCK_M: tl.constexpr):
    """Query block t over all sequences: its sequence b, the sequence's first query row q0 and query
    count n, first key row k0 and key count nk, and the block's first row within the sequence."""
    b = sequence_of_block(CU_BLOCKS, t, B, SEARCH_STEPS)
    q0 = tl.load(CU_Q + b)
    k0 = tl.load(CU_K + b)
    return (b, q0, tl.load(CU_Q + b + 1) - q0, k0, tl.load(CU_K + b + 1) - k0,
            (t - tl.load(CU_BLOCKS + b)) * BLOCK_M)


@triton.jit
def key_range(first_position, last_position, key_end, left, right, BLOCK_N: tl.constexpr,
              LEFT: tl.constexpr, RIGHT: tl.constexpr):
    """[lo, hi) of the keys that queries at positions first..last may see, lo a multiple of BLOCK_N."""
    lo = first_position * 0
    hi = lo + key_end
    if LEFT:
        lo = (tl.maximum(first_position - left, 0) // BLOCK_N) * BLOCK_N
    if RIGHT:
        hi = tl.minimum(hi, last_position + right + 1)
    return lo, hi


@triton.jit
def seen_keys(key_ok, offs_n, position, left, right, LEFT: tl.constexpr, RIGHT: tl.constexpr):
    """[rows, keys] mask of the keys offs_n a row at ``position`` sees: inside its sequence (key_ok) and, with
    LEFT / RIGHT, at most left before and right after the position."""
    ok = key_ok[None, :]
    if LEFT:
        ok = ok & (offs_n[None, :] >= position[:, None] - left)
    if RIGHT:
        ok = ok & (offs_n[None, :] <= position[:, None] + right)
    return ok


@triton.jit
def unmasked_keys(first, last, key_end, lo, hi, left, right, BLOCK_N: tl.constexpr, LEFT: tl.constexpr,
                  RIGHT: tl.constexpr):
    """[mid_lo, mid_hi) within [lo, hi), both lo plus multiples of BLOCK_N: the key blocks that every
    query at positions first..last sees whole (no key past key_end, none outside a window), which
    skip the mask; rows past the sequence's end may see them too (their outputs are not stored)."""
    mid_lo = lo
    if LEFT:  # keys >= last - left
        mid_lo = tl.maximum(lo, ((tl.maximum(last - left, 0) + BLOCK_N - 1) // BLOCK_N) * BLOCK_N)
    bound = key_end
    if RIGHT:  # keys <= first + right
        bound = tl.minimum(bound, first + right + 1)
    mid_hi = (tl.maximum(bound, 0) // BLOCK_N) * BLOCK_N
    mid_lo = tl.minimum(mid_lo, hi)
    return mid_lo, tl.maximum(mid_lo, tl.minimum(mid_hi, hi))


@triton.jit
def _fwd_step(q, k_base, v_base, k0, start_n, offs_n0, offs_d, offs_dv, d_ok, dv_ok, nk, skt, skd, svt, svd,
              position, left, right, scale, softcap, m_i, l_i, acc,
              LEFT: tl.constexpr, RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, MASKED: tl.constexpr):
    """Fold key block start_n into the rows' online softmax; MASKED: keys past nk and outside the
    window to -inf (else every key of the block is seen by every row)."""
    offs_n = start_n + offs_n0
    key_rows = (k0 + offs_n).to(tl.int64)
    if MASKED:
        key_ok = offs_n < nk
        k = tl.load(k_base + key_rows[:, None] * skt + offs_d[None, :] * skd, mask=key_ok[:, None] & d_ok[None, :],
                    other=0.0)
        v = tl.load(v_base + key_rows[:, None] * svt + offs_dv[None, :] * svd,
                    mask=key_ok[:, None] & dv_ok[None, :], other=0.0)
    else:
        k = tl.load(k_base + key_rows[:, None] * skt + offs_d[None, :] * skd, mask=d_ok[None, :], other=0.0)
        v = tl.load(v_base + key_rows[:, None] * svt + offs_dv[None, :] * svd, mask=dv_ok[None, :], other=0.0)
    s = tl.dot(q, tl.trans(k)) * scale
    if SOFTCAP:  # softcap * tanh(s / softcap)
        s = capped(s, softcap, SOFTCAP)
    if MASKED:
        ok = seen_keys(key_ok, offs_n, position, left, right, LEFT, RIGHT)
        s = tl.where(ok, s * LOG2E_IN_KERNEL, float("-inf"))
    else:
        s = s * LOG2E_IN_KERNEL
    m_i, l_i, acc, p = online_softmax_update(m_i, l_i, acc, s, 1.0)
    return m_i, l_i, tl.dot(p.to(v.dtype), v, acc)


@triton.jit
def _packed_rows(base, first_row, offs, rows_ok, cols, cols_ok, s_row, s_col):
    """(pointers, mask) of packed rows first_row + offs (64-bit) and columns ``cols`` of one head."""
    rows = (first_row + offs).to(tl.int64)
    return base + rows[:, None] * s_row + cols[None, :] * s_col, rows_ok[:, None] & cols_ok[None, :]


# --------------------------------------------------------------------------------------------
# packed forward


@triton.jit
def varlen_fwd(Q, K, V, O, LSE, CU_Q, CU_K, CU_BLOCKS,
               sqt, sqh, sqd, skt, skh, skd, svt, svh, svd, sot, soh, sod,
               B, total_q, D, DV, GROUP, scale, softcap, left, right,
               LEFT: tl.constexpr, RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, SEARCH_STEPS: tl.constexpr,
               UNMASKED_MIDDLE: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Program (query block over all sequences, q head): its rows' O (total_q, Hq, Dv) and lse."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    if t >= tl.load(CU_BLOCKS + B):
        return
    b, q0, n, k0, nk, start_m = query_block(CU_Q, CU_K, CU_BLOCKS, t, B, SEARCH_STEPS, BLOCK_M)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    hk = (h // GROUP).to(tl.int64)
    h64 = h.to(tl.int64)
    row_ok = offs_m < n
    q_ptrs, q_ok = _packed_rows(Q + h64 * sqh, q0, offs_m, row_ok, offs_d, offs_d < D, sqt, sqd)
    q = tl.load(q_ptrs, mask=q_ok, other=0.0)
    k_base = K + hk * skh
    v_base = V + hk * svh

    m_i, l_i = online_softmax_start(BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    shift = nk - n
    position = offs_m + shift
    first, last = start_m + shift, tl.minimum(start_m + BLOCK_M, n) - 1 + shift
    lo, hi = key_range(first, last, nk, left, right, BLOCK_N, LEFT, RIGHT)
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    if UNMASKED_MIDDLE:  # masked key blocks at the window's left edge, unmasked in the middle, masked at the right
        mid_lo, mid_hi = unmasked_keys(first, last, nk, lo, hi, left, right, BLOCK_N, LEFT, RIGHT)
        for start_n in range(lo, mid_lo, BLOCK_N):
            m_i, l_i, acc = _fwd_step(q, k_base, v_base, k0, start_n, offs_n0, offs_d, offs_dv, d_ok, dv_ok, nk,
                                      skt, skd, svt, svd, position, left, right, scale, softcap, m_i, l_i, acc,
                                      LEFT, RIGHT, SOFTCAP, True)
        for start_n in range(mid_lo, mid_hi, BLOCK_N):
            m_i, l_i, acc = _fwd_step(q, k_base, v_base, k0, start_n, offs_n0, offs_d, offs_dv, d_ok, dv_ok, nk,
                                      skt, skd, svt, svd, position, left, right, scale, softcap, m_i, l_i, acc,
                                      LEFT, RIGHT, SOFTCAP, False)
        for start_n in range(mid_hi, hi, BLOCK_N):
            m_i, l_i, acc = _fwd_step(q, k_base, v_base, k0, start_n, offs_n0, offs_d, offs_dv, d_ok, dv_ok, nk,
                                      skt, skd, svt, svd, position, left, right, scale, softcap, m_i, l_i, acc,
                                      LEFT, RIGHT, SOFTCAP, True)
    else:  # every block masked: one loop (less code: the three loops made ptxas serialize wgmma with softcap)
        for start_n in range(lo, hi, BLOCK_N):
            m_i, l_i, acc = _fwd_step(q, k_base, v_base, k0, start_n, offs_n0, offs_d, offs_dv, d_ok, dv_ok, nk,
                                      skt, skd, svt, svd, position, left, right, scale, softcap, m_i, l_i, acc,
                                      LEFT, RIGHT, SOFTCAP, True)
    # normalized, not online_softmax_result: lse's division by log2 e after O's store is the schedule this kernel
    # was measured with (the other order: the same bits, other sm_90a code)
    out, lse2 = normalized(m_i, l_i, acc)
    o_ptrs, o_ok = _packed_rows(O + h64 * soh, q0, offs_m, row_ok, offs_dv, offs_dv < DV, sot, sod)
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=o_ok)
    tl.store(LSE + h64 * total_q + (q0 + offs_m).to(tl.int64), lse2 / LOG2E_IN_KERNEL, mask=row_ok)


# --------------------------------------------------------------------------------------------
# packed backward: delta = rowsum(dO * O) - dlse (torch, on the device), then dK/dV, then dQ


@triton.jit
def _row_max_log2(LSE, offs, ok):
    """lse as a base-2 row max for exp2(s - m); 0 where lse = -inf (a row with no key: its p is 0)."""
    lse = tl.load(LSE + offs, mask=ok, other=0.0)
    return tl.where(lse == float("-inf"), 0.0, lse * LOG2E_IN_KERNEL)


@triton.jit
def varlen_bwd_delta(O, DO, DLSE, DELTA, total_q, DV, sot, soh, sod, sdt, sdh, sdd,
                     HAS_DLSE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Program (block of packed rows, q head): delta = rowsum(O * dO) - dlse in float32, (Hq, total_q)
    (one read of O and dO, no float32 copies of them)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    h = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, BLOCK_DV)
    ok = (rows[:, None] < total_q) & (cols[None, :] < DV)
    rows64 = rows.to(tl.int64)
    o = tl.load(O + h * soh + rows64[:, None] * sot + cols[None, :] * sod, mask=ok, other=0.0)
    do = tl.load(DO + h * sdh + rows64[:, None] * sdt + cols[None, :] * sdd, mask=ok, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    if HAS_DLSE:
        delta -= tl.load(DLSE + h * total_q + rows64, mask=rows < total_q, other=0.0)
    tl.store(DELTA + h * total_q + rows64, delta, mask=rows < total_q)


@triton.jit
def _dkdv_step(Q, DO, LSE, DELTA, k, v, h, q0, n, start_m, offs_m0, offs_n, key_ok, offs_d, offs_dv, d_ok, dv_ok,
               shift, sqh, sqt, sqd, sdh, sdt, sdd, total_q, left, right, scale, softcap, dk, dv,
               LEFT: tl.constexpr, RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, MASKED: tl.constexpr):
    """dk, dv += the query block start_m's part (transposed tiles: keys x queries); MASKED: keys past
    nk, rows past n and pairs outside the window get p = 0."""
    offs_m = start_m + offs_m0
    row_ok = offs_m < n
    query_rows = (q0 + offs_m).to(tl.int64)
    q = tl.load(Q + h * sqh + query_rows[:, None] * sqt + offs_d[None, :] * sqd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    do = tl.load(DO + h * sdh + query_rows[:, None] * sdt + offs_dv[None, :] * sdd,
                 mask=row_ok[:, None] & dv_ok[None, :], other=0.0)
    stat = h * total_q + query_rows
    lse = tl.load(LSE + stat, mask=row_ok, other=0.0)
    m2 = tl.where(lse == float("-inf"), 0.0, lse * LOG2E_IN_KERNEL)  # no key: p = 0, not NaN
    delta = tl.load(DELTA + stat, mask=row_ok, other=0.0)
    s_t = tl.dot(k, tl.trans(q)) * scale  # [keys, queries]
    if SOFTCAP:
        s_t = capped(s_t, softcap, SOFTCAP)
    p_t = tl.exp2(s_t * LOG2E_IN_KERNEL - m2[None, :])
    if MASKED:
        ok = key_ok[:, None] & row_ok[None, :]
        if LEFT:
            ok = ok & (offs_n[:, None] >= (offs_m + shift)[None, :] - left)
        if RIGHT:
            ok = ok & (offs_n[:, None] <= (offs_m + shift)[None, :] + right)
        p_t = tl.where(ok, p_t, 0.0)
    dv = tl.dot(p_t.to(do.dtype), do, dv)
    dp_t = tl.dot(v, tl.trans(do))
    ds_t = p_t * (dp_t - delta[None, :])
    if SOFTCAP:  # d(softcap tanh(x / softcap)) / dx = 1 - tanh^2; masked scores have p = 0
        th = tanh_of(s_t, softcap, SOFTCAP)
        if MASKED:
            th = tl.where(ok, th, 0.0)
        ds_t = ds_t * (1.0 - th * th)
    return tl.dot(ds_t.to(q.dtype), q, dk), dv


@triton.jit
def varlen_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV_OUT, CU_Q, CU_K, CU_BLOCKS,
                    sqt, sqh, sqd, skt, skh, skd, svt, svh, svd, sdt, sdh, sdd,
                    sgkt, sgkh, sgkd, sgvt, sgvh, sgvd,
                    B, total_q, D, DV, GROUP, scale, softcap, left, right,
                    LEFT: tl.constexpr, RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, SEARCH_STEPS: tl.constexpr,
               UNMASKED_MIDDLE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Program (key block over all sequences, kv head): dK, dV of its keys, summed over the query
    blocks of every q head of the group that see them (no atomics)."""
    t = tl.program_id(0)
    hk = tl.program_id(1)
    if t >= tl.load(CU_BLOCKS + B):
        return
    b = sequence_of_block(CU_BLOCKS, t, B, SEARCH_STEPS)
    q0 = tl.load(CU_Q + b)
    n = tl.load(CU_Q + b + 1) - q0
    k0 = tl.load(CU_K + b)
    nk = tl.load(CU_K + b + 1) - k0
    start_n = (t - tl.load(CU_BLOCKS + b)) * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    hk64 = hk.to(tl.int64)
    key_ok = offs_n < nk
    k_ptrs, k_ok = _packed_rows(K + hk64 * skh, k0, offs_n, key_ok, offs_d, d_ok, skt, skd)
    v_ptrs, v_ok = _packed_rows(V + hk64 * svh, k0, offs_n, key_ok, offs_dv, dv_ok, svt, svd)
    k = tl.load(k_ptrs, mask=k_ok, other=0.0)
    v = tl.load(v_ptrs, mask=v_ok, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

    shift = nk - n
    # the queries that see key j have positions i' in [j - right, j + left]: their rows i' - shift
    lo = start_n * 0
    hi = lo + n
    if RIGHT:
        lo = (tl.maximum(start_n - right - shift, 0) // BLOCK_M) * BLOCK_M
    if LEFT:
        hi = tl.minimum(n, tl.minimum(start_n + BLOCK_N, nk) - 1 + left - shift + 1)
    # query blocks whose every row sees every key of this block (rows past n are zeros: they add 0);
    # (with UNMASKED_MIDDLE; else one masked loop)
    mid_lo = lo
    if RIGHT:  # rows with position >= last key - right
        mid_lo = tl.maximum(lo, ((tl.maximum(start_n + BLOCK_N - 1 - right - shift, 0) + BLOCK_M - 1)
                                 // BLOCK_M) * BLOCK_M)
    mid_hi = hi
    if LEFT:  # rows with position + BLOCK_M - 1 <= first key + left
        last_first_row = start_n - BLOCK_M + 1 - shift + left
        mid_hi = tl.where(last_first_row >= 0, (last_first_row // BLOCK_M + 1) * BLOCK_M, 0)
    mid_lo = tl.minimum(mid_lo, hi)
    mid_hi = tl.maximum(mid_lo, tl.minimum(mid_hi, hi))
    if UNMASKED_MIDDLE:
        for g in range(0, GROUP):
            h = hk64 * GROUP + g
            for start_m in range(lo, mid_lo, BLOCK_M):  # masked, unmasked, masked: as varlen_fwd
                dk, dv = _dkdv_step(Q, DO, LSE, DELTA, k, v, h, q0, n, start_m, offs_m0, offs_n, key_ok, offs_d,
                                    offs_dv, d_ok, dv_ok, shift, sqh, sqt, sqd, sdh, sdt, sdd, total_q, left, right,
                                    scale, softcap, dk, dv, LEFT, RIGHT, SOFTCAP, True)
            for start_m in range(mid_lo, mid_hi, BLOCK_M):
                dk, dv = _dkdv_step(Q, DO, LSE, DELTA, k, v, h, q0, n, start_m, offs_m0, offs_n, key_ok, offs_d,
                                    offs_dv, d_ok, dv_ok, shift, sqh, sqt, sqd, sdh, sdt, sdd, total_q, left, right,
                                    scale, softcap, dk, dv, LEFT, RIGHT, SOFTCAP, False)
            for start_m in range(mid_hi, hi, BLOCK_M):
                dk, dv = _dkdv_step(Q, DO, LSE, DELTA, k, v, h, q0, n, start_m, offs_m0, offs_n, key_ok, offs_d,
                                    offs_dv, d_ok, dv_ok, shift, sqh, sqt, sqd, sdh, sdt, sdd, total_q, left, right,
                                    scale, softcap, dk, dv, LEFT, RIGHT, SOFTCAP, True)
    else:
        for g in range(0, GROUP):
            h = hk64 * GROUP + g
            for start_m in range(lo, hi, BLOCK_M):
                dk, dv = _dkdv_step(Q, DO, LSE, DELTA, k, v, h, q0, n, start_m, offs_m0, offs_n, key_ok, offs_d,
                                    offs_dv, d_ok, dv_ok, shift, sqh, sqt, sqd, sdh, sdt, sdd, total_q, left, right,
                                    scale, softcap, dk, dv, LEFT, RIGHT, SOFTCAP, True)

    dk_ptrs, dk_ok = _packed_rows(DK + hk64 * sgkh, k0, offs_n, key_ok, offs_d, d_ok, sgkt, sgkd)
    dv_ptrs, dv_ok2 = _packed_rows(DV_OUT + hk64 * sgvh, k0, offs_n, key_ok, offs_dv, dv_ok, sgvt, sgvd)
    tl.store(dk_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=dk_ok)
    tl.store(dv_ptrs, dv.to(DV_OUT.dtype.element_ty), mask=dv_ok2)


@triton.jit
def _dq_step(q, do, m2, delta, k_base, v_base, k0, start_n, offs_n0, offs_d, offs_dv, d_ok, dv_ok, nk,
             skt, skd, svt, svd, position, left, right, scale, softcap, dq,
             LEFT: tl.constexpr, RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, MASKED: tl.constexpr):
    """dq += dS K over key block start_n (p recomputed from the rows' lse); MASKED as _fwd_step."""
    offs_n = start_n + offs_n0
    key_rows = (k0 + offs_n).to(tl.int64)
    key_ok = offs_n < nk
    if MASKED:
        k = tl.load(k_base + key_rows[:, None] * skt + offs_d[None, :] * skd, mask=key_ok[:, None] & d_ok[None, :],
                    other=0.0)
        v = tl.load(v_base + key_rows[:, None] * svt + offs_dv[None, :] * svd,
                    mask=key_ok[:, None] & dv_ok[None, :], other=0.0)
    else:
        k = tl.load(k_base + key_rows[:, None] * skt + offs_d[None, :] * skd, mask=d_ok[None, :], other=0.0)
        v = tl.load(v_base + key_rows[:, None] * svt + offs_dv[None, :] * svd, mask=dv_ok[None, :], other=0.0)
    s = tl.dot(q, tl.trans(k)) * scale
    if SOFTCAP:
        s = capped(s, softcap, SOFTCAP)
    p = tl.exp2(s * LOG2E_IN_KERNEL - m2[:, None])
    if MASKED:
        ok = seen_keys(key_ok, offs_n, position, left, right, LEFT, RIGHT)
        p = tl.where(ok, p, 0.0)
    dp = tl.dot(do, tl.trans(v))
    ds = p * (dp - delta[:, None])
    if SOFTCAP:  # d(softcap tanh(x / softcap)) / dx = 1 - tanh^2; masked scores have p = 0
        th = tanh_of(s, softcap, SOFTCAP)
        if MASKED:
            th = tl.where(ok, th, 0.0)
        ds = ds * (1.0 - th * th)
    return tl.dot(ds.to(k.dtype), k, dq)


@triton.jit
def varlen_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, CU_Q, CU_K, CU_BLOCKS,
                  sqt, sqh, sqd, skt, skh, skd, svt, svh, svd, sdt, sdh, sdd, sgt, sgh, sgd,
                  B, total_q, D, DV, GROUP, scale, softcap, left, right,
                  LEFT: tl.constexpr, RIGHT: tl.constexpr, SOFTCAP: tl.constexpr, SEARCH_STEPS: tl.constexpr,
               UNMASKED_MIDDLE: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Program (query block over all sequences, q head): dQ = scale * sum over its keys of dS K."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    if t >= tl.load(CU_BLOCKS + B):
        return
    b, q0, n, k0, nk, start_m = query_block(CU_Q, CU_K, CU_BLOCKS, t, B, SEARCH_STEPS, BLOCK_M)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    hk = (h // GROUP).to(tl.int64)
    h64 = h.to(tl.int64)
    row_ok = offs_m < n
    q_ptrs, q_ok = _packed_rows(Q + h64 * sqh, q0, offs_m, row_ok, offs_d, d_ok, sqt, sqd)
    do_ptrs, do_ok = _packed_rows(DO + h64 * sdh, q0, offs_m, row_ok, offs_dv, dv_ok, sdt, sdd)
    q = tl.load(q_ptrs, mask=q_ok, other=0.0)
    do = tl.load(do_ptrs, mask=do_ok, other=0.0)
    stat = h64 * total_q + (q0 + offs_m).to(tl.int64)
    m2 = _row_max_log2(LSE, stat, row_ok)
    delta = tl.load(DELTA + stat, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    shift = nk - n
    position = offs_m + shift
    first, last = start_m + shift, tl.minimum(start_m + BLOCK_M, n) - 1 + shift
    lo, hi = key_range(first, last, nk, left, right, BLOCK_N, LEFT, RIGHT)
    k_base = K + hk * skh
    v_base = V + hk * svh
    if UNMASKED_MIDDLE:  # masked, unmasked, masked: as varlen_fwd
        mid_lo, mid_hi = unmasked_keys(first, last, nk, lo, hi, left, right, BLOCK_N, LEFT, RIGHT)
        for start_n in range(lo, mid_lo, BLOCK_N):
            dq = _dq_step(q, do, m2, delta, k_base, v_base, k0, start_n, offs_n0, offs_d, offs_dv, d_ok, dv_ok, nk,
                          skt, skd, svt, svd, position, left, right, scale, softcap, dq, LEFT, RIGHT, SOFTCAP, True)
        for start_n in range(mid_lo, mid_hi, BLOCK_N):
            dq = _dq_step(q, do, m2, delta, k_base, v_base, k0, start_n, offs_n0, offs_d, offs_dv, d_ok, dv_ok, nk,
                          skt, skd, svt, svd, position, left, right, scale, softcap, dq, LEFT, RIGHT, SOFTCAP, False)
        for start_n in range(mid_hi, hi, BLOCK_N):
            dq = _dq_step(q, do, m2, delta, k_base, v_base, k0, start_n, offs_n0, offs_d, offs_dv, d_ok, dv_ok, nk,
                          skt, skd, svt, svd, position, left, right, scale, softcap, dq, LEFT, RIGHT, SOFTCAP, True)
    else:
        for start_n in range(lo, hi, BLOCK_N):
            dq = _dq_step(q, do, m2, delta, k_base, v_base, k0, start_n, offs_n0, offs_d, offs_dv, d_ok, dv_ok, nk,
                          skt, skd, svt, svd, position, left, right, scale, softcap, dq, LEFT, RIGHT, SOFTCAP, True)
    dq_ptrs, dq_ok = _packed_rows(DQ + h64 * sgh, q0, offs_m, row_ok, offs_d, d_ok, sgt, sgd)
    tl.store(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=dq_ok)


@triton.jit
def varlen_work_table(CU_Q, ORDER, TABLE, B, entries, HEADS, TILE_M: tl.constexpr, BLOCK_B: tl.constexpr,
                      BLOCK_T: tl.constexpr):
    """The Gluon varlen forward's work table (op.work_table; TABLE (entries, 4) int32) in one
    launch: entry t is (sequence, query tile from its last row, q head, 0) for the sequences in
    ORDER's order (B of them, every one held here: BLOCK_B >= B), each sequence's cdiv(N, TILE_M)
    tiles head by head; entries past the real tiles (sequence -1, 0, 0, 0). A program writes
    BLOCK_T entries (work.write_work_entries)."""
    offs_b = tl.arange(0, BLOCK_B)
    b_ok = offs_b < B
    seq = tl.load(ORDER + offs_b, mask=b_ok, other=0)
    n = tl.load(CU_Q + seq + 1, mask=b_ok, other=0) - tl.load(CU_Q + seq, mask=b_ok, other=0)
    tiles = tl.where(b_ok, (n + TILE_M - 1) // TILE_M, 0)
    write_work_entries(TABLE, seq, tiles, B, entries, HEADS, BLOCK_B, BLOCK_T)


__all__ = ["varlen_fwd", "varlen_bwd_delta", "varlen_bwd_dkdv", "varlen_bwd_dq", "varlen_work_table"]
