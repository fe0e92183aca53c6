"""Attention: tilecore.attention against torch SDPA's cuDNN and flash (FlashAttention-2) backends,
bf16, forward and backward, head dims 64 and 128, causal and not. Ceiling: cuBLAS bf16 matmul.

FLOPs: forward 4 B H N^2 D (the two matmuls), halved when causal; backward 2.5x the forward (the
FlashAttention papers' convention). Tokens are held at B N = 65536 (B = 16 at N = 4096), H = 16.
"""
from __future__ import annotations

import torch

from tilecore.bench.case import Case, Suite

TOKENS, HEADS = 65536, 16


def _sdpa(backend_name: str):
    def f(q, k, v, causal):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(getattr(SDPBackend, backend_name)):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return f


def _tilecore(q, k, v, causal):
    import tilecore

    return tilecore.attention(q, k, v, causal=causal)


IMPLS = {"tilecore": _tilecore, "cuDNN (SDPA)": _sdpa("CUDNN_ATTENTION"), "flash (SDPA)": _sdpa("FLASH_ATTENTION")}


def timed_pass(name: str, call, q, k, v, backward: bool):
    """The function to time for ``call(q, k, v)``: the forward without autograd, or the backward of
    one forward (a gradient of random values). Called once first: a backend that does not take these
    inputs on this GPU is a peer that is not here (ImportError, which the harness skips)."""
    try:
        out = call(q, k, v)
    except RuntimeError as err:
        raise ImportError(f"{name}: {err}") from err
    if not backward:
        def forward():
            with torch.no_grad():
                return call(q, k, v)
        return forward
    dout = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


def _build(name: str, n: int, d: int, causal: bool, backward: bool):
    def build():
        b = TOKENS // n
        q, k, v = (torch.randn(b, HEADS, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
                   for _ in range(3))
        return timed_pass(name, lambda q, k, v: IMPLS[name](q, k, v, causal), q, k, v, backward)
    return build


def cases(quick: bool) -> list[Case]:
    out = []
    for d in (64, 128):
        for causal in (False, True):
            for backward in (False, True):
                for n in ([4096] if quick else [512, 1024, 2048, 4096, 8192, 16384]):
                    b = TOKENS // n
                    flops = 4 * b * HEADS * n * n * d // (2 if causal else 1) * (5 if backward else 2) // 2
                    params = {"pass": "bwd" if backward else "fwd", "D": d, "causal": causal, "N": n}
                    out.append(Case(params, {name: _build(name, n, d, causal, backward) for name in IMPLS},
                                    flops=flops))
    return out


SUITE = Suite("attention", ceiling="matmul", metric="TFLOP/s", x="N", cases=cases,
              describe="bf16 attention forward and backward vs torch SDPA (cuDNN, flash), B*N = 65536, H = 16")
