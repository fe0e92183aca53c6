"""Tile building blocks for Hadamard transforms on tensor cores."""
import triton
import triton.language as tl


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
def dot_split_lhs(a, b, PIECES: tl.constexpr, PIECE_DTYPE: tl.constexpr):
    """a @ b for a float32 ``a`` whose values do not fit one 16-bit operand, on 16-bit tensor cores.

    ``a`` is cut into PIECES 16-bit parts (a = p0 + p1 + ..., each the rounding of what is left), and
    their products with ``b`` (exact in 16 bits, e.g. +-1) accumulate in float32. Two bf16 pieces
    carry 16 significant bits, three carry 24 (float32's own precision).
    """
    rest = a
    piece = rest.to(PIECE_DTYPE)
    acc = tl.dot(piece, b, out_dtype=tl.float32)
    for _ in tl.static_range(PIECES - 1):
        rest = _remainder(rest, piece)
        piece = rest.to(PIECE_DTYPE)
        acc = tl.dot(piece, b, acc)
    return acc


@triton.jit
def dot_split_rhs(a, b, PIECES: tl.constexpr, PIECE_DTYPE: tl.constexpr):
    """a @ b with the float32 operand on the right; see dot_split_lhs."""
    rest = b
    piece = rest.to(PIECE_DTYPE)
    acc = tl.dot(a, piece, out_dtype=tl.float32)
    for _ in tl.static_range(PIECES - 1):
        rest = _remainder(rest, piece)
        piece = rest.to(PIECE_DTYPE)
        acc = tl.dot(a, piece, acc)
    return acc
