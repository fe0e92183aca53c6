"""The Hadamard transform for n < 16 (n = 1, 2, 4, 8): a float32 butterfly in registers, no tensor cores.

A tensor-core tile is 16 wide: kernels.py's kernel pads such rows to 16 in registers, spending 2-16x
the registers, load lanes and tensor-core work per useful byte; it measured 11-42% of copy bandwidth
on the H100. Here a program reads BLOCK_ROWS whole rows, runs log2(n) butterfly stages in float32 and
writes them back: a copy with a few additions, measured at copy speed for every n and dtype
(rows stored back to back; H100).

Each stage is the same "constant geometry" step, y[k] = x[2k] + x[2k+1], y[k + n/2] = x[2k] - x[2k+1];
log2(n) of them give H_n x in Sylvester order (checked against H_2n = [[H, H], [H, -H]] for n <= 64).

Error: inputs are converted to float32 once, each output is a +-sum of n <= 8 of them (log2(n) <= 3
float32 additions), scaled in float32 and rounded once to the output dtype. The float32 steps need not
be exact (16-bit inputs of far-apart exponents), but their error is at the float32 rounding level, far
below a 16-bit output's rounding floor. Rows never mix, so a NaN or Inf stays in its row.
"""
import triton
import triton.language as tl

from tilecore.tiles.launch import CachedLaunch, cdiv

# A program moves BLOCK_ELEMS elements in and out (4 KiB each way for 16-bit, 8 KiB for float32).
# 1024 and 2048 ran at copy speed for every n and dtype on the H100; 4096 lost up to 5% at n = 1.
BLOCK_ELEMS = 2048
NUM_WARPS = 4


@triton.jit
def butterfly_kernel(x, out, rows, stride_x, stride_out, scale,
                     N: tl.constexpr, LOG_N: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                     X_DENSE: tl.constexpr, OUT_DENSE: tl.constexpr):
    """out[r] = scale * H_N x[r] for the BLOCK_ROWS rows of this program.

    X_DENSE (OUT_DENSE): the row stride is N, compiled in as a constant; with the stride a runtime
    value, 16-bit n = 2..8 measured 80-86% of copy speed on the H100 (100% with the constant)."""
    if X_DENSE:
        stride_x = N
    if OUT_DENSE:
        stride_out = N
    first = tl.program_id(0).to(tl.int64) * BLOCK_ROWS  # 64-bit: rows * stride may pass 2^31
    r = first + tl.arange(0, BLOCK_ROWS)
    c = tl.arange(0, N)
    px = x + r[:, None] * stride_x + c[None, :]
    po = out + r[:, None] * stride_out + c[None, :]
    mask = (r < rows)[:, None]
    # Whole blocks go unmasked: for n = 1 the row mask would split accesses into single elements
    # unless rows is a multiple of 16 (34-43% of copy speed measured for 16-bit).
    whole = first + BLOCK_ROWS <= rows
    if whole:
        v = tl.load(px)
    else:
        v = tl.load(px, mask=mask)
    v = v.to(tl.float32)
    for _ in tl.static_range(LOG_N):
        even, odd = tl.split(tl.reshape(v, (BLOCK_ROWS, N // 2, 2)))
        # join gives [.., k, (sum, difference)]; the permute puts all sums first: y[k], y[k + N/2]
        v = tl.reshape(tl.permute(tl.join(even + odd, even - odd), (0, 2, 1)), (BLOCK_ROWS, N))
    y = (v * scale).to(out.dtype.element_ty)
    if whole:
        tl.store(po, y)
    else:
        tl.store(po, y, mask=mask)


_launch = CachedLaunch(butterfly_kernel)


def grid(rows: int, n: int) -> tuple[int]:
    """A program per BLOCK_ROWS rows (not persistent: nothing differs under the interpreter)."""
    return (cdiv(rows, BLOCK_ELEMS // n),)


def launch(x, out, scale: float) -> None:
    """out[r] = scale * H_n x[r] for 2-D ``x`` and ``out`` (rows, n), n in {1, 2, 4, 8}, unit stride
    along n (any for n = 1: the kernel never steps along it)."""
    rows, n = x.shape
    assert n in (1, 2, 4, 8) and out.shape == x.shape and (n == 1 or x.stride(1) == out.stride(1) == 1), \
        (x.shape, x.stride(), out.stride())
    if rows == 0:
        return
    _launch[grid(rows, n)](
        x, out, rows, x.stride(0), out.stride(0), scale,
        N=n, LOG_N=n.bit_length() - 1, BLOCK_ROWS=BLOCK_ELEMS // n,
        X_DENSE=x.stride(0) == n, OUT_DENSE=out.stride(0) == n, num_warps=NUM_WARPS)
