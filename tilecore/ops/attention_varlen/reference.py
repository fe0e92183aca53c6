"""References for packed (varlen) attention: the dense reference
(tilecore.ops.attention.reference: reference_attention, attention_backward_reference) one sequence at a time, in a chosen
compute dtype (float64 for the tests; float32 is the CPU path when Triton's interpreter is off).

The masking rule is flash-attn's, as tilecore.ops.attention.reference states it: query i of a sequence with N queries
and Nk keys sits at key position i' = i + Nk - N (aligned to the bottom right) and attends keys j
with i' - left <= j <= i' + right (-1: no bound; ``causal`` is the window (left, 0)); softcap > 0
caps the scaled scores as softcap * tanh(scale * q.k / softcap). A row with no key: O = 0 and
lse = -inf.
"""
from __future__ import annotations

import torch

from tilecore.ops.attention.reference import attention_backward_reference, reference_attention


def _sequences(cu_seqlens_q, cu_seqlens_k):
    """(query slice, key slice) of each sequence (values read on the host)."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    return [(slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])) for b in range(len(cq) - 1)]


def _dense(t: torch.Tensor) -> torch.Tensor:
    """A sequence's packed rows (N, H, D) as a dense (1, H, N, D) view."""
    return t.transpose(0, 1).unsqueeze(0)


def varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None, window_size=(-1, -1),
                     softcap=0.0, compute_dtype=torch.float64):
    """Packed q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv) -> (O (total_q, Hq, Dv),
    lse (Hq, total_q)) in ``compute_dtype``, one sequence at a time; differentiable."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    out = q.new_zeros((q.shape[0], q.shape[1], v.shape[2]), dtype=compute_dtype)
    lse = q.new_full((q.shape[1], q.shape[0]), float("-inf"), dtype=compute_dtype)
    outs, lses = [], []
    for qs, ks in _sequences(cu_seqlens_q, cu_seqlens_k):
        if qs.stop == qs.start:
            continue
        o, l = reference_attention(_dense(q[qs]), _dense(k[ks]), _dense(v[ks]), causal, scale, window_size, softcap,
                                   compute_dtype)
        outs.append(o[0].transpose(0, 1))
        lses.append(l[0])
    if outs:  # every query row belongs to a sequence (cu_seqlens_q[-1] == total_q): cat, not scatter
        out, lse = torch.cat(outs, 0), torch.cat(lses, 1)
    return out, lse


def varlen_backward_reference(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, *, causal, scale,
                              window_size=(-1, -1), softcap=0.0, compute_dtype=torch.float32):
    """(dq, dk, dv) of packed attention by the FlashAttention-2 formulas, one sequence at a time, in
    ``compute_dtype`` (lse (Hq, total_q), dlse the same or None); keys no query sees get 0."""
    dq = torch.zeros(q.shape, dtype=compute_dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=compute_dtype, device=q.device)
    dv = torch.zeros(v.shape, dtype=compute_dtype, device=q.device)
    for qs, ks in _sequences(cu_seqlens_q, cu_seqlens_k):
        if qs.stop == qs.start or ks.stop == ks.start:
            continue
        g = attention_backward_reference(
            _dense(dout[qs]), _dense(q[qs]), _dense(k[ks]), _dense(v[ks]), _dense(out[qs]), lse[None, :, qs],
            None if dlse is None else dlse[None, :, qs], causal=causal, scale=scale, window_size=window_size,
            softcap=softcap, compute_dtype=compute_dtype)
        dq[qs], dk[ks], dv[ks] = (t[0].transpose(0, 1) for t in g)
    return dq, dk, dv
