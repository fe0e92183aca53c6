"""Issue 35 part A on the GPU: tilecore.attention's sliding window, softcap and MLA head sizes.

1. Correctness (bf16 and fp16): forward and backward of each feature and a combination against the
   float64 reference (reference.py), error as a multiple of the rounding floor; the MLA decode
   (576 / 512, 128 q heads over one latent) forward.
2. Timing (H100, bf16, triton.testing.do_bench medians; peers measured in the same run):
   - sliding window 4096 over N = 32768 (B 2, H 16, D 128: 64K tokens) against full causal, forward
     and backward (target: ~1/8 of causal's time), and FlexAttention compiled with the same block mask;
   - softcap 30 against none (B 16, N 4096, causal; target >= 0.9x), the tl kernel without softcap too
     (what the gap is made of: the Gluon kernel takes no softcap), and FlexAttention with the score_mod;
   - MLA prefill D 192 / Dv 128 against D 128 (B 16, N 4096, causal; target >= 0.9x the TFLOP/s rate);
   - MLA decode 576 / 512, H 128 over one latent (v a view of k's first 512 columns), B 32 x 4096 keys:
     bytes read per second against a device copy measured in the same run.
Prints a table last; writes JSON to $OUT (default /tmp/out)/attention_features.json.

  PYTHONPATH=. python experiments/attention/gpu_features.py            # on the GPU (< 3 minutes)
  PYTHONPATH=. python experiments/attention/gpu_features.py --smoke    # CPU, interpreter, tiny, no timing
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
from tilecore.ops.attention import attention, launch, plan  # noqa: E402
from tilecore.ops.attention.reference import attention_reference  # noqa: E402

ROWS = []  # the table: (section, case, figures)
RESULTS = {"correctness": [], "timing": [], "errors": []}


def device() -> str:
    return "cpu" if SMOKE else "cuda"


def note_error(what: str, exc: BaseException) -> None:
    text = f"{type(exc).__name__}: {exc}"
    print(f"[{what}] FAILED: {text}")
    traceback.print_exc(limit=3)
    RESULTS["errors"].append(dict(case=what, error=text[:2000]))
    ROWS.append(("error", what, text[:80]))


def make(b, hq, hkv, n, nk, d, dv, dtype, grad=False):
    g = torch.Generator(device=device()).manual_seed(0)
    q = torch.randn(b, hq, n, d, dtype=dtype, device=device(), generator=g)
    k = torch.randn(b, hkv, nk, d, dtype=dtype, device=device(), generator=g)
    v = torch.randn(b, hkv, nk, dv, dtype=dtype, device=device(), generator=g)
    return [t.requires_grad_(grad) for t in (q, k, v)]


# --------------------------------------------------------------------------------------------
# correctness

CHECKS = [  # name, B, Hq, Hkv, N, Nk, D, Dv, causal, window, softcap
    ("window (256, 0)", 1, 4, 2, 1000, 1000, 128, 128, False, (256, 0), 0.0),
    ("window (100, 37) N<Nk", 1, 4, 4, 700, 1100, 64, 64, False, (100, 37), 0.0),
    ("causal + window (-1, -1) -> causal", 1, 4, 4, 513, 513, 128, 128, True, (-1, -1), 0.0),
    ("window (64, -1) causal, N>Nk", 1, 4, 1, 900, 600, 64, 64, True, (64, -1), 0.0),
    ("softcap 30", 1, 4, 2, 1000, 1000, 128, 128, True, (-1, -1), 30.0),
    ("softcap 2 (saturating)", 1, 4, 4, 600, 700, 64, 64, False, (-1, -1), 2.0),
    ("MLA prefill 192/128", 1, 4, 4, 1000, 1000, 192, 128, True, (-1, -1), 0.0),
    ("window + softcap + 192/128 GQA", 1, 8, 2, 800, 800, 192, 128, True, (200, -1), 20.0),
]
SMOKE_CHECKS = [("window (9, 3) smoke", 1, 2, 1, 40, 50, 16, 16, False, (9, 3), 0.0),
                ("softcap smoke", 1, 2, 2, 24, 24, 32, 16, True, (-1, -1), 2.0)]


def check_case(name, b, hq, hkv, n, nk, d, dv, causal, window, softcap, dtype) -> None:
    q, k, v = make(b, hq, hkv, n, nk, d, dv, dtype, grad=True)
    out, lse = attention(q, k, v, causal=causal, window_size=window, softcap=softcap, return_lse=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, ref_lse = attention_reference(q64, k64, v64, causal=causal, window_size=window, softcap=softcap)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
    errs = {name_: accuracy.error_over_floor(got, r) for name_, got, r in
            zip(("out", "dq", "dk", "dv"), (out.detach(), *grads), (ref.detach(), *ref_grads))}
    live = torch.isfinite(ref_lse)
    lse, ref_lse = lse.detach(), ref_lse.detach()
    lse_ok = bool(torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)) and torch.allclose(
        lse[live].double(), ref_lse[live], rtol=1e-3, atol=1e-3))
    finite = all(bool(torch.isfinite(t).all()) for t in (out, *grads))
    ok = finite and lse_ok and errs["out"] <= 2.0 and max(errs["dq"], errs["dk"], errs["dv"]) <= 3.0
    fwd_path = plan.plan_forward(q, k, v, causal, d ** -0.5, window=window, softcap=softcap).path
    RESULTS["correctness"].append(dict(case=name, dtype=str(dtype), path=fwd_path, ok=ok, lse_ok=lse_ok,
                                       finite=finite, **{f"{k_}_over_floor": v_ for k_, v_ in errs.items()}))
    ROWS.append(("check", f"{name} {str(dtype)[6:]} [{fwd_path}]",
                 ("ok " if ok else "BAD ") + " ".join(f"{k_} {v_:.2f}" for k_, v_ in errs.items())))
    if not SMOKE and d == dv and d in (64, 128) and fwd_path != "gluon":
        check_gluon_forward(name, q.detach(), k.detach(), v.detach(), causal, window, softcap, ref.detach(),
                            ref_lse.detach())


def check_gluon_forward(name, q, k, v, causal, window, softcap, ref, ref_lse, tanh_approx=False) -> None:
    """The Gluon forward's window / softcap (not routed by default: configs.GLUON_FORWARD_FEATURES),
    forced, into NaN-poisoned buffers; ``tanh_approx``: the softcap's tanh by tanh.approx.f32."""
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full(q.shape[:3], float("nan"), device=q.device)
    config = None
    if tanh_approx:
        config = plan.plan_forward(q, k, v, causal, q.shape[-1] ** -0.5, window=window, softcap=softcap,
                                   path="gluon").config | dict(tanh_approx=True)
        name = f"{name} tanh.approx"
    launch.forward_into(q, k, v, out, lse, causal, q.shape[-1] ** -0.5, window, softcap, path="gluon", config=config)
    err = accuracy.error_over_floor(out, ref)
    live = torch.isfinite(ref_lse)
    lse_ok = bool(torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)) and torch.allclose(
        lse[live].double(), ref_lse[live], rtol=1e-3, atol=1e-3))
    ok = bool(torch.isfinite(out).all()) and lse_ok and err <= 2.0
    RESULTS["correctness"].append(dict(case=name, dtype=str(q.dtype), path="gluon (forced)", ok=ok, lse_ok=lse_ok,
                                       out_over_floor=err))
    ROWS.append(("check", f"{name} {str(q.dtype)[6:]} [gluon fwd, forced]", f"{'ok' if ok else 'BAD'} out {err:.2f}"))
    if softcap and not tanh_approx:
        check_gluon_forward(name, q, k, v, causal, window, softcap, ref, ref_lse, tanh_approx=True)


