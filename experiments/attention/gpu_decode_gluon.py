"""GPU check and timing of the split-key (decode) path's Gluon kernel (tilecore/ops/attention_decode/gluon_decode.py)
against its tl twin (kernels_tl.attn_fwd_split_keys) and torch SDPA (cuDNN).

    python experiments/attention/gpu_decode_gluon.py [--phases check,time,host] [--deadline 130] [--rounds 3] [--smoke]

check: the Gluon kernel forced (launch.forward_into(path="decode", config=configs.decode_gluon_config(D))), and the
    tl kernel beside it, into NaN-poisoned O and lse, against float64 (error over the rounding floor; lse; rows with
    no key 0 / -inf): bf16 and fp16, GQA 32/8 and 8/8, Nk not a multiple of the key block, 1 and 4 queries (causal),
    one key range (merged in the kernel) and several (the tl merge), two row blocks, a window, a softcap, N > Nk,
    strided q and a (B, Nmax, Hkv, D) cache; then the public tilecore.attention with the Gluon kernel as the table's
    (switches.patched DECODE_GLUON_DEFAULT), its plan checked to be the Gluon one.
time: the committed bench's shapes (benchmarks/results/h100-80gb-hbm3/attention-decode.json: one query, Hq 32 / Hkv 8,
    D 128, bf16, B 1 / 16 / 64, Nk 1K / 4K / 16K), as the bench times them (tilecore.bench.harness: input sets
    rotating past L2, back-to-back calls replayed from a CUDA graph: GPU time), the variants in interleaved rounds:
    the Gluon kernel's table config (16 rows by mma.sync here) and VARIANTS (64 keys x 6 stages), the tl kernel,
    SDPA cuDNN; two D 64 shapes besides; GB/s and x the
    copy ceiling measured in the same run, and each series' ratio to tl per round (median, min, max).

host: eager host time a call of tilecore.attention (B1 Nk4K, B64 Nk1K), the Gluon kernel as the table's (its keyed
    recipe) against the shipped tl recipe, interleaved rounds.

--smoke (no GPU): the check phase's tl side through the interpreter on two tiny cases, the script's logic end to end;
the Gluon kernels are compile-checked for sm_90a by tests/attention/test_decode_gluon.py.
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import torch  # noqa: E402

from experiments.common.gpu_script import Run, check, poisoned  # noqa: E402
from tilecore.tiles import switches  # noqa: E402
from tilecore.ops.attention import attention, attention_reference, launch, plan as attention_plan  # noqa: E402
from tilecore.ops.attention_decode import configs  # noqa: E402

HQ, HKV, D = 32, 8, 128
SHAPES = [(b, nk, D) for b in (1, 16, 64) for nk in (1024, 4096, 16384)] + [(1, 4096, 64), (64, 1024, 64)]
RULED = dict(DECODE_GLUON_DEFAULT=(64, 128), DECODE_GLUON_ONE_WAVE=True)  # the Gluon kernel wherever it fits
# the Gluon kernel's configs timed beside the table's (16 rows by mma.sync here; call 3 timed and lost 64 rows by
# wgmma, KV_STEPS and 64 keys x 4 stages): 64 keys x 6 stages, a deeper ring for the long tiles B64 Nk4K / 16K lose
VARIANTS = {"gluon_bn64_s6": dict(kernel="gluon", BLOCK_N=64, STAGES=6)}

# B, Hq, Hkv, N, Nk, D, dtype, causal, splits (None: the plan's), extra (window, softcap, layout)
CHECKS = [
    (4, 32, 8, 1, 1000, 128, "bf16", False, None, {"tl": True, "rows64": True}),
    (2, 8, 8, 1, 3001, 128, "fp16", False, 1, {}),  # one range: O and lse from the kernel itself
    (3, 32, 8, 4, 777, 64, "bf16", True, None, {"rows64": True}),
    (2, 32, 8, 4, 4100, 128, "fp16", True, 5, {"tl": True}),
    (1, 8, 8, 1, 16384, 64, "fp16", False, None, {}),
    (2, 32, 4, 16, 999, 128, "bf16", True, 3, {"rows64": True}),  # 8 x 16 = 128 packed rows: two row blocks
    (2, 32, 8, 4, 2000, 128, "bf16", False, None, {"window": (300, 0)}),
    (2, 32, 8, 3, 2000, 64, "fp16", False, 4, {"window": (100, 50)}),
    (2, 32, 8, 1, 1500, 128, "fp16", False, None, {"softcap": 30.0}),
    (1, 8, 8, 4, 2, 64, "fp16", True, 1, {}),  # N > Nk: rows 0 and 1 see no key
    (3, 32, 8, 1, 2047, 128, "bf16", False, None, {"layout": "cache"}),  # strided q, K / V a cache's view
    (64, 32, 8, 1, 4096, 128, "bf16", False, None, {}),  # a timed shape
]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _inputs(b, hq, hkv, n, nk, d, dtype, layout, device):
    gen = torch.Generator(device="cpu").manual_seed(1000 * b + nk + n)
    if layout == "cache":  # flash-attn's (B, seqlen, heads, D) q, and K / V the first nk rows of a longer cache
        q = torch.randn(b, n, hq, d, generator=gen).to(device, dtype).transpose(1, 2)
        cache = [torch.randn(b, nk + 37, hkv, d, generator=gen).to(device, dtype) for _ in range(2)]
        k, v = (c[:, :nk].transpose(1, 2) for c in cache)
    else:
        q, k, v = (torch.randn(*s, generator=gen).to(device, dtype) for s in ((b, hq, n, d), (b, hkv, nk, d),
                                                                               (b, hkv, nk, d)))
    return q, k, v


def _run(q, k, v, causal, scale, window, softcap, config, splits):
    out = poisoned(torch.empty((*q.shape[:3], v.shape[-1]), dtype=q.dtype, device=q.device))
    lse = poisoned(torch.empty(q.shape[:3], dtype=torch.float32, device=q.device))
    launch.forward_into(q, k, v, out, lse, causal, scale, window=window, softcap=softcap, path="decode",
                        config=config, splits=splits)
    return out, lse


def _lse_err(lse, ref_lse) -> float:
    finite = torch.isfinite(ref_lse)
    same_inf = bool((lse[~finite] == ref_lse[~finite].float()).all())
    err = (lse[finite].double() - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
    return err if same_inf else float("inf")


def phase_check(run, smoke):
    device = "cpu" if smoke else "cuda"
    cases = CHECKS
    if smoke:
        cases = [(1, 4, 2, 1, 100, 64, "fp16", False, 3, {}), (1, 4, 1, 4, 50, 32, "fp16", True, None, {})]
    for b, hq, hkv, n, nk, d, dt, causal, splits, extra in cases:
        q, k, v = _inputs(b, hq, hkv, n, nk, d, DTYPES[dt], extra.get("layout"), device)
        window, softcap = extra.get("window", (-1, -1)), extra.get("softcap", 0.0)
        scale = d ** -0.5
        ref, ref_lse = attention_reference(q, k, v, causal=causal, scale=scale, window_size=window, softcap=softcap)
        kernels = {} if smoke else {"gluon": configs.decode_gluon_config(d)}
        if extra.get("rows64"):  # 64 rows by wgmma where the table takes 16 by mma.sync
            kernels["gluon64"] = dict(configs.decode_gluon_config(d), ROWS=64)
        if smoke or extra.get("tl"):  # the twin beside it (where the floor itself is in question)
            kernels["tl"] = configs.decode_config(d, smoke)
        name = f"B{b} {hq}/{hkv} N{n} Nk{nk} D{d} {dt}{' causal' if causal else ''} splits {splits}" + \
               "".join(f" {k_}={v_}" for k_, v_ in extra.items() if k_ not in ("tl", "rows64"))
        for kernel, cfg in kernels.items():
            out, lse = _run(q, k, v, causal, scale, window, softcap, cfg, splits)
            empty = torch.isneginf(ref_lse)
            run.row(f"check {kernel} {name}", **check(out, ref), lse_err=_lse_err(lse, ref_lse),
                    empty_rows_zero=bool((out[empty] == 0).all()),
                    plan_splits=attention_plan.plan_forward(q, k, v, causal, scale, path="decode", config=cfg,
                                                            splits=splits, window=window, softcap=softcap).grid[1])
    if smoke:
        return
    # the public op with the Gluon kernel as the table's: the plan it makes, and its numbers
    q, k, v = _inputs(16, HQ, HKV, 1, 4096, D, torch.bfloat16, None, device)
    ref, _ = attention_reference(q, k, v)
    with switches.patched(configs, **RULED):
        p = attention_plan.plan_forward(q, k, v, False, D ** -0.5)
        outs = [attention(q, k, v) for _ in range(3)]  # (the plan cache's first call, then the key's recipe)
    run.row("check public op, Gluon as the table's", kernel=p.config.get("kernel", "tl"), **check(outs[-1], ref),
            same_each_call=all(torch.equal(o, outs[0]) for o in outs))
    p = attention_plan.plan_forward(q, k, v, False, D ** -0.5)
    run.row("plan after the patched block", kernel=p.config.get("kernel", "tl"))


def phase_time(run, rounds):
    from tilecore.bench.harness import copy_ceiling, graph_replay, median_ms, rotating

    ceiling = copy_ceiling()
    run.extra["copy_gbps"] = ceiling.value
    run.say(f"copy ceiling {ceiling.value:.0f} GB/s")

    def sdpa(q, k, v):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    for b, nk, d in SHAPES:
        if run.left() < 25:  # (the host phase after it)
            run.errors.append(f"time: deadline before B{b} Nk{nk} D{d}")
            break
        nbytes = 2 * (2 * b * HKV * nk * d + 2 * b * HQ * d)  # as the bench: K, V read; q read, O written
        series = {"gluon": configs.decode_gluon_config(d), **VARIANTS, "tl": configs.decode_config(d, False)}

        def make_set():
            return (torch.randn(b, HQ, 1, d, device="cuda", dtype=torch.bfloat16),
                    *(torch.randn(b, HKV, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2)))

        nxt = rotating(make_set, nbytes)
        fns = {}
        for name, cfg in series.items():
            def call(cfg=cfg):
                q, k, v = nxt()
                out = torch.empty_like(q)
                lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
                launch.forward_into(q, k, v, out, lse, False, q.shape[-1] ** -0.5, path="decode", config=cfg)
                return out
            fns[name] = call
        fns["cudnn"] = lambda: sdpa(*nxt())
        replays = {name: graph_replay(fn) for name, fn in fns.items()}  # (every kernel compiled and planned first)
        per = {name: [] for name in fns}
        for r in range(rounds):
            for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                replay, calls = replays[name]
                per[name].append(median_ms(replay, warmup_ms=5, rep_ms=25) / calls)
        row = {}
        for name, times in per.items():
            ms = statistics.median(times)
            ratios = [t_tl / t for t, t_tl in zip(times, per["tl"])]
            row[f"{name}_us"] = round(ms * 1e3, 2)
            row[f"{name}_copy"] = round(nbytes / ms / 1e6 / ceiling.value, 3)
            row[f"{name}_vs_tl"] = round(statistics.median(ratios), 3)
            row[f"{name}_vs_tl_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
        row["rounds_us"] = {n: [round(t * 1e3, 2) for t in ts] for n, ts in per.items()}
        run.row(f"time B{b} Nk{nk}" + (f" D{d}" if d != D else ""), **row)
        del replays, fns, nxt
        torch.cuda.empty_cache()


def phase_host(run, rounds):
    """Eager host time a call of the public op (no sync between calls: issue 31's measure) with the Gluon kernel as
    the table's (switches.patched, entered once a round: its first calls plan and make the recipe) against the
    shipped tl recipe, interleaved rounds."""
    from experiments.common.gpu_script import host_us

    for b, nk in ((1, 4096), (64, 1024)):
        q, k, v = _inputs(b, HQ, HKV, 1, nk, D, torch.bfloat16, None, "cuda")
        call = lambda: attention(q, k, v)  # noqa: E731
        per = {"gluon": [], "tl": []}
        kernels = {}
        for r in range(rounds):
            for name in (("gluon", "tl") if r % 2 == 0 else ("tl", "gluon")):
                if name == "gluon":
                    with switches.patched(configs, **RULED):
                        per[name].append(round(host_us(call), 2))
                        kernels[name] = attention_plan.plan_forward(q, k, v, False, D ** -0.5).config.get("kernel")
                else:
                    per[name].append(round(host_us(call), 2))
                    kernels[name] = attention_plan.plan_forward(q, k, v, False, D ** -0.5).config.get("kernel", "tl")
        run.row(f"host B{b} Nk{nk}", gluon_host_us=statistics.median(per["gluon"]),
                tl_host_us=statistics.median(per["tl"]), rounds_host_us=per, kernels=kernels)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="no GPU: the tl side of two tiny checks (the interpreter)")
    ap.add_argument("--phases", default="check,time,host", help="check, time, host (comma-separated)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    ap.add_argument("--deadline", type=float, default=130, help="seconds: no shape is timed past it")
    args = ap.parse_args()
    phases = args.phases.split(",")
    run = Run("gpu_decode_gluon", deadline=args.deadline)
    run.extra["variants"] = VARIANTS
    if "check" in phases:
        run.attempt("check", phase_check, run, args.smoke)
    if "time" in phases and not args.smoke:
        run.attempt("time", phase_time, run, args.rounds)
    if "host" in phases and not args.smoke:
        run.attempt("host", phase_host, run, args.rounds)
    cols = ["name", "pass", "err_over_floor", "lse_err", "kernel", "gluon_us", "gluon_bn64_s6_us", "tl_us", "cudnn_us",
            "gluon_vs_tl", "gluon_bn64_s6_vs_tl", "cudnn_vs_tl", "gluon_copy", "tl_copy", "gluon_host_us", "tl_host_us"]
    run.finish(cols)


if __name__ == "__main__":
    main()
