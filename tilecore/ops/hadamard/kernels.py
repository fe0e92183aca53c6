"""The Hadamard transform on tensor cores, in Triton.

A row of n = S * N1 * N2 elements is read as S slices, each an N1 x N2 matrix X (N2 contiguous).
Since H_n = H_S (x) H_N1 (x) H_N2 (Kronecker products of Sylvester matrices),

    slice transform  T(X) = H_N1 @ X @ H_N2       (two tensor-core products)
    row transform    out_s = sum_t H_S[s, t] T(X_t)   (a float32 butterfly in registers)

Where the error comes from, and how it stays at the rounding floor:
* H_N1 @ X multiplies exact 16-bit inputs by +-1 and accumulates in float32: no rounding but the
  accumulator's own.
* Its float32 result does not fit one 16-bit operand. Rounding it to 16 bits between stages is what
  costs other kernels 1.4-2x the rounding floor; here it is cut into bf16 pieces
  (tiles.hadamard.dot_split) whose sum carries 16 significant bits (24 for float32 inputs), so the
  final rounding to the output dtype is the only one that matters.
* The slice butterfly adds float32 values: no 16-bit rounding there either.

Data never changes layout between stages: the first product's accumulator becomes the second's
left operand in registers. Rows never share a product (X @ H_N2 keeps rows apart, H_N1 @ X is a
batched product per row), so a NaN or Inf stays in its row.

Loads and stores go through pointers (tl.load/tl.store, pipelined by Triton with cp.async) or, per n
where that measured faster (configs.TMA_TUNING), through TMA descriptors: the copy engine moves each [B, N1, N2]
slice between global and shared memory (cp.async.bulk.tensor), zero-filling reads and clipping writes
past the last row. Only the data movement differs; the transform above is the same code.

Two other kernels serve the ends of the range (plan.py picks): n < 16 runs as a float32 register
butterfly (butterfly.py), and n in configs.GLUON_TUNING on Hopper runs this split on the tiles' Gluon
pipeline template (gluon_kernels.py: a producer warp, a TMA ring and two consumer warpgroups).
"""
import triton
import triton.language as tl

from tilecore import dispatch
from tilecore.tiles.hadamard import dot_split, sylvester_tile

# Triton 3.6's interpreter multiplies bf16 operands as their integer bits (numpy has no bf16). There
# _split_dot runs the GPU's math another way: the same bf16 pieces (rounded by the interpreter's own
# conversion, which truncates where the GPU rounds to nearest), multiplied in float32, which is exact
# for products with +-1. (triton.jit makes interpreted kernels, or not, as this module is imported.)
_INTERPRETED = tl.constexpr(dispatch.interpreter_enabled())


@triton.jit
def _load_slice(x, rows, stride_x, tile, s, N: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr,
                B: tl.constexpr, TMA: tl.constexpr):
    """Slice s of the B rows of ``tile`` as a [B, N1, N2] tile (zeros past the last row and past n < 16).

    TMA: ``x`` is a descriptor over the rows seen as (rows, n / N2, N2) with box [B, N1, N2], so a
    slice is one bulk tensor copy into shared memory; the copy engine zero-fills rows past the end.
    """
    if TMA:
        return x.load([tile * B, s * N1, 0])
    else:
        r = tl.arange(0, B).to(tl.int64) + tile * B  # 64-bit: rows * stride may pass 2^31
        i = tl.arange(0, N1)
        j = tl.arange(0, N2)
        offs = r[:, None, None] * stride_x + (s * N1 * N2 + i[None, :, None] * N2 + j[None, None, :])
        mask = (r[:, None, None] < rows) & (j[None, None, :] < N)
        return tl.load(x + offs, mask=mask, other=0.0)


LO_FLOOR: tl.constexpr = tl.constexpr(-2.0**120)  # _pairs_dot's CLAMP: below any finite lo (|x - h| < 2^119)


