"""Issue 35, session 27: MLA prefill head sizes (q/k 192, v 128) on the Gluon kernels, on the GPU.

1. Correctness (bf16; fp16 on one case), against the float64 reference (reference.py), error as a
   multiple of the rounding floor, into NaN-poisoned buffers (every element written):
   - the forced Gluon forward at 192 / 128 (gluon_kernels.py, Q and K by 64-column pieces, O stored
     in two halves): O and lse; causal and not, tails N (not a multiple of the 128-row tile), N != Nk;
     with --full also grouped-query heads, an odd N, the short causal config (64-key blocks) and
     window + softcap (more compiles: ~7 s a Gluon kernel on the device host);
   - dq, dk, dv from the Gluon forward's O and lse by the backward the plan picks (the tl kernels at
     192 / 128: what tilecore.attention runs once configs.GLUON_FORWARD_DV_ROUTED is set) and by the
     forced Gluon backward (gluon_backward.attention_bwd_mla_kernel's dK and dV by 64-column pieces,
     32 query rows a step, then gluon_dq.attention_dq_mla_kernel's dQ: configs.GLUON_BACKWARD_DV);
   - tilecore.attention through autograd (the default plans: the custom ops and the eager plan cache);
2. Timing (bf16, B8 H16 N4096, causal and not; triton.testing.do_bench medians, all in this run):
   forward and forward + backward of 192 / 128 (Gluon forward with the tl backward, Gluon forward and
   backward, and the tl forward: the route before session 27), of
   128 / 128 (Gluon, the default), and SDPA's cuDNN / flash / efficient backends on 192 / 128 where
   they run. The rate is FLOPs per second, FLOPs counted per problem (forward 2 B H N Nk (D + Dv),
   backward 2 B H N Nk (3 D + 2 Dv): S, dP, dV, dK, dQ; halved causal), and the issue's ratio is the
   192 / 128 rate over the 128 / 128 rate (target >= 0.9).
Prints a table last; writes JSON to $OUT (default /tmp/out)/attention_mla_s27.json. --quick (the
default) runs in about a minute; --full adds checks.

  PYTHONPATH=. python experiments/attention/gpu_mla.py            # on the GPU
  PYTHONPATH=. python experiments/attention/gpu_mla.py --smoke    # CPU, interpreter, tiny, no timing
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

SMOKE = "--smoke" in sys.argv
if SMOKE:  # before triton is imported: the kernels run in its interpreter
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from tilecore import accuracy  # noqa: E402
from tilecore.ops.attention import attention, configs, launch, plan  # noqa: E402
from tilecore.ops.attention.reference import attention_reference  # noqa: E402

ROWS = []  # the table: (section, case, figures)
RESULTS = {"correctness": [], "timing": [], "errors": []}


def row(entry) -> None:
    """A table row: kept for the table printed last, and printed now (a run cut short keeps them)."""
    ROWS.append(entry)
    print(" | ".join(str(x) for x in entry), flush=True)


def device() -> str:
    return "cpu" if SMOKE else "cuda"


def note_error(what: str, exc: BaseException) -> None:
    text = f"{type(exc).__name__}: {exc}"
    print(f"[{what}] FAILED: {text}")
    traceback.print_exc(limit=4)
    RESULTS["errors"].append(dict(case=what, error=text[:2000]))
    row(("error", what, text[:100]))


def make(b, hq, hkv, n, nk, d, dv, dtype, seed=0):
    g = torch.Generator(device=device()).manual_seed(seed)
    q = torch.randn(b, hq, n, d, dtype=dtype, device=device(), generator=g)
    k = torch.randn(b, hkv, nk, d, dtype=dtype, device=device(), generator=g)
    v = torch.randn(b, hkv, nk, dv, dtype=dtype, device=device(), generator=g)
    return q, k, v


def gluon_path() -> str:
    """The path the Gluon rows force: "gluon" on the GPU; the interpreter cannot run Gluon, so the
    smoke run plans the Gluon path (checking its config) and launches the tl one."""
    return "tl" if SMOKE else "gluon"


def forward(q, k, v, causal, path, window=(-1, -1), softcap=0.0, config=None):
    """(out, lse, plan) into NaN-poisoned buffers by the forced ``path``."""
    scale = q.shape[-1] ** -0.5
    out = torch.full((*q.shape[:3], v.shape[-1]), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:3], float("nan"), device=q.device)
    if q.shape[-1] != v.shape[-1]:  # the Gluon config (the smoke run too: planning a Gluon grid needs a GPU)
        cfg = config or configs.gluon_forward_config(q.shape[-1], q.shape[2], k.shape[2], causal, v.shape[-1])
        assert cfg.get("qk_pieces") == 3 and cfg.get("o_halves"), cfg
    fwd_plan = plan.plan_forward(q, k, v, causal, scale, path=path, window=window, softcap=softcap,
                                 config=config if path == "gluon" else None)
    launch.forward(fwd_plan, q, k, v, out, lse, causal, scale, window, softcap)
    return out, lse, fwd_plan


def backward(dout, q, k, v, out, lse, causal, window=(-1, -1), softcap=0.0, path=None):
    """dq, dk, dv into NaN-poisoned buffers by the backward's own plan (tl at 192 / 128) or the forced
    ``path`` ("gluon": gluon_backward.attention_bwd_mla_kernel's dK and dV, then the tl dq kernel)."""
    scale = q.shape[-1] ** -0.5
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    if q.shape[-1] != v.shape[-1]:  # the Gluon backward's config (the smoke run too)
        cfg = configs.gluon_backward_config(q.shape[-1], q.shape[2], causal, v.shape[-1])
        assert cfg.get("qk_pieces") == 3 and cfg["dq_from"] == "gluon", cfg
    bwd_plan = plan.plan_backward(dout, q, k, v, causal, scale, window=window, softcap=softcap, path=path)
    launch.backward(bwd_plan, dout, q, k, v, out, lse, None, *grads, causal, scale, window, softcap)
    return grads, bwd_plan


# --------------------------------------------------------------------------------------------
# correctness

# --quick: one q head a kv head and lengths multiples of 16, as the timings (their compiled variants:
# on the device host a Gluon kernel compiles in ~7 s), tails of no 128-row tile; --full: GQA, odd N
CHECKS = [  # name, B, Hq, Hkv, N, Nk, causal, window, softcap, config override
    ("192/128 N1008", 1, 2, 2, 1008, 1008, False, (-1, -1), 0.0, None),
    ("192/128 causal N1040", 1, 2, 2, 1040, 1040, True, (-1, -1), 0.0, None),
    ("192/128 causal N720 Nk1104", 1, 2, 2, 720, 1104, True, (-1, -1), 0.0, None),
    ("192/128 N1104 Nk720", 1, 2, 2, 1104, 720, False, (-1, -1), 0.0, None),
    ("192/128 causal N4096 (schedule)", 1, 2, 2, 4096, 4096, True, (-1, -1), 0.0, None),
]
FULL_CHECKS = [
    ("192/128 N1000 GQA 4/2 (odd)", 1, 4, 2, 1000, 1000, False, (-1, -1), 0.0, None),
    ("192/128 causal N1040 GQA 8/2", 1, 8, 2, 1040, 1040, True, (-1, -1), 0.0, None),
    ("192/128 causal N384 (64-key blocks)", 1, 4, 4, 384, 384, True, (-1, -1), 0.0, None),
    ("192/128 window (256, 0) + softcap 30 GQA", 1, 4, 2, 1500, 1500, False, (256, 0), 30.0, None),
    ("192/128 causal N2048, 128-key blocks forced", 2, 2, 2, 2048, 2048, True, (-1, -1), 0.0,
     dict(configs.GLUON_FORWARD_DV[192, 128])),
]
SMOKE_CHECKS = [("192/128 smoke causal N40 Nk50 GQA", 1, 2, 1, 40, 50, True, (-1, -1), 0.0, None),
                ("192/128 smoke N33", 1, 2, 2, 33, 33, False, (-1, -1), 0.0, None)]


def check_case(name, b, hq, hkv, n, nk, causal, window, softcap, config, dtype) -> None:
    q, k, v = make(b, hq, hkv, n, nk, 192, 128, dtype)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    ref, ref_lse = attention_reference(q64, k64, v64, causal=causal, window_size=window, softcap=softcap)
    dout = torch.randn(ref.shape, dtype=dtype, device=q.device)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
    ref, ref_lse = ref.detach(), ref_lse.detach()
    live = torch.isfinite(ref_lse)
    out, lse, fwd_plan = forward(q, k, v, causal, gluon_path(), window, softcap, config)
    unwritten = int(out.isnan().sum()) + int(lse.isnan().sum())
    err = accuracy.error_over_floor(out, ref)
    lse_ok = bool(torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)) and torch.allclose(
        lse[live].double(), ref_lse[live], rtol=1e-3, atol=1e-3))
    ok = unwritten == 0 and lse_ok and err <= 2.0
    cfg = fwd_plan.config
    RESULTS["correctness"].append(dict(case=name, dtype=str(dtype), what="forward", path=fwd_plan.path, config=cfg,
                                       ok=ok, lse_ok=lse_ok, unwritten=unwritten, out_over_floor=err))
    row(("check", f"{name} {str(dtype)[6:]} fwd [{fwd_plan.path} BN{cfg.get('BLOCK_N', cfg.get('block_n'))}]",
                 f"{'ok' if ok else 'BAD'} out {err:.2f} lse {'ok' if lse_ok else 'BAD'}"
                 + (f" unwritten {unwritten}" if unwritten else "")))
    for bwd_path in (None,) if SMOKE else (None, "gluon"):  # the interpreter cannot run Gluon
        try:
            grads, bwd_plan = backward(dout, q, k, v, out, lse, causal, window, softcap, bwd_path)
        except Exception as exc:  # noqa: BLE001
            note_error(f"check {name} {dtype} backward {bwd_path or 'default'}", exc)
            continue
        unwritten = int(sum(g.isnan().sum() for g in grads))
        errs = {nm: accuracy.error_over_floor(g, r) for nm, g, r in zip(("dq", "dk", "dv"), grads, ref_grads)}
        ok = unwritten == 0 and max(errs.values()) <= 3.0
        paths = bwd_plan.path + (f" + dq {bwd_plan.dq.path}" if bwd_plan.path == "gluon" else "")
        RESULTS["correctness"].append(dict(case=name, dtype=str(dtype), what="backward", path=paths, ok=ok,
                                           unwritten=unwritten, **{f"{nm}_over_floor": e for nm, e in errs.items()}))
        row(("check", f"{name} {str(dtype)[6:]} bwd [{paths}, from the {fwd_plan.path} forward]",
                     ("ok " if ok else "BAD ") + " ".join(f"{nm} {e:.2f}" for nm, e in errs.items())
                     + (f" unwritten {unwritten}" if unwritten else "")))
    # tilecore.attention through autograd: the default plans (the custom ops, the eager plan cache)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out_d = attention(qg, kg, vg, causal=causal, window_size=window, softcap=softcap)
    grads = torch.autograd.grad(out_d, (qg, kg, vg), dout)
    errs = {nm: accuracy.error_over_floor(g, r) for nm, g, r in zip(("dq", "dk", "dv"), grads, ref_grads)}
    err_out = accuracy.error_over_floor(out_d.detach(), ref)
    scale = q.shape[-1] ** -0.5
    paths = (f"{plan.plan_forward(q, k, v, causal, scale, window=window, softcap=softcap).path}+"
             f"{plan.plan_backward(dout, q, k, v, causal, scale, window=window, softcap=softcap).path}")
    ok = all(bool(torch.isfinite(g).all()) for g in grads) and err_out <= 2.0 and max(errs.values()) <= 3.0
    RESULTS["correctness"].append(dict(case=name, dtype=str(dtype), what="default autograd", path=paths, ok=ok,
                                       out_over_floor=err_out, **{f"{nm}_over_floor": e for nm, e in errs.items()}))
    row(("check", f"{name} {str(dtype)[6:]} tilecore.attention autograd [{paths}]",
         ("ok " if ok else "BAD ") + f"out {err_out:.2f} " + " ".join(f"{nm} {e:.2f}" for nm, e in errs.items())))


