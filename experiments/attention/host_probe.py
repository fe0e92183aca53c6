"""Host time against GPU time of tilecore.attention's short calls, next to SDPA's cuDNN backend.

    PYTHONPATH=. python3 experiments/attention/host_probe.py [--out DIR] [--profile]

For each case (the attention bench's short causal forwards, a long one for contrast, and a decode
step) and implementation: the host time of a call (200 calls with no sync between them), the bench's
time (do_bench median, L2 flushed before each call, what `tilecore bench attention` reports) and the
GPU time alone (CUDA graph of back-to-back calls). Where host time is over the flush's GPU time, the
bench's figure holds host time, not the kernel's. --profile LABEL adds a cProfile of tilecore's call;
--only LABEL runs only the cases whose label starts so.
--parts: where a call's host time goes (best of rounds): the public call, launch.forward_into (plan
and launch), plan.plan_forward alone, launch.forward of a plan made once, the public function's
checks (op.check), plain_eager and its output allocations.

(Until the tiles v2 port --parts also timed forward_into with tiles.launch's fast path switched off
and with CachedLaunch._launch_here replaced, which patched internals: git show
bb6b420:experiments/attention/host_probe.py; figures in notes/attention/.)
"""
import argparse
import cProfile
import json
import os
import pstats
import time

import torch

# (label, B, Hq, Hkv, N, Nk, D, causal): the bench's tokens (B N = 65536, H 16) and a decode step
CASES = [("fwd N512 D128 causal", 128, 16, 16, 512, 512, 128, True),
         ("fwd N512 D64 causal", 128, 16, 16, 512, 512, 64, True),
         ("fwd N1024 D128 causal", 64, 16, 16, 1024, 1024, 128, True),
         ("fwd N1024 D64 causal", 64, 16, 16, 1024, 1024, 64, True),
         ("fwd N512 D128", 128, 16, 16, 512, 512, 128, False),
         ("fwd N4096 D128 causal", 16, 16, 16, 4096, 4096, 128, True),
         ("decode B1 Nk4096", 1, 32, 8, 1, 4096, 128, False)]
PARTS_CASES = ("fwd N512 D128 causal", "decode B1 Nk4096")


def _sdpa(backend):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def f(q, k, v, causal):
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return f


def _impls():
    import tilecore
    from tilecore.ops.attention import launch

    def direct(q, k, v, causal):  # plan and launch alone: outputs made here, no checks or custom op
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
        launch.forward_into(q, k, v, out, lse, causal, q.shape[-1] ** -0.5)
        return out
    return {"tilecore": lambda q, k, v, c: tilecore.attention(q, k, v, causal=c), "forward_into": direct,
            "cuDNN (SDPA)": _sdpa("CUDNN_ATTENTION")}


def flush_us():
    """GPU time of do_bench's L2 flush (a 256 MB memset): host time under it is hidden."""
    cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    from tilecore.bench.harness import graph_median_ms
    return graph_median_ms(lambda: cache.zero_()) * 1e3


def best_us(f):
    """Host time of a call: the best of 5 rounds of 300 calls (harness.host_us)."""
    from tilecore.bench.harness import host_us

    return host_us(f, calls=300, rounds=5)


def parts(label, q, k, v, causal):
    """Host time of the pieces of one call, in us (best of rounds)."""
    import tilecore
    from tilecore import dispatch
    from tilecore.ops.attention import launch, op, plan

    scale = q.shape[-1] ** -0.5
    out, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
    into = lambda: launch.forward_into(q, k, v, out, lse, causal, scale)
    made = plan.plan_forward(q, k, v, causal, scale)
    row = {"case": label}
    with torch.no_grad():
        row["public"] = best_us(lambda: tilecore.attention(q, k, v, causal=causal))
        row["forward_into"] = best_us(into)
        row["plan_forward"] = best_us(lambda: plan.plan_forward(q, k, v, causal, scale))
        row["forward (planned)"] = best_us(lambda: launch.forward(made, q, k, v, out, lse, causal, scale))
        row["check"] = best_us(lambda: op.check(q, k, v, causal, None))
        row["plain_eager"] = best_us(lambda: dispatch.plain_eager(q, k, v))
        row["out + lse"] = best_us(lambda: (torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")))
    print(label + ": " + ", ".join(f"{n} {t:.1f}" for n, t in row.items() if n != "case"), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--profile", default=None, help="cProfile tilecore's call in the cases whose label starts so")
    ap.add_argument("--only", default=None, help="run only the cases whose label starts so")
    ap.add_argument("--parts", action="store_true")
    args = ap.parse_args()
    import triton
    from tilecore.bench.harness import graph_median_ms, host_us, median_ms

    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "commit": os.environ.get("TILECORE_COMMIT"), "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    result = {"meta": meta, "flush_us": flush_us(), "rows": [], "parts": []}
    print(meta, f"flush {result['flush_us']:.1f} us", flush=True)
    impls = _impls()
    for label, b, hq, hkv, n, nk, d, causal in CASES:
        if args.only and not label.startswith(args.only):
            continue
        torch.manual_seed(0)
        q = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hkv, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        with torch.no_grad():
            for name, impl in impls.items():
                f = lambda: impl(q, k, v, causal)
                row = dict(case=label, impl=name, host_us=host_us(f), bench_us=median_ms(f) * 1e3,
                           gpu_us=graph_median_ms(f) * 1e3)
                result["rows"].append(row)
                print(f"{label:24} {name:14} host {row['host_us']:6.1f} us  bench {row['bench_us']:7.1f} us  "
                      f"GPU {row['gpu_us']:7.1f} us", flush=True)
            if args.profile and label.startswith(args.profile):
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(1000):
                    impls["tilecore"](q, k, v, causal)
                prof.disable()
                torch.cuda.synchronize()
                pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        if args.parts and label in PARTS_CASES:
            result["parts"].append(parts(label, q, k, v, causal))
        with open(os.path.join(args.out, "host_probe.json"), "w") as fh:
            json.dump(result, fh, indent=1)
    print("\ncase | impl | host us | bench us | GPU us | bench / GPU")
    for r in result["rows"]:
        print(f"{r['case']} | {r['impl']} | {r['host_us']:.1f} | {r['bench_us']:.1f} | {r['gpu_us']:.1f} | "
              f"{r['bench_us'] / r['gpu_us']:.2f}")
    if result["parts"]:
        names = [n for n in result["parts"][0] if n != "case"]
        print("\nhost us | " + " | ".join(names))
        for r in result["parts"]:
            print(r["case"] + " | " + " | ".join(f"{r[n]:.1f}" for n in names))


if __name__ == "__main__":
    main()
