"""FP8 attention's convenience path at causal D128 (issue 34, session 38): the tile's first key hidden from LLVM
(configs.GLUON_FORWARD's ``hide_first_key``) against the shipped kernel, and the k / v passes against copy speed.

    PYTHONPATH=. python experiments/attention_fp8/gpu_s38.py [--budget 55] [--cases d128c,d64c] [--smoke]

``hide_first_key`` (gluon_fp8.AttentionFp8.first_key): at a causal tile's step 0 the key offset is the constant 0, so
LLVM hoisted the causal mask's comparisons to every tile's start (sm_90a, D128 causal e2e kernel: 62 ISETP, ~190 LOP3
packing predicates, 48 SEL a tile before its first S) and ran step 0's masking as selects; through opaque_int (the bf16
forward's first_key, +7% at its D128 causal in session 13) the mask stays in its branch. Same math: O must be the same
bits.

Phases (each only where the budget allows; rows printed as they come, the table last):
* d128c: B16 H16 N4096 D128 causal, ``tilecore.attention(..., precision="fp8")`` with hide_first_key off ("old") and on
  ("new") under tiles.switches.patched, and tilecore's bf16 forward: O of each against float64 on the last (batch,
  head) (outputs poisoned: the allocator's block filled with NaN before each call), old and new bit for bit; then
  interleaved rounds of do_bench and CUDA-graph times, and GPU time by the profiler (each call after a synchronize: the
  sum of its kernels, and each kernel's).
* passes: the k pass (quantize.rotate_quantize, per 128-key blocks) and the v pass (quantize_v_permuted per block) of
  that shape against torch's bf16 -> e4m3 cast of the same tensor (the same bytes read and written: the copy-speed
  reference) and a bf16 copy; each a single kernel, timed from CUDA graphs (interleaved rounds), GB/s.
* tail: B2 Hq8 Hkv2 N1008 Nk1104 D128 causal (GQA, tails): old and new bit for bit, against float64 (every head).
* outlier: FlashAttention-3's outlier test (N(0,1) + N(0,100) with probability 0.001), B1 H16 N2048 D128 causal,
  RMSE against float64, old and new.
* plain128c, plain64c: attention_fp8 on e4m3 inputs with per-head descales (the kernel alone), old and new: O
  against float64 and bit for bit, graph times and TFLOP/s.
* d64c: B16 H16 N4096 D64 causal, as d128c; d128, d64: the same without the mask (hide_first_key changes nothing
  there: the end-to-end figures).
* sweep: rotate_quantize's launch shapes (row blocks x warps x stages) and quantize_v_permuted's tile permuted in
  registers, each checked bit for bit against the shipped launch, by GPU time beside the cast.

JSON: $OUT/attention_fp8_s38.json (experiments/common/gpu_script.Run).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments.common.gpu_script import Run, check, same_bits, sync, time_rounds  # noqa: E402


def reference(q, k, v, causal):
    """float64 attention (B, Hq, N, D) of (B, Hkv, Nk, D) keys (GQA), causal bottom right: the library's reference."""
    from tilecore.ops.attention.reference import attention_reference

    return attention_reference(q, k, v, causal=causal)[0]


def poison_allocator(like: torch.Tensor):
    """Fill the caching allocator's next block of like's size with NaN (an element a kernel skips then stays NaN)."""
    x = torch.full_like(like, float("nan"))
    del x


def gpu_us(fn, calls: int = 3) -> dict:
    """GPU time of ``fn`` by the profiler: each call after a synchronize; the median over calls of the sum of a call's
    kernels (us), and the last call's kernels [(name, us)]."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        for _ in range(calls):
            sync()
            fn()
        sync()
    ks = sorted((e for e in prof.events() if e.device_type.name == "CUDA" and "Memset" not in e.name
                 and "Memcpy" not in e.name), key=lambda e: e.time_range.start)
    if not ks:
        return {"total_us": None, "kernels": []}
    per = max(1, len(ks) // calls)
    totals = [sum(e.time_range.end - e.time_range.start for e in ks[c * per:(c + 1) * per]) for c in range(calls)]
    return {"total_us": round(statistics.median(totals), 1),
            "kernels": [(e.name[:40], round(e.time_range.end - e.time_range.start, 1)) for e in ks[-per:]]}


def outlier_inputs(B, H, N, D, device, dtype, seed=1):
    """q, k, v of FlashAttention-3's outlier test: entries N(0, 1) plus N(0, 100) with probability 0.001."""
    g = torch.Generator(device=device).manual_seed(seed)

    def one():
        x = torch.randn(B, H, N, D, device=device, generator=g)
        big = torch.rand(B, H, N, D, device=device, generator=g) < 0.001
        return (x + big * torch.randn(B, H, N, D, device=device, generator=g) * 10.0).to(dtype)
    return one(), one(), one()


