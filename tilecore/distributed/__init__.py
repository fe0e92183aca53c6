"""Past one GPU: attention over a sequence split across the ranks of a torch.distributed group.

* ``op``: ``context_parallel_attention`` (ring or all-to-all), the checks every rank makes together,
  the custom ops and autograd;
* ``ring``: ring attention (keys and values around the ring, lse merges, the ring backward);
* ``ulysses``: all-to-all attention (heads shared out, the sequence gathered);
* ``sharding``: the zigzag split, ``zigzag_shard`` and ``zigzag_unshard``;
* ``groups``: process groups and the bounded-time metadata gather;
* ``reference``: the whole sequence gathered on every rank and attended in float64.
"""
from tilecore.distributed.op import context_parallel_attention
from tilecore.distributed.reference import context_parallel_attention_reference
from tilecore.distributed.sharding import zigzag_shard, zigzag_unshard

__all__ = ["context_parallel_attention", "context_parallel_attention_reference", "zigzag_shard", "zigzag_unshard"]
