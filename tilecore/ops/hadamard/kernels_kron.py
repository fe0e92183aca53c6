"""The Hadamard transform of rows of n = m x p elements (p a power of two, m a Hadamard order that is
not: 12, 20, ... 172, orders.py), and the row pieces that hadamard_quantize's kernel shares.

Kronecker order, as Dao's fast-hadamard-transform's ``hadamard_transform_{12,20,28,40}N``: a row is read
as an m x p matrix X (row-major: element i p + j is X[i, j]) and

    y = (H_m (x) H_p) x,   i.e.   Y = H_m X H_p        (H_p Sylvester, H_m from orders.py)

so the power-of-two transform runs along contiguous elements and H_m mixes the m sub-rows.

A program takes one row at a time (persistent grid) as S slices of [M_PAD, Q] (columns t Q .. t Q + Q - 1
of every sub-row; M_PAD the power of two >= m, sub-rows past m loaded as zeros; Q >= 16 a tensor-core
tile, zero-padded where p < 16):

    T_t = H_m X_t H_Q        (two tensor-core products: H_m X_t exact for 16-bit inputs with float32
                              sums, then its float32 result as bf16 pieces times H_Q: kernels.py's
                              accuracy design, so the final rounding is the only one that matters)
    Y_s = sum_t H_S[s, t] T_t  (a float32 butterfly over S <= 8 slices, in registers)

H_m comes from memory (``h``: M_PAD x M_PAD, zero past m, in the product's dtype; H_m^T for the
transpose); H_Q is made from indices. The same kernel also runs "rows" tiles (M_PAD = 1): B whole rows
of n = S Q, no mixing, for hadamard_quantize's power-of-two and blocked rotations.

With ``CHUNKS`` > 1 it is the first pass of the two-pass path for rows too long for one program's
registers (plan_kron): the tile is a Q-wide column chunk of a row, only H_m X is computed (no H_Q,
S = 1), and stored in float32 for the power-of-two kernel to finish.
"""
import triton
import triton.language as tl

from tilecore.ops.hadamard.kernels import _split_dot
from tilecore.tiles.hadamard import sylvester_tile


