"""Session 34 (issue 33, helper HB): one job of <= 70 s, each row checked against float64 and timed once (do_bench
medians), a row printed as soon as it is timed.

* Hedgehog (d64, F 2 x 32, B16 H16 N4096 bf16, W requiring grad): the public op's fwd and fwd+bwd as shipped since
  e185e97 (the one-pass map under autograd, tf32x3, configs.HEDGEHOG_MAP_BWD_BLOCKS), the same with the map backward
  at 64 rows where Dk x F <= 2048 ("bwd r64": 0.305 ms against 0.586 in call 1, never checked), with 1024 / 2048
  programs (configs.HEDGEHOG_MAP_BWD_PROGRAMS, 512 shipped: 32 serial row blocks a program), and torch's map under
  autograd with and without W's gradient (call 1's 26.29 ms against session 33's 6.585 without it: is W's einsum
  backward the difference?). Checks: o / dq / dk / dv / dW of the op (each row) against float64 at N 200 and 1000,
  and at Dk 128, F 64 (the map backward's 32 rows / 8 warps) at N 200.
* Based (d16 v64, B16 H16 N4096 bf16): launch.backward shipped against SYM (kernels_tl's symmetric quadratic state,
  configs.BASED_BWD_SYM) at 4 warps, 1 stage, 8 warps, value blocks of 64 at 8 warps, chunks of 32 at 8 warps and 1
  stage; each checked against the float64 recurrence's gradients (B1 H2 N 300) in a process of its own (which also
  compiles it at the timed shape); two interleaved rounds. FLA parallel_based's fwd and fwd+bwd in a process of its
  own, timed after ours if its compiles are done by PEER_READY s (else the row says so).
* Mamba-2 2.7B (kernel alone, gpu_mamba_s32's launch and checks): shipped and LEAN + UPDATE_LATE, three interleaved
  rounds on a quiet GPU (FLA's compiles for Based only, finished or killed before), the napkin's bound and the copy.

    PYTHONPATH=/tmp/site:. python3 experiments/linear_attention/gpu_based_s34.py [--no-peer] [--no-mamba] [--confirm]

``--confirm`` (the second batch): the shipped configs (SYM and the 64-row map backward on since d0bb2b4), each checked
as above, Based's public op fwd and fwd+bwd, Based's backward without SYM and at value blocks of 16 beside (call 4 also
timed Hedgehog's map by one tf32 product for 16-bit inputs, a switch removed in session 35 after it lost: decision 100).

JSON to $OUT/based_s34.json (rewritten after each phase).
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
from tilecore.ops.linear_attention import configs, launch, linear_attention  # noqa: E402
from tilecore.ops.linear_attention import linear_attention_reference  # noqa: E402
from tilecore.ops.linear_attention.plan import BASED, tl_plan  # noqa: E402
from tilecore.tiles.switches import patched  # noqa: E402

START = time.time()
OUT = Path(os.environ.get("OUT", "/tmp/out"))
SCRATCH = Path("/tmp/hb_s34_scratch")
gm.OUT = SCRATCH  # (gpu_mamba_s32's own JSON to scratch)
WARM_DEADLINE = 40.0
PEER_READY = 52.0
PEER_DEADLINE = 64.0
RESULTS: dict = {"check": [], "hedgehog": {}, "based": {}, "based_check": [], "mamba": {}, "errors": [], "peer": {}}
PEER = "--no-peer" not in sys.argv
CONFIRM = "--confirm" in sys.argv  # the shipped configs only (each row checked as above) and Based's public op
MAMBA = [] if "--no-mamba" in sys.argv else ["shipped"]  # (LEAN + UPDATE_LATE: removed, decision 124)
BASED_VARIANTS = {
    "shipped": {},
    "sym": dict(based_sym=True),
    "sym st1": dict(based_sym=True, num_stages=1),
    "sym w8": dict(based_sym=True, num_warps=8),
    "sym bvb64 w8": dict(based_sym=True, BVB=64, num_warps=8),
    # chunks of 32 (half the reverse sweep's serial steps): with SYM at 8 warps / 1 stage 0 B spilled (dq 246, dK/dV
    # 255 registers; without SYM session 33's bt32 w8 spilled 608 B and ran 6.33 ms against 4.51)
    "sym bt32 w8 st1": dict(based_sym=True, BT_BWD=32, num_warps=8, num_stages=1),
}
if CONFIRM:  # (SYM on since d0bb2b4: "no sym" is the backward before it; value blocks of 16 with SYM: 56 B spilled)
    BASED_VARIANTS = {"shipped": {}, "no sym": dict(based_sym=False), "bvb16": dict(BVB=16)}
R64 = ((2048, 64, 4), (4096, 32, 4), (8192, 32, 8))  # the map backward at 64 rows where Dk x F <= 2048


def elapsed() -> float:
    return time.time() - START


def save():
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "based_s34.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def attempt(name, fn):
    try:
        return fn()
    except Exception as err:  # noqa: BLE001
        msg = f"{name}: {type(err).__name__}: {err}"[:400]
        print("FAILED", msg, flush=True)
        traceback.print_exc(limit=2)
        RESULTS["errors"].append(msg)
        return None


def bench(fn, grads=()):
    import triton

    return triton.testing.do_bench(fn, warmup=10, rep=60, grad_to_none=list(grads) or None, return_mode="median")


# --------------------------------------------------------------------------------------------
# FLA parallel_based in a process of its own: compiles, a ready file, waits for go, times


def _peer(go: str):
    t0 = time.time()
    res: dict = {}
    try:
        t = gb.inputs("based", grad=True)
        fn = gb.fla("based", t)
        gb.fwd_bwd(fn, t)()
        torch.cuda.synchronize()
        res["ready_s"] = round(time.time() - t0, 1)
    except Exception as err:  # noqa: BLE001
        res["error"] = f"{type(err).__name__}: {err}"[:300]
        Path(go + ".ready").touch()
        return res
    Path(go + ".ready").touch()
    while not os.path.exists(go) and time.time() - t0 < 120:
        time.sleep(0.02)
    with torch.no_grad():
        res["fwd_ms"] = bench(fn)
    res["fwd_bwd_ms"] = bench(gb.fwd_bwd(fn, t), [t["q"], t["k"], t["v"]])
    res["bwd_ms"] = res["fwd_bwd_ms"] - res["fwd_ms"]
    return res


def start_peer():
    import concurrent.futures as cf
    import multiprocessing as mp

    SCRATCH.mkdir(parents=True, exist_ok=True)
    go = str(SCRATCH / ".peer_go")
    for p in (go, go + ".ready"):
        Path(p).unlink(missing_ok=True)
    pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"))
    return pool, pool.submit(_peer, go), go


def finish_peer(peer):
    """Times the peer if its compiles are done by PEER_READY, else kills it."""
    import concurrent.futures as cf

    pool, fut, go = peer
    while elapsed() < PEER_READY and not (os.path.exists(go + ".ready") or fut.done()):
        time.sleep(0.05)
    if os.path.exists(go + ".ready"):
        Path(go).touch()
        try:
            RESULTS["peer"] = fut.result(timeout=max(1.0, PEER_DEADLINE - elapsed()))
        except cf.TimeoutError:
            RESULTS["peer"] = dict(error=f"not timed by {PEER_DEADLINE:.0f} s")
        except Exception as err:  # noqa: BLE001
            RESULTS["peer"] = dict(error=f"{type(err).__name__}: {err}"[:300])
    else:
        RESULTS["peer"] = dict(error=f"compiles not done by {PEER_READY:.0f} s")
    for proc in list(getattr(pool, "_processes", {}).values()):
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    print("peer FLA parallel_based", RESULTS["peer"], flush=True)


# --------------------------------------------------------------------------------------------
# Based's backward variants: a process each (its float64 check and its compile at the timed shape)


def based_call(t: dict, name: str):
    p = tl_plan(t["q"], t["v"], None, BASED, **BASED_VARIANTS[name])
    return lambda do: launch.backward(p, do, t["q"], t["k"], t["v"], None, None, None, None, None, None, t["scale"],
                                      BASED, native=True)


def _based_warm(name: str):
    t0 = time.time()
    try:
        t = gb.inputs("based", 1, 300, 2, seed=21)
        do = torch.randn_like(t["v"])
        dq, dk, dv = based_call(t, name)(do)[:3]
        d = {x: t[x].double().requires_grad_(True) for x in ("q", "k", "v")}
        ref, _ = linear_attention_reference(d["q"], d["k"], d["v"], feature_map="based", scale=t["scale"])
        ref.backward(do.double())
        row = dict(variant=name, case="based bwd B1 H2 N 300",
                   finite=bool(all(torch.isfinite(g).all() for g in (dq, dk, dv))),
                   **{f"d{x}_floor": round(accuracy.error_over_floor(g, d[x].grad), 3)
                      for x, g in zip(("q", "k", "v"), (dq, dk, dv))})
        big = gb.inputs("based")
        based_call(big, name)(torch.randn_like(big["v"]))
        torch.cuda.synchronize()
        return "based", name, None, time.time() - t0, [row]
    except Exception as err:  # noqa: BLE001
        return "based", name, f"{type(err).__name__}: {err}"[:300], time.time() - t0, []


def _mamba_warm(name: str):
    _, err, secs, rows = gm._warm(name)
    return "mamba", name, err, secs, rows


def warm_start():
    import concurrent.futures as cf
    import multiprocessing as mp

    tasks = [(_based_warm, n) for n in BASED_VARIANTS] + [(_mamba_warm, n) for n in MAMBA]
    pool = cf.ProcessPoolExecutor(max_workers=len(tasks), mp_context=mp.get_context("spawn"), max_tasks_per_child=1)
    return pool, [pool.submit(fn, n) for fn, n in tasks]


def warm_finish(handle) -> dict:
    import concurrent.futures as cf

    pool, futs = handle
    ok: dict = {"based": set(), "mamba": set()}
    try:
        for fut in cf.as_completed(futs, timeout=max(1.0, WARM_DEADLINE - elapsed())):
            kind, name, err, secs, rows = fut.result()
            if kind == "based":
                RESULTS["based_check"] += rows
                good = bool(rows) and rows[0]["finite"] and max(rows[0][f"d{x}_floor"] for x in "qkv") < 3
            else:
                RESULTS["check"] += rows
                good = len(rows) >= len(gm.CHECKS) and all(r["all_written"] and r["out_floor"] < 2.5 for r in rows)
            print("warm", kind, name, err, round(secs, 1), rows if kind == "based" else
                  [(r["case"], r["out_floor"]) for r in rows], flush=True)
            if good and not err:
                ok[kind].add(name)
    except cf.TimeoutError:
        RESULTS["errors"].append(f"warm: not every task done by {WARM_DEADLINE:.0f} s")
    for proc in list(getattr(pool, "_processes", {}).values()):
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    print(f"warm done {elapsed():.0f} s: {ok}", flush=True)
    return ok


def based_time(ok: set, rounds: int = 2):
    t = gb.inputs("based")
    do = torch.randn_like(t["v"])
    fns = {n: based_call(t, n) for n in BASED_VARIANTS if n in ok}
    runs: dict = {n: [] for n in fns}
    with torch.no_grad():
        for r in range(rounds):
            for n, fn in fns.items():
                ms = attempt(f"based {n}", lambda: bench(lambda: fn(do)))
                if ms:
                    runs[n].append(ms)
                    print(f"based bwd {n} round {r}: {ms:.3f} ms", flush=True)
    RESULTS["based"]["runs"] = runs
    if CONFIRM:  # the public op (linear_attention(feature_map="based"): configs' backward) fwd, fwd+bwd
        RESULTS["based"]["op"] = attempt("based op", lambda: gb.time_case("based", "ours"))
        print("based op", RESULTS["based"]["op"], flush=True)
    save()


# --------------------------------------------------------------------------------------------
# Hedgehog (in this process: configs read at each call)


def hh_inputs(n, dk=64, f=32, b=16, h=16, seed=0):
    torch.manual_seed(seed)
    bf = torch.bfloat16
    t = dict(q=torch.randn(b, n, h, dk, device="cuda", dtype=bf), k=torch.randn(b, n, h, dk, device="cuda", dtype=bf),
             v=torch.randn(b, n, h, 64, device="cuda", dtype=bf),
             W=torch.randn(h, dk, f, device="cuda") * dk ** -0.5)
    for x in ("q", "k", "v", "W"):
        t[x].requires_grad_(True)
    t["do"] = torch.randn_like(t["v"])
    return t


def hh_setting(name: str):
    """The configs of the row, for a ``with`` block: "shipped", "bwd r64" (64 rows), "bwd r64 pN" (and N programs over
    the heads: one float32 dW partial each), "torch map" (HEDGEHOG_FUSED_MAP_GRAD off)."""
    return patched(configs, HEDGEHOG_FUSED_MAP_GRAD=name != "torch map",
                   HEDGEHOG_MAP_BWD_BLOCKS=R64 if name.startswith("bwd r64") else SHIPPED_BLOCKS,
                   HEDGEHOG_MAP_BWD_PROGRAMS=int(name.split(" p")[1]) if " p" in name else SHIPPED_PROGRAMS)


SHIPPED_BLOCKS, SHIPPED_PROGRAMS = configs.HEDGEHOG_MAP_BWD_BLOCKS, configs.HEDGEHOG_MAP_BWD_PROGRAMS
HH_ROWS = ("shipped",) if CONFIRM else ("shipped", "bwd r64", "bwd r64 p1024", "bwd r64 p2048")


def hh_fwd(t):
    return linear_attention(t["q"], t["k"], t["v"], feature_map="hedgehog", feature_weights=t["W"])


def hedgehog_checks():
    for n, dk, f, names in ((200, 64, 32, HH_ROWS[:2]), (1000, 64, 32, HH_ROWS),
                            (200, 128, 64, HH_ROWS[:2] if CONFIRM else ("shipped",))):
        t = hh_inputs(n, dk, f, 1, 2, seed=5 + n + dk)
        d = {x: t[x].detach().double().requires_grad_(True) for x in ("q", "k", "v", "W")}
        ref, _ = linear_attention_reference(d["q"], d["k"], d["v"], feature_map="hedgehog", feature_weights=d["W"])
        ref.backward(t["do"].double())
        for name in names:
            with hh_setting(name):
                ts = {x: t[x].detach().clone().requires_grad_(True) for x in ("q", "k", "v", "W")}
                o = hh_fwd(ts)
                o.backward(t["do"])
            row = dict(case=f"hedgehog op {name} d{dk} F{f} B1 H2 N {n}",
                       out_floor=round(accuracy.error_over_floor(o.detach(), ref.detach()), 3),
                       **{f"d{x}_floor": round(accuracy.error_over_floor(ts[x].grad, d[x].grad), 3)
                          for x in ("q", "k", "v")},
                       dW_rel=round(float((ts["W"].grad.double() - d["W"].grad).norm() / d["W"].grad.norm()), 5),
                       finite=bool(all(torch.isfinite(ts[x].grad).all() for x in ts)))
            print("check", row, flush=True)
            RESULTS["check"].append(row)


def hedgehog_time():
    H = RESULTS["hedgehog"]
    t = hh_inputs(4096)
    grads = [t["q"], t["k"], t["v"], t["W"]]

    def fb():
        hh_fwd(t).backward(t["do"])

    with hh_setting("shipped"), torch.no_grad():
        hh_fwd(t)
        H["fwd_ms"] = attempt("hh fwd", lambda: bench(lambda: hh_fwd(t)))
    for name in HH_ROWS + (() if CONFIRM else ("torch map",)):
        with hh_setting(name):
            fb()  # (compiles)
            H[f"fwd_bwd_{name}_ms"] = attempt(f"hh {name}", lambda: bench(fb, grads))
        print(f"hedgehog fwd+bwd {name}: {H[f'fwd_bwd_{name}_ms']}", flush=True)
    if CONFIRM:
        save()
        return
    t["W"].requires_grad_(False)  # torch's map without W's gradient (session 33 run 2's setting)
    with hh_setting("torch map"):
        fb()
        H["fwd_bwd_torch map no dW_ms"] = attempt("hh torch no dW", lambda: bench(fb, grads[:3]))
    print(f"hedgehog fwd+bwd torch map without dW: {H['fwd_bwd_torch map no dW_ms']}", flush=True)
    save()


# --------------------------------------------------------------------------------------------
# Mamba-2 (quiet GPU)


def mamba_time(ok: set, rounds: int = 3):
    gfw = gm.gfw
    t = gfw.make(gm.CASE, *gfw.shape())
    M = RESULTS["mamba"]
    M["napkin_ms"] = attempt("napkin", gm.napkin_bound_ms)
    M["copy_ms"] = attempt("copy", lambda: gfw.copy_ms(gfw.nbytes(gm.CASE, t)))
    o = torch.empty_like(t["v"])
    d_skip = t["d_skip"].float().contiguous()
    fns = {n: gm.launch(t["q"], t["k"], t["v"], t["g"], t["beta"], d_skip, t["z"], None, o, None, 1.0, n)
           for n in MAMBA if n in ok}
    runs: dict = {n: [] for n in fns}
    for r in range(rounds):
        for n, fn in fns.items():
            ms = attempt(f"mamba {n}", lambda: bench(fn))
            if ms:
                runs[n].append(ms)
                print(f"mamba {n} round {r}: {ms:.4f} ms = {100 * (M['napkin_ms'] or 0) / ms:.1f}% napkin", flush=True)
    M["runs"] = runs
    save()


# --------------------------------------------------------------------------------------------


def table() -> str:
    L = []
    H, P = RESULTS["hedgehog"], RESULTS["peer"]
    f = lambda x: f"{x:.3f}" if isinstance(x, float) else "-"  # noqa: E731
    L.append(f"Hedgehog d64 F2x32 B16 H16 N4096 bf16 (ms): op fwd {f(H.get('fwd_ms'))} "
             "; fwd+bwd "
             + ", ".join(f"{n} {f(H.get(f'fwd_bwd_{n}_ms'))}" for n in HH_ROWS)
             + f", torch map {f(H.get('fwd_bwd_torch map_ms'))} (without dW {f(H.get('fwd_bwd_torch map no dW_ms'))})")
    L.append("  (FLA torch features + chunk_linear_attn, s33 run 2: fwd 1.613, fwd+bwd 4.220)")
    for r in RESULTS["check"]:
        if r["case"].startswith("hedgehog"):
            L.append("  check " + " | ".join(f"{k} {v}" for k, v in r.items()))
    runs = RESULTS["based"].get("runs", {})
    med = {n: sorted(r)[len(r) // 2] for n, r in runs.items() if r}
    base = med.get("shipped")
    fla_b = P.get("bwd_ms")
    L.append(f"Based d16 v64 B16 H16 N4096 bf16 launch.backward (ms): FLA parallel_based bwd {f(fla_b)} "
             f"(fwd {f(P.get('fwd_ms'))}, fwd+bwd {f(P.get('fwd_bwd_ms'))}) {P.get('error', '')}")
    if RESULTS["based"].get("op"):
        op = RESULTS["based"]["op"]
        L.append(f"  public op: fwd {f(op['fwd_ms'])}, fwd+bwd {f(op['fwd_bwd_ms'])}, bwd {f(op['bwd_ms'])}"
                 + (f" = {fla_b / op['bwd_ms']:.2f}x FLA's bwd" if fla_b else ""))
    for n in BASED_VARIANTS:
        chk = next((r for r in RESULTS["based_check"] if r["variant"] == n), {})
        cs = f"dq/dk/dv floor {chk.get('dq_floor')}/{chk.get('dk_floor')}/{chk.get('dv_floor')}"
        if n not in med:
            L.append(f"  {n}: - ({cs})")
            continue
        L.append(f"  {n}: {med[n]:.3f} ({', '.join(f'{x:.3f}' for x in runs[n])}) x shipped "
                 f"{base / med[n] if base else 0:.3f}, x FLA {fla_b / med[n] if fla_b else 0:.2f} | {cs}")
    M = RESULTS["mamba"]
    nap = M.get("napkin_ms")
    L.append(f"Mamba-2 2.7B kernel alone, quiet (napkin {f(nap)} ms, 75%: {f(nap and nap / .75)}; copy "
             f"{f(M.get('copy_ms'))})")
    for n, r in M.get("runs", {}).items():
        if r:
            m = sorted(r)[len(r) // 2]
            L.append(f"  {n}: {m:.4f} ({', '.join(f'{x:.4f}' for x in r)}) = {100 * nap / m if nap else 0:.1f}% "
                     f"napkin, {100 * (M.get('copy_ms') or 0) / m:.1f}% copy")
    ranges: dict = {}
    for r in RESULTS["check"]:
        if r.get("case", "").startswith("mamba"):
            ranges.setdefault(f"{r['variant']}", []).append(r["out_floor"])
    L.append("  checks (out floor): " + "; ".join(f"{c} {min(v)}-{max(v)}" for c, v in ranges.items()))
    L += [f"ERROR {e[:200]}" for e in RESULTS["errors"][:6]]
    return "\n".join(L)


def main():
    try:
        from experiments.common.meta import meta
        RESULTS["meta"] = meta()
    except Exception as err:  # noqa: BLE001
        RESULTS["meta"] = {"error": str(err)}
    print(RESULTS["meta"], flush=True)
    peer = start_peer() if PEER else None
    warm = warm_start()
    try:
        attempt("hedgehog checks", hedgehog_checks)
        ok = attempt("warm", lambda: warm_finish(warm)) or {"based": set(), "mamba": set()}
        if MAMBA:
            attempt("mamba time", lambda: mamba_time(ok["mamba"]))
        attempt("hedgehog time", hedgehog_time)
        torch.cuda.empty_cache()
        attempt("based time", lambda: based_time(ok["based"]))
    finally:
        if peer is not None:
            finish_peer(peer)
        save()
    print(table())
    print(f"\n{elapsed():.0f} s; JSON: {OUT / 'based_s34.json'}")


if __name__ == "__main__":
    main()
