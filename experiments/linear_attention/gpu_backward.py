"""Linear attention's backward and per-channel decay (GLA) on the GPU (issue 33, session 26): correctness
against the float64 recurrence (bf16 and fp16, the gated backward included: FLA refuses its own on Hopper
under triton 3.6), where the backward's time goes (each kernel and the torch passes alone), block
variants, and flash-linear-attention's chunk_linear_attn / chunk_simple_gla / chunk_gla / parallel_based
forward and backward in the same run.

    PYTHONPATH=. python3 experiments/linear_attention/gpu_backward.py [--smoke] [--phases check,pieces,fla,sweep]

--smoke: tiny shapes on the CPU through Triton's interpreter, no timing (imports and shapes checked).
Every case runs in its own try (a failure is printed and the run goes on); the JSON is rewritten after
each case. Prints a table last and writes linear_attention_backward.json to $OUT (default /tmp/out).
Timing: triton.testing.do_bench medians (warm-up 10, 60 ms of repetitions), bf16, B16 H16 N4096.
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
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tilecore import accuracy  # noqa: E402
from tilecore.ops.linear_attention import launch, linear_attention, linear_attention_reference  # noqa: E402
from tilecore.ops.linear_attention.plan import BASED, IDENTITY, tl_plan  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
HBM_GBS = 3000.0
RESULTS: dict = {"check": [], "pieces": [], "fla": [], "sweep": [], "errors": []}
START = float(os.environ.get("LA_BWD_START", time.time()))  # a child keeps its parent's clock
BUDGET = {"check": 45.0, "pieces": 130.0, "fla": 215.0, "sweep": 250.0}  # seconds from the start
OUT = Path(os.environ.get("OUT", "/tmp/out"))
CHILD_FILE = "linear_attention_backward.json"
TASK = [0]  # the task index this process has reached
FIRST_TASK = 0  # a child process starts at --start (the tasks before it ran in an earlier process)
# the timed shape, and the smoke run's
SHAPE = dict(B=16, N=4096, H=16) if not SMOKE else dict(B=1, N=40, H=2)


def attempt(phase, name, fn):
    index = TASK[0]
    TASK[0] += 1
    if index < FIRST_TASK:  # an earlier process ran it
        return None
    print(f"@@TASK {index} {phase} {name}", flush=True)
    if os.environ.get("LA_BWD_CRASH_TASK") == str(index):  # tests the recovery (--smoke)
        os._exit(3)
    if time.time() - START > BUDGET[phase]:
        print(f"{phase} {name}: skipped (time budget)", flush=True)
        RESULTS["errors"].append(f"{phase} {name}: skipped, time budget")
        return None
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 (a probe goes on)
        msg = f"{phase} {name}: {type(err).__name__}: {str(err)[:300]}"
        print("FAILED", msg, flush=True)
        traceback.print_exc(limit=2)
        RESULTS["errors"].append(msg)
        if "CUDA" in str(err) or "illegal" in str(err):  # the context is gone: a fresh process goes on
            save()
            os._exit(3)
        return None
    finally:
        save()


def save():
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / CHILD_FILE).write_text(json.dumps(RESULTS, indent=1, default=str))


def bench(fn) -> float:
    if SMOKE:
        fn()
        return float("nan")
    import triton

    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def make(B, N, H, Dk, Dv, dtype, decay=None, feature_map=None, strong=False, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(B, N, H, Dk, device=DEV, dtype=dtype)
    k = torch.randn(B, N, H, Dk, device=DEV, dtype=dtype)
    v = torch.randn(B, N, H, Dv, device=DEV, dtype=dtype)
    g = None
    lo = 6.0 if strong else 0.3
    if decay == "scalar":
        g = -torch.rand(B, N, H, device=DEV) * lo
    elif decay == "channel":
        g = -torch.rand(B, N, H, Dk, device=DEV) * lo
    elif decay == "channel_extreme":
        g = -torch.rand(B, N, H, Dk, device=DEV) * 1e-6
        g[:, N // 3, :, : Dk // 2] = float("-inf")
        g[:, N // 2] = -1e30
        g[:, 2 * N // 3:] = -60.0
    return q, k, v, g


# --------------------------------------------------------------------------------------------
# check: bf16 / fp16 against float64, forward and every gradient, the gated backward included


def check_case(name, B, N, H, Dk, Dv, dtype, decay=None, feature_map=None, strong=False, chunk=None):
    if SMOKE:
        N, B = min(N, 70), 1
    q, k, v, g = make(B, N, H, Dk, Dv, dtype, decay, feature_map, strong)
    rows = 1 + Dk + Dk * Dk if feature_map == "based" else Dk
    s0 = torch.randn(B, H, rows, Dv, device=DEV)
    leaves = [t.requires_grad_() for t in (q, k, v, g, s0) if t is not None]
    o, ht = linear_attention(q, k, v, feature_map=feature_map, decay=g, initial_state=s0, return_final_state=True,
                             chunk_size=chunk)
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    got = torch.autograd.grad((o.float() * do.float()).sum() + (ht * dht).sum(), leaves)
    r = [t.detach().double().requires_grad_() for t in leaves]
    rg = r[3] if g is not None else None
    ref, ref_state = linear_attention_reference(r[0], r[1], r[2], feature_map=feature_map, decay=rg,
                                                initial_state=r[-1])
    want = torch.autograd.grad((ref * do.double()).sum() + (ref_state * dht.double()).sum(), r)
    row = dict(case=name, dtype=str(dtype).removeprefix("torch."), N=N, chunk=chunk,
               out_floor=round(accuracy.error_over_floor(o.detach(), ref.detach()), 3),
               state_rel=accuracy.rel_rms(ht.detach(), ref_state.detach()),
               finite=bool(torch.isfinite(o).all() and torch.isfinite(ht).all()))
    names = ["dq", "dk", "dv"] + (["dg"] if g is not None else []) + ["ds0"]
    for n_, a, b in zip(names, got, want):
        row["finite"] = row["finite"] and bool(torch.isfinite(a).all())
        if n_ == "dg":  # where the floor clamped: 0; elsewhere relative error
            live = g.detach() >= -100
            row["dg_rel"] = accuracy.rel_rms(a[live], b[live])
        elif n_ == "ds0":
            row["ds0_rel"] = accuracy.rel_rms(a, b)
        else:
            row[n_ + "_floor"] = round(accuracy.error_over_floor(a, b), 3)
    print("check", row, flush=True)
    RESULTS["check"].append(row)


def check_written(name, B, N, H, D, dtype, decay, chunk=None):
    """The forward and both backward kernels into NaN-filled buffers: every element written."""
    if SMOKE:
        N = min(N, 70)
    q, k, v, g = make(B, N, H, D, D, dtype, decay)
    s0 = torch.randn(B, H, D, D, device=DEV)
    p = tl_plan(q, v, g, IDENTITY, chunk)
    nan = float("nan")
    o, o_lin, ht = torch.full_like(v, nan), torch.full(v.shape, nan, device=DEV), torch.full_like(s0, nan)
    kernel, grid, args, kw = launch.forward_call(p, q, k, v, g, None, None, None, s0, o, ht, o_lin, D ** -0.5, IDENTITY)
    kernel[grid](*args, **kw)
    cfg = p.config
    do, dht = torch.randn(v.shape, device=DEV), torch.randn_like(s0)
    dq = torch.full((B, N, H, D), nan, device=DEV)
    dkp = torch.full((cfg["dkv_value_blocks"], B, N, H, D), nan, device=DEV)
    dvp = torch.full((cfg["dkv_key_blocks"], B, N, H, D), nan, device=DEV)
    dh0 = torch.full_like(s0, nan)
    r = torch.full((B, N, H), nan, device=DEV) if launch.strict_diagonal(IDENTITY, g) else None
    for kernel, grid, args, kw in launch.backward_calls(p, do, q, k, v, g, None, s0, dht, dq, dkp, dvp, dh0,
                                                        D ** -0.5, IDENTITY, r):
        kernel[grid](*args, **kw)
    bufs = dict(o=o, o_lin=o_lin, ht=ht, dq=dq, dk_parts=dkp, dv_parts=dvp, dh0=dh0, r=r)
    unwritten = [n_ for n_, t in bufs.items() if t is not None and torch.isnan(t).any()]
    row = dict(case=name, all_written=not unwritten, unwritten=unwritten)
    print("check", row, flush=True)
    RESULTS["check"].append(row)


def check_kernels(D, N, decay):
    """The forward, dQ and dK/dV kernels one at a time, synchronized, each named before it runs (a crash
    names its kernel)."""
    q, k, v, g = make(1, N, 1, D, D, torch.bfloat16, decay)
    s0 = torch.randn(1, 1, D, D, device=DEV)
    p = tl_plan(q, v, g, IDENTITY)
    print("plan", {key: val for key, val in p.config.items() if key not in ("MMA",)}, flush=True)
    o, ht, o_lin = torch.empty_like(v), torch.empty_like(s0), torch.empty(v.shape, device=DEV)
    calls = [("forward", launch.forward_call(p, q, k, v, g, None, None, None, s0, o, ht, o_lin, D ** -0.5,
                                             IDENTITY))]
    cfg = p.config
    do, dht = torch.randn(v.shape, device=DEV), torch.randn_like(s0)
    dq = torch.empty(1, N, 1, D, device=DEV)
    dkp = torch.empty(cfg["dkv_value_blocks"], 1, N, 1, D, device=DEV)
    dvp = torch.empty(cfg["dkv_key_blocks"], 1, N, 1, D, device=DEV)
    r = torch.empty(1, N, 1, device=DEV)
    dq_call, dkv_call = launch.backward_calls(p, do, q, k, v, g, None, s0, dht, dq, dkp, dvp, torch.empty_like(s0),
                                              D ** -0.5, IDENTITY, r)
    calls += [("dq", dq_call), ("dkv", dkv_call)]
    for name, (kernel, grid, args, kw) in calls:
        print(f"kernel {name} d{D} N{N} {decay}: running", flush=True)
        kernel[grid](*args, **kw)
        if not SMOKE:
            torch.cuda.synchronize()
        print(f"kernel {name} d{D} N{N} {decay}: ok", flush=True)
    RESULTS["check"].append(dict(case=f"kernels d{D} N{N} {decay}", all_written=True, unwritten=[]))


def phase_check():
    bf, fp = torch.bfloat16, torch.float16
    cases = [
        ("gla d64 (chunk 64: sub-chunks)", dict(B=1, N=600, H=2, Dk=64, Dv=64, dtype=bf, decay="channel")),
        ("gla d64 fp16", dict(B=1, N=600, H=2, Dk=64, Dv=64, dtype=fp, decay="channel")),
        ("gla d128", dict(B=1, N=1000, H=2, Dk=128, Dv=128, dtype=bf, decay="channel")),
        ("gla d128 strong decays [-6, 0]", dict(B=1, N=300, H=2, Dk=128, Dv=128, dtype=bf, decay="channel",
                                                 strong=True)),
        ("gla d64 decays near 0, -inf, -1e30", dict(B=1, N=300, H=2, Dk=64, Dv=64, dtype=bf,
                                                     decay="channel_extreme")),
        ("gla d64 chunk 32", dict(B=1, N=600, H=2, Dk=64, Dv=64, dtype=bf, decay="channel", chunk=32)),
        ("simple gla d128", dict(B=2, N=1000, H=2, Dk=128, Dv=128, dtype=bf, decay="scalar")),
        ("linear d128", dict(B=2, N=1000, H=2, Dk=128, Dv=128, dtype=bf)),
        ("based d16 v64", dict(B=2, N=1000, H=2, Dk=16, Dv=64, dtype=bf, feature_map="based")),
    ]
    if SMOKE:
        cases = [cases[0], cases[4], cases[7]]
    elif os.environ.get("LA_BWD_SHORT"):  # the GLA cases and the scalar decay's only
        cases = [cases[i] for i in (0, 3, 4, 7)]
    for name, kw in cases:
        attempt("check", name, lambda: check_case(name, **kw))
    attempt("check", "written gla", lambda: check_written("gla d128: every output written", 2, 999, 2, 128,
                                                          torch.bfloat16, "channel"))
    attempt("check", "written scalar", lambda: check_written("simple gla d128: every output written", 2, 999, 2,
                                                             128, torch.bfloat16, "scalar"))
    attempt("check", "gla d256 N17", lambda: check_case("gla d256 N17", 1, 17, 1, 256, 256, bf, decay="channel"))


# --------------------------------------------------------------------------------------------
# pieces: where the backward's time goes


CASES = {
    "linear d128": dict(Dk=128, Dv=128, decay=None, feature=IDENTITY),
    "simple gla d128": dict(Dk=128, Dv=128, decay="scalar", feature=IDENTITY),
    "gla d128": dict(Dk=128, Dv=128, decay="channel", feature=IDENTITY),
    "based d16 v64": dict(Dk=16, Dv=64, decay=None, feature=BASED),
}


def case_inputs(name):
    c = CASES[name]
    q, k, v, g = make(SHAPE["B"], SHAPE["N"], SHAPE["H"], c["Dk"], c["Dv"], torch.bfloat16, c["decay"],
                      "based" if c["feature"] == BASED else None)
    return q, k, v, g, c["feature"], c["Dk"] ** -0.5


def bytes_of(*ts):
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def pieces(name, chunk=None, label=None, **over):
    """The forward, the whole backward (autograd), and the backward's kernels and torch passes alone."""
    q, k, v, g, feature, scale = case_inputs(name)
    fm = "based" if feature == BASED else None
    p = tl_plan(q, v, g, feature, chunk, **over)
    row = dict(case=label or name, chunk=p.chunk, **over)
    row["fwd_ms"] = bench(lambda: launch.forward(p, q, k, v, g, None, None, None, None, scale, feature,
                                                 final_state=False, keep_linear=False))
    o_lin = None
    if feature == BASED and g is not None:
        o_lin = torch.randn(v.shape, device=DEV)
    do = torch.randn(v.shape, device=DEV)
    calls = []
    buffers = launch.backward_kernels(p, do, q, k, v, g, None, None, None, scale, feature)
    dq, dkp, dvp, dh0, r = buffers
    calls = launch.backward_calls(p, do, q, k, v, g, None, None, None, dq, dkp, dvp, dh0, scale, feature, r)
    (kq, gq, aq, wq), (kk, gk, ak, wk) = calls
    row["dq_kernel_ms"] = bench(lambda: kq[gq](*aq, **wq))
    row["dkv_kernel_ms"] = bench(lambda: kk[gk](*ak, **wk))
    row["torch_passes_ms"] = bench(lambda: launch.backward_combine(buffers, do, q, k, v, g, None, o_lin, None, None))
    if not (feature == BASED and g is not None):
        row["combine_kernel_ms"] = bench(lambda: launch.backward_combine_kernel(buffers, q, k, v, g, None, None, None))
    row["dk_parts"], row["dv_parts"] = dkp.shape[0], dvp.shape[0]
    if dkp.shape[0] > 1 or dvp.shape[0] > 1:
        row["partial_sums_ms"] = bench(lambda: (dkp.sum(0), dvp.sum(0)))
    if g is not None:
        dG = torch.randn(g.shape if g.dim() == 4 else (*g.shape, q.shape[-1]), device=DEV)
        row["decay_grad_ms"] = bench(lambda: launch.decay_grad(g, None, None, dG))
    row["launch_backward_ms"] = bench(lambda: launch.backward(p, do, q, k, v, g, None, None, o_lin, None, None,
                                                              scale, feature))
    p_torch = tl_plan(q, v, g, feature, chunk, combine="torch", **over)
    row["launch_backward_torch_combine_ms"] = bench(lambda: launch.backward(p_torch, do, q, k, v, g, None, None, o_lin,
                                                                            None, None, scale, feature))
    if not over and chunk is None:  # the public op's autograd (casts and the op's own passes included)
        leaves = [t.requires_grad_() for t in (q, k, v, g) if t is not None]
        o = linear_attention(q, k, v, feature_map=fm, decay=g)
        dob = torch.randn_like(o)
        row["autograd_bwd_ms"] = bench(lambda: torch.autograd.grad(o, leaves, dob, retain_graph=True))
    # the backward's HBM bound: q, k, v, do read, dq, dk, dv written (bf16), g read and dg written (fp32)
    row["bwd_bound_ms"] = (bytes_of(q, k, v) * 2 + v.numel() * 2 + (2 * bytes_of(g) if g is not None else 0)) \
        / HBM_GBS / 1e6
    row["fwd_bound_ms"] = (bytes_of(q, k, v, g) + v.numel() * 2) / HBM_GBS / 1e6
    print("pieces", row, flush=True)
    RESULTS["pieces"].append(row)


