"""configs.ONE_LAUNCH_WHEN_RECORDING on the GPU (issue 31's "attention N256 recording a gradient" host row): an eager
call recording a gradient on the split-key path's inputs planned on the one-launch Gluon forward instead.

    python experiments/attention/gpu_recording_one_launch.py [--rounds 5] [--calls 300]

1. Right: with the switch on, O and dq, dk, dv of the public call (autograd) against float64 (poisoned .grad
   buffers are not possible through autograd: the outputs are checked for NaN left, as gpu_script.check does), for
   D64 / D128, full / causal, GQA; the switch off beside (the shipped split-key plan).
2. Fast: the host time of the recorded forward call (host_time.py's row: B1 H8 N256 D64) on vs off in interleaved
   rounds, SDPA's beside; the GPU time of forward + backward (do_bench, which includes the host's launches at
   these sizes) on vs off.
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
import tilecore  # noqa: E402
from experiments.common.gpu_script import Run, check, host_rounds, time_rounds  # noqa: E402
from tilecore.ops.attention import attention_reference, configs  # noqa: E402
from tilecore.tiles.switches import patched  # noqa: E402

CASES = [  # (B, Hq, Hkv, N, D, causal): inputs the split-key path serves (decode_fits)
    (1, 8, 8, 256, 64, False), (1, 8, 8, 256, 64, True), (1, 8, 8, 256, 128, False),
    (1, 8, 8, 256, 128, True), (2, 8, 2, 128, 64, True), (1, 4, 4, 200, 64, True),
]


def inputs(b, hq, hkv, n, d, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda h: torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)  # noqa: E731
    return mk(hq), mk(hkv), mk(hkv), torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)


def checked(run, case, on):
    b, hq, hkv, n, d, causal = case
    q, k, v, dout = inputs(*case[:5], seed=hash(case) & 0xFFFF)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    with patched(configs, ONE_LAUNCH_WHEN_RECORDING=on):
        out = tilecore.attention(qg, kg, vg, causal=causal)
        out.backward(dout)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    ref, _ = attention_reference(q64, k64, v64, causal=causal)
    ref.backward(dout.double())
    res = {f"{name}_x": check(got, want, tol=3.0) for name, got, want in
           (("o", out, ref), ("dq", qg.grad, q64.grad), ("dk", kg.grad, k64.grad), ("dv", vg.grad, v64.grad))}
    run.row(f"check {'on' if on else 'off'} B{b} H{hq}/{hkv} N{n} D{d}{' causal' if causal else ''}",
            passed=all(r["pass"] for r in res.values()),
            err_over_floor="/".join(f"{r.get('err_over_floor')}" for r in res.values()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=300)
    a = ap.parse_args()
    run = Run("recording_one_launch", deadline=60)
    for case in CASES:
        for on in (True, False):
            run.attempt(f"check {case} {on}", checked, run, case, on)
    # the host row: host_time.py's "attention N256 (grad recorded)" inputs (B1 H8 N256 D64, bf16)
    q, k, v, dout = inputs(1, 8, 8, 256, 64)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

    def recorded(on):
        def call():
            with patched(configs, ONE_LAUNCH_WHEN_RECORDING=on):
                return tilecore.attention(qg, kg, vg)
        return call

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(qg, kg, vg)

    # (patched's with-block costs the same on both sides; its own cost is timed too, with a no-op body)
    def patch_only():
        with patched(configs, ONE_LAUNCH_WHEN_RECORDING=False):
            return None

    res = host_rounds({"on": recorded(True), "off": recorded(False), "sdpa": sdpa, "patch": patch_only},
                      rounds=a.rounds, calls=a.calls)
    run.row("host us, recorded forward N256 D64", on_us=res["on_us"], off_us=res["off_us"], sdpa_us=res["sdpa_us"],
            patch_us=res["patch_us"], rounds={k: v for k, v in res.items() if k.endswith("rounds")})

    def step(on, causal):
        def call():
            with patched(configs, ONE_LAUNCH_WHEN_RECORDING=on):
                out = tilecore.attention(qg, kg, vg, causal=causal)
            out.backward(dout)
            qg.grad = kg.grad = vg.grad = None
        return call

    for causal in (False, True):
        t = time_rounds({"on": step(True, causal), "off": step(False, causal)}, rounds=3)
        run.row(f"fwd+bwd ms N256 D64{' causal' if causal else ''} (do_bench, eager)", on_ms=t["on_ms"],
                off_ms=t["off_ms"], ratio=round(t["on_ms"] / t["off_ms"], 3))
    run.finish(["name", "passed", "err_over_floor", "on_us", "off_us", "sdpa_us", "patch_us", "on_ms", "off_ms",
                "ratio"])


if __name__ == "__main__":
    main()
