"""The ring's transfers by the GPUs' copy engines, for the ranks of one host (ring.TRANSPORT).

Why: NCCL moves bytes with a kernel, on SMs, and tilecore's persistent attention takes every SM, so
beside it NCCL's kernel either waits for the attention (the late order: the transfer exposed) or
takes SMs the attention then lacks (a margin: hidden 0-100%, the hop 1.7x slower with
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

Two ranks: each rank's next is its previous, and one mailbox a kind suffices (one K/V hop a pass and
one sum hop in the backward). More ranks: each rank pushes to its next and reads what
its previous pushed; the slots are double-buffered (kv0, kv1, sum0, sum1: step s+1's push lands while
step s reads the other), a rank forwards the block in its own slot to the next one (a copy from its
symmetric memory), and hands a slot back only after that copy too (the compute stream waits for the
copy stream first). Sums of more than one share travel in float32, so the slots hold float32 dK, dV.

The first K/V push of a forward may be prepared before the metadata gather ends (``prewait``): the
FREE wait queued before step 0's attention and an event after it, by which the copy, queued after the
gather's checks, is ordered (not by the compute stream, where step 0 then sits). A call whose checks
fail hands the FREE token back (``Prewaited.cancel``: the rank's own signal word rewritten).
CUDA only; the CPU tests run NCCL's path on gloo and this protocol over a stand-in handle.
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

# More than two ranks on the copy engines (double-buffered slots): right and faster than NCCL on 4 H100s
# (notes/distributed/README.md's decision log): on
ABOVE_TWO_RANKS = True

_MAILBOXES: dict = {}  # (group name, device index) -> Mailboxes
_TOLD: set = set()  # groups told why their ring (more than two ranks) uses NCCL


_PEERS: dict = {}  # (group name, device index) -> whether the two ranks can use the copy engines


def available(group, device: torch.device) -> bool:
    """Whether copy-engine transfers apply: CUDA tensors, an NCCL group of two ranks or more (more
    only with ABOVE_TWO_RANKS, on by default), all on
    one host with peer access from each GPU to its ring neighbours' (asked once per group and device:
    a small gather on the group's gloo metadata group, which every rank reaches at the same call), and
    torch's symmetric memory made there (a failure, the same on every rank where the cause is the
    machine's, leaves NCCL)."""
    if device.type != "cuda":
        return False
    world = dist.get_world_size(group)
    if world < 2 or "nccl" not in str(dist.get_backend(group)):
        return False
    if world > 2 and not ABOVE_TWO_RANKS:
        if group.group_name not in _TOLD:  # once a group: why its ring uses NCCL
            _TOLD.add(group.group_name)
            import warnings

            warnings.warn(f"tilecore.distributed: copy_engine.ABOVE_TWO_RANKS is off, so this group of {world} "
                          "ranks passes its blocks through NCCL", RuntimeWarning, stacklevel=3)
        return False
    key = (group.group_name, device.index)
    if key not in _PEERS:
        from tilecore.distributed import groups

        mine = (socket.gethostname(), os.getpid(), torch.cuda.current_device() if device.index is None
                else device.index)
        every = [None] * world
        dist.all_gather_object(every, mine, group=groups.metadata_group(group))
        rank = dist.get_rank(group)
        ok = all(e[0] == mine[0] for e in every) and len({e[2] for e in every}) == world
        try:
            ok = ok and all(torch.cuda.can_device_access_peer(mine[2], every[(rank + d) % world][2]) for d in (1, -1))
        except Exception:  # noqa: BLE001
            ok = False
        # every rank decides alike: all must be able to
        votes = [None] * world
        dist.all_gather_object(votes, ok, group=groups.metadata_group(group))
        _PEERS[key] = all(votes)
    return _PEERS[key]


def set_above_two_ranks(on: bool) -> bool:
    """Probes: copy-engine rings past two ranks (ABOVE_TWO_RANKS) from now on; returns the previous
    value (a group already asked keeps its answer: set it before the group's first ring call)."""
    global ABOVE_TWO_RANKS
    previous, ABOVE_TWO_RANKS = ABOVE_TWO_RANKS, bool(on)
    return previous


