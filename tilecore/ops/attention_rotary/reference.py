"""The float64 reference of attention(q, k, v, rotary=(cos, sin)): q and k turned by rotary's reference, then
attention's."""
from __future__ import annotations

import torch

from tilecore.ops.attention.reference import attention_reference


def rotated_qk(q, k, cos, sin, *, interleaved: bool = False, compute_dtype: torch.dtype = torch.float64):
    """(q, k) turned by rotary embedding in ``compute_dtype`` (tilecore.ops.rotary's reference; cos, sin
    (max_seqlen, rotary_dim / 2)): key j at position j, query i at i + Nk - N (the bottom-right alignment
    causal uses), so the tables need Nk rows and N <= Nk. Differentiable."""
    from tilecore.ops.rotary.reference import rotary_reference

    n, nk = q.shape[2], k.shape[2]
    qr = rotary_reference(q.transpose(1, 2), cos[nk - n:], sin[nk - n:], interleaved=interleaved).transpose(1, 2)
    kr = rotary_reference(k.transpose(1, 2), cos, sin, interleaved=interleaved).transpose(1, 2)
    return qr.to(compute_dtype), kr.to(compute_dtype)


def rotary_attention_reference(q, k, v, cos, sin, *, interleaved: bool = False, causal: bool = False,
                               scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
                               softcap: float = 0.0,
                               compute_dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """attention_reference of q and k turned by rotated_qk (in float64, then ``compute_dtype``): what
    attention(q, k, v, rotary=(cos, sin)) is checked against. Differentiable in q, k, v."""
    qr, kr = rotated_qk(q, k, cos, sin, interleaved=interleaved)
    return attention_reference(qr.to(compute_dtype), kr.to(compute_dtype), v, causal=causal, scale=scale,
                               window_size=window_size, softcap=softcap, compute_dtype=compute_dtype)