# --------------------------------------------------------------------------------------------
# timing


def bench(fn) -> float:
    """Median ms of fn (do_bench: warm-up, then repeats); --smoke: one call, wall time."""
    if SMOKE:
        t0 = time.time()
        fn()
        return (time.time() - t0) * 1e3
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def flops(b, h, n, nk, d, dv, causal):
    """(forward, backward) FLOPs of the problem (causal: half the scores)."""
    pairs = b * h * n * nk * (0.5 if causal else 1.0)
    return 2 * pairs * (d + dv), 2 * pairs * (3 * d + 2 * dv)


def tilecore_times(q, k, v, causal, fwd_path, bwd_path=None, bwd_config=None):
    """(forward ms, forward + backward ms): the forward by the forced ``fwd_path``, the backward by
    its own plan or the forced ``bwd_path``; plans made once, launches into buffers made once."""
    scale = q.shape[-1] ** -0.5
    out, lse, fwd_plan = forward(q, k, v, causal, fwd_path)
    dout = torch.randn_like(out)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    bwd_plan = plan.plan_backward(dout, q, k, v, causal, scale, path=bwd_path, config=bwd_config)
    fwd = lambda: launch.forward(fwd_plan, q, k, v, out, lse, causal, scale)
    bwd = lambda: launch.backward(bwd_plan, dout, q, k, v, out, lse, None, *grads, causal, scale)

    def both():
        fwd()
        bwd()

    dq_pass = f" (dq {bwd_plan.dq.path})" if bwd_plan.dq is not None and bwd_plan.path == "gluon" else ""
    return bench(fwd), bench(both), f"{fwd_plan.path}+{bwd_plan.path}{dq_pass}"


