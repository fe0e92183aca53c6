"""Where the GLA backward's d 32 dq / dk chain waits (issue 33: the Gluon kernel's consumer chain at ~73% of its HBM
bound, latency-bound with two chains an SM): Nsight Compute's warp stall samples per SASS instruction on one launch of
gla_dqk_gluon_kernel (B16 H16 N4096 Dk = Dv = 32 bf16, a pair of chunks a tile, 3 stages), for each FORM asked, summed
by the chain's phases (the instructions between two synchronizing ones: bar.sync, wgmma waits, mbarrier waits, TMA
stores, fences) and by stall reason, with the top instructions. Compile-level counts of the same forms: sm_90a
cuobjdump of the chunk loop (experiments/linear_attention/sass_mamba_step.report's split).

    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_dqk_ncu.py [--forms 75266,4269570] [--top 25]
    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_dqk_ncu.py --target 9730     (what ncu runs)

Writes $OUT/gla_dqk_ncu.json (per form: samples by reason, by phase, the top instructions); prints the same.
"""
import argparse
import collections
import csv
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from experiments.common.nsight import ncu_binary, profile  # noqa: E402

MARKS = ("BAR.", "WARPGROUP.DEPBAR", "SYNCS", "UTMA", "DEPBAR", "MEMBAR", "FENCE")


def target(form: int) -> None:
    """Three launches of the d 32 dq / dk kernel at FORM ``form`` (ncu profiles the third)."""
    import torch

    from experiments.linear_attention.gpu_gla_s37 import backward, make

    t = make(16, 4096, 16, 32, decay=0.3, reset=False, seed=0)
    ht = torch.randn(16, 16, 32, 32, device="cuda")
    steps = []
    backward(t, ht, dict(dqk_gluon_form=form), steps=steps)  # (with steps: the launches recorded, none run)
    s = next(s for s in steps if s[0] == "dqk0w")
    for _ in range(3):
        s[1][s[2]](*s[3], **s[4])
    torch.cuda.synchronize()


def opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0] if text.strip() else ""


def summarize(rows: list, cols: list, top: int) -> dict:
    """Samples by stall reason, by phase of the chain (in address order, a phase ends at a synchronizing
    instruction, which counts in it), and the top instructions."""
    num = lambda v: float(v.replace(",", "") or 0)  # noqa: E731
    src = cols.index("Source")
    addr = next((i for i, c in enumerate(cols) if c.lower() in ("address", "#address")), None)
    total_col = next((i for i, c in enumerate(cols) if c.startswith("Warp Stall Sampling (All")),
                     next(i for i, c in enumerate(cols) if "Sampl" in c))
    reasons = [i for i, c in enumerate(cols) if c.startswith("stall_")]
    total = sum(num(r[total_col]) for r in rows) or 1.0

    def at(r):  # the offset from the kernel's first instruction (cuobjdump's addresses)
        try:
            return hex(int(r[addr], 16) - int(rows[0][addr], 16))
        except (TypeError, ValueError, IndexError):
            return ""
    by_reason = collections.Counter()
    for r in rows:
        for i in reasons:
            by_reason[cols[i]] += num(r[i])
    phases, cur, cur_n = [], 0.0, 0
    for r in rows:
        op = opcode(r[src])
        cur += num(r[total_col])
        cur_n += 1
        if op.startswith(MARKS):
            phases.append(dict(end=r[src][:60], at=at(r), n=cur_n, pct=round(100 * cur / total, 2)))
            cur, cur_n = 0.0, 0
    if cur_n:
        phases.append(dict(end="(end)", at="", n=cur_n, pct=round(100 * cur / total, 2)))
    top_rows = []
    for r in sorted(rows, key=lambda r: -num(r[total_col]))[:top]:
        why = sorted(((num(r[i]), cols[i]) for i in reasons), reverse=True)[:2]
        top_rows.append(dict(at=at(r), sass=r[src][:70],
                             pct=round(100 * num(r[total_col]) / total, 2),
                             why={c: int(v) for v, c in why if v}))
    return dict(samples=int(total), by_reason={k: round(100 * v / total, 2) for k, v in by_reason.most_common(12)},
                phases=phases, top=top_rows)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target", type=int)
    p.add_argument("--forms", default="75266,4269570")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    a = p.parse_args()
    if a.target is not None:
        return target(a.target)
    t0 = time.time()
    out = {}
    for form in (int(x) for x in a.forms.split(",")):
        rep = os.path.join("/tmp", f"gla_dqk_ncu_{form}")
        text = profile(["--section", "SourceCounters", "--section", "WarpStateStats", "-f", "-o", rep],
                       "gla_dqk_gluon", __file__, ["--target", str(form)], timeout=200)
        res = subprocess.run([ncu_binary(), "-i", rep + ".ncu-rep", "--page", "source", "--csv", "--print-source",
                              "sass"], capture_output=True, text=True, timeout=120)
        table = list(csv.reader(io.StringIO(res.stdout)))
        head = next((i for i, r in enumerate(table) if "Source" in r), None)
        if head is None:
            out[form] = dict(error=(text[-1500:] + res.stderr[-800:]))
            print(f"--- FORM {form}: no source table ({time.time() - t0:.0f} s)\n{text[-1500:]}\n{res.stderr[-800:]}")
            continue
        cols = table[head]
        rows = [r for r in table[head + 1:] if len(r) == len(cols)]
        out[form] = s = summarize(rows, cols, a.top)
        print(f"--- FORM {form}: {len(rows)} SASS lines, {s['samples']} samples ({time.time() - t0:.0f} s) ---")
        print("by reason: " + ", ".join(f"{k} {v}%" for k, v in s["by_reason"].items()))
        print("phases over 1% (samples, instructions, the synchronizing one that ends it):")
        for ph in s["phases"]:
            if ph["pct"] >= 1.0:
                print(f"  {ph['pct']:5.1f}% {ph['n']:4d}  {ph['at']:>7s} {ph['end']}")
        for r in s["top"]:
            print(f"{r['pct']:5.1f}%  {r['at']:>6s} {r['sass']:70s} {r['why']}")
        sys.stdout.flush()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "gla_dqk_ncu.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
