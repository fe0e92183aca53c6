"""Rotary embedding as one Triton kernel: each pair (a, b) of a head's first 2R features turns by the
angle of its token's position,

    a' = a cos - b sin,    b' = b cos + a sin        (CONJUGATE: by -sin, the backward)

and the features past 2R pass through. A pair is (i, i + R) in the half-split (GPT-NeoX / Llama)
layout: two [heads, R] row tiles; and (2i, 2i + 1) in the interleaved (GPT-J) one: the [heads, 2R]
rows loaded whole, reshaped to [heads, R, 2] and split in registers (addressing the pairs as a 3-D
tile instead made 4-byte loads; this way every access is a 16-byte vector: PTX of report.py).

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
    x_rows = X + b * stride_xb + n * stride_xn + h.to(tl.int64)[:, None] * stride_xh  # [BLOCK_H, 1]
    o_rows = OUT + b * stride_ob + n * stride_on + h.to(tl.int64)[:, None] * stride_oh
    if INTERLEAVED:  # the pairs' 2R features are contiguous: load them as rows, split in registers
        f = tl.arange(0, 2 * BLOCK_R)
        fmask = (h < heads)[:, None] & (f < 2 * R)[None, :]
        pair = tl.load(x_rows + f[None, :], mask=fmask, other=0.0).to(tl.float32)
        a, c = tl.split(tl.reshape(pair, [BLOCK_H, BLOCK_R, 2]))
    else:  # the halves (i) and (i + R): two row tiles
        imask2 = (h < heads)[:, None] & (i < R)[None, :]
        a = tl.load(x_rows + i[None, :], mask=imask2, other=0.0).to(tl.float32)
        c = tl.load(x_rows + R + i[None, :], mask=imask2, other=0.0).to(tl.float32)
    a2 = a * cos[None, :] - c * sin[None, :]
    c2 = c * cos[None, :] + a * sin[None, :]
    if INTERLEAVED:
        rotated = tl.reshape(tl.join(a2, c2), [BLOCK_H, 2 * BLOCK_R])
        tl.store(o_rows + f[None, :], rotated.to(OUT.dtype.element_ty), mask=fmask)
    else:
        tl.store(o_rows + i[None, :], a2.to(OUT.dtype.element_ty), mask=imask2)
        tl.store(o_rows + R + i[None, :], c2.to(OUT.dtype.element_ty), mask=imask2)
    if PASS > 0:  # features 2R .. D - 1, unchanged
        p = tl.arange(0, BLOCK_PASS)
        pmask = (h < heads)[:, None] & (p < PASS)[None, :]
        rest = tl.load(x_rows + 2 * R + p[None, :], mask=pmask)
        tl.store(o_rows + 2 * R + p[None, :], rest, mask=pmask)
