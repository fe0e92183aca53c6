"""The ring's transfers by the GPUs' copy engines, for two ranks of one host (ring.TRANSPORT).

Why: NCCL moves bytes with a kernel, on SMs, and tilecore's persistent attention takes every SM, so
beside it NCCL's kernel either waits for the attention (the late order: the transfer exposed) or
takes SMs the attention then lacks (a margin; session 28: hidden 0-100%, the hop 1.7x slower with
its CTAs capped). A peer copy (cudaMemcpyAsync into memory of the other GPU, mapped here through
torch's symmetric memory) runs on a copy engine over NVLink and needs no SM, so it overlaps the
attention at margin 0.

Layout: each rank owns one symmetric buffer of two slots ("kv": a block's K then V; "sum": a dK/dV
sum), each a mailbox the previous rank writes into. Per slot two signals in torch's signal pads
(uint32 words, ``world * channel + rank``):

* FULL: the sender, after its copy, sets the receiver's word (cuStreamWriteValue32 on the copy's own
  stream, so no kernel and no SM; torch's put_signal kernel where that call is missing); the receiver
  waits for it (torch's wait_signal, a one-thread kernel on its compute stream, before the first use);
* FREE: the receiver, after the last kernel that reads the slot is queued, hands the slot back
  (put_signal on its compute stream); the sender waits for it on its compute stream before it
  queues the copy. Every slot starts FREE (each rank signals its sender once when the buffer is made).

So a transfer is: [sender compute] wait FREE -> [sender copy stream] copy, set FULL; [receiver compute]
wait FULL, kernels reading the slot, signal FREE. Every push a call makes is consumed in the same call
on the other rank, so the tokens balance per call. Signals time out (``TIMEOUT_MS``: the kernel traps,
an error, rather than a hang).

Only two ranks (each rank's next is its previous, one mailbox a kind suffices: one K/V hop a pass and
one sum hop in the backward); more ranks use NCCL. CUDA only; the CPU tests run NCCL's path on gloo.
"""
from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist

SLOTS = ("kv", "sum")
FULL, FREE = 0, 1  # a slot's two channels: channel = 2 * slot + kind
# ms a signal's wait spins before its kernel traps (an error, not a hang): long, since the ranks'
# first calls may differ by their kernels' compile times (NCCL's own default is 10 minutes)
TIMEOUT_MS = 300_000
ALIGN = 512  # bytes: each tensor in a slot starts on this boundary
# FULL set by cuStreamWriteValue32 on the copy stream (no kernel, no SM), else torch's put_signal
# kernel there (one thread; it may wait for an SM until the attention beside it ends)
FULL_BY_WRITE = True

_MAILBOXES: dict = {}  # (group name, device index) -> Mailboxes


_PEERS: dict = {}  # (group name, device index) -> whether the two ranks can use the copy engines


def available(group, device: torch.device) -> bool:
    """Whether copy-engine transfers apply: CUDA tensors, an NCCL group of exactly two ranks, both on
    one host with peer access between their GPUs (asked once per group and device: a small gather on
    the group's gloo metadata group, which every rank reaches at the same call), and torch's symmetric
    memory made there (a failure, the same on both ranks where the cause is the machine's, leaves
    NCCL)."""
    if device.type != "cuda" or dist.get_world_size(group) != 2 or "nccl" not in str(dist.get_backend(group)):
        return False
    key = (group.group_name, device.index)
    if key not in _PEERS:
        from tilecore.distributed import groups

        mine = (socket.gethostname(), os.getpid(), torch.cuda.current_device() if device.index is None
                else device.index)
        every = [None, None]
        dist.all_gather_object(every, mine, group=groups.metadata_group(group))
        other = every[1 - dist.get_rank(group)]
        ok = other[0] == mine[0] and other[2] != mine[2]
        try:
            ok = ok and torch.cuda.can_device_access_peer(mine[2], other[2])
        except Exception:  # noqa: BLE001
            ok = False
        # every rank decides alike: both must be able to
        votes = [None, None]
        dist.all_gather_object(votes, ok, group=groups.metadata_group(group))
        _PEERS[key] = all(votes)
    return _PEERS[key]


