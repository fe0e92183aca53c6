"""FP8 attention, session 30 (issue 34: the forward to 1.5x bf16): the new switches checked, then timed beside the
shipped default, tilecore's bf16 forward and cuDNN (SDPA) in the same run.

    PYTHONPATH=. python3 experiments/attention_fp8/gpu_speed_s30.py            (~60-85 s on the H100; --quick is the default)
    [--smoke] [--variants q8,q4,pp,...] [--cases d128,d128c,d64,d64c] [--budget 85]

Variants (each a configs.GLUON_FORWARD override on the shipped l_mma + tree default; `VARIANTS` below):
  q8, q4, q2   one exp2 in 8 / 4 / 2 by the quadratic on the FMA units (gluon_fp8.exp2_fma_ptx(2): one FFMA fewer than
               the cubic, 1.7e-3 relative error, under e4m3's half-step): exp2_fma_every -8 / -4 / -2
  c8           the cubic one in 8 (session 29 run 4: 0.98x): the quadratic's baseline
  pp           ping-pong flipped (FA3's warp-scheduler barriers between the two consumers)
  packed       P rounded to e4m3 at the softmax's end and carried packed, 4 a register, as int32 (cast_late 2:
               gluon_fp8.pack_e4m3x4): no float32 P beside the next S (sm_90a D128: 0 spills against 32, the step 454
               instructions against 467, no PRMT)
  pp2, pp3     ping-pong with the turn passed after the row max (2) / after the exponentials (3) instead of right
               after the issue (run 1: pp 0.99x): the other consumer's S runs under this one's exponentials
  packed_pp2   both
  bn160        (D64) key steps of 160 (128 + 32: two K and two V^T blocks a stage, block_n2 = 32), FlashAttention-3's
               FP8 D64 key block: the step's fixed costs (O *= alpha, the row max's quad shuffles, the waits and the
               issue) over 1.25x the keys. (D128 cannot: 168 registers a thread for 384 threads, the split step spills
               736-952 bytes there; notes/attention_fp8/README.md)
  bn160q4      bn160 with q4
Cases (B16 H16 N4096): d128, d128c (causal), d64 (H16 D64), d64c. Each variant is checked before it is timed: NaN-
poisoned outputs, two (batch, head) slices of the timed problem against float64 attention of the dequantized inputs
and the float32 emulation (reference.attention_fp8_emulated at the variant's key step, l of the rounded P); at the
end, while the budget lasts, a GQA tail (B2 Hq8 Hkv2 N1000 Nk1100, causal, per-block descales; D128 and D64) per
variant. O's error as multiples of the bf16 rounding floor; ok = every element written, O within 8x the floor of the
emulation, lse within 2e-2 of it, rows with no key 0 and -inf.

Prints each result as it comes, a table last; JSON to $OUT/attention_fp8_speed_s30.json (default /tmp/out). Stops
gracefully past --budget seconds. --smoke: CPU, TRITON_INTERPRET=1, tiny shapes on the tl kernel (imports, shapes
and the checks' code), no timing.
"""
from __future__ import annotations

import argparse
import json
import os
import time
import traceback

import torch

T0 = time.time()

# name -> (overrides of configs.gluon_config, the cases where it is timed)
VARIANTS = {
    "q8": (dict(exp2_fma_every=-8), ("d128", "d128c", "d64", "d64c")),
    "q4": (dict(exp2_fma_every=-4), ("d128", "d64")),
    "q2": (dict(exp2_fma_every=-2), ("d64",)),
    "c8": (dict(exp2_fma_every=8), ("d128",)),
    "pp": (dict(pingpong="flip"), ("d128", "d64c")),  # (D64 causal ships ping-pong on: flipped = off there)
    "packed": (dict(cast_late=2), ("d128", "d128c", "d64", "d64c")),
    "pp2": (dict(pingpong=2), ("d128", "d64c")),
    "pp3": (dict(pingpong=3), ("d128",)),
    "packed_pp2": (dict(cast_late=2, pingpong=2), ("d128",)),
    "bn160": (dict(block_n2=32), ("d64",)),
    "bn160q4": (dict(block_n2=32, exp2_fma_every=-4), ("d64",)),
}
# what a later session's wrapper may replace (gpu_speed_s31.py): the JSON's name, the variants the tails run (None:
# all), the trace's (label, overrides)
JSON_NAME = "attention_fp8_speed_s30.json"
TAIL_VARIANTS = None
SPLIT_TAILS = None  # the split steps' tail shapes (None: D64 causal and not)
TRACE_VARIANTS = (("default", {}), ("pp", dict(pingpong="flip")))
CASES = {"d128": (16, 16, 4096, 128, False), "d128c": (16, 16, 4096, 128, True),
         "d64": (16, 16, 4096, 64, False), "d64c": (16, 16, 4096, 64, True)}