def phase_pieces():
    for name in CASES:
        attempt("pieces", name, lambda: pieces(name))


# --------------------------------------------------------------------------------------------
# fla: the peer, forward and backward, same inputs


def fla_fn(name):
    if name == "chunk_simple_gla":
        from fla.ops.simple_gla import chunk_simple_gla as f
    elif name == "chunk_gla":
        from fla.ops.gla import chunk_gla as f
    elif name == "chunk_linear_attn":
        from fla.ops.linear_attn import chunk_linear_attn as f
    elif name == "parallel_based":
        from fla.ops.based import parallel_based as f
    elif name == "fused_chunk_based":
        from fla.ops.based import fused_chunk_based as f
    return f


def fla_case(case, fla_name):
    q, k, v, g, feature, scale = case_inputs(case)
    f = fla_fn(fla_name)
    kw = {}
    if fla_name == "chunk_linear_attn":
        kw["normalize"] = False
    if "based" in fla_name:
        kw["use_norm"] = False

    def run():
        out = f(q, k, v, g, **kw) if g is not None else f(q, k, v, **kw)
        return out[0] if isinstance(out, tuple) else out

    row = dict(case=case, peer=fla_name, fla_fwd_ms=bench(run))
    leaves = [t.requires_grad_() for t in (q, k, v, g) if t is not None]
    try:
        o = run()
        do = torch.randn_like(o)
        row["fla_bwd_ms"] = bench(lambda: torch.autograd.grad(o, leaves, do, retain_graph=True))
    except Exception as err:  # noqa: BLE001 (FLA refuses its gated backward on Hopper with triton 3.6)
        row["fla_bwd_error"] = f"{type(err).__name__}: {str(err)[:200]}"
    print("fla", row, flush=True)
    RESULTS["fla"].append(row)


