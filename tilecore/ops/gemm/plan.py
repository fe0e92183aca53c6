"""Which kernel serves a GEMM, with which configuration and grid: every fit check in one place.

``plan(a, b, out_dtype=...)`` returns a ``Plan``; ``launch.launch(plan, a, b, ...)`` runs it. Paths:

* "gluon": Hopper, operands TMA can describe (or copied once into a layout it can): the TMA + wgmma
  kernel of gluon_kernels.py;
* "tl": the same GEMM on the tl twin of the template (kernels.py): GPUs older than Hopper, operands
  TMA cannot describe, and CPU tensors through Triton's interpreter;
* "cpu": CPU tensors without the interpreter, on torch's CPU matmul: float32 operands (and 16-bit
  ones where dispatch.cpu_native_matmul says the CPU multiplies them natively) as they are; other
  16-bit and fp8 operands upcast to float32 in blocks of configs.CPU_BLOCK_ELEMS (fp32 accumulation
  and one rounding to out_dtype, as on the GPU);
* "reference": PyTorch, for empty products on the kernel paths.
"""
from __future__ import annotations

import dataclasses

import torch

from tilecore import dispatch
from tilecore.ops.gemm import configs
from tilecore.tiles.launch import LRU, cdiv, next_power_of_2, tma_describable
from tilecore.tiles.switches import generation
from tilecore.tiles import timed
from tilecore.tiles.schedule import stream_k_plan


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one GEMM runs. ``config`` is a configs.py row; ``grid`` the persistent programs, looping
    over ``units`` units of work (the tiles, or with ``stream_k`` tiles.schedule.stream_k_units)."""
    path: str  # "gluon" | "tl" | "cpu" | "reference"
    out_dtype: torch.dtype
    config: dict = dataclasses.field(default_factory=dict)
    grid: tuple[int, ...] = ()
    units: int = 0
    stream_k: bool = False
    has_bias: bool = False
    scales: int = 0  # fp8 scales: 0 none, else 1 + (per row of A) + 2 * (per column of B)
    b_t: bool = False  # gluon: B goes in as B^T [N, K] (K-major), which fp8 wgmma requires
    copy_a: bool = False  # gluon: A (B) is first copied into a layout TMA can describe
    copy_b: bool = False
    operand_dtype: torch.dtype | None = None  # tl in the interpreter, cpu: A and B converted to this first
    bias_dtype: torch.dtype | None = None  # ... and the bias to this
    c_dtype: torch.dtype | None = None  # the kernel writes C in this dtype, rounded once to out_dtype after
    notice: str | None = None  # printed once: why a slower path serves these operands
    block: tuple[int, int] = (0, 0)  # cpu: rows of A and columns of B converted at a time


NOT_HOPPER = ("gemm: the TMA + wgmma kernel needs NVIDIA Hopper (sm_90), and this GPU is older than Hopper, newer "
              "or not NVIDIA's: running the portable tl GEMM kernel, which is slower")
FP8_UPCAST = ("gemm_fp8: this GPU has no e4m3 tensor cores (NVIDIA from sm_89 has them): the operands are converted "
              "exactly to float16 and multiplied there by the tl GEMM kernel (slower, same result)")


def scales_code(scale_a: torch.Tensor, scale_b: torch.Tensor) -> int:
    """The kernels' SCALES: 1 + (per-row scales of A) + 2 * (per-column scales of B)."""
    return 1 + int(scale_a.numel() > 1) + 2 * int(scale_b.numel() > 1)