def sdpa_times(q, k, v, causal, backend):
    """(forward ms, forward + backward ms) of torch's SDPA with one backend (raises where it does not run)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    which = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel([which]):
        out = sdpa(q, k, v, is_causal=causal)
        dout = torch.randn_like(out)

        def both():
            o = sdpa(qg, kg, vg, is_causal=causal)
            torch.autograd.grad(o, (qg, kg, vg), dout)

        both()
        return bench(lambda: sdpa(q, k, v, is_causal=causal)), bench(both), f"sdpa {backend}"


def time_all(quick: bool) -> None:
    b, h, n = (1, 2, 64) if SMOKE else (8, 16, 4096)
    dtype = torch.bfloat16
    for causal in (False, True):
        mla = make(b, h, h, n, n, 192, 128, dtype, seed=1)
        square = make(b, h, h, n, n, 128, 128, dtype, seed=2)
        runs = [("192/128", mla, gluon_path(), "tilecore gluon fwd"), ("192/128", mla, "tl", "tilecore tl fwd"),
                ("128/128", square, None, "tilecore default")]
        if not SMOKE:
            runs.insert(1, ("192/128", mla, "gluon", "tilecore gluon fwd+bwd"))
            runs.insert(2, ("192/128", mla, "gluon", "tilecore gluon fwd+bwd, dq tl"))
        if not SMOKE:
            runs += [("192/128", mla, backend, f"sdpa {backend}") for backend in ("cudnn", "flash", "efficient")
                     if backend != "efficient" or not quick]
        rates = {}
        for dims, (q, k, v), how, label in runs:
            name = f"{dims} {'causal' if causal else 'full'} B{b} H{h} N{n} {label}"
            try:
                t0 = time.time()
                if label.startswith("sdpa"):
                    fwd, both, paths = sdpa_times(q, k, v, causal, how)
                elif how is None:  # the default plans (Gluon forward and backward at 128 / 128)
                    scale = q.shape[-1] ** -0.5
                    fwd_plan = plan.plan_forward(q, k, v, causal, scale)
                    fwd, both, paths = tilecore_times(q, k, v, causal, fwd_plan.path)
                elif label == "tilecore gluon fwd+bwd":
                    fwd, both, paths = tilecore_times(q, k, v, causal, "gluon", "gluon")
                elif label == "tilecore gluon fwd+bwd, dq tl":
                    fwd, both, paths = tilecore_times(q, k, v, causal, "gluon", "gluon",
                                                      dict(configs.GLUON_BACKWARD_DV[192, 128], dq_from="tl"))
                else:
                    fwd, both, paths = tilecore_times(q, k, v, causal, how)
            except Exception as exc:  # noqa: BLE001 - report and go on
                note_error(f"time {name}", exc)
                continue
            f_fwd, f_bwd = flops(b, h, n, n, q.shape[-1], v.shape[-1], causal)
            fwd_rate, both_rate = f_fwd / fwd * 1e-9, (f_fwd + f_bwd) / both * 1e-9  # TFLOP/s
            rates[label, dims] = (fwd_rate, both_rate)
            RESULTS["timing"].append(dict(case=name, paths=paths, causal=causal, fwd_ms=fwd, fwd_bwd_ms=both,
                                          fwd_tflops=fwd_rate, fwd_bwd_tflops=both_rate, wall_s=time.time() - t0))
            row(("time", name, f"[{paths}] fwd {fwd:.3f} ms {fwd_rate:.0f} TFLOP/s, fwd+bwd {both:.3f} ms "
                                       f"{both_rate:.0f} TFLOP/s"))
        base = rates.get(("tilecore default", "128/128"))
        for label in ("tilecore gluon fwd", "tilecore gluon fwd+bwd", "tilecore gluon fwd+bwd, dq tl",
                      "tilecore tl fwd"):
            got = rates.get((label, "192/128"))
            if base and got:
                ratios = dict(fwd=got[0] / base[0], fwd_bwd=got[1] / base[1])
                RESULTS["timing"].append(dict(case=f"ratio {label} 192/128 vs 128/128", causal=causal, **ratios))
                row(("ratio", f"192/128 {label} / 128/128 {'causal' if causal else 'full'} (rate)",
                             f"fwd {ratios['fwd']:.3f}, fwd+bwd {ratios['fwd_bwd']:.3f} (target >= 0.9)"))
        gluon = rates.get(("tilecore gluon fwd", "192/128"))
        for backend in ("cudnn", "flash", "efficient"):
            peer = rates.get((f"sdpa {backend}", "192/128"))
            if gluon and peer:
                ratios = dict(fwd=gluon[0] / peer[0], fwd_bwd=gluon[1] / peer[1])
                RESULTS["timing"].append(dict(case=f"ratio gluon fwd 192/128 vs sdpa {backend}", causal=causal, **ratios))
                row(("ratio", f"192/128 tilecore gluon fwd / sdpa {backend} {'causal' if causal else 'full'}",
                             f"fwd {ratios['fwd']:.3f}, fwd+bwd {ratios['fwd_bwd']:.3f}"))


# the tl backward's blocks at 192 / 128: configs.backward_config(192), 64 x 32, 4 warps, 2 stages
# since session 27's run 3 (169-173 TFLOP/s against 32 x 32's 87-89), against candidates that
# compile lean for sm_90a: 3 stages (dk/dv spills 12 B), 128 x 32 with 8 warps (none)
TL_BACKWARD_CANDIDATES = [dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2),
                          dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=3),
                          dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2)]


def time_tl_backward(budget_s: float, t_start: float) -> None:
    """The tl backward at 192 / 128, B8 H16 N4096, by block configuration (dk/dv and dq take the
    same one), from a tl forward's O and lse; checked against the first configuration's gradients."""
    b, h, n = (1, 2, 64) if SMOKE else (8, 16, 4096)
    dtype = torch.bfloat16
    for causal in (True, False):
        q, k, v = make(b, h, h, n, n, 192, 128, dtype, seed=3)
        scale = 192**-0.5
        out, lse, _ = forward(q, k, v, causal, "tl")
        dout = torch.randn_like(out)
        f_fwd, f_bwd = flops(b, h, n, n, 192, 128, causal)
        first = None
        for cfg in TL_BACKWARD_CANDIDATES[:1] if SMOKE else TL_BACKWARD_CANDIDATES:
            name = f"tl bwd 192/128 {'causal' if causal else 'full'} B{b} H{h} N{n} {cfg}"
            if time.time() - t_start > budget_s:
                row(("skip", name, f"past the {budget_s:.0f} s budget"))
                continue
            try:
                grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
                bwd_plan = plan.plan_backward(dout, q, k, v, causal, scale, path="tl", config=cfg)
                run = lambda: launch.backward(bwd_plan, dout, q, k, v, out, lse, None, *grads, causal, scale)
                run()
                unwritten = int(sum(g.isnan().sum() for g in grads))
                if first is None:
                    first = [g.clone() for g in grads]
                    agree = 0.0
                else:  # against the first (shipped) configuration's
                    agree = max(accuracy.rel_rms(g.float(), f.float()) for g, f in zip(grads, first))
                ms = bench(run)
            except Exception as exc:  # noqa: BLE001 - report and go on
                note_error(f"time {name}", exc)
                continue
            rate = f_bwd / ms * 1e-9
            RESULTS["timing"].append(dict(case=name, config=cfg, causal=causal, bwd_ms=ms, bwd_tflops=rate,
                                          unwritten=unwritten, rel_rms_vs_shipped=agree))
            row(("time", name, f"bwd {ms:.3f} ms {rate:.0f} TFLOP/s; vs shipped rel rms {agree:.2e}"
                                       + (f" UNWRITTEN {unwritten}" if unwritten else "")))


def time_parts(budget_s: float, t_start: float) -> None:
    """--parts (session 29): where the non-causal 192 / 128 backward's time goes, B8 H16 N4096 bf16.
    The dK/dV kernel (with its preprocess) at STAGES 2 / 3 (shipped) / 4 / 6 (sm_90a: no spill, 140-223 KB
    of shared memory) and the dq kernel at 3 (shipped) / 2 stages, each part's own matmul FLOPs
    (dK/dV: S^T, dP^T, dV, dK = 2 pairs (192 + 128 + 128 + 192); dq: S, dP, dQ = 2 pairs (192 + 128 + 192))
    over its time; beside them the 128 / 128 backward kernel (lagged dQ, one kernel: five matmuls) and the
    shipped 192 / 128 backward whole. Each new STAGES value compiles (~7 s)."""
    import dataclasses

    b, h, n = (1, 2, 64) if SMOKE else (8, 16, 4096)
    causal = False
    scale = 192 ** -0.5
    q, k, v = make(b, h, h, n, n, 192, 128, torch.bfloat16, seed=1)
    out, lse, _ = forward(q, k, v, causal, gluon_path())
    dout = torch.randn_like(out)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    pairs = b * h * n * n
    label = f"192/128 full B{b} H{h} N{n}"
    if SMOKE:  # planning the Gluon grid needs a GPU: the smoke run checks the script's shapes above only
        row(("skip", f"parts {label}", "--smoke: Gluon plans need a GPU"))
        return
    base = plan.plan_backward(dout, q, k, v, causal, scale, path="gluon")

    def part(name, fn, matmul_flops):
        if time.time() - t_start > budget_s:
            row(("skip", f"parts {label} {name}", f"past the {budget_s:.0f} s budget"))
            return
        try:
            fn()  # compile outside the timing
            t = bench(fn)
        except Exception as exc:  # noqa: BLE001 - report and go on
            note_error(f"parts {label} {name}", exc)
            return
        rate = matmul_flops / t * 1e-9
        RESULTS["timing"].append(dict(case=f"parts {label} {name}", ms=t, tflops=rate))
        row(("parts", f"{label} {name}", f"{t:.3f} ms {rate:.0f} TFLOP/s"))

    f_bwd = 2 * pairs * (3 * 192 + 2 * 128)
    part("backward whole (shipped)", lambda: launch.backward(base, dout, q, k, v, out, lse, None, dq, dk, dv, causal,
                                                             scale), f_bwd)
    for stages in (3, 2, 4, 6):
        p = plan.plan_backward(dout, q, k, v, causal, scale, path="gluon", config=dict(base.config, stages=stages))

        def dkdv(p=p):
            _, dq_sum, stats = launch.backward_preprocess(out, dout, lse, None, dq_sum=False, row_stats=True)
            launch.launch_backward_gluon_kernel(p, dout, q, k, v, stats, dq_sum, dk, dv, causal, scale)
        part(f"dK/dV kernel + preprocess, STAGES {stages}{' (shipped)' if stages == base.config['stages'] else ''}",
             dkdv, 2 * pairs * (192 + 128 + 128 + 192))
    delta, _, _ = launch.backward_preprocess(out, dout, lse, None)
    for stages in (3, 2):
        p = dataclasses.replace(base.dq, config=dict(base.dq.config, stages=stages))
        part(f"dq kernel, STAGES {stages}{' (shipped)' if stages == base.dq.config['stages'] else ''}",
             lambda p=p: launch.launch_dq_gluon(p, dout, q, k, v, lse, delta, dq, causal, scale),
             2 * pairs * (192 + 128 + 192))
    qs, ks, vs = make(b, h, h, n, n, 128, 128, torch.bfloat16, seed=2)
    os_, ls_, _ = forward(qs, ks, vs, causal, "gluon")
    ds = torch.randn_like(os_)
    sq = plan.plan_backward(ds, qs, ks, vs, causal, 128 ** -0.5, path="gluon")
    gs = [torch.empty_like(t) for t in (qs, ks, vs)]
    part(f"128/128 backward whole (dq {sq.config['dq_from']})",
         lambda: launch.backward(sq, ds, qs, ks, vs, os_, ls_, None, *gs, causal, 128 ** -0.5),
         2 * pairs * (3 * 128 + 2 * 128))


# --------------------------------------------------------------------------------------------
# --roles (session 31): the dK/dV kernel with 64 query rows a step, its matmuls split between the two
# consumers by role (experiments.attention.mla_roles_kernel), then the shipped MLA dq kernel


def roles_backward(base, dout, q, k, v, out, lse, dq, dk, dv, causal, scale, window=(-1, -1), stages=2,
                   dkdv_only=False):
    """The shipped MLA backward (plan ``base``: the preprocess, dK/dV, the dq kernel) with its dK/dV kernel
    replaced by attention_bwd_mla_roles_kernel (tiles of 64 keys drawn from a counter, 64 rows a step)."""
    from tilecore import dispatch
    from experiments.attention.mla_roles_kernel import attention_bwd_mla_roles_kernel
    from tilecore.tiles.launch import TmaOperand, cdiv, tile_counter

    B, H, N, _ = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    delta, _, stats = launch.backward_preprocess(out, dout, lse, None, row_stats=True)
    masks, left, right = launch.mask_options(causal, window, N, Nk)
    piece = lambda t: TmaOperand(t, [1, 1, 64, 64]).descriptor()  # noqa: E731
    tiles = cdiv(Nk, 64) * B * Hkv
    grid = (min(torch.cuda.get_device_properties(q.device).multi_processor_count, tiles),)
    with dispatch.on_device(q.device):
        attention_bwd_mla_roles_kernel[grid](
            piece(q), piece(k), piece(v), piece(dout), piece(dk), piece(dv),
            launch.row_stats_operand(stats, 64).descriptor(), H, N, Nk, H // Hkv, scale, scale * 1.4426950408889634,
            B * Hkv, base.sizes["head_group"], tile_counter(q.device), left, right, 0.0, **masks, STAGES=stages,
            num_warps=4)
    if not dkdv_only:
        launch.launch_dq_gluon(base.dq, dout, q, k, v, lse, delta, dq, causal, scale, window)


ROLES_CHECKS = [  # name, B, Hq, Hkv, N, Nk, causal, window
    ("192/128 causal N1040", 1, 2, 2, 1040, 1040, True, (-1, -1)),
    ("192/128 N1008", 1, 2, 2, 1008, 1008, False, (-1, -1)),
    ("192/128 causal N720 Nk1104", 1, 2, 2, 720, 1104, True, (-1, -1)),
    ("192/128 N1104 Nk720", 1, 2, 2, 1104, 720, False, (-1, -1)),
    ("192/128 causal N1040 GQA 8/2", 1, 8, 2, 1040, 1040, True, (-1, -1)),
    ("192/128 window (256, 0) GQA 4/2 N1500", 1, 4, 2, 1500, 1500, False, (256, 0)),
    ("192/128 causal N4096 B2", 2, 2, 2, 4096, 4096, True, (-1, -1)),
]


def roles_check(name, b, hq, hkv, n, nk, causal, window, dtype=torch.bfloat16, stages=2):
    q, k, v = make(b, hq, hkv, n, nk, 192, 128, dtype)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    ref, _ = attention_reference(q64, k64, v64, causal=causal, window_size=window)
    dout = torch.randn(ref.shape, dtype=dtype, device=q.device)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
    out, lse, _ = forward(q, k, v, causal, "gluon", window)
    scale = 192 ** -0.5
    base = plan.plan_backward(dout, q, k, v, causal, scale, window=window, path="gluon")
    found = {}
    for which in ("roles", "shipped"):
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        if which == "roles":
            roles_backward(base, dout, q, k, v, out, lse, *grads, causal, scale, window, stages)
        else:
            launch.backward(base, dout, q, k, v, out, lse, None, *grads, causal, scale, window)
        torch.cuda.synchronize()
        unwritten = int(sum(g.isnan().sum() for g in grads))
        found[which] = errs = {nm: accuracy.error_over_floor(g, r) for nm, g, r in zip(("dq", "dk", "dv"), grads,
                                                                                      ref_grads)}
        found[which + "_unwritten"] = unwritten
    ok = found["roles_unwritten"] == 0 and all(found["roles"][nm] <= max(3.0, 1.25 * found["shipped"][nm])
                                               for nm in ("dq", "dk", "dv"))
    RESULTS["correctness"].append(dict(case=f"roles {name}", dtype=str(dtype), stages=stages, ok=ok, **{
        f"{w}_{nm}_over_floor": found[w][nm] for w in ("roles", "shipped") for nm in ("dq", "dk", "dv")},
        unwritten=found["roles_unwritten"]))
    row(("check", f"roles {name} {str(dtype)[6:]} stages {stages}",
         ("ok " if ok else "BAD ") + " ".join(f"{nm} {found['roles'][nm]:.2f} (shipped {found['shipped'][nm]:.2f})"
                                            for nm in ("dq", "dk", "dv"))
         + (f" unwritten {found['roles_unwritten']}" if found["roles_unwritten"] else "")))
    return ok


def time_roles(budget_s: float, t_start: float) -> None:
    """B8 H16 N4096 bf16, causal and not: the dK/dV kernels alone (with the preprocess) and the whole backward
    (+ dq kernel) and forward + backward, roles (STAGES 2, 3) against the shipped dK/dV kernel; 128 / 128's
    forward + backward (the default) for the issue's ratio, all in this run."""
    b, h, n = 8, 16, 4096
    for causal in (False, True):
        label = f"{'causal' if causal else 'full'} B{b} H{h} N{n}"
        scale = 192 ** -0.5
        q, k, v = make(b, h, h, n, n, 192, 128, torch.bfloat16, seed=1)
        out, lse, fwd_plan = forward(q, k, v, causal, "gluon")
        dout = torch.randn_like(out)
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        base = plan.plan_backward(dout, q, k, v, causal, scale, path="gluon")
        pairs = b * h * n * n * (0.5 if causal else 1.0)
        f_fwd, f_bwd = flops(b, h, n, n, 192, 128, causal)
        fwd = lambda: launch.forward(fwd_plan, q, k, v, out, lse, causal, scale)  # noqa: E731

        def shipped_dkdv():
            _, dq_sum, stats = launch.backward_preprocess(out, dout, lse, None, dq_sum=False, row_stats=True)
            launch.launch_backward_gluon_kernel(base, dout, q, k, v, stats, dq_sum, dk, dv, causal, scale)

        cands = [("shipped dK/dV + preprocess", shipped_dkdv, 2 * pairs * (192 + 128 + 128 + 192)),
                 ("shipped backward", lambda: launch.backward(base, dout, q, k, v, out, lse, None, dq, dk, dv,
                                                               causal, scale), f_bwd),
                 ("shipped fwd+bwd", lambda: (fwd(), launch.backward(base, dout, q, k, v, out, lse, None, dq, dk, dv,
                                                                      causal, scale)), f_fwd + f_bwd)]
        for stages in (2, 3):
            cands += [(f"roles STAGES {stages} dK/dV + preprocess", lambda st=stages: roles_backward(
                          base, dout, q, k, v, out, lse, dq, dk, dv, causal, scale, stages=st, dkdv_only=True),
                       2 * pairs * (192 + 128 + 128 + 192)),
                      (f"roles STAGES {stages} backward", lambda st=stages: roles_backward(
                          base, dout, q, k, v, out, lse, dq, dk, dv, causal, scale, stages=st), f_bwd),
                      (f"roles STAGES {stages} fwd+bwd", lambda st=stages: (fwd(), roles_backward(
                          base, dout, q, k, v, out, lse, dq, dk, dv, causal, scale, stages=st)), f_fwd + f_bwd)]
        qs, ks, vs = make(b, h, h, n, n, 128, 128, torch.bfloat16, seed=2)
        sq_fwd = plan.plan_forward(qs, ks, vs, causal, 128 ** -0.5)
        os_, ls_ = (torch.empty_like(qs), torch.empty(qs.shape[:3], device=qs.device))
        launch.forward(sq_fwd, qs, ks, vs, os_, ls_, causal, 128 ** -0.5)
        ds = torch.randn_like(os_)
        sq = plan.plan_backward(ds, qs, ks, vs, causal, 128 ** -0.5)
        gs = [torch.empty_like(t) for t in (qs, ks, vs)]
        f_sq = sum(flops(b, h, n, n, 128, 128, causal))
        cands.append(("128/128 default fwd+bwd", lambda: (launch.forward(sq_fwd, qs, ks, vs, os_, ls_, causal,
                                                                         128 ** -0.5),
                                                          launch.backward(sq, ds, qs, ks, vs, os_, ls_, None, *gs,
                                                                          causal, 128 ** -0.5)), f_sq))
        rates = {}
        for name, fn, fl in cands:
            if time.time() - t_start > budget_s:
                row(("skip", f"roles {label} {name}", f"past the {budget_s:.0f} s budget"))
                continue
            try:
                fn()
                t = bench(fn)
            except Exception as exc:  # noqa: BLE001 - report and go on
                note_error(f"time roles {label} {name}", exc)
                continue
            rates[name] = rate = fl / t * 1e-9
            RESULTS["timing"].append(dict(case=f"roles {label} {name}", ms=t, tflops=rate))
            row(("time", f"{label} {name}", f"{t:.3f} ms {rate:.0f} TFLOP/s"))
        sq_rate = rates.get("128/128 default fwd+bwd")
        for name in ("shipped fwd+bwd", "roles STAGES 2 fwd+bwd", "roles STAGES 3 fwd+bwd"):
            if sq_rate and name in rates:
                RESULTS["timing"].append(dict(case=f"ratio {label} {name} / 128/128", ratio=rates[name] / sq_rate))
                row(("ratio", f"{label} 192/128 {name} / 128/128 fwd+bwd (rate)",
                     f"{rates[name] / sq_rate:.3f} (target >= 0.9)"))


