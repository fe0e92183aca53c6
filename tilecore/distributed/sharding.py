"""The zigzag split of a sequence over P ranks, and the helpers that shard and un-shard a tensor by it.

The sequence of N positions is cut into 2P chunks by ``torch.tensor_split``'s rule (the first
N mod 2P chunks one position longer), and rank r holds chunks r and 2P-1-r, in that order. Under a
causal mask chunk c's queries see every earlier chunk, so pairing an early chunk with its mirror
gives every rank the same work: that is what balances causal ring attention (ring.py).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from tilecore.distributed import groups


def chunk_sizes(n: int, world: int) -> list[int]:
    """The lengths of the 2 * world chunks of a sequence of ``n`` positions (tensor_split's rule)."""
    base, extra = divmod(n, 2 * world)
    return [base + (1 if c < extra else 0) for c in range(2 * world)]


def chunk_starts(n: int, world: int) -> list[int]:
    """Where each of the 2 * world chunks starts in the sequence."""
    starts, at = [], 0
    for size in chunk_sizes(n, world):
        starts.append(at)
        at += size
    return starts


def rank_chunks(n: int, world: int, rank: int) -> tuple[int, int]:
    """(length of the early chunk, length of the late chunk) rank ``rank`` holds: chunks rank and
    2 * world - 1 - rank."""
    sizes = chunk_sizes(n, world)
    return sizes[rank], sizes[2 * world - 1 - rank]


def local_lengths(n: int, world: int) -> list[int]:
    """Each rank's slice length for a sequence of ``n`` positions."""
    return [sum(rank_chunks(n, world, r)) for r in range(world)]


def natural_pieces(n: int, world: int) -> list[tuple[int, int, int]]:
    """The sequence in its natural order as (rank, offset in that rank's slice, length) pieces: chunk
    c < world is rank c's first part; chunk c >= world is rank 2 * world - 1 - c's second part."""
    sizes = chunk_sizes(n, world)
    pieces = []
    for c in range(2 * world):
        if c < world:
            pieces.append((c, 0, sizes[c]))
        else:
            r = 2 * world - 1 - c
            pieces.append((r, sizes[r], sizes[c]))
    return pieces


def _rank_and_world(group, rank, world_size) -> tuple[int, int]:
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise ValueError("zigzag_shard: give both rank and world_size, or neither (then the group's are used)")
        if not (isinstance(rank, int) and isinstance(world_size, int) and 0 <= rank < world_size):
            raise ValueError(f"zigzag_shard: need 0 <= rank < world_size (ints); got rank={rank!r}, "
                             f"world_size={world_size!r}")
        return rank, world_size
    group = groups.resolve(group, "zigzag_shard")
    return dist.get_rank(group), dist.get_world_size(group)


def _dim(x: torch.Tensor, dim: int, what: str) -> int:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what}: x must be a torch.Tensor, got {type(x).__name__}")
    if not (isinstance(dim, int) and -x.dim() <= dim < x.dim()):
        raise ValueError(f"{what}: dim must be an int in [-{x.dim()}, {x.dim()}) for a tensor of shape "
                         f"{tuple(x.shape)}; got {dim!r}")
    return dim % x.dim()


def zigzag_shard(x: torch.Tensor, dim: int = 2, group=None, *, rank: int | None = None,
                 world_size: int | None = None) -> torch.Tensor:
    """This rank's slice of the whole sequence ``x`` along ``dim`` (2: the (B, H, N, D) layout's N):
    chunks rank and 2P-1-rank of 2P, joined (a copy; ``x`` itself for one rank). The rank and world
    size are the group's (the default group's for None), or ``rank`` and ``world_size`` given
    together (no process group needed). Any N: chunk lengths differ by at most one; differentiable."""
    dim = _dim(x, dim, "zigzag_shard")
    rank, world = _rank_and_world(group, rank, world_size)
    if world == 1:
        return x
    n = x.shape[dim]
    starts, sizes = chunk_starts(n, world), chunk_sizes(n, world)
    late = 2 * world - 1 - rank
    return torch.cat([x.narrow(dim, starts[rank], sizes[rank]), x.narrow(dim, starts[late], sizes[late])], dim)


def zigzag_order(pieces_by_rank: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The whole sequence in its natural order from every rank's zigzag slice (rank order)."""
    world = len(pieces_by_rank)
    n = sum(t.shape[dim] for t in pieces_by_rank)
    return torch.cat([pieces_by_rank[r].narrow(dim, offset, length)
                      for r, offset, length in natural_pieces(n, world)], dim)


def zigzag_unshard(x: torch.Tensor, dim: int = 2, group=None, *, timeout: float = groups.DEFAULT_TIMEOUT_S
                   ) -> torch.Tensor:
    """The whole sequence, in its natural order along ``dim``, from every rank's zigzag slice ``x``
    (zigzag_shard's): every rank gets all of it. The slices' lengths are gathered first (waited on
    for at most ``timeout`` seconds, then a TimeoutError); they must be a zigzag split of their sum,
    and the other dimensions, dtype and device type the same on every rank, else ValueError on every
    rank. Differentiable: the gradient of a rank's slice is the sum over ranks of their gradients of
    its positions (each rank may compute a loss on the whole sequence)."""
    dim = _dim(x, dim, "zigzag_unshard")
    group = groups.resolve(group, "zigzag_unshard")
    world = dist.get_world_size(group)
    if world == 1:
        return x
    shape = list(x.shape)
    meta = [dim, x.dim(), groups.dtype_code(x.dtype), groups.device_code(x.device)] + \
        [shape[i] if i != dim else -1 for i in range(x.dim())] + [x.shape[dim]]
    rows = groups.gather_ints(meta, group, timeout, "zigzag_unshard")
    lengths = [row[-1] for row in rows]
    for r, row in enumerate(rows):
        if row[:-1] != rows[0][:-1]:
            raise ValueError(f"zigzag_unshard: every rank must pass a tensor of one shape but for dim {dim}, one "
                             f"dtype and one device type, and the same dim; rank 0 has {groups.describe_meta(rows[0])},"
                             f" rank {r} has {groups.describe_meta(row)}")
    expected = local_lengths(sum(lengths), world)
    if lengths != expected:
        raise ValueError(f"zigzag_unshard: the ranks' slice lengths {lengths} are not a zigzag split of "
                         f"{sum(lengths)} positions (zigzag_shard gives {expected})")
    return _Unshard.apply(x, dim, group, lengths)


class _Unshard(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group, lengths):
        ctx.dim, ctx.group, ctx.rank, ctx.world = dim, group, dist.get_rank(group), len(lengths)
        longest = max(lengths)
        padded = x
        if x.shape[dim] < longest:
            pad_shape = list(x.shape)
            pad_shape[dim] = longest - x.shape[dim]
            padded = torch.cat([x, x.new_zeros(pad_shape)], dim)
        gathered = [torch.empty_like(padded, memory_format=torch.contiguous_format) for _ in lengths]
        dist.all_gather(gathered, padded.contiguous(), group=group)
        return zigzag_order([g.narrow(dim, 0, n) for g, n in zip(gathered, lengths)], dim)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone(memory_format=torch.contiguous_format)  # reduced in place
        dist.all_reduce(grad, group=ctx.group)
        return zigzag_shard(grad, ctx.dim, rank=ctx.rank, world_size=ctx.world), None, None, None
