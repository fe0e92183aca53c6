"""FP8 attention's convenience path eager (issue 34, session 37): where does an eager call of
``tilecore.attention(q, k, v, causal=True, precision="fp8")`` lose against its CUDA graph, and is it the host?

Session 36 measured the convenience path at D128 causal B16 H16 N4096 at 1.104-1.153x the bf16 forward eager
(triton.testing.do_bench: the L2 flushed before each call, each call timed alone, median) and 1.140-1.201x from a CUDA
graph (do_bench_cudagraph: calls back to back, the mean). This job times the same calls four ways, in interleaved
rounds, with the bf16 forward beside them:

* ``bench``: do_bench (the project's eager figure);
* ``loop``: 20 calls back to back between two events, no flush (eager, the mean: what the graph replays, launched by
  the host) and the host's own time for those 20 calls (enqueue only: the GPU runs behind);
* ``graph``: do_bench_cudagraph.

Then for one call of each form: torch.cuda.set_sync_debug_mode("warn") (any host synchronization, by message) and a
torch.profiler trace of 3 calls (each after a synchronize, so a host-bound gap would show; and 3 back to back): the
kernels a call launches, each one's GPU time, and the GPU's idle time between them inside the call.

Forms: ``bf16`` (tilecore.attention), ``fp8`` (attention(..., precision="fp8"), the shipped path), and, where the
library has them, ``kv2`` / ``kv1`` (k and v quantized in two launches / one: configs.ROTATED["kv_one_launch"], call 1
only: removed after it), ``rec`` (the per-key recipe: quantize.ROTATED_RECIPES, a repeat call without checks or
plans; on since call 2) and ``fill`` (rotate_quantize's blocks a program cut where its grid leaves SMs idle:
quantize.FILL_SMS).
O of each fp8 form against float64 attention of the bf16 inputs on the last (batch, head) (error as a multiple of the
bf16 rounding floor; all written and finite), and a call after the timings (keyed launches, recipes) against the
first call, bit for bit. Case ``s1k`` (B1 H16 N1024 D128 causal): a call whose GPU time is below its host time.

    PYTHONPATH=. python experiments/attention_fp8/gpu_eager_s37.py [--budget 55] [--smoke]

Prints rows as it goes and a table last; JSON to $OUT/attention_fp8_eager_s37.json. --smoke: CPU, tiny shapes (the
script's plumbing only).
"""
from __future__ import annotations

import argparse
import json
import os
import time
import traceback

import torch

from experiments.common import gpu_script

T0 = time.time()