def phase_fla():
    try:
        import fla  # noqa: F401
    except Exception as err:  # noqa: BLE001
        RESULTS["errors"].append(f"fla does not import: {err}")
        print("fla does not import here:", err, flush=True)
        return
    for case, name in (("linear d128", "chunk_linear_attn"), ("simple gla d128", "chunk_simple_gla"),
                       ("gla d128", "chunk_gla"), ("based d16 v64", "parallel_based")):
        attempt("fla", f"{case} {name}", lambda: fla_case(case, name))


# --------------------------------------------------------------------------------------------
# sweep: block variants of the backward kernels and the per-channel chunk


SWEEP = [
    # (case, chunk, overrides): the backward kernels alone (and the forward for per-channel decay)
    ("gla d128", 64, dict(diag=0)),
    ("gla d128", 64, dict(BVB=128)),
    ("gla d128", 64, dict(BKQ=16, BKB=16)),
    ("gla d128", 64, dict(BKQ=64, BKB=64)),
    ("gla d128", 32, {}),
    ("gla d128", 64, dict(BV=128)),
    ("linear d128", 64, dict(num_warps=4, num_stages=3)),
    ("simple gla d128", 64, dict(BKQ=64, BVB=64)),
    ("gla d128", 64, dict(num_warps=4)),  # lost its CUDA context in session 26's second run (diag 0)
]


