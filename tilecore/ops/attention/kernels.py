"""FlashAttention-2 forward and backward in Triton ``tl``, written with tilecore.tiles' tile ops.

Layout: q (B, Hq, N, D), k and v (B, Hkv, Nk, D), any strides; the outputs are contiguous. q head h
reads kv head h // (Hq // Hkv). Batch and head offsets are 64-bit (B * H * N * D can pass 2^31).

Masks, all by construction (the interpreter does not catch out-of-bounds loads):
* bounds: query rows < N, key rows < Nk, head-dim columns < D (D is padded to a power of two
  >= 16 inside the kernel, the padding loads as 0 and so adds nothing to q k^T);
* causal, aligned to the bottom right: query i sees key j <= i + (Nk - N).

Scores are kept in base 2: s = q k^T * scale * log2(e), so every exponential is one ``exp2``.
The running row max starts at a finite sentinel (EMPTY_ROW_MAX) instead of -inf, so a block whose
scores are all masked gives exp2(sentinel - sentinel) = 1 and exp2(-inf - sentinel) = 0, never
exp2(-inf - -inf) = NaN; a row that saw no key at all ends with l = 0, is written as 0 and gets
lse = -inf. The backward turns lse = -inf back into 0 before exp2(s - lse), so those rows get
p = 0 and zero gradients.
"""
from __future__ import annotations

import functools
import importlib

import torch
import triton
import triton.language as tl

from tilecore import dispatch
from tilecore.tiles.launch import CachedLaunch, TmaOperand, cdiv, tile_counter, tl_addressable, tma_describable
from tilecore.ops.attention import decode
from tilecore.ops.attention.steps import attend_keys, block_d, key_block, normalized
from tilecore.tiles.ops import (LOG2E, LOG2E_IN_KERNEL, block_ptrs, causal_mask, masked, mma, mma_abt,
                                row_sum)
from tilecore.tiles.schedule import balanced_schedule, dealt_schedule

EMPTY_ROW_MAX = tl.constexpr(-1.0e30)  # far below any real scaled score, far above -inf


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


def row_block_grid(heads: int, rows: int, block: int) -> tuple[int]:
    """The 1-D grid of _query_block's programs: ``heads`` x blocks of ``block`` rows."""
    return (heads * cdiv(rows, block),)


