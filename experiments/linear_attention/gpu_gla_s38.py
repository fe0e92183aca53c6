"""GLA backward, session 38 (HA, issue 33): the Gluon dq / dk kernel's stores by TMA from shared memory
(gluon_gla_bwd's FORM bits STORE_TMA 512: dq through the consumer's epilogue buffer, dk through the stage's q buffer;
DG_TMA 1024: dg through the stage's g buffer, waited for before the stage's release; DG_LATE 2048: dg through the
pieces' buffers, waited for at the next tile's start), at d 64 AT_REG 4096 (a^T from a's registers, not a second
product) and 3 stages, at d 128 AT_SMEM 8192 (a^T read transposed from shared memory, not a second product), against configs' forms (FORM 2 at d 128, 258 at d 64) in one run. Each
variant is checked against float64 ON THE GPU first (a gated backward can be miscompiled on Hopper: FLA's issue 640),
then timed (< 60 s on an H100).

Checks: bf16 B2 N1024 H16, an initial state and a final state's gradient, weak decays -U(0, 0.3) and strong ones
-U(0, 6) with a reset mid-chunk (flagged blocks the fallback launch rewrites); outputs NaN-poisoned; dq / dk / dv as
multiples of the bf16 rounding floor (experiments/common/gpu_script.check, <= 2.5), dg / dh0 relative (< 0.05 /
0.01). The float64 references are made once a head dim by the main process (files the workers wait for), while one
worker a variant compiles and runs its backward (after one worker a head dim has compiled configs' backward: the shared
tl kernels into the cache). Timing at B16 H16 N4096 in the main process: the dqk launch alone (interleaved rounds,
do_bench medians; a 1.8 ms kernel, so the other lanes' host work does not enter) against its HBM bound at this run's
copy bandwidth, and the composed backward once.

    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_s38.py [--batch b] [--variants "d128 configs,d128 atsmem"]
        [--smoke]
JSON to $OUT/gla_s38<batch>.json (rewritten after each row); the table last. ``--smoke``: the checks on the CPU (the
interpreter runs the tl kernels: the Gluon forms are not taken there), tiny shapes, no timing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments.common.gpu_script import Run, check, eager_ms, poisoned, time_rounds  # noqa: E402
from experiments.linear_attention.gpu_gla_s37 import (backward, dqk_bytes, dqk_kernel, load_reference, make,  # noqa: E402
                                                      ref_path, warm)

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
WARM_DEADLINE = 22.0  # the shared kernels' compile: the variants start then at the latest
BATCH = sys.argv[sys.argv.index("--batch") + 1] if "--batch" in sys.argv else "d"
WORKER_DEADLINE = 900.0 if SMOKE else 54.0 if BATCH == "d" else 42.0  # a worker still compiling then is killed
TIME_DEADLINE = 58.0 if BATCH == "d" else 54.0  # no timing round starts past it
CHECK_SHAPE = (1, 128, 2) if SMOKE else (2, 1024, 16)  # B, N, H
TIME_SHAPE = (16, 4096, 16)
CASES = {"weak": dict(decay=0.3, reset=False, seed=1), "strong+reset": dict(decay=6.0, reset=True, seed=2)}

# name: (Dk = Dv, CHUNKED overrides), a set a device call (--batch NAME). FORM bits: 2 the chain by dots, 512 STORE_TMA,
# 1024 DG_TMA, 2048 DG_LATE; in calls 1-2 also 256 EXP_FTZ, 4096 AT_REG (d 64), 8192 AT_SMEM: since decision 185 (issue 30)
# EXP_FTZ and AT_SMEM are always on with 2 and AT_REG is removed, so batches a and b no longer build what they timed
BATCHES = {
    # call 1 (runs/gla_s38a_run1_session38_h100.txt, at c174fb7; configs' then FORM 2 at d 128, 258 at d 64): d 64
    # 258 + STORE_TMA + DG_TMA 1.10x (on since: configs' d 64 FORM 1794), d 128 + EXP_FTZ + both 1.01x, d 128 STORE_TMA
    # alone 0.85x (116 B spilled)
    "a": {
        "d128 configs": (128, {}),
        "d128 tma": (128, dict(dqk_gluon_form=2 | 512)),
        "d128 tma+dg": (128, dict(dqk_gluon_form=2 | 512 | 1024)),
        "d128 ftz+tma+dg": (128, dict(dqk_gluon_form=258 | 512 | 1024)),
        "d64 configs 258": (64, dict(dqk_gluon_form=258)),
        "d64 tma": (64, dict(dqk_gluon_form=258 | 512)),
        "d64 tma+dg": (64, dict(dqk_gluon_form=258 | 512 | 1024)),
        "d64 st3": (64, dict(dqk_gluon=3, dqk_gluon_form=258)),  # (3 stages: 229.9 KB, one CTA an SM as at 2)
    },
    # call 2 (runs/gla_s38b_run3_session38_h100.txt, at 58fc730): d 128 258 + AT_SMEM + STORE_TMA + DG_TMA (9986) 1.533 ms
    # = 81.7% against FORM 2's 1.782 (1.16x), d 64 9986 0.7096 = 75.6% against 1794's 0.7508: 9986 on at both since;
    # AT_REG 0.714 at d 64 (removed since, so its rows here no longer build it)
    "b": {
        "d128 configs": (128, {}),
        "d128 ftz+tma+dg": (128, dict(dqk_gluon_form=258 | 512 | 1024)),
        "d128 ftz+tma+dglate": (128, dict(dqk_gluon_form=258 | 512 | 2048)),
        "d128 atsmem": (128, dict(dqk_gluon_form=2 | 8192)),
        "d128 atsmem+tma+dg": (128, dict(dqk_gluon_form=2 | 8192 | 512 | 1024)),
        "d128 atsmem+tma+dglate": (128, dict(dqk_gluon_form=2 | 8192 | 512 | 2048)),
        "d128 ftz+atsmem+tma+dg": (128, dict(dqk_gluon_form=258 | 8192 | 512 | 1024)),
        "d64 configs": (64, {}),
        "d64 former 258": (64, dict(dqk_gluon_form=258)),
        "d64 tma+dglate": (64, dict(dqk_gluon_form=258 | 512 | 2048)),
        "d64 atreg+tma+dg": (64, dict(dqk_gluon_form=258 | 4096 | 512 | 1024)),
        "d64 atreg+tma+dglate": (64, dict(dqk_gluon_form=258 | 4096 | 512 | 2048)),
        "d64 atsmem+tma+dg": (64, dict(dqk_gluon_form=258 | 8192 | 512 | 1024)),
    },
    # call 3 (the confirmation): configs' (1538 at both: call 2's 9986, the same PTX) against the launch's other forms:
    # FORM 2 (the pointer stores: misaligned outputs) and, with bf16 g, 2562 (DG_LATE for DG_TMA), each checked with its
    # own float64 reference of the rounded g; the public op through autograd
    "c": {
        "d128 configs": (128, {}),
        "d128 fallback 2": (128, dict(dqk_gluon_form=2)),
        "d128 bf16 g": (128, dict(g_dtype="bf16")),
        "d64 configs": (64, {}),
        "d64 fallback 2": (64, dict(dqk_gluon_form=2)),
        "d64 bf16 g": (64, dict(g_dtype="bf16")),
        "d128 op": (128, dict(op=(1, 1024, 2, 128, True))),
        "d64 op": (64, dict(op=(2, 1024, 3, 64, False))),
    },
    # call 4 (runs/gla_s38c_run4_session38_h100.txt, at 1207f0c) ran set c: configs' 1538 d 128 1.541 ms = 81.3%, d 64
    # 0.712 = 75.4%, the fallback FORM 2 and d 64 bf16 g right; d 128 bf16 g and the d 128 op were killed compiling at
    # 42 s (bf16 g compiles every kernel again, the op its forward too): set d, with more time for the workers
    "d": {
        "d128 configs": (128, {}),
        "d128 bf16 g": (128, dict(g_dtype="bf16")),
        "d128 op": (128, dict(op=(1, 1024, 2, 128, True))),
    },
}
VARIANTS = BATCHES[BATCH]
if "--variants" in sys.argv:
    keep = sys.argv[sys.argv.index("--variants") + 1].split(",")
    VARIANTS = {k: v for k, v in VARIANTS.items() if k in keep}


def knobs(over: dict):
    """A variant's (CHUNKED overrides, g's dtype: None for make's float32)."""
    over = dict(over)
    return over, {"bf16": torch.bfloat16}.get(over.pop("g_dtype", None))


