"""Issue 37, session 36 (helper HF): the norm backward against issue 37's 90% of copy, and fft_conv's figures at 4096
(x torch.fft, % of copy), in one run.

    PYTHONPATH=. python experiments/norm_rotary/gpu_s36.py [--fft-sizes 4096] [--compile-peer]

Call 1 (snapshot 17a61a21) timed the first candidates at 65536 x 1024 (the finishing kernel, the compiler-pipelined
loop, the weight hoisted: notes/norm/README.md); configs.BACKWARD_FINISH "kernel" shipped from it. Call 2 (791b332e,
H200) confirmed it at 1024 and on the fused 1024 backward, found it 1-4% slower at 4096, and the row groups an SM worth
more (4 at 1024, 2 at 4096); call 3 (e972e559, H100) put those on (configs.PLAIN_BACKWARD, FINISH_PROGRAMS 512); this
form (call 4) confirms them against the configurations before (CASES):

1. Norm backward (bf16; LayerNorm with weight and bias, RMSNorm with a weight, the fused variant with a residual,
   dropout 0.1 and the prenorm gradient), launch.backward on plans from plan.tl_plan: the shipped plan, the torch
   finish (the plan before), and candidates (groups an SM, the finishing kernel's programs). Each is checked first on
   fresh 4096-row inputs (outputs poisoned with NaN) against a float64 autograd reference (error / the rounding
   floor; the fused one with the kernels' own dropout mask), then timed at 65536 rows under CUDA graphs
   (triton.testing.do_bench_cudagraph, median: an eager 0.15 ms call is disturbed by other lanes' compiles), against
   a graph-timed copy of the same bytes (LayerNorm / RMSNorm: dy, x read, dx written; fused: dy, h, dh read, dx,
   dresidual written).
2. Peers at 65536 x 1024: forward + backward through autograd, ours against Liger-Kernel's (where importable) and
   (--compile-peer) torch.compile's, graph-timed.
3. fft_conv at B16 H768 bf16 (spectrum precomputed; --fft-sizes): the shipped op and torch.fft (rfft, product, irfft
   in float32), do_bench medians (0.4+ ms: eager is fine), the op's output on a B2 H64 slice against float64; % of
   copy = the op's bytes (u, the spectrum, y: model.bound_ms) at the anchors' copy speed over the measured time.
Prints rows as they land and a short table last; writes norm_fft_gpu_s36.json to $OUT.
"""
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton

from tilecore import accuracy
from tilecore.ops.norm import configs as norm_configs
from tilecore.ops.norm import launch as norm_launch
from tilecore.ops.norm import layer_norm_reference
from tilecore.ops.norm.plan import tl_plan
from tilecore.tiles.switches import patched

START = time.time()
DEV = torch.device("cuda")
OUT = os.environ.get("OUT", ".")
ROWS, N = 65536, 1024
SMALL_ROWS = 4096  # the check's rows
BOUND = 1.3  # error / floor: the shipped backward sits at 1.00-1.05x
RESULTS = {"norm": [], "norm_peers": [], "fft": [], "errors": []}
TORCH = ("torch finish", dict(finish="torch"), {})
SHIPPED = ("shipped", {}, {})


def groups(k, finish=None):
    kw = dict(groups_per_sm=k, **({"finish": finish} if finish else {}))
    return (f"{k} groups/SM" + (f", {finish} finish" if finish else ""), kw, {})


