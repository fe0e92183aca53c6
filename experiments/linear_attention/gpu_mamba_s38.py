"""Session 38 (HB; one job of <= 60 s): Mamba-2's chunk step on the transposed state (shipped) against the former
step (gluon_forward_s36.py, this folder), without states and with an initial state and the final states, each checked
against float64 and timed from CUDA graphs in interleaved rounds in the same process.

The question (notes decision 151): with h0 and final states the transposed step read 0.987x the former step (2.2 KB a
thread spilled). The spill is the states' 64-bit feature offsets (64 a thread for h0 and for ht, each a runtime stride
times a column: loop-invariant, so hoisted out of the persistent tile loop and kept across it); where the feature dim
is the contiguous one (stride 1, specialized: the offsets are immediates) ptxas spills 152 B, none in the loop. So the
states' layout is a case here:

* ``states_op``: h0 and ht (B, H, F, Dv) contiguous (the linear-attention op's layout; decision 151's run);
* ``states_mamba``: h0 and ht laid out (B, H, Dv, F) (mamba_ssm's (b, h, p, s)) and passed as the (B, H, F, Dv)
  transposed view, as mamba2_chunk_scan passes a contiguous initial_states.

Variants: ``shipped`` (gluon_forward, 2 stages), ``s36`` (the former step: S through shared memory, EARLY_WV and
LEAN), ``st3`` (the shipped step at 3 stages: o^T staged for its TMA store in the consumer's P^T buffer, free after
P V, so the epilogue buffers' 16 KB go and a third stage fits, 217.6 KB), ``p2`` (o^T through P^T's buffer at 2
stages: that change alone). ``--op``: the public mamba2_chunk_scan checked too (D, z, h0, final states).
Checks (a process a variant): NaN-poisoned y and final states, every element written, error over the rounding floor
against the float64 recurrence (bf16 D z N 1000; strong decays A in [-80, -20] with h0 and final states in both
layouts, N 300); the states' relative error. Timing: the kernel alone on prepared arguments, CUDA-graph medians of
interleaved rounds (order reversed every other round), the napkin's HBM bound beside (2.7B: B16 H80 N4096 P64 S128).

    PYTHONPATH=/tmp/site:. python3 experiments/linear_attention/gpu_mamba_s38.py [--variants shipped,s36]

JSON to $OUT/mamba_s38.json (rewritten each row); a short table last.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from experiments.common.gpu_script import Run, check, poisoned, time_rounds  # noqa: E402
from gpu_mamba_s37 import check_op, mamba_inputs, napkin_ms  # noqa: E402
from gpu_mamba_s37 import launcher as launcher_s37  # noqa: E402

SHAPE = (16, 4096, 80)  # B, N, H (headdim 64, d_state 128, one group)
CASES = ("states_mamba", "stateless", "states_op")


def launcher(variant: str, q, k, v, g, beta, d_skip, z, h0, o, ht, scale: float):
    """The variant's kernel on these inputs (g and beta as (B, N, H))."""
    if variant not in ("st3", "p2"):
        return launcher_s37(variant, q, k, v, g, beta, d_skip, z, h0, o, ht, scale)
    from tilecore.ops.linear_attention import gluon_forward as gf

    G, beta_h = gf.chunk_heads_prep(g, beta, gf.BT_GLUON)
    grid, args, warps = gf.launch_args(q, k, v, G, beta_h, d_skip.float().contiguous(), z, h0, o, ht, scale,
                                       3 if variant == "st3" else 2, o_in_p=True)
    return lambda: gf.la_fwd_gluon_kernel[grid](**args, num_warps=warps)


def states(B, H, S, P, layout: str, fill=None):
    """A (B, H, S, P) float32 state (the kernel's (F, Dv)) in ``layout``: "op" contiguous, "mamba" a transposed
    view of a contiguous (B, H, P, S)."""
    if layout == "op":
        t = torch.empty(B, H, S, P, device="cuda")
    else:
        t = torch.empty(B, H, P, S, device="cuda").transpose(-1, -2)
    if fill == "randn":
        t.copy_(torch.randn(B, H, S, P, device="cuda"))
    elif fill == "nan":
        t.fill_(float("nan"))
    return t


