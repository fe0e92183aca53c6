"""Mamba-2's Gluon forward toward 75% of the napkin's bound (issue 33). The shipped kernel (G, beta and z through the
stage, the gate by tanh.approx, LEAN's step: session 37 removed those switches' other sides) against its variants (VARIANTS: launch_args keywords over the shipped flags; the step
variants session 32 timed here, D_EARLY, UPDATE_LATE, Q_REG and BETA_LOG, lost and were removed: notes decisions 64,
91, 124), each checked against the float64 recurrence, then timed in interleaved rounds beside the shipped
kernel (first and last), the copy of the same bytes, the public op, FLA's chunk_simple_gla (the same SSD math, in a
process of its own) and mamba_ssm's mamba_chunk_scan_combined where it imports. The napkin's bound (mamba2_ssd with
one B/C group, the gate and the skip: compulsory bytes at the datasheet's 3.35 TB/s) printed beside.

    PYTHONPATH=/tmp/site:. python3 experiments/linear_attention/gpu_mamba_s32.py [--only a,b] [--no-peer]

Shape: the 2.7B model's (B16 H80 N4096, headdim 64, d_state 128, one group), bf16; the kernel alone on prepared
arguments (G and beta head-major), as gpu_forward.py --set s30 timed it (0.891-0.903 ms in session 30).
Checks (NaN-poisoned o and final states, every element written; error over the bf16/fp16 rounding floor): Mamba-2
bf16 h0 N 1000 (B2 H8, D and z), N 33 (B1 H4), fp16 h0 N 1000, strong decays (A in [-80, -20]: every chunk's
exponent difference above the diagonal is +inf in LEAN's unmasked exps) N 300; with LEAN also linear attention
with beta, a scalar decay with a reset, scale 0.5 and no D / z (the scale moved onto beta V's rows), N 1000.
Decode steps (issue 33's >= 90% of the copy bandwidth over the state read and written; last timed in session 24
through the host, 0.049 ms against a 0.017 ms copy): the step kernel alone (kernels_tl.la_step_kernel) by CUDA graphs
at its shipped blocks (value blocks of configs.STEP_BV, configs.STEP_WARPS) and at value blocks 16 / 32 / 128 and 8
warps, beside a graph-timed copy of the state's bytes and the public ops (linear_attention_step, mamba2_step) in
graphs; each variant's o and state against the float64 step. Shapes: linear d128 B16 H16 (scalar decay, float32
state) and Mamba-2 2.7B B16 (H80 P64 S128, D, z; the (b, h, p, s) state by strides).
Prints a table last; JSON to $OUT/mamba_s32.json. About 110 s on an H100.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_forward as gfw  # noqa: E402

from tilecore import accuracy  # noqa: E402
from tilecore.ops.linear_attention import linear_attention_reference, mamba2_reference  # noqa: E402

START = time.time()
OUT = Path(os.environ.get("OUT", "/tmp/out"))
WARM_DEADLINE = 75.0
PEER_DEADLINE = 130.0
READY_DEADLINE = 80.0  # the timing phase waits for the peer's compiles until then
RESULTS: dict = {"check": [], "time": {}, "warm": [], "errors": [], "step": {}, "step_check": []}
CASE = "mamba2 2.7B shape"
# name -> gluon_forward.launch_args keywords over the shipped kernel's ("no lean", the kernel before LEAN: removed with
# the switch in session 37, notes decision 146)
VARIANTS = {
    "shipped": {},
}
# (label, B, N, H, dtype, h0, A's range (lo, hi))
CHECKS = [("bf16 h0 N 1000", 2, 1000, 8, "bf16", True, (-8.5, -0.5)),
          ("bf16 N 33", 1, 33, 4, "bf16", False, (-8.5, -0.5)),
          ("fp16 h0 N 1000", 2, 1000, 8, "fp16", True, (-8.5, -0.5)),
          ("bf16 h0 strong decays N 300", 2, 300, 4, "bf16", True, (-80.0, -20.0))]


def elapsed() -> float:
    return time.time() - START


def save():
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "mamba_s32.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def attempt(name, fn):
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 (a variant goes on)
        msg = f"{name}: {type(err).__name__}: {err}"[:500]
        print("FAILED", msg, flush=True)
        traceback.print_exc(limit=3)
        RESULTS["errors"].append(msg)
        return None


def launch(q, k, v, g, beta, d_skip, z, h0, o, ht, scale, name: str):
    """The variant's kernel on prepared arguments (G and beta head-major: gluon_forward.prepare_decay); the variant's
    launch_args keywords (VARIANTS) over the shipped kernel's (none since session 37: the kernel has no switches)."""
    from tilecore.ops.linear_attention import configs
    from tilecore.ops.linear_attention import gluon_forward as gf

    G, beta_h = gf.prepare_decay(g, beta)
    grid, args, warps = gf.launch_args(q, k, v, G, beta_h, d_skip, z, h0, o, ht, scale, configs.GLUON_STAGES,
                                       **VARIANTS[name])
    return lambda: gf.la_fwd_gluon_kernel[grid](**args, num_warps=warps)


