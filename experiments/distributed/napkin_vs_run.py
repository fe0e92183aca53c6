"""The napkin's ring (tilecore.napkin.ring) against a gpu_check run's per-part timeline, part by part,
computed here (pure Python, this checkout's calibration: the committed ceilings under
benchmarks/results), not on the device: a snapshot without benchmarks/ falls back to the
uncalibrated 680 TFLOP/s there, which is what made session 29's run 9 print backward rows at
1.17-1.22 (its step_compute_ms 8.03 where this checkout derives 7.50).

    python experiments/distributed/napkin_vs_run.py notes/distributed/runs/distributed_gpu_check_ce_run9_session29_h100x2.json
    python experiments/distributed/napkin_vs_run.py $OUT/distributed_gpu_check4.json     (gpu_check4's, any world)

Per (N, causal, variant with a timeline): each pass's total (predicted / the timeline's total / the
lockstep median), then each step's prediction against the timeline parts it models (forward: step 0;
each foreign step + its merge; backward: the own first part; each foreign block; the own last part + the
sums and casts), p/m = predicted over measured. With --measured-rate the attention runs at one GPU's measured
forward rate of the same run instead of the napkin's derivation.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tilecore.napkin import ring as napkin_ring  # noqa: E402

# the timeline's labels (ring.py's probes) each napkin step stands for, in step order (P ranks: step 0,
# P - 1 foreign steps; the backward's own first part, P - 1 foreign blocks, the own last part and sums)
def forward_parts(world: int) -> list[tuple]:
    return [("fwd step 0 attention",)] + [(f"fwd step {s} attention", f"fwd step {s} merge") for s in range(1, world)]


def backward_parts(world: int) -> list[tuple]:
    return ([("bwd own first", "bwd own first adds")] + [(f"bwd step {s}",) for s in range(1, world)]
            + [("bwd own last", "bwd own sums", "bwd sum adds", "bwd casts")])


FORWARD_PARTS, BACKWARD_PARTS = forward_parts(2), backward_parts(2)
# gpu_check's variants (margins or these keys) and gpu_check4's ("nccl", "ce": margin 0, no fused sums)
VARIANTS = {"ce": ("copy_engine", False), "cef": ("copy_engine", True), "0f": ("nccl", True),
            "nccl": ("nccl", False)}


def variant(key: str):
    via, fused = VARIANTS.get(str(key), ("nccl", False))
    margin = 0 if str(key) in VARIANTS else int(key)
    return margin, via, fused


def measured(parts, labels) -> float:
    return sum(p[3] for p in parts if p[0] in labels and p[1] == "compute")


def compare(row: dict, heads: int, d: int, world: int, measured_rate: bool) -> list[str]:
    lines = []
    rate = row.get("single_fwd_tflops") if measured_rate else None
    cells = row.get("margins") or row.get("variants") or {}  # gpu_check's or gpu_check4's
    for key, cell in cells.items():
        b = cell.get("breakdown") or cell.get("timeline")
        if not b or not b["fwd"].get("parts"):
            continue
        margin, via, fused = variant(key)
        if via == "copy_engine" and cell.get("ring", "CopyEngineRing") != "CopyEngineRing":
            via = "nccl"  # gpu_check4: asked for the copy engines, ran NCCL's ring
        p = napkin_ring.predict(seq=row["N"], heads=heads, d=d, world=world, causal=row["causal"],
                                attention_tflops=rate, one_gpu=False, sm_margin=margin, dq_in_kernel=True,
                                copy_engine=via == "copy_engine", one_pass_own_sums=fused)
        head = f"{row['N']:>6} {'causal' if row['causal'] else 'full':<6} {str(key):<4}"
        for name, steps, part_map, total, lock in (("fwd", p.forward, forward_parts(world), b["fwd"]["total_ms"],
                                                    cell["fwd_ms"]),
                                                   ("bwd", p.backward, backward_parts(world), b["bwd"]["total_ms"],
                                                    cell["bwd_ms"])):
            pred = sum(s.time for s in steps) * 1e3
            cells = []
            for s, labels in zip(steps, part_map):
                m = measured(b[name]["parts"], labels)
                cells.append(f"{s.what.split(',')[0][:22]} {s.time * 1e3:.2f}/{m:.2f}={s.time * 1e3 / m:.2f}"
                             if m else f"{s.what[:22]} {s.time * 1e3:.2f}/-")
            lines.append(f"{head} {name} {pred:7.2f} / {total:7.2f} (lockstep {lock:7.2f}) = {pred / total:.3f} "
                         f"| " + " | ".join(cells))
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", help="a gpu_check JSON (distributed_gpu_check.json)")
    parser.add_argument("--measured-rate", action="store_true",
                        help="the attention at one GPU's measured forward rate of the run")
    args = parser.parse_args(argv)
    data = json.loads(Path(args.json).read_text())
    print(f"napkin ({'one GPU measured rate' if args.measured_rate else 'derived rate'}, backward rate "
          f"{napkin_ring.BACKWARD_RATE}) over the timeline: predicted / measured ms per pass and step")
    for row in data["timing"]:
        lines = compare(row, data["heads"], data["d"], data["world"], args.measured_rate) \
            if "error" not in row and "skipped" not in row else []
        if lines:
            print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
