"""layer_norm on CPU tensors without Triton's interpreter: torch's own CPU kernels (native_layer_norm and
its backward in float32; RMSNorm in float32 torch operations), against float64. bf16 rounds to nearest
here, so it is held to the rounding floor too."""
import math

import pytest
import torch
import torch.nn.functional as F
from norm_testing import assert_close_to, make_inputs, run_and_check

from tilecore.ops.norm import dropout_mask, layer_norm, plan

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # CPU tensors take torch's CPU path


def test_plans_the_cpu_path():
    assert plan.plan(4, 64, torch.device("cpu")).path == "cpu"


@pytest.mark.parametrize("n", [1, 7, 300, 1024])
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_float64(n, rms, dtype):
    x, w, b, r = make_inputs(33, n, dtype, shift=3.0)
    run_and_check(x, w, b, r, rms=rms)


@pytest.mark.parametrize("case", ["no weight, no bias", "no residual", "float32 residual", "not prenorm",
                                  "dropout", "dropout, no residual"])
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_variants(case, rms):
    x, w, b, r = make_inputs(
        17, 96, torch.bfloat16, weight="weight" not in case, bias="bias" not in case,
        residual="no residual" not in case, res_dtype=torch.float32 if "float32 residual" in case else None)
    run_and_check(x, w, b, r, rms=rms, prenorm=case != "not prenorm", dropout_p=0.25 if "dropout" in case else 0.0)


def test_dropout_reproducible_and_the_same_mask_backward():
    x, w, b, r = make_inputs(64, 256, torch.float32)
    p = 0.3
    keep = dropout_mask(x, p, torch.Generator().manual_seed(9))
    assert abs(keep.float().mean().item() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / keep.numel())
    y, h = layer_norm(x, w, b, residual=r, dropout_p=p, prenorm=True, generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(h - r, torch.where(keep, x / (1 - p), 0).detach(), rtol=1e-6, atol=1e-6)
    dx, dres = torch.autograd.grad(y.sum(), (x, r))
    assert torch.equal(dx != 0, keep)
    torch.testing.assert_close(dx[keep], dres[keep] / (1 - p), rtol=1e-6, atol=1e-6)


def test_nan_and_inf_as_torch():
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    x[2, 5] = math.nan
    x[5, 7] = math.inf
    w, b = torch.randn(64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    for rms in (False, True):
        y = layer_norm(x, w, b, rms=rms)
        expected = F.rms_norm(x.float(), (64,), w.float(), 1e-5) + b.float() if rms else \
            F.layer_norm(x.float(), (64,), w.float(), b.float(), 1e-5)
        assert torch.equal(torch.isnan(y), torch.isnan(expected)) and torch.isnan(y[2]).all()
        clean = [0, 1, 3, 4, 6, 7]
        assert_close_to(y[clean], expected[clean].double(), "clean rows", multiple=1.5)


def test_empty_and_3d():
    e = torch.randn(0, 16, requires_grad=True)
    y = layer_norm(e, torch.ones(16), rms=True)
    assert y.shape == (0, 16)
    y.sum().backward()
    x = torch.randn(2, 3, 40, dtype=torch.float16)
    assert layer_norm(x, None).shape == (2, 3, 40)
