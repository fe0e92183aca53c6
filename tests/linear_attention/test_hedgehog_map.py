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


def test_the_op_hook_takes_the_fused_map_only_where_nothing_is_recorded(monkeypatch):
    """op.hedgehog_map's ``fused`` (configs.HEDGEHOG_FUSED_MAP by default): the kernel under no_grad (its output equal
    to hedgehog_map_fused's), torch's map where a gradient is recorded (W's gradient flows), and the public op with the
    switch on equal to the op with it off (bf16, the interpreter's float32 output rounded by torch)."""
    from tilecore.ops.linear_attention import configs, linear_attention

    torch.manual_seed(1)
    B, N, H, Dk, F = 1, 70, 2, 16, 8
    x = torch.randn(B, N, H, Dk).to(torch.bfloat16)
    w = torch.randn(H, Dk, F) * Dk ** -0.5
    kernel = hedgehog_map_fused(x, w, out_dtype=torch.float32).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(hedgehog_map(x, w, fused=True), kernel)
        torch_map = hedgehog_map(x, w, fused=False)
    assert torch.allclose(torch_map.float(), kernel.float(), atol=2 * torch.finfo(torch.bfloat16).eps, rtol=0)
    wg = w.clone().requires_grad_(True)
    out = hedgehog_map(x, wg, fused=True)  # (a gradient to record: torch's map)
    assert out.requires_grad and torch.equal(out.detach(), torch_map)
    out.float().sum().backward()
    assert wg.grad is not None and torch.isfinite(wg.grad).all()

    q, k, v = torch.randn(B, N, H, Dk).half(), torch.randn(B, N, H, Dk).half(), torch.randn(B, N, H, 32).half()
    monkeypatch.setattr(configs, "HEDGEHOG_FUSED_MAP", False)
    off = linear_attention(q, k, v, feature_map="hedgehog", feature_weights=w)
    monkeypatch.setattr(configs, "HEDGEHOG_FUSED_MAP", True)
    with torch.no_grad():
        on = linear_attention(q, k, v, feature_map="hedgehog", feature_weights=w)
        assert torch.equal(hedgehog_map(q, w), hedgehog_map_fused(q, w, out_dtype=torch.float32).half())
    ref, _ = linear_attention_reference_f64(q, k, v, w)
    assert accuracy.error_over_floor(on, ref) <= 1.05 * max(1.0, accuracy.error_over_floor(off, ref))


def linear_attention_reference_f64(q, k, v, w):
    from tilecore.ops.linear_attention import linear_attention_reference

    return linear_attention_reference(q.double(), k.double(), v.double(), feature_map="hedgehog",
                                      feature_weights=w.double())
