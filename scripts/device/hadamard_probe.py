"""GPU check and timing of the Hadamard kernel: correctness for every n and dtype, then GB/s of
the default config and of variants, against the copy ceiling measured in the same run.

    PYTHONPATH=. python3 scripts/device/hadamard_probe.py [--variants] [--out DIR]
"""
import argparse
import json
import os

import torch

from tilecore import accuracy, dispatch, env
from tilecore.bench.harness import copy_ceiling, median_ms
from tilecore.ops.hadamard import hadamard_reference, kernels

p = argparse.ArgumentParser()
p.add_argument("--variants", default="")  # e.g. "256,1024,4096,16384,32768"
p.add_argument("--out", default=os.environ.get("OUT", "."))
p.add_argument("--skip-check", action="store_true")
args = p.parse_args()
print(env.report(), flush=True)
dev = torch.device("cuda")
sms = dispatch.num_sms(dev)
report = {"meta": env.metadata(), "check": [], "timing": [], "variants": []}

# 1. correctness: poisoned output, float64 reference, error / rounding floor
bad = []
if not args.skip_check:
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for k in range(16):
            n = 2**k
            rows = max(3, 2**20 // n) + 1
            x = torch.randn(rows, n, dtype=dtype, device=dev)
            out = torch.full_like(x, float("nan"))
            try:  # twice: the first launch compiles, the second takes the cached fast path
                kernels.launch(x, out, n**-0.5, interpret=False, num_sms=sms)
                out.fill_(float("nan"))
                kernels.launch(x, out, n**-0.5, interpret=False, num_sms=sms)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                bad.append((str(dtype), n, f"{type(e).__name__}: {str(e)[:120]}"))
                print("CHECK ERROR", dtype, n, str(e)[:200], flush=True)
                continue
            ref = hadamard_reference(x, n**-0.5, out_dtype=torch.float64)
            written = bool(torch.isfinite(out).all())
            err = accuracy.rel_rms(out, ref)
            ratio = accuracy.error_over_floor(out, ref)
            report["check"].append({"dtype": str(dtype), "n": n, "written": written, "rel_rms": err, "over_floor": ratio})
            ok = written and (ratio <= 1.25 if dtype != torch.float32 else err <= 1e-6)
            if not ok:
                bad.append((str(dtype), n, written, err, ratio))
    print("CHECK:", "all ok" if not bad else f"FAILURES {bad}", flush=True)
    worst = {}
    for c in report["check"]:
        worst[c["dtype"]] = max(worst.get(c["dtype"], 0), c["over_floor"] if "float32" not in c["dtype"] else c["rel_rms"])
    print("worst error (x floor; fp32: rel):", worst, flush=True)

# 1b. more than 2^31 elements: 64-bit offsets (the last rows are the ones a 32-bit offset would miss)
if not args.skip_check:
    n = 4096
    rows = (2**31 + 2**22) // n
    x = torch.randn(rows, n, dtype=torch.bfloat16, device=dev)
    out = torch.full_like(x, float("nan"))
    kernels.launch(x, out, n**-0.5, interpret=False, num_sms=sms)
    tail = slice(rows - 600, rows)
    ref = hadamard_reference(x[tail], n**-0.5, out_dtype=torch.float64)
    big = {"elements": rows * n, "tail_over_floor": accuracy.error_over_floor(out[tail], ref),
           "all_written": bool(torch.isfinite(out).all())}
    report["over_2^31"] = big
    print("over 2^31 elements:", big, flush=True)
    del x, out

# 2. timing at 2^28 elements against the copy ceiling
ceil = copy_ceiling()
print(f"copy ceiling {ceil.value:.0f} GB/s", flush=True)
E = 2**28


def time_cfg(n, dtype, **tuning):
    x = torch.randn(E // n, n, dtype=dtype, device=dev)
    out = torch.empty_like(x)
    fn = lambda: kernels.launch(x, out, n**-0.5, interpret=False, num_sms=sms, **tuning)
    ms = median_ms(fn)
    return 2 * E * x.element_size() / ms / 1e6


rows = []
for dtype in (torch.float16, torch.bfloat16):
    for k in range(0, 16):
        n = 2**k
        try:
            gbs = time_cfg(n, dtype)
        except Exception as e:  # noqa: BLE001
            print(f"{str(dtype)[6:]} n={n}: {type(e).__name__} {str(e)[:150]}", flush=True)
            continue
        rows.append((str(dtype)[6:], n, gbs, 100 * gbs / ceil.value))
        report["timing"].append({"dtype": str(dtype), "n": n, "GB/s": gbs, "pct_copy": 100 * gbs / ceil.value})
        print(f"{str(dtype)[6:]:9s} n={n:6d} {gbs:7.0f} GB/s {100 * gbs / ceil.value:5.1f}%", flush=True)

# Alternative (plan, tile elements, stages) per n; None keeps the default.
VARIANTS = {
    512: [dict(plan=(2, 16, 16), tile_elems=16384, waves=16), dict(tile_elems=8192, waves=16, num_stages=4),
          dict(num_warps=4, waves=16), dict(tile_elems=8192, num_warps=4, waves=16)],
    2048: [dict(waves=16), dict(tile_elems=8192, waves=16), dict(num_warps=4, waves=16), dict(waves=8, num_stages=4)],
    32768: [dict(waves=2), dict(num_stages=2, waves=1)],
    1024: [dict(num_warps=4), dict(tile_elems=16384, waves=8)],
}
if args.variants:
    for n in [int(v) for v in args.variants.split(",")]:
        for tuning in VARIANTS.get(n, []):
            try:
                gbs = time_cfg(n, torch.float16, **tuning)
            except Exception as e:  # noqa: BLE001 - a variant that fails to compile is a result too
                print(f"variant n={n} {tuning}: {type(e).__name__} {str(e)[:100]}")
                continue
            report["variants"].append({"n": n, **tuning, "GB/s": gbs})
            print(f"variant n={n:6d} {tuning} {gbs:6.0f} GB/s {100 * gbs / ceil.value:5.1f}%", flush=True)

with open(os.path.join(args.out, "hadamard_probe.json"), "w") as f:
    json.dump(report, f, indent=1)
print("\nSUMMARY (default config)")
for r in rows:
    print(f"{r[0]:9s} n={r[1]:6d} {r[2]:7.0f} GB/s {r[3]:5.1f}% of copy")