def with_g(t: dict, g_dtype) -> dict:
    """The inputs with g in g_dtype (rounded once: the reference takes the rounded g too)."""
    return t if g_dtype is None else dict(t, g=t["g"].to(g_dtype))


def reference(D: int, case: str, g_dtype=None):
    """The float64 gradients (dq, dk, dv, dg, dh0) and the final state of (D, case) at CHECK_SHAPE."""
    from tilecore.ops.linear_attention import linear_attention_reference

    t = with_g(make(*CHECK_SHAPE, D, **CASES[case]), g_dtype)
    leaves = [t[n].detach().double().requires_grad_() for n in ("q", "k", "v", "g", "h0")]
    o, st = linear_attention_reference(*leaves[:3], decay=leaves[3], scale=D ** -0.5, initial_state=leaves[4])
    ref = torch.autograd.grad((o * t["do"].double()).sum() + (st * t["dht"].double()).sum(), leaves)
    return [r.detach() for r in ref], st.detach().float()


def check_variant(name: str) -> dict:
    """The variant's backward against float64 on both cases (its own process)."""
    from tilecore import accuracy

    D, over = VARIANTS[name]
    row = dict(variant=name)
    if "op" in over:  # the public op through autograd with configs' defaults (gpu_gla_op.check against float64)
        from experiments.linear_attention.gpu_gla_op import check as op_check

        r = op_check(*((1, 128, 1) + over["op"][3:] if SMOKE else over["op"]))  # (B, N, H, D, strong)
        cell = f"op o {r['o']} {r['dq']}/{r['dk']}/{r['dv']} {r['dg']:.2g}" + ("" if r["pass"] else " FAIL")
        return dict(row, **{"strong+reset" if over["op"][-1] else "weak": dict(text=cell, pass_=r["pass"])},
                    op=r, dqk_kernel="(public op)", **{"pass": r["pass"]})
    over, g_dtype = knobs(over)
    for case, kw in CASES.items():
        t = with_g(make(*CHECK_SHAPE, D, **kw), g_dtype)
        if SMOKE or g_dtype is not None:  # (another g: its own reference)
            ref, st = reference(D, case, g_dtype)
        else:
            backward(t, t["h0"], over)  # (compiled while the main process makes the references)
            torch.cuda.synchronize()
            ref, st = load_reference(D, case)  # (the files gpu_gla_s37.ref_path names, in this run's HA_REFS)
        out = dict(dq=poisoned(t["q"]), dk=poisoned(t["k"]), dv=poisoned(t["v"]), dg=poisoned(t["g"].float()),
                   dh0=poisoned(t["h0"]))
        got = backward(t, st, over, out=out)
        if not SMOKE:
            torch.cuda.synchronize()
        got = [got[i] for i in (0, 1, 2, 3, 5)]
        live = t["g"] >= -100  # (dg where the floor clamped g is 0 by definition)
        res = {nm: check(x, r) for nm, x, r in zip(("dq", "dk", "dv"), got[:3], ref[:3])}
        cell = {nm: res[nm]["err_over_floor"] for nm in res}
        cell["dg"] = round(accuracy.rel_rms(got[3][live], ref[3][live]), 5)
        cell["dh0"] = round(accuracy.rel_rms(got[4], ref[4]), 6)
        finite = bool(torch.isfinite(got[3]).all() and torch.isfinite(got[4]).all())
        cell["pass"] = all(r["pass"] for r in res.values()) and finite and cell["dg"] < 0.05 and cell["dh0"] < 0.01
        row[case] = cell
    row["dqk_kernel"] = dqk_kernel(t, st, over)
    row["pass"] = all(row[c]["pass"] for c in CASES)
    return row


