"""What every GPU script of experiments/ does, once: a float64 check of poisoned outputs with the error as a multiple
of the rounding floor, timing in interleaved rounds (triton's do_bench and do_bench_cudagraph, medians), host time a
call, and a JSON (device, versions, date) rewritten after each row, with a short table printed last.

    import sys; from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))      # the repository root
    from experiments.common.gpu_script import Run, poisoned, check, time_rounds

    run = Run("my_probe", deadline=55)           # JSON at $OUT/my_probe.json; run.say prints "[ 12.3 s] ..."
    out = poisoned(q)                            # NaN-filled like q: an element the kernel skips stays NaN
    kernel(q, k, v, out)
    run.row("check d128", **check(out, reference_float64, tol=2.5))     # err_over_floor, written, nonfinite_ok, pass
    run.row("time d128", **time_rounds({"ours": f, "peer": g}, rounds=3, graph=True))   # interleaved rounds
    run.attempt("a phase that may fail", phase)  # an exception becomes run.errors' entry (traceback printed), not the end
    run.finish(["name", "pass", "err_over_floor", "ours_ms", "peer_ms"])   # the table (<= 40 lines), the JSON

Each script states its own shapes, references and peers; this module holds no op. On a machine without CUDA (tests,
``--smoke`` runs) ``time_rounds`` times by the host clock and leaves graph times out.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
import traceback
from pathlib import Path

import torch

from tilecore import accuracy


def meta() -> dict:
    """Where and when: the GPU (or "cpu"), torch, triton, CUDA, tilecore's source digest, the UTC date."""
    import triton

    from tilecore import env

    info = {"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "source": env.source_digest(), "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, sms=p.multi_processor_count)
    else:
        info.update(gpu="cpu", sms=0)
    return info


