"""A napkin candidate row that the table never ran (configs.GLUON_CANDIDATES: one consumer
partition of 4 warps, 128 x 128 tiles) compiles for sm_90a on this GPU-less machine with
wgmma and TMA, without spilling and within Hopper's shared memory (every candidate was compiled so
when the list was made: notes/napkin/README.md, issue 36 part 4)."""
from compiled_run import compiled_json

COMPILE = r"""
import json, torch
from tilecore.ops.gemm import gluon_kernels, plan
from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources
from tilecore.tiles.launch import gluon_descriptor as desc
out = []
for row in ((128, 128, 64, 4, 1, 4),):
    cfg = plan.gluon_row(*row)
    BM, BN, BK = cfg["block"]
    x = torch.empty(512, 512, dtype=torch.bfloat16)
    f32 = torch.empty(256)
    args = dict(a_desc=desc(x, [BM, BK]), b_desc=desc(x, [BK, BN]), c_desc=desc(x, [BM, min(BN, 65536 // (BM * 2))]),
                M=512, N=512, K=512, bias_ptr=x, scale_a_ptr=f32, scale_b_ptr=f32, workspace=f32,
                flags=torch.empty(8, dtype=torch.int32), num_units=4, B_T=False, GROUP_M=8, HAS_BIAS=True, SCALES=0,
                STAGES=cfg["stages"], CONSUMERS=1, STREAM_K=True)
    k = compile_kernel(gluon_kernels.gemm_kernel, args, num_warps=cfg["num_warps"])
    r = resources(k)
    out.append(dict(row=row, spills=r.spill_stores + r.spill_loads, shared=r.shared, serialized=r.wgmma_serialized,
                    legal=plan.gluon_legal(cfg, 2, 2), **has_hopper_instructions(k.asm["ptx"])))
print(json.dumps(out))
"""


def test_one_consumer_candidates_compile_for_hopper_without_spills():
    rows = compiled_json(COMPILE, timeout=600)
    assert len(rows) == 1
    for row in rows:
        assert row["wgmma"] and row["tma"] and not row["serialized"], row
        assert row["spills"] == 0 and row["shared"] <= 227 * 1024 and row["legal"] is None, row
