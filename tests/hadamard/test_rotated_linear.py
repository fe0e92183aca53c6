"""tilecore.nn.RotatedLinear (W8A8 FP8 with the rotation folded into the weight and fused with the
activation's quantization) and HadamardRotation at n = m x 2^k: against the float64 linear."""
import pytest
import torch

from tilecore.nn import HadamardRotation, RotatedLinear


@pytest.fixture(params=["cpu-path", "interpreter"])
def path(request, monkeypatch):
    if request.param == "cpu-path":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    return request.param


def float64_linear(lin, x):
    return x.double() @ lin.weight.double().T + lin.bias.double()


def rel(y, ref):
    return float((y.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("n", [128, 28 * 16])
def test_output_against_the_float64_linear(monkeypatch, n):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the CPU path (the interpreter's below, smaller)
    lin = torch.nn.Linear(n, 64)
    x = torch.randn(2, 16, n)
    x[..., 5] *= 60  # an outlier channel
    ref = float64_linear(lin, x)
    errors = {}
    for rotate, randomized in ((False, False), (True, False), (True, True)):
        layer = RotatedLinear.from_linear(lin, rotate=rotate, randomized=randomized, seed=3)
        y = layer(x.to(torch.bfloat16))
        assert y.shape == (2, 16, 64) and y.dtype == torch.bfloat16
        errors[rotate, randomized] = rel(y, ref)
    # e4m3 (3 mantissa bits) on both operands, bf16 output: a few percent either way
    assert all(e < 0.06 for e in errors.values()), errors


def test_kernels_through_the_interpreter():
    """hadamard_quantize's and gemm_fp8's tl kernels (Triton's interpreter), float16 in and out."""
    lin = torch.nn.Linear(128, 32)
    x = torch.randn(16, 128)
    layer = RotatedLinear.from_linear(lin, randomized=True, seed=0)
    y = layer(x.to(torch.float16))
    assert y.dtype == torch.float16 and rel(y, float64_linear(lin, x)) < 0.06


def test_the_rotation_is_folded_into_the_weight():
    """The stored weight is W R^T (to e4m3's rounding): rotated back by R it is W."""
    lin = torch.nn.Linear(64, 8, bias=False)
    layer = RotatedLinear.from_linear(lin, randomized=True, seed=0)
    w_rot = layer.weight_codes.double() * layer.weight_scales.double().reshape(-1, 1)
    rot = HadamardRotation(64, randomized=True, seed=0)
    assert torch.equal(rot.signs, layer.signs)
    back = rot.inverse(w_rot.float())  # rows of W R^T rotated back: W (to e4m3's error)
    assert rel(back, lin.weight.double()) < 0.04


def test_from_linear_rejects_what_it_cannot_build():
    with pytest.raises(ValueError, match="format must be 'fp8_e4m3'"):
        RotatedLinear.from_linear(torch.nn.Linear(64, 8), format="int8")
    with pytest.raises(ValueError, match="in_features = 200"):
        RotatedLinear.from_linear(torch.nn.Linear(200, 8))
    assert RotatedLinear.from_linear(torch.nn.Linear(200, 8), rotate=False).in_features == 200
    with pytest.raises(ValueError, match=r"needs a last dimension of 64; got \(2, 32\)"):
        RotatedLinear.from_linear(torch.nn.Linear(64, 8))(torch.randn(2, 32))


@pytest.mark.parametrize("n", [12 * 8, 172 * 2, 156])
def test_rotation_of_non_power_of_two_sizes_is_orthogonal(path, n):
    rot = HadamardRotation(n, randomized=True, seed=1)
    x = torch.randn(3, n)
    y = rot(x)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5)
    assert torch.allclose(rot.inverse(y), x, atol=1e-5)


def test_weights_off_the_cpu_stay_on_their_device():
    """from_linear on a GPU layer failed on the H100 (session 37 call 3): H_m (built on the CPU) and the random
    signs met CUDA rows. The meta device stands in for any non-CPU device: shapes flow, devices must agree."""
    from tilecore.ops.hadamard.reference import hadamard_reference

    for n in (28 * 16, 64):  # H_m (x) H_p, and Sylvester alone
        y = hadamard_reference(torch.empty(3, n, device="meta"), n ** -0.5)
        assert y.device.type == "meta" and y.shape == (3, n)
    for randomized in (False, True):  # the random signs are drawn on the CPU
        layer = RotatedLinear.from_linear(torch.nn.Linear(28 * 16, 8, device="meta"), randomized=randomized, seed=1)
        assert all(b.device.type == "meta" for b in layer.buffers() if b is not None)
