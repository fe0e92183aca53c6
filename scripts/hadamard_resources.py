"""Compile the Hadamard kernel for sm_90a on any machine (no GPU needed) and print, for each n,
dtype and path (pointer loads/stores, TMA descriptors, or the Gluon kernel for n in GLUON_SIZES), its shared memory, registers and spills,
whether the PTX uses wgmma or mma.sync, and how many bulk tensor copies (cp.async.bulk.tensor) it holds.

    python scripts/hadamard_resources.py [--json] [fp16|bf16|fp32 ...] [n ...]
"""
import json
import re
import subprocess
import sys
import tempfile

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from tilecore.ops.hadamard import configs, kernels, launch, plan
from tilecore.tiles.compile import resources

TARGET = GPUTarget("cuda", 90, 32)


def compile_for(n: int, dtype: torch.dtype, tma=None, **tuning):
    """``tma``: which side goes through TMA descriptors, as plan.plan takes it ("none", "load",
    "store", "both"; None: the default dispatch for n and dtype)."""
    fp32 = dtype == torch.float32
    tma_load, tma_store, tuning = plan.tma_sides(n, fp32, tma, tuning)
    cfg = plan.tl_config(n, fp32=fp32, **tuning)
    ptr = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32"}[dtype]
    desc = f"tensordesc<{ptr[1:]}[{cfg['B']}, {cfg['N1']}, {cfg['N2']}]>"  # what launch's descriptors pass
    mma = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.bfloat16}[dtype]
    constexprs = {"N": n, "S": cfg["S"], "N1": cfg["N1"], "N2": cfg["N2"], "B": cfg["B"],
                  "IN_PIECES": 3 if fp32 else 1, "MID_PIECES": 3 if fp32 else 2, "MMA_DTYPE": mma, "PIECE_DTYPE": tl.bfloat16,
                  "GRID": 132 * cfg["waves"], "TMA_LOAD": tma_load, "TMA_STORE": tma_store}
    signature = {"x": desc if tma_load else ptr, "out": desc if tma_store else ptr,
                 "rows": "i32", "stride_x": "i32", "stride_out": "i32", "scale": "fp32"}
    signature.update({k: "constexpr" for k in constexprs})
    # As the launcher specializes them on the GPU: 16-byte aligned pointers and strides divisible by 16
    # (this is what lets Triton pipeline the loads through shared memory).
    pointers = [i for i, on_tma in ((0, tma_load), (1, tma_store)) if not on_tma]
    attrs = {(k,): [["tt.divisibility", 16]] for k in pointers + [3, 4]}
    src = triton.compiler.ASTSource(fn=kernels.hadamard_kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=TARGET, options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})


def compile_gluon(n: int, dtype: torch.dtype, stages: int | None = None):
    """Hopper's Gluon kernel (gluon_kernels.py) for n in configs.GLUON_SIZES, as launch.launch builds it."""
    from tilecore.ops.hadamard.gluon_kernels import hadamard_gluon_kernel
    from tilecore.tiles.compile import compile_kernel

    x = torch.empty(64, n, dtype=dtype)
    tuned_stages, lookahead = configs.GLUON_TUNING.get(n, (configs.GLUON_STAGES, 0))
    args = launch.gluon_args(x, x, 0.5, stages or tuned_stages, lookahead if stages is None else 0)
    return compile_kernel(hadamard_gluon_kernel, args, num_warps=4)


def ptxas_report(ptx: str) -> tuple[int, int]:
    """(registers, spill bytes) from ptxas -v, which ships with triton and needs no GPU."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        out = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"],
                             capture_output=True, text=True).stderr
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    spills = sum(int(v) for v in re.findall(r"(\d+) bytes spill stores", out))
    return regs, spills


def report(ns, dtypes=(torch.float16, torch.bfloat16, torch.float32)) -> list[dict]:
    """One record per n, dtype and path: pointers, TMA both ways (n >= 16), and the default dispatch
    where it differs from both (configs.TMA_TUNING)."""
    rows = []
    for dtype in dtypes:
        for n in ns:
            paths = ["none", "both"] if n >= 16 else ["none"]
            if dtype != torch.float32 and n in configs.TMA_TUNING:
                paths.append(None)  # the default dispatch: TMA with its own tuning
            if dtype != torch.float32 and n in configs.GLUON_SIZES:
                paths.append("gluon")
            for tma in paths:
                path = {"none": "pointer", "both": "tma", "gluon": "gluon"}.get(tma) or f"default:{configs.TMA_TUNING[n][0]}"
                rec = {"dtype": str(dtype)[6:], "n": n, "path": path}
                try:
                    k = compile_gluon(n, dtype) if tma == "gluon" else compile_for(n, dtype, tma=tma)
                except Exception as e:  # noqa: BLE001
                    rows.append({**rec, "error": str(e).splitlines()[0][:200]})
                    continue
                ptx = k.asm["ptx"]
                regs, spills = ptxas_report(ptx)
                rows.append({**rec, "shared": k.metadata.shared, "registers": regs, "spill": spills,
                             "mma": "wgmma" if "wgmma" in ptx else ("mma.sync" if "mma.sync" in ptx else "none"),
                             "bulk_copies": ptx.count("cp.async.bulk.tensor"),
                             "warp_specialized": "setmaxnreg" in ptx,
                             "wgmma_serialized": resources(k).wgmma_serialized if tma == "gluon" else None})
    return rows


DTYPE_NAMES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def main(argv):
    as_json = "--json" in argv
    dtypes = tuple(DTYPE_NAMES[a] for a in argv if a in DTYPE_NAMES) or tuple(DTYPE_NAMES.values())
    ns = [int(a) for a in argv if a.isdigit()] or sorted(configs.SPLITS)
    rows = report(ns, dtypes)
    if as_json:
        print(json.dumps(rows))
        return
    print(f"{'dtype':9s} {'n':>6s} {'path':>13s} {'smem KB':>8s} {'regs':>5s} {'spill':>6s} mma      bulk copies")
    for r in rows:
        head = f"{r['dtype']:9s} {r['n']:6d} {r['path']:>13s}"
        if "error" in r:
            print(f"{head} compile error: {r['error'][:90]}")
        else:
            print(f"{head} {r['shared'] / 1024:8.1f} {r['registers']:5d} {r['spill']:6d} {r['mma']:8s} {r['bulk_copies']}")


if __name__ == "__main__":
    main(sys.argv[1:])
