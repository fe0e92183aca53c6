"""GPU check of tilecore.fft_conv (issue 37), v8, in about three minutes:

1. check: bf16 / fp16 / fp32 forward, du and dk on the GPU against float64 (the reference's float64 FFT)
   at N = 256 .. 16384 (the pair kernel at 256..4096 for bf16/fp16, the float32 kernel at 256..1024 for
   fp32, torch.fft beyond), error as a multiple of the rounding floor; outputs start as NaN (the caching
   allocator is filled with NaN first). Every candidate configuration of the pair kernel
   (configs.PAIR_CANDIDATES) is checked (bf16 y) before it is timed.
2. time: do_bench medians at B16 H768, N = 256 .. 16384, bf16: fft_conv(u, precomputed spectrum)
   against a torch.fft convolution (rfft, multiply, irfft in float32: the issue's baseline) and the HBM
   bound (a torch copy of the bytes the kernel must move: u read, y written, the spectrum read), in the
   same run; each candidate configuration of the pair kernel beside the plan's (v7: programs looping
   over groups of pairs, their constants loaded once or again each group). v7 also times the backward
   step: fft_conv(u, k) forward + backward (du through the kernel, dk through torch.fft) against torch.fft's
   autograd of the same convolution, and du's kernel alone (the conjugate spectrum); N up to 65536
   (32768 and 65536: torch.fft's path; B scaled so B N stays 16 x 16384); the model (model.py: each
   pass's bytes and tensor FLOPs, the bound max(bytes / copy, FLOPs / 680 TFLOP/s)) beside each time.
   v8: the filter-gradient kernel's candidates (configs.DK_CANDIDATES: launch.dk_pair) checked against
   float64 and timed against torch.fft's dk (two rfft, a product summed over the batch, an irfft), the
   piece the backward step spends most on; 2048's pair kernel at other shapes (which ones fault).

Each N runs in a child process, step by step (torch.fft and the bound first, then each candidate's
check and timing, then the plan's checks with gradients); a step that kills its process (an illegal
memory access poisons the CUDA context) is recorded as an error and the child restarted after it.

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
from tilecore.ops.fft_conv import model  # noqa: E402
from tilecore.ops.fft_conv.plan import Plan, plan, plan_of_config  # noqa: E402

START = time.time()
SMOKE = "--smoke" in sys.argv
DEV = torch.device("cpu" if SMOKE else "cuda")
RESULTS: dict = {"check": [], "candidates": [], "time": [], "errors": []}
DEADLINE_S = 175  # no new child process past this (each N's compiles take a while)
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
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001  (a lost context: the child returns 3 after this)
                pass
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
    # the reference on the CPU (no cuFFT: runs 3 and 4 saw CUFFT_INTERNAL_ERROR at N = 2048 after the
    # B16 H768 baseline's plans, with an illegal memory access reported next)
    u64, k64 = u.detach().cpu().double().requires_grad_(), k.detach().cpu().double().requires_grad_()
    ref = fft_conv_reference(u64, k64)
    ref_du, ref_dk = torch.autograd.grad(ref, (u64, k64), dy.cpu().double())
    y, du, dk = y.cpu(), du.cpu(), dk.cpu()
    row = {"n": n, "dtype": str(dtype).removeprefix("torch."), "path": plan(n, DEV, dtype).path}
    for name, out, r in (("y", y.detach(), ref.detach()), ("du", du, ref_du), ("dk", dk, ref_dk)):
        row[name] = accuracy.rel_rms(out, r) if dtype == torch.float32 else accuracy.error_over_floor(out, r)
    row["finite"] = all(bool(torch.isfinite(t).all()) for t in (y, du, dk))
    if row["path"] == "tl" and not SMOKE:  # the kernel at one TF32 product
        p = plan(n, DEV, dtype)
        y32 = torch.empty_like(u)
        conv_launch.launch(Plan("tl", p.n1, p.n2, p.num_warps, "tf32"), u.detach(), filter_spectrum(k.detach(), n),
                           y32, False)
        y32 = y32.cpu()
        row["y_tf32"] = accuracy.rel_rms(y32, ref) if dtype == torch.float32 else accuracy.error_over_floor(y32, ref)
    RESULTS["check"].append(row)
    print("check", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})


def plan_of(config) -> Plan:
    """A candidate: (N1, N2, pairs, warps[, loop[, stages[, hoist]]]) of the pair kernel (pairs 0: the
    transpose-free one-pair kernel), or the 7 numbers of the long form (an 8th, True: GAUSS)."""
    return plan_of_config(tuple(config))


def check_candidate(config, B=3, H=4):
    """The pair kernel (or the long form) at one configuration, bf16 (fp16 in the smoke run: the interpreter's bf16 store
    truncates), against float64; an odd batch (the last pair half masked)."""
    n = config[0] * config[1] // 2
    dtype = torch.float16 if SMOKE else torch.bfloat16
    poison_allocator()
    u = torch.randn(B, H, n, device=DEV).to(dtype)
    k = torch.randn(H, n, device=DEV) / math.sqrt(n)
    y = torch.full_like(u, float("nan"))
    spectrum = filter_spectrum(k.cpu(), n).to(DEV)  # (no cuFFT in the candidates' checks: see check())
    conv_launch.launch(plan_of(config), u, spectrum, y, False)
    y = y.cpu()
    row = {"n": n, "config": list(config), "y": accuracy.error_over_floor(y, fft_conv_reference(u.cpu(), k.cpu())),
           "finite": bool(torch.isfinite(y).all())}
    RESULTS["candidates"].append(row)
    print("candidate", row)
    return row["finite"] and row["y"] < 4


def batch_for(n) -> int:
    """B16 up to N = 16384, then B N = 16 x 16384 (H768 throughout: the chip filled, memory bounded)."""
    return 16 if n <= 16384 else max(1, 16 * 16384 // n)


def torch_dk(u, dy, n, filter_len):
    """dk as op.py's backward computes it without the kernel (torch.fft in float32)."""
    cross = (torch.fft.rfft(dy.float(), n=2 * n) * torch.conj_physical(torch.fft.rfft(u.float(), n=2 * n))).sum(0)
    return torch.fft.irfft(cross, n=2 * n)[:, :filter_len]