def time_roles_ab(rounds: int = 3) -> None:
    """--roles-ab (session 31, after call 3's --roles: every check right, roles STAGES 3 fwd+bwd 0.884-0.885x the
    128/128 rate against the shipped 0.853-0.856x, but its dK/dV kernel alone within +-3% of the shipped one: the
    run's spread). B8 H16 N4096 bf16, causal and not: the shipped dK/dV kernel and roles STAGES 3 (each with
    the preprocess), then the whole forward + backward each way, timed alternately ``rounds`` times (do_bench
    medians, rep 200 ms); the median of the rounds and roles' speedup."""
    import statistics

    import triton.testing

    b, h, n = 8, 16, 4096
    for causal in (False, True):
        label = f"{'causal' if causal else 'full'} B{b} H{h} N{n}"
        scale = 192 ** -0.5
        q, k, v = make(b, h, h, n, n, 192, 128, torch.bfloat16, seed=1)
        out, lse, fwd_plan = forward(q, k, v, causal, "gluon")
        dout = torch.randn_like(out)
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        base = plan.plan_backward(dout, q, k, v, causal, scale, path="gluon")

        def shipped_dkdv():
            _, dq_sum, stats = launch.backward_preprocess(out, dout, lse, None, dq_sum=False, row_stats=True)
            launch.launch_backward_gluon_kernel(base, dout, q, k, v, stats, dq_sum, dk, dv, causal, scale)

        def fwd():
            launch.forward(fwd_plan, q, k, v, out, lse, causal, scale)

        pairs = {"dK/dV + preprocess": (shipped_dkdv, lambda: roles_backward(
                     base, dout, q, k, v, out, lse, dq, dk, dv, causal, scale, stages=3, dkdv_only=True)),
                 "fwd+bwd": (lambda: (fwd(), launch.backward(base, dout, q, k, v, out, lse, None, dq, dk, dv, causal,
                                                             scale)),
                             lambda: (fwd(), roles_backward(base, dout, q, k, v, out, lse, dq, dk, dv, causal, scale,
                                                            stages=3)))}
        for what, (shipped, roles) in pairs.items():
            times = {"shipped": [], "roles": []}
            try:
                shipped()
                roles()
                for _ in range(rounds):
                    for name, fn in (("shipped", shipped), ("roles", roles)):
                        times[name].append(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))
            except Exception as exc:  # noqa: BLE001 - report and go on
                note_error(f"roles A/B {label} {what}", exc)
                continue
            med = {name: statistics.median(ts) for name, ts in times.items()}
            RESULTS["timing"].append(dict(case=f"roles A/B {label} {what}", rounds=times, median_ms=med,
                                          roles_speedup=med["shipped"] / med["roles"]))
            row(("time", f"A/B {label} {what}", f"shipped {med['shipped']:.3f} ms, roles STAGES 3 {med['roles']:.3f} "
                 f"ms: {med['shipped'] / med['roles']:.3f}x (rounds " + " ".join(
                     f"{a:.3f}/{r:.3f}" for a, r in zip(times["shipped"], times["roles"])) + ")"))


