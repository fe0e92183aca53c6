"""Why a one-row-a-block Hadamard kernel runs far below copy at small n (issue 36, part 3: "Dao's kernel at 29% of
copy"): the launch geometry alone, measured.

Dao's fast-hadamard-transform cannot be built on the device (notes/napkin/README.md's decision log: none of its PyPI
sdists, 1.0.0.post1 to 1.1.0, holds its csrc/; its setup.py fetches a prebuilt wheel from GitHub, which the device
cannot reach). Its launch geometry is public: one block a row (grid = rows), 16 threads a block at n = 128, 32 at
256 and 512, 128 at 1024, 256 from 2048. This script runs a copy with that geometry (one row a program, the same
bytes a block; Triton's smallest block is one warp, so 32 threads at n = 128), the same copy with 2-8 rows a
program, and programs that do nothing (2^20 and 2^21 of them: the blocks of n = 256 and 128) beside torch's copy of
the same 2^28 bf16 elements. If the empty grid takes as long as the copy at n = 128, the SMs' block turnover, not
memory, bounds it: the figure is ns a block an SM.

    python experiments/napkin/gpu_launch_geometry.py [--smoke] [--deadline 100]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from experiments.common.gpu_script import Run, check, poisoned, time_rounds  # noqa: E402

ELEMENTS = 2**28


def dao_threads(n: int) -> int:
    """Threads a block of Dao's kernel at n (its launch table, read from its source)."""
    log = n.bit_length() - 1
    return {7: 16, 8: 32, 9: 32, 10: 128}.get(log, 256 if log >= 11 else max(1, n // 8))


@triton.jit
def rows_copy_kernel(x_ptr, y_ptr, n, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * ROWS * n
    offs = tl.arange(0, BLOCK)
    for r in tl.static_range(ROWS):
        v = tl.load(x_ptr + base + r * n + offs)
        tl.store(y_ptr + base + r * n + offs, v)


@triton.jit
def nothing_kernel(y_ptr, flag):
    if flag != 0:  # never true: the block starts and retires, nothing else
        tl.store(y_ptr + tl.program_id(0), 0.0)


def rows_copy(x, y, n, rows_per_program, warps):
    rows = x.numel() // n
    rows_copy_kernel[(rows // rows_per_program,)](x, y, n, ROWS=rows_per_program, BLOCK=n, num_warps=warps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="CPU / interpreter: the checks on a tiny size, no timing")
    ap.add_argument("--deadline", type=float, default=100.0)
    args = ap.parse_args(argv)
    run = Run("napkin_launch_geometry", deadline=args.deadline)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    elements = 2**14 if args.smoke else ELEMENTS
    x = torch.randn(elements, dtype=torch.bfloat16, device=dev)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if dev == "cuda" else 132
    run.extra["settings"] = {"elements": elements, "dtype": "bf16", "sms": sms}

    variants = []  # (name, n, rows a program, warps)
    for n in [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]:
        warps = max(1, dao_threads(n) // 32)
        variants.append((f"dao-geom n{n}", n, 1, warps))
        if n <= 1024:
            for rpp in (2, 4, 8):
                variants.append((f"n{n} rows{rpp}", n, rpp, warps))
    if args.smoke:
        variants = [v for v in variants if v[1] <= 512 and v[2] <= 2]

    y_copy = torch.empty_like(x)
    for name, n, rpp, warps in variants:
        if run.left() <= 5:
            run.errors.append(f"deadline: {name} and later not run")
            break
        y = poisoned(x)
        run.attempt(name, rows_copy, x, y, n, rpp, warps)
        res = check(y, x.double(), tol=0.0)
        if not res["pass"]:
            run.row(name, n=n, rows_per_program=rpp, warps=warps, **res)
            continue
        fields = dict(n=n, rows_per_program=rpp, warps=warps, blocks=elements // n // rpp, **res)
        if not args.smoke:
            t = time_rounds({"probe": lambda: rows_copy(x, y, n, rpp, warps), "copy": lambda: y_copy.copy_(x)},
                            rounds=3, warmup=5, rep=30, deadline=run)
            blocks = elements // n // rpp
            fields.update(probe_ms=t["probe_ms"], copy_ms=t["copy_ms"], of_copy=round(t["copy_ms"] / t["probe_ms"], 4),
                          ns_per_block_per_sm=round(t["probe_ms"] * 1e6 / (blocks / sms), 2),
                          rounds=t["probe_rounds"])
        run.row(name, **fields)

    if not args.smoke:
        sink = torch.empty(1, dtype=torch.float32, device=dev)
        for blocks in (2**21, 2**20, 2**19):
            for warps in (1, 4):
                fn = (lambda b=blocks, w=warps: nothing_kernel[(b,)](sink, 0, num_warps=w))
                t = time_rounds({"nothing": fn}, rounds=3, warmup=5, rep=30)
                run.row(f"nothing {blocks} blocks w{warps}", blocks=blocks, warps=warps, probe_ms=t["nothing_ms"],
                        ns_per_block_per_sm=round(t["nothing_ms"] * 1e6 / (blocks / sms), 2),
                        rounds=t["nothing_rounds"])
    run.finish(["name", "pass", "warps", "blocks", "probe_ms", "copy_ms", "of_copy", "ns_per_block_per_sm"])
    return 0 if not run.errors and all(r.get("pass", True) for r in run.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
