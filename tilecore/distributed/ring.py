"""Ring attention: each rank keeps its queries and passes its keys and values around the ring; every
step attends the local queries to the block it holds while the next block is in flight; partial
results are merged by their log-sum-exp in float32.

Layout: the sequence is split in the zigzag order (sharding.py): rank r holds chunks r and 2P-1-r
(its "early" and "late" chunks). Step s attends to the block of rank src = r - s (mod P):

* step 0 (its own block): causal attention of the local slice on itself (the two chunks are in
  order, so the local causal mask is the global one restricted to them), or full attention;
* causal, src < r: every local query sees src's early chunk whole, and none sees src's late one;
* causal, src > r: only the local late chunk sees src's block, all of it.

So every causal step is full, empty, or causal on the diagonal, and every rank does the same work a
step (half its queries against a whole block, or all its queries against half a block).

Backward: the same ring, with the merged O and lse of each local query: the flash backward's
P = exp(s - lse) and delta = rowsum(dO * O) are then the global ones, so each step's block gradients
are exactly that block's share (tilecore's attention backward, which takes O and lse). dQ sums
locally in float32, each block's added into the rows of one accumulator (with DQ_IN_KERNEL by
attention's backward_adding_dq: the Gluon kernel's own float32 reductions, where it adds dQ); each foreign
block's dK, dV sum in a float32 buffer that travels the ring behind its keys and values and goes
home after the last rank's share. The rank's own block is done in two parts, one before the foreign
blocks and one after, so that the first transfer of keys and values and the last hop of a sum both
run under attention (ring_backward).

Communication: one batch of isend/irecv a step (torch.distributed.batch_isend_irecv: K and V, each
sent as it is where contiguous, else copied once) to the next rank and from the previous; NCCL runs
it on its own stream, ordered after the work queued before it, and wait() orders the next step after
it. NCCL moves the bytes with a kernel, on SMs, so the transfer overlaps the step's attention only
where the attention leaves it some: ``sm_margin`` (tilecore.attention's: its persistent kernels'
grids that many SMs smaller). With a margin each transfer starts before the attention it hides
under (the early order); without one, after it (the late order, TRANSFERS_EARLY). On gloo the same
code runs (the transfer on gloo's threads). CUDA ranks of one host (the default, TRANSPORT, for two
ranks or more): the copy engines instead (copy_engine.py: peer copies into
the next GPU's symmetric memory, no SM), each transfer started before the attention it hides under,
at margin 0.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from tilecore import dispatch
import contextlib

from tilecore.distributed import copy_engine, groups, kernels_tl, sharding
from tilecore.ops.attention import attention
from tilecore.ops.attention.op import backward_adding_dq
from tilecore.tiles.launch import CachedLaunch, cdiv, next_power_of_2

MERGE = CachedLaunch(kernels_tl.lse_merge_kernel)
OWN_SUM = CachedLaunch(kernels_tl.own_sum_kernel)


POISON = False  # checks: receive buffers start as NaN, so one a transfer did not fill shows


def poison_receive_buffers(on: bool = True) -> None:
    """Checks and probes: fill every receive buffer with NaN before its transfer (off by default)."""
    global POISON
    POISON = bool(on)


def receive_buffer(like: torch.Tensor, shape) -> torch.Tensor:
    """An uninitialized buffer of ``like``'s dtype and device (NaN-filled under POISON)."""
    buffer = like.new_empty(shape)
    return buffer.fill_(float("nan")) if POISON else buffer


def receive_pair(like: torch.Tensor, shape) -> tuple[torch.Tensor, torch.Tensor]:
    """Two receive buffers of ``like``'s dtype (a block's K and V, or their gradients' sums)."""
    return receive_buffer(like, shape), receive_buffer(like, shape)


def sendable(t: torch.Tensor) -> torch.Tensor:
    """``t`` as NCCL and gloo send it: contiguous (a copy only where it is not)."""
    return t if t.is_contiguous() else t.contiguous()