def mamba_inputs(B, N, H, dtype, h0, a_range, seed=5):
    torch.manual_seed(seed)
    dt_ = torch.bfloat16 if dtype == "bf16" else torch.float16
    P, S = 64, 128
    x = torch.randn(B, N, H, P, device="cuda", dtype=dt_)
    dt = torch.nn.functional.softplus(torch.randn(B, N, H, device="cuda") - 2)
    lo, hi = a_range
    A = torch.rand(H, device="cuda") * (hi - lo) + lo
    Bm = (torch.randn(B, N, 1, S, device="cuda") * S ** -0.5).to(dt_)
    Cm = (torch.randn(B, N, 1, S, device="cuda") * S ** -0.5).to(dt_)
    D = torch.randn(H, device="cuda")
    z = torch.randn(B, N, H, P, device="cuda", dtype=dt_)
    st = torch.randn(B, H, S, P, device="cuda") if h0 else None  # the kernel's (F, Dv) states
    return x, dt, A, Bm, Cm, D, z, st


def check_mamba(name: str, label, B, N, H, dtype, h0, a_range) -> dict:
    x, dt, A, Bm, Cm, D, z, st = mamba_inputs(B, N, H, dtype, h0, a_range)
    o = torch.full_like(x, float("nan"))
    ht = torch.full((B, H, 128, 64), float("nan"), device="cuda")
    d_skip = D[:, None].expand(H, 64).contiguous()
    launch(Cm, Bm, x, dt * A, dt, d_skip, z, st, o, ht, 1.0, name)()
    torch.cuda.synchronize()
    ref, ref_state = mamba2_reference(x.double(), dt.double(), A.double(), Bm.double(), Cm.double(), D=D.double(),
                                      z=z.double(),
                                      initial_states=None if st is None else st.transpose(-1, -2).double())
    row = dict(variant=name, case=f"mamba2 {label}", N=N, all_written=not bool(o.isnan().any() or ht.isnan().any()),
               out_floor=round(accuracy.error_over_floor(o.nan_to_num(), ref), 3),
               state_rel=accuracy.rel_rms(ht.nan_to_num(), ref_state.transpose(-1, -2)))
    return row


