"""Session 31 (issue 33, helper HB): Based's Gluon forward variants that move its feature map off the shared-memory
path, and the GLA forward's blocks, each checked against float64 and timed against the shipped kernel (and FLA's
chunk_gla for GLA) in the same run.

    PYTHONPATH=/tmp/site:. python3 experiments/linear_attention/gpu_forward_s31.py [--only based|gla] [--no-fla]

* Based (B16 H16 N4096 d16 v64 bf16, the kernel alone on prepared arguments): the shipped kernel (SEL_ASYNC 3 +
  CHAIN) against SEL_REG (the selections' A operand q / k from registers), PHIQ_REG (phi_q never in shared
  memory: each piece the register operand of o's phi_q S wgmma, issued as it is made), both, and the PHIQ_REG
  forms at 3 stages (the 40 KB it frees), FEAT_ALU (the features by the CUDA cores, no selection wgmmas: a thread
  a row of scale q or k, blocks of 4 x 4 products; 2 and 3 stages). Checks (float64 recurrence, NaN-poisoned o and final states, the
  kernel and gluon_based.forward's host path): bf16 h0 N 1000, fp16 v128 N 77, bf16 h0 N 4097 with one tile.
* GLA (per-channel decay, B16 H16 N4096 d128 bf16, log decays -U(0, 0.3), an initial and a final state, the
  tl kernel alone on prepared arguments as gpu_gla.py times it): the shipped blocks (diag 3, chunk 32, BV 128,
  8 warps, 3 stages) against 4 stages, 16 / 4 warps, chunk 64 and 16; checks: bf16 N 4096 weak decays and N
  1008 strong decays with a reset (the fallback), every element written, error over the rounding floor.
  FLA chunk_gla compiles and autotunes in a process of its own from the start and times itself last (whatever it
  has by FLA_DEADLINE; the last figure otherwise: 4.196 ms, session 29 call 5).
Compiles run first in a pool of processes. Prints a table last; JSON to $OUT/linear_attention_forward_s31.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_forward as gf  # noqa: E402
import gpu_gla as gg  # noqa: E402

START = time.time()
OUT = Path(os.environ.get("OUT", "/tmp/out"))
WARM_DEADLINE = 70.0
BUDGET = 150.0  # no new timed variant past it
gg.FLA_DEADLINE = 138.0  # (gpu_gla's START is this script's import time)
RESULTS: dict = {"check": [], "time": [], "warm": [], "errors": []}

# name -> launch_args keywords over the shipped flags (configs: SEL_ASYNC 3, CHAIN); "stages" the ring's depth
# run 1 (H100, snapshot e7fb30d): shipped 0.1821 / 0.1853 ms (again), sel_reg 0.1794 (1.015x, noise), phiq_reg 0.2422
# (0.75x), both 0.2532, at 3 stages 0.2414 / 0.2515: PHIQ_REG slower, out; every check right (1.409-1.44x the floor).
# Run 3 (snapshot 3554620): FEAT_ALU 0.1505 ms, at 3 stages 0.1408 (82.3% of the copy bound; shipped 0.1820 / 0.1869),
# FEAT_ALU 2 0.1498 / 0.1411, 3 0.1494; all checked: FEAT_ALU 1 at 3 stages is on since (configs). The final run: the
# shipped kernel (configs: FEAT_ALU 1, GLUON_BASED_ALU_STAGES) against the session start's and FEAT_ALU 2 / 3 at 3
# stages and OUT_DIRECT (o stored from registers: no epilogue buffer, so 4 stages fit), the public op against float64
# and its time
BASED = {
    "shipped": {},
    "session_start": dict(feat_alu=0, stages=2),
    "feat_alu 2, 3 stages": dict(feat_alu=2, stages=3),
    "feat_alu 3, 3 stages": dict(feat_alu=3, stages=3),
    "out_direct 3 stages": dict(out_direct=True, stages=3),
    "out_direct 4 stages": dict(out_direct=True, stages=4),
}
# (label, B, N, H, Dv, h0, dtype)
BASED_CHECKS = [("bf16 h0 N 1000", 2, 1000, 4, 64, True, "bf16"), ("fp16 v128 N 77", 1, 77, 2, 128, False, "fp16"),
                ("bf16 h0 N 4097 one tile", 1, 4097, 2, 64, True, "bf16")]
# (name, diag, chunk, BV, warps, stages): the shipped blocks first (configs.CHANNEL_FWD_BLOCKS)
# run 1: shipped 2.220 ms (1.83x FLA chunk_gla 4.052 in the same run), s4 2.183, w16 4.20, w4 2.95, bt64 w8 s2 2.058
# (1.97x), bt16 w8 s3 8.44, bt16 w4 s3 4.72; every check right (bt64: 1.998x / 1.414x the floor). Run 3: bt64 w8 s2
# 2.103, s1 2.110, bt32 s4 2.145, shipped 2.161 (timed again last; its first timing 4.74 ran beside FLA's autotune);
# chunk 64 with 3 / 4 stages out of shared memory at d128; d64 N 77 checked 1.966x. Chunk 64 / 2 stages on since. The
# final run: FLA timed first (alone), then the shipped blocks against the session start's (chunk 32, 3 stages)
GLA = [
    ("shipped bt64 bv128 w8 s2", 3, 64, 128, 8, 2),
    ("session start bt32 w8 s3", 3, 32, 128, 8, 3),
    ("bt64 w8 s1", 3, 64, 128, 8, 1),
]
GLA_CHECKS = [("bf16 d128 h0 N 4096 weak decays", dict(B=1, N=4096, H=16, Dk=128, Dv=128, h0=True)),
              ("bf16 d128 h0 N 1008 strong [-6, 0] + reset", dict(B=1, N=1008, H=16, Dk=128, Dv=128, decay=6.0,
                                                                   reset=True, h0=True, seed=2)),
              # (gpu_gla.py's small cases, for the chunk-64 blocks the plan would give every Dk <= 128)
              ("fp16 d128 h0 N 1000 per token 0.05 (factored)", dict(B=1, N=1000, H=2, Dk=128, Dv=128, per_token=0.05,
                                                                      h0=True, dtype=torch.float16, seed=3)),
              ("bf16 d64 v128 h0 N 77", dict(B=2, N=77, H=2, Dk=64, Dv=128, h0=True, seed=4))]


def elapsed() -> float:
    return time.time() - START


def save():
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "linear_attention_forward_s31.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def attempt(name, fn):
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 (a variant goes on)
        msg = f"{name}: {type(err).__name__}: {err}"[:500]
        print("FAILED", msg, flush=True)
        traceback.print_exc(limit=3)
        RESULTS["errors"].append(msg)
        return None


def based_flags(name: str) -> tuple[int, dict]:
    from tilecore.ops.linear_attention import configs

    flags = dict(paired=configs.GLUON_BASED_PAIRED, chain=configs.GLUON_BASED_CHAIN,
                 sel_async=configs.GLUON_BASED_SEL_ASYNC, feat_alu=configs.GLUON_BASED_FEAT_ALU)
    extra = dict(BASED[name])
    stages = extra.pop("stages", configs.GLUON_BASED_ALU_STAGES if configs.GLUON_BASED_FEAT_ALU
                       else configs.GLUON_BASED_STAGES)
    flags.update(extra)
    return stages, flags


def based_call(t: dict, name: str):
    from tilecore.ops.linear_attention import gluon_based as gb

    stages, flags = based_flags(name)
    o = torch.empty_like(t["v"])
    grid, args, warps = gb.launch_args(t["q"], t["k"], t["v"], None, o, None, t["scale"], stages, False, 0, **flags)
    return lambda: gb.based_fwd_gluon_kernel[grid](**args, num_warps=warps)


def based_check(name: str, label: str, B, N, H, Dv, h0, dtype):
    stages, flags = based_flags(name)
    row = gf.check_based(f"based {name}: {label}", B, N, H, Dv, h0, dtype, stages=stages, **flags)
    row["variant"] = name
    return row


def gla_check(label: str, mk: dict):
    kernels = GLA[:2]
    gg.check(label, mk, kernels)
    return gg.RESULTS["check"][-1]


def _warm(task):
    """A warm task in its own process: compile and run once (a check: its row)."""
    t0 = time.time()
    try:
        kind, name = task[:2]
        if kind == "based":
            based_call(gf.make("based d16 v64", *gf.shape()), name)()
        elif kind == "based check":
            return task, None, time.time() - t0, based_check(name, *BASED_CHECKS[task[2]])
        elif kind == "based op check":
            return task, None, time.time() - t0, gf.check_op_based(1000)
        elif kind == "gla":
            _, diag, chunk, bv, warps, stages = next(v for v in GLA if v[0] == name)
            t = gg.make(1, 128, 16, 128, 128, h0=True)
            if len(task) > 2:  # the small checks' specializations: (dtype, Dk) at N 77, H 2
                t = gg.make(1, 77, 2, task[3], 128, h0=True, dtype=getattr(torch, task[2]))
            run, _, _ = gg.prepared(t, diag, chunk, bv, warps, final=True, stages=stages)
            run()
        torch.cuda.synchronize()
        return task, None, time.time() - t0, None
    except Exception as err:  # noqa: BLE001
        return task, f"{type(err).__name__}: {err}"[:300], time.time() - t0, None


def warm(parts):
    import concurrent.futures as cf
    import multiprocessing as mp

    tasks = []
    if "based" in parts:
        tasks += [("based check", n, i) for n in BASED for i in range(len(BASED_CHECKS))]
        tasks += [("based op check", "public linear_attention based h0 N 1000")]
        tasks += [("based", n) for n in BASED]
    if "gla" in parts:
        tasks += [("gla", v[0]) for v in GLA]
        tasks += [("gla", v[0], dt, dk) for v in GLA[:2] for dt, dk in (("float16", 128), ("bfloat16", 64))]
    pool = cf.ProcessPoolExecutor(max_workers=min(15, len(tasks)), mp_context=mp.get_context("spawn"),
                                  max_tasks_per_child=1)
    futs = {pool.submit(_warm, task): task for task in tasks}
    ok = set()
    try:
        for fut in cf.as_completed(futs, timeout=max(1.0, WARM_DEADLINE - elapsed())):
            task, err, secs, row = fut.result()
            RESULTS["warm"].append(dict(task=str(task), error=err, s=round(secs, 1)))
            if row is not None:
                RESULTS["check"].append(row)
            if err:
                print("warm", task, err, flush=True)
            else:
                ok.add(task)
    except cf.TimeoutError:
        RESULTS["errors"].append(f"warm: not every task done by {WARM_DEADLINE:.0f} s")
    for proc in list(getattr(pool, "_processes", {}).values()):
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    print(f"warm: {len(RESULTS['warm'])} of {len(tasks)} tasks in {elapsed():.0f} s", flush=True)
    return ok


def based_phase(ok):
    # (the checks ran in the warm phase: their rows are in RESULTS["check"])
    t = gf.make("based d16 v64", *gf.shape())
    row = dict(case="based d16 v64 B16 H16 N4096", bytes=gf.nbytes("based d16 v64", t))
    row["copy_ms"] = gf.copy_ms(row["bytes"])
    for name in BASED:
        if ("based", name) not in ok:
            row[f"{name}_error"] = "failed or not compiled in the warm phase"
            continue
        fn = attempt(f"based {name}", lambda: based_call(t, name))
        if fn is not None:
            row[f"{name}_ms"] = attempt(f"time based {name}", lambda: gf.bench(fn))
    for name in BASED:  # the shipped kernel again (drift between the first and the last timing)
        if name == "shipped":
            row["shipped_again_ms"] = attempt("time based shipped again", lambda: gf.bench(based_call(t, name)))
    from tilecore.ops.linear_attention import linear_attention

    op = lambda: linear_attention(t["q"], t["k"], t["v"], feature_map="based")  # noqa: E731
    row["public_op_ms"] = attempt("time based public op", lambda: gf.bench(op))
    print("time", row, flush=True)
    RESULTS["time"].append(row)
    save()


def gla_phase(ok, fla):
    fla_res = None
    if fla is not None:  # FLA's timing first, alone on the GPU (its autotune ran beside the Based timing)
        fla_res = gg.finish_fla(fla)
        print("fla chunk_gla", fla_res, flush=True)
    for label, mk in GLA_CHECKS:
        attempt(f"check gla {label}", lambda: RESULTS["check"].append(gla_check(label, mk)))
    save()
    t = gg.make(16, 4096, 16, 128, 128, h0=True)
    size = lambda x: x.numel() * x.element_size()  # noqa: E731
    nbytes = size(t["q"]) + size(t["k"]) + 2 * size(t["v"]) + size(t["g"])
    row = dict(case="gla d128 B16 H16 N4096 bf16", bytes=nbytes, copy_ms=gf.copy_ms(nbytes))
    base = None
    for name, diag, chunk, bv, warps, stages in GLA:
        if ("gla", name) not in ok or elapsed() > BUDGET:
            row[f"{name}_error"] = "not compiled in the warm phase, or past the budget"
            continue

        def one():
            run, o, _ = gg.prepared(t, diag, chunk, bv, warps, final=True, stages=stages)
            run()
            torch.cuda.synchronize()
            rel = None if base is None else gg.accuracy.rel_rms(o, base)
            return gg.bench(run), rel, o.clone()

        res = attempt(f"time gla {name}", one)
        if res is None:
            continue
        row[f"{name}_ms"], row[f"{name}_rel_vs_shipped"], o = res
        base = o if base is None else base
        print("time gla", name, row[f"{name}_ms"], row[f"{name}_rel_vs_shipped"], flush=True)
    if ("gla", GLA[0][0]) in ok:  # the shipped blocks again (drift between the first and the last timing)
        run, _, _ = gg.prepared(t, *GLA[0][1:5], final=True, stages=GLA[0][5])
        row["shipped_again_ms"] = attempt("time gla shipped again", lambda: gg.bench(run))
    del t, base
    torch.cuda.empty_cache()
    if fla_res is not None:
        row.update({f"chunk_gla_{k}": v for k, v in fla_res.items()})
    RESULTS["time"].append(row)
    save()


def table() -> str:
    lines = []
    for r in RESULTS["time"]:
        if r["case"].startswith("based"):
            names, base = list(BASED) + ["shipped_again", "public_op"], r.get("shipped_ms")
            lines.append(f"{r['case']}: copy bound {r.get('copy_ms', 0):.4f} ms | ms | % of bound | x shipped")
        else:
            names, base = [v[0] for v in GLA] + ["shipped_again"], r.get(f"{GLA[0][0]}_ms")
            fla = r.get("chunk_gla_ms")
            lines.append(f"{r['case']}: copy bound {r.get('copy_ms', 0):.4f} ms; FLA chunk_gla "
                         f"{fla and round(fla, 3)} (same run) | ms | % of bound | x shipped | x chunk_gla (same run, "
                         f"else session 29's 4.196)")
        for n in names:
            ms = r.get(f"{n}_ms")
            if not ms:
                lines.append(f"  {n:28} - {r.get(n + '_error', '')}")
                continue
            extra = ""
            if not r["case"].startswith("based"):
                extra = f" | {(r.get('chunk_gla_ms') or 4.196) / ms:.2f}x | rel vs shipped {r.get(n + '_rel_vs_shipped')}"
            lines.append(f"  {n:28} {ms:.4f} | {100 * r['copy_ms'] / ms:5.1f}% | {base / ms if base else 0:.3f}{extra}")
    lines.append("")
    lines.append("check (float64) | all written | out / floor | state rel")
    for r in RESULTS["check"]:
        if "out_floor" in r:
            lines.append(f"{r['case']} | {r.get('all_written')} | {r.get('out_floor')} | {r.get('state_rel'):.2e} | "
                         f"host path equal {r.get('forward_matches')}")
        else:
            parts = [f"{v[0]} {r.get(v[0] + '_out_floor')}{'' if r.get(v[0] + '_all_written') else ' NOT WRITTEN'}"
                     for v in GLA if v[0] + "_out_floor" in r]
            lines.append(f"gla {r['case']} pass {r.get('pass')}: " + ", ".join(parts))
    lines += [f"ERROR {e}" for e in RESULTS["errors"][:20]]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="based,gla")
    ap.add_argument("--no-fla", action="store_true")
    args = ap.parse_args()
    parts = args.only.split(",")
    try:
        from experiments.common.meta import meta
        RESULTS["meta"] = meta()
    except Exception as err:  # noqa: BLE001
        RESULTS["meta"] = {"error": str(err)}
    print(RESULTS["meta"], flush=True)
    fla = gg.start_fla() if "gla" in parts and not args.no_fla else None
    ok = warm(parts)
    if "based" in parts:
        attempt("based", lambda: based_phase(ok))
        torch.cuda.empty_cache()
    if "gla" in parts:
        attempt("gla", lambda: gla_phase(ok, fla))
    save()
    print(table())
    print(f"\n{elapsed():.0f} s; JSON: {OUT / 'linear_attention_forward_s31.json'}")


if __name__ == "__main__":
    main()
