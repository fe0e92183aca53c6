"""The tour's norm case: residual + LayerNorm in bf16, rows of 4096 (a transformer block's pre-norm)."""
from __future__ import annotations

import torch

from tilecore.ops.norm.op import layer_norm
from tilecore.ops.norm.reference import layer_norm_reference
from tilecore.tour_case import TourCase


def tour_cases(device: torch.device) -> list:
    rows, n = (65536, 4096) if device.type == "cuda" else (8, 4096)
    dt = torch.bfloat16
    x, r = torch.randn(rows, n, device=device, dtype=dt), torch.randn(rows, n, device=device, dtype=dt)
    w, b = torch.randn(n, device=device, dtype=dt), torch.randn(n, device=device, dtype=dt)
    return [TourCase("layer_norm", f"{rows}x{n} + residual", dt, lambda: layer_norm(x, w, b, residual=r),
                     lambda: layer_norm_reference(x, w, b, residual=r)[0], bytes=3 * x.numel() * 2,
                     bound="memory")]