# --------------------------------------------------------------------------------------------
# --rows64 (session 33): the dK/dV kernel at 64 query rows a step (config block_m 64: AttentionBackwardPieces.
# compute: S^T, then dP^T with dV under it, P^T kept in float16) against the then shipped 32 rows (the shipped
# config since; the 32-row step removed in session 35, so both sides are now the same kernel unless --rows64's
# stages differ). Calls 4 and 5 timed two 64-row orders (dV after dS^T, and DV_EARLY: dV under dP^T, 1.01-1.04x
# faster): the second is the kernel's now


def rows64_config(stages=3):
    return dict(configs.GLUON_BACKWARD_DV[192, 128], block_m=64, stages=stages)


ROWS64_CHECKS = [  # name, B, Hq, Hkv, N, Nk, causal, window, softcap, dtype (H16: the timing's specializations);
    # the first two before the timings (the plain causal step, the softcap step's folded P^T (1 - tanh^2))
    ("192/128 causal N1040", 1, 16, 16, 1040, 1040, True, (-1, -1), 0.0, torch.bfloat16),
    ("192/128 causal N1040 softcap 30", 1, 16, 16, 1040, 1040, True, (-1, -1), 30.0, torch.bfloat16),
    ("192/128 N1008", 1, 16, 16, 1008, 1008, False, (-1, -1), 0.0, torch.bfloat16),
    ("192/128 causal N720 Nk1104", 1, 16, 16, 720, 1104, True, (-1, -1), 0.0, torch.bfloat16),
    ("192/128 N1104 Nk720", 1, 16, 16, 1104, 720, False, (-1, -1), 0.0, torch.bfloat16),
    ("192/128 window (256, 0) + softcap 30 GQA 16/4 N1500", 1, 16, 4, 1500, 1500, False, (256, 0), 30.0,
     torch.bfloat16),
    ("192/128 causal N1040 GQA 16/4", 1, 16, 4, 1040, 1040, True, (-1, -1), 0.0, torch.bfloat16),
    ("192/128 causal N1040 fp16", 1, 16, 16, 1040, 1040, True, (-1, -1), 0.0, torch.float16),
]


