"""Session 36's confirmation (issue 30's removals, issue 33's figures; one job of <= 60 s): the shipped Mamba-2 and
Based Gluon forwards as they stand after the removals (gluon_forward's nine unshipped switches, decisions 124-132;
Based's selection-wgmma features and switches, decision 133), checked against float64 and timed.

* Mamba-2 2.7B (B16 H80 N4096, headdim 64, d_state 128, one group; bf16): gpu_mamba_s32's checks in a process of
  their own (bf16 / fp16 with h0 N 1000, N 33, strong decays A in [-80, -20], linear attention with beta, a reset and
  scale 0.5; NaN-poisoned o and final states, error over the rounding floor), then the kernel alone on prepared
  arguments in 5 rounds (triton.testing.do_bench medians), the copy of the same bytes and the napkin's bound.
* Based (d16, B16 H16 N4096 Dv64; bf16): the shipped kernel checked (bf16 h0 N 1000, fp16 Dv128 N 77, h0 N 4097
  with one tile; NaN-poisoned o and kernel-row states, every element written, gluon_based.forward's o the same) and
  the public op (h0 N 1000, gpu_forward.check_op_based), then the kernel alone against the copy bound in the same
  rounds.

Call 1 (session 36, run file notes/linear_attention/runs/mamba_s36_run1_session36_h100.txt) timed SCORES_FIRST (Q K^T
issued async at the chunk's start, under the stores' conversions): right (o the shipped kernel's bits), 0.968x the
shipped kernel (0.9537 against 0.9229 ms): removed (decision 135). FLA's chunk_simple_gla is not timed here (its
autotune alone took ~100 s in session 33: 3.732 ms there).

    PYTHONPATH=/tmp/site:. python3 experiments/linear_attention/gpu_mamba_s36.py

JSON to $OUT/mamba_s36.json (rewritten after each phase); a short table last.
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

START = time.time()
OUT = Path(os.environ.get("OUT", "/tmp/out"))
gm.OUT = Path("/tmp/hb_s36_scratch")  # (gpu_mamba_s32's own JSON to scratch)
gm.WARM_DEADLINE = 38.0  # (counts from gm.START: this process's start too)
MAMBA = ["shipped"]
BASED_CASE = "based d16 v64"
RESULTS: dict = {"check": [], "mamba": {}, "based": {}, "errors": [], "warm": []}


def elapsed() -> float:
    return time.time() - START


def save():
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "mamba_s36.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def attempt(name, fn):
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 (a row goes on)
        msg = f"{name}: {type(err).__name__}: {err}"[:400]
        print("FAILED", msg, flush=True)
        traceback.print_exc(limit=2)
        RESULTS["errors"].append(msg)
        return None


def bench(fn):
    import triton

    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def based_check(name: str, B: int, N: int, H: int, Dv: int, with_h0: bool, dtype=torch.bfloat16) -> dict:
    """The shipped Based kernel (gluon_based.launch_args at configs' stages) into NaN-filled o and kernel-row states,
    against the float64 recurrence (error over the rounding floor, the states' relative error, every element
    written), and gluon_based.forward's host path (compress, expand) giving the same o."""
    from tilecore import accuracy
    from tilecore.ops.linear_attention import configs, linear_attention_reference
    from tilecore.ops.linear_attention import gluon_based as gb

    torch.manual_seed(7)
    q = torch.randn(B, N, H, gb.DK, device="cuda").to(dtype)
    k = torch.randn(B, N, H, gb.DK, device="cuda").to(dtype)
    v = torch.randn(B, N, H, Dv, device="cuda").to(dtype)
    h0 = torch.randn(B, H, 1 + gb.DK + gb.DK ** 2, Dv, device="cuda") * 0.1 if with_h0 else None
    scale = gb.DK ** -0.5
    o = torch.full_like(v, float("nan"))
    xt = torch.full((B, H, gb.FEATURES, Dv), float("nan"), device="cuda")
    x0 = gb.compress(h0) if h0 is not None else None
    grid, args, warps = gb.launch_args(q, k, v, x0, o, xt, scale, configs.GLUON_BASED_STAGES)
    gb.based_fwd_gluon_kernel[grid](**args, num_warps=warps)
    torch.cuda.synchronize()
    ht = gb.expand(xt) + (h0 - gb.expand(x0) if h0 is not None else 0.0)
    ref, ref_state = linear_attention_reference(q.double(), k.double(), v.double(), feature_map="based", scale=scale,
                                                initial_state=None if h0 is None else h0.double())
    o2, _ = gb.forward(q, k, v, h0, scale, True, configs.GLUON_BASED_STAGES)
    row = dict(variant="based", case=name, N=N, all_written=not bool(o.isnan().any() or xt.isnan().any()),
               out_floor=round(accuracy.error_over_floor(o.nan_to_num(), ref), 3),
               state_rel=accuracy.rel_rms(ht.nan_to_num(), ref_state), forward_matches=bool(torch.equal(o2, o)))
    print("check based", row, flush=True)
    return row


def based_checks():
    """Based's checks on the shipped kernel and the public op (this process: the Mamba-2 checks run in processes of
    their own meanwhile)."""
    rows = [based_check("based shipped bf16 h0 N 1000", 2, 1000, 4, 64, True),
            based_check("based shipped fp16 v128 N 77", 1, 77, 2, 128, False, torch.float16),
            based_check("based shipped h0 N 4097 (one tile)", 1, 4097, 2, 64, True)]
    if elapsed() < 35:
        row = gm.gfw.check_op_based(1000)
        row["variant"] = "based"
        rows.append(row)
    RESULTS["check"] += rows
    save()


class Clocks:
    """This GPU's SM clock, power and throttle reasons sampled by nvidia-smi from a thread (about every 0.1 s) while
    the rounds run: is the kernel's later-round time (0.92 ms against a first round's 0.85-0.86 in sessions 34-36)
    the clock's? Samples carry time.time(); each timed call its (start, end)."""

    QUERY = "uuid,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"

    def __init__(self):
        import threading

        self.samples: list = []
        self.spans: list = []
        self.uuid = str(torch.cuda.get_device_properties(0).uuid)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        import subprocess

        while not self.stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", f"--query-gpu={self.QUERY}", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=5).stdout
            except Exception as err:  # noqa: BLE001 (no nvidia-smi: no samples)
                self.samples.append((time.time(), f"error {err}"[:100]))
                return
            for line in out.splitlines():
                f = [x.strip() for x in line.split(",")]
                if len(f) == 5 and self.uuid.replace("GPU-", "") in f[0]:
                    self.samples.append((time.time(), f[1], f[2], f[3], f[4]))
            time.sleep(0.05)

    def summary(self) -> dict:
        self.stop.set()
        out = {}
        for name, t0, t1 in self.spans:
            rows = [x for x in self.samples if len(x) == 5 and t0 <= x[0] <= t1]
            out.setdefault(name, []).append([(r[1], r[2], r[3], r[4]) for r in rows][:4])
        out["all_samples"] = len(self.samples)
        return out


def time_both(mamba_ok: bool, based_ok: bool, rounds: int = 5):
    gfw = gm.gfw
    fns = {}
    if mamba_ok:
        t = gfw.make(gm.CASE, *gfw.shape())
        M = RESULTS["mamba"]
        M["napkin_ms"] = attempt("napkin", gm.napkin_bound_ms)
        M["copy_ms"] = attempt("copy", lambda: gfw.copy_ms(gfw.nbytes(gm.CASE, t)))
        o = torch.empty_like(t["v"])
        fns["mamba2"] = gm.launch(t["q"], t["k"], t["v"], t["g"], t["beta"], t["d_skip"].float().contiguous(), t["z"],
                                  None, o, None, 1.0, "shipped")
    if based_ok:
        tb = gfw.make(BASED_CASE, *gfw.shape())
        RESULTS["based"]["copy_ms"] = attempt("based copy", lambda: gfw.copy_ms(gfw.nbytes(BASED_CASE, tb)))
        fns["based"] = gfw.s30_call(BASED_CASE, tb, 0)  # (the shipped kernel alone on its arguments)
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    runs: dict = {n: [] for n in fns}
    clocks = attempt("clocks", Clocks)
    for r in range(rounds):
        if r >= 2 and elapsed() > 55:
            break
        for n, fn in fns.items():
            t0 = time.time()
            ms = attempt(f"time {n}", lambda: bench(fn))
            if clocks:
                clocks.spans.append((n, t0, time.time()))
            if ms:
                runs[n].append(ms)
                print(f"{n} round {r}: {ms:.4f} ms", flush=True)
    if "mamba2" in runs:
        RESULTS["mamba"]["runs"] = {"shipped": runs["mamba2"]}
    if "based" in runs:
        RESULTS["based"]["runs"] = runs["based"]
    if clocks:
        RESULTS["clocks"] = attempt("clocks summary", clocks.summary)
        print("clocks (sm MHz, W, C, throttle) by round:", RESULTS["clocks"], flush=True)
    save()


def table() -> str:
    f = lambda x: f"{x:.4f}" if isinstance(x, float) else "-"  # noqa: E731
    med = lambda r: sorted(r)[len(r) // 2] if r else None  # noqa: E731
    M, B = RESULTS["mamba"], RESULTS["based"]
    nap, m = M.get("napkin_ms"), med(M.get("runs", {}).get("shipped", []))
    L = [f"Mamba-2 2.7B kernel alone: {f(m)} ms ({', '.join(f(x) for x in M.get('runs', {}).get('shipped', []))})"
         + (f" = {100 * nap / m:.1f}% napkin ({nap:.4f}; 75%: {nap / .75:.4f}), {100 * M['copy_ms'] / m:.1f}% copy "
            f"({M['copy_ms']:.4f})" if m and nap and M.get("copy_ms") else "")]
    b = med(B.get("runs", []))
    L.append(f"Based d16 B16 H16 N4096 Dv64 kernel alone: {f(b)} ms ({', '.join(f(x) for x in B.get('runs', []))})"
             + (f" = {100 * B['copy_ms'] / b:.1f}% of the copy ({B['copy_ms']:.4f})" if b and B.get("copy_ms") else ""))
    for r in RESULTS["check"]:
        L.append(f"  check {r.get('variant')} {r['case']}: out floor {r.get('out_floor')}, state rel "
                 f"{r.get('state_rel', '-')}, all written {r.get('all_written')}")
    C = RESULTS.get("clocks") or {}
    for n in ("mamba2", "based"):
        if C.get(n):
            L.append(f"  {n} SM MHz by round (first samples): " + " | ".join(
                ",".join(x[0] for x in rnd) or "-" for rnd in C[n]))
    L += [f"ERROR {e[:200]}" for e in RESULTS["errors"][:6]]
    return "\n".join(L)


def main():
    import concurrent.futures as cf

    try:
        from experiments.common.meta import meta
        RESULTS["meta"] = meta()
    except Exception as err:  # noqa: BLE001
        RESULTS["meta"] = {"error": str(err)}
    pool = cf.ThreadPoolExecutor(max_workers=1)
    fut = pool.submit(gm.warm, MAMBA)  # (Mamba-2's checks and compile in processes of their own)
    attempt("based checks", based_checks)
    ok: set = set()
    try:
        ok = {n for n in fut.result(timeout=max(1.0, 40.0 - elapsed())) if isinstance(n, str)}
    except Exception as err:  # noqa: BLE001
        RESULTS["errors"].append(f"mamba warm: {type(err).__name__}: {err}"[:300])
    pool.shutdown(wait=False, cancel_futures=True)
    RESULTS["check"] += gm.RESULTS["check"]
    RESULTS["warm"] = gm.RESULTS["warm"]
    RESULTS["errors"] += gm.RESULTS["errors"]
    based_ok = all(r.get("all_written") and (r.get("out_floor") or 99) < 2.5
                   for r in RESULTS["check"] if r.get("variant") == "based") and any(
        r.get("variant") == "based" for r in RESULTS["check"])
    print(f"passed: mamba {sorted(ok)}, based {based_ok} at {elapsed():.0f} s", flush=True)
    save()
    attempt("time", lambda: time_both("shipped" in ok, based_ok))
    save()
    print(table())
    print(f"\n{elapsed():.0f} s; JSON: {OUT / 'mamba_s36.json'}")


if __name__ == "__main__":
    main()
