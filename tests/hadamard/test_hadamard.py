"""hadamard_transform on the CPU: the Triton kernel through the interpreter, the reference path,
the custom-op machinery, and bad input."""

import numpy as np
import pytest
import torch

import tilecore
from tilecore import accuracy
from tilecore.ops.hadamard import hadamard_matrix, hadamard_reference, hadamard_transform
from tilecore.ops.hadamard.configs import SPLITS

ALL_N = sorted(SPLITS)


def truncate_to_bf16(t: torch.Tensor) -> torch.Tensor:
    """Round toward zero to bf16: what Triton 3.6's interpreter does where the GPU rounds to nearest."""
    return (t.float().view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


def run_poisoned(x, scale):
    """The kernel's answer, with the output poisoned first so an unwritten element shows as NaN."""
    from tilecore.ops.hadamard.op import _transform_into

    out = torch.full_like(x, float("nan"))
    _transform_into(x, out, scale)
    assert torch.isfinite(out).all(), "some outputs were never written"
    return out


@pytest.mark.parametrize("n", ALL_N)
def test_fp16_at_the_rounding_floor(n):
    x = torch.randn(max(2, 2**14 // n) + 1, n, dtype=torch.float16)  # +1: a partial last tile
    out = run_poisoned(x, n**-0.5)
    ref = hadamard_reference(x, n**-0.5, out_dtype=torch.float64)
    assert accuracy.error_over_floor(out, ref) <= 1.05


@pytest.mark.parametrize("n", ALL_N)
def test_bf16_is_the_exact_answer_rounded_once(n):
    # The interpreter truncates float32 -> bf16 (the GPU rounds to nearest), so the kernel's answer is
    # compared with the exact transform truncated once. Where a row is one exact product (N1 = 1), bit
    # for bit; where the second product takes the first's float32 result as two bf16 pieces (16
    # significant bits, the GPU's math), within the truncation's own error. (On the GPU, which rounds
    # to nearest, experiments/hadamard/hadamard_tma_probe.py checks <= 1.25x the rounding floor.)
    x = torch.randn(max(2, 2**13 // n) + 1, n, dtype=torch.bfloat16)
    scale = 0.5 if n > 1 else 1.0
    out = run_poisoned(x, scale)
    ref = hadamard_reference(x, scale, out_dtype=torch.float64)
    expected = truncate_to_bf16(ref)
    S, N1, _ = SPLITS[n]
    if S == 1 and N1 == 1:
        assert torch.equal(out, expected)
    elif N1 == 1:  # the float32 butterfly over slices rounds once more (at 2^-24): a truncation may move 1 ulp
        ulps = (out.view(torch.int16).int() - expected.view(torch.int16).int()).abs()
        assert ulps.max() <= 1 and (ulps > 0).float().mean() < 1e-3
    else:
        assert accuracy.rel_rms(out, ref) <= 1.02 * accuracy.rel_rms(expected, ref)
        assert (out != expected).float().mean() < 0.01


@pytest.mark.parametrize("n", ALL_N)
def test_fp32_within_1e6(n):
    x = torch.randn(max(2, 2**13 // n) + 1, n, dtype=torch.float32)
    out = run_poisoned(x, 1.0)
    ref = hadamard_reference(x, 1.0, out_dtype=torch.float64)
    assert accuracy.rel_rms(out, ref) <= 1e-6


@pytest.mark.parametrize("n", [32, 512, 4096])
@pytest.mark.parametrize("magnitude", [1e-30, 1e-3, 1e4, 1e6, 1e30])
def test_fp32_at_any_magnitude(n, magnitude):
    """float32 pieces are bf16 as on the GPU (the interpreter once cut them as fp16: NaN past |x| ~ 1e4,
    lost bits below ~1e-3)."""
    x = torch.randn(5, n, dtype=torch.float32) * magnitude
    out = run_poisoned(x, 0.5)
    assert accuracy.rel_rms(out, hadamard_reference(x, 0.5, out_dtype=torch.float64)) <= 1e-6


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_inputs_near_their_largest(dtype):
    x = torch.randn(3, 1024).clamp(-2, 2).to(dtype) * (torch.finfo(dtype).max / 2**11)  # sums stay finite
    out = run_poisoned(x, 2**-5)
    ref = hadamard_reference(x, 2**-5, out_dtype=torch.float64)
    assert accuracy.rel_rms(out, ref) <= 2 * accuracy.rel_rms(truncate_to_bf16(ref) if dtype == torch.bfloat16
                                                              else ref.to(dtype), ref)


# Alternative splits the GPU probe times: each must compute the same transform.
VARIANT_SPLITS = [(256, (2, 1, 128)), (256, (4, 1, 64)), (512, (4, 1, 128)), (512, (2, 16, 16)),
                  (1024, (4, 16, 16)), (2048, (2, 32, 32)), (2048, (1, 32, 64)), (2048, (1, 128, 16)),
                  (4096, (1, 64, 64)), (8192, (1, 128, 64)), (16384, (2, 128, 64))]


@pytest.mark.parametrize("n,split", VARIANT_SPLITS)
def test_every_split_computes_the_transform(n, split):
    from tilecore.ops.hadamard import launch, plan

    x = torch.randn(3, n, dtype=torch.float16)
    out = torch.full_like(x, float("nan"))
    p = plan.plan(x, out, split=split)
    assert p.path == "tl" and (p.config["S"], p.config["N1"], p.config["N2"]) == split
    launch.launch(p, x, out, n**-0.5)
    ref = hadamard_reference(x, n**-0.5, out_dtype=torch.float64)
    assert torch.isfinite(out).all()
    assert accuracy.error_over_floor(out, ref) <= 1.05


def test_reference_matches_dense_matrix():
    n = 16
    x = torch.randn(3, n, dtype=torch.float64)
    assert torch.allclose(hadamard_reference(x), x @ hadamard_matrix(n).T)
    h = hadamard_matrix(n)
    assert torch.equal(h @ h, n * torch.eye(n, dtype=torch.float64))


def test_leading_dimensions_and_dtype_kept():
    x = torch.randn(2, 3, 4, 256, dtype=torch.float16)
    y = hadamard_transform(x, 1 / 16)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert torch.equal(y.reshape(-1, 256), hadamard_transform(x.reshape(-1, 256), 1 / 16))


@pytest.mark.parametrize("make", [
    lambda: torch.randn(64, 40, dtype=torch.float16)[:, :32],           # row stride 40
    lambda: torch.randn(32, 24, dtype=torch.float16).t(),                # last-dim stride 24
    lambda: torch.randn(4, 128, 3, dtype=torch.float16)[..., 1],         # last-dim stride 3
    lambda: torch.randn(6, 2, 64, dtype=torch.float16).transpose(0, 1),  # leading dims permuted
])
def test_non_contiguous_inputs(make):
    x = make()
    ref = hadamard_reference(x, 1.0, out_dtype=torch.float64)
    y = hadamard_transform(x)
    assert y.is_contiguous() and y.shape == x.shape
    assert accuracy.error_over_floor(y, ref) <= 1.05


@pytest.mark.parametrize("n", [4096, 16384, 32768])
def test_inplace_overwrites_and_returns_input(n):
    x = torch.randn(3, n, dtype=torch.float16)
    expected = hadamard_transform(x, 1 / 64)  # noqa
    data_ptr = x.data_ptr()
    y = hadamard_transform(x, 1 / 64, inplace=True)
    assert y is x and x.data_ptr() == data_ptr
    assert torch.equal(x, expected)


def test_inplace_on_a_non_contiguous_view_writes_through():
    base = torch.randn(8, 2, 32, dtype=torch.float16)
    view = base[:, 1]
    expected = hadamard_transform(view.clone(), 0.5)
    hadamard_transform(view, 0.5, inplace=True)
    assert torch.equal(base[:, 1], expected)


def test_inplace_refuses_to_drop_a_gradient():
    x = torch.randn(4, 16, requires_grad=True)
    with pytest.raises(RuntimeError, match="inplace"):
        hadamard_transform(x, inplace=True)


def test_gradient_is_the_same_transform_times_scale():
    x = torch.randn(5, 64, dtype=torch.float32, requires_grad=True)
    g = torch.randn(5, 64)
    hadamard_transform(x, 0.3).backward(g)
    assert torch.allclose(x.grad, hadamard_reference(g, 0.3), atol=1e-5)


def test_gradcheck():
    x = torch.randn(3, 16, dtype=torch.float32, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: hadamard_transform(t, 0.25), (x,), eps=1e-2, atol=1e-3, rtol=1e-3)


def test_compile_fullgraph_traces_the_custom_op():
    def f(x):
        return hadamard_transform(x * 2, 0.5) + 1

    x = torch.randn(4, 32, dtype=torch.float32)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert torch.allclose(compiled(x), f(x))
    torch.library.opcheck(torch.ops.tilecore.hadamard_transform.default, (x, 0.5))


def test_meta_tensors_use_the_fake_implementation():
    y = hadamard_transform(torch.empty(7, 1024, dtype=torch.bfloat16, device="meta"))
    assert y.shape == (7, 1024) and y.device.type == "meta"


def test_empty_input_gives_empty_output():
    for shape in [(0, 64), (3, 0, 16)]:
        y = hadamard_transform(torch.randn(shape, dtype=torch.float16))
        assert y.shape == shape


def test_nan_and_inf_stay_in_their_row():
    x = torch.randn(9, 256, dtype=torch.float16)
    x[2, 17] = float("nan")
    x[5, 3] = float("inf")
    y = hadamard_transform(x)
    ref = hadamard_reference(x, 1.0, out_dtype=torch.float64)
    assert torch.isnan(y[2]).all()
    assert torch.equal(torch.isfinite(y[5]), torch.isfinite(ref[5])) and torch.isinf(y[5]).any()
    clean = [0, 1, 3, 4, 6, 7, 8]
    assert torch.isfinite(y[clean]).all()
    assert accuracy.error_over_floor(y[clean], ref[clean]) <= 1.05


@pytest.mark.parametrize("n", [3, 6, 76, 65536, 2**16 + 1, 12 * 65536])
def test_unsupported_sizes_name_what_is_accepted(n):
    with pytest.raises(ValueError, match=r"no Hadamard matrix of order .* m = 1 \(powers of two\), 12, 20, 28"):
        hadamard_transform(torch.empty(2, n))


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.complex64, torch.float64, torch.uint8])
def test_unsupported_dtypes_name_what_is_accepted(dtype):
    with pytest.raises(TypeError, match="float16, bfloat16 and float32"):
        hadamard_transform(torch.zeros(2, 16, dtype=dtype))


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf"), torch.tensor(float("nan"))])
def test_non_finite_scale(scale):
    with pytest.raises(ValueError, match="finite real number.*got (nan|inf|-inf)"):
        hadamard_transform(torch.randn(2, 16), scale)


@pytest.mark.parametrize("scale", ["2", None, True, np.bool_(True), 1j, torch.ones(2), torch.ones(1),
                                   torch.tensor(1 + 1j), torch.tensor(True)])
def test_scale_that_is_no_real_number(scale):
    with pytest.raises(TypeError, match="finite real number \\(int, float, a numpy scalar or a 0-d tensor\\); got"):
        hadamard_transform(torch.randn(2, 16), scale)


@pytest.mark.parametrize("scale", [np.float32(0.25), np.float64(0.25), np.float16(0.25), torch.tensor(0.25),
                                   torch.tensor(0.25, dtype=torch.bfloat16), np.int64(2), torch.tensor(2), 2])
def test_real_scalars_of_any_kind(scale):
    x = torch.randn(3, 64)
    expected = hadamard_transform(x, float(scale))
    assert torch.equal(hadamard_transform(x, scale), expected)
    assert torch.equal(tilecore.nn.HadamardRotation(64)(x), hadamard_transform(x, np.float64(1 / 8)))


def test_scale_tensor_that_requires_grad_is_refused():
    scale = torch.tensor(0.5, requires_grad=True)
    with pytest.raises(ValueError, match="not differentiable in scale"):
        hadamard_transform(torch.randn(2, 16), scale)
    with torch.no_grad():
        assert hadamard_transform(torch.randn(2, 16), scale).shape == (2, 16)


@pytest.mark.parametrize("make", [lambda: torch.randn(1, 5).t(), lambda: torch.randn(3, 4, 2)[..., :1],
                                  lambda: torch.randn(2, 3, 1).transpose(0, 1)])
def test_n1_with_any_strides(make):
    """A last dimension of 1 with a stride other than 1 (once a bare AssertionError)."""
    x = make()
    assert torch.equal(hadamard_transform(x, 3.0), x * 3.0)
    y = x.clone()
    hadamard_transform(y, 3.0, inplace=True)
    assert torch.equal(y, x * 3.0)


def test_scalar_tensor_rejected():
    with pytest.raises(ValueError, match="last dimension"):
        hadamard_transform(torch.tensor(1.0))


@pytest.mark.parametrize("randomized", [False, True])
def test_rotation_is_orthogonal(randomized):
    n = 128
    rot = tilecore.nn.HadamardRotation(n, randomized=randomized, seed=3)
    q = rot(torch.eye(n, dtype=torch.float32)).double()  # rows: the rotation of each basis vector
    assert torch.allclose(q @ q.T, torch.eye(n, dtype=torch.float64), atol=1e-5)
    x = torch.randn(10, n, dtype=torch.float32)
    assert torch.allclose(rot.inverse(rot(x)), x, atol=1e-5)
    assert torch.allclose(rot(x).norm(dim=-1), x.norm(dim=-1), rtol=1e-5)


def test_randomized_rotation_is_seeded_and_differs_from_plain():
    x = torch.randn(4, 64)
    a = tilecore.nn.HadamardRotation(64, randomized=True, seed=1)
    b = tilecore.nn.HadamardRotation(64, randomized=True, seed=1)
    plain = tilecore.nn.HadamardRotation(64)
    assert torch.equal(a(x), b(x))
    assert not torch.allclose(a(x), plain(x))
    assert torch.allclose(plain(x), hadamard_reference(x, 1 / 8).float(), atol=1e-5)


def test_rotation_rejects_bad_sizes():
    with pytest.raises(ValueError, match=r"m = 1 \(powers of two\), 12, 20"):
        tilecore.nn.HadamardRotation(6)
    with pytest.raises(ValueError, match="last dimension of 64; got a last dimension of 32"):
        tilecore.nn.HadamardRotation(64)(torch.randn(2, 32))
    for randomized in (False, True):
        with pytest.raises(ValueError, match=r"HadamardRotation\(64\).inverse needs a last dimension of 64"):
            tilecore.nn.HadamardRotation(64, randomized=randomized).inverse(torch.randn(2, 32))
