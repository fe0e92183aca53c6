"""GPU check and timing of the Hadamard kernel's two load/store paths: pointers (tl.load/tl.store)
and TMA descriptors (bulk tensor copies through shared memory). One script, one device call.

1. check: every n 1..32768 (TMA from 16), fp16/bf16/fp32, each path and the default dispatch,
   poisoned output, against float64, each case launched twice (compile, then the cached launch);
   a > 2^31-element run through TMA.
2. timing at 2^28 elements, fp16 and bf16: pointer vs TMA (same tuning) and the default dispatch,
   each timed twice, interleaved, against the copy ceiling measured in the same run.
3. with --sweep: TMA tuning variants (fp16).

Compiling ~150 kernels would take most of a call, so a pool of processes first launches each config
once on scratch tensors of the same shapes: that fills Triton's on-disk cache, and the measured
launches then load the compiled kernels.

Every launch is the op's plan and launch: launch.launch(plan.plan(x, out, tma=, **tuning), ...), the
tuning keys being plan.tl_config's (split, tile_elems, num_warps, num_stages, waves).

    PYTHONPATH=. python3 experiments/hadamard/hadamard_tma_probe.py [--skip-check] [--sweep] [--ns 256,512]
"""
import argparse
import json
import multiprocessing
import os
import time

import torch

E = 2**28  # elements timed
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}

# Variants around the default dispatch (configs.TMA_TUNING): which side goes through TMA, splits and
# tuning beyond the pointer path's (TMA takes fewer registers, and holds its loads in shared memory).
# Each is checked (fp16, bf16) and timed (fp16, bf16).
B, L, S_ = "both", "load", "store"
VARIANTS = {
    256: [dict(tma=B, split=(1, 16, 16), tile_elems=8192), dict(tma=B, split=(1, 16, 16), tile_elems=16384),
          dict(tma=B, split=(1, 16, 16), tile_elems=8192, waves=32), dict(tma="none", split=(1, 16, 16), tile_elems=8192),
          dict(tma=B, tile_elems=16384, waves=32), dict(tma=L, tile_elems=16384, waves=32)],
    512: [dict(tma=B, split=(1, 16, 32), tile_elems=8192, waves=32), dict(tma=B, split=(1, 16, 32), tile_elems=4096),
          dict(tma=B, split=(1, 16, 32), tile_elems=16384), dict(tma=B, split=(1, 16, 32), tile_elems=8192, num_stages=4),
          dict(tma=B, split=(1, 16, 32), tile_elems=8192, num_warps=4)],
    1024: [dict(tma=B, waves=64), dict(tma=B, waves=128), dict(tma=B, waves=32, num_warps=4),
           dict(tma=B, waves=32, num_stages=4)],
    2048: [dict(tma=B, waves=64), dict(tma=B, waves=128), dict(tma=B, waves=32, tile_elems=8192),
           dict(tma=B, waves=32, num_warps=4)],
    4096: [dict(tma=B, split=(4, 32, 32), tile_elems=16384, waves=16), dict(tma=B, split=(4, 32, 32), tile_elems=16384, waves=32),
           dict(tma=B, split=(4, 32, 32), tile_elems=32768, waves=32), dict(tma=B, split=(2, 64, 32), num_stages=6, num_warps=4),
           dict(tma=B, num_stages=6, num_warps=4, waves=32), dict(tma=B, num_stages=5, num_warps=4),
           dict(tma=B, num_stages=8, num_warps=4)],
    8192: [dict(tma=S_, waves=8), dict(tma=S_, waves=16), dict(tma=S_, num_stages=3), dict(tma=B, split=(4, 64, 32)),
           dict(tma=S_, split=(4, 64, 32)), dict(tma=B, waves=32)],
    16384: [dict(tma=B, split=(2, 128, 64), waves=2), dict(tma=B, split=(2, 128, 64), num_stages=4),
            dict(tma=L, split=(2, 128, 64)), dict(tma=S_, split=(2, 128, 64)), dict(tma=B, split=(4, 64, 64))],
    32768: [dict(tma=B, waves=4), dict(tma=L, waves=2, num_stages=4), dict(tma=B, split=(4, 64, 128), waves=2)],
}


def run(x, out, scale, **options):
    """out = scale * H x through the op's plan (``options``: plan.plan's tma, gluon and tuning) and launch."""
    from tilecore.ops.hadamard import launch, plan

    launch.launch(plan.plan(x, out, **options), x, out, scale)


