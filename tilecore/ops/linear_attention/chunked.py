"""The chunked form in PyTorch, float32: the CPU path when Triton's interpreter is off (forward, and the
backward by autograd through it), and the kernels' math in a readable form (kernels_tl.py's docstring
has the why of each step: the floor on log decays, differences of the cumulative decay within a chunk,
masks before exp).

Tensors as the custom ops take them: q, k (B, N, Hqk, Dk), v (B, N, H, Dv), g (B, N, H) or
(B, N, H, F), beta (B, N, H), h0 (B, H, F, Dv). Returns o before D and z (B, N, H, Dv) and the final
state (B, H, F, Dv), float32.
"""
from __future__ import annotations

import torch

from tilecore.ops.linear_attention.reference import based_features

LOG_DECAY_FLOOR = -100.0  # kernels_tl.LOG_DECAY_FLOOR


def features(q, k, v_heads: int, scale: float, feature: int):
    """q and k per value head in float32 (B, H, N, F), Based's features expanded, and the output's scale."""
    group = v_heads // q.shape[2]
    qh = q.float().repeat_interleave(group, dim=2).transpose(1, 2)
    kh = k.float().repeat_interleave(group, dim=2).transpose(1, 2)
    if feature == 1:
        return based_features(qh, scale), based_features(kh), 1.0
    return qh, kh, scale


def chunked_forward(q, k, v, g, beta, h0, scale: float, feature: int, chunk: int):
    """(o, final state) in float32 by the chunked form, chunk tokens at a time."""
    B, N, H, Dv = v.shape
    phi_q, phi_k, out_scale = features(q, k, H, scale, feature)
    if beta is not None:
        phi_k = phi_k * beta.float().transpose(1, 2)[..., None]
    vh = v.float().transpose(1, 2)  # (B, H, N, Dv)
    F = phi_q.shape[-1]
    # (a copy: with no token the final state is the initial one, and an op's output must not alias its input)
    S = torch.zeros(B, H, F, Dv, dtype=torch.float32, device=v.device) if h0 is None else h0.float().clone()
    channel = g is not None and g.dim() == 4
    if g is not None:
        g = g.float().transpose(1, 2)  # (B, H, N) or (B, H, N, F)
        g = torch.where(g < LOG_DECAY_FLOOR, LOG_DECAY_FLOOR, g)  # NaN kept
    outs = []
    for t0 in range(0, N, chunk):
        qc, kc, vc = phi_q[:, :, t0:t0 + chunk], phi_k[:, :, t0:t0 + chunk], vh[:, :, t0:t0 + chunk]
        T = qc.shape[2]
        causal = torch.ones(T, T, dtype=torch.bool, device=v.device).tril()
        if g is None:
            p = torch.where(causal, qc @ kc.transpose(-1, -2), 0.0)
            o = p @ vc + qc @ S
            S = S + kc.transpose(-1, -2) @ vc
        elif not channel:
            G = g[:, :, t0:t0 + chunk].cumsum(-1)  # (B, H, T)
            G_last = G[..., -1:]
            pair = torch.where(causal, G[..., :, None] - G[..., None, :], float("-inf")).exp()
            p = torch.where(causal, (qc @ kc.transpose(-1, -2)) * pair, 0.0)
            o = p @ vc + G.exp()[..., None] * (qc @ S)
            S = G_last.exp()[..., None] * S + (kc * (G_last - G).exp()[..., None]).transpose(-1, -2) @ vc
        else:
            G = g[:, :, t0:t0 + chunk].cumsum(2)  # (B, H, T, F)
            G_last = G[:, :, -1:]
            diff = torch.where(causal[..., None], G[:, :, :, None] - G[:, :, None, :], float("-inf"))
            p = torch.where(causal, torch.einsum("bhid,bhjd,bhijd->bhij", qc, kc, diff.exp()), 0.0)
            o = p @ vc + (qc * G.exp()) @ S
            S = G_last.exp().transpose(-1, -2) * S + (kc * (G_last - G).exp()).transpose(-1, -2) @ vc
        outs.append(o * out_scale)
    o = torch.cat(outs, dim=2) if outs else vh.new_empty(B, H, 0, Dv)
    return o.transpose(1, 2), S


def chunked_backward(do, q, k, v, g, beta, h0, dht, scale: float, feature: int, chunk: int):
    """(dq, dk, dv, dg, dbeta, dh0) of chunked_forward's (o, final state) against (do, dht), by
    torch.func.vjp (a custom op's implementation runs below autograd, where torch.autograd.grad would
    record nothing); None for an input that is None."""
    given = [i for i, t in enumerate((q, k, v, g, beta, h0)) if t is not None]
    inputs = (q, k, v, g, beta, h0)

    def run(*tensors):
        full = list(inputs)
        for i, t in zip(given, tensors):
            full[i] = t
        return chunked_forward(*full, scale, feature, chunk)

    (o, ht), vjp = torch.func.vjp(run, *(inputs[i].detach().float() for i in given))
    grads = iter(vjp((do.float(), torch.zeros_like(ht) if dht is None else dht.float())))
    return tuple(next(grads) if t is not None else None for t in inputs)