def variant_plan(case, chunk, over, q, v, g, feature):
    over = dict(over)
    if chunk is not None and "BT_BWD" not in over and case != "based d16 v64":
        over["BT_BWD"] = chunk
    return tl_plan(q, v, g, feature, chunk, **over)


def sweep_kernels(case, chunk, over):
    q, k, v, g, feature, scale = case_inputs(case)
    p = variant_plan(case, chunk, over, q, v, g, feature)
    do = torch.randn(v.shape, device=DEV)
    dq, dkp, dvp, dh0, r = launch.backward_kernels(p, do, q, k, v, g, None, None, None, scale, feature)
    (kq, gq, aq, wq), (kk, gk, ak, wk) = launch.backward_calls(p, do, q, k, v, g, None, None, None, dq, dkp, dvp,
                                                               dh0, scale, feature, r)
    row = dict(case=case, chunk=p.chunk, BT_BWD=p.config["BT_BWD"], **over,
               dq_kernel_ms=bench(lambda: kq[gq](*aq, **wq)), dkv_kernel_ms=bench(lambda: kk[gk](*ak, **wk)),
               dk_parts=dkp.shape[0], dv_parts=dvp.shape[0])
    if g is not None and g.dim() == 4:
        row["fwd_ms"] = bench(lambda: launch.forward(p, q, k, v, g, None, None, None, None, scale, feature,
                                                     final_state=False, keep_linear=False))
    row["kernels_ms"] = row["dq_kernel_ms"] + row["dkv_kernel_ms"]
    print("sweep", row, flush=True)
    RESULTS["sweep"].append(row)


