"""The backward's query split (gluon_backward.attention_bwd_split_kernel: each consumer owns half of
a step's queries for S, dP and dQ and half the tile's keys for dK and dV, P^T and dS^T through
shared memory) against the shipped key split, D = 64.

1. check: every variant on small GQA shapes with tails (and, causal, rows with no key) against a
   float64 reference, gradients NaN-poisoned first: error over the rounding floor, all written.
2. time: B16 H16 bf16 at N = --lengths, every variant next to cuDNN's backward, --rounds interleaved
   rounds; median TFLOP/s and the median (min-max) of the per-round ratios to cuDNN.

    PYTHONPATH=. python3 scripts/device/bwd_split.py [--out DIR] [--lengths 4096] [--rounds 5]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, ".")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

from attention_knobs import backward_case  # noqa: E402 (scripts/device)
from tilecore.accuracy import error_over_floor  # noqa: E402
from tilecore.bench.harness import ratios_to  # noqa: E402
from tilecore.ops.attention import kernels  # noqa: E402
from tilecore.ops.attention.reference import reference_grads  # noqa: E402

D = 64
SPLIT = dict(block_m=128, block_n=64, stages=2, dq_from="fused", split="queries")
ROUND_ROBIN = False  # --round-robin


def variants(causal):
    """(Session 12's runs also had the split with S^T and dP^T of all 128 keys at once, a "crossed"
    order, lse and delta loaded as columns, and the own P^T kept in registers, all since removed:
    notes/attention.md.)"""
    out = {"key split": kernels.key_split_config(D, causal),
           "split": dict(SPLIT, prefetch=True),
           "split, no prefetch": dict(SPLIT, prefetch=False)}
    if causal and ROUND_ROBIN:  # round-robin tiles instead of the balanced schedule (its cost model counts steps)
        out |= {"split, round-robin": dict(SPLIT, prefetch=True, balanced=False),
                "split, no prefetch, round-robin": dict(SPLIT, prefetch=False, balanced=False),
                "key split, round-robin": dict(kernels.key_split_config(D, causal), balanced=False)}
    return out


def meta():
    import triton
    from tilecore import env
    p = torch.cuda.get_device_properties(0)
    return {"gpu": p.name, "sms": p.multi_processor_count, "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "source": env.source_digest(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


def check(res, causals):
    ok_all = True
    for causal in causals:
        for dtype, (b, hq, hkv, n, nk) in ((torch.bfloat16, (2, 4, 2, 700, 900)), (torch.bfloat16, (1, 4, 1, 1000, 300)),
                                           (torch.float16, (1, 2, 2, 4097, 4097)), (torch.bfloat16, (2, 2, 2, 1, 17)),
                                           (torch.bfloat16, (1, 2, 2, 129, 257))):
            g = torch.Generator(device="cuda").manual_seed(D + causal + n)
            mk = lambda h, length: torch.randn(b, h, length, D, device="cuda", dtype=dtype, generator=g)
            q, k, v, do = mk(hq, n), mk(hkv, nk), mk(hkv, nk), mk(hq, n)
            ref = reference_grads(q, k, v, do, causal=causal)
            out, lse = torch.empty_like(q), torch.empty(b, hq, n, device="cuda")
            kernels.forward_into(q, k, v, out, lse, causal, D ** -0.5)
            line = []
            for name, cfg in variants(causal).items():
                grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
                kernels.backward_into(do, q, k, v, out, lse, None, *grads, causal, D ** -0.5, gluon=cfg)
                errs = [error_over_floor(x, r) for x, r in zip(grads, ref)]
                written = not any(x.isnan().any().item() for x in grads)
                ok = max(errs) < 4 and written
                ok_all &= ok
                res["check"].append(dict(variant=name, causal=causal, dtype=str(dtype), shape=[b, hq, hkv, n, nk],
                                         dq=errs[0], dk=errs[1], dv=errs[2], written=written))
                line.append(f"{name} {errs[0]:.2f}/{errs[1]:.2f}/{errs[2]:.2f}{'' if ok else ' FAIL'}")
            print(f"check causal={causal} {str(dtype)[6:]} B{b} H{hq}/{hkv} N{n} Nk{nk} (dq/dk/dv err/floor): "
                  + "; ".join(line), flush=True)
    return ok_all


def time_all(res, lengths, rounds, causals):
    for causal in causals:
        for n in lengths:
            run, cudnn, fl, grads = backward_case(n, D, causal)
            fns = {name: (lambda c=cfg, run=run: run(gluon=c)) for name, cfg in variants(causal).items()}
            fns["cuDNN"] = cudnn
            row = ratios_to("cuDNN", fns, fl, rounds, warmup_ms=10, rep_ms=50, grad_to_none=grads)
            res["time"][f"N{n}{' causal' if causal else ''}"] = row
            print(f"time D{D} N{n} causal={causal}: " + ", ".join(
                f"{nm} {r['tflops']:.0f} ({r['ratio']:.3f}x, {r['lo']:.2f}-{r['hi']:.2f})" for nm, r in row.items()),
                flush=True)
            del run, cudnn, grads, fns
            torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--lengths", default="4096")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--causal", default="0,1", help="0: without a mask, 1: causal")
    ap.add_argument("--round-robin", action="store_true", help="causal: also the round-robin tile order")
    args = ap.parse_args()
    global ROUND_ROBIN
    ROUND_ROBIN = args.round_robin
    causals = [bool(int(x)) for x in args.causal.split(",")]
    res = {"meta": meta(), "check": [], "time": {}}
    ok = check(res, causals)
    json.dump(res, open(os.path.join(args.out, "bwd_split.json"), "w"), indent=1)
    if not ok:
        print("CHECK FAILED: not timed")
        return 1
    time_all(res, [int(x) for x in args.lengths.split(",")], args.rounds, causals)
    json.dump(res, open(os.path.join(args.out, "bwd_split.json"), "w"), indent=1)
    print("\nsummary: ratio to cuDNN (median of rounds)")
    for case, row in res["time"].items():
        print(f"{case}: " + "; ".join(f"{nm} {r['ratio']:.3f}" for nm, r in row.items() if nm != "cuDNN"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
