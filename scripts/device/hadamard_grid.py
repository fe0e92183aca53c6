"""n = 32768's Gluon kernel (2^28 elements, fp16 and bf16) with its grid and ring depth varied,
each checked against float64 on sampled rows (output poisoned first), then timed next to torch's
copy_ of the same bytes, ROUNDS interleaved rounds: median % of copy (of the per-round ratios).
Question: does a grid that divides the 8,192 rows evenly (128 programs: 64 rows each, no 8-row
last round) beat one program per SM (132)?

    PYTHONPATH=. python3 scripts/device/hadamard_grid.py [--out DIR]
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, ".")
import torch  # noqa: E402

from tilecore.accuracy import error_over_floor  # noqa: E402
from tilecore.bench.harness import interleaved_ms  # noqa: E402
from tilecore.ops.hadamard import kernels  # noqa: E402
from tilecore.ops.hadamard.reference import hadamard_reference  # noqa: E402

N, ROWS, ROUNDS = 32768, 8192, 5
VARIANTS = {"132 programs, 8 stages (shipped)": dict(num_sms=132, stages=8),
            "128 programs, 8 stages": dict(num_sms=128, stages=8),
            "66 programs, 8 stages": dict(num_sms=66, stages=8),
            "132 programs, 7 stages": dict(num_sms=132, stages=7)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    res = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}, "rows": []}
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(ROWS, N, device="cuda", dtype=dtype)
        out = torch.empty_like(x)
        sample = torch.randint(0, ROWS, (16,), device="cuda").tolist() + [ROWS - 1]
        ref = hadamard_reference(x[sample], N ** -0.5, out_dtype=torch.float64)
        fns = {}
        for name, cfg in VARIANTS.items():
            out.fill_(float("nan"))
            kernels.launch_gluon(x, out, N ** -0.5, **cfg)
            torch.cuda.synchronize()
            written = not out.isnan().any().item()
            err = error_over_floor(out[sample], ref)
            print(f"{dtype} {name}: all written {written}, error {err:.5f}x floor", flush=True)
            res["rows"].append(dict(dtype=str(dtype), variant=name, written=written, err=err))
            fns[name] = (lambda cfg=cfg: kernels.launch_gluon(x, out, N ** -0.5, **cfg))
        fns["copy"] = lambda: out.copy_(x)
        ms = interleaved_ms(fns, ROUNDS, warmup_ms=25, rep_ms=100)
        gbs = {name: [2 * x.numel() * x.element_size() / t / 1e6 for t in ts] for name, ts in ms.items()}
        for name, xs in gbs.items():
            pct = [100 * a / c for a, c in zip(xs, gbs["copy"])]
            row = dict(dtype=str(dtype), variant=name, gbs=statistics.median(xs), pct=statistics.median(pct),
                       lo=min(pct), hi=max(pct), all=xs)
            res["rows"].append(row)
            print(f"{dtype} {name}: {row['gbs']:.0f} GB/s, {row['pct']:.1f}% of copy ({row['lo']:.1f}-{row['hi']:.1f})",
                  flush=True)
        del x, out
    json.dump(res, open(os.path.join(args.out, "hadamard_grid.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
