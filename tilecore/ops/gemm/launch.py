"""One launch of a GEMM plan (plan.py): C = A B (+ bias) [* scales] on the plan's path."""
from __future__ import annotations

import importlib

import torch

from tilecore import dispatch
from tilecore.ops.gemm import plan as _plan, reference
from tilecore.ops.gemm.plan import Plan
from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.launch import CachedLaunch, KeyedLaunch, TmaOperand
from tilecore.tiles.schedule import stream_k_buffers

# the Gluon kernel through tiles.launch's fast path: compiled kernels cached by everything Triton
# specializes them on, so that later launches skip its argument binding and cache lookup (which cost
# more than a 4096^3 GEMM's run time on a slow host, notes/gemm/README.md, v3)
_GLUON_GEMM = CachedLaunch(lambda: importlib.import_module("tilecore.ops.gemm.gluon_kernels").gemm_kernel)
_UNUSED: dict = {}  # per device: what whole-tile launches pass for the stream-K workspace and flags


def launch(plan: Plan, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
           scales: tuple[torch.Tensor, torch.Tensor] | None = None, *, out: torch.Tensor | None = None,
           key: tuple | None = None):
    """Run ``plan`` (plan.plan of these operands) and return C. ``out``: an [M, N] tensor of the plan's
    out_dtype to write C into (any strides on the tl path; one TMA can describe on the Gluon path).
    ``key``: the operands' signature (tiles.launch.signature, without ``out``), which the plan is a
    function of: the Gluon launch is looked up by it (CachedLaunch.launch_keyed)."""
    M, N = a.shape[0], b.shape[1]
    if plan.notice:
        dispatch.notice_once(plan.notice)
    if plan.path == "cpu":
        return _cpu(plan, a, b, bias, scales, out)
    if plan.path == "reference":
        c = reference.gemm(a, b, bias, plan.out_dtype) if scales is None else \
            reference.gemm_fp8(a, b, *scales, plan.out_dtype)
        return c if out is None else out.copy_(c)
    if plan.operand_dtype is not None:
        a, b = a.to(plan.operand_dtype), b.to(plan.operand_dtype)
    if bias is not None:
        bias = bias.contiguous() if plan.bias_dtype is None else bias.to(plan.bias_dtype).contiguous()
    sa, sb = (s.float().reshape(-1).contiguous() for s in scales) if scales is not None else (None, None)
    c = out if out is not None and out.dtype == plan.c_dtype else \
        torch.empty(M, N, dtype=plan.c_dtype, device=a.device)
    if plan.path == "gluon":
        _gluon(plan, a, b, c, bias, sa, sb, None if out is not None else key)
    else:
        _tl(plan, a, b, c, bias, sa, sb)
    if c is out:
        return out
    if out is not None:
        return out.copy_(c)
    return c if c.dtype == plan.out_dtype else c.to(plan.out_dtype)


def _stream_k_buffers(plan: Plan, device, slots: int, slot_elems: int):
    """(workspace, flags): the stream's buffers for a stream-K launch, placeholders of the right types
    for whole tiles."""
    if plan.stream_k:
        return stream_k_buffers(device, slots, slot_elems)
    if device not in _UNUSED:
        _UNUSED[device] = (torch.empty(1, dtype=torch.float32, device=device),
                           torch.zeros(1, dtype=torch.int32, device=device))
    return _UNUSED[device]


