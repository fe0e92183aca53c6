"""The norm's forward pass, as Triton kernels: h = dropout(x) + residual, y = norm(h) * w + b.

A program works on a tile of ROWS rows by BLOCK_N columns, in float32 registers:

* rows that fit in one tile (``WHOLE_ROW``: N <= BLOCK_N): ``norm_forward_kernel`` alone, one read of
  x (and the residual) and one write of y (and h): the statistics come from the registers;
* wider rows: ``norm_stats_kernel`` first (one program per ROWS rows walks the columns and merges
  each block's mean and squared deviations, Chan et al.'s pairwise update), then
  ``norm_forward_kernel`` over (row tiles, column blocks) reads x again and normalizes with them.

Dropout keeps an element where 16 random bits of it are >= p16 = round(p * 2^16), the bits drawn by
Philox from the seed (a one-element int64 tensor) and the element's place in the (rows, N) matrix (one
call per 8 columns of a row): the same mask for any tiling, forward or backward, so it is recomputed,
never stored. Kept elements are scaled by 1 / (1 - p).

h, the residual stream, is rounded to its stored dtype before the statistics are taken: y is the norm
of exactly the h that ``prenorm`` hands back (and that the backward recomputes).
"""
import triton
import triton.language as tl


@triton.jit
def load_tile(ptr, r64, c, stride, mask):
    """The [ROWS, BLOCK_N] tile of rows ``r64`` (64-bit) and columns ``c`` of a row-major view, in float32."""
    return tl.load(ptr + r64[:, None] * stride + c[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def dropout_bits(seed_ptr, r64, c_start, N, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """16 random bits for each element (r, c_start + j) of a [ROWS, BLOCK_N] tile (c_start a multiple of
    8): one Philox call (4 x 32 bits) per 8 columns of a row, keyed by (r, c // 8), so the bits of an
    element do not depend on the tiling. (A call per element, 10 rounds of 32-bit multiplies, would
    cost more than the pass's memory time on an H100.)"""
    groups = (N + 7) // 8
    key = r64[:, None] * groups + (c_start // 8 + tl.arange(0, BLOCK_N // 8))[None, :]
    a, b, c, d = tl.randint4x(tl.load(seed_ptr), key)
    bits = tl.join(tl.join(tl.join(a & 0xFFFF, a >> 16), tl.join(b & 0xFFFF, b >> 16)),
                   tl.join(tl.join(c & 0xFFFF, c >> 16), tl.join(d & 0xFFFF, d >> 16)))  # [ROWS, BLOCK_N / 8, 2, 2, 2]
    return tl.reshape(bits, [ROWS, BLOCK_N]).to(tl.int32)


@triton.jit
def dropout_multiplier(seed_ptr, r64, c_start, N, p16, scale, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """scale where an element is kept (its 16 bits >= p16 = p * 2^16: kept with probability
    1 - p16 / 2^16), else 0; x times it is dropout(x) (x * 0 where dropped: a NaN stays NaN, as torch's)."""
    return tl.where(dropout_bits(seed_ptr, r64, c_start, N, ROWS, BLOCK_N) >= p16, scale, 0.0)


@triton.jit
def residual_stream(X, RES, r64, c, mask, stride_x, stride_res, drop,
                    HAS_RES: tl.constexpr, DROPOUT: tl.constexpr, H_DTYPE: tl.constexpr):
    """h = x * drop + residual on a tile (drop: dropout_multiplier's tile), in float32, rounded as it
    is stored (H_DTYPE)."""
    res = 0.0
    if HAS_RES:
        res = load_tile(RES, r64, c, stride_res, mask)
    return combine_stream(load_tile(X, r64, c, stride_x, mask), res, drop, HAS_RES, DROPOUT, H_DTYPE)


@triton.jit
def combine_stream(x, res, drop, HAS_RES: tl.constexpr, DROPOUT: tl.constexpr, H_DTYPE: tl.constexpr):
    """h = x * drop + res from loaded tiles (any dtype), in float32, rounded as it is stored (H_DTYPE)."""
    h = x.to(tl.float32)
    if DROPOUT:
        h = h * drop
    if HAS_RES:
        h = h + res.to(tl.float32)
    if HAS_RES or DROPOUT:
        h = h.to(H_DTYPE).to(tl.float32)
    return h


@triton.jit
def norm_forward_kernel(X, RES, W, B, Y, H, MEAN, RSTD, SEED,
                        rows, N, stride_x, stride_res, stride_y, stride_h, eps, p16, scale,
                        ROWS: tl.constexpr, BLOCK_N: tl.constexpr, WHOLE_ROW: tl.constexpr,
                        HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                        DROPOUT: tl.constexpr, RMS: tl.constexpr, STORE_H: tl.constexpr,
                        H_DTYPE: tl.constexpr):
    """y = (h - mean) * rstd * w + b on the tile of row tile program_id(0), column block program_id(1).

    X, RES: (rows, N) inputs; Y, H: (rows, N) outputs (H only with STORE_H); MEAN, RSTD: (rows,)
    float32, written here with WHOLE_ROW, else read (norm_stats_kernel's). RMS: mean = 0 (not stored).
    H_DTYPE: h's dtype (the residual's, else x's), which h is rounded to whether stored or not."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = r < rows
    mask = rmask[:, None] & (c < N)[None, :]
    r64 = r.to(tl.int64)
    drop = 1.0
    if DROPOUT:
        drop = dropout_multiplier(SEED, r64, tl.program_id(1) * BLOCK_N, N, p16, scale, ROWS, BLOCK_N)
    h = residual_stream(X, RES, r64, c, mask, stride_x, stride_res, drop, HAS_RES, DROPOUT, H_DTYPE)
    if STORE_H:
        tl.store(H + r64[:, None] * stride_h + c[None, :], h.to(H_DTYPE), mask=mask)
    if WHOLE_ROW:
        if RMS:
            centered = h
        else:
            mean = tl.sum(h, axis=1) / N
            centered = tl.where(mask, h - mean[:, None], 0.0)
            tl.store(MEAN + r, mean, mask=rmask)
        rstd = tl.math.rsqrt(tl.sum(centered * centered, axis=1) / N + eps)
        tl.store(RSTD + r, rstd, mask=rmask)
    else:
        rstd = tl.load(RSTD + r, mask=rmask, other=0.0)
        if RMS:
            centered = h
        else:
            centered = h - tl.load(MEAN + r, mask=rmask, other=0.0)[:, None]
    y = centered * rstd[:, None]
    cmask = c < N
    if HAS_W:
        y = y * tl.load(W + c, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if HAS_B:
        y = y + tl.load(B + c, mask=cmask, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + r64[:, None] * stride_y + c[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def norm_stats_kernel(X, RES, MEAN, RSTD, SEED, rows, N, stride_x, stride_res, eps, p16, scale,
                      ROWS: tl.constexpr, BLOCK_N: tl.constexpr, HAS_RES: tl.constexpr,
                      DROPOUT: tl.constexpr, RMS: tl.constexpr, H_DTYPE: tl.constexpr):
    """mean and rstd of rows wider than a tile: program_id(0)'s ROWS rows, BLOCK_N columns at a time.

    Each block's mean and sum of squared deviations merge into the running ones (Chan, Golub and
    LeVeque's pairwise update): no cancellation of a sum of squares against a large mean."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = r < rows
    r64 = r.to(tl.int64)
    mean = tl.zeros([ROWS], dtype=tl.float32)
    m2 = tl.zeros([ROWS], dtype=tl.float32)  # sum of squared deviations (RMS: of squares)
    for start in range(0, N, BLOCK_N):
        c = start + tl.arange(0, BLOCK_N)
        mask = rmask[:, None] & (c < N)[None, :]
        drop = 1.0
        if DROPOUT:
            drop = dropout_multiplier(SEED, r64, start, N, p16, scale, ROWS, BLOCK_N)
        h = residual_stream(X, RES, r64, c, mask, stride_x, stride_res, drop, HAS_RES, DROPOUT, H_DTYPE)
        if RMS:
            m2 += tl.sum(h * h, axis=1)
        else:
            seen = start * 1.0  # elements merged so far, in float32
            count = tl.minimum(N - start, BLOCK_N) * 1.0
            block_mean = tl.sum(h, axis=1) / count
            d = tl.where(mask, h - block_mean[:, None], 0.0)
            delta = block_mean - mean
            total = seen + count
            mean += delta * (count / total)
            m2 += tl.sum(d * d, axis=1) + delta * delta * (seen * count / total)
    tl.store(RSTD + r, tl.math.rsqrt(m2 / N + eps), mask=rmask)
    if not RMS:
        tl.store(MEAN + r, mean, mask=rmask)


@triton.jit
def dropout_mask_kernel(SEED, OUT, rows, N, p16, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """OUT (rows, N) int8: the dropout mask the kernels above draw for this seed (1: kept)."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (r < rows)[:, None] & (c < N)[None, :]
    r64 = r.to(tl.int64)
    keep = dropout_bits(SEED, r64, tl.program_id(1) * BLOCK_N, N, ROWS, BLOCK_N) >= p16
    tl.store(OUT + r64[:, None] * N + c[None, :], keep.to(tl.int8), mask=mask)
