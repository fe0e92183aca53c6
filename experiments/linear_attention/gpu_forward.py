"""Linear attention's FORWARD speed on the GPU (issue 33): tilecore's forward against flash-linear-attention
0.6.0 and a copy of the same bytes, all in one run; a sweep of the tl kernels' blocks; probes of where the
time goes; each sweep point checked against the default's output and the best against the float64
recurrence.

    PYTHONPATH=. python3 experiments/linear_attention/gpu_forward.py [--full] [--smoke] [--phases ...] [--out DIR]

Default (quick, under 90 s on an H100): the Gluon checks (phi(x) = x, and Based's gluon_based kernel: bf16 and
fp16 against float64, tails, initial and final states, NaN-poisoned outputs), then the four forward cases plus
Dk 64 (no decay, scalar decay) timed with their peers and the copy bound, Based's Gluon kernel and the Gluon
forward at Dk 64 beside the defaults, and Mamba-2's pieces (the kernel alone against the op: the torch side).
--full: also the tl sweep and the probes (about 5 minutes).

(FLA: pip install --no-index --no-deps --target /tmp/site .whl/*.whl and put /tmp/site on PYTHONPATH; without
it the peers are recorded as errors.) About 2 minutes on an H100 with --phases warm,gluon,time,sweep.

Cases (bf16, B16 H16 N4096 unless said): no decay d128 (peer chunk_linear_attn, normalize off), scalar decay
d128 (chunk_simple_gla), Based d16 v64 (parallel_based and fused_chunk_based, use_norm off), Mamba-2 2.7B
shape B16 H80 N4096 P64 S128 groups 1 (chunk_simple_gla on q = C, k = B expanded to the 80 heads).
HBM bound: bytes of q, k, v, o (and the decays; Mamba-2: x, z, y, B, C, dt) at the copy bandwidth measured
in the same run (a torch copy of those bytes). Phases:
* gluon: gluon_forward.la_fwd_gluon_kernel into NaN-filled outputs with initial states, against the float64
  recurrence (no decay, a scalar decay with a reset and N 4097, Dk 64, Mamba-2's beta/D/z), beside the tl
  kernel on the same inputs.
* time: the public op (default plan), the peers, the copy.
* sweep: launch.forward with plan.tl_plan's overrides (chunk, BV, warps, stages); every point's output
  against the default's (relative RMS; a wrong kernel shows), the best against the float64 reference.
* probe: experiments/linear_attention/probe_fwd_kernels.py's modes (loads only; + intra; + inter; all).
Compiles run first in a pool of processes (the Triton cache is on disk, so the timing process then only
loads them). Prints a table last and writes linear_attention_forward.json to --out (default $OUT, else
/tmp/out). --smoke: CPU, Triton's interpreter, tiny shapes, no timing (imports and shapes).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

SMOKE = "--smoke" in sys.argv
QUICK = "--full" not in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tilecore import accuracy  # noqa: E402
from tilecore.ops.linear_attention import (launch, linear_attention, linear_attention_reference,  # noqa: E402
                                           mamba2_chunk_scan, mamba2_reference)
from tilecore.ops.linear_attention.plan import BASED, IDENTITY, tl_plan  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
START = time.time()
RESULTS: dict = {"time": [], "sweep": [], "check": [], "probe": [], "warm": [], "errors": []}
OUT = Path(os.environ.get("OUT", "/tmp/out"))
BUDGET = 85.0 if QUICK else 300.0  # seconds from the start: no new timed case past it
WARM_BUDGET = 55.0 if QUICK else 170.0  # seconds from the start for the warm phase's compiles and checks


def elapsed() -> float:
    return time.time() - START


def save():
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "linear_attention_forward.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def attempt(name, fn):
    if elapsed() > BUDGET:
        RESULTS["errors"].append(f"{name}: skipped, past the {BUDGET:.0f} s budget")
        return None
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 (a probe goes on)
        msg = f"{name}: {type(err).__name__}: {err}"
        print("FAILED", msg, flush=True)
        traceback.print_exc(limit=2)
        RESULTS["errors"].append(msg)
        return None


def bench(fn) -> float:
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


# --------------------------------------------------------------------------------------------
# cases: the inputs of launch.forward


# in the order a cut budget (BUDGET) should keep: the scalar decay, GLA, then the regressions to watch
CASES = {
    "simple gla d128": dict(H=16, Hqk=16, Dk=128, Dv=128, decay="scalar", feature=IDENTITY,
                            peers=("chunk_simple_gla",)),
    # per-channel decay (GLA): the tl forward (kernels_tl, sub-chunks of 16) and its gathered diagonal (plan
    # diag=2) against FLA's chunk_gla, first timed in session 28
    "gla d128": dict(H=16, Hqk=16, Dk=128, Dv=128, decay="channel", feature=IDENTITY, peers=("chunk_gla",)),
    # (FLA's chunk_linear_attn 0.972 ms and fused_chunk_based 2.932 in run 9 of session 27: left out for the budget)
    "linear d128": dict(H=16, Hqk=16, Dk=128, Dv=128, decay=None, feature=IDENTITY, peers=()),
    "based d16 v64": dict(H=16, Hqk=16, Dk=16, Dv=64, decay=None, feature=BASED, peers=("parallel_based",)),
    "mamba2 2.7B shape": dict(H=80, Hqk=1, Dk=128, Dv=64, decay="scalar", feature=IDENTITY, mamba=True,
                              peers=("chunk_simple_gla",)),
    "simple gla d64 v128": dict(H=16, Hqk=16, Dk=64, Dv=128, decay="scalar", feature=IDENTITY,
                                peers=(), gluon_override=True),  # FLA's d64 compile: left out for the budget
    "linear d64 v128": dict(H=16, Hqk=16, Dk=64, Dv=128, decay=None, feature=IDENTITY, peers=(),
                            gluon_override=True),
}


def shape(smoke=SMOKE):
    return (1, 64) if smoke else (16, 4096)


def make(case: str, B: int, N: int, seed: int = 0) -> dict:
    """launch.forward's inputs for a case (Mamba-2: q = C, k = B, v = x, g = dt A, beta = dt, D, z)."""
    c = CASES[case]
    H, Hqk, Dk, Dv = c["H"], c["Hqk"], c["Dk"], c["Dv"]
    if SMOKE:
        H, Hqk = min(H, 4), min(Hqk, 4)
    torch.manual_seed(seed)
    bf = torch.bfloat16
    t = dict(q=torch.randn(B, N, Hqk, Dk, device=DEV, dtype=bf), k=torch.randn(B, N, Hqk, Dk, device=DEV, dtype=bf),
             v=torch.randn(B, N, H, Dv, device=DEV, dtype=bf), g=None, beta=None, d_skip=None, z=None,
             scale=Dk ** -0.5, feature=c["feature"])
    if c.get("mamba"):
        t["q"] *= Dk ** -0.5
        t["k"] *= Dk ** -0.5
        dt = torch.nn.functional.softplus(torch.randn(B, N, H, device=DEV) - 2)
        A = -torch.rand(H, device=DEV) * 8 - 0.5
        t.update(g=dt * A, beta=dt, d_skip=torch.randn(H, device=DEV)[:, None].expand(H, Dv), scale=1.0,
                 z=torch.randn(B, N, H, Dv, device=DEV, dtype=bf), dt=dt, A=A)
    elif c["decay"] == "scalar":
        t["g"] = -torch.rand(B, N, H, device=DEV) * 0.3
    elif c["decay"] == "channel":
        t["g"] = -torch.rand(B, N, H, Dk, device=DEV) * 0.3
    return t


