"""GPU check of tilecore.fft_conv (issue 37: the pair kernel), in about two minutes:

1. check: bf16 / fp16 / fp32 forward, du and dk on the GPU against float64 (the reference's float64 FFT)
   at N = 256 .. 16384 (the pair kernel at 256..4096 for bf16/fp16, the float32 kernel at 256..1024 for
   fp32, torch.fft beyond), error as a multiple of the rounding floor; outputs start as NaN (the caching
   allocator is filled with NaN first). Every candidate configuration of the pair kernel
   (configs.PAIR_CANDIDATES) is checked (bf16 y) before it is timed.
2. time: do_bench medians at B16 H768, N = 256 .. 16384, bf16: fft_conv(u, precomputed spectrum)
   against a torch.fft convolution (rfft, multiply, irfft in float32: the issue's baseline) and the HBM
   bound (a torch copy of the bytes the kernel must move: u read, y written, the spectrum read), in the
   same run; each candidate configuration of the pair kernel beside the plan's.

    PYTHONPATH=. python3 experiments/fft_conv/gpu_check.py            # on the GPU
    TRITON_INTERPRET=1 PYTHONPATH=. python3 experiments/fft_conv/gpu_check.py --smoke   # CPU: shapes

Writes $OUT/fft_conv_gpu_check.json ($OUT defaults to /tmp/out) and prints a table last.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tilecore import accuracy  # noqa: E402
from tilecore.ops.fft_conv import fft_conv, fft_conv_reference, filter_spectrum  # noqa: E402
from tilecore.ops.fft_conv import launch as conv_launch  # noqa: E402
from tilecore.ops.fft_conv import configs  # noqa: E402
from tilecore.ops.fft_conv.plan import Plan, long_plan, pair_plan, plan  # noqa: E402

START = time.time()
SMOKE = "--smoke" in sys.argv
DEV = torch.device("cpu" if SMOKE else "cuda")
RESULTS: dict = {"check": [], "candidates": [], "time": [], "errors": []}
DEADLINE_S = 100  # no new candidate checks past this (their compiles); candidates unchecked are not timed
SMOKE_LONG = (32, 16, 16, 16, 16, 4, 4)  # the long form at a size the interpreter runs quickly


def guarded(label, fn):
    print(f"[{time.time() - START:.0f} s] {label}", flush=True)
    try:
        return fn()
    except Exception as err:  # noqa: BLE001
        print(f"[error] {label}: {type(err).__name__}: {err}")
        traceback.print_exc(limit=3)
        RESULTS["errors"].append({"case": label, "error": f"{type(err).__name__}: {err}"})
        if not SMOKE:
            torch.cuda.synchronize()
        return None


def poison_allocator(nbytes: int = 1 << 30):
    if SMOKE:
        return
    block = torch.full((nbytes // 2,), float("nan"), dtype=torch.float16, device=DEV)
    del block


def bench(fn) -> float:
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def check(n, dtype, B=2, H=8):
    poison_allocator()
    u = torch.randn(B, H, n, device=DEV).to(dtype).requires_grad_()
    k = (torch.randn(H, n, device=DEV) / math.sqrt(n)).to(dtype).requires_grad_()
    y = fft_conv(u, k)
    dy = torch.randn(B, H, n, device=DEV).to(dtype)
    du, dk = torch.autograd.grad(y, (u, k), dy)
    u64, k64 = u.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    ref = fft_conv_reference(u64, k64)
    ref_du, ref_dk = torch.autograd.grad(ref, (u64, k64), dy.double())
    row = {"n": n, "dtype": str(dtype).removeprefix("torch."), "path": plan(n, DEV, dtype).path}
    for name, out, r in (("y", y.detach(), ref.detach()), ("du", du, ref_du), ("dk", dk, ref_dk)):
        row[name] = accuracy.rel_rms(out, r) if dtype == torch.float32 else accuracy.error_over_floor(out, r)
    row["finite"] = all(bool(torch.isfinite(t).all()) for t in (y, du, dk))
    if row["path"] == "tl" and not SMOKE:  # the kernel at one TF32 product
        p = plan(n, DEV, dtype)
        y32 = torch.empty_like(y)
        conv_launch.launch(Plan("tl", p.n1, p.n2, p.num_warps, "tf32"), u.detach(), filter_spectrum(k.detach(), n),
                           y32, False)
        row["y_tf32"] = accuracy.rel_rms(y32, ref) if dtype == torch.float32 else accuracy.error_over_floor(y32, ref)
    RESULTS["check"].append(row)
    print("check", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})


def plan_of(config) -> Plan:
    """A candidate: (N1, N2, pairs, warps) of the pair kernel, or the 7 numbers of the long form."""
    return pair_plan(*config) if len(config) == 4 else long_plan(*config)


def check_candidate(config, B=3, H=4):
    """The pair kernel (or the long form) at one configuration, bf16 (fp16 in the smoke run: the interpreter's bf16 store
    truncates), against float64; an odd batch (the last pair half masked)."""
    n = config[0] * config[1] // 2
    dtype = torch.float16 if SMOKE else torch.bfloat16
    poison_allocator()
    u = torch.randn(B, H, n, device=DEV).to(dtype)
    k = torch.randn(H, n, device=DEV) / math.sqrt(n)
    y = torch.full_like(u, float("nan"))
    conv_launch.launch(plan_of(config), u, filter_spectrum(k, n), y, False)
    row = {"n": n, "config": list(config), "y": accuracy.error_over_floor(y, fft_conv_reference(u, k)),
           "finite": bool(torch.isfinite(y).all())}
    RESULTS["candidates"].append(row)
    print("candidate", row)
    return row["finite"] and row["y"] < 4


def time_case(n, B=16, H=768):
    dtype = torch.bfloat16
    if SMOKE:
        B, H = 2, 2
    u = torch.randn(B, H, n, device=DEV, dtype=dtype)
    k = (torch.randn(H, n, device=DEV) / math.sqrt(n)).to(dtype)
    spectrum = filter_spectrum(k, n)

    def torch_fft():  # the baseline: rfft, multiply, irfft in float32
        return torch.fft.irfft(torch.fft.rfft(u.float(), n=2 * n) * spectrum, n=2 * n)[..., :n].to(dtype)

    # the HBM bound: u read, y written (bf16), the spectrum read (complex64 (H, N + 1))
    nbytes = 2 * u.numel() * u.element_size() + spectrum.numel() * 8
    src = torch.empty(nbytes // 2 // 2, dtype=dtype, device=DEV)
    dst = torch.empty_like(src)
    run = (lambda fn: (fn(), 1.0)[1]) if SMOKE else bench
    copy = run(lambda: dst.copy_(src))
    ours = run(lambda: fft_conv(u, spectrum))
    base = run(torch_fft)
    p = plan(n, DEV, dtype)
    row = {"n": n, "B": B, "H": H, "path": p.path, "plan": vars(p), "ms": ours,
           "torch_fft_ms": base, "speedup_vs_torch_fft": base / ours, "bound_ms": copy,
           "pct_of_bound": 100 * copy / ours, "bytes": nbytes}
    row["candidates"] = {}
    y = torch.empty_like(u)
    for config in configs.PAIR_CANDIDATES.get(n, []) + configs.LONG_CANDIDATES.get(n, []):
        if not any(c["config"] == list(config) and c["finite"] and c["y"] < 4 for c in RESULTS["candidates"]):
            continue  # not checked, or wrong: not timed
        try:
            ms = run(lambda: conv_launch.launch(plan_of(config), u, spectrum, y, False))
            row["candidates"]["x".join(map(str, config))] = ms
        except Exception as err:  # noqa: BLE001
            print(f"[error] time N={n} {config}: {type(err).__name__}: {err}")
            RESULTS["errors"].append({"case": f"time N={n} {config}", "error": f"{type(err).__name__}: {err}"})
    if row["candidates"]:
        best = min(row["candidates"], key=row["candidates"].get)
        row["best_candidate"], row["best_ms"] = best, row["candidates"][best]
        row["best_speedup_vs_torch_fft"] = base / row["best_ms"]
        row["best_pct_of_bound"] = 100 * copy / row["best_ms"]
    flops = B * H * 8 * (2 * n) * math.log2(2 * n)  # ~ the FFT flops of two transforms of length 2N
    row["fft_tflops_equiv"] = flops / ours / 1e9
    RESULTS["time"].append(row)
    print("time", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})


def write(out_dir: Path) -> Path:
    """The JSON so far (each phase rewrites it: a run cut short keeps what it measured)."""
    RESULTS["wall_s"] = time.time() - START
    path = out_dir / "fft_conv_gpu_check.json"
    path.write_text(json.dumps(RESULTS, indent=1, default=str))
    return path


def main() -> int:
    out_dir = Path(os.environ.get("OUT", "/tmp/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        from experiments.common.meta import meta
        RESULTS["meta"] = meta()
    except Exception as err:  # noqa: BLE001
        RESULTS["meta"] = {"error": str(err)}
    torch.manual_seed(0)
    sizes = (256, 512, 1024, 2048, 4096, 8192, 16384)
    # (fp16 and fp32 at a few N: every kernel variant is a compile, and the run has 3 minutes)
    checks = [(n, torch.bfloat16) for n in sizes] + [(n, torch.float16) for n in (512, 2048, 8192)] + \
        [(n, torch.float32) for n in (256, 1024)]
    for n, dtype in checks:
        if not (SMOKE and n > 1024):
            guarded(f"check N={n} {dtype}", lambda: check(n, dtype))
    write(out_dir)
    candidates = [c for cs in configs.PAIR_CANDIDATES.values() for c in cs] + \
        [c for cs in configs.LONG_CANDIDATES.values() for c in cs]
    for config in candidates if not SMOKE else [c for c in candidates if c[0] * c[1] <= 2048] + [SMOKE_LONG]:
        if time.time() - START > DEADLINE_S:
            print(f"[skip] candidate {config}: past {DEADLINE_S} s")
            continue
        guarded(f"candidate {config}", lambda: check_candidate(config))
    write(out_dir)
    for n in sizes if not SMOKE else (256, 512):
        guarded(f"time N={n}", lambda: time_case(n))
        write(out_dir)
        if not SMOKE:
            torch.cuda.empty_cache()
    path = write(out_dir)
    print(f"\nwrote {path}\n")
    print(f"{'N':>6} {'path':>5} {'ms':>8} {'torch.fft':>9} {'speedup':>7} {'% bound':>7}  "
          f"{'best cand.':>14} {'ms':>7} {'speedup':>7} {'% bound':>7}")
    for r in RESULTS["time"]:
        print(f"{r['n']:>6} {r['path']:>5} {r['ms']:>8.4f} {r['torch_fft_ms']:>9.4f} "
              f"{r['speedup_vs_torch_fft']:>7.2f} {r['pct_of_bound']:>7.1f}  {r.get('best_candidate', '-'):>14} "
              f"{r.get('best_ms', float('nan')):>7.4f} {r.get('best_speedup_vs_torch_fft', float('nan')):>7.2f} "
              f"{r.get('best_pct_of_bound', float('nan')):>7.1f}")
    for dtype in ("bfloat16", "float16"):
        rows = [r for r in RESULTS["check"] if r["dtype"] == dtype]
        worst = max((max(r["y"], r["du"], r["dk"]) for r in rows), default=None)
        print(f"{dtype}: worst error {worst} x floor over {len(rows)} checks")
    bad = [c for c in RESULTS["candidates"] if not (c["finite"] and c["y"] < 4)]
    print(f"candidates: {len(RESULTS['candidates'])} checked, {len(bad)} wrong; errors: {len(RESULTS['errors'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
