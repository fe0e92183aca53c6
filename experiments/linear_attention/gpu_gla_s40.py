"""GLA backward, session 40 (HA, issue 33): d 32's dq / dk kernel toward 75% of its bound (0.345 ms = 71.3% in session
39: the Gluon kernel with a pair of chunks a tile at 3 stages, one consumer warpgroup a chunk, two chains an SM). Variants:
three chunks a tile (gluon_gla_bwd CHUNKS 3: three consumer warpgroups at 160 registers, 2 stages, the chunks counted
over every (batch * head, chunk) so a tile may span two heads; the last tile's chunks past the end skipped), and dg's
store waited for at the next tile's start (FORM DG_LATE: 2562 = 2 + STORE_TMA + DG_LATE, so the stage's release does not
wait for it). Each variant is checked against float64 ON THE GPU first (a gated backward can be miscompiled on Hopper:
FLA's issue 640), then its kernel timed alone in interleaved rounds (< 60 s on an H100).

Checks (session 39's script's, which this copies): bf16 B2 N1024 H16 (512 chunks: a tile of three spans heads and the
last has two), an initial state and a final state's gradient, weak decays -U(0, 0.3) and strong ones -U(0, 6) with a
reset mid-chunk; outputs NaN-poisoned; dq / dk / dv as multiples of the bf16 rounding floor (<= 2.5), dg / dh0 relative
(< 0.05 / 0.01). Timing at B16 H16 N4096 (16,384 chunks: the last tile of three has one) in the main process: the
variant's kernel ("dqk0w", "dvw") or the whole backward ("bwd") in interleaved rounds, do_bench and CUDA-graph medians,
against its HBM bound at this run's copy bandwidth (gpu_gla_s37.dqk_bytes, dv_bytes).

    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_s40.py [--batch a] [--variants "..."] [--smoke]
JSON to $OUT/gla_s40<batch>.json (rewritten after each row); the table last. ``--smoke``: the checks on the CPU (the
interpreter runs the tl kernels; the Gluon forms are not taken there), tiny shapes, no timing.
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
from experiments.linear_attention.gpu_gla_s37 import (backward, dqk_bytes, load_reference, make, ref_path,  # noqa: E402
                                                      warm)

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
BATCH = sys.argv[sys.argv.index("--batch") + 1] if "--batch" in sys.argv else "a"
WARM_DEADLINE = 20.0  # the shared kernels' compile: the variants start then at the latest
WORKER_DEADLINE = 900.0 if SMOKE else 75.0  # a worker still compiling then is killed (its row says so)
TIME_DEADLINE = 140.0  # no timing round starts past it
CHECK_SHAPE = (1, 128, 2) if SMOKE else (2, 1024, 16)  # B, N, H
TIME_SHAPE = (16, 4096, 16)
CASES = {"weak": dict(decay=0.3, reset=False, seed=1), "strong+reset": dict(decay=6.0, reset=True, seed=2)}
# name: (Dk = Dv, CHUNKED overrides, the kernel timed: "dvw" the dv common launch, "dqk0w" the dq / dk one, "bwd" the
# whole backward)
# gluon_gla_bwd FORM: configs' 1538 = 2 + STORE_TMA 512 + DG_TMA 1024; + DG_LATE 2048 for DG_TMA (2562), + J_SMEM 8192,
# + DG_MERGE 16384, + PIECES_RZ 32768 (VALUE_LATE 4096 and three chunks a tile were removed after call 2, DG_MERGE after
# call 3)
THREE = dict(dqk_gluon=2, dqk_gluon_chunks=3)  # (call 2 only)
BATCHES = {
    # call 2: d 32's dq / dk kernel, configs' (two chunks a tile, 3 stages) against three chunks a tile (sm_90a: 608 B
    # spilled at 1538, 316 with VALUE_LATE, 508 with VALUE_LATE + J_SMEM; 160 registers a consumer) and the two-chunk
    # kernel with DG_LATE, VALUE_LATE, J_SMEM or DG_MERGE (4-52 B spilled)
    "a": {
        "d32 configs dqk": (32, {}, "dqk0w"),
        "d32 three chunks": (32, THREE, "dqk0w"),
        "d32 three chunks vl": (32, dict(THREE, dqk_gluon_form=5634), "dqk0w"),
        "d32 three chunks vl j": (32, dict(THREE, dqk_gluon_form=13826), "dqk0w"),
        "d32 dg late": (32, dict(dqk_gluon_form=2562), "dqk0w"),
        "d32 value late": (32, dict(dqk_gluon_form=5634), "dqk0w"),
        "d32 j smem": (32, dict(dqk_gluon_form=9730), "dqk0w"),
        "d32 dg merge": (32, dict(dqk_gluon_form=17922), "dqk0w"),
        "d32 dg merge j": (32, dict(dqk_gluon_form=26114), "dqk0w"),
    },
    # call 3 (after call 2, runs/ha_s40a_run2_session40_h100.txt: J_SMEM 0.3481 ms = 70.7% against configs' 0.3624,
    # rounds 0.3479-0.3498 against 0.3506-0.3642; three chunks 0.46-0.54 (spills), removed): J_SMEM alone and with
    # DG_LATE / DG_MERGE at d 32, the kernel and the whole backward; J_SMEM at d 64 (172.5 KB; d 128 has no 8 KB left);
    # the d 128 dv kernel's key step KD 128 (65.5 KB, 2 programs an SM) and 32 (227 registers); PIECES_RZ (the bf16
    # pieces by truncation: no F2F; sm_90a d 32 4544 -> 4384 SASS instructions, with J_SMEM 4304; d 64 4712 -> 4552)
    "b": {
        "d32 configs dqk": (32, {}, "dqk0w"),
        "d32 j smem": (32, dict(dqk_gluon_form=9730), "dqk0w"),
        "d32 j dg late": (32, dict(dqk_gluon_form=10754), "dqk0w"),
        "d32 j dg merge": (32, dict(dqk_gluon_form=26114), "dqk0w"),
        "d32 j dg late merge": (32, dict(dqk_gluon_form=27138), "dqk0w"),
        "d32 configs bwd": (32, {}, "bwd"),
        "d32 j smem bwd": (32, dict(dqk_gluon_form=9730), "bwd"),
        "d64 configs dqk": (64, {}, "dqk0w"),
        "d64 j smem": (64, dict(dqk_gluon_form=9730), "dqk0w"),
        "d32 rz": (32, dict(dqk_gluon_form=34306), "dqk0w"),
        "d32 j rz": (32, dict(dqk_gluon_form=42498), "dqk0w"),
        "d64 rz": (64, dict(dqk_gluon_form=34306), "dqk0w"),
        "d128 dv configs": (128, {}, "dvw"),
        "d128 dv kd128": (128, dict(KD=128), "dvw"),
        "d128 dv kd32": (128, dict(KD=32), "dvw"),
    },
    # call 4 (after call 3, runs/ha_s40b_run3_session40_h100.txt: d 32 J_SMEM 0.3393 ms = 72.6% and + DG_LATE 0.3358
    # (73.3%) against configs' 0.3517 (70.0%), the whole backward 0.9557 against 0.9625; DG_MERGE lost again (removed);
    # PIECES_RZ 0.3561 at d 32 but 0.6766 (79.4%) against 0.7131 at d 64; the dv kernel's KD 128 0.990 against 0.953):
    # the d 32 combinations again, PIECES_RZ with DG_LATE at d 32 / 64 and at d 128 (dq / dk at 81% there), KD 32 at d 128
    "c": {
        "d32 configs dqk": (32, {}, "dqk0w"),
        "d32 j": (32, dict(dqk_gluon_form=9730), "dqk0w"),
        "d32 j dg late": (32, dict(dqk_gluon_form=10754), "dqk0w"),
        "d32 j dg late rz": (32, dict(dqk_gluon_form=43522), "dqk0w"),
        "d32 dg late rz": (32, dict(dqk_gluon_form=35330), "dqk0w"),
        "d32 configs bwd": (32, {}, "bwd"),
        "d32 j dg late bwd": (32, dict(dqk_gluon_form=10754), "bwd"),
        "d64 configs dqk": (64, {}, "dqk0w"),
        "d64 rz": (64, dict(dqk_gluon_form=34306), "dqk0w"),
        "d64 rz dg late": (64, dict(dqk_gluon_form=35330), "dqk0w"),
        "d128 configs dqk": (128, {}, "dqk0w"),
        "d128 rz": (128, dict(dqk_gluon_form=34306), "dqk0w"),
        "d128 dv configs": (128, {}, "dvw"),
        "d128 dv kd32": (128, dict(KD=32), "dvw"),
    },
    # call 6 (configs at f43ba4e9; after call 5, runs/ha_s40c_run5_session40_h100.txt: d 32 J_SMEM 0.3369 ms = 73.0% against configs' 0.3534
    # (1.049x; 1.037x / 1.041x in calls 2-3), J + DG_LATE 0.3432 (0.982x J); d 64 PIECES_RZ 0.6766 = 79.3% against 0.7129
    # (1.054x again); d 128 PIECES_RZ 1.499 (83.5%) against 1.532 (1.022x by graphs; eager medians 1.726 / 1.548); the dv
    # kernel's KD 32 1.178 against 0.949): configs' new forms (d 32 9730, d 64 34306) against the session's start (1538),
    # d 64 with bf16 g (35330), the public op through autograd at d 32 / 64 with them and at d 128 with PIECES_RZ, d 128
    # PIECES_RZ again
    "d": {
        "d32 configs dqk": (32, {}, "dqk0w"),
        "d32 start dqk": (32, dict(dqk_gluon_form=1538), "dqk0w"),
        "d32 configs bwd": (32, {}, "bwd"),
        "d32 start bwd": (32, dict(dqk_gluon_form=1538), "bwd"),
        "d32 op": (32, dict(op=(2, 1024, 3, 32, True)), None),
        "d64 configs dqk": (64, {}, "dqk0w"),
        "d64 start dqk": (64, dict(dqk_gluon_form=1538), "dqk0w"),
        "d64 bf16 g": (64, dict(g_dtype="bf16"), None),
        "d64 op": (64, dict(op=(2, 1024, 3, 64, False)), None),
        "d128 configs dqk": (128, {}, "dqk0w"),
        "d128 rz": (128, dict(dqk_gluon_form=34306), "dqk0w"),
        "d128 rz op": (128, dict(op=(1, 1024, 2, 128, True), dims={"128,128": dict(dqk_gluon_form=34306)}), None),
    },
}
VARIANTS = BATCHES[BATCH]
if "--variants" in sys.argv:
    keep = sys.argv[sys.argv.index("--variants") + 1].split(",")
    VARIANTS = {k: v for k, v in VARIANTS.items() if k in keep}


def dv_bytes(B, N, H, Dk, Dv, BT=64, elt=2) -> int:
    """The dv kernel's compulsory HBM bytes: q, k (elt), g (float32), do (elt), dS_c (elt) read once; dv (elt)
    written."""
    NT = -(-N // BT)
    return B * N * H * (2 * Dk * elt + Dk * 4 + 2 * Dv * elt) + B * H * NT * Dk * Dv * elt


def knobs(over: dict):
    """A variant's (CHUNKED overrides, the inputs' dtype: None for make's bf16 q, k, v, do, or "bf16 g": g in bf16)."""
    over = dict(over)
    if over.pop("g_dtype", None) == "bf16":
        return over, "bf16 g"
    return over, {"fp16": torch.float16}.get(over.pop("dtype", None))