# the configurations before this session's flips, timed beside the shipped ones (call 4: confirmation)
S35 = ("session 35: 8/SM, torch finish", dict(groups_per_sm=8, finish="torch"), {})
CALL1 = ("call 1: 8/SM, finish 128", dict(groups_per_sm=8), dict(FINISH_PROGRAMS=128))
FINISH128 = ("finish 128 programs", {}, dict(FINISH_PROGRAMS=128))
# (variant, columns, [(label, tl_plan keywords, configs patched)]), most telling first (none added after STOP_S).
# Call 3 (H100) put configs.PLAIN_BACKWARD (4 groups an SM at 1024, 2 at 4096) and FINISH_PROGRAMS 512 on; call 4
# confirms them against the configurations before (and the fused 4096 backward at 4 groups an SM, a candidate).
CASES = [
    ("layer", 1024, [SHIPPED, CALL1, S35]),
    ("rms", 1024, [SHIPPED, CALL1, S35]),
    ("layer", 4096, [SHIPPED, FINISH128, S35]),
    ("rms", 4096, [SHIPPED, FINISH128, S35]),
    ("fused", 1024, [SHIPPED, TORCH, groups(3), groups(6)]),  # 168 registers x 128 threads: 3 resident an SM
    ("fused", 4096, [SHIPPED, FINISH128, TORCH, groups(4), groups(2)]),
]
# the op (forward + backward through autograd) with configs.PLAIN_BACKWARD patched to each, beside the shipped op
OP_CANDIDATES: dict = {}
STOP_S = 50  # no new candidate after this (the job's limit is 70 s, compiles included)
P_FUSED = 0.1


def say(*args):
    print(f"[{time.time() - START:5.1f} s]", *args, flush=True)