def run_forward(t: dict, transposed: bool = False, **over):
    """o of launch.forward at the default plan or these overrides; transposed: the same arguments into
    kernels_forward.la_fwd_transposed_kernel (the state held as S^T)."""
    p = tl_plan(t["q"], t["v"], t["g"], t["feature"], over.pop("chunk", None), **over)
    if not transposed:
        return launch.forward(p, t["q"], t["k"], t["v"], t["g"], t["beta"], t["d_skip"], t["z"], None, t["scale"],
                              t["feature"], final_state=False, keep_linear=False)[0]
    from tilecore.ops.linear_attention.kernels_forward import la_fwd_transposed_kernel

    q, k, v, z = (None if x is None else (x.float() if p.config["upcast"] else x) for x in
                  (t["q"], t["k"], t["v"], t["z"]))
    o = torch.empty_like(v)
    _, grid, args, kw = launch.forward_call(p, q, k, v, t["g"], t["beta"], t["d_skip"], z, None, o, None, None,
                                            t["scale"], t["feature"])
    la_fwd_transposed_kernel[grid](*args, **kw)
    return o.to(t["v"].dtype)


def default_call(case: str, t: dict):
    """The public op as a user calls it."""
    if CASES[case].get("mamba"):
        return lambda: mamba2_chunk_scan(t["v"], t["dt"], t["A"], t["k"], t["q"], D=t["d_skip"][:, 0], z=t["z"])
    fm = "based" if t["feature"] == BASED else None
    return lambda: linear_attention(t["q"], t["k"], t["v"], feature_map=fm, decay=t["g"])


def nbytes(case: str, t: dict) -> int:
    size = lambda x: x.numel() * x.element_size()  # noqa: E731
    n = size(t["q"]) + size(t["k"]) + 2 * size(t["v"])
    if t["g"] is not None:
        n += size(t["g"])
    if CASES[case].get("mamba"):
        n += size(t["z"])  # g and beta are dt's: dt once
    return n


def copy_ms(n: int) -> float:
    src = torch.empty(n // 2, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    return bench(lambda: dst.copy_(src))


# --------------------------------------------------------------------------------------------
# peers


def fla_fn(name):
    if name == "chunk_simple_gla":
        from fla.ops.simple_gla import chunk_simple_gla as f
    elif name == "chunk_linear_attn":
        from fla.ops.linear_attn import chunk_linear_attn as f
    elif name == "parallel_based":
        from fla.ops.based import parallel_based as f
    elif name == "fused_chunk_based":
        from fla.ops.based import fused_chunk_based as f
    elif name == "chunk_gla":
        from fla.ops.gla import chunk_gla as f
    else:
        raise ValueError(name)
    return f


def fla_call(name: str, case: str, t: dict):
    f = fla_fn(name)
    q, k, v, g = t["q"], t["k"], t["v"], t["g"]
    if CASES[case].get("mamba"):  # the same SSD math on FLA's layout: q/k per v head, dt folded into k
        H = v.shape[2]
        q = q.expand(-1, -1, H, -1).contiguous()
        k = (k.float() * t["beta"][..., None]).to(k.dtype)
        return lambda: f(q, k, v, g, scale=1.0)
    if name in ("chunk_simple_gla", "chunk_gla"):
        return lambda: f(q, k, v, g, scale=t["scale"])
    if name == "chunk_linear_attn":
        return lambda: f(q, k, v, scale=t["scale"], normalize=False)
    return lambda: f(q, k, v, scale=t["scale"], use_norm=False)


# --------------------------------------------------------------------------------------------
# the sweep's points


def sweep_points(case: str) -> list:
    """Points of the sweep (launch.forward's plan overrides). Runs 1-3 (session 26) swept the tl kernels'
    blocks (4 warps, BV 128 at Dk 128, Based BV 32) and the transposed-state kernel; run 4 times the Gluon
    forward (gluon_forward.py: fwd_gluon, gluon_stages) beside the tl defaults' nearest rivals."""
    gluon = [dict(fwd_gluon=True, gluon_stages=st) for st in (2, 3)]
    if case == "linear d128":
        pts = gluon + [dict(chunk=64, BV=128, num_warps=8, num_stages=3, transposed=True),
                       dict(chunk=64, BV=64, num_warps=4, num_stages=3)]
    elif case == "simple gla d128":
        pts = gluon + [dict(chunk=32, BV=128, num_warps=4, num_stages=2, transposed=True)]
    elif case == "based d16 v64":
        pts = [dict(chunk=32, BV=32, num_warps=4, num_stages=3)]
    else:
        pts = gluon + [dict(chunk=32, BV=64, num_warps=4, num_stages=4, transposed=True),
                       dict(chunk=32, BV=64, num_warps=4, num_stages=4)]
    if SMOKE:
        pts = [p for p in pts if not p.get("fwd_gluon")][:2]
    return pts


PROBE_POINTS = [(32, 128, 4, 2)]


def probe_run(t, mode, bt, bv, w, s):
    from experiments.linear_attention.probe_fwd_kernels import probe_forward

    s0 = t.setdefault("s0", torch.randn(t["q"].shape[-1], t["v"].shape[-1], device=DEV) * 0.01)
    return probe_forward(t["q"], t["k"], t["v"], t["g"], s0, mode, bt, bv, w, s)


# --------------------------------------------------------------------------------------------
# warm: compile and check every kernel in a pool of processes first, one task a fresh process (a kernel
# that faults poisons its CUDA context: run 1 lost its sweep to one), at the full shape; the Triton
# cache is on disk, so the timing process then only loads them and times only the points that passed


_WORKER_INPUTS: dict = {}


def _worker(task):
    t0 = time.time()
    try:
        kind, case = task[0], task[1]
        if kind == "gluoncheck":  # the row comes back to the main process (no second run there)
            return task, None, None, time.time() - t0, check_gluon(*GLUON_CHECKS[case])
        if kind == "basedcheck":
            return task, None, None, time.time() - t0, check_based(*BASED_CHECKS[case])
        if case not in _WORKER_INPUTS:
            _WORKER_INPUTS[case] = make(case, *shape())
        t = _WORKER_INPUTS[case]
        rel = None
        if kind == "tl":
            want = run_forward(t).float()
            got = run_forward(t, **task[2])
            rel = accuracy.rel_rms(got.float(), want)
            if torch.isnan(got).any():
                rel = float("nan")
        elif kind == "default":
            default_call(case, t)()
        elif kind == "fla":
            fla_call(task[2], case, t)()
        elif kind == "extra":
            extra_calls(case, t)[task[2]]()
        elif kind == "probe":
            probe_run(t, *task[2])
        torch.cuda.synchronize()
        return task, None, rel, time.time() - t0, None
    except Exception as err:  # noqa: BLE001
        return task, f"{type(err).__name__}: {err}"[:300], None, time.time() - t0, None


PASSED: set = set()
CHECKED: set = set()  # the check tasks whose rows the warm phase brought back


# FLA's chunk_gla outran the 55 s warm phase in run 7 of session 28 (autotuned compiles): it compiles in a process
# of its own from the start and times itself once the main process has timed every case (a file says when),
# so it runs alone on the GPU; whatever it has by LATE_DEADLINE s goes in the GLA row
LATE_PEERS = {("gla d128", "chunk_gla")}
LATE_DEADLINE = 88.0
LATE: dict = {}


def _late_peer(case: str, peer: str, go: str):
    t0 = time.time()
    try:
        t = make(case, *shape())
        fn = fla_call(peer, case, t)
        fn()
        torch.cuda.synchronize()
        ready = time.time() - t0
        while not os.path.exists(go) and time.time() - t0 < 200:
            time.sleep(0.02)
        return dict(ms=bench(fn), compile_s=round(ready, 1))
    except Exception as err:  # noqa: BLE001
        return dict(error=f"{type(err).__name__}: {err}"[:300])


def start_late(cases):
    import concurrent.futures as cf
    import multiprocessing as mp

    go = str(OUT / ".late_go")
    if os.path.exists(go):
        os.remove(go)
    for case, peer in LATE_PEERS:
        if case in cases and not SMOKE:
            pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"))
            LATE[(case, peer)] = (pool, pool.submit(_late_peer, case, peer, go), go)


def finish_late():
    import concurrent.futures as cf

    for (case, peer), (pool, fut, go) in LATE.items():
        Path(go).parent.mkdir(parents=True, exist_ok=True)
        Path(go).touch()
        try:
            res = fut.result(timeout=max(1.0, START + LATE_DEADLINE - time.time()))
        except cf.TimeoutError:
            res = dict(error=f"not ready by {LATE_DEADLINE:.0f} s")
        except Exception as err:  # noqa: BLE001
            res = dict(error=f"{type(err).__name__}: {err}"[:300])
        for row in RESULTS["time"]:
            if row["case"] == case:
                if "ms" in res:
                    row[f"{peer}_ms"] = res["ms"]
                    row[f"{peer}_compile_s"] = res["compile_s"]
                else:
                    row[f"{peer}_error"] = res["error"]
        print("late peer", case, peer, res, flush=True)
        Path(go).unlink(missing_ok=True)
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)


