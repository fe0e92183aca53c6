"""The tour's attention cases: causal bf16 forward at B=16 H=16 N=4096 D=128 on a GPU (the
FlashAttention benchmark shape) and a decode step (one query a sequence against 4096 cached keys,
Llama 3 8B's 32 / 8 heads, the split-key path), and small fp16 GQA cases on the CPU."""
import torch

from tilecore.ops.attention.op import attention
from tilecore.ops.attention.reference import attention_reference
from tilecore.tour_case import TourCase


def tour_cases(device: torch.device) -> list:
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
    cases = [TourCase(op="attention", shape=f"B{b} H{hq}/{hkv} N{n} D{d} causal", dtype=dtype, run=run,
                      reference=reference, flops=flops, bound="compute")]

    # the decode step's own names: the lambdas above read q, k and v when they run
    b, hq, hkv, nk, d = (16, 32, 8, 4096, 128) if gpu else (2, 8, 2, 200, 64)
    q1 = torch.randn(b, hq, 1, d, device=device, dtype=dtype)
    kc = torch.randn(b, hkv, nk, d, device=device, dtype=dtype)
    vc = torch.randn(b, hkv, nk, d, device=device, dtype=dtype)
    nbytes = (2 * b * hkv * nk * d + 2 * b * hq * d) * q1.element_size()  # K, V read; q read, out written
    cases.append(TourCase(op="attention (decode)", shape=f"B{b} H{hq}/{hkv} N1 Nk{nk} D{d}", dtype=dtype,
                          run=lambda: attention(q1, kc, vc), reference=lambda: attention_reference(q1, kc, vc)[0],
                          bytes=nbytes, bound="memory"))
    return cases