def check_mla_decode(dtype, heads=128, nk=2000, b=2) -> None:
    """576 / 512 with v a view of the latent's first 512 columns, as MLA stores it."""
    g = torch.Generator(device=device()).manual_seed(1)
    q = torch.randn(b, heads, 1, 576, dtype=dtype, device=device(), generator=g)
    latent = torch.randn(b, 1, nk, 576, dtype=dtype, device=device(), generator=g)
    v = latent[..., :512]
    out, lse = attention(q, latent, v, scale=192 ** -0.5, return_lse=True)
    ref, ref_lse = attention_reference(q, latent, v, scale=192 ** -0.5)
    err = accuracy.error_over_floor(out, ref)
    path = plan.plan_forward(q, latent, v, False, 192 ** -0.5).path
    ok = bool(torch.isfinite(out).all()) and err <= 2.0 and bool(torch.allclose(lse.double(), ref_lse, atol=1e-3))
    RESULTS["correctness"].append(dict(case=f"MLA decode 576/512 H{heads} Hkv1", dtype=str(dtype), path=path, ok=ok,
                                       out_over_floor=err))
    ROWS.append(("check", f"MLA decode 576/512 H{heads} {str(dtype)[6:]} [{path}]", f"{'ok' if ok else 'BAD'} out {err:.2f}"))


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


