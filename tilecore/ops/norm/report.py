"""``python -m tilecore.ops.norm.report``: compile the norm's kernels for sm_90a (no GPU needed) at the
plans of the widths issue 37 times (1024, 4096, 8192 whole rows; 65536 in column blocks) and print
their registers and spills (tilecore.tiles.report's table). ``--json``: the same as JSON (tests read it).
"""
from __future__ import annotations

import sys

H100_SMS = 132
# (rows, n) the plans are made for
SHAPES = ((65536, 1024), (65536, 4096), (8192, 8192), (64, 65536))


def norm_variants(shapes=SHAPES) -> list[tuple[str, object, dict, int, bool]]:
    """(name, kernel, args, num_warps, is_gluon) for each kernel at each shape, LayerNorm with a residual,
    dropout and the residual stream stored (the most live values), and RMSNorm without them."""
    import torch
    import triton.language as tl

    from tilecore.ops.norm import backward, forward
    from tilecore.ops.norm.plan import tl_plan

    t = torch.empty(64, dtype=torch.bfloat16)
    f32 = torch.empty(64, dtype=torch.float32)
    seed = torch.empty(1, dtype=torch.int64)
    out = []
    for rows, n in shapes:
        p = tl_plan(rows, n, H100_SMS)
        for label, rms, fused in (("layer, residual, dropout", False, True), ("rms", True, False)):
            res = t if fused else None
            common = dict(ROWS=p.rows_per_tile, BLOCK_N=p.block_n, HAS_RES=fused, DROPOUT=fused, RMS=rms,
                          H_DTYPE=tl.bfloat16, rows=rows, N=n, stride_x=n, stride_res=n if fused else 0,
                          p16=6554, scale=1 / 0.9, SEED=seed if fused else None)
            fwd = dict(common, X=t, RES=res, W=t, B=None if rms else t, Y=t, H=t if fused else None,
                       MEAN=None if rms else f32, RSTD=f32, stride_y=n, stride_h=n if fused else 0, eps=1e-5,
                       WHOLE_ROW=p.whole_row, HAS_W=True, HAS_B=not rms, STORE_H=fused)
            name = f"{label} {rows}x{n}"
            out.append((f"forward {name}", forward.norm_forward_kernel, fwd, p.num_warps, False))
            if not p.whole_row:
                stats = dict(common, X=t, RES=res, MEAN=None if rms else f32, RSTD=f32, eps=1e-5)
                out.append((f"stats {name}", forward.norm_stats_kernel, stats, p.num_warps, False))
            bwd_common = dict(common, ROWS=p.backward_rows, DY=t, X=None if fused else t, RES=None, H=t if fused else None, W=t,
                              MEAN=None if rms else f32, RSTD=f32, stride_dy=n, stride_h=n if fused else 0,
                              LOAD_H=fused, HAS_W=True, HAS_RES=False)
            bwd = dict(bwd_common, SUMS=None if p.whole_row else f32, DH_OUT=t if fused else None, DX=t,
                       DRES=t if fused else None, DW_PART=f32, DB_PART=None if rms else f32,
                       stride_dh_out=n if fused else 0, stride_dx=n, stride_dres=n if fused else 0,
                       WHOLE_ROW=p.whole_row, HAS_DH_OUT=fused, STORE_DRES=fused, DW=True, DB=not rms)
            out.append((f"backward {name}", backward.norm_backward_kernel, bwd, p.backward_warps, False))
            if not p.whole_row:
                sums = dict(bwd_common, SUMS=f32)
                out.append((f"row sums {name}", backward.norm_row_sums_kernel, sums, p.backward_warps, False))
        if p.finish == "kernel":
            out.append((f"partials {rows}x{n}", backward.norm_partials_kernel,
                        dict(DW_PART=f32, DB_PART=f32, DW_OUT=t, DB_OUT=t, groups=p.groups, N=n, BLOCK_G=p.finish_rows,
                             BLOCK_C=p.finish_cols, DW=True, DB=True), 4, False))
    return out


def main(argv=None) -> int:
    from tilecore.tiles import report

    return report.main(norm_variants, argv, prog="python -m tilecore.ops.norm.report",
                       description=__doc__.split("\n")[0])


if __name__ == "__main__":
    sys.exit(main())