class Run:
    """One script's results: ``rows`` (dicts with a ``name``), ``errors`` and ``meta``, written to $OUT/<name>.json
    (``out``: another folder; neither: the temp folder's tilecore-runs) after every row; ``deadline`` seconds from the start, for :meth:`left`."""

    def __init__(self, name: str, deadline: float = 55.0, out: str | os.PathLike | None = None):
        self.name, self.deadline, self.start = name, deadline, time.time()
        # without $OUT (a smoke run on this machine) the JSON goes to the temp folder, not into the checkout
        folder = out if out is not None else os.environ.get("OUT") or Path(tempfile.gettempdir()) / "tilecore-runs"
        self.path = Path(folder) / f"{name}.json"
        self.rows: list[dict] = []
        self.errors: list[str] = []
        self.extra: dict = {}  # anything else the JSON should hold (a script's settings, a bound)
        self.meta = meta()

    def elapsed(self) -> float:
        return time.time() - self.start

    def left(self) -> float:
        """Seconds before the deadline (negative past it): a phase starts only where it fits."""
        return self.deadline - self.elapsed()

    def say(self, *args) -> None:
        print(f"[{self.elapsed():5.1f} s]", *args, flush=True)

    def save(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"name": self.name, "meta": self.meta, "seconds": round(self.elapsed(), 1), **self.extra,
                "rows": self.rows, "errors": self.errors}
        self.path.write_text(json.dumps(data, indent=1, default=str))
        return self.path

    def row(self, name: str, **fields) -> dict:
        """A result row: kept, saved, printed as one line."""
        row = {"name": name, **fields}
        self.rows.append(row)
        self.save()
        self.say(json.dumps(row, default=str)[:600])
        return row

    def attempt(self, label: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, or None with the error kept (the script goes on to its next phase)."""
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 (a phase's failure is its result)
            message = f"{label}: {type(err).__name__}: {err}"[:400]
            self.errors.append(message)
            self.say("FAILED", message)
            traceback.print_exc(limit=3)
            self.save()
            return None

    def table(self, columns: list[str], limit: int = 36) -> str:
        """The rows as a fixed-width table of ``columns`` (a row lacking one shows "-"), at most ``limit`` rows."""
        def cell(v):
            if isinstance(v, float):
                return f"{v:.4g}"
            return "-" if v is None else str(v)
        cells = [[cell(r.get(c)) for c in columns] for r in self.rows[:limit]]
        widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
        if len(self.rows) > limit:
            lines.append(f"(+{len(self.rows) - limit} rows in the JSON)")
        return "\n".join(lines)

    def finish(self, columns: list[str]) -> Path:
        """Save, print the errors and the table last; the JSON's path."""
        path = self.save()
        for message in self.errors:
            print("ERROR", message[:200])
        print(self.table(columns))
        print(f"{self.elapsed():.1f} s; {path}", flush=True)
        return path


def poisoned(like: torch.Tensor, value: float = float("nan")) -> torch.Tensor:
    """A tensor like ``like`` filled with ``value`` (NaN: an element a kernel never writes stays NaN, which
    :func:`check` reports; integer dtypes take -1 for NaN)."""
    if not like.dtype.is_floating_point and not like.dtype.is_complex and math.isnan(value):
        value = -1
    return torch.full_like(like, value)


def check(out: torch.Tensor, ref: torch.Tensor, tol: float = 2.5) -> dict:
    """``out`` against its float64 reference ``ref``: the relative RMS error over the finite elements as a multiple
    of the rounding floor of out's dtype (``err_over_floor``), ``written`` (no NaN where the reference is finite: a
    poisoned element left), ``nonfinite_ok`` (NaN where the reference has NaN, the same inf where it has inf: NaN and
    inf propagate as the reference's) and ``pass`` (all three, the error <= ``tol``)."""
    out = out.detach()
    ref = ref.detach().to(out.device, torch.float64)
    if out.shape != ref.shape:
        return {"pass": False, "shape": [list(out.shape), list(ref.shape)]}
    got = out.double()
    finite = torch.isfinite(ref)
    written = bool(torch.isfinite(got[finite]).all())
    nan_ok = bool(torch.isnan(got[torch.isnan(ref)]).all())
    inf = torch.isinf(ref)
    inf_ok = bool((got[inf] == ref[inf]).all())
    if finite.any() and written:
        a, r = got[finite], ref[finite]
        floor = accuracy.rounding_floor(r, out.dtype)
        err = accuracy.rel_rms(a, r)
        over = err / floor if floor > 0 else (0.0 if err == 0 else float("inf"))
    else:
        over = float("nan") if not written else 0.0
    return {"err_over_floor": round(over, 3), "written": written, "nonfinite_ok": nan_ok and inf_ok,
            "pass": written and nan_ok and inf_ok and over <= tol}


def _host_ms(fn, warmup: int = 1, reps: int = 3) -> float:
    """The median ms of ``fn`` by the host clock (no CUDA: tests and smoke runs, where a call may be the
    interpreter's: few calls)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def eager_ms(fn, warmup: int = 10, rep: int = 40) -> float:
    """``fn``'s median ms as triton.testing.do_bench takes it (launches back to back, the L2 flushed between)."""
    if not torch.cuda.is_available():
        return _host_ms(fn)
    import triton

    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def graph_ms(fn, rep: int = 30) -> float | None:
    """``fn``'s median ms replayed from a CUDA graph (triton.testing.do_bench_cudagraph: GPU time without the
    host's launches); None without CUDA."""
    if not torch.cuda.is_available():
        return None
    import triton

    return triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median")


def time_rounds(fns: dict, rounds: int = 3, graph: bool = False, eager: bool = True, warmup: int = 10,
                rep: int = 40, deadline: Run | None = None) -> dict:
    """Interleaved rounds: in each round every callable of ``fns`` once (the order reversed every other round, so
    neither side always goes first), by do_bench (``eager``) and, with ``graph``, from a CUDA graph. Returns
    ``{name}_ms`` / ``{name}_graph_ms`` (medians over rounds) and ``{name}_rounds`` (each round's figures); a
    ``deadline`` Run stops starting rounds past its deadline (the rounds done count)."""
    names = list(fns)
    per = {n: {"eager": [], "graph": []} for n in names}
    for r in range(rounds):
        if deadline is not None and r > 0 and deadline.left() <= 0:
            break
        for n in (names if r % 2 == 0 else names[::-1]):
            if eager:
                per[n]["eager"].append(round(eager_ms(fns[n], warmup, rep), 5))
            if graph:
                g = graph_ms(fns[n])
                if g is not None:
                    per[n]["graph"].append(round(g, 5))
    res: dict = {}
    for n in names:
        if per[n]["eager"]:
            res[f"{n}_ms"] = round(statistics.median(per[n]["eager"]), 5)
        if per[n]["graph"]:
            res[f"{n}_graph_ms"] = round(statistics.median(per[n]["graph"]), 5)
        res[f"{n}_rounds"] = {k: v for k, v in per[n].items() if v}
    return res


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def host_us(fn, calls: int = 300, warmup: int = 100) -> float:
    """Host time of one call, us: ``calls`` back-to-back calls (after ``warmup``), synchronized before and after, so
    where the GPU work is small the figure is the host's (issue 31's way of timing an eager call)."""
    for _ in range(min(warmup, calls)):
        fn()
    sync()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t) / calls * 1e6