def warm(indices):
    """Compile the sweep's variants (tiny shapes, the same specializations) into Triton's disk cache, in
    processes beside the main one, so the sweep times rather than compiles."""
    for i in indices:
        case, chunk, over = SWEEP[i]
        try:
            c = CASES[case]
            q, k, v, g = make(1, 256, 16, c["Dk"], c["Dv"], torch.bfloat16, c["decay"],
                              "based" if c["feature"] == BASED else None)
            p = variant_plan(case, chunk, over, q, v, g, c["feature"])
            do = torch.randn(v.shape, device=DEV)
            launch.backward_kernels(p, do, q, k, v, g, None, None, None, 1.0, c["feature"])
            if g is not None and g.dim() == 4:
                launch.forward(p, q, k, v, g, None, None, None, None, 1.0, c["feature"], final_state=False,
                               keep_linear=False)
        except Exception as err:  # noqa: BLE001 (the sweep reports it)
            print(f"warm {SWEEP[i]}: {type(err).__name__}: {str(err)[:200]}", flush=True)


def phase_sweep():
    for case, chunk, over in SWEEP:
        attempt("sweep", f"{case} {chunk} {over}", lambda: sweep_kernels(case, chunk, over))


# --------------------------------------------------------------------------------------------


def fmt(x):
    return "-" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))


