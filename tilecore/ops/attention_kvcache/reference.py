"""The reference for attention against a KV cache (contiguous or paged): the dense reference
(tilecore.ops.attention.reference.reference_attention) one sequence at a time over its gathered cache
rows, in a chosen compute dtype (float64 for the tests; float32 is the CPU path when Triton's
interpreter is off). Masks as attention_varlen's (tilecore.ops.attention_varlen.reference).
"""
from __future__ import annotations

import torch

from tilecore.ops.attention.reference import reference_attention


def _dense(t: torch.Tensor) -> torch.Tensor:
    """A sequence's rows (N, H, D) as a dense (1, H, N, D) view."""
    return t.transpose(0, 1).unsqueeze(0)


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
