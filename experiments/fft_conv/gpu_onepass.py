"""GPU check and timing of the one-pass FFT-convolution kernel in Gluon (gluon_onepass.py, issue 37;
every DFT stage a wgmma, the DFT matrices resident in shared memory), in about a minute:

1. check (one child process a case, all in parallel: each compiles its kernel, filling Triton's cache
   for step 2; one more a N compiles the shipped plan): every candidate of
   configs.GLUON_ONEPASS_CANDIDATES at N = 1024, 2048 against float64 (the reference's float64 FFT, on
   the CPU), bf16 and fp16 u, the convolution and the correlation (the backward's conjugate spectrum,
   bf16), B16 H128 (1024 pairs: more than a persistent grid's programs, so each walks several), outputs started as NaN (the caching allocator
   filled with NaN), error as a multiple of the rounding floor; and B5 H3 bf16 with a NaN in one
   sequence (an odd batch: the last pair's half masked; the NaN's sequence all NaN, every other one
   accurate);
2. time (one child a N, one after the other, only candidates that passed): do_bench medians at B16
   H768 bf16 of torch.fft's convolution (rfft, multiply, irfft in float32: the issue's baseline), a
   copy of the op's bytes (u read, y written, the spectrum read: the bound), the shipped plan
   (fft_conv(u, spectrum)) and each candidate (the launch with the host's spectrum layout, and the
   kernel alone on a prepared spectrum); speedups, % of the copy, the model's bound (model.py).

A case that kills its process (an illegal memory access) is recorded (its candidate is not timed); one
past 60 s is killed. --smoke (CPU, TRITON_INTERPRET=1): Gluon cannot be interpreted, so each Gluon
candidate runs as its tl twin (kernels_mono.py at the same factors: the same stage math), which checks
this script's imports and shapes, not the Gluon kernel.

    PYTHONPATH=. python3 experiments/fft_conv/gpu_onepass.py            # on the GPU (--quick: default)
    TRITON_INTERPRET=1 PYTHONPATH=. python3 experiments/fft_conv/gpu_onepass.py --smoke   # CPU: shapes

Writes $OUT/fft_conv_gpu_onepass.json ($OUT defaults to /tmp/out) and prints a table last.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tilecore import accuracy  # noqa: E402
from tilecore.ops.fft_conv import configs, fft_conv, fft_conv_reference, filter_spectrum, model  # noqa: E402
from tilecore.ops.fft_conv import launch as conv_launch  # noqa: E402
from tilecore.ops.fft_conv.plan import gluon_plan, mono_plan, plan  # noqa: E402

START = time.time()
SMOKE = "--smoke" in sys.argv
DEV = torch.device("cpu" if SMOKE else "cuda")
SIZES = (1024, 2048, 4096)
# no new child past these (s from the start): checks, then timings (the interpreter on 2 cores is slow)
DEADLINE_S = {"check": 900 if SMOKE else 55, "time": 1800 if SMOKE else 85}
# bounds of a passing check (multiples of the rounding floor): bf16 at ~1.05x as the pair kernel; fp16 at
# the float16 products' own ~2.5x (the interpreter truncates bf16: 2.6 there)
# timing probes (kernels_mono.py PROBE: WRONG results, timing only) of one configuration a N: each leaves
# out one part of the chain, so the time it saves is that part's share
PROBE_CONFIGS: dict = {}  # (session 28's mono probes: runs/…run10…)
PROBES = {1: "no square products", 2: "no scale reductions", 4: "no twiddle/spectrum loads", 7: "all three out"}
BOUNDS = {"bfloat16": 2.6 if SMOKE else 1.3, "float16": 4.0}


def say(*args):
    print(f"[{time.time() - START:5.1f} s]", *args, flush=True)


def candidates(n) -> list:
    """configs.GLUON_ONEPASS_CANDIDATES[n] (the smoke run: the first only)."""
    found = configs.GLUON_ONEPASS_CANDIDATES.get(n, [])
    return found[:1] if SMOKE else found


def candidate_plan(config):
    """The Gluon plan of a candidate; the smoke run (CPU): its tl twin, kernels_mono.py at the same factors
    (4096's 128 x 64 as 64 x 128: the twin's first factor is its smaller)."""
    if SMOKE:
        a, b = (config[1], config[0]) if config[0] > 64 else config[:2]
        return mono_plan(a, b, 1, 1, 4, False, True)
    return gluon_plan(*config)


def key(config) -> str:
    return "x".join(str(int(c)) for c in config)


def poison_allocator(nbytes: int = 1 << 30):
    if not SMOKE:
        block = torch.full((nbytes // 2,), float("nan"), dtype=torch.float16, device=DEV)
        del block


def bench(fn) -> float:
    if SMOKE:
        fn()
        return 1.0
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def check(n, config, dtype, conj, B=16, H=128, nan=False) -> dict:
    """One candidate against float64: (B, H, n) u, a filter of n, y started as NaN. ``nan``: B5 H3 (an odd
    batch) with a NaN in u[2, 1]: that sequence must come out all NaN, every other one finite."""
    if SMOKE:
        B, H = 3, 2  # (an odd batch: the last pair's half masked)
    if nan:
        B, H = 5, 3
    g = torch.Generator().manual_seed(n + 7 * conj + 3 * nan)
    u = torch.randn(B, H, n, generator=g).to(dtype)
    if nan:
        u[2, 1, n // 3] = float("nan")
    k = (torch.randn(H, n, generator=g) / math.sqrt(n)).to(dtype)
    spectrum = filter_spectrum(k, n)
    poison_allocator()
    y = torch.full((B, H, n), float("nan"), dtype=dtype, device=DEV)
    conv_launch.launch(candidate_plan(config), u.to(DEV), spectrum.to(DEV), y, conj)
    y = y.cpu()
    # conj: the correlation (the backward's du), else the causal convolution
    ref = _correlation(u.double(), k.double()) if conj else fft_conv_reference(u.double(), k.double())
    name = str(dtype).removeprefix("torch.")
    row = {"n": n, "config": key(config), "dtype": name + (" NaN/odd" if nan else ""), "conj": conj}
    if nan:
        bad = y[2, 1]
        rest = torch.ones(B, H, dtype=torch.bool)
        rest[2, 1] = False
        written = bool(torch.isfinite(y[rest]).all())
        err = accuracy.error_over_floor(y[rest], ref[rest]) if written else float("inf")
        row.update(written=written, nan_all=bool(torch.isnan(bad).all()), err_over_floor=err)
        row["ok"] = written and row["nan_all"] and err <= BOUNDS[name]
        return row
    written = bool(torch.isfinite(y).all())
    err = accuracy.error_over_floor(y, ref) if written else float("inf")
    row.update(written=written, err_over_floor=err, ok=written and err <= BOUNDS[name])
    return row


def _correlation(u64, k64):
    """y[n] = sum_{m >= n} u[m] k[m - n] (float64): the adjoint of the causal convolution, du's form."""
    n = u64.shape[-1]
    size = 2 * n
    spectrum = torch.fft.rfft(u64, n=size) * torch.fft.rfft(k64, n=size).conj()
    return torch.fft.irfft(spectrum, n=size)[..., :n]