def rel_rms(x, ref) -> float:
    x, ref = x.double(), ref.double()
    return ((x - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-300)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--budget", type=float, default=55.0)
    ap.add_argument("--cases", default="s1k,d128c,n1024c,d64c", help="d128c (D128 causal), d128 (full), d64c, d64 "
                    "(B16 H16 N4096); n1024c (D128 causal B16 N1024), s1k (D128 causal B1 H16 N1024: host-bound)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parts", action="store_true", help="after the cases: the attention kernel alone at D128 causal "
                    "B16 H16 N4096 with q rotated in it against e4m3 q (rotate_quantize's codes), GPU time by the "
                    "profiler and do_bench: what the rotation costs the kernel")
    args = ap.parse_args()
    left = lambda: args.budget - (time.time() - T0)
    smoke = args.smoke
    import tilecore
    from tilecore.ops.attention_fp8 import configs, quantize
    from tilecore.tiles.switches import patched

    dev = "cpu" if smoke else "cuda"
    dt = torch.float32 if smoke else torch.bfloat16
    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "attention_fp8_eager_s37.json")
    result = {"device": torch.cuda.get_device_name() if not smoke else "cpu (smoke)", "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cases": [], "notes": []}
    shipped = dict(configs.ROTATED)
    switches = {n: getattr(quantize, n) for n in ("ROTATED_RECIPES", "FILL_SMS") if hasattr(quantize, n)}
    forms = {"fp8": (shipped, switches)}  # name -> (configs.ROTATED, quantize's switches)
    if "kv_one_launch" in shipped:  # the A/B of the one-launch k and v passes, both ways whatever the default
        forms = {"kv2": (dict(shipped, kv_one_launch=False), switches),
                 "kv1": (dict(shipped, kv_one_launch=True), switches)}
    if "ROTATED_RECIPES" in switches and not switches["ROTATED_RECIPES"]:
        forms["rec"] = (shipped, dict(switches, ROTATED_RECIPES=True))
    if "FILL_SMS" in switches and not switches["FILL_SMS"]:
        forms["fill"] = (shipped, dict(switches, ROTATED_RECIPES=True, FILL_SMS=True))

    def save():
        with open(path, "w") as f:
            json.dump(result, f, indent=1)

    def sync():
        if not smoke:
            torch.cuda.synchronize()

    def bench(fn):
        if smoke:
            t = time.time()
            fn()
            return (time.time() - t) * 1e3
        import triton

        return triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median")

    def graph(fn):
        if smoke:
            return bench(fn)
        import triton

        sync()
        try:
            with torch.cuda.stream(torch.cuda.Stream()):
                return triton.testing.do_bench_cudagraph(fn, rep=25, return_mode="median")
        except Exception as e:  # noqa: BLE001
            result["notes"].append(f"graph timing failed ({type(e).__name__}: {str(e)[:160]})")
            sync()
            return float("nan")

    def loop(fn, calls=20):
        """(GPU ms a call, host ms a call) over ``calls`` back-to-back calls, no flush."""
        fn()
        sync()
        if smoke:
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            return (time.perf_counter() - t) * 1e3 / calls, (time.perf_counter() - t) * 1e3 / calls
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        host = (time.perf_counter() - t) * 1e3 / calls
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls, host

    def sync_warnings(fn) -> dict:
        return {} if smoke else gpu_script.sync_warnings(fn)

    def trace(fn, calls=3, synced=True) -> dict:
        """The kernels of each call (name, us) and the GPU's idle us between them inside a call; host us a call."""
        from torch.profiler import ProfilerActivity, profile

        fn()
        sync()
        acts = [ProfilerActivity.CPU] + ([] if smoke else [ProfilerActivity.CUDA])
        marks = []
        with profile(activities=acts) as prof:
            for i in range(calls):
                if synced:
                    sync()
                with torch.profiler.record_function(f"call{i}"):
                    fn()
            sync()
        events = prof.events()
        kernels = sorted((e for e in events if e.device_type.name == "CUDA" and "Memset" not in e.name
                          and "Memcpy" not in e.name), key=lambda e: e.time_range.start)
        calls_cpu = sorted((e for e in events if e.name.startswith("call") and e.device_type.name == "CPU"),
                           key=lambda e: e.time_range.start)
        out = {"host_us": [round(e.time_range.end - e.time_range.start, 1) for e in calls_cpu], "kernels": [],
               "gaps_us": [], "span_us": []}
        if not kernels:
            return out
        per = max(1, len(kernels) // calls)
        for c in range(calls):
            ks = kernels[c * per:(c + 1) * per]
            if not ks:
                break
            marks.append(ks)
            out["span_us"].append(round(ks[-1].time_range.end - ks[0].time_range.start, 1))
            out["gaps_us"].append([round(b.time_range.start - a.time_range.end, 1) for a, b in zip(ks, ks[1:])])
        out["kernels"] = [[e.name[:48], round(e.time_range.end - e.time_range.start, 1)] for e in marks[-1]]
        return out

    def reference(q, k, v, causal, b, h):
        qf, kf, vf = (t[b, h].double() for t in (q, k, v))
        s = (qf @ kf.T) * qf.shape[-1] ** -0.5
        if causal:
            n, nk = s.shape
            allowed = torch.arange(nk, device=dev)[None, :] <= torch.arange(n, device=dev)[:, None] + nk - n
            s = s.masked_fill(~allowed, float("-inf"))
        return torch.softmax(s, -1) @ vf

    def case(B, H, N, D, causal, detail):
        row = dict(B=B, H=H, N=N, D=D, causal=causal, bench={}, loop={}, host_ms={}, graph={})
        try:
            g = torch.Generator(device=dev).manual_seed(N + D + causal)
            q, k, v = (torch.randn(B, H, N, D, device=dev, generator=g).to(dt) for _ in range(3))
            ref = reference(q, k, v, causal, B - 1, H - 1)
            floor = rel_rms(ref.to(torch.bfloat16), ref)
            fns = {"bf16": lambda: tilecore.attention(q, k, v, causal=causal)}
            firsts = {}
            for name, (cfg, sw) in forms.items():
                def fp8(cfg=cfg, sw=sw):
                    with patched(configs, ROTATED=cfg), patched(quantize, **sw):
                        return tilecore.attention(q, k, v, causal=causal, precision="fp8")
                o = fp8()
                row[f"err_over_floor_{name}"] = rel_rms(o[B - 1, H - 1], ref) / floor
                row[f"written_{name}"] = bool(torch.isfinite(o).all().item())
                firsts[name] = o
                fns[name] = fp8
            for r in range(args.rounds):  # interleaved rounds: each form timed once a round, the order turned
                order = list(fns) if r % 2 == 0 else list(fns)[::-1]
                for name in order:
                    row["bench"].setdefault(name, []).append(bench(fns[name]))
                    gpu, host = loop(fns[name])
                    row["loop"].setdefault(name, []).append(gpu)
                    row["host_ms"].setdefault(name, []).append(host)
                for name in order:
                    row["graph"].setdefault(name, []).append(graph(fns[name]))
                print(f"  D{D} {'causal' if causal else 'full'} N{N} round {r}: " + "; ".join(
                    f"{n} bench {row['bench'][n][-1]:.3f} loop {row['loop'][n][-1]:.3f} (host {row['host_ms'][n][-1]:.3f})"
                    f" graph {row['graph'][n][-1]:.3f}" for n in fns), flush=True)
                save()
            for name, o in firsts.items():  # a later call (keyed launches, the recipe) against the first, bit for bit
                row[f"later_same_{name}"] = bool(torch.equal(fns[name](), o))
            row["same_as_first_form"] = {n: bool(torch.equal(o, next(iter(firsts.values())))) for n, o in firsts.items()}
            print(f"  checks: " + ", ".join(f"{n} O {row[f'err_over_floor_{n}']:.1f}x floor, written "
                                            f"{row[f'written_{n}']}, later call same {row[f'later_same_{n}']}, same as "
                                            f"{next(iter(firsts))} {row['same_as_first_form'][n]}" for n in firsts),
                  flush=True)
            del firsts
            if detail:
                row["sync"] = {n: sync_warnings(fn) for n, fn in fns.items()}
                row["trace_synced"] = {n: trace(fn) for n, fn in fns.items()}
                row["trace_back_to_back"] = {n: trace(fn, synced=False) for n, fn in fns.items() if n != "bf16"}
                print("  sync", json.dumps(row["sync"]), flush=True)
                for kind in ("trace_synced", "trace_back_to_back"):
                    for n, t in row[kind].items():
                        print(f"  {kind} {n}: host us {t['host_us']}, span us {t['span_us']}, gaps us {t['gaps_us']}, "
                              f"kernels {t['kernels']}", flush=True)
            del q, k, v
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
        result["cases"].append(row)
        save()

    def parts():
        """The q-rotated kernel against the e4m3-q kernel on the same k and v codes (D128 causal B16 H16 N4096)."""
        from tilecore.ops.attention_fp8 import launch
        from tilecore.ops.attention_fp8.quantize import quantize_v_permuted, rotate_quantize, rotation_signs

        out = {}
        try:
            B, H, N, D = 16, 16, 4096, 128
            g = torch.Generator(device=dev).manual_seed(5)
            q, k, v = (torch.randn(B, H, N, D, device=dev, generator=g).to(dt) for _ in range(3))
            signs = rotation_signs(D, q.device)
            k8, ks = rotate_quantize(k, signs=signs, scales="block")
            v8, vs = quantize_v_permuted(v, per="block")
            q8, qs = rotate_quantize(q, signs=signs, scales="token")
            fns = {"q_rotated": lambda: launch.forward_q_rotated(q, signs, k8, v8, ks, vs, True, D ** -0.5, q.dtype),
                   "q_e4m3": lambda: tilecore.attention_fp8(q8, k8, v8, q_scale=qs, k_scale=ks, v_scale=vs,
                                                            causal=True, out_dtype=q.dtype, v_layout="keys_permuted",
                                                            check_scales=False)}
            o_rot, o_e4 = fns["q_rotated"]()[0], fns["q_e4m3"]()
            out["rel_diff_rotated_vs_e4m3"] = rel_rms(o_rot.float(), o_e4.float())
            for r in range(2):
                for name, fn in fns.items():
                    out.setdefault(f"bench_{name}", []).append(bench(fn))
                    t = trace(fn, calls=3)
                    out.setdefault(f"gpu_us_{name}", []).extend(us for _, us in t["kernels"][-1:])
            print("parts", json.dumps(out), flush=True)
        except Exception as e:  # noqa: BLE001
            out["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
        result["parts"] = out
        save()

    shapes = {"d128c": (128, True, 4096, 16), "d128": (128, False, 4096, 16), "d64c": (64, True, 4096, 16),
              "d64": (64, False, 4096, 16), "n1024c": (128, True, 1024, 16), "s1k": (128, True, 1024, 1)}
    H0 = 2 if smoke else 16
    for i, name in enumerate(args.cases.split(",")):
        D, causal, N, B0 = shapes[name]
        N, B0 = (256, 1) if smoke else (N, B0)
        if i and left() < 12:
            result["notes"].append(f"{name}: skipped for the time budget")
            print(f"skipped for the time budget: {name}", flush=True)
            continue
        case(B0, H0, N, D, causal, detail=name in ("d128c", "s1k"))

    if args.parts and not smoke:
        if left() < 10:
            result["notes"].append("parts: skipped for the time budget")
            print("skipped for the time budget: parts", flush=True)
        else:
            parts()
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else float("nan")
    print("\n| case | form | bench ms (x bf16) | loop ms (x bf16) | host ms a call | graph ms (x bf16) | O / floor |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in result["cases"]:
        label = f"D{r['D']} {'causal' if r['causal'] else 'full'} B{r['B']} H{r['H']} N{r['N']}"
        if "error" in r:
            print(f"| {label} | error | {r['error'][:80]} | | | | |")
        for n in r["bench"]:
            b, lp, gr = med(r["bench"][n]), med(r["loop"][n]), med(r["graph"][n])
            b0, l0, g0 = med(r["bench"]["bf16"]), med(r["loop"]["bf16"]), med(r["graph"]["bf16"])
            err = r.get(f"err_over_floor_{n}")
            print(f"| {label} | {n} | {b:.3f} ({b0 / b:.3f}x) | {lp:.3f} ({l0 / lp:.3f}x) | {med(r['host_ms'][n]):.3f} "
                  f"| {gr:.3f} ({g0 / gr:.3f}x) | {'' if err is None else f'{err:.1f}'} |")
    print(f"wall {time.time() - T0:.1f} s")
    save()


if __name__ == "__main__":
    main()
