"""Session 37 (HB; one job of <= 60 s): the linear-attention Gluon forward as shipped against the file before the
session's changes (issue 30's removals; Mamba-2's step on the transposed state), each checked against float64 and
timed from CUDA graphs in interleaved rounds in the same process.

Variants (``--variants``, comma-separated):

* ``shipped``: gluon_forward as the library launches it (G, beta and z through the stage; with beta Mamba-2's step on
  the transposed state: S^T in registers as the register operand of S^T Q^T and the update's accumulator, P^T
  through shared memory, the ALU's work under the wgmmas).
* ``s36``: gluon_forward_s36.py (this folder), the file before the session's changes, launched with the flags configs
  then shipped (Z_STAGE, G_STAGE, SILU_TANH; EARLY_WV and LEAN with beta): without beta its PTX is the shipped one's
  but for the parameter list (G, BETA, Z and their strides), whose constant-bank offsets move ptxas's schedule; with
  beta it is the former Mamba-2 step.

Cases: Mamba-2 2.7B (B16 H80 N4096, headdim 64, d_state 128, one group, D and z; bf16), the scalar decay and no decay
at d 128 (B16 H16 N4096, bf16). Checks (a process a variant: its compiles beside the others'): NaN-poisoned o and
final states, every element written, error over the rounding floor against the float64 recurrence (Mamba-2 bf16
N 1000 with D and z, strong decays A in [-80, -20] N 300 with h0 and a final state; scalar decay with a reset, h0
and final state N 1000; no decay N 1000), ``--op`` the public mamba2_chunk_scan (D, z, h0, final states), and o's
bits at the timed shape (shipped and s36 must agree where their math is the same: without beta). Timing: the kernel
alone on prepared arguments (G and beta head-major), CUDA-graph medians of interleaved rounds (order reversed every
other round), the napkin's HBM bound for Mamba-2 beside.

Calls of session 37 (runs/mamba_ab37_run2_session37_h100.txt, runs/mamba_m37b_run3_session37_h100.txt): every variant
right; the transposed step's form 1 0.950x / 0.943x, form 2 1.043x the former step (on since, the only form: notes
decisions 148-150); without beta the kernel as s36 within the rounds' noise (0.996x, 1.004x).

    PYTHONPATH=/tmp/site:. python3 experiments/linear_attention/gpu_mamba_s37.py [--variants shipped,s36] [--op]

JSON to $OUT/mamba_s37.json (rewritten each row); a short table last.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from experiments.common.gpu_script import Run, check, poisoned, time_rounds  # noqa: E402

CASES = {  # name -> (B, N, Hqk, H, Dk, Dv, decay, Mamba-2's beta D z)
    "mamba2": (16, 4096, 1, 80, 128, 64, True, True),
    "decay": (16, 4096, 16, 16, 128, 128, True, False),
    "linear": (16, 4096, 16, 16, 128, 128, False, False),
    # Mamba-2 with an initial state and the final states (prefill carrying a state): the transposed step spills 2.2 KB
    # in each tile's start and finish there (none in the chunk loop)
    "mamba2_states": (16, 4096, 1, 80, 128, 64, True, True),
}
STAGES = 2  # configs.GLUON_STAGES


def module(variant: str):
    if variant == "s36":
        import gluon_forward_s36 as m
    else:
        from tilecore.ops.linear_attention import gluon_forward as m
    return m


def launcher(variant: str, q, k, v, g, beta, d_skip, z, h0, o, ht, scale: float):
    """The variant's kernel on these inputs (g and beta as (B, N, H): prepared here as the library does)."""
    m = module(variant)
    from tilecore.ops.linear_attention import gluon_forward as gf

    G, beta_h = gf.chunk_heads_prep(g, beta, gf.BT_GLUON) if g is not None else (None, None)
    if d_skip is not None:
        d_skip = d_skip.float().contiguous()
    kw = {}
    if variant == "s36":
        mamba = beta is not None
        kw = dict(z_stage=True, g_stage=g is not None, early_wv=mamba, silu_tanh=True, lean=mamba)
    grid, args, warps = m.launch_args(q, k, v, G, beta_h, d_skip, z, h0, o, ht, scale, STAGES, **kw)
    return lambda: m.la_fwd_gluon_kernel[grid](**args, num_warps=warps)


def mamba_inputs(B, N, H, dtype, a_range=(-8.5, -0.5), seed=5):
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


