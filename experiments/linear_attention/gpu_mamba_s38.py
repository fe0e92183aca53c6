"""Mamba-2's Gluon chunk step (gluon_forward.la_fwd_gluon_kernel with beta: the transposed step) on the H100, one job
of <= 60 s: float64 checks and CUDA-graph timings on the 2.7B shape (B16 H80 N4096, headdim 64, d_state 128, one
group, D and z; bf16), without states and with an initial state and the final states, the napkin's HBM bound beside.

The states' layout matters (notes decision 170): the transposed step loads and stores S^T's rows, and where the
feature stride is 1 (a specialized constant) their offsets are immediates; with a stride read at run time each
state's 64 feature offsets a thread are loop-invariant, hoisted out of the persistent tile loop and spilled. The op
passes the states in mamba_ssm's (b, h, p, s) layout (a contiguous initial_states, and gluon_forward.empty_state's
final states), so the cases:

* ``stateless``;
* ``states``: h0 and ht in the (b, h, p, s) layout, as mamba2_chunk_scan passes them;
* ``h0_op``: h0 (B, H, F, Dv)-contiguous (a caller's non-contiguous (b, h, p, s) initial_states), ht as the op's.

Variants: ``shipped`` (the kernel as launch.forward launches it); ``h0copy`` (h0 copied into the (b, h, p, s) layout
on the host before the launch where its feature stride is not 1: the copy's 42 MB against the spill, timed with the
launch). ``--op``: the public mamba2_chunk_scan checked too (D, z, h0, final states; a second call's bits).

Checks (a process a variant): NaN-poisoned y and final states, every element written, error over the rounding floor
against the float64 recurrence (D z N 1008; strong decays A in [-80, -20] N 304 with h0 and ht in both layouts: partial
last chunks), the states' relative error (~1.6e-3: the update's bf16 operands). Timing: the kernel alone on prepared
arguments, CUDA-graph medians of interleaved rounds (order reversed every other round).

Session 38: call 1 (runs/mamba_s38b_run1_session38_h100.txt, the script then also held the former step (s36) and
3-stage variants, since removed: notes decisions 170-172); call 3 (runs/mamba_s38c_run3_session38_h100.txt: the
states 0.873 ms, stateless 0.878; a (B, H, F, Dv) h0 0.954, h0copy 0.971: no copy).

    PYTHONPATH=/tmp/site:. python3 experiments/linear_attention/gpu_mamba_s38.py [--variants shipped,h0copy] [--op]

JSON to $OUT/mamba_s38.json (rewritten each row); a short table last.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.common.gpu_script import Run, check, poisoned, time_rounds  # noqa: E402

SHAPE = (16, 4096, 80)  # B, N, H (headdim 64, d_state 128, one group)
CASES = ("states", "stateless", "h0_op")


def launcher(variant: str, q, k, v, g, beta, d_skip, z, h0, o, ht, scale: float):
    """The variant's launch on these inputs (g and beta (B, N, H): prepared here as the library does)."""
    from tilecore.ops.linear_attention import configs
    from tilecore.ops.linear_attention import gluon_forward as gf

    G, beta_h = gf.chunk_heads_prep(g, beta, gf.BT_GLUON)
    d_skip = d_skip.float().contiguous()
    copy = variant == "h0copy" and h0 is not None and h0.stride(-2) != 1
    grid, args, warps = gf.launch_args(q, k, v, G, beta_h, d_skip, z, h0, o, ht, scale, configs.GLUON_STAGES)

    def run():
        if copy:  # the (b, h, p, s) layout's buffer, as a caller's contiguous initial_states would be
            args["H0"] = h0.transpose(-1, -2).contiguous().transpose(-1, -2)
            args.update(s0b=args["H0"].stride(0), s0h=args["H0"].stride(1), s0f=1, s0v=args["H0"].stride(3))
        gf.la_fwd_gluon_kernel[grid](**args, num_warps=warps)
    return run


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


