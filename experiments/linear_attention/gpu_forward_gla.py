"""The GLA forward (per-channel log decay) on Hopper: gluon_gla_forward's kernel (issue 33) checked against the
float64 recurrence and timed beside the shipped tl forward (kernels_tl, plan diag 3) and the copy bound, in one run.

    python experiments/linear_attention/gpu_forward_gla.py [--smoke] [--rounds 5] [--deadline 130]
    (the time phase first, then the checks by importance while the deadline allows: new specializations compile)

* check: launch.forward with the plan's fwd_gluon_gla on (the Gluon kernel, then the tl kernel on the heads it
  flags) into fresh outputs (the kernel writes every element: NaN-poisoned buffers are not its inputs, so the
  check is that o and the final state come out whole and right), against linear_attention_reference in float64 on
  fresh random inputs, as a multiple of the rounding floor: bf16 weak decays (the factored path), a span near the
  bf16 limit (factors ~2^41), strong decays [-6, 0] with a reset (every head flagged: the tl kernel's), fp16, N not a
  multiple of the chunk, Dk 64, Dv 256, initial and final states; the flagged heads counted by running the kernel
  alone (gluon_gla_forward.forward without the tl pass); the public op under autograd (inputs requiring grad,
  configs.GLUON_GLA patched on: tiles.switches.patched, planned and run once eagerly before any timing).
* time: B16 H16 N4096 d128 bf16, log decays -U(0, 0.3) in float32 (gpu_gla.py's), h0 and final states: the tl
  forward (the shipped default), the Gluon path (launch.forward: flags, kernel, tl pass on no head), the kernel
  alone (gluon_gla_forward.forward without the tl pass), interleaved rounds, CUDA-graph and eager medians; the copy
  bound (a copy of q, k, v, o and g's bytes) in the same run.
--smoke: the CPU and the interpreter, tiny shapes (the Gluon path then falls back to the tl kernel: the flow only).
JSON to $OUT/gla_forward.json; a table last.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments.common.gpu_script import Run, check, sync, time_rounds  # noqa: E402
from tilecore import accuracy  # noqa: E402
from tilecore.ops.linear_attention import configs, gluon_gla_forward, launch, linear_attention  # noqa: E402
from tilecore.ops.linear_attention.plan import tl_plan  # noqa: E402
from tilecore.ops.linear_attention.reference import linear_attention_reference  # noqa: E402
from tilecore.tiles import switches  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_gla  # noqa: E402  (its inputs: the GLA forward's cases since session 29)

DEV = "cpu" if SMOKE else "cuda"


def make(B, N, H, Dk, Dv, *, h0=True, **kw):
    """gpu_gla.make's inputs (log decays -U(0, decay), or ~per_token each; reset: -inf on a quarter of the channels
    at N/2), with an initial state unless said."""
    return gpu_gla.make(B, N, H, Dk, Dv, h0=h0, **kw)


def plan_of(t, gla: bool):
    return tl_plan(t["q"], t["v"], t["g"], 0, fwd_gluon_gla=gla)


def forward(p, t, final=True):
    o, ht, _ = launch.forward(p, t["q"], t["k"], t["v"], t["g"], None, None, None, t["h0"], t["scale"], 0,
                              final_state=final, keep_linear=False)
    return o, ht


def state_error(ht, ref_s, dtype) -> float:
    """The final state's relative RMS error as a multiple of the rounding floor of the inputs' dtype (the state is
    float32, made from operands rounded to it: the tl kernel's is the comparison)."""
    return round(accuracy.rel_rms(ht.detach().double(), ref_s) / accuracy.rounding_floor(ref_s, dtype), 3)


def check_case(run: Run, name: str, t: dict, expect_flags: str, with_tl: bool = False, alone: bool = False):
    """launch.forward's Gluon path (and the tl forward's, ``with_tl``) against float64; the kernel alone too
    (``alone``) where it flags no head (its flagged heads counted either way)."""
    ref_o, ref_s = linear_attention_reference(t["q"], t["k"], t["v"], decay=t["g"], scale=t["scale"],
                                              initial_state=t["h0"])
    ref_s = ref_s.to(t["v"].device)
    fits = gluon_gla_forward.fits(t["q"], t["k"], t["v"], t["g"], 0)
    runs = [(label, lambda gla=gla: forward(plan_of(t, gla), t), False)
            for label, gla in ((("gluon", True), ("tl", False)) if with_tl else (("gluon", True),))]
    if fits is None:
        def kernel():
            o, ht, redo = gluon_gla_forward.forward(t["q"], t["k"], t["v"], t["g"], t["h0"], t["scale"], True)
            return o, ht, f"{int(redo.sum().item())}/{redo.numel()}"
        runs.append(("kernel" if alone else "kernel flags", kernel, True))
    for label, fn, is_kernel in runs:
        out = fn()
        sync()
        o, ht = out[0], out[1]
        flagged = out[2] if is_kernel else None
        if is_kernel and (not alone or not flagged.startswith("0/")):  # flags only (flagged heads are not written)
            run.row(f"{name} {label}", flagged=flagged, expect_flags=expect_flags)
            continue
        co, cs = check(o, ref_o), check(ht, ref_s, tol=float("inf"))
        es = state_error(ht, ref_s, t["q"].dtype) if cs["written"] else None
        run.row(f"{name} {label}", pass_=co["pass"] and cs["pass"] and es is not None and es <= 2.5,
                err_o=co["err_over_floor"], err_state=es, written=co["written"] and cs["written"], flagged=flagged,
                expect_flags=expect_flags, fits=fits or "yes")


def check_public(run: Run):
    """The public op under autograd's forward with configs.GLUON_GLA patched on, against float64."""
    t = make(2, 1000, 4, 128, 128, decay=0.3)
    q, k, v, g, h0 = (x.clone().requires_grad_(x.is_floating_point()) for x in (t["q"], t["k"], t["v"], t["g"],
                                                                                 t["h0"]))
    ref_o, ref_s = linear_attention_reference(t["q"], t["k"], t["v"], decay=t["g"], scale=t["scale"],
                                              initial_state=t["h0"])
    with switches.patched(configs, GLUON_GLA=True):
        o, ht = linear_attention(q, k, v, decay=g, initial_state=h0, return_final_state=True)
        sync()
    co, cs = check(o.detach(), ref_o), check(ht.detach(), ref_s, tol=float("inf"))
    es = state_error(ht, ref_s.to(ht.device), t["q"].dtype) if cs["written"] else None
    run.row("public op autograd N1000", pass_=co["pass"] and cs["pass"] and es is not None and es <= 2.5,
            err_o=co["err_over_floor"], err_state=es, written=co["written"] and cs["written"],
            grad_fn=type(o.grad_fn).__name__)


def time_case(run: Run, rounds: int):
    B, N, H, D = (2, 128, 2, 128) if SMOKE else (16, 4096, 16, 128)
    t = make(B, N, H, D, D, decay=0.3)
    size = lambda x: x.numel() * x.element_size()  # noqa: E731
    nbytes = size(t["q"]) + size(t["k"]) + 2 * size(t["v"]) + size(t["g"])
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    p_tl, p_gla = plan_of(t, False), plan_of(t, True)
    fns = {"tl": lambda: forward(p_tl, t), "gluon": lambda: forward(p_gla, t)}
    if gluon_gla_forward.fits(t["q"], t["k"], t["v"], t["g"], 0) is None:
        fns["kernel"] = lambda: gluon_gla_forward.forward(t["q"], t["k"], t["v"], t["g"], t["h0"], t["scale"], True)
    fns["copy"] = lambda: dst.copy_(src)
    for f in fns.values():  # compiled and run once eagerly before any graph capture
        f()
    sync()
    res = time_rounds(fns, rounds=rounds, graph=not SMOKE, deadline=run)
    row = dict(bytes=nbytes, **{k: v for k, v in res.items() if not k.endswith("_rounds")})
    key = "_graph_ms" if not SMOKE else "_ms"
    copy = res.get("copy" + key)
    for n in ("tl", "gluon", "kernel"):
        ms = res.get(n + key)
        if ms and copy:
            row[f"{n}_pct_of_copy"] = round(100 * copy / ms, 1)
        if ms and res.get("tl" + key):
            row[f"{n}_x_tl"] = round(res["tl" + key] / ms, 3)
    row["rounds"] = {k: v for k, v in res.items() if k.endswith("_rounds")}
    run.row(f"time B{B} H{H} N{N} d{D} bf16", **row)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--deadline", type=float, default=130.0)
    ap.add_argument("--skip-checks", action="store_true")
    args = ap.parse_args()
    run = Run("gla_forward", deadline=args.deadline)
    run.say(f"configs.GLUON_GLA={configs.GLUON_GLA}")
    small = SMOKE  # (the interpreter: a few chunks a case)
    run.attempt("time", time_case, run, args.rounds)
    if not args.skip_checks:  # by importance, while the deadline allows (each new specialization compiles)
        cases = [  # (name, shape, make's options, flags expected, with the tl forward, the kernel alone checked too)
            ("bf16 weak N4096", dict(B=2, N=256 if small else 4096, H=4, Dk=128, Dv=128), {}, "none", True, True),
            ("bf16 strong+reset N1000", dict(B=1, N=100 if small else 1000, H=4, Dk=128, Dv=128),
             dict(decay=6.0, reset=True), "all", False, False),
            ("bf16 weak N1000", dict(B=2, N=100 if small else 1000, H=4, Dk=128, Dv=128), {}, "none", False, False),
            ("bf16 span~83 (2^41 factors) N1000", dict(B=1, N=100 if small else 1000, H=4, Dk=128, Dv=128),
             dict(per_token=0.9), "none", False, False),
            ("fp16 N1000 decay 0.1", dict(B=2, N=100 if small else 1000, H=4, Dk=128, Dv=128),
             dict(dtype=torch.float16, decay=0.1), "none", False, True),
            ("bf16 d64 N1000", dict(B=2, N=77 if small else 1000, H=4, Dk=64, Dv=128), {}, "none", False, True),
            ("bf16 d128 v256 N1000", dict(B=1, N=70 if small else 1000, H=3, Dk=128, Dv=256), {}, "none", False,
             False),
            ("fp16 N1000 decay 0.3 (some wide)", dict(B=2, N=100 if small else 1000, H=4, Dk=128, Dv=128),
             dict(dtype=torch.float16, decay=0.3), "some", False, False),
            ("bf16 no h0 N4097", dict(B=1, N=130 if small else 4097, H=2, Dk=128, Dv=128), dict(h0=False), "none",
             False, False),
        ]
        for name, shape, kw, expect, with_tl, alone in cases:
            if run.left() < 10:
                run.row(f"{name} skipped", note=f"past the deadline ({run.elapsed():.0f} s)")
                continue
            run.attempt(name, check_case, run, name, make(**shape, **kw), expect, with_tl, alone)
        if run.left() >= 10:  # grouped q/k heads: head h reads q/k head h // 2 (views of the first two heads)
            t = make(1, 77 if small else 1000, 4, 128, 128)
            t["q"], t["k"] = t["q"][:, :, :2], t["k"][:, :, :2]
            run.attempt("bf16 q/k heads 2 of 4 N1000", check_case, run, "bf16 q/k heads 2 of 4 N1000", t, "none")
        if run.left() >= 10:
            run.attempt("public op", check_public, run)
    run.finish(["name", "pass_", "err_o", "err_state", "written", "flagged", "expect_flags", "tl_graph_ms",
                "gluon_graph_ms", "kernel_graph_ms", "copy_graph_ms", "gluon_x_tl", "gluon_pct_of_copy",
                "kernel_pct_of_copy", "tl_ms", "gluon_ms", "kernel_ms"])


if __name__ == "__main__":
    main()
