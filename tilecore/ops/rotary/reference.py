"""Rotary embedding in float64 with PyTorch operations, plainly: the reference results are compared with."""
from __future__ import annotations

import torch


def rotary_reference(x, cos, sin, *, interleaved: bool = False, position_ids=None, conjugate: bool = False):
    """x (B, N, H, D) turned pair by pair, in float64: pair i of a token at position p (n, or
    position_ids[b, n]) by the angle whose cosine and sine are cos[p, i], sin[p, i]; the pairs are
    (i, i + R) (half-split) or (2i, 2i + 1) (interleaved), R = cos.shape[1]; features past 2R unchanged.
    ``conjugate``: by the opposite angle (the inverse rotation, and the backward)."""
    B, N, H, D = x.shape
    R = cos.shape[1]
    pos = torch.arange(N).expand(B, N) if position_ids is None else position_ids.expand(B, N)
    c = cos.double()[pos][:, :, None, :]  # (B, N, 1, R)
    s = sin.double()[pos][:, :, None, :] * (-1 if conjugate else 1)
    x = x.double()
    if interleaved:
        a, b = x[..., 0:2 * R:2], x[..., 1:2 * R:2]
    else:
        a, b = x[..., :R], x[..., R:2 * R]
    a2, b2 = a * c - b * s, b * c + a * s
    rotated = torch.stack((a2, b2), -1).flatten(-2) if interleaved else torch.cat((a2, b2), -1)
    return torch.cat((rotated, x[..., 2 * R:]), -1)
