"""Context-parallel attention on the GPUs of one host (issue 38): correctness against one GPU and
float64, then the ring's timing at B1 H32 D128 bf16 for each sm_margin (SMs the attention leaves to
NCCL's transfer kernel: 0 with the transfers after each step's attention, 4, 8, 16 with them before
it): with its transfers and with the compute alone (the same steps, nothing sent), the share of the
transfers hidden, the public call's forward + backward, speedup over one GPU's tilecore.attention at
the same total sequence, the napkin's prediction at that margin, peak memory per rank; the transfers
alone and all-to-all beside it.

In the early order (margins above 0) only the attentions with a transfer beside them leave the
margin (ring.step_margin); compute-only runs the same steps with the same margins. Besides margins,
--margins takes variants (session 29): "ce" (the copy engines' transfers, copy_engine.py, margin 0),
"cef" (those and the one-pass own dK/dV sums: the ring's defaults since run 6), "0f" (NCCL at margin
0 with the one-pass sums). Per variant also: one warm call's per-part timeline (ring.TIMELINE: each
step, merge, wait, sum and copy by CUDA events on the compute and copy streams; --no-breakdown skips
it), and the public fwd+bwd "queued" (the GPU kept busy 5 ms first, so the host's queueing overlaps
it as in a training step; one GPU's the same way).

    torchrun --nproc_per_node=2 experiments/distributed/gpu_check.py          (from the repo root)
    torchrun --nproc_per_node=2 experiments/distributed/gpu_check.py --sizes 32768 --margins 0,8 --skip-check
    torchrun --nproc_per_node=2 experiments/distributed/gpu_check.py --dry    (gloo, CPU: the logic only)

Timing: ranks run each timed call in lockstep (a barrier, then CUDA events around the call on each
rank; the median over fixed repetitions after one warm-up), since a ring call on one rank waits for
the others; do_bench's adaptive repetition counts could differ between ranks. Rank 0's figures are
reported (the ranks' medians are within a few percent of each other; the JSON has both).
JSON: $OUT/distributed_gpu_check.json (OUT defaults to /tmp/out), rewritten after every case;
the tables are printed last. Each case catches its own exceptions (printed and kept in the JSON);
a rank that fails inside a ring step leaves the other waiting until NCCL's timeout (--nccl-timeout).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tilecore, experiments

from tilecore import accuracy  # noqa: E402
from tilecore.distributed import op as op_module  # noqa: E402
from tilecore.distributed import ring as ring_module  # noqa: E402
from tilecore.distributed import context_parallel_attention, zigzag_shard  # noqa: E402
from tilecore.distributed.ring import (Ring, poison_receive_buffers, ring_backward, ring_for,  # noqa: E402
                                       ring_forward, transfer_order)
from tilecore.ops.attention import attention, attention_reference  # noqa: E402


DEVICE = "cuda"  # --dry: "cpu" (gloo, torch's CPU attention, small sizes: the script's logic only)


class ComputeOnlyRing(Ring):
    """The ring's steps with nothing sent: each step attends whatever its receive buffer holds (the
    same shapes, so the same work)."""

    def exchange(self, send, recv, tag):
        return []


class transport:
    """Context: the ring's transfers by ``name`` ("nccl" or "copy_engine", ring.TRANSPORT) inside,
    and with ``fused`` the own dK/dV sums in one pass (ring.FUSED_OWN_SUMS)."""

    def __init__(self, name: str, fused: bool = False):
        self.name, self.fused = name, fused

    def __enter__(self):
        if self.name is not None:  # None: the ring's defaults as they are
            self.saved = ring_module.set_transport(self.name), ring_module.set_fused_own_sums(self.fused)

    def __exit__(self, *exc):
        if self.name is not None:
            ring_module.set_transport(self.saved[0])
            ring_module.set_fused_own_sums(self.saved[1])


VARIANTS = {"ce": (0, "copy_engine", False), "cef": (0, "copy_engine", True), "0f": (0, "nccl", True)}
AHEAD_MS = 5.0  # the "queued" timings: the GPU kept busy this long before each call (queue_ahead)


def variant(m) -> tuple[int, str, bool]:
    """A --margins entry: an int (sm_margin, NCCL), "ce" (the copy engines' transfers at margin 0,
    early order: copy_engine.py), "cef" (the same with the own dK/dV sums fused: ring.own_sum), "0f"
    (margin 0, NCCL, sums fused)."""
    return VARIANTS[m] if m in VARIANTS else (int(m), "nccl", False)


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


SLEEP_CYCLES_PER_MS = None  # torch.cuda._sleep's cycles a millisecond on this GPU (measured once)


def queue_ahead(ms: float) -> None:
    """Keep the GPU busy ``ms`` (torch.cuda._sleep) so the host's time to queue what follows is not
    the GPU's: what a training step sees, where the previous layers' kernels run while the host
    queues this one (one GPU and the ring alike)."""
    global SLEEP_CYCLES_PER_MS
    if SLEEP_CYCLES_PER_MS is None:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)
        a.record()
        torch.cuda._sleep(10_000_000)
        b.record()
        b.synchronize()
        SLEEP_CYCLES_PER_MS = 10_000_000 / max(a.elapsed_time(b), 1e-3)
    torch.cuda._sleep(int(ms * SLEEP_CYCLES_PER_MS))


def lockstep_ms(fn, reps: int, warmup: int = 1, ahead_ms: float = 0.0) -> list[float]:
    """fn's GPU time on this rank (ms), each repetition started together on every rank. ``ahead_ms``:
    the GPU kept busy that long before the start event (queue_ahead), so the host's time to queue
    fn's first kernels (checks, the metadata gather, launches) overlaps it instead of counting."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    if DEVICE == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        dist.barrier()
        sync()
        if DEVICE != "cuda":
            began = time.perf_counter()
            fn()
            times.append((time.perf_counter() - began) * 1e3)
            continue
        if ahead_ms > 0:
            queue_ahead(ahead_ms)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def memory_allocated() -> int:
    return torch.cuda.memory_allocated() if DEVICE == "cuda" else 0


