"""Where a Mamba-2 chunk step's instructions go, on this machine (no GPU): the shipped kernel (gluon_forward's
la_fwd_gluon_kernel with beta, D and z, as compile_report builds it) compiled for sm_90a, then each consumer's chunk
loop in its SASS: the instruction mix by unit and the phases between its synchronizing instructions (wgmma issue and
waits, bar.sync, mbarrier, TMA, the gate's tanh), in ptxas's order. Notes/linear_attention's "Session 39 (HB)" split
reads from it.

    python experiments/linear_attention/sass_mamba_step.py [--case mamba2_states] [--sass FILE]

``--sass FILE`` reads a cuobjdump listing instead of compiling (another tree's, or a variant's).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

UNITS = (  # (unit, opcode prefixes), the first match wins
    ("tensor", ("HGMMA", "WARPGROUP")),
    ("sfu", ("MUFU",)),
    ("fp32", ("FMUL", "FADD", "FFMA", "FMNMX", "FSEL", "FSETP")),
    ("convert", ("F2FP", "F2F", "I2F", "F2I")),
    ("shared", ("LDS", "STS", "LDSM", "STSM")),
    ("global/local", ("LDG", "STG", "LDL", "STL")),
    ("tma", ("UTMA",)),
    ("mbarrier", ("SYNCS",)),
    ("sync", ("BAR", "DEPBAR", "MEMBAR", "FENCE")),
    ("moves", ("MOV", "IMAD.MOV")),
    ("uniform", ("U", "R2UR", "S2UR", "LDC")),
)
MARKS = ("HGMMA", "WARPGROUP", "BAR.", "SYNCS", "UTMA", "DEPBAR", "LDG", "MEMBAR", "FENCE")


def compile_sass(case: str) -> str:
    os.environ.pop("TRITON_INTERPRET", None)
    from triton.backends.nvidia.compiler import get_ptxas

    from tilecore.ops.linear_attention.gluon_forward import compile_report

    out: list = []
    r = compile_report(case, stages=2, compiled_out=out)
    print(f"{case}: registers {r['registers']}, spilled {r['spill_bytes']} B, shared {r['shared']} B, "
          f"wgmma serialized {r['wgmma_serialized']}")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(out[0].asm["cubin"])
        tool = os.path.join(os.path.dirname(get_ptxas(90).path), "cuobjdump")
        return subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout


def opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


def unit(op: str) -> str:
    for name, prefixes in UNITS:
        if op.startswith(prefixes):
            return name
    return "integer/address/control"


def chunk_loops(code):
    """Each consumer's chunk loop: of the innermost backward branches around wgmmas, the shortest for each set of
    wgmmas (a wait's out-of-line branch back makes another around the same ones)."""
    loops = []
    for addr, text in code:
        m = re.search(r"BRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            lo = int(m.group(1), 16)
            if any("HGMMA" in t for a, t in code if lo <= a <= addr):
                loops.append((lo, addr))
    inner = [(lo, hi) for lo, hi in loops if not any(lo < a and b < hi for a, b in loops if (a, b) != (lo, hi)
                                                      and any("HGMMA" in t for x, t in code if a <= x <= b))]
    by_mma = {}
    for lo, hi in inner:
        key = tuple(a for a, t in code if lo <= a <= hi and "HGMMA" in t)
        if key not in by_mma or hi - lo < by_mma[key][1] - by_mma[key][0]:
            by_mma[key] = (lo, hi)
    return sorted(by_mma.values())


def report(sass: str) -> None:
    code = [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    for lo, hi in chunk_loops(code):
        body = [(a, t) for a, t in code if lo <= a <= hi]
        ops = [opcode(t) for _, t in body]
        print(f"\nchunk loop {lo:#x}-{hi:#x}: {len(body)} instructions a step")
        by_unit = collections.Counter(unit(op) for op in ops)
        print("  by unit: " + ", ".join(f"{k} {v}" for k, v in by_unit.most_common()))
        top = collections.Counter(op.split(".")[0] if not op.startswith("MUFU") else op for op in ops)
        print("  opcodes: " + ", ".join(f"{k} {v}" for k, v in top.most_common(24)))
        print("  phases (the instructions between synchronizing ones, in ptxas's order):")
        seg: collections.Counter = collections.Counter()
        for a, t in body:
            op = opcode(t)
            if op.startswith(MARKS) and not op.startswith("HGMMA"):
                if seg:
                    print(f"    {sum(seg.values()):4d}: " + ", ".join(f"{k} {v}" for k, v in seg.most_common(8)))
                    seg = collections.Counter()
                print(f"  {a:05x} {t[:80]}")
            elif op.startswith("HGMMA"):
                seg["HGMMA"] += 1
            else:
                seg[op.split(".")[0] if not op.startswith("MUFU") else op] += 1
        if seg:
            print(f"    {sum(seg.values()):4d}: " + ", ".join(f"{k} {v}" for k, v in seg.most_common(8)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="mamba2", help="gluon_forward.COMPILE_CASES: mamba2, mamba2_states")
    ap.add_argument("--sass", help="a cuobjdump -sass listing to read instead of compiling")
    a = ap.parse_args()
    report(Path(a.sass).read_text() if a.sass else compile_sass(a.case))


if __name__ == "__main__":
    main()
