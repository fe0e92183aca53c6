"""The norm's forward pass, as Triton kernels: h = dropout(x) + residual, y = norm(h) * w + b.

A program works on a tile of ROWS rows by BLOCK_N columns, in float32 registers:

* rows that fit in one tile (``WHOLE_ROW``: N <= BLOCK_N): ``norm_forward_kernel`` alone, one read of
  x (and the residual) and one write of y (and h): the statistics come from the registers;
* wider rows: ``norm_stats_kernel`` first (one program per ROWS rows walks the columns and merges
  each block's mean and squared deviations, Chan et al.'s pairwise update), then
  ``norm_forward_kernel`` over (row tiles, column blocks) reads x again and normalizes with them.

Dropout keeps an element with probability 1 - p from one Philox draw keyed by the seed (a one-element
int64 tensor) and the element's place in the (rows, N) matrix, row * N + column: the same mask for any
tiling, forward or backward, so it is recomputed, never stored.

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
def dropout_keep(seed_ptr, r64, c, N, p):
    """Keep (True) with probability 1 - p: one Philox draw for element (r, c), keyed by row * N + c."""
    return tl.rand(tl.load(seed_ptr), r64[:, None] * N + c[None, :]) >= p


@triton.jit
def residual_stream(X, RES, SEED, r64, c, mask, N, stride_x, stride_res, p, scale,
                    HAS_RES: tl.constexpr, DROPOUT: tl.constexpr, H_DTYPE: tl.constexpr):
    """h = dropout(x) + residual on a tile, in float32, rounded as it is stored (H_DTYPE)."""
    h = load_tile(X, r64, c, stride_x, mask)
    if DROPOUT:  # x * 0 where dropped, as torch's dropout: a NaN or inf there still gives NaN
        h = h * tl.where(dropout_keep(SEED, r64, c, N, p), scale, 0.0)
    if HAS_RES:
        h = h + load_tile(RES, r64, c, stride_res, mask)
    if HAS_RES or DROPOUT:
        h = h.to(H_DTYPE).to(tl.float32)
    return h


@triton.jit
def norm_forward_kernel(X, RES, W, B, Y, H, MEAN, RSTD, SEED,
                        rows, N, stride_x, stride_res, stride_y, stride_h, eps, p, scale,
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
    h = residual_stream(X, RES, SEED, r64, c, mask, N, stride_x, stride_res, p, scale,
                        HAS_RES, DROPOUT, H_DTYPE)
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
def norm_stats_kernel(X, RES, MEAN, RSTD, SEED, rows, N, stride_x, stride_res, eps, p, scale,
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
        h = residual_stream(X, RES, SEED, r64, c, mask, N, stride_x, stride_res, p, scale,
                            HAS_RES, DROPOUT, H_DTYPE)
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
def dropout_mask_kernel(SEED, OUT, rows, N, p, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """OUT (rows, N) int8: the dropout mask the kernels above draw for this seed (1: kept)."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (r < rows)[:, None] & (c < N)[None, :]
    r64 = r.to(tl.int64)
    keep = dropout_keep(SEED, r64, c, N, p)
    tl.store(OUT + r64[:, None] * N + c[None, :], keep.to(tl.int8), mask=mask)