def reset_peak() -> None:
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak() -> int:
    return torch.cuda.max_memory_allocated() if DEVICE == "cuda" else 0


def empty_cache() -> None:
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def gathered(values: list[float]) -> list[list[float]]:
    """Every rank's ``values`` (rank order)."""
    t = torch.tensor(values, dtype=torch.float64, device=DEVICE)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [o.tolist() for o in out]


def all_ok(ok: bool) -> bool:
    """Whether every rank's case went well (so all skip together what follows)."""
    t = torch.tensor([1 if ok else 0], device=DEVICE)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


# --------------------------------------------------------------------------------------------
# correctness


def check_case(mode: str, causal: bool, n: int, hq: int, hkv: int, d: int, dtype: torch.dtype,
               sm_margin: int | None = None, via: str = "nccl", fused: bool = False) -> dict:
    """One case against one GPU's attention and float64 (``sm_margin``: context_parallel_attention's;
    None: its default, the ring's RING_SM_MARGIN with early transfers on CUDA)."""
    g = torch.Generator(device=DEVICE).manual_seed(1234)
    rnd = lambda *shape: torch.randn(*shape, generator=g, device=DEVICE)  # noqa: E731
    q, k, v = rnd(1, hq, n, d).to(dtype), rnd(1, hkv, n, d).to(dtype), rnd(1, hkv, n, d).to(dtype)
    dout, dlse = rnd(1, hq, n, d).to(dtype), rnd(1, hq, n)

    def loss(o, lse, do, dl):
        return (o.double() * do.double()).sum() + (lse.double() * dl.double()).sum()

    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    o1, l1 = attention(*whole, causal=causal, return_lse=True)
    g1 = torch.autograd.grad(loss(o1, l1, dout, dlse), whole)
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    o64, l64 = attention_reference(*ref, causal=causal, scale=d ** -0.5)
    g64 = torch.autograd.grad(loss(o64, l64, dout, dlse), ref)
    o64 = o64.detach()
    del ref

    shard = lambda t: zigzag_shard(t.detach(), 2)  # noqa: E731
    local = [shard(t).requires_grad_() for t in (q, k, v)]
    with transport(via, fused):
        out, lse = context_parallel_attention(*local, causal=causal, mode=mode, return_lse=True, sm_margin=sm_margin)
        grads = torch.autograd.grad(loss(out, lse, shard(dout), shard(dlse)), local)
        # twice: the second call reuses the mailboxes (their tokens handed back by the first)
        out2, lse2 = context_parallel_attention(*local, causal=causal, mode=mode, return_lse=True,
                                                sm_margin=sm_margin)
        grads2 = torch.autograd.grad(loss(out2, lse2, shard(dout), shard(dlse)), local)
    # the worst of the two calls (the second's dQ may differ in its last bits: the kernel's atomic adds)
    second = {name: accuracy.error_over_floor(mine.detach(), shard(exact))
              for name, mine, exact in (("out", out2, o64), ("dq", grads2[0], g64[0]), ("dk", grads2[1], g64[1]),
                                        ("dv", grads2[2], g64[2]))}
    finite2 = all(bool(torch.isfinite(t).all()) for t in (out2, lse2, *grads2))

    row = {"finite": float(all(bool(torch.isfinite(t).all()) for t in (out, lse, *grads)) and finite2)}
    for name, mine, single, exact in (("out", out, o1, o64), ("dq", grads[0], g1[0], g64[0]),
                                      ("dk", grads[1], g1[1], g64[1]), ("dv", grads[2], g1[2], g64[2])):
        row[f"{name}_floor_x"] = max(accuracy.error_over_floor(mine.detach(), shard(exact)), second[name])
        row[f"{name}_single_floor_x"] = accuracy.error_over_floor(shard(single), shard(exact))
    row["lse_abs_err"] = max((x.detach().double() - shard(l64)).abs().max().item() for x in (lse, lse2))
    row["lse_single_abs_err"] = (shard(l1).double() - shard(l64)).abs().max().item()
    # the worst rank's figures
    keys = sorted(row)
    worst = torch.tensor([row[k] if k != "finite" else -row[k] for k in keys], dtype=torch.float64, device=DEVICE)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return {k: (-w if k == "finite" else w) for k, w in zip(keys, worst.tolist())}


CHECKS = [  # (mode, causal, n, hq, hkv, d, dtype[, sm_margin]): n not a multiple of 2P for most; GQA and MQA
    ("ring", False, 4099, 8, 2, 128, torch.bfloat16),
    ("ring", True, 4099, 8, 2, 128, torch.bfloat16),
    ("ring", True, 4099, 8, 2, 128, torch.bfloat16, 0),  # every SM, the late order
    ("ring", False, 8192, 8, 8, 128, torch.bfloat16, 16),
    ("ring", True, 16384, 2, 2, 128, torch.bfloat16, 8),  # causal parts of 4096 rows: dQ added in the Gluon kernel
    ("all_to_all", False, 4099, 8, 2, 128, torch.bfloat16),
    ("all_to_all", True, 4099, 8, 2, 128, torch.bfloat16),
    ("ring", True, 3001, 4, 4, 64, torch.float16),
    ("ring", False, 2048, 4, 1, 128, torch.bfloat16),
    ("ring", True, 4099, 8, 2, 128, torch.bfloat16, 0, "nccl", True),  # the own dK/dV sums fused (ring.own_sum)
    ("ring", False, 3001, 4, 4, 64, torch.float16, 0, "nccl", True),
    # the copy engines' transfers (ring.TRANSPORT = "copy_engine"; margin 0, early order)
    ("ring", True, 4099, 8, 2, 128, torch.bfloat16, 0, "copy_engine"),
    ("ring", False, 8192, 8, 8, 128, torch.bfloat16, 0, "copy_engine"),
    ("ring", True, 16384, 2, 2, 128, torch.bfloat16, 0, "copy_engine"),
    ("ring", True, 3001, 4, 4, 64, torch.float16, 0, "copy_engine"),
    ("ring", True, 4099, 8, 2, 128, torch.bfloat16, 0, "copy_engine", True),  # + the own sums fused
    ("ring", False, 3001, 4, 4, 64, torch.float16, 0, "copy_engine", True),
]


