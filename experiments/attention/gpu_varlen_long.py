"""The varlen backward's route for long sequences (config VARLEN_GLUON_BACKWARD_LONG, issue 35, session 35): the
sequences of at least ``long_from`` rows by the fixed-length backward (one call each, on views of the packed
tensors), the rest by the shipped varlen split, against the shipped split alone and the fixed path's matched
rate, checked against float64 in one run, <= 60 s on an H100 including compiles.

Why: 64% of the long tail's backward FLOPs sit in its three sequences >= 4096 (9449, 5083, 4593), where the fixed
path's fused dQ runs ~9% faster than the varlen split (session 34: split 0.925-0.927x matched; target 0.95).

    PYTHONPATH=. python3 experiments/attention/gpu_varlen_long.py [--budget 58] [--routes 4096,2048]

check: bf16 against float64 autograd of the varlen reference (2 heads), NaN-poisoned gradients, lengths 0 / 1 /
    odd / > 4096, causal (H8, and GQA 8 / 2) and not, routed from 1024 (two sequences) and 4096 (one).
time (do_bench medians of alternate rounds): the 64K long-tailed batch (54 sequences, longest 9449), H16 D128
    causal bf16, backward from the same forward: the shipped split, the route at each --routes length given
    cu_seqlens' values (host cu) and, for the first, reading them itself (a host sync a call, what the op does);
    and from 4096 with the fixed calls on a stream of their own (long_stream); the routed sequences alone (split
    against their fixed-length calls); the public op's backward through autograd with the route off and from the
    first length (the forward's copy of cu_seqlens, op.HostOffsets); the fixed path's default backward at N 512
    ... 8192 (B = 64K / N) for the matched ratio.
Prints a table last; writes $OUT/gpu_varlen_long.json.

    TRITON_INTERPRET=1 PYTHONPATH=. python3 experiments/attention/gpu_varlen_long.py --smoke   (CPU: the script's
    paths on tiny shapes, the tl kernels standing in for the Gluon ones)
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
BUDGET = [58.0]
OUT = {"check": [], "time": [], "errors": [], "table": []}
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


def forward(q, k, v, cu, causal, scale):
    from tilecore.ops.attention_varlen import op as varlen

    if SMOKE[0]:
        return varlen.forward_kernels(q, k, v, cu, cu, causal, scale, -1, -1, 0.0)
    return varlen.forward_gluon(q, k, v, cu, cu, causal, scale, 0.0)


def backward(dout, q, k, v, out, lse, cu, causal, scale, grads, long_from, host_cu, stream=False):
    """varlen.backward_gluon with the route from ``long_from`` rows (0: the shipped split alone); ``host_cu``:
    cu_seqlens' values (None: the op reads them); ``stream``: the fixed calls on a stream of their own
    (long_stream). --smoke: the tl kernels with the same route."""
    from tilecore.ops.attention_varlen import op as varlen

    if SMOKE[0]:
        return varlen.backward_kernels(dout, q, k, v, out, lse, None, cu, cu, causal, scale, -1, -1, 0.0,
                                       grads=grads, long_from=long_from, host_cu=host_cu)
    return varlen.backward_gluon(dout, q, k, v, out, lse, None, cu, cu, causal, scale, -1, -1, 0.0, grads=grads,
                                 long_from=long_from, host_cu=host_cu, long_stream=stream)


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
def check(name, lengths, hq, hkv, causal, long_from, ref_heads=2):
    """One routed backward against float64 (the first ``ref_heads`` q heads and their kv heads), into
    NaN-poisoned gradients; the op reads cu_seqlens itself."""
    from tilecore import accuracy
    from tilecore.ops.attention_varlen.reference import varlen_reference

    d = D[0]
    cu = cu_of(lengths)
    torch.manual_seed(len(lengths) + sum(lengths) + hkv)
    dtype = torch.float16 if SMOKE[0] else torch.bfloat16
    total = sum(lengths)
    q = torch.randn(total, hq, d, dtype=dtype, device=DEV[0])
    k, v = (torch.randn(total, hkv, d, dtype=dtype, device=DEV[0]) for _ in range(2))
    scale = d ** -0.5
    out, lse = forward(q, k, v, cu, causal, scale)
    dout = torch.randn_like(out)
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    backward(dout, q, k, v, out, lse, cu, causal, scale, grads, long_from, None)
    if not SMOKE[0]:
        torch.cuda.synchronize()
    group = hq // hkv
    kv_heads = max(1, ref_heads // group)
    x64 = [q[:, :kv_heads * group].double().requires_grad_()] + [
        t[:, :kv_heads].double().requires_grad_() for t in (k, v)]
    ref, _ = varlen_reference(*x64, cu, cu, causal=causal)
    ref_grads = torch.autograd.grad((ref * dout[:, :kv_heads * group].double()).sum(), x64)
    got = (grads[0][:, :kv_heads * group], grads[1][:, :kv_heads], grads[2][:, :kv_heads])
    row = {"case": name, "unwritten": int(sum(g.isnan().sum() for g in grads))}
    for n, g, r in zip("qkv", got, ref_grads):
        row[f"d{n}_x_floor"] = accuracy.error_over_floor(g, r)
    row["ok"] = row["unwritten"] == 0 and all(row[f"d{n}_x_floor"] <= 3.0 for n in "qkv")
    OUT["check"].append(row)
    say(("PASS " if row["ok"] else "FAIL ") + name + " " + " ".join(
        f"d{n} {row[f'd{n}_x_floor']:.2f}" for n in "qkv") + f" unwritten {row['unwritten']}")


# ----------------------------------------------------------------------------------------------------------
def varlen_inputs(lengths):
    h, d = H[0], D[0]
    torch.manual_seed(1)
    total = sum(lengths)
    cu = cu_of(lengths)
    dtype = torch.float16 if SMOKE[0] else torch.bfloat16
    q, k, v, dout = (torch.randn(total, h, d, dtype=dtype, device=DEV[0]) for _ in range(4))
    out, lse = forward(q, k, v, cu, True, d ** -0.5)
    grads = tuple(torch.empty_like(t) for t in (q, k, v))
    return q, k, v, dout, out, lse, cu, grads


def varlen_call(inputs, long_from, host, stream=False):
    q, k, v, dout, out, lse, cu, grads = inputs
    host_cu = cu.tolist() if host else None
    scale = q.shape[-1] ** -0.5
    return lambda: backward(dout, q, k, v, out, lse, cu, True, scale, grads, long_from, host_cu, stream)


def op_calls(lengths, long_from):
    """The public op's backward through autograd (tilecore.attention_varlen, causal, retain_graph), the route off
    and from ``long_from`` rows (configs.VARLEN_GLUON_BACKWARD_LONG patched around each forward and backward: the
    forward's copy of cu_seqlens feeds the backward), as (name, fn) pairs."""
    from tilecore.ops.attention_varlen import attention_varlen, configs
    from tilecore.tiles.switches import patched

    h, d = H[0], D[0]
    torch.manual_seed(2)
    total, cu, longest = sum(lengths), cu_of(lengths), max(lengths)
    dtype = torch.float16 if SMOKE[0] else torch.bfloat16
    calls = []
    for name, value in (("op autograd, split", 0), (f"op autograd, route {long_from}", long_from)):
        q, k, v = (torch.randn(total, h, d, dtype=dtype, device=DEV[0], requires_grad=True) for _ in range(3))
        with patched(configs, VARLEN_GLUON_BACKWARD_LONG=value):
            out = attention_varlen(q, k, v, cu, cu, longest, longest, causal=True)
        dout = torch.randn_like(out)

        def fn(out=out, q=q, k=k, v=v, dout=dout, value=value):
            with patched(configs, VARLEN_GLUON_BACKWARD_LONG=value):
                return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        calls.append((name, fn))
    return calls


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


def ab(label, lengths, variants, rounds, calls=None):
    """Alternate rounds of the variants ((name, long_from, host cu[, stream])) on one batch, or of ``calls``
    ((name, fn) pairs); medians."""
    if calls is None:
        inputs = varlen_inputs(lengths)
        calls = [(name, varlen_call(inputs, *options)) for name, *options in variants]
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
    return result


def per_sequence(lengths, rounds):
    """Each routed length alone, H16 D128 causal: the varlen split on it, its route (the fixed call on views of
    the packed tensors) and the fixed default on contiguous (1, H, N, D) copies, alternate rounds; TFLOP/s."""
    rows = {}
    for n in lengths:
        if left(10) < 0:
            say(f"skip per-sequence N{n}: budget")
            continue

        def one(n=n):
            inputs = varlen_inputs([n])
            fixed, p = fixed_call(inputs, 1, n)
            calls = [("split", varlen_call(inputs, 0, True)), ("route (view)", varlen_call(inputs, 1, True)),
                     ("fixed B1 (contiguous)", fixed)]
            times = {name: [] for name, _ in calls}
            for _, fn in calls:
                fn()
            for _ in range(rounds):
                for name, fn in calls:
                    times[name].append(bench(fn))
            flops = bwd_flops([n])
            ms = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
            rows[n] = {name: dict(ms=m, tflops=flops / m * 1e-9, rounds=times[name]) for name, m in ms.items()}
            say(f"N{n} alone: " + ", ".join(f"{name} {m:.3f} ms ({flops / m * 1e-9:.0f} TF)" for name, m in ms.items())
                + f" [fixed {p.config.get('dq_from')}]")
        guarded(f"per-sequence N{n}", one)
    OUT["per_sequence"] = rows
    return rows


def graph_of(fn):
    """fn captured in a CUDA graph (after a warm-up call on a side stream; gpu_varlen_bwd.graph_of's): the
    replay's time is the GPU's alone, with no host time between the kernels."""
    if SMOKE[0]:
        return fn
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def graphs(lt, long_from, rounds):
    """--graphs: where the route's per-sequence gain goes in the batch. The long tail, the split and the route,
    eager and replayed from CUDA graphs (GPU time alone); the rest (the sequences < long_from) as a batch of its
    own and the routed ones as one (split, and route: their fixed calls), from graphs: the parts' sum."""
    out = {}
    inputs = varlen_inputs(lt)
    split, route = varlen_call(inputs, 0, True), varlen_call(inputs, long_from, True)
    calls = [("split eager", split), ("route eager", route)]
    for name, fn in (("split graph", split), ("route graph", route)):
        replay = guarded(f"capture {name}", graph_of, fn)
        if replay is not None:
            calls.append((name, replay))
    out["long tail"] = ab("long tail", lt, None, rounds, calls)
    for label, part in (("rest", [n for n in lt if n < long_from]), ("routed", [n for n in lt if n >= long_from])):
        if left(8) < 0 or not part:
            continue
        part_inputs = varlen_inputs(part)
        calls = [("split graph", varlen_call(part_inputs, 0, True))]
        if label == "routed":
            calls.append(("route graph", varlen_call(part_inputs, 1, True)))
        calls = [(name, guarded(f"capture {label} {name}", graph_of, fn)) for name, fn in calls]
        out[label] = ab(f"{label} ({len(part)} seqs)", part, None, 2, [(n, fn) for n, fn in calls if fn is not None])
    return out


def fixed_rates():
    """The fixed default backward's TFLOP/s at each MATCHED length, B = 64K / N."""
    rates = {}
    for n in ((16, 32) if SMOKE[0] else MATCHED):
        if left(6) < 0:
            say(f"skip fixed N{n}: budget")
            continue
        b = 2 if SMOKE[0] else 65536 // n

        def one(n=n, b=b):
            fn, p = fixed_call(varlen_inputs([n] * b), b, n)
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
    ap.add_argument("--budget", type=float, default=58.0)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes, tl kernels")
    ap.add_argument("--routes", default="4096,2048", help="long_from lengths timed (the first also reading cu)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-fixed-rates", action="store_true", help="skip the fixed path at N 512 ... 8192")
    ap.add_argument("--no-op", action="store_true", help="skip the public op's autograd A/B")
    ap.add_argument("--per-seq", action="store_true", help="first: each routed length alone (split, route, fixed B1)")
    ap.add_argument("--graphs", action="store_true",
                    help="instead of the variants: split / route eager and from CUDA graphs, and the parts")
    ap.add_argument("--variants", default="split,host,reads,stream",
                    help="long-tail variants: split, host (each --routes), reads, stream (the first route)")
    args = ap.parse_args()
    BUDGET[0] = args.budget if not args.smoke else 1e9
    if args.smoke:
        SMOKE[0], H[0], D[0], DEV[0] = True, 2, 16, "cpu"
    name = "cpu (smoke)" if args.smoke else torch.cuda.get_device_properties(0).name
    OUT["meta"] = {"gpu": name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    say(f"{name}, torch {torch.__version__}")
    routes = [int(x) for x in args.routes.split(",") if x]
    scale_down = 64 if args.smoke else 1  # smoke: lengths / 64 (the routes too)
    routes = [max(1, r // scale_down) for r in routes]
    wanted = set(args.variants.split(","))
    variants = [("split (shipped)", 0, True)] + [(f"route {r} (host cu)", r, True) for r in routes if "host" in wanted]
    variants += [(f"route {routes[0]} (reads cu)", routes[0], False)] if routes and "reads" in wanted else []
    variants += [(f"route {routes[0]} stream (host cu)", routes[0], True, True)] if routes and "stream" in wanted else []
    lt = [16, 40, 3, 25, 70] if args.smoke else long_tailed()
    per_seq = per_sequence([n for n in lt if routes and n >= routes[0]], 2) if args.per_seq else {}
    graph_times = (guarded("graphs", graphs, lt, routes[0], args.rounds) or {}) if args.graphs and routes else {}
    lt_times = {} if args.graphs else guarded("long-tailed", ab, "long-tailed", lt, variants, args.rounds) or {}
    rates = {} if args.no_fixed_rates else fixed_rates()
    if not args.no_check:  # lengths 0 / 1 / odd / past 4096; two routed (from 1024), one (from 4096); GQA; not causal
        lens = [1, 0, 20, 5, 40, 2, 70] if args.smoke else [1, 0, 777, 63, 1500, 2, 4500]
        low, high = (16, 64) if args.smoke else (1024, 4096)
        for label, hq, hkv, causal, long_from in (("causal H8 from", 8, 8, True, low), ("causal GQA 8/2 from", 8, 2,
                                                  True, high), ("full H8 from", 8, 8, False, low)):
            if left(6 if causal else 14) < 0:
                say(f"skip check {label}: budget")
                continue
            guarded(f"check {label}", check, f"{label} {long_from} q{lens}", lens, hq, hkv, causal, long_from)
    # the long tail's routed sequences alone: the varlen split on them against their fixed-length calls
    longs = [n for n in lt if n >= routes[0]] if routes else []
    long_times = (guarded("long only", ab, f"long only {longs}", longs, variants[:2], 2) or {}) \
        if longs and not args.per_seq and not args.graphs else {}
    # the public op's backward through autograd, the route off and on (its forward's copy of cu_seqlens)
    op_times = {}
    if routes and not args.no_op and left(12) > 0:
        op_times = guarded("op", lambda: ab("long-tailed op", lt, None, 2, op_calls(lt, routes[0]))) or {}
    # the table
    say(f"== varlen backward, H16 D128 causal bf16, ms (median of alternate rounds); {time.time() - START:.0f} s ==")
    base = lt_times.get(variants[0][0])
    matched = matched_ms(lt, rates) if len(rates) >= 2 else None
    if matched:
        say(f"long-tailed ({len(lt)} seqs, longest {max(lt)}): fixed matched {matched:.3f} ms "
            f"(rates at N {sorted(rates)})")
    for name, ms in lt_times.items():
        extra = f", {base / ms:.3f}x split" if base else ""
        extra += f", {matched / ms:.3f}x matched" if matched else ""
        say(f"  long-tailed {name:26s} {ms:7.3f} ms{extra}")
    for part, times in graph_times.items():
        base_g = times.get("split graph") or times.get("split eager")
        for name, ms in times.items():
            extra = f", {base_g / ms:.3f}x split" if base_g else ""
            extra += f", {matched / ms:.3f}x matched" if matched and part == "long tail" else ""
            say(f"  {part} {name:22s} {ms:7.3f} ms{extra}")
    OUT["graphs"] = graph_times
    for name, ms in op_times.items():
        extra = f", {matched / ms:.3f}x matched" if matched else ""
        say(f"  long-tailed {name:26s} {ms:7.3f} ms{extra}")
    long_matched = matched_ms(longs, rates) if len(rates) >= 2 and longs else None
    for name, ms in long_times.items():
        extra = f", {long_matched / ms:.3f}x matched" if long_matched else ""
        say(f"  long only {name:28s} {ms:7.3f} ms{extra}")
    for n, row in per_seq.items():
        at_rate = matched_ms([n], rates) if len(rates) >= 2 else None  # ms at the fixed path's B = 64K / N rate
        say(f"  N{n} alone: " + ", ".join(f"{name} {r['ms']:.3f} ms" + (f" {at_rate / r['ms']:.3f}x" if at_rate else "")
                                         for name, r in row.items()) + " (x: of the matched rate)")
    OUT["summary"] = {"long_tailed": lt_times, "long_only": long_times, "op_autograd": op_times, "fixed_rates": rates,
                      "matched_ms": matched, "long_matched_ms": long_matched, "lengths": lt}
    say(f"checks: {sum(r['ok'] for r in OUT['check'])} ok, {sum(not r['ok'] for r in OUT['check'])} bad; "
        f"errors {len(OUT['errors'])}")
    out_dir = os.environ.get("OUT", "/tmp")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gpu_varlen_long.json"), "w") as f:
        json.dump(OUT, f, indent=1)


if __name__ == "__main__":
    main()
