"""Which kernel transforms these rows, with which configuration and grid: every fit check in one place.

``plan(x, out)`` returns a ``Plan``; ``launch.launch(plan, x, out, scale)`` runs it. Paths:

* "butterfly": n < 16, a float32 register butterfly (butterfly.py);
* "gluon": Hopper, 16-bit rows of n in configs.GLUON_SIZES that TMA can describe, from
  configs.TMA_MIN_ELEMENTS elements: the warp-specialized TMA-ring kernel (gluon_kernels.py);
* "tl": the tensor-core kernel of kernels.py (any CUDA GPU, and the CPU through Triton's interpreter),
  loading and storing through pointers or, where configs.TMA_TUNING measured it faster, TMA descriptors;
* "cpu": CPU tensors without the interpreter, on torch's CPU matmul in float32: one product with
  H_n up to configs.CPU_DENSE_MAX_N, else two with H_a and H_b (n = a b, H_n = H_a (x) H_b), over
  chunks of configs.CPU_CHUNK_ELEMS elements where temporaries are needed (launch._cpu).
"""
from __future__ import annotations

import dataclasses

import torch
import triton.language as tl

from tilecore import dispatch
from tilecore.ops.hadamard import butterfly, configs
from tilecore.tiles.launch import cdiv, tma_describable


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one transform runs. ``config``: for "tl" the kernel's keyword arguments (kernels.hadamard_kernel's
    constexprs, num_warps, num_stages), for "gluon" launch.gluon_args' (stages, lookahead, dynamic)."""
    path: str  # "butterfly" | "tl" | "gluon" | "cpu"
    config: dict = dataclasses.field(default_factory=dict)
    grid: tuple[int, ...] = ()


# a ``tma`` argument -> (load through TMA, store through TMA)
TMA_MODES = {False: (False, False), "none": (False, False), "load": (True, False), "store": (False, True),
             "both": (True, True), True: (True, True)}


def plan(x: torch.Tensor, out: torch.Tensor, *, tma=None, gluon: bool | None = None, **tuning) -> Plan:
    """The plan of out[r] = scale * H_n x[r] for 2-D ``x`` and ``out`` (rows, n), unit stride along n.

    ``tma``: which side of the tl kernel goes through TMA descriptors: "load", "store", "both" (or
    True), "none" (or False); None: configs.TMA_TUNING's choice. Where TMA cannot describe a tensor it
    needs (tma_fits), both go through pointers. ``gluon``: True takes the Gluon kernel where it fits
    (gluon_fits), False never; None: where configs.GLUON_TUNING has n, unless ``tma`` or a tuning is
    given. ``tuning``: the tl kernel's (tl_config's) overrides."""
    rows, n = x.shape
    if dispatch.backend_for(x.device) == "reference":
        return cpu_plan(rows, n)
    if n < 16:  # padded to a 16-wide tensor-core tile it ran at 11-42% of copy speed
        return Plan("butterfly", grid=butterfly.grid(rows, n))
    interpret = dispatch.interpreted(x.device)
    if gluon is None:
        gluon = n in configs.GLUON_TUNING and tma is None and not tuning and rows * n >= configs.TMA_MIN_ELEMENTS
    if gluon and not interpret and gluon_fits(x, out):
        return gluon_plan(x)
    fp32 = x.dtype == torch.float32
    if tma is None and not tuning:
        # a GPU with less shared memory than TUNING asks for: configs.SHARED_FITS's row, on pointers
        fit = dispatch.shared_memory_fit(x.device, configs.SHARED_FITS, "hadamard_transform")
        if fit is not None:
            tma, tuning = "none", fit.get((n, fp32), {})
        elif not dispatch.tma_ok(x.device):
            tma = "none"  # before sm_90 (and on ROCm) Triton makes descriptors plain loads, unpipelined
    tma_load, tma_store, tma_tuning = tma_sides(n, fp32, tma, tuning, rows * n)
    if (tma_load and not tma_fits(x)) or (tma_store and not tma_fits(out)):
        tma_load = tma_store = False
    else:
        tuning = tma_tuning
    cfg = tl_config(n, fp32=fp32, **tuning)
    # Triton 3.6's interpreter multiplies bf16 operands as integers: there a bf16 input's one exact
    # product runs in float32, and the pieces' products emulate bf16 (kernels._split_dot)
    piece = tl.bfloat16
    mma = {torch.float16: tl.float16, torch.bfloat16: tl.float32 if interpret else tl.bfloat16,
           torch.float32: piece}[x.dtype]
    sms = configs.INTERPRETER_SMS if interpret else dispatch.num_sms(x.device)
    grid = max(1, min(cdiv(rows, cfg["B"]), sms * cfg["waves"]))
    return Plan("tl", grid=(grid,), config=dict(
        N=n, S=cfg["S"], N1=cfg["N1"], N2=cfg["N2"], B=cfg["B"], IN_PIECES=3 if fp32 else 1,
        MID_PIECES=3 if fp32 else 2, MMA_DTYPE=mma, PIECE_DTYPE=piece, GRID=grid, TMA_LOAD=tma_load,
        TMA_STORE=tma_store, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]))