# --------------------------------------------------------------------------------------------
# timing


# SMs the attention leaves to NCCL's transfer kernel (0: the late order, else early); "ce": the copy
# engines' transfers (ring.TRANSPORT = "copy_engine") at margin 0, early
MARGINS = (0, "cef")


def timeline_of(fn) -> dict:
    """One call of ``fn`` (after the timed ones: warm) with the ring's parts recorded (ring.TIMELINE):
    {"total_ms", "parts": [label, stream, start ms from the call's start, ms], "host": [label, ms of
    host time from the call's start]} (the host's milestones: ring.HOST_TIMELINE), every rank started
    together. On the CPU (--dry) the total and the host's milestones only."""
    events, marks = [], []
    dist.barrier()
    sync()
    ring_module.record_host_timeline(marks)
    try:
        if DEVICE != "cuda":
            began = time.perf_counter()
            fn()
            return {"total_ms": (time.perf_counter() - began) * 1e3, "parts": [],
                    "host": [[label, (t - began) * 1e3] for label, t in marks]}
        origin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ring_module.record_timeline(events)
        try:
            began = time.perf_counter()
            origin.record()
            fn()
            marks.append(("returned", time.perf_counter()))
            end.record()
        finally:
            ring_module.record_timeline(None)
    finally:
        ring_module.record_host_timeline(None)
    end.synchronize()
    sync()
    parts = [[label, stream, origin.elapsed_time(a), a.elapsed_time(b)] for label, a, b, stream in events]
    return {"total_ms": origin.elapsed_time(end), "parts": parts,
            "host": [[label, (t - began) * 1e3] for label, t in marks]}


def paired_lockstep(fns: dict, reps: int) -> dict:
    """Each of ``fns`` (name -> fn) timed as lockstep_ms times it, in rounds: every round runs each
    once, in order, so slow and fast stretches of the run fall on all alike. {name: [ms a round]}."""
    for fn in fns.values():
        fn()
    sync()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            times[name] += lockstep_ms(fn, 1, warmup=0)
    return times


def host_ms(fn, reps: int) -> list[float]:
    """The host's time to queue ``fn`` (ms: its call, nothing synchronized inside), every repetition
    started together on every rank (a barrier, the GPU idle)."""
    fn()
    sync()
    times = []
    for _ in range(reps):
        dist.barrier()
        sync()
        began = time.perf_counter()
        fn()
        times.append((time.perf_counter() - began) * 1e3)
        sync()
    return times


class host_path:
    """Context: the public call's host path, session 30's (op.FAST_HOST: the gather waited on after
    step 0, cached checks, the eager autograd Function) or session 29's (``fast`` False)."""

    def __init__(self, fast: bool):
        self.fast = fast

    def __enter__(self):
        self.saved = op_module.set_fast_host(self.fast)

    def __exit__(self, *exc):
        op_module.set_fast_host(self.saved)


