"""GPU check and timing of the one-pass FFT-convolution kernel in Gluon (gluon_onepass.py, issue 37;
every DFT stage a wgmma, the DFT matrices resident in shared memory), in about a minute (session 31: the
shipped plans re-checked, KPRE candidates (the spectrum requested before a block's stage 1), and the shipped
paths at 8192 / 16384 checked through the op and timed against torch.fft; session 30: the op's keyed launch,
its host time (--host), timing probes of what binds):

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

3. the op (each N's timing child, first): fft_conv(u, k) through its keyed launch (TmaOperand, the launch
   parts kept a key) on B16 H16 bf16 with NaN-poisoned memory, three calls with the same bits
   (call 1 plans, 2 is the key's first keyed launch, 3 the cached one), against float64; and
   its backward's du (the conjugate spectrum through the same kernel) against float64;
4. host time (one child, after the checks): eager fft_conv(u, filter) at experiments/common/host_time.py's shapes (B2
   H64 N1024 bf16, a float32 filter) against torch's code and against a replica of the op's host path
   before session 30 (fresh TensorDescriptors each call, the plain specializing launch); then with
   tiles.launch's kept TMA encodings (CACHE_TMA_DESCRIPTORS, off by default); same bits on calls 1..10.
PROBES: the shipped tuples of PROBE_CONFIGS with parts of their chain left out (WRONG results: timing only).
Session 32: the op's filter form (fft_conv(u, k): k's rfft a call) timed beside the precomputed spectrum's
(fft_conv(u, filter_spectrum(k, n)), the "shipped" row), the spectrum form's gradients (du, and dk through the
spectrum: op.spectrum_grad + rfft's backward) checked against float64 in the op check, and 4096's probes again.
Session 33 (job hf_s33: --dk --sizes 1024,2048,4096,8192,16384): 4096's CSCALE candidates (one spectrum-product scale a
pair from the channel's spectrum: no reduction a chunk, no rescale; strided and on a CONTIG walk, and CONTIG alone),
the dk launches after their shared host tail (launch._dk_spectrum_sum) and the op's kernel dk (a 16-bit filter
requiring grad: op.py's backward through its chosen dk launch) checked against float64; no probes (PROBE_CONFIGS
empty); the tl dk candidates only where no Gluon dk ships. Call 4 (runs/onepass_s33_run4_session33_h100.txt): CONTIG
4.90x (on), CSCALE no gain, 2048's XSMEM dk 2.67x torch.fft's (on). Job hf_s33b: the flips re-checked and re-timed
(4096 CONTIG against session 32's strided walk in the same run), TWEARLY (the chunk's twiddles computed under its
wgmmas) at 4096 strided / CONTIG / with CSCALE, CSCALE in the whole-tile kernel at 1024; the training step with the
shipped dk, torch.fft's dk and the best candidate's, the shipped one twice (the host-bound steps' spread). Call 6:
CONTIG and the dk confirmed, TWEARLY / LAG / CSCALE no gain (removed). Job hf_s33c (--sizes 4096): CONTIG 2 (a program's
two walkers interleaved on one contiguous block: both on one channel's pairs at once) against CONTIG and strided.

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
from tilecore import dispatch  # noqa: E402
from tilecore.ops.fft_conv import configs, fft_conv, fft_conv_reference, filter_spectrum, model  # noqa: E402
from tilecore.ops.fft_conv import op as conv_op  # noqa: E402
from tilecore.ops.fft_conv import launch as conv_launch  # noqa: E402
from tilecore.ops.fft_conv.plan import gluon_plan, mono_plan, plan  # noqa: E402
from tilecore.tiles import launch as tiles_launch  # noqa: E402

START = time.time()
SMOKE = "--smoke" in sys.argv
DEV = torch.device("cpu" if SMOKE else "cuda")
SIZES = (1024, 2048, 4096, 8192, 16384)  # (8192, 16384: no Gluon candidate; the shipped path checked and timed)
if "--sizes" in sys.argv:  # e.g. --sizes 1024 (a quicker smoke run)
    SIZES = tuple(int(n) for n in sys.argv[sys.argv.index("--sizes") + 1].split(","))
# no new child past these (s from the start): checks, then timings (the interpreter on 2 cores is slow)
DEADLINE_S = {"check": 900 if SMOKE else 75, "host": 1800 if SMOKE else 85, "time": 1800 if SMOKE else 135}
HOST = "--host" in sys.argv  # the host-time phase (session 30's figure; off unless asked)
DK = "--dk" in sys.argv  # session 32: the filter-gradient kernel's candidates (configs.DK_CANDIDATES) checked and timed
# bounds of a passing check (multiples of the rounding floor): bf16 at ~1.05x as the pair kernel; fp16 at
# the float16 products' own ~2.5x (the interpreter truncates bf16: 2.6 there)
# timing probes (kernels_mono.py PROBE: WRONG results, timing only) of one configuration a N: each leaves
# out one part of the chain, so the time it saves is that part's share
# (session 28's mono probes: runs/…run10…; session 30: the Gluon kernels' shipped tuples, gluon_onepass.Stages)
# (run 9 of session 30 timed them at 1024 and 4096: the loads bind; PROBE_CONFIGS = {1024: ..., 4096: ...} again
# to re-time)
PROBE_CONFIGS: dict = {}  # (session 32: {4096: configs.GLUON_ONEPASS[4096]}, what binds 4096's chunked chain; its figures
# are in notes/fft_conv: session 33 spends the time on the candidates)
PROBES = {1: "no square products", 2: "no spectrum scale reduction", 4: "no twiddle/spectrum loads",
          7: "all three out"}
BOUNDS = {"bfloat16": 2.6 if SMOKE else 1.3, "float16": 4.0}
FILTER = False  # timing_inputs: the filter too (time_n's filter form)


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


def probe_plan(config, probe: int):
    """A probe of a candidate: its plan with ``probe`` (WRONG results; the smoke run: its tl twin's)."""
    return dataclasses.replace(candidate_plan(config), probe=probe)


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


def dk_inputs(n, B, H, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, n, generator=g).to(torch.bfloat16), torch.randn(B, H, n, generator=g).to(torch.bfloat16)


def torch_dk(u, dy, n, filter_len):
    """dk as op.py's backward computes it without the kernel (torch.fft in float32)."""
    cross = (torch.fft.rfft(dy.float(), n=2 * n) * torch.conj_physical(torch.fft.rfft(u.float(), n=2 * n))).sum(0)
    return torch.fft.irfft(cross, n=2 * n)[:, :filter_len]


def dk_candidates(n) -> list:
    """(label, the launch, config) of N's filter-gradient candidates: the tl kernel's (configs.DK_CANDIDATES,
    launch.dk_pair) and the Gluon kernel's (configs.DK_GLUON_CANDIDATES, launch.dk_gluon; session 32)."""
    if not DK:
        return []
    out = [] if n in configs.DK_GLUON and not SMOKE else [  # (session 33: the tl kernel only where no Gluon dk ships)
        ("dk " + key(c), conv_launch.dk_pair, c) for c in configs.DK_CANDIDATES.get(n, [])]
    if not SMOKE:  # (Gluon cannot be interpreted)
        out += [("dkg " + key(c), conv_launch.dk_gluon, c) for c in configs.DK_GLUON_CANDIDATES.get(n, [])]
    return out


def check_dk(n, label, fn, config, B=5, H=4) -> dict:
    """The filter-gradient kernel (kernels_pair.fft_conv_dk_pair_kernel through launch.dk_pair; session 26, never
    run on a GPU before) at one configuration against float64: bf16 u and dy, an odd batch, a filter of n - 5; the
    float32 dk cast to bf16 (the filter's dtype) against the float64 dk, as a multiple of bf16's floor."""
    u, dy = dk_inputs(n, B, H, n + 3)
    want = torch_dk(u.double(), dy.double(), n, n - 5)
    poison_allocator()
    got = fn(tuple(config), u.to(DEV), dy.to(DEV), n - 5).cpu()
    written = bool(torch.isfinite(got).all())
    err = accuracy.error_over_floor(got.to(torch.bfloat16), want) if written else float("inf")
    row = {"n": n, "config": label, "dtype": "dk-kernel bfloat16", "conj": False, "written": written,
           "err_over_floor": err, "ok": written and err <= BOUNDS["bfloat16"]}
    say("check", json.dumps(row))
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
    if FILTER:  # (the filter itself too: the op's filter form, its rfft a call)
        return u, filter_spectrum(k, n).to(DEV), k.to(DEV)
    return u, filter_spectrum(k, n).to(DEV)  # (on the CPU: cuFFT only in the baseline, last)


def op_check(n, B=16, H=16) -> list[dict]:
    """The op's keyed path at N: fft_conv(u, k) three times (plan + compile, the key's first keyed launch, the
    cached launch) on NaN-poisoned memory, the same bits each call, against float64; and du of its
    backward (the correlation through the same kernel, keyed too) against float64. B16 H16: the
    specializations the check phase compiled (no compile here); the odd batch is the NaN/odd check's."""
    if SMOKE:
        B, H = 3, 2
    g = torch.Generator().manual_seed(n + 11)
    u = torch.randn(B, H, n, generator=g).to(torch.bfloat16)
    k = (torch.randn(H, n, generator=g) / math.sqrt(n)).to(torch.bfloat16)
    dy = torch.randn(B, H, n, generator=g).to(torch.bfloat16)
    ref = fft_conv_reference(u.double(), k.double())
    ref_du = _correlation(dy.double(), k.double())
    ud, kd, dyd = u.to(DEV), k.to(DEV), dy.to(DEV)
    path = plan(n, DEV, u.dtype).path
    rows, outs = [], []
    for call in range(3):
        poison_allocator()
        outs.append(fft_conv(ud, kd).cpu())
    same = all(torch.equal(outs[0], o) for o in outs[1:])
    written = bool(torch.isfinite(outs[0]).all())
    err = accuracy.error_over_floor(outs[0], ref) if written else float("inf")
    rows.append({"n": n, "config": f"op ({path}) x3", "dtype": "bfloat16 op", "conj": False, "written": written,
                 "same_bits": same, "err_over_floor": err, "ok": written and same and err <= BOUNDS["bfloat16"]})
    # session 32: the spectrum form's plain eager calls (the third through _GluonConv with the spectrum as it is)
    sd = filter_spectrum(kd, n)
    outs_s = []
    for call in range(3):
        poison_allocator()
        outs_s.append(fft_conv(ud, sd).cpu())
    same = all(torch.equal(outs_s[0], o) for o in outs_s[1:]) and torch.equal(outs_s[0], outs[0])
    written = bool(torch.isfinite(outs_s[0]).all())
    err = accuracy.error_over_floor(outs_s[0], ref) if written else float("inf")
    rows.append({"n": n, "config": f"op ({path}) spectrum x3", "dtype": "bfloat16 op", "conj": False, "written": written,
                 "same_bits": same, "err_over_floor": err, "ok": written and same and err <= BOUNDS["bfloat16"]})
    ug = ud.clone().requires_grad_()
    dus = []
    for call in range(2):
        poison_allocator()
        ug.grad = None
        fft_conv(ug, kd).backward(dyd)
        dus.append(ug.grad.cpu())
    written = bool(torch.isfinite(dus[0]).all())
    err = accuracy.error_over_floor(dus[0], ref_du) if written else float("inf")
    same = torch.equal(dus[0], dus[1])
    rows.append({"n": n, "config": f"op ({path}) du x2", "dtype": "bfloat16 op", "conj": True, "written": written,
                 "same_bits": same, "err_over_floor": err, "ok": written and same and err <= BOUNDS["bfloat16"]})
    # session 33: the filter form with a bf16 k requiring grad: dk through the backward's chosen launch (the Gluon dk
    # kernel at 1024, the tl one at 4096, torch.fft elsewhere), cast to k's bf16, against float64
    kg16 = kd.clone().requires_grad_()
    poison_allocator()
    dk16 = torch.autograd.grad(fft_conv(ud, kg16), kg16, dyd)[0].cpu()
    u64, k64 = u.double(), k.double().requires_grad_()
    ref_dk16 = torch.autograd.grad(fft_conv_reference(u64, k64), k64, dy.double())[0]
    written = bool(torch.isfinite(dk16).all())
    err = accuracy.error_over_floor(dk16, ref_dk16) if written else float("inf")
    rows.append({"n": n, "config": f"op ({path}) dk bf16 filter", "dtype": "bfloat16 op", "conj": False,
                 "written": written, "err_over_floor": err, "ok": written and err <= BOUNDS["bfloat16"]})
    # session 32: the spectrum form with k requiring grad: fft_conv(u, filter_spectrum(k)) backward gives du (the
    # kernel's correlation) and dk (the spectrum's gradient through rfft's backward) against float64
    kg = kd.float().requires_grad_()
    ug = ud.clone().requires_grad_()
    poison_allocator()
    y = fft_conv(ug, filter_spectrum(kg, n))
    du, dk = torch.autograd.grad(y, (ug, kg), dyd)
    u64, k64 = u.double().requires_grad_(), k.double().requires_grad_()
    ref_du2, ref_dk = torch.autograd.grad(fft_conv_reference(u64, k64), (u64, k64), dy.double())
    for what, got, want, bound in (("y", y.detach().cpu(), ref, BOUNDS["bfloat16"]),
                                   ("du", du.cpu(), ref_du2, BOUNDS["bfloat16"]), ("dk", dk.cpu(), ref_dk, None)):
        written = bool(torch.isfinite(got).all())
        if bound is None:  # (float32 dk: relative RMS error, float32's accuracy expected)
            err = accuracy.rel_rms(got, want) if written else float("inf")
            ok = written and err <= 1e-5
        else:
            err = accuracy.error_over_floor(got, want) if written else float("inf")
            ok = written and err <= bound
        rows.append({"n": n, "config": f"op ({path}) spectrum grad {what}", "dtype": "bfloat16 op" if bound else
                     "rel_rms dk-through-spectrum", "conj": what == "du", "written": written, "err_over_floor": err, "ok": ok})
    for row in rows:
        say("check", json.dumps(row))
    return rows


_OLD_CHECKED, _OLD_PLANS = tiles_launch.LRU(16), tiles_launch.LRU(16)  # (the replica's: as op.py's)


def _old_host_path(u, k):
    """fft_conv(u, k) as its host path ran before session 30 (a replica: the checks and the plan found by
    the call's signature, the filter's rfft, then the Gluon launch with fresh TMA TensorDescriptors each
    call and the plain launch, which specializes every argument): the host-time baseline."""
    key = tiles_launch.signature(u, k)
    _OLD_CHECKED.memo(key, lambda: conv_op.check(u, k) or True)
    dispatch.plain_eager(u, k)
    spectrum = filter_spectrum(k, u.shape[-1]).resolve_conj()
    y = conv_launch.output(u.shape, u.dtype, u.device)
    cplan = _OLD_PLANS.memo(key, lambda: plan(u.shape[-1], u.device, u.dtype))
    if cplan.path != "gluon":
        raise ValueError(f"the old host path's replica is the Gluon launch's; the plan here is {cplan.path}")
    B, H, N = u.shape
    a, b = cplan.n1, cplan.n2
    use_tma = cplan.tma and tiles_launch.tma_describable(u) and tiles_launch.tma_describable(y)
    descs = conv_launch.gluon_descriptors(u, y, a, b) if use_tma else (None, None)
    kspec = conv_launch.gluon_spectrum(cplan, spectrum, False)
    ops = conv_launch.mono_operands(a, b, 1, u.device)
    options = dict(RFFT=cplan.rfft, CONJ=False)
    common = (u, kspec, y, ops["FARE"], ops["FAIM"], ops["FBRE"], ops["FBIM"], ops["TFRE"], ops["TFIM"], B, H,
              u.stride(0), u.stride(1), y.stride(0), y.stride(1), kspec.stride(0))
    grid = (conv_launch.gluon_grid(cplan, B, H, u.device),)
    if cplan.chunk:
        conv_launch.CONV_GLUON_CHUNKED[grid](*common, A=a, B=b, CHUNK=cplan.chunk, u_desc=descs[0], y_desc=descs[1],
                                              TMA=use_tma, WARPGROUPS=cplan.warpgroups, WORKER_REGS=248, num_warps=4,
                                              **options)
    else:
        conv_launch.CONV_GLUON[grid](*common, A=a, B=b, ASYNC=cplan.async_mma, u_desc=descs[0], y_desc=descs[1],
                                      TMA=use_tma, num_warps=cplan.num_warps, **options)
    return y


def per_call_us(fn, calls):
    """Host time a call: back-to-back calls whose GPU work is shorter than the host's (host_time.py's)."""
    for _ in range(min(100, calls)):
        fn()
    if not SMOKE:
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    if not SMOKE:
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def host_time(calls=2000) -> dict:
    """fft_conv's eager host time at host_time.py's shapes: the op now, the replica of its path before
    session 30, torch's code; then the op with tiles.launch's kept TMA encodings; same bits on calls 1..10."""
    if SMOKE:
        calls = 3
    bf = dict(device=DEV, dtype=torch.bfloat16)
    H = 2 if SMOKE else 64  # (the smoke run's kernels are interpreted)
    u = torch.randn(2, H, 1024, **bf)
    kf = torch.randn(H, 1024, device=DEV)
    ug, kfg = u.clone().requires_grad_(), kf.clone().requires_grad_()
    n = 2 * u.shape[-1]

    def fft_torch():
        return torch.fft.irfft(torch.fft.rfft(u.float(), n) * torch.fft.rfft(kf, n), n)[..., :u.shape[-1]].to(u.dtype)

    def fft_torch_grad():
        return torch.fft.irfft(torch.fft.rfft(ug.float(), n) * torch.fft.rfft(kfg, n), n)[..., :ug.shape[-1]].to(ug.dtype)

    row = {"path": plan(1024, DEV, u.dtype).path, "calls": calls, "errors": []}

    def guard(label, fn):
        try:
            return fn()
        except Exception as err:  # noqa: BLE001
            say(f"[error] host {label}: {type(err).__name__}: {err}")
            row["errors"].append(f"{label}: {type(err).__name__}: {err}"[:400])
            return None

    first = guard("first call", lambda: fft_conv(u, kf).clone())
    row["same_bits_1_10"] = guard("bits", lambda: all(torch.equal(first, fft_conv(u, kf)) for _ in range(9)))
    row["old_path_same_bits"] = guard("old bits", lambda: torch.equal(first, _old_host_path(u, kf)))
    row["torch_us"] = guard("torch", lambda: per_call_us(fft_torch, calls))
    row["fft_conv_us"] = guard("fft_conv", lambda: per_call_us(lambda: fft_conv(u, kf), calls))
    row["old_path_us"] = guard("old path", lambda: per_call_us(lambda: _old_host_path(u, kf), calls))
    row["torch_grad_us"] = guard("torch grad", lambda: per_call_us(fft_torch_grad, calls))
    row["fft_conv_grad_us"] = guard("fft_conv grad", lambda: per_call_us(lambda: fft_conv(ug, kfg), calls))
    # the kept TMA encodings (tiles.launch, off by default): made at a key's first keyed launch, so the keys go
    tiles_launch.cache_tma_descriptors(True)
    for kernel in (conv_launch.CONV_GLUON, conv_launch.CONV_GLUON_CHUNKED):
        kernel.keyed.clear()
    row["kept_same_bits_1_10"] = guard("kept bits", lambda: all(torch.equal(first, fft_conv(u, kf)) for _ in range(10)))
    row["fft_conv_kept_us"] = guard("fft_conv kept", lambda: per_call_us(lambda: fft_conv(u, kf), calls))
    tiles_launch.cache_tma_descriptors(False)
    say("host", json.dumps(row))
    return row


def time_n(n, passed: list[str]) -> dict:
    """The baseline, the bound, the shipped plan and the checked candidates at B16 H768 bf16."""
    global FILTER
    FILTER = True
    u, spectrum, k = timing_inputs(n)
    FILTER = False
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
    # session 32: the filter form (the op takes rfft(k) each call) against the precomputed spectrum's (shipped_ms)
    row["filter_ms"] = guard("filter form", lambda: bench(lambda: fft_conv(u, k)))
    y = torch.empty_like(u)
    for config in candidates(n):
        if key(config) not in passed:
            continue
        cplan = candidate_plan(config)
        row["candidates"][key(config)] = guard(key(config), lambda: bench(
            lambda: conv_launch.launch(cplan, u, spectrum, y, False)))
        if not SMOKE and config == configs.GLUON_ONEPASS.get(n):  # the kernel alone (the shipped tuple)
            tile_spectrum = conv_launch.gluon_spectrum(cplan, spectrum, False)
            row.setdefault("kernel_only", {})[key(config)] = guard(key(config) + " kernel", lambda: bench(
                lambda: conv_launch.launch_gluon_kernel(cplan, u, tile_spectrum, y)))
        a, b = config[:2]
        row.setdefault("model_ms", {})[key(config)] = model.bound_ms("mono", B, H, n, a, b, 1)
    if n in PROBE_CONFIGS and not SMOKE:
        for probe in PROBES:
            pplan = probe_plan(PROBE_CONFIGS[n], probe)
            row.setdefault("probes", {})[str(probe)] = guard(f"probe {probe}", lambda: bench(
                lambda: conv_launch.launch(pplan, u, spectrum, y, False)))

    dks = [d for d in dk_candidates(n) if d[0] in passed]
    if dks:  # session 32: the filter-gradient kernels against torch.fft's dk (op.py's backward without them), B16 H768
        ud, dyd = (t.to(DEV) for t in dk_inputs(n, B, H, n))
        for label, fn, config in dks:
            row.setdefault("dk", {})[label] = guard(label, lambda: bench(lambda: fn(tuple(config), ud, dyd, n)))
        row.setdefault("dk", {})["dk torch.fft"] = guard("torch dk", lambda: bench(lambda: torch_dk(ud, dyd, n, n)))
        # the training step: fft_conv(u, k) forward + backward (du through the kernel; dk through torch.fft as shipped,
        # or through the fastest dk candidate: configs.DK_CONFIGS patched in this process) against torch.fft's autograd
        kf = (torch.randn(H, n, device=DEV) / math.sqrt(n)).to(torch.bfloat16).requires_grad_()
        uf = ud.clone().requires_grad_()
        label, fn, best = min(dks, key=lambda d: row["dk"].get(d[0], math.inf))
        tables = (configs.DK_GLUON, configs.DK_CONFIGS)
        shipped = [t.get(n) for t in tables]

        def step_with(gluon, tl):  # (session 33: the shipped tables restored after, not popped)
            for t, c in zip(tables, (gluon, tl)):
                if c is None:
                    t.pop(n, None)
                else:
                    t[n] = tuple(c)
            try:
                return bench(lambda: torch.autograd.grad(fft_conv(uf, kf), (uf, kf), dyd))
            finally:
                for t, c in zip(tables, shipped):
                    if c is None:
                        t.pop(n, None)
                    else:
                        t[n] = c

        row["step_ms"] = guard("step", lambda: step_with(*shipped))  # (the shipped dk: a kernel's where it ships)
        row["step_torch_dk_ms"] = guard("step torch dk", lambda: step_with(None, None))
        row["step_dk_kernel_ms"] = guard("step dk kernel", lambda: step_with(
            *((best, None) if label.startswith("dkg") else (None, best))))
        row["step_again_ms"] = guard("step again", lambda: step_with(*shipped))  # (the host-bound steps' spread)
        row["step_dk_config"] = label

        def torch_step():
            y = torch.fft.irfft(torch.fft.rfft(uf.float(), n=2 * n) * torch.fft.rfft(kf.float(), n=2 * n),
                                n=2 * n)[..., :n].to(uf.dtype)
            return torch.autograd.grad(y, (uf, kf), dyd)

        row["torch_step_ms"] = guard("torch step", lambda: bench(torch_step))
        del ud, dyd, uf, kf

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
        if step == -1:  # (and the backward's correlation: the op check's du compiles nothing in the time phase)
            ug = u.clone().requires_grad_()
            fft_conv(ug, spectrum).backward(torch.randn_like(u))
        elif not SMOKE:  # a probe's compile (step -10 - probe)
            conv_launch.launch(probe_plan(PROBE_CONFIGS[n], -10 - step), u, spectrum, torch.empty_like(u), False)
        if not SMOKE:
            torch.cuda.synchronize()
    elif phase == "check":
        if step >= 1000:  # (a dk candidate: step 1000 + its index)
            label, fn, config = dk_candidates(n)[step - 1000]
            got["case"] = f"N={n} {label}"
            part.write_text(json.dumps(got))
            got["checks"].append(check_dk(n, label, fn, config))
            if not SMOKE:  # (the timing's specialization compiled here: B16 H768's, as B16 H16's)
                fn(tuple(config), *(t.to(DEV) for t in dk_inputs(n, 16, 16, 0)), n)
                torch.cuda.synchronize()
            part.write_text(json.dumps(got))
            return 0
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
    elif phase == "host":
        got["host"] = host_time()
    else:
        try:  # the op's keyed path first (its rows go with the checks)
            got["checks"] += op_check(n)
        except Exception as err:  # noqa: BLE001
            say(f"[error] op check N={n}: {type(err).__name__}: {err}")
            got["errors"].append({"case": f"op check N={n}", "error": f"{type(err).__name__}: {err}"[:400]})
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
            args += ["--sizes", ",".join(map(str, SIZES))] + ["--dk"] * DK
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
    tasks += [(n, -10 - probe) for n in PROBE_CONFIGS if n in SIZES and not SMOKE for probe in PROBES]
    tasks += [(n, 1000 + i) for n in SIZES for i in range(len(dk_candidates(n)))]
    for got in run_children("check", tasks, {}, parallel=2 if SMOKE else 16):
        results["checks"] += got.get("checks", [])
        results["errors"] += got.get("errors", [])
    results["checks"].sort(key=lambda r: (r["n"], r["config"], r["dtype"], r["conj"]))
    by_config: dict = {}
    for row in results["checks"]:
        by_config.setdefault((row["n"], row["config"]), []).append(row["ok"])
    passed = {n: [c for (m, c), oks in by_config.items() if m == n and all(oks) and (len(oks) == 4 or c.startswith("dk"))]
              for n in SIZES}
    # the timings one N after the other (the kernels come from Triton's cache)
    for got in run_children("host", [(1024, 0)] if HOST else [], passed, parallel=1):
        results["errors"] += got.get("errors", [])
        if "host" in got:
            results["host"] = got["host"]
    for got in run_children("time", [(n, 0) for n in SIZES], passed, parallel=1):
        results["errors"] += got.get("errors", [])
        results["checks"] += got.get("checks", [])
        if "time" in got:
            results["time"].append(got["time"])
    results["wall_s"] = time.time() - START
    path = out_dir / "fft_conv_gpu_onepass.json"
    path.write_text(json.dumps(results, indent=1, default=str))

    print(f"\nchecks (error / rounding floor; ok: bf16 <= {BOUNDS['bfloat16']}, fp16 <= {BOUNDS['float16']}, "
          "every element written; the full rows in the JSON): worst a N and kind, every failure")
    for n in SIZES:
        rows = [r for r in results["checks"] if r["n"] == n]
        if not rows:
            continue
        worst = {}
        for r in rows:
            kind = ("op" if "op" in r["dtype"] else r["dtype"].split()[0]) + (" conj" if r["conj"] else "")
            worst[kind] = max(worst.get(kind, 0.0), r["err_over_floor"])
        same = all(r.get("same_bits", True) for r in rows)
        print(f"  N {n:>5}: {sum(r['ok'] for r in rows)}/{len(rows)} ok, op same bits {same}; worst "
              + ", ".join(f"{k} {v:.3f}" for k, v in sorted(worst.items())))
        for r in rows:
            if not r["ok"]:
                print(f"  FAIL N {n} {r['config']} {r['dtype']} conj={r['conj']} {r['err_over_floor']:.3f} "
                      f"written={r.get('written')} nan_all={r.get('nan_all')} same_bits={r.get('same_bits')}")
    print(f"\ntime at B16 H768 bf16 ({'smoke: not timed' if SMOKE else 'do_bench medians, ms'}); "
          "speedup = torch.fft / ms; % copy = copy of u, y, spectrum / ms")
    print(f"{'N':>6} {'what':>30} {'ms':>8} {'speedup':>8} {'% copy':>7} {'model ms':>9}")
    for row in results["time"]:
        base, copy = row.get("torch_fft_ms", math.nan), row.get("copy_ms", math.nan)
        print(f"{row['n']:>6} {'torch.fft / copy':>30} {base:8.4f} {copy:8.4f}")
        cases = [(f"shipped ({row['shipped_path']})", row.get("shipped_ms", math.nan), None),
                 ("shipped, filter form (rfft a call)", row.get("filter_ms", math.nan), None)]
        cases += [(f"g {c}", ms, row.get("model_ms", {}).get(c)) for c, ms in row["candidates"].items()]
        cases += [(f"g {c} kernel", ms, None) for c, ms in row.get("kernel_only", {}).items()]
        for what, ms, bound in cases:
            print(f"{row['n']:>6} {what:>30} {ms:8.4f} {base / ms:8.2f} {100 * copy / ms:7.1f} "
                  f"{'' if bound is None else f'{bound:9.4f}'}")
        if "step_ms" in row:
            print(f"{row['n']:>6} {'step fwd+bwd, shipped dk':>30} {row['step_ms']:8.4f}   again "
                  f"{row.get('step_again_ms', math.nan):.4f}; torch.fft's autograd {row.get('torch_step_ms', math.nan):.4f}; "
                  f"dk torch.fft {row.get('step_torch_dk_ms', math.nan):.4f}; dk by {row['step_dk_config']}: "
                  f"{row.get('step_dk_kernel_ms', math.nan):.4f}")
        for c, ms in row.get("dk", {}).items():
            print(f"{row['n']:>6} {c:>30} {ms:8.4f}   (the filter's gradient alone, B16 H768; torch: op.py's "
                  f"torch.fft dk)")
        for probe, ms in row.get("probes", {}).items():
            print(f"{row['n']:>6} {'probe ' + probe:>30} {ms:8.4f}   ({key(PROBE_CONFIGS[row['n']])}, "
                  f"{PROBES[int(probe)]}: wrong output, timing only)")
    host = results.get("host")
    if host:
        us = lambda name: "-" if host.get(name) is None else f"{host[name]:.1f}"  # noqa: E731
        print(f"\nhost time a call, us (B2 H64 N1024 bf16, float32 filter; path {host['path']}): fft_conv "
              f"{us('fft_conv_us')}, the path before session 30 {us('old_path_us')}, torch {us('torch_us')}; "
              f"kept TMA encodings {us('fft_conv_kept_us')}; grad recorded {us('fft_conv_grad_us')} (torch "
              f"{us('torch_grad_us')}); same bits 1..10 {host.get('same_bits_1_10')} / kept "
              f"{host.get('kept_same_bits_1_10')} / old path {host.get('old_path_same_bits')}")
    for err in results["errors"]:
        print("error:", err)
    print(f"wall {results['wall_s']:.0f} s; JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
