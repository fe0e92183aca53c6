"""Session 33 (issue 33, helper HB): one call for the rows session 32 left untimed.

* Mamba-2 (2.7B: B16 H80 N4096 P64 S128, one group, bf16, the kernel alone): the shipped kernel (LEAN on) against the
  kernel before LEAN and BETA_LOG (with LEAN; alone and with UPDATE_LATE), each checked against the float64
  recurrence in a process of its own (gpu_mamba_s32's checks), then timed in 7 interleaved rounds only after FLA's
  compiles are done (session 32's run 2 timed beside FLA's autotune: +-5% rounds); the napkin's bound (%) and FLA
  chunk_simple_gla (same run, timed alone) beside.
* Decode steps (issue 33: >= 90% of the copy over the state read and written): gpu_mamba_s32's step phase, the step
  kernel alone by CUDA graphs at its blocks against a graph-timed copy of the state, and the public ops; each variant's
  o and state against the float64 step.
* Hedgehog (d64, F 2 x 32, B16 H16 N4096 bf16): op.hedgehog_map's torch map against the one-pass map
  (hedgehog_map(fused=True): kernels_forward.hedgehog_map_fused; configs.HEDGEHOG_FUSED_MAP is off), the forward
  with each (the public op = torch's map; the fused map + the kernel on its features = the op with the switch on),
  the kernel alone on features (fwd, fwd+bwd), the op's fwd+bwd (autograd: torch's map), and FLA chunk_linear_attn on
  bf16 torch features (gpu_based_s32's peer). Checks: the fused map and the switch-on forward against float64.
* Where Based's and Hedgehog's backward spend their time: torch.profiler's CUDA kernel times of one fwd+bwd each.

    PYTHONPATH=/tmp/site:. python3 experiments/linear_attention/gpu_forward_s33.py

Prints a table last (<= 40 lines); JSON to $OUT/forward_s33.json. About 100 s on an H100.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_based_s32 as gb  # noqa: E402
import gpu_forward as gfw  # noqa: E402
import gpu_mamba_s32 as gm  # noqa: E402

from tilecore import accuracy  # noqa: E402
from tilecore.ops.linear_attention import linear_attention, linear_attention_reference  # noqa: E402

START = time.time()
OUT = Path(os.environ.get("OUT", "/tmp/out"))
SCRATCH = Path("/tmp/hb_s33_scratch")
gm.OUT = SCRATCH  # (gpu_mamba_s32's own JSON goes to scratch: this call writes one JSON)
READY_DEADLINE = 85.0
PEER_DEADLINE = 140.0
RESULTS: dict = {"check": [], "hedgehog": {}, "profile": {}, "errors": [], "peer": {}}
MAMBA = ["shipped", "no lean"]  # (session 33 also timed LEAN + BETA_LOG, + UPDATE_LATE: removed, decision 124)


def elapsed() -> float:
    return time.time() - START


def save():
    OUT.mkdir(parents=True, exist_ok=True)
    RESULTS["mamba"] = gm.RESULTS
    (OUT / "forward_s33.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def attempt(name, fn):
    try:
        return fn()
    except Exception as err:  # noqa: BLE001
        msg = f"{name}: {type(err).__name__}: {err}"[:500]
        print("FAILED", msg, flush=True)
        traceback.print_exc(limit=3)
        RESULTS["errors"].append(msg)
        return None


bench = gb.bench


# --------------------------------------------------------------------------------------------
# FLA peers, one process each (compiles and autotunes from the start; a ready file; times itself once told)


def _peer(kind: str, go: str):
    t0 = time.time()
    res: dict = {}
    fns = {}
    try:
        if kind == "mamba":
            t = gfw.make(gm.CASE, *gfw.shape())
            fns["fla_chunk_simple_gla"] = (gfw.fla_call("chunk_simple_gla", gm.CASE, t), None)
        else:
            t = gb.inputs("hedgehog", grad=True)
            fn = gb.fla("hedgehog", t)
            fns["fla_hedgehog_fwd"] = (fn, None)
            fns["fla_hedgehog_fwd_bwd"] = (gb.fwd_bwd(fn, t), [t["q"], t["k"], t["v"]])
        for name, (fn, _) in fns.items():
            fn()
        torch.cuda.synchronize()
        res["ready_s"] = round(time.time() - t0, 1)
    except Exception as err:  # noqa: BLE001
        res["error"] = f"{type(err).__name__}: {err}"[:300]
    Path(go + ".ready").touch()
    while not os.path.exists(go) and time.time() - t0 < 200:
        time.sleep(0.02)
    if "ready_s" in res:
        for name, (fn, grads) in fns.items():
            try:
                if grads is None:
                    with torch.no_grad():
                        res[f"{name}_ms"] = bench(fn)
                else:
                    res[f"{name}_ms"] = bench(fn, grads)
            except Exception as err:  # noqa: BLE001
                res[f"{name}_error"] = f"{type(err).__name__}: {err}"[:200]
    return res


def start_peers():
    import concurrent.futures as cf
    import multiprocessing as mp

    SCRATCH.mkdir(parents=True, exist_ok=True)
    out = {}
    for kind in ("mamba", "hedgehog"):
        go = str(SCRATCH / f".peer_go_{kind}")
        Path(go).unlink(missing_ok=True)
        Path(go + ".ready").unlink(missing_ok=True)
        pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"))
        out[kind] = (pool, pool.submit(_peer, kind, go), go)
    return out


def wait_ready(peers):
    t0 = time.time()
    while elapsed() < READY_DEADLINE and not all(os.path.exists(go + ".ready") or fut.done()
                                                 for _, fut, go in peers.values()):
        time.sleep(0.05)
    RESULTS["waited_for_peers_s"] = round(time.time() - t0, 1)
    RESULTS["peers_ready"] = {k: os.path.exists(go + ".ready") for k, (_, _, go) in peers.items()}


def finish_peers(peers):
    import concurrent.futures as cf

    for kind, (pool, fut, go) in peers.items():  # one at a time: each times alone on the GPU
        Path(go).touch()
        try:
            RESULTS["peer"][kind] = fut.result(timeout=max(1.0, START + PEER_DEADLINE - time.time()))
        except cf.TimeoutError:
            RESULTS["peer"][kind] = dict(error=f"not done by {PEER_DEADLINE:.0f} s")
        except Exception as err:  # noqa: BLE001
            RESULTS["peer"][kind] = dict(error=f"{type(err).__name__}: {err}"[:300])
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)
    print("peers", RESULTS["peer"], flush=True)


# --------------------------------------------------------------------------------------------
# Hedgehog


def hedgehog_checks():
    """The fused map and the switch-on forward (fused map + the kernel on its features) against float64, bf16, B1 H2
    N 200 and 1000; the autograd op's gradients (torch's map) as gpu_based_s32's check."""
    from tilecore.ops.linear_attention.op import hedgehog_map

    for n in (200, 1000):
        t = gb.inputs("hedgehog", 1, n, 2, seed=3 + n)
        with torch.no_grad():
            qf = hedgehog_map(t["q"], t["W"], fused=True)
            kf = hedgehog_map(t["k"], t["W"], fused=True)
            o = linear_attention(qf, kf, t["v"], scale=1.0)
            off = linear_attention(t["q"], t["k"], t["v"], feature_map="hedgehog", feature_weights=t["W"])
        ref_map = torch.cat([torch.einsum("bnhd,hdf->bnhf", t["q"].double(), t["W"].double()).softmax(-1),
                             torch.einsum("bnhd,hdf->bnhf", -t["q"].double(), t["W"].double()).softmax(-1)], -1)
        ref, _ = linear_attention_reference(t["q"].double(), t["k"].double(), t["v"].double(), feature_map="hedgehog",
                                            feature_weights=t["W"].double())
        row = dict(case=f"hedgehog fused-map fwd B1 H2 N {n}", finite=bool(torch.isfinite(o).all()),
                   map_floor=round(accuracy.error_over_floor(qf, ref_map), 3),
                   torch_map_floor=round(accuracy.error_over_floor(hedgehog_map(t["q"], t["W"], fused=False),
                                                                   ref_map), 3),
                   out_floor=round(accuracy.error_over_floor(o, ref), 3),
                   op_off_floor=round(accuracy.error_over_floor(off, ref), 3))
        print("check", row, flush=True)
        RESULTS["check"].append(row)
    gb.check("hedgehog")
    RESULTS["check"] += [r for r in gb.RESULTS["check"] if r not in RESULTS["check"]]


