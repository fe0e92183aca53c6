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
START = time.time()
BUDGET = {"check": 70.0, "pieces": 170.0, "fla": 230.0, "sweep": 320.0}  # seconds from the start
OUT = Path(os.environ.get("OUT", "/tmp/out"))
# the timed shape, and the smoke run's
SHAPE = dict(B=16, N=4096, H=16) if not SMOKE else dict(B=1, N=40, H=2)


def attempt(phase, name, fn):
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
        return None
    finally:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "linear_attention_backward.json").write_text(json.dumps(RESULTS, indent=1, default=str))


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
        ("gla d256 N17", dict(B=1, N=17, H=1, Dk=256, Dv=256, dtype=bf, decay="channel")),
        ("gla d64 chunk 32", dict(B=1, N=600, H=2, Dk=64, Dv=64, dtype=bf, decay="channel", chunk=32)),
        ("simple gla d128", dict(B=2, N=1000, H=2, Dk=128, Dv=128, dtype=bf, decay="scalar")),
        ("linear d128", dict(B=2, N=1000, H=2, Dk=128, Dv=128, dtype=bf)),
        ("based d16 v64", dict(B=2, N=1000, H=2, Dk=16, Dv=64, dtype=bf, feature_map="based")),
    ]
    if SMOKE:
        cases = [cases[0], cases[4], cases[7]]
    for name, kw in cases:
        attempt("check", name, lambda: check_case(name, **kw))
    attempt("check", "written gla", lambda: check_written("gla d128: every output written", 2, 999, 2, 128,
                                                          torch.bfloat16, "channel"))
    attempt("check", "written scalar", lambda: check_written("simple gla d128: every output written", 2, 999, 2,
                                                             128, torch.bfloat16, "scalar"))


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
    row["dk_parts"], row["dv_parts"] = dkp.shape[0], dvp.shape[0]
    if dkp.shape[0] > 1 or dvp.shape[0] > 1:
        row["partial_sums_ms"] = bench(lambda: (dkp.sum(0), dvp.sum(0)))
    if g is not None:
        dG = torch.randn(g.shape if g.dim() == 4 else (*g.shape, q.shape[-1]), device=DEV)
        row["decay_grad_ms"] = bench(lambda: launch._decay_grad(g, None, None, dG))
    row["launch_backward_ms"] = bench(lambda: launch.backward(p, do, q, k, v, g, None, None, o_lin, None, None,
                                                              scale, feature))
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
    # (case, chunk, overrides)
    ("gla d128", 32, {}),
    ("gla d128", 64, dict(BV=128)),
    ("gla d128", 64, dict(num_warps=4)),
    ("gla d128", 64, dict(BKQ=32, BKB=32)),
    ("linear d128", 64, {}),
    ("linear d128", None, dict(BVB=128)),
    ("linear d128", None, dict(BKQ=128)),
    ("linear d128", None, dict(num_warps=4)),
    ("linear d128", None, dict(num_stages=3)),
    ("linear d128", None, dict(BVB=32)),
    ("simple gla d128", 64, {}),
    ("simple gla d128", None, dict(BVB=128)),
    ("simple gla d128", None, dict(BKQ=128)),
    ("simple gla d128", None, dict(num_warps=4)),
    ("based d16 v64", None, dict(BVB=64)),
    ("based d16 v64", None, dict(num_warps=4)),
]


def phase_sweep():
    for case, chunk, over in SWEEP:
        attempt("sweep", f"{case} {chunk} {over}", lambda: pieces(case, chunk, f"{case} chunk {chunk} {over}",
                                                                 **over))


# --------------------------------------------------------------------------------------------


def fmt(x):
    return "-" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))


def table() -> str:
    lines = ["", "backward pieces (ms) | fwd | fwd bound | dq kernel | dk/dv kernel | torch passes | launch bwd | "
             "autograd bwd | bwd bound | parts (dk, dv)"]
    for r in RESULTS["pieces"]:
        lines.append(" | ".join([r["case"]] + [fmt(r.get(k)) for k in (
            "fwd_ms", "fwd_bound_ms", "dq_kernel_ms", "dkv_kernel_ms", "torch_passes_ms", "launch_backward_ms",
            "autograd_bwd_ms", "bwd_bound_ms")] + [f"{r.get('dk_parts')}, {r.get('dv_parts')}"]))
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--phases", default="check,pieces,fla,sweep")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (interpreter), no timing")
    args = parser.parse_args()
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
        SWEEP = SWEEP[:1]
        for k in BUDGET:
            BUDGET[k] = 1e9
    for phase in ("check", "pieces", "fla", "sweep"):
        if phase in phases:
            globals()[f"phase_{phase}"]()
    print(table())
    print(f"\n{time.time() - START:.0f} s; JSON: {OUT / 'linear_attention_backward.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
