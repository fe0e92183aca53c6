"""The large-n Gluon kernel (n = 32768; n = 16384 for the set of that name; 2^28 elements, fp16 and
bf16) with its grid and ring depth varied, each checked against float64 on sampled rows (output
poisoned first), then timed next to torch's copy_ of the same bytes (and the bench's ceiling, a copy
of 1 GiB), ROUNDS interleaved rounds: median % of copy (of the per-round ratios). VARIANT_SETS says
what each set asks (the sets before session 18's "dynamic" deal rows round-robin, as they were run).

    PYTHONPATH=. python3 scripts/device/hadamard_grid.py [--set grid|stages|programs|twin|sizes|lookahead|dynamic|16384]
        [--elements E] [--out DIR]
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, ".")
sys.path.insert(0, "scripts/device")  # hadamard_large_probe (the twins)
import torch  # noqa: E402

from tilecore.accuracy import error_over_floor  # noqa: E402
from tilecore.bench.harness import interleaved_ms  # noqa: E402
from tilecore.ops.hadamard import kernels  # noqa: E402
from tilecore.ops.hadamard.reference import hadamard_reference  # noqa: E402

ELEMENTS, ROUNDS = 1 << 28, 7
VARIANT_SETS = {
    # session 10: does a grid that divides the rows evenly beat one program per SM?
    "grid": {"132 programs, 8 stages (shipped)": dict(num_sms=132, programs=132, stages=8, dynamic=False),
             "128 programs, 8 stages": dict(num_sms=132, programs=128, stages=8, dynamic=False),
             "66 programs, 8 stages": dict(num_sms=132, programs=66, stages=8, dynamic=False),
             "132 programs, 7 stages": dict(num_sms=132, programs=132, stages=7, dynamic=False)},
    # session 11: the shipped kernel (slice s's first product in flight under slice s-1's adds) by
    # ring depth, and at n = 16384 against the tl kernel that runs there by default
    "stages": {"4 stages (shipped)": dict(num_sms=132, stages=4, dynamic=False),
               "5 stages": dict(num_sms=132, programs=132, stages=5, dynamic=False),
               "6 stages": dict(num_sms=132, programs=132, stages=6, dynamic=False),
               "3 stages": dict(num_sms=132, programs=132, stages=3, dynamic=False)},
    "programs": {"132 programs": dict(num_sms=132, programs=132, stages=4, dynamic=False),
                 "128 programs (64 rows each; shipped)": dict(num_sms=132, programs=128, stages=4, dynamic=False),
                 "124 programs": dict(num_sms=132, programs=124, stages=4, dynamic=False),
                 "120 programs": dict(num_sms=132, programs=120, stages=4, dynamic=False),
                 "116 programs": dict(num_sms=132, programs=116, stages=4, dynamic=False)},
    # the shipped kernel's memory pattern alone (hadamard_large_probe's twins: no products; or the
    # products without stores): the ceiling of one row per SM
    "twin": {"shipped": dict(num_sms=132, stages=4),
             "twin: loads and stores, no products": dict(twin=dict(num_sms=128, stages=4, copy=True)),
             "twin: products, no stores": dict(twin=dict(num_sms=128, stages=4, copy=False, stores=2))},
    "sizes": {"shipped": dict(num_sms=132, stages=4, dynamic=False),
              "132 programs": dict(num_sms=132, programs=132, stages=4, dynamic=False)},
    # session 18: a ring that fills at the start (two rows ahead while nothing is written yet) and
    # runs LOOKAHEAD slices deep after (4: the shipped ring's depth)
    "lookahead": {"4 stages (session 17)": dict(num_sms=132, stages=4, dynamic=False),
                  "8 stages, lookahead 4 (shipped then)": dict(num_sms=132, dynamic=False),
                  "7 stages, lookahead 4": dict(num_sms=132, stages=7, lookahead=4, dynamic=False),
                  "6 stages, lookahead 4": dict(num_sms=132, stages=6, lookahead=4, dynamic=False),
                  "8 stages, lookahead 5": dict(num_sms=132, stages=8, lookahead=5, dynamic=False),
                  "8 stages": dict(num_sms=132, stages=8, dynamic=False)},
    # session 18: rows drawn from a counter as programs get to them (the template's tile_counter),
    # against rows dealt round-robin; with dynamic rows a program per SM may pay again
    "dynamic": {"dynamic rows, 8 stages, lookahead 4 (shipped)": dict(num_sms=132),
                "static rows, 8 stages, lookahead 4": dict(num_sms=132, dynamic=False),
                "static rows, 4 stages (session 17)": dict(num_sms=132, stages=4, dynamic=False),
                "dynamic rows, 4 stages": dict(num_sms=132, stages=4),
                "dynamic rows, 132 programs": dict(num_sms=132, programs=132)},
    "16384": {"gluon, dynamic rows, 4 stages": dict(num_sms=132, programs=132, stages=4),
              "gluon, dynamic rows, 8 stages, lookahead 4": dict(num_sms=132, programs=132, stages=8, lookahead=4),
              "gluon, dynamic rows, 8 stages, lookahead 2": dict(num_sms=132, programs=132, stages=8, lookahead=2),
              "gluon, static rows, 4 stages (session 11)": dict(num_sms=132, programs=132, stages=4, dynamic=False),
              "tl kernel (default at 16384)": dict(num_sms=132, gluon=False)},
}


def _launch(x, out, scale, gluon=True, twin=None, **cfg):
    if twin is not None:
        from hadamard_large_probe import gluon_twin_launch
        gluon_twin_launch(x, out, scale, **twin)
    elif gluon:
        kernels.launch_gluon(x, out, scale, **cfg)
    else:
        kernels.launch(x, out, scale, interpret=False, gluon=False, **cfg)


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
    ap.add_argument("--set", default="grid", choices=sorted(VARIANT_SETS))
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
        if args.set not in ("grid", "twin"):
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
