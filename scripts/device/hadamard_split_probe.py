"""n = 32768 with each row split between two programs (hadamard_kernel's HALVES = 2): one device call.

H_n = H_2 (x) H_{n/2}: half h of a row's output is H_{n/2} (top + (-1)^h bottom). Each program then
holds half a row's transforms (the state that limited the one-program-a-row kernels to ~93% of copy),
and reads the row twice, the second time mostly from L2. Each variant is checked (fp16 and bf16,
poisoned, tail rows, against float64), then timed at 2^28 elements in two interleaved rounds next to
the shipped dispatch (Gluon) and Triton's one-program-a-row kernel, with the copy ceiling in the run.

    PYTHONPATH=. python3 scripts/device/hadamard_split_probe.py
"""
import json
import multiprocessing
import os
import time

import torch

E = 2**28
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# (n, name, launch keywords for kernels.launch; {} is the shipped dispatch)
VARIANTS = [
    (32768, "shipped (gluon)", {}),
    (32768, "triton row", dict(tma="both", waves=2)),
    (32768, "split 4x64x64 s3", dict(tma="both", halves=2, plan=(4, 64, 64), num_stages=3, waves=1)),
    (32768, "split 4x64x64 s2", dict(tma="both", halves=2, plan=(4, 64, 64), num_stages=2, waves=1)),
    (32768, "split 4x64x64 s3 4warps", dict(tma="both", halves=2, plan=(4, 64, 64), num_stages=3, waves=1,
                                             num_warps=4)),
    (32768, "split 4x64x64 s2 4warps w2", dict(tma="both", halves=2, plan=(4, 64, 64), num_stages=2, waves=2,
                                                num_warps=4)),
    (32768, "split 2x128x64 s2", dict(tma="both", halves=2, plan=(2, 128, 64), num_stages=2, waves=1)),
    (32768, "split 4x64x64 ptr", dict(tma="none", halves=2, plan=(4, 64, 64), num_stages=3, waves=1)),
    (16384, "shipped", {}),
    (16384, "split 2x64x64 s3", dict(tma="both", halves=2, plan=(2, 64, 64), num_stages=3, waves=1)),
]


def run(n, x, out, tuning, sms):
    from tilecore.ops.hadamard import kernels

    kernels.launch(x, out, n**-0.5, interpret=False, num_sms=sms, **tuning)


def warm(specs):
    from tilecore import dispatch

    sms = dispatch.num_sms(torch.device("cuda"))
    failed = []
    for n, dt, tuning in specs:
        try:
            x = torch.randn(E // n, n, dtype=DTYPES[dt], device="cuda")
            run(n, x, torch.empty_like(x), tuning, sms)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - reported by the measured run
            failed.append((n, dt, repr(tuning), f"{type(e).__name__}: {str(e)[:160]}"))
    return failed


def main():
    from tilecore import accuracy, dispatch, env
    from tilecore.bench.harness import copy_ceiling, median_ms
    from tilecore.ops.hadamard import hadamard_reference

    t0 = time.time()
    out_dir = os.environ.get("OUT", ".")
    print(env.report(), flush=True)
    sms = dispatch.num_sms(torch.device("cuda"))
    specs = [(n, dt, tuning) for n, _, tuning in VARIANTS for dt in DTYPES]
    with multiprocessing.get_context("spawn").Pool(8) as pool:
        failed = [f for part in pool.map(warm, [specs[i::8] for i in range(8)]) for f in part]
    print(f"warm-up: {len(specs)} compiled, failed: {failed} [{time.time() - t0:.0f}s]", flush=True)

    report = {"meta": env.metadata(), "variants": {}}
    ceil = copy_ceiling()
    report["copy_GBps"] = [ceil.value]
    for n, name, tuning in VARIANTS:
        rec = report["variants"].setdefault(f"{n} {name}", {"n": n, "tuning": repr(tuning), "pct": {}})
        try:
            for dt, dtype in DTYPES.items():
                x = torch.randn(2**24 // n + 3, n, dtype=dtype, device="cuda")
                out = torch.full_like(x, float("nan"))
                run(n, x, out, tuning, sms)
                ref = hadamard_reference(x, n**-0.5, out_dtype=torch.float64)
                rec[f"{dt}_over_floor"] = (accuracy.error_over_floor(out, ref) if bool(torch.isfinite(out).all())
                                           else float("inf"))
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"{type(e).__name__}: {str(e)[:200]}"

    inputs = {(n, dt): torch.randn(E // n, n, dtype=dtype, device="cuda") for n in (16384, 32768)
              for dt, dtype in DTYPES.items()}
    outs = {k: torch.empty_like(v) for k, v in inputs.items()}
    for rnd in range(2):
        for n, name, tuning in VARIANTS:
            rec = report["variants"][f"{n} {name}"]
            if "error" in rec:
                continue
            for dt in (("fp16", "bf16") if rnd == 0 else ("fp16",)):
                x, out = inputs[(n, dt)], outs[(n, dt)]
                ms = median_ms(lambda: run(n, x, out, tuning, sms))
                rec["pct"].setdefault(dt, []).append(100 * (2 * x.numel() * x.element_size() / ms / 1e6) / ceil.value)
        report["copy_GBps"].append(copy_ceiling().value)
        print(f"round {rnd} done [{time.time() - t0:.0f}s]", flush=True)
    with open(os.path.join(out_dir, "hadamard_split_probe.json"), "w") as f:
        json.dump(report, f, indent=1)

    print(f"copy GB/s: {[round(c) for c in report['copy_GBps']]}")
    print(f"{'variant':34s} {'err fp16':>8s} {'err bf16':>8s}  % of copy fp16 (2 rounds) / bf16")
    for key, rec in report["variants"].items():
        if "error" in rec:
            print(f"{key:34s} ERROR {rec['error']}")
            continue
        p = rec["pct"]
        print(f"{key:34s} {rec['fp16_over_floor']:8.5f} {rec['bf16_over_floor']:8.5f}  "
              f"{' '.join(f'{v:5.1f}' for v in p.get('fp16', []))} / {' '.join(f'{v:5.1f}' for v in p.get('bf16', []))}")


if __name__ == "__main__":
    main()
