"""The resource report of a set of kernels, compiled for sm_90a without a GPU: registers, spills,
shared memory, threads, and whether the PTX holds wgmma and TMA instructions.

An op builds the list of its kernels and arguments and hands it to :func:`main` (the GEMM's:
``python -m tilecore.ops.gemm.report``). ``--json`` prints the rows as JSON (the tests read it);
``--ptx DIR`` writes each kernel's PTX. Tiles import nothing of ops: the kernels come from the caller.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Iterable

from tilecore import dispatch

# (name, kernel, arguments by name, num_warps, is_gluon) of one kernel to compile
Variant = tuple[str, object, dict, int, bool]


def rows(variants: Iterable[Variant], ptx_dir: Path | None = None) -> list[dict]:
    """Compile each variant for sm_90a; one row per kernel: its resources (tiles.compile.Resources)
    and which Hopper instructions its PTX holds. ``ptx_dir``: write each kernel's PTX there."""
    from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources

    out = []
    for name, kernel, kargs, num_warps, gluon in variants:
        compiled = compile_kernel(kernel, kargs, num_warps=num_warps)
        ptx = compiled.asm["ptx"]
        out.append(dict(kernel=name, gluon=gluon, **vars(resources(compiled)), **has_hopper_instructions(ptx)))
        if ptx_dir:
            ptx_dir.mkdir(parents=True, exist_ok=True)
            (ptx_dir / (name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")
                        .replace("^", "t") + ".ptx")).write_text(ptx)
    return out


def table(report: list[dict]) -> str:
    """The rows as a text table, under a line naming the target and Triton's version."""
    import triton

    head = ["kernel", "registers", "spills (st/ld B)", "stack B", "shared KiB", "threads", "wgmma", "TMA"]
    body = [[r["kernel"], str(r["registers"]), f"{r['spill_stores']}/{r['spill_loads']}", str(r["stack"]),
             f"{r['shared'] / 1024:.1f}", str(r["threads"]), "yes" if r["wgmma"] else "no",
             "yes" if r["tma"] else "no"] for r in report]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    lines = [f"sm_90a, triton {triton.__version__} (registers: the kernel's cap; warp-specialized partitions "
             "re-balance with setmaxnreg)",
             "  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def main(variants: Callable[[], list[Variant]], argv: list[str] | None = None, *, prog: str,
         description: str = "") -> int:
    """The command: ``variants()`` built and compiled (after the interpreter check), printed as a
    table or, with --json, as JSON. Returns the exit code (2 under Triton's interpreter, whose
    ``triton.jit`` functions cannot be compiled)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--ptx", type=Path, help="write each kernel's PTX into this folder")
    args = parser.parse_args(argv)
    if dispatch.interpreter_enabled():
        print(f"{prog}: unset TRITON_INTERPRET (interpreted kernels cannot be compiled)", file=sys.stderr)
        return 2
    report = rows(variants(), args.ptx)
    print(json.dumps(report, indent=1) if args.json else table(report))
    return 0
