"""Compile the Hadamard kernel for sm_90a on any machine (no GPU needed) and print, for each n and
dtype, its shared memory, registers and spills, and whether the PTX uses wgmma or mma.sync.

    python scripts/hadamard_resources.py [n ...]
"""
import re
import subprocess
import sys
import tempfile

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from tilecore.ops.hadamard import kernels

TARGET = GPUTarget("cuda", 90, 32)


def compile_for(n: int, dtype: torch.dtype, **tuning):
    fp32 = dtype == torch.float32
    cfg = kernels.config(n, fp32=fp32, **tuning)
    ptr = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32"}[dtype]
    mma = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.bfloat16}[dtype]
    constexprs = {"N": n, "S": cfg["S"], "N1": cfg["N1"], "N2": cfg["N2"], "B": cfg["B"],
                  "IN_PIECES": 3 if fp32 else 1, "MID_PIECES": 3 if fp32 else 2, "MMA_DTYPE": mma, "PIECE_DTYPE": tl.bfloat16,
                  "GRID": 132 * cfg["waves"]}
    signature = {"x_ptr": ptr, "out_ptr": ptr, "rows": "i32", "stride_x": "i32", "stride_out": "i32", "scale": "fp32"}
    signature.update({k: "constexpr" for k in constexprs})
    # As the launcher specializes them on the GPU: 16-byte aligned pointers and strides divisible by 16
    # (this is what lets Triton pipeline the loads through shared memory).
    attrs = {(k,): [["tt.divisibility", 16]] for k in (0, 1, 3, 4)}
    src = triton.compiler.ASTSource(fn=kernels.hadamard_kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=TARGET, options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})


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


def main(ns):
    print(f"{'dtype':9s} {'n':>6s} {'smem KB':>8s} {'regs':>5s} {'spill':>6s} mma")
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for n in ns:
            try:
                k = compile_for(n, dtype)
            except Exception as e:  # noqa: BLE001
                print(f"{str(dtype)[6:]:9s} {n:6d} compile error: {str(e).splitlines()[0][:90]}")
                continue
            ptx = k.asm["ptx"]
            regs, spills = ptxas_report(ptx)
            kind = "wgmma" if "wgmma" in ptx else ("mma.sync" if "mma.sync" in ptx else "none")
            print(f"{str(dtype)[6:]:9s} {n:6d} {k.metadata.shared / 1024:8.1f} {regs:5d} {spills:6d} {kind}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or sorted(kernels.PLANS))
