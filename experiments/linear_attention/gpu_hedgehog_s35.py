"""Session 35 (issue 33, helper HB): Hedgehog's backward toward 2x FLA, by its parts. One job of <= 60 s.

Hedgehog d64, F 2 x 32, B16 H16 N4096 bf16, W requiring grad (the benchmark of decisions 95-97):

* the public op's fwd and fwd+bwd as shipped (configs.HEDGEHOG_MAP_EXACT_X on since call 2: the map kernels' products
  with x by two tf32 products) against the same with it off, five interleaved rounds (call 2's host was noisy);
* the map kernels alone on q (kernels_forward.hedgehog_map_fused / hedgehog_map_backward at op's blocks): tf32x3
  against tf32x2, five rounds;
* the linear kernels' backward alone on the features (launch.backward on phi(q), phi(k), v, do; no decay), five
  rounds (call 3 also timed configs.BWD_SPLIT_NARROW's blocks: 0.84x / 0.89x, removed: decision 103);
* where the shipped fwd+bwd's time goes: CUDA time by kernel (torch.profiler, the gradients set to None before each
  call, as do_bench's grad_to_none: call 2's profile summed their accumulation);
* checks first: the op's o, dq, dk, dv, dW against float64 at N 208 and 1008 (B1 H2) both ways.

``--nodecay`` (call 4): also the no-decay op at d128 (B16 H16 N4096 bf16: fwd, fwd+bwd, launch.backward), checked
against float64 (B1 H2 N 1000), and v's float32 copy alone at both shapes: what launch.backward_combine took for
nothing on the no-decay path until session 35 (call 3's profile: a 0.209 ms direct_copy kernel a Hedgehog fwd+bwd).

    PYTHONPATH=/tmp/site:. python3 experiments/linear_attention/gpu_hedgehog_s35.py

FLA (torch features + chunk_linear_attn) is not timed here (its autotune takes ~100 s): session 33 run 2's fwd 1.613,
fwd+bwd 4.220, bwd 2.607 ms. JSON to $OUT/hedgehog_s35.json.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tilecore import accuracy  # noqa: E402
from tilecore.ops.linear_attention import configs, kernels_forward, launch, linear_attention  # noqa: E402
from tilecore.ops.linear_attention import linear_attention_reference  # noqa: E402
from tilecore.ops.linear_attention.op import hedgehog_map  # noqa: E402
from tilecore.ops.linear_attention.plan import IDENTITY, tl_plan  # noqa: E402
from tilecore.tiles.switches import patched  # noqa: E402

START = time.time()
OUT = Path(os.environ.get("OUT", "/tmp/out"))
RESULTS: dict = {"check": [], "op": {}, "map": {}, "linear_bwd": {}, "profile_ms": [], "errors": []}
FLA = dict(fwd=1.613, fwd_bwd=4.220, bwd=2.607)  # session 33 run 2, same shape (torch features + chunk_linear_attn)
EXACT = {"shipped": configs.HEDGEHOG_MAP_EXACT_X, "tf32x3": False}
NODECAY = "--nodecay" in sys.argv
FLA_LINEAR_BWD = 3.448  # FLA chunk_linear_attn's bwd at d128 (session 28 run 3, same shape)


def elapsed() -> float:
    return time.time() - START


def save():
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "hedgehog_s35.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def attempt(name, fn):
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 (a row goes on)
        msg = f"{name}: {type(err).__name__}: {err}"[:400]
        print("FAILED", msg, flush=True)
        traceback.print_exc(limit=2)
        RESULTS["errors"].append(msg)
        return None


def bench(fn, grads=()):
    import triton

    return triton.testing.do_bench(fn, warmup=10, rep=50, grad_to_none=list(grads) or None, return_mode="median")


def inputs(n, b=16, h=16, dk=64, f=32, seed=0):
    torch.manual_seed(seed)
    bf = torch.bfloat16
    t = dict(q=torch.randn(b, n, h, dk, device="cuda", dtype=bf), k=torch.randn(b, n, h, dk, device="cuda", dtype=bf),
             v=torch.randn(b, n, h, 64, device="cuda", dtype=bf),
             W=torch.randn(h, dk, f, device="cuda") * dk ** -0.5)
    for x in ("q", "k", "v", "W"):
        t[x].requires_grad_(True)
    t["do"] = torch.randn_like(t["v"])
    return t


def op(t):
    return linear_attention(t["q"], t["k"], t["v"], feature_map="hedgehog", feature_weights=t["W"])


# --------------------------------------------------------------------------------------------
# checks


def checks():
    for n in (208, 1008):
        t = inputs(n, b=1, h=2, seed=5 + n)
        d = {x: t[x].detach().double().requires_grad_(True) for x in ("q", "k", "v", "W")}
        ref, _ = linear_attention_reference(d["q"], d["k"], d["v"], feature_map="hedgehog", feature_weights=d["W"])
        ref.backward(t["do"].double())
        for name, exact in EXACT.items():
            with patched(configs, HEDGEHOG_MAP_EXACT_X=exact):
                ts = {x: t[x].detach().clone().requires_grad_(True) for x in ("q", "k", "v", "W")}
                o = op(ts)
                o.backward(t["do"])
            row = dict(case=f"op {name} N {n}", out_floor=round(accuracy.error_over_floor(o.detach(), ref.detach()), 3),
                       **{f"d{x}_floor": round(accuracy.error_over_floor(ts[x].grad, d[x].grad), 3)
                          for x in ("q", "k", "v")},
                       dW_rel=round(float((ts["W"].grad.double() - d["W"].grad).norm() / d["W"].grad.norm()), 5),
                       finite=bool(all(torch.isfinite(ts[x].grad).all() for x in ts)))
            print("check", row, flush=True)
            RESULTS["check"].append(row)
    if NODECAY:  # the no-decay op at d128 (its backward's combine path)
        torch.manual_seed(11)
        bf = torch.bfloat16
        q, k, v = (torch.randn(1, 1000, 2, 128, device="cuda", dtype=bf).requires_grad_(True) for _ in range(3))
        do = torch.randn_like(v)
        d = [x.detach().double().requires_grad_(True) for x in (q, k, v)]
        ref, _ = linear_attention_reference(*d)
        ref.backward(do.double())
        o = linear_attention(q, k, v)
        o.backward(do)
        row = dict(case="no decay d128 B1 H2 N 1000", out_floor=round(accuracy.error_over_floor(o.detach(), ref), 3),
                   **{f"d{n}_floor": round(accuracy.error_over_floor(x.grad, r.grad), 3)
                      for n, x, r in zip("qkv", (q, k, v), d)})
        print("check", row, flush=True)
        RESULTS["check"].append(row)


# --------------------------------------------------------------------------------------------
# the parts


def features(n, b=16, h=16, seed=1):
    t = inputs(n, b=b, h=h, seed=seed)
    with torch.no_grad():
        fq, fk = hedgehog_map(t["q"], t["W"]), hedgehog_map(t["k"], t["W"])
    return dict(q=fq, k=fk, v=t["v"].detach(), do=t["do"])


def linear_bwd(f):
    """launch.backward on the features (as op._backward_impl plans it: no decay, no beta)."""
    q, k, v, do = f["q"], f["k"], f["v"], f["do"]
    p = launch.backward_plan(tl_plan(q, v, None, IDENTITY), q, v, None, IDENTITY)
    scale = q.shape[-1] ** -0.5
    return lambda: launch.backward(p, do, q, k, v, None, None, None, None, None, None, scale, IDENTITY, native=True)[:3]


def nodecay_inputs(n=4096, b=16, h=16, d=128, seed=3):
    torch.manual_seed(seed)
    bf = torch.bfloat16
    return dict(q=torch.randn(b, n, h, d, device="cuda", dtype=bf) * d ** -0.5,
                k=torch.randn(b, n, h, d, device="cuda", dtype=bf) * d ** -0.5,
                v=torch.randn(b, n, h, d, device="cuda", dtype=bf), do=torch.randn(b, n, h, d, device="cuda", dtype=bf))


def map_calls(t, exact):
    x, w = t["q"].detach(), t["W"].detach().float()
    dout = torch.randn(*x.shape[:-1], 2 * w.shape[-1], device="cuda", dtype=x.dtype)
    size = max(16, triton.next_power_of_2(x.shape[-1])) * max(16, triton.next_power_of_2(w.shape[-1]))
    rows, warps = next(((r, wp) for top, r, wp in configs.HEDGEHOG_MAP_BWD_BLOCKS if size <= top),
                       configs.HEDGEHOG_MAP_BWD_BLOCKS[-1][1:])  # (the op's blocks by Dk x F)
    programs = max(1, min(-(-x.numel() // (x.shape[-2] * x.shape[-1] * rows)), -(-configs.HEDGEHOG_MAP_BWD_PROGRAMS
                                                                               // x.shape[-2])))

    def fwd():
        with patched(configs, HEDGEHOG_MAP_EXACT_X=exact):
            return kernels_forward.hedgehog_map_fused(x, w, precision=configs.HEDGEHOG_MAP_PRECISION)

    def bwd():
        with patched(configs, HEDGEHOG_MAP_EXACT_X=exact):
            return kernels_forward.hedgehog_map_backward(x, w, dout, programs=programs, rows=rows, warps=warps,
                                                         precision=configs.HEDGEHOG_MAP_PRECISION)
    return fwd, bwd


def time_all(rounds: int = 5):
    t = inputs(4096)
    grads = [t["q"], t["k"], t["v"], t["W"]]
    f = features(4096)
    fb = lambda: op(t).backward(t["do"])  # noqa: E731
    rows = {}
    for name, exact in EXACT.items():
        fw, bw = map_calls(t, exact)
        rows[f"map fwd {name}"], rows[f"map bwd {name}"] = fw, bw
    rows["linear bwd"] = linear_bwd(f)
    rows["v.float() d64"] = lambda: f["v"].float()
    if NODECAY:
        n = nodecay_inputs()
        rows["no decay d128 launch.backward"] = linear_bwd(n)
        rows["v.float() d128"] = lambda: n["v"].float()
        nd = {x: n[x].detach().requires_grad_(True) for x in ("q", "k", "v")}
        nfb = lambda: linear_attention(nd["q"], nd["k"], nd["v"]).backward(n["do"])  # noqa: E731
        RESULTS["nodecay"] = {}
    for name, fn in rows.items():  # (compiles)
        attempt(f"warm {name}", fn)
    for name, exact in EXACT.items():
        with patched(configs, HEDGEHOG_MAP_EXACT_X=exact):
            attempt(f"warm op {name}", fb)
    if NODECAY:
        attempt("warm no decay", nfb)
        with torch.no_grad():
            attempt("warm no decay fwd", lambda: linear_attention(nd["q"], nd["k"], nd["v"]))
    torch.cuda.synchronize()
    print(f"compiled at {elapsed():.0f} s", flush=True)
    T = RESULTS["times"] = {}
    for r in range(rounds):
        if r >= 2 and elapsed() > 52:
            break
        for name, exact in EXACT.items():
            with patched(configs, HEDGEHOG_MAP_EXACT_X=exact):
                with torch.no_grad():
                    T.setdefault(f"op fwd {name}", []).append(attempt("fwd", lambda: bench(lambda: op(t))))
                T.setdefault(f"op fwd+bwd {name}", []).append(attempt("fb", lambda: bench(fb, grads)))
        for name, fn in rows.items():
            T.setdefault(name, []).append(attempt(name, lambda: bench(fn)))
        if NODECAY:
            with torch.no_grad():
                T.setdefault("op no decay d128 fwd", []).append(attempt("nd fwd", lambda: bench(
                    lambda: linear_attention(nd["q"], nd["k"], nd["v"]))))
            T.setdefault("op no decay d128 fwd+bwd", []).append(attempt("nd fb", lambda: bench(nfb, list(nd.values()))))
        print(f"round {r} at {elapsed():.0f} s: " + ", ".join(f"{k} {v[-1]:.4f}" for k, v in T.items() if v[-1]),
              flush=True)
        save()
    if elapsed() < 58:
        attempt("profile", lambda: profile_op(fb, grads))


def profile_op(fb, grads, calls: int = 5):
    from experiments.common.gpu_script import profiled

    def call():  # (the gradients set to None first, as do_bench's grad_to_none: no accumulation kernels)
        for g in grads:
            g.grad = None
        fb()
    prof = profiled(call, calls)
    rows = sorted(((e.key, e.device_time_total / calls / 1000.0) for e in prof.key_averages() if e.device_time_total > 0),
                  key=lambda r: -r[1])
    RESULTS["profile_ms"] = [(k[:70], round(ms, 4)) for k, ms in rows]
    print("profile (ms a fwd+bwd):", RESULTS["profile_ms"][:10], flush=True)
    save()


def table() -> str:
    T = RESULTS.get("times", {})
    med = lambda r: sorted(x for x in r if x)[len([x for x in r if x]) // 2] if any(r) else None  # noqa: E731
    f = lambda x: f"{x:.3f}" if isinstance(x, float) else "-"  # noqa: E731
    L = ["Hedgehog d64 F2x32 B16 H16 N4096 bf16, W grad (ms, medians of interleaved rounds); FLA (s33 run 2): fwd "
         f"{FLA['fwd']}, fwd+bwd {FLA['fwd_bwd']}, bwd {FLA['bwd']}"]
    for name in EXACT:
        fw, fb = med(T.get(f"op fwd {name}", [])), med(T.get(f"op fwd+bwd {name}", []))
        bwd = fb - fw if fw and fb else None
        L.append(f"  op {name}: fwd {f(fw)} ({FLA['fwd'] / fw if fw else 0:.2f}x FLA), fwd+bwd {f(fb)} "
                 f"({FLA['fwd_bwd'] / fb if fb else 0:.2f}x), bwd {f(bwd)} ({FLA['bwd'] / bwd if bwd else 0:.2f}x); "
                 f"rounds fwd+bwd {', '.join(f(x) for x in T.get(f'op fwd+bwd {name}', []))}")
    for key in [k for k in T if not k.startswith("op ")]:
        L.append(f"  {key}: {f(med(T[key]))} ({', '.join(f(x) for x in T[key])})")
    nf, nb = med(T.get("op no decay d128 fwd", [])), med(T.get("op no decay d128 fwd+bwd", []))
    if nf and nb:
        L.append(f"  op no decay d128 B16 H16 N4096: fwd {f(nf)}, fwd+bwd {f(nb)}, bwd {f(nb - nf)} = "
                 f"{FLA_LINEAR_BWD / (nb - nf):.2f}x FLA chunk_linear_attn's bwd ({FLA_LINEAR_BWD}, s28 run 3)")
    if RESULTS["profile_ms"]:
        L.append("  shipped profile: " + ", ".join(f"{k[:26]} {ms}" for k, ms in RESULTS["profile_ms"][:8]))
    for r in RESULTS["check"]:
        L.append("  check " + " | ".join(f"{k} {v}" for k, v in r.items()))
    L += [f"ERROR {e[:200]}" for e in RESULTS["errors"][:6]]
    return "\n".join(L)


def main():
    try:
        from experiments.common.meta import meta
        RESULTS["meta"] = meta()
    except Exception as err:  # noqa: BLE001
        RESULTS["meta"] = {"error": str(err)}
    try:
        attempt("checks", checks)
        print(f"checked at {elapsed():.0f} s", flush=True)
        attempt("time", time_all)
    finally:
        save()
    print(table())
    print(f"\n{elapsed():.0f} s; JSON: {OUT / 'hedgehog_s35.json'}")


if __name__ == "__main__":
    main()
