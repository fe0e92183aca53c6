"""The norm's backward pass, as Triton kernels: dx, dresidual, and dweight / dbias through per-program
partial sums.

With xhat = (h - mean) * rstd and g = dy * w (dy without a weight), the gradient of h is

    dh = rstd * (g - xhat * mean(g xhat) - mean(g))        (RMSNorm: without the mean(g) term)

plus the gradient that reaches h directly (``prenorm``'s second output). dresidual = dh; dx = dh where
dropout kept the element, times 1 / (1 - p), else 0 (the mask recomputed from the seed). dweight and
dbias are sums over rows of dy * xhat and dy: each program adds up its rows in float32 registers and
writes one partial row; ``norm_partials_kernel`` sums the programs' partials and casts them (launch.py).

h is read back where the forward stored it (``prenorm``), else recomputed from x, the residual and
the mask: as many bytes as storing and reloading it, and no activation kept for the backward.

* rows that fit in one tile (WHOLE_ROW): ``norm_backward_kernel`` alone, over a grid of row groups,
  each running row tiles g, g + groups, ... ;
* wider rows: ``norm_row_sums_kernel`` (mean(g xhat), mean(g) per row, columns a block at a time),
  then ``norm_backward_kernel`` over (row groups, column blocks).
"""
import triton
import triton.language as tl

from tilecore.ops.norm.forward import combine_stream, dropout_multiplier, load_tile


@triton.jit
def _add_pairs(a0, b0, a1, b1):
    return a0 + a1, b0 + b1


@triton.jit
def tile_rows(tile, rows, c, cmask, ROWS: tl.constexpr):
    """Row indices of row tile ``tile`` (rows past the end mapped to row 0, whose statistics they read;
    nothing of theirs is stored), as int32 and int64, and the tile's mask."""
    r = tile * ROWS + tl.arange(0, ROWS)
    rmask = r < rows
    r = tl.where(rmask, r, 0)
    return r, r.to(tl.int64), rmask[:, None] & cmask[None, :]


@triton.jit
def load_operands(DY, X, RES, H, MEAN, RSTD, r, r64, c, mask, stride_dy, stride_x, stride_res, stride_h,
                  LOAD_H: tl.constexpr, HAS_RES: tl.constexpr, RMS: tl.constexpr):
    """A tile's inputs in their own dtypes, loaded and not yet used: dy, then h (LOAD_H) or x and the
    residual, and the rows' rstd and mean (0 where not read)."""
    dy = tl.load(DY + r64[:, None] * stride_dy + c[None, :], mask=mask, other=0.0)
    if LOAD_H:
        a = tl.load(H + r64[:, None] * stride_h + c[None, :], mask=mask, other=0.0)
    else:
        a = tl.load(X + r64[:, None] * stride_x + c[None, :], mask=mask, other=0.0)
    b = a
    if HAS_RES and not LOAD_H:
        b = tl.load(RES + r64[:, None] * stride_res + c[None, :], mask=mask, other=0.0)
    rstd = tl.load(RSTD + r)
    mean = rstd * 0.0
    if not RMS:
        mean = tl.load(MEAN + r)
    return dy, a, b, rstd, mean


@triton.jit
def grad_terms(dy, a, b, rstd, mean, W, c, mask, N, drop, LOAD_H: tl.constexpr, HAS_RES: tl.constexpr,
               HAS_W: tl.constexpr, DROPOUT: tl.constexpr, RMS: tl.constexpr, H_DTYPE: tl.constexpr):
    """(dy, xhat, g) in float32 from load_operands' tile: h = a (LOAD_H) or recomputed as x * drop +
    residual, rounded as the forward stored it; dy, xhat, g are 0 outside ``mask``."""
    dy = dy.to(tl.float32)
    if LOAD_H:
        h = a.to(tl.float32)
    else:
        h = combine_stream(a, b, drop, HAS_RES, DROPOUT, H_DTYPE)
    if not RMS:
        h = h - mean[:, None]
    xhat = tl.where(mask, h * rstd[:, None], 0.0)
    g = dy
    if HAS_W:
        g = dy * tl.load(W + c, mask=c < N, other=0.0).to(tl.float32)[None, :]
    return dy, xhat, g


