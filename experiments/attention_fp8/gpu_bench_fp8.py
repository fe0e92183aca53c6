"""Issue 34's sweep through the benchmark harness: the attention-fp8 suite (tilecore/bench/suites/attention_fp8.py:
the FP8 kernel, the convenience path end to end, tilecore bf16, cuDNN bf16; N 512..16384 at B N = 65536, H 16, D 128
and 64, causal and not), run by tilecore.bench.harness.run_suite one (D, causal) group at a time while the budget
lasts, merged into one result: $OUT/<device>/attention-fp8.json and .png (harness.save; the suite is not in
tilecore.bench.suites.SUITES yet, so ``tilecore bench`` does not list it).

    PYTHONPATH=. python3 experiments/attention_fp8/gpu_bench_fp8.py [--quick] [--dims 128,64] [--budget 110]
        [--merge benchmarks/results/h100-80gb-hbm3/attention-fp8.json]

Prints, per (D, causal), each N's TFLOP/s of the FP8 kernel and its ratios to bf16 and cuDNN, and the end to end
path's ratio to bf16 (<= 30 lines).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())

T0 = time.time()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dims", default="128,64")
    ap.add_argument("--budget", type=float, default=110.0)
    ap.add_argument("--merge", default="", help="a committed attention-fp8 JSON whose rows (other dims) to keep: this "
                    "run's rows are added to them (their ratio against that file's ceiling)")
    args = ap.parse_args()
    import torch

    from tilecore.bench import harness
    from tilecore.bench.case import Suite
    from tilecore.bench.suites import attention_fp8 as fp8_suite

    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 1
    out_root = Path(os.environ.get("OUT", "/tmp/out"))
    merged = None

    def save(result):
        """harness.save (JSON, then the PNG); where the plot cannot be drawn here, the JSON alone."""
        try:
            return harness.save(result, out_root)
        except Exception as e:  # noqa: BLE001 -- (matplotlib missing, say): the JSON is what matters
            folder = out_root / harness.device_slug(result.meta)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{result.suite}.json"
            path.write_text(json.dumps(result.to_json(), indent=1) + "\n")
            print(f"(plot skipped: {type(e).__name__}: {str(e)[:100]})", flush=True)
            return path, None
    dims = [int(x) for x in args.dims.split(",")]
    for d in dims:
        for causal in (False, True):
            left = args.budget - (time.time() - T0)
            if left < 45:  # (a group takes ~25-40 s: its compiles, then 6 N x 4 series x 3 rounds)
                print(f"D{d} {'causal' if causal else 'full'}: out of time budget ({left:.0f} s left)", flush=True)
                continue
            group = Suite(fp8_suite.SUITE.name, fp8_suite.SUITE.ceiling, fp8_suite.SUITE.metric, fp8_suite.SUITE.x,
                          lambda quick, d=d, causal=causal: [c for c in fp8_suite.cases(quick, (d,))
                                                             if c.params["causal"] == causal],
                          fp8_suite.SUITE.describe)
            res = harness.run_suite(group, quick=args.quick)
            if merged is None and args.merge and Path(args.merge).exists():
                old = json.loads(Path(args.merge).read_text())
                ceiling = harness.Ceiling(**old["ceiling"])
                merged = harness.Result(old["suite"], old["metric"], old["x"], ceiling, old["meta"],
                                        [harness.Row(**r) for r in old["rows"] if r["params"]["D"] not in dims])
                print(f"merged into {args.merge}: {len(merged.rows)} rows kept; this run's ceiling "
                      f"{res.ceiling.value:,.0f} against the file's {ceiling.value:,.0f}", flush=True)
            if merged is None:
                merged = res
            else:
                for r in res.rows:
                    r.ratio = r.value / merged.ceiling.value
                merged.rows += res.rows
            save(merged)
            print(f"D{d} {'causal' if causal else 'full'} done at {time.time() - T0:.0f} s", flush=True)
    if merged is None:
        return 1
    paths = save(merged)
    print(f"wrote {paths[0]}")
    print(f"\n{merged.meta.get('gpu', {}).get('name', '?')}  ({time.time() - T0:.0f} s); ceiling "
          f"{merged.ceiling.name} {merged.ceiling.value:,.0f} {merged.ceiling.unit}")
    print("TFLOP/s of the FP8 kernel (x tilecore bf16, x cuDNN) | end to end x bf16")
    by = {}
    for r in merged.rows:
        by.setdefault((r.params["D"], r.params["causal"], r.params["N"]), {})[r.series] = r.value
    for key in sorted(by, key=lambda k: (-k[0], k[1], k[2])):
        v = by[key]
        fp8, bf16 = v.get("tilecore fp8", float("nan")), v.get("tilecore bf16", float("nan"))
        cudnn, e2e = v.get("cuDNN (SDPA) bf16", float("nan")), v.get("tilecore fp8 end to end", float("nan"))
        print(f"D{key[0]:<4d}{'causal' if key[1] else 'full':7s}N{key[2]:<6d} fp8 {fp8:6.0f} ({fp8 / bf16:.2f}x bf16 "
              f"{bf16:.0f}, {fp8 / cudnn:.2f}x cuDNN {cudnn:.0f}) | e2e {e2e:5.0f} ({e2e / bf16:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
