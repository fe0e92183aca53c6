"""Ring attention across the GPUs of one host, as tilecore.distributed runs it (zigzag slices, one
K/V block in flight while the step's attention runs, partial results merged by lse; the backward's
dK/dV sums travelling behind the blocks): each step's time from the napkin's attention derivation,
its transfer from the cross-GPU link (interconnect.py), and whether the transfer hides under it.

    from tilecore.napkin import ring
    p = ring.predict(seq=65536, heads=32, d=128, world=2, causal=True)
    print(p.summary())

A step takes max(attention + its elementwise passes, the bytes in flight on one link direction)
where the attention leaves the transfer's kernel its SMs (``sm_margin`` >= the link's ``sms``; the
attention then runs on the rest, in the steps with a transfer beside it), else their sum:
tilecore's attention kernels are persistent, one
program on every SM, and NCCL's kernel waits for them (an h100-x2 run measured the
transfers exposed, not hidden, at sm_margin 0). Attention runs at the rate the
napkin derives for the step's shape (the calibrated H100 by default: measured copy and matmul
ceilings), or at ``attention_tflops`` where a measured rate is given. The backward does
BACKWARD_FLOPS times the forward's FLOPs at BACKWARD_RATE times its rate (the napkin has no
backward diagram). The elementwise passes (merges, sums, casts) move their bytes at HBM's bandwidth.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import models
from .engine import plan
from .hardware import GPU, dtype_bytes, get_gpu
from .interconnect import Link, get_link

BACKWARD_FLOPS = 2.5  # the backward's matmul FLOPs over the forward's (5 products of the 2's size)
# tilecore's own backward TFLOP/s over its forward's, B1 H32 D128 bf16 on one H100, 32K-64K, causal
# and not: 0.882-0.917 (one H100; the ring's own steps 0.89-0.93; notes/distributed, "The napkin's
# cross-GPU level").
# Was cuDNN's 0.87 (shared/anchors.md: 519 / 596), which the ring's backward rows carried as +2%
BACKWARD_RATE = 0.89
# Host time between a pass's kernels that the GPU waits for (the 2-H100 timeline's "gaps" with nothing
# sent: forward 0.06-0.11 ms over 3-4 launches, backward 0.18-0.37 over 8-10): the first
# launch of a pass (its host path: the ring's setup, plan lookups) and each later one
FIRST_LAUNCH_S = 50e-6
LAUNCH_GAP_S = 20e-6


@dataclass(frozen=True)
class Step:
    """One step of one rank (the slowest rank's, where ranks differ)."""
    what: str
    compute: float      # s: attention
    elementwise: float  # s: merges, sums, casts (HBM bound)
    transfer: float     # s: what is in flight on the link during the step
    serial: bool = False  # the transfer waits for the attention's SMs
    launches: float = 0.0  # s: host gaps between the step's kernels (FIRST_LAUNCH_S, LAUNCH_GAP_S)

    @property
    def time(self) -> float:
        busy = self.compute + self.elementwise + self.launches
        return busy + self.transfer if self.serial else max(busy, self.transfer)

    @property
    def hidden(self) -> bool:
        return self.transfer == 0 or (not self.serial and self.transfer <= self.compute + self.elementwise)


@dataclass
class RingPrediction:
    seq: int
    world: int
    causal: bool
    shape: str
    gpu: str
    link: str
    forward: list
    backward: list
    one_gpu_forward: float | None = None
    one_gpu_backward: float | None = None
    sm_margin: int = 0
    sms: int = 0            # the GPU's SMs
    transfer_sms: int = 0   # SMs the link's transfer kernel needs (Link.sms)
    copy_engine: bool = False  # transfers by the copy engines (no SM): beside the attention at any margin

    @property
    def forward_s(self) -> float:
        return sum(s.time for s in self.forward)

    @property
    def backward_s(self) -> float:
        return sum(s.time for s in self.backward)

    @property
    def step_compute_s(self) -> float:
        """A forward step's attention after the first (the first where there is one step)."""
        return self.forward[min(1, len(self.forward) - 1)].compute

    @property
    def step_transfer_s(self) -> float:
        """One K/V block's hop to the next GPU."""
        return self.forward[0].transfer

    @property
    def hidden(self) -> bool:
        """Every transfer, forward and backward, under its step's compute."""
        return all(s.hidden for s in self.forward + self.backward)

    @property
    def exposed_s(self) -> float:
        """Time the transfers add beyond the compute (forward + backward)."""
        return sum(s.transfer if s.serial else max(s.transfer - s.compute - s.elementwise, 0.0)
                   for s in self.forward + self.backward)

    def speedup(self) -> tuple[float | None, float | None]:
        """(forward, forward + backward) over one GPU's at the whole sequence."""
        if self.one_gpu_forward is None:
            return None, None
        return (self.one_gpu_forward / self.forward_s,
                (self.one_gpu_forward + self.one_gpu_backward) / (self.forward_s + self.backward_s))

    def margin_line(self) -> str:
        """What the sm_margin does to the transfers."""
        if self.world < 2:
            return f"sm_margin {self.sm_margin}: one GPU, nothing to transfer"
        if self.copy_engine:
            return (f"sm_margin {self.sm_margin} of {self.sms} SMs: the transfers by the copy engines (no SM) run "
                    f"beside the attention")
        if self.sm_margin >= self.transfer_sms:
            return (f"sm_margin {self.sm_margin} of {self.sms} SMs: the transfers' kernel ({self.transfer_sms} SMs) "
                    f"runs beside the attention, which keeps {self.sms - self.sm_margin} SMs in the steps with a "
                    f"transfer")
        return (f"sm_margin {self.sm_margin} of {self.sms} SMs: below the {self.transfer_sms} the transfers' kernel "
                f"needs, so each transfer waits for its step's attention (not hidden)")

    def summary(self) -> str:
        ms = lambda x: f"{x * 1e3:9.3f}"  # noqa: E731
        lines = [f"ring attention, {self.shape}, N = {self.seq}{' causal' if self.causal else ''} over {self.world} "
                 f"GPUs ({self.gpu}; {self.link})",
                 self.margin_line(),
                 f"{'pass':<9}{'step':<34}{'attn ms':>9}{'elem ms':>9}{'xfer ms':>9}{'step ms':>9}  hidden"]
        for name, steps in (("forward", self.forward), ("backward", self.backward)):
            for s in steps:
                lines.append(f"{name:<9}{s.what:<34}{ms(s.compute)}{ms(s.elementwise)}{ms(s.transfer)}{ms(s.time)}"
                             f"  {'yes' if s.hidden else 'NO'}")
        lines.append(f"forward {self.forward_s * 1e3:.3f} ms, backward {self.backward_s * 1e3:.3f} ms; transfers "
                     f"{'all hidden' if self.hidden else f'exposed {self.exposed_s * 1e3:.3f} ms'}")
        fwd, both = self.speedup()
        if fwd is not None:
            lines.append(f"one GPU at N = {self.seq}: forward {self.one_gpu_forward * 1e3:.3f} ms, backward "
                         f"{self.one_gpu_backward * 1e3:.3f} ms; speedup {fwd:.2f}x forward, {both:.2f}x both")
        return "\n".join(lines)


def attention_flops(batch, heads, nq, nk, d, causal_pairs: float = 1.0) -> float:
    """4 B H nq nk d times the share of (query, key) pairs attended."""
    return 4.0 * batch * heads * nq * nk * d * causal_pairs


_RATES: dict = {}  # (gpu key, shape) -> derived FLOP/s (a derivation searches for seconds)


def _derived_rate(gpu: GPU, batch, heads, kv_heads, n, d, causal, dtype) -> float:
    """FLOP/s (attention_flops' count: half the pairs when causal) the napkin derives for a square
    n x n attention."""
    key = (repr(gpu), batch, heads, kv_heads, n, d, causal, dtype)  # (two calibrations share a name)
    if key not in _RATES:
        sched = plan(models.attention(batch=batch, heads=heads, kv_heads=kv_heads, seq=n, d=d, causal=causal,
                                      dtype=dtype), gpu)
        _RATES[key] = attention_flops(batch, heads, n, n, d, 0.5 if causal else 1.0) / sched.time
    return _RATES[key]


def predict(seq: int, heads: int, d: int, world: int, *, causal: bool = False, batch: int = 1,
            kv_heads: int | None = None, dtype: str = "bf16", gpu="h100", link="h100-x2", calibrate: bool = True,
            attention_tflops: float | None = None, one_gpu: bool = True, kv_views: bool = False,
            sm_margin: int = 0, dq_in_kernel: bool = False, copy_engine: bool = False,
            one_pass_own_sums: bool = False) -> RingPrediction:
    """The ring's steps on ``world`` GPUs for a sequence of ``seq`` (each rank seq / world, in two
    chunks). ``gpu``: a napkin GPU (calibrated to the measured H100 ceilings of napkin.validate
    unless ``calibrate`` is False; a napkin GPU object is used as given: a probe on another machine
    passes validate.lab_gpu of its own checkout's ceilings); ``link``: interconnect.LINKS' key or a Link; ``attention_tflops``:
    a measured attention rate to use instead of the napkin's derivation; ``one_gpu``: also predict
    one GPU at the whole sequence; ``kv_views``: K and V come as views (a (B, N, H, D) projection's
    transpose), copied to contiguous buffers before they are sent; ``sm_margin``: SMs the attention
    leaves free (its persistent grid that much smaller): the transfers overlap it where that is at
    least the link's ``sms``, else each waits for the step's attention; ``dq_in_kernel``: each block's
    dQ added to the float32 sum by the attention kernel (the Gluon backward's reductions: D64, D128
    from 1024 rows, causal from 4096), else by a pass of its own; ``copy_engine``: the transfers by the
    copy engines (tilecore.distributed.copy_engine: no SM), so beside the attention at any margin, at
    the link's ``copy_bandwidth`` (measured on the h100-x2: 355 GB/s); ``one_pass_own_sums``: a rank's
    own dK/dV summed from its shares in one pass (ring.FUSED_OWN_SUMS at two ranks, with
    ring.ONE_PASS_SUMS_ABOVE_TWO past two) instead of a float32 buffer (a copy, adds, a cast), and past two
    ranks each passing sum made in one pass (the incoming sum + this rank's share into float32) instead
    of a float32 copy and an add."""
    if world < 1 or seq < 2 * world:
        raise ValueError(f"ring.predict: need world >= 1 and seq >= 2 * world; got seq={seq}, world={world}")
    if isinstance(sm_margin, bool) or not isinstance(sm_margin, int) or sm_margin < 0:
        raise ValueError(f"ring.predict: sm_margin must be an int >= 0 (SMs the attention leaves free); got "
                         f"{sm_margin!r}")
    kv_heads = kv_heads or heads
    g = get_gpu(gpu)
    if calibrate and attention_tflops is None and isinstance(gpu, str):  # a GPU given is used as it is
        from .validate import lab_gpu  # the committed runs' copy and cuBLAS ceilings
        g = lab_gpu() if g.key == "h100" else g
    lk: Link = get_link(link)
    hbm = g.level("HBM").bandwidth
    if sm_margin >= g.sms:
        raise ValueError(f"ring.predict: sm_margin must be below the GPU's SMs ({g.sms}); got {sm_margin}")
    # the transfer's kernel finds no SM until the attention is done (the copy engines need none)
    serial = sm_margin < lk.sms and not copy_engine
    slower = g.sms / (g.sms - sm_margin)  # the attention on the SMs it keeps, beside a transfer
    q = dtype_bytes(dtype)
    n = seq / world           # a rank's slice
    half = n / 2              # one chunk

    def rate(size, is_causal):
        if attention_tflops is not None:
            return attention_tflops * 1e12
        return _derived_rate(g, batch, heads, kv_heads, max(int(size), 1), d, is_causal, dtype)

    def attn(nq, nk, pairs, is_causal, backward=False):
        t = attention_flops(batch, heads, nq, nk, d, pairs) / rate(n, is_causal)
        return t * BACKWARD_FLOPS / BACKWARD_RATE if backward else t

    def step(what, compute, elementwise, transfer, kernels=1, first=False):
        """A step of ``kernels`` launches (the first of its pass: ``first``); its attention leaves the
        margin only beside a transfer (ring.py: a step with nothing in flight takes every SM)."""
        gaps = (FIRST_LAUNCH_S if first else 0.0) + LAUNCH_GAP_S * (kernels - (1 if first else 0))
        return Step(what, compute * (slower if transfer > 0 else 1.0), elementwise, transfer, serial, gaps)

    hop = lk.copy_time if copy_engine else lk.time
    fused = one_pass_own_sums and world >= 2
    one_pass = one_pass_own_sums and world > 2  # the passing sums too (ring.ONE_PASS_SUMS_ABOVE_TWO)
    o_elems = batch * heads * d          # per query row
    kv_elems = 2 * batch * kv_heads * d  # K and V, per key row
    kv_bytes = kv_elems * n * q
    in_place = world == 2

    # forward: step 0 (own slice, causal or full), then world - 1 foreign steps of half the pairs
    # (causal) or all of them
    stack = 2 * kv_elems * n * q / hbm if kv_views else 0.0  # K and V made contiguous to be sent
    upcast = (0 if in_place else o_elems * n * (q + 4)) / hbm
    merge = o_elems * n * (3 * q if in_place else 8 + q) / hbm
    fwd = [step("own slice" + (" (causal)" if causal else ""), attn(n, n, 0.5 if causal else 1.0, causal),
                stack + upcast, hop(kv_bytes) if world > 1 else 0.0, first=True)]
    for s in range(1, world):
        last = s == world - 1
        what = "foreign block, half the pairs" if causal else "foreign block"
        cast = (0 if in_place or not last else o_elems * n * (4 + q)) / hbm
        fwd.append(step(what, attn(n, n, 0.5 if causal else 1.0, False), merge + cast,
                        0.0 if last else hop(kv_bytes), kernels=2 + (1 if cast else 0)))

    # backward: own block's first part, the foreign blocks, own block's second part. A dK/dV sum of
    # one share (the hop after step 1) travels in the dtype, of more in float32
    def sum_bytes(after_step):
        return kv_elems * n * (q if after_step == 1 else 4)

    # per row: a block's dq into the float32 sum; with dq_in_kernel the Gluon backward adds it in the
    # kernel, into the ring's accumulator (ring.DQ_IN_KERNEL, off by default): no pass of its own
    dq_add = 0.0 if dq_in_kernel else o_elems * (8 + q) / hbm
    dkv_add = kv_elems * (8 + q) / hbm         # per key row: float32 sums += dk, dv
    start = o_elems * n * 4 / hbm + stack      # zeroed dq, K/V to send
    if causal:  # the late chunk against the slice (3/4 of its pairs); the early chunk against itself
        first = ("own late chunk vs slice (causal)", attn(half, n, 0.75, True, True), half, n)
        second = ("own early chunk (causal)", attn(half, half, 0.5, True, True), half, half)
    else:
        first = ("own first half of rows", attn(half, n, 1.0, False, True), half, n)
        second = ("own second half of rows", attn(half, n, 1.0, False, True), half, n)
    own_start = 0.0 if fused else kv_elems * n * (q + 4) / hbm   # the own sums: a float32 copy of the first part's
    # a block's backward: its preprocess (delta) and the kernel; the own parts' copies and adds
    bwd = [step(first[0], first[1], start + first[2] * dq_add + own_start,
                hop(kv_bytes) if world > 1 else 0.0, kernels=3 + (0 if fused else 2), first=True)]
    for s in range(1, world):
        in_flight = (kv_bytes if s < world - 1 else 0.0) + (sum_bytes(s - 1) if s >= 2 else 0.0)
        if s == 1:  # the share sent as the op gave it (causal, the slowest rank's: half the keys, into zeros)
            sums = kv_elems * n * 2 * q / hbm if causal else 0.0
        elif one_pass:  # incoming (the dtype after a one-share hop, else float32) + share, float32 written
            sums = kv_elems * n * ((2 * q + 4) if s == 2 else (8 + q)) / hbm
        else:  # the incoming sum copied to float32 (an upcast after a one-share hop), this share added
            sums = kv_elems * n * ((q + 4) if s == 2 else 8) / hbm + n * dkv_add
        bwd.append(step("foreign block" + (", half the pairs" if causal else ""),
                        attn(n, n, 0.5 if causal else 1.0, False, True), n * dq_add + sums,
                        hop(in_flight), kernels=2 + (2 if s >= 2 else 0)))
    home = (kv_elems * n * (8 + (q if world == 2 else 4)) if world > 1 else 0.0) \
        + o_elems * n * (4 + q) + kv_elems * n * (4 + q)  # the sum home added, casts out
    if fused:  # the three shares read (the last part's over its keys; the sum home in float32 past two
        # ranks), the dtype written once; dq's cast
        home = (kv_elems * (n + second[3]) * q + kv_elems * n * (q if world == 2 else 4) + kv_elems * n * q
                + o_elems * n * (4 + q))
    bwd.append(step(second[0], second[1], second[2] * dq_add + (0.0 if fused else second[3] * dkv_add) + home / hbm,
                    hop(sum_bytes(world - 1)) if world > 1 else 0.0, kernels=2 + (3 if fused else 7)))

    one_fwd = one_bwd = None
    if one_gpu:
        r1 = (attention_tflops * 1e12 if attention_tflops is not None else
              _derived_rate(g, batch, heads, kv_heads, seq, d, causal, dtype))
        one_fwd = attention_flops(batch, heads, seq, seq, d, 0.5 if causal else 1.0) / r1
        one_bwd = one_fwd * BACKWARD_FLOPS / BACKWARD_RATE
    shape = f"B{batch} H{heads}" + (f"/{kv_heads}" if kv_heads != heads else "") + f" D{d} {dtype}"
    return RingPrediction(seq, world, causal, shape, g.name, f"{lk.name}, {lk.bandwidth / 1e9:.0f} GB/s a direction",
                          fwd, bwd, one_fwd, one_bwd, sm_margin, g.sms, lk.sms, copy_engine)


def main(argv: list[str] | None = None) -> int:
    """``tilecore napkin ring``: predict(...).summary() from the command line."""
    import argparse

    from .interconnect import LINKS

    p = argparse.ArgumentParser(prog="tilecore napkin ring",
                                description="Ring attention (tilecore.distributed) across the GPUs of one host: "
                                            "each step's attention, transfer and whether it hides.")
    p.add_argument("--seq", type=int, required=True, help="total sequence length (each GPU holds seq / world)")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=None, help="grouped-query K/V heads (default: --heads)")
    p.add_argument("--d", type=int, default=128, help="head dim")
    p.add_argument("--world", type=int, default=2, help="GPUs in the ring")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--gpu", default="h100")
    p.add_argument("--link", default="h100-x2", choices=sorted(LINKS))
    p.add_argument("--sm-margin", type=int, default=0,
                   help="SMs the attention leaves to the transfers beside it (default 0, the ring's: each "
                        "transfer after its step's attention)")
    p.add_argument("--copy-engine", action="store_true",
                   help="transfers by the copy engines (no SM: hidden beside the attention at margin 0)")
    p.add_argument("--one-pass-sums", action="store_true",
                   help="a rank's own dK/dV summed in one pass (tilecore.distributed.ring.FUSED_OWN_SUMS; past "
                        "two ranks with ONE_PASS_SUMS_ABOVE_TWO, the passing sums too)")
    p.add_argument("--attention-tflops", type=float, default=None,
                   help="a measured attention rate instead of the napkin's derivation")
    args = p.parse_args(argv)
    try:
        pred = predict(args.seq, args.heads, args.d, args.world, causal=args.causal, batch=args.batch,
                       kv_heads=args.kv_heads, dtype=args.dtype, gpu=args.gpu, link=args.link,
                       attention_tflops=args.attention_tflops, sm_margin=args.sm_margin,
                       copy_engine=args.copy_engine, one_pass_own_sums=args.one_pass_sums)
    except Exception as err:  # noqa: BLE001 (a bad size or name: the message, not a traceback)
        print(f"tilecore napkin ring: {err}")
        return 2
    print(pred.summary())
    return 0