def rows64_check(name, b, hq, hkv, n, nk, causal, window, softcap, dtype) -> bool:
    """dq, dk, dv by the forced Gluon backward with block_m 64 and with the shipped config, from the same Gluon
    forward's O and lse, into NaN-poisoned buffers, as multiples of the float64 reference's rounding floor."""
    q, k, v = make(b, hq, hkv, n, nk, 192, 128, dtype, seed=5)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    ref, _ = attention_reference(q64, k64, v64, causal=causal, window_size=window, softcap=softcap)
    dout = torch.randn(ref.shape, dtype=dtype, device=q.device)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
    out, lse, _ = forward(q, k, v, causal, "gluon", window, softcap)
    scale = 192 ** -0.5
    found = {}
    for which, cfg in (("rows64", rows64_config()), ("shipped", None)):
        p = plan.plan_backward(dout, q, k, v, causal, scale, window=window, softcap=softcap, path="gluon", config=cfg)
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        launch.backward(p, dout, q, k, v, out, lse, None, *grads, causal, scale, window, softcap)
        torch.cuda.synchronize()
        found[which] = {nm: accuracy.error_over_floor(g, r) for nm, g, r in zip(("dq", "dk", "dv"), grads, ref_grads)}
        found[which + "_unwritten"] = int(sum(g.isnan().sum() for g in grads))
    ok = found["rows64_unwritten"] == 0 and all(found["rows64"][nm] <= max(3.0, 1.25 * found["shipped"][nm])
                                                for nm in ("dq", "dk", "dv"))
    RESULTS["correctness"].append(dict(case=f"rows64 {name}", dtype=str(dtype), ok=ok, unwritten=found[
        "rows64_unwritten"], **{f"{w}_{nm}_over_floor": found[w][nm] for w in ("rows64", "shipped")
                                for nm in ("dq", "dk", "dv")}))
    row(("check", f"rows64 {name} {str(dtype)[6:]}",
         ("ok " if ok else "BAD ") + " ".join(f"{nm} {found['rows64'][nm]:.2f} ({found['shipped'][nm]:.2f})"
                                            for nm in ("dq", "dk", "dv"))
         + (f" unwritten {found['rows64_unwritten']}" if found["rows64_unwritten"] else "")))
    return ok