def check_mamba(variant, label, B, N, H, dtype, states: bool, a_range=(-8.5, -0.5)) -> dict:
    from tilecore.ops.linear_attention import mamba2_reference

    x, dt, A, Bm, Cm, D, z = mamba_inputs(B, N, H, dtype, a_range)
    P, S = x.shape[-1], Bm.shape[-1]
    h0 = torch.randn(B, H, S, P, device="cuda") if states else None  # the kernel's (F, Dv) states
    o = poisoned(x)
    ht = poisoned(torch.empty(B, H, S, P, device="cuda")) if states else None
    launcher(variant, Cm, Bm, x, dt * A, dt, D[:, None].expand(H, P), z, h0, o, ht, 1.0)()
    torch.cuda.synchronize()
    ref, ref_state = mamba2_reference(x.double(), dt.double(), A.double(), Bm.double(), Cm.double(), D=D.double(),
                                      z=z.double(), initial_states=None if h0 is None else h0.transpose(-1, -2).double())
    row = dict(variant=variant, case=f"mamba2 {label}", **check(o, ref))
    if states:
        st = check(ht, ref_state.transpose(-1, -2), tol=1e9)  # (float32 states: the floor is float32's; see rel)
        row.update(state_written=st["written"], state_rel=float((ht.double() - ref_state.transpose(-1, -2)).norm()
                                                                / ref_state.norm()))
    return row