def plan(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype, bias: torch.Tensor | None = None,
         scales: tuple[torch.Tensor, torch.Tensor] | None = None, path: str | None = None,
         config: dict | None = None) -> Plan:
    """The plan of C = A B (+ bias) [* scales] for checked operands (op.py checks them): A [M, K],
    B [K, N], ``scales`` (scale_a, scale_b) for fp8. ``path`` ("gluon", "tl") and ``config`` (a row
    like configs.py's) replace the measured choice (tests, probes); "gluon" still needs Hopper and
    operands it can take."""
    M, K = a.shape
    N = b.shape[1]
    fp8 = scales is not None
    common = dict(out_dtype=out_dtype, has_bias=bias is not None, scales=scales_code(*scales) if fp8 else 0)
    if dispatch.backend_for(a.device) == "reference":
        return _cpu(a, M, N, K, out_dtype, bias, fp8)
    if M == 0 or N == 0 or K == 0:
        return Plan("reference", out_dtype)  # nothing to multiply: zeros (+ bias)
    if dispatch.interpreted(a.device):
        # the interpreter's bf16 dot and fp8 types are not faithful: compute from exact upcasts
        # (bf16 -> fp32, e4m3 -> fp16) and round once at the end
        operand = torch.float32 if a.dtype == torch.bfloat16 else torch.float16 if fp8 else a.dtype
        c_dtype = torch.float16 if operand == torch.float16 and out_dtype == torch.float16 else torch.float32
        return _tl(a, M, N, K, config or configs.TL_CPU, common, operand_dtype=operand, bias_dtype=torch.float32,
                   c_dtype=c_dtype)
    if fp8 and not dispatch.fp8_ok(a.device):
        # no e4m3 tensor cores (sm_80, sm_86, ROCm), where Triton refuses the type: e4m3 converts to
        # float16 exactly (3 mantissa bits, exponents -9..8), so the tl kernel multiplies the exact
        # upcasts, accumulates in float32 and scales as on fp8 GPUs
        return _tl(a, M, N, K, config or configs.TL_GPU, common, operand_dtype=torch.float16, notice=FP8_UPCAST)
    if not dispatch.gluon_ok(a.device):  # not Hopper, or an untested triton on Hopper (dispatch has warned once)
        notice = None if dispatch.is_hopper(a.device) else NOT_HOPPER
        return _tl(a, M, N, K, config or configs.TL_GPU, common, notice=notice)
    form = None if path == "tl" else _tma_form(a, b, out_dtype, fp8)
    if form is None:
        notice = None if path == "tl" else ("gemm: operands that TMA cannot describe (strides or sizes not "
                                            "multiples of 16 bytes) run the tl kernel, which is slower")
        return _tl(a, M, N, K, config or configs.TL_GPU, common, notice=notice)
    cfg = config or table_config(K, fp8)
    if config is None and configs.NAPKIN_TOPK and (not fp8 or configs.NAPKIN_TOPK_FP8):
        cfg = timed_config(a, b, out_dtype, bias, scales, form, configs.NAPKIN_TOPK)[0]
    copy_a, b_t, copy_b = form
    return Plan("gluon", config=cfg, **_schedule(a, M, N, K, cfg), b_t=b_t, copy_a=copy_a, copy_b=copy_b,
                c_dtype=out_dtype, **common)


def operand_form(a, b, out_dtype, fp8: bool):
    """The Gluon kernel's operand form for A and B (copy A, B as B^T, copy B), or None where it cannot
    take them (timed_config's key)."""
    return _tma_form(a, b, out_dtype, fp8)


def _tma_form(a, b, out_dtype, fp8: bool):
    """How the Gluon kernel takes A and B: (copy A, B as B^T, copy B), or None where it can't.

    B^T means B goes in as its transpose [N, K] (K-major), which fp8 wgmma requires. Operands in
    another layout are copied once into one TMA can read; sizes whose rows are not a multiple of
    16 bytes leave it to the tl kernel."""
    M, K = a.shape
    N = b.shape[1]
    if (N * out_dtype.itemsize) % 16 or (K * a.element_size()) % 16:
        return None
    copy_a = not tma_describable(a)
    if fp8:
        return copy_a, True, not tma_describable(b.t())
    if tma_describable(b):
        return copy_a, False, False
    if tma_describable(b.t()):
        return copy_a, True, False
    if (N * b.element_size()) % 16 == 0:
        return copy_a, False, True
    return None


def _schedule(a, M, N, K, cfg) -> dict:
    """The persistent grid over the tiles, or over stream-K units where ``cfg["stream_k"]`` takes them."""
    BM, BN, BK = cfg["block"]
    tiles = cdiv(M, BM) * cdiv(N, BN)
    programs, units = stream_k_plan(tiles, cdiv(K, BK), a.device, cfg.get("stream_k", "auto"))
    return dict(grid=(programs,), units=units or tiles, stream_k=units > 0)


