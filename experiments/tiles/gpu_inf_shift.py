"""What does the Gluon online-softmax's +inf shift cost the attention forward, and does a per-tile form keep its
answers for less? (issue 30's T1, issue 31's semantics; session 34, helper HH)

Session 34's port_check (notes/tiles/runs/port_check_attn3_run2_session34_h100.txt) found the D64 three-consumer
forward 3-4.5% slower than the pre-port code in every round. Compiled for sm_90a on the CPU, those variants' SASS
is the same instruction for instruction at HEAD as at 84320df, which added 24 instructions to each (8 a consumer):
``online_softmax_update``'s shift is NaN while a row's max is +inf (a finite score whose scaled value overflows
must make its row NaN, as SDPA's math does; exp2_scaled's FMA keeps s * c exact and would give p = 0).

The per-tile form ("tile_nan"): the update's shift is again 0 while the max is -inf and m itself otherwise (no
+inf select a step); ``online_softmax_result`` makes l NaN where the final max is +inf, so such a row's O and lse
are NaN (a max, once +inf, stays +inf). Every finite row's arithmetic is unchanged, so outputs must be bitwise
equal on finite inputs.

This script builds the variant as a renamed copy of the package (``tilecore_tile_nan``: every ``tilecore`` word
in its .py files renamed, so both load in one process; the two tile-op edits asserted), then per case, with the
configs table's Gluon config forced on both (plan_forward's config=: no timed top-k pick, the same kernel
configuration in both trees):
  checks: fresh random inputs, O and lse of both trees bitwise equal, O against float64 on two heads as a
  multiple of bf16's rounding floor; outputs poisoned (NaN) before each call; and the overflow case of
  tests/attention/test_attention_nonfinite.py (scale 2^120 / log2 e: one row +inf, one -inf, one near -1e38)
  against SDPA's math in float32: NaN rows, the -inf row "no key" (0, lse -inf), live rows equal;
  timing: do_bench medians, ROUNDS interleaved rounds of shipped / tile_nan, GPU time.

    python experiments/tiles/gpu_inf_shift.py [--rounds 5] [--cases all|quick]
"""
import argparse
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import zlib

ALT = "tilecore_variant"
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# (name, d, n, causal, b, h): port_check's slow rows (three consumers at D64) and two controls
CASES = [("D64 N4096 (3 consumers, q2)", 64, 4096, False, 16, 16),
         ("D64 N8192 (3 consumers)", 64, 8192, False, 8, 16),
         ("D64 N2048 causal (3 consumers)", 64, 2048, True, 32, 16),
         ("D128 N4096 (2 consumers, Q regs)", 128, 4096, False, 16, 16),
         ("D64 N1024 (2 consumers, carried)", 64, 1024, False, 64, 16),
         ("D64 N4096 causal (3 consumers, q2)", 64, 4096, True, 16, 16),
         ("D128 N4096 causal", 128, 4096, True, 16, 16)]

# variant -> the edits of tiles/gluon/ops.py (each text must occur once). "tile_nan": call 3 and 4's, against the
# per-step +inf select (shipped since c2cab6d). "clamp": the -inf shift by one max (m_ref = max(m, -FLT_MAX): a row
# whose max is still -inf shifts by -FLT_MAX, so exp2(-inf + FLT_MAX) = 0 and alpha = exp2(-inf + FLT_MAX) = 0, as
# the select's shift 0 gives; every finite m is its own max), against session 24's compare and select: T1's last
# rows, the D64 three-consumer causal forward, 0.94-0.975x bb6b420 in call 5 (0.966 / 0.972 in session 24's run,
# the change's first)
VARIANTS = {
    "tile_nan": [('    m_ref = gl.where(m_new == float("-inf"), 0.0, gl.where(m_new == float("inf"), float("nan"), m_new))\n',
                  '    m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)\n'),
                 ('    no_key = l == 0.0\n',
                  '    l = gl.where(m == float("inf"), float("nan"), l)  # a max that overflowed: the row is NaN\n'
                  '    no_key = l == 0.0\n')],
    "clamp": [('    m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)\n',
               '    m_ref = gl.maximum(m_new, -3.4028234663852886e38)  # -inf: -FLT_MAX, exp2(-inf + FLT_MAX) = 0\n')],
}
VAR = "tile_nan"


