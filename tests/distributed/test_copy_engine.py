"""The copy-engine transport's protocol (copy_engine.py) without a GPU: two ranks as two threads of
one process, each with Mailboxes over a stand-in for torch's symmetric-memory handle (CPU buffers,
signal words with put_signal's and wait_signal's compare-and-swap semantics), driving ring.py's
forward and backward. Checks the slot layout, the tags' slots, the FREE/FULL order (a slot handed
back only after its reader, every push consumed: no wait times out) and the results against one
process's attention on the whole sequence; receive slots poisoned with NaN after each read, so a
transfer that failed to land shows."""
from __future__ import annotations

import threading

import pytest
import torch

from tilecore.distributed import copy_engine, ring
from tilecore.distributed.sharding import zigzag_shard
from tilecore.ops.attention import attention


class FakeWorld:
    """The ranks' buffers and signal pads (uint32 words: world * channel + rank, as torch's)."""

    def __init__(self, nbytes: int, world: int = 2):
        self.buffers = [torch.zeros(nbytes, dtype=torch.uint8) for _ in range(world)]
        self.cond = threading.Condition()
        self.pads = [FakePad(self.cond) for _ in range(world)]
        self.log = []  # (rank, what, channel)


class FakePad(list):
    """A rank's signal words; a write (stream_write_value32's stand-in) wakes the waiters."""

    def __init__(self, cond):
        super().__init__([0] * 128)
        self.cond = cond

    def write(self, word, value):
        with self.cond:
            self[word] = value
            self.cond.notify_all()


class FakeHandle:
    def __init__(self, world: FakeWorld, rank: int):
        self.w, self.rank, self.world_size = world, rank, len(world.buffers)

    def get_buffer(self, rank, sizes, dtype, storage_offset=0):
        numel = 1
        for s in sizes:
            numel *= s
        return self.w.buffers[rank].view(dtype)[storage_offset:storage_offset + numel].view(sizes)

    def get_signal_pad(self, rank, dtype=None):
        return self.w.pads[rank]

    @staticmethod
    def stream_write_value32(pad, offset, value):  # cuStreamWriteValue32's stand-in: a plain write
        pad.write(offset, value)

    def put_signal(self, dst_rank, channel=0, timeout_ms=0):  # CAS 0 -> 1 on dst's word
        word = self.world_size * channel + self.rank
        with self.w.cond:
            assert self.w.cond.wait_for(lambda: self.w.pads[dst_rank][word] == 0, timeout=20), "put_signal timed out"
            self.w.pads[dst_rank][word] = 1
            self.w.log.append((self.rank, "put", channel))
            self.w.cond.notify_all()

    def wait_signal(self, src_rank, channel=0, timeout_ms=0):  # CAS 1 -> 0 on own word
        word = self.world_size * channel + src_rank
        with self.w.cond:
            assert self.w.cond.wait_for(lambda: self.w.pads[self.rank][word] == 1, timeout=20), \
                f"rank {self.rank}: wait_signal(channel {channel}) timed out"
            self.w.pads[self.rank][word] = 0
            self.w.log.append((self.rank, "wait", channel))
            self.w.cond.notify_all()


def run_ranks(fn, world: int = 2):
    results, errors = [None] * world, []

    def body(r):
        try:
            results[r] = fn(r)
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results


def test_slots_and_tags():
    assert [copy_engine.slot_of(t) for t in (0, 1, 2, 3)] == [0, 1, 0, 1]
    # past two ranks: kv0, kv1, sum0, sum1 by the step's parity (tag 2t: a block for step t; 2t+1: a sum)
    assert [copy_engine.slot_of(t, 4) for t in range(8)] == [0, 2, 1, 3, 0, 2, 1, 3]
    k32 = torch.empty(1, 3, 10, 8, dtype=torch.bfloat16)
    assert copy_engine.slot_bytes_for(k32, [10, 9, 9]) == 2 * copy_engine.aligned(3 * 10 * 8 * 4)  # float32 sums
    k = torch.empty(1, 3, 10, 8, dtype=torch.float16)
    assert copy_engine.slot_bytes_for(k, [10, 9]) == 2 * copy_engine.aligned(3 * 10 * 8 * 2)
    world = FakeWorld(2 * copy_engine.slot_bytes_for(k, [10, 9]))
    boxes = run_ranks(lambda r: copy_engine.Mailboxes(None, torch.device("cpu"),
                                                      copy_engine.slot_bytes_for(k, [10, 9]), FakeHandle(world, r)))
    a, b = boxes[0].views(1, 1, [(1, 3, 10, 8), (1, 3, 9, 8)], torch.float16)
    assert a.data_ptr() - world.buffers[1].data_ptr() == boxes[0].slot_bytes
    assert b.data_ptr() - a.data_ptr() == copy_engine.aligned(3 * 10 * 8 * 2)
    with pytest.raises(ValueError, match="do not fit"):
        boxes[0].views(1, 1, [(1, 3, 11, 8)] * 2, torch.float16)
    assert not copy_engine.available(None, torch.device("cpu"))


