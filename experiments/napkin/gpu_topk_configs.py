"""The napkin's top-k configs, timed (issue 36 part 4): does a pick among the napkin's best few tiles
match an exhaustive sweep, and beat the hand table?

For each GEMM shape (bf16 and fp8; LLM-ish, skinny M, small K) it measures, on the Gluon kernel
through tilecore.ops.gemm.plan's config override:
  (a) the shipped table's row (plan.table_config),
  (b) the napkin's top-1 (plan.napkin_configs),
  (c) the timed top-k pick (plan.timed_config with k = --topk: what configs.NAPKIN_TOPK turns on; its
      own timing, do_bench's through launch.time_plans),
  (d) the best of the sweep over every legal row (configs.GLUON_CANDIDATES through plan.gluon_legal),
  and cuBLAS (torch.mm, torch._scaled_mm) as the peer.
Each row is first checked against a float64 reference into a NaN-poisoned output (every element
written; error as a multiple of the output's rounding floor). Reported: the picked times over the
sweep's best, the table over the best, and the napkin's predicted ranking against the measured one
(Spearman). ``--attention`` does the same for the Gluon attention forward (plan.napkin_forward_configs
against configs.gluon_forward_config; peer: the table's row, as the shipped path runs it).

Compiles come first, in parallel worker processes (--workers): each runs every (shape, row) once so
Triton's disk cache holds the kernels when the timing process launches them. A deadline (--budget s)
cuts the remaining cases; every case's exception is printed and the run goes on.

Run from the repository root on the GPU machine (each under 90 s on an H100):

    PYTHONPATH=. python3 experiments/napkin/gpu_topk_configs.py
    PYTHONPATH=. python3 experiments/napkin/gpu_topk_configs.py --attention

``--smoke``: the CPU under TRITON_INTERPRET=1, tiny shapes, no timing (the tl kernel stands in for the
Gluon one): a check of the script. Writes $OUT/napkin_topk_configs[_attention].json ($OUT: /tmp/out).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from tilecore.ops.gemm import configs, launch, plan

# name, M, N, K, dtype; Llama-3 8B's projections at 8192 tokens, decode-like skinny M, small K
GEMM_SHAPES = [  # interleaved, so that a budget cut leaves each kind measured
    ("sq 8192", 8192, 8192, 8192, "bf16"),
    ("fp8 sq 8192", 8192, 8192, 8192, "fp8"),
    ("skinny M64", 64, 8192, 8192, "bf16"),
    ("K256", 4096, 4096, 256, "bf16"),
    ("gate+up T8192", 8192, 28672, 4096, "bf16"),
    ("fp8 gate+up T8192", 8192, 28672, 4096, "fp8"),
    ("down T8192", 8192, 4096, 14336, "bf16"),
    ("sq 4096", 4096, 4096, 4096, "bf16"),
    ("qkv T8192", 8192, 6144, 4096, "bf16"),
    ("fp8 skinny M256", 256, 8192, 8192, "fp8"),
    ("skinny M512", 512, 14336, 4096, "bf16"),
    ("K128", 8192, 8192, 128, "bf16"),
]
SMOKE_GEMM = [("smoke bf16", 96, 80, 64, "bf16"), ("smoke fp8", 64, 96, 64, "fp8")]
# name, B, H, N, D, causal
ATTN_SHAPES = [
    ("D128 N4096", 8, 16, 4096, 128, False),
    ("D128 N4096 causal", 8, 16, 4096, 128, True),
    ("D64 N4096", 8, 16, 4096, 64, False),
    ("D128 N1024 causal", 32, 16, 1024, 128, True),
    ("D128 N16384", 1, 16, 16384, 128, False),
    ("D64 N1024", 32, 16, 1024, 64, False),
]
SMOKE_ATTN = [("smoke D64", 1, 2, 64, 64, False)]
SMOKE = "--smoke" in sys.argv
DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


def device() -> str:
    return "cpu" if SMOKE else "cuda"


def key(cfg: dict) -> str:
    """A row's short name."""
    if "block" in cfg:
        return "x".join(map(str, cfg["block"])) + f" s{cfg['stages']} c{cfg.get('consumers', 1)} w{cfg['num_warps']}"
    return f"m{cfg['block_m']}x{cfg.get('consumers', 2)} n{cfg['block_n']} s{cfg['stages']} q{cfg.get('q_buffers', 1)}" \
           + (" carry" if cfg.get("carry") else "") + (" qregs" if cfg.get("q_regs") else "")


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties)."""
    if len(x) < 3:
        return None

    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for t in range(i, j + 1):
                r[order[t]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy) if sx and sy else None


def bench(fn) -> float:
    """GPU ms: do_bench's median after warm-up."""
    import triton

    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


