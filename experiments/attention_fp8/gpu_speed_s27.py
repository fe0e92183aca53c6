"""FP8 attention speed, session 27 (issue 34): the kernel's new switches, checked against float64 then timed beside
the current default, tilecore's bf16 attention and cuDNN (SDPA, bf16) in the same run.

    PYTHONPATH=. python3 experiments/attention_fp8/gpu_speed_s27.py [--smoke] [--full] [--d all|128|64] [--e2e]
        [--diag-lmma]

Variants (configs.GLUON_FORWARD keys; all off by default):
  l_mma                   l (the softmax's row sum) by the tensor cores: P times a [BN, 8] block of ones in shared
                          memory, a wgmma of N = 8 beside P V, in place of 64 FADD a thread and step; l then sums P
                          as rounded to e4m3 (O's weights sum to 1; lse off by up to P's rounding, ~5e-3). Runs 3-4
                          (l accumulated across blocks in the tensor cores): WRONG, lse off by 0.8-2.6; now a fresh
                          accumulator a block, added to l in float32 registers (4 FADD a step).
  rescale_tau / p_shift   conditional rescaling (FlashAttention-4): a row's running max moves only where the block's
                          max exceeds it by more than tau (base 2), and O *= alpha is skipped where no row of the
                          warpgroup moved; P is rounded as 2^p_shift p with p_shift + tau <= log2(448).
  exp2_fma_every 8        one exp2 in 8 on the FMA units (FlashAttention-4's cubic; 2 and 4 were slower in session 26,
                          when the step was issue-bound: with l_mma and tau its MUFU work is the longer chain).
  pingpong                FlashAttention-3's barriers (no gain at D128 in session 26; with fewer instructions a step
                          the two consumers' softmaxes, which share each sub-partition's MUFU, may gain from taking
                          turns).
  quick: "l_mma", "l_mma_fma8", "l_mma_pingpong" (flipped where the default has it on); --full adds "tau0.8" and
  "l_mma_tau0.8" (tau 0.8, p_shift 8; runs 3-4: tau alone 0.95-0.98x the default), "tau2.8" = (2.8, 6),
  "l_mma_tau2.8", "l_mma_tau0.8_fma4".
  Probe (timed, not checked: wrong results by design), D128 non-causal: "probe_no_softmax" (P = S: the step
  without its max, exp2 and sum: what the tensor cores, loads, P's cvt and O *= alpha cost alone).

check  every variant into NaN-poisoned buffers at a tail shape with GQA (B2 Hq8 Hkv2 N1000 Nk1100, D 128 causal;
       with --d 64 D 64 non-causal: masks, rows with no key) and on two (batch, head) slices of each timed problem: every element
       written, rel-RMS error of O against float64 attention on the dequantized inputs and against the float32
       emulation of the same math (reference.attention_fp8_emulated with the variant's tau and shift), as multiples
       of the bf16 rounding floor; lse against float64.
time   B16 H16 N4096, D 128 then D 64, non-causal then causal (--quick: the default): do_bench medians, TFLOP/s =
       4 B H N^2 D / t (halved causal), x tilecore bf16. --full adds N 1024 (B64) and N 16384 (B4) at D 128.
--e2e  instead: the convenience path end to end (attention_fp8_rotated's work: quantize.quantize_inputs, fused
       rotate + quantize, q per token, k per 128-key block, then the kernel) with each variant's kernel, beside
       attention_fp8_rotated itself and tilecore bf16, checked against float64 attention of the bf16 inputs.

Stops gracefully past FP8_BUDGET_S (default 85 s; --full 170). Prints a table last, JSON to
$OUT/attention_fp8_speed_s27.json (default /tmp/out). --smoke: tiny shapes on the CPU under TRITON_INTERPRET=1
(imports, shapes, the checks' code; the variants run on the interpreter's tl kernel with the same rule), no timing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

T0 = time.time()

# name -> (Gluon config overrides, the emulation's keywords (reference.attention_fp8_emulated))
VARIANTS = {"l_mma": (dict(l_mma=True), dict(l_rounded=True)),
            "l_mma_fma8": (dict(l_mma=True, exp2_fma_every=8), dict(l_rounded=True)),
            "l_mma_pingpong": (dict(l_mma=True, pingpong="flip"), dict(l_rounded=True))}
PROBES = {"probe_no_softmax": dict(probe_no_softmax=True)}
FULL_VARIANTS = {"tau0.8": (dict(rescale_tau=0.8, p_shift=8), dict(rescale_tau=0.8)),
                 "l_mma_tau0.8": (dict(l_mma=True, rescale_tau=0.8, p_shift=8), dict(l_rounded=True, rescale_tau=0.8)),
                 "l_mma_tau0.8_fma4": (dict(l_mma=True, rescale_tau=0.8, p_shift=8, exp2_fma_every=4),
                                       dict(l_rounded=True, rescale_tau=0.8)),
                 "tau2.8": (dict(rescale_tau=2.8, p_shift=6), dict(rescale_tau=2.8, p_shift=6)),
                 "l_mma_tau2.8": (dict(l_mma=True, rescale_tau=2.8, p_shift=6),
                                  dict(l_rounded=True, rescale_tau=2.8, p_shift=6))}


def rel_rms(x, ref) -> float:
    x, ref = x.double(), ref.double()
    return ((x - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-300)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--full", action="store_true", help="more variants and N 1024 / 16384 (~170 s)")
    ap.add_argument("--d", default="all", choices=("all", "128", "64"), help="the head dims timed (and tails checked)")
    ap.add_argument("--e2e", action="store_true", help="the convenience path end to end with each variant instead")
    ap.add_argument("--diag-lmma", action="store_true", help="instead: where l_mma's l goes wrong (run 3: lse off by 1-3)")
    args = ap.parse_args()
    budget = float(os.environ.get("FP8_BUDGET_S", "170" if args.full else "85"))
    left = lambda: budget - (time.time() - T0)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import tilecore
    from tilecore.ops.attention_fp8 import quantize_fp8
    from tilecore.ops.attention_fp8 import launch as fp8_launch
    from tilecore.ops.attention_fp8.reference import attention_fp8_emulated, attention_fp8_exact

    variants = dict(VARIANTS, **(FULL_VARIANTS if args.full else {}))
    dev = "cpu" if args.smoke else "cuda"
    dt = torch.float32 if args.smoke else torch.bfloat16
    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    result = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter smoke)",
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "variants": {n: v[0] for n, v in variants.items()}, "tails": [], "cases": []}
    path = os.path.join(out_dir, "attention_fp8_speed_s27.json")

    def save():
        with open(path, "w") as f:
            json.dump(result, f, indent=1)

    def bench(fn):
        import triton

        fn()
        return triton.testing.do_bench(fn, warmup=10, rep=50)

    def plan_for(q8, k8, causal, name):
        """(plan, the emulation's keywords) of variant ``name`` ("default": the shipped config); on the interpreter
        the tl kernel with the same rules."""
        p = fp8_launch.plan(q8, k8, causal)
        emulation = {} if name == "default" else variants[name][1]
        if p.path == "gluon":
            if name != "default":
                overrides = dict(variants[name][0])
                if overrides.get("pingpong") == "flip":  # the other setting than the default's
                    overrides["pingpong"] = not p.config["pingpong"]
                p = fp8_launch.plan(q8, k8, causal, config=dict(p.config, **overrides))
        else:
            p.config.update(RESCALE_TAU=emulation.get("rescale_tau", 0.0), P_SHIFT=emulation.get("p_shift", 8),
                            L_ROUNDED=emulation.get("l_rounded", False))
        return p, emulation

    def block_n(p):
        return p.config.get("block_n", p.config.get("BLOCK_N", 128))

    def check(name, q8, k8, v8, vt8, qs, ks, vs, causal, sl=None):
        """Run variant ``name`` into poisoned buffers; errors against float64 and the emulation (on the (batch,
        head) slices ``sl``, or all), as multiples of the bf16 floor. Returns (record, plan)."""
        B, Hq, N, D = q8.shape
        p, emulation = plan_for(q8, k8, causal, name)
        o = torch.full((B, Hq, N, D), float("nan"), dtype=dt, device=dev)
        lse = torch.full((B, Hq, N), float("nan"), dtype=torch.float32, device=dev)
        fp8_launch.forward(p, q8, k8, vt8, qs, ks, vs, causal, D ** -0.5, dt, True, out=o, lse=lse)
        written = bool(torch.isfinite(o).all().item() and (~lse.isnan()).all().item())
        if sl is not None:  # the slices (GQA: the kv head of q head h is h // group; here Hq == Hkv)
            pick = lambda t: torch.stack([t[b, h] for b, h in sl])[None]
            q8, k8, v8, qs, ks, vs, o, lse = map(pick, (q8, k8, v8, qs, ks, vs, o, lse))
        o_ref, lse_ref = attention_fp8_exact(q8, k8, v8, qs, ks, vs, causal=causal)
        o_emu, lse_emu = attention_fp8_emulated(q8, k8, v8, qs, ks, vs, causal=causal, block_n=block_n(p),
                                                **emulation)
        rows = torch.isfinite(lse_ref)
        sel = rows[..., None].expand_as(o_ref)
        floor = rel_rms(o_ref[sel].to(torch.bfloat16), o_ref[sel])
        rec = dict(written=written, err_over_floor=rel_rms(o[sel], o_ref[sel]) / floor,
                   emulation_over_floor=rel_rms(o_emu[sel], o_ref[sel]) / floor,
                   vs_emulation_over_floor=rel_rms(o[sel].float(), o_emu[sel]) / floor,
                   lse_max_err=(lse.double()[rows] - lse_ref[rows]).abs().max().item() if rows.any() else 0.0,
                   lse_vs_emulation=(lse[rows] - lse_emu[rows]).abs().max().item() if rows.any() else 0.0,
                   no_key_rows_ok=bool(((o[~rows] == 0).all() & (lse[~rows] == float("-inf")).all()).item()))
        return rec, p

    if args.e2e:
        return e2e(args, variants, dev, dt, left, bench, plan_for, result, save)
    if args.diag_lmma:  # its own JSON (run 5 ran it and the timing run into one file: the diagnosis was lost)
        path_diag = os.path.join(out_dir, "attention_fp8_diag_lmma_s27.json")

        def save_diag():
            with open(path_diag, "w") as f:
                json.dump(result, f, indent=1)

        return diag_lmma(dev, dt, result, save_diag)

    # 1. tails with GQA: every variant
    tails = ([(1, 2, 1, 40, 70, 64, True)] if args.smoke else
             [(2, 8, 2, 1000, 1100, 128, True)] * (args.d != "64") + [(2, 8, 2, 1000, 1100, 64, False)] * (args.d == "64"))
    for (B, Hq, Hkv, N, Nk, D, causal) in tails:
        g = torch.Generator(device=dev).manual_seed(N + Nk + D)
        q = torch.randn(B, Hq, N, D, device=dev, generator=g)
        k = torch.randn(B, Hkv, Nk, D, device=dev, generator=g) * 1.5
        v = torch.randn(B, Hkv, Nk, D, device=dev, generator=g)
        q8, qs = quantize_fp8(q, per="block")
        k8, ks = quantize_fp8(k, per="block")
        v8, vs = quantize_fp8(v, per="head")
        vt8 = quantize_fp8(v, per="head", layout="keys_permuted")[0]
        for name in variants:  # (the default passed this shape in session 27's first run)
            if left() < 45:
                print("tails: out of time budget", flush=True)
                break
            rec = dict(B=B, Hq=Hq, Hkv=Hkv, N=N, Nk=Nk, D=D, causal=causal, variant=name)
            try:
                c, p = check(name, q8, k8, v8, vt8, qs, ks, vs, causal)
                rec.update(c, path=p.path)
            except Exception as e:  # noqa: BLE001 -- report and go on
                rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                traceback.print_exc()
            print("tail", rec, flush=True)
            result["tails"].append(rec)
            save()

    # 2. the timed problems
    if args.smoke:
        cases = [(1, 1, 160, 64, True)]
    else:
        cases = [(16, 16, 4096, d, c) for d in (128, 64) if args.d in ("all", str(d)) for c in (False, True)]
        if args.full:
            cases += [(64, 16, 1024, 128, c) for c in (False, True)] + [(4, 16, 16384, 128, c) for c in (False, True)]
    for (B, H, N, D, causal) in cases:
        if left() < 12:
            print("cases: out of time budget", flush=True)
            break
        rec = dict(B=B, H=H, N=N, D=D, causal=causal, check={}, ms={})
        try:
            g = torch.Generator(device=dev).manual_seed(N + D + causal)
            q, k, v = (torch.randn(B, H, N, D, device=dev, generator=g).to(dt) for _ in range(3))
            flops = 4 * B * H * N * N * D / (2 if causal else 1)
            q8, qs = quantize_fp8(q, per="head")
            k8, ks = quantize_fp8(k, per="head")
            v8, vs = quantize_fp8(v, per="head")
            vt8 = quantize_fp8(v, per="head", layout="keys_permuted")[0]
            sl = [(0, 0), (B - 1, H - 1)]
            for name in ["default", *variants]:
                if left() < 8:
                    break
                try:
                    rec["check"][name], p = check(name, q8, k8, v8, vt8, qs, ks, vs, causal, sl)
                    if not args.smoke:
                        rec["ms"][name] = bench(lambda p=p: fp8_launch.forward(p, q8, k8, vt8, qs, ks, vs, causal,
                                                                               D ** -0.5, dt, True))
                except Exception as e:  # noqa: BLE001
                    rec["check"][name] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
                    traceback.print_exc()
                print(name, rec["check"][name], rec["ms"].get(name), flush=True)
            if not args.smoke and (D, causal) == (128, False):  # probes: timed only
                for name, overrides in PROBES.items():
                    if left() < 8:
                        break
                    try:
                        p = fp8_launch.plan(q8, k8, causal, config=dict(fp8_launch.plan(q8, k8, causal).config,
                                                                           **overrides))
                        rec["ms"][name] = bench(lambda p=p: fp8_launch.forward(p, q8, k8, vt8, qs, ks, vs, causal,
                                                                               D ** -0.5, dt, True))
                    except Exception as e:  # noqa: BLE001
                        rec["check"][name] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
                        traceback.print_exc()
                    print(name, rec["ms"].get(name), flush=True)
            if not args.smoke and left() > 5:
                try:
                    rec["ms"]["bf16"] = bench(lambda: tilecore.attention(q, k, v, causal=causal))
                except Exception as e:  # noqa: BLE001
                    rec["bf16_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            if not args.smoke and left() > 4:
                try:
                    from torch.nn.attention import SDPBackend, sdpa_kernel

                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        rec["ms"]["cudnn_bf16"] = bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                            q, k, v, is_causal=causal))
                except Exception as e:  # noqa: BLE001
                    rec["cudnn_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            rec["tflops"] = {n: flops / ms / 1e9 for n, ms in rec["ms"].items()}
            if "bf16" in rec["ms"]:
                rec["over_bf16"] = {n: rec["ms"]["bf16"] / ms for n, ms in rec["ms"].items()}
            if "default" in rec["ms"]:
                rec["over_default"] = {n: rec["ms"]["default"] / ms for n, ms in rec["ms"].items()}
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
        print("case", json.dumps(rec), flush=True)
        result["cases"].append(rec)
        save()
        if dev == "cuda":
            torch.cuda.empty_cache()

    save()
    print(f"\n{result['device']}  ({time.time() - T0:.0f} s)  variants {result['variants']}")
    print("checks: O err / bf16 floor (emulation's; kernel vs emulation), lse err, written, no-key rows")
    for r in result["tails"]:
        head = f"tail B{r['B']} Hq{r['Hq']} Hkv{r['Hkv']} N{r['N']} Nk{r['Nk']} D{r['D']} causal={r['causal']} {r['variant']}"
        print(head + ": " + (f"ERROR {r['error'][:150]}" if "error" in r else
                             f"{r['err_over_floor']:.2f} ({r['emulation_over_floor']:.2f}; {r['vs_emulation_over_floor']:.2f}) "
                             f"lse {r['lse_max_err']:.1e} (vs emulation {r['lse_vs_emulation']:.1e}) written {r['written']} "
                             f"no-key {r['no_key_rows_ok']}"))
    for r in result["cases"]:
        head = f"B{r['B']} H{r['H']} N{r['N']} D{r['D']} {'causal' if r['causal'] else 'full'}"
        if "error" in r:
            print(f"{head}: ERROR {r['error'][:200]}")
            continue
        print(head + " | " + "  ".join(
            f"{n}: {c['err_over_floor']:.2f} ({c['vs_emulation_over_floor']:.2f}){'' if c['written'] else ' NOT WRITTEN'}"
            if "err_over_floor" in c else f"{n}: {c}" for n, c in r["check"].items()))
    print("\nTFLOP/s (x tilecore bf16, x default)")
    for r in result["cases"]:
        if "error" in r:
            continue
        head = f"B{r['B']} H{r['H']} N{r['N']} D{r['D']} {'causal' if r['causal'] else 'full'}"
        print(head + " | " + "  ".join(
            f"{n} {t:.0f} ({r.get('over_bf16', {}).get(n, float('nan')):.2f}x, {r.get('over_default', {}).get(n, float('nan')):.3f})"
            for n, t in r.get("tflops", {}).items()))
    return 0


def e2e(args, variants, dev, dt, left, bench, plan_for, result, save):
    """--e2e: rotate + quantize + attend with each variant's kernel (the convenience path's work), timed and checked."""
    import tilecore
    from tilecore.ops.attention_fp8 import attention_fp8_rotated
    from tilecore.ops.attention_fp8 import launch as fp8_launch
    from tilecore.ops.attention_fp8.quantize import quantize_inputs

    cases = ([(1, 2, 160, 64, True)] if args.smoke else
             [(16, 16, 4096, d, c) for d in (128, 64) if args.d in ("all", str(d)) for c in (False, True)])
    for (B, H, N, D, causal) in cases:
        if left() < 10:
            print("e2e: out of time budget", flush=True)
            break
        rec = dict(B=B, H=H, N=N, D=D, causal=causal, e2e=True, check={}, ms={})
        try:
            g = torch.Generator(device=dev).manual_seed(N + D + causal)
            q, k, v = (torch.randn(B, H, N, D, device=dev, generator=g).to(dt) for _ in range(3))
            flops = 4 * B * H * N * N * D / (2 if causal else 1)
            o_exact = exact_attention(q[:1, :2], k[:1, :2], v[:1, :2], causal)
            floor = rel_rms(o_exact.to(torch.bfloat16), o_exact)
            q8, qs, k8, ks, v8, vs = quantize_inputs(q, k, v, True, "block", "fused", False)
            runs = {"e2e_default_public": lambda: attention_fp8_rotated(q, k, v, causal=causal),
                    "bf16": lambda: tilecore.attention(q, k, v, causal=causal)}
            for name in ["default", *variants]:
                p, _ = plan_for(q8, k8, causal, name)

                def run(p=p):
                    q8, qs, k8, ks, v8, vs = quantize_inputs(q, k, v, True, "block", "fused", False)
                    return fp8_launch.forward(p, q8, k8, v8, qs, ks, vs, causal, D ** -0.5, dt, True)[0]

                runs[f"e2e_{name}"] = run
            for name, fn in runs.items():
                if left() < 6:
                    break
                try:
                    with torch.no_grad():
                        o = fn()
                    rec["check"][name] = dict(written=bool(torch.isfinite(o).all().item()),
                                              err_over_floor=rel_rms(o[:1, :2], o_exact) / floor)
                    if not args.smoke:
                        rec["ms"][name] = bench(fn)
                except Exception as e:  # noqa: BLE001
                    rec["check"][name] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
                    traceback.print_exc()
                print(name, rec["check"][name], rec["ms"].get(name), flush=True)
            rec["tflops"] = {n: flops / ms / 1e9 for n, ms in rec["ms"].items()}
            if "bf16" in rec["ms"]:
                rec["over_bf16"] = {n: rec["ms"]["bf16"] / ms for n, ms in rec["ms"].items()}
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
        print("case", json.dumps(rec), flush=True)
        result["cases"].append(rec)
        save()
    print(f"\n{result['device']}  e2e: err / bf16 floor (written); TFLOP/s (x tilecore bf16)")
    for r in result["cases"]:
        head = f"B{r['B']} H{r['H']} N{r['N']} D{r['D']} {'causal' if r['causal'] else 'full'}"
        if "error" in r:
            print(f"{head}: ERROR {r['error'][:200]}")
            continue
        print(head + " | " + "  ".join(f"{n}: {c['err_over_floor']:.2f}{'' if c['written'] else ' NOT WRITTEN'}"
                                       if "err_over_floor" in c else f"{n}: {c}" for n, c in r["check"].items()))
        print("    " + "  ".join(f"{n} {t:.0f} ({r.get('over_bf16', {}).get(n, float('nan')):.2f}x)"
                                 for n, t in r.get("tflops", {}).items()))
    return 0


def diag_lmma(dev, dt, result, save):
    """--diag-lmma: l_mma's l against the expected, row by row, on problems that isolate its paths. Each case runs the
    Gluon kernel with l_mma (and without, as a control) and reports, per (tile, consumer), the ratio l_kernel / l
    (from lse: exp(lse_kernel - lse_expected)) min / median / max. Cases: q = 0 (every score 0: P = 256 everywhere,
    m constant so alpha = 1, l = 256 Nk exactly) with Nk 128 (one key block: only the last-P-V step adds to l) and
    Nk 512 (steady steps, no rescale); random inputs Nk 512 (rescales); and v = 1 (O must be v_scale everywhere: O / l
    consistent)."""
    from tilecore.ops.attention_fp8 import launch as fp8_launch
    from tilecore.ops.attention_fp8 import quantize_fp8
    from tilecore.ops.attention_fp8.reference import attention_fp8_emulated

    D, N = 128, 256  # two tiles of 2 x 64 rows
    result["diag_lmma"] = []
    for name, nk, zero_q in (("q0_nk128", 128, True), ("q0_nk512", 512, True), ("random_nk512", 512, False),
                             ("random_nk2048", 2048, False)):
        for l_mma in (False, True):
            rec = dict(case=name, l_mma=l_mma)
            try:
                g = torch.Generator(device=dev).manual_seed(nk)
                q = torch.randn(1, 1, N, D, device=dev, generator=g) * (0.0 if zero_q else 1.0)
                k = torch.randn(1, 1, nk, D, device=dev, generator=g)
                v = torch.randn(1, 1, nk, D, device=dev, generator=g)
                q8, qs = quantize_fp8(q + (1e-3 if zero_q else 0.0), per="head")
                if zero_q:
                    q8 = torch.zeros_like(q8)
                k8, ks = quantize_fp8(k, per="head")
                v8, vs = quantize_fp8(v, per="head")
                vt8 = quantize_fp8(v, per="head", layout="keys_permuted")[0]
                p = fp8_launch.plan(q8, k8, False)
                if p.path == "gluon":
                    p = fp8_launch.plan(q8, k8, False, config=dict(p.config, l_mma=l_mma))
                o = torch.full((1, 1, N, D), float("nan"), dtype=dt, device=dev)
                lse = torch.full((1, 1, N), float("nan"), dtype=torch.float32, device=dev)
                fp8_launch.forward(p, q8, k8, vt8, qs, ks, vs, False, D ** -0.5, dt, True, out=o, lse=lse)
                o_emu, lse_emu = attention_fp8_emulated(q8, k8, v8, qs, ks, vs, block_n=128, l_rounded=l_mma)
                ratio = torch.exp(lse.double() - lse_emu.double())[0, 0]  # l_kernel / l per row
                groups = {}
                for t in range(N // 128):
                    for c in range(2):
                        r = ratio[t * 128 + c * 64: t * 128 + c * 64 + 64]
                        groups[f"tile{t}_consumer{c}"] = [round(r.min().item(), 4), round(r.median().item(), 4),
                                                          round(r.max().item(), 4)]
                rec.update(l_ratio_min_median_max=groups,
                           o_rel_err_vs_emulation=rel_rms(o.float(), o_emu.float()),
                           lse_first_rows=[round(x, 4) for x in lse[0, 0, :3].tolist()],
                           lse_expected_first_rows=[round(x, 4) for x in lse_emu[0, 0, :3].tolist()])
            except Exception as e:  # noqa: BLE001
                rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                traceback.print_exc()
            print("diag", json.dumps(rec), flush=True)
            result["diag_lmma"].append(rec)
            save()
    print(f"\n{result['device']}  l_mma diagnosis: l_kernel / l (min, median, max) per tile and consumer")
    for r in result["diag_lmma"]:
        print(f"{r['case']:14s} l_mma={r['l_mma']!s:5s} " + (f"ERROR {r['error'][:150]}" if "error" in r else
              f"O err vs emulation {r['o_rel_err_vs_emulation']:.2e}  " + "  ".join(
                  f"{k}: {v}" for k, v in r["l_ratio_min_median_max"].items())))
    return 0


def exact_attention(q, k, v, causal):
    """float64 softmax(q k^T / sqrt(D)) v of (B, H, N, D) tensors, causal bottom right (N == Nk here)."""
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        n, nk = s.shape[-2], s.shape[-1]
        s = s.masked_fill(torch.ones(n, nk, dtype=torch.bool, device=s.device).triu(nk - n + 1), float("-inf"))
    return torch.softmax(s, -1) @ v


if __name__ == "__main__":
    sys.exit(main())
