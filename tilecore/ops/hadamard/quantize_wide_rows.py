"""hadamard_quantize's wide kernel with the mixing product 128 columns wide (issue 32): the "wide_rows"
path, for n = m x 2^k with m > 64 and 64-wide slices (11008 = 172 x 64, 18944 = 148 x 128).

Why: quantize_wide.wide_quantize_kernel mixes one row's [KC, Q = 64] chunk at a time, so each product is a
[MB, KC] x [KC, 64] wgmma (N = 64) and each chunk of H_m ([MB, KC] bf16, 8 KiB) is fetched from L2 into shared
memory for that one row: at 11008 (NB = 3 blocks, NK = 3 chunks) 72 KiB of H a row against the row's own 22 KiB
read and 11 KiB written (fp8). The best wide plan measured ran at 281 effective TFLOPS (40% of copy).

Here the mixing's B operand is 128 columns: C = R S = 2 slices of Q = 64 (R rows of one slice at 11008, R = 2;
one row's two slices at 18944, R = 1), side by side:

    V[k, c] = x[row0 + c // P, (K0 + k) P + c % P]                [KC, R P]   (R P = 2 Q = 128)
    A_j += H[j MB : j MB + MB, K0 : K0 + KC] V                    [MB, 128]   one wgmma chain, N = 128
    (piece 0, piece 1) = A_j's columns 0..63, 64..127              [MB, Q] each: (row 0, row 1) or (slice 0, 1)

so each H chunk serves 128 columns (half the L2 traffic a row at 11008, and the products' N doubles), then each
row's blocks finish and quantize exactly as the wide kernel's (quantize_wide._finish, _block_epilogue,
_block_codes: the same arithmetic, so the same codes bit for bit). Shapes: NB accumulators of [MB, 128] float32
(MB = 64: 3 at 172 and 148, 96 registers a thread at 8 warps). 16-bit inputs; Q = 64, R S = 2.
"""
import triton
import triton.language as tl

from tilecore.ops.hadamard.kernels_kron import _load_sub_rows
from tilecore.ops.hadamard.quantize_kernels import AMAX, _nan_max
from tilecore.ops.hadamard.quantize_wide import _finish, _mix_step, _row_out


