"""Linear attention and Mamba-2 on the GPU: correctness against the float64 recurrence, then speed
against flash-linear-attention (and mamba_ssm) where they import, the HBM bound and a copy of the same
bytes measured in the same run, and a sweep of the tl kernels' blocks.

    PYTHONPATH=. python3 experiments/linear_attention/gpu_check.py [--phases check,time,sweep] [--out DIR]

Phases (each case in its own try: a failure is printed and the run goes on):
* check: bf16 and fp16 forward and backward of every path (no decay, scalar decay, per-channel decay,
  Based, Hedgehog, Mamba-2 with D, z, grouped B/C, initial and final states), N up to 4097, and the
  decode steps, against reference.py's float64 recurrence: error as a multiple of the rounding floor
  (forward and gradients), no NaN, every output written (outputs poisoned with NaN first).
* time: B16 H16 N4096 bf16 forward (and backward) medians of triton.testing.do_bench: tilecore against
  FLA's chunk_linear_attn, chunk_simple_gla, chunk_gla, parallel_based, fused_chunk_based and mamba_ssm's
  mamba_chunk_scan_combined (skipped, saying so, where they do not import), against the HBM bound
  (bytes of q, k, v, o / 3000 GB/s) and a torch copy of the same bytes; the decode step against copying
  its state.
* sweep: the forward's chunk, value block, warps and pipeline stages (plan.tl_plan's overrides).

Prints a table last and writes linear_attention.json to --out (default $OUT, else /tmp/out). About 3-4
minutes on an H100; a time budget (--budget, seconds) skips what is left past it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

DRY = "--dry" in sys.argv  # the check's logic on the CPU through Triton's interpreter, at small sizes
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tilecore import accuracy  # noqa: E402
from tilecore.ops.linear_attention import (launch, linear_attention, linear_attention_reference,  # noqa: E402
                                           linear_attention_step, mamba2_chunk_scan, mamba2_reference,
                                           mamba2_step)
from tilecore.ops.linear_attention.plan import BASED, IDENTITY, tl_plan  # noqa: E402

HBM_GBS = 3000.0
DEV = "cpu" if DRY else "cuda"


def n(tokens: int) -> int:
    """A sequence length, cut to at most 40 tokens in a dry run."""
    return min(tokens, 40) if DRY else tokens
RESULTS: dict = {"check": [], "time": [], "sweep": [], "errors": []}
START = time.time()


def elapsed() -> float:
    return time.time() - START


BUDGET = {"check": 110.0, "time": 200.0, "sweep": 225.0}  # seconds from the start: no new case past them
OUT = Path("/tmp/out")


def attempt(phase: str, name: str, fn):
    """Run one case; print and record an exception instead of stopping; skip it past the phase's budget.
    The JSON is rewritten after each case (a run cut short still leaves its results)."""
    if elapsed() > BUDGET[phase]:
        print(f"{phase} {name}: skipped (past the {BUDGET[phase]:.0f} s budget)", flush=True)
        RESULTS["errors"].append(f"{phase} {name}: skipped, time budget")
        return None
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 (a probe goes on)
        msg = f"{phase} {name}: {type(err).__name__}: {err}"
        print("FAILED", msg, flush=True)
        traceback.print_exc(limit=3)
        RESULTS["errors"].append(msg)
        return None
    finally:
        save()


def save():
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "linear_attention.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def sync():
    if not DRY:
        torch.cuda.synchronize()


def bench(fn) -> float:
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


# --------------------------------------------------------------------------------------------
# check


def inputs(B, N, Hqk, H, Dk, Dv, dtype, decay=None, feature_map=None, h0=False, fh=None, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(B, N, Hqk, Dk, device=DEV, dtype=dtype)
    k = torch.randn(B, N, Hqk, Dk, device=DEV, dtype=dtype)
    v = torch.randn(B, N, H, Dv, device=DEV, dtype=dtype)
    feats = 1 + Dk + Dk * Dk if feature_map == "based" else (2 * fh if feature_map == "hedgehog" else Dk)
    g = None
    if decay == "scalar":
        g = -torch.rand(B, N, H, device=DEV) * 0.3
    elif decay == "channel":
        g = -torch.rand(B, N, H, feats, device=DEV) * 0.3
    elif decay == "extreme":  # near 0, and resets
        g = -torch.rand(B, N, H, device=DEV) * 1e-6
        g[:, N // 3] = float("-inf")
        g[:, N // 2] = -1e30
    s0 = torch.randn(B, H, feats, Dv, device=DEV) if h0 else None
    w = torch.randn(Hqk, Dk, fh, device=DEV) * Dk ** -0.5 if feature_map == "hedgehog" else None
    return q, k, v, g, s0, w


def grad_floors(got, ref):
    return [round(accuracy.error_over_floor(a, b), 3) if a is not None else None for a, b in zip(got, ref)]


def check_case(name, B, N, Hqk, H, Dk, Dv, dtype, decay=None, feature_map=None, h0=True, fh=None, backward=True,
               chunk=None):
    N = n(N)
    q, k, v, g, s0, w = inputs(B, N, Hqk, H, Dk, Dv, dtype, decay, feature_map, h0, fh)
    leaves = [t for t in (q, k, v, g, s0) if t is not None]
    for t in leaves:
        t.requires_grad_(backward)
    o, ht = linear_attention(q, k, v, feature_map=feature_map, feature_weights=w, decay=g, initial_state=s0,
                             return_final_state=True, chunk_size=chunk)
    sync()
    r = [t.detach().double().requires_grad_(backward) for t in leaves]
    it = iter(r)
    rq, rk, rv = next(it), next(it), next(it)
    rg = next(it) if g is not None else None
    rs = next(it) if s0 is not None else None
    ref, ref_state = linear_attention_reference(rq, rk, rv, feature_map=feature_map,
                                                feature_weights=None if w is None else w.double(), decay=rg,
                                                initial_state=rs)
    row = dict(case=name, dtype=str(dtype).removeprefix("torch."), N=N,
               out_floor=round(accuracy.error_over_floor(o.detach(), ref.detach()), 3),
               state_rel=accuracy.rel_rms(ht.detach(), ref_state.detach()),
               nan=bool(torch.isnan(o).any() or torch.isnan(ht).any()))
    if backward:
        do = torch.randn_like(o)
        dht = torch.randn_like(ht)
        got = torch.autograd.grad((o.float() * do.float()).sum() + (ht * dht).sum(), leaves)
        want = torch.autograd.grad((ref * do.double()).sum() + (ref_state * dht.double()).sum(), r)
        names = ["dq", "dk", "dv"] + (["dg"] if g is not None else []) + (["ds0"] if s0 is not None else [])
        for n_, a, b in zip(names, got, want):
            if n_ in ("dg", "ds0"):  # float32 gradients: relative error
                row[n_ + "_rel"] = accuracy.rel_rms(a, b)
            else:
                row[n_ + "_floor"] = round(accuracy.error_over_floor(a, b), 3)
            row["nan"] = row["nan"] or bool(torch.isnan(a).any())
    print("check", row, flush=True)
    RESULTS["check"].append(row)


def check_poisoned(name, B, N, H, D, dtype, decay):
    """The forward kernel into NaN-filled buffers: every element written."""
    N = n(N)
    q, k, v, g, s0, _ = inputs(B, N, H, H, D, D, dtype, decay, None, True)
    p = tl_plan(q, v, g, IDENTITY)
    o = torch.full_like(v, float("nan"))
    ht = torch.full_like(s0, float("nan"))
    o_lin = torch.full(v.shape, float("nan"), device=DEV)
    kernel, grid, args, kw = launch.forward_call(p, q, k, v, g, None, None, None, s0, o, ht, o_lin, D ** -0.5,
                                                 IDENTITY)
    kernel[grid](*args, **kw)
    sync()
    written = not (torch.isnan(o).any() or torch.isnan(ht).any() or torch.isnan(o_lin).any())
    RESULTS["check"].append(dict(case=name, all_written=bool(written)))
    print("check", name, "every output written:", written, flush=True)


def check_mamba(name, b, n_, h, g, p, s, dtype, backward=True):
    n_ = n(n_)
    torch.manual_seed(1)
    x = torch.randn(b, n_, h, p, device=DEV, dtype=dtype)
    dt = torch.randn(b, n_, h, device=DEV) - 2
    A = -torch.rand(h, device=DEV) * 8 - 0.5
    Bm = torch.randn(b, n_, g, s, device=DEV, dtype=dtype) * s ** -0.5
    Cm = torch.randn(b, n_, g, s, device=DEV, dtype=dtype) * s ** -0.5
    D = torch.randn(h, device=DEV)
    z = torch.randn(b, n_, h, p, device=DEV, dtype=dtype)
    bias = torch.randn(h, device=DEV) * 0.5
    s0 = torch.randn(b, h, p, s, device=DEV)
    leaves = [x, dt, A, Bm, Cm, D, z, bias, s0]
    for t in leaves:
        t.requires_grad_(backward)
    y, hT = mamba2_chunk_scan(x, dt, A, Bm, Cm, chunk_size=256, D=D, z=z, dt_bias=bias, dt_softplus=True,
                              initial_states=s0, return_final_states=True)
    r = [t.detach().double().requires_grad_(backward) for t in leaves]
    ry, rh = mamba2_reference(*r[:5], D=r[5], z=r[6], dt_bias=r[7], dt_softplus=True, initial_states=r[8])
    row = dict(case=name, dtype=str(dtype).removeprefix("torch."), N=n_,
               out_floor=round(accuracy.error_over_floor(y.detach(), ry.detach()), 3),
               state_rel=accuracy.rel_rms(hT.detach(), rh.detach()), nan=bool(torch.isnan(y).any()))
    if backward:
        dy, dh = torch.randn_like(y), torch.randn_like(hT)
        got = torch.autograd.grad((y.float() * dy.float()).sum() + (hT * dh).sum(), leaves)
        want = torch.autograd.grad((ry * dy.double()).sum() + (rh * dh.double()).sum(), r)
        for n_, a, bb in zip(("dx", "ddt", "dA", "dB", "dC", "dD", "dz", "ddt_bias", "ds0"), got, want):
            if a.dtype == torch.float32:
                row[n_ + "_rel"] = accuracy.rel_rms(a, bb)
            else:
                row[n_ + "_floor"] = round(accuracy.error_over_floor(a, bb), 3)
    print("check", row, flush=True)
    RESULTS["check"].append(row)


def check_steps(dtype):
    B, H, D, T = 4, 8, 128, 6
    q, k, v, g, s0, _ = inputs(B, T, H, H, D, D, dtype, "scalar", None, True)
    ref, ref_state = linear_attention_reference(q, k, v, decay=g, initial_state=s0)
    state = s0.clone()
    outs = [linear_attention_step(q[:, t], k[:, t], v[:, t], state, decay=g[:, t]) for t in range(T)]
    o = torch.stack(outs, 1)
    row = dict(case="linear_attention_step d128", dtype=str(dtype).removeprefix("torch."),
               out_floor=round(accuracy.error_over_floor(o, ref), 3), state_rel=accuracy.rel_rms(state, ref_state))
    b, h, p, s = 4, 16, 64, 128
    x = torch.randn(b, 1, h, p, device=DEV, dtype=dtype)
    dt, A = torch.randn(b, 1, h, device=DEV), -torch.rand(h, device=DEV) * 4
    Bm, Cm = torch.randn(b, 1, 1, s, device=DEV, dtype=dtype), torch.randn(b, 1, 1, s, device=DEV, dtype=dtype)
    st = torch.randn(b, h, p, s, device=DEV)
    ry, rs = mamba2_reference(x, dt, A, Bm, Cm, dt_softplus=True, initial_states=st)
    y = mamba2_step(st, x[:, 0], dt[:, 0], A, Bm[:, 0], Cm[:, 0], dt_softplus=True)
    row.update(mamba_step_floor=round(accuracy.error_over_floor(y, ry[:, 0]), 3),
               mamba_state_rel=accuracy.rel_rms(st, rs))
    print("check", row, flush=True)
    RESULTS["check"].append(row)


def phase_check():
    for dtype in (torch.bfloat16, torch.float16):
        attempt("check", f"linear {dtype}", lambda: check_case("linear d64", 2, 1000, 4, 4, 64, 64, dtype))
        attempt("check", f"scalar {dtype}", lambda: check_case("simple gla d128", 2, 1000, 2, 2, 128, 128, dtype,
                                                              decay="scalar"))
        attempt("check", f"channel {dtype}", lambda: check_case("gla d64", 1, 600, 2, 2, 64, 64, dtype,
                                                               decay="channel"))
        attempt("check", f"based {dtype}", lambda: check_case("based d16 v64", 2, 1000, 4, 4, 16, 64, dtype,
                                                             feature_map="based", decay="scalar"))
        attempt("check", f"hedgehog {dtype}", lambda: check_case("hedgehog d64 f32", 1, 500, 2, 2, 64, 64, dtype,
                                                                feature_map="hedgehog", fh=32))
        attempt("check", f"mamba {dtype}", lambda: check_mamba("mamba2 p64 s128 g1", 1, 600, 8, 1, 64, 128, dtype))
        attempt("check", f"steps {dtype}", lambda: check_steps(dtype))
    dt = torch.bfloat16
    attempt("check", "long", lambda: check_case("simple gla d128 N4097 (forward)", 1, 4097, 2, 2, 128, 128, dt,
                                               decay="scalar", backward=False))
    attempt("check", "N1", lambda: check_case("simple gla d128 N1", 1, 1, 2, 2, 128, 128, dt, decay="scalar"))
    attempt("check", "N17", lambda: check_case("gla d256 N17", 1, 17, 1, 1, 256, 256, dt, decay="channel"))
    attempt("check", "extreme", lambda: check_case("decays near 0 and -inf d64", 1, 300, 2, 2, 64, 64, dt,
                                                  decay="extreme"))
    attempt("check", "fp32", lambda: check_case("simple gla d64 fp32", 1, 300, 2, 2, 64, 64, torch.float32,
                                                decay="scalar"))
    attempt("check", "poisoned", lambda: check_poisoned("forward into NaN buffers d128", 2, 999, 2, 128,
                                                        torch.bfloat16, "scalar"))


# --------------------------------------------------------------------------------------------
# time


def copy_time(nbytes: int) -> float:
    """ms of a torch copy that moves nbytes in all (reads half, writes half)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    return bench(lambda: dst.copy_(src))