def with_dtype(t: dict, dtype) -> dict:
    """The inputs with q, k, v, do in dtype, or g in bf16 (rounded once: the reference takes the rounded ones)."""
    if dtype == "bf16 g":
        return dict(t, g=t["g"].to(torch.bfloat16))
    return t if dtype is None else dict(t, **{n: t[n].to(dtype) for n in ("q", "k", "v", "do")})


def step_of(t, ht, over, name: str):
    """The launch ``name`` of the variant's backward: (kernel's name, a callable running it alone); "bwd": the whole
    backward (kernels_backward_gla_chunked.backward, its buffers allocated each call)."""
    if name == "bwd":
        return "backward", (lambda: backward(t, ht, over))
    steps = []
    backward(t, ht, over, steps=steps)
    s = next(s for s in steps if s[0] == name)
    kernel = getattr(s[1], "__name__", None) or s[1].fn.__name__
    return kernel, (lambda: s[1][s[2]](*s[3], **s[4]))


def check_variant(name: str) -> dict:
    """The variant's backward against float64 on both cases (its own process)."""
    from tilecore import accuracy
    from tilecore.ops.linear_attention import linear_attention_reference

    D, over, which = VARIANTS[name]
    row = dict(variant=name)
    if "op" in over:  # the public op through autograd with configs' defaults (gpu_gla_op.check against float64)
        from experiments.linear_attention.gpu_gla_op import check as op_check

        from tilecore.ops.linear_attention import configs_gla_bwd
        from tilecore.tiles.switches import patched

        dims = dict(configs_gla_bwd.CHUNKED_FLAT_DIMS)  # ("dims": a head dim's entry replaced, as a flip would)
        for key, value in over.get("dims", {}).items():  # ("Dk,Dv": JSON keys)
            at = tuple(int(x) for x in key.split(","))
            dims[at] = dict(dims[at], **value)
        with patched(configs_gla_bwd, CHUNKED_FLAT_DIMS=dims):
            r = op_check(*((1, 128, 1) + over["op"][3:] if SMOKE else over["op"]))  # (B, N, H, D, strong)
        cell = dict(dq=r["dq"], dk=r["dk"], dv=r["dv"], dg=round(r["dg"], 5), dh0=r["dh0"], o=r["o"], **{"pass": r["pass"]})
        return dict(row, **{"strong+reset" if over["op"][-1] else "weak": cell}, kernel="(public op)",
                    **{"pass": r["pass"]})
    over, dtype = knobs(over)
    for case, kw in CASES.items():
        t = with_dtype(make(*CHECK_SHAPE, D, **kw), dtype)
        if SMOKE or dtype is not None:  # (other inputs: their own reference)
            leaves = [t[n].detach().double().requires_grad_() for n in ("q", "k", "v", "g", "h0")]
            o, st = linear_attention_reference(*leaves[:3], decay=leaves[3], scale=D ** -0.5, initial_state=leaves[4])
            ref = torch.autograd.grad((o * t["do"].double()).sum() + (st * t["dht"].double()).sum(), leaves)
            st = st.detach().float()
        else:
            backward(t, t["h0"], over)  # (compiled while the main process makes the references)
            torch.cuda.synchronize()
            ref, st = load_reference(D, case)
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
    row["kernel"] = step_of(t, st, over, which)[0] if which else None
    row["pass"] = all(row[c]["pass"] for c in CASES)
    return row