def unavailable(group, device: torch.device, err: Exception) -> None:
    """Symmetric memory failed here (``err``): a warning, and NCCL for this group from now on."""
    import warnings

    warnings.warn(f"tilecore.distributed: the copy engines' transfers are unavailable ({err}); using NCCL's",
                  RuntimeWarning, stacklevel=3)
    _PEERS[(group.group_name, device.index)] = False


def slot_of(tag: int) -> int:
    """ring.py's tags: even for K/V blocks, odd for dK/dV sums."""
    return tag % 2


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


class Mailboxes:
    """One rank's symmetric buffer of two slots and its handle (made and grown together by the ranks)."""

    def __init__(self, group, device: torch.device, slot_bytes: int, handle=None):
        """``handle``: torch's symmetric-memory handle of a buffer of two slots (made here, a
        collective, where None; tests pass a stand-in with the same methods)."""
        self.group, self.device, self.slot_bytes = group, device, slot_bytes
        self.buffer = None  # the local allocation, kept as long as the handle
        if handle is None:
            self.buffer, handle = _symmetric_handle(group, device, len(SLOTS) * slot_bytes)
        self.handle = handle
        self.rank, self.world = self.handle.rank, self.handle.world_size
        self.peer = (self.rank + 1) % self.world  # with two ranks both the next and the previous
        self.stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
        self.write_value = getattr(type(self.handle), "stream_write_value32", None) if FULL_BY_WRITE else None
        self.peer_pad = None
        if self.write_value is not None:
            try:
                self.peer_pad = self.handle.get_signal_pad(self.peer, dtype=torch.uint32)
            except Exception:  # noqa: BLE001  (no pad view: put_signal's kernel instead)
                self.peer_pad = None
        for slot in range(len(SLOTS)):  # every slot starts free: tell the sender
            self.handle.put_signal(self.peer, 2 * slot + FREE, TIMEOUT_MS)

    def views(self, rank: int, slot: int, shapes, dtype: torch.dtype) -> list[torch.Tensor]:
        """Tensors of ``shapes`` laid out in ``rank``'s slot (that rank's memory, mapped here)."""
        size = torch.tensor([], dtype=dtype).element_size()
        offsets, offset = [], slot * self.slot_bytes
        for shape in shapes:
            offsets.append(offset)
            nbytes = size
            for s in shape:
                nbytes *= s
            offset += aligned(nbytes)
        if offset > (slot + 1) * self.slot_bytes:
            raise ValueError(f"copy_engine: {offset - slot * self.slot_bytes} bytes do not fit a slot of "
                             f"{self.slot_bytes}")
        return [self.handle.get_buffer(rank, tuple(shape), dtype, at // size) for shape, at in zip(shapes, offsets)]

    def push(self, tensors, slot: int, timeline=None) -> None:
        """Copy ``tensors`` into the peer's slot on the copy stream, then set its FULL signal."""
        self.handle.wait_signal(self.peer, 2 * slot + FREE, TIMEOUT_MS)  # the peer is done with the slot
        dtype = tensors[0].dtype
        targets = self.views(self.peer, slot, [t.shape for t in tensors], dtype)
        if self.stream is None:  # tests' stand-in on the CPU: in order, on the caller's thread
            for target, t in zip(targets, tensors):
                target.copy_(t)
            self.signal_full(slot)
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            start = _event(timeline)
            for target, t in zip(targets, tensors):
                target.copy_(t)  # contiguous, same dtype: a cudaMemcpyAsync to peer memory (copy engine)
                t.record_stream(self.stream)
            if timeline is not None:
                timeline.append((f"copy {SLOTS[slot]}", start, _event(timeline), "copy"))
            self.signal_full(slot)

    def signal_full(self, slot: int) -> None:
        word = self.world * (2 * slot + FULL) + self.rank
        if self.peer_pad is not None:
            try:
                self.write_value(self.peer_pad, word, 1)
                return
            except Exception:  # noqa: BLE001
                self.peer_pad = None
        self.handle.put_signal(self.peer, 2 * slot + FULL, TIMEOUT_MS)

    def wait_full(self, slot: int) -> None:
        self.handle.wait_signal(self.peer, 2 * slot + FULL, TIMEOUT_MS)

    def release(self, slot: int) -> None:
        self.handle.put_signal(self.peer, 2 * slot + FREE, TIMEOUT_MS)


def _symmetric_handle(group, device: torch.device, nbytes: int):
    """A buffer of ``nbytes`` in torch's symmetric memory (CUDA backend: cuMem allocations mapped
    into every rank of ``group``; no multicast needed) and its handle: a collective. Returns both."""
    from torch.distributed import _symmetric_memory as symm_mem

    name = group.group_name
    try:
        if symm_mem.get_backend(device) is None:
            symm_mem.set_backend("CUDA")  # the peer-mapped allocations whose signal pads this uses
    except Exception:  # noqa: BLE001  (older torch: one backend, no choice)
        pass
    try:  # older torch needs the group enabled first; newer ones deprecate the call
        symm_mem.enable_symm_mem_for_group(name)
    except Exception:  # noqa: BLE001
        pass
    buffer = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
    return buffer, symm_mem.rendezvous(buffer, name)


def _event(timeline):
    if timeline is None:
        return None
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def mailboxes(group, device: torch.device, slot_bytes: int) -> Mailboxes:
    """The group's mailboxes on ``device``, made (or remade larger) where a slot is smaller than
    ``slot_bytes``: a collective, so every rank must ask for the same size at the same call (ring.py
    sizes it from the ranks' lengths, which every rank knows)."""
    key = (group.group_name, device.index)
    boxes = _MAILBOXES.get(key)
    if boxes is None or boxes.slot_bytes < slot_bytes:
        if boxes is not None:
            torch.cuda.synchronize(device)
        _MAILBOXES.pop(key, None)
        boxes = _MAILBOXES[key] = Mailboxes(group, device, aligned(slot_bytes))
    return boxes


class _Arrival:
    """The work ring.py waits on: the FULL signal's wait, queued on the compute stream."""

    def __init__(self, boxes: Mailboxes, slot: int):
        self.boxes, self.slot = boxes, slot

    def wait(self):
        self.boxes.wait_full(self.slot)


class CopyEngineRing:
    """ring.Ring's interface over Mailboxes: ``receive`` gives the slot's views (the mailbox is the
    receive buffer), ``exchange`` pushes to the peer and returns the arrival to wait on, ``release``
    hands the slot back after its last reader is queued."""

    uses_sms = False

    def __init__(self, group, device: torch.device, slot_bytes: int, timeline=None, boxes: Mailboxes | None = None):
        self.group = group
        self.boxes = boxes if boxes is not None else mailboxes(group, device, slot_bytes)
        self.rank, self.world = self.boxes.rank, self.boxes.world
        self.timeline = timeline

    def receive(self, like: torch.Tensor, shape, tag: int, count: int = 2):
        return tuple(self.boxes.views(self.boxes.rank, slot_of(tag), [shape] * count, like.dtype))

    def exchange(self, send, recv, tag: int) -> list:
        send = (send,) if isinstance(send, torch.Tensor) else tuple(send)
        send = tuple(t if t.is_contiguous() else t.contiguous() for t in send)
        self.boxes.push(send, slot_of(tag), self.timeline)
        return [_Arrival(self.boxes, slot_of(tag))]

    def release(self, tag: int, received=None, poison: bool = False) -> None:
        if poison and received is not None:  # checks: a slot the next transfer fails to fill shows NaN
            for t in received:
                t.fill_(float("nan"))
        self.boxes.release(slot_of(tag))


def slot_bytes_for(k: torch.Tensor, lengths: list[int]) -> int:
    """A slot's size for the ring's transfers of ``k``'s shape: K and V (or dK and dV in the inputs'
    dtype, as two ranks send them) of the longest slice."""
    B, H, _, D = k.shape
    return 2 * aligned(B * H * max(lengths) * D * k.element_size())