def warm(workers: int, cases):
    # FLA's chunk_simple_gla first (its autotuned compiles took past run 7's 55 s warm budget behind the
    # rest), then the new kernels (workers take tasks in order; one past the warm budget is skipped after)
    tasks = [("fla", c, p) for c in cases for p in CASES[c]["peers"] if p == "chunk_simple_gla"]
    tasks += [("basedcheck", i) for i in range(len(BASED_CHECKS))]
    tasks += [("gluoncheck", i) for i in reversed(range(len(GLUON_CHECKS)))]
    # one task a variant (a case's compiles in parallel: one slow compile costs only its own row)
    tasks += [("extra", c, n) for c in cases for n in extra_calls(c, None, names_only=True)
              if n not in ("torch_prep", "kernel_only")]  # (kernel_only: gluon_direct's compile)
    tasks += [("fla", c, p) for c in cases for p in CASES[c]["peers"]
              if p != "chunk_simple_gla" and (c, p) not in LATE_PEERS]
    # a default the extras do not compile already (the Gluon cases' gluon_direct / gluon is their default)
    tasks += [("default", c) for c in cases if CASES[c]["feature"] == BASED or CASES[c]["decay"] == "channel"
              or not extra_calls(c, None, names_only=True)]
    if not QUICK:
        if "simple gla d128" in cases:
            tasks += [("probe", "simple gla d128", (m, *pt)) for pt in PROBE_POINTS for m in range(4)]
        tasks += [("tl", c, p) for c in cases for p in sweep_points(c)]
    import concurrent.futures as cf
    import multiprocessing as mp

    pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), max_tasks_per_child=1)
    futures = [pool.submit(_worker, task) for task in tasks]
    deadline = START + WARM_BUDGET  # a kernel that never returns (a barrier never completed) is left behind
    hung = False
    for task, fut in zip(tasks, futures):
        try:
            task, err, rel, secs, row = fut.result(timeout=max(1.0, deadline - time.time()))
        except cf.TimeoutError:
            hung = True
            err, rel, secs, row = f"no result within the warm phase's {WARM_BUDGET:.0f} s (hung?)", None, 0.0, None
        except Exception as exc:  # noqa: BLE001 (a worker that died)
            err, rel, secs, row = f"{type(exc).__name__}: {exc}"[:300], None, 0.0, None
        if row is not None:
            RESULTS["check"].append(row)
            CHECKED.add(str(task))
        RESULTS["warm"].append(dict(task=str(task), error=err, rel_vs_default=rel, s=round(secs, 1)))
        if err or (rel is not None and not rel < 2e-2):
            print("warm", task, err, rel, flush=True)
        else:
            PASSED.add(str(task))
    if hung:
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
    pool.shutdown(wait=not hung, cancel_futures=True)
    print(f"warm: {len(tasks)} tasks in {elapsed():.0f} s", flush=True)


def passed(task) -> bool:
    """Whether the warm phase ran this task without a fault (always, where there was no warm phase)."""
    return not RESULTS["warm"] or str(task) in PASSED


# --------------------------------------------------------------------------------------------
# phases


def reference_floor(case: str, over: dict | None) -> float:
    """Error of the forward (default plan, or these overrides) over the rounding floor against the float64
    recurrence, at B1 N1000 (smoke: N 40)."""
    N = 40 if SMOKE else 1000
    t = make(case, 1, N, seed=3)
    if CASES[case].get("mamba"):
        o = run_forward(t, **(over or {}))
        r = [x.double() for x in (t["v"], t["dt"], t["A"], t["k"], t["q"])]
        ref, _ = mamba2_reference(*r, D=t["d_skip"][:, 0].double(), z=t["z"].double())
    else:
        o = run_forward(t, **(over or {}))
        fm = "based" if t["feature"] == BASED else None
        ref, _ = linear_attention_reference(t["q"].double(), t["k"].double(), t["v"].double(), feature_map=fm,
                                            decay=None if t["g"] is None else t["g"].double())
    return round(accuracy.error_over_floor(o, ref), 3)