@triton.jit
def _pairs_dot(a, b, CLAMP: tl.constexpr = False, TRUNC: tl.constexpr = False):
    """PIECES == -2 (PAIRS): a @ b with float32 ``a`` as two bf16 pieces, dot_split's, hi made a column
    pair at a time by one cvt.rn.bf16x2 and its float32 values by a shift and a mask of that word, in one asm block
    (Triton's a.to(bf16) then hi.to(float32) made ptxas split each pair's conversion into two F2F and a PRMT, then
    unpack it by two IMAD.U32); lo as dot_split's remainder. The same pieces: bit-identical products.
    CLAMP (PIECES == -3): lo = max(a - h, -2^120), one max a value instead of a compare and a select: the same lo for
    every finite a (a - h is exact, above -2^119, and +0 where h holds a whole); for a = +-inf, a - h is NaN and the
    max returns -2^120, so the product stays the infinity hi makes it (as the select's lo 0 leaves it); NaN stays
    NaN through hi (gluon_epilogue.pieces' CLAMP_LO, the same argument).
    TRUNC (PIECES == -4, with CLAMP): hi is a truncated, not rounded: the pair's upper halves by one prmt and h by a
    mask, no conversion (lo's cvt.rn.bf16x2 is the pair's only one, against two: the conversion pipe runs at an
    eighth of the FMA pipe's rate). |a - h| < 2^-7 |a| and lo rounds that to 8 bits: hi + lo within 2^-15 |a| (the
    rounded hi's 2^-17); inf truncates to inf (lo -2^120 by CLAMP), the GPU's NaNs (canonical, high mantissa bits
    set) to NaN."""
    if TRUNC:
        hi, h = tl.inline_asm_elementwise(
            "prmt.b32 $0, $3, $4, 0x7632; and.b32 $1, $3, -65536; and.b32 $2, $4, -65536;", "=r,=r,=r,r,r", [a],
            dtype=(tl.bfloat16, tl.float32), is_pure=True, pack=2)
    else:
        hi, h = tl.inline_asm_elementwise(
            "cvt.rn.bf16x2.f32 $0, $4, $3; shl.b32 $1, $0, 16; and.b32 $2, $0, -65536;", "=r,=r,=r,r,r", [a],
            dtype=(tl.bfloat16, tl.float32), is_pure=True, pack=2)
    if CLAMP or TRUNC:
        lo = tl.maximum(a - h, LO_FLOOR).to(tl.bfloat16)  # max.f32: the non-NaN operand where one is NaN
    else:
        lo = tl.where(h == a, 0.0, a - h).to(tl.bfloat16)
    acc = tl.dot(hi, b, out_dtype=tl.float32)
    return tl.dot(lo, b, acc)