def time_rows64(rounds: int = 5, budget_s: float = 100.0, t_start: float = 0.0, rep: int = 200,
                cases=((False, 0.0), (True, 0.0), (True, 30.0))) -> None:
    """B8 H16 N4096 bf16, for each (causal, softcap) of ``cases``, alternately ``rounds`` times (do_bench medians,
    ``rep`` ms): the dK/dV kernel with its preprocess, the backward and forward + backward, shipped (32 rows) and
    rows64, and (no softcap) 128 / 128's default backward and forward + backward (the issue's ratio: 192 / 128's
    FLOP rate over 128 / 128's)."""
    import statistics

    import triton.testing

    b, h, n = 8, 16, 4096
    for causal, softcap in cases:
        label = f"{'causal' if causal else 'full'}{f' softcap {softcap:g}' if softcap else ''} B{b} H{h} N{n}"
        if time.time() - t_start > budget_s:
            row(("skip", f"rows64 timing {label}", f"past the {budget_s:.0f} s budget"))
            continue
        scale = 192 ** -0.5
        w = (-1, -1)
        q, k, v = make(b, h, h, n, n, 192, 128, torch.bfloat16, seed=1)
        out, lse, fwd_plan = forward(q, k, v, causal, "gluon", w, softcap)
        dout = torch.randn_like(out)
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        plans = {"shipped": plan.plan_backward(dout, q, k, v, causal, scale, path="gluon", softcap=softcap),
                 "rows64": plan.plan_backward(dout, q, k, v, causal, scale, path="gluon", softcap=softcap,
                                              config=rows64_config())}

        def dkdv(p):
            _, dq_sum, stats = launch.backward_preprocess(out, dout, lse, None, dq_sum=False, row_stats=True)
            launch.launch_backward_gluon_kernel(p, dout, q, k, v, stats, dq_sum, dk, dv, causal, scale, w, softcap)

        def bwd(p):
            launch.backward(p, dout, q, k, v, out, lse, None, dq, dk, dv, causal, scale, w, softcap)

        def fwd_bwd(p):
            launch.forward(fwd_plan, q, k, v, out, lse, causal, scale, w, softcap)
            bwd(p)

        fns = {}
        for which in ("shipped", "rows64"):
            fns[f"dK/dV+pre {which}"] = lambda p=plans[which]: dkdv(p)
            fns[f"bwd {which}"] = lambda p=plans[which]: bwd(p)
            fns[f"fwd+bwd {which}"] = lambda p=plans[which]: fwd_bwd(p)
        if not softcap:
            qs, ks, vs = make(b, h, h, n, n, 128, 128, torch.bfloat16, seed=2)
            sq_fwd = plan.plan_forward(qs, ks, vs, causal, 128 ** -0.5)
            os_ = torch.empty_like(qs)
            ls_ = torch.empty(b, h, n, device=qs.device)
            ds_ = torch.randn_like(qs)
            sq_bwd = plan.plan_backward(ds_, qs, ks, vs, causal, 128 ** -0.5)
            gs = [torch.empty_like(t) for t in (qs, ks, vs)]
            launch.forward(sq_fwd, qs, ks, vs, os_, ls_, causal, 128 ** -0.5)
            fns["128/128 bwd"] = lambda: launch.backward(sq_bwd, ds_, qs, ks, vs, os_, ls_, None, *gs, causal,
                                                         128 ** -0.5)
            fns["128/128 fwd+bwd"] = lambda: (launch.forward(sq_fwd, qs, ks, vs, os_, ls_, causal, 128 ** -0.5),
                                              fns["128/128 bwd"]())
        times = {name: [] for name in fns}
        try:
            for fn in fns.values():
                fn()
            for _ in range(rounds):
                for name, fn in fns.items():
                    times[name].append(triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median"))
        except Exception as exc:  # noqa: BLE001 - report and go on
            note_error(f"rows64 timing {label}", exc)
            continue
        med = {name: statistics.median(ts) for name, ts in times.items() if ts}
        pairs = b * h * n * n * (0.5 if causal else 1.0)
        f_fwd, f_bwd = flops(b, h, n, n, 192, 128, causal)
        s_fwd, s_bwd = flops(b, h, n, n, 128, 128, causal)
        kernel_flops = 2 * pairs * (192 + 128 + 128 + 192)  # S^T, dP^T, dV, dK
        work = {"dK/dV+pre": kernel_flops, "bwd": f_bwd, "fwd+bwd": f_fwd + f_bwd}
        rates = {name: work[name.rsplit(" ", 1)[0]] / med[name] * 1e-9 for name in med if not name.startswith("128")}
        if not softcap:
            rates["128/128 bwd"] = s_bwd / med["128/128 bwd"] * 1e-9
            rates["128/128 fwd+bwd"] = (s_fwd + s_bwd) / med["128/128 fwd+bwd"] * 1e-9
        entry = dict(case=f"rows64 A/B {label}", rounds=times, median_ms=med, tflops=rates,
                     **{f"speedup {part}": med[f"{part} shipped"] / med[f"{part} rows64"] for part in work})
        if not softcap:
            for which in ("shipped", "rows64"):
                entry[f"ratio fwd+bwd {which}"] = rates[f"fwd+bwd {which}"] / rates["128/128 fwd+bwd"]
                entry[f"ratio bwd {which}"] = rates[f"bwd {which}"] / rates["128/128 bwd"]
        RESULTS["timing"].append(entry)
        for name in fns:
            row(("time", f"{label} {name}", f"{med[name]:.3f} ms {rates[name]:.0f} TFLOP/s (rounds "
                 + " ".join(f"{t:.3f}" for t in times[name]) + ")"))
        row(("ratio", f"{label} rows64 / shipped", ", ".join(f"{part} {entry['speedup ' + part]:.3f}x"
                                                             for part in work)))
        if not softcap:
            row(("ratio", f"{label} 192/128 over 128/128 rate", ", ".join(
                f"{part} {which} {entry[f'ratio {part} {which}']:.3f}" for part in ("fwd+bwd", "bwd")
                for which in ("shipped", "rows64")) + " (target >= 0.9)"))


def run_rows64(budget_s: float) -> None:
    """The first check (a wrong kernel is not timed), the timings, then the other checks while the budget lasts."""
    t_start = time.time()
    ok = {}
    for first in ROWS64_CHECKS[:2]:
        try:
            ok[first[8]] = rows64_check(*first)
        except Exception as exc:  # noqa: BLE001 - report and go on
            note_error(f"check rows64 {first[0]}", exc)
            ok[first[8]] = False
    cases = [c for c in ((False, 0.0), (True, 0.0), (True, 30.0)) if ok[c[1]]]
    time_rows64(budget_s=budget_s - 40.0, t_start=t_start, cases=cases)
    for case in ROWS64_CHECKS[2:]:
        if time.time() - t_start > budget_s:
            row(("skip", f"check rows64 {case[0]}", f"past the {budget_s:.0f} s budget"))
            continue
        try:
            rows64_check(*case)
        except Exception as exc:  # noqa: BLE001 - report and go on
            note_error(f"check rows64 {case[0]}", exc)


# --dq-regs (session 32, removed with the kernel's DO_REGS: commit 6a1176b has both): the MLA dq kernel with each
# consumer's dO rows in registers, 6 checks right, dq kernel 1.000x full / 0.975x causal, fwd+bwd 1.035x / 0.993x
# (session 32 call 6)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, interpreter, tiny shapes, no timing")
    parser.add_argument("--quick", action="store_true", help="the default: the checks above and the timings")
    parser.add_argument("--full", action="store_true", help="more checks (short causal, window + softcap)")
    parser.add_argument("--roles", action="store_true",
                        help="only the 64-row dK/dV kernel by roles (session 31): checks, then times, <= 150 s")
    parser.add_argument("--roles-ab", action="store_true",
                        help="only the shipped MLA dK/dV against roles STAGES 3, interleaved rounds, <= 90 s")
    parser.add_argument("--budget", type=float, default=140.0, help="--roles: seconds before later cases are skipped")
    parser.add_argument("--rows64", action="store_true",
                        help="only the dK/dV kernel at 64 query rows a step against the shipped 32 (session 33): the "
                             "first check, 5 alternate rounds (rep 200 ms) full / causal / causal softcap 30 with "
                             "128/128's, then the other checks while the budget lasts, <= 130 s")
    parser.add_argument("--parts", action="store_true",
                        help="only the non-causal backward's parts at other stage counts (session 29), <= 90 s")
    args = parser.parse_args()
    t_start = time.time()
    if args.rows64:
        if SMOKE:  # planning a Gluon grid needs a GPU
            print("--rows64 runs on the GPU only")
            return
        run_rows64(min(args.budget, 135.0))
        out_dir = os.environ.get("OUT", "/tmp/out")
        os.makedirs(out_dir, exist_ok=True)
        RESULTS["device"] = torch.cuda.get_device_name()
        RESULTS["wall_s"] = time.time() - t_start
        with open(os.path.join(out_dir, "attention_mla_rows64.json"), "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)
        print(f"\n{'=' * 20} MLA 192/128 dK/dV at 64 rows a step vs 32, {time.time() - t_start:.0f} s")
        for section, name, figures in ROWS:
            print(f"{section:6s} {name:50s}  {figures}")
        bad = [r for r in RESULTS["correctness"] if not r["ok"]]
        print(f"checks: {len(RESULTS['correctness']) - len(bad)} ok, {len(bad)} bad; errors: {len(RESULTS['errors'])}")
        return
    if args.roles_ab:
        time_roles_ab()
        out_dir = os.environ.get("OUT", "/tmp/out")
        os.makedirs(out_dir, exist_ok=True)
        RESULTS["device"] = torch.cuda.get_device_name()
        with open(os.path.join(out_dir, "attention_mla_roles_ab.json"), "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)
        print(f"\n{'=' * 20} MLA 192/128 dK/dV by roles: A/B, {time.time() - t_start:.0f} s")
        for section, name, figures in ROWS:
            print(f"{section:6s} {name:40s}  {figures}")
        print(f"errors: {len(RESULTS['errors'])}")
        return
    if args.roles:
        # the two timed variants' checks first (a wrong kernel is not timed), the timings, then the other checks
        # (N != Nk, GQA, a window, the balanced B2 N4096, STAGES 3) while the budget lasts
        first_ok = True
        for case in ROLES_CHECKS[:2]:
            try:
                first_ok = roles_check(*case) and first_ok
            except Exception as exc:  # noqa: BLE001 - report and go on
                note_error(f"check roles {case[0]}", exc)
                first_ok = False
        if first_ok:
            time_roles(args.budget - 50.0, t_start)
            for case, stages in [(c, 2) for c in ROLES_CHECKS[2:]] + [(ROLES_CHECKS[0], 3)]:
                if time.time() - t_start > args.budget:
                    row(("skip", f"check roles {case[0]} stages {stages}", f"past the {args.budget:.0f} s budget"))
                    continue
                try:
                    roles_check(*case, stages=stages)
                except Exception as exc:  # noqa: BLE001 - report and go on
                    note_error(f"check roles {case[0]}", exc)
        out_dir = os.environ.get("OUT", "/tmp/out")
        os.makedirs(out_dir, exist_ok=True)
        RESULTS["device"] = torch.cuda.get_device_name()
        with open(os.path.join(out_dir, "attention_mla_roles.json"), "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)
        print(f"\n{'=' * 20} MLA 192/128 dK/dV by roles (64 rows a step), {time.time() - t_start:.0f} s")
        for section, name, figures in ROWS:
            print(f"{section:6s} {name:75s}  {figures}")
        bad = [r for r in RESULTS["correctness"] if not r["ok"]]
        print(f"checks: {len(RESULTS['correctness']) - len(bad)} ok, {len(bad)} bad; errors: {len(RESULTS['errors'])}")
        return
    if args.parts:
        time_parts(80.0, t_start)
        out_dir = os.environ.get("OUT", "/tmp/out")
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "attention_mla_parts.json"), "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)
        print(f"\n{'=' * 20} MLA 192/128 backward parts, {time.time() - t_start:.0f} s")
        for section, name, figures in ROWS:
            print(f"{section:6s} {name:70s}  {figures}")
        print(f"errors: {len(RESULTS['errors'])}")
        return
    if SMOKE:
        cases = [(c, torch.bfloat16) for c in SMOKE_CHECKS]
    else:
        cases = [(c, torch.bfloat16) for c in CHECKS + (FULL_CHECKS if args.full else [])]
        if args.full:
            cases.append((CHECKS[1], torch.float16))
    for case, dtype in cases:
        try:
            check_case(*case, dtype)
        except Exception as exc:  # noqa: BLE001 - report and go on
            note_error(f"check {case[0]} {dtype}", exc)
    time_all(not args.full)
    time_tl_backward(80.0, t_start)
    if not SMOKE:
        RESULTS["device"] = torch.cuda.get_device_name()
    RESULTS["versions"] = dict(torch=torch.__version__, triton=__import__("triton").__version__)
    RESULTS["wall_s"] = time.time() - t_start
    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "attention_mla_s27" + ("_smoke" if SMOKE else "") + ".json")
    with open(path, "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    width = max(len(r[1]) for r in ROWS) if ROWS else 10
    print(f"\n{'=' * 20} MLA 192/128 on Gluon (session 27) {RESULTS.get('device', 'cpu')}, {RESULTS['wall_s']:.0f} s")
    for section, name, figures in ROWS:
        print(f"{section:6s} {name:{width}s}  {figures}")
    bad = [r for r in RESULTS["correctness"] if not r["ok"]]
    print(f"checks: {len(RESULTS['correctness']) - len(bad)} ok, {len(bad)} bad; errors: {len(RESULTS['errors'])}; "
          f"JSON: {path}")


if __name__ == "__main__":
    main()
