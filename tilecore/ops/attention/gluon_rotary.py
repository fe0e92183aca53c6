"""Attention forward with rotary embeddings turned inside the Hopper kernel (issue 37).

``forward(q, k, v, cos, sin, ...)`` is attention(rotary(q), rotary(k), v) without a pass of its own
over Q or K: K is turned in shared memory as each stage arrives, Q once a tile.

Conventions (as ``tilecore.apply_rotary``): q (B, H, N, D), k and v (B, Hkv, Nk, D); cos, sin
(max_seqlen, rotary_dim / 2); key j is at position j, query i at i + Nk - N; the pairs are (i, i + R)
(half-split, NeoX / Llama), R = rotary_dim / 2.
"""
from __future__ import annotations

import torch


def forward(q, k, v, cos, sin, *, causal: bool, scale: float, interleaved: bool = False, window=(-1, -1),
            softcap: float = 0.0, sm_margin: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of attention(rotary(q), rotary(k), v): out (B, H, N, D) contiguous in q's dtype, lse
    (B, H, N) float32, as the shipped forward's launch (launch.outputs) gives them."""
    raise NotImplementedError("gluon_rotary.forward: the in-kernel rotary forward is being written (issue 37)")
