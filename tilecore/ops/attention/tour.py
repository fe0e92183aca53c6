"""The tour's attention cases: causal bf16 forward at B=16 H=16 N=4096 D=128 on a GPU (the
FlashAttention benchmark shape), a small fp16 GQA case on the CPU."""
import torch

from tilecore.ops.attention.op import attention
from tilecore.ops.attention.reference import attention_reference


def tour_cases(device: torch.device) -> list:
    from tilecore.tour import TourCase

    gpu = device.type == "cuda"
    # the float64 reference materializes B*H*N*Nk scores: on the GPU it checks a slice of the heads
    b, hq, hkv, n, d, dtype = (16, 16, 16, 4096, 128, torch.bfloat16) if gpu else (1, 4, 2, 100, 64, torch.float16)
    q = torch.randn(b, hq, n, d, device=device, dtype=dtype)
    k = torch.randn(b, hkv, n, d, device=device, dtype=dtype)
    v = torch.randn(b, hkv, n, d, device=device, dtype=dtype)
    flops = 4 * b * hq * n * n * d // 2  # causal: half the scores
    if gpu:
        run = lambda: attention(q, k, v, causal=True)[:1, :2]
        reference = lambda: attention_reference(q[:1, :2], k[:1, :2], v[:1, :2], causal=True)[0]
    else:
        run = lambda: attention(q, k, v, causal=True)
        reference = lambda: attention_reference(q, k, v, causal=True)[0]
    return [TourCase(op="attention", shape=f"B{b} H{hq}/{hkv} N{n} D{d} causal", dtype=dtype, run=run,
                     reference=reference, flops=flops, bound="compute")]