def check_gluon(name: str, B: int, N: int, Hqk: int, H: int, Dk: int, Dv: int, decay: bool, mamba: bool,
                stages: int = 2, strength: str = "mild", dtype: str = "bf16"):
    """The Gluon forward (gluon_forward.la_fwd_gluon_kernel) into NaN-filled o and final states, with
    initial states, against the float64 recurrence: o's error over the rounding floor, the states'
    relative error, every element written. strength (scalar decay): "mild" (log decays in [-0.3, 0] and a
    reset), "strong" ([-4, -1]), "tiny" ([-1e-4, 0])."""
    from tilecore.ops.linear_attention import gluon_forward as gf

    torch.manual_seed(5)
    bf = torch.bfloat16 if dtype == "bf16" else torch.float16
    sc = Dk ** -0.5 if mamba else 1.0
    q = (torch.randn(B, N, Hqk, Dk, device=DEV) * sc).to(bf)
    k = (torch.randn(B, N, Hqk, Dk, device=DEV) * sc).to(bf)
    v = torch.randn(B, N, H, Dv, device=DEV, dtype=bf)
    g = beta = d_skip = z = None
    if mamba:
        dt = torch.nn.functional.softplus(torch.randn(B, N, H, device=DEV) - 2)
        A = -torch.rand(H, device=DEV) * 8 - 0.5
        g, beta, z = dt * A, dt, torch.randn(B, N, H, Dv, device=DEV, dtype=bf)
        D = torch.randn(H, device=DEV)
        d_skip = D[:, None].expand(H, Dv).contiguous()
    elif decay and strength == "strong":
        g = -torch.rand(B, N, H, device=DEV) * 3 - 1
    elif decay and strength == "tiny":
        g = -torch.rand(B, N, H, device=DEV) * 1e-4
    elif decay:
        g = -torch.rand(B, N, H, device=DEV) * 0.3
        g[:, N // 3] = float("-inf")  # a reset
    h0 = torch.randn(B, H, Dk, Dv, device=DEV)
    scale = 1.0 if mamba else Dk ** -0.5
    row = dict(case=name, N=N, fits=gf.fits(q, k, v, g, 0, beta, z))
    o = torch.full_like(v, float("nan"))
    ht = torch.full_like(h0, float("nan"))
    G = beta_h = None
    if g is not None:  # the forward's one-pass prep (kernels_forward.chunk_heads_kernel) against its torch forms
        G, beta_h = gf.chunk_heads_prep(g, beta, gf.BT_GLUON)
        G_torch = gf.chunk_cumulative_heads(g, gf.BT_GLUON)
        row["prep_max_diff"] = float((G - G_torch).abs().max())
        if beta is not None:
            row["prep_beta_equal"] = bool(torch.equal(beta_h, gf.chunk_heads(beta, gf.BT_GLUON)))
    grid, args, warps = gf.launch_args(q, k, v, G, beta_h, d_skip, z, h0, o, ht, scale, stages)
    gf.la_fwd_gluon_kernel[grid](**args, num_warps=warps)
    torch.cuda.synchronize()
    row["all_written"] = not bool(torch.isnan(o).any() or torch.isnan(ht).any())
    if mamba:
        ref, ref_state = mamba2_reference(v.double(), beta.double(), A.double(), k.double(), q.double(), D=D.double(),
                                          z=z.double(), initial_states=h0.transpose(-1, -2).double())
        ref_state = ref_state.transpose(-1, -2)
    else:
        ref, ref_state = linear_attention_reference(q.double(), k.double(), v.double(), scale=scale,
                                                    decay=None if g is None else g.double(), initial_state=h0.double())
    row["out_floor"] = round(accuracy.error_over_floor(o.nan_to_num(), ref), 3)
    row["state_rel"] = accuracy.rel_rms(ht.nan_to_num(), ref_state)
    # the tl forward on the same inputs, for comparison
    p = tl_plan(q, v, g, IDENTITY)
    o_tl, ht_tl, _ = launch.forward(p, q, k, v, g, beta, d_skip, z, h0, scale, IDENTITY, final_state=True,
                                    keep_linear=False)
    row["tl_out_floor"] = round(accuracy.error_over_floor(o_tl, ref), 3)
    row["tl_state_rel"] = accuracy.rel_rms(ht_tl, ref_state)
    o2, _ = gf.forward(q, k, v, g, beta, d_skip, z, h0, scale, False, stages)  # (its host side: the same o)
    row["forward_matches"] = bool(torch.equal(o2, o))
    print("check gluon", row, flush=True)
    RESULTS["check"].append(row)
    return row


# (name, B, N, Hqk, H, Dk, Dv, decay, mamba[, stages, strength, dtype]): the shipped kernel at the edges (a reset,
# strong and tiny decays, one token, one tile, fp16, partial chunks). Session 37 removed the kernel's switches and
# their rows (Z_STAGE, G_STAGE, EARLY_WV off; notes/linear_attention decisions 143-147)
GLUON_CHECKS = (("gluon linear d128 h0", 2, 1000, 4, 4, 128, 128, False, False),
                ("gluon scalar decay d128 h0, a reset, N 4097", 1, 4097, 2, 2, 128, 128, True, False),
                ("gluon scalar decay d64 v128 strong decays N 77", 2, 77, 2, 2, 64, 128, True, False, 2, "strong"),
                ("gluon scalar decay d128 tiny decays N 300", 2, 300, 2, 2, 128, 128, True, False, 2, "tiny"),
                ("gluon scalar decay d128 B1 H1 N 1 (one token, one tile)", 1, 1, 1, 1, 128, 128, True, False),
                ("gluon scalar decay d128 fp16 N 1000 h0", 2, 1000, 3, 3, 128, 128, True, False, 2, "mild", "fp16"),
                ("gluon mamba2 p64 s128 g1 (beta, D, z) h0", 2, 1000, 1, 8, 128, 64, True, True),
                ("gluon mamba2 N 33", 1, 33, 1, 4, 128, 64, True, True))


def check_based(name: str, B: int, N: int, H: int, Dv: int, with_h0: bool, dtype: str = "bf16", stages: int = 3):
    """Based's Gluon forward (gluon_based.based_fwd_gluon_kernel) into NaN-filled o and final states (the
    kernel's rows), with or without an initial state, against the float64 recurrence; beside the tl kernel."""
    from tilecore.ops.linear_attention import gluon_based as gb

    torch.manual_seed(7)
    dt = torch.bfloat16 if dtype == "bf16" else torch.float16
    q = torch.randn(B, N, H, gb.DK, device=DEV).to(dt)
    k = torch.randn(B, N, H, gb.DK, device=DEV).to(dt)
    v = torch.randn(B, N, H, Dv, device=DEV).to(dt)
    h0 = torch.randn(B, H, 1 + gb.DK + gb.DK ** 2, Dv, device=DEV) * 0.1 if with_h0 else None
    scale = gb.DK ** -0.5
    row = dict(case=name, N=N, fits=gb.fits(q, k, v, None), stages=stages)
    o = torch.full_like(v, float("nan"))
    xt = torch.full((B, H, gb.FEATURES, Dv), float("nan"), device=DEV)
    x0 = gb.compress(h0) if h0 is not None else None
    grid, args, warps = gb.launch_args(q, k, v, x0, o, xt, scale, stages)
    gb.based_fwd_gluon_kernel[grid](**args, num_warps=warps)
    torch.cuda.synchronize()
    row["all_written"] = not bool(torch.isnan(o).any() or torch.isnan(xt).any())
    ht = gb.expand(xt) + (h0 - gb.expand(x0) if h0 is not None else 0.0)
    ref, ref_state = linear_attention_reference(q.double(), k.double(), v.double(), feature_map="based", scale=scale,
                                                initial_state=None if h0 is None else h0.double())
    row["out_floor"] = round(accuracy.error_over_floor(o.nan_to_num(), ref), 3)
    row["state_rel"] = accuracy.rel_rms(ht.nan_to_num(), ref_state)
    o2, ht2 = gb.forward(q, k, v, h0, scale, True, stages)  # the host path (compress, expand) as the op calls it
    row["forward_matches"] = bool(torch.equal(o2, o)) and accuracy.rel_rms(ht2, ht) < 1e-6
    p = tl_plan(q, v, None, BASED)
    o_tl, ht_tl, _ = launch.forward(p, q, k, v, None, None, None, None, h0, scale, BASED, final_state=True,
                                    keep_linear=False)
    row["tl_out_floor"] = round(accuracy.error_over_floor(o_tl, ref), 3)
    row["tl_state_rel"] = accuracy.rel_rms(ht_tl, ref_state)
    print("check based", row, flush=True)
    RESULTS["check"].append(row)
    return row


BASED_CHECKS = (("gluon based d16 v64 h0 N 1000", 2, 1000, 4, 64, True),)  # run 9 checked v128 N 77 and fp16


def phase_gluon_check():
    for i, args in enumerate(GLUON_CHECKS):
        if str(("gluoncheck", i)) in CHECKED:
            continue
        if not passed(("gluoncheck", i)):
            RESULTS["errors"].append(f"check {args[0]}: failed in the warm phase")
            continue
        attempt(f"check {args[0]}", lambda: check_gluon(*args))
    for i, args in enumerate(BASED_CHECKS):
        if str(("basedcheck", i)) in CHECKED:
            continue
        if not passed(("basedcheck", i)):
            RESULTS["errors"].append(f"check {args[0]}: failed in the warm phase")
            continue
        attempt(f"check {args[0]}", lambda: check_based(*args))


def extra_calls(case: str, t: dict | None, names_only: bool = False) -> dict:
    """The case's timed variants beside the default (name -> call): Based on its Gluon kernel
    (gluon_based.forward), the Gluon forward at Dk 64 (plan override fwd_gluon), Mamba-2's pieces (the
    Gluon kernel alone on prepared arguments; the torch side before it: dt A and the chunk sums)."""
    c = CASES[case]
    names = []
    # (Based's Gluon kernel and the no-decay Gluon forward are the defaults: their default rows time them)
    if c["feature"] == BASED:
        names = []
    elif c["decay"] == "channel":
        names = ["gla_diag2"]
    elif c.get("gluon_override"):
        names = ["gluon"] if c["decay"] else []
    elif c.get("mamba"):
        names = ["kernel_only", "torch_prep", "gluon_direct"]
    elif c["decay"]:
        names = ["gluon_direct"]
    else:
        names = []
    if names_only or not names:
        return dict.fromkeys(names)
    if c["decay"] == "channel":  # the gathered diagonal (decision 18: an override, checked in session 27's run 2)
        return {"gla_diag2": lambda: run_forward(t, diag=2)}
    from tilecore.ops.linear_attention import gluon_based as gb
    from tilecore.ops.linear_attention import gluon_forward as gf

    if c["feature"] == BASED:
        if gb.fits(t["q"], t["k"], t["v"], None) is not None:
            raise ValueError(f"gluon_based does not take the case: {gb.fits(t['q'], t['k'], t['v'], None)}")
        return {"gluon_based": lambda: gb.forward(t["q"], t["k"], t["v"], None, t["scale"], False)[0]}
    def direct(stages=2):
        return lambda: gf.forward(t["q"], t["k"], t["v"], t["g"], t["beta"], t["d_skip"], t["z"], None, t["scale"],
                                  False, stages)[0]
    variants = {"gluon_direct": direct()}  # (the switches' rows: removed with the switches in session 37)
    if c.get("gluon_override"):
        calls = {"gluon": lambda: run_forward(t, fwd_gluon=True, gluon_stages=2)}  # the default (GLUON_CHECKED)
        calls.update({n: variants[n] for n in names if n in variants})
        return calls
    if not c.get("mamba"):
        return {n: variants[n] for n in names}
    # Mamba-2: what mamba2_chunk_scan runs before the kernel (dt in float32, g = dt A, D expanded; in
    # gluon_forward.forward the chunk sums of g and D's float copy), and the kernel alone
    v = t["v"]
    o = torch.empty_like(v)

    def prep():
        dt = t["dt"].float()
        g = dt * t["A"].float()
        G, beta = gf.chunk_heads_prep(g, dt, gf.BT_GLUON)
        return G, beta, t["d_skip"].float().contiguous()
    G, beta, d_skip = prep()
    grid, args, warps = gf.launch_args(t["q"], t["k"], v, G, beta, d_skip, t["z"], None, o, None, 1.0, 2)
    return {"kernel_only": lambda: gf.la_fwd_gluon_kernel[grid](**args, num_warps=warps), "torch_prep": prep,
            **{n: variants[n] for n in names if n in variants}}


def phase_time(case: str, t: dict):
    row = dict(case=case, shape=tuple(t["v"].shape), bytes=nbytes(case, t))
    if not SMOKE:
        row["copy_ms"] = copy_ms(row["bytes"])
        row["default_ms"] = bench(default_call(case, t))
    else:
        default_call(case, t)()
    row["default_floor"] = attempt(f"check {case}", lambda: reference_floor(case, None))
    if extra_calls(case, None, names_only=True) and not SMOKE:
        want = default_call(case, t)().float()
        for name, fn in (attempt(f"extra {case}", lambda: extra_calls(case, t)) or {}).items():
            if name not in ("torch_prep", "kernel_only") and not passed(("extra", case, name)):
                row[f"{name}_error"] = "failed in the warm phase"
                continue
            out = attempt(f"run {case} {name}", fn)
            if isinstance(out, torch.Tensor) and out.shape == want.shape:
                row[f"{name}_rel_vs_default"] = accuracy.rel_rms(out.float(), want)
            row[f"{name}_ms"] = attempt(f"time {case} {name}", lambda: bench(fn))
    for peer in CASES[case]["peers"]:
        if (case, peer) in LATE_PEERS:
            continue  # finish_late
        if not passed(("fla", case, peer)):
            row[f"{peer}_error"] = "failed in the warm phase"
            continue
        try:
            fn = fla_call(peer, case, t)
            row[f"{peer}_ms"] = bench(fn) if not SMOKE else None
        except Exception as err:  # noqa: BLE001
            row[f"{peer}_error"] = f"{type(err).__name__}: {err}"[:300]
            print(f"peer {peer} on {case}: {row[f'{peer}_error']}", flush=True)
    print("time", row, flush=True)
    RESULTS["time"].append(row)
    return row


def phase_sweep(case: str, t: dict, base_row: dict):
    want = run_forward(t).float()
    best = None
    for over in sweep_points(case):
        if not passed(("tl", case, over)):
            RESULTS["sweep"].append(dict(case=case, **over, error="failed in the warm phase"))
            continue

        def one():
            o = run_forward(t, **over)
            rel = accuracy.rel_rms(o.float(), want)
            row = dict(case=case, **over, rel_vs_default=rel, nan=bool(torch.isnan(o).any()))
            if over.get("fwd_gluon"):
                from tilecore.ops.linear_attention.gluon_forward import fits

                row["gluon_fits"] = fits(t["q"], t["k"], t["v"], t["g"], t["feature"])  # None: the Gluon kernel ran
            if not SMOKE:
                row["ms"] = bench(lambda: run_forward(t, **over))
            RESULTS["sweep"].append(row)
            print("sweep", row, flush=True)
            return row
        row = attempt(f"sweep {case} {over}", one)
        if row and not row["nan"] and row["rel_vs_default"] < 2e-2:
            if best is None or row.get("ms", 0) < best.get("ms", 0):
                best = row
            key = ("best_gluon_ms" if over.get("fwd_gluon") else
                   "best_transposed_ms" if over.get("transposed") else "best_standard_ms")
            if row.get("ms") and row["ms"] < base_row.get(key, float("inf")):
                base_row[key] = row["ms"]
    if best is not None:
        over = {k: best[k] for k in ("chunk", "BV", "num_warps", "num_stages", "transposed", "fwd_gluon",
                                      "gluon_stages") if k in best}
        best["ref_floor"] = attempt(f"check best {case}", lambda: reference_floor(case, dict(over)))
        base_row["best"] = over
        base_row["best_ms"] = best.get("ms")
        base_row["best_floor"] = best["ref_floor"]


def phase_probe(t: dict):
    for pt in PROBE_POINTS:
        row = dict(BT=pt[0], BV=pt[1], num_warps=pt[2], num_stages=pt[3])
        for mode in range(4):
            if not passed(("probe", "simple gla d128", (mode, *pt))):
                continue

            def one():
                probe_run(t, mode, *pt)
                return None if SMOKE else bench(lambda: probe_run(t, mode, *pt))
            row[f"mode{mode}_ms"] = attempt(f"probe {mode} {pt}", one)
        if not SMOKE and passed(("tl", "simple gla d128", dict(chunk=pt[0], BV=pt[1], num_warps=pt[2],
                                                                 num_stages=pt[3], transposed=False))):
            row["tl_ms"] = attempt("probe tl", lambda: bench(lambda: run_forward(
                t, chunk=pt[0], BV=pt[1], num_warps=pt[2], num_stages=pt[3], transposed=False)))
        print("probe", row, flush=True)
        RESULTS["probe"].append(row)


def table() -> str:
    lines = ["", "case | copy = HBM bound ms | default ms (% bound) | best sweep ms (% bound) [chunk BV warps stages "
             "transposed gluon, best tl / transposed / gluon] "
             "| err/floor default, best | FLA ms: x of best (quick: of default); extras (% bound), FLA / extra"]
    for r in RESULTS["time"]:
        bound = r.get("copy_ms")
        pct = lambda ms: f"{ms:.3f} ({100 * bound / ms:.0f}%)" if ms and bound else "-"  # noqa: E731
        best = dict(r.get("best", {}))
        ours = r.get("best_ms") or r.get("default_ms")  # quick runs have no sweep: the default
        peers = "; ".join(f"{p} {r[p + '_ms']:.3f}: {r[p + '_ms'] / ours:.2f}x"
                          for p in CASES[r["case"]]["peers"] if r.get(p + "_ms") and ours)
        best["tl / transposed / gluon ms"] = " / ".join(f"{r.get(k, 0):.3f}" for k in (
            "best_standard_ms", "best_transposed_ms", "best_gluon_ms"))
        extra_keys = [k for k in r if k.endswith("_ms") and k.split("_")[0] in ("gluon", "kernel", "torch", "gla")
                      and r.get(k)]
        extras = "; ".join(f"{k[:-3]} {pct(r[k])}" for k in extra_keys)
        if extras:
            peers = (peers + "; " if peers else "") + extras
            for p in CASES[r["case"]]["peers"]:
                for k in extra_keys:
                    if r.get(p + "_ms") and k.split("_")[0] in ("gluon", "gla"):
                        peers += f"; {p} / {k[:-3]}: {r[p + '_ms'] / r[k]:.2f}x"
        lines.append(" | ".join([r["case"], f"{bound:.3f}" if bound else "-", pct(r.get("default_ms")),
                                 pct(r.get("best_ms")) + f" {list(best.values())}",
                                 f"{r.get('default_floor')}, {r.get('best_floor')}", peers or "-"]))
    if RESULTS["check"]:
        lines += ["", "check (bf16, float64 reference) | N | fits | all written | out/floor | state rel | tl out/floor "
                  "| tl state rel | forward() = kernel (Based, G_STAGE) | G prep vs torch"]
        for r in RESULTS["check"]:
            lines.append(" | ".join(str(r.get(k, "-")) for k in ("case", "N", "fits", "all_written", "out_floor",
                                                                  "state_rel", "tl_out_floor", "tl_state_rel",
                                                                  "forward_matches", "prep_max_diff")))
    if RESULTS["probe"]:
        lines += ["", "probe (simple gla d128) BT BV warps stages | loads only | + intra | + inter | all | tl kernel"]
        for r in RESULTS["probe"]:
            cells = [f"{r['BT']} {r['BV']} {r['num_warps']} {r['num_stages']}"]
            cells += [f"{r[k]:.3f}" if r.get(k) else "-" for k in ("mode0_ms", "mode1_ms", "mode2_ms", "mode3_ms",
                                                                     "tl_ms")]
            lines.append(" | ".join(cells))
    if RESULTS["errors"]:
        lines += [""] + [f"ERROR {e}" for e in RESULTS["errors"][:30]]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# --set s30 (session 30, issue 33: Based and Mamba-2 toward 75% of the HBM bound): the candidate variants (checked
# against float64 before they are timed; session 30 also timed the kernels' PROBE bits, each leaving one part of a
# chunk's work out: removed with decisions 133 and 136). Kernel-only launches on prepared arguments (no host
# time), the copy bound of the same bytes and the public op in the same run.

S30_CASES = ("based d16 v64", "mamba2 2.7B shape")
# name -> 0 (the shipped kernel) or a dict of launch_args's keywords (a candidate variant: checked against float64
# in S30_CHECKS)
# run 2 (session 30) timed every probe: the Based features 0.064 ms of 0.202, each MMA group ~0.03; Mamba-2's gate
# and D 0.35 ms of 1.125, the decay exps 0.22, Q K^T + P V 0.26 (no_store was dead code: no final state, so
# nothing is live without o). Run 3: the candidates, and Mamba-2's probes again on its new default (SILU_TANH)
# run 5: Mamba-2 0.903 ms with SILU_TANH (75.9%), ASYNC_UPDATE on top 0.886 (77.4%), EXP2_FMA and FACTORED
# slower; Based SEL_ASYNC 2 + CHAIN 0.1928 (60%, from 57%). Run 6 (the final batch): the shipped defaults
# (Based SEL_ASYNC 2 + CHAIN on), the session-start forms beside them, Mamba-2's ASYNC_UPDATE checked with
# SILU_TANH, the public ops against float64
S30_BASED = {"default": 0}  # (its session-30 candidates and probes: the selection-wgmma features, removed: decision 133)
S30_MAMBA = {"default": 0}  # (session_start, SILU_TANH off: removed with the switch in session 37)
S30_TABLES = {"based d16 v64": S30_BASED, "mamba2 2.7B shape": S30_MAMBA}
def check_op_mamba2(N: int = 1000):
    """The public mamba2_chunk_scan (its keyed CUDA path, configs' kernel flags: SILU_TANH on since session 30)
    against the float64 recurrence: y's error over the rounding floor, the final states' relative error."""
    torch.manual_seed(11)
    B, H, P, S = 2, 8, 64, 128
    bf = torch.bfloat16
    x = torch.randn(B, N, H, P, device=DEV, dtype=bf)
    dt = torch.nn.functional.softplus(torch.randn(B, N, H, device=DEV) - 2)
    A = -torch.rand(H, device=DEV) * 8 - 0.5
    Bm = (torch.randn(B, N, 1, S, device=DEV) * S ** -0.5).to(bf)
    Cm = (torch.randn(B, N, 1, S, device=DEV) * S ** -0.5).to(bf)
    D = torch.randn(H, device=DEV)
    z = torch.randn(B, N, H, P, device=DEV, dtype=bf)
    h0 = torch.randn(B, H, P, S, device=DEV)
    y, ht = mamba2_chunk_scan(x, dt, A, Bm, Cm, D=D, z=z, initial_states=h0, return_final_states=True)
    y2, _ = mamba2_chunk_scan(x, dt, A, Bm, Cm, D=D, z=z, initial_states=h0, return_final_states=True)  # keyed again
    ref, ref_state = mamba2_reference(x.double(), dt.double(), A.double(), Bm.double(), Cm.double(), D=D.double(),
                                      z=z.double(), initial_states=h0.double())
    row = dict(case=f"s30 public mamba2_chunk_scan D z h0 N {N}", N=N, all_written=bool(torch.isfinite(y).all()),
               out_floor=round(accuracy.error_over_floor(y, ref), 3), state_rel=accuracy.rel_rms(ht, ref_state),
               second_call_equal=bool(torch.equal(y, y2)))
    print("check op", row, flush=True)
    return row


def check_op_based(N: int = 1000):
    """The public linear_attention(feature_map="based") (its Gluon kernel) with an initial state against the float64
    recurrence."""
    torch.manual_seed(13)
    B, H, Dv, bf = 2, 4, 64, torch.bfloat16
    q = torch.randn(B, N, H, 16, device=DEV).to(bf)
    k = torch.randn(B, N, H, 16, device=DEV).to(bf)
    v = torch.randn(B, N, H, Dv, device=DEV).to(bf)
    h0 = torch.randn(B, H, 1 + 16 + 256, Dv, device=DEV) * 0.1
    o, ht = linear_attention(q, k, v, feature_map="based", initial_state=h0, return_final_state=True)
    ref, ref_state = linear_attention_reference(q.double(), k.double(), v.double(), feature_map="based",
                                                initial_state=h0.double())
    row = dict(case=f"s30 public linear_attention based h0 N {N}", N=N, all_written=bool(torch.isfinite(o).all()),
               out_floor=round(accuracy.error_over_floor(o, ref), 3), state_rel=accuracy.rel_rms(ht, ref_state))
    print("check op", row, flush=True)
    return row


# candidate name -> its float64 check (check_gluon / check_based rows: NaN-poisoned o and states, initial states)
S30_CHECKS = {
    "mamba2 public op h0 N 1000": lambda: check_op_mamba2(1000),
    "based shipped fp16 v128 N 77": lambda: check_based("s30 based shipped fp16 v128 N 77", 1, 77, 2, 128, False,
                                                        "fp16"),
    "based shipped h0 N 4097 (one tile)": lambda: check_based("s30 based shipped h0 N 4097 B1 H2", 1, 4097, 2, 64,
                                                              True),
    "based public op N 1000": lambda: check_op_based(1000),
}


def s30_call(case: str, t: dict, variant):
    """The case's Gluon kernel alone on prepared arguments: the shipped one (``variant`` 0) or with a dict of
    launch_args's keywords over its flags (a call that launches it)."""
    from tilecore.ops.linear_attention import configs
    from tilecore.ops.linear_attention import gluon_based as gb
    from tilecore.ops.linear_attention import gluon_forward as gf

    o = torch.empty_like(t["v"])
    extra = variant if isinstance(variant, dict) else {}
    if case.startswith("based"):  # (the shipped kernel: Based has no candidates left)
        grid, args, warps = gb.launch_args(t["q"], t["k"], t["v"], None, o, None, t["scale"],
                                           configs.GLUON_BASED_STAGES)
        return lambda: gb.based_fwd_gluon_kernel[grid](**args, num_warps=warps)

    G, beta = gf.prepare_decay(t["g"].float(), t["beta"].float())
    grid, args, warps = gf.launch_args(t["q"], t["k"], t["v"], G, beta, t["d_skip"].float().contiguous(), t["z"],
                                       None, o, None, 1.0, 2, **extra)
    return lambda: gf.la_fwd_gluon_kernel[grid](**args, num_warps=warps)


def _s30_worker(task):
    """A warm task: compile and run one (case, variant) once at the full shape (its own process)."""
    t0 = time.time()
    try:
        case, name = task
        if name in S30_CHECKS:
            return task, None, time.time() - t0, S30_CHECKS[name]()
        if case not in _WORKER_INPUTS:
            _WORKER_INPUTS[case] = make(case, *shape())
        s30_call(case, _WORKER_INPUTS[case], S30_TABLES[case][name])()
        if not SMOKE:
            torch.cuda.synchronize()
        return task, None, time.time() - t0, None
    except Exception as err:  # noqa: BLE001
        return task, f"{type(err).__name__}: {err}"[:300], time.time() - t0, None


def s30_warm(workers: int):
    import concurrent.futures as cf
    import multiprocessing as mp

    # the checks first (they decide the switches), then each case's default and candidates, then the probes
    tasks = [("check", n) for n in S30_CHECKS]
    tasks += [(c, n) for c in S30_CASES for n in S30_TABLES[c] if not isinstance(S30_TABLES[c][n], int) or n == "default"]
    tasks += [(c, n) for c in S30_CASES for n in S30_TABLES[c] if isinstance(S30_TABLES[c][n], int) and n != "default"]
    if SMOKE:  # the interpreter cannot run Gluon: the task list only
        print("s30 warm tasks:", tasks, flush=True)
        return
    pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), max_tasks_per_child=1)
    futures = [pool.submit(_s30_worker, task) for task in tasks]
    deadline = START + 45.0
    hung = False
    for task, fut in zip(tasks, futures):
        try:
            task, err, secs, row = fut.result(timeout=max(1.0, deadline - time.time()))
        except cf.TimeoutError:
            hung, err, secs, row = True, "no result within 45 s (hung?)", 0.0, None
        except Exception as exc:  # noqa: BLE001
            err, secs, row = f"{type(exc).__name__}: {exc}"[:300], 0.0, None
        if row is not None:
            RESULTS["check"].append(row)
        RESULTS["warm"].append(dict(task=str(task), error=err, s=round(secs, 1)))
        if err:
            print("warm", task, err, flush=True)
        else:
            PASSED.add(str(task))
    if hung:
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
    pool.shutdown(wait=not hung, cancel_futures=True)
    print(f"s30 warm: {len(tasks)} tasks in {elapsed():.0f} s", flush=True)


