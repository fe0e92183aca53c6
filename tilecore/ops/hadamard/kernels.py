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
"""
import torch
import triton
import triton.language as tl

from tilecore.tiles.hadamard import dot_split, sylvester_tile
from tilecore.tiles.launch import CachedLaunch


@triton.jit
def _load_slice(x_ptr, rows, stride_x, r, s, N: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr):
    """Slice s of the rows ``r`` as a [B, N1, N2] tile (zeros past the last row and past n < 16)."""
    i = tl.arange(0, N1)
    j = tl.arange(0, N2)
    offs = r[:, None, None] * stride_x + (s * N1 * N2 + i[None, :, None] * N2 + j[None, None, :])
    mask = (r[:, None, None] < rows) & (j[None, None, :] < N)
    return tl.load(x_ptr + offs, mask=mask, other=0.0)


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
            z = dot_split(x2.to(tl.float32), sylvester_tile(N2, N2, N, PIECE_DTYPE), True, IN_PIECES, PIECE_DTYPE)
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
                y = dot_split(h1, x1.to(tl.float32), False, IN_PIECES, PIECE_DTYPE)
        else:
            # One product per row (batched), so that rows never mix.
            h1b = tl.broadcast_to(h1[None, :, :], (B, N1, N1))
            if IN_PIECES == 1:
                y = tl.dot(h1b, x.to(MMA_DTYPE), out_dtype=tl.float32)
            else:
                y = dot_split(h1b, x.to(tl.float32), False, IN_PIECES, PIECE_DTYPE)
            y = tl.reshape(y, (B * N1, N2))
        z = dot_split(y, sylvester_tile(N2, N2, N, PIECE_DTYPE), True, MID_PIECES, PIECE_DTYPE)
    return z


@triton.jit
def _store_slice(out_ptr, rows, stride_out, r, s, z, scale,
                 N: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr, B: tl.constexpr):
    i = tl.arange(0, N1)
    j = tl.arange(0, N2)
    offs = r[:, None, None] * stride_out + (s * N1 * N2 + i[None, :, None] * N2 + j[None, None, :])
    mask = (r[:, None, None] < rows) & (j[None, None, :] < N)
    z = tl.reshape(z * scale, (B, N1, N2))
    tl.store(out_ptr + offs, z.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def hadamard_kernel(x_ptr, out_ptr, rows, stride_x, stride_out, scale,
                    N: tl.constexpr, S: tl.constexpr,
                    N1: tl.constexpr, N2: tl.constexpr, B: tl.constexpr,
                    IN_PIECES: tl.constexpr, MID_PIECES: tl.constexpr,
                    MMA_DTYPE: tl.constexpr, PIECE_DTYPE: tl.constexpr, GRID: tl.constexpr):
    """scale * H_N applied to each of ``rows`` rows; a persistent grid of GRID programs, B rows a tile.

    A row is S slices of N1 x N2: their transforms T_t stay in registers, and out = H_S [T_0 .. T_{S-1}].
    """
    tiles = tl.cdiv(rows, B)
    for tile in range(tl.program_id(0), tiles, GRID):
        r = tl.arange(0, B).to(tl.int64) + tile * B  # 64-bit: rows * stride may pass 2^31
        t0 = _slice_transform(_load_slice(x_ptr, rows, stride_x, r, 0, N, N1, N2),
                              N, N1, N2, B, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE)
        if S == 1:
            _store_slice(out_ptr, rows, stride_out, r, 0, t0, scale, N, N1, N2, B)
        else:
            t1 = _slice_transform(_load_slice(x_ptr, rows, stride_x, r, 1, N, N1, N2),
                                  N, N1, N2, B, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE)
            if S == 2:
                _store_slice(out_ptr, rows, stride_out, r, 0, t0 + t1, scale, N, N1, N2, B)
                _store_slice(out_ptr, rows, stride_out, r, 1, t0 - t1, scale, N, N1, N2, B)
            else:  # S == 4: H_4 = H_2 (x) H_2 over the slice index
                t2 = _slice_transform(_load_slice(x_ptr, rows, stride_x, r, 2, N, N1, N2),
                                      N, N1, N2, B, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE)
                t3 = _slice_transform(_load_slice(x_ptr, rows, stride_x, r, 3, N, N1, N2),
                                      N, N1, N2, B, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE)
                a = t0 + t1
                b = t0 - t1
                c = t2 + t3
                d = t2 - t3
                _store_slice(out_ptr, rows, stride_out, r, 0, a + c, scale, N, N1, N2, B)
                _store_slice(out_ptr, rows, stride_out, r, 1, b + d, scale, N, N1, N2, B)
                _store_slice(out_ptr, rows, stride_out, r, 2, a - c, scale, N, N1, N2, B)
                _store_slice(out_ptr, rows, stride_out, r, 3, b - d, scale, N, N1, N2, B)


# n -> (S, N1, N2). A row is S slices of N1 x N2 (N2 contiguous); the slices' transforms are combined
# by a float32 butterfly in registers, which costs no tensor-core work.
# * N2 >= 16 (a tensor-core tile; smaller n are zero-padded to 16); N1 is 1 (one product) or >= 16.
# * Tensor-core FLOP per element: 2 N1 + 4 N2 (2 N2 when N1 = 1: one exact stage).
# * N1 >= 64 runs one row per tile (2-D wgmma); N1 <= 32 batches rows (3-D product).
# Chosen from timings on the H100 (notes/hadamard.md).
PLANS = {
    1: (1, 1, 16), 2: (1, 1, 16), 4: (1, 1, 16), 8: (1, 1, 16), 16: (1, 1, 16),
    32: (1, 1, 32), 64: (1, 1, 64), 128: (1, 1, 128),
    256: (4, 1, 64), 512: (1, 32, 16), 1024: (1, 32, 32), 2048: (2, 32, 32),
    4096: (1, 128, 32), 8192: (2, 128, 32), 16384: (4, 128, 32), 32768: (4, 128, 64),
}
MAX_N = max(PLANS)

# n -> (elements per tile, warps, software-pipeline stages of the persistent loop's loads, programs per
# SM in the persistent grid), chosen from the compiler's register and shared-memory report
# (scripts/hadamard_resources.py) and timings on the H100 (notes/hadamard.md).
TUNING = {n: (4096, 8, 3, 4) for n in PLANS} | {n: (16384, 8, 3, 1) for n in (16, 32, 64, 128)} | {
    256: (32768, 8, 3, 16), 512: (4096, 8, 3, 16), 1024: (8192, 8, 3, 16), 2048: (16384, 8, 3, 4),
    4096: (4096, 8, 5, 16), 8192: (8192, 8, 5, 4), 16384: (4096, 8, 3, 1), 32768: (4096, 8, 3, 1)}
# float32 inputs carry three pieces per stage: smaller tiles and two stages keep them in shared memory.
FP32_TUNING = (4096, 8, 2, 4)


def config(n: int, *, fp32: bool = False, plan: tuple | None = None, tile_elems: int | None = None,
           num_warps: int | None = None, num_stages: int | None = None, waves: int | None = None) -> dict:
    """Launch parameters for size n: plan, rows per tile B, warps, pipeline stages, programs per SM."""
    S, N1, N2 = plan or PLANS[n]
    assert S in (1, 2, 4) and S * N1 * N2 == max(n, 16) or (n < 16 and (S, N1, N2) == (1, 1, 16)), (n, plan)
    tuned = FP32_TUNING if fp32 else TUNING[n]
    tile_elems = tile_elems or tuned[0]
    B = max(1, tile_elems // (S * N1 * N2))
    if N1 >= 64:
        B = 1  # a batch of such rows runs as a 3-D product on mma.sync: measured 2-15x slower
    if N1 == 1:
        B = max(B, 16)  # a tensor-core tile needs 16 rows
    return {"S": S, "N1": N1, "N2": N2, "B": B, "num_warps": num_warps or tuned[1],
            "num_stages": num_stages or tuned[2], "waves": waves or tuned[3]}


_launch_hadamard = CachedLaunch(hadamard_kernel)


def launch(x, out, scale: float, *, interpret: bool, num_sms: int, **tuning) -> None:
    """out[r] = scale * H_n x[r] for 2-D ``x`` and ``out`` (rows, n) with unit stride along n."""
    rows, n = x.shape
    cfg = config(n, fp32=x.dtype == torch.float32, **tuning)
    # bf16 products are wrong in Triton 3.6's interpreter: there, bf16 runs its math in fp32/fp16.
    piece = tl.float16 if interpret else tl.bfloat16
    mma = {torch.float16: tl.float16, torch.bfloat16: tl.float32 if interpret else tl.bfloat16,
           torch.float32: piece}[x.dtype]
    fp32 = x.dtype == torch.float32
    tiles = triton.cdiv(rows, cfg["B"])
    grid = max(1, min(tiles, num_sms * cfg["waves"]))
    _launch_hadamard[(grid,)](
        x, out, rows, x.stride(0), out.stride(0), scale,
        N=n, S=cfg["S"], N1=cfg["N1"], N2=cfg["N2"], B=cfg["B"],
        IN_PIECES=3 if fp32 else 1, MID_PIECES=3 if fp32 else 2, MMA_DTYPE=mma, PIECE_DTYPE=piece, GRID=grid,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
