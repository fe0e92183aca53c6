"""Mamba-2's Gluon chunk step on the H100 (gluon_forward.la_fwd_gluon_kernel with beta: the transposed step), one job
of <= 60 s: float64 checks and CUDA-graph timings on the 2.7B shape (B16 H80 N4096, headdim 64, d_state 128, one
group, D and z; bf16) without states and with an initial state and the final states, the napkin's HBM bound beside;
optionally the decode step (``--step``). It replaces gpu_mamba_s32.py (sessions 32-33: the step variants, the decode
steps, FLA's peer) and gpu_mamba_s38.py (session 38: the states' layout), whose runs are in notes/linear_attention.

Checks (in a process of its own, NaN-poisoned y and final states, every element written): the error over the bf16
rounding floor against the float64 recurrence (D z N 1008; strong decays A in [-80, -20] N 304 with h0 and ht in the
op's (b, h, p, s) layout: partial last chunks), the states' relative error (~1.6e-3: the update's bf16 operands); with
``--op`` the public mamba2_chunk_scan (a second call the same bits). Timing: the chunks' scores
(kernels_forward.chunk_scores, C B^T once a q/k head) and the kernel on prepared arguments, as the op launches them,
CUDA-graph medians of rounds (they drift by a few % on a shared host), the scores' kernel alone beside. Variants were
timed in interleaved rounds in this script's forms versions: session 39's at git 853f125^ (notes decisions 190-191),
session 40's at 4347ebf (210-214), session 41's at c103ffe (the scores from the stage, v^T's registers: 240-242),
session 42's at dff9d7d7 (the factors' bar.sync folded into P^T's: 260-262).

    PYTHONPATH=/tmp/site:. python3 experiments/linear_attention/gpu_mamba.py [--op] [--step] [--probe] [--clocks]
    PYTHONPATH=/tmp/site:. python3 experiments/linear_attention/gpu_mamba.py --ncu
    PYTHONPATH=/tmp/site:. python3 experiments/linear_attention/gpu_mamba.py --ncu-source

``--clocks``: the SM clock the timed rounds ran at (nvidia-smi sampled every 50 ms in the background: clocks, power,
the clock-event reasons; ``nvidia-smi -q -d CLOCK`` before), and the kernel alone timed as ncu times it (one launch
after the GPU idled 0.3 s, by CUDA events) beside back-to-back launches and graph rounds of it, each with its clocks.

``--ncu``: Nsight Compute on one launch of the kernel, one tile alone (B1 H2) and the 2.7B shape: the tensor pipe's,
the shared-memory LSU pipe's and the issue slots' use, the SFU's, bank conflicts, DRAM bytes and the warp-state
stalls (JSON $OUT/mamba_ncu.json, a table last). Its barrier stall counts the producer partition's three padding
warps too if they wait at a barrier the whole launch (one on each of three SM sub-partitions: 0.75 / issue-active
warps per issue-active cycle, ~1.5 at 50% issue). ``--ncu-source``: the warp-stall samples per SASS instruction of
one 2.7B launch (gpu_gla_dqk_ncu's summary: by reason, by the chain's phases, the top instructions) and each
BAR.SYNC's share, which tells the consumers' barriers from the padding warps' (JSON $OUT/mamba_ncu_source.json).

JSON to $OUT/mamba.json (rewritten each row); a short table last.
"""
from __future__ import annotations

import argparse
import hashlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.common.gpu_script import Run, check, graph_ms, poisoned, same_bits, time_rounds  # noqa: E402

SHAPE = (16, 4096, 80)  # B, N, H (headdim 64, d_state 128, one group)
CASES = ("stateless", "states")
# --probe: the stateless kernel at fewer tiles (two heads each), as the time of a chunk-step of an SM: one tile alone on
# the GPU (the step's chain with nothing else running), 40 and 120 tiles (one partial wave: HBM and L2 shared by
# that many SMs), against the 2.7B shape's 640 (4.85 waves of 132)
PROBES = {"1 tile B1 H2": (1, 2), "40 tiles B1 H80": (1, 80), "120 tiles B3 H80": (3, 80)}


