"""attention(..., precision="fp8"): the FP8 convenience path through tilecore.attention, its errors."""
import pytest
import torch

import tilecore
from tilecore.ops.attention_fp8 import attention_fp8_rotated
from tilecore.ops.attention.reference import attention_reference


def _qkv(seed, B=1, H=2, N=40, D=64, dtype=torch.float16):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, D, generator=gen).to(dtype) for _ in range(3)]


@pytest.mark.parametrize("rotate", [True, False])
def test_fp8_precision_is_the_convenience_path(rotate):
    q, k, v = _qkv(0)
    out = tilecore.attention(q, k, v, causal=True, precision="fp8", rotate=rotate)
    same = attention_fp8_rotated(q, k, v, causal=True, rotate=rotate)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert torch.equal(out, same)
    exact, _ = attention_reference(q.double(), k.double(), v.double(), causal=True)
    err = (out.double() - exact).norm() / exact.norm()
    assert 0 < err < 0.1  # e4m3 operands and P: a few percent, not garbage, not exact


def test_fp8_precision_errors():
    q, k, v = _qkv(1)
    with pytest.raises(ValueError, match="precision must be None"):
        tilecore.attention(q, k, v, precision="int8")
    with pytest.raises(ValueError, match="neither window_size nor softcap"):
        tilecore.attention(q, k, v, precision="fp8", window_size=(8, 0))
    with pytest.raises(ValueError, match="neither window_size nor softcap"):
        tilecore.attention(q, k, v, precision="fp8", softcap=5.0)
    with pytest.raises(TypeError, match="rotate must be True or False"):
        tilecore.attention(q, k, v, precision="fp8", rotate=1)
    q.requires_grad_()
    with pytest.raises(RuntimeError, match="forward-only"):
        tilecore.attention(q, k, v, precision="fp8")
    with torch.no_grad():
        assert tilecore.attention(q, k, v, precision="fp8").isfinite().all()