def timing(run: Run, rows: dict) -> None:
    """Each passing variant's dqk launch alone (interleaved rounds) and composed backward (once), a head dim at a
    time; each row saved as it comes."""
    B, N, H = TIME_SHAPE
    x = torch.empty(2 ** 29, dtype=torch.bfloat16, device=DEV)
    y = torch.empty_like(x)
    copy = 2 * x.numel() * 2 / eager_ms(lambda: y.copy_(x)) / 1e6  # GB/s, read + write
    x = y = None  # (freed)
    run.extra["copy_GBps"] = round(copy, 1)
    for D in dict.fromkeys(d for d, _ in VARIANTS.values()):
        names = [n for n, (d, o) in VARIANTS.items() if d == D and "op" not in o and rows.get(n, {}).get("pass")]
        if not names or run.elapsed() > TIME_DEADLINE:
            continue
        torch.cuda.empty_cache()
        t = make(B, N, H, D, decay=0.3, reset=False, seed=0)
        ht = torch.randn(B, H, D, D, device=DEV)
        fns, bounds, ins = {}, {}, {}
        for name in names:
            over, g_dtype = knobs(VARIANTS[name][1])
            ins[name] = (with_g(t, g_dtype), over)
            g_less = 0 if g_dtype is None else B * N * H * D * (4 - g_dtype.itemsize)  # (g read in its own dtype)
            bounds[name] = (dqk_bytes(B, N, H, D, D) - g_less) / copy / 1e6
            steps = []
            backward(ins[name][0], ht, over, steps=steps)
            step = next(s for s in steps if s[0] == "dqk0w")
            fns[name] = (lambda s=step: s[1][s[2]](*s[3], **s[4]))
            fns[name]()  # (compiled at this shape's specialization, if it differs)
        torch.cuda.synchronize()
        times = time_rounds(fns, rounds=3, deadline=_Deadline(run))
        for name in names:
            ms, bound = times[f"{name}_ms"], bounds[name]
            tt, over = ins[name]
            bwd = eager_ms(lambda: backward(tt, ht, over)) if run.elapsed() < TIME_DEADLINE + 3 else None
            rows[name].update(dqk_ms=ms, dqk_rounds=times[f"{name}_rounds"]["eager"], dqk_bound_ms=round(bound, 4),
                              dqk_pct=round(100 * bound / ms, 1), bwd_ms=None if bwd is None else round(bwd, 4))
            run.say(json.dumps(dict(variant=name, dqk_ms=ms, rounds=rows[name]["dqk_rounds"],
                                    pct=rows[name]["dqk_pct"], bwd_ms=rows[name]["bwd_ms"])))
        t = ht = ins = None  # (freed before the next head dim's inputs)