def s30_time(case: str):
    B, N = shape()
    t = make(case, B, N)
    row = dict(case=case, shape=tuple(t["v"].shape), bytes=nbytes(case, t))
    if SMOKE:
        default_call(case, t)()
        RESULTS["time"].append(row)
        return
    row["copy_ms"] = copy_ms(row["bytes"])
    for name in S30_TABLES[case]:
        if not passed((case, name)):
            row[f"{name}_error"] = "failed in the warm phase"
            continue
        fn = attempt(f"s30 {case} {name}", lambda: s30_call(case, t, S30_TABLES[case][name]))
        if fn is not None:
            row[f"{name}_ms"] = attempt(f"time {case} {name}", lambda: bench(fn))
    row["op_ms"] = attempt(f"time {case} op", lambda: bench(default_call(case, t)))  # (may compile: last)
    print("time", row, flush=True)
    RESULTS["time"].append(row)
    save()


def s30_table() -> str:
    lines = ["", "s30 (kernel alone; probes leave work out: their time says what binds) | ms | % of the copy bound | "
             "saved vs default ms"]
    for r in RESULTS["time"]:
        bound, base = r.get("copy_ms"), r.get("default_ms")
        lines.append(f"{r['case']}: copy bound {bound and round(bound, 4)} ms, op {r.get('op_ms') and round(r['op_ms'], 4)} ms")
        for name in S30_TABLES[r["case"]]:
            ms = r.get(f"{name}_ms")
            if ms:
                lines.append(f"  {name:18} {ms:.4f} | {100 * bound / ms:5.1f}% | "
                             f"{(base - ms) if base else float('nan'):+.4f}")
            else:
                lines.append(f"  {name:18} - {r.get(name + '_error', '')}")
    if RESULTS["check"]:
        lines += ["", "check (float64) | " + " | ".join(("N", "all_written", "out_floor", "state_rel"))]
        for r in RESULTS["check"]:
            lines.append(" | ".join(str(r.get(k, "-")) for k in ("case", "N", "all_written", "out_floor", "state_rel")))
    if RESULTS["errors"]:
        lines += [""] + [f"ERROR {e}" for e in RESULTS["errors"][:30]]
    return "\n".join(lines)


