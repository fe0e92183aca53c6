"""Moved (issue 30): the packed references to :mod:`tilecore.ops.attention_varlen.reference`, the KV cache's to
:mod:`tilecore.ops.attention_kvcache.reference`. Kept for importers not yet updated; remove it once none is."""
from tilecore.ops.attention_kvcache.reference import gather_cache, kvcache_reference
from tilecore.ops.attention_varlen.reference import varlen_backward_reference, varlen_reference

__all__ = ["gather_cache", "kvcache_reference", "varlen_backward_reference", "varlen_reference"]