def timing_inputs(n, B=16, H=768):
    if SMOKE:
        B, H = 2, 2
    g = torch.Generator(device=DEV).manual_seed(n)
    u = torch.randn(B, H, n, device=DEV, generator=g).to(torch.bfloat16)
    k = (torch.randn(H, n, generator=torch.Generator().manual_seed(n)) / math.sqrt(n)).to(torch.bfloat16)
    return u, filter_spectrum(k, n).to(DEV)  # (on the CPU: cuFFT only in the baseline, last)


def time_n(n, passed: list[str]) -> dict:
    """The baseline, the bound, the shipped plan and the checked candidates at B16 H768 bf16."""
    u, spectrum = timing_inputs(n)
    B, H, _ = u.shape
    row = {"n": n, "B": B, "H": H, "shipped_path": plan(n, DEV, u.dtype).path, "candidates": {}, "errors": []}

    def guard(label, fn):
        try:
            return fn()
        except Exception as err:  # noqa: BLE001
            say(f"[error] N={n} {label}: {type(err).__name__}: {err}")
            row["errors"].append(f"{label}: {type(err).__name__}: {err}"[:400])
            return float("nan")

    nbytes = 2 * u.numel() * u.element_size() + spectrum.numel() * 8
    src = torch.empty(nbytes // 4, dtype=torch.bfloat16, device=DEV)
    dst = torch.empty_like(src)
    row["bytes"] = nbytes
    row["copy_ms"] = guard("copy", lambda: bench(lambda: dst.copy_(src)))
    del src, dst
    row["shipped_ms"] = guard("shipped", lambda: bench(lambda: fft_conv(u, spectrum)))
    y = torch.empty_like(u)
    for config in candidates(n):
        if key(config) not in passed:
            continue
        cplan = candidate_plan(config)
        row["candidates"][key(config)] = guard(key(config), lambda: bench(
            lambda: conv_launch.launch(cplan, u, spectrum, y, False)))
        if not SMOKE:  # the kernel alone: the spectrum already in the tile's layout (filter_spectrum's cost)
            a, b = config[:2]
            tile_spectrum = conv_launch.gluon_spectrum(cplan, spectrum, False)
            descs = conv_launch.gluon_descriptors(u, y, a, b) if cplan.tma else None
            row.setdefault("kernel_only", {})[key(config)] = guard(key(config) + " kernel", lambda: bench(
                lambda: conv_launch.launch_gluon_kernel(cplan, u, tile_spectrum, y, descs)))
        a, b = config[:2]
        row.setdefault("model_ms", {})[key(config)] = model.bound_ms("mono", B, H, n, a, b, 1)
    if n in PROBE_CONFIGS and key(PROBE_CONFIGS[n]) in passed:
        for probe in PROBES:
            probe_plan = dataclasses.replace(mono_plan(*PROBE_CONFIGS[n]), probe=probe)
            row.setdefault("probes", {})[str(probe)] = guard(f"probe {probe}", lambda: bench(
                lambda: conv_launch.launch(probe_plan, u, spectrum, y, False)))

    def torch_fft():  # the baseline: rfft, multiply, irfft in float32 (last: cuFFT after our kernels)
        return torch.fft.irfft(torch.fft.rfft(u.float(), n=2 * n) * spectrum, n=2 * n)[..., :n].to(u.dtype)

    row["torch_fft_ms"] = guard("torch.fft", lambda: bench(torch_fft))
    say("time", json.dumps(row))
    return row


def check_steps(n) -> list:
    """N's check steps: (config, dtype, conj) of each candidate (each its own compile: dtype and conj
    specialize the kernel)."""
    return [(config, dtype, conj, nan) for config in candidates(n)
            for dtype, conj, nan in ((torch.bfloat16, False, False), (torch.float16, False, False),
                                     (torch.bfloat16, True, False), (torch.bfloat16, False, True))]


def child(phase: str, n: int, step: int, part: Path) -> int:
    """check: one step of N (step -1: compile the shipped plan at the timing's specializations); time:
    all of N's timings. The result is written to ``part``."""
    got: dict = {"checks": [], "errors": []}
    if phase == "check" and step < 0:
        u, spectrum = timing_inputs(n, 2, 2) if SMOKE else timing_inputs(n, 16, 16)
        if step == -1:
            fft_conv(u, spectrum)
        else:  # a probe's compile (step -10 - probe)
            probe_plan = dataclasses.replace(mono_plan(*PROBE_CONFIGS[n]), probe=-10 - step)
            conv_launch.launch(probe_plan, u, spectrum, torch.empty_like(u), False)
        if not SMOKE:
            torch.cuda.synchronize()
    elif phase == "check":
        config, dtype, conj, nan = check_steps(n)[step]
        label = f"N={n} {key(config)} {dtype} conj={conj} nan={nan}"
        got["case"] = label
        part.write_text(json.dumps(got))  # (a child that dies leaves its case behind)
        try:
            row = check(n, config, dtype, conj, nan=nan)
            got["checks"].append(row)
            say("check", json.dumps(row))
        except Exception as err:  # noqa: BLE001
            say(f"[error] {label}: {type(err).__name__}: {err}")
            traceback.print_exc(limit=2)
            got["errors"].append({"case": label, "error": f"{type(err).__name__}: {err}"[:400]})
    else:
        got["time"] = time_n(n, json.loads(os.environ.get("FFT_ONEPASS_PASSED", "[]")))
    part.write_text(json.dumps(got))
    return 0


def run_children(phase: str, tasks: list, passed: dict, parallel: int) -> list[dict]:
    """One child a task (n, step), ``parallel`` at a time; each one's result (or the error that ended it)."""
    tmp = Path(tempfile.mkdtemp())
    results, queue, running = [], list(tasks), {}
    while queue or running:
        while queue and len(running) < parallel:
            n, step = queue.pop(0)
            part = tmp / f"{phase}_{n}_{step}.json"
            if time.time() - START > DEADLINE_S[phase]:
                results.append({"errors": [{"case": f"{phase} N={n} step {step}", "error": "skipped: past the deadline"}]})
                continue
            env = dict(os.environ, FFT_ONEPASS_PASSED=json.dumps(passed.get(n, [])))
            args = [sys.executable, __file__, "--child", phase, str(n), str(step), str(part)] + ["--smoke"] * SMOKE
            running[(n, step)] = (subprocess.Popen(args, env=env), part, time.time())
        time.sleep(0.2)
        for task, (proc, part, began) in list(running.items()):
            rc = proc.poll()
            if rc is None and time.time() - began < (600 if SMOKE else 60):
                continue
            if rc is None:
                proc.kill()
                rc = "killed after 60 s"
            del running[task]
            got = json.loads(part.read_text()) if part.exists() else {}
            got.setdefault("errors", [])
            if rc != 0:
                got["errors"].append({"case": got.get("case", f"{phase} N={task[0]} step {task[1]}"),
                                      "error": f"child rc {rc} (an illegal memory access kills it)"})
                say(f"[error] {phase} {task}: child rc {rc}")
            results.append(got)
    return results


def main() -> int:
    if "--child" in sys.argv:
        i = sys.argv.index("--child")
        return child(sys.argv[i + 1], int(sys.argv[i + 2]), int(sys.argv[i + 3]), Path(sys.argv[i + 4]))
    out_dir = Path(os.environ.get("OUT", "/tmp/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict = {"checks": [], "time": [], "errors": []}
    try:
        from experiments.common.meta import meta
        results["meta"] = meta()
    except Exception as err:  # noqa: BLE001
        results["meta"] = {"error": str(err)}
    # every check and warm-up compile in its own process, all at once (compiles dominate: 16 cores)
    tasks = [(n, -1) for n in SIZES] + [(n, i) for n in SIZES for i in range(len(check_steps(n)))]
    tasks += [(n, -10 - probe) for n in PROBE_CONFIGS for probe in PROBES]
    for got in run_children("check", tasks, {}, parallel=2 if SMOKE else 16):
        results["checks"] += got.get("checks", [])
        results["errors"] += got.get("errors", [])
    results["checks"].sort(key=lambda r: (r["n"], r["config"], r["dtype"], r["conj"]))
    by_config: dict = {}
    for row in results["checks"]:
        by_config.setdefault((row["n"], row["config"]), []).append(row["ok"])
    passed = {n: [c for (m, c), oks in by_config.items() if m == n and len(oks) == 4 and all(oks)] for n in SIZES}
    # the timings one N after the other (the kernels come from Triton's cache)
    for got in run_children("time", [(n, 0) for n in SIZES], passed, parallel=1):
        results["errors"] += got.get("errors", [])
        if "time" in got:
            results["time"].append(got["time"])
    results["wall_s"] = time.time() - START
    path = out_dir / "fft_conv_gpu_onepass.json"
    path.write_text(json.dumps(results, indent=1, default=str))

    print(f"\nchecks (error / rounding floor; ok: bf16 <= {BOUNDS['bfloat16']}, fp16 <= {BOUNDS['float16']}, "
          "every element written)")
    for row in results["checks"]:
        print(f"  N {row['n']:>5} {row['config']:>10} {row['dtype']:>16} conj={row['conj']!s:5} "
              f"{row['err_over_floor']:7.3f}  {'ok' if row['ok'] else 'FAIL'}")
    print(f"\ntime at B16 H768 bf16 ({'smoke: not timed' if SMOKE else 'do_bench medians, ms'}); "
          "speedup = torch.fft / ms; % copy = copy of u, y, spectrum / ms")
    print(f"{'N':>6} {'what':>22} {'ms':>8} {'speedup':>8} {'% copy':>7} {'model ms':>9}")
    for row in results["time"]:
        base, copy = row.get("torch_fft_ms", math.nan), row.get("copy_ms", math.nan)
        print(f"{row['n']:>6} {'torch.fft':>22} {base:8.4f}")
        print(f"{row['n']:>6} {'copy (bound)':>22} {copy:8.4f}")
        cases = [(f"shipped ({row['shipped_path']})", row.get("shipped_ms", math.nan), None)]
        cases += [(f"gluon {c}", ms, row.get("model_ms", {}).get(c)) for c, ms in row["candidates"].items()]
        cases += [(f"gluon {c} kernel", ms, None) for c, ms in row.get("kernel_only", {}).items()]
        for what, ms, bound in cases:
            print(f"{row['n']:>6} {what:>22} {ms:8.4f} {base / ms:8.2f} {100 * copy / ms:7.1f} "
                  f"{'' if bound is None else f'{bound:9.4f}'}")
        for probe, ms in row.get("probes", {}).items():
            print(f"{row['n']:>6} {'probe ' + probe:>22} {ms:8.4f}   (mono {key(PROBE_CONFIGS[row['n']])}, "
                  f"{PROBES[int(probe)]}: wrong output, timing only)")
    for err in results["errors"]:
        print("error:", err)
    print(f"wall {results['wall_s']:.0f} s; JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
