"""FP8 attention, session 35 (issue 34): the convenience path with q rotated and quantized inside Hopper's kernel
(configs.ROTATED["q_in_kernel"]; the kernel's Q_ROTATE) against the shipped form (rotate_quantize's pass over q, then
the kernel) and tilecore's bf16 forward, end to end from bf16, in the same run. Target: >= 1.2x bf16 at causal D128
B16 H16 N4096 (session 34 call 5: 1.046x).

    PYTHONPATH=. python3 experiments/attention_fp8/gpu_qrot_s35.py [--budget 58] [--smoke]

Forms (switches.patched(configs, ROTATED=...)): "block" (shipped: v per 128-key block, q by rotate_quantize), "q3"
(q in the kernel, the shipped 3 stages and 2 bf16 Q buffers a consumer, the codes written over the bf16 buffer),
"q31" (D128 with 1 Q buffer a consumer: the next tile's Q loads only after this tile; timed at D128 causal only).

1. D128 causal B16 H16 N4096: O of each form against float64 attention of the bf16 inputs on a slice (error as a
   multiple of the bf16 rounding floor; all finite), then timings (triton.testing.do_bench medians): end to end, and
   the parts: each kernel alone (k and v quantized once; q3 / q31 launched by launch.forward_q_rotated) and the
   quantizing passes of q, k, v. Calls 3 and 4 of session 35 also timed the kernel's timing probes probe_pv2 (P V
   issued twice a step) and probe_rot 1 / 2 (no rotation product / no rotate_q); wrong O, removed after those runs
   (issue 30): their code and this script's rows for them at commit 34f350a.
2. q in the kernel against its twin (quantize.rotate_quantize_rows for q, rotate_quantize for k per block,
   quantize_v_permuted per block, attention_fp8_emulated with P's linear code) on a GQA tail (B2 Hq8 Hkv2 N1008 Nk1104,
   D128 causal: neither a multiple of 128; v's magnitude 10^-2..10^2 along the keys), O, lse and the no-key rows;
   against float64 beside the shipped form.
3. FlashAttention-3's outlier test (N(0,1) + N(0,100) w.p. 0.001, B1 H16 N2048 D128, RMSE against float64; target
   <= 9.1e-3 rotated): block and q3.
   3b. A scaled score that overflows float32 (q's descale 3e38 on one head, per-head descales): its rows NaN.
4. If time is left: D128 full, D64 causal, D64 full end to end (bf16, block, q3).
--confirm (the second batch): D128 causal block against q31 (1 Q buffer) with the kernels alone, then D64 (the tail
against the twin, causal end to end), the outlier test, D128 full (block, q3, q31) and D64 full.
--rest (what calls 3 and 4 left): q in the kernel against its twin on D64 GQA tails (causal, full), D128 full end to
end (block, q3, q31: 1 Q buffer), D64 full (block, q3). Prints rows as it goes, a table last; JSON to $OUT/attention_fp8_qrot_s35.json. --smoke: CPU, tiny shapes (the
twin in place of the kernel: checks the script, not the kernel).
"""
from __future__ import annotations

import argparse
import json
import os
import time
import traceback

import torch

T0 = time.time()