def _gluon(plan: Plan, a, b, c, bias, scale_a, scale_b, key=None):
    """``num_warps`` consumer warps in all: with ``consumers=2`` two partitions of half as many, each
    taking half of every tile's rows (and its own stream-K workspace slot)."""
    cfg = plan.config
    M, K = a.shape
    N = c.shape[1]
    BM, BN, BK = cfg["block"]
    consumers = cfg.get("consumers", 1)
    rows = BM // consumers  # each consumer's share of a tile, and of the epilogue buffer
    slice_n = BN if cfg.get("epilogue_bytes") is None else \
        min(BN, max(16, cfg["epilogue_bytes"] // (BM * c.element_size())))
    if plan.copy_a:
        a = a.contiguous()
    if plan.b_t:
        b = b.t()
    if plan.copy_b:
        b = b.contiguous()
    workspace, flags = _stream_k_buffers(plan, a.device, plan.grid[0] * consumers, rows * BN)
    args = (TmaOperand(a, [BM, BK]), TmaOperand(b, [BN, BK] if plan.b_t else [BK, BN]),
            TmaOperand(c, [rows, slice_n]), M, N, K, bias if plan.has_bias else c,
            scale_a if scale_a is not None else c, scale_b if scale_b is not None else c,
            workspace, flags, plan.units)
    options = dict(num_warps=cfg["num_warps"] // consumers, B_T=plan.b_t, GROUP_M=cfg["group_m"],
                   HAS_BIAS=plan.has_bias, SCALES=plan.scales, STAGES=cfg["stages"], CONSUMERS=consumers,
                   STREAM_K=plan.stream_k)
    if key is None:
        _GLUON_GEMM[plan.grid](*args, **options)
    else:  # C, the workspace and the flags are fresh or internal buffers: the key determines the rest
        with dispatch.on_device(a.device):
            _GLUON_GEMM.launch_keyed(key, plan.grid, args, options)


class GluonGemm:
    """gemm's and gemm_fp8's eager call for one launch key on the Gluon path (issue 31's host time): the
    kernel's KeyedLaunch with A's, B's and C's TMA views fixed by the key (each descriptor encoded once per base
    address; B^T described from B's own memory, no view a call), M, N, K, the schedule and the constexprs, made from
    the key's plan; a call allocates C, takes the stream's stream-K buffers where the plan has a tail, and launches:
    what ``launch(plan, a, b, bias, scales, key=key)`` launches, without its per-call reads of the plan.

    ``of`` gives False (the general path for the key) where the plan would first copy, convert or cast (copy_a /
    copy_b, an operand dtype, a bias not contiguous or converted, scales not contiguous float32, C in another dtype
    than the output) or A is not the matrix the key's call passed (leading batch dimensions: the op folds them)."""

    __slots__ = ("launch", "shape", "dtype", "device", "mnk", "has_bias", "units", "stream_k")

    @classmethod
    def of(cls, plan: Plan, a, b, bias, scales, key):
        if plan.path != "gluon" or plan.operand_dtype is not None or plan.copy_a or plan.copy_b or a.dim() != 2 \
                or plan.c_dtype != plan.out_dtype or plan.notice \
                or (bias is not None and (plan.bias_dtype is not None or not bias.is_contiguous())) \
                or (scales is not None and any(s.dtype != torch.float32 or not s.is_contiguous() for s in scales)):
            return False
        self = cls()
        cfg = plan.config
        M, K = a.shape
        N = b.shape[1]
        BM, BN, BK = cfg["block"]
        consumers = cfg.get("consumers", 1)
        rows = BM // consumers
        slice_n = BN if cfg.get("epilogue_bytes") is None else \
            min(BN, max(16, cfg["epilogue_bytes"] // (BM * (torch.finfo(plan.c_dtype).bits // 8))))
        b_block = [BN, BK] if plan.b_t else [BK, BN]
        makers = {0: lambda t: TmaOperand(t, [BM, BK]),
                  1: (lambda t: TmaOperand(t.t(), b_block)) if plan.b_t else (lambda t: TmaOperand(t, b_block)),
                  2: lambda t: TmaOperand(t, [rows, slice_n])}
        options = dict(num_warps=cfg["num_warps"] // consumers, B_T=plan.b_t, GROUP_M=cfg["group_m"],
                       HAS_BIAS=plan.has_bias, SCALES=plan.scales, STAGES=cfg["stages"], CONSUMERS=consumers,
                       STREAM_K=plan.stream_k)
        self.launch = KeyedLaunch(_GLUON_GEMM, key, plan.grid, options, operands=makers)
        self.shape, self.dtype, self.device, self.mnk = (M, N), plan.c_dtype, a.device, (M, N, K)
        self.has_bias, self.units = plan.has_bias, plan.units
        # (slots, slot elements) of the stream's stream-K buffers, or the whole-tile placeholders
        self.stream_k = (plan.grid[0] * consumers, rows * BN) if plan.stream_k else None
        if self.stream_k is None:
            _stream_k_buffers(plan, a.device, 0, 0)  # (the device's placeholders made now)
        return self

    def __call__(self, a, b, bias=None, scales=None):
        c = a.new_empty(self.shape, dtype=self.dtype)  # (a's device, the key's: ~1 us under torch.empty(device=))
        workspace, flags = _UNUSED[self.device] if self.stream_k is None else \
            stream_k_buffers(self.device, *self.stream_k)
        sa, sb = (c, c) if scales is None else scales
        self.launch((a, b, c, *self.mnk, bias if self.has_bias else c, sa, sb, workspace, flags, self.units))
        return c


def recipe(plan: Plan, a, b, bias=None, scales=None, key=None):
    """The key's GluonGemm, or False (the general path) where it takes none or OP_RECIPES is off."""
    if key is None or not tiles_launch.OP_RECIPES:
        return False
    return GluonGemm.of(plan, a, b, bias, scales, key)


def _tl(plan: Plan, a, b, c, bias, scale_a, scale_b):
    from tilecore.ops.gemm.kernels import gemm_kernel

    cfg = plan.config
    M, K = a.shape
    N = c.shape[1]
    BM, BN, BK = cfg["block"]
    workspace, flags = _stream_k_buffers(plan, a.device, plan.grid[0], BM * BN)
    gemm_kernel[plan.grid](a, b, c, bias if plan.has_bias else c, scale_a if scale_a is not None else c,
                           scale_b if scale_b is not None else c, M, N, K, a.stride(0), a.stride(1), b.stride(0),
                           b.stride(1), c.stride(0), c.stride(1), workspace, flags, plan.units, BM=BM, BN=BN,
                           BK=BK, GROUP_M=cfg["group_m"], HAS_BIAS=plan.has_bias, SCALES=plan.scales,
                           STAGES=cfg["stages"], STREAM_K=plan.stream_k, num_warps=cfg["num_warps"])


def time_plans(plans: list[Plan], a, b, bias=None, scales=None, rep_ms: float = 20.0,
               clock: str = "do_bench") -> list[float]:
    """Each plan's GPU time in ms on these operands (CUDA), after one launch that compiles it. A plan
    whose compile, launch or capture raises gets inf (named once). plan.timed_config's measurement.

    ``clock`` "do_bench": triton.testing.do_bench's median over about ``rep_ms`` of launches, each
    after an L2 flush (the flush keeps the GPU busy while the host queues a launch, but a launch whose
    host path outlasts the flush is timed at its host time: fp8 M 256). "graph": the
    launch captured into a CUDA graph once (GRAPH_LAUNCHES of it, C preallocated), the graph replayed
    for about ``rep_ms``, each replay timed by CUDA events: the GPU's time alone (no host time; no
    L2 flush either, so operands that fit L2 stay there between launches)."""
    if clock not in ("do_bench", "graph"):
        raise ValueError(f"time_plans: clock {clock!r}: 'do_bench' or 'graph'")
    from triton.testing import do_bench

    times = []
    for p in plans:
        try:
            launch(p, a, b, bias, scales)
            if clock == "graph":
                out = torch.empty(a.shape[0], b.shape[1], dtype=p.out_dtype, device=a.device)
                times.append(graph_ms(lambda: launch(p, a, b, bias, scales, out=out), rep_ms))
            else:
                times.append(do_bench(lambda: launch(p, a, b, bias, scales), warmup=max(rep_ms / 4, 1),
                                      rep=rep_ms, return_mode="median"))
        except Exception as e:  # a candidate the compiler or the GPU refuses: the others still compete
            dispatch.notice_once(f"gemm: the candidate {p.config} failed ({type(e).__name__}: {str(e)[:200]}); "
                                 "left out of the timed pick")
            times.append(float("inf"))
    return times


GRAPH_LAUNCHES = 8  # launches in one captured graph: a replay's host cost spread over them


def graph_ms(fn, rep_ms: float, launches: int = GRAPH_LAUNCHES, cuda=torch.cuda) -> float:
    """ms of one ``fn()`` on the GPU: ``launches`` calls captured into one CUDA graph, the graph
    replayed back to back for about ``rep_ms`` (at least 3 replays, after one to warm up), each replay
    between two CUDA events; the median replay over ``launches``. ``fn`` must have run once outside
    the capture (compiled, its caches filled). Events bound each replay on the GPU's clock, so a host
    slower than the kernels only adds gaps between replays, never time inside one. ``cuda``: the
    torch.cuda API (a fake in the CPU tests)."""
    graph = cuda.CUDAGraph()
    with cuda.graph(graph, capture_error_mode="thread_local"):
        for _ in range(launches):
            fn()
    graph.replay()  # warm: the graph's first launch uploads it
    cuda.synchronize()
    start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    first = max(start.elapsed_time(end), 1e-3)
    replays = max(3, min(1000, int(rep_ms / first)))
    events = [(cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)) for _ in range(replays)]
    for s, e in events:
        s.record()
        graph.replay()
        e.record()
    events[-1][1].synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in events)
    del graph
    return ms[len(ms) // 2] / launches


_plan.use_timer(lambda *args: time_plans(*args))  # late-bound: a replaced time_plans is the one called


def _cpu(plan: Plan, a, b, bias, scales, out):
    """C on torch's CPU matmul (plan._cpu): as is, or A and B upcast to float32 a block at a time,
    accumulated in float32, scaled (fp8) and rounded once to out_dtype."""
    M, N = a.shape[0], b.shape[1]
    c = out if out is not None else torch.empty(M, N, dtype=plan.out_dtype, device=a.device)
    if plan.operand_dtype is None:  # the operands' own dtype: float32, or 16-bit where the CPU has it
        direct = c.dtype == a.dtype and (bias is None or bias.dtype == a.dtype)
        t = c if direct else None
        t = torch.mm(a, b, out=t) if bias is None else torch.addmm(bias.to(a.dtype), a, b, out=t)
        return c if t is c else c.copy_(t)
    f32 = torch.float32
    bm, bn = plan.block
    bias = None if bias is None else bias.to(f32)
    sa = sb = None
    if scales is not None:
        sa, sb = scales[0].reshape(-1, 1).to(f32), scales[1].reshape(1, -1).to(f32)
    for j in range(0, N, bn):
        bj = b[:, j:j + bn].to(f32)
        for i in range(0, M, bm):
            ai = a[i:i + bm].to(f32)
            cij = c[i:i + bm, j:j + bn]
            t = cij if cij.dtype == f32 else None
            t = torch.mm(ai, bj, out=t) if bias is None else torch.addmm(bias[j:j + bn], ai, bj, out=t)
            if sa is not None:
                t.mul_(sa if sa.numel() == 1 else sa[i:i + bm]).mul_(sb if sb.numel() == 1 else sb[:, j:j + bn])
            if t is not cij:
                cij.copy_(t)
    return c