@triton.jit
def norm_backward_kernel(DY, X, RES, H, W, MEAN, RSTD, SUMS, SEED, DH_OUT, DX, DRES, DW_PART, DB_PART,
                         rows, N, stride_dy, stride_x, stride_res, stride_h, stride_dh_out, stride_dx,
                         stride_dres, p16, scale,
                         ROWS: tl.constexpr, BLOCK_N: tl.constexpr, WHOLE_ROW: tl.constexpr,
                         LOAD_H: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr,
                         DROPOUT: tl.constexpr, RMS: tl.constexpr, HAS_DH_OUT: tl.constexpr,
                         STORE_DRES: tl.constexpr, DW: tl.constexpr, DB: tl.constexpr,
                         H_DTYPE: tl.constexpr):
    """dx (and dres) for row tiles g, g + groups, ... (g = program_id(0), groups = num_programs(0)) over
    column block program_id(1); this program's dweight / dbias partials in row g of DW_PART / DB_PART
    ((groups, N) float32). SUMS: (rows, 2) float32 mean(g xhat), mean(g) when not WHOLE_ROW."""
    group = tl.program_id(0)
    groups = tl.num_programs(0)
    c = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = c < N
    # the partials accumulate as whole tiles, summed over the rows once at the end: a sum across rows
    # every tile went through shared memory and barriers (22 bar.sync a tile at 4 x 1024 before)
    dw = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    db = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    # the loop is latency-bound (a few programs an SM): the next tile's loads are issued before this
    # tile's reductions, so that they are in flight while it computes (past the last tile: all masked)
    r, r64, mask = tile_rows(group, rows, c, cmask, ROWS)
    ahead = load_operands(DY, X, RES, H, MEAN, RSTD, r, r64, c, mask, stride_dy, stride_x, stride_res, stride_h,
                          LOAD_H, HAS_RES, RMS)
    for tile in range(group, tl.cdiv(rows, ROWS), groups):
        dy, a, b, rstd, mean = ahead
        r, r64, mask = tile_rows(tile, rows, c, cmask, ROWS)
        r_next, r64_next, mask_next = tile_rows(tile + groups, rows, c, cmask, ROWS)
        ahead = load_operands(DY, X, RES, H, MEAN, RSTD, r_next, r64_next, c, mask_next, stride_dy, stride_x,
                              stride_res, stride_h, LOAD_H, HAS_RES, RMS)
        drop = 1.0
        if DROPOUT:  # drawn once: for the recomputed h and for dx
            drop = dropout_multiplier(SEED, r64, tl.program_id(1) * BLOCK_N, N, p16, scale, ROWS, BLOCK_N)
        dy, xhat, g = grad_terms(dy, a, b, rstd, mean, W, c, mask, N, drop, LOAD_H, HAS_RES, HAS_W, DROPOUT, RMS,
                                 H_DTYPE)
        if WHOLE_ROW:
            if RMS:
                mean_gx = tl.sum(g * xhat, axis=1) / N
            else:  # both row sums in one reduction (one round through shared memory)
                sum_gx, sum_g = tl.reduce((g * xhat, g), 1, _add_pairs)
                mean_gx, mean_g = sum_gx / N, sum_g / N
        else:
            mean_gx = tl.load(SUMS + 2 * r64)
            if not RMS:
                mean_g = tl.load(SUMS + 2 * r64 + 1)
        dh = g - xhat * mean_gx[:, None]
        if not RMS:
            dh = dh - mean_g[:, None]
        dh = dh * rstd[:, None]
        if HAS_DH_OUT:
            dh += load_tile(DH_OUT, r64, c, stride_dh_out, mask)
        if STORE_DRES:
            tl.store(DRES + r64[:, None] * stride_dres + c[None, :], dh.to(DRES.dtype.element_ty), mask=mask)
        if DROPOUT:
            dh = dh * drop
        tl.store(DX + r64[:, None] * stride_dx + c[None, :], dh.to(DX.dtype.element_ty), mask=mask)
        if DW:
            dw += dy * xhat
        if DB:
            db += dy  # (0 outside the mask)
    part = group.to(tl.int64) * N + c
    if DW:
        tl.store(DW_PART + part, tl.sum(dw, axis=0), mask=cmask)
    if DB:
        tl.store(DB_PART + part, tl.sum(db, axis=0), mask=cmask)


