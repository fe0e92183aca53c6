"""Attention for a few queries against many keys (decode): the keys split across programs, the
q heads of a kv head packed into one tile, the splits merged by their log-sum-exp.

At decode (N = 1, or a few with speculative decoding) the forward's grid of query blocks has
B * Hq programs of one valid row each: a chain of dependent steps per head that leaves most of the
chip idle and reads each kv head once per q head. Here instead (FlashDecoding's plan):

* a tile is every (query, q head) row of one kv head, packed query-major (row r is query r // G of
  q head hk * G + r % G, G = Hq / Hkv): one pass over K and V serves the whole group;
* the keys are split into ``splits`` contiguous ranges, one program each, so B * Hkv * splits
  programs stream K and V at once;
* each program writes its rows' output normalized over its own keys (float32) and their lse (base
  2); a second kernel merges the splits: with L = log2(sum_s 2^lse_s), O = sum_s 2^(lse_s - L) O_s.
  With one split the first kernel writes O and lse itself.

Masks and empty rows work as in kernels.py: scores are scaled before masking, a split whose keys a
row does not see leaves that row's lse at -inf (weight 0 in the merge), and a row that sees no key
at all is written as 0 with lse = -inf.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from tilecore import dispatch
from tilecore.ops.attention.steps import attend_keys, block_d, normalized
from tilecore.tiles.launch import CachedLaunch, cdiv, next_power_of_2, tl_addressable
from tilecore.tiles.ops import LOG2E, LOG2E_IN_KERNEL

# Which inputs the split-key path serves (decode_fits): up to DECODE_MAX_QUERIES queries a sequence
# whatever the group (decode, speculative decode), and up to DECODE_MAX_PACKED_QUERIES where a kv
# head's packed rows (queries x group) are at most DECODE_MAX_PACKED_ROWS. Against the query-block
# (Gluon) forward on the H100 (GPU time, Hq 32, D 64 and 128, B 1-64 with 1024-16384 keys;
# notes/attention/README.md, session 21): 16 queries won everywhere (1.01-10.6x); 64 packed rows (MHA, 64
# queries) 1.01-2.8x, 128 (group 4, 32 queries) 1.14-6.3x; beyond, it lost at B >= 4 (0.34-0.96x:
# its row blocks each read K and V again, with mma.sync) while the query blocks fill their tiles.
DECODE_MAX_QUERIES = 16
DECODE_MAX_PACKED_QUERIES = 64
DECODE_MAX_PACKED_ROWS = 128
# ... and up to DECODE_FEW_TILES_MAX_QUERIES queries where the query-block forward would have at most
# DECODE_FEW_QUERY_TILES tiles of 128 rows (a quarter of the H100's 132 SMs: B = 1 chunked prefill).
# 128-512 queries, D 64 and 128: 8-32 tiles 1.25-5.0x, 64 tiles 0.94-1.34x, 128 tiles 0.57-0.93x
DECODE_FEW_TILES_MAX_QUERIES = 512
DECODE_FEW_QUERY_TILES = 32
# A tile packs at most this many (query, q head) rows; a kv head with more takes several tiles
DECODE_MAX_ROWS = 64


@triton.jit
def _attn_fwd_split_keys(Q, K, V, O, LSE, O_PART, LSE_PART,
                         sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                         Hkv, N, Nk, D, GROUP, keys_per_split, scale_log2e,
                         CAUSAL: tl.constexpr, MERGED: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (batch * kv head, split, row block): the packed rows' attention over the split's keys
    (batch * kv head on the grid's first axis, the one that takes more than 65535 programs).
    MERGED (one split): write O and lse; else this split's float32 O and base-2 lse to the parts."""
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
def _attn_merge_splits(O, LSE, O_PART, LSE_PART, rows_total, D, splits,
                       SPLITS: tl.constexpr, BLOCK_D: tl.constexpr):
    """O and lse of one row from its ``splits`` parts (at most SPLITS, a power of two), all loaded at
    once: weights 2^(lse_s - max), normalized; a row with every part empty (lse -inf) gets 0, -inf.
    The parts are (split, row): a split's stride is rows_total rows (64-bit offsets)."""
    row = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    part = offs_s.to(tl.int64) * rows_total + row
    lse_s = tl.load(LSE_PART + part, mask=offs_s < splits, other=float("-inf"))
    top = tl.max(lse_s, axis=0)
    top_ref = tl.where(top == float("-inf"), 0.0, top)
    w = tl.exp2(lse_s - top_ref)
    o_s = tl.load(O_PART + part[:, None] * D + offs_d[None, :],
                  mask=(offs_s[:, None] < splits) & (offs_d[None, :] < D), other=0.0)
    weight_sum = tl.sum(w, axis=0)
    w_safe = tl.where(weight_sum > 0.0, weight_sum, 1.0)
    out = tl.sum(w[:, None] * o_s, axis=0) / w_safe
    tl.store(O + row * D + offs_d, out.to(O.dtype.element_ty), mask=offs_d < D)
    tl.store(LSE + row, tl.where(weight_sum > 0.0, (top_ref + tl.log2(w_safe)) / LOG2E_IN_KERNEL, float("-inf")))


_SPLIT_KEYS = CachedLaunch(_attn_fwd_split_keys)
_MERGE = CachedLaunch(_attn_merge_splits)

# Programs the split aims for, per SM: one wave. Splitting further than a wave costs more in the
# merge than it gains (H100, Hq 32 / Hkv 8, D 128, 1 query: B 16 with 1024 keys, 128 tiles, ran
# 26 us unsplit against 29-31 us in 2-5 splits; B 1 with 16384 keys 26.4 us in 16 splits of 1024
# keys against 28.3 in 64; notes/attention/README.md, session 21)
DECODE_PROGRAMS_PER_SM = 1
# The most key ranges: the merge loads a row's parts at once
DECODE_MAX_SPLITS = 64
# A split's fewest keys: below this its fixed cost (Q load, epilogue, its share of the merge)
# dominates (B 1 with 1024 keys: 5.7 us in 8 splits of 128, 8.1 in 4 of 256)
DECODE_MIN_SPLIT_KEYS = 128


