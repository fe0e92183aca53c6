"""configs.HEDGEHOG_MAP_EXACT_X (session 35): the map kernels' products with x as one operand (x W, x^T dproj) by
kernels_forward.dot_tf32x2 (PREC "tf32x2") where x is 16-bit: a bf16 / fp16 value is exact in tf32, so tf32x3's
third product (x's rest times the other's head) is zero and two products give its accuracy; dx = dproj W^T keeps
tf32x3. Here: where the host takes it (kernels_forward.map_precision), the kernels on that path in the interpreter
(whose dot is float32: the split's arithmetic) against the float64 map and torch's, and a CPU model of the tensor
cores' tf32 reads (the low 13 mantissa bits dropped) showing dot_tf32x2's scheme at float32's accuracy for bf16 x
where one tf32 product is 1e-4 off. The GPU run (experiments/linear_attention/gpu_mamba_s35.py) checks the op."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.linear_attention import configs, kernels_forward
from tilecore.ops.linear_attention.op import hedgehog_map


def test_where_the_host_takes_tf32x2(monkeypatch):
    bf, f32 = torch.empty(1, dtype=torch.bfloat16), torch.empty(1)
    monkeypatch.setattr(configs, "HEDGEHOG_MAP_EXACT_X", False)
    assert kernels_forward.map_precision("tf32x3", bf) == "tf32x3"
    monkeypatch.setattr(configs, "HEDGEHOG_MAP_EXACT_X", True)
    assert kernels_forward.map_precision("tf32x3", bf) == "tf32x2"
    assert kernels_forward.map_precision("tf32x3", torch.empty(1, dtype=torch.float16)) == "tf32x2"
    assert kernels_forward.map_precision("tf32x3", f32) == "tf32x3"  # float32 x is not exact in tf32
    assert kernels_forward.map_precision("ieee", bf) == "ieee"


def map_and_grads(x, w, fused, dout):
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    out = hedgehog_map(xg, wg, fused=fused)
    out.backward(dout)
    return out.detach(), xg.grad, wg.grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_tf32x2_kernels_are_the_float64_map(monkeypatch, dtype):
    monkeypatch.setattr(configs, "HEDGEHOG_MAP_EXACT_X", True)
    seen = []
    for name in ("hedgehog_map_fused", "hedgehog_map_backward"):
        fn = getattr(kernels_forward, name)
        monkeypatch.setattr(kernels_forward, name, lambda *a, _fn=fn, **kw: seen.append(
            kernels_forward.map_precision(kw["precision"], a[0])) or _fn(*a, **kw))
    torch.manual_seed(4)
    B, N, H, Dk, F = 1, 90, 2, 24, 12
    x = torch.randn(B, H, N, Dk).to(dtype).transpose(1, 2)
    w = torch.randn(H, Dk, F) * Dk ** -0.5
    dout = torch.randn(B, N, H, 2 * F).to(dtype)
    out, dx, dw = map_and_grads(x, w, True, dout)
    assert seen == ["tf32x2", "tf32x2"]
    t_out, t_dx, t_dw = map_and_grads(x, w, False, dout)
    r_out, r_dx, r_dw = map_and_grads(x.double(), w.double(), False, dout.double())
    for mine, theirs, ref in ((out, t_out, r_out), (dx, t_dx, r_dx)):
        assert accuracy.error_over_floor(mine, ref) <= 1.05 * max(1.0, accuracy.error_over_floor(theirs, ref))
    assert (dw.double() - r_dw).abs().max() <= 1.05 * (t_dw.double() - r_dw).abs().max() + 1e-5 * r_dw.abs().max()


def tf32_read(t: torch.Tensor) -> torch.Tensor:
    """A float32 tensor as the tensor cores read it in a tf32 product: its low 13 mantissa bits dropped."""
    return (t.float().view(torch.int32) & -8192).view(torch.float32)


def test_the_two_product_split_has_float32_accuracy_for_16_bit_x():
    torch.manual_seed(5)
    x = torch.randn(256, 64).to(torch.bfloat16).float()  # exact in tf32
    w = torch.randn(64, 32) / 8
    assert torch.equal(tf32_read(x), x)
    exact = x.double() @ w.double()
    hi = tf32_read(w)  # dot_tf32x2's split of w: exact in float32
    two = tf32_read(x).double() @ tf32_read(hi).double() + tf32_read(x).double() @ tf32_read(w - hi).double()
    one = tf32_read(x).double() @ tf32_read(w).double()
    rel = lambda a: float((a - exact).abs().max() / exact.abs().max())  # noqa: E731
    assert rel(two) < 2e-6 < 1e-4 < rel(one)