def hedgehog_calls():
    from tilecore.ops.linear_attention.op import hedgehog_map
    from tilecore.ops.linear_attention.reference import hedgehog_features

    t = gb.inputs("hedgehog", grad=True)
    q, k, v, W = t["q"], t["k"], t["v"], t["W"]
    with torch.no_grad():
        qf0, kf0 = hedgehog_map(q, W, fused=True), hedgehog_map(k, W, fused=True)
    qf, kf = qf0.clone().requires_grad_(True), kf0.clone().requires_grad_(True)
    vg = v.detach().clone().requires_grad_(True)

    def bf16_map_kernel():  # (FLA's peer's features: bf16 einsum and softmax, then our kernel)
        return linear_attention(hedgehog_features(q, W), hedgehog_features(k, W), v, scale=1.0)

    fwd = {  # name -> (fn, no_grad)
        "torch_map_qk": lambda: (hedgehog_map(q, W, fused=False), hedgehog_map(k, W, fused=False)),
        "fused_map_qk": lambda: (hedgehog_map(q, W, fused=True), hedgehog_map(k, W, fused=True)),
        "kernel_on_features_fwd": lambda: linear_attention(qf0, kf0, v, scale=1.0),
        "op_fwd_torch_map": lambda: linear_attention(q, k, v, feature_map="hedgehog", feature_weights=W),
        "fwd_fused_map": lambda: linear_attention(hedgehog_map(q, W, fused=True), hedgehog_map(k, W, fused=True), v,
                                                  scale=1.0),
    }
    fb = {  # name -> (fn, grads)
        "op_fwd_bwd_torch_map": (gb.fwd_bwd(gb.ours("hedgehog", t), t), [q, k, v]),
        "kernel_on_features_fwd_bwd": (gb.fwd_bwd(lambda: linear_attention(qf, kf, vg, scale=1.0), t), [qf, kf, vg]),
        "bf16_map_kernel_fwd_bwd": (gb.fwd_bwd(bf16_map_kernel, t), [q, k, v]),
    }
    return fwd, fb


