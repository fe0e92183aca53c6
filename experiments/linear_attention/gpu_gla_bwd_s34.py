"""GLA backward, session 34 (HA, issue 33): the d 64 fault of session 33 (decision 84) and the switches that lift
the per-dims rule, checked against float64 and timed against what ships, in one run (< 70 s on an H100).

What the variants test (configs_gla_bwd.CHUNKED keys; sm_90a facts from the CPU compile in the notes):
* d64 VB64 straight: session 33's values at d 64 (dqk_VB 64 = Dv: a value loop of ONE block, which Triton folds into
  straight-line code: no scf.for, no cp.async). Wrong in session 33's calls 7-8 (or an illegal address): repeated here
  beside the others, in a process of its own, as the contrast.
* d64 VB64 dyn: the same blocks with dqk_dyn (the loop's bound Dv at run time: one trip through the pipelined loop;
  its PTX is byte-identical to the d 128 kernel's). Right here and wrong above = the fold is the trigger.
* d64 / d32 two blocks: dqk_two_blocks (dqk_VB at most half of Dv's block) with session 33's dqk_form 3 / dv_form 5:
  rows of run 3, removed in session 35 with the switch (issue 30: lost to dqk_dyn; git keeps them).
* d64 / d32 other: what ships at those dims (CHUNKED_OTHER_DIMS: VB 32, forms off): the timing baseline.
* d128 shipped / d128 dyn: configs' CHUNKED at d 128 and the same with dqk_dyn (the one code for every Dv if as fast).
* d128 1 an SM: configs' CHUNKED with dqk_stages 6 (the same code but for idle load buffers: 136 KB of shared memory,
  so ONE program an SM instead of two): what the second co-resident program buys (an occupancy probe for the notes'
  question of how far more chains an SM would go).

Each variant compiles and checks in a worker process of its own (an illegal address ends only its CUDA context): bf16
B1 N1008 H16 (a partial last chunk of 48; the timed kernels' specialization) with an initial state and a final
state's gradient, weak decays -U(0, 0.3) (the factored path) and strong ones -U(0, 6) with a reset (the fallback
launches), outputs NaN-poisoned; dq / dk / dv as multiples of the bf16 rounding floor, dg / dh0 relative. Then the
main process times the variants that passed, one at a time: the composed backward at B16 H16 N4096 (d as the variant)
and, at d 128, the dqk kernel's common launch alone against its HBM bound at the copy bandwidth of the same run.

    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_bwd_s34.py             (H100)
    TRITON_INTERPRET=1 PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_bwd_s34.py --smoke   (CPU, tiny)
JSON to $OUT/gla_bwd_s34.json; the table last.
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
WORKER_DEADLINE = 900.0 if SMOKE else 48.0  # from the start: workers still compiling then are killed (rows say so)
TIME_DEADLINE = 66.0  # no timing starts past it

# name: (Dk = Dv, CHUNKED overrides, timed)
VARIANTS = {
    "d128 shipped": (128, {}, True),
    "d128 dyn": (128, dict(dqk_dyn=True), True),
    "d128 1 an SM": (128, dict(dqk_stages=6), True),
    "d64 other": (64, {}, True),
    "d64 VB64 dyn": (64, dict(dqk_VB=64, dqk_form=3, dv_form=5, dqk_dyn=True), True),
    "d64 VB64 straight": (64, dict(dqk_VB=64, dqk_form=3, dv_form=5), False),
    "d32 other": (32, {}, True),
    "d32 dyn": (32, dict(dqk_VB=64, dqk_form=3, dv_form=5, dqk_dyn=True), True),
}
if "--only" in sys.argv:
    keep = sys.argv[sys.argv.index("--only") + 1].split(",")
    VARIANTS = {k: v for k, v in VARIANTS.items() if k in keep}
CASES = {"weak": dict(decay=0.3, reset=False, seed=1), "strong+reset": dict(decay=6.0, reset=True, seed=2)}
CHECK_SHAPE = (1, 70, 2) if SMOKE else (1, 1008, 16)  # B, N, H (H 16: the timed specialization)
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

    D, over, _ = VARIANTS[name]
    row = dict(variant=name)
    for case, kw in CASES.items():
        B, N, H = CHECK_SHAPE
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
    """Each passing variant's composed backward (ms) at TIME_SHAPE, one at a time; at d 128 its dqk0w alone."""
    B, N, H = TIME_SHAPE
    copy = copy_bandwidth()
    res = dict(copy_GBps=round(copy, 1))
    tensors = {}
    for name, (D, over, timed) in VARIANTS.items():
        if not timed or not rows.get(name, {}).get("pass") or time.time() - START > TIME_DEADLINE:
            continue
        if D not in tensors:
            tensors.clear()
            torch.cuda.empty_cache()
            tensors[D] = make(B, N, H, D, decay=0.3, reset=False, seed=0)
            tensors[D]["ht"] = torch.randn(B, H, D, D, device=DEV)
        t = tensors[D]
        r = dict(bwd_ms=round(bench(lambda: backward(t, t["ht"], over)), 4))
        if D == 128:
            steps = []
            backward(t, t["ht"], over, steps=steps)
            for _, kernel, grid, args, kw in steps:
                kernel[grid](*args, **kw)
            for step, kernel, grid, args, kw in steps:
                if step == "dqk0w":
                    ms = bench(lambda: kernel[grid](*args, **kw))
                    bound = dqk_bytes(B, N, H, D, D) / copy / 1e6
                    r.update(dqk_ms=round(ms, 4), dqk_bound_ms=round(bound, 4), dqk_pct=round(100 * bound / ms, 1))
        res[name] = r
        print(json.dumps(dict(variant=name, **r)), flush=True)
    return res


def main():
    if "--one" in sys.argv:
        name = sys.argv[sys.argv.index("--one") + 1]
        print("ROW " + json.dumps(check(name)), flush=True)
        return
    env = dict(os.environ)
    procs = {n: subprocess.Popen([sys.executable, __file__, "--one", n] + (["--smoke"] if SMOKE else []),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for n in VARIANTS}
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
    (out / "gla_bwd_s34.json").write_text(json.dumps(result, indent=1))
    B, N, H = CHECK_SHAPE
    print(f"\nGLA backward s34 ({result['device']}; checks B{B} N{N} H{H}, times B16 H16 N4096; copy "
          f"{times.get('copy_GBps', '-')} GB/s; {result['wall_s']} s)")
    print(f"{'variant':18s} | {'weak dq/dk/dv (x floor), dg':32s} | {'strong+reset dq/dk/dv, dg':30s} | bwd ms | "
          "dqk ms (% bound)")
    for n in VARIANTS:
        r = rows[n]
        if "error" in r:
            print(f"{n:18s} | ERROR {r['error']}")
            continue
        cells = []
        for c in CASES:
            x = r[c]
            fin = "" if all(x[k + "_ok"] for k in ("dq", "dk", "dv", "dg", "dh0")) else " NONFINITE"
            cells.append(f"{x['dq']}/{x['dk']}/{x['dv']}, {x['dg']}{fin}{'' if x['pass'] else ' FAIL'}")
        tm = times.get(n, {})
        dq = f"{tm['dqk_ms']} ({tm['dqk_pct']}%)" if "dqk_ms" in tm else ""
        print(f"{n:18s} | {cells[0]:32s} | {cells[1]:30s} | {tm.get('bwd_ms', '-')} | {dq}")


if __name__ == "__main__":
    main()
