"""GLA backward, session 36 (HA, issue 33): the dqk kernel's common launch by the Gluon kernel on the tiles template
(gluon_gla_bwd.gla_dqk_gluon_kernel: a producer warp TMA-loads the next tile's v, do, S_c, dS_c, q, k, g into a ring
stage while two consumer warpgroups run this tile's chain, one key block of 32 each), checked against float64 and
timed against the flat tl launch in one run (< 60 s on an H100).

Call 1 (``--call1``; runs/gla_gluon36_run1_session36_h100.txt): configs' (then the flat launch) against CHUNKED
dqk_gluon n (a ring of n stages) at d 128 and d 64, and d 32 configs' once: the Gluon kernel right, 1.04x at d 128
(on since), slower at d 64. Call 2 (``--call2``; runs/gla_gluon36b_run3_session36_h200.txt, an H200): configs' (Gluon
at d 128) against the flat launch (dqk_gluon 0), dqk_gluon_form 1 (G's span and last row by one reduction) at d 128
and d 64, timing probes of the Gluon kernel at d 128 (gluon_gla_bwd.PROBE_*: a part of the tile's work left out,
gradients wrong; timed once, never checked), and the public op through autograd at d 128 with configs' defaults: the
scans over tokens (G's with its reductions, dG's) were 1.37 of its 2.28 ms. Call 3 (the default): dqk_gluon_form 2
(every sum over tokens by bf16 dots with a 0/1 matrix: gluon_gla_bwd.chain_dots) at d 128 and d 64 against configs'
and the flat launch.

Each variant compiles and checks in a worker process of its own: bf16 B1 N1088 H16 (17 chunks) with an initial state
and a final state's gradient, weak decays -U(0, 0.3) and strong ones -U(0, 6) with a reset (flagged blocks: the
fallback launch rewrites them), outputs NaN-poisoned; dq / dk / dv as multiples of the bf16 rounding floor, dg / dh0
relative. Then the main process times the variants that passed, in two interleaved rounds: the dqk common launch
alone (against its HBM bound at the copy bandwidth of the same run) and the composed backward at B16 H16 N4096.

    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_gluon_s36.py             (H100)
JSON to $OUT/gla_gluon_s36.json; the table last.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
START = time.time()
WORKER_DEADLINE = 900.0 if SMOKE else 34.0  # from the start: workers still compiling then are killed (rows say so)
TIME_DEADLINE = 56.0  # no timing starts past it

# name: (Dk = Dv, CHUNKED overrides, timed)
VARIANTS = {
    "d128 configs": (128, {}, True),
    "d128 gluon form2": (128, dict(dqk_gluon_form=2), True),
    "d128 flat": (128, dict(dqk_gluon=0), True),
    "d64 configs": (64, {}, True),
    "d64 gluon form2 st3": (64, dict(dqk_gluon=3, dqk_gluon_form=2), True),
    "d64 gluon form2 st2": (64, dict(dqk_gluon=2, dqk_gluon_form=2), True),
}
CALL2 = "--call2" in sys.argv
if CALL2:  # call 2's rows (runs/gla_gluon36b_run3_session36_h200.txt)
    # (and FORM 1 at d 128 / d 64 st 3: noise-sized, removed after it; git keeps it)
    VARIANTS = {"d128 configs": (128, {}, True), "d128 flat": (128, dict(dqk_gluon=0), True),
                "d64 configs": (64, {}, True)}
if "--call1" in sys.argv:  # call 1's rows (runs/gla_gluon36_run1_session36_h100.txt)
    VARIANTS = {"d128 configs": (128, dict(dqk_gluon=0), True), "d128 gluon st2": (128, dict(dqk_gluon=2), True),
                "d64 configs": (64, {}, True), "d64 gluon st2": (64, dict(dqk_gluon=2), True),
                "d64 gluon st3": (64, dict(dqk_gluon=3), True), "d32 configs": (32, {}, True)}
# timing probes of the Gluon kernel at d 128 (gluon_gla_bwd.PROBE_*: a part of the tile's work left out; gradients
# WRONG, never checked; the dqk launch timed once): what the chain spends where
PROBES = {"no G scan": 1, "no <S, dS>": 2, "no value mma": 4, "no intra mma": 8, "no dG scan": 16}
if CALL2:
    VARIANTS.update({f"d128 probe {p}": (128, dict(dqk_gluon_probe=p), "probe") for p in PROBES.values()})
# the public op through autograd with configs' defaults (gpu_gla_op.check: o, dq, dk, dv, dg, dh0 against float64):
# (B, N, H, D, strong decays + a reset); d 128 with N a multiple of 64: the Gluon dqk kernel
OPS = [(1, 1024, 2, 128, True), (2, 1024, 3, 128, False)] if CALL2 else []
if "--only" in sys.argv:
    keep = sys.argv[sys.argv.index("--only") + 1].split(",")
    VARIANTS = {k: v for k, v in VARIANTS.items() if k in keep}
CASES = {"weak": dict(decay=0.3, reset=False, seed=1), "strong+reset": dict(decay=6.0, reset=True, seed=2)}
CHECK_SHAPE = (1, 70, 2) if SMOKE else (1, 1088, 16)  # B, N, H (H 16: the timed specialization)
TIME_SHAPE = (16, 4096, 16)


def make(B, N, H, D, *, decay, reset, seed, dtype=torch.bfloat16):
    torch.manual_seed(seed)
    t = {n: torch.randn(B, N, H, D, dtype=dtype, device=DEV) for n in ("q", "k", "v", "do")}
    g = -torch.rand(B, N, H, D, device=DEV) * decay
    if reset:
        g[:, N // 2, :, : D // 4] = float("-inf")
    t.update(g=g, h0=torch.randn(B, H, D, D, device=DEV), dht=torch.randn(B, H, D, D, device=DEV))
    return t


def backward(t, ht, over, out=None, steps=None):
    from tilecore.ops.linear_attention import kernels_backward_gla_chunked
    from tilecore.ops.linear_attention.plan import IDENTITY, tl_plan

    p = tl_plan(t["q"], t["v"], t["g"], IDENTITY, 64, diag=5)
    return kernels_backward_gla_chunked.backward(p, t["do"], t["q"], t["k"], t["v"], t["g"], t["h0"], ht, t["dht"],
                                                 t["q"].shape[-1] ** -0.5, out=out, steps=steps, **over)


def check(name: str) -> dict:
    """The variant against float64 on both cases (its own process)."""
    from tilecore import accuracy
    from tilecore.ops.linear_attention import linear_attention_reference

    D, over, timed = VARIANTS[name]
    row = dict(variant=name)
    if timed == "probe":  # compiled here (the main process then finds it in the cache), not checked: wrong by design
        B, N, H = CHECK_SHAPE
        t = make(B, 1088, H, D, decay=0.3, reset=False, seed=1)
        backward(t, None, over)
        if DEV == "cuda":
            torch.cuda.synchronize()
        return dict(row, probe=True, pass_=None)
    for case, kw in CASES.items():
        B, N, H = CHECK_SHAPE
        if not SMOKE:  # the flat launch needs N a multiple of the chunk
            N = 1088
        t = make(B, N, H, max(16, D // 4) if SMOKE else D, dtype=torch.float16 if SMOKE else torch.bfloat16, **kw)
        leaves = [t[n].detach().double().requires_grad_() for n in ("q", "k", "v", "g", "h0")]
        o, st = linear_attention_reference(*leaves[:3], decay=leaves[3], scale=t["q"].shape[-1] ** -0.5,
                                           initial_state=leaves[4])
        ref = torch.autograd.grad((o * t["do"].double()).sum() + (st * t["dht"].double()).sum(), leaves)
        nan = float("nan")
        out = dict(dq=torch.full_like(t["q"], nan), dk=torch.full_like(t["k"], nan), dv=torch.full_like(t["v"], nan),
                   dg=torch.full_like(t["g"], nan), dh0=torch.full_like(t["h0"], nan))
        got = backward(t, st.float(), over, out=out)
        if DEV == "cuda":
            torch.cuda.synchronize()
        got = [got[i] for i in (0, 1, 2, 3, 5)]
        live = t["g"] >= -100
        res = {}
        for nm, x, r, inp in zip(("dq", "dk", "dv", "dg", "dh0"), got, ref, (t["q"], t["k"], t["v"], None, None)):
            r = r.to(x.device)
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
        steps = []  # which kernel ran the dqk common launch (the Gluon one only where its conditions held)
        backward(t, st.float(), over, steps=steps)
        row["dqk_kernel"] = next((getattr(s[1], "__name__", None) or getattr(s[1], "fn", s[1]).__name__
                                  for s in steps if s[0] == "dqk0w"), "-")
    row["pass"] = all(row[c]["pass"] for c in CASES)
    return row


def bench(fn) -> float:
    import triton

    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def dqk_bytes(B, N, H, Dk, Dv, BT=64, elt=2) -> int:
    """The dqk kernel's compulsory HBM bytes (gpu_gla_bwd.dqk_bytes): q, k, v, do (elt), g (float32), S_c, dS_c
    (elt) read once; dq, dk (elt), dg (float32) written."""
    NT = -(-N // BT)
    tokens = B * N * H
    states = 2 * B * H * NT * Dk * Dv * elt
    return tokens * (2 * Dk * elt + Dk * 4 + 2 * Dv * elt) + states + tokens * Dk * (2 * elt + 4)


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device copy (read + write)."""
    x = torch.empty(2 ** 29, dtype=torch.bfloat16, device=DEV)
    y = torch.empty_like(x)
    return 2 * x.numel() * 2 / bench(lambda: y.copy_(x)) / 1e6