def fwd_bwd_times(q, k, v, causal, window, softcap, path=None, config=None):
    """(forward ms, backward ms) of tilecore's attention (path: force "tl" for both passes, or
    "gluon" for the forward, the backward then by its own plan)."""
    scale = q.shape[-1] ** -0.5
    if path is None:
        run = lambda: attention(q, k, v, causal=causal, window_size=window, softcap=softcap)
        out = run()
        dout = torch.randn_like(out)
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        out_g = attention(qg, kg, vg, causal=causal, window_size=window, softcap=softcap)
        back = lambda: torch.autograd.grad(out_g, (qg, kg, vg), dout, retain_graph=True)
        return bench(run), bench(back)
    b, h, n, _ = q.shape
    out = torch.empty(b, h, n, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(b, h, n, dtype=torch.float32, device=q.device)
    run = lambda: launch.forward_into(q, k, v, out, lse, causal, scale, window, softcap, path=path, config=config)
    run()
    dout = torch.randn_like(out)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    back = lambda: launch.backward_into(dout, q, k, v, out, lse, None, *grads, causal, scale, window, softcap,
                                        path=None if path == "gluon" else path)
    return bench(run), bench(back)


def flex_times(q, k, v, mask_mod=None, score_mod=None):
    """(forward ms, backward ms) of FlexAttention compiled, with a block mask from mask_mod."""
    if SMOKE:  # its CPU compile takes minutes; the GPU run catches its failures
        return None, None
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    b, h, n, _ = q.shape
    nk = k.shape[2]
    block_mask = None if mask_mod is None else create_block_mask(mask_mod, None, None, n, nk, device=q.device)
    flex = torch.compile(flex_attention, dynamic=False)
    gqa = dict(enable_gqa=True) if k.shape[1] != h else {}
    run = lambda: flex(q, k, v, score_mod=score_mod, block_mask=block_mask, **gqa)
    run()
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out = flex(qg, kg, vg, score_mod=score_mod, block_mask=block_mask, **gqa)
    dout = torch.randn_like(out)
    back = lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)
    return bench(run), bench(back)


def timed(section, name, fn, **extra):
    try:
        t0 = time.time()
        fwd, bwd = fn()
        RESULTS["timing"].append(dict(section=section, case=name, fwd_ms=fwd, bwd_ms=bwd, wall_s=time.time() - t0,
                                      **extra))
        return fwd, bwd
    except Exception as exc:  # noqa: BLE001 - report and go on
        note_error(f"{section}: {name}", exc)
        return None, None


def ratio(a, b):
    return None if a is None or b is None else a / b


def fmt(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}"


def time_window(dtype=torch.bfloat16):
    b, h, n, w = (1, 2, 96, 16) if SMOKE else (2, 16, 32768, 4096)
    q, k, v = make(b, h, h, n, n, 128 if not SMOKE else 16, 128 if not SMOKE else 16, dtype)
    causal = timed("window", f"full causal N{n}", lambda: fwd_bwd_times(q, k, v, True, (-1, -1), 0.0))
    window = timed("window", f"window ({w}, 0) N{n}", lambda: fwd_bwd_times(q, k, v, True, (w, 0), 0.0))
    tl_causal = timed("window", f"tl causal N{n}", lambda: fwd_bwd_times(q, k, v, True, (-1, -1), 0.0, path="tl"))
    gluon = (None, None) if SMOKE else timed(
        "window", f"gluon window ({w}, 0) N{n}", lambda: fwd_bwd_times(q, k, v, True, (w, 0), 0.0, path="gluon"))
    work = (min(w + 1, n) * n - min(w + 1, n) * (min(w + 1, n) - 1) / 2) / (n * (n + 1) / 2)  # scores seen / causal's

    def sliding(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= w)

    flex = timed("window", "flex window (4096, 0)", lambda: flex_times(q, k, v, mask_mod=sliding))
    for i, what in enumerate(("fwd", "bwd")):
        ROWS.append(("time", f"window {w} / causal N{n} {what}",
                     f"{fmt(window[i])} / {fmt(causal[i])} ms = {fmt(ratio(window[i], causal[i]))} (work {work:.3f}, "
                     f"target ~0.125); gluon fwd {fmt(gluon[0]) if i == 0 else '-'} = "
                     f"{fmt(ratio(gluon[0], causal[0])) if i == 0 else '-'}; tl causal {fmt(tl_causal[i])}; flex "
                     f"{fmt(flex[i])} ms, x flex {fmt(ratio(flex[i], window[i]))}"
                     f"{' gluon ' + fmt(ratio(flex[0], gluon[0])) if i == 0 else ''} (target >= 1.3)"))