# ---------------------------------------------------------------------------------------------- GEMM

def gemm_operands(M, N, K, dt, seed=0):
    g = torch.Generator(device=device()).manual_seed(seed)
    a = torch.randn(M, K, device=device(), generator=g)
    b = torch.randn(K, N, device=device(), generator=g)
    if dt == "fp8":
        sa, sb = a.abs().amax() / 448, b.abs().amax() / 448
        # B as the [K, N] view of a K-major [N, K] tensor: fp8 wgmma's form, so no row copies B per call
        bt = (b / sb).to(torch.float8_e4m3fn).t().contiguous().t()
        return (a / sa).to(torch.float8_e4m3fn), bt, (sa.reshape(1), sb.reshape(1))
    return a.to(torch.bfloat16), b.to(torch.bfloat16), None


def gemm_rows(M, N, K, dt) -> list[dict]:
    """Every legal row for this dtype (the sweep), the table's included (the smoke run: two)."""
    dtype = DTYPES[dt]
    rows = [plan.gluon_row(*c) for c in configs.GLUON_CANDIDATES]
    rows = [r for r in rows if plan.gluon_legal(r, dtype.itemsize, 2) is None]
    table = plan.table_config(K, dt == "fp8")
    rows = rows if table in rows else rows + [table]
    return rows[:2] if SMOKE else rows


def gemm_plan(a, b, scales, cfg):
    return plan.plan(a, b, out_dtype=torch.bfloat16, scales=scales, config=cfg, path=None if not SMOKE else "tl")


def gemm_run(a, b, scales, cfg, out=None):
    return launch.launch(gemm_plan(a, b, scales, cfg), a, b, None, scales, out=out)


def gemm_reference(a, b, scales):
    ref = a.double() @ b.double()
    if scales is not None:
        ref = ref * scales[0].double() * scales[1].double()
    return ref


def error_floor(c, ref) -> tuple[bool, float]:
    """(every element written and finite, max error over the max rounding error of the correctly
    rounded result)."""
    finite = bool(torch.isfinite(c).all())
    floor = (ref.to(c.dtype).double() - ref).abs().max().item()
    err = (c.double() - ref).abs().max().item()
    return finite, err / floor if floor else (0.0 if err == 0 else math.inf)


_WORKER_OPERANDS: dict = {}  # a warm-up worker's operands, by shape


def gemm_warm(job) -> str:
    """A worker: run one row once on one shape (compiles it into Triton's disk cache)."""
    (name, M, N, K, dt), cfg = job
    if (M, N, K, dt) not in _WORKER_OPERANDS:
        _WORKER_OPERANDS.clear()
        _WORKER_OPERANDS[M, N, K, dt] = gemm_operands(M, N, K, dt)
    a, b, scales = _WORKER_OPERANDS[M, N, K, dt]
    try:
        gemm_run(a, b, scales, cfg)
        if not SMOKE:
            torch.cuda.synchronize()
        return ""
    except Exception as e:
        return f"{name} {key(cfg)}: {type(e).__name__}"