def timing(rows: dict) -> dict:
    """Each passing variant's dqk common launch alone (two interleaved rounds: the variants of one head dim in turn,
    then again) and composed backward (the first round) at TIME_SHAPE, ms; d 128 first."""
    B, N, H = TIME_SHAPE
    copy = copy_bandwidth()
    res = dict(copy_GBps=round(copy, 1))
    for D in sorted({d for d, _, _ in VARIANTS.values()}, reverse=True):
        names = [n for n, (d, _, timed) in VARIANTS.items() if d == D and timed is True and rows.get(n, {}).get("pass")]
        probes = [n for n, (d, _, timed) in VARIANTS.items()
                  if d == D and timed == "probe" and rows.get(n, {}).get("probe")]
        if not names or time.time() - START > TIME_DEADLINE:
            continue
        torch.cuda.empty_cache()
        t = make(B, N, H, D, decay=0.3, reset=False, seed=0)
        t["ht"] = torch.randn(B, H, D, D, device=DEV)
        bound = dqk_bytes(B, N, H, D, D) / copy / 1e6
        for rnd in range(2):
            for name in names + (probes if rnd == 0 else []):  # (the probes once, their dqk launch alone)
                if time.time() - START > TIME_DEADLINE:
                    break
                over = VARIANTS[name][1]
                steps = []
                backward(t, t["ht"], over, steps=steps)
                for _, kernel, grid, args, kw in steps:
                    kernel[grid](*args, **kw)
                step = next(s for s in steps if s[0] == "dqk0w")
                ms = bench(lambda: step[1][step[2]](*step[3], **step[4]))
                bwd = bench(lambda: backward(t, t["ht"], over)) if rnd == 0 and name in names else float("nan")
                r = res.setdefault(name, dict(dqk_ms=[], bwd_ms=[], dqk_bound_ms=round(bound, 4)))
                r["dqk_ms"].append(round(ms, 4))
                if rnd == 0:
                    r["bwd_ms"].append(round(bwd, 4))
                r["dqk_pct"] = round(100 * bound / min(r["dqk_ms"]), 1)
                print(json.dumps(dict(variant=name, round=rnd, dqk_ms=round(ms, 4), bwd_ms=round(bwd, 4),
                                      dqk_pct=round(100 * bound / ms, 1))), flush=True)
        print(f"d{D} timed at {time.time() - START:.0f} s", flush=True)
        del t
    return res