def cpu_plan(rows: int, n: int) -> Plan:
    """torch's CPU matmul: config ``factors`` (a, b), n = a b with a <= b (a = 1: one product with H_n),
    and ``rows`` per chunk."""
    if n <= configs.CPU_DENSE_MAX_N:
        a = 1
    else:
        a = 1 << ((n.bit_length() - 1) // 2)
    return Plan("cpu", config=dict(factors=(a, n // a), rows=max(1, configs.CPU_CHUNK_ELEMS // n)))


def tma_sides(n: int, fp32: bool, tma, tuning: dict, elements: int = configs.TMA_MIN_ELEMENTS):
    """(load through TMA, store through TMA, tuning) for ``tma`` as ``plan`` takes it; the caller's
    tuning overrides TMA_TUNING's. ``elements``: the input's size (by default a large input, the case
    TMA_TUNING was timed for)."""
    if tma is not None:
        return (*TMA_MODES[tma], tuning)
    if fp32 or elements < configs.TMA_MIN_ELEMENTS:
        return False, False, tuning
    mode, preset = configs.TMA_TUNING.get(n, ("none", {}))
    return (*TMA_MODES[mode], {**preset, **tuning})


def tl_config(n: int, *, fp32: bool = False, split: tuple | None = None, tile_elems: int | None = None,
              num_warps: int | None = None, num_stages: int | None = None, waves: int | None = None) -> dict:
    """The tl kernel's configuration for size n: the split (S, N1, N2), rows per tile B, warps, pipeline
    stages, programs per SM; configs.SPLITS and TUNING (FP32_TUNING) unless given."""
    S, N1, N2 = split or configs.SPLITS[n]
    assert S in (1, 2, 4) and S * N1 * N2 == max(n, 16) or (n < 16 and (S, N1, N2) == (1, 1, 16)), (n, split)
    tuned = configs.FP32_TUNING if fp32 else configs.TUNING[n]
    tile_elems = tile_elems or tuned[0]
    B = max(1, tile_elems // (S * N1 * N2))
    if N1 >= 64:
        B = 1  # a batch of such rows runs as a 3-D product on mma.sync: measured 2-15x slower
    if N1 == 1:
        B = max(B, 16)  # a tensor-core tile needs 16 rows
    return {"S": S, "N1": N1, "N2": N2, "B": B, "num_warps": num_warps or tuned[1],
            "num_stages": num_stages or tuned[2], "waves": waves or tuned[3]}


def tma_fits(t: torch.Tensor) -> bool:
    """Whether a TMA descriptor can describe the rows of ``t`` (rows, n): base address and row stride
    16-byte aligned, and n >= 16 (smaller rows are padded to a 16-wide tile in registers)."""
    return t.shape[1] >= 16 and tma_describable(t)


def gluon_fits(x: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether the Gluon kernel can take these (rows, n) tensors: Hopper, float16/bfloat16, n in
    GLUON_SIZES, contiguous rows that TMA can describe."""
    return (x.shape[1] in configs.GLUON_SIZES and x.dtype in (torch.float16, torch.bfloat16)
            and all(t.is_contiguous() and tma_describable(t) for t in (x, out)) and dispatch.gluon_ok(x.device))


def gluon_plan(x: torch.Tensor, *, stages: int | None = None, lookahead: int | None = None,
               programs: int | None = None, dynamic: bool = True) -> Plan:
    """The Gluon kernel's plan for the (rows, n) ``x`` (gluon_fits): ``stages`` and ``lookahead`` (the
    template's LOOKAHEAD, 0: the ring's depth) override GLUON_TUNING's; ``programs`` the grid;
    ``dynamic``: rows drawn from a counter as programs get to them, else dealt round-robin."""
    rows, n = x.shape
    if stages is None:
        stages, tuned_lookahead = configs.GLUON_TUNING.get(n, (configs.GLUON_STAGES, 0))
        lookahead = tuned_lookahead if lookahead is None else lookahead
    sms = dispatch.num_sms(x.device)
    # drawn rows end together on any grid (one program per SM measured as fast as 128 at 8192 rows)
    grid = min(rows, programs or (sms if dynamic else gluon_programs(rows, sms)))
    return Plan("gluon", config=dict(stages=stages, lookahead=lookahead or 0, dynamic=dynamic), grid=(grid,))


def gluon_programs(rows: int, num_sms: int) -> int:
    """The Gluon kernel's grid with rows dealt round-robin: a program per SM, or up to 4% fewer where
    that fills the last round of rows better (a row is a program's whole tile, so a last round of a few
    rows keeps those SMs busy while the rest idle: 0.7-0.8% at 8,192 rows, notes/hadamard/README.md)."""
    if rows <= num_sms:
        return rows

    def last_round_fill(programs):
        return (rows % programs or programs) / programs

    return max(range(num_sms, num_sms - num_sms // 25 - 1, -1), key=last_round_fill)  # ties: more programs