def fla(name):
    try:
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
        else:
            return None
        return f
    except Exception as err:  # noqa: BLE001
        print(f"fla {name} does not import here ({type(err).__name__}: {err}): skipped", flush=True)
        return None


def fla_call(f, q, k, v, g=None, **extra):
    import inspect

    params = inspect.signature(f).parameters
    kw = {key: val for key, val in extra.items() if key in params}
    if g is not None:
        return f(q, k, v, g, **kw)
    return f(q, k, v, **kw)


def time_case(name, B, N, H, Dk, Dv, decay=None, feature_map=None, fla_name=None, backward=True):
    dtype = torch.bfloat16
    q, k, v, g, _, _ = inputs(B, N, H, H, Dk, Dv, dtype, decay, feature_map)
    nbytes = sum(t.numel() * t.element_size() for t in (q, k, v)) + v.numel() * v.element_size()
    if g is not None:
        nbytes += g.numel() * g.element_size()
    fwd = bench(lambda: linear_attention(q, k, v, feature_map=feature_map, decay=g))
    row = dict(case=name, shape=f"B{B} H{H} N{N} Dk{Dk} Dv{Dv}", fwd_ms=fwd, bound_ms=nbytes / HBM_GBS / 1e6,
               copy_ms=copy_time(nbytes))
    f = fla(fla_name) if fla_name else None
    if f is not None:
        try:
            extra = dict(use_norm=False) if "based" in fla_name else {}
            row["fla_fwd_ms"] = bench(lambda: fla_call(f, q, k, v, g, **extra))
        except Exception as err:  # noqa: BLE001
            row["fla_error"] = f"{type(err).__name__}: {err}"
    if backward:
        leaves = [t.requires_grad_() for t in (q, k, v, g) if t is not None]
        o = linear_attention(q, k, v, feature_map=feature_map, decay=g)
        do = torch.randn_like(o)
        row["bwd_ms"] = bench(lambda: torch.autograd.grad(o, leaves, do, retain_graph=True))
        if f is not None:
            try:
                extra = dict(use_norm=False) if "based" in fla_name else {}
                fo = fla_call(f, q, k, v, g, **extra)
                fo = fo[0] if isinstance(fo, tuple) else fo
                row["fla_bwd_ms"] = bench(lambda: torch.autograd.grad(fo, leaves, do, retain_graph=True))
            except Exception as err:  # noqa: BLE001
                row["fla_bwd_error"] = f"{type(err).__name__}: {err}"
    print("time", row, flush=True)
    RESULTS["time"].append(row)