def table() -> str:
    lines = ["", "backward pieces (ms) | fwd | fwd bound | dq kernel | dk/dv kernel | torch combine | combine kernel "
             "| launch bwd (torch combine) | launch bwd | autograd bwd | bwd bound | parts (dk, dv)"]
    for r in RESULTS["pieces"]:
        lines.append(" | ".join([r["case"]] + [fmt(r.get(k)) for k in (
            "fwd_ms", "fwd_bound_ms", "dq_kernel_ms", "dkv_kernel_ms", "torch_passes_ms", "combine_kernel_ms",
            "launch_backward_torch_combine_ms", "launch_backward_ms", "autograd_bwd_ms", "bwd_bound_ms")]
            + [f"{r.get('dk_parts')}, {r.get('dv_parts')}"]))
    if RESULTS["fla"]:
        lines += ["", "FLA (same inputs) | fla fwd ms | ours fwd (x) | fla bwd ms | ours bwd (x)"]
        ours = {r["case"]: r for r in RESULTS["pieces"] if "autograd_bwd_ms" in r}
        for r in RESULTS["fla"]:
            o = ours.get(r["case"], {})
            of, ob = o.get("fwd_ms"), o.get("autograd_bwd_ms")
            fb = r.get("fla_bwd_ms")
            lines.append(" | ".join([
                f"{r['case']} vs {r['peer']}", fmt(r["fla_fwd_ms"]),
                f"{fmt(of)} ({r['fla_fwd_ms'] / of:.2f}x)" if of else "-",
                fmt(fb) if fb else r.get("fla_bwd_error", "-")[:90],
                f"{fmt(ob)} ({fb / ob:.2f}x)" if ob and fb else "-"]))
    if RESULTS["sweep"]:
        lines += ["", "sweep (ms) | dq kernel | dk/dv kernel | sum | parts (dk, dv) | fwd"]
        for r in RESULTS["sweep"]:
            opts = {k: v for k, v in r.items() if k not in ("case", "dq_kernel_ms", "dkv_kernel_ms", "kernels_ms",
                                                              "dk_parts", "dv_parts", "fwd_ms")}
            lines.append(" | ".join([f"{r['case']} {opts}", fmt(r["dq_kernel_ms"]), fmt(r["dkv_kernel_ms"]),
                                     fmt(r["kernels_ms"]), f"{r['dk_parts']}, {r['dv_parts']}",
                                     fmt(r.get("fwd_ms"))]))
    lines += ["", "check | dtype | N | chunk | out/floor | state rel | dq dk dv /floor | dg rel | ds0 rel | finite"]
    for r in RESULTS["check"]:
        if "all_written" in r:
            lines.append(f"{r['case']} | {r['all_written']} {r['unwritten']}")
            continue
        lines.append(" | ".join(fmt(x) for x in (
            r["case"], r["dtype"], r["N"], r["chunk"], r["out_floor"], r["state_rel"],
            f"{r.get('dq_floor')} {r.get('dk_floor')} {r.get('dv_floor')}", r.get("dg_rel"), r.get("ds0_rel"),
            r["finite"])))
    if RESULTS["errors"]:
        lines += [""] + [f"ERROR {e}" for e in RESULTS["errors"]]
    return "\n".join(lines)