class _Deadline:
    """time_rounds' deadline: a round starts only before TIME_DEADLINE."""

    def __init__(self, run: Run):
        self.run = run

    def left(self) -> float:
        return TIME_DEADLINE - self.run.elapsed()


def main():
    if "--one" in sys.argv:
        print("ROW " + json.dumps(check_variant(sys.argv[sys.argv.index("--one") + 1])), flush=True)
        return
    if "--warm" in sys.argv:  # (gpu_gla_s37's: the same check shape and weak case)
        warm(int(sys.argv[sys.argv.index("--warm") + 1]))
        return
    run = Run(f"gla_s38{BATCH}", deadline=TIME_DEADLINE)
    run.extra.update(check_shape=CHECK_SHAPE, time_shape=TIME_SHAPE, variants={k: v[1] for k, v in VARIANTS.items()})
    os.environ["HA_REFS"] = tempfile.mkdtemp()  # (the workers inherit it)

    def spawn(*args):
        return subprocess.Popen([sys.executable, __file__, *args] + ["--smoke"] * SMOKE
                                + ["--batch", BATCH, "--variants", ",".join(VARIANTS)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    dims = list(dict.fromkeys(d for d, _ in VARIANTS.values()))
    procs = {}
    if SMOKE:
        procs = {n: spawn("--one", n) for n in VARIANTS}
    else:
        warmers = {D: spawn("--warm", str(D)) for D in dims}
        # the public op's rows and another g's from the start (their own kernels and references: nothing of the warm-up's)
        apart = [n for n, (_, o) in VARIANTS.items() if "op" in o or "g_dtype" in o]
        procs.update({n: spawn("--one", n) for n in apart})
        for D in dims:  # the references meanwhile (written once, read by every variant of the head dim)
            for case in CASES:
                ref, st = reference(D, case)
                tmp = ref_path(D, case).with_suffix(".tmp")
                torch.save(dict(ref=[r.cpu() for r in ref], st=st.cpu()), tmp)
                tmp.rename(ref_path(D, case))
                ref_path(D, case).with_suffix(".done").touch()
            torch.cuda.empty_cache()
            run.say(f"d{D} references")
        for D in dims:
            try:
                warmers[D].communicate(timeout=max(1.0, WARM_DEADLINE - run.elapsed()))
            except subprocess.TimeoutExpired:
                pass  # (the variants compile what is left)
            run.say(f"d{D} warm")
            procs.update({n: spawn("--one", n) for n, (d, _) in VARIANTS.items() if d == D and n not in apart})
    rows = {}
    for n, p in procs.items():
        try:
            out, err = p.communicate(timeout=max(1.0, WORKER_DEADLINE - run.elapsed()))
            got = [ln[4:] for ln in out.splitlines() if ln.startswith("ROW ")]
            rows[n] = json.loads(got[0]) if got else dict(variant=n, error=(err.strip().splitlines() or ["?"])[-1][:200])
        except subprocess.TimeoutExpired:
            p.kill()
            rows[n] = dict(variant=n, error=f"killed at {WORKER_DEADLINE:.0f} s (compiling)")
        if "error" in rows[n]:
            run.errors.append(f"{n}: {rows[n]['error']}")
        run.say(json.dumps(rows[n]))
    if not SMOKE:
        run.attempt("timing", timing, run, rows)
    for n in VARIANTS:
        r = rows[n]
        cells = {c: r[c]["text"] if "text" in r[c] else
                 (f"{r[c]['dq']}/{r[c]['dk']}/{r[c]['dv']} {r[c]['dg']}" + ("" if r[c]["pass"] else " FAIL"))
                 for c in CASES if c in r}
        run.row(n, pass_=r.get("pass"), weak=cells.get("weak"), strong=cells.get("strong+reset"),
                dqk_ms=r.get("dqk_ms"), rounds="/".join(f"{x:.4f}" for x in r.get("dqk_rounds", [])) or None,
                pct=r.get("dqk_pct"), bwd_ms=r.get("bwd_ms"), kernel=r.get("dqk_kernel"), error=r.get("error"))
    print(f"\nGLA backward s38 ({run.meta.get('gpu')}; checks bf16 B{CHECK_SHAPE[0]} N{CHECK_SHAPE[1]} H{CHECK_SHAPE[2]}"
          f" dq/dk/dv x floor, dg rel; times B16 H16 N4096, copy {run.extra.get('copy_GBps', '-')} GB/s)")
    run.finish(["name", "pass_", "weak", "strong", "dqk_ms", "rounds", "pct", "bwd_ms"])


if __name__ == "__main__":
    main()
