"""Linear attention's backward and per-channel decay (GLA) on the GPU (issue 33): correctness against the
float64 recurrence (bf16, the gated backward included: FLA refuses its own on Hopper under triton 3.6),
the backward's time against flash-linear-attention's in the same run, and block variants.

    PYTHONPATH=. python3 experiments/linear_attention/gpu_backward.py            # --quick (default), < 90 s
    PYTHONPATH=. python3 experiments/linear_attention/gpu_backward.py --smoke    # CPU, interpreter, tiny
    PYTHONPATH=. python3 experiments/linear_attention/gpu_backward.py --full [--phases check,pieces,fla,sweep]

--quick (session 27): (1) checks, bf16 against float64 (initial and final states, N = 1000), of every
backward path this session changed or added: the default autograd backward without a decay, with a
scalar decay, per-channel (GLA) and Based (gradients now stored by the kernels in the inputs' dtype);
the split dK/dV path (launch.backward_plan(split=True)) without a decay, with a scalar decay, and with
beta and grouped heads (Mamba-2's form; the scalar decay's kernels doing the combine's work, the
EPILOGUE, and without it), each into NaN-filled buffers (every element written); and the
pending gated variants (GLA's gathered diagonal diag=2, key blocks of 32, both; the scalar decay's swept
blocks). The checks run in worker processes beside kernel-compiling warm-ups. (2) Timing, serial, after
them: the autograd backward of the four cases, FLA chunk_linear_attn's backward (and forward), the split
path and its kernels (and block variants), the pending variants. Each task in its own try; a lost CUDA
context costs one process.

--smoke: the quick run's tasks on the CPU through Triton's interpreter, shapes cut (imports, shapes and
the orchestration checked; no timing). Prints a table last and writes linear_attention_backward.json to
$OUT (default /tmp/out). Timing: triton.testing.do_bench medians, bf16, B16 H16 N4096.
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
RESULTS: dict = {"check": [], "pieces": [], "fla": [], "sweep": [], "time": [], "errors": []}
START = float(os.environ.get("LA_BWD_START", time.time()))  # a child keeps its parent's clock
BUDGET = {"check": 45.0, "pieces": 130.0, "fla": 215.0, "sweep": 250.0, "time": 88.0}  # seconds from the start
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
    row["grad_dtypes"] = [str(t.dtype).removeprefix("torch.") for t in got[:3]]
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
# --quick (session 27): checks and warm-ups in worker processes, then timing in one process


QUICK_BUDGET = 88.0  # seconds for the whole run; a timing task starting later is skipped
CHECK_DEADLINE = 58.0  # the workers (checks, warm-ups) are waited for until then, then stopped
CHECK_N = 1008  # a multiple of 16, as the timed N (one compiled specialization), ragged against chunks of 64
SPLIT_VARIANTS = [  # (case, label, backward_plan overrides) timed beside the split default
    ("linear d128", "split 8 warps", dict(split_warps=8)),
    ("linear d128", "split chunk 32", dict(split_BT=32)),
    ("linear d128", "split BKB 128 BV 128", dict(split_BKB=128, split_BV=128)),
    ("linear d128", "split dq BKQ 128 8 warps", dict(dq_BKQ=128, dq_warps=8, dq_stages=2)),
    ("linear d128", "split stages 3", dict(split_stages=3)),
    ("simple gla d128", "split no epilogue (combine kernel)", dict(split_epilogue=False)),
    ("simple gla d128", "split chunk 64", dict(split_BT=64)),
    ("simple gla d128", "split 8 warps", dict(split_warps=8, dq_warps=8)),
]
PENDING = [  # (case, tl_plan overrides): gated variants shipped off until a GPU check (configs.py says each)
    ("gla d128", dict(diag=2)),
    ("gla d128", dict(BKQ=32, BKB=32)),
    ("gla d128", dict(diag=2, BKQ=32, BKB=32)),
    ("simple gla d128", dict(BT_BWD=64, BKQ=128, BVB=128, num_warps=4)),  # BWD_BLOCK_KINDS = (0, 1)
]
NATIVE = True  # launch.backward(native=True): dq, dk, dv in the inputs' dtype, as op.py asks


def quick_inputs(B, N, Hqk, group, Dk, Dv, decay, beta, seed=0):
    torch.manual_seed(seed)
    H = Hqk * group
    q = torch.randn(B, N, Hqk, Dk, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(B, N, Hqk, Dk, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(B, N, H, Dv, device=DEV, dtype=torch.bfloat16)
    g = None
    if decay == "scalar":
        g = -torch.rand(B, N, H, device=DEV) * 0.3
    elif decay == "channel":
        g = -torch.rand(B, N, H, Dk, device=DEV) * 0.3
    bt = torch.rand(B, N, H, device=DEV) + 0.5 if beta else None
    return q, k, v, g, bt


def quick_plan(q, v, g, feature=IDENTITY, plan_over=None, split=False, split_over=None):
    p = tl_plan(q, v, g, feature, None, **(plan_over or {}))
    return launch.backward_plan(p, q, v, g, feature, None, split=split, **(split_over or {}))


def check_launch(name, Dk=128, Dv=128, decay=None, beta=False, group=1, split=False, plan_over=None,
                 split_over=None, B=2, N=CHECK_N, Hqk=2, states=True):
    """launch.forward and launch.backward (native dtypes) at a plan (the split path, a pending variant) against
    the float64 recurrence, initial and final states (unless ``states`` is False: then the kernels compiled
    are the timed ones, so the check is their warm-up too), beta and grouped heads as asked; and the
    backward's kernels into NaN-filled buffers (every element written)."""
    if SMOKE:
        N, Dk, Dv = min(N, 70), min(Dk, 32), min(Dv, 32)
    q, k, v, g, bt = quick_inputs(B, N, Hqk, group, Dk, Dv, decay, beta)
    H = Hqk * group
    s0 = torch.randn(B, H, Dk, Dv, device=DEV) if states else None
    dht = torch.randn_like(s0) if states else None
    scale = Dk ** -0.5
    p = quick_plan(q, v, g, IDENTITY, plan_over, split, split_over)
    o, ht, _ = launch.forward(p, q, k, v, g, bt, None, None, s0, scale, IDENTITY, final_state=states,
                              keep_linear=False)
    do = torch.randn_like(o)
    # the kernels into NaN-filled buffers
    nan = float("nan")
    nv, nk = launch.part_counts(p)
    bufs = dict(dq=torch.full((B, N, H, Dk), nan, device=DEV), dk_parts=torch.full((nv, B, N, H, Dk), nan, device=DEV),
                dv_parts=torch.full((nk, B, N, H, Dv), nan, device=DEV),
                dh0=torch.full_like(s0, nan) if states else None,
                r=torch.full((B, N, H), nan, device=DEV) if launch.strict_diagonal(IDENTITY, g) else None)
    qk, kk, vk, dok = (t.float() for t in (q, k, v, do)) if p.config["upcast"] else (q, k, v, do)
    for kernel, grid, args, kw in launch.backward_calls(p, dok, qk, kk, vk, g, bt, s0, dht, bufs["dq"], bufs["dk_parts"],
                                                        bufs["dv_parts"], bufs["dh0"], scale, IDENTITY, bufs["r"]):
        kernel[grid](*args, **kw)
    unwritten = [n_ for n_, t in bufs.items() if t is not None and torch.isnan(t).any()]
    grads = launch.backward(p, do, q, k, v, g, bt, s0, None, ht, dht, scale, IDENTITY, native=NATIVE)
    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (q, k, v, g, bt, s0)]
    ref, ref_state = linear_attention_reference(leaves[0], leaves[1], leaves[2], decay=leaves[3], scale=scale,
                                                initial_state=leaves[5], beta=leaves[4])
    given = [t for t in leaves if t is not None]
    loss = (ref * do.double()).sum() + ((ref_state * dht.double()).sum() if states else 0.0)
    want = iter(torch.autograd.grad(loss, given))
    want = [next(want) if t is not None else None for t in leaves]
    row = dict(case=name, dtype="bfloat16", N=N, chunk=p.config.get("split_BT") if split else p.config["BT_BWD"],
               split=split, **(plan_over or {}), **(split_over or {}),
               out_floor=round(accuracy.error_over_floor(o, ref.detach()), 3),
               state_rel=accuracy.rel_rms(ht, ref_state.detach()) if states else None, all_written=not unwritten,
               unwritten=unwritten,
               grad_dtypes=[str(t.dtype).removeprefix("torch.") for t in grads[:3]])
    finite = bool(torch.isfinite(o).all() and (not states or torch.isfinite(ht).all()))
    for n_, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "ds0"), grads, want):
        if a is None or b is None:
            continue
        finite = finite and bool(torch.isfinite(a).all())
        if n_ in ("dq", "dk", "dv"):
            row[n_ + "_floor"] = round(accuracy.error_over_floor(a.to(q.dtype), b), 3)
        else:
            row[n_ + "_rel"] = accuracy.rel_rms(a, b)
    row["finite"] = finite
    print("check", row, flush=True)
    RESULTS["check"].append(row)