def time_case(n_total: int, causal: bool, heads: int, d: int, reps: int, single: bool, a2a: bool,
              margins=MARGINS, breakdown: bool = True, host_compare: bool = True) -> dict:
    """One (N, causal) case: per sm_margin the ring's forward and backward with their transfers and
    with the compute alone (ComputeOnlyRing: the same steps, nothing sent), and the public call's
    forward + backward; the transfers alone; one GPU at the whole sequence; peak memory."""
    world, rank = dist.get_world_size(), dist.get_rank()
    group = dist.group.WORLD
    n = n_total // world
    lengths = [n] * world
    scale = d ** -0.5
    g = torch.Generator(device=DEVICE).manual_seed(rank)
    q, k, v = (torch.randn(1, heads, n, d, generator=g, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn_like(q)
    row = {"N": n_total, "causal": causal, "n_per_rank": n, "margins": {}}

    def record(name, times, into=None):
        every = gathered([statistics.median(times)])
        into = row if into is None else into
        into[name] = every[0][0]
        into[name + "_ranks"] = [e[0] for e in every]

    with torch.no_grad():
        ring = Ring(group)
        kv, kv_in = (k, v), (torch.empty_like(k), torch.empty_like(v))  # as ring.py sends them
        # the backward's sums: one share (the dtype) after step 1, float32 after later steps
        dkv = (k.clone(), v.clone())
        dkv_in = (torch.empty_like(dkv[0]), torch.empty_like(dkv[1]))
        dkv32 = (k.float(), v.float())
        dkv32_in = (torch.empty_like(dkv32[0]), torch.empty_like(dkv32[1]))

        def transfers(count, with_sums, through=ring):
            for step in range(count):
                for work in through.exchange(kv, kv_in, tag=2 * step):
                    work.wait()
                through.release(2 * step)
                if with_sums:
                    sums, sums_in = (dkv, dkv_in) if step == 0 else (dkv32, dkv32_in)
                    for work in through.exchange(sums, sums_in, tag=2 * step + 1):
                        work.wait()
                    through.release(2 * step + 1)

        record("ring_fwd_transfer_ms", lockstep_ms(lambda: transfers(world - 1, False), reps))
        record("ring_bwd_transfer_ms", lockstep_ms(lambda: transfers(world - 1, True), reps))
        for key in margins:  # the K/V hops alone through the ring each margin's calls use (NCCL's CTAs capped)
            m, via, fused = variant(key)
            with transport(via):
                through = ring_for(group, q.device, m, transfer_order(None, m), k, lengths)
            row["margins"][key] = {"early": transfer_order(None, m, through), "transport": via,
                                   "transfer_group": through.group.group_name}
            cell = row["margins"][key]
            record("fwd_transfer_ms", lockstep_ms(lambda: transfers(world - 1, False, through), reps), cell)
            record("bwd_transfer_ms", lockstep_ms(lambda: transfers(world - 1, True, through), reps), cell)
        del dkv, dkv_in, dkv32, dkv32_in, kv_in
        out, lse = ring_forward(q, k, v, group, lengths, causal, scale)
        for key in margins:  # the ring's default order for each: late at 0, early above (ring.transfer_order)
            m, via, fused = variant(key)
            cell = row["margins"][key]
            fwd = lambda r=None: ring_forward(q, k, v, group, lengths, causal, scale, ring=r, sm_margin=m)  # noqa: E731
            bwd = lambda r=None: ring_backward(dout, None, q, k, v, out, lse, group, lengths, causal,  # noqa: E731
                                               scale, ring=r, sm_margin=m)
            with transport(via, fused):
                record("fwd_ms", lockstep_ms(fwd, reps), cell)
                record("fwd_compute_ms", lockstep_ms(lambda: fwd(ComputeOnlyRing(group)), reps), cell)
                record("bwd_ms", lockstep_ms(bwd, reps), cell)
                record("bwd_compute_ms", lockstep_ms(lambda: bwd(ComputeOnlyRing(group)), reps), cell)
                if breakdown:  # one call of each, its parts timed by CUDA events (ring.TIMELINE)
                    cell["breakdown"] = {"fwd": timeline_of(fwd), "fwd_compute": timeline_of(
                        lambda: fwd(ComputeOnlyRing(group))), "bwd": timeline_of(bwd),
                        "bwd_compute": timeline_of(lambda: bwd(ComputeOnlyRing(group)))}
        del out, lse
        public = lambda: context_parallel_attention(q, k, v, causal=causal, mode="ring")  # noqa: E731
        record("public_fwd_ms", lockstep_ms(public, reps))
        if DEVICE == "cuda":
            record("public_fwd_queued_ms", lockstep_ms(public, reps, ahead_ms=AHEAD_MS))
        if host_compare:  # the host's time to queue the public forward: session 30's path and 29's
            record("public_fwd_host_ms", host_ms(public, reps))
            with host_path(False):
                record("public_fwd_old_ms", lockstep_ms(public, reps))
                record("public_fwd_host_old_ms", host_ms(public, reps))

    local = [t.clone().requires_grad_() for t in (q, k, v)]

    def fwd_bwd(mode, margin=None, via=None, fused=False):
        def run():
            with transport(via, fused):
                o = context_parallel_attention(*local, causal=causal, mode=mode, sm_margin=margin)
                torch.autograd.grad(o, local, dout)
        return run

    for key in margins:
        m, via, fused = variant(key)
        sync()
        base = memory_allocated()
        reset_peak()
        cell = row["margins"][key]
        record("fwd_bwd_ms", lockstep_ms(fwd_bwd("ring", m, via, fused), reps), cell)
        if DEVICE == "cuda":  # the same with the host's queueing time overlapped (a training step's view)
            record("fwd_bwd_queued_ms", lockstep_ms(fwd_bwd("ring", m, via, fused), reps, ahead_ms=AHEAD_MS), cell)
        cell["peak_extra_gb"] = (peak() - base) / 1e9  # over what was allocated before: activations, buffers
    if host_compare:  # the defaults' public fwd+bwd with session 29's host path, and one call's host milestones
        run = fwd_bwd("ring")
        record("fwd_bwd_host_ms", host_ms(run, reps))
        row["public_timeline"] = timeline_of(run)
        with host_path(False):
            record("fwd_bwd_old_ms", lockstep_ms(run, reps))
            record("fwd_bwd_host_old_ms", host_ms(run, reps))
            row["public_timeline_old"] = timeline_of(run)
        record("fwd_bwd_default_ms", lockstep_ms(run, reps))  # again after: the ranks' drift between the two
    row["peak_extra_gb"] = max(c["peak_extra_gb"] for c in row["margins"].values())
    row["inputs_gb"] = 4 * q.numel() * q.element_size() / 1e9  # q, k, v, dO of this rank
    if a2a and heads % world == 0:
        record("a2a_fwd_bwd_ms", lockstep_ms(fwd_bwd("all_to_all"), reps))
    if not (single and host_compare):
        del local

    if single:  # one GPU, the whole sequence (each rank runs its own, at the same time)
        gq, gk, gv = (torch.randn(1, heads, n_total, d, generator=g, device=DEVICE, dtype=torch.bfloat16)
                      for _ in range(3))
        gdout = torch.randn_like(gq)
        with torch.no_grad():
            record("single_fwd_ms", lockstep_ms(lambda: attention(gq, gk, gv, causal=causal), reps))
        whole = [t.requires_grad_() for t in (gq, gk, gv)]

        def single_fwd_bwd():
            o = attention(*whole, causal=causal)
            torch.autograd.grad(o, whole, gdout)

        sync()
        base = memory_allocated()
        reset_peak()
        record("single_fwd_bwd_ms", lockstep_ms(single_fwd_bwd, reps))
        if DEVICE == "cuda":
            record("single_fwd_bwd_queued_ms", lockstep_ms(single_fwd_bwd, reps, ahead_ms=AHEAD_MS))
        row["single_peak_extra_gb"] = (peak() - base) / 1e9
        if host_compare:  # new path, old path and one GPU alternating, a round each: the run's drift shared
            ring_new = fwd_bwd("ring")

            def ring_old():
                with host_path(False):
                    ring_new()

            times = paired_lockstep({"new": ring_new, "old": ring_old, "single": single_fwd_bwd}, max(reps, 7))
            for name, ts in times.items():
                record(f"paired_{name}_ms", ts)
            for name in ("new", "old"):  # the median of each round's one GPU over ring
                record(f"paired_x1_{name}", [a / b for a, b in zip(times["single"], times[name])])
            del local
        del whole, gq, gk, gv, gdout

    # derived figures, per margin: hidden = the share of the transfers' own time that did not add to
    # the compute at that margin; vs_best_compute = time with transfers over margin 0's compute alone
    # (the measure: 1 / 0.9 at most for 90% hidden)
    best = row["margins"][margins[0]] if margins[0] == 0 else None
    for m, cell in row["margins"].items():
        for p in ("fwd", "bwd"):
            exposed = max(cell[f"{p}_ms"] - cell[f"{p}_compute_ms"], 0.0)
            transfer = cell[f"{p}_transfer_ms"]  # through the margin's ring
            cell[f"{p}_hidden"] = 1 - min(exposed / transfer, 1.0) if transfer > 0 else 1.0
            # the slowest rank's with transfers against the slowest rank's compute alone: a ring step
            # waits for the slower rank, which rank 0's own compute alone does not show
            exposed = max(max(cell[f"{p}_ms_ranks"]) - max(cell[f"{p}_compute_ms_ranks"]), 0.0)
            cell[f"{p}_hidden_slowest"] = 1 - min(exposed / transfer, 1.0) if transfer > 0 else 1.0
            if best is not None:
                cell[f"{p}_vs_best_compute"] = cell[f"{p}_ms"] / best[f"{p}_compute_ms"]
        if single:
            cell["speedup_fwd"] = row["single_fwd_ms"] / cell["fwd_ms"]
            cell["speedup_fwd_bwd"] = row["single_fwd_bwd_ms"] / cell["fwd_bwd_ms"]
            if "fwd_bwd_queued_ms" in cell and "single_fwd_bwd_queued_ms" in row:
                cell["speedup_fwd_bwd_queued"] = row["single_fwd_bwd_queued_ms"] / cell["fwd_bwd_queued_ms"]
        for p in ("fwd", "bwd"):  # hidden by the timeline: the waits for transfers against a transfer's own time
            parts = (cell.get("breakdown") or {}).get(p, {}).get("parts")
            if parts:
                waits = sum(x[3] for x in parts if x[1] == "compute" and " wait" in " " + x[0])
                cell[f"{p}_waits_ms"] = waits
                transfer = cell[f"{p}_transfer_ms"]
                cell[f"{p}_hidden_by_waits"] = 1 - min(waits / transfer, 1.0) if transfer > 0 else 1.0
    if single:
        row["speedup_public_fwd"] = row["single_fwd_ms"] / row["public_fwd_ms"]
        for name in ("fwd_bwd_old_ms", "fwd_bwd_default_ms"):
            if name in row:
                row["speedup_" + name.removesuffix("_ms")] = row["single_fwd_bwd_ms"] / row[name]
    flops = 4 * heads * n_total * n_total * d * (0.5 if causal else 1.0)
    row["ring_fwd_tflops_per_gpu"] = flops / world / (row["public_fwd_ms"] * 1e-3) / 1e12
    if single:
        row["single_fwd_tflops"] = flops / (row["single_fwd_ms"] * 1e-3) / 1e12
    return row


def transfer_latency_us(reps: int = 20) -> float:
    """One small ring exchange (4 KiB a rank), lockstep median: the link's fixed cost a transfer."""
    ring = Ring(dist.group.WORLD)
    send = torch.zeros(1024, device=DEVICE)
    recv = torch.empty_like(send)

    def hop():
        for work in ring.exchange(send, recv, tag=0):
            work.wait()

    return gathered([statistics.median(lockstep_ms(hop, reps, warmup=3)) * 1e3])[0][0]


def napkin_predictions(row, heads, d, world) -> dict:
    """The napkin's ring (tilecore.napkin.ring) for this row at each margin: with its own attention
    derivation ("napkin") and with the one-GPU forward rate measured here ("measured_rate");
    predicted over measured."""
    from tilecore.napkin import ring as napkin_ring
    from tilecore.napkin import validate

    # the napkin calibrated by this checkout's committed ceilings (a snapshot of tilecore without
    # benchmarks/ beside it would fall back to the uncalibrated 680 TFLOP/s: session 29's run 9)
    results_dir = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    gpu = validate.lab_gpu(validate.bench_files(results_dir)) if results_dir.is_dir() else "h100"
    out = {"calibration": str(results_dir) if results_dir.is_dir() else "none found (680 TFLOP/s)"}
    rates = {"napkin": None}
    if row.get("single_fwd_tflops"):
        rates["measured_rate"] = row["single_fwd_tflops"]
    for m, cell in row["margins"].items():
        out[m] = {}
        margin, via, fused = variant(m)
        for label, rate in rates.items():
            p = napkin_ring.predict(seq=row["N"], heads=heads, d=d, world=world, causal=row["causal"],
                                    gpu=gpu if rate is None else "h100",
                                    attention_tflops=rate, one_gpu=False, sm_margin=margin,
                                    dq_in_kernel=ring_module.DQ_IN_KERNEL, copy_engine=via == "copy_engine",
                                    one_pass_own_sums=fused)
            out[m][label] = {
                "fwd_ms": p.forward_s * 1e3, "bwd_ms": p.backward_s * 1e3, "hidden": p.hidden,
                "step_compute_ms": p.step_compute_s * 1e3, "step_transfer_ms": p.step_transfer_s * 1e3,
                "fwd_over_measured": p.forward_s * 1e3 / cell["fwd_ms"],
                "bwd_over_measured": p.backward_s * 1e3 / cell["bwd_ms"],
                # a forward step's attention against the measured compute-only forward's per step
                "step_over_measured": p.step_compute_s * 1e3 / (cell["fwd_compute_ms"] / world)}
    return out


# --------------------------------------------------------------------------------------------


def compact(x):
    """``x`` for the log: floats rounded, the per-rank lists left out."""
    if isinstance(x, dict):
        return {str(k): compact(v) for k, v in x.items() if not str(k).endswith("_ranks")}
    return round(x, 3) if isinstance(x, float) else x


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def tables(results) -> str:
    lines = ["", "correctness (worst rank; error over the rounding floor against float64: ours / one GPU's):",
             f"{'mode':<11}{'causal':<7}{'shape':<24}{'out':>12}{'dq':>12}{'dk':>12}{'dv':>12}{'lse err':>10}"]
    for c in results["checks"]:
        if "error" in c:
            lines.append(f"{c['case']}: {c['error'].splitlines()[-1]}")
            continue
        r = c["result"]
        cells = "".join(f"{fmt(r[f'{x}_floor_x'])}/{fmt(r[f'{x}_single_floor_x'])}".rjust(12)
                        for x in ("out", "dq", "dk", "dv"))
        via = (" CE" if c.get("transport") == "copy_engine" else "") + ("+f" if c.get("fused_own_sums") else "")
        lines.append(f"{c['mode'] + via:<11}{str(c['causal']):<7}{c['shape']:<24}{cells}{r['lse_abs_err']:>10.1e}"
                     + ("" if r["finite"] == 1.0 else "  NOT FINITE"))
    lines += ["", f"ring timing by sm_margin, B1 H{results['heads']} D{results['d']} bf16 on {results['world']} GPUs "
              "(rank 0, ms; margin 0: transfers after each step's attention, above 0: before it; fwd, bwd: "
              "ring_forward/backward with transfers; comp: the same steps with nothing sent; hid: share of the "
              "transfers' own time hidden (hid*: the slowest rank's against the slowest rank's compute); /c0: with transfers over margin 0's compute alone; f+b: the public "
              "call's forward + backward; x1: speedup over one GPU; hop: the forward's K/V hops alone through the "
              "margin's ring (NCCL's CTAs capped at the margin); napkin: predicted fwd/bwd ms and their ratio "
              "to the measured, and whether it predicts every transfer hidden; f+b q, x1 q: the public f+b and its speedup "
              f"with the GPU kept busy {AHEAD_MS:g} ms before each call (the host's queueing overlapped, as in a training "
              "step; one GPU's alike); wait-hid: 1 - the timeline's waits for transfers over a transfer's own time; "
              "variants: ce = copy engines, cef = copy engines + one-pass own sums (the defaults), 0f = NCCL + one-pass sums):",
              f"{'N':>7} {'causal':<6}{'m':>3}{'fwd':>8}{'comp':>8}{'hid':>5}{'hid*':>5}{'/c0':>6}{'bwd':>8}"
              f"{'comp':>8}{'hid':>5}{'hid*':>5}{'/c0':>6}{'f+b':>8}{'x1 fwd':>7}{'x1 f+b':>7}{'GB':>6}{'hop':>6}{'napkin fwd/bwd':>16}"
              f"{'p/m':>11}{'hides':>6}{'f+b q':>8}{'x1 q':>6}{'wait-hid f/b':>13}"]
    for t in results["timing"]:
        if "error" in t:
            lines.append(f"{t['N']:>7} {str(t['causal']):<6} {t['error'].splitlines()[-1]}")
            continue
        for m, c in t["margins"].items():
            nap = t.get("napkin", {})
            p = nap.get(m, nap.get(str(m), {})).get("napkin") if isinstance(nap, dict) else None
            lines.append(
                f"{t['N']:>7} {str(t['causal']):<6}{m:>3}{fmt(c['fwd_ms']):>8}{fmt(c['fwd_compute_ms']):>8}"
                f"{fmt(c['fwd_hidden'], '.0%'):>5}{fmt(c['fwd_hidden_slowest'], '.0%'):>5}"
                f"{fmt(c.get('fwd_vs_best_compute')):>6}{fmt(c['bwd_ms']):>8}{fmt(c['bwd_compute_ms']):>8}"
                f"{fmt(c['bwd_hidden'], '.0%'):>5}{fmt(c['bwd_hidden_slowest'], '.0%'):>5}"
                f"{fmt(c.get('bwd_vs_best_compute')):>6}"
                f"{fmt(c['fwd_bwd_ms']):>8}{fmt(c.get('speedup_fwd')):>7}{fmt(c.get('speedup_fwd_bwd')):>7}"
                f"{fmt(c['peak_extra_gb']):>6}{fmt(c.get('fwd_transfer_ms')):>6}"
                f"{(fmt(p['fwd_ms'], '.1f') + '/' + fmt(p['bwd_ms'], '.1f')) if p else '-':>16}"
                f"{(fmt(p['fwd_over_measured']) + '/' + fmt(p['bwd_over_measured'])) if p else '-':>11}"
                f"{('yes' if p['hidden'] else 'no') if p else '-':>6}"
                f"{fmt(c.get('fwd_bwd_queued_ms')):>8}{fmt(c.get('speedup_fwd_bwd_queued')):>6}"
                f"{fmt(c.get('fwd_hidden_by_waits'), '.0%') + '/' + fmt(c.get('bwd_hidden_by_waits'), '.0%'):>13}")
        lines.append(
            f"{'':>7} {'':<6}    one GPU: fwd {fmt(t.get('single_fwd_ms'))}, "
            f"fwd+bwd {fmt(t.get('single_fwd_bwd_ms'))}, "
            f"{fmt(t.get('single_peak_extra_gb'))} GB; transfers alone fwd {fmt(t['ring_fwd_transfer_ms'])}, bwd "
            f"{fmt(t['ring_bwd_transfer_ms'])}; public fwd (defaults) {fmt(t['public_fwd_ms'])} (queued "
            f"{fmt(t.get('public_fwd_queued_ms'))}); one GPU f+b queued {fmt(t.get('single_fwd_bwd_queued_ms'))}; "
            f"all-to-all f+b {fmt(t.get('a2a_fwd_bwd_ms'))}")
    lines += host_lines(results)
    lines += breakdown_lines(results)
    latency = fmt(results.get("transfer_latency_us"), ".1f")
    lines.append(f"transfer latency (4 KiB ring hop, lockstep median): {latency} us; GB: a rank's peak over its "
                 "inputs' allocation (fwd+bwd)")
    return "\n".join(lines)


def host_lines(results) -> list[str]:
    """The public call's host path, session 30's (the gather after step 0, cached checks, the eager
    Function) against session 29's (op.FAST_HOST False), the ring's defaults: lockstep ms and the
    host's time to queue the call; one call's host milestones (ms from its start) and where its GPU
    parts started."""
    lines = ["", "public call, host path new / old (session 29's: op.FAST_HOST off); lockstep ms (x1: over one GPU), "
             "host: the host's time to queue the call (median):",
             f"{'N':>7} {'causal':<7}{'fwd':>14}{'fwd host':>14}{'f+b':>14}{'x1 f+b':>12}{'f+b host':>14}"]
    for t in results["timing"]:
        if "error" in t or "fwd_bwd_old_ms" not in t:
            continue
        pair = lambda a, b: f"{fmt(t.get(a))}/{fmt(t.get(b))}"  # noqa: E731
        lines.append(f"{t['N']:>7} {'causal' if t['causal'] else 'full':<7}"
                     f"{pair('public_fwd_ms', 'public_fwd_old_ms'):>14}"
                     f"{pair('public_fwd_host_ms', 'public_fwd_host_old_ms'):>14}"
                     f"{pair('fwd_bwd_default_ms', 'fwd_bwd_old_ms'):>14}"
                     f"{pair('speedup_fwd_bwd_default', 'speedup_fwd_bwd_old'):>12}"
                     f"{pair('fwd_bwd_host_ms', 'fwd_bwd_host_old_ms'):>14}")
    for t in results["timing"]:
        if "error" not in t and "paired_new_ms" in t:
            lines.append(f"{t['N']:>7} {'causal' if t['causal'] else 'full':<7}paired rounds (new, old, one GPU "
                         f"alternating): f+b {fmt(t['paired_new_ms'])} / {fmt(t['paired_old_ms'])}, one GPU "
                         f"{fmt(t['paired_single_ms'])}; x1 (median of the rounds' ratios) new "
                         f"{fmt(t['paired_x1_new'])}, old {fmt(t['paired_x1_old'])}")
    for t in results["timing"]:
        for name in ("public_timeline", "public_timeline_old"):
            b = t.get(name) if "error" not in t else None
            if not b:
                continue
            host = " | ".join(f"{label} {ms:.2f}" for label, ms in b.get("host", []))
            gpu = " | ".join(f"{p[0]}{' [copy]' if p[1] == 'copy' else ''} {p[3]:.2f}@{p[2]:.2f}" for p in b["parts"])
            lines.append(f"{t['N']:>7} {'causal' if t['causal'] else 'full':<7}{name.removeprefix('public_'):<13}"
                         f"total {b['total_ms']:7.2f}; host ms: {host}; GPU starts: {gpu}")
    return lines


def breakdown_lines(results) -> list[str]:
    """One call's parts per margin (rank 0, CUDA events on the compute stream and, for the copy
    engines, on the copy stream): each part's ms and where it started (@ ms from the call's start);
    gaps: the call's time outside every compute-stream part (launches, host waits, the NCCL hop's
    wait in the late order); "compute" rows: the same steps with nothing sent."""
    lines = ["", "per-part timeline of one call (rank 0; ms @ start ms; gaps = total - compute-stream parts):"]
    for t in results["timing"]:
        if "error" in t:
            continue
        for m, c in t["margins"].items():
            for name, b in (c.get("breakdown") or {}).items():
                parts = b["parts"]
                busy = sum(p[3] for p in parts if p[1] == "compute")
                shown = " | ".join(f"{p[0].removeprefix('fwd ').removeprefix('bwd ')}"
                                   f"{' [copy]' if p[1] == 'copy' else ''} {p[3]:.2f}@{p[2]:.2f}" for p in parts)
                lines.append(f"{t['N']:>7} {'causal' if t['causal'] else 'full':<7}{str(m):>3} {name:<12}"
                             f"total {b['total_ms']:7.2f} gaps {b['total_ms'] - busy:6.2f}: {shown}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="32768,65536,131072", help="total sequence lengths to time")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--skip-check", action="store_true")
    parser.add_argument("--no-single", action="store_true", help="skip one GPU's timing")
    parser.add_argument("--nccl-timeout", type=float, default=120.0)
    parser.add_argument("--margins", default=",".join(map(str, MARGINS)),
                        help="sm_margin values to time (0 first: the others are compared with its compute)")
    parser.add_argument("--causal-only-from", type=int, default=131072,
                        help="time only the causal mask from this total length up")
    parser.add_argument("--napkin-after-s", type=float, default=420.0,
                        help="skip the napkin's derivations (seconds of CPU each) past this many seconds")
    parser.add_argument("--checks", default="all", choices=("all", "nccl", "ce"),
                        help="which correctness cases: all, NCCL's only, or the copy engines' only")
    parser.add_argument("--no-breakdown", action="store_true",
                        help="skip the per-part timeline of one call per margin (ring.TIMELINE)")
    parser.add_argument("--old-host", action="store_true",
                        help="the checks and timings on session 29's host path (op.FAST_HOST off)")
    parser.add_argument("--no-host-compare", action="store_true",
                        help="skip the public call's host path against session 29's (op.FAST_HOST off)")
    parser.add_argument("--dry", action="store_true",
                        help="CPU tensors on gloo, small sizes (the script's logic, without a GPU)")
    args = parser.parse_args()
    margins = tuple(m if m in VARIANTS else int(m) for m in args.margins.split(",") if m)

    global DEVICE, CHECKS
    if args.dry:
        DEVICE = "cpu"
        CHECKS = [(m, c, 37, 4, 2, 16, torch.bfloat16, *rest[5:]) for m, c, *rest in CHECKS]
        args.sizes, args.heads, args.d = "64,96", 4, 16
        dist.init_process_group("gloo")
    else:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=args.nccl_timeout))
    # the public call's session-30 host path (op.FAST_HOST: the gather after step 0, the first copy-engine
    # push's FREE wait before it; on since the session's call 6): on for every check and timing
    op_module.set_fast_host(not args.old_host)
    poison_receive_buffers()  # the checks' transfers fill NaN buffers (turned off for the timing)
    rank, world = dist.get_rank(), dist.get_world_size()
    out_dir = Path(os.environ.get("OUT", "/tmp/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "distributed_gpu_check.json"
    results = {"world": world, "heads": args.heads, "d": args.d, "checks": [], "timing": [],
               "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (dry run)", "torch": torch.__version__,
               "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    try:
        from experiments.common.meta import meta
        results["meta"] = meta()
    except Exception as err:  # noqa: BLE001
        results["meta"] = f"unavailable: {err}"
    began = time.time()

    def save():
        if rank == 0:
            results["wall_s"] = time.time() - began
            path.write_text(json.dumps(results, indent=1))

    if not args.skip_check:
        for mode, causal, n, hq, hkv, d, dtype, *extra in CHECKS:
            margin = extra[0] if extra else None
            via = extra[1] if len(extra) > 1 else "nccl"
            fused = len(extra) > 2 and extra[2]
            if args.checks != "all" and (via == "copy_engine") != (args.checks == "ce"):
                continue
            entry = {"mode": mode, "causal": causal, "shape": f"n{n} h{hq}/{hkv} d{d} {str(dtype)[6:]}",
                     "case": f"{mode} causal={causal} n={n}" + ("" if margin is None else f" sm_margin={margin}")
                     + ("" if via == "nccl" else f" {via}") + (" fused sums" if fused else ""), "sm_margin": margin,
                     "transport": via, "fused_own_sums": fused}
            try:
                entry["result"] = check_case(mode, causal, n, hq, hkv, d, dtype, margin, via, fused)
                ok = True
            except Exception:  # noqa: BLE001
                entry["error"] = traceback.format_exc()
                ok = False
                print(f"rank {rank}: check {entry['case']} failed:\n{entry['error']}", flush=True)
            all_ok(ok)
            results["checks"].append(entry)
            if rank == 0:
                print(f"check {entry['case']}: {entry.get('result', 'failed')}", flush=True)
            empty_cache()
            save()

    poison_receive_buffers(False)
    try:
        results["transfer_latency_us"] = transfer_latency_us()
    except Exception:  # noqa: BLE001
        results["transfer_latency_us"] = None
        print(f"rank {rank}: latency probe failed:\n{traceback.format_exc()}", flush=True)
    for n_total in [int(s) for s in args.sizes.split(",") if s]:
        for causal in ((True,) if n_total >= args.causal_only_from else (False, True)):
            reps = 5 if n_total <= 65536 else 3
            try:
                row = time_case(n_total, causal, args.heads, args.d, reps, single=not args.no_single, a2a=True,
                                margins=margins, breakdown=not args.no_breakdown,
                                host_compare=not args.no_host_compare)
                ok = True
            except Exception:  # noqa: BLE001
                row = {"N": n_total, "causal": causal, "error": traceback.format_exc()}
                ok = False
                print(f"rank {rank}: timing N={n_total} causal={causal} failed:\n{row['error']}", flush=True)
            all_ok(ok)
            results["timing"].append(row)
            if rank == 0:
                print(f"timing N={n_total} causal={causal}: " + json.dumps(compact(row)), flush=True)
            empty_cache()
            save()

    if rank == 0:  # the napkin alone (pure Python; the other ranks are done)
        for row in results["timing"]:
            if "error" in row:
                continue
            if time.time() - began > args.napkin_after_s:
                row["napkin"] = "skipped: out of time"
                continue
            try:
                row["napkin"] = napkin_predictions(row, args.heads, args.d, world)
            except Exception:  # noqa: BLE001
                row["napkin"] = {"error": traceback.format_exc()}
    save()
    if rank == 0:
        print(tables(results))
        print(f"\nJSON: {path} ({time.time() - began:.0f} s)")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
