"""Tile operations, as ``triton.jit`` functions that kernels call on register tiles.

ThunderKittens' vocabulary, in Triton: matrix multiply-accumulate (``A B`` and ``A B^T``), row and
column reductions, ``exp2`` with a folded-in scale, masks (causal, bounds), the online-softmax
update, casts, and quantization with a scale. Each is a few lines; the point is that kernels read
as a sequence of named tile steps, and that each step is tested once (tests/tiles).

Inside the Triton interpreter, check bf16 math in fp16 or fp32 (the interpreter's bf16 ``tl.dot``
is wrong); on a GPU every dtype is real.
"""
from __future__ import annotations

import math

import triton
import triton.language as tl

# Softmax runs in base 2 (one exp2 an element): scores carry a factor log2(e), and a base-2
# log-sum-exp divided by it is the natural one
LOG2E = math.log2(math.e)
LOG2E_IN_KERNEL = tl.constexpr(LOG2E)


# --------------------------------------------------------------------------------------------
# matrix multiply-accumulate


@triton.jit
def mma(a, b, acc):
    """acc + A B  (A: [m, k], B: [k, n], acc: [m, n] fp32)."""
    return tl.dot(a, b, acc)


@triton.jit
def mma_abt(a, b, acc):
    """acc + A B^T  (A: [m, k], B: [n, k]); the transpose is a view, no data moves."""
    return tl.dot(a, tl.trans(b), acc)


# --------------------------------------------------------------------------------------------
# addressing


@triton.jit
def block_ptrs(base, start, rows, cols, row_stride, col_stride):
    """Pointers to rows ``start + rows`` (``rows`` counted from 0 within the block) and columns
    ``cols`` of a strided 2-D view at ``base``. Row offsets are 64-bit, so a view past 2^31 elements
    (a 2M-key cache in (batch, keys, 8 heads, 128) layout, say) does not wrap to a wrong address;
    column offsets stay 32-bit (the caller keeps a block's columns times their stride under 2^31,
    as tiles.launch.tl_addressable does). (Keeping rows within a block 32-bit as well made no
    difference to a memory-bound pass, and spilled more in a loop that kept them live.)"""
    rows64 = tl.cast(start, tl.int64) + rows.to(tl.int64)
    return base + rows64[:, None] * row_stride + cols[None, :] * col_stride


# --------------------------------------------------------------------------------------------
# reductions: row_* reduce along the columns (one value per row), col_* along the rows


@triton.jit
def row_max(x):
    return tl.max(x, axis=1)


@triton.jit
def row_sum(x):
    return tl.sum(x, axis=1)


@triton.jit
def col_max(x):
    return tl.max(x, axis=0)


@triton.jit
def col_sum(x):
    return tl.sum(x, axis=0)


# --------------------------------------------------------------------------------------------
# elementwise


@triton.jit
def exp2_scaled(x, scale_log2e):
    """2^(x * scale_log2e): exp(x * s) with s * log2(e) folded into one multiply (one MUFU.EX2)."""
    return tl.exp2(x * scale_log2e)


@triton.jit
def bounds_mask(offs_m, offs_n, M, N):
    """[m, n] mask of the elements inside an M x N matrix."""
    return (offs_m[:, None] < M) & (offs_n[None, :] < N)


@triton.jit
def causal_mask(x, offs_m, offs_n, fill):
    """x where column <= row (a query sees keys up to itself), else ``fill`` (e.g. -inf)."""
    return tl.where(offs_n[None, :] <= offs_m[:, None], x, fill)


@triton.jit
def masked(x, mask, fill):
    return tl.where(mask, x, fill)


# --------------------------------------------------------------------------------------------
# online softmax (the flash-attention update), in base 2


@triton.jit
def online_softmax_start(ROWS: tl.constexpr):
    """An online softmax's running row max and sum before any score (the twin of
    ``tiles.gluon.online_softmax_start``): m = -inf (see ``online_softmax_update``), l = 0."""
    return tl.full([ROWS], float("-inf"), tl.float32), tl.zeros([ROWS], tl.float32)