def check_op(i: int) -> dict:
    """OPS[i] through the public op (gpu_gla_op.check), in its own process."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_gla_op", Path(__file__).with_name("gpu_gla_op.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    B, N, H, D, strong = OPS[i]
    row = mod.check(B, N, H, D, strong)
    row["variant"] = "op " + row.pop("case")
    return row


def main():
    if "--one" in sys.argv:
        name = sys.argv[sys.argv.index("--one") + 1]
        row = check_op(int(name[3:])) if name.startswith("op ") else check(name)
        print("ROW " + json.dumps(row), flush=True)
        return
    env = dict(os.environ)
    names = list(VARIANTS) + ([] if SMOKE else [f"op {i}" for i in range(len(OPS))])
    procs = {n: subprocess.Popen([sys.executable, __file__, "--one", n] + (["--smoke"] if SMOKE else []),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for n in names}
    rows = {}
    for n, p in procs.items():
        try:
            out, err = p.communicate(timeout=max(1.0, WORKER_DEADLINE - (time.time() - START)))
            got = [ln[4:] for ln in out.splitlines() if ln.startswith("ROW ")]
            rows[n] = json.loads(got[0]) if got else dict(variant=n, error=(
                err.strip().splitlines() or ["?"])[-1][:160])
        except subprocess.TimeoutExpired:
            p.kill()
            rows[n] = dict(variant=n, error=f"killed at {WORKER_DEADLINE:.0f} s (compiling)")
        print(json.dumps(rows[n]), flush=True)
    print(f"checks done at {time.time() - START:.0f} s", flush=True)
    times = timing(rows) if not SMOKE else {}
    result = dict(device=torch.cuda.get_device_name() if DEV == "cuda" else "cpu", check_shape=CHECK_SHAPE,
                  time_shape=TIME_SHAPE, rows=rows, times=times, wall_s=round(time.time() - START, 1))
    out = Path(os.environ.get("OUT", "/tmp"))
    (out / "gla_gluon_s36.json").write_text(json.dumps(result, indent=1))
    B, N, H = CHECK_SHAPE
    print(f"\nGLA backward gluon s36 ({result['device']}; checks B{B} N{N} H{H}, times B16 H16 N4096, 2 rounds; copy "
          f"{times.get('copy_GBps', '-')} GB/s; {result['wall_s']} s)")
    print(f"{'variant':15s} | {'weak dq/dk/dv (x floor), dg':30s} | {'strong+reset dq/dk/dv, dg':28s} | "
          "dqk ms r1/r2 (% bound) | bwd ms r1/r2")
    for n in names:
        r = rows[n]
        if "error" in r:
            print(f"{n:15s} | ERROR {r['error']}")
            continue
        if r.get("probe"):
            tm = times.get(n, {})
            print(f"{n:15s} | (a timing probe: gradients wrong by design) | dqk {tm.get('dqk_ms', '-')} ms")
            continue
        if n.startswith("op "):
            print(f"{r['variant']:15s} | o {r['o']} dq/dk/dv {r['dq']}/{r['dk']}/{r['dv']} dg {r['dg']:.2e} "
                  f"dh0 {r['dh0']:.2e} {'pass' if r['pass'] else 'FAIL'}")
            continue
        cells = []
        for c in CASES:
            x = r[c]
            fin = "" if all(x[k + "_ok"] for k in ("dq", "dk", "dv", "dg", "dh0")) else " NONFINITE"
            cells.append(f"{x['dq']}/{x['dk']}/{x['dv']}, {x['dg']}{fin}{'' if x['pass'] else ' FAIL'}")
        tm = times.get(n, {})
        dq = "/".join(str(x) for x in tm.get("dqk_ms", [])) + (f" ({tm['dqk_pct']}%)" if "dqk_pct" in tm else "")
        bw = "/".join(str(x) for x in tm.get("bwd_ms", []))
        print(f"{n:15s} | {cells[0]:30s} | {cells[1]:28s} | {dq} | {bw} | {r.get('dqk_kernel', '-')}")


if __name__ == "__main__":
    main()