def gemm_case(name, M, N, K, dt, topk: int) -> dict:
    from tilecore.napkin.engine import rank_gemm_configs

    dtype = DTYPES[dt]
    a, b, scales = gemm_operands(M, N, K, dt)
    ref = gemm_reference(a, b, scales)
    table = plan.table_config(K, dt == "fp8")
    gpu = "h100" if SMOKE else plan.napkin_gpu(a.device)
    top = plan.napkin_configs(M, N, K, dtype, torch.bfloat16, topk, gpu)
    rows = gemm_rows(M, N, K, dt)
    napkin = lambda r: (*r["block"], r["stages"], r["num_warps"] // 4)
    predicted = {(c.block, c.stages, c.warpgroups): c.time * 1e3
                 for c in rank_gemm_configs(M, N, K, dt, gpu, candidates=list(dict.fromkeys(map(napkin, rows))))}
    res = dict(name=name, M=M, N=N, K=K, dtype=dt, table=key(table), napkin_top1=key(top[0]),
               candidates=[key(r) for r in top], rows={})
    if dt == "fp8":
        peer = lambda: torch._scaled_mm(a, b, scales[0].reshape(()), scales[1].reshape(()), out_dtype=torch.bfloat16)
    else:
        peer = lambda: torch.mm(a, b)
    # the bar: 2x the floor, or 1.25x cuBLAS's own error where fp32 accumulation over K exceeds it (fp8:
    # run 3 read 1.9-3.3x the floor on every row, the table's too)
    peer_err = None
    if not SMOKE:
        _, peer_err = error_floor(peer(), ref)
        res["cublas_err_floor"] = peer_err
    bar = max(2.0, 1.25 * (peer_err or 0))
    for cfg in rows:
        r = dict(predicted_ms=predicted.get((cfg["block"], cfg["stages"], cfg["num_warps"] // 4)))
        try:
            out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device=device())
            gemm_run(a, b, scales, cfg, out=out)
            r["written"], r["err_floor"] = error_floor(out, ref)
            r["ok"] = r["written"] and r["err_floor"] <= bar
            if not SMOKE:  # the plan made once and C preallocated: the timed call is the launch alone
                p = gemm_plan(a, b, scales, cfg)
                r["ms"] = bench(lambda: launch.launch(p, a, b, None, scales, out=out))
                r["tflops"] = 2 * M * N * K / r["ms"] / 1e9
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"  {name} {key(cfg)}: {r['error']}", flush=True)
        res["rows"][key(cfg)] = r
    if SMOKE:
        return res
    # (c): the plan's timed pick (its own timing), and the sweep's do_bench time of what it picked
    t0 = time.perf_counter()
    form = plan.operand_form(a, b, torch.bfloat16, dt == "fp8")
    picked, pick_times = plan.timed_config(a, b, torch.bfloat16, None, scales, form, topk)
    res["pick_s"] = time.perf_counter() - t0
    res["timed_pick"] = key(picked)
    res["pick_ms"] = {key(top[i]): t for i, t in pick_times.items()}
    res["cublas_ms"] = bench(peer)
    timed = {k: r["ms"] for k, r in res["rows"].items() if r.get("ms") and r.get("ok")}
    if timed:
        best = min(timed, key=timed.get)
        res["best"], res["best_ms"] = best, timed[best]
        for what in ("table", "napkin_top1", "timed_pick"):
            ms = timed.get(res[what])
            res[f"{what}_over_best"] = ms / timed[best] if ms else None
        res["table_over_pick"] = (timed.get(res["table"]) or math.nan) / (timed.get(res["timed_pick"]) or math.nan)
        pairs = [(r["predicted_ms"], r["ms"]) for r in res["rows"].values()
                 if r.get("ms") and r.get("ok") and r.get("predicted_ms") is not None]
        res["spearman"] = spearman([p for p, _ in pairs], [m for _, m in pairs])
        res["best_over_cublas"] = res["cublas_ms"] / timed[best]
    return res


# ----------------------------------------------------------------------------------------- attention

def attn_operands(B, H, N, D, seed=0):
    g = torch.Generator(device=device()).manual_seed(seed)
    return [torch.randn(B, H, N, D, device=device(), generator=g).to(torch.bfloat16) for _ in range(3)]


def attn_run(q, k, v, causal, cfg, out=None, lse=None):
    """The forward with ``cfg`` into ``out`` (and ``lse``), returning a call that repeats it (the plan
    made once: the timed call is the launch)."""
    from tilecore.ops.attention import launch as alaunch, plan as aplan

    scale = q.shape[-1] ** -0.5
    out = torch.empty_like(q) if out is None else out
    lse = torch.empty(q.shape[:3], device=q.device) if lse is None else lse
    p = aplan.plan_forward(q, k, v, causal, scale, path="tl" if SMOKE else "gluon", config=None if SMOKE else cfg)
    again = lambda: alaunch.forward(p, q, k, v, out, lse, causal, scale)
    again()
    return again


def attn_rows(B, H, N, D, causal, topk) -> tuple[list[dict], list[dict]]:
    """(the napkin's top-k plus the table, the sweep: every legal tile)."""
    from tilecore.ops.attention import plan as aplan

    return (aplan.napkin_forward_configs(B, H, N, N, D, causal, topk),
            aplan.napkin_forward_configs(B, H, N, N, D, causal, 64))


def attn_warm(job) -> str:
    (name, B, H, N, D, causal, topk), cfg = job
    if (B, H, N, D) not in _WORKER_OPERANDS:
        _WORKER_OPERANDS.clear()
        _WORKER_OPERANDS[B, H, N, D] = attn_operands(B, H, N, D)
    q, k, v = _WORKER_OPERANDS[B, H, N, D]
    try:
        attn_run(q, k, v, causal, cfg)
        if not SMOKE:
            torch.cuda.synchronize()
        return ""
    except Exception as e:
        return f"{name} {key(cfg)}: {type(e).__name__}"


def attn_case(name, B, H, N, D, causal, topk) -> dict:
    from tilecore.napkin.engine import rank_attention_configs
    from tilecore.ops.attention import configs as aconfigs

    q, k, v = attn_operands(B, H, N, D)
    table = aconfigs.gluon_forward_config(D, N, N, causal)
    top, sweep = attn_rows(B, H, N, D, causal, topk)
    predicted = {((c.block[0], c.block[1]), c.warpgroups, c.stages): c.time * 1e3
                 for c in rank_attention_configs(B, H, N, D, causal)}
    # float64 reference on one (batch, head): the kernels' rows are independent
    q64, k64, v64 = (t[:1, :1].double() for t in (q, k, v))
    s = (q64 @ k64.transpose(-1, -2)) * D ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool, device=q.device).triu(1), -math.inf)
    ref = torch.softmax(s, -1) @ v64
    flops = 4 * B * H * N * N * D * (0.5 if causal else 1)
    res = dict(name=name, B=B, H=H, N=N, D=D, causal=causal, table=key(table), napkin_top1=key(top[0]),
               candidates=[key(r) for r in top], rows={})
    for cfg in sweep:
        c = cfg.get("consumers", 2)
        r = dict(predicted_ms=predicted.get(((64 * c, cfg["block_n"]), c, cfg["stages"])))
        try:
            out = torch.full_like(q, float("nan"))
            again = attn_run(q, k, v, causal, cfg, out=out)
            r["written"] = bool(torch.isfinite(out).all())
            _, r["err_floor"] = error_floor(out[:1, :1], ref)
            r["ok"] = r["written"] and r["err_floor"] <= 4.0
            if not SMOKE:
                r["ms"] = bench(again)
                r["tflops"] = flops / r["ms"] / 1e9
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"  {name} {key(cfg)}: {r['error']}", flush=True)
        res["rows"][key(cfg)] = r
    timed = {k: r["ms"] for k, r in res["rows"].items() if r.get("ms") and r.get("ok")}
    if timed:
        best = min(timed, key=timed.get)
        res["best"], res["best_ms"] = best, timed[best]
        # the timed top-k pick: the fastest of the napkin's top-k and the table, by the same clock
        mine = {key(c): timed[key(c)] for c in top if key(c) in timed}
        res["timed_pick"] = min(mine, key=mine.get) if mine else None
        for what in ("table", "napkin_top1", "timed_pick"):
            ms = timed.get(res[what]) if res[what] else None
            res[f"{what}_over_best"] = ms / timed[best] if ms else None
        pairs = [(r["predicted_ms"], r["ms"]) for r in res["rows"].values()
                 if r.get("ms") and r.get("ok") and r.get("predicted_ms") is not None]
        res["spearman"] = spearman([p for p, _ in pairs], [m for _, m in pairs])
    if not SMOKE:  # the plan's own timed pick (what plan.NAPKIN_FORWARD_TOPK turns on), by its own timing
        from tilecore.ops.attention import launch as alaunch, plan as aplan

        aplan.use_forward_launch(alaunch.forward)
        t0 = time.perf_counter()
        res["plan_pick"] = key(aplan.timed_forward_config(q, k, v, causal, D ** -0.5, 0.0, topk))
        res["plan_pick_s"] = time.perf_counter() - t0
        ms = timed.get(res["plan_pick"]) if timed else None
        res["plan_pick_over_best"] = ms / res["best_ms"] if ms else None
    return res


