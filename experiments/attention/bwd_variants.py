"""The Gluon backward's planned configs against variants of them and cuDNN, at D = 64 or 128, all
through launch.backward_into(path="gluon", config=...) (plan.plan_backward's forced path and config).

1. check: every variant meant to be correct, on small GQA shapes with tails (and, causal, rows with
   no key) against a float64 reference, gradients NaN-poisoned first: error over the rounding
   floor, all written. Each variant is checked (and its kernels compiled for the timing shape) in a
   child process of its own, all at once, so that the parent's timing finds them compiled.
2. time: B16 H16 bf16 at N = --lengths, every variant next to cuDNN's backward, --rounds interleaved
   rounds; median TFLOP/s and the median (min-max) of the per-round ratios to cuDNN.

Sets (--set): "shipped" (configs.GLUON_BACKWARD's configs, checked and timed, and their dK/dV kernel
alone: launch.launch_backward_gluon_kernel of a plan made once, the preprocess done once outside);
"stages" (their ring depth); "det" (the deterministic mode's config: dQ by the Gluon dq kernel).

(Until the tiles v2 port it also had sets for unshipped variants: the query split, dQ overlapped,
lagged or by a warpgroup where not shipped, K and V in registers, drawn tiles, and an ablation
that needed a patch: git show bb6b420:scripts/device/bwd_variants.py; figures in notes/attention/.)

    PYTHONPATH=. python3 experiments/attention/bwd_variants.py --set shipped [--d 64,128] [--causal 0,1]
        [--lengths 4096] [--rounds 5] [--out DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
import torch  # noqa: E402

from experiments.attention.cases import backward_case  # noqa: E402
from experiments.common.meta import meta  # noqa: E402
from tilecore.accuracy import error_over_floor  # noqa: E402
from tilecore.bench.harness import ratios_to  # noqa: E402
from tilecore.ops.attention import configs, launch, plan  # noqa: E402
from tilecore.ops.attention.reference import reference_grads  # noqa: E402


def variants(set_name, d, causal):
    """name -> (config, checked): a Gluon config for launch.backward_into(path="gluon", config=), or
    with kernel_alone the kernel-alone call's config (not checked: its dQ is not finished)."""
    shipped = dict(configs.GLUON_BACKWARD[d, causal])  # at N = 4096 (configs.gluon_backward_config)
    if set_name == "shipped":
        return {"shipped": (shipped, True), "kernel alone": (dict(shipped, kernel_alone=True), False)}
    if set_name == "det":  # the deterministic mode's config (dq by the Gluon dq kernel) against the default
        return {"shipped": (shipped, True), "dq kernel (deterministic)": (dict(shipped, dq_from="gluon", kv_regs=False), True)}
    if set_name == "stages":  # ring depth of the launcher's config
        return {"shipped": (shipped, True), "3 stages": (dict(shipped, stages=3), True),
                "4 stages": (dict(shipped, stages=4), True)}
    raise ValueError(set_name)


CHECK_SHAPES = ((torch.bfloat16, (2, 4, 2, 700, 900)), (torch.bfloat16, (1, 4, 1, 1000, 300)),
                (torch.float16, (1, 2, 2, 4097, 4097)), (torch.bfloat16, (2, 2, 2, 1, 17)),
                (torch.bfloat16, (2, 8, 8, 1500, 1500)))


def kernel_alone(case, cfg):
    """A call of the Gluon kernel alone (the preprocess done and the plan made once, outside)."""
    q, k, v, do, out, lse, causal, scale = case
    opts = {key: val for key, val in cfg.items() if key != "kernel_alone"}
    fused = configs.DQ_MODES[opts["dq_from"]] > 0
    _, dq_sum, stats = launch.backward_preprocess(out, do, lse, None, dq_sum=fused, row_stats=True)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    p = plan.plan_backward(do, q, k, v, causal, scale, path="gluon", config=opts)
    return lambda: launch.launch_backward_gluon_kernel(p, do, q, k, v, stats, dq_sum, dk, dv, causal, scale)


