"""Dump the PTX of the norm's kernels (tilecore.ops.norm.report's variants: the shipped plans at issue 37's
widths) into a folder, one file a variant, for experiments/tiles/ptx_compare.py (no GPU: sm_90a on the CPU).

    python experiments/norm_rotary/ptx_dump.py /tmp/ptx_norm_before
    (edit)
    python experiments/norm_rotary/ptx_dump.py /tmp/ptx_norm_after
    python experiments/tiles/ptx_compare.py /tmp/ptx_norm_before /tmp/ptx_norm_after
"""
import os
import re
import sys

from tilecore.ops.norm.report import norm_variants
from tilecore.tiles.compile import compile_kernel, resources

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def main(folder: str) -> int:
    os.makedirs(folder, exist_ok=True)
    for name, kernel, args, warps, _ in norm_variants():
        params = {p.name for p in kernel.params}
        compiled = compile_kernel(kernel, {k: v for k, v in args.items() if k in params}, num_warps=warps)
        r = resources(compiled)
        print(f"{name}: {r.registers} registers, {r.spill_stores + r.spill_loads} spill", flush=True)
        with open(os.path.join(folder, re.sub(r"[^A-Za-z0-9]+", "_", name) + ".ptx"), "w") as f:
            f.write(compiled.asm["ptx"].replace(ROOT + os.sep, ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
