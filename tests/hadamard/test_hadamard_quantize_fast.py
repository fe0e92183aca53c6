"""hadamard_quantize's FAST epilogue (plan tuning ``fast=True``, configs.QUANT_FAST): y times each group's
reciprocal (the rotation's 1 / sqrt(n) folded into it on the pow2 path) instead of the correctly rounded
quotient. Through the interpreter: codes against the float64 reference (>= 99.9% equal, the rest one step
apart, as the issue's accuracy rule), scales as exact as the Markstein epilogue's, NaN/inf rows, outputs
poisoned first (run_plan's poison)."""
import pytest
import torch

from tilecore.ops.hadamard import quantize
from tilecore.ops.hadamard.quantize_reference import FORMATS, code_order, hadamard_quantize_reference

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered")


def _run(x, fmt, fast, block=None, scale=None, group=None):
    rows, n = x.shape
    group = FORMATS[fmt].default_group if group is None else group
    plan = quantize.kernel_plan(rows, n, x.dtype, fmt, group, block, True, scale is not None, False, 4, True,
                                fast=fast)
    assert plan.config["FAST"] == fast
    codes, scales, g = quantize.run_plan(plan, x, fmt, group, block, True, scale, poison=True)
    return plan, codes, scales, g


def _compare(x, fmt, block=None, scale=None, group=None):
    """FAST's codes against the reference's and the exact epilogue's; returns the plan's path."""
    plan, codes, scales, _ = _run(x, fmt, True, block, scale, group)
    _, exact_codes, exact_scales, _ = _run(x, fmt, False, block, scale, group)
    kw = {"block": block} if block else {}
    if scale is not None:
        kw["scale"] = scale
    if group is not None:
        kw["group"] = group
    ref_codes, _ = hadamard_quantize_reference(x, format=fmt, **kw)
    a, b = code_order(codes.reshape(ref_codes.shape), fmt), code_order(ref_codes, fmt)
    e = code_order(exact_codes.reshape(ref_codes.shape), fmt)
    finite = torch.isfinite(x).all(dim=-1)
    assert (a == b).double().mean() >= 0.999, f"{(a != b).double().mean():.5f} of the codes differ"
    assert (a - b)[finite].abs().max() <= 1 or fmt == "fp8_e5m2"  # e5m2's subnormal far codes: see the main test
    assert (a - e)[finite].abs().max() <= 1  # against the exact epilogue: at most one step, never more
    # the scales are the exact epilogue's: the amax of the unscaled values times 1 / sqrt(n) rounds as the
    # amax of the scaled ones (rounding is monotone)
    if isinstance(scales, torch.Tensor) and scales.dtype == torch.float32:
        assert torch.equal(scales.nan_to_num(7.0), exact_scales.nan_to_num(7.0))
    else:
        assert torch.equal(scales.view(torch.uint8), exact_scales.view(torch.uint8))
    return plan.path


@pytest.mark.parametrize("fmts", [("fp8_e4m3", "int8", "mxfp4"), ("fp8_e5m2", "nvfp4", "int4")])
def test_fast_epilogue_matches_the_reference(fmts):
    x = torch.randn(8, 512, dtype=torch.float16)  # 512 = 2^9: 1 / sqrt(n) is not a power of two
    x[:, 5] *= 60  # an outlier channel
    x[3, 7] = float("nan")
    x[4, 9] = float("inf")
    for fmt in fmts:
        scale = torch.tensor([0.002]) if fmt == "nvfp4" else None
        assert _compare(x, fmt, scale=scale) == "pow2"


def test_fast_epilogue_groups_blocks_statics_and_the_kron_tiled_kernel():
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    x[:, 3] *= 50
    assert _compare(x, "fp8_e4m3", group=128) == "pow2"
    assert _compare(x, "mxfp4", block=32) == "pow2"
    assert _compare(x, "fp8_e4m3", scale=torch.tensor([0.01])) == "pow2"
    x = torch.randn(2, 12 * 16, dtype=torch.float16)  # n = m 2^k: the kron-tiled kernel
    assert _compare(x, "int8") == "fused"
