"""The napkin's attention backward model (tilecore.napkin.backward) against one H100 run, with the SM
clock and board power read while each call runs back to back (issue 36: the backward term). < 90 s.

Why: the model runs the backward's SM-clocked units at the backward's own clock (1545 MHz, measured in
session 19 at the board's 700 W limit), not at the clock the run's cuBLAS ceiling implies, because the
ceiling moves between runs (shared/anchors.md 680 TFLOP/s, the committed bench 752) while the backwards
do not (cuDNN 519, 505). This run reads the GEMM's clock and each backward's in one run to test that,
and prints the napkin's prediction for each backward beside the measurement.

1. check: tilecore's backward (dq, dk, dv) at B1 H2 N4096 D128, causal and not, bf16 (--full: fp16 too;
   each dtype compiles its own kernels), against a float64 reference on the GPU: error as a multiple of the rounding floor, every element finite;
2. ceilings: torch copy_ of 1 GiB, torch.matmul bf16 8192^3 (do_bench medians);
3. backward, B16 H16 N4096 bf16, D128 (--full: D64 too), causal and not: tilecore, SDPA cuDNN, SDPA
   flash: do_bench medians (TFLOP/s in the 2.5x-forward convention), then ~0.6 s back to back with
   nvidia-smi sampling the SM clock and board power every 50 ms (the GEMM too);
4. the napkin's TFLOP/s for each: its default (the SM-clocked units at the backward's own clock, 1545 MHz
   from notes/attention's power probe) and the engine's convention (this run's cuBLAS rate; "@ceil").

Run from the repository root on the GPU machine:

    PYTHONPATH=. python3 experiments/napkin/gpu_backward_clock.py

``--smoke`` runs the same code on the CPU (tiny shapes through the CPU paths and Triton's interpreter,
no timing, no clocks): a check of the script. Writes $OUT/napkin_gpu_backward_clock.json ($OUT defaults
to /tmp/out) and prints a table last.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
SMOKE = "--smoke" in sys.argv
FULL = "--full" in sys.argv
if SMOKE:  # before tilecore: its kernels are made for the interpreter or a GPU at import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import tilecore  # noqa: E402
from tilecore.napkin import backward  # noqa: E402
from tilecore.napkin.hardware import H100  # noqa: E402

START = time.time()
BUDGET_S = 80          # sections not started by then are skipped
DEV = torch.device("cpu" if SMOKE else "cuda")
OUT = Path(os.environ.get("OUT", "/tmp/out"))
RESULTS = {"device": "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(), "torch": torch.__version__,
           "checks": [], "ceilings": {}, "backward": [], "errors": []}
B, H, N = (1, 2, 64) if SMOKE else (16, 16, 4096)
DIMS = (64, 128) if FULL else (128,)
FP8_OVER_BF16 = 1230 / 680   # shared/anchors.md, as tilecore.napkin.validate


def note_error(what, exc):
    traceback.print_exc()
    RESULTS["errors"].append(f"{what}: {type(exc).__name__}: {str(exc)[:300]}")


def bench(fn) -> float:
    """Median seconds of fn (do_bench after its warm-up); the smoke run calls it once."""
    if SMOKE:
        fn()
        return float("nan")
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3


class Sampler:
    """nvidia-smi's SM clock (MHz) and board power (W) every 50 ms while the block runs."""

    def __init__(self):
        self.rows, self.proc, self.thread = [], None, None

    def __enter__(self):
        if SMOKE:
            return self
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                                          "--format=csv,noheader,nounits", "-lms", "50",
                                          "-i", str(torch.cuda.current_device())],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self.thread = threading.Thread(target=self._read, daemon=True)
            self.thread.start()
        except (OSError, ValueError) as e:  # no nvidia-smi: the timings stand without clocks
            RESULTS["errors"].append(f"nvidia-smi: {e}")
            self.proc = None
        return self

    def _read(self):
        for line in self.proc.stdout:
            try:
                mhz, watts = (float(x) for x in line.strip().split(","))
                self.rows.append((mhz, watts))
            except ValueError:
                continue

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return False

    def summary(self):
        rows = self.rows[len(self.rows) // 3:]   # the first third: the clock still settling
        if not rows:
            return None, None
        mhz = sorted(r[0] for r in rows)[len(rows) // 2]
        watts = sorted(r[1] for r in rows)[len(rows) // 2]
        return mhz, watts


def sustained(fn, seconds=0.6):
    """(seconds a call, SM MHz, W): fn back to back for ~`seconds`, clocks sampled meanwhile."""
    if SMOKE:
        fn()
        return float("nan"), None, None
    fn()
    torch.cuda.synchronize()
    with Sampler() as s:
        t0, calls = time.time(), 0
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        while time.time() - t0 < seconds:
            fn()
            calls += 1
            if calls % 4 == 0:
                torch.cuda.synchronize()
        end.record()
        torch.cuda.synchronize()
    mhz, watts = s.summary()
    return start.elapsed_time(end) * 1e-3 / calls, mhz, watts


# ------------------------------------------------------------------------------------ 1. check
def reference_grads(q, k, v, dout, causal):
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = (qd @ kd.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        n, nk = s.shape[-2:]
        mask = torch.ones(n, nk, dtype=torch.bool, device=s.device).tril(nk - n)
        s = s.masked_fill(~mask, float("-inf"))
    o = torch.softmax(s, -1) @ vd
    return torch.autograd.grad(o, (qd, kd, vd), dout.double())


def check():
    n = 64 if SMOKE else 4096
    for dtype in (torch.bfloat16, torch.float16) if FULL else (torch.bfloat16,):  # fp16: its own compiles
        for causal in (False, True):
            try:
                gen = torch.Generator(device=DEV).manual_seed(0)
                q, k, v = (torch.randn(1, 2, n, 128, generator=gen, device=DEV, dtype=torch.float32).to(dtype)
                           .requires_grad_() for _ in range(3))
                dout = torch.randn(1, 2, n, 128, generator=gen, device=DEV, dtype=torch.float32).to(dtype)
                out = tilecore.attention(q, k, v, causal=causal)
                grads = torch.autograd.grad(out, (q, k, v), dout)
                refs = reference_grads(q, k, v, dout, causal)
                worst, finite = 0.0, True
                for g, r in zip(grads, refs):
                    finite &= bool(torch.isfinite(g).all())
                    rms = r.pow(2).mean().sqrt()
                    floor = max(((r - r.to(dtype).double()).pow(2).mean().sqrt() / rms).item(), 2 ** -24)
                    worst = max(worst, ((g.double() - r).pow(2).mean().sqrt() / rms).item() / floor)
                ok = finite and worst < 3.0
                RESULTS["checks"].append({"dtype": str(dtype), "causal": causal, "n": n, "grad_err_over_floor":
                                          round(worst, 3), "all_finite": finite, "ok": ok})
                print(f"check {dtype} causal={causal}: dq/dk/dv worst {worst:.2f}x the floor, "
                      f"{'finite' if finite else 'NOT FINITE'}", flush=True)
            except Exception as e:  # noqa: BLE001 - report and go on
                note_error(f"check {dtype} causal={causal}", e)


# ------------------------------------------------------------------------------------ 2. ceilings
def ceilings():
    if SMOKE:
        RESULTS["ceilings"] = {"copy_bytes_per_s": 3000e9, "matmul_bf16_flops": 750e12}
        return
    x = torch.empty(2 ** 29, dtype=torch.bfloat16, device=DEV)
    y = torch.empty_like(x)
    copy = 2 * x.numel() * 2 / bench(lambda: y.copy_(x))
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    mm = 2 * 8192 ** 3 / bench(lambda: a @ b)
    t, mhz, watts = sustained(lambda: a @ b)
    RESULTS["ceilings"] = {"copy_bytes_per_s": copy, "matmul_bf16_flops": mm,
                           "matmul_sustained_flops": 2 * 8192 ** 3 / t, "matmul_mhz": mhz, "matmul_watts": watts}
    del x, y, a, b
    print(f"ceilings: copy {copy / 1e9:.0f} GB/s, cuBLAS bf16 8192^3 {mm / 1e12:.0f} TFLOP/s "
          f"(back to back {2 * 8192 ** 3 / t / 1e12:.0f} at {mhz} MHz, {watts} W)", flush=True)


# ------------------------------------------------------------------------------------ 3. backward
def sdpa(backend_name):
    def f(q, k, v, causal):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(getattr(SDPBackend, backend_name)):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return f


IMPLS = {"tilecore": ("tilecore", lambda q, k, v, c: tilecore.attention(q, k, v, causal=c)),
         "cuDNN (SDPA)": ("cudnn", sdpa("CUDNN_ATTENTION")), "flash (SDPA)": ("flash", sdpa("FLASH_ATTENTION"))}


def time_backward(gpu_run):
    for d in DIMS:
        for causal in (False, True):
            q, k, v = (torch.randn(B, H, N, d, device=DEV, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
            flops = backward.backward_flops(B, H, N, d, causal)
            for name, (impl, call) in IMPLS.items():
                if time.time() - START > BUDGET_S:
                    RESULTS["errors"].append(f"backward D{d} causal={causal} {name}: skipped (time budget)")
                    continue
                if SMOKE and name != "tilecore":
                    continue   # SDPA's CPU backends are not the ones timed
                try:
                    out = call(q, k, v, causal)
                    dout = torch.randn_like(out)
                    run = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # noqa: E731
                    t = bench(run)
                    t_sus, mhz, watts = sustained(run)
                    # the model's default (the backward's own clock, 1545 MHz) and the engine's convention
                    # (this run's cuBLAS rate)
                    pred = backward.attention_backward_time(B, H, H, N, d, causal, gpu_run, impl).time
                    pred_ceiling = backward.attention_backward_time(B, H, H, N, d, causal, gpu_run, impl,
                                                                   rates="ceiling").time
                    row = {"impl": name, "d": d, "causal": causal, "B": B, "H": H, "N": N, "ms": t * 1e3,
                           "tflops": flops / t / 1e12, "sustained_tflops": flops / t_sus / 1e12, "mhz": mhz,
                           "watts": watts, "napkin_tflops": flops / pred / 1e12,
                           "napkin_run_ceiling_tflops": flops / pred_ceiling / 1e12}
                    row["predicted_over_measured"] = row["napkin_tflops"] / row["tflops"] if t == t else None
                    RESULTS["backward"].append(row)
                    print(f"backward D{d} causal={causal} {name}: {row['tflops']:.0f} TFLOP/s "
                          f"(back to back {row['sustained_tflops']:.0f} at {mhz} MHz, {watts} W); "
                          f"napkin {row['napkin_tflops']:.0f}", flush=True)
                    del out, dout
                except Exception as e:  # noqa: BLE001
                    note_error(f"backward D{d} causal={causal} {name}", e)
            del q, k, v


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    check()
    try:
        ceilings()
    except Exception as e:  # noqa: BLE001
        note_error("ceilings", e)
    c = RESULTS["ceilings"] or {"copy_bytes_per_s": 3000e9, "matmul_bf16_flops": 750e12}
    mm = c["matmul_bf16_flops"]
    gpu_run = H100.calibrated(copy_bytes_per_s=c["copy_bytes_per_s"],
                              matmul_flops={"bf16": mm, "fp16": mm, "fp8": mm * FP8_OVER_BF16}, label="this run")
    time_backward(gpu_run)
    RESULTS["wall_s"] = time.time() - START
    (OUT / "napkin_gpu_backward_clock.json").write_text(json.dumps(RESULTS, indent=1))
    f = lambda x, fmt="%.0f": "-" if x is None or x != x else fmt % x  # noqa: E731
    print(f"\ndevice: {RESULTS['device']}; {RESULTS['wall_s']:.0f} s; JSON: {OUT / 'napkin_gpu_backward_clock.json'}")
    print(f"ceilings: cuBLAS {f(mm / 1e12)} TFLOP/s (back to back {f(c.get('matmul_sustained_flops', 0) / 1e12)} "
          f"at {f(c.get('matmul_mhz'))} MHz, {f(c.get('matmul_watts'))} W), copy {f(c['copy_bytes_per_s'] / 1e9)} GB/s")
    print(f"{'check':<40} {'err/floor':>9} ok")
    for r in RESULTS["checks"]:
        print(f"{r['dtype'] + ' causal=' + str(r['causal']):<40} {r['grad_err_over_floor']:>9.2f} {'yes' if r['ok'] else 'NO'}")
    print(f"{'backward B16 H16 N4096':<32} {'TFLOP/s':>7} {'b2b':>5} {'MHz':>5} {'W':>4} {'napkin':>6} {'p/m':>5} {'@ceil':>5}")
    for r in RESULTS["backward"]:
        print(f"{r['impl'] + ' D' + str(r['d']) + (' causal' if r['causal'] else ''):<32} {f(r['tflops']):>7} "
              f"{f(r['sustained_tflops']):>5} {f(r['mhz']):>5} {f(r['watts']):>4} {f(r['napkin_tflops']):>6} "
              f"{f(r['predicted_over_measured'], '%.2f'):>5} {f(r['napkin_run_ceiling_tflops']):>5}")
    for e in RESULTS["errors"]:
        print("error:", e)


if __name__ == "__main__":
    main()