def check_linear(variant, decay: bool) -> dict:
    from tilecore.ops.linear_attention import linear_attention_reference

    torch.manual_seed(9)
    B, N, H, D = 2, 1000, 2, 128
    bf = torch.bfloat16
    q = (torch.randn(B, N, H, D, device="cuda") * D ** -0.5).to(bf)
    k = (torch.randn(B, N, H, D, device="cuda") * D ** -0.5).to(bf)
    v = torch.randn(B, N, H, D, device="cuda").to(bf)
    g = None
    if decay:
        g = -torch.rand(B, N, H, device="cuda") * 0.3
        g[:, N // 3] = float("-inf")  # a reset
    h0 = torch.randn(B, H, D, D, device="cuda")
    o, ht = poisoned(v), poisoned(h0)
    launcher(variant, q, k, v, g, None, None, None, h0, o, ht, 0.5)()
    torch.cuda.synchronize()
    ref, ref_state = linear_attention_reference(q.double(), k.double(), v.double(), decay=None if g is None else
                                                g.double(), scale=0.5, initial_state=h0.double())
    return dict(variant=variant, case=f"{'decay' if decay else 'linear'} d128 reset h0 N 1000", **check(o, ref),
                state_written=bool(torch.isfinite(ht).all()),
                state_rel=float((ht.double() - ref_state).norm() / ref_state.norm()))


def timed_inputs(case: str):
    B, N, Hqk, H, Dk, Dv, decay, mamba = CASES[case]
    bf = torch.bfloat16
    if mamba:
        x, dt, A, Bm, Cm, D, z = mamba_inputs(B, N, H, bf)
        states = case.endswith("_states")
        return dict(q=Cm, k=Bm, v=x, g=dt * A, beta=dt, d_skip=D[:, None].expand(H, Dv), z=z, scale=1.0,
                    h0=torch.randn(B, H, Dk, Dv, device="cuda") * 0.1 if states else None,
                    ht=torch.empty(B, H, Dk, Dv, device="cuda") if states else None)
    torch.manual_seed(3)
    q = (torch.randn(B, N, Hqk, Dk, device="cuda") * Dk ** -0.5).to(bf)
    k = (torch.randn(B, N, Hqk, Dk, device="cuda") * Dk ** -0.5).to(bf)
    v = torch.randn(B, N, H, Dv, device="cuda").to(bf)
    g = -torch.rand(B, N, H, device="cuda") * 0.1 if decay else None
    return dict(q=q, k=k, v=v, g=g, beta=None, d_skip=None, z=None, scale=Dk ** -0.5)


def timed_call(variant: str, case: str, t: dict, o):
    return launcher(variant, t["q"], t["k"], t["v"], t["g"], t["beta"], t["d_skip"], t["z"], t.get("h0"), o,
                    t.get("ht"), t["scale"])


def check_op(variant: str) -> dict:
    """The public mamba2_chunk_scan (the shipped kernel through the op's keyed launch) against the float64
    recurrence: D, z, an initial state and the final states, N 1000; a second call's y the same bits."""
    import tilecore
    from tilecore.ops.linear_attention import mamba2_reference

    x, dt, A, Bm, Cm, D, z = mamba_inputs(2, 1000, 8, torch.bfloat16, seed=13)
    h0 = torch.randn(2, 8, 64, 128, device="cuda")
    y, ht = tilecore.mamba2_chunk_scan(x, dt, A, Bm, Cm, D=D, z=z, initial_states=h0, return_final_states=True)
    y2 = tilecore.mamba2_chunk_scan(x, dt, A, Bm, Cm, D=D, z=z, initial_states=h0)  # (its keyed launch)
    torch.cuda.synchronize()
    ref, ref_state = mamba2_reference(x.double(), dt.double(), A.double(), Bm.double(), Cm.double(), D=D.double(),
                                      z=z.double(), initial_states=h0.double())
    return dict(variant=variant, case="public mamba2_chunk_scan D z h0 final N 1000", **check(y, ref),
                state_written=bool(torch.isfinite(ht).all()),
                state_rel=float((ht.double() - ref_state).norm() / ref_state.norm()),
                second_call_same=bool(torch.equal(y, y2)))


def warm(variant: str, cases: list, op: bool = False):
    """In a process of its own: the variant's checks, then each timed case once (its compile) with o's digest (the
    scalar decay's and no decay's checks only where their cases are timed)."""
    t0 = time.time()
    rows, digests = [], {}
    try:
        rows.append(check_mamba(variant, "bf16 D z N 1000", 2, 1000, 8, torch.bfloat16, False))
        rows.append(check_mamba(variant, "bf16 strong decays h0 final N 300", 2, 300, 4, torch.bfloat16, True,
                                (-80.0, -20.0)))
        if "decay" in cases:
            rows.append(check_linear(variant, True))
        if "linear" in cases:
            rows.append(check_linear(variant, False))
        if op and variant == "shipped":
            rows.append(check_op(variant))
        for case in cases:
            t = timed_inputs(case)
            o = poisoned(t["v"])
            timed_call(variant, case, t, o)()
            torch.cuda.synchronize()
            digests[case] = hashlib.sha1(o.view(torch.int16).cpu().numpy().tobytes()).hexdigest()[:12]
        return variant, None, round(time.time() - t0, 1), rows, digests
    except Exception as err:  # noqa: BLE001
        return variant, f"{type(err).__name__}: {err}"[:300], round(time.time() - t0, 1), rows, digests


def napkin_ms() -> float:
    from tilecore.napkin import models
    from tilecore.napkin.engine import derive

    r = derive(models.mamba2_ssd(batch=16, heads=80, seq=4096, headdim=64, state=128, chunk=64, groups=1, gate=True,
                                 skip=True), "h100")
    return 1e3 * r.compulsory_bytes / r.gpu.levels[0].bandwidth


def main():
    import concurrent.futures as cf
    import multiprocessing as mp

    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="shipped,s36")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--op", action="store_true", help="also check the public mamba2_chunk_scan (shipped)")
    a = ap.parse_args()
    variants = a.variants.split(",")
    cases = a.cases.split(",")
    run = Run("mamba_s37", deadline=56)
    run.extra["variants"] = variants
    pool = cf.ProcessPoolExecutor(max_workers=len(variants), mp_context=mp.get_context("spawn"))
    futs = [pool.submit(warm, n, cases, a.op) for n in variants]
    run.extra["napkin_mamba2_ms"] = run.attempt("napkin", napkin_ms)
    ok, digests = [], {}

    def collect():
        for fut in cf.as_completed(futs, timeout=max(1.0, 40 - run.elapsed())):
            got = run.attempt("warm (a worker died)", fut.result)
            if got is None:
                continue
            name, err, secs, rows, dig = got
            for r in rows:
                run.row(f"check {name} {r['case']}", **r)
            digests[name] = dig
            if err:
                run.errors.append(f"warm {name}: {err}")
            # (the float32 states' error is the bf16 operands' of the update: ~1e-3 relative)
            if not err and all(r["pass"] and r.get("state_written", True) and r.get("state_rel", 0) < 2e-2
                               for r in rows):
                ok.append(name)
            run.say(f"warm {name}: {secs} s, error {err}, digests {dig}")
    run.attempt("warm (not every variant done by 40 s)", collect)
    pool.shutdown(wait=False, cancel_futures=True)
    run.extra["digests"] = digests
    ok = [n for n in variants if n in ok]
    run.say(f"passed: {ok}")
    for case in cases:
        if run.left() < 6 or not ok:
            break
        t = timed_inputs(case)
        fns = {n: timed_call(n, case, t, torch.empty_like(t["v"])) for n in ok}
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        res = run.attempt(f"time {case}", time_rounds, fns, rounds=a.rounds, graph=True, eager=False, deadline=run)
        if res:
            # o's bits: the shipped kernel's and s36's agree without beta (the same math); Mamba-2's steps round
            # differently
            row = dict(case=case, same_bits=len({digests[n].get(case) for n in fns}) == 1, **res)
            nap = run.extra.get("napkin_mamba2_ms")
            base = res.get("shipped_graph_ms")
            for n in fns:
                ms = res.get(f"{n}_graph_ms")
                if ms and n != "shipped" and base:
                    row[f"speedup_{n}"] = round(base / ms, 4)  # > 1: n faster than the shipped kernel
                if ms and case.startswith("mamba2") and nap:
                    row[f"{n}_napkin_pct"] = round(100 * nap / ms, 1)
            run.row(f"time {case}", **row)
            run.say("  " + ", ".join(f"{n} {res.get(f'{n}_graph_ms')} ms {res[f'{n}_rounds'].get('graph')}"
                                     for n in fns))
    cols = ["name", "pass", "err_over_floor", "state_rel", "same_bits"] + [f"{n}_graph_ms" for n in variants] + [
        f"speedup_{n}" for n in variants if n != "shipped"] + [f"{n}_napkin_pct" for n in variants]
    run.finish(cols)


if __name__ == "__main__":
    main()