def _tl(a, M, N, K, cfg, common, *, c_dtype=None, **fields) -> Plan:
    return Plan("tl", config=cfg, **_schedule(a, M, N, K, cfg), c_dtype=c_dtype or common["out_dtype"], **fields,
                **common)


def _cpu(a, M, N, K, out_dtype, bias, fp8: bool) -> Plan:
    """torch's CPU matmul: in the operands' dtype where the CPU multiplies it natively and nothing
    needs more precision than that dtype keeps (a 16-bit C from 16-bit operands and bias), else
    upcast to float32 a block at a time (float32 operands convert nothing: one block)."""
    dtype = a.dtype
    native = not fp8 and dispatch.cpu_native_matmul(dtype) and (
        dtype == torch.float32 or (out_dtype == dtype and (bias is None or bias.dtype == dtype)))
    if native:
        return Plan("cpu", out_dtype, block=(M, N))
    # blocks of A [bm, K] and B [K, bn] and their product [bm, bn] of at most about CPU_BLOCK_ELEMS
    # each (a minimum of 64 rows or columns): B converts once, A once per column block. fp8 B converts
    # whole: torch converts e4m3 at ~20 ns an element on this CPU (16-bit: ~3), too slow to repeat
    budget = configs.CPU_BLOCK_ELEMS
    bn = N if fp8 else min(N, max(64, budget // max(K, 1)))
    bm = min(M, max(64, budget // max(K, bn, 1)))
    return Plan("cpu", out_dtype, block=(max(bm, 1), max(bn, 1)), operand_dtype=torch.float32,
                scales=1 if fp8 else 0, has_bias=bias is not None)


# ---------------------------------------------------------------------------------------------------
# the Gluon rows from the napkin's ranking, timed (issue 36 part 4; on where configs.NAPKIN_TOPK > 0)

SMEM_PER_BLOCK = 227 * 1024  # Hopper's opt-in shared memory a block (sm_90)
SMEM_RESERVE = 1024  # barriers and the template's bookkeeping beside the ring and the epilogue buffer
MAX_ACC_REGS = 128  # fp32 accumulator registers a thread: past it the operands and addresses spill


def table_config(K: int, fp8: bool) -> dict:
    """The measured table's Gluon row (configs.py) for this K and dtype."""
    return configs.GLUON_FP8 if fp8 else configs.GLUON_BF16_SMALL_K if K <= configs.SMALL_K else configs.GLUON_BF16


def gluon_row(bm: int, bn: int, bk: int, stages: int, consumers: int, warps: int) -> dict:
    """A configs.py Gluon row for a configs.GLUON_CANDIDATES entry (the table's group order, epilogue
    buffer and stream-K rule)."""
    return dict(block=(bm, bn, bk), stages=stages, group_m=8, num_warps=warps, epilogue_bytes=65536,
                consumers=consumers, stream_k="auto")


def gluon_legal(cfg: dict, operand_bytes: int, out_bytes: int, smem: int = SMEM_PER_BLOCK) -> str | None:
    """Why the Gluon kernel cannot take ``cfg`` for these element sizes, or None where it can: TMA
    boxes of at most 256 a side with the K box within the 128-byte swizzle, 64-row warpgroups in
    each consumer, the accumulator within MAX_ACC_REGS a thread, the ring and the epilogue buffer
    within ``smem``."""
    BM, BN, BK = cfg["block"]
    consumers = cfg.get("consumers", 1)
    warps = cfg["num_warps"] // consumers  # a consumer partition's
    if max(BM, BN) > 256 or BK * operand_bytes > 128:
        return f"a TMA box past 256 rows or a K box past the 128-byte swizzle ({BM}x{BN}x{BK})"
    if warps % 4 or BM % (consumers * 16 * warps) or (BM // consumers) % 64:
        return f"{BM} rows do not split into 64-row warpgroups over {consumers} consumer(s) of {warps} warps"
    if BM // consumers * BN // (32 * warps) > MAX_ACC_REGS:
        return f"a {BM // consumers}x{BN} accumulator over {warps} warps holds more than {MAX_ACC_REGS} registers a thread"
    ring = cfg["stages"] * (BM + BN) * BK * operand_bytes
    epilogue = min(cfg.get("epilogue_bytes") or BM * BN * out_bytes, BM * BN * out_bytes)
    if ring + epilogue + SMEM_RESERVE > smem:
        return f"{cfg['stages']} stages ({ring} bytes) and the epilogue ({epilogue}) exceed {smem} bytes of shared memory"
    return None


def napkin_dtype(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float8_e4m3fn: "fp8"}[dtype]


def napkin_configs(M: int, N: int, K: int, dtype: torch.dtype, out_dtype: torch.dtype, top_k: int,
                   gpu: str = "h100") -> list[dict]:
    """The Gluon rows to time for an M x N x K product: the napkin's ``top_k`` fastest of
    configs.GLUON_CANDIDATES that the kernel takes (gluon_legal), in its order, then the table's row
    where it is not among them. Pure Python: the same list on every machine (the napkin's ``gpu``
    preset: "h100" or "h200")."""
    from tilecore.napkin.engine import rank_gemm_configs

    fp8 = dtype == torch.float8_e4m3fn
    rows = [gluon_row(*c) for c in configs.GLUON_CANDIDATES]
    rows = [r for r in rows if gluon_legal(r, dtype.itemsize, out_dtype.itemsize) is None]
    # the napkin knows warpgroups, not how they are partitioned: rows alike but for that tie, and
    # keep the candidates' order (rank_gemm_configs sorts stably)
    napkin = lambda r: (*r["block"], r["stages"], r["num_warps"] // 4)
    ranked = rank_gemm_configs(M, N, K, napkin_dtype(dtype), gpu, candidates=list(dict.fromkeys(map(napkin, rows))))
    order = {(c.block, c.stages, c.warpgroups): i for i, c in enumerate(ranked)}
    rows = sorted((r for r in rows if (r["block"], r["stages"], r["num_warps"] // 4) in order),
                  key=lambda r: order[r["block"], r["stages"], r["num_warps"] // 4])
    picked = rows[:max(top_k, 0)]
    table = table_config(K, fp8)
    if table not in picked:
        picked.append(table)
    return picked


def shape_bucket(M: int, N: int, K: int) -> tuple[int, int, int]:
    """The sizes a timed pick serves: M, N and K rounded up to powers of two."""
    return next_power_of_2(M), next_power_of_2(N), next_power_of_2(K)


_PICKS = LRU(256)  # (bucket, dtypes, bias, scales, operand form, device, generation) -> (config, {candidate: ms})
TIMER = "gemm"  # the name launch.py registers launch.time_plans under (tiles.timed: plan.py never imports launch.py)


def use_timer(timer) -> None:
    """Register ``timer(plans, a, b, bias, scales, rep_ms, clock) -> [ms]`` as timed_config's measurement
    (launch.py registers launch.time_plans when it is imported; until then the switch plans the table)."""
    timed.register(TIMER, timer)


def timed_config(a, b, out_dtype, bias, scales, form, top_k: int) -> tuple[dict, dict]:
    """(the Gluon row to run, its candidates' times in ms by position): napkin_configs' candidates,
    each launched once to compile and then timed (launch.time_plans, registered in tiles.timed: about
    configs.NAPKIN_TIMED_MS of launches by the dtype's clock, configs.NAPKIN_CLOCK / NAPKIN_CLOCK_FP8), the
    fastest kept for the shape's bucket on this device. By the clock "agree", agreed_pick: the table's row
    unless do_bench and the CUDA-graph clock both time a candidate faster; the times are then
    (do_bench ms, graph ms or None) pairs.

    Only a CUDA device is timed. Everywhere else the table's row, so that a plan made without a GPU
    is deterministic and the same with the switch on or off: a meta device standing for a GPU
    (dispatch.pretend: portability's compiles), CPU tensors planned as a GPU's (tests), a CUDA graph
    capture (not kept), a process where launch.py has not registered its timer yet. A candidate that
    fails to compile or launch is left out (the table's row if all do)."""
    M, K = a.shape
    N = b.shape[1]
    fp8 = scales is not None
    table = table_config(K, fp8)
    if not _timeable(a.device):
        return table, {}
    key = (shape_bucket(M, N, K), a.dtype, out_dtype, bias is not None and bias.dtype,
           scales_code(*scales) if fp8 else 0, form, a.device, generation())  # (candidates and clock read configs)
    hit = _PICKS.get(key)
    if hit is not None:
        return hit
    timer = timed.runner(TIMER)
    if dispatch.capturing(a.device) or timer is None:
        return table, {}
    rows = napkin_configs(M, N, K, a.dtype, out_dtype, top_k, napkin_gpu(a.device))
    copy_a, b_t, copy_b = form
    common = dict(out_dtype=out_dtype, has_bias=bias is not None, scales=scales_code(*scales) if fp8 else 0)
    plans = [Plan("gluon", config=r, **_schedule(a, M, N, K, r), b_t=b_t, copy_a=copy_a, copy_b=copy_b,
                  c_dtype=out_dtype, **common) for r in rows]
    clock = configs.NAPKIN_CLOCK_FP8 if fp8 else configs.NAPKIN_CLOCK
    if clock == "agree":
        best, times = agreed_pick(timer, plans, a, b, bias, scales, configs.NAPKIN_TIMED_MS, rows.index(table))
    else:
        times = timer(plans, a, b, bias, scales, configs.NAPKIN_TIMED_MS, clock)
        best = timed.fastest(times)
    picked = (rows[best] if best is not None else table, dict(enumerate(times)))
    _PICKS.put(key, picked)
    return picked


AGREE_CLOCKS = ("do_bench", "graph")  # configs clock "agree": a candidate must beat the table by both


def agreed(by_clock: list[list[float]], table: int) -> int | None:
    """The pick where several clocks must agree (``by_clock``: each clock's times of the same candidates,
    in order): among the candidates that every clock times faster than the table's row (position
    ``table``), the one whose slowest ratio to the table is least (the first of equals); the table where
    none is. A candidate a clock did not time (inf: failed, or left out) never beats the table. Where the
    table itself failed under a clock, the first clock's fastest (timed.fastest; None where all failed)."""
    if not all(times[table] < float("inf") for times in by_clock):
        return timed.fastest(by_clock[0])
    worst = [max(times[i] / times[table] for times in by_clock) for i in range(len(by_clock[0]))]
    best = min(range(len(worst)), key=lambda i: (worst[i], i != table, i))
    return best if worst[best] < 1.0 else table


def agreed_pick(timer, plans, a, b, bias, scales, rep_ms: float, table: int) -> tuple[int | None, list]:
    """configs clock "agree" (issue 36): the table's row unless do_bench (an L2 flush before each
    launch; may read host time on short kernels) and the CUDA-graph clock (GPU time alone; operands that fit
    L2 stay there) both time a candidate faster. Every candidate by do_bench first; by the graph only the table
    and the candidates do_bench times faster than it (none: the table, no graph timed). (position picked,
    [(do_bench ms, graph ms or None)] by position)."""
    first = timer(plans, a, b, bias, scales, rep_ms, AGREE_CLOCKS[0])
    inf = float("inf")
    if not first[table] < inf:  # the table failed: do_bench's fastest (None: every candidate failed)
        return timed.fastest(first), [(t, None) for t in first]
    faster = [i for i, t in enumerate(first) if i != table and t < first[table]]
    if not faster:
        return table, [(t, None) for t in first]
    timed_by_graph = [table] + faster
    second = dict(zip(timed_by_graph, timer([plans[i] for i in timed_by_graph], a, b, bias, scales, rep_ms,
                                            AGREE_CLOCKS[1])))
    graph = [second.get(i, inf) for i in range(len(plans))]
    return agreed([first, graph], table), [(t, second.get(i)) for i, t in enumerate(first)]


def _timeable(device) -> bool:
    return device.type == "cuda"


def napkin_gpu(device) -> str:
    """The napkin preset of a Hopper device (dispatch.properties names it): "h200" or "h100"."""
    if device.type != "cuda":  # a meta device inside dispatch.pretend: the Hopper preset
        return "h100"
    return "h200" if "H200" in dispatch.properties(device).name.upper() else "h100"
