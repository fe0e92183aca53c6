"""Reference GEMMs with PyTorch operations: what CPU tensors get without the interpreter, and what
tests compare against (in float64)."""
from __future__ import annotations

import torch


def gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    out = a.float() @ b.float()
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def gemm_fp8(a, b, scale_a, scale_b, out_dtype):
    out = (a.float() @ b.float()) * scale_a.float().reshape(-1, 1) * scale_b.float().reshape(1, -1)
    return out.to(out_dtype)


def gemm_f64(a, b, bias=None):
    out = a.double() @ b.double()
    return out if bias is None else out + bias.double()


def gemm_fp8_f64(a, b, scale_a, scale_b):
    return (a.double() @ b.double()) * scale_a.double().reshape(-1, 1) * scale_b.double().reshape(1, -1)
