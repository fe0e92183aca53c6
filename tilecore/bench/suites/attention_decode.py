"""Attention at decode: one new query a sequence against its cached keys, Llama 3 8B's heads (32 q
heads on 8 kv heads, D = 128), bf16, forward. A memory-bound op: GB/s of K and V read (plus q and
out), against the copy ceiling.

Peers: torch SDPA with ``enable_gqa=True`` under its flash, cuDNN and memory-efficient backends (a
backend that refuses a case on this build is skipped). Not causal: the one query sees every key
(SDPA's causal mask is aligned to the top left, which would leave it one key). Inputs rotate among
copies that together exceed L2, so each call reads K and V from memory.

Timed as servers run decode steps: back-to-back calls replayed from a CUDA graph (``timing="graph"``),
so the figures are GPU time. Eagerly, a call at B = 1 is host-bound for every implementation
(40-140 us of Python and launch against 6-30 us on the GPU on the lent H100; notes/attention/README.md).
"""
from __future__ import annotations

import torch

from tilecore.bench.case import Case, Suite
from tilecore.bench.harness import rotating

HQ, HKV, D = 32, 8, 128


def _sdpa(backend_name: str):
    def f(q, k, v):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(getattr(SDPBackend, backend_name)):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return f


def _tilecore(q, k, v):
    import tilecore

    return tilecore.attention(q, k, v)


IMPLS = {"tilecore": _tilecore, "flash (SDPA)": _sdpa("FLASH_ATTENTION"), "cuDNN (SDPA)": _sdpa("CUDNN_ATTENTION"),
         "efficient (SDPA)": _sdpa("EFFICIENT_ATTENTION")}


def _bytes(b: int, nk: int) -> int:
    return 2 * (2 * b * HKV * nk * D + 2 * b * HQ * D)  # bf16 K, V read; q read, out written


def _build(name: str, b: int, nk: int):
    def build():
        f = IMPLS[name]

        def make_set():
            return (torch.randn(b, HQ, 1, D, device="cuda", dtype=torch.bfloat16),
                    *(torch.randn(b, HKV, nk, D, device="cuda", dtype=torch.bfloat16) for _ in range(2)))

        nxt = rotating(make_set, _bytes(b, nk))
        try:  # a backend that does not take this case on this build is a peer that is not here
            f(*nxt())
        except RuntimeError as err:
            raise ImportError(f"{name}: {err}") from err

        def forward():
            with torch.no_grad():
                return f(*nxt())
        return forward
    return build


def cases(quick: bool) -> list[Case]:
    out = []
    for b in ([16] if quick else [1, 16, 64]):
        for nk in ([4096] if quick else [1024, 4096, 16384]):
            out.append(Case({"B": b, "Nk": nk}, {name: _build(name, b, nk) for name in IMPLS}, bytes=_bytes(b, nk)))
    return out


SUITE = Suite("attention-decode", ceiling="copy", metric="GB/s", x="Nk", cases=cases,
              describe="bf16 attention of one query against Nk cached keys, Hq 32 / Hkv 8, D 128, vs torch SDPA "
                       "(GPU time: CUDA graph replays)", timing="graph")
