"""The tour's GEMM cases: one bf16 GEMM and one fp8 GEMM, big on a GPU, small on the CPU."""
from __future__ import annotations

import torch

from tilecore.ops.gemm import reference
from tilecore.ops.gemm.op import gemm, gemm_fp8
from tilecore.tour_case import TourCase


def cases(device: torch.device) -> list:
    gpu = device.type == "cuda"
    n = 4096 if gpu else 96
    m, k = (n, n) if gpu else (80, 72)
    dt = torch.bfloat16
    a = torch.randn(m, k, device=device, dtype=dt)
    b = torch.randn(k, n, device=device, dtype=dt)
    out = [TourCase("gemm", f"{m}x{k} @ {k}x{n}", dt, lambda: gemm(a, b), lambda: reference.gemm_f64(a, b),
                    flops=2 * m * n * k, bound="compute")]
    a8 = (torch.randn(m, k, device=device) * 8).to(torch.float8_e4m3fn)
    b8 = (torch.randn(n, k, device=device) * 8).to(torch.float8_e4m3fn).t()
    sa = torch.rand(m, 1, device=device) / 64 + 1 / 128
    sb = torch.rand(1, n, device=device) / 64 + 1 / 128
    out.append(TourCase("gemm_fp8", f"{m}x{k} @ {k}x{n} (row scales)", dt,
                        lambda: gemm_fp8(a8, b8, sa, sb), lambda: reference.gemm_fp8_f64(a8, b8, sa, sb),
                        flops=2 * m * n * k, bound="compute-fp8"))
    return out
