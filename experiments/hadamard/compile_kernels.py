"""Compile issue 32's tl kernels (kernels_kron.kron_kernel, quantize_kernels.rotate_quantize_kernel) for
sm_90a without a GPU, at the configurations their plans pick for the GPU (kron.kernel_plan,
quantize.kernel_plan with 132 SMs), and print registers, spills and shared memory (ptxas -v). A compile
error here is one the GPU run would hit; spills say a tile is too large for the registers.

    python experiments/hadamard/compile_kernels.py [--quick] [--json PATH]     (TRITON_INTERPRET unset)
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.getcwd())
os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402

from tilecore.ops.hadamard import kron, quantize  # noqa: E402
from tilecore.tiles.compile import compile_kernel, resources  # noqa: E402

SMS = 132
ROWS = 1 << 16


def kron_case(m, p, dtype):
    from tilecore.ops.hadamard.kernels_kron import kron_kernel

    plan = kron.kernel_plan(ROWS, m, p, dtype, SMS)
    cfg = dict(plan.config)
    warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
    n = m * p
    x = torch.empty(64, n, dtype=dtype)
    work = torch.empty(64, n, dtype=torch.float32) if plan.path == "two-pass" else x
    h = torch.empty(cfg["M_PAD"], cfg["M_PAD"], dtype=dtype if dtype != torch.float32 else torch.bfloat16)
    args = dict(x=x, out=work, h=h, rows=ROWS, stride_x=n, stride_out=n, scale=0.5, **cfg)
    return plan.path, compile_kernel(kron_kernel, args, num_warps=warps, num_stages=stages)


def quantize_case(fmt, n, dtype, block=None, group=None, static=False):
    from tilecore.ops.hadamard.kernels_kron import kron_kernel  # noqa: F401 (same module set as the op)
    from tilecore.ops.hadamard.quantize_kernels import rotate_quantize_kernel

    f = quantize.FORMATS[fmt]
    group = group if group is not None else f.default_group
    plan = quantize.kernel_plan(ROWS, n, dtype, fmt, group, block, True, static, False, SMS)
    if plan.path != "fused":
        return plan.path, None
    cfg = dict(plan.config)
    warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
    x = torch.empty(64, n, dtype=dtype)
    codes = torch.empty(64, n // 2 if f.packed else n, dtype=torch.uint8)
    scales = torch.empty(64, n // (group or n), dtype=torch.uint8 if fmt in ("mxfp4", "nvfp4") else torch.float32)
    h = torch.empty(cfg["M_PAD"], cfg["M_PAD"], dtype=dtype if dtype != torch.float32 else torch.bfloat16)
    g = torch.empty(1, dtype=torch.float32)
    args = dict(x=x, codes=codes, scales=scales, h=h, signs=x, gscale=g, amax_out=g, rows=ROWS, stride_x=n,
                stride_codes=codes.shape[1], stride_scales=scales.shape[1], rscale=0.5, **cfg)
    return plan.path, compile_kernel(rotate_quantize_kernel, args, num_warps=warps, num_stages=stages)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a few configurations")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    bf16 = torch.bfloat16
    kron_cases = [(12, 64), (12, 1024), (20, 512), (28, 512), (28, 1024), (172, 64), (148, 128), (156, 64), (12, 2048)]
    quant_cases = [("fp8_e4m3", 4096, {}), ("mxfp4", 4096, {}), ("nvfp4", 14336, {}), ("int4", 32768, {}),
                   ("int8", 1024, {}), ("fp8_e4m3", 14336, {"group": 128}), ("mxfp4", 4096, {"block": 32}),
                   ("fp8_e5m2", 11008, {}), ("int4", 4096, {"block": 16})]
    if args.quick:
        kron_cases, quant_cases = kron_cases[:2], quant_cases[:2]
    rows = []
    for m, p in kron_cases:
        t = time.time()
        try:
            path, k = kron_case(m, p, bf16)
            r = resources(k)
            rows.append({"kernel": "kron", "n": f"{m}x{p}", "path": path, **vars(r), "s": round(time.time() - t, 1)})
        except Exception as err:  # noqa: BLE001
            rows.append({"kernel": "kron", "n": f"{m}x{p}", "error": f"{type(err).__name__}: {str(err)[:300]}"})
        print(rows[-1], flush=True)
    for fmt, n, kw in quant_cases:
        t = time.time()
        try:
            path, k = quantize_case(fmt, n, bf16, **kw)
            r = vars(resources(k)) if k is not None else {}
            rows.append({"kernel": "quantize", "format": fmt, "n": n, **kw, "path": path, **r, "s": round(time.time() - t, 1)})
        except Exception as err:  # noqa: BLE001
            rows.append({"kernel": "quantize", "format": fmt, "n": n, **kw, "error": f"{type(err).__name__}: {str(err)[:300]}"})
        print(rows[-1], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
