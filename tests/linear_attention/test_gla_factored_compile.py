"""The factored GLA forward (kernels_tl.la_fwd_kernel at plan diag 4: one reference a chunk, operands split
hi + lo, the sub-chunk fallback in registers) compiles for sm_90a on this GPU-less machine: wgmma, not
serialized, within Hopper's 227 KiB of shared memory, spills bounded. Its math is tested in the interpreter
(test_gla_factored.py); experiments/linear_attention/gpu_gla.py checks it on the GPU."""
from compiled_run import compiled_json

# sm_90a, triton 3.6.0, chunk 32, BV 64, 8 warps, 2 stages (the blocks gpu_gla.py times as "diag4 bt32"): 255
# registers, 16 B spilled (BV 128: 156; diag 3 at both: 0; the shipped diag 0 at chunk 64: 360)
SPILLS_ALLOWED = 512
CODE = """
import json, torch
from tilecore.ops.linear_attention import launch
from tilecore.ops.linear_attention.plan import IDENTITY, tl_plan
from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources
q = torch.empty(1, 128, 2, 128, dtype=torch.bfloat16)
v = torch.empty(1, 128, 2, 128, dtype=torch.bfloat16)
g = torch.empty(1, 128, 2, 128)
p = tl_plan(q, v, g, IDENTITY, 32, diag=4, BV=64, fwd_warps=8, fwd_stages=2)
kernel, _, args, kw = launch.forward_call(p, q, q, v, g, None, None, None, None, v, None, None, 1.0, IDENTITY)
kw = dict(kw)
warps, stages = kw.pop("num_warps"), kw.pop("num_stages")
c = compile_kernel(kernel, dict(zip(kernel.arg_names, args), **kw), num_warps=warps, num_stages=stages)
print(json.dumps(dict(vars(resources(c)), **has_hopper_instructions(c.asm["ptx"]))))
"""


def test_factored_gla_forward_compiles_for_sm90a():
    r = compiled_json(CODE, timeout=600)
    assert r["wgmma"] and not r["wgmma_serialized"], r
    assert r["shared"] <= 227 * 1024, r
    assert r["spill_stores"] <= SPILLS_ALLOWED, r
