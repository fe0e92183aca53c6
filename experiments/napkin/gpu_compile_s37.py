"""Session 37 (helper HH): compiled plain attention against tilecore.attention, one job < 60 s on an H100.

Issue 36 asks compiled diagrams for >= 0.8x the hand-written kernel. Session 36 left plain softmax
attention at the edge (B4 H16 N4096 D128: full 0.78-0.82x, causal 0.78-0.80x, H100) and never timed D64.
``--plain``: plain softmax attention (scale D^-0.5), causal and full, D128 and D64, B4 H16 N4096 bf16, each
block configuration checked against float64 at B1 H16 N1024 (poisoned outputs), then timed with the
hand-written tilecore.attention IN THE SAME interleaved rounds (config A, config B, ..., peer; ROUNDS
rounds, medians), beside the napkin's prediction (its H100 calibrated with this run's copy bandwidth and
cuBLAS rate). Configurations: the default (run._attention_blocks: BM 128 BN 64, 8 warps, 3 stages: 138
registers and 128 KiB at D128, one program an SM) and BM 64 BN 64 with 4 warps (two programs an SM:
their softmax and MMAs interleave; 1.025x for plain causal in session 36's one round, but each K/V tile
is read by twice as many programs); at D128 also BM 128 with the registers capped at 128 (maxnreg) and
2 stages (BN 64) or BN 32 (3 stages): two 8-warp programs an SM with the default's K/V reuse; at D64
also BM 128 BN 128 8 warps.
``--confirm``: the plain cases' defaults against session 36's blocks where they differ (after a flip: causal
takes BM 64 BN 64 4 warps since run 1), and full D128's registers capped at 128 for two programs an SM.
``--softcap``: softcap_approx(30) D128 causal and full with part of the softmax's exp2 on the FMA pipe
(compile.EXP2_FMA_PACK / EXP2_FMA_POLY) against the default.
``--final``: every plain case and softcap_approx D128 (causal, full) at the defaults, beside the blocks or
switch each flip replaced (call 3: the session's final figures).
``--extra``: the full D128 softcaps (approx and exact) in two programs an SM (2 stages, maxnreg 128).
``--smoke``: the same code through the interpreter at tiny sizes (fp16, no timing).
Writes $OUT/napkin_compile_s37.json after every case; prints a table last.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import gpu_compile as gc  # noqa: E402  (sets TRITON_INTERPRET under --smoke before tilecore loads)
import torch  # noqa: E402

import tilecore  # noqa: E402
from tilecore.ops.napkin_compiled import CompiledDiagram, compile_diagram  # noqa: E402

SMOKE, DEV, DTN = gc.SMOKE, gc.DEV, gc.DTN
START = time.time()
BUDGET_S = 48  # no case starts after this (the job is killed at 70 s)
OUT = Path(os.environ.get("OUT", "/tmp/out"))
RES = {"device": gc.RESULTS["device"], "argv": sys.argv[1:], "checks": [], "timings": [], "errors": []}
ROUNDS = 1 if SMOKE else (5 if "--final" in sys.argv or "--extra" in sys.argv else 4 if "--confirm" in sys.argv else 3)

SMALL = dict(BM=64, BN=64, num_warps=4, num_stages=3)


def plain_cases():
    """(label, D, causal, softcap, configs): the default first (plain attention: BM 128 BN 64, 8 warps, 3
    stages); the others take the default's HEAD_GROUP (4 causal, 0 full)."""
    if SMOKE:  # maxnreg is a GPU launch option (the interpreter ignores it)
        return [("plain causal", 32, True, 0.0, {"default": None, "BM 16 BN 32": dict(BM=16, BN=32, maxnreg=128)})]
    cases = []
    for D in (128, 64):
        for causal in (True, False):
            hg = dict(HEAD_GROUP=4 if causal else 0)
            cfgs = {"default": None}
            cfgs["BM 64 BN 64 w4 s3"] = dict(SMALL, **hg)
            if D == 128:  # 126 / 114 registers, 96 / 80 KiB (sm_90a, no spills): two programs an SM
                cfgs["BM 128 BN 64 w8 s2 r128"] = dict(BM=128, BN=64, num_warps=8, num_stages=2, maxnreg=128, **hg)
                cfgs["BM 128 BN 32 w8 s3 r128"] = dict(BM=128, BN=32, num_warps=8, num_stages=3, maxnreg=128, **hg)
            if D == 64:
                cfgs["BM 128 BN 128 w8 s3"] = dict(BM=128, BN=128, num_warps=8, num_stages=3, **hg)
            cases.append((f"plain{' causal' if causal else ''} D{D}", D, causal, 0.0, cfgs))
    return cases


