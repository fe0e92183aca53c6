"""Attention's portable kernels in Triton ``tl`` (any GPU, and the CPU through the interpreter),
written with tilecore.tiles' tile ops: the query-block forward and the backward's preprocess, dK/dV
and dQ (the split-key decode forward and its merge: tilecore.ops.attention_decode, on these pieces),
and the host's options for them (mask_options, score_options).

Layout: q (B, Hq, N, D), k (B, Hkv, Nk, D) and v (B, Hkv, Nk, DV), any strides (DV may differ from
D: MLA); the outputs are contiguous. q head h reads kv head h // (Hq // Hkv). Batch and head offsets
are 64-bit (B * H * N * D can pass 2^31).

Masks, all by construction (the interpreter does not catch out-of-bounds loads):
* bounds: query rows < N, key rows < Nk, head-dim columns < D (D is padded to a power of two
  >= 16 inside the kernel, the padding loads as 0 and so adds nothing to q k^T);
* causal, aligned to the bottom right: query i sees key j <= i + (Nk - N);
* WINDOW (a sliding window, flash-attn's window_size): query i sees keys
  i + shift - left <= j <= i + shift + right (shift = Nk - N; an unbounded side comes in as
  max(N, Nk), past any distance). CAUSAL and WINDOW are never both set (the plan folds causal into
  the window). The loops visit only the key (or query) blocks that some row's window touches
  (key_range, query_range): time goes with the window, not with N.

SOFTCAP: the base-2 score is cap log2(e) tanh(q.k scale / cap) (``scale_log2e`` carries
cap log2(e), ``tanh_scale`` scale / cap); tanh is computed from exp2 (tanh_from_exp2: libdevice does
not run in the interpreter), stable for any |x|. Its gradient is dS (1 - tanh^2).

ROTARY (attention(..., rotary=(cos, sin)); the forward and both backward kernels): Q and K turned by
rotary embedding as they are loaded (rotary_turn: Q once a tile, K as each block arrives), key j at
position j and query i at i + (Nk - N), cos and sin rows (positions, rotary_pairs) of the tables
COS / SIN; the turned tile is rounded to the operand dtype (as a separate rotation pass would) and
feeds tl.dot unchanged. The backward's dS is the same on the turned vectors: dK and dQ accumulate in
the turned space and are turned back, R(-theta), once a tile before they are stored. Off (the
default, COS = SIN = None) the kernels compile as without it.

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

from tilecore.ops.attention.reference import effective_window
from tilecore.tiles.launch import cdiv, next_power_of_2
from tilecore.tiles.ops import (LOG2E, LOG2E_IN_KERNEL, block_ptrs, bounds_mask, mma, mma_abt, online_softmax_result,
                                online_softmax_start, online_softmax_update, row_sum)


def block_d(d: int) -> int:
    """The head dimension padded to a power of two >= 16 (tl.dot's smallest)."""
    return max(16, next_power_of_2(d))


def row_block_grid(heads: int, rows: int, block: int) -> tuple[int]:
    """The 1-D grid of _query_block's programs: ``heads`` x blocks of ``block`` rows."""
    return (heads * cdiv(rows, block),)


def mask_options(causal: bool, window, n: int, nk: int) -> tuple[dict, int, int]:
    """(the tl kernels' CAUSAL and WINDOW constexprs, left, right) of ``causal`` and ``window``: no
    mask; causal (the window (-1, 0)); or a window whose unbounded side is max(n, nk) (past any
    key distance: no wrap in 32 bits)."""
    left, right = effective_window(causal, window)
    if (left, right) == (-1, -1):
        return dict(CAUSAL=False, WINDOW=False), 0, 0
    if (left, right) == (-1, 0):
        return dict(CAUSAL=True, WINDOW=False), 0, 0
    unbounded = max(n, nk, 1)
    left = unbounded if left < 0 else min(left, unbounded)
    right = unbounded if right < 0 else min(right, unbounded)
    return dict(CAUSAL=False, WINDOW=True), left, right


def score_options(scale: float, softcap: float) -> tuple[dict, float, float]:
    """(SOFTCAP constexpr, scale_log2e, tanh_scale) of the tl kernels' scores (scores_base2): under a
    softcap the base-2 score is cap log2(e) tanh(q.k scale / cap)."""
    if softcap:
        return dict(SOFTCAP=True), softcap * LOG2E, scale / softcap
    return dict(SOFTCAP=False), scale * LOG2E, 0.0


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
def key_range(first_query, last_query, N, Nk, left, right, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
              WINDOW: tl.constexpr):
    """[lo, hi): the keys some query of first_query..last_query attends to, lo rounded down to a
    block of BLOCK_N (hi <= lo: none). Causal: up to the last row's diagonal; WINDOW: from the first
    row's left edge to the last row's right edge."""
    shift = Nk - N
    lo = 0
    hi = Nk
    if CAUSAL:
        hi = tl.minimum(Nk, last_query + shift + 1)
    if WINDOW:
        lo = (tl.maximum(first_query + shift - left, 0) // BLOCK_N) * BLOCK_N
        hi = tl.minimum(Nk, last_query + shift + right + 1)
    return lo, hi


@triton.jit
def query_range(first_key, last_key, N, Nk, left, right, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr,
                WINDOW: tl.constexpr):
    """[lo, hi): the queries that attend to some key of first_key..last_key, lo rounded down to a
    block of BLOCK_M (the transpose of key_range)."""
    shift = Nk - N
    lo = 0
    hi = N
    if CAUSAL:
        lo = (tl.maximum(first_key - shift, 0) // BLOCK_M) * BLOCK_M
    if WINDOW:
        lo = (tl.maximum(first_key - shift - right, 0) // BLOCK_M) * BLOCK_M
        hi = tl.minimum(N, last_key - shift + left + 1)
    return lo, hi


@triton.jit
def tanh_from_exp2(x):
    """tanh(x) = sign(x) (1 - e) / (1 + e) with e = exp(-2 |x|) in (0, 1]: no overflow for any |x|
    (tanh(+-inf) = +-1), NaN stays NaN; absolute error ~1e-7 near 0, which is what a score needs."""
    e = tl.exp2(tl.abs(x) * (-2.0 * LOG2E_IN_KERNEL))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def scores_base2(qk, scale_log2e, tanh_scale, SOFTCAP: tl.constexpr):
    """Base-2 scores of the raw products q.k: qk scale log2(e), or under SOFTCAP
    cap log2(e) tanh(qk scale / cap) (scale_log2e then carries cap log2(e))."""
    if SOFTCAP:
        return tanh_from_exp2(qk * tanh_scale) * scale_log2e
    else:
        return qk * scale_log2e


@triton.jit
def softcap_slope(s, scale_log2e, SOFTCAP: tl.constexpr):
    """d s / d(scaled q.k) of base-2 scores s: 1 - tanh^2 under SOFTCAP (tanh = s / (cap log2 e);
    a masked -inf score's slope is irrelevant, its p is 0: taken as 0), else 1."""
    if SOFTCAP:
        t = s / scale_log2e
        return tl.where(s == float("-inf"), 0.0, 1.0 - t * t)
    else:
        return 1.0


@triton.jit
def mask_keys(s, queries, keys, shift, key_end, left, right, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """s with -inf where the key is past key_end or outside the query's window (``queries`` and
    ``keys`` broadcast to s's shape: [m, 1] and [1, n], or transposed)."""
    ok = keys < key_end
    if CAUSAL:
        ok = ok & (keys <= queries + shift)
    if WINDOW:
        ok = ok & (keys <= queries + (shift + right)) & (keys >= queries + (shift - left))
    return tl.where(ok, s, float("-inf"))


@triton.jit
def rotary_partner(offs_d, pairs, INTERLEAVED: tl.constexpr):
    """The column each head-dim column ``offs_d`` turns with: c +- pairs (half-split) or c ^ 1
    (INTERLEAVED) within the first 2 * pairs columns, c itself past them."""
    rotated = offs_d < 2 * pairs
    if INTERLEAVED:
        return tl.where(rotated, offs_d ^ 1, offs_d)
    else:
        return tl.where(rotated, tl.where(offs_d < pairs, offs_d + pairs, offs_d - pairs), offs_d)


@triton.jit
def rotary_turn(x, x_partner, COS, SIN, stride_cos, stride_sin, pos, rows_ok, offs_d, pairs,
                INTERLEAVED: tl.constexpr, INVERSE: tl.constexpr):
    """x, a [rows, BLOCK_D] tile of head-dim columns offs_d, turned by rotary embedding, in float32:
    each pair (i, i + pairs) (or (2i, 2i + 1) when INTERLEAVED) of a row at position ``pos`` by the
    angle whose cosine and sine are COS[pos, i], SIN[pos, i] (INVERSE: by the opposite angle, the
    transpose); columns from 2 * pairs on, and rows not ``rows_ok``, unchanged. ``x_partner``: x's
    columns rotary_partner(offs_d) (loaded beside x, or rotary_gathered from it);
    x'[c] = x[c] cos -+ x[partner] sin, minus for a pair's first column."""
    rotated = offs_d < 2 * pairs
    if INTERLEAVED:
        first = (offs_d % 2) == 0
        angle = offs_d // 2
    else:
        first = offs_d < pairs
        angle = tl.where(first, offs_d, offs_d - pairs)
    ok = rows_ok[:, None] & rotated[None, :]
    pos = pos.to(tl.int64)
    c = tl.load(COS + pos[:, None] * stride_cos + angle[None, :], mask=ok, other=1.0).to(tl.float32)
    s = tl.load(SIN + pos[:, None] * stride_sin + angle[None, :], mask=ok, other=0.0).to(tl.float32)
    if INVERSE:
        s = tl.where(first[None, :], s, -s)
    else:
        s = tl.where(first[None, :], -s, s)
    return x.to(tl.float32) * c + x_partner.to(tl.float32) * s


@triton.jit
def rotary_gathered(x, offs_d, pairs, INTERLEAVED: tl.constexpr):
    """x's columns rotary_partner(offs_d), from the tile itself (tl.gather along the columns): the
    partner of an accumulator, which has no copy in memory."""
    partner = rotary_partner(offs_d, pairs, INTERLEAVED)
    return tl.gather(x, tl.broadcast_to(partner[None, :], x.shape), axis=1)


# --------------------------------------------------------------------------------------------
# the forward's tile steps, shared by the query-block and the split-key kernels


@triton.jit
def key_rows(base, start_n, offs_n0, offs_d, d_ok, key_end, sn, sd):
    """Rows start_n + offs_n0 of one head's K or V (zeros from key_end on and past the head dim),
    and that mask (64-bit offsets: tiles.ops.block_ptrs)."""
    ok = (start_n + offs_n0[:, None] < key_end) & d_ok[None, :]
    return tl.load(block_ptrs(base, start_n, offs_n0, offs_d, sn, sd), mask=ok, other=0.0), ok


@triton.jit
def fold_keys(qk, v, offs_n, key_end, query, shift, left, right, m_i, l_i, acc, scale_log2e, tanh_scale,
              CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr):
    """Fold the raw products qk = Q K^T of keys ``offs_n`` (those before key_end; V rows ``v``) into
    the rows' running (max, sum, output): scores (capped), masked (``query`` is each row's query,
    which the split-key kernel's packed rows do not number consecutively), online softmax, O += P V."""
    s = scores_base2(qk, scale_log2e, tanh_scale, SOFTCAP)
    s = mask_keys(s, query[:, None], offs_n[None, :], shift, key_end, left, right, CAUSAL,
                  WINDOW)
    m_i, l_i, acc, p = online_softmax_update(m_i, l_i, acc, s, 1.0)
    return m_i, l_i, mma(p.to(v.dtype), v, acc)


@triton.jit
def attend_keys(q, k_base, v_base, start_n, offs_n0, offs_d, d_ok, offs_dv, dv_ok, key_end, skn, skd, svn, svd,
                query, shift, left, right, m_i, l_i, acc, scale_log2e, tanh_scale,
                CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr):
    """fold_keys of keys start_n + offs_n0, loaded here (K's columns offs_d, V's offs_dv)."""
    k, _ = key_rows(k_base, start_n, offs_n0, offs_d, d_ok, key_end, skn, skd)
    v, _ = key_rows(v_base, start_n, offs_n0, offs_dv, dv_ok, key_end, svn, svd)
    qk = mma_abt(q, k, tl.zeros([q.shape[0], k.shape[0]], dtype=tl.float32))
    return fold_keys(qk, v, start_n + offs_n0, key_end, query, shift, left, right, m_i, l_i, acc, scale_log2e,
                     tanh_scale, CAUSAL, WINDOW, SOFTCAP)


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
             H, N, Nk, D, DV, GROUP, left, right, scale_log2e, tanh_scale,
             CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
             COS=None, SIN=None, stride_cos=1, stride_sin=1, rotary_pairs=1, ROTARY: tl.constexpr = False,
             ROTARY_INTERLEAVED: tl.constexpr = False):
    """One program per (batch * q head, block of queries): its rows' O (BLOCK_M x DV) and lse over
    the keys their windows reach (key_range). ROTARY: Q turned once, each K block as it is loaded."""
    bh, b, h, hk, start_m, offs_m = _query_block(H, N, GROUP, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < DV

    q_ptrs, q_ok = _rows(Q, b, h, start_m, N, D, sqb, sqh, sqn, sqd, BLOCK_M, BLOCK_D)
    q = tl.load(q_ptrs, mask=q_ok, other=0.0)
    if ROTARY:
        turn = rotary_partner(offs_d, rotary_pairs, ROTARY_INTERLEAVED) - offs_d  # partner column - column
        q = rotary_turn(q, tl.load(q_ptrs + turn[None, :] * sqd, mask=q_ok, other=0.0), COS, SIN, stride_cos,
                        stride_sin, offs_m + (Nk - N), offs_m < N, offs_d, rotary_pairs, ROTARY_INTERLEAVED,
                        False).to(q.dtype)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh

    m_i, l_i = online_softmax_start(BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    shift = Nk - N  # query i sits at key position i + shift
    lo, hi = key_range(start_m, start_m + BLOCK_M - 1, N, Nk, left, right, BLOCK_N, CAUSAL, WINDOW)
    for start_n in range(lo, hi, BLOCK_N):
        if ROTARY:
            k, _ = key_rows(k_base, start_n, offs_n0, offs_d, d_ok, Nk, skn, skd)
            k_partner, _ = key_rows(k_base + turn[None, :] * skd, start_n, offs_n0, offs_d, d_ok, Nk, skn, skd)
            k = rotary_turn(k, k_partner, COS, SIN, stride_cos, stride_sin, start_n + offs_n0,
                            start_n + offs_n0 < Nk, offs_d, rotary_pairs, ROTARY_INTERLEAVED, False).to(k.dtype)
            v, _ = key_rows(v_base, start_n, offs_n0, offs_dv, dv_ok, Nk, svn, svd)
            qk = mma_abt(q, k, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32))
            m_i, l_i, acc = fold_keys(qk, v, start_n + offs_n0, Nk, offs_m, shift, left, right, m_i, l_i, acc,
                                      scale_log2e, tanh_scale, CAUSAL, WINDOW, SOFTCAP)
        else:
            m_i, l_i, acc = attend_keys(q, k_base, v_base, start_n, offs_n0, offs_d, d_ok, offs_dv, dv_ok, Nk, skn,
                                        skd, svn, svd, offs_m, shift, left, right, m_i, l_i, acc, scale_log2e,
                                        tanh_scale, CAUSAL, WINDOW, SOFTCAP)
    out, lse = online_softmax_result(m_i, l_i, acc)
    o_ptrs, o_ok = _rows(O, b, h, start_m, N, DV, sob, soh, son, sod, BLOCK_M, BLOCK_DV)
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=o_ok)
    tl.store(LSE + bh.to(tl.int64) * N + offs_m, lse, mask=offs_m < N)


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
def attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV_OUT,
                  sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdn, sdd,
                  sgb, sgh, sgn, sgd, svgb, svgh, svgn, svgd,
                  H, HKV, N, Nk, D, DV, GROUP, left, right, scale, scale_log2e, tanh_scale,
                  CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                  COS=None, SIN=None, stride_cos=1, stride_sin=1, rotary_pairs=1, ROTARY: tl.constexpr = False,
                  ROTARY_INTERLEAVED: tl.constexpr = False):
    """One program per (batch * kv head, block of keys): sums dk, dv over the query blocks that
    see the keys (query_range) of every q head in the kv head's group (no atomics), computing the
    transposed tiles directly. Query rows past N load as zeros (Q, dO, lse and delta): whatever
    their p, they add 0. ROTARY: K turned once, each Q block as it is loaded, dK turned back."""
    # (batch * kv heads, key blocks) on the grid's axes: a 1-D grid with a kv head's blocks
    # consecutive, as the query-block kernels have, spilled 52-80 B at D128 (notes/attention)
    bhk = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = (bhk // HKV).to(tl.int64)
    hk = (bhk % HKV).to(tl.int64)
    start_n = pid_n * BLOCK_N
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_n = start_n + offs_n0
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < DV
    k, k_ok = key_rows(K + b * skb + hk * skh, start_n, offs_n0, offs_d, d_ok, Nk, skn, skd)
    v, v_ok = key_rows(V + b * svb + hk * svh, start_n, offs_n0, offs_dv, dv_ok, Nk, svn, svd)
    if ROTARY:
        turn = rotary_partner(offs_d, rotary_pairs, ROTARY_INTERLEAVED) - offs_d  # partner column - column
        k_partner, _ = key_rows(K + b * skb + hk * skh + turn[None, :] * skd, start_n, offs_n0, offs_d, d_ok, Nk,
                                skn, skd)
        k = rotary_turn(k, k_partner, COS, SIN, stride_cos, stride_sin, offs_n, offs_n < Nk, offs_d, rotary_pairs,
                        ROTARY_INTERLEAVED, False).to(k.dtype)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

    shift = Nk - N
    lo, hi = query_range(start_n, start_n + BLOCK_N - 1, N, Nk, left, right, BLOCK_M, CAUSAL, WINDOW)
    for g in range(0, GROUP):
        h = hk * GROUP + g
        row_base = (b * H + h) * N
        for start_m in range(lo, hi, BLOCK_M):
            offs_m = start_m + offs_m0
            q_ptrs, q_ok = _rows(Q, b, h, start_m, N, D, sqb, sqh, sqn, sqd, BLOCK_M, BLOCK_D)
            do_ptrs, do_ok = _rows(DO, b, h, start_m, N, DV, sdb, sdh, sdn, sdd, BLOCK_M, BLOCK_DV)
            q = tl.load(q_ptrs, mask=q_ok, other=0.0)
            if ROTARY:
                q_partner = tl.load(q_ptrs + turn[None, :] * sqd, mask=q_ok, other=0.0)
                q = rotary_turn(q, q_partner, COS, SIN, stride_cos, stride_sin, offs_m + shift, offs_m < N, offs_d,
                                rotary_pairs, ROTARY_INTERLEAVED, False).to(q.dtype)
            do = tl.load(do_ptrs, mask=do_ok, other=0.0)
            m2 = _row_max_log2(LSE, row_base + offs_m, offs_m < N)
            delta = tl.load(DELTA + row_base + offs_m, mask=offs_m < N, other=0.0)
            s_t = scores_base2(mma_abt(k, q, tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)), scale_log2e,
                               tanh_scale, SOFTCAP)
            s_t = mask_keys(s_t, offs_m[None, :], offs_n[:, None], shift, Nk, left, right,
                            CAUSAL, WINDOW)
            p_t = tl.exp2(s_t - m2[None, :])
            dv = mma(p_t.to(do.dtype), do, dv)
            dp_t = mma_abt(v, do, tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32))
            ds_t = p_t * (dp_t - delta[None, :]) * softcap_slope(s_t, scale_log2e, SOFTCAP)
            dk = mma(ds_t.to(q.dtype), q, dk)

    dk_ptrs, _ = _rows(DK, b, hk, start_n, Nk, D, sgb, sgh, sgn, sgd, BLOCK_N, BLOCK_D)
    dv_ptrs, _ = _rows(DV_OUT, b, hk, start_n, Nk, DV, svgb, svgh, svgn, svgd, BLOCK_N, BLOCK_DV)
    if ROTARY:  # dV first: its registers free before dK is turned back
        tl.store(dv_ptrs, dv.to(DV_OUT.dtype.element_ty), mask=v_ok)
        dk = rotary_turn(dk, rotary_gathered(dk, offs_d, rotary_pairs, ROTARY_INTERLEAVED), COS, SIN, stride_cos,
                         stride_sin, offs_n, offs_n < Nk, offs_d, rotary_pairs, ROTARY_INTERLEAVED, True)
        tl.store(dk_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=k_ok)
    else:
        tl.store(dk_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=k_ok)
        tl.store(dv_ptrs, dv.to(DV_OUT.dtype.element_ty), mask=v_ok)


@triton.jit
def attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ,
                sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdn, sdd,
                sgb, sgh, sgn, sgd,
                H, N, Nk, D, DV, GROUP, left, right, scale, scale_log2e, tanh_scale,
                CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                COS=None, SIN=None, stride_cos=1, stride_sin=1, rotary_pairs=1, ROTARY: tl.constexpr = False,
                ROTARY_INTERLEAVED: tl.constexpr = False):
    """One program per (batch * q head, block of queries): dq = scale * sum over the keys its rows
    see (key_range) of dS k. ROTARY: Q turned once, each K block as it is loaded, dQ turned back."""
    bh, b, h, hk, start_m, offs_m = _query_block(H, N, GROUP, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < DV
    q_ptrs, q_ok = _rows(Q, b, h, start_m, N, D, sqb, sqh, sqn, sqd, BLOCK_M, BLOCK_D)
    do_ptrs, do_ok = _rows(DO, b, h, start_m, N, DV, sdb, sdh, sdn, sdd, BLOCK_M, BLOCK_DV)
    q = tl.load(q_ptrs, mask=q_ok, other=0.0)
    if ROTARY:
        turn = rotary_partner(offs_d, rotary_pairs, ROTARY_INTERLEAVED) - offs_d  # partner column - column
        q = rotary_turn(q, tl.load(q_ptrs + turn[None, :] * sqd, mask=q_ok, other=0.0), COS, SIN, stride_cos,
                        stride_sin, offs_m + (Nk - N), offs_m < N, offs_d, rotary_pairs, ROTARY_INTERLEAVED,
                        False).to(q.dtype)
    do = tl.load(do_ptrs, mask=do_ok, other=0.0)
    row = bh.to(tl.int64) * N + offs_m
    m2 = _row_max_log2(LSE, row, offs_m < N)
    delta = tl.load(DELTA + row, mask=offs_m < N, other=0.0)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    shift = Nk - N
    lo, hi = key_range(start_m, start_m + BLOCK_M - 1, N, Nk, left, right, BLOCK_N, CAUSAL, WINDOW)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k, _ = key_rows(k_base, start_n, offs_n0, offs_d, d_ok, Nk, skn, skd)
        if ROTARY:
            k_partner, _ = key_rows(k_base + turn[None, :] * skd, start_n, offs_n0, offs_d, d_ok, Nk, skn, skd)
            k = rotary_turn(k, k_partner, COS, SIN, stride_cos, stride_sin, offs_n, offs_n < Nk, offs_d,
                            rotary_pairs, ROTARY_INTERLEAVED, False).to(k.dtype)
        v, _ = key_rows(v_base, start_n, offs_n0, offs_dv, dv_ok, Nk, svn, svd)
        s = scores_base2(mma_abt(q, k, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)), scale_log2e, tanh_scale,
                         SOFTCAP)
        s = mask_keys(s, offs_m[:, None], offs_n[None, :], shift, Nk, left, right, CAUSAL,
                      WINDOW)
        p = tl.exp2(s - m2[:, None])
        dp = mma_abt(do, v, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32))
        ds = p * (dp - delta[:, None]) * softcap_slope(s, scale_log2e, SOFTCAP)
        dq = mma(ds.to(k.dtype), k, dq)

    dq_ptrs, _ = _rows(DQ, b, h, start_m, N, D, sgb, sgh, sgn, sgd, BLOCK_M, BLOCK_D)
    if ROTARY:
        dq = rotary_turn(dq, rotary_gathered(dq, offs_d, rotary_pairs, ROTARY_INTERLEAVED), COS, SIN, stride_cos,
                         stride_sin, offs_m + (Nk - N), offs_m < N, offs_d, rotary_pairs, ROTARY_INTERLEAVED, True)
    tl.store(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=q_ok)
