"""Issue 37 (session 37, helper HR): attention(..., rotary=(cos, sin)) on Hopper, the turned path's choices.

1. --checks D:full,D:causal,D:causal:half (bf16, fresh random inputs, the allocator's free memory filled with NaN
   first so an unwritten element shows): O, dq, dk, dv of the turned path against the float64 reference
   (reference.rotary_attention_reference) as multiples of the rounding floor, beside plain attention's on the
   same inputs; B1 H2 N4096 (the timed shapes' kernels); full half-split, causal interleaved (or half-split);
   --extra also N 900 < Nk 1000 causal with rotary_dim 32 of 128 and GQA 4/2. --routed: also a call without a
   gradient routed to gluon_rotary.forward in every case (configs.ROTARY_IN_KERNEL_CASES: K by apply_rotary's
   pass, Q in the Gluon
   forward); --fwd-only: that call alone.
2. --dims D,..: GPU time from CUDA graphs (triton.testing.do_bench_cudagraph medians, interleaved rounds), B16
   H16 N4096, bf16 tables: forward (no gradient) plain / rotary as routed (/ with --routed the turned forward
   and the in-kernel one, whatever configs.ROTARY_IN_KERNEL_CASES routes);
   forward + backward (autograd.grad of q, k, v) plain / rotary, unless --fwd-only. Overheads over plain
   (issue 37: <= 3%). --launches: apply_rotary on q and k by one launch over a tensor of both's heads against
   two.
(Session 37's calls 1-5 ran this script also with the Gluon backward's dK epilogue and with q and k turned by
one launch (turn_pair), both removed since: git 535eca7 has them.)

  PYTHONPATH=. python experiments/attention/gpu_rotary_dk.py [--checks 128:full,64:causal] [--dims 128,64]
      [--fwd-only] [--routed] [--extra] [--launches]
  PYTHONPATH=. python experiments/attention/gpu_rotary_dk.py --smoke   # CPU interpreter: imports and the checks' code
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import tilecore  # noqa: E402
from experiments.common.gpu_script import Run, check, time_rounds  # noqa: E402
from tilecore.ops.attention import configs, plan  # noqa: E402
from tilecore.ops.attention.reference import attention_reference, rotary_attention_reference  # noqa: E402
from tilecore.tiles.switches import patched  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
# configs.ROTARY_IN_KERNEL_CASES (and ROTARY_TRAIN_IN_KERNEL_CASES) routing every case
ALL_CASES = frozenset({(64, False), (64, True), (128, False), (128, True)})
ROUTED = [False]
FWD_ONLY = [False]


def poison():
    """The allocator's free blocks filled with NaN (the next outputs likely land there)."""
    if SMOKE:
        return
    free = torch.cuda.mem_get_info()[0]
    try:
        junk = torch.full((int(min(free * 0.5, 8 << 30)) // 2,), float("nan"), dtype=torch.bfloat16, device=DEV)
        del junk
    except RuntimeError:
        pass


def tables(rows, pairs, dtype=torch.float32):
    angle = torch.rand(rows, pairs, device=DEV, dtype=torch.float64) * 2 * math.pi
    return angle.cos().to(dtype), angle.sin().to(dtype)


def checks(run, name, b, hq, hkv, n, nk, d, pairs, causal, interleaved, dtype=torch.bfloat16):
    q = torch.randn(b, hq, n, d, device=DEV, dtype=dtype, requires_grad=True)
    k = torch.randn(b, hkv, nk, d, device=DEV, dtype=dtype, requires_grad=True)
    v = torch.randn(b, hkv, nk, d, device=DEV, dtype=dtype, requires_grad=True)
    cos, sin = tables(nk + 3, pairs)
    g = torch.randn(b, hq, n, d, device=DEV, dtype=dtype)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    result = {}
    for label, rot in (("rotary", (cos, sin)), ("plain", None)) if not FWD_ONLY[0] else ():
        poison()
        out = tilecore.attention(q, k, v, causal=causal, rotary=rot, rotary_interleaved=interleaved)
        grads = torch.autograd.grad(out, (q, k, v), g)
        if rot is None:
            ro, _ = attention_reference(q64, k64, v64, causal=causal)
        else:
            ro, _ = rotary_attention_reference(q64, k64, v64, cos, sin, interleaved=interleaved, causal=causal)
        rg = torch.autograd.grad(ro, (q64, k64, v64), g.double())
        for t, got, ref in zip(("o", "dq", "dk", "dv"), (out, *grads), (ro, *rg)):
            c = check(got, ref, tol=3.0)
            result[f"{label}_{t}"] = c.get("err_over_floor")
            if label == "rotary":
                result[f"{t}_pass"] = c["pass"]
        del out, grads, ro, rg
    if ROUTED[0]:  # a call without a gradient routed to gluon_rotary.forward (on Hopper)
        poison()
        with torch.no_grad(), patched(configs, ROTARY_IN_KERNEL_CASES=ALL_CASES):
            out = tilecore.attention(q, k, v, causal=causal, rotary=(cos, sin), rotary_interleaved=interleaved)
        ro, _ = rotary_attention_reference(q64.detach(), k64.detach(), v64.detach(), cos, sin,
                                           interleaved=interleaved, causal=causal)
        c = check(out, ro, tol=3.0)
        result["inkernel_o"], result["inkernel_pass"] = c.get("err_over_floor"), c["pass"]
        del out, ro
    grads = () if FWD_ONLY[0] else ("o", "dq", "dk", "dv")
    ok = all(result[f"{t}_pass"] for t in grads) and result.get("inkernel_pass", True)
    ok = ok and all(result[f"rotary_{t}"] <= max(3.0, 1.8 * result[f"plain_{t}"]) for t in grads)
    run.row(f"check {name}", kind="check", path=plan.rotary_path(q, k, v, 1.0, grad=True), causal=causal,
            interleaved=interleaved, d=d, pairs=pairs, n=n, nk=nk, hq=hq, hkv=hkv, ok=bool(ok),
            **{k_: v_ for k_, v_ in result.items() if not k_.endswith("_pass")})


def timing(run, d, causal, b=16, h=16, n=4096, rounds=2):
    q, k, v = (torch.randn(b, h, n, d, device=DEV, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(b, h, n, d, device=DEV, dtype=torch.bfloat16)
    cos, sin = tables(n, d // 2, torch.bfloat16)

    def fwd(rot):
        def f():
            with torch.no_grad():
                tilecore.attention(q, k, v, causal=causal, rotary=rot)
        return f

    def fwdbwd(rot):
        return lambda: torch.autograd.grad(tilecore.attention(q, k, v, causal=causal, rotary=rot), (q, k, v), g)

    def fwd_turned():  # the turned forward whatever configs.ROTARY_IN_KERNEL_CASES routes
        with torch.no_grad(), patched(configs, ROTARY_IN_KERNEL_CASES=frozenset()):
            tilecore.attention(q, k, v, causal=causal, rotary=(cos, sin))

    def fwd_in_kernel():  # gluon_rotary.forward in every case (K by the pass, Q in the kernel)
        with torch.no_grad(), patched(configs, ROTARY_IN_KERNEL_CASES=ALL_CASES):
            tilecore.attention(q, k, v, causal=causal, rotary=(cos, sin))

    fns = {"fwd_plain": fwd(None), "fwd_rotary": fwd((cos, sin))}
    if not FWD_ONLY[0]:
        fns.update(bwd_plain=fwdbwd(None), bwd_rotary=fwdbwd((cos, sin)))
    if ROUTED[0]:
        fns["fwd_turned"] = fwd_turned
        fns["fwd_inkernel"] = fwd_in_kernel
    for f in fns.values():  # compiled before the clock
        f()
    torch.cuda.synchronize()
    t = time_rounds(fns, rounds=rounds, graph=True, eager=False, deadline=run)
    ms = {name: t[f"{name}_graph_ms"] for name in fns}
    over = lambda a, base: round(100 * (ms[a] / ms[base] - 1), 2)
    run.row(f"time D{d} {'causal' if causal else 'full'}", kind="time", d=d, causal=causal, b=b, h=h, n=n,
            **{f"{k_}_ms": round(v_, 4) for k_, v_ in ms.items()},
            fwd_over=over("fwd_rotary", "fwd_plain"),
            **({} if FWD_ONLY[0] else dict(bwd_over=over("bwd_rotary", "bwd_plain"))),
            **({"fwd_turned_over": over("fwd_turned", "fwd_plain"),
                "fwd_inkernel_over": over("fwd_inkernel", "fwd_plain")} if ROUTED[0] else {}),
            rounds={name: t[f"{name}_rounds"]["graph"] for name in fns})


def launches(run, d=128, b=16, h=16, n=4096):
    """apply_rotary on q and k (two launches) against one launch over a (B, N, 2H, D) tensor holding both."""
    from tilecore.ops.rotary.op import turn

    qk = torch.randn(b, n, 2 * h, d, device=DEV, dtype=torch.bfloat16)
    q, k = qk[:, :, :h], qk[:, :, h:]
    out = torch.empty_like(qk)
    cos, sin = tables(n, d // 2, torch.bfloat16)
    fns = {"two": lambda: (turn(q, cos, sin, out=out[:, :, :h]), turn(k, cos, sin, out=out[:, :, h:])),
           "one": lambda: turn(qk, cos, sin, out=out)}
    for f in fns.values():
        f()
    t = time_rounds(fns, rounds=3, graph=True, eager=False, deadline=run)
    run.row(f"launches D{d}", kind="launches", d=d, two_ms=t["two_graph_ms"], one_ms=t["one_graph_ms"],
            saved_us=round(1000 * (t["two_graph_ms"] - t["one_graph_ms"]), 2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--dims", default="128", help="end-to-end timing (forward, forward + backward) at these D")
    ap.add_argument("--checks", default="", help="checks: D:full (half-split), D:causal "
                    "(interleaved), D:causal:half")
    ap.add_argument("--extra", action="store_true")
    ap.add_argument("--launches", action="store_true")
    ap.add_argument("--routed", action="store_true", help="also the forward by gluon_rotary (no gradient)")
    ap.add_argument("--fwd-only", action="store_true", help="forward only: checks of the no-grad calls (with "
                    "--routed), timing of the forwards")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--deadline", type=float, default=56.0)
    a = ap.parse_args()
    torch.manual_seed(0)
    run = Run("gpu_rotary_dk", deadline=a.deadline)
    ROUTED[0], FWD_ONLY[0] = a.routed, a.fwd_only
    if SMOKE:  # the checks' code on the CPU path (composite): no Gluon there
        run.attempt("smoke", checks, run, "smoke", 1, 2, 1, 24, 40, 32, 8, True, True, torch.float16)
        run.finish(["name", "ok", "rotary_dq", "rotary_dk", "plain_dk"])
        return
    dims = [int(x) for x in a.dims.split(",")] if a.dims else []
    for case in filter(None, a.checks.split(",")):  # D:full (half-split), D:causal (interleaved), D:causal:half
        d, mask, *layout = case.split(":")
        d, causal = int(d), mask == "causal"
        interleaved = causal and layout != ["half"]
        run.attempt(f"check {case}", checks, run, f"D{d} {mask}{' inter' if interleaved else ''}", 1, 2, 2, 4096,
                    4096, d, d // 2, causal, interleaved)
    for d in dims:
        for causal in (False, True):
            if run.left() < 12:
                run.errors.append(f"time D{d} causal={causal}: skipped (deadline)")
                continue
            run.attempt(f"time D{d} causal={causal}", timing, run, d, causal, rounds=a.rounds)
    if a.launches and run.left() > 5:
        run.attempt("launches", launches, run, dims[0])
    if a.extra and run.left() > 10:
        run.attempt("check extra", checks, run, "N900<Nk1000 r32 gqa", 1, 4, 2, 900, 1000, 128, 16, True, False)
    run.finish(["name", "ok", "rotary_o", "rotary_dq", "rotary_dk", "rotary_dv", "plain_dk", "inkernel_o",
                "fwd_plain_ms", "fwd_over", "fwd_turned_over", "fwd_inkernel_over", "bwd_plain_ms", "bwd_over",
                "saved_us"])


if __name__ == "__main__":
    main()
