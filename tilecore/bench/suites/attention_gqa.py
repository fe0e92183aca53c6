"""Grouped-query attention as LLMs run it: causal, bf16, forward and backward, q heads sharing kv
heads (Llama 3 8B: 32 q heads on 8 kv heads, D = 128; Llama 3 70B: 64 on 8; Llama 3.2 1B: 32 on
8, D = 64; multi-query: 16 on 1). Ceiling: cuBLAS bf16 matmul.

Peers: torch SDPA with ``enable_gqa=True`` under its cuDNN and flash backends (a backend that
refuses grouped heads on this build is skipped), and SDPA's cuDNN backend on K and V repeated to
every q head, the expansion inside the timed call: what a user without grouped-head support runs.
FLOPs as the attention suite's (forward 4 B Hq N^2 D, halved causal; backward 2.5x): the work is
the q heads'. B Hq N is held at 2^20 (B = 8 at Hq = 32, N = 4096): the attention suite's B16 H16
N4096 count of q-head rows.
"""
from __future__ import annotations

import torch

from tilecore.bench.case import Case, Suite
from tilecore.bench.suites.attention import timed_pass

Q_HEAD_ROWS = 2**20
MODELS = {"8B": (32, 8, 128), "70B": (64, 8, 128), "1B": (32, 8, 64), "MQA": (16, 1, 128)}  # Hq, Hkv, D


def _sdpa(backend_name: str, repeat_kv: bool):
    def f(q, k, v):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        group = q.shape[1] // k.shape[1]
        with sdpa_kernel(getattr(SDPBackend, backend_name)):
            if repeat_kv:
                k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return f


def _tilecore(q, k, v):
    import tilecore

    return tilecore.attention(q, k, v, causal=True)


IMPLS = {"tilecore": _tilecore, "cuDNN (SDPA, gqa)": _sdpa("CUDNN_ATTENTION", False),
         "flash (SDPA, gqa)": _sdpa("FLASH_ATTENTION", False),
         "cuDNN (SDPA, K/V repeated)": _sdpa("CUDNN_ATTENTION", True)}


def _build(name: str, model: str, n: int, backward: bool):
    def build():
        hq, hkv, d = MODELS[model]
        b = Q_HEAD_ROWS // (hq * n)

        def make(h):
            return torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=backward)

        return timed_pass(name, IMPLS[name], make(hq), make(hkv), make(hkv), backward)
    return build


def cases(quick: bool) -> list[Case]:
    out = []
    for model, (hq, hkv, d) in MODELS.items():
        for backward in (False, True):
            for n in ([4096] if quick else [1024, 4096, 16384]):
                b = Q_HEAD_ROWS // (hq * n)
                flops = 4 * b * hq * n * n * d // 2 * (5 if backward else 2) // 2
                params = {"pass": "bwd" if backward else "fwd", "model": f"{model} Hq{hq}/Hkv{hkv} D{d}", "N": n}
                out.append(Case(params, {name: _build(name, model, n, backward) for name in IMPLS}, flops=flops))
    return out


SUITE = Suite("attention-gqa", ceiling="matmul", metric="TFLOP/s", x="N", cases=cases,
              describe="bf16 causal grouped-query attention (Llama 3 shapes, MQA) vs torch SDPA, B*Hq*N = 2^20")