def build_variant(where: str, variant: str) -> None:
    dst = os.path.join(where, ALT)
    shutil.copytree(os.path.join(ROOT, "tilecore"), dst, ignore=shutil.ignore_patterns("__pycache__"))
    for dirpath, _, files in os.walk(dst):
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(dirpath, f)
                with open(p) as fh:
                    s = fh.read()
                with open(p, "w") as fh:
                    fh.write(re.sub(r"\btilecore\b", ALT, s))
    p = os.path.join(dst, "tiles", "gluon", "ops.py")
    s = open(p).read()
    for old, new in VARIANTS[variant]:
        assert s.count(old) == 1, f"tiles/gluon/ops.py is not the one variant {variant} edits: {old!r}"
        s = s.replace(old, new)
    with open(p, "w") as fh:
        fh.write(s)
    sys.path.insert(0, where)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cases", default="all", help="all; quick (the first two and the D64 N1024 control); confirm "
                    "(the first four); causal (D64 N4096 / N2048 causal, D128 N4096 causal, D64 N8192); recheck (D128 N4096 "
                    "causal alone: session 35's clamp run had it 0.898-1.047 by round)")
    ap.add_argument("--no-pick", action="store_true", help="skip the public plan's own pick (two more compiles)")
    ap.add_argument("--rep", type=int, default=100, help="do_bench's rep (ms) a measurement")
    ap.add_argument("--variant", default="tile_nan", choices=sorted(VARIANTS))
    a = ap.parse_args()
    t_start = time.time()
    sys.path.insert(0, ROOT)
    import torch
    import triton

    import tilecore
    from tilecore.ops.attention import configs, launch
    global VAR
    VAR = a.variant
    build_variant(tempfile.mkdtemp(prefix="hh_inf_shift_"), VAR)
    import importlib
    alt_launch = importlib.import_module(f"{ALT}.ops.attention.launch")
    trees = {"shipped": launch, VAR: alt_launch}
    assert tilecore.__file__.startswith(ROOT) and ALT in alt_launch.__file__
    dev = torch.device("cuda")
    out_dir = os.environ.get("OUT", ".")
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  rounds=a.rounds, variant=a.variant, checks=[], timing=[])

    def run(tree, q, k, v, causal, scale, cfg):
        o = torch.full_like(q, float("nan"))
        lse = torch.full(q.shape[:3], float("nan"), device=dev)
        trees[tree].forward_into(q, k, v, o, lse, causal, scale, path="gluon", config=cfg)
        return o, lse

    def save():
        with open(os.path.join(out_dir, "inf_shift.json"), "w") as fh:
            json.dump(result, fh, indent=1)

    # the overflow case (tests/attention/test_attention_nonfinite.py's `overflowing`, d 64, big 1000)
    g = torch.Generator().manual_seed(1)
    q = (0.01 * torch.randn(1, 2, 24, 64, generator=g)).bfloat16()
    k = (0.1 * torch.randn(1, 2, 16, 64, generator=g)).bfloat16()
    v = torch.randn(1, 2, 16, 64, generator=g).bfloat16()
    k[..., 0] = 1.0
    q[0, 0, 3] = 0.0
    q[0, 0, 3, 0] = 1000.0  # every score +inf once scaled
    q[0, 1, 7] = 0.0
    q[0, 1, 7, 0] = -1000.0  # every score -inf
    q[0, 0, 5, 0] = -1.0  # every score about -1e38: finite
    scale = 2.0 ** 120 / math.log2(math.e)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):  # SDPA's math in float32 (the definition NaN and inf follow)
        expect = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=scale)
    nan_rows = torch.isnan(expect).any(-1)
    cfg = configs.gluon_forward_config(64, 24, 16, False)
    for tree in trees:
        o, lse = (t.cpu() for t in run(tree, q.to(dev), k.to(dev), v.to(dev), False, scale, cfg))
        live = ~nan_rows
        ok = dict(nan_rows=bool(torch.equal(torch.isnan(o).any(-1), nan_rows) and nan_rows[0, 0, 3]
                                and nan_rows.sum() == 1 and torch.isnan(lse[0, 0, 3])),
                  no_key_row=bool((o[0, 1, 7] == 0).all() and torch.isneginf(lse[0, 1, 7])),
                  live_rows_equal=bool(torch.equal(o[live].float(), expect[live].bfloat16().float())),
                  near_min_row_kept=bool(lse[0, 0, 5] < -1e35 and (o[0, 0, 5] != 0).any()))
        result["checks"].append(dict(case="overflow (scale 2^120 / log2 e)", tree=tree, ok=all(ok.values()), **ok))
        print(f"overflow case, {tree}: {ok}", flush=True)
    # causal with N > Nk: the first N - Nk rows see no key (0 and lse -inf), in both trees, bit for bit
    gq = torch.Generator().manual_seed(2)
    q2, k2, v2 = (torch.randn(1, 2, n_, 64, generator=gq).bfloat16().to(dev) for n_ in (40, 30, 30))
    cfg2 = configs.gluon_forward_config(64, 40, 30, True)
    o2 = {tree: run(tree, q2, k2, v2, True, 0.125, cfg2) for tree in trees}
    ok2 = dict(no_key_rows=all(bool((o[:, :, :10] == 0).all() and torch.isneginf(l[:, :, :10]).all())
                               for o, l in o2.values()),
               others_finite=all(bool(torch.isfinite(o[:, :, 10:]).all()) for o, _ in o2.values()),
               bitwise_equal=bool(torch.equal(o2["shipped"][0], o2[VAR][0]) and torch.equal(o2["shipped"][1], o2[VAR][1])))
    result["checks"].append(dict(case="causal N 40 > Nk 30 (rows 0-9 see no key)", ok=all(ok2.values()), **ok2))
    print(f"causal N 40 > Nk 30: {ok2}", flush=True)
    save()

    cases = {"all": CASES, "quick": [CASES[0], CASES[1], CASES[4]], "confirm": CASES[:4],
             "causal": [CASES[5], CASES[2], CASES[6], CASES[1]], "recheck": [CASES[6]]}[a.cases]
    fns = {}
    for name, d, n, causal, b, h in cases:
        gen = torch.Generator(device=dev).manual_seed(zlib.crc32(name.encode()) + int(time.time()))  # fresh inputs
        q, k, v = (torch.randn(b, h, n, d, device=dev, generator=gen).bfloat16() for _ in range(3))
        scale = d ** -0.5
        cfg = configs.gluon_forward_config(d, n, n, causal)
        outs = {tree: run(tree, q, k, v, causal, scale, cfg) for tree in trees}
        torch.cuda.synchronize()
        hs = slice(0, 2)
        ref = torch.nn.functional.scaled_dot_product_attention(q[:1, hs].double(), k[:1, hs].double(),
                                                               v[:1, hs].double(), is_causal=causal)
        floor = (ref.bfloat16().double() - ref).abs().max().item()
        err = {t: (o[:1, hs].double() - ref).abs().max().item() / floor for t, (o, _) in outs.items()}
        same = bool(torch.equal(outs["shipped"][0], outs[VAR][0])
                    and torch.equal(outs["shipped"][1], outs[VAR][1]))
        finite = bool(torch.isfinite(outs[VAR][0]).all() and torch.isfinite(outs[VAR][1]).all())
        result["checks"].append(dict(case=name, config=cfg, bitwise_equal=same, all_finite=finite,
                                     err_over_floor=err, ok=same and finite and max(err.values()) < 2.0))
        print(f"{name}: config {cfg}; O and lse bitwise equal {same}; finite {finite}; err/floor "
              + ", ".join(f"{t} {e:.2f}" for t, e in err.items()) + f"  [{time.time() - t_start:.0f} s]", flush=True)
        plans = {tree: trees[tree].plan_forward(q, k, v, causal, scale, path="gluon", config=cfg) for tree in trees}
        if name == cases[0][0] and not a.no_pick:  # the public plan's own pick (NAPKIN_FORWARD_TOPK: its top 3 timed), shipped tree
            pick = launch.plan_forward(q, k, v, causal, scale)
            result["pick"] = dict(case=name, table=cfg, picked=pick.config)
            print(f"{name}: the public plan picked {pick.config} (table {cfg})", flush=True)
            if pick.config != cfg:
                plans["shipped_pick"] = pick
        for tree, plan in plans.items():
            o = torch.empty_like(q)
            lse = torch.empty(q.shape[:3], device=dev)
            mod = trees.get(tree, launch)  # shipped_pick: the shipped tree's launch
            fns[name, tree] = (lambda plan=plan, mod=mod, q=q, k=k, v=v, o=o, lse=lse, causal=causal, scale=scale:
                               mod.forward(plan, q, k, v, o, lse, causal, scale))
        save()
    times = {key: [] for key in fns}
    for r in range(a.rounds):
        for name, *_ in cases:
            order = [t for t in ("shipped", VAR, "shipped_pick") if (name, t) in fns]
            for tree in (order if r % 2 == 0 else order[::-1]):
                times[name, tree].append(triton.testing.do_bench(fns[name, tree], warmup=25, rep=a.rep,
                                                                 return_mode="median"))
        print(f"round {r + 1}: " + "; ".join(f"{name} {times[name, 'shipped'][-1]:.4f} / {times[name, VAR][-1]:.4f}"
                                             for name, *_ in cases) + f"  [{time.time() - t_start:.0f} s]", flush=True)
    print(f"timed [{time.time() - t_start:.0f} s]; GPU time, do_bench medians of {a.rounds} interleaved rounds")
    print(f"{'case':34s} {'shipped ms':>10s} {VAR + ' ms':>11s} {'shipped/' + VAR:>16s}  per round")
    for name, d, n, causal, b, h in cases:
        t0, t1 = (statistics.median(times[name, t]) for t in ("shipped", VAR))
        per = [x / y for x, y in zip(times[name, "shipped"], times[name, VAR])]
        flops = 4 * b * h * n * n * d // (2 if causal else 1)
        result["timing"].append(dict(case=name, shipped_ms=t0, variant_ms=t1, speedup=t0 / t1,
                                     per_round=per, shipped_rounds=times[name, "shipped"],
                                     variant_rounds=times[name, VAR], tflops_shipped=flops / t0 / 1e9,
                                     tflops_variant=flops / t1 / 1e9))
        print(f"{name:34s} {t0:10.4f} {t1:11.4f} {t0 / t1:16.3f}  {min(per):.3f}-{max(per):.3f}", flush=True)
        if (name, "shipped_pick") in times:
            tp = statistics.median(times[name, "shipped_pick"])
            result["timing"][-1].update(pick_ms=tp, pick_rounds=times[name, "shipped_pick"])
            print(f"{'  ... the public plan pick (shipped)':34s} {tp:10.4f}  pick time / table time {tp / t0:.3f}",
                  flush=True)
    print("checks: " + ("all ok" if all(c["ok"] for c in result["checks"]) else
                        "FAILED: " + ", ".join(f"{c['case']} ({c.get('tree', '')})" for c in result["checks"]
                                               if not c["ok"])))
    save()


if __name__ == "__main__":
    main()