def threads_ring(world_size, causal, n, calls, fused, pending, one_pass=False):
    """ring_forward + ring_backward ``calls`` times on ``world_size`` ranks as threads over the stand-in
    handle; returns (each rank's [(out, lse, dq, dk, dv)] per call, the shards with one process's
    results, the FakeWorld)."""
    torch.manual_seed(7)
    B, H, Hkv, D = 1, 2, 1, 16
    P = world_size
    q, k, v, dout = (torch.randn(B, h, n, D) for h in (H, Hkv, Hkv, H))
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    o1, l1 = attention(*whole, causal=causal, return_lse=True)
    g1 = torch.autograd.grad(o1, whole, dout)
    shards = [[zigzag_shard(t, 2, rank=r, world_size=P) for t in (q, k, v, dout, o1.detach(), l1.detach(), *g1)]
              for r in range(P)]
    lengths = [s[0].shape[2] for s in shards]
    slot = copy_engine.slot_bytes_for(k, lengths)
    world = FakeWorld(copy_engine.slot_count(P) * slot, P)
    scale = D ** -0.5
    ring.poison_receive_buffers()
    was_fused = ring.set_fused_own_sums(fused)
    was_one = ring.set_one_pass_sums_above_two(one_pass)
    try:
        def rank_body(r):
            boxes = copy_engine.Mailboxes(None, torch.device("cpu"), slot, FakeHandle(world, r))
            assert boxes.own_pad is not None and boxes.next == (r + 1) % P and boxes.prev == (r - 1) % P
            lq, lk, lv, ldo = shards[r][:4]
            outs = []
            for _ in range(calls):  # twice: the second call reuses the slots the first handed back
                cer = copy_engine.CopyEngineRing(None, torch.device("cpu"), slot, boxes=boxes)
                assert ring.transfer_order(None, 0, cer)  # no SM needed: transfers start early
                given = (lambda: list(lengths)) if pending else lengths
                out, lse = ring.ring_forward(lq, lk, lv, None, given, causal, scale, ring=cer)
                if pending:
                    assert cer.prewaited is not None and cer.prewaited.used
                cer = copy_engine.CopyEngineRing(None, torch.device("cpu"), slot, boxes=boxes)
                grads = ring.ring_backward(ldo, None, lq, lk, lv, out, lse, None, lengths, causal, scale, ring=cer)
                outs.append((out, lse, *grads))
            return outs
        results = run_ranks(rank_body, P)
    finally:
        ring.poison_receive_buffers(False)
        ring.set_fused_own_sums(was_fused)
        ring.set_one_pass_sums_above_two(was_one)
    return results, shards, world


@pytest.mark.parametrize("world_size,causal,n,calls,fused,pending,one_pass",
                         [(2, True, 11, 2, True, True, False), (2, False, 8, 1, False, False, False),
                          (4, True, 19, 2, False, True, False), (4, True, 19, 2, True, True, True),
                          (3, False, 13, 1, True, False, True)])
def test_ring_over_copy_engine_threads(world_size, causal, n, calls, fused, pending, one_pass, monkeypatch):
    """(fused: the own dK/dV sums by ring.own_sum's kernel, ring.FUSED_OWN_SUMS; pending: the lengths
    given as the public call's pending checks, so step 0 is queued first and the first push's FREE
    wait taken before it (CopyEngineRing.prewait_first); 4 ranks: the double-buffered slots, each
    block forwarded from the slot it arrived in; one_pass: past two ranks the own sums and the passing
    sums in one pass each (ring.ONE_PASS_SUMS_ABOVE_TWO); torch's CPU kernels: the protocol is what is
    tested)"""
    if world_size > 2:
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    P = world_size
    results, shards, world = threads_ring(world_size, causal, n, calls, fused, pending, one_pass)
    for r in range(P):
        want = [shards[r][4], shards[r][5], *shards[r][6:]]
        for got in results[r]:
            for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
                assert torch.isfinite(g).all(), (r, name)
                torch.testing.assert_close(g, w, atol=5e-5, rtol=5e-5, msg=f"rank {r} {name}")
    # every slot handed back: each rank's FREE words (from its next rank) set again, no FULL left
    for r in range(P):
        word = lambda ch: world.pads[r][P * ch + src]  # noqa: E731
        src = (r + 1) % P
        assert [word(2 * s + copy_engine.FREE) for s in range(copy_engine.slot_count(P))] == [1] * \
            copy_engine.slot_count(P)
        src = (r - 1) % P
        assert [word(2 * s + copy_engine.FULL) for s in range(copy_engine.slot_count(P))] == [0] * \
            copy_engine.slot_count(P)


