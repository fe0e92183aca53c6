"""GLA backward, session 37 (HA, issue 33): the dq / dk kernel (the chunk-parallel form's common launch) at d 128 / 64,
its variants against configs' in one run, each checked against float64 ON THE GPU first (a gated backward can be
miscompiled on Hopper: FLA's issue 640), then timed (< 60 s on an H100).

Sets (``--set NAME``; one per device call; FORM n: gluon_gla_bwd's FORM bits, configs' is 2). Since session 38 the
bits 4 / 16 / 32 / 128 (EARLY_VALUE, TRI_SMEM, EXP_FEW, G_TWO) are always on with 2 and no longer read (removed,
issue 30): a FORM n here builds n's other bits only (182 as 2, 438 and 310 as 258), so the forms without them (6,
34, 38, 50, 54) are no longer built; since decision 185 EXP_FTZ 256 and AT_SMEM too: every FORM here builds FORM 2
(ex2.approx.ftz, a^T from a's tile), with the pointer stores.

* ``call1`` (session 37 device calls 2 and 3, runs/gla_s37a_run2_session37_h100.txt at 62cdf46 and
  runs/gla_s37a_run3_session37_h100.txt at 9dd9a7c; its set then: d 64 configs' (the flat tl launch) against FORM 2 at
  3 and 2 stages (call 3: FORM 98 at 3); d 128 configs' (FORM 2), the flat launch (call 2), FORM 6 / 34 / 38 / 54
  (call 2) / 98 / 102 (call 3), FORM 2's probes; each variant's worker compiled every kernel and made its own
  references: on call 2's slow host only d 64, d 128 flat and FORM 54 finished by 34 s): d 64 FORM 2 at 2 stages 1.07x
  the flat launch (on since); d 128 FORM 54 1.855 ms = 67.5% (call 2), FORM 38 1.95-1.98 against FORM 2's 2.16-2.17
  (call 3), DG_ONE slower (98, 102: the bit removed since, so the set no longer lists them).
* ``call3``: the confirmation of configs' (since call 4: FORM 182 at d 128, 438 at d 64) against FORM 2 (the session's
  start at d 128, call 2's flip at d 64), FORM 38 (call 3's flip) and 310 (call 4's tie) at d 128, the flat launch at
  d 64, and the public op through autograd (gpu_gla_op.check: B1 N1024 H2 d 128 strong + a reset, B2 N1024 H3 d 64).
* ``call2`` (device call 4, runs/gla_s37b_run4_session37_h100.txt): d 128 FORM 182 1.78 ms = 70.5%, 310 70.4%, 54
  67.1%, 438 63.3%, configs' 38 64.4%, FORM 2 58.2%; d 64 FORM 438 0.826 ms = 65.1%, 54 57.8%, FORM 2 55.0%, flat 55.3%.
  Its set: configs' (since call 3: FORM 38 = 2 + EARLY_VALUE + EXP_FEW at d 128, FORM 2 at d 64 with 2 stages)
  against FORM 2, 54 (38 + TRI_SMEM), 50 (TRI_SMEM + EXP_FEW), 182 (54 + G_TWO), 310 (54 + EXP_FTZ), 438 (54 + G_TWO +
  EXP_FTZ) at d 128; the flat launch, 54 and 438 at d 64.

The main process makes the float64 references once a head dim (bf16 B2 N1024 H16: the timed shape's specializations;
an initial state and a final state's gradient, weak decays -U(0, 0.3) and strong ones -U(0, 6) with a reset
mid-chunk: flagged blocks the fallback launch rewrites) while one worker a head dim compiles configs' backward (the
shared tl kernels into the cache); then each variant checks in a worker of its own (compiling only its dqk kernel),
outputs NaN-poisoned; dq / dk / dv as multiples of the bf16 rounding floor, dg / dh0 relative. The main process then
times the variants that passed at B16 H16 N4096, in two interleaved rounds: the dqk launch alone (against its HBM
bound at this run's copy bandwidth) and, in the first round, the composed backward.

    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_s37.py --set call3
JSON to $OUT/gla_s37_<set>.json; the table last.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import sys
import time
from pathlib import Path

import torch

START = time.time()
SET = sys.argv[sys.argv.index("--set") + 1] if "--set" in sys.argv else "call3"
WARM_DEADLINE = 30.0  # the shared kernels' compile: the variants start then at the latest
WORKER_DEADLINE = 900.0 if "--smoke" in sys.argv else 44.0  # from the start: a worker still compiling then is killed (its row says so)
TIME_DEADLINE = 53.0  # no timing starts past it (the probes, last, run only if the rest left time)

# name: (Dk = Dv, CHUNKED overrides, timed: True / "probe")
SETS = {
    "call1": {
        "d64 configs": (64, {}, True),
        "d64 form2 st3": (64, dict(dqk_gluon=3, dqk_gluon_form=2), True),
        "d128 configs": (128, {}, True),
        "d128 form6": (128, dict(dqk_gluon_form=6), True),
        "d128 form34": (128, dict(dqk_gluon_form=34), True),
        "d128 form38": (128, dict(dqk_gluon_form=38), True),
        **{f"d128 probe {p}": (128, dict(dqk_gluon_probe=p), "probe") for p in (1, 2, 4, 8, 16)},
    },
    "call2": {
        "d64 configs": (64, {}, True),
        "d64 flat": (64, dict(dqk_gluon=0), True),
        "d64 form54": (64, dict(dqk_gluon_form=54), True),
        "d64 form438": (64, dict(dqk_gluon_form=438), True),
        "d128 configs": (128, {}, True),
        "d128 form2": (128, dict(dqk_gluon_form=2), True),
        "d128 form54": (128, dict(dqk_gluon_form=54), True),
        "d128 form50": (128, dict(dqk_gluon_form=50), True),
        "d128 form182": (128, dict(dqk_gluon_form=182), True),
        "d128 form310": (128, dict(dqk_gluon_form=310), True),
        "d128 form438": (128, dict(dqk_gluon_form=438), True),
    },
    "call3": {  # the confirmation: configs' (182 at d 128, 438 at d 64) against the session's start and flips, the op
        "d64 configs": (64, {}, True),
        "d64 form2": (64, dict(dqk_gluon_form=2), True),
        "d64 flat": (64, dict(dqk_gluon=0), True),
        "d64 op": (64, dict(op=(2, 1024, 3, 64, False)), "op"),
        "d128 configs": (128, {}, True),
        "d128 form2": (128, dict(dqk_gluon_form=2), True),
        "d128 form38": (128, dict(dqk_gluon_form=38), True),
        "d128 form310": (128, dict(dqk_gluon_form=310), True),
        "d128 op": (128, dict(op=(1, 1024, 2, 128, True)), "op"),
    },
}
VARIANTS = SETS[SET]
if "--only" in sys.argv:  # (a subset: e.g. the CPU smoke run)
    VARIANTS = {k: v for k, v in VARIANTS.items() if k in sys.argv[sys.argv.index("--only") + 1].split(",")}
PROBES = {1: "no L g, J g", 2: "no <S, dS>", 4: "no value mma", 8: "no intra mma", 16: "no dG sums"}
CASES = {"weak": dict(decay=0.3, reset=False, seed=1), "strong+reset": dict(decay=6.0, reset=True, seed=2)}
SMOKE = "--smoke" in sys.argv  # the checks on the CPU (the interpreter: the tl kernels), tiny shapes, no timing
DEV = "cpu" if SMOKE else "cuda"
CHECK_SHAPE = (1, 128, 2) if SMOKE else (2, 1024, 16)  # B, N, H
TIME_SHAPE = (16, 4096, 16)


def make(B, N, H, D, *, decay, reset, seed):
    torch.manual_seed(seed)
    t = {n: torch.randn(B, N, H, D, dtype=torch.bfloat16, device=DEV) for n in ("q", "k", "v", "do")}
    g = -torch.rand(B, N, H, D, device=DEV) * decay
    if reset:
        g[:, N // 2 + 5, :, : D // 4] = float("-inf")
    t.update(g=g, h0=torch.randn(B, H, D, D, device=DEV), dht=torch.randn(B, H, D, D, device=DEV))
    return t


def backward(t, ht, over, out=None, steps=None):
    from tilecore.ops.linear_attention import kernels_backward_gla_chunked
    from tilecore.ops.linear_attention.plan import IDENTITY, tl_plan

    p = tl_plan(t["q"], t["v"], t["g"], IDENTITY, 64, diag=5)
    return kernels_backward_gla_chunked.backward(p, t["do"], t["q"], t["k"], t["v"], t["g"], t["h0"], ht, t["dht"],
                                                 t["q"].shape[-1] ** -0.5, out=out, steps=steps, **over)


def dqk_kernel(t, ht, over) -> str:
    steps = []
    backward(t, ht, over, steps=steps)
    k = next(s[1] for s in steps if s[0] == "dqk0w")
    return getattr(k, "__name__", None) or getattr(k, "fn", k).__name__


def reference(D: int, case: str, path: Path):
    """The float64 gradients of (D, case) at CHECK_SHAPE into path (dq, dk, dv, dg, dh0 and the final state)."""
    from tilecore.ops.linear_attention import linear_attention_reference

    B, N, H = CHECK_SHAPE
    t = make(B, N, H, D, **CASES[case])
    leaves = [t[n].detach().double().requires_grad_() for n in ("q", "k", "v", "g", "h0")]
    o, st = linear_attention_reference(*leaves[:3], decay=leaves[3], scale=D ** -0.5, initial_state=leaves[4])
    ref = torch.autograd.grad((o * t["do"].double()).sum() + (st * t["dht"].double()).sum(), leaves)
    torch.save(dict(ref=[r.cpu() for r in ref], st=st.detach().float().cpu()), path)


def ref_path(D: int, case: str) -> Path:
    return Path(os.environ.get("HA_REFS", "/tmp")) / f"gla_s37_ref_d{D}_{case.replace('+', '_')}.pt"


def load_reference(D: int, case: str):
    """The main process's float64 gradients and final state of (D, case), once its file is written (waited for)."""
    while not ref_path(D, case).with_suffix(".done").exists():
        time.sleep(0.2)
    saved = torch.load(ref_path(D, case))
    return [r.to(DEV) for r in saved["ref"]], saved["st"].to(DEV)


