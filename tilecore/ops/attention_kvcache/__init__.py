"""``attention_with_kvcache``: attention of new queries against a contiguous or paged KV cache, the new
K/V appended in place (decode and chunked prefill; forward only).

* ``op``: the public function, checks, the custom op ``tilecore::attention_with_kvcache``, launches;
* ``kernels_tl``: the split-key forward over (paged) cache rows, the merge of its splits, the append;
* ``reference``: the per-sequence reference over the gathered cache rows (also the CPU path).
"""
from tilecore.ops.attention_kvcache.op import attention_with_kvcache
from tilecore.ops.attention_kvcache.reference import kvcache_reference

__all__ = ["attention_with_kvcache", "kvcache_reference"]