def check_dk(config, B=5, H=4):
    """The filter-gradient kernel (launch.dk_pair) at one configuration against float64 (CPU), bf16
    and an odd batch; the partials start as whatever the allocator held (NaN: poisoned)."""
    n = config[0] * config[1] // 2
    dtype = torch.float16 if SMOKE else torch.bfloat16
    poison_allocator()
    u = torch.randn(B, H, n, device=DEV).to(dtype)
    dy = torch.randn(B, H, n, device=DEV).to(dtype)
    k = torch.zeros(H, n, dtype=torch.float64, requires_grad=True)
    want, = torch.autograd.grad(fft_conv_reference(u.cpu().double(), k), k, dy.cpu().double())
    got = conv_launch.dk_pair(tuple(config), u, dy, n).cpu()
    row = {"n": n, "dk_config": list(config), "y": accuracy.error_over_floor(got.to(dtype), want),
           "finite": bool(torch.isfinite(got).all())}
    RESULTS["candidates"].append(row)
    print("dk candidate", row)


def time_dk(n, config, B=None, H=768):
    """The kernel's dk against torch.fft's at B16 H768 (the same inputs)."""
    B = B or batch_for(n)
    u, _ = timing_inputs(n, B, H)
    dy = torch.randn_like(u)
    row = time_row(n)
    row.setdefault("dk", {})["x".join(map(str, config))] = run_timed(lambda: conv_launch.dk_pair(tuple(config), u,
                                                                                                 dy, n))
    if "torch" not in row["dk"]:
        row["dk"]["torch"] = run_timed(lambda: torch_dk(u, dy, n, n))
    print("time dk", n, row["dk"])