def set_signal_timeout_ms(ms: int) -> int:
    """Probes: milliseconds a signal wait spins before its kernel traps (TIMEOUT_MS) for mailboxes
    made and waits queued from now on; returns the previous value."""
    global TIMEOUT_MS
    if isinstance(ms, bool) or not isinstance(ms, int) or ms <= 0:
        raise ValueError(f"copy_engine.set_signal_timeout_ms: a positive int; got {ms!r}")
    previous, TIMEOUT_MS = TIMEOUT_MS, ms
    return previous


def mailbox_bytes(group, device: torch.device) -> int:
    """Bytes of this group's symmetric mailboxes on ``device`` (0 where none were made): memory
    outside torch's caching allocator, so not in its peak figures."""
    boxes = _MAILBOXES.get((group.group_name, device.index))
    return 0 if boxes is None else boxes.slots * boxes.slot_bytes


def known_available(group, device: torch.device) -> bool:
    """available()'s answer where it was asked before for this group and device (no collective),
    else False."""
    return device.type == "cuda" and bool(_PEERS.get((group.group_name, device.index)))


def unavailable(group, device: torch.device, err: Exception) -> None:
    """Symmetric memory failed here (``err``): a warning, and NCCL for this group from now on."""
    import warnings

    warnings.warn(f"tilecore.distributed: the copy engines' transfers are unavailable ({err}); using NCCL's",
                  RuntimeWarning, stacklevel=3)
    _PEERS[(group.group_name, device.index)] = False


