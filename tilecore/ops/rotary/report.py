"""``python -m tilecore.ops.rotary.report``: compile the rotary kernel for sm_90a (no GPU needed) at
Llama's shapes (32 heads of 128, all rotated; 8 heads with half rotated, the rest passed through),
both layouts, and print its registers and spills (tilecore.tiles.report's table)."""
from __future__ import annotations

import sys

# (heads, head_dim, rotary pairs)
SHAPES = ((32, 128, 64), (8, 128, 32))


def rotary_variants(shapes=SHAPES) -> list[tuple[str, object, dict, int, bool]]:
    import torch

    from tilecore.ops.rotary import kernels
    from tilecore.ops.rotary.plan import tl_plan

    t = torch.empty(64, dtype=torch.bfloat16)
    pos = torch.empty(64, dtype=torch.int64)
    out = []
    for heads, d, pairs in shapes:
        p = tl_plan(16, 4096, heads, d, pairs)
        for interleaved in (False, True):
            for has_pos in (False, True):
                args = dict(X=t, COS=t, SIN=t, POS=pos if has_pos else None, OUT=t, seqlen=4096, heads=heads,
                            n_max=4096, stride_xb=4096 * heads * d, stride_xn=heads * d, stride_xh=d,
                            stride_ob=4096 * heads * d, stride_on=heads * d, stride_oh=d, stride_cos=pairs,
                            stride_sin=pairs, stride_pb=4096 if has_pos else 0, stride_pn=1 if has_pos else 0,
                            R=pairs, BLOCK_R=p.block_r, BLOCK_H=p.block_h, PASS=d - 2 * pairs,
                            BLOCK_PASS=p.block_pass, INTERLEAVED=interleaved, CONJUGATE=False, HAS_POS=has_pos)
                name = (f"rotary H{heads} D{d} R{pairs} {'interleaved' if interleaved else 'half'}"
                        f"{', position_ids' if has_pos else ''}")
                out.append((name, kernels.rotary_kernel, args, p.num_warps, False))
    return out


def main(argv=None) -> int:
    from tilecore.tiles import report

    return report.main(rotary_variants, argv, prog="python -m tilecore.ops.rotary.report",
                       description=__doc__.split("\n")[0])


if __name__ == "__main__":
    sys.exit(main())