def time_mamba(b=16, n=4096, h=80, g=1, p=64, s=128):
    dtype = torch.bfloat16
    x = torch.randn(b, n, h, p, device=DEV, dtype=dtype)
    dt = torch.randn(b, n, h, device=DEV) - 2
    A = -torch.rand(h, device=DEV) * 8
    Bm = torch.randn(b, n, g, s, device=DEV, dtype=dtype)
    Cm = torch.randn(b, n, g, s, device=DEV, dtype=dtype)
    D, z, bias = torch.randn(h, device=DEV), torch.randn_like(x), torch.randn(h, device=DEV)
    nbytes = 3 * x.numel() * 2 + 2 * Bm.numel() * 2 + dt.numel() * 4  # x, z, y; B, C; dt
    row = dict(case="mamba2 2.7B shape", shape=f"B{b} H{h} N{n} P{p} S{s}",
               fwd_ms=bench(lambda: mamba2_chunk_scan(x, dt, A, Bm, Cm, D=D, z=z, dt_bias=bias, dt_softplus=True)),
               bound_ms=nbytes / HBM_GBS / 1e6, copy_ms=copy_time(nbytes))
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

        row["mamba_ssm_fwd_ms"] = bench(lambda: mamba_chunk_scan_combined(x, dt, A, Bm, Cm, 256, D=D, z=z, dt_bias=bias,
                                                                           dt_softplus=True))
    except Exception as err:  # noqa: BLE001
        print(f"mamba_ssm does not import or run here ({type(err).__name__}: {err}): skipped", flush=True)
    f = fla("chunk_simple_gla")
    if f is not None:  # the same SSD math's cost: q = C, k = B (dt folded in), v = x, g = dt A, h heads of p
        try:
            kk = (Bm.expand(b, n, h, s) * 1.0).contiguous()
            qq = Cm.expand(b, n, h, s).contiguous()
            gg = (dt * A).float()
            row["fla_simple_gla_fwd_ms"] = bench(lambda: f(qq, kk, x, gg, scale=1.0))
        except Exception as err:  # noqa: BLE001
            row["fla_error"] = f"{type(err).__name__}: {err}"
    print("time", row, flush=True)
    RESULTS["time"].append(row)