def graph_ms(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median")


_COPY = {}


def copy_ms(nbytes: int) -> float:
    if nbytes not in _COPY:
        src = torch.empty(nbytes // 4, dtype=torch.float16, device=DEV)
        dst = torch.empty_like(src)
        _COPY[nbytes] = graph_ms(lambda: dst.copy_(src))
    return _COPY[nbytes]


def poison():
    block = torch.full((1 << 29,), float("nan"), dtype=torch.float16, device=DEV)
    del block


def reference(x, w, b, r, keep, dy, dh, variant):
    """float64 gradients: (dx, dweight, dbias) or, fused, (dx, dweight, dbias, dresidual)."""
    leaves = [t.detach().double().requires_grad_() for t in (x, w, b, r) if t is not None]
    xd, wd, bd = leaves[0], leaves[1], (leaves[2] if b is not None else None)
    rd = leaves[-1] if r is not None else None
    y, h = layer_norm_reference(xd, wd, bd, residual=rd, keep=keep, dropout_p=P_FUSED if keep is not None else 0.0,
                                rms=variant == "rms", h_dtype=x.dtype)
    loss = (y * dy.double()).sum()
    if dh is not None:
        loss = loss + (h * dh.double()).sum()
    return torch.autograd.grad(loss, leaves)


def norm_case(variant: str, n: int, candidates, sms: int):
    dtype = torch.bfloat16
    rms, fused = variant == "rms", variant == "fused"
    g = torch.Generator(device=DEV).manual_seed(36 + n + len(variant))

    def inputs(rows):
        x = torch.randn(rows, n, device=DEV, generator=g).to(dtype)
        w = (1 + 0.5 * torch.randn(n, device=DEV, generator=g)).to(dtype)
        b = None if rms else torch.randn(n, device=DEV, generator=g).to(dtype)
        r = torch.randn(rows, n, device=DEV, generator=g).to(dtype) if fused else None
        dy = torch.randn(rows, n, device=DEV, generator=g).to(dtype)
        dh = torch.randn(rows, n, device=DEV, generator=g).to(dtype) if fused else None
        seed = torch.randint(0, 2**62, (1,), device=DEV, generator=g) if fused else None
        return x, w, b, r, dy, dh, seed

    def forward(x, w, b, r, seed):
        base = tl_plan(x.shape[0], n, sms, fused=fused)
        _, h, mean, rstd = norm_launch.forward(base, x, r, w, b, seed, P_FUSED if fused else 0.0, 1e-5, rms, fused,
                                               dtype)
        return base, h, mean, rstd

    def backward(p, x, w, b, r, dy, dh, seed, h, mean, rstd):
        if fused:
            return norm_launch.backward(p, dy, None, None, h, w, b, mean, rstd, seed, dh, P_FUSED, False, dtype, dtype,
                                        True)
        return norm_launch.backward(p, dy, x, None, None, w, b, mean, rstd, None, None, 0.0, rms, dtype, dtype, False)

    small, big = inputs(SMALL_ROWS), inputs(ROWS)
    base, h_small, mean_small, rstd_small = forward(*small[:4], small[6])
    keep = norm_launch.dropout_mask(small[6], SMALL_ROWS, n, P_FUSED, base) if fused else None
    refs = reference(*small[:4], keep, small[4], small[5], variant)
    _, h_big, mean_big, rstd_big = forward(*big[:4], big[6])
    nbytes = (5 if fused else 3) * ROWS * n * 2  # fused: dy, h, dh read, dx, dres written (+ dy x, dx otherwise)
    c = copy_ms(nbytes)
    shipped_ms = None
    for label, kw, patches in candidates:
        if time.time() - START > STOP_S:
            say(f"skipped (time): {variant} {n} {label}")
            continue
        try:
            with patched(norm_configs, **patches):
                p = tl_plan(SMALL_ROWS, n, sms, fused=fused, **kw)
                poison()
                outs = backward(p, *small, h_small, mean_small, rstd_small)
                got = (outs[0], outs[2], outs[3]) + ((outs[1],) if fused else ())
                if rms:
                    got = got[:2]
                names = ("dx", "dw", "db", "dres")
                errs = {name: (accuracy.error_over_floor(o, want) if torch.isfinite(o).all() else math.inf)
                        for name, o, want in zip(names, got, refs)}
                p = tl_plan(ROWS, n, sms, fused=fused, **kw)
                ms = graph_ms(lambda: backward(p, *big, h_big, mean_big, rstd_big))
            ok = all(e <= BOUND for e in errs.values())
            if label == "shipped":
                shipped_ms = ms
            row = dict(variant=variant, n=n, what=label, ms=ms, pct_copy=100 * c / ms, copy_ms=c, ok=ok, errs=errs,
                       vs_shipped=(shipped_ms / ms) if shipped_ms else None, groups=p.groups,
                       backward_rows=p.backward_rows, warps=p.backward_warps, finish=p.finish)
            RESULTS["norm"].append(row)
            say(json.dumps(row))
        except Exception as err:  # noqa: BLE001
            say(f"[error] {variant} {n} {label}: {type(err).__name__}: {err}")
            RESULTS["errors"].append(f"{variant} {n} {label}: {type(err).__name__}: {err}")
    return big


def norm_peers(rms: bool, big, compile_peer: bool):
    """forward + backward through autograd at 65536 x 1024, graph-timed: ours (shipped), Liger's, torch.compile's."""
    from tilecore.ops.norm import layer_norm

    x, w, b, _, dy, _, _ = big
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    bg = None if b is None else b.clone().requires_grad_()
    leaves = [t for t in (xg, wg, bg) if t is not None]
    variant = "rms" if rms else "layer"
    n = x.shape[-1]

    def step(f):
        return lambda: torch.autograd.grad(f(), leaves, dy)

    fns = {"ours": step(lambda: layer_norm(xg, wg, bg, rms=rms))}
    table = OP_CANDIDATES.get(n)
    if table:  # on another shape (a plan of its own), made under the patched table
        x2, dy2 = x[:-8].clone().requires_grad_(), dy[:-8]
        leaves2 = [t for t in (x2, wg, bg) if t is not None]

        def candidate():
            with patched(norm_configs, PLAIN_BACKWARD=table):
                return torch.autograd.grad(layer_norm(x2, wg, bg, rms=rms), leaves2, dy2)

        fns[f"ours PLAIN_BACKWARD {table}"] = candidate
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        fns["liger"] = step((lambda: LigerRMSNormFunction.apply(xg, wg, 1e-5)) if rms
                            else (lambda: LigerLayerNormFunction.apply(xg, wg, bg, 1e-5)))
    except Exception as err:  # noqa: BLE001
        say(f"liger not importable: {type(err).__name__}: {err}")
    if compile_peer and time.time() - START < STOP_S - 20:
        eager = ((lambda x, w: F.rms_norm(x, (n,), w, 1e-5)) if rms
                 else (lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5)))
        compiled = torch.compile(eager)
        fns["torch.compile"] = step(lambda: compiled(*leaves))
    nbytes = 5 * ROWS * n * 2
    c = copy_ms(nbytes)
    for name, fn in fns.items():
        try:
            ms = graph_ms(fn)
        except Exception as err:  # noqa: BLE001
            say(f"[error] peer {name}: {type(err).__name__}: {err}")
            continue
        row = dict(variant=variant, n=n, what=f"fwd+bwd {name}", ms=ms, pct_copy=100 * c / ms)
        RESULTS["norm_peers"].append(row)
        say(json.dumps(row))


def fft_case(n: int):
    from tilecore.ops.fft_conv import fft_conv, fft_conv_reference, filter_spectrum, model
    from tilecore.ops.fft_conv.plan import plan as conv_plan

    g = torch.Generator(device=DEV).manual_seed(n)
    u = torch.randn(16, 768, n, device=DEV, generator=g).to(torch.bfloat16)
    k = (torch.randn(768, n, generator=torch.Generator().manual_seed(n)) / math.sqrt(n)).to(torch.bfloat16)
    spectrum = filter_spectrum(k, n).to(DEV)
    path = conv_plan(n, u.device).path
    bench = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    y = fft_conv(u, spectrum)
    err = accuracy.error_over_floor(y[:2, :64].cpu(), fft_conv_reference(u[:2, :64].double().cpu(), k[:64].double()))
    ours = bench(lambda: fft_conv(u, spectrum))
    base = bench(lambda: torch.fft.irfft(torch.fft.rfft(u.float(), n=2 * n) * spectrum, n=2 * n)[..., :n])
    bound = model.bound_ms("pair", 16, 768, n)
    row = dict(n=n, path=path, ms=ours, torch_fft_ms=base, speedup=base / ours, pct_copy=100 * bound / ours,
               copy_bound_ms=bound, five_x_ms=base / 5, err_over_floor=err, finite=bool(torch.isfinite(y).all()))
    RESULTS["fft"].append(row)
    say(json.dumps(row))


def save():
    RESULTS["device"] = torch.cuda.get_device_name()
    with open(os.path.join(OUT, "norm_fft_gpu_s36.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)


def main() -> int:
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    fft_sizes = []
    if "--fft-sizes" in sys.argv:
        fft_sizes = [int(s) for s in sys.argv[sys.argv.index("--fft-sizes") + 1].split(",")]
    for variant, n, candidates in CASES:
        big = norm_case(variant, n, candidates, sms)
        save()
        if n == N and variant in ("layer", "rms") and time.time() - START < STOP_S - 10:
            norm_peers(variant == "rms", big, "--compile-peer" in sys.argv)
            save()
        del big
        torch.cuda.empty_cache()
    for n in fft_sizes:
        if time.time() - START > STOP_S + 5:
            say(f"skipped (time): fft {n}")
            continue
        try:
            fft_case(n)
        except Exception as err:  # noqa: BLE001
            say(f"[error] fft {n}: {type(err).__name__}: {err}")
            RESULTS["errors"].append(f"fft {n}: {type(err).__name__}: {err}")
        save()
    print(f"\n{torch.cuda.get_device_name()}; norm backward {ROWS} rows bf16, CUDA-graph medians; % of a graph-timed copy")
    print(f"{'variant':<6} {'n':>5} {'what':<28} {'ms':>7} {'% copy':>7} {'vs shipped':>10} {'err/floor max':>13}")
    for r in RESULTS["norm"]:
        print(f"{r['variant']:<6} {r['n']:>5} {r['what']:<28} {r['ms']:7.4f} {r['pct_copy']:7.1f} "
              f"{(r['vs_shipped'] or 1):10.3f} {max(r['errs'].values()):13.3f}{'' if r['ok'] else '  FAIL'}")
    for r in RESULTS["norm_peers"]:
        print(f"{r['variant']:<6} {r['n']:>5} {r['what']:<28} {r['ms']:7.4f} {r['pct_copy']:7.1f}")
    for r in RESULTS["fft"]:
        print(f"fft {r['n']} {r['path']}: {r['ms']:.4f} ms, torch.fft {r['torch_fft_ms']:.4f} ({r['speedup']:.2f}x; "
              f"5x = {r['five_x_ms']:.4f} ms), {r['pct_copy']:.1f}% of copy, err/floor {r['err_over_floor']:.3f}")
    print("errors:", RESULTS["errors"] or "none", f"; wall {time.time() - START:.0f} s")
    return 0 if not RESULTS["errors"] and all(r["ok"] for r in RESULTS["norm"]) else 1


if __name__ == "__main__":
    sys.exit(main())