def check_scale(name: str) -> dict:
    """LEAN's scale on beta V: linear attention with beta, a scalar decay (a reset), scale 0.5, no D / z."""
    torch.manual_seed(9)
    B, N, H, Dk, Dv = 2, 1000, 2, 128, 128
    bf = torch.bfloat16
    q = (torch.randn(B, N, H, Dk, device="cuda") * Dk ** -0.5).to(bf)
    k = (torch.randn(B, N, H, Dk, device="cuda") * Dk ** -0.5).to(bf)
    v = torch.randn(B, N, H, Dv, device="cuda", dtype=bf)
    g = -torch.rand(B, N, H, device="cuda") * 0.3
    g[:, N // 3] = float("-inf")
    beta = torch.rand(B, N, H, device="cuda") + 0.1
    h0 = torch.randn(B, H, Dk, Dv, device="cuda")
    o = torch.full_like(v, float("nan"))
    ht = torch.full_like(h0, float("nan"))
    launch(q, k, v, g, beta, None, None, h0, o, ht, 0.5, name)()
    torch.cuda.synchronize()
    ref, ref_state = linear_attention_reference(q.double(), k.double(), v.double(), decay=g.double(),
                                                beta=beta.double(), scale=0.5, initial_state=h0.double())
    return dict(variant=name, case="linear beta scale 0.5 reset h0 N 1000", N=N,
                all_written=not bool(o.isnan().any() or ht.isnan().any()),
                out_floor=round(accuracy.error_over_floor(o.nan_to_num(), ref), 3),
                state_rel=accuracy.rel_rms(ht.nan_to_num(), ref_state))


def _warm(name: str):
    """In a process of its own: the variant's checks, then one launch at the timed shape (compiles it)."""
    t0 = time.time()
    rows = []
    if name.startswith("step "):
        try:
            rows = step_checks(name[5:])
            return name, None, time.time() - t0, rows
        except Exception as err:  # noqa: BLE001
            return name, f"{type(err).__name__}: {err}"[:300], time.time() - t0, rows
    try:
        for c in CHECKS:
            rows.append(check_mamba(name, *c))
        rows.append(check_scale(name))  # (LEAN's scale on beta V)
        t = gfw.make(CASE, *gfw.shape())
        launch(t["q"], t["k"], t["v"], t["g"], t["beta"], t["d_skip"].float().contiguous(), t["z"], None,
               torch.empty_like(t["v"]), None, 1.0, name)()
        torch.cuda.synchronize()
        return name, None, time.time() - t0, rows
    except Exception as err:  # noqa: BLE001
        return name, f"{type(err).__name__}: {err}"[:300], time.time() - t0, rows


def warm(names) -> set:
    import concurrent.futures as cf
    import multiprocessing as mp

    pool = cf.ProcessPoolExecutor(max_workers=min(12, len(names)), mp_context=mp.get_context("spawn"),
                                  max_tasks_per_child=1)
    futs = [pool.submit(_warm, n) for n in names]
    ok = set()
    try:
        for fut in cf.as_completed(futs, timeout=max(1.0, WARM_DEADLINE - elapsed())):
            name, err, secs, rows = fut.result()
            RESULTS["warm"].append(dict(variant=name, error=err, s=round(secs, 1)))
            if name.startswith("step "):
                RESULTS["step_check"] += rows
                if err:
                    print("warm", name, err, flush=True)
                for r in rows:
                    if r["all_written"] and r["out_floor"] < 2.5 and r["state_rel"] < 1e-5:
                        ok.add((name[5:], r["variant"]))
                continue
            RESULTS["check"] += rows
            good = all(r["all_written"] and r["out_floor"] < 2.5 for r in rows) and len(rows) >= len(CHECKS)
            if err or not good:
                print("warm", name, err, "checks", [(r["case"], r["out_floor"], r["all_written"]) for r in rows],
                      flush=True)
            else:
                ok.add(name)
    except cf.TimeoutError:
        RESULTS["errors"].append(f"warm: not every variant done by {WARM_DEADLINE:.0f} s")
    for proc in list(getattr(pool, "_processes", {}).values()):
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    print(f"warm: {len(RESULTS['warm'])} of {len(names)} tasks in {elapsed():.0f} s; passed {sorted(map(str, ok))}",
          flush=True)  # (ok holds variant names and (step case, variant) pairs: run 7 crashed sorting them together)
    return ok


# --------------------------------------------------------------------------------------------
# peers in a process of their own (compiles and autotunes from the start; times itself when told)


def _peer(go: str):
    """FLA's (and mamba_ssm's) compiles first, then a ready file beside ``go`` (the timing phase waits for it: run 2
    timed beside FLA's autotune), then its own timings once ``go`` exists."""
    t0 = time.time()
    res = {}
    t = gfw.make(CASE, *gfw.shape())
    calls = {}
    try:
        calls["fla_chunk_simple_gla"] = gfw.fla_call("chunk_simple_gla", CASE, t)
    except Exception as err:  # noqa: BLE001
        res["fla_error"] = f"{type(err).__name__}: {err}"[:200]
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

        Bm, Cm = t["k"], t["q"]
        calls["mamba_ssm"] = lambda: mamba_chunk_scan_combined(t["v"], t["dt"], t["A"], Bm, Cm, chunk_size=256,
                                                               D=t["d_skip"][:, 0], z=t["z"])
    except Exception as err:  # noqa: BLE001
        res["mamba_ssm_error"] = f"{type(err).__name__}: {err}"[:200]
    for name, fn in calls.items():
        try:
            fn()
            torch.cuda.synchronize()
            res[f"{name}_ready_s"] = round(time.time() - t0, 1)
        except Exception as err:  # noqa: BLE001
            res[f"{name}_error"] = f"{type(err).__name__}: {err}"[:200]
    torch.cuda.synchronize()
    Path(go + ".ready").touch()
    while not os.path.exists(go) and time.time() - t0 < 200:
        time.sleep(0.02)
    for name, fn in calls.items():
        if f"{name}_ready_s" in res:
            res[f"{name}_ms"] = gfw.bench(fn)
    return res


def start_peer():
    import concurrent.futures as cf
    import multiprocessing as mp

    go = str(OUT / ".mamba_peer_go")
    OUT.mkdir(parents=True, exist_ok=True)
    Path(go).unlink(missing_ok=True)
    Path(go + ".ready").unlink(missing_ok=True)
    pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"))
    return pool, pool.submit(_peer, go), go


def finish_peer(handle) -> dict:
    import concurrent.futures as cf

    pool, fut, go = handle
    Path(go).touch()
    try:
        res = fut.result(timeout=max(1.0, START + PEER_DEADLINE - time.time()))
    except cf.TimeoutError:
        res = dict(error=f"not ready by {PEER_DEADLINE:.0f} s (autotuned compiles)")
    except Exception as err:  # noqa: BLE001
        res = dict(error=f"{type(err).__name__}: {err}"[:300])
    Path(go).unlink(missing_ok=True)
    Path(go + ".ready").unlink(missing_ok=True)
    for proc in list(getattr(pool, "_processes", {}).values()):
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    return res


# --------------------------------------------------------------------------------------------
# decode steps: the kernel alone at its blocks (value block, warps) by CUDA graphs, the copy, the public ops

# name -> (value block, warps); None: the shipped (configs.STEP_BV, configs.STEP_WARPS)
STEP_VARIANTS = {"shipped": (None, None), "bv16": (16, None), "bv32": (32, None), "bv128": (128, None),
                 "w8": (None, 8), "bv32 w8": (32, 8)}
STEP_CASES = ("linear", "mamba2")


def step_inputs(case: str, seed: int = 1):
    torch.manual_seed(seed)
    B, bf = 16, torch.bfloat16
    if case == "linear":
        H, Dk, Dv = 16, 128, 128
        t = dict(q=torch.randn(B, H, Dk, device="cuda", dtype=bf), k=torch.randn(B, H, Dk, device="cuda", dtype=bf),
                 v=torch.randn(B, H, Dv, device="cuda", dtype=bf), g=-torch.rand(B, H, device="cuda") * 0.3,
                 beta=None, d_skip=None, z=None, state=torch.randn(B, H, Dk, Dv, device="cuda"), scale=Dk ** -0.5)
        return t
    H, P, S = 80, 64, 128
    dt = torch.nn.functional.softplus(torch.randn(B, H, device="cuda") - 2)
    A = -torch.rand(H, device="cuda") * 8 - 0.5
    D = torch.randn(H, device="cuda")
    return dict(q=(torch.randn(B, 1, S, device="cuda") * S ** -0.5).to(bf),
                k=(torch.randn(B, 1, S, device="cuda") * S ** -0.5).to(bf),
                v=torch.randn(B, H, P, device="cuda", dtype=bf), g=dt * A, beta=dt, dt=dt, A=A, D=D,
                d_skip=D[:, None].expand(H, P).contiguous(), z=torch.randn(B, H, P, device="cuda", dtype=bf),
                state=torch.randn(B, H, P, S, device="cuda"), scale=1.0)


def step_launch(case: str, t: dict, name: str, state=None, o=None):
    """The step kernel alone on t at the variant's blocks (the Mamba-2 state (b, h, p, s) read by strides)."""
    import dataclasses

    from tilecore.ops.linear_attention import launch
    from tilecore.ops.linear_attention.plan import IDENTITY, plan

    bv, warps = STEP_VARIANTS[name]
    state = t["state"] if state is None else state
    o = torch.empty_like(t["v"]) if o is None else o
    p = plan(t["q"][:, None], t["v"][:, None], None, IDENTITY)
    if warps is not None:
        p = dataclasses.replace(p, config={**p.config, "step_warps": warps})
    if bv is not None:
        p = dataclasses.replace(p, config={**p.config, "step_bv": bv})
    strides = None
    if case == "mamba2":
        s0, s1, s2, s3 = state.stride()
        strides = (s0, s1, s3, s2)
    kern, grid, args, kw = launch.step_call(p, t["q"], t["k"], t["v"], t["g"], t["beta"], t["d_skip"], t["z"],
                                            state, o, t["scale"], IDENTITY, strides)
    return lambda: kern[grid](*args, **kw), o


def step_reference(case: str, t: dict):
    """(o, the state after the step) in float64."""
    S = t["state"].double()
    q, k, v = t["q"].double(), t["k"].double(), t["v"].double()
    if case == "linear":
        S = S * t["g"].double().exp()[..., None, None] + k[..., :, None] * v[..., None, :]
        return t["scale"] * torch.einsum("bhf,bhfv->bhv", q, S), S
    dt, g = t["dt"].double(), t["g"].double()
    S = S * g.exp()[..., None, None] + (dt[..., None] * v)[..., :, None] * k[:, :1, None, :]  # (b, h, p, s)
    y = torch.einsum("bs,bhps->bhp", q[:, 0], S) + t["D"].double()[None, :, None] * v
    z = t["z"].double()
    return y * z * torch.sigmoid(z), S


def step_checks(case: str) -> list:
    """Every variant on a fresh copy of the state into a NaN-filled o, against the float64 step (this also compiles
    them for the timing phase)."""
    t = step_inputs(case)
    ref_o, ref_S = step_reference(case, t)
    rows = []
    for name in STEP_VARIANTS:
        state = t["state"].clone()
        o = torch.full_like(t["v"], float("nan"))
        fn, _ = step_launch(case, t, name, state=state, o=o)
        fn()
        torch.cuda.synchronize()
        rows.append(dict(case=f"step {case}", variant=name, all_written=not bool(o.isnan().any()),
                         out_floor=round(accuracy.error_over_floor(o.nan_to_num(), ref_o), 3),
                         state_rel=accuracy.rel_rms(state, ref_S)))
    return rows


def step_phase(ok: set):
    from triton.testing import do_bench_cudagraph

    from tilecore.ops.linear_attention import linear_attention_step, mamba2_step

    graph = lambda fn: do_bench_cudagraph(fn, rep=20, return_mode="median")  # noqa: E731
    for case in STEP_CASES:
        t = step_inputs(case, seed=2)
        row = dict(state_bytes=t["state"].numel() * 4)
        src = torch.empty_like(t["state"])
        dst = torch.empty_like(src)
        row["copy_ms"] = attempt(f"step copy {case}", lambda: graph(lambda: dst.copy_(src)))
        for name in STEP_VARIANTS:
            if (case, name) not in ok:
                continue
            fn, _ = step_launch(case, t, name)
            row[f"{name}_ms"] = attempt(f"step {case} {name}", lambda: graph(fn))
        with torch.no_grad():
            if case == "linear":
                op = lambda: linear_attention_step(t["q"], t["k"], t["v"], t["state"], decay=t["g"])  # noqa: E731
            else:
                op = lambda: mamba2_step(t["state"], t["v"], t["dt"], t["A"], t["k"], t["q"], D=t["D"],  # noqa: E731
                                         z=t["z"])
            for _ in range(3):  # (keyed: the op's later calls take their prepared launches)
                op()
            torch.cuda.synchronize()
            row["op_graph_ms"] = attempt(f"step op {case}", lambda: graph(op))
            row["op_eager_ms"] = attempt(f"step op eager {case}", lambda: gfw.bench(op))
        RESULTS["step"][case] = row
        print("step", case, row, flush=True)
    save()


# --------------------------------------------------------------------------------------------
# time


def napkin_bound_ms() -> float:
    from tilecore.napkin import models
    from tilecore.napkin.engine import derive

    r = derive(models.mamba2_ssd(batch=16, heads=80, seq=4096, headdim=64, state=128, chunk=64, groups=1, gate=True,
                                 skip=True), "h100")
    return 1e3 * r.compulsory_bytes / r.gpu.levels[0].bandwidth


def wait_peer(peer):
    """Until the peer's compiles are done (its ready file), at most READY_DEADLINE s from the start."""
    if peer is None:
        return
    t0 = time.time()
    while not os.path.exists(peer[2] + ".ready") and elapsed() < READY_DEADLINE and not peer[1].done():
        time.sleep(0.05)
    RESULTS["time"]["waited_for_peer_s"] = round(time.time() - t0, 1)
    RESULTS["time"]["peer_ready"] = os.path.exists(peer[2] + ".ready")


def time_phase(ok: set, names, rounds: int = 5):
    t = gfw.make(CASE, *gfw.shape())
    T = RESULTS["time"]
    T["bytes"] = gfw.nbytes(CASE, t)
    T["copy_ms"] = gfw.copy_ms(T["bytes"])
    T["napkin_ms"] = attempt("napkin", napkin_bound_ms)
    o = torch.empty_like(t["v"])
    d_skip = t["d_skip"].float().contiguous()
    fns = {n: launch(t["q"], t["k"], t["v"], t["g"], t["beta"], d_skip, t["z"], None, o, None, 1.0, n)
           for n in names if n in ok}
    runs: dict = {n: [] for n in fns}
    for _ in range(rounds):  # interleaved rounds: drift hits every variant alike
        for n, fn in fns.items():
            ms = attempt(f"time {n}", lambda: gfw.bench(fn))
            if ms:
                runs[n].append(ms)
    if "shipped" in fns:
        T["shipped_last_ms"] = attempt("time shipped last", lambda: gfw.bench(fns["shipped"]))
    T["runs"] = runs
    T["op_ms"] = attempt("time op", lambda: gfw.bench(gfw.default_call(CASE, t)))
    save()


def table(peer: dict) -> str:
    T = RESULTS["time"]
    runs = T.get("runs", {})
    med = {n: sorted(r)[len(r) // 2] for n, r in runs.items() if r}
    base = med.get("shipped")
    nap, copy = T.get("napkin_ms"), T.get("copy_ms")
    fla = peer.get("fla_chunk_simple_gla_ms")
    lines = [f"Mamba-2 2.7B (B16 H80 N4096 P64 S128, one group) bf16, kernel alone; napkin bound "
             f"{nap and round(nap, 4)} ms (75%: {nap and round(nap / 0.75, 4)}), copy {copy and round(copy, 4)} ms, "
             f"FLA chunk_simple_gla {fla and round(fla, 4)}, "
             f"mamba_ssm {peer.get('mamba_ssm_ms') or peer.get('mamba_ssm_error', '')[:60]}",
             "variant | median ms (rounds) | % napkin | % copy | x shipped | x FLA"]
    for n in VARIANTS:
        if n not in med:
            err = next((w["error"] for w in RESULTS["warm"] if w["variant"] == n), None)
            lines.append(f"{n:18} | - {err or 'failed a check or not warm'}")
            continue
        ms = med[n]
        rounds = ", ".join(f"{x:.4f}" for x in runs[n])
        lines.append(f"{n:18} | {ms:.4f} ({rounds}) | {100 * nap / ms if nap else 0:5.1f}%"
                     f" | {100 * copy / ms:5.1f}% | {base / ms if base else 0:.3f} | {fla / ms if fla else 0:.2f}x")
    lines.append(f"shipped timed last {T.get('shipped_last_ms')}; public op {T.get('op_ms')}; waited for the peer's "
                 f"compiles {T.get('waited_for_peer_s')} s (ready {T.get('peer_ready')})")
    lines.append("check | variant | all written | out / floor | state rel")
    bad = [r for r in RESULTS["check"] if not (r["all_written"] and r["out_floor"] < 2.5)]
    ranges = {}
    for r in RESULTS["check"]:
        ranges.setdefault(r["case"], []).append(r["out_floor"])
    for case, v in ranges.items():
        lines.append(f"{case}: out/floor {min(v)}-{max(v)} over {len(v)} variants")
    for r in bad:
        lines.append(f"BAD {r['variant']} {r['case']} written {r['all_written']} {r['out_floor']}")
    lines.append("decode step (CUDA graphs) | ms | % of the state's copy (same bytes read and written)")
    for case, r in RESULTS.get("step", {}).items():
        copy = r.get("copy_ms")
        cells = [f"{n} {r[n + '_ms']:.4f} ({100 * copy / r[n + '_ms']:.0f}%)" for n in list(STEP_VARIANTS)
                 + ["op_graph"] if r.get(n + "_ms") and copy]
        eager = r.get("op_eager_ms")
        lines.append(f"{case}: copy {copy and round(copy, 4)} ms, eager op {eager and round(eager, 4)} | "
                     + ", ".join(cells))
    for case in STEP_CASES:
        v = [r for r in RESULTS.get("step_check", []) if r["case"] == f"step {case}"]
        if v:
            lines.append(f"step {case} checks: out/floor {min(r['out_floor'] for r in v)}-"
                         f"{max(r['out_floor'] for r in v)}, state rel <= {max(r['state_rel'] for r in v):.1e}, "
                         f"written {all(r['all_written'] for r in v)} ({len(v)} variants)")
    lines += [f"ERROR {e}" for e in RESULTS["errors"][:10]]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=",".join(VARIANTS))
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--no-step", action="store_true")
    args = ap.parse_args()
    names = [n for n in VARIANTS if n in args.only.split(",") or n == "shipped"]
    try:
        from experiments.common.meta import meta
        RESULTS["meta"] = meta()
    except Exception as err:  # noqa: BLE001
        RESULTS["meta"] = {"error": str(err)}
    print(RESULTS["meta"], flush=True)
    peer = None if args.no_peer else start_peer()
    try:
        ok = attempt("warm", lambda: warm(names + ([] if args.no_step else [f"step {c}" for c in STEP_CASES]))) or set()
        wait_peer(peer)
        attempt("time", lambda: time_phase(ok, names))
        if not args.no_step:
            attempt("step", lambda: step_phase(ok))
    finally:  # (run 7: a crash here left the peer waiting for its go file, and the job hung to its timeout)
        peer_res = finish_peer(peer) if peer is not None else {}
    RESULTS["peer"] = peer_res
    print("peer", peer_res, flush=True)
    save()
    print(table(peer_res))
    print(f"\n{elapsed():.0f} s; JSON: {OUT / 'mamba_s32.json'}")


if __name__ == "__main__":
    main()
