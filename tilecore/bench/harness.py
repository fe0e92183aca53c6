"""The benchmark harness: every op is measured the same way.

* Times are ``triton.testing.do_bench`` medians after warm-up (it also flushes L2 before each call),
  the median of REPEATS repetitions that take a case's series in turn, so a clock that drifts
  during a run moves every series of a case alike.
* Inputs that would fit in L2 are rotated among several copies, so repeated calls measure HBM.
* Every figure is also given as a ratio to a ceiling measured in the same run: the device-to-device
  copy bandwidth for memory-bound ops, cuBLAS bf16 matmul for compute-bound ones.
* Results carry the device, versions, date and timing mode, and are written as JSON and a PNG plot
  (tilecore.bench.plot draws it, and redraws committed JSONs: ``python -m tilecore.bench.plot``).
"""
from __future__ import annotations

import itertools
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import torch

from tilecore import env
from tilecore.bench.case import Case, Metric, Suite  # noqa: F401 (Case and Suite: re-exported)


# ---------------------------------------------------------------------------------------------
# timing


def median_ms(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 100, grad_to_none=None) -> float:
    """Median time of ``fn`` in milliseconds, after warm-up, through triton.testing.do_bench
    (``grad_to_none``: tensors whose .grad it resets between calls, for a backward)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median",
                                         grad_to_none=grad_to_none))


def interleaved_ms(fns: dict[str, Callable[[], object]], repeats: int, **timing) -> dict[str, list[float]]:
    """Every fn's median_ms (``timing``: its keywords), ``repeats`` times taking the fns in turn, so
    that clock drift (the H100's moves 5-25% within a process) reaches them all alike."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(median_ms(fn, **timing))
    return times


def ratios_to(reference: str, fns: dict[str, Callable[[], object]], flops: float, repeats: int,
              **timing) -> dict[str, dict]:
    """interleaved_ms of ``fns`` as TFLOP/s (``flops`` a call), and for each fn the median of its
    per-round ratio to the ``reference`` entry's figure of the same round, with their min and max
    (a ratio taken within a round is steadier than a ratio of medians when the clock drifts)."""
    ms = interleaved_ms(fns, repeats, **timing)
    tf = {name: [flops / t / 1e9 for t in ts] for name, ts in ms.items()}
    out = {}
    for name, xs in tf.items():
        ratios = [x / r for x, r in zip(xs, tf[reference])]
        out[name] = dict(tflops=statistics.median(xs), ratio=statistics.median(ratios), lo=min(ratios),
                         hi=max(ratios), all=xs)
    return out


def graph_replay(fn: Callable[[], object], *, target_ms: float = 1.0, max_calls: int = 64) -> tuple[Callable[[], object], int]:
    """(replay, calls): a CUDA graph of enough back-to-back calls of ``fn`` for ~``target_ms`` (at most
    ``max_calls``) and their number; the replay's time over ``calls`` is one call's GPU time.
    (A graph of one call would also measure the replay's launch gap, ~4-5 us on the H100: a quarter
    of a 4096 x 4096 x 64 GEMM.)"""
    def graph_of(calls: int):
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(calls):
                fn()
        torch.cuda.synchronize()
        return g

    once = median_ms(graph_of(1).replay)
    calls = max(1, min(max_calls, round(target_ms / once)))
    graph = graph_of(calls)

    def replay():
        # the graph reads the memory of the inputs ``fn`` held when it was captured: ``fn`` must live
        # as long as the replay (a graph that outlived its inputs read freed memory: illegal addresses)
        graph.replay()
        return fn
    return replay, calls


def graph_median_ms(fn: Callable[[], object], *, target_ms: float = 1.0, max_calls: int = 64) -> float:
    """GPU time of one call of ``fn`` in milliseconds, without its host time: graph_replay's median_ms
    over its calls."""
    replay, calls = graph_replay(fn, target_ms=target_ms, max_calls=max_calls)
    return median_ms(replay) / calls


def host_us(fn: Callable[[], object], *, calls: int = 200, rounds: int = 1, warmup: int = 5) -> float:
    """Host time of one call of ``fn`` in microseconds: ``calls`` calls back to back with no sync
    between them (the GPU's work queues behind them), after ``warmup`` calls; the best of ``rounds``
    rounds (the lent hosts are noisy)."""
    import time

    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
    torch.cuda.synchronize()
    return best


def l2_bytes() -> int:
    info = env.gpu_info()
    return info["l2_bytes"] if info and info["l2_bytes"] else 64 * 2**20


def rotating(make_set: Callable[[], tuple], bytes_per_set: int, *, cover: int = 4,
             max_sets: int = 64) -> Callable[[], tuple]:
    """Return a function giving the next of several input sets, round-robin.

    Enough sets are made that together they cover ``cover`` times the L2 cache, so a call never
    finds its inputs in L2 from the call before.
    """
    count = 1 if bytes_per_set >= cover * l2_bytes() else min(max_sets, math.ceil(cover * l2_bytes() / max(bytes_per_set, 1)))
    sets = [make_set() for _ in range(count)]
    cycle = itertools.cycle(sets)
    return lambda: next(cycle)


# ---------------------------------------------------------------------------------------------
# ceilings, measured in the same run as the figures they judge


@dataclass
class Ceiling:
    name: str
    value: float
    unit: Metric


def copy_ceiling(nbytes: int = 2**30) -> Ceiling:
    """Device-to-device copy bandwidth, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    size = f"{nbytes / 2**30:g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:g} MiB"
    return Ceiling(f"copy {size} (torch copy_)", 2 * nbytes / ms / 1e6, "GB/s")


def matmul_ceiling(size: int = 8192, dtype: torch.dtype = torch.bfloat16) -> Ceiling:
    """cuBLAS matmul rate through torch.matmul at size^3, on random data."""
    a = torch.randn(size, size, dtype=dtype, device="cuda")
    b = torch.randn(size, size, dtype=dtype, device="cuda")
    ms = median_ms(lambda: torch.matmul(a, b))
    return Ceiling(f"torch.matmul {str(dtype).removeprefix('torch.')} {size}^3 (cuBLAS)",
                   2 * size**3 / ms / 1e9, "TFLOP/s")


def scaled_mm_ceiling(size: int = 8192) -> Ceiling:
    """cuBLAS fp8 (e4m3) matmul rate through torch._scaled_mm at size^3, row-wise scales, bf16 out."""
    a = torch.randn(size, size, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(size, size, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as it requires
    sa = torch.rand(size, 1, device="cuda") + 0.5
    sb = torch.rand(1, size, device="cuda") + 0.5
    ms = median_ms(lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16))
    return Ceiling(f"torch._scaled_mm e4m3 {size}^3 (cuBLAS)", 2 * size**3 / ms / 1e9, "TFLOP/s")


CEILINGS: dict[str, Callable[[], Ceiling]] = {"copy": copy_ceiling, "matmul": matmul_ceiling,
                                              "matmul-fp8": scaled_mm_ceiling}


# ---------------------------------------------------------------------------------------------
# results (a suite and its cases: tilecore.bench.case; the suites: tilecore.bench.suites)


@dataclass
class Row:
    params: dict
    series: str
    ms: float
    value: float  # in the suite's metric
    ratio: float  # value / ceiling


@dataclass
class Result:
    suite: str
    metric: Metric
    x: str
    ceiling: Ceiling
    meta: dict
    rows: list[Row] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "suite": self.suite,
            "metric": self.metric,
            "x": self.x,
            "ceiling": vars(self.ceiling),
            "meta": self.meta,
            "rows": [vars(r) for r in self.rows],
        }


def progress(done: int, total: int, label: str) -> None:
    width = 30
    filled = int(width * done / max(total, 1))
    end = "\n" if done == total else ""
    print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label[:60]:<60}", end=end,
          file=sys.stderr, flush=True)


REPEATS = 3


def run_suite(suite: Suite, *, quick: bool = False) -> Result:
    """Measure the ceiling, then every case of ``suite``: its series built together and timed in
    turn, REPEATS times (each figure the median of its repetitions)."""
    ceiling = CEILINGS[suite.ceiling]()
    result = Result(suite.name, suite.metric, suite.x, ceiling,
                    {**env.metadata(), "timing": suite.timing, "describe": suite.describe})
    cases = suite.cases(quick)
    for i, case in enumerate(cases):
        progress(i, len(cases), " ".join(f"{k}={v}" for k, v in case.params.items()))
        fns = {}
        for name, build in case.series.items():
            try:
                fns[name] = build()
            except ImportError:  # a peer not installed here
                continue
        calls = dict.fromkeys(fns, 1)
        if suite.timing == "graph":
            for name in fns:
                fns[name], calls[name] = graph_replay(fns[name])
        times = interleaved_ms(fns, REPEATS, warmup_ms=10, rep_ms=50)
        for name, ts in times.items():
            ms = sorted(ts)[len(ts) // 2] / calls[name]
            value = case.bytes / ms / 1e6 if suite.metric == "GB/s" else case.flops / ms / 1e9
            result.rows.append(Row(case.params, name, ms, value, value / ceiling.value))
        del fns
        torch.cuda.empty_cache()
    progress(len(cases), len(cases), "done")
    return result


# ---------------------------------------------------------------------------------------------
# output: table, JSON, PNG


def table(result: Result) -> str:
    keys = list(result.rows[0].params) if result.rows else []
    head = keys + ["series", "ms", result.metric, "% of ceiling"]
    body = [[str(r.params[k]) for k in keys] + [r.series, f"{r.ms:.4f}", f"{r.value:,.0f}", f"{100 * r.ratio:.1f}"]
            for r in result.rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))
    lines = [f"{result.suite}: ceiling {result.ceiling.name} = {result.ceiling.value:,.0f} {result.ceiling.unit}",
             fmt(head), fmt(["-" * w for w in widths])] + [fmt(b) for b in body]
    return "\n".join(lines)


def device_slug(meta: dict) -> str:
    name = (meta.get("gpu") or {}).get("name", "cpu")
    name = re.sub(r"^nvidia\s+", "", name.lower())
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-")


def save(result: Result, root: Path) -> tuple[Path, Path]:
    """Write ``<root>/<device>/<suite>.json`` and ``.png``; return both paths."""
    folder = Path(root) / device_slug(result.meta)
    folder.mkdir(parents=True, exist_ok=True)
    json_path = folder / f"{result.suite}.json"
    json_path.write_text(json.dumps(result.to_json(), indent=1) + "\n")
    png_path = folder / f"{result.suite}.png"
    plot(result, png_path)
    return json_path, png_path


def plot(result: Result, path: Path) -> None:
    """The suite's PNG, drawn from its JSON form by tilecore.bench.plot (which redraws committed
    results the same way: ``python -m tilecore.bench.plot``)."""
    from tilecore.bench import plot as plotting

    plotting.plot(plotting.Results.from_json(result.to_json()), path, describe=result.meta.get("describe"))


def names(values: Iterable) -> str:
    return ", ".join(sorted(values))
