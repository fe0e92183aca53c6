"""Did a change alter the code a kernel emits? Compares two folders of PTX written by
``port_resources.py --ptx DIR`` (one file per variant, e.g. the tree before a refactor and after it),
variant by variant, on this machine (no GPU: triton's own ptxas and cuobjdump):

* PTX: identical once debug information is left out (``.loc``/``.file`` lines, the ``$L__tmp``
  labels they reference, ``.section .debug_*`` blocks and comments), which carry line numbers that
  any edit of the source moves;
* SASS (ptxas -arch=sm_90a, cuobjdump -sass): instruction counts, and whether the two instruction
  sequences are the same up to register names (ptxas may number registers differently when only the
  PTX's line information differs). Read this column too: a new inlined jit call adds ``$L__tmp``
  labels, which split ptxas's blocks and can reorder a kernel's schedule though the PTX compares
  identical (session 28: one attention backward variant).

    python experiments/tiles/port_resources.py --root OLD --only attention --ptx /tmp/ptx_old
    python experiments/tiles/port_resources.py --only attention --ptx /tmp/ptx_new
    python experiments/tiles/ptx_compare.py /tmp/ptx_old /tmp/ptx_new [--json OUT]
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile


def ptx_code(path: str) -> list[str]:
    """The PTX's lines without debug information or comments."""
    lines, in_debug = [], False
    for line in open(path):
        s = line.strip()
        if s.startswith(".section") and ".debug" in s:
            in_debug = True
        if in_debug:
            in_debug = s != "}"
            continue
        if s.startswith((".loc", ".file")) or re.fullmatch(r"\$L__tmp\d+:", s):
            continue
        code = line.split("//")[0].rstrip()
        if code:
            lines.append(code)
    return lines


def _tool(name: str) -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    return os.path.join(os.path.dirname(get_ptxas(90).path), name)


def sass(path: str) -> list[str]:
    """The SASS instructions of a PTX file compiled for sm_90a, addresses and encodings left out."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        subprocess.run([_tool("ptxas"), "-arch=sm_90a", path, "-o", cubin], check=True, capture_output=True)
        out = subprocess.run([_tool("cuobjdump"), "-sass", cubin], check=True, capture_output=True, text=True).stdout
    return [m.group(1).strip() for line in out.splitlines() if (m := re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?);", line))]


def without_registers(instructions: list[str]) -> list[str]:
    return [re.sub(r"\bU?R\d+\b|\bU?P\d\b", "R", i) for i in instructions]


def digest(lines: list[str]) -> str:
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()[:12]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    for name in sorted(set(os.listdir(a.old)) | set(os.listdir(a.new))):
        if not name.endswith(".ptx"):
            continue
        paths = [os.path.join(d, name) for d in (a.old, a.new)]
        if not all(os.path.exists(p) for p in paths):
            rows.append(dict(variant=name[:-4], missing=[p for p in paths if not os.path.exists(p)]))
            continue
        ptx = [ptx_code(p) for p in paths]
        code = [sass(p) for p in paths]
        rows.append(dict(variant=name[:-4], ptx_identical=ptx[0] == ptx[1], ptx=[digest(x) for x in ptx],
                         sass_instructions=[len(x) for x in code], sass_identical=code[0] == code[1],
                         sass_same_up_to_registers=without_registers(code[0]) == without_registers(code[1])))
    print(f"{'variant':44s} {'PTX':9s} {'SASS old -> new':17s} sequence")
    for r in rows:
        if "missing" in r:
            print(f"{r['variant']:44s} missing in {', '.join(r['missing'])}")
            continue
        seq = "identical" if r["sass_identical"] else (
            "same but register names" if r["sass_same_up_to_registers"] else "DIFFERENT")
        print(f"{r['variant']:44s} {'same' if r['ptx_identical'] else 'DIFFERENT':9s} "
              f"{r['sass_instructions'][0]:6d} -> {r['sass_instructions'][1]:6d}  {seq}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r.get("sass_same_up_to_registers") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
