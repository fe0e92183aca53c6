"""The norm's kernels compile for sm_90a on this (GPU-less) machine without spilling registers: the
whole-row forward and backward at 65536 x 4096 and the wide path's statistics and row sums at
64 x 65536 (LayerNorm with a residual, dropout and the residual stream stored: the most live values).
python -m tilecore.ops.norm.report compiles every shape and variant."""
from compiled_run import compiled_json

CODE = """
import json
from tilecore.ops.norm.report import norm_variants
from tilecore.tiles.report import rows
keep = ("forward layer, residual, dropout 65536x4096", "backward layer, residual, dropout 65536x4096",
        "stats layer, residual, dropout 64x65536", "row sums layer, residual, dropout 64x65536")
print(json.dumps(rows([v for v in norm_variants(((65536, 4096), (64, 65536))) if v[0] in keep])))
"""


def test_compiles_for_hopper_without_spills():
    report = compiled_json(CODE, timeout=600)
    assert len(report) == 4
    for row in report:
        assert row["spill_stores"] == 0 and row["spill_loads"] == 0 and row["stack"] == 0, row


FUSED_1024 = """
import json
import torch
import triton.language as tl
from tilecore.ops.norm import backward, configs
from tilecore.tiles.compile import compile_kernel, resources
t, f32 = torch.empty(64, dtype=torch.bfloat16), torch.empty(64, dtype=torch.float32)
n = 1024
tile, warps, groups = configs.FUSED_BACKWARD[n]
args = dict(DY=t, X=None, RES=None, H=t, W=t, MEAN=f32, RSTD=f32, SUMS=None, SEED=torch.empty(1, dtype=torch.int64),
            DH_OUT=t, DX=t, DRES=t, DW_PART=f32, DB_PART=f32, rows=65536, N=n, stride_dy=n, stride_x=0, stride_res=0,
            stride_h=n, stride_dh_out=n, stride_dx=n, stride_dres=n, p16=6554, scale=1 / 0.9, ROWS=tile // n, BLOCK_N=n,
            WHOLE_ROW=True, LOAD_H=True, HAS_RES=False, HAS_W=True, DROPOUT=True, RMS=False, HAS_DH_OUT=True,
            STORE_DRES=True, DW=True, DB=True, H_DTYPE=tl.bfloat16)
r = resources(compile_kernel(backward.norm_backward_kernel, args, num_warps=warps))
print(json.dumps(dict(groups=groups, warps=warps, **vars(r))))
"""


def test_fused_backward_at_1024_keeps_its_programs_resident():
    """The fused backward (h stored, dropout, the prenorm gradient) at configs.FUSED_BACKWARD[1024]'s tile and warps:
    no spill, and as many programs resident an SM (registers x threads within 64 K registers) as the entry's groups
    an SM, so the groups run as one wave."""
    row = compiled_json(FUSED_1024, timeout=600)
    assert row["spill_stores"] == 0 and row["spill_loads"] == 0, row
    per_warp = -(-row["registers"] * 32 // 256) * 256  # (registers are allocated a warp at a time, 256 at once)
    assert row["groups"] * row["warps"] * per_warp <= 65536, row