def confirm_cases():
    """--confirm: each plain case's default (run._attention_blocks) against session 36's blocks (BM 128 BN 64,
    8 warps, 3 stages, the default's HEAD_GROUP) where the two differ, else the default alone (its ratio to
    tilecore.attention in interleaved rounds)."""
    from tilecore.ops.napkin_compiled import run
    if SMOKE:
        return [("plain causal", 32, True, 0.0, {"default": None, "before": dict(BM=16, BN=16)})]
    cases = []
    for D in (128, 64):
        for causal in (True, False):
            before = dict(BM=128, BN=64, num_warps=8, num_stages=3, HEAD_GROUP=4 if causal else 0)
            now = run.attention_defaults(torch.device("cuda"), causal, plain_d128_tma=D == 128)
            cfgs = {"default": None} if now == before else {"default": None, "before: BM 128 BN 64 w8 s3": before}
            if D == 128 and not causal and now == before:  # run 1: 1.019x the default (1084-1095 against 1074-1136)
                cfgs["BM 128 BN 64 w8 s2 r128"] = dict(BM=128, BN=64, num_warps=8, num_stages=2, maxnreg=128, HEAD_GROUP=0)
            cases.append((f"plain{' causal' if causal else ''} D{D}", D, causal, 0.0, cfgs))
    return cases


def softcap_cases():
    """--softcap: softcap_approx(30) at D128, causal (BM 64 BN 64 4 warps, the default) and full (BM 128 BN 64
    8 warps), with compile.EXP2_FMA_PACK / EXP2_FMA_POLY: POLY of every PACK of the softmax's exponentials in
    unmasked key tiles by an FMA-pipe polynomial (sm_90a loop at BM 64: 435 instructions and 66 MUFU a warp
    a key tile; (8, 1) 472 and 62, (16, 3) 490 and 60; MUFU at 8 issue clocks each: the SFU-bound 528 clocks
    become 496 / 490)."""
    variants = {"default": None, "exp2 1 of 8 by FMA": {"_exp2": (8, 1)}, "exp2 3 of 16 by FMA": {"_exp2": (16, 3)}}
    if SMOKE:
        return [("softcap_approx 30 causal", 32, True, 30.0, {"default": None, "exp2 1 of 8": {"_exp2": (8, 1)}},
                 (f"scale({32 ** -0.5})", "softcap_approx(30.0)"))]
    return [(f"softcap_approx 30{' causal' if causal else ''} D128", 128, causal, 30.0, variants,
             (f"scale({128 ** -0.5})", "softcap_approx(30.0)")) for causal in (True, False)]


def final_softcap_cases():
    """--final: softcap_approx(30) D128 at its defaults, causal, and full against the polynomial exponentials
    off (EXP2_FMA_PACK 0: on by default since call 2's 1.038x)."""
    mods = (f"scale({128 ** -0.5})", "softcap_approx(30.0)")
    if SMOKE:
        return [("softcap_approx 30 D32", 32, False, 30.0, {"default": None, "exp2 all by MUFU": {"_exp2": (0, 1)}},
                 (f"scale({32 ** -0.5})", "softcap_approx(30.0)"))]
    return [("softcap_approx 30 causal D128", 128, True, 30.0, {"default": None}, mods),
            ("softcap_approx 30 D128", 128, False, 30.0, {"default": None, "exp2 all by MUFU (before)": {"_exp2": (0, 1)}},
             mods)]


def extra_cases():
    """--extra: the full D128 softcaps (one 8-warp program an SM by default) in two programs an SM as full
    plain D128 ships (2 stages, registers capped at 128: 126 / 128 registers, no spills through TMA, sm_90a),
    softcap_approx with and without its polynomial exponentials (they lost 3% where two programs share an SM)."""
    r128 = dict(BM=128, BN=64, num_warps=8, num_stages=2, maxnreg=128, HEAD_GROUP=0)
    if SMOKE:
        return [("softcap_approx 30 D32", 32, False, 30.0, {"default": None, "r128": dict(BM=16, BN=16, maxnreg=128)},
                 (f"scale({32 ** -0.5})", "softcap_approx(30.0)"))]
    return [("softcap_approx 30 D128", 128, False, 30.0,
             {"default": None, "BM 128 BN 64 w8 s2 r128": r128,
              "BM 128 BN 64 w8 s2 r128, exp2 all by MUFU": dict(r128, _exp2=(0, 1))},
             (f"scale({128 ** -0.5})", "softcap_approx(30.0)")),
            ("softcap 30 (exact) D128", 128, False, 30.0, {"default": None, "BM 128 BN 64 w8 s2 r128": r128},
             (f"scale({128 ** -0.5})", "softcap(30.0)"))]


def compiled(g, cfg):
    """The diagram compiled with cfg's blocks; cfg's "_exp2" (PACK, POLY) sets compile.EXP2_FMA_* for the
    emission (the source is made here: the module keeps it after the with-block)."""
    cfg = dict(cfg) if cfg else None
    exp2 = cfg.pop("_exp2", None) if cfg else None
    if exp2 is not None:
        from tilecore.tiles.switches import patched
        cm = sys.modules["tilecore.napkin.compile"]
        with patched(cm, EXP2_FMA_PACK=exp2[0], EXP2_FMA_POLY=exp2[1]):
            return CompiledDiagram(compile_diagram(g).program, cfg or None)
    return CompiledDiagram(compile_diagram(g).program, cfg or None)