@triton.jit
def norm_row_sums_kernel(DY, X, RES, H, W, MEAN, RSTD, SEED, SUMS, rows, N,
                         stride_dy, stride_x, stride_res, stride_h, p16, scale,
                         ROWS: tl.constexpr, BLOCK_N: tl.constexpr, LOAD_H: tl.constexpr,
                         HAS_RES: tl.constexpr, HAS_W: tl.constexpr, DROPOUT: tl.constexpr,
                         RMS: tl.constexpr, H_DTYPE: tl.constexpr):
    """SUMS[r] = (mean(g xhat), mean(g)) for program_id(0)'s ROWS rows, BLOCK_N columns at a time."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = r < rows
    r = tl.where(rmask, r, 0)
    r64 = r.to(tl.int64)
    sum_gx = tl.zeros([ROWS], dtype=tl.float32)
    sum_g = tl.zeros([ROWS], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        c = start + tl.arange(0, BLOCK_N)
        mask = rmask[:, None] & (c < N)[None, :]
        drop = 1.0
        if DROPOUT and not LOAD_H:
            drop = dropout_multiplier(SEED, r64, start, N, p16, scale, ROWS, BLOCK_N)
        dy, a, b, rstd, mean = load_operands(DY, X, RES, H, MEAN, RSTD, r, r64, c, mask, stride_dy, stride_x,
                                             stride_res, stride_h, LOAD_H, HAS_RES, RMS)
        dy, xhat, g = grad_terms(dy, a, b, rstd, mean, W, c, mask, N, drop, LOAD_H, HAS_RES, HAS_W, DROPOUT, RMS,
                                 H_DTYPE)
        if RMS:
            sum_gx += tl.sum(g * xhat, axis=1)
        else:
            block_gx, block_g = tl.reduce((g * xhat, g), 1, _add_pairs)
            sum_gx += block_gx
            sum_g += block_g
    tl.store(SUMS + 2 * r64, sum_gx / N, mask=rmask)
    tl.store(SUMS + 2 * r64 + 1, sum_g / N, mask=rmask)


@triton.jit
def norm_partials_kernel(DW_PART, DB_PART, DW_OUT, DB_OUT, groups, N, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr,
                         DW: tl.constexpr, DB: tl.constexpr):
    """dweight / dbias = the column sums of the backward's (groups, N) float32 partials, written in the outputs'
    dtypes: BLOCK_C columns a program, BLOCK_G partial rows a step (one launch for both, in place of a torch sum
    and a cast each)."""
    c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < N
    acc_w = tl.zeros([BLOCK_G, BLOCK_C], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_G, BLOCK_C], dtype=tl.float32)
    for start in range(0, groups, BLOCK_G):
        g = start + tl.arange(0, BLOCK_G)
        offs = g.to(tl.int64)[:, None] * N + c[None, :]
        mask = (g < groups)[:, None] & cmask[None, :]
        if DW:
            acc_w += tl.load(DW_PART + offs, mask=mask, other=0.0)
        if DB:
            acc_b += tl.load(DB_PART + offs, mask=mask, other=0.0)
    if DW:
        tl.store(DW_OUT + c, tl.sum(acc_w, axis=0).to(DW_OUT.dtype.element_ty), mask=cmask)
    if DB:
        tl.store(DB_OUT + c, tl.sum(acc_b, axis=0).to(DB_OUT.dtype.element_ty), mask=cmask)