def rel_rms(x, ref) -> float:
    x, ref = x.double(), ref.double()
    return ((x - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-300)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--quick", action="store_true", help="(the default: the case and variant lists below)")
    ap.add_argument("--variants", default="packed,pp2,pp3,packed_pp2,bn160", help="comma-separated names of VARIANTS")
    ap.add_argument("--cases", default="d128,d128c,d64,d64c")
    ap.add_argument("--budget", type=float, default=float(os.environ.get("FP8_BUDGET_S", "85")))
    ap.add_argument("--trace", default="",
                    help="timing probe first (comma-separated cases, e.g. d128,d64): program 0's SM clock at 5 points of "
                    "each step of each consumer (gluon_fp8.AttentionFp8.stamp), the default and ping-pong flipped; "
                    "prints the phases' medians (cycles) and the consumers' offset")
    args = ap.parse_args()
    left = lambda: args.budget - (time.time() - T0)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import tilecore
    from tilecore.ops.attention_fp8 import configs
    from tilecore.ops.attention_fp8 import launch as fp8_launch
    from tilecore.ops.attention_fp8 import quantize_fp8
    from tilecore.ops.attention_fp8.reference import attention_fp8_emulated, attention_fp8_exact

    dev = "cpu" if args.smoke else "cuda"
    dt = torch.float32 if args.smoke else torch.bfloat16
    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    names = [v for v in args.variants.split(",") if v]
    case_names = [c for c in args.cases.split(",") if c]
    result = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter smoke)",
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "configs": {f"d{d}{'c' if c else ''}": {k: str(v) for k, v in configs.gluon_config(d, c).items()}
                          for d in configs.GLUON_FORWARD for c in (False, True)},
              "variants": {n: {k: str(v) for k, v in VARIANTS[n][0].items()} for n in names}, "cases": [], "tails": []}
    path = os.path.join(out_dir, JSON_NAME)
    print("shipped configs:", json.dumps(result["configs"]), flush=True)

    def save():
        with open(path, "w") as f:
            json.dump(result, f, indent=1)

    def bench(fn):
        import triton

        fn()
        return triton.testing.do_bench(fn, warmup=10, rep=40)

    def plan_for(q8, k8, causal, overrides):
        """(plan, the emulation's keywords): the Gluon config with ``overrides``; on the interpreter the tl kernel
        with the same rule for l (L_ROUNDED) and its own blocks."""
        p = fp8_launch.plan(q8, k8, causal)
        if p.path == "gluon":
            overrides = dict(overrides)
            if overrides.get("pingpong") == "flip":
                overrides["pingpong"] = not p.config["pingpong"]
            p = fp8_launch.plan(q8, k8, causal, config=dict(p.config, **overrides))
            l_rounded = bool(p.config.get("l_mma", 0))
            step = p.config["block_n"] + p.config.get("block_n2", 0)
            if p.config.get("pv_smem", 0) >= 2:  # (session 31's pipelined halves: the running max moves per half)
                step = min(p.config["block_n"], p.config["block_n2"])
        else:
            p.config.update(L_ROUNDED=True)
            l_rounded, step = True, p.config["BLOCK_N"]
        return p, dict(l_rounded=l_rounded, block_n=step)

    def run(p, q8, k8, vt8, qs, ks, vs, causal):
        B, Hq, N, D = q8.shape
        o = torch.full((B, Hq, N, D), float("nan"), dtype=dt, device=dev)
        lse = torch.full((B, Hq, N), float("nan"), dtype=torch.float32, device=dev)
        fp8_launch.forward(p, q8, k8, vt8, qs, ks, vs, causal, D ** -0.5, dt, True, out=o, lse=lse)
        return o, lse

    def check(overrides, q8, k8, v8, vt8, qs, ks, vs, causal, sl=None):
        """Errors of the variant against float64 and the emulation (on the (batch, head) slices ``sl``, or all)."""
        p, emulation = plan_for(q8, k8, causal, overrides)
        o, lse = run(p, q8, k8, vt8, qs, ks, vs, causal)
        written = bool(torch.isfinite(o).all().item() and (~lse.isnan()).all().item())
        if sl is not None:
            pick = lambda t: torch.stack([t[b, h] for b, h in sl])[None]
            q8, k8, v8, qs, ks, vs, o, lse = map(pick, (q8, k8, v8, qs, ks, vs, o, lse))
        o_ref, lse_ref = attention_fp8_exact(q8, k8, v8, qs, ks, vs, causal=causal)
        o_emu, lse_emu = attention_fp8_emulated(q8, k8, v8, qs, ks, vs, causal=causal, **emulation)
        rows = torch.isfinite(lse_ref)
        sel = rows[..., None].expand_as(o_ref)
        floor = rel_rms(o_ref[sel].to(torch.bfloat16), o_ref[sel])
        rec = dict(written=written, err_over_floor=rel_rms(o[sel], o_ref[sel]) / floor,
                   emulation_over_floor=rel_rms(o_emu[sel], o_ref[sel]) / floor,
                   vs_emulation_over_floor=rel_rms(o[sel].float(), o_emu[sel]) / floor,
                   lse_max_err=(lse.double()[rows] - lse_ref[rows]).abs().max().item() if rows.any() else 0.0,
                   lse_vs_emulation=(lse[rows] - lse_emu[rows]).abs().max().item() if rows.any() else 0.0,
                   no_key_rows_ok=bool(((o[~rows] == 0).all() & (lse[~rows] == float("-inf")).all()).item()),
                   step=emulation["block_n"])
        rec["ok"] = bool(written and rec["vs_emulation_over_floor"] < 8 and rec["lse_vs_emulation"] < 2e-2
                         and rec["no_key_rows_ok"])
        return rec, p

    def quantized(B, Hq, Hkv, N, Nk, D, seed, per="head", per_k=None):
        g = torch.Generator(device=dev).manual_seed(seed)
        q = torch.randn(B, Hq, N, D, device=dev, generator=g)
        k = torch.randn(B, Hkv, Nk, D, device=dev, generator=g)
        v = torch.randn(B, Hkv, Nk, D, device=dev, generator=g)
        q8, qs = quantize_fp8(q, per=per)
        k8, ks = quantize_fp8(k, per=per_k or per)
        v8, vs = quantize_fp8(v, per="head")
        vt8 = quantize_fp8(v, per="head", layout="keys_permuted")[0]
        return q8, k8, v8, vt8, qs, ks, vs

    # the timed problems: per case the default, bf16, cuDNN, then the variants timed there (each checked first)
    cases = {"smoke": (1, 1, 160, 64, False)} if args.smoke else {c: CASES[c] for c in case_names}
    data_of = {}

    def run_cases(these, first):
        """Check and time the variants ``these`` in their cases (with ``first``: the default, bf16 and cuDNN too)."""
        for cname, (B, H, N, D, causal) in cases.items():
            todo = (["default", "bf16", "cudnn"] if first else []) + [
                n for n in these if args.smoke or cname in VARIANTS[n][1]]
            if not todo:
                continue
            if left() < 12:
                print(f"{cname}: out of time budget", flush=True)
                break
            rec = next((r for r in result["cases"] if r["case"] == cname), None)
            if rec is None:
                rec = dict(case=cname, B=B, H=H, N=N, D=D, causal=causal, check={}, ms={})
                result["cases"].append(rec)
            try:
                if cname not in data_of:
                    g = torch.Generator(device=dev).manual_seed(N + D + causal)
                    q, k, v = (torch.randn(B, H, N, D, device=dev, generator=g).to(dt) for _ in range(3))
                    q8, qs = quantize_fp8(q, per="head")
                    k8, ks = quantize_fp8(k, per="head")
                    v8, vs = quantize_fp8(v, per="head")
                    vt8 = quantize_fp8(v, per="head", layout="keys_permuted")[0]
                    data_of[cname] = (q, k, v, q8, k8, v8, vt8, qs, ks, vs)
                q, k, v, q8, k8, v8, vt8, qs, ks, vs = data_of[cname]
                flops = 4 * B * H * N * N * D / (2 if causal else 1)
                sl = [(0, 0), (B - 1, H - 1)]
                for name in todo:
                    if left() < 8:
                        print(f"{cname} {name}: out of time budget", flush=True)
                        break
                    try:
                        if name == "bf16":
                            if not args.smoke:
                                rec["ms"][name] = bench(lambda: tilecore.attention(q, k, v, causal=causal))
                            continue
                        if name == "cudnn":
                            if not args.smoke and cname == "d128":  # (run 1 timed all four: 0.93-0.96x bf16)
                                from torch.nn.attention import SDPBackend, sdpa_kernel

                                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                                    rec["ms"][name] = bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                                        q, k, v, is_causal=causal))
                            continue
                        overrides = {} if name == "default" else VARIANTS[name][0]
                        rec["check"][name], p = check(overrides, q8, k8, v8, vt8, qs, ks, vs, causal, sl)
                        if not args.smoke:
                            rec["ms"][name] = bench(lambda p=p: fp8_launch.forward(p, q8, k8, vt8, qs, ks, vs, causal,
                                                                                   D ** -0.5, dt, True))
                    except Exception as e:  # noqa: BLE001 -- report and go on
                        rec.setdefault("errors", {})[name] = f"{type(e).__name__}: {str(e)[:300]}"
                        traceback.print_exc()
                    print(cname, name, rec["check"].get(name), rec["ms"].get(name), rec.get("errors", {}).get(name),
                          flush=True)
                rec["tflops"] = {n: flops / ms / 1e9 for n, ms in rec["ms"].items()}
                if "bf16" in rec["ms"]:
                    rec["over_bf16"] = {n: rec["ms"]["bf16"] / ms for n, ms in rec["ms"].items()}
                if "default" in rec["ms"]:
                    rec["over_default"] = {n: rec["ms"]["default"] / ms for n, ms in rec["ms"].items()}
            except Exception as e:  # noqa: BLE001
                rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
                traceback.print_exc()
            save()

    # tails (GQA, per-block descales, N and Nk not multiples of the blocks), each variant at D128 causal and D64; the
    # split steps (block_n2) at D64 causal and not, with k's descales per head (what they take; q's per block)
    tails = [(1, 2, 1, 40, 70, 64, True)] if args.smoke else [(2, 8, 2, 1000, 1100, 128, True),
                                                               (2, 8, 2, 1000, 1100, 64, False)]
    split_tails = [(1, 2, 1, 40, 70, 64, True)] if args.smoke else SPLIT_TAILS or [(2, 8, 2, 1000, 1100, 64, True),
                                                                                    (2, 8, 2, 1000, 1100, 64, False)]

    def run_tails(these):
        for name in these:
            split = bool(VARIANTS[name][0].get("block_n2"))
            shapes = split_tails if split else tails
            if VARIANTS[name][0].get("pingpong") in (2, 3):  # (its D64 non-causal tail: one more compile)
                shapes = shapes[:1]
            for shape in shapes:
                if left() < 6:
                    print(f"tail {name}: out of time budget", flush=True)
                    break
                B, Hq, Hkv, N, Nk, D, causal = shape
                rec = dict(B=B, Hq=Hq, Hkv=Hkv, N=N, Nk=Nk, D=D, causal=causal, variant=name,
                           k_scales="head" if split else "block")
                try:
                    data = quantized(B, Hq, Hkv, N, Nk, D, N + Nk + D, per="block", per_k="head" if split else None)
                    c, p = check(VARIANTS[name][0], *data, causal)
                    rec.update(c, path=p.path, config={k: str(v) for k, v in p.config.items()})
                except Exception as e:  # noqa: BLE001
                    rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    traceback.print_exc()
                print("tail", json.dumps(rec), flush=True)
                result["tails"].append(rec)
                save()

    def run_trace(cname, overrides, label):
        """TRACE: one launch with the stamps on, then per consumer the medians over steps 2..29 of each phase (cycles):
        entry -> issued (the turn, P's conversion, the issue), issued -> S waited, S -> softmax done (with P V's wait,
        which ptxas hoists above the softmax), softmax -> P V waited, and the step's period; and consumer 1's entry
        minus consumer 0's (the two in phase or not)."""
        B, H, N, D, causal = CASES[cname]
        g = torch.Generator(device=dev).manual_seed(7)
        q, k, v = (torch.randn(B, H, N, D, device=dev, generator=g).to(dt) for _ in range(3))
        q8, qs = quantize_fp8(q, per="head")
        k8, ks = quantize_fp8(k, per="head")
        vt8, vs = quantize_fp8(v, per="head", layout="keys_permuted")
        trace = torch.zeros(2 * 64 * 8, dtype=torch.int32, device=dev)
        p, _ = plan_for(q8, k8, causal, dict(overrides, trace=trace))
        fp8_launch.forward(p, q8, k8, vt8, qs, ks, vs, causal, D ** -0.5, dt, True)
        trace.zero_()
        fp8_launch.forward(p, q8, k8, vt8, qs, ks, vs, causal, D ** -0.5, dt, True)
        torch.cuda.synchronize()
        t = trace.view(2, 64, 8).long().cpu().tolist()  # (python ints: the clock wraps at 2^32)
        rec = dict(case=cname, variant=label, consumers=[])
        steps = range(2, 30)
        med = lambda xs: float(torch.tensor(xs, dtype=torch.float64).median()) if xs else float("nan")
        wrap = lambda d: d % (1 << 32)
        for c in range(2):
            ph = {name: med([wrap(t[c][j][b] - t[c][j][a]) for j in steps]) for name, (a, b) in
                  dict(issue=(0, 1), s_wait=(1, 2), softmax=(2, 3), pv_wait=(3, 4)).items()}
            ph["period"] = med([wrap(t[c][j + 1][0] - t[c][j][0]) for j in steps])
            rec["consumers"].append(ph)
        rec["offset_c1_c0"] = med([((t[1][j][0] - t[0][j][0] + (1 << 31)) % (1 << 32)) - (1 << 31) for j in steps])
        result.setdefault("traces", []).append(rec)
        print("trace", json.dumps(rec), flush=True)
        save()

    if not args.smoke:
        for cname in [c for c in args.trace.split(",") if c]:
            for label, overrides in TRACE_VARIANTS:
                if left() < 20:
                    break
                try:
                    run_trace(cname, overrides, label)
                except Exception as e:  # noqa: BLE001
                    print(f"trace {cname} {label}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
                    traceback.print_exc()

    # the split steps (new kernel code: a fault would end the process) after everything else
    plain = [n for n in names if not VARIANTS[n][0].get("block_n2")]
    split_names = [n for n in names if VARIANTS[n][0].get("block_n2")]
    run_cases(plain, True)
    run_tails([n for n in plain if TAIL_VARIANTS is None or n in TAIL_VARIANTS])
    run_cases(split_names, False)
    run_tails([n for n in split_names if TAIL_VARIANTS is None or n in TAIL_VARIANTS])

    save()
    print(f"\n{result['device']}  ({time.time() - T0:.0f} s)")
    for r in result["tails"]:
        head = f"tail B{r['B']} Hq{r['Hq']} Hkv{r['Hkv']} N{r['N']} Nk{r['Nk']} D{r['D']} " \
               f"{'causal' if r['causal'] else 'full'} {r['variant']}"
        print(head + ": " + (f"ERROR {r['error'][:150]}" if "error" in r else
                             f"O {r['err_over_floor']:.2f}x floor (emulation {r['emulation_over_floor']:.2f}, vs it "
                             f"{r['vs_emulation_over_floor']:.2f}) lse vs emulation {r['lse_vs_emulation']:.1e} "
                             f"written {r['written']} no-key {r['no_key_rows_ok']} ok {r['ok']}"))
    for r in result.get("traces", []):
        print(f"trace {r['case']} {r['variant']}: c1 - c0 entry {r['offset_c1_c0']:.0f} cycles; " + "; ".join(
            f"c{i} " + " ".join(f"{k} {v:.0f}" for k, v in c.items()) for i, c in enumerate(r["consumers"])))
    print("\nTFLOP/s (x tilecore bf16, x default); check: O err / bf16 floor (vs emulation), ok")
    for r in result["cases"]:
        head = f"{r['case']:6s} B{r['B']} H{r['H']} N{r['N']} D{r['D']} {'causal' if r['causal'] else 'full'}"
        if "error" in r:
            print(f"{head}: ERROR {r['error'][:200]}")
            continue
        print(head + " | " + "  ".join(
            f"{n}: {c['err_over_floor']:.2f} ({c['vs_emulation_over_floor']:.2f}) {'ok' if c['ok'] else 'BAD'}"
            for n, c in r["check"].items()) + "".join(f"  {n}: ERROR {e[:80]}" for n, e in r.get("errors", {}).items()))
        print(head + " | " + "  ".join(
            f"{n} {t:.0f} ({r.get('over_bf16', {}).get(n, float('nan')):.2f}x, "
            f"{r.get('over_default', {}).get(n, float('nan')):.3f})" for n, t in r.get("tflops", {}).items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
