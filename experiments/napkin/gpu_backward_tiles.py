"""The napkin's attention backward, kernel by kernel, at short and long N (issue 36, session 28). < 90 s.

Why: session 28's model (tilecore.napkin.backward) added three terms, each a claim this run tests:
- a one-tile thread block (cuDNN costed as FA3's grid of tiles, FlashAttention-2) pays its tile's
  prologue and epilogue (K, V and the first stage in, dK and dV out, two DRAM round trips): a cost a
  tile, so at B N fixed the main kernel's time is `a + b N` with `a` the tile term. tilecore's persistent
  kernel: none. The profiler's main-kernel time at N 512 and 4096 gives `a` and `b` for each;
- FlashAttention-2's per-warp operand reads add to its MMAs at its own clock (1920 MHz measured at D128
  only): its clock at D64 and at N 512 is read here;
- the passes around the main kernel (preprocess, dQ conversion, FA2's grouped dK/dV sums) at copy
  bandwidth: each kernel's own time from the profiler.

For each implementation (SDPA cuDNN, SDPA flash, tilecore), D 64 / 128, N 512 / 4096 (B = 65536 / N,
H 16, bf16; the bench's shapes), causal and not: do_bench median of the backward (autograd.grad of a
kept forward), every CUDA kernel's time from torch.profiler over 3 calls, the SM clock and board power
back to back (nvidia-smi, 50 ms), and the napkin's prediction, total and per kernel. Then FA2's grouped
backward (Llama 3 8B heads, 32 / 8, D128, N 1024, causal): its group sums. Correctness: tilecore's
backward at B1 H2 N512 (D64 causal, D128 not) against a float64 reference (error over the rounding floor).

Run from the repository root on the GPU machine:

    PYTHONPATH=. python3 experiments/napkin/gpu_backward_tiles.py

``--short``: instead, N 128, 256, 512 (not causal), 512 and 1024 causal: whether the short causal rows' excess
over the model (1.12-1.27 on cuDNN's and tilecore's main kernels in run 5) is the mask or the tiles' length.
Writes napkin_gpu_backward_tiles_short.json.

``--smoke``: the same code on the CPU (tiny shapes, tilecore only, no timing, no profiler, no clocks).
Writes $OUT/napkin_gpu_backward_tiles.json ($OUT defaults to /tmp/out); prints a table last.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT, ROOT / "experiments" / "napkin"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
SMOKE = "--smoke" in sys.argv
if SMOKE:  # before tilecore: its kernels are made for the interpreter or a GPU at import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import tilecore  # noqa: E402
from gpu_backward_clock import IMPLS, reference_grads, sustained  # noqa: E402  (the clock probe's helpers)
from tilecore.napkin import backward  # noqa: E402
from tilecore.napkin.hardware import H100  # noqa: E402

START = time.time()
BUDGET_S = 78          # cases not started by then are skipped
DEV = torch.device("cpu" if SMOKE else "cuda")
OUT = Path(os.environ.get("OUT", "/tmp/out"))
RESULTS = {"device": "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(), "torch": torch.__version__,
           "checks": [], "ceilings": {}, "cases": [], "errors": []}
H = 2 if SMOKE else 16
TOKENS = 128 if SMOKE else 65536          # B N
SEQS = (64, 128) if SMOKE else (512, 4096)
# --short: which of the short causal rows' excess is the mask and which the tiles' length: non-causal
# N 128 and 256 (2 and 4 query steps a 128-key tile: as short as causal N 512's 2-8) beside causal and
# non-causal N 512 and causal 1024, D64 and D128, the one-tile peers and tilecore
SHORT = "--short" in sys.argv
SHORT_CASES = tuple((n, causal) for n in ((64, 128) if SMOKE else (128, 256, 512, 1024))
                    for causal in (False, True) if not (n <= 256 and causal) and not (n == 1024 and not causal))
ORDER = ("cuDNN (SDPA)", "flash (SDPA)", "tilecore")   # the one-tile peers first: they test the new terms


def note_error(what, exc):
    traceback.print_exc()
    RESULTS["errors"].append(f"{what}: {type(exc).__name__}: {str(exc)[:300]}")


def bench(fn) -> float:
    if SMOKE:
        fn()
        return float("nan")
    import triton.testing
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e-3


def kernel_times(fn, calls=3) -> list:
    """[(kernel name, us a call)] of every CUDA kernel fn launches, largest first (torch.profiler)."""
    if SMOKE:
        return []
    from experiments.common.gpu_script import profiled
    rows = []
    for e in profiled(fn, calls).key_averages():
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = getattr(e, "cuda_time_total", 0.0)
        if us and e.count:
            rows.append((e.key[:90], us / calls, e.count / calls))
    return sorted(rows, key=lambda r: -r[1])


def check():
    n = 64 if SMOKE else 512
    for d, causal in ((64, True), (128, False)):   # two of the four: each compiles its own kernels
        if True:
            try:
                gen = torch.Generator(device=DEV).manual_seed(1)
                q, k, v = (torch.randn(1, 2, n, d, generator=gen, device=DEV).to(torch.bfloat16).requires_grad_()
                           for _ in range(3))
                dout = torch.randn(1, 2, n, d, generator=gen, device=DEV).to(torch.bfloat16)
                grads = torch.autograd.grad(tilecore.attention(q, k, v, causal=causal), (q, k, v), dout)
                worst, finite = 0.0, True
                for g, r in zip(grads, reference_grads(q, k, v, dout, causal)):
                    finite &= bool(torch.isfinite(g).all())
                    rms = r.pow(2).mean().sqrt()
                    floor = max(((r - r.to(torch.bfloat16).double()).pow(2).mean().sqrt() / rms).item(), 2 ** -24)
                    worst = max(worst, ((g.double() - r).pow(2).mean().sqrt() / rms).item() / floor)
                RESULTS["checks"].append({"d": d, "causal": causal, "n": n, "grad_err_over_floor": round(worst, 3),
                                          "all_finite": finite, "ok": finite and worst < 3.0})
            except Exception as e:  # noqa: BLE001 - report and go on
                note_error(f"check D{d} causal={causal}", e)


def ceilings():
    if SMOKE:
        RESULTS["ceilings"] = {"copy_bytes_per_s": 3000e9, "matmul_bf16_flops": 750e12}
        return
    x = torch.empty(2 ** 29, dtype=torch.bfloat16, device=DEV)
    y = torch.empty_like(x)
    copy = 2 * x.numel() * 2 / bench(lambda: y.copy_(x))
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    mm = 2 * 8192 ** 3 / bench(lambda: a @ a)
    RESULTS["ceilings"] = {"copy_bytes_per_s": copy, "matmul_bf16_flops": mm}
    del x, y, a


def predicted(b, h, hkv, n, d, causal, gpu, impl):
    t = backward.attention_backward_time(b, h, hkv, n, d, causal, gpu, impl)
    return {"ms": t.time * 1e3, "kernels_us": {name: s * 1e6 for name, s, _ in t.kernels},
            "terms_ms": {k: v * 1e3 for k, v in t.terms.items()}}


def run_case(name, impl, call, b, h, hkv, n, d, causal, gpu):
    q = torch.randn(b, h, n, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, hkv, n, d, device=DEV, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    out = call(q, k, v, causal)
    dout = torch.randn_like(out)
    run = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # noqa: E731
    t = bench(run)
    kernels = kernel_times(run)
    t_sus, mhz, watts = sustained(run, seconds=0.25)
    pred = predicted(b, h, hkv, n, d, causal, gpu, impl)
    row = {"impl": name, "d": d, "causal": causal, "B": b, "H": h, "Hkv": hkv, "N": n, "ms": t * 1e3,
           "tflops": backward.backward_flops(b, h, n, d, causal) / t / 1e12, "mhz": mhz, "watts": watts,
           "kernels": [{"name": k_, "us": us, "launches": c} for k_, us, c in kernels],
           "main_kernel_us": kernels[0][1] if kernels else None, "napkin": pred,
           "napkin_main_us": pred["kernels_us"].get("main"),
           "predicted_over_measured": (t * 1e3) / pred["ms"] if t == t else None}
    RESULTS["cases"].append(row)
    print(f"{name} D{d} N{n} Hkv{hkv} causal={causal}: {row['ms']:.3f} ms (napkin {pred['ms']:.3f}), "
          f"main {row['main_kernel_us']} us (napkin {pred['kernels_us'].get('main', 0):.0f}), {mhz} MHz, {watts} W",
          flush=True)
    del q, k, v, out, dout


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    check()
    try:
        ceilings()
    except Exception as e:  # noqa: BLE001
        note_error("ceilings", e)
    c = RESULTS["ceilings"] or {"copy_bytes_per_s": 3000e9, "matmul_bf16_flops": 750e12}
    mm = c["matmul_bf16_flops"]
    gpu = H100.calibrated(copy_bytes_per_s=c["copy_bytes_per_s"], matmul_flops={"bf16": mm, "fp16": mm},
                          label="this run")
    if SHORT:
        cases = [(name, d, n, causal, H) for name in ORDER for d in (64, 128) for n, causal in SHORT_CASES]
    else:
        cases = [(name, d, n, causal, H) for name in ORDER for d in (64, 128) for n in SEQS for causal in (False, True)]
        cases.insert(len(cases) // 3 * 2, ("flash (SDPA)", 128, 1024 if not SMOKE else 64, True, None))  # GQA 32 / 8
    for name, d, n, causal, hkv in cases:
        if SMOKE and name != "tilecore":
            continue   # SDPA's CPU backends are not the ones timed
        if time.time() - START > BUDGET_S:
            RESULTS["errors"].append(f"{name} D{d} N{n} causal={causal}: skipped (time budget)")
            continue
        impl, call = IMPLS[name]
        if not hkv:   # grouped heads: SDPA's enable_gqa
            def call(q, k, v, causal):
                import torch.nn.functional as F
                from torch.nn.attention import SDPBackend, sdpa_kernel
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        h, kvh = (H, H) if hkv else ((8, 2) if SMOKE else (32, 8))
        b = max(1, TOKENS // n) if hkv else max(1, 2 ** 20 // (h * n)) if not SMOKE else 1
        try:
            run_case(name, impl, call, b, h, kvh, n, d, causal, gpu)
        except Exception as e:  # noqa: BLE001
            note_error(f"{name} D{d} N{n} causal={causal}", e)
        if not SMOKE:
            torch.cuda.empty_cache()
    RESULTS["wall_s"] = time.time() - START
    RESULTS["mode"] = "short" if SHORT else "default"
    name = "napkin_gpu_backward_tiles_short.json" if SHORT else "napkin_gpu_backward_tiles.json"
    (OUT / name).write_text(json.dumps(RESULTS, indent=1))
    f = lambda x, fmt="%.0f": "-" if x is None or x != x else fmt % x  # noqa: E731
    print(f"\ndevice: {RESULTS['device']}; {RESULTS['wall_s']:.0f} s; JSON: {OUT / name}")
    print(f"ceilings: cuBLAS bf16 8192^3 {f(mm / 1e12)} TFLOP/s, copy {f(c['copy_bytes_per_s'] / 1e9)} GB/s")
    for r in RESULTS["checks"]:
        print(f"check tilecore D{r['d']} causal={r['causal']} N{r['n']}: {r['grad_err_over_floor']:.2f}x the floor "
              f"{'ok' if r['ok'] else 'NOT OK'}")
    print(f"{'backward (bf16, B N 65536)':<34} {'ms':>7} {'napkin':>7} {'p/m':>5} {'main us':>8} {'napkin':>7} "
          f"{'MHz':>5} {'W':>4}")
    for r in RESULTS["cases"]:
        label = f"{r['impl']} D{r['d']} N{r['N']}" + (" causal" if r["causal"] else "") + (
            f" Hq{r['H']}/Hkv{r['Hkv']}" if r["Hkv"] != r["H"] else "")
        ratio = r["predicted_over_measured"]   # measured time / predicted: predicted speed over measured
        print(f"{label:<34} {f(r['ms'], '%.3f'):>7} {f(r['napkin']['ms'], '%.3f'):>7} {f(ratio, '%.2f'):>5} "
              f"{f(r['main_kernel_us']):>8} {f(r['napkin_main_us']):>7} {f(r['mhz']):>5} {f(r['watts']):>4}")
    for e in RESULTS["errors"]:
        print("error:", e)


if __name__ == "__main__":
    main()
