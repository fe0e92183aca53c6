"""The tour's rotary case: Llama's q, bf16 (B, N, 32 heads, 128), half-split pairs."""
from __future__ import annotations

import torch

from tilecore.ops.rotary.op import apply_rotary
from tilecore.ops.rotary.reference import rotary_reference
from tilecore.tour_case import TourCase


def tour_cases(device: torch.device) -> list:
    B, N = (16, 4096) if device.type == "cuda" else (1, 8)
    dt = torch.bfloat16
    x = torch.randn(B, N, 32, 128, device=device, dtype=dt)
    angle = torch.arange(N, device=device)[:, None] * 10000.0 ** (-torch.arange(64, device=device) / 64)
    cos, sin = angle.cos(), angle.sin()
    return [TourCase("apply_rotary", f"{B}x{N}x32x128", dt, lambda: apply_rotary(x, cos, sin),
                     lambda: rotary_reference(x, cos, sin), bytes=2 * x.numel() * 2, bound="memory")]