def hedgehog_warm(calls):
    fwd, fb = calls
    with torch.no_grad():
        for fn in fwd.values():
            fn()
    for fn, grads in fb.values():
        fn()
        for g in grads:
            g.grad = None
    torch.cuda.synchronize()


def hedgehog_time(calls):
    fwd, fb = calls
    H = RESULTS["hedgehog"]
    with torch.no_grad():
        for name, fn in fwd.items():
            H[f"{name}_ms"] = attempt(name, lambda: bench(fn))
    for name, (fn, grads) in fb.items():
        H[f"{name}_ms"] = attempt(name, lambda: bench(fn, grads))
    t = gb.inputs("hedgehog")
    H["qkvo_copy_ms"] = attempt("copy", lambda: gb.copy_ms(sum(t[x].numel() * 2 for x in ("q", "k", "v", "v"))))
    print("hedgehog", H, flush=True)


# --------------------------------------------------------------------------------------------
# where the backward's time goes (torch.profiler, CUDA kernels)


def profile_case(case: str):
    from experiments.common.gpu_script import profiled

    t = gb.inputs(case, grad=True)
    fn = gb.fwd_bwd(gb.ours(case, t), t)

    def call():  # (the gradients set to None first: no accumulation kernels in the profile)
        for x in ("q", "k", "v"):
            t[x].grad = None
        fn()
    prof = profiled(call, 3)
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us > 0:
            rows.append((e.key[:60], round(us / 3 / 1e3, 4), e.count // 3))
    rows.sort(key=lambda r: -r[1])
    RESULTS["profile"][case] = rows[:12]
    print("profile", case, rows[:12], flush=True)


# --------------------------------------------------------------------------------------------


def table() -> str:
    T = gm.RESULTS["time"]
    runs = T.get("runs", {})
    med = {n: sorted(r)[len(r) // 2] for n, r in runs.items() if r}
    nap, copy = T.get("napkin_ms"), T.get("copy_ms")
    pm, ph = RESULTS["peer"].get("mamba", {}), RESULTS["peer"].get("hedgehog", {})
    fla = pm.get("fla_chunk_simple_gla_ms")
    base = med.get("shipped")
    L = [f"Mamba-2 2.7B bf16 kernel alone: napkin {nap and round(nap, 4)} ms (75%: {nap and round(nap / .75, 4)}), "
         f"copy {copy and round(copy, 4)}, FLA chunk_simple_gla {fla and round(fla, 4)} {pm.get('error', '')}",
         "variant | median ms (rounds) | % napkin | x shipped | x FLA"]
    for n in MAMBA:
        if n not in med:
            L.append(f"{n} | - (failed a check or not warm)")
            continue
        ms = med[n]
        L.append(f"{n} | {ms:.4f} ({', '.join(f'{x:.3f}' for x in runs[n])}) | {100 * nap / ms if nap else 0:.1f}% | "
                 f"{base / ms if base else 0:.3f} | {fla / ms if fla else 0:.2f}x")
    L.append(f"shipped last {T.get('shipped_last_ms')}; public op {T.get('op_ms')}; waited "
             f"{RESULTS.get('waited_for_peers_s')} s, ready {RESULTS.get('peers_ready')}")
    ranges: dict = {}
    for r in gm.RESULTS["check"]:
        ranges.setdefault(r["case"], []).append((r["out_floor"], r["all_written"]))
    for case, v in ranges.items():
        L.append(f"check {case}: out/floor {min(x for x, _ in v)}-{max(x for x, _ in v)} over {len(v)}, "
                 f"written {all(w for _, w in v)}")
    for case, r in gm.RESULTS.get("step", {}).items():
        c = r.get("copy_ms")
        cells = [f"{n} {r[n + '_ms']:.4f} ({100 * c / r[n + '_ms']:.0f}%)" for n in list(gm.STEP_VARIANTS) + ["op_graph"]
                 if r.get(n + "_ms") and c]
        L.append(f"step {case}: copy {c and round(c, 4)} ms | " + ", ".join(cells)
                 + f" | eager op {r.get('op_eager_ms') and round(r['op_eager_ms'], 4)}")
    sc = gm.RESULTS.get("step_check", [])
    if sc:
        L.append(f"step checks: out/floor {min(r['out_floor'] for r in sc)}-{max(r['out_floor'] for r in sc)}, "
                 f"state rel <= {max(r['state_rel'] for r in sc):.1e}, written {all(r['all_written'] for r in sc)}")
    H = RESULTS["hedgehog"]
    f = lambda k: f"{H[k]:.3f}" if H.get(k) else "-"  # noqa: E731
    L.append(f"Hedgehog d64 F64 B16 H16 N4096 bf16 (ms): map q+k torch {f('torch_map_qk_ms')} / fused "
             f"{f('fused_map_qk_ms')}; fwd op (torch map) {f('op_fwd_torch_map_ms')}, fused map + kernel "
             f"{f('fwd_fused_map_ms')}, kernel alone {f('kernel_on_features_fwd_ms')}; copy q,k,v,o {f('qkvo_copy_ms')}")
    L.append(f"  fwd+bwd: op (torch map) {f('op_fwd_bwd_torch_map_ms')}, kernel on features {f('kernel_on_features_fwd_bwd_ms')}"
             f", bf16 torch map + kernel {f('bf16_map_kernel_fwd_bwd_ms')}; FLA fwd {ph.get('fla_hedgehog_fwd_ms')} "
             f"fwd+bwd {ph.get('fla_hedgehog_fwd_bwd_ms')} {ph.get('error', '')}")
    if H.get("fwd_fused_map_ms") and ph.get("fla_hedgehog_fwd_ms"):
        L.append(f"  fwd x FLA: torch map {ph['fla_hedgehog_fwd_ms'] / H['op_fwd_torch_map_ms']:.2f}x, fused "
                 f"{ph['fla_hedgehog_fwd_ms'] / H['fwd_fused_map_ms']:.2f}x")
    for r in RESULTS["check"]:
        L.append("check " + " | ".join(f"{k} {v}" for k, v in r.items()))
    for case, rows in RESULTS["profile"].items():
        L.append(f"profile {case} fwd+bwd (ms a call, count): " + "; ".join(f"{n} {ms} x{c}" for n, ms, c in rows[:5]))
    L += [f"ERROR {e[:200]}" for e in (RESULTS["errors"] + gm.RESULTS["errors"])[:6]]
    return "\n".join(L)


def main():
    try:
        from experiments.common.meta import meta
        RESULTS["meta"] = meta()
    except Exception as err:  # noqa: BLE001
        RESULTS["meta"] = {"error": str(err)}
    print(RESULTS["meta"], flush=True)
    peers = start_peers()
    try:
        ok = attempt("warm", lambda: gm.warm(MAMBA + [f"step {c}" for c in gm.STEP_CASES])) or set()
        attempt("hedgehog checks", hedgehog_checks)
        calls = attempt("hedgehog calls", hedgehog_calls)
        if calls:
            attempt("hedgehog warm", lambda: hedgehog_warm(calls))
        tb = gb.inputs("based", grad=True)  # (Hedgehog's fwd+bwd compiled above; profiled after the peers' compiles)
        attempt("warm based", lambda: gb.fwd_bwd(gb.ours("based", tb), tb)())
        tb = None
        print(f"warm done {elapsed():.0f} s", flush=True)
        wait_ready(peers)
        attempt("mamba time", lambda: gm.time_phase(ok, MAMBA, rounds=7))
        save()
        attempt("step", lambda: gm.step_phase(ok))
        if calls:
            attempt("hedgehog time", lambda: hedgehog_time(calls))
        calls = None  # (its tensors freed before the profiles)
        torch.cuda.empty_cache()
        for case in ("based", "hedgehog"):
            attempt(f"profile {case}", lambda: profile_case(case))
        save()
    finally:
        finish_peers(peers)
    save()
    print(table())
    print(f"\n{elapsed():.0f} s; JSON: {OUT / 'forward_s33.json'}")


if __name__ == "__main__":
    main()
