"""Attention's portable kernels in Triton ``tl`` (any GPU, and the CPU through the interpreter),
written with tilecore.tiles' tile ops: the query-block forward, the split-key (decode) forward and
its merge, and the backward's preprocess, dK/dV and dQ.

Layout: q (B, Hq, N, D), k and v (B, Hkv, Nk, D), any strides; the outputs are contiguous. q head h
reads kv head h // (Hq // Hkv). Batch and head offsets are 64-bit (B * H * N * D can pass 2^31).

Masks, all by construction (the interpreter does not catch out-of-bounds loads):
* bounds: query rows < N, key rows < Nk, head-dim columns < D (D is padded to a power of two
  >= 16 inside the kernel, the padding loads as 0 and so adds nothing to q k^T);
* causal, aligned to the bottom right: query i sees key j <= i + (Nk - N).

Scores are kept in base 2: s = q k^T * scale * log2(e), so every exponential is one ``exp2``, and
are scaled before they are masked, so a negative scale cannot turn the -inf fill into +inf. The
running row max starts at -inf (tiles.ops.online_softmax_update shifts by 0 while it is -inf, so a
block whose scores are all masked never gives exp2(-inf - -inf) = NaN, and a row of finite scores
however negative keeps them); a row that saw no key at all (every score masked or -inf) ends with
l = 0, is written as 0 and gets lse = -inf. The backward turns lse = -inf back into 0 before
exp2(s - lse), so those rows get p = 0 and zero gradients.

NaN and inf propagate as in SDPA's math: a NaN or +inf score makes its row's p NaN (exp2 of NaN, or
of +inf - +inf), so l is NaN and the row's O and lse are NaN (``normalized`` tells "no key" by
l == 0, never by l > 0, which a NaN fails too); the backward's p from a NaN lse is NaN. A masked
score is -inf whatever Q K^T gave, so a NaN key reaches only the rows that see it. Scores are
scaled in base 2, so a score past float32's range / log2(e) (about 2.4e38) is already +-inf here.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tilecore.tiles.launch import cdiv, next_power_of_2
from tilecore.tiles.ops import (LOG2E_IN_KERNEL, block_ptrs, bounds_mask, causal_mask, col_max, col_sum,
                                mask_scores, masked, mma, mma_abt, online_softmax_update, row_sum)


def block_d(d: int) -> int:
    """The head dimension padded to a power of two >= 16 (tl.dot's smallest)."""
    return max(16, next_power_of_2(d))


def row_block_grid(heads: int, rows: int, block: int) -> tuple[int]:
    """The 1-D grid of _query_block's programs: ``heads`` x blocks of ``block`` rows."""
    return (heads * cdiv(rows, block),)


@triton.jit
def _query_block(H, N, GROUP, BLOCK_M: tl.constexpr):
    """The program's query block: (batch * q head, batch, q head, kv head, first row, its rows), for
    a 1-D grid over (batch * q heads) x query blocks (row_block_grid). A head's blocks are consecutive
    programs, which run together and share its K and V (and its rows' memory pages); one axis takes
    2^31 - 1 programs (the others stop at 65535). Batch and heads are 64-bit for the offsets."""
    blocks = tl.cdiv(N, BLOCK_M)
    bh = tl.program_id(0) // blocks
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    start_m = (tl.program_id(0) % blocks) * BLOCK_M
    return bh, b, h, h // GROUP, start_m, start_m + tl.arange(0, BLOCK_M)


@triton.jit
def _rows(base, b, h, start_m, N, D, sb, sh, sn, sd, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """(pointers, mask) of rows [start_m, start_m + BLOCK_M) of head (b, h) of a strided (B, H, N, D)
    tensor, columns up to BLOCK_D (64-bit offsets: tiles.ops.block_ptrs)."""
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    return block_ptrs(base + b * sb + h * sh, start_m, rows, cols, sn, sd), bounds_mask(start_m + rows, cols, N, D)


@triton.jit
def _keys_seen(start_m, N, Nk, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """How many leading keys the query rows [start_m, start_m + BLOCK_M) attend to: all Nk, or when
    causal (query i sees keys j <= i + Nk - N) up to the block's last row; <= 0 when they see none."""
    if CAUSAL:
        return tl.minimum(Nk, start_m + BLOCK_M + (Nk - N))
    else:
        return Nk


# --------------------------------------------------------------------------------------------
# the forward's tile steps, shared by the query-block and the split-key kernels


@triton.jit
def key_block(k_base, v_base, start_n, offs_n0, offs_d, d_ok, key_end, skn, skd, svn, svd):
    """Keys start_n + offs_n0 of one head: K and V rows (zeros from key_end on and past D), and that
    mask (64-bit offsets: tiles.ops.block_ptrs)."""
    kv_ok = (start_n + offs_n0[:, None] < key_end) & d_ok[None, :]
    k = tl.load(block_ptrs(k_base, start_n, offs_n0, offs_d, skn, skd), mask=kv_ok, other=0.0)
    v = tl.load(block_ptrs(v_base, start_n, offs_n0, offs_d, svn, svd), mask=kv_ok, other=0.0)
    return k, v, kv_ok


@triton.jit
def attend_keys(q, k_base, v_base, start_n, offs_n0, offs_d, d_ok, key_end, skn, skd, svn, svd, query, shift,
                m_i, l_i, acc, scale_log2e, CAUSAL: tl.constexpr):
    """Fold keys start_n + offs_n0 (those before key_end) into the rows' running (max, sum, output):
    S = Q K^T, masked (causal: query i sees keys j <= i + shift; ``query`` is each row's query, which
    the split-key kernel's packed rows do not number consecutively), online softmax, O += P V."""
    k, v, _ = key_block(k_base, v_base, start_n, offs_n0, offs_d, d_ok, key_end, skn, skd, svn, svd)
    offs_n = start_n + offs_n0
    s = mma_abt(q, k, tl.zeros([q.shape[0], k.shape[0]], dtype=tl.float32)) * scale_log2e
    s = masked(s, offs_n[None, :] < key_end, float("-inf"))
    if CAUSAL:
        s = causal_mask(s, query + shift, offs_n, float("-inf"))
    m_i, l_i, acc, p = online_softmax_update(m_i, l_i, acc, s, 1.0)
    return m_i, l_i, mma(p.to(v.dtype), v, acc)


@triton.jit
def normalized(m_i, l_i, acc):
    """The rows' output acc / l and their base-2 lse (m + log2 l); a row with no key (l = 0): 0 and
    -inf; a row whose l is NaN (a NaN or +inf score): NaN and NaN."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    return acc / l_safe[:, None], tl.where(empty, float("-inf"), m_i + tl.log2(l_safe))


# --------------------------------------------------------------------------------------------
# forward


@triton.jit
def attn_fwd(Q, K, V, O, LSE,
             sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, son, sod,
             H, N, Nk, D, GROUP, scale_log2e,
             CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per (batch * q head, block of queries): its rows' O and lse over every key."""
    bh, b, h, hk, start_m, offs_m = _query_block(H, N, GROUP, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D

    q_ptrs, q_ok = _rows(Q, b, h, start_m, N, D, sqb, sqh, sqn, sqd, BLOCK_M, BLOCK_D)
    q = tl.load(q_ptrs, mask=q_ok, other=0.0)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    shift = Nk - N  # causal: query i sees keys j <= i + shift
    hi = _keys_seen(start_m, N, Nk, BLOCK_M, CAUSAL)
    for start_n in range(0, hi, BLOCK_N):
        m_i, l_i, acc = attend_keys(q, k_base, v_base, start_n, offs_n0, offs_d, d_ok, Nk, skn, skd, svn, svd,
                                    offs_m, shift, m_i, l_i, acc, scale_log2e, CAUSAL)
    out, lse2 = normalized(m_i, l_i, acc)
    lse = lse2 / LOG2E_IN_KERNEL
    o_ptrs, o_ok = _rows(O, b, h, start_m, N, D, sob, soh, son, sod, BLOCK_M, BLOCK_D)
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=o_ok)
    tl.store(LSE + bh.to(tl.int64) * N + offs_m, lse, mask=offs_m < N)


# --------------------------------------------------------------------------------------------
# decode: a few queries a sequence, the keys split across programs, merged by lse


@triton.jit
def attn_fwd_split_keys(Q, K, V, O, LSE, O_PART, LSE_PART,
                        sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                        Hkv, N, Nk, D, GROUP, keys_per_split, scale_log2e,
                        CAUSAL: tl.constexpr, MERGED: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (batch * kv head, split, row block): the attention over the split's keys of every
    (query, q head) row of the kv head, packed query-major (row r is query r // GROUP of q head
    hk * GROUP + r % GROUP: one pass over K and V serves the whole group; batch * kv head on the
    grid's first axis, the one that takes more than 65535 programs). MERGED (one split): write O and
    lse; else this split's float32 O, normalized over its own keys, and base-2 lse to the parts
    (attn_merge_splits combines them; a row that sees none of the split's keys gets lse -inf)."""
    bhk = tl.program_id(0)
    split = tl.program_id(1)
    b = (bhk // Hkv).to(tl.int64)
    hk = (bhk % Hkv).to(tl.int64)
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)  # packed: query rows // G, head rows % G
    row_ok = rows < N * GROUP
    query = rows // GROUP
    head = hk * GROUP + rows % GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q = tl.load(Q + b * sqb + head[:, None] * sqh + query.to(tl.int64)[:, None] * sqn + offs_d[None, :] * sqd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    lo = split * keys_per_split
    end = tl.minimum(lo + keys_per_split, Nk)  # the split's keys: [lo, end)
    shift = Nk - N  # causal: query i sees keys j <= i + shift
    hi = end
    if CAUSAL:  # no key past what the tile's last query sees
        last_query = tl.minimum((tl.program_id(2) * BLOCK_M + BLOCK_M - 1) // GROUP, N - 1)
        hi = tl.minimum(end, last_query + shift + 1)
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        m_i, l_i, acc = attend_keys(q, k_base, v_base, start_n, offs_n0, offs_d, d_ok, end, skn, skd, svn, svd,
                                    query, shift, m_i, l_i, acc, scale_log2e, CAUSAL)
    out, lse2 = normalized(m_i, l_i, acc)
    row = (b * Hkv * GROUP + head) * N + query  # (batch, q head, query) in O's and LSE's row order
    ok = row_ok[:, None] & d_ok[None, :]
    if MERGED:
        tl.store(O + row[:, None] * D + offs_d[None, :], out.to(O.dtype.element_ty), mask=ok)
        tl.store(LSE + row, lse2 / LOG2E_IN_KERNEL, mask=row_ok)
    else:
        part = split.to(tl.int64) * (tl.num_programs(0) * N * GROUP) + row  # (split, row)
        tl.store(O_PART + part[:, None] * D + offs_d[None, :], out, mask=ok)
        tl.store(LSE_PART + part, lse2, mask=row_ok)


@triton.jit
def attn_merge_splits(O, LSE, O_PART, LSE_PART, rows_total, D, splits,
                      SPLITS: tl.constexpr, BLOCK_D: tl.constexpr):
    """O and lse of one row from its ``splits`` parts (at most SPLITS, a power of two), all loaded at
    once: with L = log2(sum_s 2^lse_s), O = sum_s 2^(lse_s - L) O_s; a row with every part empty (lse
    -inf) gets 0, -inf, a row with a NaN part NaN. The parts are (split, row): a split's stride is
    rows_total rows (64-bit)."""
    row = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    part = offs_s.to(tl.int64) * rows_total + row
    lse_s = tl.load(LSE_PART + part, mask=offs_s < splits, other=float("-inf"))
    top = col_max(lse_s)
    top_ref = tl.where(top == float("-inf"), 0.0, top)
    w = tl.exp2(lse_s - top_ref)
    o_s = tl.load(O_PART + part[:, None] * D + offs_d[None, :],
                  mask=(offs_s[:, None] < splits) & (offs_d[None, :] < D), other=0.0)
    weight_sum = col_sum(w)
    empty = weight_sum == 0.0  # not "not > 0": a NaN part (a NaN or +inf score) makes the row NaN
    w_safe = tl.where(empty, 1.0, weight_sum)
    out = col_sum(w[:, None] * o_s) / w_safe
    tl.store(O + row * D + offs_d, out.to(O.dtype.element_ty), mask=offs_d < D)
    tl.store(LSE + row, tl.where(empty, float("-inf"), (top_ref + tl.log2(w_safe)) / LOG2E_IN_KERNEL))


# --------------------------------------------------------------------------------------------
# backward: delta = rowsum(dO * O) - dlse, then dk/dv (loop over queries), then dq (loop over keys)


@triton.jit
def attn_bwd_delta(O, DO, LSE, DLSE, DELTA, STATS, DQ_SUM, sob, soh, son, sod, sdb, sdh, sdn, sdd, H, N, D,
                   N_PAD, HAS_DLSE: tl.constexpr, ZERO_DQ_SUM: tl.constexpr, ROW_STATS: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """delta = rowsum(O * dO) - dlse for a block of rows; with ZERO_DQ_SUM also zeros the same rows of
    the contiguous float32 (B, H, N, D) buffer that the Gluon backward's dQ reductions add to (one
    pass over the rows instead of a separate memset); with ROW_STATS also writes the rows' lse (-inf,
    a row with no key, as +inf: its p must be 0) and delta to the float32 (B * H, 2, N_PAD) buffer
    that the Gluon backward loads by TMA with each step's Q and dO."""
    bh, b, h, _, start_m, offs_m = _query_block(H, N, 1, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o_ptrs, ok = _rows(O, b, h, start_m, N, D, sob, soh, son, sod, BLOCK_M, BLOCK_D)
    do_ptrs, _ = _rows(DO, b, h, start_m, N, D, sdb, sdh, sdn, sdd, BLOCK_M, BLOCK_D)
    o = tl.load(o_ptrs, mask=ok, other=0.0)
    do = tl.load(do_ptrs, mask=ok, other=0.0)
    delta = row_sum(o.to(tl.float32) * do.to(tl.float32))
    row = bh.to(tl.int64) * N + offs_m
    if HAS_DLSE:
        # d lse_i / d s_ij = p_ij: an lse gradient enters dS = p (dP - delta) as -dlse in delta
        delta -= tl.load(DLSE + row, mask=offs_m < N, other=0.0)
    tl.store(DELTA + row, delta, mask=offs_m < N)
    if ROW_STATS:
        lse = tl.load(LSE + row, mask=offs_m < N, other=0.0)
        stats = STATS + bh.to(tl.int64) * 2 * N_PAD + offs_m
        tl.store(stats, tl.where(lse == float("-inf"), float("inf"), lse), mask=offs_m < N)
        tl.store(stats + N_PAD, delta, mask=offs_m < N)
    if ZERO_DQ_SUM:
        tl.store(DQ_SUM + row[:, None] * D + offs_d[None, :], tl.zeros([BLOCK_M, BLOCK_D], tl.float32), mask=ok)


@triton.jit
def _row_max_log2(LSE, row, ok):
    """lse (natural log) of rows as a base-2 row max for exp2(s - m); 0 for a row that saw no key
    (lse = -inf), whose scores are all -inf, so p = exp2(-inf - 0) = 0 and not NaN."""
    lse = tl.load(LSE + row, mask=ok, other=0.0)
    return tl.where(lse == float("-inf"), 0.0, lse * LOG2E_IN_KERNEL)


@triton.jit
def attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV,
                  sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdn, sdd,
                  sgb, sgh, sgn, sgd,
                  H, HKV, N, Nk, D, GROUP, scale, scale_log2e,
                  CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per (batch * kv head, block of keys): sums dk, dv over every query block of
    every q head in the kv head's group (no atomics), computing the transposed tiles directly.
    Query rows past N load as zeros (Q, dO, lse and delta): whatever their p, they add 0."""
    # (batch * kv heads, key blocks) on the grid's axes: a 1-D grid with a kv head's blocks
    # consecutive, as the query-block kernels have, spilled 52-80 B at D128 (notes/attention, session 22)
    bhk = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = (bhk // HKV).to(tl.int64)
    hk = (bhk % HKV).to(tl.int64)
    start_n = pid_n * BLOCK_N
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    k, v, kv_ok = key_block(K + b * skb + hk * skh, V + b * svb + hk * svh, start_n, tl.arange(0, BLOCK_N), offs_d,
                            d_ok, Nk, skn, skd, svn, svd)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    lo = 0
    if CAUSAL:
        # the first query that sees key start_n is start_n - (Nk - N); start at its block
        lo = (tl.maximum(start_n - (Nk - N), 0) // BLOCK_M) * BLOCK_M
    for g in range(0, GROUP):
        h = hk * GROUP + g
        row_base = (b * H + h) * N
        for start_m in range(lo, N, BLOCK_M):
            offs_m = start_m + offs_m0
            q_ptrs, q_ok = _rows(Q, b, h, start_m, N, D, sqb, sqh, sqn, sqd, BLOCK_M, BLOCK_D)
            do_ptrs, _ = _rows(DO, b, h, start_m, N, D, sdb, sdh, sdn, sdd, BLOCK_M, BLOCK_D)
            q = tl.load(q_ptrs, mask=q_ok, other=0.0)
            do = tl.load(do_ptrs, mask=q_ok, other=0.0)
            m2 = _row_max_log2(LSE, row_base + offs_m, offs_m < N)
            delta = tl.load(DELTA + row_base + offs_m, mask=offs_m < N, other=0.0)
            s_t = mma_abt(k, q, tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)) * scale_log2e
            s_t = mask_scores(s_t, start_m, start_n, N, Nk, CAUSAL, KEY_AXIS=0)
            p_t = tl.exp2(s_t - m2[None, :])
            dv = mma(p_t.to(do.dtype), do, dv)
            dp_t = mma_abt(v, do, tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32))
            ds_t = p_t * (dp_t - delta[None, :])
            dk = mma(ds_t.to(q.dtype), q, dk)

    dk_ptrs, _ = _rows(DK, b, hk, start_n, Nk, D, sgb, sgh, sgn, sgd, BLOCK_N, BLOCK_D)
    dv_ptrs, _ = _rows(DV, b, hk, start_n, Nk, D, sgb, sgh, sgn, sgd, BLOCK_N, BLOCK_D)
    tl.store(dk_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=kv_ok)
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=kv_ok)


@triton.jit
def attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ,
                sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdn, sdd,
                sgb, sgh, sgn, sgd,
                H, N, Nk, D, GROUP, scale, scale_log2e,
                CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per (batch * q head, block of queries): dq = scale * sum over keys of dS k."""
    bh, b, h, hk, start_m, offs_m = _query_block(H, N, GROUP, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q_ptrs, q_ok = _rows(Q, b, h, start_m, N, D, sqb, sqh, sqn, sqd, BLOCK_M, BLOCK_D)
    do_ptrs, _ = _rows(DO, b, h, start_m, N, D, sdb, sdh, sdn, sdd, BLOCK_M, BLOCK_D)
    q = tl.load(q_ptrs, mask=q_ok, other=0.0)
    do = tl.load(do_ptrs, mask=q_ok, other=0.0)
    row = bh.to(tl.int64) * N + offs_m
    m2 = _row_max_log2(LSE, row, offs_m < N)
    delta = tl.load(DELTA + row, mask=offs_m < N, other=0.0)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    hi = _keys_seen(start_m, N, Nk, BLOCK_M, CAUSAL)
    for start_n in range(0, hi, BLOCK_N):
        k, v, _ = key_block(k_base, v_base, start_n, offs_n0, offs_d, d_ok, Nk, skn, skd, svn, svd)
        s = mma_abt(q, k, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)) * scale_log2e
        s = mask_scores(s, start_m, start_n, N, Nk, CAUSAL, KEY_AXIS=1)
        p = tl.exp2(s - m2[:, None])
        dp = mma_abt(do, v, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32))
        ds = p * (dp - delta[:, None])
        dq = mma(ds.to(k.dtype), k, dq)

    dq_ptrs, _ = _rows(DQ, b, h, start_m, N, D, sgb, sgh, sgn, sgd, BLOCK_M, BLOCK_D)
    tl.store(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=q_ok)
