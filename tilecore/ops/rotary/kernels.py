"""Rotary embedding as one Triton kernel: each pair (a, b) of a head's first 2R features turns by the
angle of its token's position,

    a' = a cos - b sin,    b' = b cos + a sin        (CONJUGATE: by -sin, the backward)

and the features past 2R pass through. A pair is (i, i + R) in the half-split (GPT-NeoX / Llama)
layout: two [rows, R] tiles; and (2i, 2i + 1) in the interleaved (GPT-J) one: the [rows, 2R]
rows loaded whole, reshaped to [rows, R, 2] and split in registers (addressing the pairs as a 3-D
tile instead made 4-byte loads; this way every access is a 16-byte vector: PTX of report.py).

A tile's rows are, token by token (x with its heads side by side, as (B, N, H, D) tensors are),
BLOCK_H heads of one token (b, n): cos and sin are read once a token (from the row of its position:
n, or position_ids[b, n]) and serve every head; or, head by head (BLOCK_T > 1: x with each head's
tokens side by side, as attention's (B, H, N, D) q and k are), BLOCK_T consecutive tokens of one head,
each with its own cos and sin row: BLOCK_T x D contiguous features read and written, where a tile of
a token's heads would take D of each head. A position outside [0, N_max) reads no memory and gives NaN
(the host checks positions on CPU tensors, where that costs no sync).
"""
import triton
import triton.language as tl


@triton.jit
def rotary_kernel(X, COS, SIN, POS, OUT, seqlen, heads, n_max,
                  stride_xb, stride_xn, stride_xh, stride_ob, stride_on, stride_oh,
                  stride_cos, stride_sin, stride_pb, stride_pn,
                  R: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, PASS: tl.constexpr,
                  BLOCK_PASS: tl.constexpr, INTERLEAVED: tl.constexpr, CONJUGATE: tl.constexpr,
                  HAS_POS: tl.constexpr, BLOCK_T: tl.constexpr = 1):
    """OUT[b, n, h] = rotation of X[b, n, h]; X, OUT: (B, N, H, D) with unit stride along D (OUT may be X:
    in place, PASS = 0). BLOCK_T 1: token program_id(0) = b * seqlen + n, heads program_id(1) * BLOCK_H ...;
    else (BLOCK_H 1): tokens from (program_id(0) % cdiv(seqlen, BLOCK_T)) * BLOCK_T of batch
    program_id(0) // cdiv(seqlen, BLOCK_T), head program_id(1). R: pairs rotated; PASS: features past 2R
    copied; cos, sin: (N_max, R) rows."""
    if BLOCK_T == 1:
        token = tl.program_id(0)
        b = (token // seqlen).to(tl.int64)
        n = (token % seqlen).to(tl.int64)
        if HAS_POS:
            pos = tl.load(POS + b * stride_pb + n * stride_pn).to(tl.int64)
        else:
            pos = n
        i = tl.arange(0, BLOCK_R)
        # The position compared as a vector: triton's interpreter splats a scalar bool into an int32 block,
        # which its loads refuse as a mask from 3.9 on ("mask has unsupported dtype").
        pos_i = pos + tl.zeros([BLOCK_R], tl.int64)
        imask = (i < R) & (pos_i >= 0) & (pos_i < n_max)
        cos = tl.load(COS + pos * stride_cos + i, mask=imask, other=float("nan")).to(tl.float32)[None, :]
        sin = tl.load(SIN + pos * stride_sin + i, mask=imask, other=float("nan")).to(tl.float32)[None, :]
        if CONJUGATE:
            sin = -sin
        h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        x_rows = X + b * stride_xb + n * stride_xn + h.to(tl.int64)[:, None] * stride_xh  # [BLOCK_H, 1]
        o_rows = OUT + b * stride_ob + n * stride_on + h.to(tl.int64)[:, None] * stride_oh
        rows = h < heads
    else:
        blocks = tl.cdiv(seqlen, BLOCK_T)
        b = (tl.program_id(0) // blocks).to(tl.int64)
        n = (tl.program_id(0) % blocks).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        rows = n < seqlen
        if HAS_POS:
            pos = tl.load(POS + b * stride_pb + n * stride_pn, mask=rows, other=0).to(tl.int64)
        else:
            pos = n
        valid = (pos >= 0) & (pos < n_max)
        i = tl.arange(0, BLOCK_R)
        imask = valid[:, None] & (i < R)[None, :]
        cos = tl.load(COS + pos[:, None] * stride_cos + i[None, :], mask=imask, other=float("nan")).to(tl.float32)
        sin = tl.load(SIN + pos[:, None] * stride_sin + i[None, :], mask=imask, other=float("nan")).to(tl.float32)
        if CONJUGATE:
            sin = -sin
        h = tl.program_id(1).to(tl.int64)
        x_rows = X + b * stride_xb + h * stride_xh + n[:, None] * stride_xn  # [BLOCK_T, 1]
        o_rows = OUT + b * stride_ob + h * stride_oh + n[:, None] * stride_on
    turn_rows(x_rows, o_rows, rows, cos, sin, R, BLOCK_R, BLOCK_H * BLOCK_T, PASS, BLOCK_PASS, INTERLEAVED)


@triton.jit
def turn_rows(x_rows, o_rows, rows, cos, sin, R: tl.constexpr, BLOCK_R: tl.constexpr, ROWS: tl.constexpr,
              PASS: tl.constexpr, BLOCK_PASS: tl.constexpr, INTERLEAVED: tl.constexpr):
    """The pairs of the rows at x_rows ([ROWS, 1] pointers; ``rows``: which exist) turned by cos and sin ([1, BLOCK_R]
    for every row, or [ROWS, BLOCK_R]), into o_rows, the features past 2R copied."""
    i = tl.arange(0, BLOCK_R)
    if INTERLEAVED:  # the pairs' 2R features are contiguous: load them as rows, split in registers
        f = tl.arange(0, 2 * BLOCK_R)
        fmask = rows[:, None] & (f < 2 * R)[None, :]
        pair = tl.load(x_rows + f[None, :], mask=fmask, other=0.0).to(tl.float32)
        a, c = tl.split(tl.reshape(pair, [ROWS, BLOCK_R, 2]))
    else:  # the halves (i) and (i + R): two row tiles
        imask2 = rows[:, None] & (i < R)[None, :]
        a = tl.load(x_rows + i[None, :], mask=imask2, other=0.0).to(tl.float32)
        c = tl.load(x_rows + R + i[None, :], mask=imask2, other=0.0).to(tl.float32)
    a2 = a * cos - c * sin
    c2 = c * cos + a * sin
    if INTERLEAVED:
        rotated = tl.reshape(tl.join(a2, c2), [ROWS, 2 * BLOCK_R])
        tl.store(o_rows + f[None, :], rotated.to(o_rows.dtype.element_ty), mask=fmask)
    else:
        tl.store(o_rows + i[None, :], a2.to(o_rows.dtype.element_ty), mask=imask2)
        tl.store(o_rows + R + i[None, :], c2.to(o_rows.dtype.element_ty), mask=imask2)
    if PASS > 0:  # features 2R .. D - 1, unchanged
        p = tl.arange(0, BLOCK_PASS)
        pmask = rows[:, None] & (p < PASS)[None, :]
        rest = tl.load(x_rows + 2 * R + p[None, :], mask=pmask)
        tl.store(o_rows + 2 * R + p[None, :], rest, mask=pmask)
