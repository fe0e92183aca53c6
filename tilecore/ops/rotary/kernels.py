"""Rotary embedding as one Triton kernel: each pair (a, b) of a head's first 2R features turns by the
angle of its token's position,

    a' = a cos - b sin,    b' = b cos + a sin        (CONJUGATE: by -sin, the backward)

and the features past 2R pass through. A pair is (i, i + R) in the half-split (GPT-NeoX / Llama)
layout and (2i, 2i + 1) in the interleaved (GPT-J) one: the kernel addresses pair element j of pair i
at column i + j R or 2 i + j, loads the [heads, R, 2] tile at once and splits it, so both layouts
read and write whole rows (no strided half-rows).

A program takes one token (b, n) and BLOCK_H of its heads: cos and sin are read once a token (from the
row of its position: n, or position_ids[b, n]) and serve every head. A position outside [0, N_max)
reads no memory and gives NaN (the host checks positions on CPU tensors, where that costs no sync).
"""
import triton
import triton.language as tl


@triton.jit
def rotary_kernel(X, COS, SIN, POS, OUT, seqlen, heads, n_max,
                  stride_xb, stride_xn, stride_xh, stride_ob, stride_on, stride_oh,
                  stride_cos, stride_sin, stride_pb, stride_pn,
                  R: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, PASS: tl.constexpr,
                  BLOCK_PASS: tl.constexpr, INTERLEAVED: tl.constexpr, CONJUGATE: tl.constexpr,
                  HAS_POS: tl.constexpr):
    """OUT[b, n, h] = rotation of X[b, n, h] for token program_id(0) = b * seqlen + n and heads
    program_id(1) * BLOCK_H ...; X, OUT: (B, N, H, D) with unit stride along D (OUT may be X: in place,
    PASS = 0). R: pairs rotated; PASS: features past 2R copied; cos, sin: (N_max, R) rows."""
    token = tl.program_id(0)
    b = (token // seqlen).to(tl.int64)
    n = (token % seqlen).to(tl.int64)
    if HAS_POS:
        pos = tl.load(POS + b * stride_pb + n * stride_pn).to(tl.int64)
    else:
        pos = n
    valid = (pos >= 0) & (pos < n_max)
    i = tl.arange(0, BLOCK_R)
    imask = (i < R) & valid
    cos = tl.load(COS + pos * stride_cos + i, mask=imask, other=float("nan")).to(tl.float32)
    sin = tl.load(SIN + pos * stride_sin + i, mask=imask, other=float("nan")).to(tl.float32)
    if CONJUGATE:
        sin = -sin
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    j = tl.arange(0, 2)
    if INTERLEAVED:
        col = 2 * i[None, :, None] + j[None, None, :]  # [1, BLOCK_R, 2]
    else:
        col = i[None, :, None] + R * j[None, None, :]
    mask = (h < heads)[:, None, None] & (i < R)[None, :, None] & (j < 2)[None, None, :]
    x_ptrs = X + b * stride_xb + n * stride_xn + h.to(tl.int64)[:, None, None] * stride_xh + col
    o_ptrs = OUT + b * stride_ob + n * stride_on + h.to(tl.int64)[:, None, None] * stride_oh + col
    pair = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_H, BLOCK_R, 2]
    a, c = tl.split(pair)
    a2 = a * cos[None, :] - c * sin[None, :]
    c2 = c * cos[None, :] + a * sin[None, :]
    tl.store(o_ptrs, tl.join(a2, c2).to(OUT.dtype.element_ty), mask=mask)
    if PASS > 0:  # features 2R .. D - 1, unchanged
        p = tl.arange(0, BLOCK_PASS)
        pmask = (h < heads)[:, None] & (p < PASS)[None, :]
        rows_x = X + b * stride_xb + n * stride_xn + h.to(tl.int64)[:, None] * stride_xh
        rows_o = OUT + b * stride_ob + n * stride_on + h.to(tl.int64)[:, None] * stride_oh
        rest = tl.load(rows_x + 2 * R + p[None, :], mask=pmask)
        tl.store(rows_o + 2 * R + p[None, :], rest, mask=pmask)