def decode_fits(q, k) -> bool:
    """Whether the split-key path serves these inputs (few queries a sequence; any device)."""
    b, hq, n = q.shape[:3]
    group = hq // k.shape[1]
    few_query_tiles = n <= DECODE_FEW_TILES_MAX_QUERIES and b * hq * cdiv(n, 128) <= DECODE_FEW_QUERY_TILES
    return (n <= DECODE_MAX_QUERIES or (n <= DECODE_MAX_PACKED_QUERIES and n * group <= DECODE_MAX_PACKED_ROWS)
            or few_query_tiles)


def decode_config(d: int, interpret: bool) -> dict:
    """Keys a step (BLOCK_N) and launch options of the split-key kernel for head dim ``d``, from the
    H100 sweeps of one query against 1024-16384 keys (notes/attention/README.md, session 21); small blocks
    in the interpreter, so tests cover several blocks and splits."""
    if interpret:
        return dict(BLOCK_N=16)
    if d <= 64:  # 4 stages: B 64 x 4096 keys 0.98x copy against 3 stages' 0.90x (B 1 x 1024: 5.3 us against 4.5)
        return dict(BLOCK_N=128, num_warps=4, num_stages=4)
    if d <= 128:  # 128 keys a step: B 64 x 4096 keys 1.01x copy against 64's 0.93x, the rest within 3%
        return dict(BLOCK_N=128, num_warps=4, num_stages=3)
    # D 256: 64 keys x 3 stages 0.89-1.00x copy, against 32 x 2's 0.64-0.92x
    return dict(BLOCK_N=64, num_warps=4, num_stages=3)


def tile_rows(queries: int, group: int) -> int:
    """BLOCK_M of the split-key kernel: a kv head's packed rows (queries x group), as a power of
    two from 16 (tl.dot's smallest) to DECODE_MAX_ROWS."""
    return max(16, min(DECODE_MAX_ROWS, next_power_of_2(queries * group)))


def key_ranges(nk: int, splits: int, block_n: int) -> tuple[int, int]:
    """(ranges, keys in each) of ``nk`` keys cut into at most ``splits`` ranges of whole blocks of
    ``block_n`` keys (at least one range, if empty: no key at all)."""
    keys_per_split = cdiv(cdiv(max(nk, 1), max(splits, 1)), block_n) * block_n
    return max(1, cdiv(nk, keys_per_split)), keys_per_split


def decode_splits(tiles: int, nk: int, block_n: int, programs: int, min_keys: int) -> int:
    """How many key ranges to split ``nk`` keys into, for ``tiles`` tiles (batch x kv head x row
    blocks): as many as keep the launch within ``programs`` programs (at least one), none with fewer
    than ``min_keys`` keys (or one block of ``block_n``), at most DECODE_MAX_SPLITS."""
    most = min(DECODE_MAX_SPLITS, cdiv(max(nk, 1), max(min_keys, block_n)))
    return key_ranges(nk, min(most, max(1, programs // tiles)), block_n)[0]


def decode_into(q, k, v, out, lse, causal: bool, scale: float, *, splits: int | None = None,
                config: dict | None = None, programs_per_sm: int | None = None) -> None:
    """out (B, Hq, N, D) and lse (B, Hq, N) float32, both contiguous, of attention(q, k, v) by the
    split-key kernels. For tests and sweeps: ``splits`` (at most DECODE_MAX_SPLITS; default
    decode_splits's for ``programs_per_sm``, default DECODE_PROGRAMS_PER_SM) and ``config``
    (decode_config's)."""
    B, Hq, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    q, k, v = tl_addressable(q), tl_addressable(k), tl_addressable(v)
    group = Hq // Hkv
    cfg = config or decode_config(D, q.device.type != "cuda")
    block_n = cfg["BLOCK_N"]
    block_m = tile_rows(N, group)
    row_blocks = cdiv(N * group, block_m)
    if splits is None:
        sms = dispatch.num_sms(q.device) if q.is_cuda else 4
        programs = (programs_per_sm or DECODE_PROGRAMS_PER_SM) * sms
        splits = decode_splits(B * Hkv * row_blocks, Nk, block_n, programs, DECODE_MIN_SPLIT_KEYS)
    elif not 1 <= splits <= DECODE_MAX_SPLITS:
        raise ValueError(f"decode_into: splits must be from 1 to {DECODE_MAX_SPLITS}, got {splits}")
    splits, keys_per_split = key_ranges(Nk, splits, block_n)
    merged = splits == 1
    rows_total = B * Hq * N
    if merged:
        o_part = lse_part = out  # unused
    else:
        o_part = out.new_empty((splits, rows_total, D), dtype=torch.float32)
        lse_part = lse.new_empty((splits, rows_total))
    _SPLIT_KEYS[(B * Hkv, splits, row_blocks)](
        q, k, v, out, lse, o_part, lse_part, *q.stride(), *k.stride(), *v.stride(),
        Hkv, N, Nk, D, group, keys_per_split, scale * LOG2E,
        CAUSAL=causal, MERGED=merged, BLOCK_M=block_m, BLOCK_D=block_d(D), **cfg)
    if not merged:
        _MERGE[(rows_total,)](out, lse, o_part, lse_part, rows_total, D, splits,
                              SPLITS=next_power_of_2(splits), BLOCK_D=block_d(D))