def rel_rms(x, ref) -> float:
    x, ref = x.double(), ref.double()
    return ((x - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-300)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--budget", type=float, default=58.0)
    ap.add_argument("--confirm", action="store_true", help="the second batch: checks first, then e2e block vs q3")
    ap.add_argument("--rest", action="store_true", help="what calls 3-4 left: D64 tails, D128 / D64 full")
    args = ap.parse_args()
    left = lambda: args.budget - (time.time() - T0)
    smoke = args.smoke
    import tilecore
    from tilecore.ops.attention_fp8 import attention_fp8_rotated, configs
    from tilecore.ops.attention_fp8.quantize import (quantize_v_permuted, rotate_quantize, rotate_quantize_rows,
                                                     rotation_signs)
    from tilecore.ops.attention_fp8.reference import attention_fp8_emulated, keys_unpermuted
    from tilecore.tiles.switches import patched

    dev = "cpu" if smoke else "cuda"
    dt = torch.float32 if smoke else torch.bfloat16
    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "attention_fp8_qrot_s35.json")
    result = {"device": torch.cuda.get_device_name() if not smoke else "cpu (smoke)", "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "e2e": [], "checks": [], "outlier": {},
              "notes": []}
    shipped = dict(configs.ROTATED)
    forms = {"block": dict(shipped, q_in_kernel=()),
             "q3": dict(shipped, q_in_kernel=(64, 128), q_buffers={}),
             "q31": dict(shipped, q_in_kernel=(64, 128), q_buffers={128: 1})}

    def save():
        with open(path, "w") as f:
            json.dump(result, f, indent=1)

    def bench(fn):
        fn()
        if smoke:
            t = time.time()
            fn()
            return (time.time() - t) * 1e3
        import triton

        return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")

    def run_form(form, *a, **kw):
        with patched(configs, ROTATED=forms[form]):
            return attention_fp8_rotated(*a, **kw)

    def reference(q, k, v, causal, b, h):
        qf, kf, vf = (t[b, h].double() for t in (q, k, v))
        s = (qf @ kf.T) * qf.shape[-1] ** -0.5
        if causal:
            n, nk = s.shape
            allowed = torch.arange(nk, device=dev)[None, :] <= torch.arange(n, device=dev)[:, None] + nk - n
            s = s.masked_fill(~allowed, float("-inf"))
        return torch.softmax(s, -1) @ vf

    def e2e(B, H, N, D, causal, names, parts=()):
        row = dict(B=B, H=H, N=N, D=D, causal=causal)
        try:
            g = torch.Generator(device=dev).manual_seed(N + D + causal)
            q, k, v = (torch.randn(B, H, N, D, device=dev, generator=g).to(dt) for _ in range(3))
            ref = reference(q, k, v, causal, B - 1, H - 1)
            floor = rel_rms(ref.to(torch.bfloat16), ref)
            ms = {"bf16": bench(lambda: tilecore.attention(q, k, v, causal=causal))}
            row.update(ms=ms)
            for name in names:  # each form checked, then timed, printed as it goes (a hang loses only what follows)
                o = run_form(name, q, k, v, causal=causal)
                row[f"err_over_floor_{name}"] = rel_rms(o[B - 1, H - 1], ref) / floor
                row[f"written_{name}"] = bool(torch.isfinite(o).all().item())
                del o
                with patched(configs, ROTATED=forms[name]):
                    ms[name] = bench(lambda: attention_fp8_rotated(q, k, v, causal=causal))
                print(f"  D{D} {'causal' if causal else 'full'} {name}: {ms[name]:.3f} ms, bf16 {ms['bf16']:.3f} "
                      f"({ms['bf16'] / ms[name]:.3f}x), O {row[f'err_over_floor_{name}']:.1f}x the floor, written "
                      f"{row[f'written_{name}']}", flush=True)
            row.update(ms=ms, over_bf16={n: ms["bf16"] / x for n, x in ms.items()})
            print("e2e", json.dumps(row), flush=True)
            if parts and not smoke:  # the kernels alone (k and v quantized once) and the quantizing passes
                from tilecore.ops.attention_fp8 import attention_fp8, launch

                signs = rotation_signs(D, q.device)
                q8, qs = rotate_quantize(q, signs=signs, scales="token")
                k8, ks = rotate_quantize(k, signs=signs, scales="block")
                v8, vs = quantize_v_permuted(v, per="block")
                kern = {"kernel_block": bench(lambda: attention_fp8(q8, k8, v8, q_scale=qs, k_scale=ks, v_scale=vs,
                                                                     causal=causal, v_layout="keys_permuted",
                                                                     check_scales=False))}
                # the q forms' kernels (calls 3-4 also timed probes of the kernel, removed since: module docstring)
                for label, name, extra in parts:
                    with patched(configs, ROTATED=forms[name]):
                        cfg = dict(launch.rotated_q_config(D, causal), **extra)
                    kern[f"kernel_{label}"] = bench(lambda: launch.forward_q_rotated(
                        q, signs, k8, v8, ks, vs, causal, D ** -0.5, q.dtype, config=cfg))
                kern["q_pass"] = bench(lambda: rotate_quantize(q, signs=signs, scales="token"))
                kern["k_pass"] = bench(lambda: rotate_quantize(k, signs=signs, scales="block"))
                kern["v_pass"] = bench(lambda: quantize_v_permuted(v, per="block"))
                row["parts_ms"] = kern
                print("parts", json.dumps(kern), flush=True)
                del q8, k8, v8
            del q, k, v
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
        result["e2e"].append(row)
        save()

    def tail(Dt, causal_t):
        """2. q in the kernel against its twin on a GQA tail."""
        try:
            Bt, Hq, Hkv, Nt, Nkt = (1, 4, 2, 100, 200) if smoke else (2, 8, 2, 1008, 1104)
            g = torch.Generator(device=dev).manual_seed(3 + Dt)
            qt = torch.randn(Bt, Hq, Nt, Dt, device=dev, generator=g).to(dt)
            kt = torch.randn(Bt, Hkv, Nkt, Dt, device=dev, generator=g).to(dt)
            vt = (torch.randn(Bt, Hkv, Nkt, Dt, device=dev, generator=g)
                  * torch.logspace(-2, 2, Nkt, device=dev)[:, None]).to(dt)
            o, lse = run_form("q3", qt, kt, vt, causal=causal_t, return_lse=True)
            o_ship = run_form("block", qt, kt, vt, causal=causal_t)
            signs = rotation_signs(Dt, qt.device)
            q8, qs = rotate_quantize_rows(qt, signs)
            q8_ship, qs_ship = rotate_quantize(qt, signs=signs, scales="token")
            k8, ks = rotate_quantize(kt, signs=signs, scales="block")
            vp8, vs = quantize_v_permuted(vt, per="block")
            v8 = keys_unpermuted(vp8, Nkt)
            emu, lse_emu = attention_fp8_emulated(q8, k8, v8, qs, ks, vs, causal=causal_t, l_rounded=True,
                                                  p_linear=not smoke)  # (the CPU path: exp2 P)
            rows = torch.isfinite(lse_emu)
            sel = rows[..., None].expand_as(emu)
            floor = rel_rms(emu[sel].to(torch.bfloat16), emu[sel])
            errs, errs_ship, floors = [], [], []
            for b, h in ((0, 0), (Bt - 1, Hq - 1)):
                ref = reference(qt, kt.repeat_interleave(Hq // Hkv, 1), vt.repeat_interleave(Hq // Hkv, 1), causal_t,
                                b, h)
                ok_rows = torch.isfinite(ref).all(-1)
                errs.append(rel_rms(o[b, h][ok_rows], ref[ok_rows]))
                errs_ship.append(rel_rms(o_ship[b, h][ok_rows], ref[ok_rows]))
                floors.append(rel_rms(ref[ok_rows].to(torch.bfloat16), ref[ok_rows]))
            t = dict(check=f"q in kernel: tail GQA B{Bt} Hq{Hq} Hkv{Hkv} N{Nt} Nk{Nkt} D{Dt} "
                     f"{'causal' if causal_t else 'full'}", written=bool(torch.isfinite(o[sel]).all().item()),
                     vs_twin_over_floor=rel_rms(o[sel].float(), emu[sel]) / floor,
                     lse_vs_twin=(lse[rows] - lse_emu[rows]).abs().max().item(),
                     no_key_rows_ok=bool((o[~sel] == 0).all().item()),
                     f64_over_floor=max(e / f for e, f in zip(errs, floors)),
                     f64_over_floor_shipped=max(e / f for e, f in zip(errs_ship, floors)),
                     twin_q_codes_equal_shipped=(q8.float() == q8_ship.float()).float().mean().item(),
                     twin_q_descale_rel=((qs - qs_ship).abs() / qs_ship).max().item())
            t["ok"] = bool(t["written"] and t["vs_twin_over_floor"] < 8 and t["lse_vs_twin"] < 2e-2
                           and t["no_key_rows_ok"])
        except Exception as e:  # noqa: BLE001
            t = dict(check=f"q in kernel tail D{Dt}", error=f"{type(e).__name__}: {str(e)[:400]}")
            traceback.print_exc()
        result["checks"].append(t)
        print("check", json.dumps(t), flush=True)
        save()

    def outlier():
        """3. FlashAttention-3's outlier test."""
        try:
            Bo, Ho, No, Do = (1, 2, 256, 128) if smoke else (1, 16, 2048, 128)
            g = torch.Generator(device=dev).manual_seed(1)

            def outliers(*shape):
                x = torch.randn(*shape, device=dev, generator=g)
                big = torch.rand(*shape, device=dev, generator=g) < 0.001
                return x + big * torch.randn(*shape, device=dev, generator=g) * 10.0  # N(0, 100): std 10

            qo, ko, vo = (outliers(Bo, Ho, No, Do).to(dt) for _ in range(3))
            qf, kf, vf = (t.double() for t in (qo, ko, vo))
            ref_o = torch.softmax((qf @ kf.transpose(-1, -2)) * Do ** -0.5, -1) @ vf
            rmse = lambda o: (o.double() - ref_o).pow(2).mean().sqrt().item()
            result["outlier"]["bf16"] = rmse(tilecore.attention(qo, ko, vo))
            for name in ("block", "q3"):
                result["outlier"][f"{name} rotated"] = rmse(run_form(name, qo, ko, vo))
            print("outlier", json.dumps(result["outlier"]), flush=True)
        except Exception as e:  # noqa: BLE001
            result["outlier"]["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
        save()

    def overflow():
        """3b. a scaled score that overflows float32 (q's descale 3e38 on head 0): its rows NaN, as the emulation's
        (the kernel's +inf select a step dropped in session 35: finish takes l for NaN where m is +inf)."""
        try:
            from tilecore.ops.attention_fp8 import attention_fp8, quantize_fp8
            from tilecore.ops.attention_fp8.reference import attention_fp8_emulated as emulated

            g = torch.Generator(device=dev).manual_seed(11)
            qx, kx, vx = (torch.randn(1, 2, 256, 128, device=dev, generator=g) for _ in range(3))
            q8, qs = quantize_fp8(qx, per="head")
            k8, ks = quantize_fp8(kx, per="head")
            v8, vs = quantize_fp8(vx, per="head")
            qs = qs.clone()
            qs[0, 0] = 3e38
            o = attention_fp8(q8, k8, v8, q_scale=qs, k_scale=ks, v_scale=vs,
                              out_dtype=torch.bfloat16 if not smoke else torch.float32)
            emu, _ = emulated(q8, k8, v8, qs, ks, vs, l_rounded=True, p_linear=not smoke)
            t = dict(check="overflowed max: head 0's rows NaN as the emulation's, head 1 finite",
                     kernel_nan_rows=int(torch.isnan(o).any(-1).sum().item()),
                     emulation_nan_rows=int(torch.isnan(emu).any(-1).sum().item()),
                     same_pattern=bool(torch.equal(torch.isnan(o).any(-1), torch.isnan(emu).any(-1))),
                     head1_finite=bool(torch.isfinite(o[0, 1]).all().item()))
            t["ok"] = t["same_pattern"] and t["head1_finite"] and t["kernel_nan_rows"] == 256
        except Exception as e:  # noqa: BLE001
            t = dict(check="overflow", error=f"{type(e).__name__}: {str(e)[:400]}")
            traceback.print_exc()
        result["checks"].append(t)
        print("check", json.dumps(t), flush=True)
        save()

    def when(seconds, what, fn, *a, **kw):
        if left() < seconds:
            result["notes"].append(f"{what}: skipped for the time budget")
            print(f"skipped for the time budget: {what}", flush=True)
            return
        fn(*a, **kw)

    B0, H0, N0 = (1, 2, 256) if smoke else (16, 16, 4096)
    if args.rest:  # what calls 3 and 4 left: D64 against the twin, the full cases (1 Q buffer at D128 full)
        tail(64, True)
        when(36, "e2e D128 full", e2e, B0, H0, N0, 128, False, ["block", "q3", "q31"])
        when(22, "tail D64 full", tail, 64, False)
        when(14, "e2e D64 full", e2e, B0, H0, N0, 64, False, ["block", "q3"])
    elif not args.confirm:  # the first batch (call 3)
        e2e(B0, H0, N0, 128, True, ["block", "q3", "q31"],
            parts=[("q3", "q3", {}), ("q31", "q31", {})])
        tail(128, True)
        when(40, "tail D64", tail, 64, False)
        when(25, "outlier", outlier)
        when(20, "overflow", overflow)
        for D, causal in ((128, False), (64, True), (64, False)):
            when(14, f"e2e D{D} causal {causal}", e2e, B0, H0, N0, D, causal, ["block", "q3"])
    else:  # the second batch: where the rotation's cost lies, D64 (its tail and causal), the outlier test, the rest
        e2e(B0, H0, N0, 128, True, ["block", "q31"],
            parts=[("q31", "q31", {})])
        when(30, "tail D64 causal", tail, 64, True)
        when(20, "e2e D64 causal", e2e, B0, H0, N0, 64, True, ["block", "q3"])
        when(15, "outlier", outlier)
        when(14, "e2e D128 full", e2e, B0, H0, N0, 128, False, ["block", "q3", "q31"])
        when(10, "e2e D64 full", e2e, B0, H0, N0, 64, False, ["block", "q3"])

    print("\n| case | bf16 ms | form: ms (x bf16) | O / floor |")
    print("| --- | --- | --- | --- |")
    for r in result["e2e"]:
        if "ms" not in r:
            print(f"| D{r['D']} {'causal' if r['causal'] else 'full'} N{r['N']} | error | {r.get('error', '')[:60]} | |")
            continue
        forms_txt = ", ".join(f"{n} {r['ms'][n]:.3f} ({r['ms']['bf16'] / r['ms'][n]:.3f}x)" for n in r["ms"]
                              if n != "bf16")
        if "error" in r:
            forms_txt += f"; error {r['error'][:50]}"
        errs = ", ".join(f"{k.removeprefix('err_over_floor_')} {v:.1f}" for k, v in r.items()
                         if k.startswith("err_over_floor_"))
        print(f"| D{r['D']} {'causal' if r['causal'] else 'full'} B{r['B']} H{r['H']} N{r['N']} | {r['ms']['bf16']:.3f} "
              f"| {forms_txt} | {errs} |")
        if "parts_ms" in r:
            print("| parts (ms) | | " + ", ".join(f"{n} {x:.3f}" for n, x in r["parts_ms"].items()) + " | |")
    for t in result["checks"]:
        print("check:", json.dumps(t))
    print("outlier:", json.dumps(result["outlier"]))
    print(f"wall {time.time() - T0:.1f} s")
    save()


if __name__ == "__main__":
    main()