def launcher(q, k, v, g, beta, d_skip, z, h0, o, ht, scale: float, scores: bool = True):
    """The chunks' scores and the kernel as the op launches them on these inputs (g and beta (B, N, H): prepared here
    as the library does); ``scores`` False: the kernel alone (the scores made once here)."""
    from tilecore.ops.linear_attention import configs
    from tilecore.ops.linear_attention import gluon_forward as gf
    from tilecore.ops.linear_attention.kernels_forward import chunk_scores

    G, beta_h = gf.chunk_heads_prep(g, beta, gf.BT_GLUON)
    cb = chunk_scores(q, k, gf.BT_GLUON, q.dtype)
    grid, args, warps = gf.launch_args(q, k, v, G, beta_h, d_skip.float().contiguous(), z, h0, o, ht, scale,
                                       configs.GLUON_STAGES, cb=cb)
    if not scores:
        return lambda: gf.la_fwd_gluon_kernel[grid](**args, num_warps=warps)

    def fn():
        chunk_scores(q, k, gf.BT_GLUON, q.dtype, out=cb)
        gf.la_fwd_gluon_kernel[grid](**args, num_warps=warps)
    return fn


def mamba_inputs(B, N, H, dtype=torch.bfloat16, a_range=(-8.5, -0.5), seed=5):
    torch.manual_seed(seed)
    P, S = 64, 128
    x = torch.randn(B, N, H, P, device="cuda").to(dtype)
    dt = torch.nn.functional.softplus(torch.randn(B, N, H, device="cuda") - 2)
    lo, hi = a_range
    A = torch.rand(H, device="cuda") * (hi - lo) + lo
    Bm = (torch.randn(B, N, 1, S, device="cuda") * S ** -0.5).to(dtype)
    Cm = (torch.randn(B, N, 1, S, device="cuda") * S ** -0.5).to(dtype)
    D = torch.randn(H, device="cuda")
    z = torch.randn(B, N, H, P, device="cuda").to(dtype)
    return x, dt, A, Bm, Cm, D, z


def mamba_states(B, H, S, P, fill=None):
    """A (B, H, S, P) float32 state (the kernel's (F, Dv)) laid out as the op passes it: the transposed view of a
    contiguous (B, H, P, S) (gluon_forward.empty_state's with beta; notes decision 170)."""
    t = torch.empty(B, H, P, S, device="cuda").transpose(-1, -2)
    if fill == "randn":
        t.copy_(torch.randn(B, H, S, P, device="cuda"))
    elif fill == "nan":
        t.fill_(float("nan"))
    return t