def check(name: str) -> dict:
    """The variant against float64 on both cases (its own process, the references from the main process's files,
    waited for); a probe is compiled and run once, not checked."""
    from tilecore import accuracy
    from tilecore.ops.linear_attention import linear_attention_reference

    D, over, timed = VARIANTS[name]
    B, N, H = CHECK_SHAPE
    row = dict(variant=name)
    if timed == "op":  # the public op through autograd with configs' defaults (gpu_gla_op.check against float64)
        import importlib.util

        spec = importlib.util.spec_from_file_location("gpu_gla_op", Path(__file__).with_name("gpu_gla_op.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return dict(mod.check(*over["op"]), variant=name, op=True)
    if timed == "probe":
        t = make(B, N, H, D, decay=0.3, reset=False, seed=1)
        backward(t, t["h0"], over)
        if not SMOKE:
            torch.cuda.synchronize()
        return dict(row, probe=True, dqk_kernel=dqk_kernel(t, t["h0"], over))
    for case, kw in CASES.items():
        t = make(B, N, H, D, **kw)
        if SMOKE:
            leaves = [t[n].detach().double().requires_grad_() for n in ("q", "k", "v", "g", "h0")]
            o, st = linear_attention_reference(*leaves[:3], decay=leaves[3], scale=D ** -0.5, initial_state=leaves[4])
            ref = torch.autograd.grad((o * t["do"].double()).sum() + (st * t["dht"].double()).sum(), leaves)
        else:
            backward(t, t["h0"], over)  # (compiled while the main process makes the references)
            torch.cuda.synchronize()
            ref, st = load_reference(D, case)
        nan = float("nan")
        out = dict(dq=torch.full_like(t["q"], nan), dk=torch.full_like(t["k"], nan), dv=torch.full_like(t["v"], nan),
                   dg=torch.full_like(t["g"], nan), dh0=torch.full_like(t["h0"], nan))
        got = backward(t, st.float(), over, out=out)
        if not SMOKE:
            torch.cuda.synchronize()
        got = [got[i] for i in (0, 1, 2, 3, 5)]
        live = t["g"] >= -100
        res = {}
        for nm, x, r, inp in zip(("dq", "dk", "dv", "dg", "dh0"), got, ref, (t["q"], t["k"], t["v"], None, None)):
            ok = bool(torch.isfinite(x).all())
            if inp is not None:
                res[nm] = round(accuracy.rel_rms(x, r) / accuracy.rounding_floor(r, inp.dtype), 3)
            elif nm == "dg":
                res[nm] = round(accuracy.rel_rms(x[live], r[live]), 5)
            else:
                res[nm] = round(accuracy.rel_rms(x, r), 6)
            res[nm + "_ok"] = ok
        res["pass"] = all(res[n + "_ok"] for n in ("dq", "dk", "dv", "dg", "dh0")) and all(
            res[n] <= 2.5 for n in ("dq", "dk", "dv")) and res["dg"] < 0.05 and res["dh0"] < 0.01
        row[case] = res
        row["dqk_kernel"] = dqk_kernel(t, st.float(), over)
    row["pass"] = all(row[c]["pass"] for c in CASES)
    return row


def bench(fn) -> float:
    import triton

    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def dqk_bytes(B, N, H, Dk, Dv, BT=64, elt=2) -> int:
    """The dqk kernel's compulsory HBM bytes: q, k, v, do (elt), g (float32), S_c, dS_c (elt) read once; dq, dk
    (elt), dg (float32) written."""
    NT = -(-N // BT)
    tokens = B * N * H
    states = 2 * B * H * NT * Dk * Dv * elt
    return tokens * (2 * Dk * elt + Dk * 4 + 2 * Dv * elt) + states + tokens * Dk * (2 * elt + 4)


def timing(rows: dict) -> dict:
    """Each passing variant's dqk launch alone (two interleaved rounds) and composed backward (first round), ms; the
    head dims in the set's order; probes once, after both rounds (their first call compiles them)."""
    B, N, H = TIME_SHAPE
    x = torch.empty(2 ** 29, dtype=torch.bfloat16, device=DEV)
    y = torch.empty_like(x)
    copy = 2 * x.numel() * 2 / bench(lambda: y.copy_(x)) / 1e6  # GB/s, read + write
    x = y = None  # (freed)
    res = dict(copy_GBps=round(copy, 1))
    dims = list(dict.fromkeys(d for d, _, _ in VARIANTS.values()))
    for D in dims:
        names = [n for n, (d, _, tm) in VARIANTS.items() if d == D and tm is True and rows.get(n, {}).get("pass")]
        probes = [n for n, (d, _, tm) in VARIANTS.items() if d == D and tm == "probe" and rows.get(n, {}).get("probe")]
        if not names or time.time() - START > TIME_DEADLINE:
            continue
        torch.cuda.empty_cache()
        t = make(B, N, H, D, decay=0.3, reset=False, seed=0)
        t["ht"] = torch.randn(B, H, D, D, device=DEV)
        bound = dqk_bytes(B, N, H, D, D) / copy / 1e6
        for rnd in range(3):  # two rounds of the checked variants, then the probes once (compiled here)
            for name in (names if rnd < 2 else probes):
                if time.time() - START > TIME_DEADLINE:
                    break
                over = VARIANTS[name][1]
                steps = []
                backward(t, t["ht"], over, steps=steps)
                step = next(s for s in steps if s[0] == "dqk0w")
                ms = bench(lambda: step[1][step[2]](*step[3], **step[4]))
                first = rnd == 0
                bwd = bench(lambda: backward(t, t["ht"], over)) if first else float("nan")
                r = res.setdefault(name, dict(dqk_ms=[], bwd_ms=[], dqk_bound_ms=round(bound, 4)))
                r["dqk_ms"].append(round(ms, 4))
                if first:
                    r["bwd_ms"].append(round(bwd, 4))
                r["dqk_pct"] = round(100 * bound / min(r["dqk_ms"]), 1)
                print(json.dumps(dict(variant=name, round=rnd, dqk_ms=round(ms, 4), bwd_ms=round(bwd, 4),
                                      dqk_pct=round(100 * bound / ms, 1))), flush=True)
        print(f"d{D} timed at {time.time() - START:.0f} s", flush=True)
        t = None  # (freed before the next head dim's inputs)
    return res


def warm(D: int) -> None:
    """configs' backward once at the check shape: the shared tl kernels into the cache (a worker of its own)."""
    t = make(*CHECK_SHAPE, D, **CASES["weak"])
    backward(t, t["h0"], {})
    if not SMOKE:
        torch.cuda.synchronize()
    print("WARM", D, flush=True)


def main():
    if "--one" in sys.argv:
        print("ROW " + json.dumps(check(sys.argv[sys.argv.index("--one") + 1])), flush=True)
        return
    if "--warm" in sys.argv:
        warm(int(sys.argv[sys.argv.index("--warm") + 1]))
        return

    def spawn(*args):
        return subprocess.Popen([sys.executable, __file__, "--set", SET, *args] + ["--smoke"] * SMOKE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    dims = list(dict.fromkeys(d for d, _, tm in VARIANTS.values() if tm is True))
    procs = {}
    os.environ["HA_REFS"] = tempfile.mkdtemp()  # (the workers inherit it)
    if not SMOKE:  # each head dim's shared kernels compiled once (then the variants compile only their dqk kernel)
        warmers = {D: spawn("--warm", str(D)) for D in dims}
        # the public op's rows from the start (their own shapes and the forward: nothing shared with the rest)
        procs.update({n: spawn("--one", n) for n, (_, _, tm) in VARIANTS.items() if tm == "op"})
        for D in dims:  # the references, meanwhile (written once, read by every variant of the head dim)
            for case in CASES:
                reference(D, case, ref_path(D, case).with_suffix(".tmp"))
                ref_path(D, case).with_suffix(".tmp").rename(ref_path(D, case))
                ref_path(D, case).with_suffix(".done").touch()
            torch.cuda.empty_cache()
            print(f"d{D} references at {time.time() - START:.0f} s", flush=True)
        for D in dims:
            try:
                warmers[D].communicate(timeout=max(1.0, WARM_DEADLINE - (time.time() - START)))
            except subprocess.TimeoutExpired:
                pass  # (the variants compile what is left)
            print(f"d{D} warm at {time.time() - START:.0f} s", flush=True)
            procs.update({n: spawn("--one", n) for n, (d, _, tm) in VARIANTS.items() if d == D and tm is True})
    else:
        procs = {n: spawn("--one", n) for n, (_, _, tm) in VARIANTS.items() if tm is True}
    rows = {}
    for n, p in procs.items():
        try:
            out, err = p.communicate(timeout=max(1.0, WORKER_DEADLINE - (time.time() - START)))
            got = [ln[4:] for ln in out.splitlines() if ln.startswith("ROW ")]
            rows[n] = json.loads(got[0]) if got else dict(variant=n, error=(err.strip().splitlines() or ["?"])[-1][:160])
        except subprocess.TimeoutExpired:
            p.kill()
            rows[n] = dict(variant=n, error=f"killed at {WORKER_DEADLINE:.0f} s (compiling)")
        print(json.dumps(rows[n]), flush=True)
    rows.update({n: dict(variant=n, probe=True) for n, (_, _, tm) in VARIANTS.items() if tm == "probe"})
    print(f"checks done at {time.time() - START:.0f} s", flush=True)
    times = {} if SMOKE else timing(rows)
    result = dict(set=SET, device="cpu" if SMOKE else torch.cuda.get_device_name(), check_shape=CHECK_SHAPE, time_shape=TIME_SHAPE,
                  rows=rows, times=times, wall_s=round(time.time() - START, 1))
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from experiments.common.meta import meta

        result["meta"] = None if SMOKE else meta()
    except Exception as e:  # (the figures matter more than the metadata)
        result["meta"] = repr(e)
    (Path(os.environ.get("OUT", ".")) / f"gla_s37_{SET}.json").write_text(json.dumps(result, indent=1))
    B, N, H = CHECK_SHAPE
    print(f"\nGLA backward s37 {SET} ({result['device']}; checks bf16 B{B} N{N} H{H}, times B16 H16 N4096; copy "
          f"{times.get('copy_GBps', '-')} GB/s; {result['wall_s']} s)")
    print(f"{'variant':16s} | {'weak dq/dk/dv (x floor), dg':27s} | {'strong+reset dq/dk/dv, dg':27s} | "
          "dqk ms r1/r2 (% bound) | bwd ms | dqk kernel")
    for n in VARIANTS:
        r = rows[n]
        tm = times.get(n, {})
        dq = "/".join(str(x) for x in tm.get("dqk_ms", [])) + (f" ({tm['dqk_pct']}%)" if "dqk_pct" in tm else "")
        if "error" in r:
            print(f"{n:16s} | ERROR {r['error']}")
            continue
        if r.get("op"):
            print(f"{n:16s} | {r['case']}: o {r['o']} dq/dk/dv {r['dq']}/{r['dk']}/{r['dv']} dg {r['dg']:.2e} "
                  f"dh0 {r['dh0']:.2e} {'right' if r['pass'] else 'WRONG'}")
            continue
        if r.get("probe"):
            p = VARIANTS[n][1]["dqk_gluon_probe"]
            print(f"{n:16s} | probe: {PROBES.get(p, p)} (wrong by design) | {dq} | {r.get('dqk_kernel', '-')}")
            continue
        cells = []
        for c in CASES:
            x = r[c]
            fin = "" if all(x[k + "_ok"] for k in ("dq", "dk", "dv", "dg", "dh0")) else " NONFINITE"
            cells.append(f"{x['dq']}/{x['dk']}/{x['dv']}, {x['dg']}{fin}{'' if x['pass'] else ' FAIL'}")
        bw = "/".join(str(x) for x in tm.get("bwd_ms", []))
        print(f"{n:16s} | {cells[0]:27s} | {cells[1]:27s} | {dq} | {bw} | {r.get('dqk_kernel', '-')}")


if __name__ == "__main__":
    main()
