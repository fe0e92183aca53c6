"""Tile building blocks for Hadamard transforms on tensor cores (tl, and their Gluon twins)."""
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@triton.jit
def sylvester_tile(ROWS: tl.constexpr, COLS: tl.constexpr, SIZE: tl.constexpr, dtype: tl.constexpr):
    """A ROWS x COLS tile of the Sylvester Hadamard matrix H_SIZE, entry (i, j) = (-1)^popcount(i & j).

    Entries outside SIZE x SIZE are zero, so a transform smaller than a tensor-core tile (SIZE < 16)
    runs as a 16 x 16 product with zero padding. Made from the indices, so it costs no memory traffic.
    """
    i = tl.arange(0, ROWS)[:, None]
    j = tl.arange(0, COLS)[None, :]
    v = i & j
    v = v ^ (v >> 8)  # fold the bits of i & j down to their parity (indices are < 2^16)
    v = v ^ (v >> 4)
    v = v ^ (v >> 2)
    v = v ^ (v >> 1)
    h = tl.where((v & 1) == 0, 1.0, -1.0)
    h = tl.where((i < SIZE) & (j < SIZE), h, 0.0)
    return h.to(dtype)


@triton.jit
def _remainder(rest, piece):
    """What ``piece`` leaves of ``rest``; zero where the piece holds it all (so +-inf leaves 0, not NaN)."""
    p = piece.to(tl.float32)
    return tl.where(p == rest, 0.0, rest - p)


@triton.jit
def dot_split(a, b, SPLIT_A: tl.constexpr, PIECES: tl.constexpr, PIECE_DTYPE: tl.constexpr):
    """a @ b on 16-bit tensor cores where one operand is float32 whose values do not fit 16 bits.

    That operand (``a`` if SPLIT_A, else ``b``) is cut into PIECES 16-bit parts (x = p0 + p1 + ...,
    each the rounding of what is left), the other must be exact in 16 bits (e.g. +-1), and the
    partial products accumulate in float32. Two bf16 pieces carry 16 significant bits, three carry
    24 (float32's own precision).
    """
    if SPLIT_A:
        rest = a
    else:
        rest = b
    piece = rest.to(PIECE_DTYPE)
    if SPLIT_A:
        acc = tl.dot(piece, b, out_dtype=tl.float32)
    else:
        acc = tl.dot(a, piece, out_dtype=tl.float32)
    for _ in tl.static_range(PIECES - 1):
        rest = _remainder(rest, piece)
        piece = rest.to(PIECE_DTYPE)
        if SPLIT_A:
            acc = tl.dot(piece, b, acc)
        else:
            acc = tl.dot(a, piece, acc)
    return acc


# Gluon twins of the above, for Hopper kernels on the pipeline template (tiles.gluon).


@gluon.jit
def bf16_pieces(x):
    """float32 ``x`` as hi + lo, two bf16 tiles carrying 16 significant bits (``dot_split``'s two
    pieces); lo is 0 where hi holds x whole, so +-inf leaves 0, not NaN."""
    hi = x.to(gl.bfloat16)
    h = hi.to(gl.float32)
    return hi, gl.where(h == x, 0.0, x - h).to(gl.bfloat16)
