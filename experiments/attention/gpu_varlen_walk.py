"""The varlen backward's fused dQ with the walk from the last query block down (config ``walk_down``; issue 35,
session 34), checked against float64 and timed against the shipped split path and the fixed-length path in
one run, <= 70 s on an H100 including compiles.

Why: Nsight Compute (runs/varlen_ncu_run2_session34_h100.txt, uniform 16 x 4096 causal H16 D128) put the varlen
fused-dQ kernel at 5.69 ms against the fixed fused kernel's 4.88 on the same tiles, with DRAM reads 4.67 GB
against 2.99, writes 2.81 against 1.84, L2 hit rate 75.6% against 83.5% (the same 415M sectors of dQ
reductions): the varlen order (a head's key tiles drawn together) with the staggered walk makes every tile of
a head sweep all of the head's Q, dO and float32 dQ rows at once. ``walk_down`` s: every tile walks from the
last block down, starting key_block % s blocks up, so a head's tiles share a few blocks at a time.

    PYTHONPATH=. python3 experiments/attention/gpu_varlen_walk.py [--budget 68]

check: bf16, against float64 autograd of the varlen reference (2 heads), NaN-poisoned gradients, lengths 0 / 1 /
    odd / > 4096, causal and a window, the fused dQ with walk_down 4 and 1, the shipped split beside them.
time (do_bench medians, alternate rounds): the 64K long-tailed batch (54 sequences, longest 9449) and 16 x 4096,
    H16 D128 causal bf16, backward from the same forward: split (shipped), fused (staggered walk), fused
    walk_down 4 and 1; the fixed path's default backward at N 512 ... 8192 (B = 64K / N) for the matched-length
    ratio, and at 16 x 4096 beside the uniform batch.
Options: --names / --checks pick the variants, --rounds, --no-fixed-rates. Runs (session 34): call 3
(runs/varlen_walk_run3_session34_h100.txt): fused walk_down 1 5.206 ms on the long tail against the staggered
fused's 5.880 and the split's 5.158; call 4 (runs/varlen_walk2_run4_session34_h100.txt, with --fixed-walk 0,1: the
fixed kernel's WALK_DOWN, 0.988x its shipped walk, removed since with that option and gpu_fixed_walk.py; 7d16a1c has
them): split walk 1 1.003x, fused walk 1 0.978x the split.
Prints a table last; writes $OUT/gpu_varlen_walk.json.

    TRITON_INTERPRET=1 PYTHONPATH=. python3 experiments/attention/gpu_varlen_walk.py --smoke   (CPU: the script's
    paths on tiny shapes, the tl kernels standing in for the Gluon ones, which the interpreter cannot run)
"""
import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

START = time.time()
BUDGET = [68.0]
OUT = {"check": [], "time": [], "errors": [], "table": []}
VARIANTS = {"split (shipped)": {}, "fused": {"dq_from": "fused"},
            "fused walk_down 4": {"dq_from": "fused", "walk_down": 4},
            "fused walk_down 1": {"dq_from": "fused", "walk_down": 1},
            "fused walk_down 2": {"dq_from": "fused", "walk_down": 2},
            "split walk_down 4": {"dq_from": "gluon", "walk_down": 4},
            "split walk_down 1": {"dq_from": "gluon", "walk_down": 1}}
MATCHED = (512, 1024, 2048, 4096, 8192)
SMOKE = [False]
H, D, DEV = [16], [128], ["cuda"]


def left(reserve=0.0):
    return BUDGET[0] - reserve - (time.time() - START)


def say(line):
    print(f"[{time.time() - START:5.1f} s] {line}", flush=True)
    OUT["table"].append(line)


