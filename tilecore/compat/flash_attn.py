"""flash-attn 2's attention functions on tilecore: ``from tilecore.compat.flash_attn import
flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache`` in place of ``from flash_attn
import ...``.

Same argument names, defaults, (batch, seqlen, heads, head_dim) layout and return values as
flash-attn 2.x's ``flash_attn_interface``; the work is tilecore.attention (on ``.transpose(1, 2)``
views: no copy of q, k, v), tilecore.attention_varlen and tilecore.attention_with_kvcache.

Differences that remain:

* ``dropout_p`` > 0, ``alibi_slopes``, ``return_attn_probs=True`` (flash_attn_func, the varlen
  function), ``block_table`` of the varlen function (paged prefill), and ``rotary_cos`` /
  ``rotary_sin``, ``cache_batch_idx``, ``cache_leftpad`` of flash_attn_with_kvcache raise
  NotImplementedError naming the argument.
* flash_attn_func returns O as a (B, N, H, Dv) view of a contiguous (B, H, N, Dv) tensor (no copy):
  ``.reshape`` works, ``.view(B, N, H * Dv)`` needs a ``.contiguous()`` first.
* ``deterministic`` is accepted and not needed by the varlen backward (no atomics: one program per key
  block sums its dK, dV); tilecore.attention's Hopper backward is deterministic under
  ``torch.use_deterministic_algorithms(True)`` (notes/attention).
* ``num_splits`` of flash_attn_with_kvcache is accepted and ignored (the split count is tilecore's,
  from the cache's capacity and the GPU's SMs).
* ``cache_seqlens=None`` means every sequence fills its contiguous cache (no new k, v then).
* float32 is accepted on CPU tensors; CPU tensors run too (flash-attn's are CUDA only).
* Page sizes 16 to 256 (flash-attn 2 wants multiples of 256, vLLM's 16 included here).
"""
from __future__ import annotations

import torch

from tilecore.ops.attention_kvcache import attention_with_kvcache
from tilecore.ops.attention.op import attention
from tilecore.ops.attention_varlen import attention_varlen

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]


def _unsupported(where: str, **arguments) -> None:
    """NotImplementedError for the first argument given a value tilecore does not implement."""
    for name, given in arguments.items():
        if given:
            raise NotImplementedError(f"tilecore.compat.flash_attn.{where}: {name} is not supported (tilecore has no "
                                      f"{name.replace('_', ' ')}); call it with {name}'s default")


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash-attn's flash_attn_func: q (B, N, Hq, D), k (B, Nk, Hkv, D), v (B, Nk, Hkv, Dv) -> O
    (B, N, Hq, Dv) (a view; see the module docstring). Causal and window aligned to the bottom right;
    softcap as flash-attn's. Differentiable."""
    _unsupported("flash_attn_func", dropout_p=dropout_p > 0, alibi_slopes=alibi_slopes is not None,
                 return_attn_probs=return_attn_probs)
    out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal, scale=softmax_scale,
                    window_size=tuple(window_size), softcap=softcap)
    return out.transpose(1, 2)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """flash-attn's flash_attn_varlen_func: packed q (total_q, Hq, D), k (total_k, Hkv, D), v
    (total_k, Hkv, Dv), int32 cu_seqlens -> O (total_q, Hq, Dv). Differentiable."""
    _unsupported("flash_attn_varlen_func", dropout_p=dropout_p > 0, alibi_slopes=alibi_slopes is not None,
                 return_attn_probs=return_attn_probs, block_table=block_table is not None)
    return attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), causal=causal,
                            scale=softmax_scale, window_size=tuple(window_size), softcap=softcap)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """flash-attn's flash_attn_with_kvcache: q (B, Nq, Hq, D); k_cache, v_cache (B, Nmax, Hkv, D[v]) or
    paged (num_pages, page_size, Hkv, D[v]) with block_table; cache_seqlens an int or (B,) int tensor;
    k, v (B, Nnew, Hkv, D[v]) appended to the caches in place (cache_seqlens is not updated). Returns O
    (B, Nq, Hq, Dv), and lse (B, Hq, Nq) float32 with return_softmax_lse=True."""
    _unsupported("flash_attn_with_kvcache", rotary_cos=rotary_cos is not None, rotary_sin=rotary_sin is not None,
                 cache_batch_idx=cache_batch_idx is not None, cache_leftpad=cache_leftpad is not None,
                 alibi_slopes=alibi_slopes is not None)
    batch = q.shape[0]
    if cache_seqlens is None:
        if k is not None or block_table is not None:
            raise ValueError("tilecore.compat.flash_attn.flash_attn_with_kvcache: cache_seqlens=None means every "
                             "contiguous cache is full; pass cache_seqlens to append k, v or to use a block_table")
        cache_seqlens = k_cache.shape[1]
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, torch.Tensor) and cache_seqlens.dtype != torch.int32 \
            and not cache_seqlens.dtype.is_floating_point:
        cache_seqlens = cache_seqlens.to(torch.int32)  # on the device: no host sync
    out = attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, block_table=block_table,
                                 causal=causal, scale=softmax_scale, window_size=tuple(window_size), softcap=softcap,
                                 return_lse=return_softmax_lse)
    return out
