"""Attention with PyTorch operations: the reference every kernel result is compared with, and the
CPU path when Triton's interpreter is off.

The masking rules are the kernels': query i of N attends key j of Nk when j <= i + (Nk - N) under
``causal`` (aligned to the bottom right, as FlashAttention does), and a query row with no key to
attend to gets output 0 and log-sum-exp -inf.
"""
from __future__ import annotations

import torch


def causal_allowed(n: int, nk: int, device) -> torch.Tensor:
    """[n, nk] boolean: may query i attend key j (bottom-right aligned causal mask)."""
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(nk, device=device)[None, :]
    return j <= i + (nk - n)


def _expand_kv(t: torch.Tensor, hq: int) -> torch.Tensor:
    """(B, Hkv, Nk, D) -> (B, Hq, Nk, D): q head h reads kv head h // (Hq // Hkv)."""
    return t.repeat_interleave(hq // t.shape[1], dim=1)


def attention_reference(q, k, v, *, causal: bool = False, scale: float | None = None,
                        compute_dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, lse) in ``compute_dtype``: O = softmax(scale q k^T [masked]) v, lse = logsumexp of the
    scaled, masked scores (natural log), shape (B, Hq, N). Differentiable with torch.autograd."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    hq, n, nk = q.shape[1], q.shape[2], k.shape[2]
    qc = q.to(compute_dtype)
    kc = _expand_kv(k.to(compute_dtype), hq)
    vc = _expand_kv(v.to(compute_dtype), hq)
    s = torch.matmul(qc, kc.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~causal_allowed(n, nk, q.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # -inf for a row with every key masked
    # exp(s - lse) is NaN where both are -inf: such rows attend to nothing and get probability 0.
    empty = torch.isinf(lse)[..., None]
    p = torch.exp(s - torch.where(empty, torch.zeros_like(lse[..., None]), lse[..., None]))
    p = torch.where(empty, torch.zeros_like(p), p)
    return torch.matmul(p, vc), lse


def attention_backward_reference(dout, q, k, v, out, lse, dlse, *, causal: bool, scale: float,
                                 compute_dtype: torch.dtype = torch.float32):
    """(dq, dk, dv) by the FlashAttention-2 backward formulas, in ``compute_dtype``: p recomputed
    from lse, dS = p (dP - delta) with delta = rowsum(dO * O) - dlse, GQA groups summed."""
    hq, hkv, n, nk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    c = compute_dtype
    qc, doc, oc = q.to(c), dout.to(c), out.to(c)
    kc, vc = _expand_kv(k.to(c), hq), _expand_kv(v.to(c), hq)
    s = torch.matmul(qc, kc.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~causal_allowed(n, nk, q.device), float("-inf"))
    lse_c = lse.to(c)
    empty = torch.isinf(lse_c)[..., None]
    p = torch.exp(s - torch.where(empty, torch.zeros_like(lse_c[..., None]), lse_c[..., None]))
    p = torch.where(empty, torch.zeros_like(p), p)
    delta = (doc * oc).sum(-1) - (0 if dlse is None else dlse.to(c))
    dv = torch.matmul(p.transpose(-1, -2), doc)
    dp = torch.matmul(doc, vc.transpose(-1, -2))
    ds = p * (dp - delta[..., None])
    dq = torch.matmul(ds, kc) * scale
    dk = torch.matmul(ds.transpose(-1, -2), qc) * scale
    b, g = q.shape[0], hq // hkv
    dk = dk.view(b, hkv, g, nk, -1).sum(2)
    dv = dv.view(b, hkv, g, nk, -1).sum(2)
    return dq, dk, dv


def reference_grads(q, k, v, dout, *, causal: bool = False, scale: float | None = None):
    """(dq, dk, dv) of attention_reference in float64 (what kernel gradients are checked against)."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, _ = attention_reference(q64, k64, v64, causal=causal, scale=scale)
    return torch.autograd.grad(out, (q64, k64, v64), dout.double())