@triton.jit
def _trunc_pieces(a):
    """_pairs_dot's TRUNC pieces as float32 values, by their bits (the interpreter's bf16 conversion truncates): hi =
    a with its low 16 bits cleared, lo = a - hi rounded to bf16, half to even (its bits + 0x7FFF + the kept lowest bit,
    cleared below: a - hi is a finite float32 below 2^120 in magnitude, so no carry reaches the exponent's top); lo
    0 where a is not finite (hi holds the infinity or NaN: CLAMP's -2^120 times +-1 sums below any infinity)."""
    bits = a.to(tl.int32, bitcast=True)
    hi = (bits & -65536).to(tl.float32, bitcast=True)
    r = tl.where(hi == a, 0.0, a - hi)
    r = tl.where(r == r, r, 0.0)
    rb = r.to(tl.int32, bitcast=True)
    lo = ((rb + 0x7FFF + ((rb >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
    return hi, lo


@triton.jit
def _split_dot(a, b, SPLIT_A: tl.constexpr, PIECES: tl.constexpr, PIECE_DTYPE: tl.constexpr):
    """tiles.hadamard.dot_split(a, b, ...): a @ b with the float32 operand cut into PIECES pieces of
    PIECE_DTYPE; in the interpreter the same pieces, each multiplied in float32 (see _INTERPRETED). PIECES == -2:
    two bf16 pieces of ``a`` (SPLIT_A) by _pairs_dot on the GPU, as 2 in the interpreter; -3: the same with its
    CLAMP (the same pieces: as 2 in the interpreter, whose max would not drop a NaN as the GPU's does); -4: its TRUNC
    (hi truncated, lo rounded to nearest even: in the interpreter both by their bits, _trunc_pieces)."""
    if PIECES < 0:
        tl.static_assert(SPLIT_A, "PAIRS: the split operand is a")
    if _INTERPRETED and PIECES == -4:
        hi, lo = _trunc_pieces(a)
        other = b.to(tl.float32)
        acc = tl.dot(lo, other, tl.dot(hi, other, out_dtype=tl.float32))
    elif _INTERPRETED:
        if SPLIT_A:
            rest = a
            other = b.to(tl.float32)
        else:
            rest = b
            other = a.to(tl.float32)
        piece = rest.to(PIECE_DTYPE).to(tl.float32)
        if SPLIT_A:
            acc = tl.dot(piece, other, out_dtype=tl.float32)
        else:
            acc = tl.dot(other, piece, out_dtype=tl.float32)
        for _ in tl.static_range((2 if PIECES < 0 else PIECES) - 1):
            rest = tl.where(piece == rest, 0.0, rest - piece)  # 0 where the piece holds it all (+-inf)
            piece = rest.to(PIECE_DTYPE).to(tl.float32)
            if SPLIT_A:
                acc = tl.dot(piece, other, acc)
            else:
                acc = tl.dot(other, piece, acc)
    elif PIECES < 0:
        acc = _pairs_dot(a, b, PIECES <= -3, PIECES == -4)
    else:
        acc = dot_split(a, b, SPLIT_A, PIECES, PIECE_DTYPE)
    return acc


@triton.jit
def _slice_transform(x, N: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr, B: tl.constexpr,
                     IN_PIECES: tl.constexpr, MID_PIECES: tl.constexpr,
                     MMA_DTYPE: tl.constexpr, PIECE_DTYPE: tl.constexpr):
    """H_N1 @ X @ H_N2 for each of the B [N1, N2] matrices of ``x``, as a [B * N1, N2] float32 tile."""
    if N1 == 1:
        # One stage: the input itself is the left operand (exact for 16-bit inputs: IN_PIECES == 1).
        x2 = tl.reshape(x, (B, N2))
        if IN_PIECES == 1:
            z = tl.dot(x2.to(MMA_DTYPE), sylvester_tile(N2, N2, N, MMA_DTYPE), out_dtype=tl.float32)
        else:
            z = _split_dot(x2.to(tl.float32), sylvester_tile(N2, N2, N, PIECE_DTYPE), True, IN_PIECES, PIECE_DTYPE)
    else:
        if IN_PIECES == 1:
            h1 = sylvester_tile(N1, N1, N1, MMA_DTYPE)
        else:
            h1 = sylvester_tile(N1, N1, N1, PIECE_DTYPE)
        if B == 1:
            x1 = tl.reshape(x, (N1, N2))
            if IN_PIECES == 1:
                y = tl.dot(h1, x1.to(MMA_DTYPE), out_dtype=tl.float32)
            else:
                y = _split_dot(h1, x1.to(tl.float32), False, IN_PIECES, PIECE_DTYPE)
        else:
            # One product per row (batched), so that rows never mix.
            h1b = tl.broadcast_to(h1[None, :, :], (B, N1, N1))
            if IN_PIECES == 1:
                y = tl.dot(h1b, x.to(MMA_DTYPE), out_dtype=tl.float32)
            else:
                y = _split_dot(h1b, x.to(tl.float32), False, IN_PIECES, PIECE_DTYPE)
            y = tl.reshape(y, (B * N1, N2))
        z = _split_dot(y, sylvester_tile(N2, N2, N, PIECE_DTYPE), True, MID_PIECES, PIECE_DTYPE)
    return z


@triton.jit
def _store_slice(out, rows, stride_out, tile, s, z, scale,
                 N: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr, B: tl.constexpr, TMA: tl.constexpr):
    z = tl.reshape(z * scale, (B, N1, N2))
    if TMA:
        # Registers -> shared memory -> one bulk tensor store; the copy engine clips rows past the end.
        out.store([tile * B, s * N1, 0], z.to(out.dtype))
    else:
        r = tl.arange(0, B).to(tl.int64) + tile * B
        i = tl.arange(0, N1)
        j = tl.arange(0, N2)
        offs = r[:, None, None] * stride_out + (s * N1 * N2 + i[None, :, None] * N2 + j[None, None, :])
        mask = (r[:, None, None] < rows) & (j[None, None, :] < N)
        tl.store(out + offs, z.to(out.dtype.element_ty), mask=mask)


@triton.jit
def hadamard_kernel(x, out, rows, stride_x, stride_out, scale,
                    N: tl.constexpr, S: tl.constexpr,
                    N1: tl.constexpr, N2: tl.constexpr, B: tl.constexpr,
                    IN_PIECES: tl.constexpr, MID_PIECES: tl.constexpr,
                    MMA_DTYPE: tl.constexpr, PIECE_DTYPE: tl.constexpr, GRID: tl.constexpr,
                    TMA_LOAD: tl.constexpr, TMA_STORE: tl.constexpr):
    """scale * H_N applied to each of ``rows`` rows; a persistent grid of GRID programs, B rows a tile.

    A row is S slices of N1 x N2: their transforms T_t stay in registers, and out = H_S [T_0 .. T_{S-1}].
    ``x`` (``out``) is a pointer, or with TMA_LOAD (TMA_STORE) a tensor descriptor (see _load_slice);
    the math is the same either way.
    """
    tiles = tl.cdiv(rows, B)
    for tile in range(tl.program_id(0), tiles, GRID):
        t0 = _slice_transform(_load_slice(x, rows, stride_x, tile, 0, N, N1, N2, B, TMA_LOAD),
                              N, N1, N2, B, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE)
        if S == 1:
            _store_slice(out, rows, stride_out, tile, 0, t0, scale, N, N1, N2, B, TMA_STORE)
        else:
            t1 = _slice_transform(_load_slice(x, rows, stride_x, tile, 1, N, N1, N2, B, TMA_LOAD),
                                  N, N1, N2, B, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE)
            if S == 2:
                _store_slice(out, rows, stride_out, tile, 0, t0 + t1, scale, N, N1, N2, B, TMA_STORE)
                _store_slice(out, rows, stride_out, tile, 1, t0 - t1, scale, N, N1, N2, B, TMA_STORE)
            else:  # S == 4: H_4 = H_2 (x) H_2 over the slice index
                t2 = _slice_transform(_load_slice(x, rows, stride_x, tile, 2, N, N1, N2, B, TMA_LOAD),
                                      N, N1, N2, B, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE)
                t3 = _slice_transform(_load_slice(x, rows, stride_x, tile, 3, N, N1, N2, B, TMA_LOAD),
                                      N, N1, N2, B, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE)
                a = t0 + t1
                b = t0 - t1
                c = t2 + t3
                d = t2 - t3
                _store_slice(out, rows, stride_out, tile, 0, a + c, scale, N, N1, N2, B, TMA_STORE)
                _store_slice(out, rows, stride_out, tile, 1, b + d, scale, N, N1, N2, B, TMA_STORE)
                _store_slice(out, rows, stride_out, tile, 2, a - c, scale, N, N1, N2, B, TMA_STORE)
                _store_slice(out, rows, stride_out, tile, 3, b - d, scale, N, N1, N2, B, TMA_STORE)