def check_mamba(name, z_gate=False, b=1, n=CHECK_N, h=4, g=1, p=64, s=128):
    """mamba2_chunk_scan (D per head, dt_bias, softplus, initial and final states; the gate z if asked) through
    autograd in bf16 against mamba2_reference in float64: without z, do reaches the kernels in bf16 (session 27)."""
    from tilecore.ops.linear_attention import mamba2_chunk_scan, mamba2_reference

    if SMOKE:
        n, p, s = min(n, 70), min(p, 32), min(s, 32)
    torch.manual_seed(0)
    bf = torch.bfloat16
    x = torch.randn(b, n, h, p, device=DEV, dtype=bf)
    dt = torch.randn(b, n, h, device=DEV)
    A = -torch.rand(h, device=DEV) * 3 - 0.1
    Bm = torch.randn(b, n, g, s, device=DEV, dtype=bf)
    Cm = torch.randn(b, n, g, s, device=DEV, dtype=bf)
    D = torch.randn(h, device=DEV)
    z = torch.randn(b, n, h, p, device=DEV, dtype=bf) if z_gate else None
    dt_bias = torch.randn(h, device=DEV) * 0.1
    s0 = torch.randn(b, h, p, s, device=DEV)
    inputs = [t for t in (x, dt, A, Bm, Cm, D, z, dt_bias, s0) if t is not None]
    for t in inputs:
        t.requires_grad_()
    y, hT = mamba2_chunk_scan(x, dt, A, Bm, Cm, D=D, z=z, dt_bias=dt_bias, dt_softplus=True, initial_states=s0,
                              return_final_states=True)
    dy, dh = torch.randn_like(y), torch.randn_like(hT)
    got = torch.autograd.grad((y.float() * dy.float()).sum() + (hT * dh).sum(), inputs)
    r = [t.detach().double().requires_grad_() for t in inputs]
    rd = dict(zip([n_ for n_, t in zip(("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "s0"),
                                         (x, dt, A, Bm, Cm, D, z, dt_bias, s0)) if t is not None], r))
    ry, rh = mamba2_reference(rd["x"], rd["dt"], rd["A"], rd["B"], rd["C"], D=rd["D"], z=rd.get("z"),
                              dt_bias=rd["dt_bias"], dt_softplus=True, initial_states=rd["s0"])
    want = torch.autograd.grad((ry * dy.double()).sum() + (rh * dh.double()).sum(), r)
    row = dict(case=name, dtype="bfloat16", N=n, out_floor=round(accuracy.error_over_floor(y, ry.detach()), 3),
               state_rel=accuracy.rel_rms(hT, rh.detach()), finite=bool(torch.isfinite(y).all()))
    for n_, a, w in zip(rd, got, want):
        row["finite"] = row["finite"] and bool(torch.isfinite(a).all())
        if n_ in ("x", "B", "C", "z"):
            row[f"d{n_}_floor"] = round(accuracy.error_over_floor(a.to(bf), w), 3)
        else:
            row[f"d{n_}_rel"] = accuracy.rel_rms(a, w)
    row["dq_floor"], row["dk_floor"], row["dv_floor"] = row["dC_floor"], row["dB_floor"], row["dx_floor"]
    row["dg_rel"], row["ds0_rel"] = row["ddt_rel"], row["ds0_rel"]
    print("check", row, flush=True)
    RESULTS["check"].append(row)


def quick_checks():
    """(name, thunk) of the quick checks, the slowest to compile (per-channel decay) first. The per-channel
    ones run without states and carry the timed task's name: they compile exactly its kernels (a warm-up
    each, where another would cost a GLA compile of tens of seconds)."""
    bf = torch.bfloat16
    out = []
    for case, over in PENDING[:3]:
        out.append((f"pending {case} {over}", lambda over=over: check_launch(
            f"gla d128 {over} (no states)", decay="channel", plan_over=over, B=1, states=False)))
    out += [
        ("autograd gla d128", lambda: check_launch("gla d128 default plan (no states)", decay="channel", B=1,
                                                   states=False)),
        ("autograd linear d128", lambda: check_case("autograd linear d128", 2, CHECK_N, 2, 128, 128, bf)),
        ("autograd simple gla d128", lambda: check_case("autograd simple gla d128", 2, CHECK_N, 2, 128, 128, bf,
                                                        decay="scalar")),
        ("autograd based d16 v64", lambda: check_case("autograd based d16 v64", 2, CHECK_N, 2, 16, 64, bf,
                                                      feature_map="based")),
        ("split linear d128", lambda: check_launch("split linear d128", split=True)),
        ("split simple gla d128", lambda: check_launch("split simple gla d128 (epilogue)", decay="scalar",
                                                       split=True)),
        ("split simple gla d128 no epilogue", lambda: check_launch(
            "split simple gla d128 no epilogue", decay="scalar", split=True, split_over=dict(split_epilogue=False))),
        ("split mamba-like beta group 2 p64 s128", lambda: check_launch(
            "split scalar beta group 2 Dk128 Dv64", Dv=64, decay="scalar", beta=True, group=2, Hqk=1, split=True)),
        ("split linear d64", lambda: check_launch("split linear d64 N 17", Dk=64, Dv=64, split=True, N=17)),
        ("autograd mamba2 p64 s128 D (bf16 do into the kernels)", lambda: check_mamba("autograd mamba2 p64 s128 D")),
        ("autograd mamba2 p64 s128 D z", lambda: check_mamba("autograd mamba2 p64 s128 D z", z_gate=True)),
        (f"pending {PENDING[3][0]} {PENDING[3][1]}", lambda: check_launch(
            f"simple gla d128 {PENDING[3][1]}", decay="scalar", plan_over=PENDING[3][1])),
    ]
    return out


def quick_times():
    """(name, thunk, warm thunk) of the timed tasks, in the order they run (the most wanted first); the warm
    thunk compiles the same kernels on a small shape (run by a worker before the timing starts)."""
    # FLA after our own no-decay figures: in run 2 of session 27 its first call (autotune) ran past the budget
    out = [("autograd linear d128", lambda: time_autograd("linear d128")),
           ("split linear d128", lambda: time_launch("linear d128", split=True, pieces=True)),
           ("plan linear d128", lambda: time_launch("linear d128", split=False, pieces=True)),
           ("fla linear d128 chunk_linear_attn", lambda: fla_case("linear d128", "chunk_linear_attn")),
           ("autograd simple gla d128", lambda: time_autograd("simple gla d128")),
           ("split simple gla d128", lambda: time_launch("simple gla d128", split=True, pieces=True)),
           ("autograd based d16 v64", lambda: time_autograd("based d16 v64")),
           ("autograd gla d128", lambda: time_autograd("gla d128"))]
    for case, over in PENDING:
        out.append((f"pending {case} {over}", lambda case=case, over=over: time_launch(case, plan_over=over)))
    for case, label, over in SPLIT_VARIANTS:
        out.append((f"{case} {label}", lambda case=case, label=label, over=over: time_launch(
            case, split=True, split_over=over, label=label, pieces=True)))
    return out


def time_autograd(name):
    q, k, v, g, feature, scale = case_inputs(name)
    fm = "based" if feature == BASED else None
    leaves = [t.requires_grad_() for t in (q, k, v, g) if t is not None]
    row = dict(case=name, what="autograd bwd (default path)")
    with torch.no_grad():
        row["fwd_ms"] = bench(lambda: linear_attention(q, k, v, feature_map=fm, decay=g))
    o = linear_attention(q, k, v, feature_map=fm, decay=g)
    dob = torch.randn_like(o)
    row["bwd_ms"] = bench(lambda: torch.autograd.grad(o, leaves, dob, retain_graph=True))
    row["bwd_bound_ms"] = bwd_bound(q, k, v, g)
    print("time", row, flush=True)
    RESULTS["time"].append(row)


def bwd_bound(q, k, v, g):
    """The backward's HBM bound: q, k, v, do read, dq, dk, dv written (bf16), g read and dg written (fp32)."""
    return (bytes_of(q, k, v) * 2 + v.numel() * 2 + (2 * bytes_of(g) if g is not None else 0)) / HBM_GBS / 1e6


def time_launch(name, split=False, plan_over=None, split_over=None, label=None, pieces=False):
    """launch.backward (kernels and combine, native dtypes: what the autograd backward runs) at a plan, and
    with ``pieces`` each kernel alone."""
    q, k, v, g, feature, scale = case_inputs(name)
    p = quick_plan(q, v, g, feature, plan_over, split, split_over)
    do = torch.randn(v.shape, device=DEV, dtype=v.dtype)
    row = dict(case=name, what=label or ("split" if split else "plan"), **(plan_over or {}), **(split_over or {}))
    row["bwd_ms"] = bench(lambda: launch.backward(p, do, q, k, v, g, None, None, None, None, None, scale, feature,
                                                  native=NATIVE))
    if pieces:
        out = dict(dq=q.dtype, dk=k.dtype, dv=v.dtype)
        dq, dkp, dvp, dh0, r = launch.backward_kernels(p, do, q, k, v, g, None, None, None, scale, feature,
                                                       out_dtypes=out)
        calls = launch.backward_calls(p, do, q, k, v, g, None, None, None, dq, dkp, dvp, dh0, scale, feature, r)
        names = ["dq", "dk", "dv"] if len(calls) == 3 else ["dq", "dkv"]
        for n_, (kern, grid, args, kw) in zip(names, calls):
            row[f"{n_}_kernel_ms"] = bench(lambda: kern[grid](*args, **kw))
    row["bwd_bound_ms"] = bwd_bound(q, k, v, g)
    print("time", row, flush=True)
    RESULTS["time"].append(row)


def warm_times():
    """(name, thunk): the timed tasks' kernels compiled on a small shape with the same specializations
    (B1 H16 N256: every stride and N a multiple of 16, as at B16 H16 N4096). None under --smoke (the
    interpreter compiles nothing)."""
    out = []
    if SMOKE:
        return out
    checked = {name for name, _ in quick_checks()}
    for name, fn in quick_times():
        if name in checked:  # the check compiles its kernels
            continue
        out.append((f"warm {name}", lambda fn=fn, name=name: with_shape(dict(B=1, N=256, H=16), fn, name)))
    return out


def with_shape(shape, fn, name):
    saved = dict(SHAPE)
    SHAPE.update(shape)
    kept = {k: list(v) for k, v in RESULTS.items() if isinstance(v, list)}
    try:
        fn()
    finally:
        SHAPE.update(saved)
        for k, v in kept.items():  # a warm-up's rows are not results
            RESULTS[k] = v
    RESULTS.setdefault("warmed", []).append(name)  # (an exception above leaves it out)


def quick_worker(index, workers):
    jobs = quick_checks() + warm_times()
    try:
        import fla  # noqa: F401
    except Exception:  # noqa: BLE001 (the timer reports it)
        jobs = [j for j in jobs if not j[0].startswith("warm fla")]
    for j, (name, fn) in enumerate(jobs):
        if j % workers == index:
            attempt("check", name, lambda fn=fn, name=name: (fn(), RESULTS.setdefault("warmed", []).append(name)))


def quick_timer():
    try:
        import fla  # noqa: F401
        has_fla = True
    except Exception as err:  # noqa: BLE001
        has_fla = False
        RESULTS["errors"].append(f"fla does not import: {err}")
    warmed = os.environ.get("LA_BWD_WARMED")
    warmed = None if warmed is None else set(warmed.split(";"))
    for name, fn in quick_times():
        if name.startswith("fla") and not has_fla:
            continue
        if not SMOKE and warmed is not None and name not in warmed and ("gla d128 {" in name or name == "autograd gla d128"):
            # per-channel decay compiles for tens of seconds: not inside the timing's budget
            attempt("time", name, lambda name=name: (_ for _ in ()).throw(
                RuntimeError(f"{name}: not compiled by the workers' deadline; not timed")))
            continue
        attempt("time", name, fn)


def run_quick(argv) -> None:
    """Workers (checks and warm-ups) in parallel, then the timing in one process (a fresh one after a crash)."""
    import subprocess

    env = dict(os.environ, LA_BWD_START=str(START))
    workers = 2 if SMOKE else max(2, min(12, (os.cpu_count() or 4) - 2))
    procs = [subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *argv, "--child", "--worker", str(i),
                               "--workers", str(workers)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for i in range(workers)]
    logs = [[] for _ in procs]
    import threading

    def pump(i, proc):
        for line in proc.stdout:
            logs[i].append(line)
            if line.startswith(("check ", "FAILED", "@@TASK")):
                print(f"[w{i}] {line}", end="", flush=True)

    threads = [threading.Thread(target=pump, args=(i, pr), daemon=True) for i, pr in enumerate(procs)]
    for t in threads:
        t.start()
    deadline = START + (1e9 if SMOKE else CHECK_DEADLINE)
    for i, proc in enumerate(procs):
        try:
            proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            RESULTS["errors"].append(f"worker {i} stopped at the {CHECK_DEADLINE:.0f} s deadline")
    for i in range(workers):
        merge(OUT / f"worker_{i}.json")
    print(f"workers done at {time.time() - START:.0f} s", flush=True)
    env["LA_BWD_WARMED"] = ";".join(RESULTS.get("warmed", []))
    first = 0
    while time.time() - START < QUICK_BUDGET or SMOKE:
        cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--child", "--timer", "--start", str(first)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        last = None
        for line in proc.stdout:
            print(line, end="", flush=True)
            if line.startswith("@@TASK "):
                last = int(line.split()[1])
        rc = proc.wait()
        merge(OUT / f"timer_{first}.json")
        if rc == 0 or last is None or last < first:
            return
        RESULTS["errors"].append(f"timing task {last}: the process ended (rc {rc}); a new one went on after it")
        first = last + 1


def merge(path):
    if path.exists():
        got = json.loads(path.read_text())
        for key in ("check", "pieces", "fla", "sweep", "time", "errors", "warmed"):
            RESULTS.setdefault(key, [])
            RESULTS[key] += got.get(key, [])
        if got.get("meta") and not RESULTS.get("meta"):
            RESULTS["meta"] = got["meta"]
        path.unlink()


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


def quick_table() -> str:
    lines = ["", "time (ms, B16 H16 N4096 bf16) | fwd | bwd | dq | dk/dv (dk, dv) | bwd bound | vs FLA bwd"]
    fla_bwd = {r["case"]: r.get("fla_bwd_ms") for r in RESULTS["fla"]}
    for r in RESULTS["time"]:
        opts = {k: v for k, v in r.items() if k not in ("case", "what", "fwd_ms", "bwd_ms", "bwd_bound_ms")
                and not k.endswith("_kernel_ms")}
        dkv = r.get("dkv_kernel_ms")
        if dkv is None and r.get("dk_kernel_ms") is not None:
            dkv = f"{r['dk_kernel_ms'] + r['dv_kernel_ms']:.3f} ({r['dk_kernel_ms']:.3f}, {r['dv_kernel_ms']:.3f})"
        fb = fla_bwd.get(r["case"])
        lines.append(" | ".join([f"{r['case']} {r['what']} {opts if opts else ''}".strip(), fmt(r.get("fwd_ms")),
                                 fmt(r.get("bwd_ms")), fmt(r.get("dq_kernel_ms")), fmt(dkv), fmt(r.get("bwd_bound_ms")),
                                 f"{fb / r['bwd_ms']:.2f}x" if fb and r.get("bwd_ms") else "-"]))
    for r in RESULTS["fla"]:
        lines.append(f"FLA {r['peer']} ({r['case']}) | {fmt(r.get('fla_fwd_ms'))} | "
                     f"{fmt(r.get('fla_bwd_ms')) if r.get('fla_bwd_ms') else r.get('fla_bwd_error', '-')[:90]}")
    lines += ["", "check (bf16 vs float64) | N | out/floor | state rel | dq dk dv /floor | dg dbeta ds0 rel | written "
              "| grads dtype | finite"]
    for r in RESULTS["check"]:
        lines.append(" | ".join(fmt(x) for x in (
            r["case"], r.get("N"), r.get("out_floor"), r.get("state_rel"),
            f"{r.get('dq_floor')} {r.get('dk_floor')} {r.get('dv_floor')}",
            " ".join(fmt(r.get(k)) for k in ("dg_rel", "dbeta_rel", "ds0_rel")), r.get("all_written", "-"),
            ",".join(r.get("grad_dtypes", [])) or "-", r.get("finite"))))
    if RESULTS["errors"]:
        lines += [""] + [f"ERROR {e}" for e in RESULTS["errors"]]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="(the default) checks and timing in under 90 s")
    parser.add_argument("--full", action="store_true", help="session 26's phases (minutes)")
    parser.add_argument("--phases", default="check,pieces,fla,sweep", help="--full's phases")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (interpreter), no timing")
    parser.add_argument("--budget", type=float, default=None,
                        help="--quick: seconds for the whole run (88; the checks' deadline grows by a third "
                             "of the extra)")
    parser.add_argument("--child", action="store_true", help="(internal) run the tasks from --start")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--worker", type=int, help="(internal, --quick) this worker's index")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--timer", action="store_true", help="(internal, --quick) the timing process")
    parser.add_argument("--warm", help="(internal) compile these sweep variants")
    args = parser.parse_args()
    if args.warm is not None:
        warm([int(i) for i in args.warm.split(",")])
        return 0
    global CHILD_FILE, FIRST_TASK, QUICK_BUDGET, CHECK_DEADLINE
    if args.budget:
        CHECK_DEADLINE += max(0.0, args.budget - QUICK_BUDGET) / 3
        QUICK_BUDGET = args.budget
    quick = not args.full
    if quick:
        BUDGET.update(check=1e9 if SMOKE else CHECK_DEADLINE, time=1e9 if SMOKE else QUICK_BUDGET)
    if not args.child:
        if quick:
            run_quick([a for a in sys.argv[1:]])
        else:
            run_children([a for a in sys.argv[1:]])
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "linear_attention_backward.json").write_text(json.dumps(RESULTS, indent=1, default=str))
        print(quick_table() if quick else table())
        print(f"\n{time.time() - START:.0f} s; JSON: {OUT / 'linear_attention_backward.json'}")
        return 0
    if args.worker is not None:
        CHILD_FILE = f"worker_{args.worker}.json"
    elif args.timer:
        CHILD_FILE, FIRST_TASK = f"timer_{args.start}.json", args.start
    else:
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
    if quick:
        if args.worker is not None:
            quick_worker(args.worker, args.workers)
        else:
            print(meta, flush=True)
            quick_timer()
        save()
        return 0
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
