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
def turn_heads(x_rows, o_rows, cos, sin, h_ok, R: tl.constexpr, BLOCK_R: tl.constexpr, PASS: tl.constexpr,
               BLOCK_PASS: tl.constexpr, INTERLEAVED: tl.constexpr):
    """One token's heads turned: x_rows, o_rows ([BLOCK_H, 1] pointers to its heads' rows, h_ok which are
    real) by the angles cos, sin ([BLOCK_R] float32); features 2R .. 2R + PASS - 1 copied."""
    BLOCK_H: tl.constexpr = x_rows.shape[0]
    i = tl.arange(0, BLOCK_R)
    if INTERLEAVED:  # the pairs' 2R features are contiguous: load them as rows, split in registers
        f = tl.arange(0, 2 * BLOCK_R)
        fmask = h_ok[:, None] & (f < 2 * R)[None, :]
        pair = tl.load(x_rows + f[None, :], mask=fmask, other=0.0).to(tl.float32)
        a, c = tl.split(tl.reshape(pair, [BLOCK_H, BLOCK_R, 2]))
    else:  # the halves (i) and (i + R): two row tiles
        imask2 = h_ok[:, None] & (i < R)[None, :]
        a = tl.load(x_rows + i[None, :], mask=imask2, other=0.0).to(tl.float32)
        c = tl.load(x_rows + R + i[None, :], mask=imask2, other=0.0).to(tl.float32)
    a2 = a * cos[None, :] - c * sin[None, :]
    c2 = c * cos[None, :] + a * sin[None, :]
    if INTERLEAVED:
        rotated = tl.reshape(tl.join(a2, c2), [BLOCK_H, 2 * BLOCK_R])
        tl.store(o_rows + f[None, :], rotated.to(o_rows.dtype.element_ty), mask=fmask)
    else:
        tl.store(o_rows + i[None, :], a2.to(o_rows.dtype.element_ty), mask=imask2)
        tl.store(o_rows + R + i[None, :], c2.to(o_rows.dtype.element_ty), mask=imask2)
    if PASS > 0:  # features 2R .. D - 1, unchanged
        p = tl.arange(0, BLOCK_PASS)
        pmask = h_ok[:, None] & (p < PASS)[None, :]
        rest = tl.load(x_rows + 2 * R + p[None, :], mask=pmask)
        tl.store(o_rows + 2 * R + p[None, :], rest, mask=pmask)


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
    turn_heads(x_rows, o_rows, cos, sin, h < heads, R, BLOCK_R, PASS, BLOCK_PASS, INTERLEAVED)


@triton.jit
def rotary_pair_kernel(X, Y, COS, SIN, OX, OY, x_tokens, seqlen_x, seqlen_y, heads_x, heads_y, shift_x, n_max,
                       stride_xb, stride_xn, stride_xh, stride_oxb, stride_oxn, stride_oxh,
                       stride_yb, stride_yn, stride_yh, stride_oyb, stride_oyn, stride_oyh, stride_cos, stride_sin,
                       R: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, PASS: tl.constexpr,
                       BLOCK_PASS: tl.constexpr, INTERLEAVED: tl.constexpr, CONJUGATE: tl.constexpr):
    """rotary_kernel over two tensors in one launch (attention's q and k): programs 0 .. x_tokens - 1 take X's
    tokens b * seqlen_x + n, token n at position n + shift_x (attention's query i at i + Nk - N), the rest Y's
    tokens b * seqlen_y + n at position n; into OX, OY (never X, Y: PASS features copied). Same dtypes; both
    (B, N, H, D) with unit stride along D; heads_x and heads_y may differ (grouped heads)."""
    token = tl.program_id(0)
    if token < x_tokens:
        b = (token // seqlen_x).to(tl.int64)
        n = (token % seqlen_x).to(tl.int64)
        pos = n + shift_x
        heads = heads_x
        x_row = X + b * stride_xb + n * stride_xn
        o_row = OX + b * stride_oxb + n * stride_oxn
        sh = stride_xh
        soh = stride_oxh
    else:
        t = token - x_tokens
        b = (t // seqlen_y).to(tl.int64)
        n = (t % seqlen_y).to(tl.int64)
        pos = n
        heads = heads_y
        x_row = Y + b * stride_yb + n * stride_yn
        o_row = OY + b * stride_oyb + n * stride_oyn
        sh = stride_yh
        soh = stride_oyh
    i = tl.arange(0, BLOCK_R)
    imask = (i < R) & (pos < n_max)
    cos = tl.load(COS + pos * stride_cos + i, mask=imask, other=float("nan")).to(tl.float32)
    sin = tl.load(SIN + pos * stride_sin + i, mask=imask, other=float("nan")).to(tl.float32)
    if CONJUGATE:
        sin = -sin
    h = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
    turn_heads(x_row + h[:, None] * sh, o_row + h[:, None] * soh, cos, sin, h < heads, R, BLOCK_R, PASS, BLOCK_PASS,
               INTERLEAVED)