def argv_phases(argv) -> list:
    return argv[argv.index("--phases") + 1].split(",") if "--phases" in argv else ["check", "pieces", "fla", "sweep"]


def run_children(argv) -> None:
    """Run the tasks in child processes: one that breaks its CUDA context (an illegal address poisons
    every later call) exits, and a fresh child goes on from the next task. Merges their results."""
    import subprocess

    env = dict(os.environ, LA_BWD_START=str(START))
    warmers = []
    if not SMOKE and "sweep" in argv_phases(argv):
        n = min(len(SWEEP), max(1, (os.cpu_count() or 2) - 4))
        for i in range(n):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--warm", ",".join(
                str(j) for j in range(i, len(SWEEP), n))]
            warmers.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    first = 0
    while True:
        cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--child", "--start", str(first)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        last = None
        for line in proc.stdout:
            print(line, end="", flush=True)
            if line.startswith("@@TASK "):
                last = int(line.split()[1])
        rc = proc.wait()
        part = OUT / f"child_{first}.json"
        if part.exists():
            got = json.loads(part.read_text())
            for key in ("check", "pieces", "fla", "sweep", "errors"):
                RESULTS[key] += got.get(key, [])
            RESULTS.setdefault("meta", got.get("meta"))
            part.unlink()
        if rc == 0 or last is None or last < first:
            for w in warmers:
                w.kill()
            return
        RESULTS["errors"].append(f"task {last}: the process ended (rc {rc}); a new one went on after it")
        first = last + 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--phases", default="check,pieces,fla,sweep")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (interpreter), no timing")
    parser.add_argument("--child", action="store_true", help="(internal) run the tasks from --start")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--warm", help="(internal) compile these sweep variants")
    args = parser.parse_args()
    if args.warm is not None:
        warm([int(i) for i in args.warm.split(",")])
        return 0
    global CHILD_FILE, FIRST_TASK
    if not args.child:
        run_children([a for a in sys.argv[1:]])
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "linear_attention_backward.json").write_text(json.dumps(RESULTS, indent=1, default=str))
        print(table())
        print(f"\n{time.time() - START:.0f} s; JSON: {OUT / 'linear_attention_backward.json'}")
        return 0
    if args.child:
        CHILD_FILE, FIRST_TASK = f"child_{args.start}.json", args.start
    if not SMOKE and not torch.cuda.is_available():
        print("no GPU here", file=sys.stderr)
        return 2
    meta = {"smoke": True}
    if not SMOKE:
        try:
            from experiments.common.meta import meta as get_meta
            meta = get_meta()
        except Exception as err:  # noqa: BLE001
            meta = {"error": str(err), "gpu": torch.cuda.get_device_name()}
    RESULTS["meta"] = meta
    print(meta, flush=True)
    phases = args.phases.split(",")
    if SMOKE:  # the interpreter's time: one case a phase
        global CASES, SWEEP
        CASES = {k: CASES[k] for k in ("gla d128", "simple gla d128")}
        SWEEP = [("gla d128", 64, dict(BV=128))]
        for k in BUDGET:
            BUDGET[k] = 1e9
    for phase in ("check", "pieces", "fla", "sweep"):
        if phase in phases:
            globals()[f"phase_{phase}"]()
    save()
    if not args.child:
        print(table())
        print(f"\n{time.time() - START:.0f} s; JSON: {OUT / CHILD_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
