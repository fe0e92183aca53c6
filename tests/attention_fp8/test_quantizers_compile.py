"""The convenience path's quantizers (kernels_tl.rotate_quantize for k, quantize_v_permuted per block for v), compiled
for sm_90a as the launches pass configs.QUANTIZE_CLAMP: without the explicit +-448 clamp the codes' saturation is the
conversion's own, so the PTX must convert by cvt.rn.satfinite (NaN kept, out of range to +-448: the clamp's result);
with it, the clamp's max/min.NaN are there. (Compiled, not interpreted: the interpreter emulates the conversion and
clamps either way; tests/attention_fp8/test_rotate_quantize.py and test_v_per_block.py check its codes.)"""

import pytest
from compiled_run import compiled_json

SCRIPT = r"""
import json, sys, torch
from tilecore.ops.attention_fp8 import configs, kernels_tl
from tilecore.tiles.compile import compile_kernel

out = {}
B, H, N, D = 2, 2, 1024, 128
x = torch.empty(B, H, N, D, dtype=torch.bfloat16)
f32 = torch.empty(64)
for clamp in (configs.QUANTIZE_CLAMP, not configs.QUANTIZE_CLAMP):
    k = compile_kernel(kernels_tl.rotate_quantize, dict(
        X=x, OUT=torch.empty(B, H, N, D, dtype=torch.float8_e4m3fn), DESCALE=f32, SIGNS=torch.empty(D),
        sxb=x.stride(0), sxh=x.stride(1), sxn=x.stride(2), sxd=x.stride(3), H=H, N=N, n_scales=N // 128,
        out_scale=D ** -0.5, ROTATE=True, SCALE=1, UPCAST=False, BLOCK_R=128, BLOCK_D=D, ROW_BLOCKS=2, CLAMP=clamp),
        num_warps=4, num_stages=2).asm["ptx"]
    v = compile_kernel(kernels_tl.quantize_v_permuted, dict(
        V=x, OUT=torch.empty(B, H, D, N, dtype=torch.float8_e4m3fn), DESCALE=f32, svb=x.stride(0), svh=x.stride(1),
        svn=x.stride(2), svd=x.stride(3), H=H, Nk=N, D=D, n_out=N, EMULATE_CAST=False, BLOCK_K=128, BLOCK_D=D,
        PER_BLOCK=True, n_scales=N // 128, CLAMP=clamp), num_warps=4).asm["ptx"]
    out[str(clamp)] = {name: dict(satfinite=ptx.count("cvt.rn.satfinite.e4m3x2.f32"),
                                  clamps=ptx.count("max.NaN.f32") + ptx.count("min.NaN.f32"))
                       for name, ptx in (("k", k), ("v", v))}
print(json.dumps(dict(shipped=configs.QUANTIZE_CLAMP, forms=out)))
"""


@pytest.fixture(scope="module")
def report():
    return compiled_json(SCRIPT, timeout=600)


def test_codes_saturate_by_the_conversion(report):
    # every code by cvt.rn.satfinite, with or without the clamp; without it no max/min.NaN at all (two an element
    # with it: the FMNMX.NAN that session 40 removed, 248 SASS instructions a program at D128)
    for clamp, kernels in report["forms"].items():
        for name, r in kernels.items():
            assert r["satfinite"] > 0, (clamp, name, r)
            if clamp == "True":
                assert r["clamps"] >= 2 * r["satfinite"], (clamp, name, r)
            else:
                assert r["clamps"] == 0, (clamp, name, r)
    assert report["shipped"] is False  # configs.QUANTIZE_CLAMP (notes/attention_fp8's decision log)