def digest(*ts) -> str:
    h = hashlib.sha1()
    for t in ts:
        if t is not None:
            h.update(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def check_mamba(label, B, N, H, states=False, a_range=(-8.5, -0.5)) -> dict:
    from tilecore.ops.linear_attention import mamba2_reference

    x, dt, A, Bm, Cm, D, z = mamba_inputs(B, N, H, a_range=a_range)
    P, S = x.shape[-1], Bm.shape[-1]
    h0 = mamba_states(B, H, S, P, "randn") if states else None
    ht = mamba_states(B, H, S, P, "nan") if states else None
    o = poisoned(x)
    launcher(Cm, Bm, x, dt * A, dt, D[:, None].expand(H, P), z, h0, o, ht, 1.0)()
    torch.cuda.synchronize()
    ref, ref_state = mamba2_reference(x.double(), dt.double(), A.double(), Bm.double(), Cm.double(), D=D.double(),
                                      z=z.double(), initial_states=None if h0 is None else h0.transpose(-1, -2).double())
    row = dict(case=label, **check(o, ref), bits=digest(o, ht))
    if states:
        ref_t = ref_state.transpose(-1, -2)
        row.update(state_written=bool(torch.isfinite(ht).all()),
                   state_rel=float((ht.double() - ref_t).norm() / ref_t.norm()))
    return row


def check_op() -> dict:
    """The public mamba2_chunk_scan (the kernel through the op's keyed launch) against the float64 recurrence: D, z, an
    initial state and the final states ((b, h, p, s), contiguous), N 1000; a second call's y the same bits."""
    import tilecore
    from tilecore.ops.linear_attention import mamba2_reference

    x, dt, A, Bm, Cm, D, z = mamba_inputs(2, 1000, 8, seed=13)
    h0 = torch.randn(2, 8, 64, 128, device="cuda")
    y, ht = tilecore.mamba2_chunk_scan(x, dt, A, Bm, Cm, D=D, z=z, initial_states=h0, return_final_states=True)
    y2 = tilecore.mamba2_chunk_scan(x, dt, A, Bm, Cm, D=D, z=z, initial_states=h0)
    torch.cuda.synchronize()
    ref, ref_state = mamba2_reference(x.double(), dt.double(), A.double(), Bm.double(), Cm.double(), D=D.double(),
                                      z=z.double(), initial_states=h0.double())
    return dict(case="public op D z h0 final N 1000", **check(y, ref), bits=digest(y, ht),
                state_written=bool(torch.isfinite(ht).all()) and ht.is_contiguous(),
                state_rel=float((ht.double() - ref_state).norm() / ref_state.norm()),
                second_call_same=same_bits(y, y2))


def timed_args(case: str, shape=None):
    B, N, H = shape or SHAPE
    x, dt, A, Bm, Cm, D, z = mamba_inputs(B, N, H)
    P, S = x.shape[-1], Bm.shape[-1]
    h0 = ht = None
    if case == "states":
        h0 = mamba_states(B, H, S, P, "randn").mul_(0.1)
        ht = mamba_states(B, H, S, P)
    return (Cm, Bm, x, dt * A, dt, D[:, None].expand(H, P), z, h0, torch.empty_like(x), ht, 1.0)


def napkin_ms(with_states: bool) -> float:
    """The napkin's HBM bound of the 2.7B shape (with the initial state read and the final states written, float32:
    84 MB more)."""
    from tilecore.napkin import models
    from tilecore.napkin.engine import derive

    B, N, H = SHAPE
    r = derive(models.mamba2_ssd(batch=B, heads=H, seq=N, headdim=64, state=128, chunk=64, groups=1, gate=True,
                                 skip=True), "h100")
    return 1e3 * (r.compulsory_bytes + with_states * 2 * B * H * 64 * 128 * 4) / r.gpu.levels[0].bandwidth


def step_us(ms: float, B: int, H: int) -> float:
    """us a chunk-step of an SM: the persistent grid's waves of tiles (two heads each) times the sequence's chunks."""
    from tilecore.tiles.schedule import persistent_programs

    tiles = B * H // 2
    waves = -(-tiles // persistent_programs(tiles, torch.device("cuda")))
    return round(1e3 * ms / (waves * -(-SHAPE[1] // 64)), 4)


def probe_phase(run: Run, rounds: int):
    for label, (B, H) in PROBES.items():
        fn = launcher(*timed_args("stateless", (B, SHAPE[1], H)))
        fn()
        torch.cuda.synchronize()
        res = time_rounds({"shipped": fn}, rounds=rounds, graph=True, eager=False)
        ms = res.get("shipped_graph_ms")
        run.row(f"probe {label}", shipped_graph_ms=ms, step_us=step_us(ms, B, H) if ms else None,
                rounds=res["shipped_rounds"].get("graph"))


def warm(op: bool, probe: bool):
    """In a process of its own (a fault there is a row, not the end): the checks, then each timed shape's compile."""
    t0 = time.time()
    rows = []
    try:
        rows.append(check_mamba("D z N 1008", 2, 1008, 8))
        rows.append(check_mamba("strong h0 ht N 304", 2, 304, 4, True, (-80.0, -20.0)))
        if op:
            rows.append(check_op())
        for case in CASES:
            launcher(*timed_args(case))()
        if probe:
            for B, H in PROBES.values():
                launcher(*timed_args("stateless", (B, SHAPE[1], H)))()
        torch.cuda.synchronize()
        return None, round(time.time() - t0, 1), rows
    except Exception as err:  # noqa: BLE001
        return f"{type(err).__name__}: {err}"[:300], round(time.time() - t0, 1), rows


# --------------------------------------------------------------------------------------------
# --clocks: the SM clock under the timed rounds, and the kernel timed as ncu times it (one launch on an idle GPU)

SMI_FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "clocks_event_reasons.active")


def smi_id() -> str:
    """nvidia-smi's name of the GPU torch runs on (its UUID: nvidia-smi's indices ignore CUDA_VISIBLE_DEVICES, so on a
    host of several GPUs its index 0 may be another job's)."""
    return f"GPU-{torch.cuda.get_device_properties(torch.cuda.current_device()).uuid}"


class Clocks:
    """nvidia-smi sampling the GPU every 50 ms in the background, from ``with`` to its end: the SM clock's median /
    min / max (MHz), the memory clock, power (W), temperature and the clock-event reasons seen (a bit mask: 0x4 SW
    power cap, 0x20 SW thermal, 0x40 HW thermal, 0x80 HW power brake; 0x1 idle)."""

    def __init__(self):
        self.summary: dict = {}

    def __enter__(self):
        self.file = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(["nvidia-smi", "-i", smi_id(), f"--query-gpu={','.join(SMI_FIELDS)}",
                                      "--format=csv,noheader,nounits", "-lms", "50"], stdout=self.file,
                                     stderr=subprocess.STDOUT, text=True)
        time.sleep(0.2)  # (its first sample before the work)
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=5)
        self.file.seek(0)
        rows = [ln.split(",") for ln in self.file.read().splitlines() if ln.count(",") == len(SMI_FIELDS) - 1]
        self.file.close()
        nums = []
        for r in rows:
            try:
                nums.append((float(r[0]), float(r[1]), float(r[2]), float(r[3]), int(r[4].strip(), 16)))
            except ValueError:
                continue
        if nums:
            sm = [n[0] for n in nums]
            power = [n[2] for n in nums]
            reasons = 0
            for n in nums:
                reasons |= n[4]
            self.summary = dict(samples=len(nums), sm_mhz_median=statistics.median(sm), sm_mhz_min=min(sm),
                                sm_mhz_max=max(sm), mem_mhz=statistics.median(n[1] for n in nums),
                                power_w_median=statistics.median(power), power_w_max=max(power),
                                temp_c_max=max(n[3] for n in nums), reasons=hex(reasons))
        else:
            self.summary = dict(samples=0, raw=[",".join(r) for r in rows[:3]])
        return False


def clocks_phase(run: Run, rounds: int):
    """The kernel alone (stateless, the scores made once): one launch on an idle GPU (0.3 s asleep before it,
    CUDA events: as ncu times a launch), 30 launches back to back, and graph rounds, each under Clocks."""
    text = subprocess.run(["nvidia-smi", "-q", "-d", "CLOCK", "-i", smi_id()], capture_output=True, text=True).stdout
    run.extra["smi_gpu"] = smi_id()
    run.extra["smi_clock"] = text
    print("\n".join(ln for ln in text.splitlines() if ln.strip() and "Clock Policy" not in ln)[:1500], flush=True)
    fn = launcher(*timed_args("stateless"), scores=False)
    fn()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    with Clocks() as c:
        alone = []
        for _ in range(6):
            time.sleep(0.3)
            ev[0].record()
            fn()
            ev[1].record()
            torch.cuda.synchronize()
            alone.append(round(ev[0].elapsed_time(ev[1]), 5))
    run.row("clocks kernel alone after idle", ms=alone, median_ms=statistics.median(alone), **c.summary)
    with Clocks() as c:
        back = []
        for _ in range(5):
            ev[0].record()
            for _ in range(30):
                fn()
            ev[1].record()
            torch.cuda.synchronize()
            back.append(round(ev[0].elapsed_time(ev[1]) / 30, 5))
    run.row("clocks kernel back to back x30", ms=back, median_ms=statistics.median(back), **c.summary)
    with Clocks() as c:
        res = time_rounds({"kernel": fn}, rounds=rounds, graph=True, eager=False)
    run.row("clocks kernel graph rounds", ms=res["kernel_rounds"].get("graph"), median_ms=res.get("kernel_graph_ms"),
            **c.summary)


# --------------------------------------------------------------------------------------------
# the decode step (issue 33's >= 90% of the copy over the state read and written; decision 93): the public mamba2_step
# from a CUDA graph beside a graph-timed copy of the state, checked against the float64 step


def step_inputs(seed: int = 1):
    torch.manual_seed(seed)
    B, H, P, S, bf = 16, 80, 64, 128, torch.bfloat16
    dt = torch.nn.functional.softplus(torch.randn(B, H, device="cuda") - 2)
    A = -torch.rand(H, device="cuda") * 8 - 0.5
    C = (torch.randn(B, 1, S, device="cuda") * S ** -0.5).to(bf)
    Bm = (torch.randn(B, 1, S, device="cuda") * S ** -0.5).to(bf)
    x, z = (torch.randn(B, H, P, device="cuda").to(bf) for _ in range(2))
    return dict(C=C, B=Bm, x=x, dt=dt, A=A, D=torch.randn(H, device="cuda"), z=z,
                state=torch.randn(B, H, P, S, device="cuda"))


def step_phase(run: Run):
    """mamba2_step (the public op, in place on its (b, h, p, s) state) against the float64 step, then timed from a CUDA
    graph beside a copy of the state's bytes."""
    from tilecore.ops.linear_attention import mamba2_step

    t = step_inputs()
    S0 = t["state"].double()
    g = (t["dt"] * t["A"]).double()
    dt, x = t["dt"].double(), t["x"].double()
    S1 = S0 * g.exp()[..., None, None] + (dt[..., None] * x)[..., :, None] * t["B"].double()[:, :1, None, :]
    y_ref = torch.einsum("bs,bhps->bhp", t["C"].double()[:, 0], S1) + t["D"].double()[None, :, None] * x
    zz = t["z"].double()
    y_ref = y_ref * zz * torch.sigmoid(zz)
    state = t["state"].clone()
    with torch.no_grad():
        y = mamba2_step(state, t["x"], t["dt"], t["A"], t["B"], t["C"], D=t["D"], z=t["z"])
    torch.cuda.synchronize()
    row = dict(**check(y, y_ref), state_rel=float((state.double() - S1).norm() / S1.norm()))
    src = torch.empty_like(t["state"])
    dst = torch.empty_like(src)
    row["copy_graph_ms"] = graph_ms(lambda: dst.copy_(src))
    with torch.no_grad():
        row["step_graph_ms"] = graph_ms(lambda: mamba2_step(state, t["x"], t["dt"], t["A"], t["B"], t["C"], D=t["D"],
                                                            z=t["z"]))
    if row["copy_graph_ms"] and row["step_graph_ms"]:
        row["copy_pct"] = round(100 * row["copy_graph_ms"] / row["step_graph_ms"], 1)
    run.row("decode step mamba2 B16 H80", **row)


def scores_phase(run: Run):
    """The chunks' scores alone (kernels_forward.chunk_scores on the 2.7B shape's C and B), float32 and bf16."""
    from tilecore.ops.linear_attention.kernels_forward import chunk_scores

    Cm, Bm = timed_args("stateless")[:2]
    fns = {}
    for name, dt in (("cb_f32", torch.float32), ("cb_bf16", torch.bfloat16)):
        out = chunk_scores(Cm, Bm, 64, dt)
        fns[name] = lambda out=out, dt=dt: chunk_scores(Cm, Bm, 64, dt, out=out)
    ref = torch.einsum("bcjd,bcid->bcji", *(t.float().view(SHAPE[0], -1, 64, t.shape[-1]) for t in (Bm, Cm)))
    got = chunk_scores(Cm, Bm, 64)
    err = float((got.view_as(ref) - ref).abs().max())
    res = time_rounds(fns, rounds=5, graph=True, eager=False)
    run.row("chunk_scores 2.7B", max_abs_vs_fp32_einsum=err, **{k: v for k, v in res.items() if k.endswith("_ms")})


class CaseDeadline:
    """time_rounds's deadline for one case: no round starts past ``end``."""

    def __init__(self, end: float):
        self.end = end

    def left(self) -> float:
        return self.end - time.time()


NCU_SHAPES = {"1 tile": (1, 2), "2.7B": SHAPE[::2]}
NCU_METRICS = [
    "gpu__time_duration.sum",
    "sm__cycles_elapsed.avg.per_second",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "smsp__inst_executed.sum",
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
    "dram__bytes_read.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sector_hit_rate.pct",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"] + [
    f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in (
        "math_pipe_throttle", "long_scoreboard", "short_scoreboard", "wait", "barrier", "membar", "mio_throttle",
        "lg_throttle", "dispatch_stall", "selected", "not_selected", "sleeping", "branch_resolving", "no_instruction",
        "drain", "misc", "imc_miss", "tex_throttle")]


def ncu_target(spec: str) -> None:
    """What ncu runs: three launches on B x 4096 x H (``B,H``; it profiles the third)."""
    B, H = (int(x) for x in spec.split(","))
    fn = launcher(*timed_args("stateless", (B, SHAPE[1], H)))
    for _ in range(3):
        fn()
    torch.cuda.synchronize()


def ncu_numbers(text: str) -> dict:
    """{metric: value} of ncu's --metrics print (a metric's name first on its line, its value last)."""
    found = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in NCU_METRICS:
            try:
                found[parts[0]] = float(parts[-1].replace(",", ""))
            except ValueError:
                pass
    return found


def ncu_phase(out: str) -> None:
    import json
    import os

    from experiments.common.nsight import profile

    t0 = time.time()
    results = {}
    for name, (B, H) in NCU_SHAPES.items():
        text = profile(["--print-units", "base", "--metrics", ",".join(NCU_METRICS), "--section", "WarpStateStats"],
                       "la_fwd_gluon_kernel", __file__, ["--ncu-target", f"{B},{H}"], timeout=150)
        keep = [ln.strip() for ln in text.splitlines() if any(m in ln for m in NCU_METRICS) or "Stall" in ln
                or "Warp Cycles" in ln or "==ERR" in ln or "Error" in ln]
        results[name] = dict(values=ncu_numbers(text), lines=keep, tail="" if keep else text[-1500:])
        print(f"--- {name} ({time.time() - t0:.0f} s) ---\n" + "\n".join(keep[:60]), flush=True)
        if not keep:
            print(text[-1500:], flush=True)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "mamba_ncu.json"), "w") as f:
        json.dump(results, f, indent=1)
    names = list(results)
    print(f"\n== ncu, the Mamba-2 kernel, one launch each ({time.time() - t0:.0f} s) ==")
    print(f"{'metric':62s} " + " ".join(f"{n:>12s}" for n in names))
    for m in NCU_METRICS:
        if any(m in results[n]["values"] for n in names):
            short = m.replace("smsp__average_warps_issue_stalled_", "stall ").replace("_per_issue_active.ratio", "")
            print(f"{short[:62]:62s} " + " ".join(f"{results[n]['values'].get(m, float('nan')):12.4g}" for n in names))


def ncu_source_phase(out: str, top: int = 30) -> None:
    """Nsight Compute's warp-stall samples per SASS instruction on one 2.7B launch: by stall reason, by
    the chain's phases (the instructions up to a synchronizing one) and the top instructions (gpu_gla_dqk_ncu's
    summary); every BAR.SYNC's share besides (the consumers' two named barriers, 0x0 and 0x2, and the idle padding
    warps' barrier outside the loops)."""
    import csv
    import io
    import json
    import os

    from experiments.common.nsight import ncu_binary, profile
    from experiments.linear_attention.gpu_gla_dqk_ncu import summarize

    t0 = time.time()
    B, H = NCU_SHAPES["2.7B"]
    rep_path = os.path.join(tempfile.gettempdir(), "mamba_ncu_src")
    text = profile(["--section", "SourceCounters", "--section", "WarpStateStats", "-f", "-o", rep_path],
                   "la_fwd_gluon_kernel", __file__, ["--ncu-target", f"{B},{H}"], timeout=200)
    res = subprocess.run([ncu_binary(), "-i", rep_path + ".ncu-rep", "--page", "source", "--csv", "--print-source",
                          "sass"], capture_output=True, text=True, timeout=120)
    table = list(csv.reader(io.StringIO(res.stdout)))
    head = next((i for i, r in enumerate(table) if "Source" in r), None)
    if head is None:
        summary = dict(error=text[-1500:] + res.stderr[-800:])
        print(f"no source table\n{text[-1500:]}\n{res.stderr[-800:]}", flush=True)
    else:
        cols = table[head]
        rows = [r for r in table[head + 1:] if len(r) == len(cols)]
        summary = summarize(rows, cols, top)
        total_col = next((i for i, c in enumerate(cols) if c.startswith("Warp Stall Sampling (All")),
                         next(i for i, c in enumerate(cols) if "Sampl" in c))
        src, addr = cols.index("Source"), next((i for i, c in enumerate(cols) if "ddress" in c), None)
        num = lambda v: float(v.replace(",", "") or 0)  # noqa: E731
        # each BAR instruction's share of all samples (by its address: which barrier of whose code)
        summary["bars"] = [(r[addr] if addr is not None else "", r[src][:44],
                            round(100 * num(r[total_col]) / max(summary["samples"], 1), 2))
                           for r in rows if re.search(r"\bBAR\.", r[src])]
        print(f"--- {len(rows)} SASS lines, {summary['samples']} samples ({time.time() - t0:.0f} s) ---")
        print(json.dumps({k: summary[k] for k in ("by_reason", "bars")}))
        print("\n".join(json.dumps(x) for x in [p for p in summary["phases"] if p["pct"] >= 1.0] + summary["top"]))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "mamba_ncu_source.json"), "w") as f:
        json.dump(summary, f, indent=1)


