"""The m x 2^k kernels with TMA descriptors (plan tuning tma="load"/"both" for the transform, kron_tma=True
for hadamard_quantize's kron-tiled plans; configs.KRON_TMA): the rows as (rows, m, p) with [B, M_PAD, Q]
boxes, sub-rows past m and rows past the end zero-filled on load and clipped on store. Through the
interpreter (it runs descriptors as loads and stores): outputs poisoned, against the float64 references."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.hadamard import hadamard_reference, kron, quantize
from tilecore.ops.hadamard.quantize_reference import code_order, hadamard_quantize_reference


@pytest.mark.parametrize("m, p, tma", [(12, 64, "both"), (20, 16, "load"), (28, 32, "both")])
def test_kron_transform_through_descriptors(m, p, tma):
    rows = 7  # not a multiple of the tile's rows: the last tile's rows past the end
    x = torch.randn(rows, m * p, dtype=torch.float16)
    plan = kron.kron_plan(x, m, p, tma=tma)
    assert plan.config["TMA_LOAD"] and plan.config["TMA_STORE"] == (tma == "both") and plan.config["M_PAD"] > m
    out = torch.full_like(x, float("nan"))
    kron.launch(plan, x, out, (m * p) ** -0.5)
    assert torch.isfinite(out).all(), "some outputs were never written"
    ref = hadamard_reference(x, (m * p) ** -0.5, out_dtype=torch.float64)
    assert accuracy.error_over_floor(out, ref) <= 1.02


def test_kron_tiled_quantize_through_descriptors():
    x = torch.randn(5, 12 * 16, dtype=torch.float16)
    x[:, 3] *= 40
    plan = quantize.plan_quantize(x, "mxfp4", 32, None, True, False, False, kron_tma=True)
    assert plan.path == "fused" and plan.config["TMA_LOAD"]
    codes, scales, _ = quantize.run_plan(plan, x, "mxfp4", 32, poison=True)
    ref_codes, ref_scales = hadamard_quantize_reference(x, format="mxfp4")
    a, b = code_order(codes, "mxfp4"), code_order(ref_codes, "mxfp4")
    assert (a == b).double().mean() >= 0.999 and (a - b).abs().max() <= 1
    assert torch.equal(scales.view(torch.uint8), ref_scales.view(torch.uint8))
