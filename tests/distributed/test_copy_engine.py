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
    """Two ranks' buffers and signal pads (uint32 words: world * channel + rank, as torch's)."""

    def __init__(self, nbytes: int, world: int = 2):
        self.buffers = [torch.zeros(nbytes, dtype=torch.uint8) for _ in range(world)]
        self.pads = [[0] * 64 for _ in range(world)]
        self.cond = threading.Condition()
        self.log = []  # (rank, what, channel)


class FakeHandle:
    def __init__(self, world: FakeWorld, rank: int):
        self.w, self.rank, self.world_size = world, rank, len(world.buffers)

    def get_buffer(self, rank, sizes, dtype, storage_offset=0):
        numel = 1
        for s in sizes:
            numel *= s
        return self.w.buffers[rank].view(dtype)[storage_offset:storage_offset + numel].view(sizes)

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


@pytest.mark.parametrize("causal,n,calls,fused", [(True, 11, 2, True), (False, 8, 1, False)])
def test_ring_over_copy_engine_threads(causal, n, calls, fused):
    """(fused: the own dK/dV sums by ring.own_sum's kernel, ring.FUSED_OWN_SUMS)"""
    torch.manual_seed(7)
    B, H, Hkv, D = 1, 2, 1, 16
    q, k, v, dout = (torch.randn(B, h, n, D) for h in (H, Hkv, Hkv, H))
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    o1, l1 = attention(*whole, causal=causal, return_lse=True)
    g1 = torch.autograd.grad(o1, whole, dout)
    shards = [[zigzag_shard(t, 2, rank=r, world_size=2) for t in (q, k, v, dout, o1.detach(), l1.detach(), *g1)]
              for r in range(2)]
    lengths = [s[0].shape[2] for s in shards]
    slot = copy_engine.slot_bytes_for(k, lengths)
    world = FakeWorld(2 * slot)
    scale = D ** -0.5
    ring.poison_receive_buffers()
    was_fused = ring.set_fused_own_sums(fused)
    try:
        def rank_body(r):
            boxes = copy_engine.Mailboxes(None, torch.device("cpu"), slot, FakeHandle(world, r))
            cer = copy_engine.CopyEngineRing(None, torch.device("cpu"), slot, boxes=boxes)
            assert ring.transfer_order(None, 0, cer)  # no SM needed: transfers start early
            lq, lk, lv, ldo = shards[r][:4]
            outs = []
            for _ in range(calls):  # twice: the second call reuses the slots the first handed back
                out, lse = ring.ring_forward(lq, lk, lv, None, lengths, causal, scale, ring=cer)
                grads = ring.ring_backward(ldo, None, lq, lk, lv, out, lse, None, lengths, causal, scale, ring=cer)
                outs.append((out, lse, *grads))
            return outs
        results = run_ranks(rank_body)
    finally:
        ring.poison_receive_buffers(False)
        ring.set_fused_own_sums(was_fused)
    for r in range(2):
        want = [shards[r][4], shards[r][5], *shards[r][6:]]
        for got in results[r]:
            for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
                assert torch.isfinite(g).all(), (r, name)
                torch.testing.assert_close(g, w, atol=5e-5, rtol=5e-5, msg=f"rank {r} {name}")
    # every slot handed back: each rank's FREE words for both slots set again, no FULL left
    for r in range(2):
        peer_word = lambda ch: world.pads[r][2 * ch + (1 - r)]  # noqa: E731
        assert [peer_word(2 * s + copy_engine.FREE) for s in range(2)] == [1, 1]
        assert [peer_word(2 * s + copy_engine.FULL) for s in range(2)] == [0, 0]