def states(B, H, S, P, layout: str, fill=None):
    """A (B, H, S, P) float32 state (the kernel's (F, Dv)) in ``layout``: "op" contiguous, "mamba" the transposed
    view of a contiguous (B, H, P, S) (gluon_forward.empty_state's with beta)."""
    if layout == "op":
        t = torch.empty(B, H, S, P, device="cuda")
    else:
        t = torch.empty(B, H, P, S, device="cuda").transpose(-1, -2)
    if fill == "randn":
        t.copy_(torch.randn(B, H, S, P, device="cuda"))
    elif fill == "nan":
        t.fill_(float("nan"))
    return t


def check_mamba(variant, label, B, N, H, h0_layout=None, a_range=(-8.5, -0.5)) -> dict:
    from tilecore.ops.linear_attention import mamba2_reference

    x, dt, A, Bm, Cm, D, z = mamba_inputs(B, N, H, a_range=a_range)
    P, S = x.shape[-1], Bm.shape[-1]
    h0 = states(B, H, S, P, h0_layout, "randn") if h0_layout else None
    ht = states(B, H, S, P, "mamba", "nan") if h0_layout else None
    o = poisoned(x)
    launcher(variant, Cm, Bm, x, dt * A, dt, D[:, None].expand(H, P), z, h0, o, ht, 1.0)()
    torch.cuda.synchronize()
    ref, ref_state = mamba2_reference(x.double(), dt.double(), A.double(), Bm.double(), Cm.double(), D=D.double(),
                                      z=z.double(), initial_states=None if h0 is None else h0.transpose(-1, -2).double())
    row = dict(variant=variant, case=label, **check(o, ref))
    if h0_layout:
        ref_t = ref_state.transpose(-1, -2)
        row.update(state_written=bool(torch.isfinite(ht).all()),
                   state_rel=float((ht.double() - ref_t).norm() / ref_t.norm()))
    return row


def check_op(variant: str) -> dict:
    """The public mamba2_chunk_scan (the kernel through the op's keyed launch) against the float64 recurrence: D, z,
    an initial state and the final states ((b, h, p, s), contiguous), N 1000; a second call's y the same bits."""
    import tilecore
    from tilecore.ops.linear_attention import mamba2_reference

    x, dt, A, Bm, Cm, D, z = mamba_inputs(2, 1000, 8, seed=13)
    h0 = torch.randn(2, 8, 64, 128, device="cuda")
    y, ht = tilecore.mamba2_chunk_scan(x, dt, A, Bm, Cm, D=D, z=z, initial_states=h0, return_final_states=True)
    y2 = tilecore.mamba2_chunk_scan(x, dt, A, Bm, Cm, D=D, z=z, initial_states=h0)
    torch.cuda.synchronize()
    ref, ref_state = mamba2_reference(x.double(), dt.double(), A.double(), Bm.double(), Cm.double(), D=D.double(),
                                      z=z.double(), initial_states=h0.double())
    return dict(variant=variant, case="public mamba2_chunk_scan D z h0 final N 1000", **check(y, ref),
                state_written=bool(torch.isfinite(ht).all()) and ht.is_contiguous(),
                state_rel=float((ht.double() - ref_state).norm() / ref_state.norm()),
                second_call_same=bool(torch.equal(y, y2)))


def timed_args(case: str):
    B, N, H = SHAPE
    x, dt, A, Bm, Cm, D, z = mamba_inputs(B, N, H)
    P, S = x.shape[-1], Bm.shape[-1]
    h0 = ht = None
    if case != "stateless":
        h0 = states(B, H, S, P, "op" if case == "h0_op" else "mamba", "randn").mul_(0.1)
        ht = states(B, H, S, P, "mamba")
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


