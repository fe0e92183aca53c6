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
where that measured faster (TMA_TUNING), through TMA descriptors: the copy engine moves each [B, N1, N2]
slice between global and shared memory (cp.async.bulk.tensor), zero-filling reads and clipping writes
past the last row. Only the data movement differs; the transform above is the same code.

Two other kernels serve the ends of the range (launch picks): n < 16 runs as a float32 register
butterfly (butterfly.py), and n in GLUON_TUNING on Hopper runs this plan on the tiles' Gluon pipeline
template (gluon_kernels.py: a producer warp, a TMA ring and two consumer warpgroups).
"""
import functools

import torch
import triton
import triton.language as tl

from tilecore import dispatch
from tilecore.ops.hadamard import butterfly
from tilecore.ops.hadamard.reference import hadamard_matrix
from tilecore.tiles.hadamard import dot_split, sylvester_tile
from tilecore.tiles.launch import CachedLaunch, tma_describable


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


# n -> (S, N1, N2). A row is S slices of N1 x N2 (N2 contiguous); the slices' transforms are combined
# by a float32 butterfly in registers, which costs no tensor-core work.
# * N2 >= 16 (a tensor-core tile; smaller n are zero-padded to 16); N1 is 1 (one product) or >= 16.
# * Tensor-core FLOP per element: 2 N1 + 4 N2 (2 N2 when N1 = 1: one exact stage).
# * N1 >= 64 runs one row per tile (2-D wgmma); N1 <= 32 batches rows (3-D product).
# Chosen from timings on the H100 (notes/hadamard/README.md). n < 16 is listed (op.py checks n against PLANS)
# but launch() sends it to butterfly.py; config() still serves those plans to callers that ask.
PLANS = {
    1: (1, 1, 16), 2: (1, 1, 16), 4: (1, 1, 16), 8: (1, 1, 16), 16: (1, 1, 16),
    32: (1, 1, 32), 64: (1, 1, 64), 128: (1, 1, 128),
    256: (4, 1, 64), 512: (1, 32, 16), 1024: (1, 32, 32), 2048: (2, 32, 32),
    4096: (1, 128, 32), 8192: (2, 128, 32), 16384: (4, 128, 32), 32768: (4, 128, 64),
}
MAX_N = max(PLANS)

# n -> (elements per tile, warps, software-pipeline stages of the persistent loop's loads, programs per
# SM in the persistent grid), chosen from the compiler's register and shared-memory report
# (scripts/hadamard_resources.py) and timings on the H100 (notes/hadamard/README.md).
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

# float16/bfloat16: n -> (which side goes through TMA, tuning that differs from the pointer path's)
# where that measured faster than pointers on the H100 (notes/hadamard/README.md, v7). Other n, float32, and
# tensors TMA cannot describe (tma_fits) load and store through pointers with PLANS and TUNING.
# More programs per SM than fit at once (waves 32-64) measured faster with TMA; why was not profiled
# (a guess: the hardware balances the last tiles, while each program still pipelines a few tiles).
TMA_TUNING = {
    256: ("load", dict(tile_elems=16384, waves=32)),
    512: ("both", dict(plan=(1, 16, 32), tile_elems=8192, waves=32)),
    1024: ("both", dict(waves=64)),
    2048: ("both", dict(waves=64)),
    4096: ("both", dict(num_stages=6, num_warps=4, waves=32)),
    8192: ("both", dict(waves=32)),
    16384: ("both", dict(plan=(2, 128, 64), num_stages=4)),
    32768: ("both", dict(waves=2)),
}
# a ``tma`` argument -> (load through TMA, store through TMA)
TMA_MODES = {False: (False, False), "none": (False, False), "load": (True, False), "store": (False, True),
             "both": (True, True), True: (True, True)}


# Below this many elements the pointer path serves every n: TMA_TUNING was timed at 2^28 elements,
# and for few rows a TMA launch (two host-built descriptors, persistent grids of 32-64 programs per
# SM) measured 50-830 us against the pointer path's 7-24 us (hadamard-latency, notes/hadamard/README.md).
TMA_MIN_ELEMENTS = 1 << 24


def choose_path(n: int, fp32: bool, tma, tuning: dict, elements: int = TMA_MIN_ELEMENTS) -> tuple[bool, bool, dict]:
    """(load through TMA, store through TMA, tuning) for ``tma`` as kernels.launch takes it; the
    caller's tuning overrides TMA_TUNING's. ``elements``: the input's size (by default a large input,
    the case TMA_TUNING was timed for)."""
    if tma is not None:
        return (*TMA_MODES[tma], tuning)
    if fp32 or elements < TMA_MIN_ELEMENTS:
        return False, False, tuning
    mode, preset = TMA_TUNING.get(n, ("none", {}))
    return (*TMA_MODES[mode], {**preset, **tuning})


def tma_fits(t) -> bool:
    """Whether a TMA descriptor can describe the rows of ``t`` (rows, n): base address and row stride
    16-byte aligned, and n >= 16 (smaller rows are padded to a 16-wide tile in registers)."""
    return t.shape[1] >= 16 and tma_describable(t)


def _descriptor(t, cfg: dict):
    """A rank-3 view (rows, n / N2, N2) of the rows of ``t``, one [B, N1, N2] slice per box (Triton
    splits a box side over 256 elements into several copies)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    N2 = cfg["N2"]
    return TensorDescriptor(t, [t.shape[0], t.shape[1] // N2, N2], [t.stride(0), N2, 1], [cfg["B"], cfg["N1"], N2])


# n -> (ring stages, lookahead) of Hopper's Gluon kernel (gluon_kernels.py), for float16/bfloat16 rows
# of n = 8192 S (S = 2, 4) that are contiguous and TMA-describable, from TMA_MIN_ELEMENTS elements: the
# default for the n listed here (notes/hadamard/README.md, v9; 16384 since session 18, when rows drawn as
# programs get to them took it from 93.8% of copy to 98.6%, past the tl kernel's 96.2-96.5%);
# GLUON_SIZES is what the kernel can do. GLUON_STAGES: the ring depth where n has no entry. At
# n = 32768 the loads run best exactly a row (4 slices) ahead of the consumers: 3 lost 10%, 5 lost 2%,
# 8 lost 5% (sessions 11, 18); a ring of 8 that fills two rows at the start (when nothing is written
# yet) and then runs 4 deep gained 0.2-0.3%. At 16384 two rows ahead (4 stages) beat one (83%).
GLUON_STAGES = 4
GLUON_TUNING = {16384: (4, 0), 32768: (8, 4)}
GLUON_SIZES = (16384, 32768)


def gluon_fits(x, out) -> bool:
    """Whether the Gluon kernel can take these (rows, n) tensors: Hopper, float16/bfloat16, n in
    GLUON_SIZES, contiguous rows that TMA can describe."""
    n = x.shape[1]
    return (x.is_cuda and n in GLUON_SIZES and x.dtype in (torch.float16, torch.bfloat16)
            and all(t.is_contiguous() and tma_describable(t) for t in (x, out)) and dispatch.is_hopper(x.device))


@functools.lru_cache(maxsize=None)
def _h64(device, dtype) -> torch.Tensor:
    """The Gluon kernel's resident operands, as bf16 bits: H_64 in bf16 (the second product's), then
    H_64 and -H_64 in the input's ``dtype`` (the first product's), each 64 x 64."""
    h = hadamard_matrix(64, torch.float64)
    return torch.cat([h.to(torch.bfloat16), h.to(dtype).view(torch.bfloat16),
                      (-h).to(dtype).view(torch.bfloat16)]).to(device)


def gluon_args(x, out, scale: float, stages: int, lookahead: int = 0, dynamic: bool = True) -> dict:
    """hadamard_gluon_kernel's arguments for (rows, n) ``x`` and ``out``: the rows as lines of 64
    elements (TMA descriptors with [64, 64] boxes; the staging buffer's shape: [64 S, 64]), +-H_64 and
    the stream's row counter (``dynamic``: rows are drawn as programs get to them)."""
    from tilecore.tiles.launch import gluon_descriptor, tile_counter

    rows, n = x.shape
    S = n // 8192

    def lines(t, block):
        return gluon_descriptor(t, block, shape=[rows * n // 64, 64], strides=[64, 1])

    return dict(x_desc=lines(x, [64, 64]), out_desc=lines(out, [64, 64]), staging_desc=lines(out, [64 * S, 64]),
                h_desc=gluon_descriptor(_h64(x.device, x.dtype), [64, 64]), rows=rows, scale=scale,
                row_counter=tile_counter(x.device) if dynamic else None, S=S, STAGES=stages, LOOKAHEAD=lookahead)


def gluon_programs(rows: int, num_sms: int) -> int:
    """The Gluon kernel's grid with rows dealt round-robin (``launch_gluon(dynamic=False)``; drawn
    rows take a program per SM): a program per SM, or up to 4% fewer where that fills the last round
    of rows better. A row is a program's whole tile (128 KiB of traffic at n = 32768), and a last
    round of a few rows keeps those SMs busy for a whole row's time while the rest idle: 8,192 rows
    on 132 SMs leave 8 in a 63rd round; 128 programs run 64 full rounds, 0.7-0.8% faster (the
    memory being the limit, fewer SMs cost little; 120 programs lose 1-1.4%; notes/hadamard/README.md,
    session 11)."""
    if rows <= num_sms:
        return rows

    def last_round_fill(programs):
        return (rows % programs or programs) / programs

    return max(range(num_sms, num_sms - num_sms // 25 - 1, -1), key=last_round_fill)  # ties: more programs


def launch_gluon(x, out, scale: float, *, num_sms: int, stages: int | None = None,
                 programs: int | None = None, lookahead: int | None = None, dynamic: bool = True) -> None:
    """out = scale * H_n x on Hopper through gluon_kernels.hadamard_gluon_kernel (see gluon_fits);
    ``programs`` overrides gluon_programs' grid; ``stages`` and ``lookahead`` (the template's
    LOOKAHEAD, 0: the ring's depth) override GLUON_TUNING's; ``dynamic``: rows drawn from a counter
    as programs get to them, else dealt round-robin."""
    from tilecore.ops.hadamard.gluon_kernels import hadamard_gluon_kernel

    if stages is None:
        stages, tuned_lookahead = GLUON_TUNING.get(x.shape[1], (GLUON_STAGES, 0))
        lookahead = tuned_lookahead if lookahead is None else lookahead
    lookahead = lookahead or 0  # a ring of given depth runs that deep unless told otherwise

    # drawn rows end together on any grid (one program per SM measured as fast as 128 at 8192 rows)
    grid = min(x.shape[0], programs or (num_sms if dynamic else gluon_programs(x.shape[0], num_sms)))
    with dispatch.on_device(x.device):
        hadamard_gluon_kernel[(grid,)](**gluon_args(x, out, scale, stages, lookahead, dynamic), num_warps=4)


def launch(x, out, scale: float, *, interpret: bool, num_sms: int, tma=None, gluon=None, **tuning) -> None:
    """out[r] = scale * H_n x[r] for 2-D ``x`` and ``out`` (rows, n) with unit stride along n.

    ``tma``: which side loads/stores through TMA descriptors: "load", "store", "both" (or True), "none"
    (or False); None: the measured fastest for n and dtype (TMA_TUNING, with its tuning). If TMA cannot
    describe a tensor it needs (tma_fits), everything goes through pointers. ``gluon``: True runs the
    Gluon kernel where it fits (gluon_fits), False never; None: the default (GLUON_TUNING), unless
    ``tma`` or a tuning is given."""
    rows, n = x.shape
    if n < 16:  # padded to a 16-wide tensor-core tile it ran at 11-42% of copy speed
        return butterfly.launch(x, out, scale, interpret=interpret, num_sms=num_sms)
    if gluon is None:
        gluon = n in GLUON_TUNING and tma is None and not tuning and rows * n >= TMA_MIN_ELEMENTS
    if gluon and not interpret and gluon_fits(x, out):
        return launch_gluon(x, out, scale, num_sms=num_sms)
    fp32 = x.dtype == torch.float32
    tma_load, tma_store, tma_tuning = choose_path(n, fp32, tma, tuning, rows * n)
    if (tma_load and not tma_fits(x)) or (tma_store and not tma_fits(out)):
        tma_load = tma_store = False
    else:
        tuning = tma_tuning
    cfg = config(n, fp32=fp32, **tuning)
    # bf16 products are wrong in Triton 3.6's interpreter: there, bf16 runs its math in fp32/fp16.
    piece = tl.float16 if interpret else tl.bfloat16
    mma = {torch.float16: tl.float16, torch.bfloat16: tl.float32 if interpret else tl.bfloat16,
           torch.float32: piece}[x.dtype]
    tiles = triton.cdiv(rows, cfg["B"])
    grid = max(1, min(tiles, num_sms * cfg["waves"]))
    # CachedLaunch picks the device from the tensor arguments; with two descriptors there are none.
    with dispatch.on_device(x.device if tma_load and tma_store else None):
        _launch_hadamard[(grid,)](
            _descriptor(x, cfg) if tma_load else x, _descriptor(out, cfg) if tma_store else out,
            rows, x.stride(0), out.stride(0), scale,
            N=n, S=cfg["S"], N1=cfg["N1"], N2=cfg["N2"], B=cfg["B"],
            IN_PIECES=3 if fp32 else 1, MID_PIECES=3 if fp32 else 2, MMA_DTYPE=mma, PIECE_DTYPE=piece, GRID=grid,
            TMA_LOAD=tma_load, TMA_STORE=tma_store, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
