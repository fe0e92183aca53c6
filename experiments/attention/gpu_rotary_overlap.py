"""Issue 37 (session 39, helper HR): the no-grad attention(..., rotary=(cos, sin)) forward with K turned inside the
Gluon kernel (gluon_rotary.KTurn: chunks of K drawn from a global counter by a side partition of the template,
each tile's kv head waited for by the producer before its first K load; run 2's first form turned them in the
producer warp between its TMA issues: +28-36%) against the shipped route (K by apply_rotary's pass first, then
gluon_rotary's forward with Q turned in the kernel), both over attention without rotary.

1. checks (bf16, fresh random inputs, the allocator's free memory filled with NaN before each call so an unwritten
   element shows): O of the in-kernel K turn against the float64 reference (reference.rotary_attention_reference)
   as a multiple of the rounding floor, beside plain attention's on the same inputs, and against the shipped
   route's bits (``same_o``: KTurn rounds as apply_rotary's kernel, so O should be the same bits); --checks of
   D128 full half-split, D128 causal interleaved GQA 8/2 with N < Nk, D128 rotary_dim 64, D64 causal.
2. timing (--dims): B16 H16 N4096 bf16, bf16 tables, full and causal, GPU time from CUDA graphs
   (do_bench_cudagraph medians) in interleaved rounds: plain / shipped route / in-kernel K turn at each
   variant of --chunks (rows a chunk, "p": the first programs' kv heads by the pass first); overheads over plain
   (issue 37: <= 3%).

A watchdog ends the process (the table so far printed, the JSON saved) should a launch hang past --deadline + 6 s.

  PYTHONPATH=. python experiments/attention/gpu_rotary_overlap.py [--checks 128full,128causal] [--dims 128]
      [--masks full,causal] [--chunks 8,8p] [--rounds 3]
  PYTHONPATH=. python experiments/attention/gpu_rotary_overlap.py --smoke   # CPU: imports, argument handling
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import tilecore  # noqa: E402
from experiments.common.gpu_script import Run, check, same_bits, time_rounds  # noqa: E402
from tilecore.ops.attention import configs, gluon_rotary  # noqa: E402
from tilecore.ops.attention.reference import attention_reference, rotary_attention_reference  # noqa: E402
from tilecore.tiles.switches import patched  # noqa: E402

COLUMNS = ["name", "ok", "same_o", "chunk_rows", "o", "plain_o", "plain_ms", "shipped_over", "k8p_over", "k8ph_over",
           "k8nh_over", "k8n_over", "shipped_ms", "k8p_ms", "k8ph_ms", "k8nh_ms"]


def poison():
    """The allocator's free blocks filled with NaN (the next outputs likely land there)."""
    free = torch.cuda.mem_get_info()[0]
    try:
        junk = torch.full((int(min(free * 0.5, 8 << 30)) // 2,), float("nan"), dtype=torch.bfloat16, device="cuda")
        del junk
    except RuntimeError:
        pass


def tables(rows, pairs, dtype=torch.float32):
    angle = torch.rand(rows, pairs, device="cuda", dtype=torch.float64) * 2 * math.pi
    return angle.cos().to(dtype), angle.sin().to(dtype)


def in_kernel(d, causal, variant=None):
    """The no-grad forward's K turned in the kernel for (d, causal); ``variant`` "8" (rows a chunk), "8p" (and the
    first programs' kv heads by apply_rotary's pass before the launch: configs.ROTARY_K_FIRST_BY_PASS), "8n" (the
    probe: K by the pass, turned again by the side partition, no waits: what the side partition's work costs the
    consumers), "h" (its loads and stores evict-first in L2: configs.ROTARY_K_EVICT_FIRST); None: the configs'
    own."""
    values = dict(ROTARY_K_IN_KERNEL_CASES=frozenset({(d, bool(causal))}))
    if variant is not None:
        values.update(ROTARY_K_CHUNK_ROWS=int(variant.rstrip("pnh")), ROTARY_K_FIRST_BY_PASS="p" in variant,
                      ROTARY_K_PROBE_NO_WAIT="n" in variant, ROTARY_K_EVICT_FIRST="h" in variant)
    return patched(configs, **values)


def checks(run, name, b, hq, hkv, n, nk, d, pairs, causal, interleaved, table_dtype=torch.float32, variant=None):
    q = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hkv, nk, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, hkv, nk, d, device="cuda", dtype=torch.bfloat16)
    cos, sin = tables(nk + 5, pairs, table_dtype)
    with torch.no_grad():
        poison()
        with in_kernel(d, causal, variant):
            got = tilecore.attention(q, k, v, causal=causal, rotary=(cos, sin), rotary_interleaved=interleaved)
        torch.cuda.synchronize()
        poison()
        shipped = tilecore.attention(q, k, v, causal=causal, rotary=(cos, sin), rotary_interleaved=interleaved)
        poison()
        plain = tilecore.attention(q, k, v, causal=causal)
        ref, _ = rotary_attention_reference(q.double(), k.double(), v.double(), cos, sin, interleaved=interleaved,
                                            causal=causal)
        plain_ref, _ = attention_reference(q.double(), k.double(), v.double(), causal=causal)
    with in_kernel(d, causal, variant):  # the in-kernel K turn taken (its chunk rows), not the pass
        rows = gluon_rotary.k_turn_rows(q, k, cos, causal, interleaved, (-1, -1), False, None)
    c = check(got, ref, tol=3.0)
    p = check(plain, plain_ref, tol=3.0)
    same = same_bits(got, shipped)
    ok = c["pass"] and c["err_over_floor"] <= max(3.0, 1.8 * p["err_over_floor"]) and rows > 0
    run.row(f"check {name}{' ' + variant if variant else ''}", kind="check", ok=bool(ok), same_o=same, chunk_rows=rows, o=c["err_over_floor"], written=c["written"],
            plain_o=p["err_over_floor"], d=d, causal=causal, interleaved=interleaved, pairs=pairs, b=b, hq=hq,
            hkv=hkv, n=n, nk=nk)


def timing(run, d, causal, chunks, rounds, b=16, h=16, n=4096):
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cos, sin = tables(n, d // 2, torch.bfloat16)

    def fwd(rot, variant=None):
        def f():
            with torch.no_grad():
                if variant:
                    with in_kernel(d, causal, variant):
                        tilecore.attention(q, k, v, causal=causal, rotary=rot)
                else:
                    tilecore.attention(q, k, v, causal=causal, rotary=rot)
        return f

    fns = {"plain": fwd(None), "shipped": fwd((cos, sin))}
    fns.update({f"k{variant}": fwd((cos, sin), variant) for variant in chunks})
    for name, f in fns.items():  # compiled (and any hang met) before the clock
        run.say(f"first call: D{d} {'causal' if causal else 'full'} {name}")
        f()
        torch.cuda.synchronize()
    t = time_rounds(fns, rounds=rounds, graph=True, eager=False, deadline=run)
    ms = {name: t[f"{name}_graph_ms"] for name in fns}
    over = {f"{name}_over": round(100 * (ms[name] / ms["plain"] - 1), 2) for name in fns if name != "plain"}
    run.row(f"time D{d} {'causal' if causal else 'full'}", kind="time", d=d, causal=causal, b=b, h=h, n=n,
            **{f"{name}_ms": round(x, 4) for name, x in ms.items()}, **over,
            rounds={name: t[f"{name}_rounds"]["graph"] for name in fns})


def watchdog(run, seconds):
    """End the process (table printed, JSON saved) should the run pass ``seconds`` (a hung launch)."""
    def fire():
        run.errors.append(f"watchdog: still running at {seconds:.0f} s (a launch hung?)")
        run.finish(COLUMNS)
        os._exit(3)
    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--checks", default="128full,128causal", help="of 128full, 128causal, 128rot64, 64causal")
    ap.add_argument("--check-variant", default=None, help="a --chunks variant for the checks (default: the configs')")
    ap.add_argument("--dims", default="128")
    ap.add_argument("--masks", default="full,causal")
    ap.add_argument("--chunks", default="8", help="variants timed: rows a chunk (configs.ROTARY_K_CHUNK_ROWS), "
                    "with p: the first programs' kv heads by the pass first (ROTARY_K_FIRST_BY_PASS)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--deadline", type=float, default=54.0)
    a = ap.parse_args()
    run = Run("gpu_rotary_overlap", deadline=a.deadline)
    chunks = [x for x in a.chunks.split(",") if x]
    if a.smoke or not torch.cuda.is_available():  # nothing to launch: the arguments and the table
        run.row("smoke", kind="smoke", ok=True, chunks=chunks)
        run.finish(COLUMNS)
        return
    watchdog(run, a.deadline + 6)
    torch.manual_seed(0)
    cases = {"128full": ("D128 full", 2, 8, 8, 2048, 2048, 128, 64, False, False),
             "128causal": ("D128 causal inter gqa", 2, 8, 2, 1536, 2048, 128, 64, True, True),
             "128rot64": ("D128 full rot64", 1, 4, 4, 2048, 2048, 128, 32, False, False),
             "64causal": ("D64 causal", 2, 8, 8, 2048, 2048, 64, 32, True, False)}
    for case in filter(None, a.checks.split(",")):
        run.attempt(f"check {case}", checks, run, *cases[case], variant=a.check_variant)
    for d in [int(x) for x in a.dims.split(",") if x]:
        for mask in a.masks.split(","):
            if run.left() < 14:
                run.errors.append(f"time D{d} {mask}: skipped (deadline)")
                continue
            run.attempt(f"time D{d} {mask}", timing, run, d, mask == "causal", chunks, a.rounds)
    run.finish(COLUMNS)


if __name__ == "__main__":
    main()
