"""FP8 attention forward: tilecore.attention_fp8 (e4m3 q, k, v, per-head descales, V in the kernel's layout: the
kernel alone), the convenience path end to end (tilecore.attention(..., precision="fp8"): rotate, quantize, attend
from bf16), against tilecore's bf16 forward and torch SDPA's cuDNN (bf16). Head dims 64 and 128, causal and not.
Ceiling: FP8 matmul (torch._scaled_mm).

FLOPs: 4 B H N^2 D (the two matmuls), halved when causal. Tokens are held at B N = 65536 (B = 16 at N = 4096),
H = 16, as the attention suite.
"""
from __future__ import annotations

import torch

from tilecore.bench.case import Case, Suite

TOKENS, HEADS = 65536, 16


def _inputs(n: int, d: int):
    b = TOKENS // n
    return tuple(torch.randn(b, HEADS, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))


def _kernel(n: int, d: int, causal: bool):
    def build():
        import tilecore
        from tilecore.ops.attention_fp8 import quantize_fp8

        q, k, v = _inputs(n, d)
        q8, qs = quantize_fp8(q, per="head")
        k8, ks = quantize_fp8(k, per="head")
        v8, vs = quantize_fp8(v, per="head", layout="keys_permuted")
        del q, k, v
        return lambda: tilecore.attention_fp8(q8, k8, v8, q_scale=qs, k_scale=ks, v_scale=vs, causal=causal,
                                              v_layout="keys_permuted", check_scales=False)
    return build


def _end_to_end(n: int, d: int, causal: bool):
    def build():
        import tilecore

        q, k, v = _inputs(n, d)
        return lambda: tilecore.attention(q, k, v, causal=causal, precision="fp8")
    return build


def _bf16(n: int, d: int, causal: bool):
    def build():
        import tilecore

        q, k, v = _inputs(n, d)
        return lambda: tilecore.attention(q, k, v, causal=causal)
    return build


def _cudnn(n: int, d: int, causal: bool):
    def build():
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q, k, v = _inputs(n, d)

        def f():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        try:
            f()
        except RuntimeError as err:  # a backend that does not take these inputs here: a peer not present
            raise ImportError(f"cuDNN (SDPA): {err}") from err
        return f
    return build


SERIES = {"tilecore fp8": _kernel, "tilecore fp8 end to end": _end_to_end, "tilecore bf16": _bf16,
          "cuDNN (SDPA) bf16": _cudnn}


def cases(quick: bool, dims=(128, 64)) -> list[Case]:
    out = []
    for d in dims:
        for causal in (False, True):
            for n in ([4096] if quick else [512, 1024, 2048, 4096, 8192, 16384]):
                b = TOKENS // n
                flops = 4 * b * HEADS * n * n * d // (2 if causal else 1)
                out.append(Case({"D": d, "causal": causal, "N": n},
                                {name: make(n, d, causal) for name, make in SERIES.items()}, flops=flops))
    return out


SUITE = Suite("attention-fp8", ceiling="matmul-fp8", metric="TFLOP/s", x="N", cases=cases,
              describe="FP8 (e4m3) attention forward: the kernel, and rotate + quantize + attend from bf16, vs "
                       "tilecore bf16 and cuDNN bf16, B*N = 65536, H = 16")