class Ring:
    """Sends to the next rank of ``group`` and receives from the previous one, a batch a call."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.world)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.world)

    uses_sms = True  # NCCL's transfer kernel runs on SMs (copy_engine.CopyEngineRing's copies do not)

    def receive(self, like: torch.Tensor, shape, tag: int, count: int = 2):
        """``count`` buffers of ``shape`` in ``like``'s dtype for the transfer ``tag``."""
        return tuple(receive_buffer(like, shape) for _ in range(count))

    def release(self, tag: int, received=None, poison: bool = False) -> None:
        """The transfer ``tag``'s buffers are read by every kernel queued so far (nothing to do here:
        they are the caller's; copy_engine's mailboxes go back to the sender)."""

    def exchange(self, send, recv, tag: int) -> list:
        """Start sending ``send`` (a contiguous tensor, or a tuple of them) to the next rank and
        receiving ``recv`` (as many, their shapes) from the previous one, in one batch; returns the
        works to wait on."""
        send = (send,) if isinstance(send, torch.Tensor) else send
        recv = (recv,) if isinstance(recv, torch.Tensor) else recv
        ops = [dist.P2POp(dist.isend, t, self.next, self.group, 4 * tag + i) for i, t in enumerate(send)]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group, 4 * tag + i) for i, t in enumerate(recv)]
        return dist.batch_isend_irecv(ops)


def wait_all(works: list) -> None:
    """Wait for (and drop) each work of ``works``: a second call on the same list waits for nothing
    (gloo's wait() on a finished receive may block again)."""
    while works:
        works.pop(0).wait()


def step_span(step: int, src: int, rank: int, causal: bool, chunks: list[int], lengths: list[int]):
    """(query rows of the local slice, keys of src's block, causal) that step ``step`` attends, or
    None where nothing is seen. ``chunks``: the 2P chunk lengths; ``lengths``: each rank's slice."""
    n = lengths[rank]
    if step == 0:
        return slice(0, n), lengths[rank], causal
    if not causal:
        return slice(0, n), lengths[src], False
    if src < rank:  # every local query sees src's early chunk, none its late chunk
        rows, keys = slice(0, n), chunks[src]
    else:  # only the local late chunk sees src's block: all of it
        rows, keys = slice(chunks[rank], n), lengths[src]
    if rows.stop - rows.start == 0 or keys == 0:
        return None
    return rows, keys, False