def time_step(B=16, H=16, D=128):
    q = torch.randn(B, H, D, device=DEV, dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    g = -torch.rand(B, H, device=DEV)
    state = torch.randn(B, H, D, D, device=DEV)
    ms = bench(lambda: linear_attention_step(q, k, v, state, decay=g))
    nbytes = 2 * state.numel() * 4
    row = dict(case="decode step d128 (fp32 state)", shape=f"B{B} H{H}", fwd_ms=ms, bound_ms=nbytes / HBM_GBS / 1e6,
               copy_ms=copy_time(nbytes))
    print("time", row, flush=True)
    RESULTS["time"].append(row)


def phase_time():
    cases = [
        ("linear d128", dict(B=16, N=4096, H=16, Dk=128, Dv=128, fla_name="chunk_linear_attn")),
        ("simple gla d128", dict(B=16, N=4096, H=16, Dk=128, Dv=128, decay="scalar", fla_name="chunk_simple_gla")),
        ("gla d128", dict(B=16, N=4096, H=16, Dk=128, Dv=128, decay="channel", fla_name="chunk_gla")),
        ("based d16 v64", dict(B=16, N=4096, H=16, Dk=16, Dv=64, feature_map="based", fla_name="parallel_based")),
    ]
    for name, kw in cases:
        attempt("time", name, lambda: time_case(name, **kw))
    attempt("time", "based fused_chunk", lambda: time_case("based d16 v64 (vs fused_chunk_based)", 16, 4096, 16, 16, 64,
                                                           feature_map="based", fla_name="fused_chunk_based",
                                                           backward=False))
    attempt("time", "mamba", time_mamba)
    attempt("time", "step", time_step)


# --------------------------------------------------------------------------------------------
# sweep


def phase_sweep():
    dtype = torch.bfloat16
    for name, Dk, Dv, decay, feature, chunks, bvs, shapes in (
            ("simple gla d128", 128, 128, "scalar", IDENTITY, (32, 64), (64, 128), ((4, 2), (8, 2), (8, 3))),
            ("based d16 v64", 16, 64, None, BASED, (16, 32, 64), (32, 64), ((4, 2), (8, 2)))):
        q, k, v, g, _, _ = inputs(16, 4096, 16, 16, Dk, Dv, dtype, decay, "based" if feature == BASED else None)
        for chunk in chunks:
            for bv in bvs:
                for warps, stages in shapes:
                    over = dict(BV=bv, num_warps=warps, num_stages=stages)

                    def one():
                        p = tl_plan(q, v, g, feature, chunk, **over)
                        run = lambda: launch.forward(p, q, k, v, g, None, None, None, None, Dk ** -0.5, feature,
                                                     final_state=False, keep_linear=False)
                        ms = bench(run)
                        row = dict(case=name, chunk=chunk, **over, fwd_ms=ms)
                        print("sweep", row, flush=True)
                        RESULTS["sweep"].append(row)
                    attempt("sweep", f"{name} {chunk} {over}", one)


# --------------------------------------------------------------------------------------------


def table() -> str:
    lines = ["", "case | shape | tilecore fwd ms | bwd ms | peer fwd ms (x) | peer bwd ms (x) | % of HBM bound "
             "| copy ms"]
    for r in RESULTS["time"]:
        peer = next((r[k] for k in ("fla_fwd_ms", "mamba_ssm_fwd_ms", "fla_simple_gla_fwd_ms") if k in r), None)
        peer_b = r.get("fla_bwd_ms")
        lines.append(" | ".join([
            r["case"], r["shape"], f"{r['fwd_ms']:.3f}", f"{r['bwd_ms']:.3f}" if "bwd_ms" in r else "-",
            f"{peer:.3f} ({peer / r['fwd_ms']:.2f}x)" if peer else "-",
            f"{peer_b:.3f} ({peer_b / r['bwd_ms']:.2f}x)" if peer_b and "bwd_ms" in r else "-",
            f"{100 * r['bound_ms'] / r['fwd_ms']:.0f}%", f"{r['copy_ms']:.3f}"]))
    lines.append("")
    lines.append("check | dtype | N | out / floor | state rel | grads (/ floor; _rel: relative) | NaN")
    for r in RESULTS["check"]:
        grads = {k: v for k, v in r.items() if k.endswith("_floor") and k != "out_floor" or k.endswith("_rel")
                 and k != "state_rel"}
        state = f"{r['state_rel']:.2e}" if "state_rel" in r else r.get("all_written", "-")
        cells = (r["case"], r.get("dtype", "-"), r.get("N", "-"), r.get("out_floor", "-"), state, grads or "-",
                 r.get("nan", "-"))
        lines.append(" | ".join(str(x) for x in cells))
    if RESULTS["sweep"]:
        best = {}
        for r in RESULTS["sweep"]:
            if r["case"] not in best or r["fwd_ms"] < best[r["case"]]["fwd_ms"]:
                best[r["case"]] = r
        lines.append("")
        lines += [f"sweep best {name}: {r}" for name, r in best.items()]
    if RESULTS["errors"]:
        lines.append("")
        lines += [f"ERROR {e}" for e in RESULTS["errors"]]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--phases", default="check,time,sweep")
    parser.add_argument("--dry", action="store_true", help="the check phase on the CPU (interpreter), small")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    parser.add_argument("--budget", type=float, default=225.0, help="seconds; no new case past it (the check "
                        "and time phases stop earlier: 110 and 200 s at the default)")
    args = parser.parse_args()
    global OUT
    OUT = Path(args.out)
    scale = args.budget / 225.0
    for key in BUDGET:
        BUDGET[key] *= scale
    phases = args.phases.split(",")
    if DRY:
        phases = [p for p in phases if p == "check"]
        RESULTS["meta"] = {"dry": True}
    elif not torch.cuda.is_available():
        print("no GPU here", file=sys.stderr)
        return 2
    if not DRY:
        try:
            from experiments.common.meta import meta
            RESULTS["meta"] = meta()
        except Exception as err:  # noqa: BLE001
            RESULTS["meta"] = {"error": str(err), "gpu": torch.cuda.get_device_name()}
    print(RESULTS["meta"], flush=True)
    if "check" in phases:
        phase_check()
    if "time" in phases:
        phase_time()
    if "sweep" in phases:
        phase_sweep()
    save()
    print(table())
    print(f"\n{elapsed():.0f} s; JSON: {OUT / 'linear_attention.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
