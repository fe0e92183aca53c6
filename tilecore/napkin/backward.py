"""The attention backward's own time model: a FlashAttention backward step as a chain of dependent MMAs.

The engine costs any diagram with one overlap rule: every unit runs concurrently, except the
exponentials that sit between two dependent MMAs, of which the paper's 2/3 is exposed (its account of
FlashAttention-3's forward). The backward is not forward-like. A thread block holds Bc keys (their dK
and dV accumulate in registers) and streams Br query rows a step; each step is five MMAs in three
dependent groups:

    group 1   S^T  = K Q^T,  dP^T = V dO^T            (issued together; the softmax waits for S only)
    link 1    P^T  = exp(S^T - L)                     (SFU: runs under dP's MMA, the paper's 2/3 exposed)
    link 2    dS^T = P^T (dP^T - D), P^T and dS^T to the operand dtype   (ALU, after dP: exposed)
    link 3    dS stored to shared memory, fenced      (dQ contracts the keys: dS^T's rows; a transpose)
    group 2   dV += P^T dO,  dK += dS^T Q,  dQ = dS K (dQ's fp32 partial staged, added in L2)

2.5x the forward's MMAs. The consumers (two warpgroups of Bc/2 keys) read the same ring stage and meet
at the dS exchange, so they run in lockstep: where one waits on a link the other does too, and no MMA
of another warpgroup fills the tensor cores (FA3's forward ping-pongs its consumers instead; the
backward has no such order). So the links' work adds to the MMAs, except the exponentials (they run
under dP, the paper's share exposed) and a dQ from a warpgroup of its own (tilecore's D64: that
warpgroup's MMA runs while the consumers are on their links). Without warp specialization
(FlashAttention-2: mma.sync, every warp does everything) every unit adds.

Around the main kernel: the preprocess D = rowsum(dO o O) (reads O and dO, writes D, zeroes the fp32
dQ accumulator), and the conversion of the fp32 dQ to the input dtype (reads 4 bytes, writes 2 an
element). Where dQ comes from a second kernel (tilecore's D128 on short tiles), that kernel recomputes
S, P, dP and dS for query-stationary tiles (three MMAs) and writes dQ itself: no accumulator, no
conversion.

Shared memory: every MMA's operands read from it (wgmma: B always, A unless it is a register operand),
the ring's TMA writes, dS's store, dQ's staging (written, then read by the TMA reduction). A bound, not
a sum: the engine's preset rate (128 B/clk/SM) leaves it under the tensor time (64-75% of it).

One key tile a thread block (cuDNN costed as FA3's grid of tiles, FlashAttention-2): the tile's first
loads and its dK, dV stores run with nothing else on the SM (`tile_clocks`): a cost a tile, which weighs
on short sequences (the tile count is B H N / Bc). tilecore's persistent kernel loads the next tile under
the current one: none. FlashAttention-2 (mma.sync, 8 warps): each warp reads its own MMA operands from
shared memory (ldmatrix; `_warp_operand_bytes`: 576 KiB a step, more than its MMAs' time at 128 B/clk),
and, without warp specialization, adds them to its MMAs; no wgmma step latency; at its own measured clock; its
grouped heads write dK, dV per q head and sum them after (two reductions); through SDPA, dO and O are
first copied into its layout (two copies).

Constants: the datasheet's per-clock rates at the backward's own sustained clock (BACKWARD_CLOCK_HZ,
measured: the backwards run power-limited, and not at the clock the run's GEMM ceiling implies; the
engine's convention, the run's cuBLAS rate, is `rates="ceiling"`), the paper's exposed share of the
exponentials, and one latency a step (`STEP_LATENCY_CLOCKS`), derived from one shared/anchors.md row.
Sources are given where each is defined. No figure is fitted to the rows this model predicts.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from . import models
from .diagram import Diagram
from .engine import group, relabel, stream
from .errors import CapacityError
from .hardware import get_gpu

DQ_MODES = ("staged", "atomic", "warpgroup", "kernel")

# A softcap's cost on the dS link, in the ALU rate's operations a (query, key) point: the instructions the cap adds
# beside its MUFU.TANH in the sm_90a SASS of tilecore's D128 causal fused backward at its shipped config, over the 64
# points a thread takes in the kernel (a consumer's 32 a step, in both copies of the step). The counts are read from
# the compiled kernels, without and with the shipped softcap mode (tests/napkin/test_backward.py compiles both and
# asserts them, so a change of either kernel fails there until they are read again): (instructions, MUFU among them).
# The ALU rate counts an FMA as two operations and the cap's are single-lane ones (FMUL, FADD, FMNMX, an FFMA's one
# product), so each is two of the rate's. The shipped cap (SOFTCAP 3: dP accumulated from -delta, y (1 - tanh^2) before
# P, dS = P y) adds 232 instructions, 64 of them MUFU.TANH: 5.25 (its former form, dS = y - y tanh^2
# of the masked tanh, added 352: 9.0; the float16-derivative form 424: 11.25). Measured cost of the cap: 0.930x /
# 0.937x the speed without one (1.067-1.076x the time; H200, notes/attention/runs/ht_first_s43a_run1_session43_h200.txt,
# ht_unmasked_s43b_run2_session43_h200.txt; the former form 0.891-0.903x:
# notes/attention/runs/ht_softcap_modes_s41c_run5_session41_h100.txt, ht_softcap_confirm_s41d_run7_session41_h100.txt),
# where the softmax's order (under dP or after it) made no difference (1.001x:
# notes/attention/runs/issue35_bwd1_run1_session38_h100.txt)
SOFTCAP_SASS = {"plain": (3088, 76), "capped": (3320, 140)}
SOFTCAP_POINTS = 64  # (query, key) points a thread in the kernel's SASS: 32 a consumer's step, both copies


def softcap_link_ops(sass: dict = SOFTCAP_SASS, points: int = SOFTCAP_POINTS) -> float:
    """The cap's non-MUFU instructions a point, as the ALU rate's operations (two each)."""
    (plain, plain_mufu), (capped, capped_mufu) = sass["plain"], sass["capped"]
    return 2 * ((capped - plain) - (capped_mufu - plain_mufu)) / points


SOFTCAP_LINK_OPS = softcap_link_ops()
SCHEDULES = ("lockstep", "serial")


@dataclass(frozen=True)
class BackwardKernel:
    """How one implementation runs the backward (what the model needs of it)."""
    name: str
    mma: str = "wgmma"             # wgmma | mma.sync
    schedule: str = "lockstep"     # lockstep: warp-specialized consumers that meet every step; serial: none (FA2)
    block_q: int = 64              # query rows a step (Br)
    block_k: int = 128             # keys a thread block (Bc), split over the consumers
    consumers: int = 2             # MMA warpgroups over the block's keys
    dq: str = "staged"             # staged (fp32 partial through SMEM, TMA reduction in L2) | atomic (fp32
                                   # atomics from registers) | warpgroup (staged, from an MMA warpgroup of its
                                   # own) | kernel (a second, query-stationary kernel)
    kv_registers: bool = False     # K and V rows as register operands of S^T and dP^T (else read from SMEM)
    smem_operands: tuple = ("dS",)  # register intermediates stored to SMEM as MMA operands (FA2: P and dS)
    softmax_under_dp: bool = True  # the softmax waits for S only and runs under dP's MMA (else both first)
    tanh_sfu: int = 1              # SFU instructions of a softcap's tanh (tanh.approx: 1; through ex2, rcp: 2)
    persistent: bool = True        # tiles stream through resident programs (a producer loads the next tile
                                   # under the current one); else one tile a thread block: its prologue and
                                   # epilogue exposed (`tile_clocks`)
    warp_layout: tuple | None = None  # mma.sync kernels: warps along (S/dP rows, dK/dV rows, dQ rows); each
                                   # warp reads its own operands from shared memory (`_warp_operand_bytes`)
    warps: int = 8
    clock_hz: float | None = None  # its sustained SM clock where measured (else BACKWARD_CLOCK_HZ)
    group_sum: bool = False        # grouped heads: dK and dV written per q head, then summed over each group
    layout_copies: int = 0         # (B, H, N, D) tensors copied into the kernel's layout before it (SDPA's flash)
    source: str = ""

    def __post_init__(self):
        if self.dq not in DQ_MODES:
            raise ValueError(f"dq {self.dq!r}; accepted: {', '.join(DQ_MODES)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r}; accepted: {', '.join(SCHEDULES)}")


# tilecore's configs (tilecore/ops/attention/configs.py: GLUON_BACKWARD, FUSED_DQ_MIN_N): a tile of 128
# keys, two consumers of 64, 64 query rows a step; D64: K and V in registers, dQ from a warpgroup of its
# own; D128: dQ staged in the consumers ("lagged" or "fused"), or the Gluon dq kernel below FUSED_DQ_MIN_N
FUSED_DQ_MIN_N = {False: 1024, True: 4096}


def tilecore_kernel(d: int, seq: int, causal: bool) -> BackwardKernel:
    src = "tilecore/ops/attention/configs.py GLUON_BACKWARD, FUSED_DQ_MIN_N"
    if d <= 64:
        return BackwardKernel("tilecore", dq="warpgroup", kv_registers=True, source=src)
    return BackwardKernel("tilecore", dq="kernel" if seq < FUSED_DQ_MIN_N[causal] else "staged", source=src)


# cuDNN's Hopper kernel is not published: costed as FlashAttention-3's structure (Shah et al. 2024: Br 64,
# Bc 128, two consumer warpgroups, dQ's fp32 partial staged and added by a TMA reduction, one key tile a
# thread block: FA3's backward launches a grid of tiles, no persistent scheduler)
CUDNN = BackwardKernel("cuDNN", persistent=False,
                       source="FlashAttention-3's backward structure (cuDNN's is not published)")


# FlashAttention-2's backward runs at its own clock: SDPA's flash backward D128 back to back at 1920 MHz
# (1935 causal), 682-696 W, where tilecore's and cuDNN's ran at 1605-1665 MHz in the same run
# (notes/napkin/runs/napkin_gpu_backward_clock_session28_h100.json): mma.sync at 2/3 of the tensor rate
# draws less power a clock than wgmma, so the board holds a higher clock
FLASH2_CLOCK_HZ = 1920e6


def flash2_kernel(d: int) -> BackwardKernel:
    """FlashAttention-2 (SDPA's flash backend): 8 warps, no warp specialization, mma.sync; Br x Bc =
    128 x 128 at D64, 64 x 128 at D128, warps along (S/dP rows, dK/dV rows, dQ rows) (4, 4, 4) at D64,
    (2, 4, 2) at D128 (its kernel traits where a block may take 144 KiB of shared memory, as on the
    H100); P and dS through shared memory (the dV, dK and dQ MMAs read them there); dQ added by fp32
    atomics, then converted; one key tile a thread block (a grid of key blocks x batch x heads). Grouped
    heads: dK and dV written per q head (its mha_bwd's dk_expanded, dv_expanded), then summed over each
    group by two reductions. Through SDPA: dO and O are made contiguous in FA2's (B, N, H, D) layout
    first (PyTorch's _flash_attention_backward: grad_out.contiguous(), out.contiguous(), of SDPA's
    transposed views): two transposing copies, each the size of Q."""
    return BackwardKernel("flash", mma="mma.sync", schedule="serial", block_q=128 if d <= 64 else 64,
                          consumers=2, dq="atomic", smem_operands=("P", "dS"), persistent=False,
                          warp_layout=(4, 4, 4) if d <= 64 else (2, 4, 2), warps=8, clock_hz=FLASH2_CLOCK_HZ,
                          group_sum=True, layout_copies=2,
                          source="flash-attn 2 kernel traits (sm80+, 144 KiB blocks): 8 warps, Br x Bc 128 x 128 "
                                 "(D64), 64 x 128 (D128); its clock: napkin_gpu_backward_clock_session28_h100")


# FlexAttention (torch.nn.attention.flex_attention, compiled by Inductor): a Triton backward template, no
# warp specialization (every unit adds, as FA2, but with wgmma), dK/dV for key blocks and dQ for query
# blocks in one launch (S, P, dP, dS recomputed for dQ: seven MMAs, dQ written once: no atomics, no
# conversion); a score_mod's torch.tanh through libdevice (ex2 and rcp: two SFU instructions)
FLEX = BackwardKernel("flex", schedule="serial", dq="kernel", smem_operands=(), tanh_sfu=2, persistent=False,
                      source="torch Inductor's flex_attention backward template (Triton; dQ and dK/dV programs)")


IMPLS = ("tilecore", "cudnn", "flash", "flex")


def kernel_for(impl: str, d: int, seq: int, causal: bool, softcap: bool = False) -> BackwardKernel:
    """The implementation named by a bench row's series: tilecore, cudnn, flash, flex."""
    impl = impl.lower()
    if impl == "tilecore":
        # a softcap keeps the step's order (the softmax under dP: the order measured the same, 1.001x:
        # SOFTCAP_LINK_OPS's source); its tanh by tanh.approx.f32, one SFU instruction
        return tilecore_kernel(d, seq, causal)
    if impl in ("cudnn", "wgmma", "fa3"):
        return CUDNN
    if impl in ("flash", "fa2"):
        return flash2_kernel(d)
    if impl == "flex":
        return FLEX
    raise ValueError(f"backward implementation {impl!r}; accepted: tilecore, cudnn, flash, flex")


def window_density(seq: int, block_k: int, block_q: int, left: int, right: int) -> float:
    """Share of the (query step, key tile) pairs a key-stationary backward visits when a query q sees
    the keys [q - left, q + right] (causal: right = 0, left = seq): each key tile walks the query
    steps from the first that sees its first key to the last that sees its last key."""
    visited = 0
    steps = math.ceil(seq / block_q)
    for j in range(math.ceil(seq / block_k)):
        k0, k1 = j * block_k, min(seq, (j + 1) * block_k) - 1
        q0, q1 = max(0, k0 - right), min(seq - 1, k1 + left)
        if q0 <= q1:
            visited += q1 // block_q - q0 // block_q + 1
    return visited / (steps * math.ceil(seq / block_k))


# Which rates the SM-clocked units (tensor cores, SFU, ALU, shared memory) run at:
#   "clock" (default): the datasheet's per-clock rates at the backward's own sustained clock,
#       BACKWARD_CLOCK_HZ, measured on the lent H100 with tilecore's and cuDNN's D128 backwards each run
#       back to back at the board's 700 W limit: 1545 MHz both (notes/attention/runs/
#       attention_power_session19_h100.json). Why not the run's cuBLAS ceiling: the backward runs
#       power-limited at its own clock, and the GEMM's ceiling moves between runs without it
#       (shared/anchors.md: cuBLAS 680, cuDNN's backward 519; the committed bench: cuBLAS 752, the same
#       backward 505);
#   "ceiling": the tensor rate the run's cuBLAS 8192^3 gives (the engine's convention), the other units
#       at the datasheet's clock.
RATES = ("clock", "ceiling")
BACKWARD_CLOCK_HZ = 1545e6

# The one latency a step the model adds, in SM clocks: a lockstep step waits three times on its own
# MMAs (S, dP, then dV/dK/dQ) and once on the ring and the dS exchange; each wait drains a wgmma group
# before the dependent instructions issue, and no other warpgroup fills the gap. Neither the paper nor
# the datasheets give it, so it is derived once from the measured anchors (../shared/anchors.md: cuDNN's
# backward, B16 H16 N4096 D128, 519 TFLOP/s where cuBLAS ran 680 in the same run) by
# `step_latency_from_anchor(rates)`, and checked on the anchors' three other cuDNN backward rows (D64
# 430, D64 causal 379, D128 causal 461: predicted 394, 358, 467 with "clock"; 444, 400, 467 with
# "ceiling"). No committed bench row is used. Re-derived with cuDNN's tile prologue and
# epilogue (646.6 and 181.6 before: the per-tile cost was inside the per-step one); re-derived with the SMs' L2
# intake at 13.96 TB/s (576.6 and 98.8 at 14.49).
ANCHOR = dict(impl="cudnn", batch=16, heads=16, seq=4096, d=128, causal=False, tflops=519.0,
              ceiling_tflops=680.0, copy_bytes_per_s=2997e9)
ANCHOR_CHECKS = ((64, False, 430.0), (64, True, 379.0), (128, True, 461.0))
STEP_LATENCY_CLOCKS = {"clock": 575.2, "ceiling": 97.1}


def at_backward_clock(gpu, clock_hz: float = BACKWARD_CLOCK_HZ):
    """The GPU with its SM-clocked units (tensor cores, SFU, ALU, shared memory) at `clock_hz` (default
    BACKWARD_CLOCK_HZ): the datasheet preset's per-clock rates (its own where the GPU is not a preset's
    calibration) times that clock; HBM, L2 and the launch terms as given."""
    prefix = gpu.key.split("-")[0]
    base = get_gpu(prefix) if prefix in ("a100", "h100", "h200") else gpu
    f = clock_hz / base.clock_hz
    units = {name: dataclasses.replace(u, rates={dt: r * f for dt, r in u.rates.items()},
                                       source=f"{u.source}; at the backward's clock {clock_hz / 1e6:.0f} MHz")
             for name, u in base.units.items()}
    levels = tuple(dataclasses.replace(lv, bandwidth=base.level("SMEM").bandwidth * f) if lv.name == "SMEM" else lv
                   for lv in gpu.levels)
    return dataclasses.replace(gpu, units=units, levels=levels, key=f"{gpu.key}-bwdclock{clock_hz / 1e6:.0f}")


def tile_clocks(kernel: BackwardKernel, d: int, gpu, sm_clock: float) -> float:
    """SM clocks a key tile costs outside its steps where one tile is a thread block's whole life (not
    persistent): nothing else runs on the SM while the tile's first loads arrive (K, V and the first
    ring stage: a DRAM round trip, then the bytes) or while its dK and dV are stored and the stores
    complete before the block exits (the bytes, then a round trip). Bytes at the SM's even share of the
    L2 bandwidth (measured); the round trip is the preset's tile_latency_s. Persistent kernels (a
    producer loading the next tile under the current one's last steps): 0."""
    if kernel.persistent:
        return 0.0
    bc, br = kernel.block_k, kernel.block_q
    loads = 2 * bc * d * 2 + 2 * br * d * 2 + br * 8      # K, V; the first stage's Q, dO, L, D (bf16, fp32)
    stores = 2 * bc * d * 2                                # dK, dV (bf16)
    sm_bw = gpu.level("L2").bandwidth / gpu.sms
    return ((loads + stores) / sm_bw + 2 * gpu.tile_latency_s) * sm_clock


def _warp_operand_bytes(kernel: BackwardKernel, d: int) -> float:
    """Shared-memory bytes the warps of an mma.sync kernel read as MMA operands in one step (ldmatrix): a
    warp grid of a x (warps / a) over an M x N output reads its M / a rows of A and N / (warps / a)
    columns of B over the whole reduction, so each operand is read once per warp row or column.
    S^T, dP^T (Br x Bc over d: Q / dO rows and K / V rows), dV, dK (Bc x d over Br: P^T / dS^T and dO / Q),
    dQ (Br x d over Bc: dS and K)."""
    a, c, e = kernel.warp_layout
    w, br, bc = kernel.warps, kernel.block_q, kernel.block_k

    def grid(m, n, k, rows):   # elements read by a (rows x w / rows) warp grid over an m x n output
        return (w // rows) * m * k + rows * n * k

    return 2 * (2 * grid(br, bc, d, a) + 2 * grid(bc, d, br, c) + grid(br, d, bc, e))


def backward_flops(batch, heads, seq, d, causal) -> float:
    """The bench's convention: 2.5x the forward's 4 B H N^2 D, halved when causal."""
    return 2.5 * 4 * batch * heads * seq * seq * d * (0.5 if causal else 1.0)


def anchor_gpu(gpu="h100"):
    """The preset with the anchors' run's two ceilings (copy, cuBLAS bf16 8192^3)."""
    return get_gpu(gpu).calibrated(copy_bytes_per_s=ANCHOR["copy_bytes_per_s"],
                                   matmul_flops={"bf16": ANCHOR["ceiling_tflops"] * 1e12}, label="anchors")


def step_latency_from_anchor(gpu="h100", rates: str = "clock") -> float:
    """The step latency (clocks) at which the model gives the anchor row's TFLOP/s (bisection)."""
    a, g = ANCHOR, anchor_gpu(gpu)
    flops = backward_flops(a["batch"], a["heads"], a["seq"], a["d"], a["causal"])
    lo, hi = 0.0, 4000.0
    for _ in range(50):
        mid = (lo + hi) / 2
        t = attention_backward_time(a["batch"], a["heads"], a["heads"], a["seq"], a["d"], a["causal"], g,
                                    a["impl"], step_latency_clocks=mid, rates=rates).time
        lo, hi = (mid, hi) if flops / t / 1e12 > a["tflops"] else (lo, mid)
    return (lo + hi) / 2


@dataclass
class BackwardTime:
    """The predicted backward: its kernels and the main kernel's terms (seconds, whole GPU)."""
    kernel: BackwardKernel
    time: float
    bound: str
    kernels: list = field(default_factory=list)      # (name, seconds, bound)
    terms: dict = field(default_factory=dict)        # the main kernel's: mma, exp exposed, links, smem, l2
    steps: float = 0.0                                # (tile, step) pairs the main kernel runs

    def breakdown(self) -> str:
        rows = [f"{self.kernel.name} backward: {self.time * 1e3:.3f} ms, bound by {self.bound}"]
        rows += [f"  kernel {name}: {t * 1e3:.3f} ms ({b})" for name, t, b in self.kernels]
        rows += [f"  {k}: {v * 1e3:.3f} ms" for k, v in self.terms.items()]
        return "\n".join(rows)


def _copy_pass(nbytes: float, gpu) -> float:
    """A memory-bound pass moving `nbytes` (read + written): a copy's time (launch included)."""
    n = max(1, int(nbytes // 4))
    r = relabel(models.copy(n=n, dtype="bf16"), gpu, {"i": group(min(n, 8192))})
    return r.time


def dq_diagram(batch, heads, kv_heads, seq, d, causal, dtype="bf16") -> Diagram:
    """The separate dQ pass: recompute S, P, dP, dS from Q, K, V, dO, L, D, then dQ = dS K (three MMAs)."""
    import dataclasses
    g = Diagram("attention dq", q=seq, x=seq, d=d, e=d)
    _, K, _, _, dS = models.backward_recompute(g, dtype)
    g.output(g.contract(dS, K, out="q d", name="dQ", dtype=dtype))
    ins = ["Q", "dO", "L", "D"]
    for axis, size, inputs in ((("r", heads // kv_heads, ins),) if kv_heads != heads else ()) + (
            ("h", kv_heads, ["Q", "K", "V", "dO", "L", "D"]), ("b", batch, ["Q", "K", "V", "dO", "L", "D"])):
        g = g.weave(axis, size, inputs)
    if causal:
        g.ops = [dataclasses.replace(op, causal=("q", "x")) if {"q", "x"} <= set(op.axes) else op for op in g.ops]
    return g


def _relabel(diag, gpu, parts, kernel):
    try:
        return relabel(diag, gpu, parts, warpgroups=kernel.consumers, mma=kernel.mma)
    except CapacityError:  # the tile spread over one more warpgroup
        return relabel(diag, gpu, parts, warpgroups=kernel.consumers + 1, mma=kernel.mma)


def _op_share(diag: Diagram, r, output: str) -> float:
    """The share of a derivation's tensor-core clocks a step that the op writing `output` takes."""
    label = next(op.label or op.name for op in diag.ops if op.output == output)
    tensor = {k: v for k, v in r.thread_clocks.items() if k[1] == "tensor"}
    return sum(v for k, v in tensor.items() if k[0] == label) / sum(tensor.values())


def _smem_bytes_per_step(kernel: BackwardKernel, d: int, dq: bool) -> float:
    """Shared-memory bytes one thread block moves in a step (operand reads, TMA writes, staging)."""
    br, bc, w = kernel.block_q, kernel.block_k, kernel.consumers
    m = bc // w                      # keys a consumer
    q_tile = br * d * 2              # Q or dO rows of the step (bf16)
    kv_c = m * d * 2                 # a consumer's K or V rows
    reads = 0.0
    for _ in range(w):
        reads += 2 * (q_tile + (0 if kernel.kv_registers else kv_c))  # S^T, dP^T: B = Q / dO, A = K_c / V_c
        reads += 2 * q_tile                                            # dV, dK: A in registers, B = dO / Q
    if dq:  # dQ = dS K: A = dS (Br x Bc) from SMEM, B = K (Bc x d), split over the consumers' columns
        reads += br * bc * 2 * (1 if kernel.dq == "warpgroup" else w) + bc * d * 2
    writes = 2 * q_tile + br * 8                                       # the ring: Q, dO, L, D
    writes += br * bc * 2 * len(kernel.smem_operands)                  # dS (and P) stored as operands
    if dq and kernel.dq in ("staged", "warpgroup"):
        writes += br * d * 4
        reads += br * d * 4                                            # the TMA reduction reads the staging
    return reads + writes


def attention_backward_time(batch, heads, kv_heads, seq, d, causal, gpu="h100", impl="tilecore",
                            kernel: BackwardKernel | None = None, step_latency_clocks: float | None = None,
                            softcap: bool = False, window: tuple | None = None,
                            rates: str = "clock") -> BackwardTime:
    """Predicted time of one attention backward (dQ, dK, dV from Q, K, V, O, dO, L), all its kernels.
    impl: tilecore, cudnn, flash or flex (`kernel_for`), or `kernel` given; kv_heads < heads: grouped.
    softcap: tanh on the scores (its SFU instructions: kernel.tanh_sfu; its derivative 1 - tanh^2 on
    the dS link: 3 ALU operations a point). window: (left, right) keys a query sees (causal folded in
    as right = 0): the visited share of the key tiles' query steps (`window_density`) scales the step
    work; tilecore takes its non-causal configuration there (its launches fold causal into the window).
    rates: "clock" (the backward's own sustained clock) or "ceiling" (the run's cuBLAS rate): RATES."""
    if rates not in RATES:
        raise ValueError(f"rates {rates!r}; accepted: {', '.join(RATES)}")
    kv_heads = kv_heads or heads
    if window is not None:
        causal = False
    kernel = kernel or kernel_for(impl, d, seq, causal, softcap)
    sm_clock = (kernel.clock_hz or BACKWARD_CLOCK_HZ) if rates == "clock" else None
    gpu = at_backward_clock(get_gpu(gpu), sm_clock) if rates == "clock" else get_gpu(gpu)
    sm_clock = sm_clock or gpu.clock_hz
    density = 1.0 if window is None else window_density(seq, kernel.block_k, kernel.block_q, *window)
    diag = models.attention_backward(batch=batch, heads=heads, kv_heads=kv_heads, seq=seq, d=d, causal=causal)
    parts = {"x": group(kernel.block_k), "q": stream(kernel.block_q)}
    if kv_heads != heads:  # a kv head's q heads are walked one after another inside a key tile
        parts["r"] = group(1)
    r = _relabel(diag, gpu, parts, kernel)

    points = r.work[("sfu", "fp32")]                      # (query, key) points visited (padding, mask)
    busy = points / gpu.rate("sfu", "fp32") / r.times["sfu"]   # the last wave's busy share
    alu = gpu.rate("alu", "fp32") * busy
    smem_bw = gpu.level("SMEM").bandwidth * busy
    steps = points / (kernel.block_q * kernel.block_k)
    fused_dq = kernel.dq != "kernel"

    sfu_a_point = 1 + (kernel.tanh_sfu if softcap else 0)     # exp (and the cap's tanh)
    # dQ's share of the step's MMA work, from the diagram's per-op clocks (the paper's step 7): 1/5
    dq_share = _op_share(diag, r, "dQ")
    t_dq_mma = r.times["tensor"] * dq_share * density
    t_mma = r.times["tensor"] * density - (0.0 if fused_dq else t_dq_mma)   # without dQ: four MMAs here
    t_exp = r.times["sfu"] * sfu_a_point * density
    # dS: 2 ops; P and dS converted: 1 op each; a cap's derivative 3
    t_ds = points * (4 + (SOFTCAP_LINK_OPS if softcap else 0)) / alu * density
    # dS goes through SMEM for the dQ MMA (without dQ in the kernel it stays in registers); FA2's P too
    staged = len(kernel.smem_operands) if fused_dq else len([o for o in kernel.smem_operands if o != "dS"])
    t_stage = points * 2 * staged / smem_bw * density
    # the step latency is wgmma's: a warpgroup drains its asynchronous MMA group before the dependent
    # instructions issue. mma.sync is synchronous a warp and scoreboarded a register: eight warps' MMAs
    # and loads cover each other's latencies, so its time is the units' work (all of it, serial)
    lat = STEP_LATENCY_CLOCKS[rates] if step_latency_clocks is None else step_latency_clocks
    lat = lat if kernel.mma == "wgmma" else 0.0
    t_latency = steps * density * lat / sm_clock / gpu.sms / busy
    # one key tile a thread block: its prologue and epilogue (tile_clocks), once a tile
    tiles = batch * heads * math.ceil(seq / kernel.block_k)
    t_tile = tiles * tile_clocks(kernel, d, gpu, sm_clock) / sm_clock / gpu.sms / busy
    # mma.sync: every warp reads its own operands from shared memory (ldmatrix)
    t_operands = (steps * density * _warp_operand_bytes(kernel, d) / smem_bw) if kernel.warp_layout else 0.0

    if kernel.schedule == "serial":
        # no warp specialization: the warps that issue the MMAs also load their operands, run the
        # softmax and store P and dS, so every unit adds
        compute = t_mma + t_operands + t_exp + t_ds + t_stage + t_latency
        exp_exposed = t_exp
    else:
        exp_exposed = (gpu.exposed_sfu if kernel.softmax_under_dp else 1.0) * t_exp
        links = exp_exposed + t_ds + t_stage + t_latency
        if kernel.dq == "warpgroup":  # dQ's MMA runs while the consumers are on their links
            compute = t_mma - t_dq_mma + max(links, t_dq_mma)
        else:
            compute = t_mma + links

    smem = steps * density * _smem_bytes_per_step(kernel, d, fused_dq) / smem_bw
    # dQ's fp32 partials: a row of d floats for every (query row, key tile) pair, read and written in L2
    dq_l2 = points * density / kernel.block_k * d * 4 * 2 if fused_dq else 0.0
    l2 = (r.H["L2"] * density + dq_l2) / gpu.level("L2").bandwidth
    transfer = {"HBM": r.times["HBM"], "L2": l2, "SMEM": smem}
    binding = max(transfer, key=transfer.get)
    main = max(transfer[binding], compute + r.fill_time) + t_tile + r.launch_time
    main_bound = binding if transfer[binding] > compute + r.fill_time else (
        "SMEM (operand reads)" if t_operands > t_mma else "tensor" if t_mma >= compute - t_mma else "links")

    rows_q = batch * heads * seq
    kernels = [(f"layout copy {i + 1}", _copy_pass(2 * rows_q * d * 2, gpu), "HBM") for i in range(kernel.layout_copies)]
    pre_bytes = rows_q * (2 * 2 * d + 4) + (rows_q * d * 4 if fused_dq else 0)   # O, dO in; D out; dQ zeroed
    kernels.append(("preprocess", _copy_pass(pre_bytes, gpu), "HBM"))
    kernels.append(("main", main, main_bound))
    if fused_dq:
        kernels.append(("dq convert", _copy_pass(rows_q * d * 6, gpu), "HBM"))
    else:
        dq_kernel = BackwardKernel(kernel.name + " dq", block_q=128, block_k=64, consumers=2, dq="kernel",
                                   smem_operands=())
        dparts = {"q": group(dq_kernel.block_q), "x": stream(dq_kernel.block_k)}
        if kv_heads != heads:
            dparts["r"] = group(1)
        rq = _relabel(dq_diagram(batch, heads, kv_heads, seq, d, causal), gpu, dparts, dq_kernel)
        q_points = rq.work[("sfu", "fp32")]
        q_busy = q_points / gpu.rate("sfu", "fp32") / rq.times["sfu"]
        q_alu = q_points * (4 + (SOFTCAP_LINK_OPS if softcap else 0)) / (gpu.rate("alu", "fp32") * q_busy)
        q_sfu = rq.times["sfu"] * sfu_a_point
        if kernel.schedule == "serial":   # the same launch's dQ programs (FlexAttention): units add
            q_compute = rq.times["tensor"] + q_sfu + q_alu
        else:  # query-stationary like the forward: the forward's rule (2/3 of the exps, the ALU overlapped)
            q_compute = max(rq.times["tensor"] + gpu.exposed_sfu * q_sfu, q_alu)
        q_compute *= density
        q_time = max(rq.transfer_time * density, q_compute + rq.fill_time)
        if kernel.schedule == "serial":   # one launch: no second launch time
            kernels[-1] = ("main", kernels[-1][1] + q_time, kernels[-1][2])
        else:
            kernels.append(("dq kernel", q_time + rq.launch_time, "tensor"))
    if kernel.group_sum and kv_heads != heads:   # dK, dV per q head (bf16), each summed over its group
        per_q_head = batch * heads * seq * d * 2
        per_kv_head = batch * kv_heads * seq * d * 2
        kernels += [(f"{g} group sum", _copy_pass(per_q_head + per_kv_head, gpu), "HBM") for g in ("dK", "dV")]
    total = sum(t for _, t, _ in kernels)
    terms = {"mma": t_mma, "exp exposed": exp_exposed, "dS link (ALU)": t_ds,
             "dS through SMEM": t_stage, "step latency": t_latency, "operand reads (mma.sync)": t_operands,
             "compute": compute, "tile prologue/epilogue": t_tile,
             "SMEM (bound)": smem, "L2 with dQ partials": l2, "HBM": r.times["HBM"], "fill": r.fill_time,
             "launch": r.launch_time}
    return BackwardTime(kernel, total, main_bound, kernels, terms, steps)
