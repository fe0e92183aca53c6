"""Where an eager call's host time goes: cProfile over many back-to-back calls of one op (GPU work
small enough that the host is the limit), the top functions by own time and by cumulative time, and
the per-call wall time.

    python experiments/common/host_profile.py gemm|attention|hadamard [--calls 2000]
"""
import argparse
import cProfile
import pstats
import time

import torch


def op(name):
    import tilecore
    if name == "gemm":
        a = torch.randn(4096, 128, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(128, 4096, device="cuda", dtype=torch.bfloat16)
        return lambda: tilecore.gemm(a, b), lambda: a @ b
    if name == "attention":
        q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
        return (lambda: tilecore.attention(q, k, k),
                lambda: torch.nn.functional.scaled_dot_product_attention(q, k, k, enable_gqa=True))
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    return lambda: tilecore.hadamard_transform(x), lambda: x.clone()


def per_call_us(fn, calls):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("op", nargs="+")
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    for name in a.op:
        fn, peer = op(name)
        print(f"== {name}: {per_call_us(fn, a.calls):.1f} us a call (torch peer {per_call_us(peer, a.calls):.1f} us)")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.calls):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        stats = pstats.Stats(prof)
        stats.sort_stats("tottime").print_stats(14)
        stats.sort_stats("cumulative").print_stats(22)


if __name__ == "__main__":
    main()