def main_s30(workers: int) -> int:
    try:
        from experiments.common.meta import meta
        RESULTS["meta"] = meta() if not SMOKE else {"smoke": True}
    except Exception as err:  # noqa: BLE001
        RESULTS["meta"] = {"error": str(err)}
    print(RESULTS["meta"], flush=True)
    s30_warm(workers)
    if not SMOKE:
        for name, fn in S30_CHECKS.items():
            if str(("check", name)) not in PASSED:
                RESULTS["errors"].append(f"check {name}: failed in the warm phase")
    for case in S30_CASES:
        attempt(f"s30 time {case}", lambda: s30_time(case))
        if not SMOKE:
            torch.cuda.empty_cache()
    save()
    print(s30_table())
    print(f"\n{elapsed():.0f} s; JSON: {OUT / 'linear_attention_forward.json'}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--full", action="store_true", help="also the tl sweep and the probes (about 5 minutes)")
    parser.add_argument("--phases", default="warm,gluon,time" if QUICK else "warm,gluon,time,sweep,probe")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--workers", type=int, default=14)
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    parser.add_argument("--set", default=None, choices=("s30",),
                        help="s30: Based and Mamba-2's probes and candidates only (session 30; < 90 s)")
    args = parser.parse_args()
    global OUT
    OUT = Path(args.out)
    if not SMOKE and not torch.cuda.is_available():
        print("no GPU here", file=sys.stderr)
        return 2
    if args.set == "s30":
        return main_s30(max(args.workers, 15))
    try:
        from experiments.common.meta import meta
        RESULTS["meta"] = meta() if not SMOKE else {"smoke": True}
    except Exception as err:  # noqa: BLE001
        RESULTS["meta"] = {"error": str(err)}
    print(RESULTS["meta"], flush=True)
    phases = args.phases.split(",")
    cases = args.cases.split(",")
    if "warm" in phases and not SMOKE:
        start_late(cases)
        attempt("warm", lambda: warm(args.workers, cases))
    if "gluon" in phases and not SMOKE:
        phase_gluon_check()
    B, N = shape()
    for case in cases:
        t = make(case, B, N)
        row = attempt(f"time {case}", lambda: phase_time(case, t)) if "time" in phases else None
        row = row if row is not None else dict(case=case)
        if "sweep" in phases:
            attempt(f"sweep {case}", lambda: phase_sweep(case, t, row))
        if "probe" in phases and case == "simple gla d128":
            attempt("probe", lambda: phase_probe(t))
        save()
        t = row = None  # the case's tensors go before the next case's
        if not SMOKE:
            torch.cuda.empty_cache()
    if LATE:
        finish_late()
    save()
    print(table())
    print(f"\n{elapsed():.0f} s; JSON: {OUT / 'linear_attention_forward.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
