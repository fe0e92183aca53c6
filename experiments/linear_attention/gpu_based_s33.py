"""Session 33 (issue 33, helper HB), call 2: Hedgehog's map backward and the map's dot on tensor cores, Based's backward
blocks, and Mamba-2 timed on a quiet GPU.

* Hedgehog (d64, F 2 x 32, B16 H16 N4096 bf16): the one-pass map (on since run 2) by its "ieee" dot against "tf32x3"
  (kernels_forward.hedgehog_map_fused(precision=...)); the map's backward alone (hedgehog_map_backward, both dots and
  rows / warps); fwd+bwd of the public op with torch's map under autograd (HEDGEHOG_FUSED_MAP_GRAD off) against the
  fused map under autograd (hedgehog_map(fused=True): op._HedgehogMap, the configs' dot) and the same with tf32x3 (a
  script-side autograd.Function on the public kernels), FLA chunk_linear_attn on torch features beside (same run).
  Checks against float64: the tf32x3 map, and o, dq, dk, dv, dW through each autograd path (B1 H2 N 200 and 1000).
* Based (d16 v64, B16 H16 N4096 bf16): launch.backward at plan overrides of the backward's blocks (BT_BWD,
  BVB, num_warps, num_stages; configs.BASED_BWD_*: chunk 16, 32 value columns, 4 warps, 2 stages shipped), each
  checked against the float64 recurrence's gradients (B1 H2 N 300, fresh inputs) in a process of its own, timed in
  interleaved rounds; the public op's fwd+bwd and FLA parallel_based's (same run).
* Mamba-2 2.7B (kernel alone): shipped (LEAN) against LEAN + BETA_LOG and LEAN + UPDATE_LATE, checked as
  gpu_mamba_s32's, timed only after every FLA compile is done (run 2's rounds moved +-8% beside FLA's autotune).

    PYTHONPATH=/tmp/site:. python3 experiments/linear_attention/gpu_based_s33.py [--confirm]

``--no-mamba``: Hedgehog and Based only (about 40 s less). ``--confirm`` (the session's last batch): the shipped paths only (the public Hedgehog op's fwd and fwd+bwd as configs
say, Based's shipped blocks and the public op, Mamba-2's shipped kernel and op), with the same checks and FLA beside.

Prints a table last (<= 40 lines); JSON to $OUT/based_s33.json. About 110 s on an H100.
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
import gpu_mamba_s32 as gm  # noqa: E402

from tilecore import accuracy  # noqa: E402
from tilecore.ops.linear_attention import kernels_forward, launch, linear_attention  # noqa: E402
from tilecore.ops.linear_attention import linear_attention_reference  # noqa: E402
from tilecore.ops.linear_attention.op import hedgehog_map  # noqa: E402
from tilecore.ops.linear_attention.plan import BASED, tl_plan  # noqa: E402

START = time.time()
OUT = Path(os.environ.get("OUT", "/tmp/out"))
SCRATCH = Path("/tmp/hb_s33b_scratch")
gm.OUT = SCRATCH  # (gpu_mamba_s32's own JSON goes to scratch: this call writes one JSON)
READY_DEADLINE = 90.0
PEER_DEADLINE = 140.0
WARM_DEADLINE = 80.0
RESULTS: dict = {"check": [], "hedgehog": {}, "based": {}, "based_check": [], "errors": [], "peer": {}}
CONFIRM = "--confirm" in sys.argv
MAMBA = [] if "--no-mamba" in sys.argv else ["shipped"]  # (LEAN + BETA_LOG, + UPDATE_LATE: removed, decision 124)
# name -> tl_plan overrides of Based's backward (shipped: configs.BASED_BWD_CHUNK 16, BASED_BWD_BV 32, 4 warps, 2
# stages). sm_90a (this ptxas): shipped dq 144 B / dkv 316 B spilled; BVB 16: dkv 68 B; 8 warps, BVB 64: dkv 72 B
BASED_VARIANTS = {
    "shipped": {},
    "bvb16": dict(BVB=16),
    "w8": dict(num_warps=8),
    "bvb64 w8": dict(BVB=64, num_warps=8),
    "st1": dict(num_stages=1),
    "st3": dict(num_stages=3),
    "bvb16 w8": dict(BVB=16, num_warps=8),
    # chunks of 32: half the reverse sweep's serial chunk-steps (3.29 ms / 256 steps: a latency chain a program)
    "bt32 bvb16 w8": dict(BT_BWD=32, BVB=16, num_warps=8),  # sm_90a: dq 12 B, dK/dV 156 B spilled
    "bt32 w8": dict(BT_BWD=32, num_warps=8),  # dq 12 B, dK/dV 608 B
}
if CONFIRM:
    BASED_VARIANTS = {"shipped": {}}


def elapsed() -> float:
    return time.time() - START


def save():
    OUT.mkdir(parents=True, exist_ok=True)
    RESULTS["mamba"] = gm.RESULTS
    (OUT / "based_s33.json").write_text(json.dumps(RESULTS, indent=1, default=str))


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
# FLA in a process of its own: Hedgehog's and Based's fwd / fwd+bwd (compiles first, a ready file, then times)


def _peer(go: str):
    t0 = time.time()
    res: dict = {}
    fns = {}
    for case in ("hedgehog", "based"):
        try:
            t = gb.inputs(case, grad=True)
            fn = gb.fla(case, t)
            fns[f"{case}_fwd"] = (fn, None)
            fns[f"{case}_fwd_bwd"] = (gb.fwd_bwd(fn, t), [t["q"], t["k"], t["v"]])
            gb.fwd_bwd(fn, t)()
            torch.cuda.synchronize()
            res[f"{case}_ready_s"] = round(time.time() - t0, 1)
        except Exception as err:  # noqa: BLE001
            res[f"{case}_error"] = f"{type(err).__name__}: {err}"[:300]
    Path(go + ".ready").touch()
    while not os.path.exists(go) and time.time() - t0 < 200:
        time.sleep(0.02)
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


def start_peer():
    import concurrent.futures as cf
    import multiprocessing as mp

    SCRATCH.mkdir(parents=True, exist_ok=True)
    go = str(SCRATCH / ".peer_go")
    Path(go).unlink(missing_ok=True)
    Path(go + ".ready").unlink(missing_ok=True)
    pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"))
    return pool, pool.submit(_peer, go), go


def wait_ready(peer):
    t0 = time.time()
    while elapsed() < READY_DEADLINE and not (os.path.exists(peer[2] + ".ready") or peer[1].done()):
        time.sleep(0.05)
    RESULTS["waited_for_peer_s"] = round(time.time() - t0, 1)
    RESULTS["peer_ready"] = os.path.exists(peer[2] + ".ready")


def finish_peer(peer):
    import concurrent.futures as cf

    pool, fut, go = peer
    Path(go).touch()
    try:
        RESULTS["peer"] = fut.result(timeout=max(1.0, START + PEER_DEADLINE - time.time()))
    except cf.TimeoutError:
        RESULTS["peer"] = dict(error=f"not done by {PEER_DEADLINE:.0f} s")
    except Exception as err:  # noqa: BLE001
        RESULTS["peer"] = dict(error=f"{type(err).__name__}: {err}"[:300])
    for proc in list(getattr(pool, "_processes", {}).values()):
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    print("peer", RESULTS["peer"], flush=True)


# --------------------------------------------------------------------------------------------
# Based's backward blocks: a process a variant (its float64 check and its compile at the timed shape)


def based_args(t: dict, name: str):
    p = tl_plan(t["q"], t["v"], None, BASED, **BASED_VARIANTS[name])
    return lambda do: launch.backward(p, do, t["q"], t["k"], t["v"], None, None, None, None, None, None, t["scale"],
                                      BASED, native=True)


def _based_warm(name: str):
    t0 = time.time()
    try:
        torch.manual_seed(11)
        B, N, H = 1, 300, 2
        t = gb.inputs("based", B, N, H, seed=21)
        do = torch.randn_like(t["v"])
        dq, dk, dv = based_args(t, name)(do)[:3]
        d = {x: t[x].double().requires_grad_(True) for x in ("q", "k", "v")}
        ref, _ = linear_attention_reference(d["q"], d["k"], d["v"], feature_map="based", scale=t["scale"])
        ref.backward(do.double())
        row = dict(variant=name, case="based bwd B1 H2 N 300",
                   finite=bool(all(torch.isfinite(g).all() for g in (dq, dk, dv))),
                   **{f"d{x}_floor": round(accuracy.error_over_floor(g, d[x].grad), 3)
                      for x, g in zip(("q", "k", "v"), (dq, dk, dv))})
        big = gb.inputs("based")
        based_args(big, name)(torch.randn_like(big["v"]))
        torch.cuda.synchronize()
        return name, None, time.time() - t0, row
    except Exception as err:  # noqa: BLE001
        return name, f"{type(err).__name__}: {err}"[:300], time.time() - t0, None


def based_warm_start():
    import concurrent.futures as cf
    import multiprocessing as mp

    pool = cf.ProcessPoolExecutor(max_workers=len(BASED_VARIANTS), mp_context=mp.get_context("spawn"),
                                  max_tasks_per_child=1)
    return pool, [pool.submit(_based_warm, n) for n in BASED_VARIANTS]


def based_warm_finish(handle) -> set:
    import concurrent.futures as cf

    pool, futs = handle
    ok = set()
    try:
        for fut in cf.as_completed(futs, timeout=max(1.0, WARM_DEADLINE - elapsed())):
            name, err, secs, row = fut.result()
            if row:
                RESULTS["based_check"].append(row)
            good = row is not None and row["finite"] and max(row["dq_floor"], row["dk_floor"], row["dv_floor"]) < 3
            print("based warm", name, err, round(secs, 1), row, flush=True)
            if good and not err:
                ok.add(name)
    except cf.TimeoutError:
        RESULTS["errors"].append(f"based warm: not every variant done by {WARM_DEADLINE:.0f} s")
    for proc in list(getattr(pool, "_processes", {}).values()):
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    return ok


def based_time(ok: set, rounds: int = 3):
    t = gb.inputs("based")
    do = torch.randn_like(t["v"])
    fns = {n: based_args(t, n) for n in BASED_VARIANTS if n in ok}
    runs: dict = {n: [] for n in fns}
    with torch.no_grad():
        for _ in range(rounds):
            for n, fn in fns.items():
                ms = attempt(f"based {n}", lambda: bench(lambda: fn(do)))
                if ms:
                    runs[n].append(ms)
    RESULTS["based"]["runs"] = runs
    RESULTS["based"]["op"] = attempt("based op", lambda: gb.time_case("based", "ours"))
    print("based", RESULTS["based"], flush=True)


# --------------------------------------------------------------------------------------------
# Hedgehog


class MapTF32x3(torch.autograd.Function):
    """The one-pass map and its backward with the tf32x3 dot (kernels_forward's public functions)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return kernels_forward.hedgehog_map_fused(x, w.float(), precision="tf32x3")

    @staticmethod
    def backward(ctx, dout):
        x, w = ctx.saved_tensors
        dx, dw = kernels_forward.hedgehog_map_backward(x, w.float(), dout, precision="tf32x3")
        return dx, dw.to(w.dtype)


def hh_forward(path: str, t: dict):
    """o of the Hedgehog layer through ``path``: "op" (the public op: torch's map under autograd, the fused map
    without), "fused" (hedgehog_map(fused=True): op._HedgehogMap under autograd), "tf32x3"."""
    q, k, v, W = t["q"], t["k"], t["v"], t["W"]
    if path == "op":
        return linear_attention(q, k, v, feature_map="hedgehog", feature_weights=W)
    if path == "fused":
        qf, kf = hedgehog_map(q, W, fused=True), hedgehog_map(k, W, fused=True)
    else:
        qf, kf = MapTF32x3.apply(q, W), MapTF32x3.apply(k, W)
    return linear_attention(qf, kf, v, scale=1.0)


def hedgehog_checks():
    for n in (200, 1000):
        t = gb.inputs("hedgehog", 1, n, 2, seed=5 + n)
        d = {x: t[x].double().requires_grad_(True) for x in ("q", "k", "v", "W")}
        ref, _ = linear_attention_reference(d["q"], d["k"], d["v"], feature_map="hedgehog", feature_weights=d["W"])
        do = torch.randn_like(t["v"])
        ref.backward(do.double())
        with torch.no_grad():
            ref_map = torch.cat([torch.einsum("bnhd,hdf->bnhf", t["q"].double(), t["W"].double()).softmax(-1),
                                 torch.einsum("bnhd,hdf->bnhf", -t["q"].double(), t["W"].double()).softmax(-1)], -1)
            row = dict(case=f"hedgehog map N {n}")
            for prec in ("ieee", "tf32x3"):
                row[f"{prec}_map_floor"] = round(accuracy.error_over_floor(
                    kernels_forward.hedgehog_map_fused(t["q"], t["W"], precision=prec), ref_map), 3)
        RESULTS["check"].append(row)
        for path in ("op",) if CONFIRM else ("op", "fused", "tf32x3"):
            ts = {x: t[x].detach().clone().requires_grad_(True) for x in ("q", "k", "v", "W")}
            o = hh_forward(path, ts)
            o.backward(do)
            row = dict(case=f"hedgehog autograd {path} B1 H2 N {n}",
                       out_floor=round(accuracy.error_over_floor(o.detach(), ref.detach()), 3),
                       **{f"d{x}_floor": round(accuracy.error_over_floor(ts[x].grad, d[x].grad), 3)
                          for x in ("q", "k", "v")},
                       dW_rel=float((ts["W"].grad.double() - d["W"].grad).norm() / d["W"].grad.norm()))
            row["finite"] = bool(all(torch.isfinite(ts[x].grad).all() for x in ts))
            print("check", row, flush=True)
            RESULTS["check"].append(row)


def hedgehog_calls():
    t = gb.inputs("hedgehog", grad=True)
    t["W"].requires_grad_(True)
    q, k, W = t["q"], t["k"], t["W"]
    dq = torch.randn(*q.shape[:-1], 2 * W.shape[-1], device="cuda", dtype=q.dtype)
    fwd = {
        "map_qk_ieee": lambda: (kernels_forward.hedgehog_map_fused(q, W, precision="ieee"),
                                kernels_forward.hedgehog_map_fused(k, W, precision="ieee")),
        "map_qk_tf32x3": lambda: (kernels_forward.hedgehog_map_fused(q, W, precision="tf32x3"),
                                  kernels_forward.hedgehog_map_fused(k, W, precision="tf32x3")),
        "map_qk_tf32x3_r128_w8": lambda: (
            kernels_forward.hedgehog_map_fused(q, W, precision="tf32x3", rows=128, warps=8),
            kernels_forward.hedgehog_map_fused(k, W, precision="tf32x3", rows=128, warps=8)),
        "map_bwd_q_ieee": lambda: kernels_forward.hedgehog_map_backward(q, W, dq),
        "map_bwd_q_tf32x3": lambda: kernels_forward.hedgehog_map_backward(q, W, dq, precision="tf32x3"),
        "map_bwd_q_ieee_r64_w8": lambda: kernels_forward.hedgehog_map_backward(q, W, dq, rows=64, warps=8),
        "map_bwd_q_tf32x3_r64_w4": lambda: kernels_forward.hedgehog_map_backward(q, W, dq, rows=64, warps=4,
                                                                                precision="tf32x3"),
        "fwd_op": lambda: hh_forward("op", t),
        "fwd_tf32x3": lambda: hh_forward("tf32x3", t),
    }
    grads = [t["q"], t["k"], t["v"], t["W"]]
    paths = ("op",) if CONFIRM else ("op", "fused", "tf32x3")
    fb = {f"fwd_bwd_{p}": (gb.fwd_bwd(lambda p=p: hh_forward(p, t), t), grads) for p in paths}
    if CONFIRM:
        fwd = {"fwd_op": fwd["fwd_op"], "map_qk_ieee": fwd["map_qk_ieee"]}
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
    print("hedgehog", H, flush=True)


# --------------------------------------------------------------------------------------------


def table() -> str:
    P = RESULTS["peer"]
    H = RESULTS["hedgehog"]
    f = lambda k: f"{H[k]:.3f}" if H.get(k) else "-"  # noqa: E731
    L = [f"Hedgehog d64 F64 B16 H16 N4096 bf16 (ms): map q+k ieee {f('map_qk_ieee_ms')}, tf32x3 "
         f"{f('map_qk_tf32x3_ms')}, tf32x3 r128 w8 {f('map_qk_tf32x3_r128_w8_ms')}; map bwd (q) ieee "
         f"{f('map_bwd_q_ieee_ms')}, tf32x3 {f('map_bwd_q_tf32x3_ms')}, ieee r64 w8 {f('map_bwd_q_ieee_r64_w8_ms')}, "
         f"tf32x3 r64 w4 {f('map_bwd_q_tf32x3_r64_w4_ms')}",
         f"  fwd: op {f('fwd_op_ms')}, tf32x3 {f('fwd_tf32x3_ms')}; fwd+bwd: op (torch map) {f('fwd_bwd_op_ms')}, fused "
         f"{f('fwd_bwd_fused_ms')}, tf32x3 {f('fwd_bwd_tf32x3_ms')}; FLA fwd {P.get('hedgehog_fwd_ms')} fwd+bwd "
         f"{P.get('hedgehog_fwd_bwd_ms')}"]
    fl_f, fl_fb = P.get("hedgehog_fwd_ms"), P.get("hedgehog_fwd_bwd_ms")
    if fl_f and fl_fb:
        for p in ("op", "fused", "tf32x3"):
            fw = H.get("fwd_op_ms") if p != "tf32x3" else H.get("fwd_tf32x3_ms")
            fb = H.get(f"fwd_bwd_{p}_ms")
            if fw and fb:
                L.append(f"  {p}: fwd x FLA {fl_f / fw:.2f}, fwd+bwd x FLA {fl_fb / fb:.2f}, bwd {fb - fw:.3f} ms "
                         f"x FLA {(fl_fb - fl_f) / (fb - fw):.2f}")
    for r in RESULTS["check"]:
        L.append("check " + " | ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()))
    B = RESULTS["based"]
    runs = B.get("runs", {})
    med = {n: sorted(r)[len(r) // 2] for n, r in runs.items() if r}
    base = med.get("shipped")
    fla_b = (P["based_fwd_bwd_ms"] - P["based_fwd_ms"]) if P.get("based_fwd_bwd_ms") and P.get("based_fwd_ms") else None
    L.append(f"Based d16 v64 B16 H16 N4096 bf16 launch.backward (ms, rounds): FLA parallel_based bwd "
             f"{fla_b and round(fla_b, 3)}; op {B.get('op')}")
    for n in BASED_VARIANTS:
        chk = next((r for r in RESULTS["based_check"] if r["variant"] == n), {})
        cs = f"dq/dk/dv floor {chk.get('dq_floor')}/{chk.get('dk_floor')}/{chk.get('dv_floor')}"
        if n not in med:
            L.append(f"  {n}: - ({cs})")
            continue
        L.append(f"  {n}: {med[n]:.3f} ({', '.join(f'{x:.3f}' for x in runs[n])}) x shipped "
                 f"{base / med[n] if base else 0:.3f}, x FLA {fla_b / med[n] if fla_b else 0:.2f} | {cs}")
    T = gm.RESULTS["time"]
    runs = T.get("runs", {})
    med = {n: sorted(r)[len(r) // 2] for n, r in runs.items() if r}
    nap = T.get("napkin_ms")
    L.append(f"Mamba-2 2.7B kernel alone (napkin {nap and round(nap, 4)} ms; 75%: {nap and round(nap / .75, 4)})")
    for n in MAMBA:
        if n in med:
            L.append(f"  {n}: {med[n]:.4f} ({', '.join(f'{x:.3f}' for x in runs[n])}) = "
                     f"{100 * nap / med[n] if nap else 0:.1f}% napkin, min {min(runs[n]):.4f}")
    L.append(f"  shipped last {T.get('shipped_last_ms')}; op {T.get('op_ms')}; waited {RESULTS.get('waited_for_peer_s')}"
             f" s (ready {RESULTS.get('peer_ready')})")
    ranges: dict = {}
    for r in gm.RESULTS["check"]:
        ranges.setdefault(r["case"], []).append(r["out_floor"])
    L.append("  checks: " + "; ".join(f"{c} {min(v)}-{max(v)}" for c, v in ranges.items()))
    L += [f"ERROR {e[:200]}" for e in (RESULTS["errors"] + gm.RESULTS["errors"])[:6]]
    return "\n".join(L)


def main():
    try:
        from experiments.common.meta import meta
        RESULTS["meta"] = meta()
    except Exception as err:  # noqa: BLE001
        RESULTS["meta"] = {"error": str(err)}
    print(RESULTS["meta"], flush=True)
    peer = start_peer()
    based = based_warm_start()
    try:
        ok = (attempt("mamba warm", lambda: gm.warm(MAMBA)) or set()) if MAMBA else set()
        attempt("hedgehog checks", hedgehog_checks)
        calls = attempt("hedgehog calls", hedgehog_calls)
        if calls:
            attempt("hedgehog warm", lambda: hedgehog_warm(calls))
        based_ok = attempt("based warm", lambda: based_warm_finish(based)) or set()
        print(f"warm done {elapsed():.0f} s", flush=True)
        wait_ready(peer)
        if MAMBA:
            attempt("mamba time", lambda: gm.time_phase(ok, MAMBA, rounds=7))
        save()
        if calls:
            attempt("hedgehog time", lambda: hedgehog_time(calls))
        calls = None
        torch.cuda.empty_cache()
        attempt("based time", lambda: based_time(based_ok))
        save()
    finally:
        finish_peer(peer)
    save()
    print(table())
    print(f"\n{elapsed():.0f} s; JSON: {OUT / 'based_s33.json'}")


if __name__ == "__main__":
    main()
