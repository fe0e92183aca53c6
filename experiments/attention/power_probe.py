"""The H100's SM clock and power while the attention backward runs back to back: tilecore's (the
launcher's config) against cuDNN's, each in turn for --seconds, several turns, sampled by nvidia-smi
every 50 ms (the first second of each run dropped). Under the board's power limit the clock falls
to what the work's power allows (session 19's timeline: 1728 MHz for a launch alone, 1533 MHz for
the last of 20 back to back), so two kernels of the same work compare by their energy as much as
by their cycles: a kernel at a lower clock than its peer spends more energy per FLOP.

Also the forward (--passes fwd: tilecore.attention against SDPA's cuDNN forward, same inputs).

    PYTHONPATH=. python3 experiments/attention/power_probe.py [--passes bwd,fwd] [--d 128] [--causal 0] [--n 4096] [--out DIR]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from experiments.attention.cases import backward_case  # noqa: E402
from experiments.common.meta import meta  # noqa: E402


def sampled(fn, seconds: float):
    """Run fn back to back for ``seconds`` while nvidia-smi samples; (calls a second, samples)."""
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                            "--format=csv,noheader,nounits", "-lms", "50"], stdout=subprocess.PIPE, text=True)
    torch.cuda.synchronize()
    t0 = time.time()
    calls = 0
    while time.time() - t0 < seconds:
        for _ in range(5):
            fn()
        calls += 5
        torch.cuda.synchronize()
    elapsed = time.time() - t0
    smi.terminate()
    text, _ = smi.communicate()
    rows = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            rows.append((float(parts[0]), float(parts[1]), float(parts[2])))
        except (ValueError, IndexError):
            continue
    rows = rows[len(rows) // max(1, int(seconds)):]  # drop the first second
    return calls / elapsed, rows


def forward_case(n: int, d: int, causal: bool):
    """(tilecore's forward, cuDNN's, flops) at B * N = 16 x 4096 tokens a head, H 16, bf16."""
    import tilecore
    b = 16 * 4096 // n
    q, k, v = (torch.randn(b, 16, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return lambda: tilecore.attention(q, k, v, causal=causal), cudnn, 4 * b * 16 * n * n * d / (2 if causal else 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--d", default="128")
    ap.add_argument("--causal", default="0")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--passes", default="bwd")
    args = ap.parse_args()
    res = {"meta": meta(), "cases": {}}
    cases = [(p, int(d), bool(int(c))) for p in args.passes.split(",") for d in args.d.split(",")
             for c in args.causal.split(",")]
    for which, d, causal in cases:
        if which == "fwd":
            run, cudnn_call, flops = forward_case(args.n, d, causal)
        else:
            run, cudnn, flops, grads = backward_case(args.n, d, causal)

            def cudnn_call(cudnn=cudnn, grads=grads):
                for t in grads:
                    t.grad = None
                cudnn()

        fns = {"tilecore": run, "cuDNN": cudnn_call}
        for fn in fns.values():
            fn()
        per = {name: [] for name in fns}
        for _ in range(args.turns):
            for name, fn in fns.items():
                rate, rows = sampled(fn, args.seconds)
                per[name].append(dict(tflops=rate * flops / 1e12, mhz=statistics.median(r[0] for r in rows),
                                      watts=statistics.median(r[1] for r in rows),
                                      temp=statistics.median(r[2] for r in rows)))
                p = per[name][-1]
                print(f"{which} D{d} N{args.n} causal={causal} {name}: {p['tflops']:.0f} TFLOP/s at {p['mhz']:.0f} MHz, "
                      f"{p['watts']:.0f} W, {p['temp']:.0f} C", flush=True)
        key = f"{which} D{d} N{args.n}{' causal' if causal else ''}"
        res["cases"][key] = per
        json.dump(res, open(os.path.join(args.out, "power_probe.json"), "w"), indent=1)
        summary = {name: {k: statistics.median(p[k] for p in rows) for k in ("tflops", "mhz", "watts")}
                   for name, rows in per.items()}
        print(f"{key} (medians of turns): " + "; ".join(
            f"{name} {s['tflops']:.0f} TFLOP/s, {s['mhz']:.0f} MHz, {s['watts']:.0f} W, "
            f"{s['tflops'] / s['watts']:.3f} TFLOP/J-ish" for name, s in summary.items()), flush=True)
        del run, cudnn_call, fns
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