def check_mamba(variant, label, B, N, H, layout=None, a_range=(-8.5, -0.5)) -> dict:
    from tilecore.ops.linear_attention import mamba2_reference

    x, dt, A, Bm, Cm, D, z = mamba_inputs(B, N, H, torch.bfloat16, a_range)
    P, S = x.shape[-1], Bm.shape[-1]
    h0 = states(B, H, S, P, layout, "randn") if layout else None
    ht = states(B, H, S, P, layout, "nan") if layout else None
    o = poisoned(x)
    launcher(variant, Cm, Bm, x, dt * A, dt, D[:, None].expand(H, P), z, h0, o, ht, 1.0)()
    torch.cuda.synchronize()
    ref, ref_state = mamba2_reference(x.double(), dt.double(), A.double(), Bm.double(), Cm.double(), D=D.double(),
                                      z=z.double(), initial_states=None if h0 is None else h0.transpose(-1, -2).double())
    row = dict(variant=variant, case=label, **check(o, ref))
    if layout:
        ref_t = ref_state.transpose(-1, -2)
        row.update(state_written=bool(torch.isfinite(ht).all()),
                   state_rel=float((ht.double() - ref_t).norm() / ref_t.norm()))
    return row


def timed_args(case: str):
    B, N, H = SHAPE
    x, dt, A, Bm, Cm, D, z = mamba_inputs(B, N, H, torch.bfloat16)
    P, S = x.shape[-1], Bm.shape[-1]
    h0 = ht = None
    if case != "stateless":
        layout = case.split("_")[1]
        h0 = states(B, H, S, P, layout, "randn").mul_(0.1)
        ht = states(B, H, S, P, layout)
    return (Cm, Bm, x, dt * A, dt, D[:, None].expand(H, P), z, h0, torch.empty_like(x), ht, 1.0)


def napkin_states_ms() -> float:
    """The napkin's bound with the initial state read and the final states written (float32) besides."""
    from tilecore.napkin import models
    from tilecore.napkin.engine import derive

    B, N, H = SHAPE
    r = derive(models.mamba2_ssd(batch=B, heads=H, seq=N, headdim=64, state=128, chunk=64, groups=1, gate=True,
                                 skip=True), "h100")
    return 1e3 * (r.compulsory_bytes + 2 * B * H * 64 * 128 * 4) / r.gpu.levels[0].bandwidth


def warm(variant: str, op: bool):
    """In a process of its own: the variant's checks, then each timed case's compile (N 1008 and 304: a partial
    last chunk, and the timed launches' specialization: N a multiple of 16)."""
    t0 = time.time()
    rows = []
    try:
        rows.append(check_mamba(variant, "D z N 1008", 2, 1008, 8))
        for layout in ("op", "mamba"):
            rows.append(check_mamba(variant, f"strong h0 ht {layout} N 304", 2, 304, 4, layout, (-80.0, -20.0)))
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
    ap.add_argument("--variants", default="shipped,s36")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--op", action="store_true", help="also check the public mamba2_chunk_scan (shipped)")
    a = ap.parse_args()
    variants = a.variants.split(",")
    cases = a.cases.split(",")
    run = Run("mamba_s38", deadline=57)
    run.extra["variants"] = variants
    pool = cf.ProcessPoolExecutor(max_workers=len(variants), mp_context=mp.get_context("spawn"))
    futs = [pool.submit(warm, n, a.op) for n in variants]
    nap = run.attempt("napkin", napkin_ms)
    run.extra["napkin_mamba2_ms"] = nap
    run.extra["napkin_with_states_ms"] = nap_states = run.attempt("napkin with states", napkin_states_ms)
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
            # (the float32 states' error is the bf16 operands' of the update: ~1e-3 relative)
            if not err and all(r["pass"] and r.get("state_written", True) and r.get("state_rel", 0) < 2e-2
                               for r in rows):
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
            base, shipped = res.get("s36_graph_ms"), res.get("shipped_graph_ms")
            for n in fns:
                ms = res.get(f"{n}_graph_ms")
                if ms and base and n != "s36":
                    row[f"{n}_over_s36"] = round(base / ms, 4)  # > 1: n faster than the former step
                if ms and shipped and n not in ("s36", "shipped"):
                    row[f"{n}_over_shipped"] = round(shipped / ms, 4)
                bound = nap if case == "stateless" else nap_states  # (h0 read and ht written: 84 MB more)
                if ms and bound:
                    row[f"{n}_napkin_pct"] = round(100 * bound / ms, 1)
            run.row(f"time {case}", **row)
            run.say("  " + ", ".join(f"{n} {res.get(f'{n}_graph_ms')} ms {res[f'{n}_rounds'].get('graph')}"
                                     for n in fns))
    cols = ["name", "pass", "err_over_floor", "state_rel"] + [f"{n}_graph_ms" for n in variants] + [
        f"{n}_over_s36" for n in variants if n != "s36"] + [f"{n}_over_shipped" for n in variants
                                                            if n not in ("s36", "shipped")] + [
        f"{n}_napkin_pct" for n in variants if n != "s36"]
    run.finish(cols)


if __name__ == "__main__":
    main()