def timing(run: Run, rows: dict) -> None:
    """Each passing variant's kernel alone (interleaved rounds, eager and graph medians), a head dim at a time; the
    composed backward once (eager, disturbed by the other lanes: a guide only)."""
    B, N, H = TIME_SHAPE
    x = torch.empty(2 ** 29, dtype=torch.bfloat16, device=DEV)
    y = torch.empty_like(x)
    copy = 2 * x.numel() * 2 / eager_ms(lambda: y.copy_(x)) / 1e6  # GB/s, read + write
    x = y = None  # (freed)
    run.extra["copy_GBps"] = round(copy, 1)
    for D in dict.fromkeys(d for d, _, _ in VARIANTS.values()):
        names = [n for n, (d, o, w) in VARIANTS.items() if d == D and w and "dtype" not in o and rows.get(n, {}).get("pass")]
        if not names or run.left() <= 0:
            continue
        torch.cuda.empty_cache()
        t = make(B, N, H, D, decay=0.3, reset=False, seed=0)
        ht = torch.randn(B, H, D, D, device=DEV)
        fns = {}
        for name in names:
            _, over, which = VARIANTS[name]
            if which != "bwd":
                rows[name]["bound_ms"] = round((dv_bytes if which == "dvw" else dqk_bytes)(B, N, H, D, D) / copy / 1e6,
                                               4)
            fns[name] = step_of(t, ht, over, which)[1]
            fns[name]()  # (compiled at this shape's specialization, if it differs)
        torch.cuda.synchronize()
        times = time_rounds(fns, rounds=5, graph=True, deadline=run)  # (close pairs: five rounds)
        for name in names:
            r = rows[name]
            r.update(ms=times.get(f"{name}_ms"), graph_ms=times.get(f"{name}_graph_ms"),
                     rounds=times.get(f"{name}_rounds"))
            best = r["graph_ms"] or r["ms"]
            r["pct"] = round(100 * r["bound_ms"] / best, 1) if best and "bound_ms" in r else None
            over = VARIANTS[name][1]
            r["bwd_ms"] = (round(eager_ms(lambda: backward(t, ht, over), warmup=3, rep=20), 4)
                           if run.left() > 4 and VARIANTS[name][2] != "bwd" else None)
            run.say(json.dumps(dict(variant=name, ms=r["ms"], graph_ms=r["graph_ms"], pct=r["pct"], bwd_ms=r["bwd_ms"])))
        t = ht = None  # (freed before the next head dim's inputs)


