"""The scalar-decay (and no-decay) backward on Hopper: gluon_scalar_bwd's three walks (dq, dk, dv in the forward's
shape; at d 128 dk and dv by one walk, "gluon dkv", the default) against the split tl kernels (launch.backward's split
path, the default before), float64-checked and timed.

    python experiments/linear_attention/gpu_scalar_bwd.py [--deadline S] [--smoke]

Checks (each part in its own process, all at once, so the compiles overlap; the allocator's memory NaN-flooded before
each backward, so an element a kernel leaves unwritten shows as NaN): through the public ops under autograd, both routes
(configs.BWD_GLUON on / off by tiles.switches.patched) against float64 autograd of the references: linear_attention bf16
d 128 with strong decays and a reset, N 1000 (not a multiple of the chunk), h0 and the final state's gradient; fp16
d 64 likewise; no decay bf16 d 128 with states; mamba2_chunk_scan bf16 (H 8 on 2 groups, P 64, S 128, D, z, dt_bias with
softplus, initial and final states: every gradient). Timing (B16 H16 N4096 bf16; d 128 and d 64 with a scalar decay, d 128
without): launch.backward by each route's plan (launch.backward_plan's bwd_gluon override) in interleaved rounds, do_bench
and CUDA-graph medians; each Gluon role's kernel alone and each split kernel alone (the profile); the public op's
backward through autograd (eager) each route; a copy of 1 GiB for the H200's bandwidth, and the napkin's bound (q, k, v,
do read, dq, dk, dv written, g and dg) at it. JSON under $OUT; a short table last.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from experiments.common.gpu_script import Run, check, time_rounds  # noqa: E402

SMOKE = "--smoke" in sys.argv
DEV = "cuda" if torch.cuda.is_available() else "cpu"
CHECKS = ("d128_bf16_decay", "d64_fp16_decay", "d128_bf16_nodecay", "mamba2")
TIMES = ("d128_decay", "d64_decay", "d128_nodecay")
DIMS = ((128, 128), (64, 64), (128, 64))  # the Gluon route's (Dk, Dv) in the checks (configs routes (128, 128) only)


def flood():
    """NaN into the caching allocator's free memory: the backward's outputs, allocated after, start as NaN where they
    land on it (an element never written then shows)."""
    if DEV == "cuda":
        x = torch.empty(1 << 28, device=DEV)
        x.fill_(float("nan"))
        del x


def rel(a, r):
    a, r = a.detach().double(), r.detach().double().to(a.device)
    live = torch.isfinite(r)
    return round(float((a[live] - r[live]).norm() / r[live].norm().clamp_min(1e-30)), 6)


def la_check(name, say=None):
    from tilecore import linear_attention
    from tilecore.ops.linear_attention import configs, linear_attention_reference
    from tilecore.tiles.switches import patched

    D = 64 if "d64" in name else 128
    dtype = torch.float16 if "fp16" in name or SMOKE else torch.bfloat16
    decay = "nodecay" not in name
    B, N, H = (1, 100, 2) if SMOKE else (2, 1000, 4)
    torch.manual_seed(7)
    q, k, v = (torch.randn(B, N, H, D, device=DEV, dtype=dtype) for _ in range(3))
    g = -torch.rand(B, N, H, device=DEV) * 4.0 if decay else None
    if g is not None:
        g[:, 77, 1] = float("-inf")  # a reset mid-chunk
        g[:, 300:340] *= 0.01  # and weak decays
    h0 = torch.randn(B, H, D, D, device=DEV)
    do, dht = torch.randn_like(v), torch.randn(B, H, D, D, device=DEV)
    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (q, k, v, g, h0)]
    o, ht = linear_attention_reference(*leaves[:3], decay=leaves[3], initial_state=leaves[4], scale=D ** -0.5)
    live = [t for t in leaves if t is not None]
    ref = torch.autograd.grad((o * do.double()).sum() + (ht * dht.double()).sum(), live)
    rows = {}
    for route in ("gluon", "gluon_dkv", "split") if D == 128 else ("gluon", "split"):
        with patched(configs, BWD_GLUON=route != "split", BWD_GLUON_DKV=route == "gluon_dkv", BWD_GLUON_DIMS=DIMS):
            ls = [t.detach().clone().requires_grad_() if t is not None else None for t in (q, k, v, g, h0)]
            o, ht = linear_attention(*ls[:3], decay=ls[3], initial_state=ls[4], return_final_state=True)
            flood()
            got = torch.autograd.grad((o.float() * do.float()).sum() + (ht * dht).sum(), [t for t in ls if t is not None])
        names = ["dq", "dk", "dv"] + (["dg"] if decay else []) + ["dh0"]
        row = {}
        ok = True
        for n, a, r in zip(names, got, ref):
            if n in ("dq", "dk", "dv"):
                c = check(a, r)
                row[n] = c["err_over_floor"]
                ok = ok and c["pass"]
            else:
                row[n] = rel(a, r)
                ok = ok and bool(torch.isfinite(a).all()) and row[n] < 0.05
        row["pass"] = ok
        rows[route] = row
        if say is not None:  # (saved as it comes: a route that fails later leaves the earlier ones)
            say(route, row)
    return rows


def mamba_check(name):
    from tilecore import mamba2_chunk_scan
    from tilecore.ops.linear_attention import configs
    from tilecore.ops.linear_attention.reference import mamba2_reference
    from tilecore.tiles.switches import patched

    dtype = torch.float16 if SMOKE else torch.bfloat16
    b, n, h, g, p, s = (1, 100, 4, 2, 16, 16) if SMOKE else (2, 1000, 8, 2, 64, 128)
    torch.manual_seed(11)
    x = torch.randn(b, n, h, p, device=DEV, dtype=dtype)
    dt = torch.randn(b, n, h, device=DEV) * 0.5
    A = -torch.rand(h, device=DEV) * 2 - 0.2
    Bm, C = (torch.randn(b, n, g, s, device=DEV, dtype=dtype) for _ in range(2))
    D = torch.randn(h, device=DEV)
    z = torch.randn(b, n, h, p, device=DEV, dtype=dtype)
    dt_bias = torch.randn(h, device=DEV) * 0.5
    h0 = torch.randn(b, h, p, s, device=DEV)
    dy, dhT = torch.randn_like(x), torch.randn(b, h, p, s, device=DEV)
    ins = (x, dt, A, Bm, C, D, z, dt_bias, h0)
    names = ("dx", "ddt", "dA", "dB", "dC", "dD", "dz", "ddt_bias", "dh0")
    leaves = [t.detach().double().requires_grad_() for t in ins]
    y, hT = mamba2_reference(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], D=leaves[5], z=leaves[6],
                             dt_bias=leaves[7], dt_softplus=True, initial_states=leaves[8])
    ref = torch.autograd.grad((y * dy.double()).sum() + (hT * dhT.double()).sum(), leaves)
    rows = {}
    for route in ("gluon", "split"):
        with patched(configs, BWD_GLUON=route == "gluon", BWD_GLUON_DIMS=DIMS):
            ls = [t.detach().clone().requires_grad_() for t in ins]
            y, hT = mamba2_chunk_scan(ls[0], ls[1], ls[2], ls[3], ls[4], D=ls[5], z=ls[6], dt_bias=ls[7],
                                      dt_softplus=True, initial_states=ls[8], return_final_states=True)
            flood()
            got = torch.autograd.grad((y.float() * dy.float()).sum() + (hT * dhT).sum(), ls)
        row = {}
        ok = True
        for nm, a, r in zip(names, got, ref):
            if a.dtype in (torch.float16, torch.bfloat16):
                c = check(a, r)
                row[nm] = c["err_over_floor"]
                ok = ok and c["pass"]
            else:
                row[nm] = rel(a, r)
                ok = ok and bool(torch.isfinite(a).all())
        row["pass"] = ok
        rows[route] = row
    # the scalar gradients (dt, A, dt_bias, D) cancel in 16 bits: the Gluon route passes where it is within 1.5x of the
    # split route's relative error (or under 2%)
    for nm in ("ddt", "dA", "dD", "ddt_bias", "dh0"):
        gl_e, sp_e = rows["gluon"][nm], rows["split"][nm]
        rows["gluon"]["pass"] = rows["gluon"]["pass"] and (gl_e <= 1.5 * sp_e + 1e-6 or gl_e < 0.02)
    return rows


def part_main(part: str, deadline: float):
    run = Run(f"scalar_bwd_{part}", deadline=deadline)
    if part == "mamba2":
        for route, row in (run.attempt(part, mamba_check, part) or {}).items():
            run.row(f"{part} {route}", **row)
    elif part in CHECKS:
        run.attempt(part, la_check, part, lambda route, row: run.row(f"{part} {route}", **row))
    else:  # a timing shape's kernels compiled ahead of the timed process
        run.attempt(part, lambda: timing(run, part, warm_only=True))
    run.finish(["name", "pass"])


def inputs(D, decay, seed=3):
    torch.manual_seed(seed)
    B, N, H = (1, 128, 2) if SMOKE else (16, 4096, 16)
    dtype = torch.float16 if SMOKE else torch.bfloat16
    q, k, v, do = (torch.randn(B, N, H, D, device=DEV, dtype=dtype) for _ in range(4))
    g = -torch.rand(B, N, H, device=DEV) * 0.3 if decay else None
    return q, k, v, do, g


def timing(run: Run, part: str, warm_only=False) -> dict:
    from tilecore.ops.linear_attention import configs, gluon_scalar_bwd, launch
    from tilecore.ops.linear_attention.gluon_forward import chunk_heads_prep
    from tilecore.ops.linear_attention.plan import IDENTITY, plan

    D = 64 if part.startswith("d64") else 128
    decay = "nodecay" not in part
    q, k, v, do, g = inputs(D, decay)
    scale = D ** -0.5
    p = plan(q, v, g, IDENTITY)
    # the three walks, dk and dv by one walk (d 128), the split tl kernels
    plans = {r: launch.backward_plan(p, q, v, g, IDENTITY, None, bwd_gluon=r == "gluon", bwd_gluon_dkv=False)
             for r in ("gluon", "split")}
    if D == 128:
        plans["gluon dkv"] = launch.backward_plan(p, q, v, g, IDENTITY, None, bwd_gluon=True, bwd_gluon_dkv=True)
    bwd = {r: (lambda pl=pl: launch.backward(pl, do, q, k, v, g, None, None, None, None, None, scale, IDENTITY,
                                             native=True)) for r, pl in plans.items()}
    # each Gluon role's kernel alone, and each split kernel alone (the profile)
    B, N, H, _ = v.shape
    G = chunk_heads_prep(g, None, 64)[0] if decay else None
    dtypes = dict(dq=q.dtype, dk=q.dtype, dv=q.dtype)
    pieces = {}
    for role in ("dq", "dk", "dv") if DEV == "cuda" else ():  # (the Gluon kernels do not run in the interpreter)
        out = torch.empty(B, N, H, D, dtype=q.dtype, device=DEV)
        parts = torch.empty(2, B, N, H, device=DEV) if decay and role != "dv" else None
        grid, args, warps = gluon_scalar_bwd.launch_args(role, q, k, v, do, G, None, None, out, parts, None, scale,
                                                         configs.BWD_GLUON_STAGES)
        pieces[f"gluon {role}"] = (lambda grid=grid, args=args, warps=warps:
                                   gluon_scalar_bwd.la_bwd_gluon_kernel[grid](**args, num_warps=warps))
    if DEV == "cuda" and D == 128:
        dk_o, dv_o = (torch.empty(B, N, H, D, dtype=q.dtype, device=DEV) for _ in range(2))
        dg_k = torch.empty(2, B, N, H, device=DEV) if decay else None
        grid, args, warps = gluon_scalar_bwd.launch_args_dkv(q, k, v, do, G, None, None, dk_o, dv_o, dg_k, None, None,
                                                             scale, configs.BWD_GLUON_STAGES)
        pieces["gluon dkv kernel"] = (lambda grid=grid, args=args, warps=warps:
                                      gluon_scalar_bwd.la_bwd_dkv_gluon_kernel[grid](**args, num_warps=warps))
    sp = plans["split"]
    dq_b = torch.empty(B, N, H, D, dtype=q.dtype, device=DEV)
    dk_b = torch.empty(1, B, N, H, D, dtype=q.dtype, device=DEV)
    dv_b = torch.empty(1, B, N, H, D, dtype=q.dtype, device=DEV)
    epi = None
    if decay:
        epi = (torch.empty(D // sp.config["dq_BKQ"], B, N, H, device=DEV),
               torch.empty(D // sp.config["split_BKB"], B, N, H, device=DEV), None)
    calls = launch.backward_calls(sp, do, q, k, v, g, None, None, None, dq_b, dk_b, dv_b, None, scale, IDENTITY,
                                  dq_b if decay else None, epilogue=epi)
    for name, (kernel, grid, args, kw) in zip(("split dq", "split dk", "split dv"), calls):
        pieces[name] = (lambda kernel=kernel, grid=grid, args=args, kw=kw: kernel[grid](*args, **kw))
    for fn in list(bwd.values()) + list(pieces.values()):
        fn()
    if DEV == "cuda":
        torch.cuda.synchronize()
    if warm_only:
        return {}
    res = time_rounds(bwd, rounds=1 if SMOKE else 5, graph=DEV == "cuda", deadline=run)
    res.update(time_rounds(pieces, rounds=1 if SMOKE else 3, graph=DEV == "cuda", eager=False, deadline=run))
    # the napkin's bytes: q, k, v, do read, dq, dk, dv written (16-bit), g read and dg written (float32)
    nbytes = 7 * q.numel() * q.element_size() + (2 * g.numel() * 4 if decay else 0)
    res["bound_bytes"] = nbytes
    res["pieces"] = list(pieces)
    return res


def op_timing(run: Run, D: int, decay: bool = True) -> dict:
    """The public op's backward through autograd, eager, each route in its own patched block (rounds alternate; at
    d 128 the Gluon route with dk and dv by one walk)."""
    import triton

    from tilecore import linear_attention
    from tilecore.ops.linear_attention import configs
    from tilecore.tiles.switches import patched

    q, k, v, do, g = inputs(D, decay)
    per = {"gluon": [], "split": []}
    for r in range(1 if SMOKE else 3):
        for route in (("gluon", "split") if r % 2 == 0 else ("split", "gluon")):
            with patched(configs, BWD_GLUON=route == "gluon", BWD_GLUON_DKV=D == 128, BWD_GLUON_DIMS=DIMS):
                ls = [t.detach().clone().requires_grad_() if t is not None else None for t in (q, k, v, g)]
                o = linear_attention(*ls[:3], decay=ls[3])
                ls = [t for t in ls if t is not None]
                fn = lambda: torch.autograd.grad(o, ls, do, retain_graph=True)  # noqa: E731
                per[route].append(round(triton.testing.do_bench(fn, warmup=5, rep=40) if DEV == "cuda" else 0.0, 4))
    return {f"op_{r}_ms": sorted(x)[len(x) // 2] for r, x in per.items()} | {f"op_{r}_rounds": x for r, x in per.items()}


def copy_tbs() -> float:
    if DEV != "cuda":
        return 0.0
    import triton

    x = torch.empty(1 << 29, dtype=torch.bfloat16, device=DEV)
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=5, rep=40)
    return 2 * x.numel() * 2 / ms / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deadline", type=float, default=170.0)
    ap.add_argument("--part")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.part:
        part_main(a.part, a.deadline)
        return
    run = Run("scalar_bwd", deadline=a.deadline)
    # every check and every timing shape's compiles in processes of their own, at once
    env = dict(os.environ)
    procs = {part: subprocess.Popen([sys.executable, __file__, "--part", part, "--deadline", str(a.deadline - 20)]
                                    + (["--smoke"] if SMOKE else []), env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
             for part in CHECKS + TIMES}
    out_dir = Path(os.environ.get("OUT") or Path(run.path).parent)
    for part, proc in procs.items():
        try:
            text, _ = proc.communicate(timeout=max(5.0, run.left() - 40))
        except subprocess.TimeoutExpired:
            proc.kill()
            text = proc.communicate()[0]
            run.errors.append(f"{part}: timed out")
        tail = "\n".join(text.strip().splitlines()[-6:])
        run.say(f"part {part} rc {proc.returncode}:\n{tail}")
        f = out_dir / f"scalar_bwd_{part}.json"
        if f.exists():
            for row in json.loads(f.read_text()).get("rows", []):
                run.row(row.pop("name"), **row)
    bw = copy_tbs()
    run.extra["copy_tb_s"] = round(bw, 3)
    run.say(f"copy {bw:.3f} TB/s")
    for part in TIMES:
        if run.left() < 25:
            run.errors.append(f"{part}: no time left")
            break
        res = run.attempt(part, timing, run, part) or {}
        if not res:
            continue
        bound = res["bound_bytes"] / (bw * 1e12) * 1e3 if bw else None
        pieces_names = res.pop("pieces")
        row = dict(bound_ms=round(bound, 4) if bound else None)
        for r in ("gluon", "split", "gluon dkv"):
            if f"{r}_ms" in res or f"{r}_graph_ms" in res:
                row[f"{r}_ms"] = res.get(f"{r}_ms")
                row[f"{r}_graph_ms"] = res.get(f"{r}_graph_ms")
        if row["gluon_graph_ms"] and row["split_graph_ms"]:
            row["speedup_graph"] = round(row["split_graph_ms"] / row["gluon_graph_ms"], 3)
            row["bound_pct"] = round(100 * bound / row["gluon_graph_ms"], 1) if bound else None
        if row["gluon_ms"] and row["split_ms"]:
            row["speedup_eager"] = round(row["split_ms"] / row["gluon_ms"], 3)
        if row.get("gluon dkv_graph_ms") and row["split_graph_ms"]:
            row["dkv_speedup_graph"] = round(row["split_graph_ms"] / row["gluon dkv_graph_ms"], 3)
            row["dkv_over_gluon_graph"] = round(row["gluon_graph_ms"] / row["gluon dkv_graph_ms"], 3)
            row["dkv_bound_pct"] = round(100 * bound / row["gluon dkv_graph_ms"], 1) if bound else None
        row["pieces_graph_ms"] = {n.removesuffix("_graph_ms"): v for n, v in res.items() if n.endswith("_graph_ms")
                                  and n.removesuffix("_graph_ms") in pieces_names}
        row["rounds"] = {n: v for n, v in res.items() if n.endswith("_rounds")}
        run.row(f"time {part}", **row)
        run.say(json.dumps(dict(part=part, **{k: v for k, v in row.items() if k != "rounds"})))
    for D, decay in ((128, True),) if SMOKE else ((128, True), (64, True), (128, False)):
        if run.left() < 15:
            break
        name = f"op bwd d{D}" + ("" if decay else " no decay")
        res = run.attempt(name, op_timing, run, D, decay) or {}
        if res:
            run.row(name, **res)
    run.finish(["name", "pass", "gluon_graph_ms", "gluon dkv_graph_ms", "split_graph_ms", "speedup_graph",
                "dkv_speedup_graph", "bound_pct", "dkv_bound_pct", "gluon_ms", "split_ms", "op_gluon_ms", "op_split_ms"])


if __name__ == "__main__":
    main()
