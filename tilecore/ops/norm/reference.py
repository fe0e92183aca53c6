"""The fused norm in float64 with PyTorch operations, plainly: the reference every result is compared with."""
from __future__ import annotations

import torch


def layer_norm_reference(x, weight=None, bias=None, *, residual=None, keep=None, dropout_p: float = 0.0,
                         eps: float = 1e-5, rms: bool = False, h_dtype: torch.dtype | None = None,
                         rounding=None):
    """(y, h) in float64: h = x * keep / (1 - p) + residual, rounded to the dtype it is stored in (the
    residual's, else x's) where dropout or a residual is given; y = (h - mean(h)) / sqrt(var(h) + eps)
    * weight + bias over the last dimension (RMSNorm: mean taken as 0). ``keep``: the dropout mask
    (bool, x's shape). ``h_dtype``: the dtype h is rounded to (for float64 inputs standing for 16-bit
    ones); ``rounding(t, dtype)``: how h is rounded to it, in float64 (default: to nearest).
    Differentiable (the rounding of h passes gradients through unchanged)."""
    h = x.double()
    if keep is not None:
        h = h * (keep.double() * (1.0 / (1.0 - dropout_p) if dropout_p < 1 else 0.0))  # x * 0 where dropped
    if residual is not None:
        h = h + residual.double()
    if keep is not None or residual is not None:
        h_dtype = h_dtype or (residual.dtype if residual is not None else x.dtype)
        stored = rounding(h, h_dtype) if rounding else h.to(h_dtype).double()
        h = h + (stored - h).detach()  # rounded, with gradients passed through unrounded
    centered = h if rms else h - h.mean(-1, keepdim=True)
    y = centered / torch.sqrt(centered.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y, h
