"""Where a Gluon attention kernel's step time goes, read from the SASS (no GPU: triton's ptxas and cuobjdump):
for each PTX file (``port_resources.py --ptx DIR``), the loops that issue a wgmma (HGMMA) -- a consumer's step
loop -- and in each, the instruction count by opcode (MUFU by function, conversions, float32 ALU, spill loads
and stores, HGMMA), so that two variants (a softcap's and the plain kernel's, say) compare op by op per step.
A loop is the address range from a backward branch's target to the branch; one that holds another is counted
without the inner one's instructions. Printed: the whole kernel's groups and each innermost such loop (a consumer's
step loop, each consumer's copy; a masked path counted once); the JSON has every loop.

    python experiments/attention/step_sass.py --softcap 0,2,3 [--json OUT]     (compiles them itself, ~2 min)
    python experiments/attention/step_sass.py A.ptx B.ptx                       (port_resources.py --ptx's files)

``--softcap MODES``: the D128 causal fixed backward (the shipped config: dQ fused) and the D128 causal dq kernel, each
with those SOFTCAP modes (0 none; 2 tanh.approx with the float16 derivative, the varlen kernels' form; 3 the fixed
kernels' (dK/dV: dP from -delta and, since session 43, y (1 - tanh^2) before P, dS = P y; dq: ds - ds tanh^2)), compiled by the bench report's
helpers (the launchers' arguments); their PTX goes to a temporary folder. Session 41's figures (2 against 3 and the
fold alone, at 786987fb): notes/attention/runs/step_sass_softcap_session41.json.
"""
import argparse
import collections
import json
import os
import pathlib
import re
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tiles"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository root
from wgmma_overlap import sass_of  # noqa: E402

# opcode groups a step's cost reads by: the SFU, the float32 pipe, conversions, spills, the tensor cores
GROUPS = {
    "MUFU": lambda op: op.startswith("MUFU"),
    "FP32 (FADD/FMUL/FFMA/FMNMX/FSEL/FSETP)": lambda op: op.split(".")[0] in ("FADD", "FMUL", "FFMA", "FMNMX",
                                                                              "FSEL", "FSETP", "FCHK"),
    "F16x2 (HADD2/HMUL2/HFMA2)": lambda op: op.split(".")[0] in ("HADD2", "HMUL2", "HFMA2", "HMNMX2"),
    "conversions (F2FP/F2F/I2F/F2I)": lambda op: op.split(".")[0] in ("F2FP", "F2F", "I2F", "F2I", "I2FP"),
    "spills (STL/LDL)": lambda op: op.split(".")[0] in ("STL", "LDL"),
    "shared (LDS/STS/LDSM/STSM)": lambda op: op.split(".")[0] in ("LDS", "STS", "LDSM", "STSM"),
    "MOV/SHFL/PRMT": lambda op: op.split(".")[0] in ("MOV", "SHFL", "PRMT", "UMOV"),
    "integer (IMAD/IADD3/ISETP/LOP3/SHF/LEA/SEL)": lambda op: op.split(".")[0] in (
        "IMAD", "IADD3", "ISETP", "LOP3", "SHF", "LEA", "SEL", "IABS", "IMNMX", "VIADD", "VIMNMX"),
    "HGMMA": lambda op: op.startswith("HGMMA"),
    "barriers / sync": lambda op: op.split(".")[0] in ("SYNCS", "BAR", "WARPGROUP", "DEPBAR", "WARPSYNC"),
}


def opcode(text: str) -> str:
    """The instruction's opcode with its modifiers (a predicate guard left out)."""
    return re.sub(r"^@!?U?P\w+\s+", "", text).split(None, 1)[0]


def loops(ins: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """(first index, last index) of each backward branch's range, innermost first."""
    at = {addr: i for i, (addr, _) in enumerate(ins)}
    found = []
    for i, (addr, text) in enumerate(ins):
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) <= addr and int(m.group(1), 16) in at:
            found.append((at[int(m.group(1), 16)], i))
    return sorted(set(found), key=lambda r: r[1] - r[0])


def step_loops(ins: list[tuple[int, str]]) -> list[dict]:
    """The loops that issue an HGMMA, each with its own instructions' counts (inner loops left out)."""
    rows, ranges = [], loops(ins)
    for n, (first, last) in enumerate(ranges):
        inner = [r for r in ranges[:n] if first <= r[0] and r[1] <= last and r != (first, last)]
        own = [i for i in range(first, last + 1) if not any(a <= i <= b for a, b in inner)]
        ops = collections.Counter(opcode(ins[i][1]) for i in own)
        if not any(op.startswith("HGMMA") for op in ops):
            continue
        groups = {g: sum(c for op, c in ops.items() if test(op)) for g, test in GROUPS.items()}
        mufu = {op: c for op, c in ops.items() if op.startswith("MUFU")}
        rows.append(dict(start=f"{ins[first][0]:#x}", end=f"{ins[last][0]:#x}", instructions=len(own),
                         inner_loops=len(inner), groups=groups, mufu=mufu,
                         top=dict(ops.most_common(24))))
    return rows


def compiled_ptx(modes: list[int], folder: str) -> list[str]:
    """The D128 causal backward's and dq kernel's PTX files for each SOFTCAP mode."""
    os.environ.pop("TRITON_INTERPRET", None)
    from tilecore.bench.reports import attention as report

    paths = []
    for mode in modes:
        for name, compiled in ((f"bwd_d128_fused_causal_softcap{mode}", report.compile_gluon_backward(
                128, True, softcap=mode)[0]), (f"dq_d128_causal_softcap{mode}", report.compile_gluon_dq(
                    128, True, softcap=mode))):
            paths.append(os.path.join(folder, name + ".ptx"))
            with open(paths[-1], "w") as f:
                f.write(compiled.asm["ptx"])
    return paths


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("ptx", nargs="*")
    ap.add_argument("--softcap", help="comma-separated SOFTCAP modes of the D128 causal backward and dq kernel")
    ap.add_argument("--json")
    a = ap.parse_args()
    out = {}
    paths = list(a.ptx)
    if a.softcap:
        paths += compiled_ptx([int(m) for m in a.softcap.split(",")], tempfile.mkdtemp())
    for path in paths:
        ins = sass_of(path)
        name = os.path.basename(path).removesuffix(".ptx")
        ops = collections.Counter(opcode(t) for _, t in ins)
        whole = {g: sum(c for op, c in ops.items() if test(op)) for g, test in GROUPS.items()}
        out[name] = dict(sass=len(ins), groups=whole, loops=step_loops(ins))
        print(f"{name}: {len(ins)} SASS instructions; " + ", ".join(f"{g.split(' ')[0]} {c}" for g, c in whole.items()))
        for r in out[name]["loops"]:
            if r["inner_loops"]:  # (a loop around others: its own counts are the step's tail, printed in the JSON)
                continue
            print(f"  loop {r['start']}-{r['end']}: {r['instructions']} instructions ({r['inner_loops']} inner loops "
                  f"apart); MUFU {r['mufu']}")
            for g, c in r["groups"].items():
                print(f"    {g:46s} {c:5d}")
    if a.json:  # every loop of every kernel, the printed ones and the outer ones
        pathlib.Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