def guarded(name, fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - report and go on
        OUT["errors"].append({"case": name, "error": f"{type(e).__name__}: {e}"})
        say(f"error {name}: {type(e).__name__}: {e}")
        traceback.print_exc()
        return None


def cu_of(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=DEV[0])


def config(changes):
    from tilecore.ops.attention_varlen import configs

    return dict(configs.varlen_gluon_backward_config(128, True), **changes)


def forward(q, k, v, cu_q, cu_k, causal, scale, left, right):
    from tilecore.ops.attention_varlen import op as varlen

    if SMOKE[0]:
        return varlen.forward_kernels(q, k, v, cu_q, cu_k, causal, scale, left, right, 0.0)
    return varlen.forward_gluon(q, k, v, cu_q, cu_k, causal, scale, 0.0, left, right)


def backward(dout, q, k, v, out, lse, cu_q, cu_k, causal, scale, left, right, grads, cfg):
    """varlen.backward_gluon with ``cfg`` (--smoke: the tl kernels, which take no config)."""
    from tilecore.ops.attention_varlen import op as varlen

    if SMOKE[0]:
        return varlen.backward_kernels(dout, q, k, v, out, lse, None, cu_q, cu_k, causal, scale, left, right, 0.0,
                                       grads=grads)
    return varlen.backward_gluon(dout, q, k, v, out, lse, None, cu_q, cu_k, causal, scale, left, right, 0.0,
                                 grads=grads, config=cfg)


def long_tailed(total=65536, seed=0, longest=16384, shortest=16):
    """gpu_varlen_bwd.long_tailed_lengths: log-normal lengths (median ~800) until ``total`` tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = []
    while sum(lengths) < total:
        n = int(math.exp(torch.randn(1, generator=g).item() * 1.2 + math.log(800)))
        lengths.append(max(shortest, min(longest, n, total - sum(lengths))))
    return lengths


def bwd_flops(lengths, h=None, d=None):
    h, d = h or H[0], d or D[0]
    return 2.5 * sum(4 * n * n / 2 * d * h for n in lengths)  # causal: dK, dV, dQ, S, dP over half the scores


def bench(fn, rep=60):
    import triton

    if SMOKE[0]:
        fn()
        return 1.0
    return triton.testing.do_bench(fn, warmup=5, rep=rep, return_mode="median")


# ----------------------------------------------------------------------------------------------------------
def check(name, lens_q, lens_k, h, options, changes, ref_heads=2):
    """One backward against float64 (the first ``ref_heads`` heads), into NaN-poisoned gradients."""
    from tilecore import accuracy
    from tilecore.ops.attention_varlen.reference import varlen_reference

    d = D[0]
    cu_q, cu_k = cu_of(lens_q), cu_of(lens_k)
    torch.manual_seed(len(lens_q) + sum(lens_q))
    dtype = torch.float16 if SMOKE[0] else torch.bfloat16
    q = torch.randn(sum(lens_q), h, d, dtype=dtype, device=DEV[0])
    k, v = (torch.randn(sum(lens_k), h, d, dtype=dtype, device=DEV[0]) for _ in range(2))
    causal = options.get("causal", False)
    wl, wr = options.get("window_size", (-1, -1))
    scale = d ** -0.5
    out, lse = forward(q, k, v, cu_q, cu_k, causal, scale, wl, wr)
    dout = torch.randn_like(out)
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    backward(dout, q, k, v, out, lse, cu_q, cu_k, causal, scale, wl, wr, grads, config(changes))
    if not SMOKE[0]:
        torch.cuda.synchronize()
    x64 = [t[:, :ref_heads].double().requires_grad_() for t in (q, k, v)]
    ref, _ = varlen_reference(*x64, cu_q, cu_k, causal=causal, window_size=(wl, wr))
    ref_grads = torch.autograd.grad((ref * dout[:, :ref_heads].double()).sum(), x64)
    row = {"case": name, "unwritten": int(sum(g.isnan().sum() for g in grads))}
    for n, g, r in zip("qkv", grads, ref_grads):
        row[f"d{n}_x_floor"] = accuracy.error_over_floor(g[:, :ref_heads], r)
    row["ok"] = row["unwritten"] == 0 and all(row[f"d{n}_x_floor"] <= 3.0 for n in "qkv")
    OUT["check"].append(row)
    say(("PASS " if row["ok"] else "FAIL ") + name + " " + " ".join(
        f"d{n} {row[f'd{n}_x_floor']:.2f}" for n in "qkv") + f" unwritten {row['unwritten']}")


def run_checks(labels, lens, options, reserve):
    """The check of each labelled variant on one batch (the kernels the timing compiled, unless a window)."""
    for label in labels:
        if left(reserve) < 0:
            say(f"skip check {label} {options}: budget")
            return
        guarded(f"check {label}", check, f"{label} q{lens} H8 {options}", lens, lens, 8, options, VARIANTS[label])


# ----------------------------------------------------------------------------------------------------------
def varlen_inputs(lengths):
    h, d = H[0], D[0]
    torch.manual_seed(1)
    total = sum(lengths)
    cu = cu_of(lengths)
    dtype = torch.float16 if SMOKE[0] else torch.bfloat16
    q, k, v, dout = (torch.randn(total, h, d, dtype=dtype, device=DEV[0]) for _ in range(4))
    out, lse = forward(q, k, v, cu, cu, True, d ** -0.5, -1, -1)
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    return q, k, v, dout, out, lse, cu, grads


def varlen_call(inputs, changes):
    q, k, v, dout, out, lse, cu, grads = inputs
    cfg = config(changes)
    scale = q.shape[-1] ** -0.5
    return lambda: backward(dout, q, k, v, out, lse, cu, cu, True, scale, -1, -1, grads, cfg)


def fixed_call(inputs, b, n):
    """The fixed-length default backward (plan_backward's) on contiguous (B, H, N, D) copies of a uniform
    packed batch, from the varlen forward's O and lse (the same values the fixed forward gives)."""
    from tilecore.ops.attention import launch, plan

    q, k, v, dout, out, lse, cu, grads = inputs
    h, d = H[0], D[0]
    fixed = lambda t: t.view(b, n, h, d).transpose(1, 2).contiguous()  # noqa: E731
    qf, kf, vf, df, of = (fixed(t) for t in (q, k, v, dout, out))
    lf = lse.view(h, b, n).transpose(0, 1).contiguous()
    scale = d ** -0.5
    p = plan.plan_backward(df, qf, kf, vf, True, scale)
    gf = [torch.empty_like(t) for t in (qf, kf, vf)]
    return (lambda: launch.backward(p, df, qf, kf, vf, of, lf, None, *gf, True, scale)), p


def ab(label, lengths, names, rounds, extra=()):
    """Alternate rounds of the named variants (and ``extra``: (name, fn) pairs) on one batch; medians."""
    inputs = varlen_inputs(lengths)
    calls = [(name, varlen_call(inputs, VARIANTS[name])) for name in names] + list(extra(inputs) if extra else [])
    times = {name: [] for name, _ in calls}
    for name, fn in calls:  # compile and warm once before the rounds
        if left(10) < 0:
            say(f"skip {label} {name}: budget")
            continue
        guarded(f"warm {label} {name}", fn)
    if not SMOKE[0]:
        torch.cuda.synchronize()
    for r in range(rounds):
        if left(8) < 0:
            say(f"skip {label} round {r}: budget")
            break
        for name, fn in calls:
            t = guarded(f"time {label} {name}", bench, fn)
            if t is not None:
                times[name].append(t)
        say(f"{label} round {r}: " + ", ".join(f"{n} {t[-1]:.3f}" for n, t in times.items() if t))
    flops = bwd_flops(lengths)
    result = {}
    for name, ts in times.items():
        if ts:
            ms = sorted(ts)[len(ts) // 2]
            result[name] = ms
            OUT["time"].append({"batch": label, "variant": name, "ms": ms, "rounds": ts,
                                "tflops": flops / ms * 1e-9})
    return result, inputs


def fixed_rates(inputs_of):
    """The fixed default backward's TFLOP/s at each MATCHED length, B = 64K / N."""
    rates = {}
    for n in ((16, 32) if SMOKE[0] else MATCHED):
        if left(6) < 0:
            say(f"skip fixed N{n}: budget")
            continue
        b = 2 if SMOKE[0] else 65536 // n

        def one(n=n, b=b):
            fn, p = fixed_call(inputs_of([n] * b), b, n)
            fn()
            ms = bench(fn)
            rates[n] = bwd_flops([n] * b) / ms * 1e-9
            dq = f" (dq {p.dq.path})" if p.dq is not None else ""
            say(f"fixed N{n} B{b}: {ms:.3f} ms, {rates[n]:.0f} TFLOP/s [{p.path} {p.config.get('dq_from')}{dq}]")
            OUT["time"].append({"batch": f"fixed N{n} B{b}", "variant": "fixed default", "ms": ms,
                                "tflops": rates[n]})
        guarded(f"fixed N{n}", one)
    return rates


def matched_ms(lengths, rates):
    """The long-tailed batch's time at the fixed path's rate for each length (log2-interpolated, held at the ends)."""
    known = sorted(rates)
    total = 0.0
    for n in lengths:
        x = math.log2(max(n, 1))
        lo = max([m for m in known if math.log2(m) <= x] or known[:1])
        hi = min([m for m in known if math.log2(m) >= x] or known[-1:])
        rate = rates[lo] if lo == hi else rates[lo] + (rates[hi] - rates[lo]) * (x - math.log2(lo)) / (
            math.log2(hi) - math.log2(lo))
        total += bwd_flops([n]) / rate * 1e-9
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=68.0)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes, tl kernels")
    ap.add_argument("--names", default="split (shipped),fused,fused walk_down 4,fused walk_down 1",
                    help="the varlen variants timed (VARIANTS' names, comma-separated; the first is the baseline)")
    ap.add_argument("--checks", default="fused walk_down 4,fused walk_down 1,split (shipped)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-fixed-rates", action="store_true", help="skip the fixed path at N 512 ... 8192")
    args = ap.parse_args()
    BUDGET[0] = args.budget if not args.smoke else 1e9
    if args.smoke:
        SMOKE[0], H[0], D[0], DEV[0] = True, 2, 16, "cpu"
    name = "cpu (smoke)" if args.smoke else torch.cuda.get_device_properties(0).name
    OUT["meta"] = {"gpu": name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    say(f"{name}, torch {torch.__version__}")
    names = [x for x in args.names.split(",") if x]
    lt = [16, 40, 3, 25] if args.smoke else long_tailed()
    uniform = [32] * 2 if args.smoke else [4096] * 16
    check_lengths = ([1, 0, 37, 5, 20], [20, 3, 33]) if args.smoke else ([1, 0, 777, 63, 1500, 2, 4500],
                                                                         [700, 129, 2000, 64])
    lt_times, _ = guarded("long-tailed", ab, "long-tailed", lt, names, args.rounds) or ({}, None)
    if not args.no_check:  # causal, lengths 0 / 1 / odd / past 4096
        run_checks([x for x in args.checks.split(",") if x], check_lengths[0], {"causal": True}, 30)

    def fixed_uniform(inputs):
        fn, _ = fixed_call(inputs, len(uniform), uniform[0])
        return [("fixed default (fused)", fn)]
    uni_times, _ = guarded("uniform", ab, f"uniform {len(uniform)} x {uniform[0]}", uniform, names[:3], 2,
                           fixed_uniform) or ({}, None)
    rates = {} if args.no_fixed_rates else fixed_rates(varlen_inputs)
    if not args.no_check:  # a window (its own compiles: last)
        run_checks([x for x in args.checks.split(",") if x][:1], check_lengths[1], {"window_size": (100, 37)}, 12)
    # the table
    say(f"== varlen backward, H16 D128 causal bf16, ms (median of alternate rounds); {time.time() - START:.0f} s ==")
    base_lt = lt_times.get(names[0])
    matched = matched_ms(lt, rates) if len(rates) >= 2 else None
    if matched:
        say(f"long-tailed ({len(lt)} seqs, longest {max(lt)}): fixed matched {matched:.3f} ms "
            f"(rates at N {sorted(rates)})")
    for name, ms in lt_times.items():
        extra = f", {base_lt / ms:.3f}x {names[0]}" if base_lt else ""
        extra += f", {matched / ms:.3f}x matched" if matched else ""
        say(f"  long-tailed {name:24s} {ms:7.3f} ms{extra}")
    base_u = uni_times.get(names[0])
    fixed_u = uni_times.get("fixed default (fused)")
    for name, ms in uni_times.items():
        extra = f", {base_u / ms:.3f}x {names[0]}" if base_u else ""
        extra += f", {fixed_u / ms:.3f}x fixed" if fixed_u else ""
        say(f"  uniform {name:28s} {ms:7.3f} ms{extra}")
    OUT["summary"] = {"long_tailed": lt_times, "uniform": uni_times, "fixed_rates": rates, "matched_ms": matched}
    say(f"checks: {sum(r['ok'] for r in OUT['check'])} ok, {sum(not r['ok'] for r in OUT['check'])} bad; "
        f"errors {len(OUT['errors'])}")
    out_dir = os.environ.get("OUT", "/tmp")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gpu_varlen_walk.json"), "w") as f:
        json.dump(OUT, f, indent=1)


if __name__ == "__main__":
    main()
