"""``python -m tilecore.tiles.report``: compile each GEMM kernel for sm_90a (no GPU needed) and print
its registers, spills, shared memory, and whether its PTX holds wgmma and TMA instructions.

``--json`` prints the same as JSON (the tests read it); ``--ptx DIR`` writes each kernel's PTX.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def gemm_variants() -> list[tuple[str, object, dict, int, bool]]:
    """(name, kernel, args, num_warps, is_gluon) for every GEMM kernel tilecore launches."""
    import torch

    from tilecore.ops.gemm import gluon_kernels, kernels, launch
    from tilecore.tiles.launch import gluon_descriptor as desc

    out = []
    for name, dtype, cfg, b_t, scales, stream_k in (
        ("gemm bf16 (gluon)", torch.bfloat16, launch.GLUON_BF16, False, 0, False),
        ("gemm bf16, stream-K tail (gluon)", torch.bfloat16, launch.GLUON_BF16, False, 0, True),
        ("gemm bf16, small K (gluon)", torch.bfloat16, launch.GLUON_BF16_SMALL_K, False, 0, False),
        ("gemm bf16, B^T (gluon)", torch.bfloat16, launch.GLUON_BF16, True, 0, True),
        ("gemm fp16 (gluon)", torch.float16, launch.GLUON_BF16, False, 0, True),
        ("gemm bf16, fp32 out (gluon)", torch.bfloat16, launch.GLUON_BF16, False, -1, True),
        ("gemm_fp8 row scales (gluon)", torch.float8_e4m3fn, launch.GLUON_FP8, True, 4, True),
    ):
        BM, BN, BK = cfg["block"]
        consumers = cfg.get("consumers", 1)
        x = torch.empty(256, 256, dtype=dtype)
        c = torch.empty(256, 256, dtype=torch.float32 if scales < 0 else torch.bfloat16 if scales else dtype)
        scales = max(scales, 0)
        f32 = torch.empty(256)
        args = dict(a_desc=desc(x, [BM, BK]), b_desc=desc(x, [BN, BK] if b_t else [BK, BN]),
                    c_desc=desc(c, [BM // consumers, min(BN, cfg["epilogue_bytes"] // (BM * c.element_size()))]),
                    M=256, N=256, K=256, bias_ptr=c if not scales else f32,
                    scale_a_ptr=f32, scale_b_ptr=f32, workspace=f32, flags=torch.empty(8, dtype=torch.int32),
                    num_units=4, B_T=b_t, GROUP_M=cfg["group_m"], HAS_BIAS=not scales,
                    SCALES=scales, STAGES=cfg["stages"], CONSUMERS=consumers, STREAM_K=stream_k)
        out.append((name, gluon_kernels.gemm_kernel, args, cfg["num_warps"] // consumers, True))
    cfg = launch.TL_GPU
    BM, BN, BK = cfg["block"]
    f32 = torch.empty(256)
    x = torch.empty(256, 256, dtype=torch.bfloat16)
    args = dict(a=x, b=x, c=x, bias=x, scale_a=x, scale_b=x, M=256, N=256, K=256, stride_am=256,
                stride_ak=1, stride_bk=256, stride_bn=1, stride_cm=256, stride_cn=1, workspace=f32,
                flags=torch.empty(8, dtype=torch.int32), num_units=4, BM=BM, BN=BN, BK=BK,
                GROUP_M=cfg["group_m"], HAS_BIAS=True, SCALES=0, STAGES=cfg["stages"], STREAM_K=False)
    out.append(("gemm bf16 (tl twin)", kernels.gemm_kernel, args, cfg["num_warps"], False))
    out.append(("gemm bf16, stream-K tail (tl twin)", kernels.gemm_kernel, dict(args, STREAM_K=True),
                cfg["num_warps"], False))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tilecore.tiles.report", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--ptx", type=Path, help="write each kernel's PTX into this folder")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("tilecore.tiles.report: unset TRITON_INTERPRET (interpreted kernels cannot be compiled)",
              file=sys.stderr)
        return 2
    from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources

    rows = []
    for name, kernel, kargs, num_warps, gluon in gemm_variants():
        compiled = compile_kernel(kernel, kargs, num_warps=num_warps)
        ptx = compiled.asm["ptx"]
        r = resources(compiled)
        rows.append(dict(kernel=name, gluon=gluon, **vars(r), **has_hopper_instructions(ptx)))
        if args.ptx:
            args.ptx.mkdir(parents=True, exist_ok=True)
            (args.ptx / (name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")
                         .replace("^", "t") + ".ptx")).write_text(ptx)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    head = ["kernel", "registers", "spills (st/ld B)", "stack B", "shared KiB", "threads", "wgmma", "TMA"]
    body = [[r["kernel"], str(r["registers"]), f"{r['spill_stores']}/{r['spill_loads']}", str(r["stack"]),
             f"{r['shared'] / 1024:.1f}", str(r["threads"]), "yes" if r["wgmma"] else "no",
             "yes" if r["tma"] else "no"] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    print("sm_90a, triton", __import__("triton").__version__, "(registers: the kernel's cap; warp-specialized "
          "partitions re-balance with setmaxnreg)")
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    for b in body:
        print("  ".join(c.ljust(w) for c, w in zip(b, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
