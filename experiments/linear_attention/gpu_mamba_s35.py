"""Session 35 (issue 33, helper HB): one job of <= 60 s, every variant checked against float64 before it is timed.

* Mamba-2 2.7B (B16 H80 N4096, headdim 64, d_state 128, one group; the kernel alone on prepared arguments, as
  gpu_mamba_s32 launches it): the shipped kernel (call 2 of session 35 also timed SHARE_QK, C B^T made by one
  consumer and handed to the other, in three forms: 0.86-0.92x, removed after it: decision 102). Checks (gpu_mamba_s32's, each variant in a process of its own that
  also compiles it at the timed shape): bf16 / fp16 with h0 N 1000, N 33, strong decays; o and the final state
  NaN-poisoned, error over the rounding floor. Then interleaved rounds, the napkin's bound and the copy.
* Hedgehog (d64, F 2 x 32, B16 H16 N4096 bf16, W requiring grad): the public op's fwd and fwd+bwd as shipped against
  configs.HEDGEHOG_MAP_EXACT_X (the map kernels' products with x by two tf32 products, not three:
  kernels_forward.dot_tf32x2; call 2 also timed the split backward's narrow blocks, removed after call 3: decision
  103), each checked (o, dq, dk, dv, dW against float64
  at N 200 and 1000); where the shipped fwd+bwd's time goes (torch.profiler: CUDA time by kernel).

    PYTHONPATH=/tmp/site:. python3 experiments/linear_attention/gpu_mamba_s35.py [--confirm]

``--confirm`` (the second batch): the shipped configs and the one variant each part flips, checked and timed again.
JSON to $OUT/mamba_s35.json (rewritten after each phase).
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

import gpu_mamba_s32 as gm  # noqa: E402

from tilecore import accuracy  # noqa: E402
from tilecore.ops.linear_attention import configs, linear_attention, linear_attention_reference  # noqa: E402
from tilecore.tiles.switches import patched  # noqa: E402

START = time.time()
OUT = Path(os.environ.get("OUT", "/tmp/out"))
gm.OUT = Path("/tmp/hb_s35_scratch")  # (gpu_mamba_s32's own JSON to scratch)
gm.WARM_DEADLINE = 34.0  # (gm.warm's deadline counts from gm.START: this process's start too)
CONFIRM = "--confirm" in sys.argv
RESULTS: dict = {"check": [], "hedgehog": {}, "mamba": {}, "errors": [], "warm": []}
MAMBA = ["shipped"]
# Hedgehog rows: name -> configs.HEDGEHOG_MAP_EXACT_X ("shipped": call 2's, before it was on)
HH_ROWS = {"shipped": False, "exact_x": True}
HH = list(HH_ROWS)


def hh_setting(name: str):
    return patched(configs, HEDGEHOG_MAP_EXACT_X=HH_ROWS[name])


def elapsed() -> float:
    return time.time() - START


def save():
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "mamba_s35.json").write_text(json.dumps(RESULTS, indent=1, default=str))


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


# --------------------------------------------------------------------------------------------
# Mamba-2: checks and compiles in processes of their own (gm.warm, from a thread of this one), started first


def mamba_warm_start():
    import concurrent.futures as cf

    pool = cf.ThreadPoolExecutor(max_workers=1)
    return pool, pool.submit(gm.warm, MAMBA)


def mamba_time(ok, rounds: int = 3):
    gfw = gm.gfw
    t = gfw.make(gm.CASE, *gfw.shape())
    M = RESULTS["mamba"]
    M["napkin_ms"] = attempt("napkin", gm.napkin_bound_ms)
    M["copy_ms"] = attempt("copy", lambda: gfw.copy_ms(gfw.nbytes(gm.CASE, t)))
    d_skip = t["d_skip"].float().contiguous()
    outs = {n: torch.empty_like(t["v"]) for n in MAMBA if n in ok}
    fns = {n: gm.launch(t["q"], t["k"], t["v"], t["g"], t["beta"], d_skip, t["z"], None, outs[n], None, 1.0, n)
           for n in outs}
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    if "shipped" in outs:  # SHARE_QK's scores are consumer 0's bits: o should be the shipped kernel's exactly
        M["same_bits"] = {n: bool(torch.equal(outs[n], outs["shipped"])) for n in outs}
        print("mamba same bits as shipped:", M["same_bits"], flush=True)
    runs: dict = {n: [] for n in fns}
    for r in range(rounds):
        if r and elapsed() > 50:  # (the job's 70 s: Hedgehog's timings still to come)
            break
        for n, fn in fns.items():
            ms = attempt(f"mamba {n}", lambda: bench(fn))
            if ms:
                runs[n].append(ms)
                print(f"mamba {n} round {r}: {ms:.4f} ms = {100 * (M['napkin_ms'] or 0) / ms:.1f}% napkin", flush=True)
    M["runs"] = runs
    save()


# --------------------------------------------------------------------------------------------
# Hedgehog's public op


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


def hh_fwd(t):
    return linear_attention(t["q"], t["k"], t["v"], feature_map="hedgehog", feature_weights=t["W"])


def hedgehog_checks():
    for n in (208, 1008):  # (ragged last chunks; multiples of 16: the timed shape's specializations, compiled once)
        t = hh_inputs(n, b=1, h=2, seed=5 + n)
        d = {x: t[x].detach().double().requires_grad_(True) for x in ("q", "k", "v", "W")}
        ref, _ = linear_attention_reference(d["q"], d["k"], d["v"], feature_map="hedgehog", feature_weights=d["W"])
        ref.backward(t["do"].double())
        for name in HH:
            with hh_setting(name):
                ts = {x: t[x].detach().clone().requires_grad_(True) for x in ("q", "k", "v", "W")}
                o = hh_fwd(ts)
                o.backward(t["do"])
            row = dict(case=f"hedgehog op {name} d64 F32 B1 H2 N {n}",
                       out_floor=round(accuracy.error_over_floor(o.detach(), ref.detach()), 3),
                       **{f"d{x}_floor": round(accuracy.error_over_floor(ts[x].grad, d[x].grad), 3)
                          for x in ("q", "k", "v")},
                       dW_rel=round(float((ts["W"].grad.double() - d["W"].grad).norm() / d["W"].grad.norm()), 5),
                       finite=bool(all(torch.isfinite(ts[x].grad).all() for x in ts)))
            print("check", row, flush=True)
            RESULTS["check"].append(row)


HH_T: dict = {}


def hedgehog_warm():
    """The timed shape's inputs, and each row's fwd+bwd once (compiles) while the Mamba-2 checks run."""
    t = HH_T.setdefault("t", hh_inputs(4096))
    for name in HH:
        with hh_setting(name):
            attempt(f"hh warm {name}", lambda: hh_fwd(t).backward(t["do"]))
        with hh_setting(name), torch.no_grad():
            attempt(f"hh warm fwd {name}", lambda: hh_fwd(t))
    torch.cuda.synchronize()


def hedgehog_time(rounds: int = 2):
    H = RESULTS["hedgehog"]
    t = HH_T.get("t") or hh_inputs(4096)
    grads = [t["q"], t["k"], t["v"], t["W"]]

    def fb():
        hh_fwd(t).backward(t["do"])

    for name in ("shipped", "exact_x"):
        with hh_setting(name), torch.no_grad():
            hh_fwd(t)
            H[f"fwd {name}_ms"] = attempt("hh fwd", lambda: bench(lambda: hh_fwd(t)))
        print(f"hedgehog fwd {name}: {H[f'fwd {name}_ms']}", flush=True)
    H["fwd_ms"] = H.get("fwd shipped_ms")
    for r in range(rounds):
        if r and elapsed() > 60:
            break
        for name in HH:
            with hh_setting(name):
                ms = attempt(f"hh {name}", lambda: bench(fb, grads))
            H.setdefault(name, []).append(ms)
            print(f"hedgehog fwd+bwd {name} round {r}: {ms}", flush=True)
    save()
    if elapsed() < 62:
        attempt("hh profile", lambda: hedgehog_profile(fb))


def hedgehog_profile(fb, top: int = 9):
    """CUDA time by kernel of the shipped fwd+bwd (5 calls), the largest first."""
    from torch.profiler import ProfilerActivity, profile

    with hh_setting("shipped"):
        fb()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fb()
            torch.cuda.synchronize()
    rows = sorted(((e.key, e.device_time_total / 5 / 1000.0) for e in prof.key_averages() if e.device_time_total > 0),
                  key=lambda r: -r[1])
    RESULTS["hedgehog"]["profile_ms"] = [(k[:60], round(ms, 4)) for k, ms in rows]
    print("hedgehog profile (ms a fwd+bwd):", RESULTS["hedgehog"]["profile_ms"][:top], flush=True)
    save()


# --------------------------------------------------------------------------------------------


def table() -> str:
    f = lambda x: f"{x:.3f}" if isinstance(x, float) else "-"  # noqa: E731
    med = lambda r: sorted(x for x in r if x)[len([x for x in r if x]) // 2] if any(r) else None  # noqa: E731
    L = []
    H = RESULTS["hedgehog"]
    fwd = H.get("fwd_ms")
    L.append(f"Hedgehog d64 F2x32 B16 H16 N4096 bf16, W grad (ms): op fwd {f(fwd)} (exact_x {f(H.get('fwd exact_x_ms'))})"
             "; FLA (s33 run 2): fwd 1.613, fwd+bwd 4.220, bwd 2.607")
    for name in HH:
        m = med(H.get(name, []))
        own = H.get("fwd exact_x_ms") if HH_ROWS[name] else fwd  # (the row's own forward)
        bwd = m - own if m and own else None
        L.append(f"  {name}: fwd+bwd {f(m)} ({', '.join(f(x) for x in H.get(name, []))}), bwd {f(bwd)}"
                 + (f" = {2.607 / bwd:.2f}x FLA's bwd, fwd+bwd {4.220 / m:.2f}x" if bwd else ""))
    if H.get("profile_ms"):
        L.append("  shipped profile (ms): " + ", ".join(f"{k[:28]} {ms}" for k, ms in H["profile_ms"][:7]))
    for r in RESULTS["check"]:
        if r["case"].startswith("hedgehog"):
            L.append("  check " + " | ".join(f"{k} {v}" for k, v in r.items() if k != "case") + f" | {r['case']}")
    M = RESULTS["mamba"]
    nap = M.get("napkin_ms")
    L.append(f"Mamba-2 2.7B kernel alone (napkin {f(nap)} ms, 75%: {f(nap and nap / .75)}; copy {f(M.get('copy_ms'))})"
             f"; same bits as shipped: {M.get('same_bits')}")
    base = med(M.get("runs", {}).get("shipped", []))
    for n, r in M.get("runs", {}).items():
        m = med(r)
        if m:
            L.append(f"  {n}: {m:.4f} ({', '.join(f'{x:.4f}' for x in r)}) = {100 * nap / m if nap else 0:.1f}% "
                     f"napkin, {100 * (M.get('copy_ms') or 0) / m:.1f}% copy, x shipped {base / m if base else 0:.3f}")
    ranges: dict = {}
    for r in RESULTS["check"]:
        if r.get("case", "").startswith("mamba"):
            ranges.setdefault(r["variant"], []).append((r["out_floor"], r["all_written"]))
    L.append("  checks (out floor, all written): " + "; ".join(
        f"{c} {min(x for x, _ in v)}-{max(x for x, _ in v)} {all(w for _, w in v)}" for c, v in ranges.items()))
    L += [f"ERROR {e[:200]}" for e in RESULTS["errors"][:6]]
    return "\n".join(L)


def main():
    try:
        from experiments.common.meta import meta
        RESULTS["meta"] = meta()
    except Exception as err:  # noqa: BLE001
        RESULTS["meta"] = {"error": str(err)}
    pool, fut = mamba_warm_start()
    try:
        attempt("hedgehog checks", hedgehog_checks)  # (beside the Mamba-2 checks; timings after them: a quiet GPU)
        attempt("hedgehog warm", hedgehog_warm)
        print(f"hedgehog checked and compiled at {elapsed():.0f} s", flush=True)
        ok: set = set()
        try:
            ok = {n for n in fut.result(timeout=max(1.0, 40.0 - elapsed())) if isinstance(n, str)}
        except Exception as err:  # noqa: BLE001
            RESULTS["errors"].append(f"mamba warm: {type(err).__name__}: {err}"[:300])
        RESULTS["check"] += gm.RESULTS["check"]
        RESULTS["warm"] = gm.RESULTS["warm"]
        RESULTS["errors"] += gm.RESULTS["errors"]
        print(f"mamba passed checks: {sorted(ok)} at {elapsed():.0f} s", flush=True)
        if ok:
            attempt("mamba time", lambda: mamba_time(ok))
        torch.cuda.empty_cache()
        attempt("hedgehog time", hedgehog_time)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        save()
    print(table())
    print(f"\n{elapsed():.0f} s; JSON: {OUT / 'mamba_s35.json'}")


if __name__ == "__main__":
    main()