def time_baseline(n, B=None, H=768):
    """torch.fft's convolution and the HBM bound (a copy of the bytes the kernel must move)."""
    B = B or batch_for(n)
    u, spectrum = timing_inputs(n, B, H)
    dtype = u.dtype

    def torch_fft():  # the baseline: rfft, multiply, irfft in float32
        return torch.fft.irfft(torch.fft.rfft(u.float(), n=2 * n) * spectrum, n=2 * n)[..., :n].to(dtype)

    # the HBM bound: u read, y written (bf16), the spectrum read (complex64 (H, N + 1))
    nbytes = 2 * u.numel() * u.element_size() + spectrum.numel() * 8
    src = torch.empty(nbytes // 2 // 2, dtype=dtype, device=DEV)
    dst = torch.empty_like(src)
    row = time_row(n)
    row.update({"B": u.shape[0], "H": u.shape[1], "bytes": nbytes, "bound_ms": run_timed(lambda: dst.copy_(src)),
                "torch_fft_ms": run_timed(torch_fft)})
    del src, dst
    # the backward step of torch.fft's convolution (autograd through rfft, product, irfft in float32),
    # against which fft_conv's step (time_step) is set
    uf, kf = u.detach().clone().requires_grad_(), _timing_filter(n, B, H).clone().requires_grad_()
    dy = torch.randn_like(u)

    def torch_step():
        y = torch.fft.irfft(torch.fft.rfft(uf.float(), n=2 * n) * torch.fft.rfft(kf.float(), n=2 * n),
                            n=2 * n)[..., :n].to(dtype)
        return torch.autograd.grad(y, (uf, kf), dy)

    row["torch_fft_step_ms"] = run_timed(torch_step)
    print("baseline", row)


def time_row(n) -> dict:
    """N's row of timings (made by its first timing)."""
    rows = [r for r in RESULTS["time"] if r["n"] == n]
    if not rows:
        rows = [{"n": n, "candidates": {}}]
        RESULTS["time"].append(rows[0])
    return rows[0]


_TIMING_INPUTS: dict = {}


def timing_inputs(n, B, H):
    if SMOKE:
        B, H = 2, 2
    if n not in _TIMING_INPUTS:
        g = torch.Generator(device=DEV).manual_seed(n)
        u = torch.randn(B, H, n, device=DEV, generator=g).to(torch.bfloat16)
        k = (torch.randn(H, n, device=DEV, generator=g) / math.sqrt(n)).to(torch.bfloat16)
        _TIMING_INPUTS[n] = (u, filter_spectrum(k.cpu(), n).to(DEV))  # (cuFFT only in the baseline, last)
        _TIMING_INPUTS[("k", n)] = k
    return _TIMING_INPUTS[n]


def _timing_filter(n, B, H):
    timing_inputs(n, B, H)
    return _TIMING_INPUTS[("k", n)]


def run_timed(fn) -> float:
    if SMOKE:
        fn()
        return 1.0
    return bench(fn)


def time_candidate(n, config, B=None, H=768):
    """One checked candidate's time at B16 H768 (bf16), beside the baseline's row."""
    B = B or batch_for(n)
    u, spectrum = timing_inputs(n, B, H)
    y = torch.empty_like(u)
    ms = run_timed(lambda: conv_launch.launch(plan_of(config), u, spectrum, y, False))
    row = time_row(n)
    row["candidates"]["x".join(map(str, config))] = ms
    print("time", n, config, ms)


def time_plan(n, B=None, H=768):
    """fft_conv itself (the plan's choice, its host path included), the model's bound beside it."""
    B = B or batch_for(n)
    u, spectrum = timing_inputs(n, B, H)
    row = time_row(n)
    p = plan(n, DEV, u.dtype)
    row["plan"] = vars(p)
    row["ms"] = run_timed(lambda: fft_conv(u, spectrum))
    row["model"] = model.passes(p.path, u.shape[0], u.shape[1], n, p.n1, p.n2)
    row["model_ms"] = sum(m["bound_ms"] for m in row["model"]) or None
    print("time plan", n, row["plan"], row["ms"], "model bound", row["model_ms"])


def time_step(n, B=None, H=768):
    """The backward: du's kernel alone (the correlation: the conjugate spectrum), and fft_conv(u, k)'s
    forward + backward through autograd (du through the kernel, dk through torch.fft)."""
    B = B or batch_for(n)
    u, spectrum = timing_inputs(n, B, H)
    k = _timing_filter(n, B, H)
    row = time_row(n)
    p = plan(n, DEV, u.dtype)
    du = torch.empty_like(u)
    row["du_ms"] = run_timed(lambda: conv_launch.launch(p, u, spectrum, du, True))
    uf, kf = u.detach().clone().requires_grad_(), k.clone().requires_grad_()
    dy = torch.randn_like(u)
    row["step_ms"] = run_timed(lambda: torch.autograd.grad(fft_conv(uf, kf), (uf, kf), dy))
    print("time step", n, row["du_ms"], row["step_ms"])


def steps_for(n) -> list:
    """(what, argument) of one N's steps, in order: the candidates, the plan, its checks, and torch.fft's
    baseline last (its cuFFT plans at B16 H768 came before every CUFFT_INTERNAL_ERROR of runs 3-4)."""
    steps = []
    # (the long form's candidates at 8192 and 16384 ran in session 25, run 3: only its plan now)
    for config in configs.PAIR_CANDIDATES.get(n, []) + (configs.LONG_CANDIDATES.get(n, []) if n == 2048 else []):
        steps += [("candidate", config), ("time_candidate", config)]
    if SMOKE and n == 256:
        steps += [("candidate", SMOKE_LONG)]
    for config in configs.DK_CANDIDATES.get(n, []):
        steps += [("check_dk", config), ("time_dk", config)]
    steps += [("time_plan", None), ("time_step", None)]
    for dtype, sizes in CHECKS.items():
        if n in sizes:
            steps.append(("check", dtype))
    return steps + [("baseline", None)]


CHECKS = {"bfloat16": (256, 512, 1024, 2048, 4096, 8192, 16384, 65536), "float16": (512, 8192),
          "float32": (256, 1024)}


def run_step(n, what, arg):
    if what == "baseline":
        time_baseline(n)
    elif what == "candidate":
        check_candidate(tuple(arg))
    elif what == "time_candidate":
        ok = any(c.get("config") == list(arg) and c["finite"] and c["y"] < 4 for c in RESULTS["candidates"])
        if ok:  # a candidate that failed its check is not timed
            time_candidate(n, tuple(arg))
    elif what == "time_plan":
        time_plan(n)
    elif what == "time_step":
        time_step(n)
    elif what == "check_dk":
        check_dk(tuple(arg))
    elif what == "time_dk":
        ok = any(c.get("dk_config") == list(arg) and c["finite"] and c["y"] < 4 for c in RESULTS["candidates"])
        if ok:  # a configuration that failed its check is not timed
            time_dk(n, tuple(arg))
    elif what == "check":
        check(n, getattr(torch, arg))


def child(n: int, start: int, part: Path) -> int:
    """Steps start.. of N, the results written after each (the parent reads how far it got)."""
    torch.manual_seed(n)
    if part.exists():
        RESULTS.update(json.loads(part.read_text()))
    for i, (what, arg) in enumerate(steps_for(n)):
        if i < start:
            continue
        RESULTS["started"] = i
        part.write_text(json.dumps(RESULTS, default=str))
        errors = len(RESULTS["errors"])
        guarded(f"N={n} step {i}: {what} {arg}", lambda: run_step(n, what, arg))
        RESULTS["done"] = i
        part.write_text(json.dumps(RESULTS, default=str))
        if len(RESULTS["errors"]) > errors and "CUDA" in RESULTS["errors"][-1]["error"]:
            return 3  # the context is lost: the parent restarts a child after this step
    return 0


def parent(out_dir: Path) -> None:
    """Each N in a child; a child that dies is restarted after the step it died in."""
    import subprocess
    import tempfile

    # the range first (a run that reaches its deadline loses the small N)
    sizes = (256, 512) if SMOKE else (1024, 2048, 4096, 8192, 16384, 256, 512, 32768, 65536)
    for n in sizes:
        part = Path(tempfile.mkdtemp()) / f"part_{n}.json"
        start, restarts = 0, 0
        while start < len(steps_for(n)) and restarts < 4:
            if time.time() - START > DEADLINE_S:
                RESULTS["errors"].append({"case": f"N={n} from step {start}", "error": "skipped: past the deadline"})
                break
            args = [sys.executable, __file__, "--child", str(n), str(start), str(part)] + (["--smoke"] * SMOKE)
            try:
                rc = subprocess.run(args, timeout=max(10, DEADLINE_S + 30 - (time.time() - START))).returncode
            except subprocess.TimeoutExpired:
                RESULTS["errors"].append({"case": f"N={n}", "error": "child timed out"})
                break
            got = json.loads(part.read_text()) if part.exists() else {}
            if rc == 0:
                break
            died = got.get("started", start)
            print(f"[error] N={n}: the child stopped (rc {rc}) in step {died}: {steps_for(n)[died]}; restarting after it")
            if rc != 3:  # (rc 3: the child recorded the CUDA error itself)
                got.setdefault("errors", []).append({"case": f"N={n} step {died}: {steps_for(n)[died]}",
                                                    "error": f"process died (rc {rc})"})
            part.write_text(json.dumps(got, default=str))
            start, restarts = died + 1, restarts + 1
        got = json.loads(part.read_text()) if part.exists() else {}
        for key in ("check", "candidates", "time", "errors"):
            RESULTS[key] += got.get(key, [])
        write(out_dir)


def write(out_dir: Path) -> Path:
    """The JSON so far (each phase rewrites it: a run cut short keeps what it measured)."""
    RESULTS["wall_s"] = time.time() - START
    path = out_dir / "fft_conv_gpu_check.json"
    path.write_text(json.dumps(RESULTS, indent=1, default=str))
    return path


def main() -> int:
    if "--child" in sys.argv:
        i = sys.argv.index("--child")
        return child(int(sys.argv[i + 1]), int(sys.argv[i + 2]), Path(sys.argv[i + 3]))
    out_dir = Path(os.environ.get("OUT", "/tmp/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        from experiments.common.meta import meta
        RESULTS["meta"] = meta()
    except Exception as err:  # noqa: BLE001
        RESULTS["meta"] = {"error": str(err)}
    parent(out_dir)
    nan = float("nan")
    for row in RESULTS["time"]:
        row.setdefault("torch_fft_ms", nan)
        row.setdefault("bound_ms", nan)
        if "ms" in row:
            row["speedup_vs_torch_fft"] = row["torch_fft_ms"] / row["ms"]
            row["pct_of_bound"] = 100 * row["bound_ms"] / row["ms"]
        if row["candidates"]:
            best = min(row["candidates"], key=row["candidates"].get)
            row["best_candidate"], row["best_ms"] = best, row["candidates"][best]
            row["best_speedup_vs_torch_fft"] = row["torch_fft_ms"] / row["best_ms"]
            row["best_pct_of_bound"] = 100 * row["bound_ms"] / row["best_ms"]
    path = write(out_dir)
    print(f"\nwrote {path}\n")
    nan = float("nan")
    print(f"{'N':>6} {'B':>3} {'path':>5} {'ms':>8} {'torch.fft':>9} {'speedup':>7} {'% bound':>7} {'model':>7} "
          f"{'% model':>7}  {'best candidate':>20} {'ms':>7} {'speedup':>7} {'% bound':>7}  {'du ms':>7} "
          f"{'step ms':>8} {'torch step':>10} {'step x':>6}")
    for r in sorted(RESULTS["time"], key=lambda r: r["n"]):
        model_ms = r.get("model_ms") or nan
        step_x = r.get("torch_fft_step_ms", nan) / r.get("step_ms", nan)
        print(f"{r['n']:>6} {r.get('B', 0):>3} {r.get('plan', {}).get('path', '-'):>5} {r.get('ms', nan):>8.4f} "
              f"{r['torch_fft_ms']:>9.4f} {r.get('speedup_vs_torch_fft', nan):>7.2f} {r.get('pct_of_bound', nan):>7.1f} "
              f"{model_ms:>7.4f} {100 * model_ms / r.get('ms', nan):>7.1f}  {r.get('best_candidate', '-'):>20} "
              f"{r.get('best_ms', nan):>7.4f} {r.get('best_speedup_vs_torch_fft', nan):>7.2f} "
              f"{r.get('best_pct_of_bound', nan):>7.1f}  {r.get('du_ms', nan):>7.4f} {r.get('step_ms', nan):>8.4f} "
              f"{r.get('torch_fft_step_ms', nan):>10.4f} {step_x:>6.2f}")
    print("(% bound: a copy of u, y and the spectrum over the time; model: model.py's bound of the plan's path, "
          "max(bytes / copy, FLOPs / 680 TFLOP/s) a pass; step: forward + backward (du kernel, dk torch.fft))")
    for r in sorted(RESULTS["time"], key=lambda r: r["n"]):
        if r.get("candidates"):
            print(f"{r['n']:>6} candidates ms: " + ", ".join(f"{k} {v:.4f}" for k, v in r["candidates"].items()))
        if r.get("dk"):
            print(f"{r['n']:>6} dk ms (kernel configs, torch.fft): " + ", ".join(f"{k} {v:.4f}" for k, v in r["dk"].items()))
    for dtype in ("bfloat16", "float16"):
        rows = [r for r in RESULTS["check"] if r["dtype"] == dtype]
        worst = max((max(r["y"], r["du"], r["dk"]) for r in rows), default=None)
        print(f"{dtype}: worst error {worst} x floor over {len(rows)} checks")
    for c in RESULTS["candidates"]:
        if "dk_config" in c:
            print(f"dk kernel {c['dk_config']}: {c['y']:.3f} x floor (bf16), finite {c['finite']}")
    bad = [c for c in RESULTS["candidates"] if not (c["finite"] and c["y"] < 4)]
    print(f"candidates: {len(RESULTS['candidates'])} checked, {len(bad)} wrong; errors: {len(RESULTS['errors'])}")
    for e in RESULTS["errors"]:
        print("  error:", e["case"], e["error"][:160])
    return 0


if __name__ == "__main__":
    sys.exit(main())
