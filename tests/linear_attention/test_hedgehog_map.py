"""Hedgehog's one-pass feature map (kernels_forward.hedgehog_map_kernel, session 32) in Triton's interpreter against
op.hedgehog_map (torch, float32) and a float64 map: bf16, fp16 and float32 inputs, strided views (a (B, H, N, D)
tensor's transpose), Dk and F not powers of two, rows past a block, an extreme projection (softmax's max shift). bf16
takes the kernel's float32 output rounded by torch (the interpreter truncates float32 to bf16: decision 7)."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.linear_attention.kernels_forward import hedgehog_map_fused
from tilecore.ops.linear_attention.op import hedgehog_map


def reference(x, w):
    proj = torch.einsum("...hd,hdf->...hf", x.double(), w.double())
    return torch.cat([proj.softmax(-1), (-proj).softmax(-1)], dim=-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("B,N,H,Dk,F", [(2, 70, 3, 16, 8), (1, 5, 2, 24, 12), (1, 130, 1, 64, 32)])
def test_the_fused_map_is_the_torch_map(dtype, B, N, H, Dk, F):
    torch.manual_seed(0)
    x = torch.randn(B, H, N, Dk).to(dtype).transpose(1, 2)  # (B, N, H, Dk), strided
    w = torch.randn(H, Dk, F) * Dk ** -0.5
    out = hedgehog_map_fused(x, w)
    assert out.shape == (B, N, H, 2 * F) and out.dtype == dtype
    if dtype == torch.bfloat16:  # (the interpreter truncates float32 to bf16: float32 out, rounded by torch)
        out = hedgehog_map_fused(x, w, out_dtype=torch.float32).to(dtype)
    ref = reference(x, w)
    if dtype == torch.float32:  # (another sum order and exp than torch's: a few float32 ulp)
        assert (out.double() - ref).abs().max() < 2e-6
        return
    assert accuracy.error_over_floor(out, ref) <= 1.05 * max(1.0, accuracy.error_over_floor(hedgehog_map(x, w), ref))
    assert torch.allclose(out.float(), hedgehog_map(x, w).float(), atol=2 * torch.finfo(dtype).eps, rtol=0)


def test_an_extreme_projection_stays_finite():
    x = torch.full((1, 3, 1, 16), 40.0)
    w = torch.randn(1, 16, 8)
    out = hedgehog_map_fused(x, w)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, reference(x, w).float(), atol=1e-6)
