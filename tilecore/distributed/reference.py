"""The naive reference: every rank gathers the whole sequence, attends it in float64 (tilecore's
attention reference), and keeps its own queries' rows."""
from __future__ import annotations

import torch.distributed as dist

from tilecore.distributed import groups, sharding
from tilecore.ops.attention import attention_reference


def context_parallel_attention_reference(q, k, v, *, group=None, causal: bool = False, scale: float | None = None,
                                         timeout: float = groups.DEFAULT_TIMEOUT_S):
    """(out, lse) of this rank's queries, float64, from the whole sequence (q, k, v: zigzag slices,
    as context_parallel_attention takes them). Not differentiable across ranks (its gathers are not)."""
    group = groups.resolve(group, "context_parallel_attention_reference")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    whole = [sharding.zigzag_unshard(t.detach(), 2, group, timeout=timeout) for t in (q, k, v)]
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    out, lse = attention_reference(*(t.double() for t in whole), causal=causal, scale=scale)
    return (sharding.zigzag_shard(out, 2, rank=rank, world_size=world),
            sharding.zigzag_shard(lse, 2, rank=rank, world_size=world))
