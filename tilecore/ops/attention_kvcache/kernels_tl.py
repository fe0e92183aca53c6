"""Portable Triton (``tl``) kernels of ``attention_with_kvcache``: a split-key forward over a
(paged) KV cache, the merge of its splits by lse, and the append of new K/V rows.

KV cache: k_cache / v_cache either contiguous-per-sequence (B, Nmax, Hkv, D) (PAGED = False) or
paged (num_pages, PAGE, Hkv, D) with BLOCK_TABLE (B, max_pages) int32 (PAGED = True); sequence b's
length is SEQLENS[b] + Nnew (read on the device). A key row j of sequence b lives in page
BLOCK_TABLE[b, j // PAGE], slot j % PAGE; every load is masked by j < length, so no row (and no
block-table entry) past a sequence's length is read.
Masks and softcap as attention_varlen's (tilecore.ops.attention_varlen.kernels_tl: ``key_range`` is its);
the split's base-2 lse by attention's ``normalized`` (tilecore.ops.attention.kernels_tl), as the decode kernel's.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tilecore.ops.attention.kernels_tl import normalized
from tilecore.ops.attention_decode.kernels_tl import merged_row
from tilecore.ops.attention_varlen.kernels_tl import key_range, seen_keys
from tilecore.tiles.ops import LOG2E_IN_KERNEL, online_softmax_start, online_softmax_update


@triton.jit
def kvcache_fwd_split(Q, KC, VC, BLOCK_TABLE, SEQLENS, O, LSE, O_PART, LSE_PART,
                      sqb, sqn, sqh, sqd, skp, sks, skh, skd, svp, svs, svh, svd, stb, stp, sob, son, soh, sod,
                      Hkv, Nq, Nnew, D, DV, GROUP, keys_per_split, scale, softcap, left, right,
                      PAGE: tl.constexpr, PAGED: tl.constexpr, LEFT: tl.constexpr, RIGHT: tl.constexpr,
                      SOFTCAP: tl.constexpr, MERGED: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Program (batch * kv head, split, row block): attention of the (query, q head) rows of the kv
    head's group, packed query-major (row r: query r // GROUP, q head hk * GROUP + r % GROUP; one
    pass over the cache rows serves the group), over the split's keys [split * keys_per_split, ...)
    of sequence b's SEQLENS[b] + Nnew. MERGED (one split): O (B, Nq, Hq, Dv) strided and lse
    (B, Hq, Nq); else the split's float32 O and base-2 lse to the parts (kvcache_merge_splits)."""
    bhk = tl.program_id(0)
    split = tl.program_id(1)
    b = (bhk // Hkv).to(tl.int64)
    hk = (bhk % Hkv).to(tl.int64)
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < Nq * GROUP
    query = rows // GROUP
    head = hk * GROUP + rows % GROUP
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    q = tl.load(Q + b * sqb + query.to(tl.int64)[:, None] * sqn + head[:, None] * sqh + offs_d[None, :] * sqd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    nk = tl.load(SEQLENS + b) + Nnew
    shift = nk - Nq
    position = query + shift

    m_i, l_i = online_softmax_start(BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    first_query = (tl.program_id(2) * BLOCK_M) // GROUP
    last_query = tl.minimum((tl.program_id(2) * BLOCK_M + BLOCK_M - 1) // GROUP, Nq - 1)
    end = tl.minimum(split * keys_per_split + keys_per_split, nk)  # the split's keys: [.., end)
    lo, hi = key_range(first_query + shift, last_query + shift, end, left, right, BLOCK_N, LEFT, RIGHT)
    lo = tl.maximum(lo, split * keys_per_split)
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        key_ok = offs_n < end
        if PAGED:  # row j: page BLOCK_TABLE[b, j // PAGE], slot j % PAGE (entries past the length unread)
            page = tl.load(BLOCK_TABLE + b * stb + (offs_n // PAGE) * stp, mask=key_ok, other=0).to(tl.int64)
            k_rows = page * skp + (offs_n % PAGE) * sks
            v_rows = page * svp + (offs_n % PAGE) * svs
        else:
            k_rows = b * skp + offs_n.to(tl.int64) * sks
            v_rows = b * svp + offs_n.to(tl.int64) * svs
        k = tl.load(KC + hk * skh + k_rows[:, None] + offs_d[None, :] * skd,
                    mask=key_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(VC + hk * svh + v_rows[:, None] + offs_dv[None, :] * svd,
                    mask=key_ok[:, None] & dv_ok[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale  # written out: see varlen_fwd's loop
        if SOFTCAP:
            s = softcap - (2.0 * softcap) / (tl.exp2(s * (2.0 * LOG2E_IN_KERNEL / softcap)) + 1.0)
        ok = seen_keys(key_ok, offs_n, position, left, right, LEFT, RIGHT)
        s = tl.where(ok, s * LOG2E_IN_KERNEL, float("-inf"))
        m_i, l_i, acc, p = online_softmax_update(m_i, l_i, acc, s, 1.0)
        acc = tl.dot(p.to(v.dtype), v, acc)
    out, lse2 = normalized(m_i, l_i, acc)
    lse_row = (b * Hkv * GROUP + head) * Nq + query  # (batch, q head, query): lse's row order
    ok = row_ok[:, None] & dv_ok[None, :]
    if MERGED:
        o_ptrs = O + b * sob + query.to(tl.int64)[:, None] * son + head[:, None] * soh + offs_dv[None, :] * sod
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=ok)
        tl.store(LSE + lse_row, lse2 / LOG2E_IN_KERNEL, mask=row_ok)
    else:
        part = split.to(tl.int64) * (tl.num_programs(0) * Nq * GROUP) + lse_row  # (split, row)
        tl.store(O_PART + part[:, None] * DV + offs_dv[None, :], out, mask=ok)
        tl.store(LSE_PART + part, lse2, mask=row_ok)


@triton.jit
def kvcache_merge_splits(O, LSE, O_PART, LSE_PART, rows_total, Hq, Nq, DV, splits, sob, son, soh, sod,
                         SPLITS: tl.constexpr, BLOCK_DV: tl.constexpr):
    """O and lse of row (b, q head, query) from its ``splits`` parts: with L = log2(sum_s 2^lse_s),
    O = sum_s 2^(lse_s - L) O_s; every part empty: 0, -inf; a NaN part: NaN. O strided (B, Nq, Hq, Dv)."""
    row = tl.program_id(0).to(tl.int64)
    offs_dv = tl.arange(0, BLOCK_DV)
    out, empty, top, w = merged_row(O_PART, LSE_PART, rows_total, row, DV, splits, SPLITS, BLOCK_DV)
    b = row // (Hq * Nq)
    head = (row // Nq) % Hq
    query = row % Nq
    tl.store(O + b * sob + query * son + head * soh + offs_dv * sod, out.to(O.dtype.element_ty), mask=offs_dv < DV)
    tl.store(LSE + row, tl.where(empty, float("-inf"), (top + tl.log2(w)) / LOG2E_IN_KERNEL))




@triton.jit
def kvcache_append(K_NEW, V_NEW, KC, VC, BLOCK_TABLE, SEQLENS, Nnew, Hkv, D, DV,
                   snb, snn, snh, snd, svnb, svnn, svnh, svnd,
                   skp, sks, skh, skd, svp, svs, svh, svd, stb, stp,
                   PAGE: tl.constexpr, PAGED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_DV: tl.constexpr):
    """Program (batch * new token): writes that token's K and V rows (every kv head) to row
    SEQLENS[b] + t of sequence b's cache (through BLOCK_TABLE when PAGED): one launch for both caches
    where index_put_ took six small kernels."""
    bt = tl.program_id(0)
    b = (bt // Nnew).to(tl.int64)
    t = bt % Nnew
    pos = tl.load(SEQLENS + b) + t
    if PAGED:
        page = tl.load(BLOCK_TABLE + b * stb + (pos // PAGE) * stp).to(tl.int64)
        k_row = page * skp + (pos % PAGE) * sks
        v_row = page * svp + (pos % PAGE) * svs
    else:
        k_row = b * skp + pos.to(tl.int64) * sks
        v_row = b * svp + pos.to(tl.int64) * svs
    heads = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    h_ok = heads < Hkv
    k_ok = h_ok[:, None] & (offs_d[None, :] < D)
    v_ok = h_ok[:, None] & (offs_dv[None, :] < DV)
    k = tl.load(K_NEW + b * snb + t * snn + heads[:, None] * snh + offs_d[None, :] * snd, mask=k_ok)
    v = tl.load(V_NEW + b * svnb + t * svnn + heads[:, None] * svnh + offs_dv[None, :] * svnd, mask=v_ok)
    tl.store(KC + k_row + heads[:, None] * skh + offs_d[None, :] * skd, k, mask=k_ok)
    tl.store(VC + v_row + heads[:, None] * svh + offs_dv[None, :] * svd, v, mask=v_ok)


__all__ = ["kvcache_fwd_split", "kvcache_merge_splits", "kvcache_append"]
