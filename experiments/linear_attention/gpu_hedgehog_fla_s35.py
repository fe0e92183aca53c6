"""Hedgehog against flash-linear-attention in the same process (issue 33's backward target, session 35, the lead).

HB's session-35 figures for Hedgehog (d64, F 2 x 32, B16 H16 N4096 bf16) divided by FLA's of session 33 (its autotune
took ~100 s, too long for a 70 s job). This times both in one run: FLA's `chunk_linear_attn` on the feature map made
by torch (tilecore.ops.linear_attention.reference.hedgehog_features, as gpu_based_s32.fla) and tilecore's public op
(`linear_attention(..., feature_map="hedgehog", feature_weights=W)`), W requiring a gradient in both. FLA is
compiled and autotuned first (forward and backward), then five interleaved rounds of fwd and fwd+bwd each
(do_bench medians, gradients reset between calls; and the same replayed from a CUDA graph: GPU time alone). A
sanity check first: both outputs and tilecore's against the float64 reference at B1 H2 N 200 (tilecore's own
checks are in gpu_hedgehog_s35.py).

    PYTHONPATH=/tmp/site:. python3 experiments/linear_attention/gpu_hedgehog_fla_s35.py

JSON to $OUT/hedgehog_fla_s35.json; a short table last.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.linear_attention.gpu_based_s32 import bench, first, fla, inputs, ours  # noqa: E402
from tilecore import accuracy  # noqa: E402
from tilecore.ops.linear_attention import linear_attention_reference  # noqa: E402

START = time.time()
ROUNDS = 5
RESULTS: dict = {"device": None, "check": {}, "rounds": [], "errors": []}


def with_w_grad(t: dict) -> dict:
    t["W"] = t["W"].detach().clone().requires_grad_(True)
    return t


def fwd_bwd(fn, t):
    def run():
        first(fn()).backward(t["do"])
    return run


def check() -> dict:
    t = with_w_grad(inputs("hedgehog", 1, 200, 2, seed=3, grad=True))
    o = ours("hedgehog", t)().detach()
    p = first(fla("hedgehog", t)()).detach()
    ref, _ = linear_attention_reference(t["q"].double(), t["k"].double(), t["v"].double(), feature_map="hedgehog",
                                        feature_weights=t["W"].double())
    return {"ours_over_floor": round(accuracy.error_over_floor(o, ref), 3),
            "fla_over_floor": round(accuracy.error_over_floor(p.to(o.dtype), ref), 3)}


def main() -> int:
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    RESULTS["device"] = torch.cuda.get_device_name()
    RESULTS["check"] = check()
    print("check", RESULTS["check"], flush=True)
    t = with_w_grad(inputs("hedgehog", grad=True))
    grads = [t["q"], t["k"], t["v"], t["W"]]
    fns = {"fla": fla("hedgehog", t), "ours": ours("hedgehog", t)}
    for name, fn in fns.items():  # compile and autotune, forward and backward
        first(fn()).backward(t["do"])
        torch.cuda.synchronize()
        print(f"{name} ready at {time.time() - START:.0f} s", flush=True)
    for r in range(ROUNDS):
        row = {}
        for name, fn in fns.items():
            with torch.no_grad():
                row[f"{name}_fwd_ms"] = bench(fn)
            row[f"{name}_fwd_bwd_ms"] = bench(fwd_bwd(fn, t), grads)
            # GPU time alone: the same calls replayed from a CUDA graph (gradients accumulate inside it: same work)
            try:
                with torch.no_grad():
                    row[f"{name}_fwd_graph_ms"] = triton.testing.do_bench_cudagraph(fn, rep=100)
                row[f"{name}_fwd_bwd_graph_ms"] = triton.testing.do_bench_cudagraph(fwd_bwd(fn, t), rep=100)
            except Exception as err:  # noqa: BLE001
                RESULTS["errors"].append(f"{name} graph: {type(err).__name__}: {err}"[:300])
                print("graph timing failed:", RESULTS["errors"][-1], flush=True)
        RESULTS["rounds"].append(row)
        print(f"round {r}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
        (out / "hedgehog_fla_s35.json").write_text(json.dumps(RESULTS, indent=1))
    med = {k: sorted(r[k] for r in RESULTS["rounds"])[ROUNDS // 2] for k in RESULTS["rounds"][0]}
    RESULTS["median"] = med
    (out / "hedgehog_fla_s35.json").write_text(json.dumps(RESULTS, indent=1))
    bwd = {n: med[f"{n}_fwd_bwd_ms"] - med[f"{n}_fwd_ms"] for n in fns}
    print(f"\nHedgehog d64 F 2x32 B16 H16 N4096 bf16, W with grad, {RESULTS['device']}, "
          f"medians of {ROUNDS} interleaved rounds")
    print(f"{'':8} {'fwd ms':>8} {'fwd+bwd':>8} {'bwd':>8}")
    for n in fns:
        print(f"{n:8} {med[f'{n}_fwd_ms']:8.3f} {med[f'{n}_fwd_bwd_ms']:8.3f} {bwd[n]:8.3f}")
    for n in fns:
        if f"{n}_fwd_bwd_graph_ms" in med:
            print(f"{n + ' graph':8} {med[f'{n}_fwd_graph_ms']:8.3f} {med[f'{n}_fwd_bwd_graph_ms']:8.3f} "
                  f"{med[f'{n}_fwd_bwd_graph_ms'] - med[f'{n}_fwd_graph_ms']:8.3f}")
    if "ours_fwd_bwd_graph_ms" in med and "fla_fwd_bwd_graph_ms" in med:
        g = {n: med[f"{n}_fwd_bwd_graph_ms"] - med[f"{n}_fwd_graph_ms"] for n in fns}
        print(f"graph: ours x FLA fwd {med['fla_fwd_graph_ms'] / med['ours_fwd_graph_ms']:.2f}, fwd+bwd "
              f"{med['fla_fwd_bwd_graph_ms'] / med['ours_fwd_bwd_graph_ms']:.2f}, bwd {g['fla'] / g['ours']:.2f}")
    print(f"ours x FLA: fwd {med['fla_fwd_ms'] / med['ours_fwd_ms']:.2f}, fwd+bwd "
          f"{med['fla_fwd_bwd_ms'] / med['ours_fwd_bwd_ms']:.2f}, bwd {bwd['fla'] / bwd['ours']:.2f}; "
          f"{time.time() - START:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