@triton.jit
def _rows(base, b, h, start_m, N, D, sb, sh, sn, sd, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """(pointers, mask) of rows [start_m, start_m + BLOCK_M) of head (b, h) of a strided (B, H, N, D)
    tensor, columns up to BLOCK_D (64-bit offsets: tiles.ops.block_ptrs)."""
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    ok = (start_m + rows[:, None] < N) & (cols[None, :] < D)
    return block_ptrs(base + b * sb + h * sh, start_m, rows, cols, sn, sd), ok


@triton.jit
def _keys_seen(start_m, N, Nk, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """How many leading keys the query rows [start_m, start_m + BLOCK_M) attend to: all Nk, or when
    causal (query i sees keys j <= i + Nk - N) up to the block's last row; <= 0 when they see none."""
    if CAUSAL:
        return tl.minimum(Nk, start_m + BLOCK_M + (Nk - N))
    else:
        return Nk


# --------------------------------------------------------------------------------------------
# forward


@triton.jit
def _attn_fwd(Q, K, V, O, LSE,
              sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, son, sod,
              H, N, Nk, D, GROUP, scale_log2e,
              CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    bh, b, h, hk, start_m, offs_m = _query_block(H, N, GROUP, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D

    q_ptrs, q_ok = _rows(Q, b, h, start_m, N, D, sqb, sqh, sqn, sqd, BLOCK_M, BLOCK_D)
    q = tl.load(q_ptrs, mask=q_ok, other=0.0)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh

    m_i = tl.full([BLOCK_M], EMPTY_ROW_MAX, dtype=tl.float32)
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
# backward: delta = rowsum(dO * O) - dlse, then dk/dv (loop over queries), then dq (loop over keys)


@triton.jit
def _attn_bwd_delta(O, DO, LSE, DLSE, DELTA, STATS, DQ_SUM, sob, soh, son, sod, sdb, sdh, sdn, sdd, H, N, D,
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
def _attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV,
                   sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdn, sdd,
                   sgb, sgh, sgn, sgd,
                   H, HKV, N, Nk, D, GROUP, scale, scale_log2e,
                   CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per (batch * kv head, block of keys): sums dk, dv over every query block of
    every q head in the kv head's group (no atomics), computing the transposed tiles directly."""
    # (batch * kv heads, key blocks) on the grid's axes: a 1-D grid with a kv head's blocks
    # consecutive, as the query-block kernels have, made the D128 kernel spill 52-80 bytes, not 12-16
    bhk = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = (bhk // HKV).to(tl.int64)
    hk = (bhk % HKV).to(tl.int64)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    k, v, kv_ok = key_block(K + b * skb + hk * skh, V + b * svb + hk * svh, start_n, tl.arange(0, BLOCK_N), offs_d,
                             d_ok, Nk, skn, skd, svn, svd)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    shift = Nk - N
    lo = 0
    if CAUSAL:
        # the first query that sees key start_n is start_n - shift; start at its block
        lo = (tl.maximum(start_n - shift, 0) // BLOCK_M) * BLOCK_M
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
            s_t = masked(s_t, (offs_m[None, :] < N) & (offs_n[:, None] < Nk), float("-inf"))
            if CAUSAL:
                s_t = masked(s_t, offs_n[:, None] <= offs_m[None, :] + shift, float("-inf"))
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
def _attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ,
                 sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdn, sdd,
                 sgb, sgh, sgn, sgd,
                 H, N, Nk, D, GROUP, scale, scale_log2e,
                 CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per (block of queries, batch * q head): dq = scale * sum over keys of dS k."""
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

    shift = Nk - N
    hi = _keys_seen(start_m, N, Nk, BLOCK_M, CAUSAL)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k, v, _ = key_block(k_base, v_base, start_n, offs_n0, offs_d, d_ok, Nk, skn, skd, svn, svd)
        s = mma_abt(q, k, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)) * scale_log2e
        s = masked(s, (offs_n[None, :] < Nk) & (offs_m[:, None] < N), float("-inf"))
        if CAUSAL:
            s = causal_mask(s, offs_m + shift, offs_n, float("-inf"))
        p = tl.exp2(s - m2[:, None])
        dp = mma_abt(do, v, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32))
        ds = p * (dp - delta[:, None])
        dq = mma(ds.to(k.dtype), k, dq)

    dq_ptrs, _ = _rows(DQ, b, h, start_m, N, D, sgb, sgh, sgn, sgd, BLOCK_M, BLOCK_D)
    tl.store(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=q_ok)


# --------------------------------------------------------------------------------------------
# launch


def forward_config(d: int, interpret: bool) -> dict:
    """Block sizes and launch options of the forward kernel for head dim d: the fastest of four
    tried on the H100 at B=16 H=16 N=4096 (notes/attention/README.md); small blocks in the interpreter,
    so tests cover several blocks."""
    if interpret:
        return dict(BLOCK_M=32, BLOCK_N=16)
    if d <= 64:
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    if d <= 128:  # 128 x 64 with 8 warps was as fast without a causal mask, 13% slower with one
        return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
    return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)


def backward_config(d: int, interpret: bool) -> dict:
    """The dk/dv and dq kernels' blocks: 64 x 64 with 4 warps was 1.4-2.1x faster on the H100 than
    the 8-warp and 128-wide variants tried (notes/attention/README.md)."""
    if interpret:
        return dict(BLOCK_M=16, BLOCK_N=32)
    if d <= 128:
        return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
    return dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1)


_FWD = CachedLaunch(_attn_fwd)
_DELTA = CachedLaunch(_attn_bwd_delta)
_DKDV = CachedLaunch(_attn_bwd_dkdv)
_DQ = CachedLaunch(_attn_bwd_dq)


# Hopper's Gluon forward (gluon_kernels.py): the head dims it serves, with its query rows per consumer
# warpgroup (block_m), keys per step (block_n), ring depth, consumer warpgroups and the FA3-style
# overlap of softmax with P V, and Q buffers per consumer (2: the next tile's Q loads while a tile
# runs), from the sweeps on the H100 (notes/attention/README.md)
GLUON_FORWARD = {64: dict(block_m=64, block_n=128, stages=3, overlap=True, consumers=2, q_buffers=2),
                 128: dict(block_m=64, block_n=128, stages=2, overlap=True, consumers=2, q_buffers=2)}
# At D = 128 two Q buffers (224 KiB of shared memory) won where tiles are short (N = 512: +15%,
# causal +18%), and, once causal tiles were balanced (session 9), at N = 8192 too (+8%, causal
# +2%; N = 4096 +1.5% / 0%; session 5 had measured N = 4096 causal -3 to -4%; notes/attention/README.md)
SHORT_TILE_KEY_BLOCKS = 8
# D = 64 takes three consumer warpgroups (FlashAttention-3's choice there: the softmax is long next
# to the wgmma at this head dim) where its 192-row tiles pay: not causal from N = 2048 (N = 4096
# +8%, 16384 +17%; N <= 1024 -5 to -27%: partial tiles). Causal from N = 1024, and there ahead of
# the carried pipeline, since the first block's mask stopped costing every tile (session 13, two
# runs, against two consumers: 1024 +6 to +9%, 2048 -2% / +0%, 4096 +4.6 to +6%; before it, three
# consumers won causal only from N = 8192) (notes/attention/README.md)
THREE_CONSUMERS_MIN_N = {False: 2048, True: 1024}
# Three consumers keep two Q buffers each (the next tile's Q loads while a tile runs) where tiles are
# short: N <= 4096 (session 13, not causal: +2.5 / +1.4% at 4096 and +3.7 / +4.4% at 2048 in two
# runs, 8192 +0 / +0.4%, 16384 -0.8%; causal: 4096 +2%, 1024 +2%, 8192 and 16384 -1 / -2.4%)
THREE_CONSUMERS_Q2_MAX_N = 4096
# Causal tiles this short (keys a query row sees, on average) take 64-key blocks: their diagonal
# block, half of it masked, is half as large. N = 512: D128 225 -> 293-304 TFLOP/s, D64 184 -> 217;
# N = 1024 +2% / +12%; from N = 2048 (and never causal) 128-key blocks win (notes/attention/README.md, session 9)
SHORT_CAUSAL_KEYS = 512
# ... and at D = 128 a ring of 3 of those (half-size) stages, not 2: N = 512 causal 300-302 -> 326-329
# TFLOP/s in three runs (0.87 -> 0.95x cuDNN), N = 1024 -1.7 to +2.8% (session 22; 4 stages: +6 /
# +9%, -2 / +2%; D64's 3 -> 4: -1 / +1%)
SHORT_CAUSAL_STAGES = {128: 3}


def gluon_forward_config(d: int, n: int, nk: int, causal: bool) -> dict:
    """The Gluon forward's configuration for head dim ``d`` and these lengths: GLUON_FORWARD[d]; at
    D = 64 and N >= THREE_CONSUMERS_MIN_N[causal], three consumer warpgroups (two Q buffers each up
    to THREE_CONSUMERS_Q2_MAX_N, else one); else, where a tile's key blocks are few on average (its
    fixed costs dominate), the pipeline carried across tiles (not at D = 128 causal: there it lost
    1-2%); else at D = 128 without a mask each consumer's Q rows as the register operand of S = Q K^T
    (a third less shared-memory traffic for S: +1.3-2.2% at N = 2048-8192 on the H100; causal, where
    it spills 32 bytes, -1.7 to +1.6%; at D = 64 three consumers' 160 registers do not hold it:
    ptxas serialized every wgmma) (session 14); and causal tiles of at most SHORT_CAUSAL_KEYS keys
    take 64-key blocks (in SHORT_CAUSAL_STAGES stages)."""
    cfg = dict(GLUON_FORWARD[d])
    keys = max(nk - n / 2, nk / 2) if causal else nk  # keys a query row sees, on average (about)
    short = keys / cfg["block_n"] <= SHORT_TILE_KEY_BLOCKS
    if causal and keys <= SHORT_CAUSAL_KEYS:
        cfg["block_n"] = 64
        cfg["stages"] = SHORT_CAUSAL_STAGES.get(d, cfg["stages"])
    if d == 64 and n >= THREE_CONSUMERS_MIN_N[causal] and (causal or not short):
        cfg.update(consumers=3, q_buffers=2 if n <= THREE_CONSUMERS_Q2_MAX_N else 1)
    elif short and not (causal and d == 128):
        cfg["carry"] = True
    elif d == 128 and not causal:
        cfg["q_regs"] = True
    return cfg


def _head_operand(t, rows: int) -> TmaOperand:
    """A 4-D (B, heads, sequence, D) tensor as a TMA operand with boxes of ``rows`` rows of one head:
    a block never crosses into the next head (rows past the sequence arrive as 0)."""
    return TmaOperand(t, [1, 1, rows, t.shape[-1]])


def _head_descriptor(t, rows: int):
    """_head_operand's checked TensorDescriptor (for compile-only reports)."""
    return _head_operand(t, rows).descriptor()


def _gluon_kernel(module: str, name: str):
    """A CachedLaunch of a Gluon kernel of this package, imported at its first launch."""
    return CachedLaunch(lambda: getattr(importlib.import_module(f"tilecore.ops.attention.{module}"), name))


_GLUON_FWD = _gluon_kernel("gluon_kernels", "attention_fwd_kernel")
_GLUON_BWD = _gluon_kernel("gluon_backward", "attention_bwd_kernel")
_GLUON_BWD_SPLIT = _gluon_kernel("gluon_backward", "attention_bwd_split_kernel")
_GLUON_DQ = _gluon_kernel("gluon_dq", "attention_dq_kernel")


# The bytes of shared operands (the forward's K and V, the backward's Q and dO) of the heads that the
# persistent tile order keeps together, so that they stay in the H100's 50 MiB L2. 8 MiB, not half
# the L2 (24 MiB until session 10): at D = 128 it gained 0-5% forward and 2-13% backward on the H100
# (notes/attention/README.md, session 10), D = 64 within noise. At D = 128 it gives as many heads as one
# wave of 132 programs takes tiles (e.g. N = 4096: 4 heads of 32 tiles of 128 rows)
L2_GROUP_BYTES = 8 << 20


def _heads_in_l2(bytes_per_head: int) -> int:
    """How many heads' shared operands (``bytes_per_head`` each) the persistent tile order keeps
    together: within L2_GROUP_BYTES, 1 to 16."""
    return max(1, min(16, L2_GROUP_BYTES // bytes_per_head))


# A tile's fixed cost (pipeline fill and drain, epilogue) in key-block steps, for the balanced
# schedule's cost model: ~2.5-4 us a tile on the H100, 5-7% of a 32-step tile (notes/attention/README.md)
TILE_OVERHEAD_STEPS = 2


def _head_grouped_tiles(tiles: int, blocks: int, num_heads: int, head_group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(head, block) of every tile id in ``schedule.head_grouped_tile``'s order (its host twin)."""
    tile_id = torch.arange(tiles)
    per_group = head_group * blocks
    first = (tile_id // per_group) * head_group
    heads = torch.clamp(num_heads - first, max=head_group)
    local = tile_id % per_group
    return first + local % heads, local // heads


@functools.lru_cache(maxsize=64)
def _balanced_table(kind: str, N: int, Nk: int, block_m: int, block_n: int, num_bh: int, head_group: int,
                    steps_per_block: int, programs: int) -> torch.Tensor | None:
    """The balanced schedule of a causal Gluon launch (cost: its steps + TILE_OVERHEAD_STEPS).
    ``kind`` "forward": tiles of ``block_m`` query rows (query blocks from the last), each a step per
    ``block_n`` keys up to its diagonal; "backward": tiles of ``block_n`` keys, a step per
    ``block_m`` query rows that see them, ``steps_per_block`` times (the q heads of a kv head)."""
    if kind == "forward":
        m_blocks = triton.cdiv(N, block_m)
        mb = _head_grouped_tiles(m_blocks * num_bh, m_blocks, num_bh, head_group)[1]
        start = torch.clamp(N - (mb + 1) * block_m, min=0)  # blocks count from the last row (gluon_kernels._setup)
        last_key = torch.clamp(start + block_m + Nk - N, min=0, max=Nk)
        steps = torch.clamp(triton.cdiv(last_key, block_n), min=1)
    else:
        n_blocks = triton.cdiv(Nk, block_n)
        kb = _head_grouped_tiles(n_blocks * num_bh, n_blocks, num_bh, head_group)[1]
        first_mb = torch.clamp(kb * block_n - (Nk - N), min=0) // block_m
        steps = torch.clamp(triton.cdiv(N, block_m) - first_mb, min=0) * steps_per_block
    return balanced_schedule(steps + TILE_OVERHEAD_STEPS, programs)


@functools.lru_cache(maxsize=64)
def _paired_table(n_blocks: int, num_bhk: int, head_group: int, programs: int) -> torch.Tensor:
    """The causal backward's schedule with grouped heads: each program runs key block j of a kv head
    and then its key block n_blocks - 1 - j (the tile ids of head_grouped_tile's order), pairs dealt
    round-robin in that order. A pair sees as many query blocks as any other, so the programs stay in
    step, and the kernel's walk (_step_rows: the first key block of a pair from the last query block
    down, the second from its first up) keeps every tile of a kv head at the same query block:
    between them they use a few blocks of the group's rows, which L2 keeps."""
    tiles = n_blocks * num_bhk
    bhk, kb = (x.tolist() for x in _head_grouped_tiles(tiles, n_blocks, num_bhk, head_group))
    tile_of = {(h, b): t for t, (h, b) in enumerate(zip(bhk, kb))}
    units = []
    for t in range(tiles):  # in tile order; a pair starts at its first key block
        h, b = bhk[t], kb[t]
        if 2 * b < n_blocks - 1:
            units.append([t, tile_of[h, n_blocks - 1 - b]])
        elif 2 * b == n_blocks - 1:
            units.append([t])
    return dealt_schedule(units, programs)


# (device, table's key) -> the table on the device, or None for round-robin. Never evicted: a CUDA
# graph captured with a table reads it at every replay (a table is 4 bytes a tile: 33 KB at N = 4096).
_DEVICE_TABLES: dict = {}


def causal_schedule(device: torch.device, *key, build=_balanced_table) -> torch.Tensor | None:
    """``build(*key)`` (a balanced table by default, or _paired_table's) on ``device``, or None
    (round-robin): where round-robin is as even, or while a CUDA graph is being captured before this
    shape ran once (a copy to the GPU cannot be captured; the round-robin launch is as correct, if
    slower). Made once per device, builder and shape."""
    cache_key = (device, build, key)
    if cache_key not in _DEVICE_TABLES:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        table = build(*key)
        _DEVICE_TABLES[cache_key] = None if table is None else table.to(device)
    return _DEVICE_TABLES[cache_key]


def _query_tiling(q, k, tile_rows: int, block_n: int, causal: bool, balanced: bool):
    """(grid, head_group, schedule) of a persistent launch over tiles of ``tile_rows`` query rows
    of one (batch, head) in the forward's order (its K and V blocks of ``block_n`` keys streamed):
    the forward's and the Gluon dq kernel's."""
    B, H, N, D = q.shape
    Nk = k.shape[2]
    grid = (min(triton.cdiv(N, tile_rows) * B * H, dispatch.num_sms(q.device)),)
    head_group = _heads_in_l2(2 * Nk * D * q.element_size())  # their K and V stay in L2 together
    schedule = None
    if causal and balanced:
        schedule = causal_schedule(q.device, "forward", N, Nk, tile_rows, block_n, B * H, head_group, 1, grid[0])
    return grid, head_group, schedule


def gluon_forward_fits(q, k, v, scale: float) -> bool:
    """Whether the Gluon forward serves these inputs (else the tl kernel does)."""
    return (q.is_cuda and q.shape[-1] in GLUON_FORWARD and scale > 0 and dispatch.is_hopper(q.device)
            and tma_describable(q) and tma_describable(k) and tma_describable(v))


def forward_gluon(q, k, v, out, lse, causal: bool, scale: float, *, block_m: int, block_n: int,
                  stages: int, overlap: bool = True, consumers: int = 2, pingpong: bool = False,
                  q_buffers: int = 1, carry: bool = False, balanced: bool = True, q_regs: bool = False) -> None:
    """The Gluon forward: ``consumers`` warpgroups (1 of 8 warps, or 2 or 3 of 4) of ``block_m``
    query rows each share every K/V stage of ``block_n`` keys; ``q_buffers`` = 2 loads a tile's Q
    blocks while the previous tile runs; ``carry`` keeps the pipeline running across tiles;
    ``balanced`` (causal): the programs take their tiles from a balanced schedule, not round-robin;
    ``q_regs`` (not with ``carry``): each consumer holds its Q rows in registers for the tile."""
    if carry and q_regs:
        raise ValueError("q_regs takes a pipeline that restarts at each tile, not carry")
    if carry and consumers == 3:  # it hit an illegal memory access on the H100 (N = 1, Nk = 17, causal)
        raise ValueError("the carried pipeline takes one or two consumers, not three")
    B, H, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    num_warps = 8 if consumers == 1 else 4
    desc = _head_operand
    grid, head_group, schedule = _query_tiling(q, k, block_m * consumers, block_n, causal, balanced)
    with dispatch.on_device(q.device):
        _GLUON_FWD[grid](desc(q, block_m), desc(k, block_n), desc(v, block_n), desc(out, block_m), lse,
                                   H, N, Nk, H // Hkv, scale * LOG2E, B * H, head_group, schedule, CAUSAL=causal,
                                   STAGES=stages, OVERLAP=overlap, CONSUMERS=consumers, PINGPONG=pingpong,
                                   Q_BUFFERS=q_buffers, CARRY=carry, Q_REGS=q_regs, num_warps=num_warps)


def forward_into(q, k, v, out, lse, causal: bool, scale: float, *, config: dict | None = None) -> None:
    """out (B, Hq, N, D) and lse (B, Hq, N) float32 of attention(q, k, v); both contiguous. A few
    queries a sequence split the keys (decode.py); else the Gluon forward on Hopper, else the tl
    kernel. ``config`` (forward_config's keys) runs the tl kernel with it."""
    if config is None and decode.decode_fits(q, k):
        return decode.decode_into(q, k, v, out, lse, causal, scale)
    if config is None and gluon_forward_fits(q, k, v, scale):
        return forward_gluon(q, k, v, out, lse, causal, scale,
                             **gluon_forward_config(q.shape[-1], q.shape[2], k.shape[2], causal))
    B, H, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    q, k, v = tl_addressable(q), tl_addressable(k), tl_addressable(v)
    cfg = config or forward_config(D, q.device.type != "cuda")
    grid = row_block_grid(B * H, N, cfg["BLOCK_M"])
    _FWD[grid](q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
               H, N, Nk, D, H // Hkv, scale * LOG2E, CAUSAL=causal, BLOCK_D=block_d(D), **cfg)


# Hopper's Gluon backward (gluon_backward.py): query rows per step (block_m), keys per consumer
# warpgroup (block_n; a tile is two of them), ring depth, and where dQ comes from: "tl" (the tl dq
# kernel), or in the kernel, added by TMA reductions to a float32 buffer: "fused" (the step's own),
# "overlapped" (one step late, under the next step's softmax), "lagged" (one step late, with the
# next step's dV and dK) or "warpgroup" (by a warpgroup of its own, D = 64); see
# gluon_backward._compute.
# (Each step's lse and delta come by TMA with its Q and dO since session 14; before, loaded by
# pointer, a "prefetch" option loaded them a step ahead.)
# "gluon": gluon_dq.py's kernel after dK, dV
DQ_MODES = {"tl": 0, "gluon": 0, "fused": 1, "overlapped": 2, "lagged": 3, "warpgroup": 4}
# gluon_dq.py's kernel: query rows per consumer, keys per step, ring stages
GLUON_DQ = {64: dict(block_m=64, block_n=128, stages=3), 128: dict(block_m=64, block_n=64, stages=4)}
# D = 64: the key split with each consumer's K and V rows held as register operands of S^T and dP^T
# for the whole tile (kv_regs: a third less shared-memory traffic a step), and since session 17 dQ
# from a warpgroup of its own (the consumers only write dS): 1.13-1.16x cuDNN at N = 4096 / 8192,
# causal or not, against dQ overlapped's 1.07-1.10x in the same run (overlapped had measured
# 1.04-1.09x against the query split's 0.99-1.05x in session 14). The
# query split (gluon_backward.attention_bwd_split_kernel, 128 queries a step, FA3's layout at this
# head dim) was the choice without a mask from session 12 and causal in session 14 until then; it
# stays for the probes. D = 128: dQ fused into the key split, causal too since session 14 (0.94 /
# 1.01x against 0.91 / 0.96x with the Gluon dq kernel at N = 4096 / 8192); K and V do not fit in its
# registers (ptxas serialized every wgmma); without a mask, dQ lagged by a step (issued with the next
# step's dV and dK) since session 15: 1.00-1.03x against fused's 0.98-1.02x at N = 2048-16384, where
# causal it lost 1-3% (notes/attention/README.md). Tiles drawn as programs get to them (``drawn``) measured
# -3 to +3% against dealt (session 19): off.
KEY_SPLIT_D64 = dict(block_m=64, block_n=64, stages=2, dq_from="warpgroup", kv_regs=True)
QUERY_SPLIT_D64 = dict(block_m=128, block_n=64, stages=2, dq_from="fused", split="queries")
GLUON_BACKWARD = {(64, False): KEY_SPLIT_D64,
                  (64, True): KEY_SPLIT_D64,
                  (128, False): dict(block_m=64, block_n=64, stages=2, dq_from="lagged"),
                  (128, True): dict(block_m=64, block_n=64, stages=2, dq_from="fused")}
# ... except where tiles are short: at D = 128 below these lengths dQ comes from the Gluon dq kernel
# (timed against fused; lagged at 1024 in session 15)
# (session 14, x cuDNN, Gluon dq kernel against fused: causal N = 512 1.35 / 0.87, 1024 1.10 / 0.84,
# 2048 0.98 / 0.96, 4096 0.91 / 0.94; without a mask 512 1.17 / 0.92, 1024 0.96 / 0.98)
FUSED_DQ_MIN_N = {False: 1024, True: 4096}


def gluon_backward_config(d: int, n: int, causal: bool) -> dict:
    """The Gluon backward's configuration for head dim ``d`` and N query rows: GLUON_BACKWARD's, but
    at D = 128 with dQ from the Gluon dq kernel below FUSED_DQ_MIN_N[causal]."""
    cfg = dict(GLUON_BACKWARD[d, causal])
    if d == 128 and n < FUSED_DQ_MIN_N[causal]:
        cfg["dq_from"] = "gluon"
    return cfg


def key_split_config(d: int, causal: bool) -> dict:
    """GLUON_BACKWARD's config for (d, causal) if it is a key split, else KEY_SPLIT_D64."""
    cfg = GLUON_BACKWARD[d, causal]
    return dict(KEY_SPLIT_D64 if cfg.get("split") == "queries" else cfg)


def dq_box(block_m: int, d: int, split: str = "keys", dq_from: str = "fused") -> list[int]:
    """The TMA box of one dQ reduction: half the columns (128-byte rows at D = 64) of a step's rows
    (split "keys"), or of a consumer's half of them ("queries"); with dq_from "warpgroup" 32 columns
    of a step's rows (the dQ warpgroup's piece)."""
    if dq_from == "warpgroup":
        return [1, 1, block_m, 32]
    return [1, 1, block_m if split == "keys" else block_m // 2, d // 2]


def gluon_backward_fits(dout, q, k, v, scale: float) -> bool:
    """Whether the Gluon backward serves these inputs (else the tl kernels do)."""
    return ((q.shape[-1], False) in GLUON_BACKWARD and gluon_forward_fits(q, k, v, scale) and tma_describable(dout)
            and _steps_exact(q.shape[1] // k.shape[1], q.shape[2], 64))  # 64: the smallest block_m


def _steps_exact(group: int, n: int, block_m: int) -> bool:
    """Whether the Gluon backward's tile steps (group * n / block_m of them) stay below 2^24, where
    the kernel's float32 division of a step's index by the group size is exact (_step_rows)."""
    return group * triton.cdiv(n, block_m) < 2**24


def backward_delta(out, dout, lse, dlse, *, dq_sum: bool = False):
    """The backward's preprocess: (delta (B, H, N) float32, and with ``dq_sum`` a zeroed float32
    (B, H, N, D) buffer for the Gluon kernel's dQ reductions, zeroed by the same pass)."""
    return backward_preprocess(out, dout, lse, dlse, dq_sum=dq_sum)[:2]


def backward_preprocess(out, dout, lse, dlse, *, dq_sum: bool = False, row_stats: bool = False):
    """backward_delta's (delta, dq_sum), and with ``row_stats`` for the Gluon backward kernel the
    (B * H, 2, N) view of a float32 buffer with rows padded to 16 bytes (what TMA reads) that holds
    each row's lse (+inf for -inf) and delta (a placeholder otherwise); one pass over the rows."""
    B, H, N, D = out.shape
    dout = tl_addressable(dout)
    delta = torch.empty((B, H, N), dtype=torch.float32, device=out.device)
    acc = torch.empty((B, H, N, D) if dq_sum else (1, 1, 1, D), dtype=torch.float32, device=out.device)
    n_pad = triton.cdiv(N, 4) * 4
    stats = torch.empty((B * H, 2, n_pad) if row_stats else (1, 2, 4), dtype=torch.float32, device=out.device)
    pre_m = 16 if out.device.type != "cuda" else 64
    _DELTA[row_block_grid(B * H, N, pre_m)](
        out, dout, lse, dlse if dlse is not None else lse, delta, stats, acc, *out.stride(), *dout.stride(), H, N, D,
        n_pad, HAS_DLSE=dlse is not None, ZERO_DQ_SUM=dq_sum, ROW_STATS=row_stats, BLOCK_M=pre_m,
        BLOCK_D=block_d(D))
    return delta, acc, stats[..., :N]


def backward_gluon(dout, q, k, v, out, lse, dlse, dq, dk, dv, causal: bool, scale: float, *, block_m: int,
                   block_n: int, stages: int, dq_from: str = "fused", balanced: bool = True,
                   dq_config: dict | None = None, split: str = "keys", kv_regs: bool = False,
                   drawn: bool = False) -> None:
    """The Gluon backward: the preprocess, then dk and dv, and dq: with ``dq_from`` "fused",
    "overlapped" or "lagged" in the same kernel (through a float32 buffer that its TMA reductions add
    to, each consumer half of the columns), "warpgroup" likewise by a warpgroup of its own (D = 64),
    "gluon" by gluon_dq.py's kernel after it (``dq_config``: its blocks, GLUON_DQ by default), "tl" by
    the tl dq kernel. ``split``: what each consumer owns, "keys" (half the tile's keys, for everything)
    or "queries" (half of each step's queries for S, dP and dQ, half the keys for dK and dV; dQ "fused"
    only): gluon_backward.py. ``kv_regs`` (the key split): each consumer holds its K and V rows in
    registers for the tile (fits at D = 64). ``drawn``: the kernel's programs draw their tiles as they
    get to them (backward_gluon_kernel)."""
    if split not in ("keys", "queries") or (split == "queries" and (dq_from != "fused" or kv_regs)):
        raise ValueError(f"split is 'keys' or 'queries' (with dq_from 'fused', K and V in shared memory); got "
                         f"{split!r}, {dq_from!r}, kv_regs={kv_regs}")
    if dq_from == "warpgroup" and q.shape[-1] != 64:
        raise ValueError(f"dq_from 'warpgroup' fits head dim 64 (registers); got {q.shape[-1]}")
    if kv_regs and DQ_MODES[dq_from] == 0:
        # the dK/dV kernel alone with K and V in registers gave wrong dK and dV on the H100: ptxas
        # reuses some of V's operand registers inside its loop (session 14; report's
        # register_operands_clobbered): refused
        raise ValueError("kv_regs takes a dQ added in the kernel: dq_from 'fused', 'overlapped', 'lagged' or "
                         "'warpgroup'")
    fused_dq = DQ_MODES[dq_from] > 0
    delta, dq_sum, stats = backward_preprocess(out, dout, lse, dlse, dq_sum=fused_dq, row_stats=True)
    backward_gluon_kernel(dout, q, k, v, stats, dq_sum, dk, dv, causal, scale, block_m=block_m, block_n=block_n,
                          stages=stages, dq_from=dq_from, balanced=balanced, split=split, kv_regs=kv_regs,
                          drawn=drawn)
    if fused_dq:
        dq.copy_(dq_sum)
    elif dq_from == "gluon":
        backward_dq_gluon(dout, q, k, v, lse, delta, dq, causal, scale, balanced=balanced,
                          **(dq_config or GLUON_DQ[q.shape[-1]]))
    else:
        _backward_dq(dout, q, k, v, lse, delta, dq, causal, scale, backward_config(q.shape[-1], interpret=False))


def backward_gluon_kernel(dout, q, k, v, stats, dq_sum, dk, dv, causal: bool, scale: float, *, block_m: int,
                          block_n: int, stages: int, dq_from: str, balanced: bool = True, split: str = "keys",
                          kv_regs: bool = False, drawn: bool = False) -> None:
    """The Gluon backward kernel alone: dk, dv, and with ``dq_from`` "fused", "overlapped", "warpgroup" or
    "lagged" scale * dS K added to the float32 ``dq_sum`` (B, H, N, D; a placeholder otherwise), from
    the rows' lse and delta in ``stats`` (backward_preprocess's); ``balanced`` (causal): the programs take their tiles
    from a balanced schedule, not round-robin; ``drawn`` (the key split): each program draws its next
    tile from a counter when it gets to it, in tile-id order (``balanced`` is then ignored: the
    heaviest tiles come first in that order); ``split``: see backward_gluon."""
    grid, args = backward_kernel_args(dout, q, k, v, stats, dq_sum, dk, dv, causal, scale, block_m=block_m,
                                      block_n=block_n, dq_from=dq_from, balanced=balanced, split=split, drawn=drawn)
    with dispatch.on_device(q.device):
        if split == "queries":
            return _GLUON_BWD_SPLIT[grid](*args, CAUSAL=causal, STAGES=stages, num_warps=4)
        _GLUON_BWD[grid](*args, CAUSAL=causal, STAGES=stages, DQ=DQ_MODES[dq_from], KV_REGS=kv_regs,
                                   num_warps=4)


def backward_kernel_args(dout, q, k, v, stats, dq_sum, dk, dv, causal: bool, scale: float, *, block_m: int,
                         block_n: int, dq_from: str, balanced: bool = True, split: str = "keys",
                         drawn: bool = False) -> tuple[tuple, tuple]:
    """(grid, runtime arguments) of backward_gluon_kernel's launch: the TMA operands, sizes, tile
    order (schedule table, and with ``drawn`` the stream's tile counter, key split only) in the
    kernel's order, for attention_bwd_kernel or, with split "queries", attention_bwd_split_kernel
    (its twins in the probes take the same ones)."""
    B, H, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    desc = _head_operand
    tiles = triton.cdiv(Nk, 2 * block_n) * B * Hkv
    grid = (min(tiles, dispatch.num_sms(q.device)),)
    group = H // Hkv
    if not _steps_exact(group, N, block_m):
        raise ValueError(f"the Gluon backward takes (Hq / Hkv) * N / {block_m} < 2^24 steps a tile; got "
                         f"{group} q heads a kv head and N = {N}")
    # kv heads kept together in L2, as if each had one q head: with grouped heads a kv head's tiles
    # walk the query blocks together, so they share a few blocks of the group's rows at a time
    head_group = _heads_in_l2(2 * N * D * q.element_size())
    if drawn and split != "keys":
        raise ValueError("drawn tiles serve the key split (split 'keys')")
    schedule = None
    if causal and balanced and not drawn and group == 1:
        schedule = causal_schedule(q.device, "backward", N, Nk, block_m, 2 * block_n, B * Hkv, head_group, group,
                                   grid[0])
    elif causal and balanced and not drawn:  # grouped heads: key blocks in pairs
        schedule = causal_schedule(q.device, triton.cdiv(Nk, 2 * block_n), B * Hkv, head_group, grid[0],
                                   build=_paired_table)
    box = dq_box(block_m, D, split) if split == "queries" else dq_box(block_m, D, dq_from=dq_from)
    args = (desc(q, block_m), desc(k, 2 * block_n), desc(v, 2 * block_n), desc(dout, block_m), desc(dk, block_n),
            desc(dv, block_n), row_stats_operand(stats, block_m), TmaOperand(dq_sum, box), H, N, Nk, group,
            scale, scale * LOG2E, B * Hkv, head_group, schedule)
    if split == "queries":
        return grid, args
    return grid, args + (tile_counter(q.device) if drawn else None,)


def row_stats_operand(stats, block_m: int) -> TmaOperand:
    """backward_preprocess's row statistics as a TMA operand: boxes of (lse, delta) of block_m rows,
    unswizzled (the kernel reads them as S^T's columns; rows past N arrive as zeros)."""
    return TmaOperand(stats, [1, 2, block_m], layout=_unswizzled_layout(3))


@functools.lru_cache(maxsize=None)
def _unswizzled_layout(rank: int):
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=rank)


def backward_dq_gluon(dout, q, k, v, lse, delta, dq, causal: bool, scale: float, *, block_m: int, block_n: int,
                      stages: int, balanced: bool = True) -> None:
    """dq (contiguous, q's shape) by gluon_dq.py's kernel: tiles of 2 block_m query rows, block_n
    keys a step; ``balanced`` (causal) as the forward's."""
    B, H, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    desc = _head_operand
    grid, head_group, schedule = _query_tiling(q, k, 2 * block_m, block_n, causal, balanced)
    with dispatch.on_device(q.device):
        _GLUON_DQ[grid](desc(q, 2 * block_m), desc(k, block_n), desc(v, block_n), desc(dout, 2 * block_m),
                                  desc(dq, block_m), desc(q, 2 * block_m), lse, delta, H, N, Nk, H // Hkv, scale,
                                  scale * LOG2E, B * H, head_group, schedule, CAUSAL=causal, STAGES=stages,
                                  num_warps=4)


def backward_into(dout, q, k, v, out, lse, dlse, dq, dk, dv, causal: bool, scale: float, *,
                  config: dict | None = None, gluon: dict | None = None) -> None:
    """dq, dk, dv (contiguous, the inputs' shapes) from dout, the forward's out and lse, and an
    optional gradient of lse. ``config``: the tl kernels' blocks; ``gluon``: the Gluon kernel's
    (GLUON_BACKWARD's keys). On Hopper the Gluon kernels serve what they fit; a dq fused into the
    dK/dV kernel sums float32 TMA reductions in no fixed order, so with
    torch.use_deterministic_algorithms(True) dq comes from the Gluon dq kernel instead (each row
    summed in registers in a fixed order: bitwise reproducible)."""
    B, H, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    interpret = q.device.type != "cuda"
    if gluon is not None or (config is None and gluon_backward_fits(dout, q, k, v, scale)):
        cfg = dict(gluon or gluon_backward_config(D, N, causal))
        if torch.are_deterministic_algorithms_enabled() and DQ_MODES[cfg["dq_from"]] > 0:
            # dq from its own kernel: each row summed in registers, in a fixed order (the query
            # split always adds its dQ: the key split computes dK and dV then)
            if cfg.get("split") == "queries":
                cfg = dict(KEY_SPLIT_D64)
            cfg.update(dq_from="gluon", kv_regs=False)
        return backward_gluon(dout, q, k, v, out, lse, dlse, dq, dk, dv, causal, scale, **cfg)
    q, k, v, dout = tl_addressable(q), tl_addressable(k), tl_addressable(v), tl_addressable(dout)
    delta, _ = backward_delta(out, dout, lse, dlse)
    cfg = config or backward_config(D, interpret)
    strides = (*q.stride(), *k.stride(), *v.stride(), *dout.stride())
    _DKDV[(B * Hkv, cdiv(Nk, cfg["BLOCK_N"]))](
        q, k, v, dout, lse, delta, dk, dv, *strides, *dk.stride(), H, Hkv, N, Nk, D, H // Hkv,
        scale, scale * LOG2E, CAUSAL=causal, BLOCK_D=block_d(D), **cfg)
    _backward_dq(dout, q, k, v, lse, delta, dq, causal, scale, cfg)


def _backward_dq(dout, q, k, v, lse, delta, dq, causal: bool, scale: float, cfg: dict) -> None:
    """The tl dq kernel: one program per (batch * q head, query block), looping over the keys."""
    q, k, v, dout = tl_addressable(q), tl_addressable(k), tl_addressable(v), tl_addressable(dout)
    B, H, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _DQ[row_block_grid(B * H, N, cfg["BLOCK_M"])](
        q, k, v, dout, lse, delta, dq, *q.stride(), *k.stride(), *v.stride(), *dout.stride(), *dq.stride(),
        H, N, Nk, D, H // Hkv, scale, scale * LOG2E, CAUSAL=causal, BLOCK_D=block_d(D), **cfg)
