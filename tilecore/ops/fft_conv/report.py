"""``python -m tilecore.ops.fft_conv.report``: compile the Monarch kernel for sm_90a (no GPU needed) at
every N it serves and print registers, spills and shared memory (tilecore.tiles.report's table)."""
from __future__ import annotations

import sys


def fft_conv_variants() -> list[tuple[str, object, dict, int, bool]]:
    import torch

    from tilecore.ops.fft_conv import configs, kernels

    t = torch.empty(64, dtype=torch.bfloat16)
    f32 = torch.empty(64, dtype=torch.float32)
    out = []
    for n, (n1, n2) in configs.TL_FACTORS.items():  # (what the plans ship; 2048's 64 x 64 spills)
        args = dict(U=t, KRE=f32, KIM=f32, Y=t, F1RE=f32, F1IM=f32, F2RE=f32, F2IM=f32, TWRE=f32, TWIM=f32,
                    heads=768, stride_ub=768 * n, stride_uh=n, stride_yb=768 * n, stride_yh=n, stride_kh=n1 * n2,
                    N1=n1, N2=n2, PRECISION=configs.TL_PRECISION)
        out.append((f"fft_conv N{n} ({n1}x{n2})", kernels.fft_conv_kernel, args, configs.TL_WARPS[n], False))
    return out


def main(argv=None) -> int:
    from tilecore.tiles import report

    return report.main(fft_conv_variants, argv, prog="python -m tilecore.ops.fft_conv.report",
                       description=__doc__.split("\n")[0])


if __name__ == "__main__":
    sys.exit(main())
