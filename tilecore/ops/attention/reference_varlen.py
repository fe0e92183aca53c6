"""References for packed (varlen) attention and attention against a KV cache: the dense reference
(reference.reference_attention, attention_backward_reference) one sequence at a time, in a chosen
compute dtype (float64 for the tests; float32 is the CPU path when Triton's interpreter is off).

The masking rule is flash-attn's, as reference.py states it: query i of a sequence with N queries
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


def gather_cache(cache, b: int, length: int, block_table=None):
    """The first ``length`` rows of sequence b of a cache, (length, Hkv, D): contiguous (B, Nmax, Hkv,
    D), or paged (num_blocks, page_size, Hkv, D) through block_table[b]."""
    if block_table is None:
        return cache[b, :length]
    page = cache.shape[1]
    pages = block_table[b, :(length + page - 1) // page].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:length]


def kvcache_reference(q, k_cache, v_cache, cache_seqlens, *, k=None, v=None, block_table=None, causal=False,
                      scale=None, window_size=(-1, -1), softcap=0.0, compute_dtype=torch.float64):
    """Attention of q (B, Nq, Hq, D) over each sequence's cache rows [0, cache_seqlens[b]) followed by
    the new rows k, v (B, Nnew, Hkv, D[v]) when given (the caches themselves are not modified here).
    Returns (O (B, Nq, Hq, Dv), lse (B, Hq, Nq)) in ``compute_dtype``."""
    outs, lses = [], []
    for b in range(q.shape[0]):
        old = int(cache_seqlens[b])
        ks, vs = gather_cache(k_cache, b, old, block_table), gather_cache(v_cache, b, old, block_table)
        if k is not None:
            ks, vs = torch.cat([ks, k[b]], 0), torch.cat([vs, v[b]], 0)
        o, lse = reference_attention(_dense(q[b]), _dense(ks), _dense(vs), causal, scale, window_size, softcap,
                                     compute_dtype)
        outs.append(o[0].transpose(0, 1))
        lses.append(lse[0])
    return torch.stack(outs), torch.stack(lses)
