"""The large-n Gluon kernel (n = 32768; n = 16384 for the set of that name; 2^28 elements, fp16 and
bf16) with its grid, ring depth and row order varied through plan.gluon_plan's documented arguments
(programs, stages, lookahead, dynamic) and run by launch.launch, each checked against float64 on sampled rows (output
poisoned first), then timed next to torch's copy_ of the same bytes (and the bench's ceiling, a
copy of 1 GiB), ROUNDS interleaved rounds: median % of copy (of the per-round ratios).

    PYTHONPATH=. python3 experiments/hadamard/hadamard_grid.py [--set ring|programs|dynamic|16384]
        [--elements E] [--out DIR]

(Until the tiles v2 port it also had sets from before today's ring and row order shipped (grid,
stages, sizes, lookahead) and a "twin" set whose memory-only twins of the kernel were built on the
v1 template in hadamard_large_probe.py: git show bb6b420:scripts/device/hadamard_grid.py.)
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
import torch  # noqa: E402

from tilecore.accuracy import error_over_floor  # noqa: E402
from tilecore.bench.harness import interleaved_ms  # noqa: E402
from tilecore.ops.hadamard import launch, plan  # noqa: E402
from tilecore.ops.hadamard.reference import hadamard_reference  # noqa: E402

ELEMENTS, ROUNDS = 1 << 28, 7
SHIPPED = "shipped (GLUON_TUNING: dynamic rows, 8 stages, lookahead 4 at n = 32768)"
VARIANT_SETS = {
    # the ring: how deep the loads run ahead of the consumers (sessions 11, 17, 18)
    "ring": {SHIPPED: dict(),
             "4 stages": dict(stages=4),
             "8 stages": dict(stages=8),
             "7 stages, lookahead 4": dict(stages=7, lookahead=4),
             "8 stages, lookahead 5": dict(stages=8, lookahead=5)},
    # the grid with rows dealt round-robin: gluon_programs' choice against a program per SM and fewer
    # (session 11); drawn rows take a program per SM
    "programs": {SHIPPED: dict(),
                 "static rows, gluon_programs' grid": dict(dynamic=False),
                 "static rows, 132 programs": dict(programs=132, dynamic=False),
                 "static rows, 120 programs": dict(programs=120, dynamic=False)},
    # session 18: rows drawn from a counter as programs get to them against rows dealt round-robin
    "dynamic": {SHIPPED: dict(),
                "static rows": dict(dynamic=False),
                "dynamic rows, 4 stages": dict(stages=4),
                "dynamic rows, 128 programs": dict(programs=128)},
    "16384": {"gluon, dynamic rows, 4 stages (GLUON_TUNING)": dict(),
              "gluon, dynamic rows, 8 stages, lookahead 4": dict(stages=8, lookahead=4),
              "gluon, static rows, 4 stages": dict(stages=4, dynamic=False),
              "tl kernel": dict(gluon=False)},
}


def _launch(x, out, scale, gluon=True, **cfg):
    """The Gluon kernel with plan.gluon_plan's knobs ``cfg``, or (gluon=False) the op's plan without it."""
    p = plan.gluon_plan(x, **cfg) if gluon else plan.plan(x, out, gluon=False, **cfg)
    launch.launch(p, x, out, scale)


def _side_checks(dtype, variants):
    """Every variant at n = 16384 too (S = 2), and on rows holding inf / nan: the same non-finite
    positions as the float64 reference there, other rows within the floor."""
    rows = []
    for n in (16384, 32768):
        x = torch.randn(300, n, device="cuda", dtype=dtype)
        x[5, 100] = float("inf")
        x[9, 2000] = float("nan")
        x[11, 7] = -float("inf")
        x[11, n - 1] = float("inf")
        ref = hadamard_reference(x, n ** -0.5, out_dtype=torch.float64)
        finite_rows = [r for r in range(300) if r not in (5, 9, 11)]
        for name, cfg in variants.items():
            out = torch.full_like(x, 7.0)
            _launch(x, out, n ** -0.5, **cfg)
            same_nonfinite = bool(((out.isnan() == ref.isnan()) & (out.isinf() == ref.isinf())
                                   & ((out == ref) | ~ref.isinf())).all())
            err = error_over_floor(out[finite_rows], ref[finite_rows])
            print(f"{dtype} n={n} {name}: non-finite as reference {same_nonfinite}, error {err:.5f}x floor",
                  flush=True)
            rows.append(dict(dtype=str(dtype), n=n, variant=name, same_nonfinite=same_nonfinite, err=err))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--set", default="ring", choices=sorted(VARIANT_SETS))
    ap.add_argument("--elements", type=int, default=ELEMENTS, help="elements per input (default 2^28)")
    args = ap.parse_args()
    res = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}, "rows": []}
    for dtype in (torch.float16, torch.bfloat16):
        n = 16384 if args.set == "16384" else 32768
        rows = args.elements // n
        x = torch.randn(rows, n, device="cuda", dtype=dtype)
        out = torch.empty_like(x)
        sample = torch.randint(0, rows, (16,), device="cuda").tolist() + [rows - 1]
        ref = hadamard_reference(x[sample], n ** -0.5, out_dtype=torch.float64)
        fns = {}
        for name, cfg in VARIANT_SETS[args.set].items():
            out.fill_(float("nan"))
            _launch(x, out, n ** -0.5, **cfg)
            torch.cuda.synchronize()
            written = not out.isnan().any().item()
            err = error_over_floor(out[sample], ref)
            print(f"{dtype} {name}: all written {written}, error {err:.5f}x floor", flush=True)
            res["rows"].append(dict(dtype=str(dtype), variant=name, written=written, err=err))
            fns[name] = (lambda cfg=cfg: _launch(x, out, n ** -0.5, **cfg))
        res["rows"] += _side_checks(dtype, VARIANT_SETS[args.set])
        fns["copy"] = lambda: out.copy_(x)
        # the bench's ceiling (harness.copy_ceiling): a copy of 1 GiB
        big = torch.empty(1 << 29, device="cuda", dtype=dtype).normal_()  # 1 GiB
        big_out = torch.empty_like(big)
        fns["copy 1 GiB"] = lambda: big_out.copy_(big)
        ms = interleaved_ms(fns, ROUNDS, warmup_ms=25, rep_ms=100)
        nbytes = {name: 2 * x.numel() * x.element_size() for name in ms}
        nbytes["copy 1 GiB"] = 2 * big.numel() * big.element_size()
        gbs = {name: [nbytes[name] / t / 1e6 for t in ts] for name, ts in ms.items()}
        for name, xs in gbs.items():
            pct = [100 * a / c for a, c in zip(xs, gbs["copy"])]
            pct_1g = [100 * a / c for a, c in zip(xs, gbs["copy 1 GiB"])]
            row = dict(dtype=str(dtype), variant=name, gbs=statistics.median(xs), pct=statistics.median(pct),
                       lo=min(pct), hi=max(pct), pct_of_1gib_copy=statistics.median(pct_1g), all=xs)
            res["rows"].append(row)
            print(f"{dtype} {name}: {row['gbs']:.0f} GB/s, {row['pct']:.1f}% of copy "
                  f"({row['lo']:.1f}-{row['hi']:.1f}), {row['pct_of_1gib_copy']:.1f}% of the 1 GiB copy", flush=True)
        del x, out, big, big_out
    res["meta"]["elements"] = args.elements
    suffix = "" if args.elements == ELEMENTS else f"_{args.elements}"
    json.dump(res, open(os.path.join(args.out, f"hadamard_{args.set}{suffix}.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