# ---------------------------------------------------------------------------------------------- main

def warm_all(fn, jobs, workers: int, deadline: float) -> None:
    """Compile every case's rows in ``workers`` processes (Triton's disk cache is shared)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    t0 = time.perf_counter()
    pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    futures = [pool.submit(fn, j) for j in jobs]
    for f in futures:
        try:
            msg = f.result(timeout=max(0.1, deadline - time.perf_counter()))
            if msg:
                print("  warm:", msg, flush=True)
        except Exception as e:
            print(f"  warm stopped: {type(e).__name__}: {str(e)[:200]}", flush=True)
            break
    pool.shutdown(wait=False, cancel_futures=True)
    print(f"compiled {sum(f.done() for f in futures)} of {len(jobs)} (shape, row) in {time.perf_counter() - t0:.1f} s "
          f"({workers} workers)", flush=True)


def fmt(x, spec=".3f"):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, TRITON_INTERPRET=1, tiny shapes, no timing")
    ap.add_argument("--attention", action="store_true", help="the attention forward instead of the GEMM")
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--workers", type=int, default=None, help="compile processes (default 12; the smoke run: none)")
    ap.add_argument("--budget", type=float, default=75.0, help="seconds: later cases are cut")
    ap.add_argument("--shapes", type=int, default=0, help="only the first N shapes (0: all)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    args = ap.parse_args()
    start = time.perf_counter()
    deadline = start + args.budget
    if args.attention:
        cases = [(*c, args.topk) for c in (SMOKE_ATTN if SMOKE else ATTN_SHAPES)]
        fn, warm = attn_case, attn_warm
    else:
        cases = [(*c, args.topk) for c in (SMOKE_GEMM if SMOKE else GEMM_SHAPES)]
        fn, warm = gemm_case, gemm_warm
    if args.shapes:
        cases = cases[:args.shapes]
    workers = args.workers if args.workers is not None else 0 if SMOKE else 12
    if not SMOKE:
        print(torch.cuda.get_device_name(), flush=True)
    if workers > 1:  # (shape, row) jobs, a shape's rows together: the first wave compiles distinct kernels
        rows = (lambda c: attn_rows(*c[1:6], c[6])[1]) if args.attention else (lambda c: gemm_rows(*c[1:5]))
        jobs = [(c if args.attention else c[:-1], cfg) for c in cases for cfg in rows(c)]
        warm_all(warm, jobs, workers, start + args.budget * 0.55)
    results = []
    for c in cases:
        if time.perf_counter() > deadline:
            print(f"budget: {c[0]} and later cut", flush=True)
            break
        t0 = time.perf_counter()
        try:
            results.append(fn(*c))
        except Exception as e:
            traceback.print_exc()
            results.append(dict(name=c[0], error=f"{type(e).__name__}: {e}"))
        r = results[-1]
        print(f"{c[0]}: {time.perf_counter() - t0:.1f} s; table {r.get('table')}, pick {r.get('timed_pick')}, "
              f"best {r.get('best')} {fmt(r.get('best_ms'), '.4f')} ms", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("napkin_topk_configs_attention.json" if args.attention else "napkin_topk_configs.json")
    path.write_text(json.dumps(dict(device=None if SMOKE else torch.cuda.get_device_name(), topk=args.topk,
                                    smoke=SMOKE, seconds=time.perf_counter() - start, cases=results), indent=1))
    # the table: each case's picks over the sweep's best (1.000: the best), checks, Spearman
    print(f"\n{'case':22} {'table':>6} {'top1':>6} {'pick':>6} {'best TF':>8} {'/cuBLAS':>7} {'rho':>5} ok  "
          "best / pick")
    for r in results:
        ok = all(x.get("ok") for x in r.get("rows", {}).values()) if r.get("rows") else False
        best_tf = r["rows"][r["best"]].get("tflops") if r.get("best") else None
        print(f"{r['name']:22} {fmt(r.get('table_over_best')):>6} {fmt(r.get('napkin_top1_over_best')):>6} "
              f"{fmt(r.get('timed_pick_over_best')):>6} {fmt(best_tf, '.0f'):>8} {fmt(r.get('best_over_cublas')):>7} "
              f"{fmt(r.get('spearman'), '.2f'):>5} {'y' if ok else 'N'}   {r.get('best')} / {r.get('timed_pick')}"
              + (f" / plan {r['plan_pick']} {fmt(r.get('plan_pick_over_best'))}" if "plan_pick" in r else ""))
    print(f"wrote {path} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