def slot_of(tag: int, world: int = 2) -> int:
    """ring.py's tags: even for K/V blocks, odd for dK/dV sums (2t: the block a rank uses at step t;
    2t + 1: the sum sent at step t). Two ranks: slots kv and sum; more: kv0, kv1, sum0, sum1 by t's
    parity (double-buffered: consecutive transfers of a kind land in different slots)."""
    if world <= 2:
        return tag % 2
    return 2 * (tag % 2) + (tag // 2) % 2


def slot_count(world: int) -> int:
    return 2 if world <= 2 else 4


def slot_name(slot: int, world: int) -> str:
    return SLOTS[slot] if world <= 2 else ("kv0", "kv1", "sum0", "sum1")[slot]


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


class Mailboxes:
    """One rank's symmetric buffer of slots and its handle (made and grown together by the ranks)."""

    def __init__(self, group, device: torch.device, slot_bytes: int, handle=None, world: int | None = None):
        """``handle``: torch's symmetric-memory handle of a buffer of slot_count(world) slots (made
        here, a collective, where None; tests pass a stand-in with the same methods)."""
        self.group, self.device, self.slot_bytes = group, device, slot_bytes
        self.buffer = None  # the local allocation, kept as long as the handle
        if handle is None:
            world = dist.get_world_size(group) if world is None else world
            self.buffer, handle = _symmetric_handle(group, device, slot_count(world) * slot_bytes)
        self.handle = handle
        self.rank, self.world = self.handle.rank, self.handle.world_size
        self.slots = slot_count(self.world)
        self.next = (self.rank + 1) % self.world  # pushes go there (and its FREE signals come from there)
        self.prev = (self.rank - 1) % self.world  # its pushes land here (and get this rank's FREE signals)
        self.peer = self.next  # (two ranks: both)
        self.stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
        self.write_value = getattr(type(self.handle), "stream_write_value32", None) if FULL_BY_WRITE else None
        self.peer_pad = self.own_pad = None
        if self.write_value is not None:
            try:
                self.peer_pad = self.handle.get_signal_pad(self.next, dtype=torch.uint32)
                self.own_pad = self.handle.get_signal_pad(self.rank, dtype=torch.uint32)
            except Exception:  # noqa: BLE001  (no pad view: put_signal's kernel instead, no prewait)
                self.peer_pad = self.own_pad = None
        self._views: dict = {}  # (rank, slot, shapes, dtype) -> the views (get_buffer costs host time)
        for slot in range(self.slots):  # every slot starts free: tell the sender
            self.handle.put_signal(self.prev, 2 * slot + FREE, TIMEOUT_MS)

    def views(self, rank: int, slot: int, shapes, dtype: torch.dtype) -> list[torch.Tensor]:
        """Tensors of ``shapes`` laid out in ``rank``'s slot (that rank's memory, mapped here); kept per
        (rank, slot, shapes, dtype): the same calls ask for the same views."""
        key = (rank, slot, tuple(tuple(s) for s in shapes), dtype)
        hit = self._views.get(key)
        if hit is not None:
            return hit
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
        views = [self.handle.get_buffer(rank, tuple(shape), dtype, at // size) for shape, at in zip(shapes, offsets)]
        if len(self._views) >= 64:
            self._views.clear()
        self._views[key] = views
        return views

    def fits(self, tensors) -> bool:
        """Whether ``tensors`` (contiguous, one dtype) fit one slot."""
        return sum(aligned(t.numel() * t.element_size()) for t in tensors) <= self.slot_bytes

    def push(self, tensors, slot: int, timeline=None, prewaited: "Prewaited | None" = None) -> None:
        """Copy ``tensors`` into the next rank's slot on the copy stream, then set its FULL signal.
        ``prewaited``: this slot's FREE wait already queued (prewait): the copy is ordered by its event."""
        if prewaited is None:
            self.handle.wait_signal(self.next, 2 * slot + FREE, TIMEOUT_MS)  # the next rank is done with the slot
        dtype = tensors[0].dtype
        targets = self.views(self.next, slot, [t.shape for t in tensors], dtype)
        if self.stream is None:  # tests' stand-in on the CPU: in order, on the caller's thread
            for target, t in zip(targets, tensors):
                target.copy_(t)
            self.signal_full(slot)
            return
        if prewaited is None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        else:
            self.stream.wait_event(prewaited.event)
        with torch.cuda.stream(self.stream):
            start = _event(timeline)
            for target, t in zip(targets, tensors):
                target.copy_(t)  # contiguous, same dtype: a cudaMemcpyAsync to peer memory (copy engine)
                t.record_stream(self.stream)
            if timeline is not None:
                timeline.append((f"copy {slot_name(slot, self.world)}", start, _event(timeline), "copy"))
            self.signal_full(slot)

    def signal_full(self, slot: int) -> None:
        word = self.world * (2 * slot + FULL) + self.rank
        if self.peer_pad is not None:
            try:
                self.write_value(self.peer_pad, word, 1)
                return
            except Exception:  # noqa: BLE001
                self.peer_pad = None
        self.handle.put_signal(self.next, 2 * slot + FULL, TIMEOUT_MS)

    def wait_full(self, slot: int) -> None:
        self.handle.wait_signal(self.prev, 2 * slot + FULL, TIMEOUT_MS)

    def release(self, slot: int) -> None:
        if self.world > 2 and self.stream is not None:  # the slot's block may be on its way to the next rank
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
        self.handle.put_signal(self.prev, 2 * slot + FREE, TIMEOUT_MS)

    def prewait(self, slot: int) -> "Prewaited | None":
        """The FREE wait of ``slot`` queued now on the current stream, and an event after it (None where
        the token could not be handed back: no own signal pad to rewrite)."""
        if self.own_pad is None:
            return None
        self.handle.wait_signal(self.next, 2 * slot + FREE, TIMEOUT_MS)
        event = None
        if self.stream is not None:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
        return Prewaited(self, slot, event)

    def restore_free(self, slot: int) -> None:
        """Give this rank back the FREE token of ``slot`` that a prewait took (its own signal word from
        the next rank rewritten, on the current stream after the wait)."""
        self.write_value(self.own_pad, self.world * (2 * slot + FREE) + self.next, 1)


class Prewaited:
    """A slot's FREE wait queued ahead of its push (Mailboxes.prewait): ``cancel`` hands the token
    back where the push will not come (the call's checks failed, or the ring went another way)."""

    def __init__(self, boxes: Mailboxes, slot: int, event):
        self.boxes, self.slot, self.event = boxes, slot, event
        self.used = False

    def cancel(self) -> None:
        if not self.used:
            self.used = True
            self.boxes.restore_free(self.slot)


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


def prewait(group, device: torch.device, k: torch.Tensor, v: torch.Tensor, tag: int = 0) -> Prewaited | None:
    """Before the metadata gather's result: where this group's mailboxes on ``device`` exist (no
    collective needed) and hold this rank's K and V, the FREE wait of the first K/V push (``tag``)
    queued on the current stream (Mailboxes.prewait); else None. The ranks need not agree: a rank
    that prewaited and a rank that did not push alike after the checks."""
    if device.type != "cuda" or not known_available(group, device):
        return None
    boxes = _MAILBOXES.get((group.group_name, device.index))
    if boxes is None or not boxes.fits((k, v)):
        return None
    return boxes.prewait(slot_of(tag, boxes.world))


class _Arrival:
    """The work ring.py waits on: the FULL signal's wait, queued on the compute stream."""

    def __init__(self, boxes: Mailboxes, slot: int):
        self.boxes, self.slot = boxes, slot

    def wait(self):
        self.boxes.wait_full(self.slot)


class CopyEngineRing:
    """ring.Ring's interface over Mailboxes: ``receive`` gives the slot's views (the mailbox is the
    receive buffer), ``exchange`` pushes to the next rank and returns the arrival to wait on,
    ``release`` hands the slot back after its last reader (and, past two ranks, the copy forwarding
    it) is queued. ``prewaited``: the first push's FREE wait, queued before the call's step 0."""

    uses_sms = False

    def __init__(self, group, device: torch.device, slot_bytes: int, timeline=None, boxes: Mailboxes | None = None,
                 prewaited: Prewaited | None = None):
        self.group = group
        self.boxes = boxes if boxes is not None else mailboxes(group, device, slot_bytes)
        self.rank, self.world = self.boxes.rank, self.boxes.world
        self.timeline = timeline
        self.prewaited = None
        if prewaited is not None:
            if prewaited.boxes is self.boxes:
                self.prewaited = prewaited
            else:  # the mailboxes were remade larger: the old ones (and their tokens) are gone
                prewaited.used = True

    def prewait_first(self, kv) -> None:
        """The first K/V push's FREE wait queued now (Mailboxes.prewait), where the block fits a slot."""
        if self.prewaited is None and self.boxes.fits(kv):
            self.prewaited = self.boxes.prewait(slot_of(0, self.world))

    def receive(self, like: torch.Tensor, shape, tag: int, count: int = 2):
        return tuple(self.boxes.views(self.boxes.rank, slot_of(tag, self.world), [shape] * count, like.dtype))

    def exchange(self, send, recv, tag: int) -> list:
        send = (send,) if isinstance(send, torch.Tensor) else tuple(send)
        send = tuple(t if t.is_contiguous() else t.contiguous() for t in send)
        slot = slot_of(tag, self.world)
        ready = None
        if self.prewaited is not None and not self.prewaited.used and self.prewaited.slot == slot:
            ready, self.prewaited.used = self.prewaited, True
        self.boxes.push(send, slot, self.timeline, ready)
        return [_Arrival(self.boxes, slot)]

    def release(self, tag: int, received=None, poison: bool = False) -> None:
        slot = slot_of(tag, self.world)
        if poison and received is not None:  # checks: a slot the next transfer fails to fill shows NaN
            if self.world > 2 and self.boxes.stream is not None:  # after the copy that forwards it
                torch.cuda.current_stream(self.boxes.device).wait_stream(self.boxes.stream)
            for t in received:
                t.fill_(float("nan"))
        self.boxes.release(slot)

    def close(self) -> None:
        """A prewait that no push used hands its token back."""
        if self.prewaited is not None:
            self.prewaited.cancel()


def slot_bytes_for(k: torch.Tensor, lengths: list[int]) -> int:
    """A slot's size for the ring's transfers of ``k``'s shape: K and V (or dK and dV in the inputs'
    dtype, as two ranks send them; past two ranks the sums travel in float32) of the longest slice."""
    B, H, _, D = k.shape
    size = k.element_size() if len(lengths) <= 2 else max(k.element_size(), 4)
    return 2 * aligned(B * H * max(lengths) * D * size)
