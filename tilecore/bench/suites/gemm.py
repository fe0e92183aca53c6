"""GEMM: tilecore.gemm against cuBLAS (torch.matmul) in bf16, and tilecore.gemm_fp8 against
torch._scaled_mm in e4m3 (row-wise scales, bf16 out). Ceiling: cuBLAS bf16 at 8192^3.

Cases (x axis: K): square M = N = K; ThunderKittens' persistent case M = N = 4096 with small K;
fp8 square. Every figure is a do_bench median over rotating input sets.
"""
from __future__ import annotations

import torch

from tilecore.bench.case import Case, Suite
from tilecore.bench.harness import rotating


def _bf16(M, N, K, fn):
    def build():
        import tilecore

        nxt = rotating(lambda: (torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
                                torch.randn(K, N, device="cuda", dtype=torch.bfloat16)), 2 * (M * K + K * N + M * N))
        f = {"tilecore": tilecore.gemm, "cuBLAS": torch.matmul}[fn]

        def run():
            a, b = nxt()
            return f(a, b)
        return run
    return build


def _fp8(M, N, K, fn):
    def build():
        import tilecore

        def make():
            a = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
            b = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
            return a, b, torch.rand(M, 1, device="cuda") + 0.5, torch.rand(1, N, device="cuda") + 0.5
        nxt = rotating(make, M * K + K * N + 2 * M * N)

        def run():
            a, b, sa, sb = nxt()
            if fn == "tilecore":
                return tilecore.gemm_fp8(a, b, sa, sb)
            return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
        return run
    return build


def cases(quick: bool) -> list[Case]:
    out = []
    squares = [4096, 8192] if quick else [1024, 2048, 4096, 8192, 16384]
    for s in squares:
        out.append(Case({"case": "bf16 M=N=K", "K": s},
                        {"tilecore": _bf16(s, s, s, "tilecore"), "cuBLAS (torch.matmul)": _bf16(s, s, s, "cuBLAS")},
                        flops=2 * s**3))
    for k in ([64, 256, 1024] if quick else [64, 128, 256, 512, 1024]):
        out.append(Case({"case": "bf16 M=N=4096", "K": k},
                        {"tilecore": _bf16(4096, 4096, k, "tilecore"),
                         "cuBLAS (torch.matmul)": _bf16(4096, 4096, k, "cuBLAS")}, flops=2 * 4096 * 4096 * k))
    for s in ([8192] if quick else [4096, 8192, 16384]):
        out.append(Case({"case": "fp8 M=N=K", "K": s},
                        {"tilecore": _fp8(s, s, s, "tilecore"), "torch._scaled_mm": _fp8(s, s, s, "scaled_mm")},
                        flops=2 * s**3))
    return out


SUITE = Suite("gemm", ceiling="matmul", metric="TFLOP/s", x="K", cases=cases,
              describe="bf16 GEMM vs cuBLAS (square, and M=N=4096 with small K); e4m3 GEMM vs torch._scaled_mm")
