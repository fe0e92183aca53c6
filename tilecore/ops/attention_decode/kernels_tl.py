"""The split-key (decode) forward in Triton ``tl``: a few queries a sequence, the keys split across
programs, each split's O and lse merged by lse (any GPU, and the CPU through the interpreter). Built
from attention's tl pieces (kernels_tl: key_range, attend_keys, fold_keys, key_rows, normalized), so
masks, window, softcap, NaN/inf and empty rows behave exactly as the query-block forward's."""
from __future__ import annotations

import triton
import triton.language as tl

from tilecore.ops.attention.kernels_tl import attend_keys, fold_keys, key_range, key_rows, normalized
from tilecore.tiles.ops import LOG2E_IN_KERNEL, col_max, col_sum, mma_abt, online_softmax_start


@triton.jit
def attn_fwd_split_keys(Q, K, V, O, LSE, O_PART, LSE_PART,
                        sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                        Hkv, N, Nk, D, DV, GROUP, keys_per_split, left, right, scale_log2e, tanh_scale,
                        CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, MERGED: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                        BLOCK_DV: tl.constexpr, BLOCK_DK: tl.constexpr):
    """Program (batch * kv head, split, row block): the attention over the split's keys of every
    (query, q head) row of the kv head, packed query-major (row r is query r // GROUP of q head
    hk * GROUP + r % GROUP: one pass over K and V serves the whole group; batch * kv head on the
    grid's first axis, the one that takes more than 65535 programs). MERGED (one split): write O and
    lse; else this split's float32 O, normalized over its own keys, and base-2 lse to the parts
    (attn_merge_splits combines them; a row that sees none of the split's keys gets lse -inf).
    BLOCK_DK < BLOCK_D (large head dims, MLA's 576): Q K^T summed over chunks of BLOCK_DK columns,
    Q's chunks reloaded each key block (L1/L2) instead of held (a 64 x 1024 tile would spill)."""
    bhk = tl.program_id(0)
    split = tl.program_id(1)
    b = (bhk // Hkv).to(tl.int64)
    hk = (bhk % Hkv).to(tl.int64)
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)  # packed: query rows // G, head rows % G
    row_ok = rows < N * GROUP
    query = rows // GROUP
    head = hk * GROUP + rows % GROUP
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < DV
    q_rows = Q + b * sqb + head[:, None] * sqh + query.to(tl.int64)[:, None] * sqn  # [BLOCK_M, 1] pointers
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh

    m_i, l_i = online_softmax_start(BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    lo = split * keys_per_split
    end = tl.minimum(lo + keys_per_split, Nk)  # the split's keys: [lo, end)
    shift = Nk - N  # query i sits at key position i + shift
    first_query = (tl.program_id(2) * BLOCK_M) // GROUP
    last_query = tl.minimum((tl.program_id(2) * BLOCK_M + BLOCK_M - 1) // GROUP, N - 1)
    seen_lo, seen_hi = key_range(first_query, last_query, N, Nk, left, right, BLOCK_N, CAUSAL, WINDOW)
    hi = tl.minimum(end, seen_hi)  # no key past what the tile's rows see
    offs_n0 = tl.arange(0, BLOCK_N)
    if BLOCK_DK == BLOCK_D:
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        q = tl.load(q_rows + offs_d[None, :] * sqd, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        for start_n in range(tl.maximum(lo, seen_lo), hi, BLOCK_N):
            m_i, l_i, acc = attend_keys(q, k_base, v_base, start_n, offs_n0, offs_d, d_ok, offs_dv, dv_ok, end,
                                        skn, skd, svn, svd, query, shift, left, right, m_i, l_i, acc, scale_log2e,
                                        tanh_scale, CAUSAL, WINDOW, SOFTCAP)
    else:
        offs_c0 = tl.arange(0, BLOCK_DK)
        for start_n in range(tl.maximum(lo, seen_lo), hi, BLOCK_N):
            qk = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for c in range(0, D, BLOCK_DK):  # Q K^T by column chunks
                offs_c = c + offs_c0
                q_c = tl.load(q_rows + offs_c[None, :] * sqd, mask=row_ok[:, None] & (offs_c < D)[None, :],
                              other=0.0)
                k_c, _ = key_rows(k_base, start_n, offs_n0, offs_c, offs_c < D, end, skn, skd)
                qk = mma_abt(q_c, k_c, qk)
            v, _ = key_rows(v_base, start_n, offs_n0, offs_dv, dv_ok, end, svn, svd)
            m_i, l_i, acc = fold_keys(qk, v, start_n + offs_n0, end, query, shift, left, right, m_i, l_i, acc,
                                      scale_log2e, tanh_scale, CAUSAL, WINDOW, SOFTCAP)
    out, lse2 = normalized(m_i, l_i, acc)
    row = (b * Hkv * GROUP + head) * N + query  # (batch, q head, query) in O's and LSE's row order
    ok = row_ok[:, None] & dv_ok[None, :]
    if MERGED:
        tl.store(O + row[:, None] * DV + offs_dv[None, :], out.to(O.dtype.element_ty), mask=ok)
        tl.store(LSE + row, lse2 / LOG2E_IN_KERNEL, mask=row_ok)
    else:
        part = split.to(tl.int64) * (tl.num_programs(0) * N * GROUP) + row  # (split, row)
        tl.store(O_PART + part[:, None] * DV + offs_dv[None, :], out, mask=ok)
        tl.store(LSE_PART + part, lse2, mask=row_ok)


@triton.jit
def merged_row(O_PART, LSE_PART, rows_total, row, D, splits, SPLITS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Row ``row``'s O (float32, BLOCK_D columns) from its ``splits`` parts (at most SPLITS, a power of two),
    all loaded at once: with L = log2(sum_s 2^lse_s), O = sum_s 2^(lse_s - L) O_s; every part empty (lse
    -inf): 0; a NaN part: NaN. With it (empty, top, w): the row's lse is -inf where empty, else
    (top + log2 w) / log2 e, made by the caller after its O store (the order the kernels were measured with).
    The parts are (split, row): a split's stride is rows_total rows (64-bit); the O parts' rows D floats."""
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
    return out, empty, top_ref, w_safe


@triton.jit
def attn_merge_splits(O, LSE, O_PART, LSE_PART, rows_total, D, splits,
                      SPLITS: tl.constexpr, BLOCK_D: tl.constexpr):
    """O and lse of one row from its ``splits`` parts (at most SPLITS, a power of two), all loaded at
    once: with L = log2(sum_s 2^lse_s), O = sum_s 2^(lse_s - L) O_s; a row with every part empty (lse
    -inf) gets 0, -inf, a row with a NaN part NaN. The parts are (split, row): a split's stride is
    rows_total rows (64-bit)."""
    row = tl.program_id(0).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    out, empty, top, w = merged_row(O_PART, LSE_PART, rows_total, row, D, splits, SPLITS, BLOCK_D)
    tl.store(O + row * D + offs_d, out.to(O.dtype.element_ty), mask=offs_d < D)
    tl.store(LSE + row, tl.where(empty, float("-inf"), (top + tl.log2(w)) / LOG2E_IN_KERNEL))