@triton.jit
def online_softmax_update(m_i, l_i, acc, s, scale_log2e):
    """Fold a new block of scores ``s`` [m, n] into the running (max, sum, accumulator).

    ``m_i`` is the running row max of the scaled scores (in log2 units), ``l_i`` the running row
    sum of 2^(scaled - m_i), ``acc`` [m, d] the running output. Returns (m_new, l_new, acc
    rescaled to m_new, p) where p = 2^(s * scale_log2e - m_new) is the block's probabilities,
    ready for ``acc = mma(p, v, acc)``; the final output is acc / l.

    Masked scores must be -inf and ``scale_log2e`` positive (fold a negative scale into s first). A
    row whose scores so far are all masked keeps m = -inf, l = 0 and acc = 0: never NaN.
    """
    m_new = tl.maximum(m_i, row_max(s) * scale_log2e)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # exp2(-inf - -inf) would be NaN
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s * scale_log2e - m_ref[:, None])
    l_new = l_i * alpha + row_sum(p)
    return m_new, l_new, acc * alpha[:, None], p


@triton.jit
def online_softmax_result(m_i, l_i, acc):
    """The rows' output acc / l and their natural-log lse ((m + log2 l) / log2 e) after the last
    step (the twin of ``tiles.gluon.online_softmax_result``): a row with no key (l = 0) gets 0 and
    -inf; a row whose l is NaN (a NaN or +inf score) NaN and NaN. "No key" is l == 0, not "not
    l > 0", which a NaN l passes too."""
    no_key = l_i == 0.0
    l_safe = tl.where(no_key, 1.0, l_i)
    # select, then divide (-inf / log2 e is -inf): the order the tl attention kernels were measured with; the
    # other order gives the same bits but ptxas schedules the sm_90a code differently
    return acc / l_safe[:, None], tl.where(no_key, float("-inf"), m_i + tl.log2(l_safe)) / LOG2E_IN_KERNEL


# --------------------------------------------------------------------------------------------
# casts and quantization


@triton.jit
def cast(x, dtype: tl.constexpr):
    """Round to ``dtype`` (round-to-nearest-even for floating point)."""
    return x.to(dtype)


@triton.jit
def quantize(x, inv_scale, QMAX: tl.constexpr, dtype: tl.constexpr):
    """x * inv_scale, clamped to [-QMAX, QMAX] (448 for e4m3), rounded to ``dtype``."""
    y = x.to(tl.float32) * inv_scale
    y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
    return y.to(dtype)


@triton.jit
def dequantize(q, scale):
    """q * scale in fp32."""
    return q.to(tl.float32) * scale


# --------------------------------------------------------------------------------------------
# attention's score masks (tl twins of tiles.gluon's, same names and meaning)


@triton.jit
def mask_scores(s, first_query, first_key, N, Nk, CAUSAL: tl.constexpr, KEY_AXIS: tl.constexpr):
    """The scores s (keys along ``KEY_AXIS``: 1 for [queries, keys], 0 for the transposed [keys,
    queries]; queries from ``first_query``, keys from ``first_key``) with -inf where the key is past
    Nk or, causal, after the query's diagonal: aligned to the bottom right, query i sees keys
    j <= i + Nk - N."""
    if KEY_AXIS == 1:
        keys = first_key + tl.arange(0, s.shape[1])[None, :]
        queries = first_query + tl.arange(0, s.shape[0])[:, None]
    else:
        keys = first_key + tl.arange(0, s.shape[0])[:, None]
        queries = first_query + tl.arange(0, s.shape[1])[None, :]
    ok = keys < Nk
    if CAUSAL:
        ok = ok & (keys <= queries + (Nk - N))
    return tl.where(ok, s, float("-inf"))


@triton.jit
def needs_mask(first_query, first_key, BLOCK_KEYS: tl.constexpr, N, Nk, CAUSAL: tl.constexpr):
    """Whether a block of scores, queries from ``first_query`` and ``BLOCK_KEYS`` keys from
    ``first_key``, has a masked score (see ``mask_scores``): a key past Nk, or (causal) a key after
    the first query's diagonal."""
    bound = Nk
    if CAUSAL:
        bound = tl.minimum(bound, first_query + 1 + (Nk - N))  # the first query's last key + 1
    return first_key + BLOCK_KEYS > bound