def run_case(gpu, label, D, causal, softcap, cfgs, mods=None):
    B, H, N = (1, 2, 64) if SMOKE else (4, 16, 4096)
    mods = mods or (f"scale({D ** -0.5})",)
    g = gc.attention_diagram(B, H, N, D, DTN, mods, causal)
    small = gc.attention_diagram(1, H, N // 4, D, DTN, mods, causal)
    ins, ins_s = gc.rand_inputs(g), gc.rand_inputs(small, seed=2)
    fs, oks = {}, {}
    for name, cfg in cfgs.items():
        f = compiled(g, cfg)
        oks[name] = check(f"{label} B1 H{H} N{N // 4} {name}", small, compiled(small, cfg), ins_s)
        fs[name] = f
    kw = dict(softcap=softcap) if softcap else {}
    fs["tilecore.attention"] = lambda **x: tilecore.attention(x["Q"], x["K"], x["V"], causal=causal, **kw)
    for f in fs.values():
        f(**ins)
    times = {name: [] for name in fs}
    for _ in range(ROUNDS):
        for name, f in fs.items():
            times[name].append(gc.bench(lambda: f(**ins)) * 1e6)
    med = {n: sorted(t)[len(t) // 2] for n, t in times.items()}
    pred = gc.predict(g, gpu) * 1e6
    peer = med.pop("tilecore.attention")
    for name, us in med.items():
        r = {"case": f"{label} B{B} H{H} N{N} {name}", "compiled_us": us, "predicted_us": pred, "peer_us": peer,
             "x_peer": peer / us, "checked": oks[name], "rounds_us": times[name],
             "peer_rounds_us": times["tilecore.attention"], "config": cfgs[name]}
        RES["timings"].append(r)
        print(f"time {r['case']}: {us:.1f} us (median of {ROUNDS}), predicted {pred:.1f}, tilecore.attention "
              f"{peer:.1f}: {peer / us:.3f}x", flush=True)


def check(label, g, f, ins):
    """Poisoned call, float64 reference of every element (tilecore.ops.napkin_compiled.evaluate)."""
    from tilecore.ops.napkin_compiled import evaluate
    out = f(poison=True, **ins)
    err, written = gc.err_over_floor(g, out, evaluate(g, ins))
    ok = bool(written and err < 2.0)
    RES["checks"].append({"case": label, "err_over_floor": round(err, 3), "every_element_written": written, "ok": ok})
    print(f"check {label}: error {err:.2f}x the floor, {'all written' if written else 'NaN LEFT'}", flush=True)
    return ok


def dump():
    RES["wall_s"] = time.time() - START
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "napkin_compile_s37.json").write_text(json.dumps(RES, indent=1, default=str))


def main():
    gpu = gc.H100
    try:
        gpu = gc.ceilings()
        RES["ceilings"] = gc.RESULTS["ceilings"]
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        RES["errors"].append(f"ceilings: {type(e).__name__}: {e}")
    cases = ((plain_cases() if "--plain" in sys.argv else []) + (confirm_cases() if "--confirm" in sys.argv else [])
             + (softcap_cases() if "--softcap" in sys.argv else [])
             + (confirm_cases() + final_softcap_cases() if "--final" in sys.argv else [])
             + (extra_cases() if "--extra" in sys.argv else []))
    for case in cases:
        if time.time() - START > BUDGET_S:
            RES["errors"].append(f"{case[0]}: skipped (time budget)")
            continue
        try:
            run_case(gpu, *case)
        except Exception as e:  # noqa: BLE001 - report and go on
            traceback.print_exc()
            RES["errors"].append(f"{case[0]}: {type(e).__name__}: {e}")
        dump()
    dump()
    print(f"\ndevice: {RES['device']}; {RES['wall_s']:.0f} s; ceilings {RES.get('ceilings')}")
    bad = [c for c in RES["checks"] if not c["ok"]]
    print(f"checks: {len(RES['checks']) - len(bad)} of {len(RES['checks'])} right "
          f"({min((c['err_over_floor'] for c in RES['checks']), default=0):.2f}-"
          f"{max((c['err_over_floor'] for c in RES['checks']), default=0):.2f}x the floor)")
    for c in bad:
        print("FAILED", c)
    print(f"{'case (B4 H16 N4096 bf16)':<46} {'us':>8} {'pred':>8} {'c/pred':>6} {'peer us':>8} {'x peer':>6}")
    for r in RES["timings"]:
        print(f"{r['case'].replace(' B4 H16 N4096', '')[:46]:<46} {r['compiled_us']:8.1f} {r['predicted_us']:8.1f} "
              f"{r['compiled_us'] / r['predicted_us']:6.2f} {r['peer_us']:8.1f} {r['x_peer']:6.3f}"
              f"{'' if r['checked'] else '  CHECK FAILED'}")
    for e in RES["errors"]:
        print("error:", e)


if __name__ == "__main__":
    main()