def host_rounds(fns: dict, rounds: int = 3, calls: int = 300) -> dict:
    """:func:`host_us` of each callable in interleaved rounds (the order reversed every other round): ``{name}_us``
    (median) and ``{name}_us_rounds``."""
    names = list(fns)
    per = {n: [] for n in names}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            per[n].append(round(host_us(fns[n], calls), 2))
    res = {f"{n}_us": round(statistics.median(v), 2) for n, v in per.items()}
    res.update({f"{n}_us_rounds": v for n, v in per.items()})
    return res


def same_bits(a, b) -> bool:
    """Whether two tensors, or two sequences of tensors, hold the same bits (shapes, dtypes and every element's bit
    pattern: NaNs of one pattern compare equal, -0.0 and +0.0 differ)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        a, b = [a], [b]
    a, b = list(a), list(b)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x is None or y is None:
            if x is not y:
                return False
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if x.dtype.is_floating_point or x.dtype.is_complex:
            x, y = x.detach().contiguous().view(torch.uint8), y.detach().contiguous().view(torch.uint8)
        if not torch.equal(x, y):
            return False
    return True


def sync_warnings(fn) -> dict:
    """torch's own synchronizing operations in one call of ``fn`` (torch.cuda.set_sync_debug_mode("warn")): {message:
    count}; an eager call that should never wait for the GPU gives {}. Empty without CUDA."""
    if not torch.cuda.is_available():
        return {}
    import collections
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode(1)
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    return dict(collections.Counter(str(w.message)[:120] for w in caught if "synchroniz" in str(w.message).lower()))


def profiled(fn, calls: int, cpu: bool = False):
    """torch.profiler's record of ``calls`` eager calls of ``fn`` after one unrecorded (CUDA activity: CUPTI's
    kernels; ``cpu``: the host's ops on every thread, the autograd engine's too), the device synchronized around it."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU if cpu else ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return prof


def allocator_counts(fn, calls: int = 20) -> dict:
    """The caching allocator's cudaMalloc / cudaFree (and retries, all-stream syncs) over ``calls`` calls of ``fn``:
    after warm-up an eager loop should make none. Empty without CUDA."""
    if not torch.cuda.is_available():
        return {}
    before = torch.cuda.memory_stats()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    return {k: after.get(k, 0) - before.get(k, 0) for k in ("num_device_alloc", "num_device_free", "num_alloc_retries",
                                                             "num_sync_all_streams")}
