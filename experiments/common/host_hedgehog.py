"""Where Hedgehog's eager forward + backward loses time against its own CUDA-graph replay (issue 31, session 36, HG).

Session 35 call 7 (notes/linear_attention/runs/hedgehog_fla_graph_s35_run7_session35_h100.txt): tilecore's Hedgehog
(d64, F 2 x 32, B16 H16 N4096 bf16, W with a gradient) took 2.07-2.80 ms a fwd+bwd eager against 1.94 ms from a
CUDA graph, while its forward alone matched (0.454 / 0.446) and FLA's eager was within 5% of its graph. An eager
call's host time hides behind ~2 ms of GPU work unless something in the call waits for the GPU. This script asks,
for four callables at that shape (``full``: linear_attention(feature_map="hedgehog"); ``core``: linear_attention on
the features, detached, scale 1; ``map``: op.hedgehog_map of q and k, backward with fixed gradients; ``fla``:
torch's features into FLA's chunk_linear_attn; ``full_keyed`` and ``core_keyed``: the same with op.KEYED_HEDGEHOG and
op.KEYED_BACKWARD on, the lean host path of session 36):

* eager fwd+bwd (do_bench medians, gradients reset) against the same from a CUDA graph (do_bench_cudagraph);
* ``return_ms``: how long the call takes to return on the host, the GPU not waited for (median of 20 calls, each
  after a synchronize): about the host time where nothing waits for the GPU, about the GPU time where something does;
* the caching allocator's cudaMalloc / cudaFree (memory_stats num_device_alloc / num_device_free) over 20 calls;
* torch.cuda.set_sync_debug_mode("warn") over one call: torch's own synchronizing operations, by message;
* torch.profiler over 3 calls: the CUDA runtime / driver calls by name and count a call.

And the host time of one fwd+bwd at B1 H2 N 64 (GPU work negligible; not FLA's, which would autotune again): median
us a call over rounds of back-to-back calls. First a float64 check of ``full_keyed`` (a key's second call) at B1 H2 N 192 (output and every gradient over the rounding floor), and
``full_keyed``'s output and gradients against ``full``'s bit for bit (B2 H4 N 512, calls 1..3).

    PYTHONPATH=/tmp/site:. python experiments/common/host_hedgehog.py [--rounds 3] [--deadline 55]

JSON to $OUT/host_hedgehog.json after each phase; a short table last.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.linear_attention.gpu_based_s32 import fla, inputs  # noqa: E402
from experiments.common.gpu_script import Run, allocator_counts, profiled, sync_warnings  # noqa: E402
from tilecore import accuracy  # noqa: E402
from tilecore.ops.linear_attention import linear_attention, linear_attention_reference  # noqa: E402
from tilecore.ops.linear_attention import op as la_op  # noqa: E402
from tilecore.ops.linear_attention.op import hedgehog_map  # noqa: E402
from tilecore.tiles.switches import patched  # noqa: E402

RUN = Run("host_hedgehog", deadline=55)  # (experiments/common/gpu_script.py: the JSON with meta, its errors)
START = RUN.start
NAMES = ["full", "full_keyed", "core", "core_keyed", "map", "fla"]  # (--names picks some)
RESULTS: dict = RUN.extra  # the JSON's phases (its "errors" are RUN.errors)
RESULTS.update({"device": None, "check": {}, "big": {}, "small_us": {}, "errors": RUN.errors})
KEYED = dict(KEYED_HEDGEHOG=True, KEYED_BACKWARD=True)


def switched(name: str):
    """The variant's switches for a with-block: both on for ``*_keyed``, both off for ``full`` and ``core`` (the
    session-35 path, whatever the defaults), as they are for the others."""
    if name.endswith(("_keyed", "_keyed_fwd")):
        return patched(la_op, **KEYED)
    if name in ("full", "core", "full_fwd"):
        return patched(la_op, **dict.fromkeys(KEYED, False))
    return contextlib.nullcontext()


def save():
    RUN.save()


def prepared(b, n, h, seed=0):
    t = inputs("hedgehog", b, n, h, seed=seed, grad=True)
    t["W"] = t["W"].detach().clone().requires_grad_(True)
    with torch.no_grad():  # the core's inputs: the features as tilecore maps them, leaves of their own
        t["qf"] = hedgehog_map(t["q"], t["W"]).detach().requires_grad_(True)
        t["kf"] = hedgehog_map(t["k"], t["W"]).detach().requires_grad_(True)
        t["dqf"], t["dkf"] = torch.randn_like(t["qf"]), torch.randn_like(t["kf"])
    return t


SMALL_ONLY = ("full_fwd", "full_keyed_fwd")  # (host time only)


GRAD_API = [False]  # --grad-api: torch.autograd.grad (gradients returned, none accumulated: a graph replays the same
# work as an eager call) in place of .backward


def _backward(outs, leaves, grads):
    if GRAD_API[0]:
        torch.autograd.grad(outs, leaves, grads)
    else:
        torch.autograd.backward(outs, grads)


def callables(t: dict, names=None) -> dict:
    def full():
        _backward([linear_attention(t["q"], t["k"], t["v"], feature_map="hedgehog", feature_weights=t["W"])],
                  [t["q"], t["k"], t["v"], t["W"]], [t["do"]])

    def full_fwd():  # (the forward recording a gradient, its graph dropped: the backward's share by difference)
        linear_attention(t["q"], t["k"], t["v"], feature_map="hedgehog", feature_weights=t["W"])

    def core():
        _backward([linear_attention(t["qf"], t["kf"], t["v"], scale=1.0)], [t["qf"], t["kf"], t["v"]], [t["do"]])

    def fmap():
        _backward([hedgehog_map(t["q"], t["W"]), hedgehog_map(t["k"], t["W"])], [t["q"], t["k"], t["W"]],
                  [t["dqf"], t["dkf"]])

    peer = fla("hedgehog", t) if "fla" in NAMES else None

    def fla_call():
        out = peer()
        (out[0] if isinstance(out, tuple) else out).backward(t["do"])
    every = {"full": full, "full_keyed": full, "core": core, "core_keyed": core, "map": fmap, "fla": fla_call,
             "full_fwd": full_fwd, "full_keyed_fwd": full_fwd}
    return {n: every[n] for n in (NAMES if names is None else names)}


def grads_of(t):
    return [t[x] for x in ("q", "k", "v", "W", "qf", "kf")]


def return_ms(fn, calls=20) -> float:
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        s = time.perf_counter()
        fn()
        times.append(time.perf_counter() - s)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e3


allocator = allocator_counts  # (experiments/common/gpu_script.py's; sync_warnings too)


def runtime_calls(fn, calls=3) -> dict:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    counts = collections.Counter()
    kernels = 0
    for e in prof.events():
        name = e.name
        if name.startswith(("cuda", "cu")) and not name.startswith("cudaGetDevice") and e.device_type.name == "CPU":
            counts[name] += 1
        elif e.device_type.name == "CUDA":
            kernels += 1
    out = {k: round(v / calls, 1) for k, v in counts.most_common(12)}
    out["gpu_ops"] = round(kernels / calls, 1)
    return out


def cpu_breakdown(fn, calls=20, top=14) -> list:
    """torch.profiler's CPU events over ``calls`` calls (the autograd engine's thread included, which cProfile of
    this thread misses): the ``top`` by self CPU time, [name, count a call, self us a call, total us a call]
    (the profiler's own cost inflates each event: read them as shares)."""
    events = sorted(profiled(fn, calls, cpu=True).key_averages(), key=lambda e: e.self_cpu_time_total,
                    reverse=True)[:top]
    return [[e.key[:60], round(e.count / calls, 1), round(e.self_cpu_time_total / calls, 1),
             round(e.cpu_time_total / calls, 1)] for e in events]


def check() -> dict:
    t = prepared(1, 192, 2, seed=3)
    with switched("full_keyed"):  # (the key's second call: the lean path's own launches)
        for _ in range(2):
            for x in ("q", "k", "v", "W"):
                t[x].grad = None
            o = linear_attention(t["q"], t["k"], t["v"], feature_map="hedgehog", feature_weights=t["W"])
            o.backward(t["do"])
    d = {x: t[x].double().detach().requires_grad_(True) for x in ("q", "k", "v", "W")}
    ref, _ = linear_attention_reference(d["q"], d["k"], d["v"], feature_map="hedgehog", feature_weights=d["W"])
    ref.backward(t["do"].double())
    row = {"o": round(accuracy.error_over_floor(o.detach(), ref.detach()), 3)}
    for x in ("q", "k", "v"):
        row[f"d{x}"] = round(accuracy.error_over_floor(t[x].grad, d[x].grad), 3)
    # dW is float32 (W's dtype) from bf16 inputs: its error against bf16's rounding floor
    row["dW_bf16_floor"] = round(accuracy.rel_rms(t["W"].grad, d["W"].grad)
                                 / accuracy.rounding_floor(d["W"].grad, torch.bfloat16), 3)
    row["finite"] = bool(torch.isfinite(o).all()) and all(bool(torch.isfinite(t[x].grad).all()) for x in d)
    # the lean path against the shipped one, bit for bit (calls 1..3 of a fresh key)
    t = prepared(2, 512, 4, seed=7)

    def outputs():
        for x in ("q", "k", "v", "W"):
            t[x].grad = None
        o = linear_attention(t["q"], t["k"], t["v"], feature_map="hedgehog", feature_weights=t["W"])
        o.backward(t["do"])
        return [o.detach().clone()] + [t[x].grad.clone() for x in ("q", "k", "v", "W")]
    with switched("full"):
        shipped = outputs()
    with switched("full_keyed"):
        lean = [outputs() for _ in range(3)]
    row["keyed_same_bits"] = [all(torch.equal(a, b) for a, b in zip(shipped, call)) for call in lean]
    return row


def small_host_us(rounds: int, calls: int = 100) -> dict:
    t = prepared(1, 64, 2, seed=5)
    fns = {n: f for n, f in callables(t).items() if n != "fla"}  # (FLA would autotune again at this shape)
    fns.update({n: f for n, f in callables(t, SMALL_ONLY).items()})
    per = collections.defaultdict(list)
    for _ in range(rounds):
        for name, fn in fns.items():
            with switched(name):
                fn()
                torch.cuda.synchronize()
                s = time.perf_counter()
                for _ in range(calls):
                    fn()
                torch.cuda.synchronize()
                per[name].append((time.perf_counter() - s) / calls * 1e6)
    return {n: {"median": round(statistics.median(v), 1), "rounds": [round(x, 1) for x in v]} for n, v in per.items()}


ROW_CALLS = 200  # calls a round of a host_rows row


def host_rows_phase(rows: str, ab: str, deadline: float) -> None:
    """host_rows.py's A/B of a switch over some rows (same bits on vs off, interleaved rounds) and those rows' host
    time against torch's op (3 rounds of 200 calls), into RESULTS["rows"]; stops starting rows at ``deadline``."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import host_rows  # noqa: E402 (experiments/common)
    import host_time  # noqa: E402

    table = {**host_time.cases(), **host_time.later_cases()}
    out = RESULTS.setdefault("rows", {"ab": {}, "plain": {}})
    if ab:
        module, name, names = ab.split(":")
        for row in names.split(","):
            ours, peer = table[row]
            out["ab"][row] = host_rows.ab_recipes(row, ours, peer, 3, ROW_CALLS, f"{module}:{name}")
            print(f"A/B {name} {row}: {out['ab'][row]}", flush=True)
            save()
    for row in [r for r in rows.split(",") if r]:
        if time.time() - START > deadline:
            out["plain"][row] = "skipped: deadline"
            continue
        ours, peer = table[row]
        ours()
        t = [(host_time.per_call_us(ours, ROW_CALLS), host_time.per_call_us(peer, ROW_CALLS)) for _ in range(3)]
        out["plain"][row] = {"rounds_us": [[round(x, 1), round(y, 1)] for x, y in t],
                             "ours_us": round(statistics.median(x for x, _ in t), 1),
                             "torch_us": round(statistics.median(y for _, y in t), 1)}
        print(f"{row}: {out['plain'][row]}", flush=True)
        save()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=55.0)
    ap.add_argument("--profile", action="store_true", help="torch.profiler's runtime calls (CUPTI)")
    ap.add_argument("--names", default=",".join(NAMES), help="the variants (comma-separated)")
    ap.add_argument("--shape", default="16,4096,16", help="B,N,H of the timed calls")
    ap.add_argument("--rows", default="", help="host_rows.py's rows timed first (comma-separated), 3 rounds")
    ap.add_argument("--rows-ab", default="", help="MODULE:NAME:ROW,ROW: that switch on/off over those rows first")
    ap.add_argument("--rows-deadline", type=float, default=20.0)
    ap.add_argument("--grad-api", action="store_true", help="torch.autograd.grad in place of .backward (GRAD_API)")
    ap.add_argument("--no-breakdown", action="store_true")
    a = ap.parse_args()
    GRAD_API[0] = a.grad_api
    RESULTS["grad_api"] = a.grad_api
    NAMES[:] = [n for n in a.names.split(",") if n]
    RESULTS["device"] = torch.cuda.get_device_name()
    if a.rows or a.rows_ab:
        host_rows_phase(a.rows, a.rows_ab, a.rows_deadline)
    RESULTS["check"] = check()
    print("check (error / rounding floor)", RESULTS["check"], flush=True)
    save()
    RESULTS["small_us"] = small_host_us(a.rounds)
    print("host us a call at B1 H2 N64:", {n: v["median"] for n, v in RESULTS["small_us"].items()}, flush=True)
    save()
    small = prepared(1, 64, 2, seed=6)
    RESULTS["breakdown"] = {}
    for name, fn in ({} if a.no_breakdown else callables(small, ("full", "full_keyed", "map"))).items():
        with switched(name):
            RESULTS["breakdown"][name] = cpu_breakdown(fn)
    print("CPU events a keyed fwd+bwd (name, count, self us, total us):",
          RESULTS["breakdown"].get("full_keyed", [])[:8], flush=True)
    save()
    t = prepared(*(int(x) for x in a.shape.split(",")))
    fns = callables(t)
    for name, fn in fns.items():
        with switched(name):
            fn()
        torch.cuda.synchronize()
        print(f"{name} ready at {time.time() - START:.0f} s", flush=True)
    for name, fn in fns.items():
        row = RESULTS["big"].setdefault(name, {"eager": [], "graph": []})
        with switched(name):
            row["return_ms"] = round(return_ms(fn), 3)
            row["allocator"] = allocator(fn)
            row["sync_warnings"] = sync_warnings(fn)
        print(name, {k: row[k] for k in ("return_ms", "allocator", "sync_warnings")}, flush=True)
        save()
    for r in range(a.rounds):
        if time.time() - START > a.deadline:
            RESULTS["errors"].append(f"deadline: {r} rounds")
            break
        for name, fn in fns.items():
            row = RESULTS["big"][name]
            with switched(name):
                row["eager"].append(triton.testing.do_bench(fn, warmup=10, rep=60, grad_to_none=grads_of(t),
                                                            return_mode="median"))
                try:
                    row["graph"].append(triton.testing.do_bench_cudagraph(fn, rep=60, return_mode="median"))
                except Exception as err:  # noqa: BLE001
                    RESULTS["errors"].append(f"{name} graph: {type(err).__name__}: {err}"[:300])
        print(f"round {r}: " + ", ".join(f"{n} {RESULTS['big'][n]['eager'][-1]:.3f}/"
                                         f"{(RESULTS['big'][n]['graph'] or [float('nan')])[-1]:.3f}"
                                         for n in fns), f"({time.time() - START:.0f} s)", flush=True)
        save()
    if a.profile and time.time() - START < a.deadline:
        for name in [n for n in ("full", "full_keyed", "map") if n in fns]:
            try:
                with switched(name):
                    RESULTS["big"][name]["runtime_calls"] = runtime_calls(fns[name])
            except Exception as err:  # noqa: BLE001
                RESULTS["errors"].append(f"{name} profile: {type(err).__name__}: {err}"[:300])
                break
        save()
    print(f"\nHedgehog d64 F 2x32 B16 H16 N4096 bf16, W with grad, {RESULTS['device']}; ms a fwd+bwd (medians)")
    print(f"{'':10} {'eager':>7} {'graph':>7} {'return':>7} {'mallocs':>7} {'frees':>6}  host us (B1 H2 N64)")
    for name in fns:
        row = RESULTS["big"][name]
        med = {k: statistics.median(row[k]) if row[k] else float("nan") for k in ("eager", "graph")}
        print(f"{name:10} {med['eager']:7.3f} {med['graph']:7.3f} {row['return_ms']:7.3f} "
              f"{row['allocator']['num_device_alloc']:7d} {row['allocator']['num_device_free']:6d}  "
              f"{RESULTS['small_us'].get(name, {}).get('median', float('nan')):.1f}")
    for name in fns:
        if RESULTS["big"][name]["sync_warnings"]:
            print(f"{name} sync: {RESULTS['big'][name]['sync_warnings']}")
        if "runtime_calls" in RESULTS["big"][name]:
            print(f"{name} runtime calls a fwd+bwd: {RESULTS['big'][name]['runtime_calls']}")
    for row, r in RESULTS.get("rows", {}).get("ab", {}).items():
        if "on_us" in r:
            print(f"A/B {row}: on {r['on_us']} / off {r['off_us']} us (torch {r['torch_us']}), "
                  f"{r['on_us'] / r['off_us']:.2f}x; same bits {r['same_bits_on_vs_off']}, calls 1..10 "
                  f"{r['same_bits_calls_1_10_on']}")
        else:
            print(f"A/B {row}: {r}")
    for row, r in RESULTS.get("rows", {}).get("plain", {}).items():
        print(f"{row}: {r}" if isinstance(r, str) else f"{row}: ours {r['ours_us']} us, torch {r['torch_us']} us")
    print("errors:", RESULTS["errors"][:3], f"{time.time() - START:.0f} s")
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
