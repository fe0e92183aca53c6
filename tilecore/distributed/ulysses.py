"""All-to-all (DeepSpeed Ulysses) attention: one all-to-all trades each rank's slice of the sequence
for a share of the heads over the whole sequence, attention runs on it, and a second all-to-all
trades back. Heads: q's heads must divide by P; k's and v's heads are repeated (each kv head for
lcm(Hkv, P) / Hkv of its q heads) where they do not, so every rank holds whole groups.

The sequence arrives as the ranks' zigzag slices (sharding.py), of any lengths the split gives; the
gathered sequence is put back in its natural order before attention (a copy), so causal masking is
the single-GPU one. The backward gathers q, k, v, O, dO (one all-to-all), lse and dlse ride along
as bytes, and runs tilecore's attention backward on the whole sequence of its heads.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

import tilecore.ops.attention.op  # noqa: F401  (registers torch.ops.tilecore.attention_backward)
from tilecore.distributed import ring, sharding
from tilecore.ops.attention import attention


def kv_repeats(hq: int, hkv: int, world: int) -> int:
    """How many times each kv head is repeated so that kv heads divide by ``world`` (hq does)."""
    return math.lcm(hkv, world) // hkv


def _wire(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` (4-D, or 3-D lse) as a 4-D tensor of ``dtype``, its last dimension reinterpreted (a
    float32 lse travels as two bf16/fp16 words, bit for bit)."""
    if t.dim() == 3:
        t = t.unsqueeze(-1)
    if t.dtype == dtype:
        return t
    return t.contiguous().view(dtype)


def _unwire(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """_wire's inverse for a tensor shaped as ``like`` (its dtype and rank)."""
    if t.dtype != like.dtype:
        t = t.contiguous().view(like.dtype)
    return t.squeeze(-1) if like.dim() == 3 else t


def scatter_heads(tensors: list[torch.Tensor], group, lengths: list[int]) -> list[torch.Tensor]:
    """Each (B, H_i, n_rank, D_i) local slice -> (B, H_i / P, N, D_i): this rank's share of the heads
    (the rank-th 1/P of them) over the whole sequence, in its natural order. One all-to-all."""
    world = dist.get_world_size(group)
    wire = tensors[0].dtype
    parts = [_wire(t, wire) for t in tensors]
    # send buffer: destination-major, each destination's heads of every tensor flattened together
    send = torch.cat([p.unflatten(1, (world, -1)).transpose(0, 1).reshape(world, -1) for p in parts], 1)
    per_position = [p.shape[0] * (p.shape[1] // world) * p.shape[3] for p in parts]  # elements a position
    recv_sizes = [lengths[j] * sum(per_position) for j in range(world)]
    recv = ring.receive_buffer(send, (sum(recv_sizes),))
    dist.all_to_all_single(recv, send.reshape(-1), recv_sizes, [send.shape[1]] * world, group=group)
    from_rank = recv.split(recv_sizes)
    gathered = []
    offsets = [0] * world
    for t, p, per in zip(tensors, parts, per_position):
        pieces = []
        for j in range(world):
            count = per * lengths[j]
            pieces.append(from_rank[j][offsets[j]:offsets[j] + count].view(
                p.shape[0], p.shape[1] // world, lengths[j], p.shape[3]))
            offsets[j] += count
        whole = sharding.zigzag_order(pieces, 2)
        gathered.append(_unwire(whole, t))
    return gathered


def gather_heads(tensors: list[torch.Tensor], group, lengths: list[int]) -> list[torch.Tensor]:
    """scatter_heads' inverse: each (B, h_i, N, D_i) share of heads over the whole sequence ->
    (B, P * h_i, n_rank, D_i), this rank's slice with every head. One all-to-all."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    n_total = sum(lengths)
    wire = tensors[0].dtype
    parts = [_wire(t, wire) for t in tensors]
    starts, sizes = sharding.chunk_starts(n_total, world), sharding.chunk_sizes(n_total, world)

    def slice_of(p, j):  # rank j's zigzag slice of the whole sequence
        late = 2 * world - 1 - j
        return torch.cat([p.narrow(2, starts[j], sizes[j]), p.narrow(2, starts[late], sizes[late])], 2)

    send_pieces = [torch.cat([slice_of(p, j).reshape(-1) for p in parts]) for j in range(world)]
    send_sizes = [s.numel() for s in send_pieces]
    per_rank = sum(p.shape[0] * p.shape[1] * lengths[rank] * p.shape[3] for p in parts)
    recv = ring.receive_buffer(parts[0], (world * per_rank,))
    dist.all_to_all_single(recv, torch.cat(send_pieces), [per_rank] * world, send_sizes, group=group)
    from_rank = recv.view(world, per_rank)
    results, offset = [], 0
    for t, p in zip(tensors, parts):
        count = p.shape[0] * p.shape[1] * lengths[rank] * p.shape[3]
        heads = from_rank[:, offset:offset + count].reshape(world, p.shape[0], p.shape[1], lengths[rank], p.shape[3])
        offset += count
        local = heads.transpose(0, 1).reshape(p.shape[0], world * p.shape[1], lengths[rank], p.shape[3])
        if local.untyped_storage().data_ptr() == recv.untyped_storage().data_ptr():
            local = local.clone()  # a view of the receive buffer: a custom op's results may not alias
        results.append(_unwire(local, t))
    return results


def _repeat_kv(k, v, repeats: int):
    if repeats == 1:
        return k, v
    return k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)


def ulysses_forward(q, k, v, group, lengths: list[int], causal: bool, scale: float, sm_margin: int = 0):
    """(out in q's dtype, lse float32) of the local queries against the whole sequence (``sm_margin``:
    the attention's, tilecore.attention's)."""
    world = dist.get_world_size(group)
    k, v = _repeat_kv(k, v, kv_repeats(q.shape[1], k.shape[1], world))
    qg, kg, vg = scatter_heads([q, k, v], group, lengths)
    out, lse = attention(qg, kg, vg, causal=causal, scale=scale, return_lse=True, sm_margin=sm_margin)
    out, lse = gather_heads([out, lse], group, lengths)
    return out, lse


def ulysses_backward(dout, dlse, q, k, v, out, lse, group, lengths: list[int], causal: bool, scale: float,
                     sm_margin: int = 0):
    """(dq, dk, dv) of the local slice: the gathered forward's inputs, O and lse again (one
    all-to-all), tilecore's attention backward on them, and the gradients traded back."""
    world = dist.get_world_size(group)
    hkv = k.shape[1]
    repeats = kv_repeats(q.shape[1], hkv, world)
    k, v = _repeat_kv(k, v, repeats)
    with_dlse = dlse is not None
    sent = [q, k, v, out, dout, lse] + ([dlse.to(torch.float32)] if with_dlse else [])
    gathered = scatter_heads(sent, group, lengths)
    qg, kg, vg, og, dog, lseg = gathered[:6]
    dlseg = gathered[6].contiguous() if with_dlse else None
    dqg, dkg, dvg = torch.ops.tilecore.attention_backward(dog, qg, kg, vg, og, lseg.contiguous(), dlseg, causal, scale,
                                                          -1, -1, 0.0, sm_margin)
    dq, dk, dv = gather_heads([dqg, dkg, dvg], group, lengths)
    if repeats > 1:  # each kv head's repeats' gradients summed (in float32)
        dk = dk.unflatten(1, (hkv, repeats)).float().sum(2).to(dk.dtype)
        dv = dv.unflatten(1, (hkv, repeats)).float().sum(2).to(dv.dtype)
    return dq, dk, dv
