"""Session 32 (issue 33, helper HB): the targets' rows never measured beside their peer. Based's backward (">= 2x FLA
where FLA's runs": parallel_based's backward was skipped by every earlier run's time budget) and Hedgehog (the
feature maps in torch, then the linear kernels with Dk = 2F; never timed), each against FLA 0.6.0 in the same run:

* Based d16 v64, B16 H16 N4096 bf16: tilecore's autograd forward + backward (linear_attention(feature_map="based"))
  against FLA parallel_based's (use_norm off, same scale); the backward as fwd+bwd minus fwd; the gradients
  checked against the float64 recurrence's (B1 H2 N 300, error over the bf16 rounding floor).
* Hedgehog d64, F 64 (Dk 128 features), B16 H16 N4096 bf16: tilecore's linear_attention(feature_map="hedgehog",
  feature_weights=W) forward and forward + backward against the same features made by torch
  (reference.hedgehog_features) into FLA chunk_linear_attn (normalize off); o and dq/dk/dv checked against float64.
  The copy bound of q, k, v, o beside it.

* Hedgehog's map (since run 7, which found it most of the forward): op.hedgehog_map (torch) against
  kernels_forward.hedgehog_map_fused (one pass, configs.HEDGEHOG_FUSED_MAP) for q and k, each checked against the
  float64 map, and the linear kernel alone on the features: the forward the fused map would give.

FLA compiles and autotunes in a process of its own from the start and times itself when told (a deadline).

    PYTHONPATH=/tmp/site:. python3 experiments/linear_attention/gpu_based_s32.py

Prints a table last; JSON to $OUT/based_s32.json. About 90 s on an H100.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tilecore import accuracy  # noqa: E402
from tilecore.ops.linear_attention import linear_attention, linear_attention_reference  # noqa: E402
from tilecore.ops.linear_attention.reference import hedgehog_features  # noqa: E402

START = time.time()
OUT = Path(os.environ.get("OUT", "/tmp/out"))
PEER_DEADLINE = 120.0
RESULTS: dict = {"check": [], "time": {}, "errors": []}
B, N, H = 16, 4096, 16


def elapsed() -> float:
    return time.time() - START


def save():
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "based_s32.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def attempt(name, fn):
    try:
        return fn()
    except Exception as err:  # noqa: BLE001
        msg = f"{name}: {type(err).__name__}: {err}"[:500]
        print("FAILED", msg, flush=True)
        traceback.print_exc(limit=3)
        RESULTS["errors"].append(msg)
        return None


def bench(fn, grad=()):
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=list(grad) or None, return_mode="median")


def inputs(case: str, b=B, n=N, h=H, seed=0, grad=False):
    torch.manual_seed(seed)
    bf = torch.bfloat16
    if case == "based":
        dk, dv = 16, 64
        t = dict(q=torch.randn(b, n, h, dk, device="cuda", dtype=bf),
                 k=torch.randn(b, n, h, dk, device="cuda", dtype=bf),
                 v=torch.randn(b, n, h, dv, device="cuda", dtype=bf), scale=dk ** -0.5)
    else:
        dk, dv, f = 64, 64, 64
        t = dict(q=torch.randn(b, n, h, dk, device="cuda", dtype=bf),
                 k=torch.randn(b, n, h, dk, device="cuda", dtype=bf),
                 v=torch.randn(b, n, h, dv, device="cuda", dtype=bf),
                 W=torch.randn(h, dk, f // 2, device="cuda") * dk ** -0.5, scale=1.0)
    if grad:
        for x in ("q", "k", "v"):
            t[x].requires_grad_(True)
    t["do"] = torch.randn_like(t["v"])
    return t


def ours(case: str, t: dict):
    if case == "based":
        return lambda: linear_attention(t["q"], t["k"], t["v"], feature_map="based", scale=t["scale"])
    return lambda: linear_attention(t["q"], t["k"], t["v"], feature_map="hedgehog", feature_weights=t["W"])


def fla(case: str, t: dict):
    if case == "based":
        from fla.ops.based import parallel_based

        return lambda: parallel_based(t["q"], t["k"], t["v"], scale=t["scale"], use_norm=False)
    from fla.ops.linear_attn import chunk_linear_attn

    def run():
        qf = hedgehog_features(t["q"], t["W"])  # (the features as tilecore's torch side makes them)
        kf = hedgehog_features(t["k"], t["W"])
        return chunk_linear_attn(qf, kf, t["v"], scale=1.0, normalize=False)
    return run


def first(out):
    return out[0] if isinstance(out, tuple) else out


def fwd_bwd(fn, t):
    def run():
        first(fn()).backward(t["do"])
    return run


def check(case: str):
    """o and dq, dk, dv of tilecore's autograd op against the float64 recurrence's (autograd through it)."""
    n = 300 if case == "based" else 200
    t = inputs(case, 1, n, 2, seed=3, grad=True)
    o = ours(case, t)()
    o.backward(t["do"])
    d = {x: t[x].double().detach().requires_grad_(True) for x in ("q", "k", "v")}
    kw = dict(feature_map="based") if case == "based" else dict(feature_map="hedgehog",
                                                                feature_weights=t["W"].double())
    ref, _ = linear_attention_reference(d["q"], d["k"], d["v"], scale=t["scale"] if case == "based" else None, **kw)
    ref.backward(t["do"].double())
    ref = ref.detach()
    row = dict(case=f"{case} autograd B1 H2 N {n}", out_floor=round(accuracy.error_over_floor(o.detach(), ref), 3))
    for x in ("q", "k", "v"):
        row[f"d{x}_floor"] = round(accuracy.error_over_floor(t[x].grad, d[x].grad), 3)
    row["finite"] = bool(all(torch.isfinite(t[x].grad).all() for x in ("q", "k", "v")))
    print("check", row, flush=True)
    RESULTS["check"].append(row)


def time_case(case: str, which: str):
    """(fwd ms, fwd+bwd ms) of tilecore's ('ours') or FLA's op."""
    t = inputs(case, grad=True)
    fn = ours(case, t) if which == "ours" else fla(case, t)
    grads = [t["q"], t["k"], t["v"]]
    first(fn()).backward(t["do"])  # compiles both
    torch.cuda.synchronize()
    with torch.no_grad():
        f = bench(fn)
    fb = bench(fwd_bwd(fn, t), grads)
    return dict(fwd_ms=f, fwd_bwd_ms=fb, bwd_ms=fb - f)


def _peer(go: str):
    res = {}
    t0 = time.time()
    for case in ("based", "hedgehog"):  # compile and autotune, forward and backward
        try:
            t = inputs(case, grad=True)
            first(fla(case, t)()).backward(t["do"])
            torch.cuda.synchronize()
            res[f"{case}_ready_s"] = round(time.time() - t0, 1)
        except Exception as err:  # noqa: BLE001
            res[f"{case}_error"] = f"{type(err).__name__}: {err}"[:300]
    while not os.path.exists(go) and time.time() - t0 < 200:
        time.sleep(0.02)
    for case in ("based", "hedgehog"):
        if f"{case}_ready_s" in res:
            try:
                res[case] = time_case(case, "fla")
            except Exception as err:  # noqa: BLE001
                res[f"{case}_error"] = f"{type(err).__name__}: {err}"[:300]
    return res


def hedgehog_map_phase():
    """op.hedgehog_map against hedgehog_map_fused (q and k, B16 N4096 H16 d64 F 2 x 32) and the linear kernel on the
    features alone."""
    from tilecore.ops.linear_attention.kernels_forward import hedgehog_map_fused
    from tilecore.ops.linear_attention.op import hedgehog_map

    t = inputs("hedgehog")
    row = {}
    with torch.no_grad():
        ref = torch.cat([torch.einsum("...hd,hdf->...hf", t["q"][:1, :512].double(), t["W"].double()).softmax(-1),
                         torch.einsum("...hd,hdf->...hf", -t["q"][:1, :512].double(), t["W"].double()).softmax(-1)],
                        -1)
        fused = hedgehog_map_fused(t["q"][:1, :512], t["W"])
        row["fused_map_floor"] = round(accuracy.error_over_floor(fused, ref), 3)
        row["torch_map_floor"] = round(accuracy.error_over_floor(hedgehog_map(t["q"][:1, :512], t["W"]), ref), 3)
        row["torch_map_ms"] = bench(lambda: (hedgehog_map(t["q"], t["W"]), hedgehog_map(t["k"], t["W"])))
        row["fused_map_ms"] = bench(lambda: (hedgehog_map_fused(t["q"], t["W"]), hedgehog_map_fused(t["k"], t["W"])))
        qf, kf = hedgehog_map_fused(t["q"], t["W"]), hedgehog_map_fused(t["k"], t["W"])
        row["kernel_on_features_ms"] = bench(lambda: linear_attention(qf, kf, t["v"], scale=1.0))
    row["fwd_with_fused_map_ms"] = row["fused_map_ms"] + row["kernel_on_features_ms"]
    print("hedgehog map", row, flush=True)
    RESULTS["hedgehog_map"] = row


def copy_ms(nbytes: int) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return bench(lambda: dst.copy_(src))


def main():
    import concurrent.futures as cf
    import multiprocessing as mp

    try:
        from experiments.common.meta import meta
        RESULTS["meta"] = meta()
    except Exception as err:  # noqa: BLE001
        RESULTS["meta"] = {"error": str(err)}
    print(RESULTS["meta"], flush=True)
    go = str(OUT / ".based_peer_go")
    OUT.mkdir(parents=True, exist_ok=True)
    Path(go).unlink(missing_ok=True)
    pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"))
    peer = pool.submit(_peer, go)
    for case in ("based", "hedgehog"):
        attempt(f"check {case}", lambda: check(case))
        RESULTS["time"][case] = attempt(f"time {case}", lambda: time_case(case, "ours")) or {}
        t = inputs(case)
        nbytes = sum(t[x].numel() * t[x].element_size() for x in ("q", "k", "v")) + t["v"].numel() * 2
        RESULTS["time"][case]["copy_ms"] = attempt("copy", lambda: copy_ms(nbytes))
        print("ours", case, RESULTS["time"][case], flush=True)
        del t
        torch.cuda.empty_cache()
    attempt("hedgehog map", hedgehog_map_phase)
    save()
    Path(go).touch()  # FLA times itself now, alone on the GPU
    try:
        RESULTS["fla"] = peer.result(timeout=max(1.0, START + PEER_DEADLINE - time.time()))
    except Exception as err:  # noqa: BLE001
        RESULTS["fla"] = dict(error=f"{type(err).__name__}: {err}"[:300] or "not ready by the deadline")
    for proc in list(getattr(pool, "_processes", {}).values()):
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    save()
    lines = ["case (B16 H16 N4096 bf16) | ours fwd / fwd+bwd / bwd ms | FLA fwd / fwd+bwd / bwd ms | bwd x FLA | "
             "fwd x FLA | fwd % of copy"]
    for case, peer_name in (("based", "parallel_based"), ("hedgehog", "torch features + chunk_linear_attn")):
        o, p = RESULTS["time"].get(case, {}), RESULTS["fla"].get(case, {})
        keys = ("fwd_ms", "fwd_bwd_ms", "bwd_ms")
        fmt = lambda r: " / ".join(f"{r[k]:.3f}" if r.get(k) else "-" for k in keys)  # noqa: E731
        ratio = lambda k: f"{p[k] / o[k]:.2f}x" if o.get(k) and p.get(k) else "-"  # noqa: E731
        pct = f"{100 * o['copy_ms'] / o['fwd_ms']:.0f}%" if o.get("copy_ms") and o.get("fwd_ms") else "-"
        lines.append(f"{case} ({peer_name}) | {fmt(o)} | {fmt(p)} | {ratio('bwd_ms')} | {ratio('fwd_ms')} | {pct}")
        if RESULTS["fla"].get(f"{case}_error"):
            lines.append(f"  FLA {case}: {RESULTS['fla'][f'{case}_error'][:150]}")
    for r in RESULTS["check"]:
        lines.append(" | ".join(f"{k} {v}" for k, v in r.items()))
    if RESULTS.get("hedgehog_map"):
        lines.append("hedgehog map | " + " | ".join(f"{k} {v:.4g}" for k, v in RESULTS["hedgehog_map"].items()))
    lines += [f"ERROR {e}" for e in RESULTS["errors"][:10]]
    if RESULTS["fla"].get("error"):
        lines.append(f"FLA: {RESULTS['fla']['error']}")
    print("\n".join(lines))
    print(f"\n{elapsed():.0f} s; JSON: {OUT / 'based_s32.json'}")


if __name__ == "__main__":
    main()