@triton.jit
def _load_columns(x, signs, row0, rows, stride_x, K0, M: tl.constexpr, P: tl.constexpr, R: tl.constexpr,
                  KC: tl.constexpr, SIGNS: tl.constexpr):
    """Sub-rows K0 .. K0 + KC - 1 of rows row0 .. row0 + R - 1 side by side: [KC, R P], column c of row
    row0 + c // P, element c % P of the sub-row; zeros out of bounds. 64-bit offsets."""
    c = tl.arange(0, R * P)
    i = K0 + tl.arange(0, KC)
    row = (c // P).to(tl.int64) + row0
    col2 = i[:, None] * P + (c % P)[None, :]
    mask = (row[None, :] < rows) & (i[:, None] < M)
    v = tl.load(x + row[None, :] * stride_x + col2, mask=mask, other=0.0)
    if SIGNS:
        # in float32 and back (exact: +-1): the interpreter multiplies bf16 as integers
        v = (v.to(tl.float32) * tl.load(signs + col2, mask=mask, other=0.0).to(tl.float32)).to(v.dtype)
    return v


@triton.jit
def _mix_pair(acc0, acc1, h_ptr, v0, v1, J: tl.constexpr, K0, MB: tl.constexpr, KC: tl.constexpr,
              M_PAD: tl.constexpr, MMA_DTYPE: tl.constexpr):
    """(acc0 + H_chunk v0, acc1 + H_chunk v1): one load of H[J MB .. J MB + MB - 1, K0 .. K0 + KC - 1] for both."""
    i = J * MB + tl.arange(0, MB)
    k = K0 + tl.arange(0, KC)
    hc = tl.load(h_ptr + i[:, None] * M_PAD + k[None, :]).to(MMA_DTYPE)
    acc0 = tl.dot(hc, v0.to(MMA_DTYPE), acc0, out_dtype=tl.float32)
    acc1 = tl.dot(hc, v1.to(MMA_DTYPE), acc1, out_dtype=tl.float32)
    return acc0, acc1


@triton.jit
def _halves(a, MB: tl.constexpr, Q: tl.constexpr):
    """[MB, 2 Q] -> its columns 0..Q-1 and Q..2Q-1, each [MB, Q]."""
    return tl.split(tl.permute(tl.reshape(a, (MB, 2, Q)), (0, 2, 1)))


@triton.jit
def _row_blocks(p0, p1, p2, p3, rscale, M: tl.constexpr, MB: tl.constexpr, NB: tl.constexpr, P: tl.constexpr,
                Q: tl.constexpr, S: tl.constexpr, MID_PIECES: tl.constexpr, PIECE_DTYPE: tl.constexpr,
                SECOND: tl.constexpr):
    """One row's finished blocks (o{block}{slice}) from the blocks' mixed halves (p{block} = (piece 0, piece 1)):
    S == 2: the row's two slices are the two pieces; S == 1: the row is piece SECOND (0 or 1)."""
    a0, b0 = p0
    a1, b1 = p1
    a2, b2 = p2
    a3, b3 = p3
    if S == 1:
        if SECOND:
            a0, a1, a2, a3 = b0, b1, b2, b3
        b0, b1, b2, b3 = a0, a1, a2, a3
    o00, o01 = _finish(a0, b0, rscale, 0, M, MB, P, Q, S, MID_PIECES, PIECE_DTYPE)
    o10, o11 = o00, o01
    o20, o21 = o00, o01
    o30, o31 = o00, o01
    if NB > 1:
        o10, o11 = _finish(a1, b1, rscale, 1, M, MB, P, Q, S, MID_PIECES, PIECE_DTYPE)
    if NB > 2:
        o20, o21 = _finish(a2, b2, rscale, 2, M, MB, P, Q, S, MID_PIECES, PIECE_DTYPE)
    if NB > 3:
        o30, o31 = _finish(a3, b3, rscale, 3, M, MB, P, Q, S, MID_PIECES, PIECE_DTYPE)
    return o00, o01, o10, o11, o20, o21, o30, o31


@triton.jit
def wide_rows_quantize_kernel(x, codes, scales, h, signs, gscale, amax_out, rows, stride_x, stride_codes,
                              stride_scales, rscale, M: tl.constexpr, M_PAD: tl.constexpr, P: tl.constexpr,
                              Q: tl.constexpr, S: tl.constexpr, R: tl.constexpr, MB: tl.constexpr, NB: tl.constexpr,
                              KC: tl.constexpr, NK: tl.constexpr, SIGNS: tl.constexpr, FORMAT: tl.constexpr,
                              GROUP: tl.constexpr, G: tl.constexpr, SPG: tl.constexpr, STATIC: tl.constexpr,
                              PACKED: tl.constexpr, QMAX: tl.constexpr, MMA_DTYPE: tl.constexpr,
                              MID_PIECES: tl.constexpr, PIECE_DTYPE: tl.constexpr, GRID: tl.constexpr,
                              FAST: tl.constexpr = True, SPLIT: tl.constexpr = True):
    """codes, scales = quantize(rscale * (H_M (x) H_P) (signs * x)) for ``rows`` rows of M P (module docstring):
    R rows a tile (R S == 2), a persistent grid of GRID programs. ``h``: H_M zero-padded to M_PAD x M_PAD (M_PAD
    >= NB MB, NK KC). Mixing tiles [MB, R P = 2 Q], NB <= 4 blocks. FORMAT == AMAX: each program's largest |y|
    into amax_out[program] (nvfp4's dynamic global scale, a first pass); quantize_wide.STORE: the rotated values
    into ``codes`` (x's dtype). SPLIT: the mixing as one [MB, 2 Q] product a block (wgmma N = 128) split into its
    pieces after the K loop; else two [MB, Q] products a block sharing each H chunk (no split: fewer live registers)."""
    run_max = tl.zeros([MB], tl.float32)
    for tile in range(tl.program_id(0), tl.cdiv(rows, R), GRID):
        row0 = tile * R
        if SPLIT:  # one [MB, 2 Q] product a block and K chunk, its halves after the K loop
            a0 = tl.zeros([MB, R * P], tl.float32)  # a{block}: unused ones are never read (compiled away)
            a1 = tl.zeros([MB, R * P], tl.float32)
            a2 = tl.zeros([MB, R * P], tl.float32)
            a3 = tl.zeros([MB, R * P], tl.float32)
            for kc in range(NK):  # a loop, not unrolled: the compiler pipelines its loads (num_stages)
                v = _load_columns(x, signs, row0, rows, stride_x, kc * KC, M, P, R, KC, SIGNS)
                a0 = _mix_step(a0, h, v, 0, kc * KC, MB, KC, M_PAD, MMA_DTYPE)
                if NB > 1:
                    a1 = _mix_step(a1, h, v, 1, kc * KC, MB, KC, M_PAD, MMA_DTYPE)
                if NB > 2:
                    a2 = _mix_step(a2, h, v, 2, kc * KC, MB, KC, M_PAD, MMA_DTYPE)
                if NB > 3:
                    a3 = _mix_step(a3, h, v, 3, kc * KC, MB, KC, M_PAD, MMA_DTYPE)
            p0 = _halves(a0, MB, Q)
            p1 = p0
            p2 = p0
            p3 = p0
            if NB > 1:
                p1 = _halves(a1, MB, Q)
            if NB > 2:
                p2 = _halves(a2, MB, Q)
            if NB > 3:
                p3 = _halves(a3, MB, Q)
        else:  # the two pieces as two [MB, Q] products sharing each loaded H chunk (no split afterwards)
            a00 = tl.zeros([MB, Q], tl.float32)  # a{block}{piece}
            a01 = tl.zeros([MB, Q], tl.float32)
            a10 = tl.zeros([MB, Q], tl.float32)
            a11 = tl.zeros([MB, Q], tl.float32)
            a20 = tl.zeros([MB, Q], tl.float32)
            a21 = tl.zeros([MB, Q], tl.float32)
            a30 = tl.zeros([MB, Q], tl.float32)
            a31 = tl.zeros([MB, Q], tl.float32)
            for kc in range(NK):
                # piece 0 / 1: rows row0 / row0 + 1 (S == 1) or slices 0 / 1 of row0 (S == 2)
                v0 = _load_sub_rows(x, signs, row0, 0, rows, stride_x, kc * KC, M, P, Q, 1, KC, SIGNS)
                if S == 1:
                    v1 = _load_sub_rows(x, signs, row0 + 1, 0, rows, stride_x, kc * KC, M, P, Q, 1, KC, SIGNS)
                else:
                    v1 = _load_sub_rows(x, signs, row0, 1, rows, stride_x, kc * KC, M, P, Q, 1, KC, SIGNS)
                a00, a01 = _mix_pair(a00, a01, h, v0, v1, 0, kc * KC, MB, KC, M_PAD, MMA_DTYPE)
                if NB > 1:
                    a10, a11 = _mix_pair(a10, a11, h, v0, v1, 1, kc * KC, MB, KC, M_PAD, MMA_DTYPE)
                if NB > 2:
                    a20, a21 = _mix_pair(a20, a21, h, v0, v1, 2, kc * KC, MB, KC, M_PAD, MMA_DTYPE)
                if NB > 3:
                    a30, a31 = _mix_pair(a30, a31, h, v0, v1, 3, kc * KC, MB, KC, M_PAD, MMA_DTYPE)
            p0 = (a00, a01)
            p1 = (a10, a11)
            p2 = (a20, a21)
            p3 = (a30, a31)
        o00, o01, o10, o11, o20, o21, o30, o31 = _row_blocks(p0, p1, p2, p3, rscale, M, MB, NB, P, Q, S, MID_PIECES,
                                                             PIECE_DTYPE, False)
        run_max = _row_out(codes, scales, gscale, row0, rows, stride_codes, stride_scales, run_max, o00, o01, o10,
                           o11, o20, o21, o30, o31, M, M_PAD, MB, NB, P, Q, S, FORMAT, GROUP, G, SPG, STATIC, PACKED,
                           QMAX, FAST)
        if R == 2:
            o00, o01, o10, o11, o20, o21, o30, o31 = _row_blocks(p0, p1, p2, p3, rscale, M, MB, NB, P, Q, S,
                                                                 MID_PIECES, PIECE_DTYPE, True)
            run_max = _row_out(codes, scales, gscale, row0 + 1, rows, stride_codes, stride_scales, run_max, o00, o01,
                               o10, o11, o20, o21, o30, o31, M, M_PAD, MB, NB, P, Q, S, FORMAT, GROUP, G, SPG, STATIC,
                               PACKED, QMAX, FAST)
    if FORMAT == AMAX:
        tl.store(amax_out + tl.program_id(0), _nan_max(run_max, 0))