def time_softcap(dtype=torch.bfloat16):
    q, k, v = make(1, 2, 2, 64, 64, 16, 16, dtype) if SMOKE else make(16, 16, 16, 4096, 4096, 128, 128, dtype)
    plain = timed("softcap", "no softcap causal N4096", lambda: fwd_bwd_times(q, k, v, True, (-1, -1), 0.0))
    tl_plain = timed("softcap", "tl no softcap", lambda: fwd_bwd_times(q, k, v, True, (-1, -1), 0.0, path="tl"))
    capped = timed("softcap", "softcap 30", lambda: fwd_bwd_times(q, k, v, True, (-1, -1), 30.0))
    gluon = (None, None) if SMOKE else timed(
        "softcap", "gluon softcap 30", lambda: fwd_bwd_times(q, k, v, True, (-1, -1), 30.0, path="gluon"))
    approx_cfg = None if SMOKE else plan.plan_forward(q, k, v, True, q.shape[-1] ** -0.5, softcap=30.0,
                                                      path="gluon").config | dict(tanh_approx=True)
    approx = (None, None) if SMOKE else timed(
        "softcap", "gluon softcap 30 tanh.approx",
        lambda: fwd_bwd_times(q, k, v, True, (-1, -1), 30.0, path="gluon", config=approx_cfg))

    def cap(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / 30.0) * 30.0

    def causal_mask(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    flex = timed("softcap", "flex softcap 30", lambda: flex_times(q, k, v, mask_mod=causal_mask, score_mod=cap))
    for i, what in enumerate(("fwd", "bwd")):
        ROWS.append(("time", f"softcap 30 causal N{q.shape[2]} {what}",
                     f"x no-softcap {fmt(ratio(plain[i], capped[i]))} (target >= 0.9); gluon fwd x no-softcap "
                     f"{fmt(ratio(plain[0], gluon[0])) if i == 0 else '-'}, tanh.approx "
                     f"{fmt(ratio(plain[0], approx[0])) if i == 0 else '-'}; x tl no-softcap "
                     f"{fmt(ratio(tl_plain[i], capped[i]))}; x flex {fmt(ratio(flex[i], capped[i]))} "
                     f"({fmt(capped[i])} ms)"))


def time_mla(dtype=torch.bfloat16):
    b, h, n = (1, 2, 48) if SMOKE else (16, 16, 4096)
    flops = lambda d, dv: 2 * b * h * n * n * (d + dv) / 2  # causal: half the scores; QK^T and PV
    q, k, v = make(b, h, h, n, n, 192, 128, dtype)
    mla = timed("mla", "MLA 192/128 causal N4096", lambda: fwd_bwd_times(q, k, v, True, (-1, -1), 0.0))
    q, k, v = make(b, h, h, n, n, 128, 128, dtype)
    square = timed("mla", "D128 causal N4096", lambda: fwd_bwd_times(q, k, v, True, (-1, -1), 0.0))
    tl_square = timed("mla", "tl D128 causal", lambda: fwd_bwd_times(q, k, v, True, (-1, -1), 0.0, path="tl"))
    for i, what, mult in ((0, "fwd", 1.0), (1, "bwd", 2.5)):
        rate = lambda ms, d, dv: None if ms is None else mult * flops(d, dv) / ms / 1e9
        r_mla, r_sq, r_tl = rate(mla[i], 192, 128), rate(square[i], 128, 128), rate(tl_square[i], 128, 128)
        ROWS.append(("time", f"MLA 192/128 vs D128 N{n} {what} TFLOP/s",
                     f"{fmt(r_mla, 0)} vs {fmt(r_sq, 0)} = {fmt(ratio(r_mla, r_sq))} (target >= 0.9); "
                     f"tl D128 {fmt(r_tl, 0)}"))

    # decode: 128 heads over one latent, v = the latent's first 512 columns
    bd, nk, hd = (1, 64, 16) if SMOKE else (32, 4096, 128)
    g = torch.Generator(device=device()).manual_seed(2)
    qd = torch.randn(bd, hd, 1, 576, dtype=dtype, device=device(), generator=g)
    latent = torch.randn(bd, 1, nk, 576, dtype=dtype, device=device(), generator=g)
    try:
        kv_bytes = lambda k, v: (k.numel() + v.numel()) * k.element_size()  # K and V as the kernel reads them
        ms = bench(lambda: attention(qd, latent, latent[..., :512], scale=192 ** -0.5))
        gbs = kv_bytes(latent, latent[..., :512]) / ms / 1e6
        # the nearest square head size: 512 / 512 over the same latent
        q512, k512 = qd[..., :512].contiguous(), latent[..., :512]
        ms512 = bench(lambda: attention(q512, k512, k512, scale=192 ** -0.5))
        gbs512 = kv_bytes(k512, k512) / ms512 / 1e6
        src = torch.empty(latent.numel(), dtype=dtype, device=device())
        dst = torch.empty_like(src)
        copy_gbs = 2 * src.numel() * src.element_size() / bench(lambda: dst.copy_(src)) / 1e6
        RESULTS["timing"].append(dict(section="mla", case=f"MLA decode 576/512 H{hd} B{bd} Nk{nk}", fwd_ms=ms,
                                      gb_per_s=gbs, square_512_ms=ms512, square_512_gb_per_s=gbs512,
                                      copy_gb_per_s=copy_gbs))
        ROWS.append(("time", f"MLA decode 576/512 H{hd} B{bd}x{nk}",
                     f"{ms * 1e3:.0f} us, {gbs:.0f} GB/s ({gbs / copy_gbs:.2f} of copy); 512/512 {ms512 * 1e3:.0f} us "
                     f"{gbs512:.0f} GB/s; rate ratio {fmt(gbs / gbs512)} (target >= 0.9)"))
    except Exception as exc:  # noqa: BLE001
        note_error("mla decode timing", exc)


# --------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="CPU, Triton's interpreter, tiny shapes, no timing")
    ap.add_argument("--skip", default="", help="comma-separated: checks,window,softcap,mla")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--budget", type=float, default=165.0, help="seconds; later sections are skipped past it")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    t0 = time.time()
    if not args.smoke:
        RESULTS["device"] = torch.cuda.get_device_name()
        RESULTS["torch"] = torch.__version__
    budget = float("inf") if args.smoke else args.budget

    def within_budget(what: str) -> bool:
        if time.time() - t0 < budget:
            return True
        print(f"[{what}] skipped: past the {budget:.0f} s budget")
        ROWS.append(("skip", what, f"past the {budget:.0f} s budget"))
        return False

    def checks(dtype):  # fp16 on a few cases only: each dtype compiles its own kernels
        cases = SMOKE_CHECKS if args.smoke else CHECKS if dtype == torch.bfloat16 else CHECKS[::3]
        for case in cases:
            if within_budget(f"check {case[0]} {dtype}"):
                try:
                    check_case(*case, dtype)
                except Exception as exc:  # noqa: BLE001
                    note_error(f"check {case[0]} {dtype}", exc)
        if within_budget(f"check MLA decode {dtype}"):
            try:
                check_mla_decode(dtype, heads=16 if args.smoke else 128, nk=40 if args.smoke else 2000,
                                 b=1 if args.smoke else 2)
            except Exception as exc:  # noqa: BLE001
                note_error(f"check MLA decode {dtype}", exc)

    # bf16 checks, then the timings, then fp16 checks: what matters most first within the budget
    if "checks" not in skip:
        checks(torch.float16 if args.smoke else torch.bfloat16)  # the interpreter's bf16 dot is wrong
    timing_dtype = torch.float16 if args.smoke else torch.bfloat16
    for name, fn in (("window", time_window), ("softcap", time_softcap), ("mla", time_mla)):
        if name not in skip and within_budget(f"timing {name}"):
            try:
                fn(timing_dtype)
            except Exception as exc:  # noqa: BLE001
                note_error(name, exc)
            if not args.smoke:
                torch.cuda.empty_cache()
    if "checks" not in skip and not args.smoke:
        checks(torch.float16)
    RESULTS["wall_s"] = time.time() - t0
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "attention_features.json")
    with open(path, "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    print(f"\nwrote {path} ({RESULTS['wall_s']:.0f} s)")
    print(f"{'':6} {'case':52} result")
    for section, case, figures in ROWS:
        print(f"{section:6} {case:52} {figures}")


if __name__ == "__main__":
    main()