def main():
    import concurrent.futures as cf
    import multiprocessing as mp

    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--op", action="store_true", help="also check the public mamba2_chunk_scan")
    ap.add_argument("--step", action="store_true", help="also check and time the decode step")
    ap.add_argument("--probe", action="store_true", help="also time fewer tiles (PROBES): a chunk-step's time")
    ap.add_argument("--clocks", action="store_true", help="the SM clock under the timed rounds; the kernel as ncu times "
                                                          "it")
    ap.add_argument("--deadline", type=float, default=57)
    ap.add_argument("--ncu", action="store_true", help="Nsight Compute on the kernel (NCU_SHAPES), nothing else")
    ap.add_argument("--ncu-source", action="store_true", help="Nsight Compute's stall samples per SASS instruction on "
                                                                  "the 2.7B launch, nothing else")
    ap.add_argument("--ncu-target", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.ncu_target:
        return ncu_target(a.ncu_target)
    if a.ncu or a.ncu_source:
        import os

        return (ncu_source_phase if a.ncu_source else ncu_phase)(os.environ.get("OUT", "."))
    cases = a.cases.split(",")
    run = Run("mamba", deadline=a.deadline)
    pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"))
    fut = pool.submit(warm, a.op, a.probe)
    bounds = {s: run.attempt("napkin", napkin_ms, s) for s in (False, True)}
    run.extra["napkin_ms"], run.extra["napkin_with_states_ms"] = bounds[False], bounds[True]
    got = run.attempt("warm (a worker died or took past 45 s)", fut.result, timeout=max(1.0, 45 - run.elapsed()))
    pool.shutdown(wait=False, cancel_futures=True)
    ok = False
    if got is not None:
        err, secs, rows = got
        for r in rows:
            run.row(f"check {r['case']}", **r)
        if err:
            run.errors.append(f"warm: {err}")
        ok = not err and all(r["pass"] and r.get("state_written", True) and r.get("state_rel", 0) < 2e-2
                             and r.get("second_call_same", True) for r in rows)
        run.say(f"warm: {secs} s, error {err}, passed {ok}")
    if a.step:
        run.attempt("decode step", step_phase, run)
    if ok:
        run.attempt("chunk_scores", scores_phase, run)
    if a.clocks and ok:
        run.attempt("clocks", clocks_phase, run, 5)
    if a.probe and ok:
        run.attempt("probes", probe_phase, run, 5)
    for i, case in enumerate(cases):
        if run.left() < 5 or not ok:
            break
        share = CaseDeadline(time.time() + run.left() / (len(cases) - i))  # (each case its share of what is left)
        fn = launcher(*timed_args(case))
        fn()
        torch.cuda.synchronize()
        clocks = Clocks() if a.clocks else None
        if clocks:
            clocks.__enter__()
        res = run.attempt(f"time {case}", time_rounds, {"shipped": fn}, rounds=a.rounds, graph=True, eager=False,
                          deadline=share)
        if clocks:
            clocks.__exit__(None, None, None)
        if res:
            row = dict(case=case, **res)
            ms, bound = res.get("shipped_graph_ms"), bounds[case == "states"]
            if ms and bound:
                row["napkin_pct"] = round(100 * bound / ms, 1)
                row["best_round_pct"] = round(100 * bound / min(res["shipped_rounds"]["graph"]), 1)
                row["step_us"] = step_us(ms, SHAPE[0], SHAPE[2])
            if clocks:
                row.update(clocks.summary)
            run.row(f"time {case}", **row)
    run.finish(["name", "pass", "err_over_floor", "state_rel", "median_ms", "shipped_graph_ms", "napkin_pct",
                "best_round_pct", "step_us", "sm_mhz_median", "sm_mhz_min", "power_w_median", "reasons",
                "cb_bf16_graph_ms", "copy_pct"])


if __name__ == "__main__":
    main()