def med(xs):
    """The median of the figures that are there (None where none is)."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def ratio(a, b):
    return round(a / b, 4) if a and b else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=55.0)
    ap.add_argument("--cases", default="d128c,passes,tail,outlier,d64c")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gpu-rounds", type=int, default=2, help="profiler rounds (each form's calls after a sync)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: the script's plumbing only")
    args = ap.parse_args()
    import tilecore
    from tilecore.ops.attention_fp8 import configs, quantize
    from tilecore.tiles.switches import patched

    run = Run("attention_fp8_s38", deadline=args.budget)
    smoke = args.smoke
    dev = "cpu" if smoke else "cuda"
    dt = torch.float32 if smoke else torch.bfloat16
    cases = args.cases.split(",")

    def forms_for(causal):
        """name -> a call of the convenience path with hide_first_key off / on (whatever the shipped default)."""
        def make(hide):
            cfg = {d: dict(c, hide_first_key=hide) for d, c in configs.GLUON_FORWARD.items()}

            def fp8(q, k, v):
                with patched(configs, GLUON_FORWARD=cfg):
                    return tilecore.attention(q, k, v, causal=causal, precision="fp8")
            return fp8
        # (without a mask the option changes nothing: one form, the shipped path)
        return {"old": make(False), "new": make(True)} if causal else {"new": make(True)}

    def attention_case(label, B, H, N, D, causal):
        g = torch.Generator(device=dev).manual_seed(N + D)
        q, k, v = (torch.randn(B, H, N, D, device=dev, generator=g).to(dt) for _ in range(3))
        ref = reference(q[-1:, -1:], k[-1:, -1:], v[-1:, -1:], causal)[0, 0]
        forms = forms_for(causal)
        outs = {}
        fns = {"bf16": lambda: tilecore.attention(q, k, v, causal=causal)}
        for name, f in forms.items():
            poison_allocator(q)
            outs[name] = f(q, k, v)
            fns[name] = (lambda f=f: f(q, k, v))
        poison_allocator(q)
        outs["bf16"] = fns["bf16"]()
        for name, o in outs.items():
            run.row(f"{label} check {name}", **check(o[-1, -1], ref, tol=40.0 if name != "bf16" else 2.5),
                    written_all=bool(torch.isfinite(o).all()))
        if "old" in outs:
            run.row(f"{label} old == new bits", **{"pass": same_bits(outs["old"], outs["new"])})
        del outs
        t = time_rounds(fns, rounds=args.rounds, graph=True, deadline=run)
        row = {k2: v2 for k2, v2 in t.items() if not k2.endswith("_rounds")}
        for n in forms:
            if f"{n}_graph_ms" in t:
                row[f"{n}_x_bf16_graph"] = round(t["bf16_graph_ms"] / t[f"{n}_graph_ms"], 4)
            row[f"{n}_x_bf16_eager"] = round(t["bf16_ms"] / t[f"{n}_ms"], 4)
        row["rounds"] = {n: t[f"{n}_rounds"] for n in fns}
        run.row(f"{label} time", **row)
        gpu = {n: [] for n in fns}
        kernels = {}
        for r in range(args.gpu_rounds):  # interleaved
            for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                res = gpu_us(fns[n])
                gpu[n].append(res["total_us"])
                kernels[n] = res["kernels"]
        grow = {f"{n}_gpu_us": gpu[n] for n in fns}
        if not smoke:
            for n in forms:
                grow[f"{n}_x_bf16_gpu"] = ratio(med(gpu["bf16"]), med(gpu[n]))
        grow["kernels"] = kernels
        run.row(f"{label} gpu time", **grow)

    def pass_times(fns: dict, moved: dict, label: str):
        """Single-kernel calls timed from CUDA graphs (do_bench_cudagraph: replays back to back) in interleaved
        rounds, beside the cast (the same bytes): us, GB/s (bytes ``moved``) and the fraction of the cast's rate."""
        t = time_rounds(fns, rounds=3, graph=True, eager=False, deadline=run)
        row = {}
        for n in fns:
            ms = t.get(f"{n}_graph_ms")
            row[f"{n}_us"] = round(ms * 1e3, 2) if ms else None
            if ms and n in moved:
                row[f"{n}_GBps"] = round(moved[n] / (ms * 1e-3) / 1e9, 1)
        cast = row.get("cast_e4m3_us")
        for n in fns:
            if n != "cast_e4m3" and n in moved and moved[n] == moved.get("cast_e4m3"):
                row[f"{n}_of_cast"] = ratio(cast, row[f"{n}_us"])
        row["rounds"] = {n: t.get(f"{n}_rounds") for n in fns}
        run.row(label, **row)
        return row

    def passes():
        B, H, N, D = (1, 2, 256, 128) if smoke else (16, 16, 4096, 128)
        g = torch.Generator(device=dev).manual_seed(7)
        k, v = (torch.randn(B, H, N, D, device=dev, generator=g).to(dt) for _ in range(2))
        signs = quantize.rotation_signs(D, k.device)
        dst = torch.empty_like(k)
        fns = {"k_pass": lambda: quantize.rotate_quantize(k, signs=signs, scales="block"),
               "v_pass": lambda: quantize.quantize_v_permuted(v, per="block"),
               "cast_e4m3": lambda: k.to(torch.float8_e4m3fn),
               "copy_bf16": lambda: dst.copy_(k)}
        moved = {"k_pass": 3 * k.numel(), "v_pass": 3 * k.numel(), "cast_e4m3": 3 * k.numel(),
                 "copy_bf16": 4 * k.numel()}  # bytes read + written (the descales: < 0.1%)
        pass_times(fns, moved, "passes vs copy")

    def sweep():
        """The k pass's launch shapes (rotate_quantize's config: blocks of 128 rows a program, warps, stages) and the v
        pass with its tile permuted in registers, against the shipped ones and the cast, by GPU time."""
        B, H, N, D = (1, 2, 256, 128) if smoke else (16, 16, 4096, 128)
        g = torch.Generator(device=dev).manual_seed(9)
        k, v = (torch.randn(B, H, N, D, device=dev, generator=g).to(dt) for _ in range(2))
        signs = quantize.rotation_signs(D, k.device)
        ref_k = quantize.rotate_quantize(k, signs=signs, scales="block")
        ref_v = quantize.quantize_v_permuted(v, per="block")
        fns = {"cast_e4m3": lambda: k.to(torch.float8_e4m3fn)}
        for rb, nw, ns in ((8, 4, 2), (4, 4, 2), (8, 8, 2), (8, 4, 3), (16, 4, 2)):
            cfg = dict(row_blocks=rb, num_warps=nw, num_stages=ns)
            f = (lambda cfg=cfg: quantize.rotate_quantize(k, signs=signs, scales="block", config=cfg))
            if not same_bits(f(), ref_k):
                run.errors.append(f"sweep k {cfg}: not the shipped bits")
                continue
            fns[f"k_{rb}x{nw}x{ns}"] = f
        fv = (lambda: quantize.quantize_v_permuted(v, per="block", permute_in_registers=True))
        if same_bits(fv(), ref_v):
            fns["v_permute_in_registers"] = fv
        fns["v_shipped"] = lambda: quantize.quantize_v_permuted(v, per="block")
        pass_times(fns, {n: 3 * k.numel() for n in fns}, "passes sweep")

    def plain(label, B, H, N, D, causal):
        """attention_fp8 on e4m3 q, k, v with per-head descales (the kernel alone), hide_first_key off / on."""
        from tilecore.ops.attention_fp8.quantize import quantize_fp8

        g = torch.Generator(device=dev).manual_seed(N + D + 1)
        q, k, v = (torch.randn(B, H, N, D, device=dev, generator=g).to(dt) for _ in range(3))
        ref = reference(q[-1:, -1:], k[-1:, -1:], v[-1:, -1:], causal)[0, 0]
        q8, qs = quantize_fp8(q, per="head")
        k8, ks = quantize_fp8(k, per="head")
        v8, vs = quantize_fp8(v, per="head", layout="keys_permuted")
        fns, outs = {}, {}
        for name, hide in (("old", False), ("new", True)):
            cfg = {d: dict(c, hide_first_key=hide) for d, c in configs.GLUON_FORWARD.items()}

            def f(cfg=cfg):
                with patched(configs, GLUON_FORWARD=cfg):
                    return tilecore.attention_fp8(q8, k8, v8, q_scale=qs, k_scale=ks, v_scale=vs, causal=causal,
                                                  out_dtype=dt, v_layout="keys_permuted", check_scales=False)
            poison_allocator(q)
            outs[name] = f()
            fns[name] = f
            run.row(f"{label} check {name}", **check(outs[name][-1, -1], ref, tol=40.0))
        run.row(f"{label} old == new bits", **{"pass": same_bits(outs["old"], outs["new"])})
        del outs
        t = time_rounds(fns, rounds=args.rounds, graph=True, eager=False, deadline=run)
        flops = 4 * B * H * N * N * D / (2 if causal else 1)
        row = {f"{n}_graph_ms": t.get(f"{n}_graph_ms") for n in fns}
        row.update({f"{n}_tflops": round(flops / (t[f"{n}_graph_ms"] * 1e9), 1) for n in fns if t.get(f"{n}_graph_ms")})
        row["new_x_old_graph"] = ratio(t.get("old_graph_ms"), t.get("new_graph_ms"))
        row["rounds"] = {n: t.get(f"{n}_rounds") for n in fns}
        run.row(f"{label} time", **row)

    def tail():
        B, Hq, Hkv, N, Nk, D = (1, 4, 2, 40, 56, 128) if smoke else (2, 8, 2, 1008, 1104, 128)
        g = torch.Generator(device=dev).manual_seed(11)
        q = torch.randn(B, Hq, N, D, device=dev, generator=g).to(dt)
        k, v = (torch.randn(B, Hkv, Nk, D, device=dev, generator=g).to(dt) for _ in range(2))
        ref = reference(q, k, v, True)
        outs = {}
        for name, f in forms_for(True).items():
            poison_allocator(q)
            outs[name] = f(q, k, v)
            run.row(f"tail check {name}", **check(outs[name], ref, tol=40.0))
        run.row("tail old == new bits", **{"pass": same_bits(outs["old"], outs["new"])})

    def outlier():
        B, H, N, D = (1, 2, 64, 128) if smoke else (1, 16, 2048, 128)
        q, k, v = outlier_inputs(B, H, N, D, dev, dt)
        ref = reference(q, k, v, True)
        row = {}
        for name, f in forms_for(True).items():
            row[f"{name}_rmse"] = (f(q, k, v).double() - ref).pow(2).mean().sqrt().item()
        row["bf16_rmse"] = (tilecore.attention(q, k, v, causal=True).double() - ref).pow(2).mean().sqrt().item()
        row["pass"] = max(row["old_rmse"], row["new_rmse"]) <= 9.1e-3
        run.row("outlier causal rotated", **row)

    shapes = {"d128c": (128, True), "d64c": (64, True), "d128": (128, False), "d64": (64, False)}
    plains = {"plain128c": (128, True), "plain64c": (64, True)}
    need = {"d128c": 0, "passes": 8, "sweep": 15, "tail": 12, "outlier": 10, "d64c": 25, "d128": 25, "d64": 25,
            "plain128c": 15, "plain64c": 15}
    for c in cases:
        if run.left() < need.get(c, 10):
            run.errors.append(f"{c}: skipped for the time budget ({run.elapsed():.0f} s)")
            run.say("skipped for the time budget:", c)
            continue
        if c in shapes:
            D, causal = shapes[c]
            B, H, N = (1, 2, 256) if smoke else (16, 16, 4096)
            run.attempt(c, attention_case, c, B, H, N, D, causal)
        elif c in plains:
            D, causal = plains[c]
            B, H, N = (1, 2, 256) if smoke else (16, 16, 4096)
            run.attempt(c, plain, c, B, H, N, D, causal)
        else:
            run.attempt(c, {"passes": passes, "sweep": sweep, "tail": tail, "outlier": outlier}[c])
    run.finish(["name", "pass", "err_over_floor", "old_x_bf16_graph", "new_x_bf16_graph", "old_x_bf16_gpu",
                "new_x_bf16_gpu", "new_x_old_graph", "k_pass_of_cast", "v_pass_of_cast", "cast_e4m3_GBps"])


if __name__ == "__main__":
    main()