@triton.jit
def slice_offsets(tile, t, rows, stride, M: tl.constexpr, M_PAD: tl.constexpr, P: tl.constexpr,
                  Q: tl.constexpr, B: tl.constexpr, CHUNKS: tl.constexpr, IL: tl.constexpr = 0):
    """(element offsets, in-bounds mask, column index within the row) of slice t of ``tile``, each
    [B M_PAD, Q]: tile row b M_PAD + i is sub-row i (< M, else padding) of row tile B + b (of row
    tile // CHUNKS, column chunk tile % CHUNKS, where CHUNKS > 1 and B == 1). 64-bit offsets.
    IL > 0 (interleaved slices, IL = S, Q S = P, CHUNKS == 1): slice t is the columns q IL + t of each
    sub-row instead of t Q + q (H_P = H_Q (x) H_S as well as H_S (x) H_Q: the same products, and then
    a group of consecutive outputs lies in few columns of every slice, so its amax needs no other warp)."""
    q = tl.arange(0, Q)
    r = tl.arange(0, B * M_PAD)
    i = r % M_PAD
    row = (r // M_PAD).to(tl.int64) + (tile // CHUNKS) * B
    if IL > 0:
        col = q * IL + t
    else:
        col = (tile % CHUNKS) * Q + t * Q + q
    col2 = i[:, None] * P + col[None, :]
    offs = row[:, None] * stride + col2
    mask = (row[:, None] < rows) & (i[:, None] < M) & (q[None, :] < P)
    return offs, mask, col2


@triton.jit
def slice_transform(x, h_ptr, M_PAD: tl.constexpr, Q: tl.constexpr, P: tl.constexpr, B: tl.constexpr,
                    MIX: tl.constexpr, TRANSFORM: tl.constexpr, IN_PIECES: tl.constexpr, MID_PIECES: tl.constexpr,
                    MMA_DTYPE: tl.constexpr, PIECE_DTYPE: tl.constexpr):
    """The [B M_PAD, Q] float32 transform of one loaded slice ``x``: MIX (0: none, 1: H from ``h_ptr``,
    M_PAD x M_PAD, 2: Sylvester H_M_PAD) over each row's M_PAD sub-rows (a batched product where B > 1:
    rows never mix), then (TRANSFORM) H_Q along Q (zero-padded where P < Q). The first product takes
    the input exactly (16-bit; IN_PIECES bf16 pieces for float32), the second the first's float32
    result as MID_PIECES pieces."""
    if MIX == 0:
        if TRANSFORM:
            if IN_PIECES == 1:
                z = tl.dot(x.to(MMA_DTYPE), sylvester_tile(Q, Q, P, MMA_DTYPE), out_dtype=tl.float32)
            else:
                z = _split_dot(x.to(tl.float32), sylvester_tile(Q, Q, P, PIECE_DTYPE), True, IN_PIECES, PIECE_DTYPE)
        else:
            z = x.to(tl.float32)
    else:
        if MIX == 1:
            i = tl.arange(0, M_PAD)
            h = tl.load(h_ptr + i[:, None] * M_PAD + i[None, :])
        else:
            h = sylvester_tile(M_PAD, M_PAD, M_PAD, tl.float32)
        if B > 1:
            h = tl.broadcast_to(h[None, :, :], (B, M_PAD, M_PAD))
            x = tl.reshape(x, (B, M_PAD, Q))
        if IN_PIECES == 1:
            y = tl.dot(h.to(MMA_DTYPE), x.to(MMA_DTYPE), out_dtype=tl.float32)
        else:
            y = _split_dot(h.to(PIECE_DTYPE), x.to(tl.float32), False, IN_PIECES, PIECE_DTYPE)
        if B > 1:
            y = tl.reshape(y, (B * M_PAD, Q))
        if TRANSFORM:
            z = _split_dot(y, sylvester_tile(Q, Q, P, PIECE_DTYPE), True, MID_PIECES, PIECE_DTYPE)
        else:
            z = y
    return z


# H_m wider than this many sub-rows is applied in chunks of its columns (the mixing product's K): as one
# operand, H_256 alone took 128 KiB of shared memory and the kernel 344-418 KiB (ptxas, sm_90a), past
# the H100's 227 (experiments/hadamard/compile_kernels.py)
K_CHUNK: tl.constexpr = tl.constexpr(64)


@triton.jit
def _load_sub_rows(x, signs, tile, t, rows, stride_x, K0, M: tl.constexpr, P: tl.constexpr, Q: tl.constexpr,
                   CHUNKS: tl.constexpr, KB: tl.constexpr, SIGNS: tl.constexpr, IL: tl.constexpr = 0):
    """Sub-rows K0 .. K0 + KB - 1 of slice t of one row (B == 1): [KB, Q], zeros out of bounds (IL:
    interleaved slices, slice_offsets)."""
    q = tl.arange(0, Q)
    i = K0 + tl.arange(0, KB)
    row = tl.zeros([KB], tl.int64) + tile // CHUNKS
    if IL > 0:
        col2 = i[:, None] * P + (q * IL + t)[None, :]
    else:
        col2 = i[:, None] * P + ((tile % CHUNKS) * Q + t * Q + q)[None, :]
    mask = (row[:, None] < rows) & (i[:, None] < M) & (q[None, :] < P)
    v = tl.load(x + row[:, None] * stride_x + col2, mask=mask, other=0.0)
    if SIGNS:
        v = (v.to(tl.float32) * tl.load(signs + col2, mask=mask, other=0.0).to(tl.float32)).to(v.dtype)
    return v


@triton.jit
def _chunked_mix(x, h_ptr, signs, tile, t, rows, stride_x, M: tl.constexpr, M_PAD: tl.constexpr,
                 P: tl.constexpr, Q: tl.constexpr, CHUNKS: tl.constexpr, SIGNS: tl.constexpr,
                 IN_PIECES: tl.constexpr, MMA_DTYPE: tl.constexpr, PIECE_DTYPE: tl.constexpr, IL: tl.constexpr = 0,
                 K_STOP: tl.constexpr = False):
    """H_m X_t for one row (B == 1) with M_PAD > K_CHUNK: sum over column blocks of H of H[:, k] X_t[k],
    each product exact as the whole one is; [M_PAD, Q] float32. K_STOP (hadamard_quantize's plan tuning
    "k_stop"): only the blocks holding columns < M (H is zero past M: 3 of 4 at 172 and 148)."""
    i = tl.arange(0, M_PAD)
    acc = tl.zeros([M_PAD, Q], tl.float32)
    KB: tl.constexpr = (M + K_CHUNK - 1) // K_CHUNK if K_STOP else M_PAD // K_CHUNK
    for kb in tl.static_range(KB):
        v = _load_sub_rows(x, signs, tile, t, rows, stride_x, kb * K_CHUNK, M, P, Q, CHUNKS, K_CHUNK, SIGNS, IL)
        k = kb * K_CHUNK + tl.arange(0, K_CHUNK)
        h = tl.load(h_ptr + i[:, None] * M_PAD + k[None, :])
        if IN_PIECES == 1:
            acc = tl.dot(h.to(MMA_DTYPE), v.to(MMA_DTYPE), acc, out_dtype=tl.float32)
        else:
            acc += _split_dot(h.to(PIECE_DTYPE), v.to(tl.float32), False, IN_PIECES, PIECE_DTYPE)
    return acc


@triton.jit
def load_slice_transform(x, h_ptr, signs, tile, t, rows, stride_x, M: tl.constexpr, M_PAD: tl.constexpr,
                         P: tl.constexpr, Q: tl.constexpr, B: tl.constexpr, CHUNKS: tl.constexpr,
                         MIX: tl.constexpr, TRANSFORM: tl.constexpr, SIGNS: tl.constexpr,
                         IN_PIECES: tl.constexpr, MID_PIECES: tl.constexpr,
                         MMA_DTYPE: tl.constexpr, PIECE_DTYPE: tl.constexpr, TMA: tl.constexpr = False,
                         IL: tl.constexpr = 0, K_STOP: tl.constexpr = False):
    """Slice t of ``tile`` loaded (zeros out of bounds; times ``signs`` along the row where SIGNS: exact,
    +-1) and transformed: [B M_PAD, Q] float32. TMA: ``x`` is a descriptor over the rows seen as
    (rows, M, P) with [B, M_PAD, Q] boxes (Q <= P, CHUNKS == 1): one bulk copy a slice, the copy engine
    zero-filling sub-rows past M and rows past the end."""
    if MIX == 1 and M_PAD > K_CHUNK:  # (plans give B == 1 there)
        y = _chunked_mix(x, h_ptr, signs, tile, t, rows, stride_x, M, M_PAD, P, Q, CHUNKS, SIGNS, IN_PIECES,
                         MMA_DTYPE, PIECE_DTYPE, IL, K_STOP)
        if TRANSFORM:
            return _split_dot(y, sylvester_tile(Q, Q, P, PIECE_DTYPE), True, MID_PIECES, PIECE_DTYPE)
        return y
    offs, mask, col = slice_offsets(tile, t, rows, stride_x, M, M_PAD, P, Q, B, CHUNKS, IL)
    if TMA:
        v = tl.reshape(x.load([tile * B, 0, t * Q]), (B * M_PAD, Q))
    else:
        v = tl.load(x + offs, mask=mask, other=0.0)
    if SIGNS:
        # in float32 and back (exact: +-1): the interpreter multiplies bf16 as integers
        v = (v.to(tl.float32) * tl.load(signs + col, mask=mask, other=0.0).to(tl.float32)).to(v.dtype)
    return slice_transform(v, h_ptr, M_PAD, Q, P, B, MIX, TRANSFORM, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE)


@triton.jit
def butterfly4(t0, t1, t2, t3):
    """H_4 [t0, t1, t2, t3] (Sylvester order)."""
    a = t0 + t1
    b = t0 - t1
    c = t2 + t3
    d = t2 - t3
    return a + c, b + d, a - c, b - d


@triton.jit
def _store(out, tile, t, y, rows, stride_out, scale, M: tl.constexpr, M_PAD: tl.constexpr, P: tl.constexpr,
           Q: tl.constexpr, B: tl.constexpr, CHUNKS: tl.constexpr, TMA: tl.constexpr = False):
    """Slice t of the tile's output; TMA: ``out`` a descriptor as load_slice_transform's ``x`` (sub-rows past
    M and rows past the end clipped)."""
    if TMA:
        out.store([tile * B, 0, t * Q], tl.reshape((y * scale).to(out.dtype), (B, M_PAD, Q)))
    else:
        offs, mask, col = slice_offsets(tile, t, rows, stride_out, M, M_PAD, P, Q, B, CHUNKS)
        tl.store(out + offs, (y * scale).to(out.dtype.element_ty), mask=mask)


@triton.jit
def kron_kernel(x, out, h, rows, stride_x, stride_out, scale,
                M: tl.constexpr, M_PAD: tl.constexpr, P: tl.constexpr, Q: tl.constexpr, S: tl.constexpr,
                B: tl.constexpr, CHUNKS: tl.constexpr, MIX: tl.constexpr, TRANSFORM: tl.constexpr,
                IN_PIECES: tl.constexpr, MID_PIECES: tl.constexpr, MMA_DTYPE: tl.constexpr,
                PIECE_DTYPE: tl.constexpr, GRID: tl.constexpr, TMA_LOAD: tl.constexpr = False,
                TMA_STORE: tl.constexpr = False):
    """out[r] = scale * (H_M (x) H_P) x[r] for ``rows`` rows of n = M P (module docstring); a persistent
    grid of GRID programs, B rows a tile (or with CHUNKS > 1 one column chunk of a row). Shapes: a
    slice is [B M_PAD, Q]; P = S Q (Q > P: zero-padded). TMA_LOAD / TMA_STORE: ``x`` / ``out`` are
    descriptors (load_slice_transform, _store)."""
    tiles = tl.cdiv(rows, B) * CHUNKS
    for tile in range(tl.program_id(0), tiles, GRID):
        t0 = load_slice_transform(x, h, x, tile, 0, rows, stride_x, M, M_PAD, P, Q, B, CHUNKS, MIX, TRANSFORM,
                                  False, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE, TMA_LOAD)
        if S == 1:
            _store(out, tile, 0, t0, rows, stride_out, scale, M, M_PAD, P, Q, B, CHUNKS, TMA_STORE)
        else:
            t1 = load_slice_transform(x, h, x, tile, 1, rows, stride_x, M, M_PAD, P, Q, B, CHUNKS, MIX, TRANSFORM,
                                      False, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE, TMA_LOAD)
            if S == 2:
                _store(out, tile, 0, t0 + t1, rows, stride_out, scale, M, M_PAD, P, Q, B, CHUNKS, TMA_STORE)
                _store(out, tile, 1, t0 - t1, rows, stride_out, scale, M, M_PAD, P, Q, B, CHUNKS, TMA_STORE)
            else:
                t2 = load_slice_transform(x, h, x, tile, 2, rows, stride_x, M, M_PAD, P, Q, B, CHUNKS, MIX,
                                          TRANSFORM, False, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE, TMA_LOAD)
                t3 = load_slice_transform(x, h, x, tile, 3, rows, stride_x, M, M_PAD, P, Q, B, CHUNKS, MIX,
                                          TRANSFORM, False, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE, TMA_LOAD)
                a0, a1, a2, a3 = butterfly4(t0, t1, t2, t3)
                if S == 4:
                    _store(out, tile, 0, a0, rows, stride_out, scale, M, M_PAD, P, Q, B, CHUNKS, TMA_STORE)
                    _store(out, tile, 1, a1, rows, stride_out, scale, M, M_PAD, P, Q, B, CHUNKS, TMA_STORE)
                    _store(out, tile, 2, a2, rows, stride_out, scale, M, M_PAD, P, Q, B, CHUNKS, TMA_STORE)
                    _store(out, tile, 3, a3, rows, stride_out, scale, M, M_PAD, P, Q, B, CHUNKS, TMA_STORE)
                else:  # S == 8: H_8 = H_2 (x) H_4 over the slice index
                    t4 = load_slice_transform(x, h, x, tile, 4, rows, stride_x, M, M_PAD, P, Q, B, CHUNKS, MIX,
                                              TRANSFORM, False, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE, TMA_LOAD)
                    t5 = load_slice_transform(x, h, x, tile, 5, rows, stride_x, M, M_PAD, P, Q, B, CHUNKS, MIX,
                                              TRANSFORM, False, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE, TMA_LOAD)
                    t6 = load_slice_transform(x, h, x, tile, 6, rows, stride_x, M, M_PAD, P, Q, B, CHUNKS, MIX,
                                              TRANSFORM, False, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE, TMA_LOAD)
                    t7 = load_slice_transform(x, h, x, tile, 7, rows, stride_x, M, M_PAD, P, Q, B, CHUNKS, MIX,
                                              TRANSFORM, False, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE, TMA_LOAD)
                    b0, b1, b2, b3 = butterfly4(t4, t5, t6, t7)
                    _store(out, tile, 0, a0 + b0, rows, stride_out, scale, M, M_PAD, P, Q, B, CHUNKS, TMA_STORE)
                    _store(out, tile, 1, a1 + b1, rows, stride_out, scale, M, M_PAD, P, Q, B, CHUNKS, TMA_STORE)
                    _store(out, tile, 2, a2 + b2, rows, stride_out, scale, M, M_PAD, P, Q, B, CHUNKS, TMA_STORE)
                    _store(out, tile, 3, a3 + b3, rows, stride_out, scale, M, M_PAD, P, Q, B, CHUNKS, TMA_STORE)
                    _store(out, tile, 4, a0 - b0, rows, stride_out, scale, M, M_PAD, P, Q, B, CHUNKS, TMA_STORE)
                    _store(out, tile, 5, a1 - b1, rows, stride_out, scale, M, M_PAD, P, Q, B, CHUNKS, TMA_STORE)
                    _store(out, tile, 6, a2 - b2, rows, stride_out, scale, M, M_PAD, P, Q, B, CHUNKS, TMA_STORE)
                    _store(out, tile, 7, a3 - b3, rows, stride_out, scale, M, M_PAD, P, Q, B, CHUNKS, TMA_STORE)
