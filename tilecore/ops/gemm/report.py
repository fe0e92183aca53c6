"""``python -m tilecore.ops.gemm.report``: compile each GEMM kernel for sm_90a (no GPU needed) and print
its registers, spills, shared memory, and whether its PTX holds wgmma and TMA instructions
(tilecore.tiles.report's table).

``--json`` prints the same as JSON (the tests read it); ``--ptx DIR`` writes each kernel's PTX.
"""
from __future__ import annotations

import sys


def gemm_variants() -> list[tuple[str, object, dict, int, bool]]:
    """(name, kernel, args, num_warps, is_gluon) for every GEMM kernel tilecore launches."""
    import torch

    from tilecore.ops.gemm import configs, gluon_kernels, kernels
    from tilecore.tiles.launch import gluon_descriptor as desc

    out = []
    for name, dtype, cfg, b_t, scales, stream_k in (
        ("gemm bf16 (gluon)", torch.bfloat16, configs.GLUON_BF16, False, 0, False),
        ("gemm bf16, stream-K tail (gluon)", torch.bfloat16, configs.GLUON_BF16, False, 0, True),
        ("gemm bf16, small K (gluon)", torch.bfloat16, configs.GLUON_BF16_SMALL_K, False, 0, False),
        ("gemm bf16, B^T (gluon)", torch.bfloat16, configs.GLUON_BF16, True, 0, True),
        ("gemm fp16 (gluon)", torch.float16, configs.GLUON_BF16, False, 0, True),
        ("gemm bf16, fp32 out (gluon)", torch.bfloat16, configs.GLUON_BF16, False, -1, True),
        ("gemm_fp8 row scales (gluon)", torch.float8_e4m3fn, configs.GLUON_FP8, True, 4, True),
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
    cfg = configs.TL_GPU
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
    from tilecore.tiles import report

    return report.main(gemm_variants, argv, prog="python -m tilecore.ops.gemm.report",
                       description=__doc__.split("\n")[0])


if __name__ == "__main__":
    sys.exit(main())