def warm(variant: str, op: bool):
    """In a process of its own: the variant's checks, then each timed case's compile (N 1008 and 304: partial last
    chunks, and the timed launches' specialization: N a multiple of 16)."""
    t0 = time.time()
    rows = []
    try:
        rows.append(check_mamba(variant, "D z N 1008", 2, 1008, 8))
        for layout in ("mamba", "op"):
            rows.append(check_mamba(variant, f"strong h0 {layout} N 304", 2, 304, 4, layout, (-80.0, -20.0)))
        if op and variant == "shipped":
            rows.append(check_op(variant))
        for case in CASES:
            launcher(variant, *timed_args(case))()
        torch.cuda.synchronize()
        return variant, None, round(time.time() - t0, 1), rows
    except Exception as err:  # noqa: BLE001
        return variant, f"{type(err).__name__}: {err}"[:300], round(time.time() - t0, 1), rows


class CaseDeadline:
    """time_rounds's deadline for one case: no round starts past ``end``."""

    def __init__(self, end: float):
        self.end = end

    def left(self) -> float:
        return self.end - time.time()


def main():
    import concurrent.futures as cf
    import multiprocessing as mp

    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="shipped,h0copy")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--op", action="store_true", help="also check the public mamba2_chunk_scan")
    a = ap.parse_args()
    variants = a.variants.split(",")
    cases = a.cases.split(",")
    run = Run("mamba_s38", deadline=57)
    run.extra["variants"] = variants
    pool = cf.ProcessPoolExecutor(max_workers=len(variants), mp_context=mp.get_context("spawn"))
    futs = [pool.submit(warm, n, a.op) for n in variants]
    bounds = {s: run.attempt("napkin", napkin_ms, s) for s in (False, True)}
    run.extra["napkin_ms"], run.extra["napkin_with_states_ms"] = bounds[False], bounds[True]
    ok = []

    def collect():
        for fut in cf.as_completed(futs, timeout=max(1.0, 40 - run.elapsed())):
            got = run.attempt("warm (a worker died)", fut.result)
            if got is None:
                continue
            name, err, secs, rows = got
            for r in rows:
                run.row(f"check {name} {r['case']}", **r)
            if err:
                run.errors.append(f"warm {name}: {err}")
            if not err and all(r["pass"] and r.get("state_written", True) and r.get("state_rel", 0) < 2e-2
                               and r.get("second_call_same", True) for r in rows):
                ok.append(name)
            run.say(f"warm {name}: {secs} s, error {err}")
    run.attempt("warm (not every variant done by 40 s)", collect)
    pool.shutdown(wait=False, cancel_futures=True)
    ok = [n for n in variants if n in ok]
    run.say(f"passed: {ok}")
    for i, case in enumerate(cases):
        if run.left() < 5 or not ok:
            break
        share = CaseDeadline(time.time() + run.left() / (len(cases) - i))  # (each case its share of what is left)
        args = timed_args(case)
        fns = {n: launcher(n, *args) for n in ok}
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        res = run.attempt(f"time {case}", time_rounds, fns, rounds=a.rounds, graph=True, eager=False,
                          deadline=share)
        if res:
            row = dict(case=case, **res)
            shipped, bound = res.get("shipped_graph_ms"), bounds[case != "stateless"]
            for n in fns:
                ms = res.get(f"{n}_graph_ms")
                if ms and shipped and n != "shipped":
                    row[f"{n}_over_shipped"] = round(shipped / ms, 4)  # > 1: n faster
                if ms and bound:
                    row[f"{n}_napkin_pct"] = round(100 * bound / ms, 1)
            run.row(f"time {case}", **row)
            run.say("  " + ", ".join(f"{n} {res.get(f'{n}_graph_ms')} ms {res[f'{n}_rounds'].get('graph')}"
                                     for n in fns))
    cols = ["name", "pass", "err_over_floor", "state_rel"] + [f"{n}_graph_ms" for n in variants] + [
        f"{n}_over_shipped" for n in variants if n != "shipped"] + [f"{n}_napkin_pct" for n in variants]
    run.finish(cols)


if __name__ == "__main__":
    main()