def check_rows(n):
    return max(3, 2**20 // n) + 1  # + 1: a partial last tile (TMA: rows past the end)


def warm(specs):
    """Launch each (n, dtype, rows, tuning) once on scratch tensors: compiles into Triton's cache."""

    dev = torch.device("cuda")
    failed = []
    for n, dt, rows, tuning in specs:
        try:
            x = torch.zeros(rows, n, dtype=DTYPES[dt], device=dev)
            run(x, torch.empty_like(x), 1.0, **tuning)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - the measured run reports it
            failed.append((n, dt, tuning, f"{type(e).__name__}: {str(e)[:100]}"))
        x = None
    return failed


def main():
    from tilecore import accuracy, env
    from tilecore.bench.harness import copy_ceiling, median_ms
    from tilecore.ops.hadamard import configs, hadamard_reference

    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--skip-check", action="store_true")
    p.add_argument("--sweep", action="store_true", help="time the TMA tuning variants")
    p.add_argument("--ns", default=",".join(str(2**k) for k in range(7, 16)))
    p.add_argument("--workers", type=int, default=8)
    args = p.parse_args()
    t_start = time.time()
    stamp = lambda: f"[{time.time() - t_start:.0f}s]"
    print(env.report(), flush=True)
    dev = torch.device("cuda")
    report = {"meta": env.metadata(), "tma_tuning": {str(k): repr(v) for k, v in configs.TMA_TUNING.items()}, "check": [], "timing": [], "variants": []}
    NS = [int(v) for v in args.ns.split(",")]

    def save():
        with open(os.path.join(args.out, "hadamard_tma_probe.json"), "w") as f:
            json.dump(report, f, indent=1)

    # 0. compile everything in parallel
    specs = []
    if not args.skip_check:
        specs += [(2**k, dt, check_rows(2**k), dict(tma=tma)) for dt in DTYPES for k in range(16)
                  for tma in ("none", "both", "load", "store", None)
                  if tma not in ("load", "store") or 128 <= 2**k <= 4096]
    specs += [(n, dt, E // n, dict(tma=tma)) for dt in ("fp16", "bf16") for n in NS for tma in ("none", "both", None)]
    if args.sweep:
        specs += [(n, dt, rows, v) for n in NS for v in VARIANTS.get(n, []) for dt in ("fp16", "bf16")
                  for rows in (E // n, check_rows(n))]
    specs.sort(key=lambda s: -s[0])  # the big (slow to compile) ones first
    chunks = [specs[i::args.workers] for i in range(args.workers)]
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        failed = [f for part in pool.map(warm, chunks) for f in part]
    print(f"warm-up: {len(specs)} configs compiled, {len(failed)} failed {failed[:4]} {stamp()}", flush=True)

    # 1. correctness
    bad, worst = [], {}
    if not args.skip_check:
        for dt, dtype in DTYPES.items():
            for k in range(16):
                n = 2**k
                x = torch.randn(check_rows(n), n, dtype=dtype, device=dev)
                ref = hadamard_reference(x, n**-0.5, out_dtype=torch.float64)
                for path, tma in (("pointer", "none"), ("tma", "both"), ("load", "load"), ("store", "store"),
                                  ("default", None)):
                    if path in ("load", "store") and not 128 <= n <= 4096:  # one of each plan kind
                        continue
                    if path == "tma" and n < 16:
                        continue
                    out = torch.full_like(x, float("nan"))
                    try:  # twice: the first launch compiles (or loads), the second takes the cached fast path
                        run(x, out, n**-0.5, tma=tma)
                        out.fill_(float("nan"))
                        run(x, out, n**-0.5, tma=tma)
                        torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001
                        bad.append((dt, n, path, f"{type(e).__name__}: {str(e)[:120]}"))
                        print("CHECK ERROR", dt, n, path, str(e)[:300], flush=True)
                        continue
                    written = bool(torch.isfinite(out).all())
                    err = accuracy.rel_rms(out, ref)
                    ratio = accuracy.error_over_floor(out, ref)
                    report["check"].append({"dtype": dt, "n": n, "path": path, "written": written,
                                            "rel_rms": err, "over_floor": ratio})
                    ok = written and (ratio <= 1.25 if dt != "fp32" else err <= 1e-6)
                    if not ok:
                        bad.append((dt, n, path, written, err, ratio))
                    key = f"{dt}/{path}"
                    worst[key] = max(worst.get(key, 0), err if dt == "fp32" else ratio)
        print("CHECK:", "all ok" if not bad else f"FAILURES {bad}", stamp(), flush=True)
        print("worst error (x floor; fp32: rel rms):", {k: f"{v:.7g}" for k, v in worst.items()}, flush=True)

        # > 2^31 elements through TMA: the last rows are where a 32-bit offset would go wrong
        n = 4096
        rows = (2**31 + 2**22) // n
        x = torch.randn(rows, n, dtype=torch.bfloat16, device=dev)
        out = torch.full_like(x, float("nan"))
        run(x, out, n**-0.5, tma="both")
        tail = slice(rows - 600, rows)
        ref = hadamard_reference(x[tail], n**-0.5, out_dtype=torch.float64)
        big = {"elements": rows * n, "tail_over_floor": accuracy.error_over_floor(out[tail], ref),
               "all_written": bool(torch.isfinite(out).all())}
        report["over_2^31_tma"] = big
        print("over 2^31 elements (TMA):", big, stamp(), flush=True)
        del x, out, ref
        torch.cuda.empty_cache()
        save()

    # 2. timing at 2^28 elements against the copy ceiling
    ceil = copy_ceiling()
    print(f"copy ceiling {ceil.value:.0f} GB/s", flush=True)
    report["copy_GBps"] = ceil.value
    bufs = {}

    def time_cfg(n, dtype, **tuning):
        if (n, dtype) not in bufs:
            bufs.clear()
            x = torch.randn(E // n, n, dtype=dtype, device=dev)
            bufs[(n, dtype)] = (x, torch.empty_like(x))
        x, out = bufs[(n, dtype)]
        ms = median_ms(lambda: run(x, out, n**-0.5, **tuning))
        return 100 * (2 * E * x.element_size() / ms / 1e6) / ceil.value

    table = []
    paths = {"pointer": dict(tma="none"), "tma": dict(tma="both"), "default": dict(tma=None)}
    for dt in ("fp16", "bf16"):
        for n in NS:
            pct = {k: [] for k in paths}
            for _ in range(2):  # interleaved twice: the spread between the two is the noise
                for name, kw in paths.items():
                    try:
                        pct[name].append(time_cfg(n, DTYPES[dt], **kw))
                    except Exception as e:  # noqa: BLE001
                        print(f"{dt} n={n} {name}: {type(e).__name__} {str(e)[:150]}", flush=True)
            row = {"dtype": dt, "n": n, **pct}
            report["timing"].append(row)
            table.append(row)
            print(f"{dt} n={n:6d} " + " ".join(f"{k} {'/'.join(f'{v:.1f}' for v in vs)}" for k, vs in pct.items())
                  + f" {stamp()}", flush=True)
            save()

    # 3. variants: checked (poisoned, against float64) and timed, fp16 and bf16
    best = {}
    if args.sweep:
        for n in NS:
            for tuning in VARIANTS.get(n, []):
                res = {"n": n, **{k: repr(v) for k, v in tuning.items()}}
                try:
                    for dt in ("fp16", "bf16"):
                        x = torch.randn(check_rows(n), n, dtype=DTYPES[dt], device=dev)
                        out = torch.full_like(x, float("nan"))
                        run(x, out, n**-0.5, **tuning)
                        ratio = accuracy.error_over_floor(out, hadamard_reference(x, n**-0.5, out_dtype=torch.float64))
                        res[f"{dt}_ok"] = bool(torch.isfinite(out).all()) and ratio <= 1.25
                        res[f"{dt}_over_floor"] = ratio
                        res[dt] = time_cfg(n, DTYPES[dt], **tuning)
                except Exception as e:  # noqa: BLE001 - a variant that fails to compile is a result too
                    print(f"variant n={n} {tuning}: {type(e).__name__} {str(e)[:100]}", flush=True)
                    continue
                report["variants"].append(res)
                ok = res["fp16_ok"] and res["bf16_ok"]
                print(f"variant n={n:6d} {tuning} fp16 {res['fp16']:5.1f}% bf16 {res['bf16']:5.1f}% "
                      f"{'ok' if ok else 'WRONG'} {stamp()}", flush=True)
                if ok and (n not in best or res["fp16"] + res["bf16"] > best[n][1] + best[n][2]):
                    best[n] = (tuning, res["fp16"], res["bf16"])
                save()

    save()
    print(f"\nSUMMARY: % of copy ({ceil.value:.0f} GB/s), 2^28 elements, two interleaved medians each; "
          f"default: TMA {configs.TMA_TUNING}")
    print(f"{'dtype':5s} {'n':>6s} {'pointer':>12s} {'tma':>12s} {'default':>12s}")
    for r in table:
        print(f"{r['dtype']:5s} {r['n']:6d} " + " ".join(f"{'/'.join(f'{v:.1f}' for v in r[k]):>12s}"
                                                        for k in paths))
    if best:
        print("best variant per n (fp16 / bf16 % of copy):")
        for n, (tuning, a, b) in best.items():
            print(f"  n={n:6d} {a:5.1f} / {b:5.1f}  {tuning}")
    if not args.skip_check:
        print("CHECK:", "all ok" if not bad else f"FAILURES {len(bad)}", "worst:",
              {k: f"{v:.7g}" for k, v in worst.items()})
    print(f"total {time.time() - t_start:.0f}s")


if __name__ == "__main__":
    main()