@pytest.mark.parametrize("causal", [True, False])
def test_one_pass_sums_above_two_are_the_buffers_sums(causal, monkeypatch):
    """Past two ranks, ONE_PASS_SUMS_ABOVE_TWO gives the float32 buffers' results value for value (the
    same sums in the same order: ((a + b) + c) for the own block, share + incoming for a passing sum)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    off, _, _ = threads_ring(4, causal, 23, 1, True, False, one_pass=False)
    on, _, _ = threads_ring(4, causal, 23, 1, True, False, one_pass=True)
    for r in range(4):
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), off[r][0], on[r][0]):
            assert torch.equal(a, b), (r, name)


def test_failed_checks_hand_the_prewaited_token_back():
    """A forward whose pending checks raise (another rank refused) after step 0 and the first push's
    FREE wait: the token is handed back (the rank's own word rewritten), so the next call's push
    finds the slot free; nothing was pushed."""
    torch.manual_seed(3)
    P, n, D = 2, 6, 8
    q = torch.randn(1, 1, n, D)
    slot = copy_engine.slot_bytes_for(q, [n, n])
    world = FakeWorld(2 * slot, P)

    def refused():
        raise ValueError("context_parallel_attention: rank(s) [1] of the group refused their inputs")

    def rank_body(r):
        boxes = copy_engine.Mailboxes(None, torch.device("cpu"), slot, FakeHandle(world, r))
        cer = copy_engine.CopyEngineRing(None, torch.device("cpu"), slot, boxes=boxes)
        with pytest.raises(ValueError, match="refused"):
            ring.ring_forward(q, q, q, None, refused, False, 1.0, ring=cer)
        assert cer.prewaited is not None and cer.prewaited.used
        taken = [e for e in world.log if e[0] == r and e[1] == "wait"]
        assert [e[2] for e in taken] == [2 * 0 + copy_engine.FREE]  # the prewait, and no FULL
        # the token is back: a full call runs (its first push waits for FREE again)
        cer = copy_engine.CopyEngineRing(None, torch.device("cpu"), slot, boxes=boxes)
        return ring.ring_forward(q, q, q, None, [n, n], False, 1.0, ring=cer)

    outs = run_ranks(rank_body, P)
    assert all(torch.isfinite(o[0]).all() for o in outs)
    for r in range(P):
        assert world.pads[r][P * (2 * 0 + copy_engine.FREE) + (r + 1) % P] == 1


def test_probe_switches_and_mailbox_bytes():
    """The probes' entry points (gpu_check4): ABOVE_TWO_RANKS and the signal timeout set and restored
    through their setters; mailbox_bytes 0 for a group without mailboxes, the slots' bytes with."""
    before = copy_engine.set_above_two_ranks(True)
    try:
        assert copy_engine.ABOVE_TWO_RANKS is True
        assert copy_engine.set_above_two_ranks(False) is True
        assert copy_engine.ABOVE_TWO_RANKS is False
    finally:
        copy_engine.set_above_two_ranks(before)
    timeout = copy_engine.set_signal_timeout_ms(1234)
    try:
        assert copy_engine.TIMEOUT_MS == 1234
        for bad in (0, -5, 1.5, True, "10"):
            with pytest.raises(ValueError):
                copy_engine.set_signal_timeout_ms(bad)
        assert copy_engine.TIMEOUT_MS == 1234
    finally:
        assert copy_engine.set_signal_timeout_ms(timeout) == 1234

    class Group:
        group_name = "probe-switches-test"

    device = torch.device("cpu")
    assert copy_engine.mailbox_bytes(Group(), device) == 0
    world = FakeWorld(4 * 512, world=4)
    boxes = run_ranks(lambda r: copy_engine.Mailboxes(Group(), device, 512, FakeHandle(world, r)), world=4)
    copy_engine._MAILBOXES[(Group.group_name, device.index)] = boxes[1]
    try:
        assert boxes[1].slots == 4
        assert copy_engine.mailbox_bytes(Group(), device) == 4 * 512
    finally:
        copy_engine._MAILBOXES.pop((Group.group_name, device.index))