def main():
    if "--one" in sys.argv:
        print("ROW " + json.dumps(check_variant(sys.argv[sys.argv.index("--one") + 1])), flush=True)
        return
    if "--warm" in sys.argv:  # (gpu_gla_s37's: configs' backward at the check shape)
        warm(int(sys.argv[sys.argv.index("--warm") + 1]))
        return
    run = Run(f"gla_s40{BATCH}", deadline=TIME_DEADLINE)
    run.extra.update(check_shape=CHECK_SHAPE, time_shape=TIME_SHAPE, variants={k: v[1:] for k, v in VARIANTS.items()})
    os.environ["HA_REFS"] = tempfile.mkdtemp()  # (the workers inherit it)

    def spawn(*args):
        return subprocess.Popen([sys.executable, __file__, *args] + ["--smoke"] * SMOKE
                                + ["--batch", BATCH, "--variants", ",".join(VARIANTS)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    dims = list(dict.fromkeys(d for d, _, _ in VARIANTS.values()))
    procs = {}
    if SMOKE:
        procs = {n: spawn("--one", n) for n in VARIANTS}
    else:
        warmers = {D: spawn("--warm", str(D)) for D in dims}
        # the variants whose blocks differ from configs' (nothing of the warm-up's to wait for) from the start
        apart = [n for n, (_, o, _) in VARIANTS.items() if "BKB" in o or "op" in o or "dtype" in o or "g_dtype" in o]
        procs.update({n: spawn("--one", n) for n in apart})
        for D in dims:  # the references meanwhile (written once, read by every variant of the head dim)
            for case in CASES:
                from experiments.linear_attention.gpu_gla_s37 import reference as make_reference

                make_reference(D, case, ref_path(D, case).with_suffix(".tmp"))
                ref_path(D, case).with_suffix(".tmp").rename(ref_path(D, case))
                ref_path(D, case).with_suffix(".done").touch()
            torch.cuda.empty_cache()
            run.say(f"d{D} references")
        for D in dims:
            try:
                warmers[D].communicate(timeout=max(1.0, WARM_DEADLINE - run.elapsed()))
            except subprocess.TimeoutExpired:
                pass  # (the variants compile what is left)
            run.say(f"d{D} warm")
            procs.update({n: spawn("--one", n) for n, (d, _, _) in VARIANTS.items() if d == D and n not in apart})
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
        run.say(json.dumps(rows[n])[:400])
    if not SMOKE:
        run.attempt("timing", timing, run, rows)
    for n in VARIANTS:
        r = rows[n]
        cells = {c: f"{r[c]['dq']}/{r[c]['dk']}/{r[c]['dv']} {r[c]['dg']}" + ("" if r[c]["pass"] else " FAIL")
                 for c in CASES if c in r}
        rnd = (r.get("rounds") or {}).get("graph") or (r.get("rounds") or {}).get("eager") or []
        run.row(n, pass_=r.get("pass"), weak=cells.get("weak"), strong=cells.get("strong+reset"), ms=r.get("ms"),
                graph_ms=r.get("graph_ms"), rounds="/".join(f"{x:.4f}" for x in rnd) or None, bound_ms=r.get("bound_ms"),
                pct=r.get("pct"), bwd_ms=r.get("bwd_ms"), kernel=r.get("kernel"), error=r.get("error"))
    print(f"\nGLA backward s40 ({run.meta.get('gpu')}; checks bf16 B{CHECK_SHAPE[0]} N{CHECK_SHAPE[1]} H{CHECK_SHAPE[2]}"
          f" dq/dk/dv x floor, dg rel; times B16 H16 N4096 (graph rounds), copy {run.extra.get('copy_GBps', '-')} GB/s;"
          " pct of the bound by the graph median)")
    run.finish(["name", "pass_", "weak", "strong", "ms", "graph_ms", "rounds", "pct", "bwd_ms"])


if __name__ == "__main__":
    main()