def check_one(set_name, d, causal, name, lengths):
    """Child process: check variant ``name`` (if it is meant to be correct) and compile it for the
    timing shapes; prints one JSON line of check rows."""
    cfg, checked = variants(set_name, d, causal)[name]
    rows = []
    if checked:
        for dtype, (b, hq, hkv, n, nk) in CHECK_SHAPES:
            g = torch.Generator(device="cuda").manual_seed(d + causal + n)
            mk = lambda h, length: torch.randn(b, h, length, d, device="cuda", dtype=dtype, generator=g)
            q, k, v, do = mk(hq, n), mk(hkv, nk), mk(hkv, nk), mk(hq, n)
            ref = reference_grads(q, k, v, do, causal=causal)
            out, lse = torch.empty_like(q), torch.empty(b, hq, n, device="cuda")
            launch.forward_into(q, k, v, out, lse, causal, d ** -0.5)
            grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
            launch.backward_into(do, q, k, v, out, lse, None, *grads, causal, d ** -0.5, path="gluon", config=cfg)
            errs = [error_over_floor(x, r) for x, r in zip(grads, ref)]
            written = not any(x.isnan().any().item() for x in grads)
            rows.append(dict(variant=name, D=d, causal=causal, dtype=str(dtype), shape=[b, hq, hkv, n, nk], dq=errs[0],
                             dk=errs[1], dv=errs[2], written=written, ok=max(errs) < 4 and written))
    for n in lengths:  # compile for the timing shapes
        run, cudnn, fl, grads, case = timing_case(n, d, causal)
        (kernel_alone(case, cfg) if cfg.get("kernel_alone") else lambda: run(config=cfg))()
        torch.cuda.synchronize()
    print("CHECK " + json.dumps(rows), flush=True)


def timing_case(n, d, causal):
    run, cudnn, fl, grads = backward_case(n, d, causal)
    return run, cudnn, fl, grads, run.inputs + (causal, d ** -0.5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--set", default="shipped", choices=("shipped", "stages", "det"))
    ap.add_argument("--d", default="64")
    ap.add_argument("--lengths", default="4096")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--causal", default="0,1", help="0: without a mask, 1: causal")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.child:
        d, causal, name = json.loads(args.child)
        check_one(args.set, d, causal, name, lengths)
        return 0
    cases = [(int(d), bool(int(c))) for d in args.d.split(",") for c in args.causal.split(",")]
    res = {"meta": meta(), "set": args.set, "check": [], "time": {}}
    t0 = time.time()
    children = []
    for d, causal in cases:
        for name in variants(args.set, d, causal):
            cmd = [sys.executable, __file__, "--set", args.set, "--lengths", args.lengths,
                   "--child", json.dumps([d, causal, name])]
            children.append(((d, causal, name), subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)))
    ok = True
    for key, proc in children:
        try:
            text, _ = proc.communicate(timeout=480)
        except subprocess.TimeoutExpired:  # a hang (a barrier never completed): the GPU is still usable
            proc.kill()
            text, _ = proc.communicate()
        lines = [ln for ln in text.splitlines() if ln.startswith("CHECK ")]
        if proc.returncode != 0 or not lines:
            print(f"{key}: child failed (rc {proc.returncode})", flush=True)
            ok = False
            continue
        for row in json.loads(lines[-1][6:]):
            res["check"].append(row)
            ok &= row["ok"]
            print(f"check D{row['D']} causal={row['causal']} {row['dtype'][6:]} {row['shape']} {row['variant']}: "
                  f"dq {row['dq']:.2f} dk {row['dk']:.2f} dv {row['dv']:.2f}{'' if row['ok'] else '  FAIL'}", flush=True)
    print(f"checks and compiles: {time.time() - t0:.0f} s", flush=True)
    json.dump(res, open(os.path.join(args.out, f"bwd_{args.set}.json"), "w"), indent=1)
    if not ok:
        print("CHECK FAILED: not timed")
        return 1
    for d, causal in cases:
        for n in lengths:
            run, cudnn, fl, grads, case = timing_case(n, d, causal)
            fns = {}
            for name, (cfg, _) in variants(args.set, d, causal).items():
                fns[name] = kernel_alone(case, cfg) if cfg.get("kernel_alone") else (lambda c=cfg: run(config=c))
            fns["cuDNN"] = cudnn
            row = ratios_to("cuDNN", fns, fl, args.rounds, warmup_ms=10, rep_ms=50, grad_to_none=grads)
            res["time"][f"D{d} N{n}{' causal' if causal else ''}"] = row
            print(f"time D{d} N{n} causal={causal}: " + ", ".join(
                f"{nm} {r['tflops']:.0f} ({r['ratio']:.3f}x, {r['lo']:.2f}-{r['hi']:.2f})" for nm, r in row.items()),
                flush=True)
            json.dump(res, open(os.path.join(args.out, f"bwd_{args.set}.json"), "w"), indent=1)
            del run, cudnn, grads, fns, case
            torch.cuda.empty_cache()
    print("\nsummary: ratio to cuDNN (median of rounds)")
    for key, row in res["time"].items():
        print(f"{key}: " + "; ".join(f"{nm} {r['ratio']:.3f}" for nm, r in row.items() if nm != "cuDNN"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
