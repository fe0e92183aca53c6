"""FP8 attention, session 36 (issue 34), the second batch: q's codes kept in registers as S's operand
(configs.ROTATED["q_reg"], the kernel's Q_REG: on at D128 from call 1) against q's codes in shared memory (session 35's
q in the kernel) and tilecore's bf16 forward, end to end from bf16, in the same run. Target: >= 1.2x bf16 at causal
D128 B16 H16 N4096 (call 1: 1.153x eager, 1.198x from a CUDA graph).

    PYTHONPATH=. python3 experiments/attention_fp8/gpu_qreg_s36.py [--budget 56] [--smoke]

Call 1 ran this script as gpu_pvbf16_s36.py (commit 7d57409c) with P V in bfloat16 on v as given (configs pv_bf16,
the kernel's PV_BF16: slower, removed; notes/attention_fp8's decision log).
Forms (switches.patched(configs, ROTATED=...)): "q3" (q's codes in shared memory), "qr" (q_reg at D64 and D128),
"qr14" (qr with 1 bf16 Q buffer a consumer and 4 stages at D128: the Q buffer it frees; "qr1", 1 buffer and 3
stages, defined, not timed for the budget).

1. The qr kernel against its twin (quantize.rotate_quantize_rows for q, rotate_quantize per block for k,
   quantize_v_permuted per block for v, attention_fp8_emulated with P's linear code) on GQA tails (B2 Hq8 Hkv2 N1008
   Nk1104; v's magnitude 10^-2..10^2 along the keys), D128 causal and D64 full: O, lse, the no-key rows; q3 and qr
   against float64.
2. D128 causal B16 H16 N4096 (q3, qr, qr14): O of each form against float64 attention of the bf16 inputs on a slice
   (error as a
   multiple of the bf16 rounding floor; all finite), then timings: end to end eager (triton.testing.do_bench medians)
   and from a CUDA graph (do_bench_cudagraph: other lanes' compiles cannot delay its launches), and the kernels alone.
3. FlashAttention-3's outlier test (N(0,1) + N(0,100) w.p. 0.001, B1 H16 N2048 D128; RMSE against float64, target
   <= 9.1e-3 rotated): q3 and qr.
4. If time is left: D128 full (q3, qr, qr14), the outlier test, D64 causal, the D64 full tail, D64 full (graphs).
--d64 (batch 3, call 3): "qs" (q_reg with rot_split: the rotation as two half products and a butterfly) against its
twin on the D128 causal tail, D128 causal end to end q3 / qr / qs (eager, graph, kernels alone), the D64 full tail (qs),
D64 causal, the outlier test, D128 full (qr, qs), D64 full (graphs).
--final (batch 4, call 4): "ship" (configs.ROTATED as committed: q_reg at D128) against q3 and qs: D128 causal end to
end (eager, graph, kernels alone), D128 full (graph), D64 full (graph), the outlier test if time is left.
Prints rows as it goes, a table last; JSON to $OUT/attention_fp8_qreg_s36.json. --smoke: CPU, tiny shapes (the twin in
place of the kernel: checks the script, not the kernel).
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
    ap.add_argument("--budget", type=float, default=56.0)
    ap.add_argument("--final", action="store_true", help="batch 4: the shipped configs against q in shared memory: "
                    "the outlier test, D128 causal / full and D64 causal / full end to end")
    ap.add_argument("--d64", action="store_true", help="batch 3: q_reg at D64 (tails, causal and full), the outlier "
                    "test, D128 causal again")
    args = ap.parse_args()
    left = lambda: args.budget - (time.time() - T0)
    smoke = args.smoke
    import tilecore
    from tilecore.ops.attention_fp8 import attention_fp8_rotated, configs
    from tilecore.ops.attention_fp8.quantize import (quantize_v_permuted, rotate_quantize, rotate_quantize_rows,
                                                     rotation_signs)
    from tilecore.ops.attention_fp8.reference import attention_fp8_emulated
    from tilecore.tiles.switches import patched

    dev = "cpu" if smoke else "cuda"
    dt = torch.float32 if smoke else torch.bfloat16
    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "attention_fp8_qreg_s36.json")
    result = {"device": torch.cuda.get_device_name() if not smoke else "cpu (smoke)", "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "e2e": [], "checks": [], "outlier": {},
              "notes": []}
    shipped = dict(configs.ROTATED)
    forms = {"q3": dict(shipped, q_reg=()), "qr": dict(shipped, q_reg=(64, 128)),
             "qr1": dict(shipped, q_reg=(64, 128), q_buffers={128: 1}),
             "qr14": dict(shipped, q_reg=(64, 128), q_buffers={128: 1}, stages={128: 4}),
             "qs": dict(shipped, q_reg=(64, 128), rot_split=(64, 128))}

    def save():
        with open(path, "w") as f:
            json.dump(result, f, indent=1)

    def bench(fn, graph=False):
        fn()
        if smoke:
            t = time.time()
            fn()
            return (time.time() - t) * 1e3
        import triton

        if graph:
            torch.cuda.synchronize()
            try:
                with torch.cuda.stream(torch.cuda.Stream()):
                    return triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median")
            except Exception as e:  # noqa: BLE001  (recorded; the eager time stands in)
                result["notes"].append(f"graph timing failed ({type(e).__name__}: {str(e)[:160]}): eager instead")
                print(result["notes"][-1], flush=True)
                torch.cuda.synchronize()
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

    def e2e(B, H, N, D, causal, names, parts=False, eager=True):
        row = dict(B=B, H=H, N=N, D=D, causal=causal)
        try:
            g = torch.Generator(device=dev).manual_seed(N + D + causal)
            q, k, v = (torch.randn(B, H, N, D, device=dev, generator=g).to(dt) for _ in range(3))
            ref = reference(q, k, v, causal, B - 1, H - 1)
            floor = rel_rms(ref.to(torch.bfloat16), ref)
            bf16 = lambda: tilecore.attention(q, k, v, causal=causal)
            ms = {"bf16": bench(bf16)} if eager else {}
            graph = {"bf16": bench(bf16, graph=True)}
            row.update(ms=ms, graph_ms=graph)
            for name in names:  # each form checked, then timed, printed as it goes (a hang loses only what follows)
                o = run_form(name, q, k, v, causal=causal)
                o.view(-1)[0]  # (launched)
                row[f"err_over_floor_{name}"] = rel_rms(o[B - 1, H - 1], ref) / floor
                row[f"written_{name}"] = bool(torch.isfinite(o).all().item())
                del o
                with patched(configs, ROTATED=forms[name]):
                    fn = lambda: attention_fp8_rotated(q, k, v, causal=causal)
                    if eager:
                        ms[name] = bench(fn)
                    graph[name] = bench(fn, graph=True)
                print(f"  D{D} {'causal' if causal else 'full'} {name}: graph {graph[name]:.3f} ms, bf16 "
                      f"{graph['bf16']:.3f} ({graph['bf16'] / graph[name]:.3f}x)"
                      + (f"; eager {ms[name]:.3f} ({ms['bf16'] / ms[name]:.3f}x)" if eager else "")
                      + f"; O {row[f'err_over_floor_{name}']:.1f}x the floor, written {row[f'written_{name}']}",
                      flush=True)
            row["over_bf16_graph"] = {n: graph["bf16"] / x for n, x in graph.items()}
            if eager:
                row["over_bf16_eager"] = {n: ms["bf16"] / x for n, x in ms.items()}
            print("e2e", json.dumps(row), flush=True)
            if parts and not smoke:  # the kernels alone (k and v quantized once) and the quantizing passes
                from tilecore.ops.attention_fp8 import launch

                signs = rotation_signs(D, q.device)
                k8, ks = rotate_quantize(k, signs=signs, scales="block")
                v8, vs = quantize_v_permuted(v, per="block")
                with patched(configs, ROTATED=forms["qr14"]):
                    cfg14 = launch.rotated_q_config(D, causal) if D == 128 else None
                kern = {"kernel_q3": bench(lambda: launch.forward_q_rotated(q, signs, k8, v8, ks, vs, causal, D ** -0.5,
                                                                            q.dtype, q_reg=False)),
                        "kernel_qr": bench(lambda: launch.forward_q_rotated(q, signs, k8, v8, ks, vs, causal, D ** -0.5,
                                                                            q.dtype, q_reg=True, rot_split=False)),
                        "kernel_qs": bench(lambda: launch.forward_q_rotated(q, signs, k8, v8, ks, vs, causal, D ** -0.5,
                                                                            q.dtype, q_reg=True, rot_split=True)),
                        **({"kernel_qr14": bench(lambda: launch.forward_q_rotated(q, signs, k8, v8, ks, vs, causal,
                                                                                  D ** -0.5, q.dtype, config=cfg14,
                                                                                  q_reg=True, rot_split=False))}
                           if cfg14 and not (args.d64 or args.final) else {})}
                row["parts_ms"] = kern
                print("parts", json.dumps(kern), flush=True)
                del k8, v8
            del q, k, v
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
        result["e2e"].append(row)
        save()

    def tail(Dt, causal_t, form="qr"):
        """2. a form's kernel against its twin on a GQA tail."""
        try:
            Bt, Hq, Hkv, Nt, Nkt = (1, 4, 2, 100, 200) if smoke else (2, 8, 2, 1008, 1104)
            g = torch.Generator(device=dev).manual_seed(3 + Dt)
            qt = torch.randn(Bt, Hq, Nt, Dt, device=dev, generator=g).to(dt)
            kt = torch.randn(Bt, Hkv, Nkt, Dt, device=dev, generator=g).to(dt)
            vt = (torch.randn(Bt, Hkv, Nkt, Dt, device=dev, generator=g)
                  * torch.logspace(-2, 2, Nkt, device=dev)[:, None]).to(dt)
            o, lse = run_form(form, qt, kt, vt, causal=causal_t, return_lse=True)
            o_ship = run_form("q3", qt, kt, vt, causal=causal_t)
            signs = rotation_signs(Dt, qt.device)
            q8, qs = rotate_quantize_rows(qt, signs)
            k8, ks = rotate_quantize(kt, signs=signs, scales="block")
            from tilecore.ops.attention_fp8.reference import keys_unpermuted

            vp8, vs = quantize_v_permuted(vt, per="block")  # (the twin's P: the linear e4m3 code, the kernel's)
            emu, lse_emu = attention_fp8_emulated(q8, k8, keys_unpermuted(vp8, Nkt), qs, ks, vs, causal=causal_t,
                                                  p_linear=not smoke)
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
            t = dict(check=f"{form}: tail GQA B{Bt} Hq{Hq} Hkv{Hkv} N{Nt} Nk{Nkt} D{Dt} "
                     f"{'causal' if causal_t else 'full'}", written=bool(torch.isfinite(o[sel]).all().item()),
                     vs_twin_over_floor=rel_rms(o[sel].float(), emu[sel]) / floor,
                     lse_vs_twin=(lse[rows] - lse_emu[rows]).abs().max().item(),
                     no_key_rows_ok=bool((o[~sel] == 0).all().item()),
                     f64_over_floor=max(e / f for e, f in zip(errs, floors)),
                     f64_over_floor_shipped=max(e / f for e, f in zip(errs_ship, floors)))
            t["ok"] = bool(t["written"] and t["vs_twin_over_floor"] < 8 and t["lse_vs_twin"] < 2e-2
                           and t["no_key_rows_ok"])
        except Exception as e:  # noqa: BLE001
            t = dict(check=f"{form} tail D{Dt}", error=f"{type(e).__name__}: {str(e)[:400]}")
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
            for name in ("q3", "ship") if args.final else ("q3", "qr", "qs"):
                result["outlier"][f"{name} rotated"] = rmse(run_form(name, qo, ko, vo))
            print("outlier", json.dumps(result["outlier"]), flush=True)
        except Exception as e:  # noqa: BLE001
            result["outlier"]["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
        save()

    def when(seconds, what, fn, *a, **kw):
        if left() < seconds:
            result["notes"].append(f"{what}: skipped for the time budget")
            print(f"skipped for the time budget: {what}", flush=True)
            return
        fn(*a, **kw)

    B0, H0, N0 = (1, 2, 256) if smoke else (16, 16, 4096)
    if args.final:  # "ship": configs.ROTATED as committed
        forms["ship"] = shipped
        e2e(B0, H0, N0, 128, True, ["q3", "ship", "qs"], parts=True)
        when(14, "e2e D128 full", e2e, B0, H0, N0, 128, False, ["q3", "ship", "qs"], eager=False)
        when(10, "e2e D64 full", e2e, B0, H0, N0, 64, False, ["q3", "ship"], eager=False)
        when(6, "outlier", outlier)
    elif args.d64:
        when(0, "tail D128 causal qs", tail, 128, True, "qs")
        e2e(B0, H0, N0, 128, True, ["q3", "qr", "qs"], parts=True)
        when(26, "tail D64 full qs", tail, 64, False, "qs")
        when(18, "e2e D64 causal", e2e, B0, H0, N0, 64, True, ["q3", "qr", "qs"], eager=False)
        when(12, "outlier", outlier)
        when(10, "e2e D128 full", e2e, B0, H0, N0, 128, False, ["qr", "qs"], eager=False)
        when(8, "e2e D64 full", e2e, B0, H0, N0, 64, False, ["q3", "qr", "qs"], eager=False)
    else:  # the second batch (call 2)
        when(0, "tail D128 causal qr", tail, 128, True, "qr")
        when(0, "e2e D128 causal", e2e, B0, H0, N0, 128, True, ["q3", "qr", "qr14"], parts=True)
        when(14, "e2e D128 full", e2e, B0, H0, N0, 128, False, ["q3", "qr", "qr14"], eager=False)
        when(12, "outlier", outlier)
        when(10, "e2e D64 causal", e2e, B0, H0, N0, 64, True, ["q3", "qr"], eager=False)
        when(10, "tail D64 full qr", tail, 64, False, "qr")
        when(8, "e2e D64 full", e2e, B0, H0, N0, 64, False, ["q3", "qr"], eager=False)

    print("\n| case | bf16 ms (graph) | form: graph ms (x bf16) [eager x bf16] | O / floor |")
    print("| --- | --- | --- | --- |")
    for r in result["e2e"]:
        if "graph_ms" not in r:
            print(f"| D{r['D']} {'causal' if r['causal'] else 'full'} N{r['N']} | error | {r.get('error', '')[:60]} | |")
            continue
        g_ms, e_ms = r["graph_ms"], r.get("ms", {})
        forms_txt = ", ".join(f"{n} {g_ms[n]:.3f} ({g_ms['bf16'] / g_ms[n]:.3f}x)"
                              + (f" [{e_ms['bf16'] / e_ms[n]:.3f}x]" if n in e_ms and "bf16" in e_ms else "")
                              for n in g_ms if n != "bf16")
        if "error" in r:
            forms_txt += f"; error {r['error'][:50]}"
        errs = ", ".join(f"{k.removeprefix('err_over_floor_')} {v:.1f}" for k, v in r.items()
                         if k.startswith("err_over_floor_"))
        print(f"| D{r['D']} {'causal' if r['causal'] else 'full'} B{r['B']} H{r['H']} N{r['N']} | "
              f"{g_ms['bf16']:.3f} | {forms_txt} | {errs} |")
        if "parts_ms" in r:
            print("| parts (eager ms) | | " + ", ".join(f"{n} {x:.3f}" for n, x in r["parts_ms"].items()) + " | |")
    for t in result["checks"]:
        print("check:", json.dumps(t))
    print("outlier:", json.dumps(result["outlier"]))
    print(f"wall {time.time() - T0:.1f} s")
    save()


if __name__ == "__main__":
    main()