def merge_into(acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """acc (O, any float dtype, and float32 lse of the keys so far) <- the softmax-weighted union with
    a block's (out, lse), in place, in float32. Rows with no key yet (lse -inf on both sides) stay 0
    and -inf; a NaN lse makes its row NaN (as one attention over all keys gives). Where tilecore's
    kernels run (CUDA, or the interpreter) one tl kernel pass; else torch's ops."""
    if acc_out.numel() == 0:
        return
    if dispatch.backend_for(acc_out.device) == "kernel":
        B, H, rows, D = acc_out.shape
        block_m = 16 if dispatch.interpreted(acc_out.device) else 64
        with dispatch.on_device(acc_out.device):
            MERGE[(B * H, cdiv(rows, block_m), 1)](
                acc_out, acc_lse, out, lse, H, rows, D, *acc_out.stride(), *acc_lse.stride(), *out.stride(),
                *lse.stride(), BLOCK_M=block_m, BLOCK_D=next_power_of_2(D), num_warps=4)
        return
    new_lse = torch.logaddexp(acc_lse, lse)
    # exp(lse - new) with new = -inf would be NaN; such a row has no key on either side: weights 0
    base = torch.where(torch.isneginf(new_lse), 0.0, new_lse)
    merged = acc_out.float().mul_(torch.exp(acc_lse - base).unsqueeze(-1))
    merged.add_(out.float().mul_(torch.exp(lse - base).unsqueeze(-1)))
    acc_out.copy_(merged)
    acc_lse.copy_(new_lse)


# The ring's switches: a one-line reason each; the figures behind them are in notes/distributed/README.md's
# decision log.
# Transfers before the step's attention at sm_margin 0 (else after it, waited on before the next): NCCL's
# kernel finds no SM beside the persistent attention, and started first it delays the attention's programs
TRANSFERS_EARLY = False
# SMs the attention leaves NCCL's kernel by default (sm_margin=None): margins lost on 2 H200s, were mixed
# on 2 H100s, and the copy engines (the default transport) need none
RING_SM_MARGIN = 0
# With a margin, NCCL's kernels capped at that many CTAs (groups.transfer_group), so they fit in it
CAP_TRANSFER_CTAS = True
# Each block's dQ added by the Gluon backward's own reductions into the ring's float32 accumulator (no
# buffer, copy or add a block): right and as fast or faster, less memory (2 H100s)
DQ_IN_KERNEL = True
# "copy_engine": peer copies into the next rank's symmetric memory (copy_engine.py; no SM, so hidden at
# margin 0), where the ranks share a host with peer access, else NCCL; "nccl": batch_isend_irecv
TRANSPORT = "copy_engine"
# Two ranks: a rank's own dK, dV summed from its three shares in one pass (kernels_tl.own_sum_kernel, the
# float32 buffer's sums in its order) instead of a float32 buffer's copy, adds and cast
FUSED_OWN_SUMS = True
# Past two ranks: the own dK, dV in one pass too (the incoming sum float32), and each passing sum made in
# one pass (the incoming float32 sum + this rank's share, own_sum into float32) instead of a float32 copy
# and an add: the same sums in the same order. On: as right and faster at every size on 4 H100s, less memory
# (notes/distributed/README.md's decision log)
ONE_PASS_SUMS_ABOVE_TWO = True
TRANSPORTS = ("nccl", "copy_engine")


def set_fused_own_sums(on: bool) -> bool:
    """Checks and probes: FUSED_OWN_SUMS from now on; returns the previous value."""
    global FUSED_OWN_SUMS
    previous, FUSED_OWN_SUMS = FUSED_OWN_SUMS, bool(on)
    return previous


def set_one_pass_sums_above_two(on: bool) -> bool:
    """Checks and probes: ONE_PASS_SUMS_ABOVE_TWO from now on; returns the previous value."""
    global ONE_PASS_SUMS_ABOVE_TWO
    previous, ONE_PASS_SUMS_ABOVE_TWO = ONE_PASS_SUMS_ABOVE_TWO, bool(on)
    return previous


def own_sum(a, a_keys: int, b, b_keys: int, c, dtype: torch.dtype) -> torch.Tensor:
    """((a[:a_keys] + b[:b_keys]) + c) in float32, rounded to ``dtype`` (keys past a share's count it 0;
    a or b None: no share). (B, H, n, D) each, c the whole n; one kernel pass where tilecore's kernels
    run, else torch's ops."""
    B, H, n, D = c.shape
    if dispatch.backend_for(c.device) != "kernel":
        total = torch.zeros((B, H, n, D), dtype=torch.float32, device=c.device)
        for t, keys in ((a, a_keys), (b, b_keys)):
            if t is not None and keys:
                total[:, :, :keys] += t[:, :, :keys]
        return total.add_(c).to(dtype)
    out = torch.empty((B, H, n, D), dtype=dtype, device=c.device)
    if out.numel() == 0:
        return out
    flat = lambda t, rows: t[:, :, :rows].reshape(B * H, rows, D) if t is not None and rows else c.reshape(  # noqa: E731
        B * H, n, D)[:, :0]
    fa, fb, fc = flat(a, a_keys if a is not None else 0), flat(b, b_keys if b is not None else 0), flat(c, n)
    fa, fb, fc = (t if t.stride(-1) == 1 else t.contiguous() for t in (fa, fb, fc))
    block_m = 16 if dispatch.interpreted(c.device) else 64
    with dispatch.on_device(c.device):
        OWN_SUM[(B * H, cdiv(n, block_m), 1)](
            out, fa, fb, fc, n, fa.shape[1], fb.shape[1], D, n * D, D, fa.stride(0), fa.stride(1), fb.stride(0), fb.stride(1), fc.stride(0), fc.stride(1),
            BLOCK_M=block_m, BLOCK_D=next_power_of_2(D), num_warps=4)
    return out


def set_transport(name: str) -> str:
    """Checks and probes: the ring's transfers by ``name`` (one of TRANSPORTS) from now on; returns
    the previous one (to restore)."""
    global TRANSPORT
    if name not in TRANSPORTS:
        raise ValueError(f"ring.set_transport: {name!r}; accepted: {', '.join(TRANSPORTS)}")
    previous, TRANSPORT = TRANSPORT, name
    return previous

# Probes (experiments/distributed/gpu_check.py): a list that gets (label, time.perf_counter()) at the
# public call's host milestones (op.py and here: forward entered, gather started, step 0 queued,
# gather done, transfers started, backward entered and queued); None (the default): nothing.
HOST_TIMELINE = None


def record_host_timeline(into: list | None) -> None:
    """Probes: record the public call's host milestones into ``into`` (a list), or stop (None)."""
    global HOST_TIMELINE
    HOST_TIMELINE = into


def host_mark(label: str) -> None:
    """Probes: the host's time at ``label`` into HOST_TIMELINE where it is a list."""
    if HOST_TIMELINE is not None:
        HOST_TIMELINE.append((label, time.perf_counter()))


# Probes (experiments/distributed/gpu_check.py --breakdown): a list that gets (label, start event, end
# event, stream) for each part of a ring call on CUDA (attention steps, merges, waits, sums, copies);
# None (the default): nothing recorded.
TIMELINE = None


def record_timeline(into: list | None) -> None:
    """Probes: record the ring's parts into ``into`` (a list), or stop (None)."""
    global TIMELINE
    TIMELINE = into


@contextlib.contextmanager
def probe(label: str, device: torch.device):
    """Records ``label``'s CUDA events on the current stream where TIMELINE is a list."""
    if TIMELINE is None or device.type != "cuda":
        yield
        return
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    yield
    end.record()
    TIMELINE.append((label, start, end, "compute"))


def ring_for(group, device: torch.device, sm_margin: int, early: bool, k: torch.Tensor | None = None,
             lengths: list[int] | None = None, prewaited=None):
    """The Ring a call's transfers go through: with TRANSPORT "copy_engine", CUDA ranks of one host
    with peer access and ``k`` and ``lengths`` given (to size the mailboxes),
    copy_engine.CopyEngineRing; else ``group``'s, or with a margin in the early order on an NCCL group
    its ranks' group capped at sm_margin CTAs (CAP_TRANSFER_CTAS). ``prewaited``: the first push's
    FREE wait, queued before the metadata gather's result (copy_engine.prewait); handed back where the
    ring is not the copy engines'."""
    if TRANSPORT == "copy_engine" and k is not None and copy_engine.available(group, device):
        try:
            return copy_engine.CopyEngineRing(group, device, copy_engine.slot_bytes_for(k, lengths), TIMELINE,
                                              prewaited=prewaited)
        except (RuntimeError, ValueError, ImportError, AttributeError) as err:  # no symmetric memory here
            copy_engine.unavailable(group, device, err)
    if prewaited is not None:
        prewaited.cancel()
    if (CAP_TRANSFER_CTAS and early and sm_margin > 0 and device.type == "cuda"
            and "nccl" in str(dist.get_backend(group))):
        return Ring(groups.transfer_group(group, sm_margin))
    return Ring(group)


def default_sm_margin(device: torch.device, world: int, mode: str = "ring") -> int:
    """sm_margin=None's value: RING_SM_MARGIN for the ring on CUDA with more than one rank (at most
    the GPU's SMs less one), else 0 (all-to-all's transfers do not run beside its attention; the
    CPU has no grid)."""
    if mode != "ring" or world < 2 or device.type != "cuda":
        return 0
    return min(RING_SM_MARGIN, dispatch.num_sms(device) - 1)


def transfer_order(early: bool | None, sm_margin: int, ring=None) -> bool:
    """Whether transfers start before the attention they overlap: ``early`` where given, else where
    they need no SM (``ring``'s copies by the copy engines) or the attention leaves SMs (sm_margin > 0),
    else TRANSFERS_EARLY."""
    if early is not None:
        return early
    if ring is not None and not getattr(ring, "uses_sms", True):
        return True
    return sm_margin > 0 or TRANSFERS_EARLY


def step_margin(sm_margin: int, early: bool, beside_transfer: bool) -> int:
    """The margin an attention of the ring leaves: ``sm_margin`` beside a transfer (early order), 0
    where nothing is in flight during it (its SMs would idle); in the late order the caller's as
    given (nothing runs beside the attention there, so a margin only serves the caller's own work)."""
    return sm_margin if beside_transfer or not early else 0


def ring_forward(q, k, v, group, lengths, causal: bool, scale: float, ring: Ring | None = None,
                 early: bool | None = None, sm_margin: int = 0):
    """(out in q's dtype, lse float32) of the local queries against the whole sequence's keys.
    ``lengths``: the ranks' slice lengths, or a callable that gives them (the public call's metadata
    gather in flight, op.PendingChecks: it raises on every rank where the checks fail): then step 0,
    which needs only this rank's slice, is queued first and the callable waited on after it, with the
    first K/V push's FREE wait queued before step 0 where the copy engines' mailboxes are ready
    (copy_engine.prewait), so the push after the gather still overlaps step 0. ``ring``: what passes
    the blocks on (default ring_for's; probes pass one that does not, to time the compute alone);
    ``sm_margin``: SMs each step's attention leaves free (tilecore.attention's); ``early``: start
    each transfer before the step's attention (default: transfer_order's)."""
    device = q.device
    kv = (sendable(k), sendable(v))  # the block this step attends, as it is sent on
    first = None  # step 0's (out, lse), where queued before the gather's result
    if callable(lengths):
        pending, lengths = lengths, None
        world = ring.world if ring is not None else dist.get_world_size(group)
        prewaited = None
        if ring is None and TRANSPORT == "copy_engine" and world > 1:
            prewaited = copy_engine.prewait(group, device, *kv)
        elif hasattr(ring, "prewait_first"):  # a copy-engine ring given (tests): the same, on its mailboxes
            ring.prewait_first(kv)
        early0 = transfer_order(early, sm_margin, ring if ring is not None else (
            _NO_SMS if prewaited is not None else None))
        with probe("fwd step 0 attention", device):
            first = attention(q, kv[0], kv[1], causal=causal, scale=scale, return_lse=True,
                              sm_margin=step_margin(sm_margin, early0, world > 1))
        host_mark("step 0 queued")
        try:
            if hasattr(pending, "start"):  # the metadata gather (its enqueue is host time) after step 0
                pending.start()
            lengths = pending()
        except BaseException:
            if prewaited is not None:
                prewaited.cancel()
            if hasattr(ring, "close"):
                ring.close()
            raise
        if ring is None:
            ring = ring_for(group, device, sm_margin, transfer_order(early, sm_margin), k, lengths, prewaited)
    ring = ring or ring_for(group, device, sm_margin, transfer_order(early, sm_margin), k, lengths)
    early = transfer_order(early, sm_margin, ring)
    rank, world = ring.rank, ring.world
    chunks = sharding.chunk_sizes(sum(lengths), world)
    B, Hkv, _, D = k.shape
    acc_out = acc_lse = None
    for step in range(world):
        src = (rank - step) % world
        more = step + 1 < world

        def start():
            incoming = ring.receive(k, (B, Hkv, lengths[(src - 1) % world], D), tag=2 * step)
            return incoming, ring.exchange(kv, incoming, tag=2 * step)

        if more and (early or first is not None and step == 0):  # (step 0 queued already: its transfer now)
            incoming, works = start()
            host_mark(f"transfer {step} started")
        span = step_span(step, src, rank, causal, chunks, lengths)
        out = lse = None
        if step == 0 and first is not None:
            out, lse = first
        elif span is not None:
            rows, keys, step_causal = span
            with probe(f"fwd step {step} attention", device):
                out, lse = attention(q[:, :, rows], kv[0][:, :, :keys], kv[1][:, :, :keys], causal=step_causal,
                                     scale=scale, return_lse=True, sm_margin=step_margin(sm_margin, early, more))
        if step > 0:  # the block received for this step has been read
            ring.release(2 * (step - 1), kv, POISON)
        if more and not early and not (first is not None and step == 0):  # after the attention, beside the merge
            incoming, works = start()
        if span is not None:
            if acc_out is None:  # step 0: every local row. Two ranks merge once, into step 0's O in
                # place (its float32 upcast is exact: the same result as a float32 accumulator);
                # more merge into a float32 accumulator, rounded once at the end
                acc_out, acc_lse = (out if world == 2 else out.float()), lse
            else:
                with probe(f"fwd step {step} merge", device):
                    merge_into(acc_out[:, :, rows], acc_lse[:, :, rows], out, lse)
        if more:
            with probe(f"fwd wait {step + 1}", device):
                wait_all(works)
            kv = incoming
    if hasattr(ring, "close"):  # a prewait no push used (none: the first push takes it)
        ring.close()
    return acc_out.to(q.dtype), acc_lse


class _NoSms:
    uses_sms = False


_NO_SMS = _NoSms()  # transfer_order's stand-in for a copy-engine ring not yet made


def own_parts(rank: int, causal: bool, chunks: list[int], lengths: list[int]):
    """The backward's own block in two (query rows, keys, causal) parts, the first computed before
    the foreign blocks (while the first one is in flight) and the second after them (while the last
    dK/dV sum comes home); each part's keys start at the slice's first. Causal: the late chunk
    against the whole slice (causal, aligned to the bottom right: it sees the early chunk whole),
    then the early chunk against itself; else halves of the rows against every key. The first part
    covers every key where it has rows, so the own sums start as its copy. Empty parts are None."""
    n = lengths[rank]
    if causal:
        a = chunks[rank]
        parts = [(slice(a, n), n, True), (slice(0, a), a, True)]
    else:
        parts = [(slice(0, n // 2), n, False), (slice(n // 2, n), n, False)]
    return [p if p[0].stop > p[0].start and p[1] > 0 else None for p in parts]


def ring_backward(dout, dlse, q, k, v, out, lse, group, lengths: list[int], causal: bool, scale: float,
                  ring: Ring | None = None, early: bool | None = None, sm_margin: int = 0):
    """(dq, dk, dv) of the local slice (the inputs' dtypes) from ring_forward's ``out`` and ``lse``.

    Order at rank r: part of its own block; then the foreign blocks r-1, r-2, ..., r-P+1 as they
    arrive, each one's dK, dV sum received from the previous rank (which added its share one step
    before), this rank's share added and sent on; then the rest of its own block, after which its
    own block's sum has come home. With ``early`` each block is sent on
    before the attention that precedes its use and each sum travels during the next attention, so
    that, where the attention leaves the transfers SMs, every transfer (the first and the last too)
    has attention beside it; else each transfer starts after its step's attention and is waited on
    before the next. A sum of one share travels in the inputs' dtype (it is the backward op's output,
    exactly), of more in float32. ``sm_margin``: SMs each attention backward leaves free (default
    order: early where it is > 0, transfer_order)."""
    ring = ring or ring_for(group, q.device, sm_margin, transfer_order(early, sm_margin), k, lengths)
    early = transfer_order(early, sm_margin, ring)
    rank, world = ring.rank, ring.world
    chunks = sharding.chunk_sizes(sum(lengths), world)
    B, Hkv, n, D = k.shape
    device = q.device
    kv = (sendable(k), sendable(v))
    lse = lse.contiguous()
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    own = [None, None]  # float32 dK, dV sums of the rank's own block
    fused = FUSED_OWN_SUMS and (world == 2 or ONE_PASS_SUMS_ABOVE_TWO)
    one_pass = world > 2 and ONE_PASS_SUMS_ABOVE_TWO  # each passing sum: incoming + share in one pass
    shares = []  # with fused: the own parts' (dK, dV, keys), summed at the end

    def block_grads(rows, keys, block_causal, block, beside_transfer):
        """(dK, dV) of the block's first ``keys`` keys for the local ``rows``; their dQ added to dq's
        rows (with DQ_IN_KERNEL by the Gluon kernel's own float32 reductions where it adds dQ: no
        buffer, no pass)."""
        inputs = (dout[:, :, rows], q[:, :, rows], block[0][:, :, :keys], block[1][:, :, :keys], out[:, :, rows],
                  lse[:, :, rows], None if dlse is None else dlse[:, :, rows].contiguous())
        margin = step_margin(sm_margin, early, beside_transfer)
        if DQ_IN_KERNEL:
            return backward_adding_dq(*inputs, dq[:, :, rows], block_causal, scale, margin)
        gq, gk, gv = torch.ops.tilecore.attention_backward(*inputs, block_causal, scale, -1, -1, 0.0, margin)
        dq[:, :, rows] += gq
        return gk, gv

    def own_part(part):
        """The part's attention backward queued; returns the function that adds its gradients."""
        if part is None:
            return lambda: None
        rows, keys, part_causal = part
        with probe(f"bwd own {'first' if part is first else 'last'}", device):
            gk, gv = block_grads(rows, keys, part_causal, kv_own, world > 1)  # the first K/V hop, or the last sum

        def add():
            if fused:  # summed at the end, with the other rank's share, in one pass (own_sum)
                shares.append((gk, gv, keys))
                return
            for i, g in enumerate((gk, gv)):
                if own[i] is None and keys == n:
                    own[i] = g.float()  # the first share: a copy (the op's own result where already float32)
                else:
                    if own[i] is None:
                        own[i] = torch.zeros((B, Hkv, n, D), dtype=torch.float32, device=k.device)
                    own[i][:, :, :keys] += g
        return add

    def shape_of(r):
        return (B, Hkv, lengths[r], D)

    def send_block(block, to_use_at_step):  # the block the next rank attends at that step
        incoming = ring.receive(k, shape_of((rank - to_use_at_step) % world), tag=2 * to_use_at_step)
        return incoming, ring.exchange(block, incoming, tag=2 * to_use_at_step)

    kv_own = kv
    first, last = own_parts(rank, causal, chunks, lengths)
    kv_works, sum_works = [], []
    if world > 1 and early:
        incoming, kv_works = send_block(kv, 1)
    add = own_part(first)
    if world > 1 and not early:
        incoming, kv_works = send_block(kv, 1)
    with probe("bwd own first adds", device):
        add()
    for step in range(1, world):
        src = (rank - step) % world
        with probe(f"bwd wait kv {step}", device):
            wait_all(kv_works)
            if not early:
                wait_all(sum_works)  # nothing in flight beside the attention
        kv = incoming
        more = step + 1 < world
        if more and early:
            incoming, kv_works = send_block(kv, step + 1)
        span = step_span(step, src, rank, causal, chunks, lengths)
        # in flight beside it (early order): the next block's K/V, and from step 2 the previous sum
        with probe(f"bwd step {step}", device):
            grads = block_grads(*span, kv, more or step >= 2) if span is not None else None
        ring.release(2 * step, kv, POISON)  # the block is read (by the kernels queued)
        if more and not early:
            incoming, kv_works = send_block(kv, step + 1)
        keys = span[1] if span is not None else 0
        if step == 1:  # the first share of block src's sum, sent as the op gave it
            if grads is not None and keys == lengths[src]:
                block_sum = (grads[0], grads[1])
            else:
                block_sum = tuple(torch.zeros(shape_of(src), dtype=k.dtype, device=k.device) for _ in range(2))
                for i in range(2 if grads is not None else 0):
                    block_sum[i][:, :, :keys] = grads[i]
        else:  # the shares of the ranks before, from the previous rank, in float32 from here on
            wait_all(sum_works)
            if one_pass:  # (0 + share) + incoming in float32: the copy-then-add's sums, one pass
                block_sum = tuple(own_sum(grads[i] if grads is not None else None, keys, None, 0, sum_incoming[i],
                                          torch.float32) for i in range(2))
                ring.release(2 * step - 1, sum_incoming, POISON)
            else:
                # a copy (float32 in already: .float() would alias the slot, handed back next)
                block_sum = tuple(t.to(torch.float32, copy=True) for t in sum_incoming)
                ring.release(2 * step - 1, sum_incoming, POISON)
                for i in range(2 if grads is not None else 0):
                    block_sum[i][:, :, :keys] += grads[i]
        # on to the next rank, which holds block src next; after the last step, block r+1 goes home
        sum_incoming = ring.receive(block_sum[0], shape_of((src - 1) % world), tag=2 * step + 1)
        sum_works = ring.exchange(block_sum, sum_incoming, tag=2 * step + 1)
    if world > 1 and not early:
        with probe("bwd wait sum", device):
            wait_all(sum_works)
    own_part(last)()
    if fused:
        with probe("bwd wait sum", device):
            wait_all(sum_works)
        with probe("bwd own sums", device):
            a, b = (shares + [(None, None, 0)] * 2)[:2]
            dk = own_sum(a[0], a[2], b[0], b[2], sum_incoming[0], k.dtype)
            dv = own_sum(a[1], a[2], b[1], b[2], sum_incoming[1], v.dtype)
        ring.release(2 * world - 1, sum_incoming, POISON)
        with probe("bwd casts", device):
            dq = dq.to(q.dtype)
        return dq, dk, dv
    for i in range(2):
        if own[i] is None:  # no own rows at all
            own[i] = torch.zeros((B, Hkv, n, D), dtype=torch.float32, device=k.device)
    if world > 1:
        with probe("bwd wait sum", device):
            wait_all(sum_works)
        with probe("bwd sum adds", device):
            own[0] += sum_incoming[0]  # the other ranks' shares of this rank's block
            own[1] += sum_incoming[1]
        ring.release(2 * world - 1, sum_incoming, POISON)
    with probe("bwd casts", device):
        grads = dq.to(q.dtype), own[0].to(k.dtype), own[1].to(v.dtype)
    return grads
