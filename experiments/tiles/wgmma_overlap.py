"""What a consumer does while its own wgmma is in flight, read from the SASS (no GPU: triton's ptxas and
cuobjdump). For every ``WARPGROUP.DEPBAR.LE gsb0, 0x1`` (a wait that leaves the last wgmma group in
flight: the attention forward's ``warpgroup_mma_wait(1)`` after issuing S = Q K^T and O += P V), counts
the instructions, and the MUFU.EX2 among them, that run before the next ``DEPBAR.LE gsb0, 0x0`` (the
wait for that group), i.e. the work overlapped with the in-flight wgmma; and names the registers the
in-flight group reads as its A operand that are written before that wait would allow (the reason
ptxas moves the wait up).

    python experiments/tiles/port_resources.py --only "attention fwd" --ptx /tmp/ptx
    python experiments/tiles/wgmma_overlap.py /tmp/ptx [--only d128] [--json OUT]

Session 33's reading (notes/distributed/README.md, the napkin's exposed-SFU share; triton 3.6.0's
ptxas): in every forward variant port_resources.py compiles, the wait for P V comes before the first
exponential (0 EX2 overlapped, 66 a step after it at 128 keys, 34 at 64), though the PTX waits after
them: FlashAttention-3's intra-warpgroup overlap is not in the SASS. In the plain variants (d64, d128,
d128 Q regs, causal) the new P is packed (F2FP) into the very registers the in-flight P V reads as its A
operand (32 writes a step); the carried variants wait early at sites without such writes too, and so do
fwd_overlap_variants.py's double-buffered P sites: the reuse is not ptxas's only reason.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ptx_compare import _tool  # noqa: E402


def sass_of(ptx_path: str) -> list[tuple[int, str]]:
    """(address, instruction) of the PTX compiled for sm_90a."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        subprocess.run([_tool("ptxas"), "-arch=sm_90a", ptx_path, "-o", cubin], check=True, capture_output=True)
        out = subprocess.run([_tool("cuobjdump"), "-sass", cubin], check=True, capture_output=True, text=True).stdout
    return [(int(m.group(1), 16), m.group(2).strip()) for line in out.splitlines()
            if (m := re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line))]


def registers(operand: str, width: int) -> set[int]:
    """The registers an operand names: R<n> and the ``width`` - 1 after it (a vector operand)."""
    m = re.fullmatch(r"R(\d+)", operand.strip())
    return set(range(int(m.group(1)), int(m.group(1)) + width)) if m else set()


def a_operand_registers(group: list[str]) -> set[int]:
    """Registers read as the A operand by a group of HGMMA (A from registers: the second operand is
    R<n>, 4 registers for m64nNk16 16-bit: each thread's 8 elements packed by two)."""
    regs = set()
    for t in group:
        parts = [p.strip() for p in t.split(None, 1)[1].split(",")] if " " in t else []
        if len(parts) > 1:
            regs |= registers(parts[1], 4)
    return regs


def overlaps(ins: list[tuple[int, str]]) -> list[dict]:
    """One row per DEPBAR.LE gsb0, 0x1."""
    rows = []
    for i, (addr, text) in enumerate(ins):
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" not in text:
            continue
        # the in-flight group: the HGMMA after the last WARPGROUP.ARRIVE before this wait
        arrive = max((j for j in range(i) if "WARPGROUP.ARRIVE" in ins[j][1]), default=None)
        group = [t for _, t in ins[arrive + 1:i] if "HGMMA" in t] if arrive is not None else []
        a_regs = a_operand_registers(group)
        between, ex2_between, ex2_after, written = 0, 0, 0, []
        waited = False
        for addr2, t2 in ins[i + 1:]:
            if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in t2:
                if waited:
                    break
                waited = True
                continue
            if "WARPGROUP.ARRIVE" in t2 and waited:
                break
            if not waited:
                between += 1
                ex2_between += "MUFU.EX2" in t2
            else:
                ex2_after += "MUFU.EX2" in t2
                dest = re.sub(r"^@!?U?P\w+\s+", "", t2).split(None, 1)
                if len(dest) == 2 and registers(dest[1].split(",")[0], 1) & a_regs and "HGMMA" not in dest[0]:
                    written.append(f"{addr2:#x} {dest[0]} {dest[1].split(',')[0]}")
        rows.append(dict(wait1=f"{addr:#x}", in_flight_hgmma=len(group), a_from_registers=bool(a_regs),
                         instructions_overlapped=between, ex2_overlapped=ex2_between, ex2_after_wait0=ex2_after,
                         a_registers_written_after_wait0=written[:4], a_writes=len(written)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ptx_dir")
    ap.add_argument("--only", default="")
    ap.add_argument("--json")
    a = ap.parse_args()
    report = {}
    for name in sorted(os.listdir(a.ptx_dir)):
        if not name.endswith(".ptx") or a.only not in name:
            continue
        rows = overlaps(sass_of(os.path.join(a.ptx_dir, name)))
        report[name[:-4]] = rows
        for r in rows:
            print(f"{name[:-4]:<44} wait(1) {r['wait1']:>7}: {r['in_flight_hgmma']} HGMMA in flight "
                  f"(A {'registers' if r['a_from_registers'] else 'shared'}), overlapped {r['instructions_overlapped']} "
                  f"instr / {r['ex2_overlapped']} EX2; after its wait {r['ex2_after_wait0']} EX2, "
                  f"{r['a_writes']} writes of its A registers")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
