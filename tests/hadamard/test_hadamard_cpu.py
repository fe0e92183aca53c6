"""hadamard_transform on CPU tensors without Triton's interpreter: torch's CPU matmul in float32 (plan
path "cpu": one product with H_n for small n, two with H_a and H_b above), against float64."""
import pytest
import torch

import tilecore
from tilecore import accuracy
from tilecore.ops.hadamard import configs, hadamard_reference, hadamard_transform, plan

ALL_N = sorted(configs.SPLITS)


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # CPU tensors take torch's CPU path


@pytest.fixture(params=[False, True], ids=["one-chunk", "chunks"])
def chunks(request, monkeypatch):
    """Also a row or two at a time, so that the loop over chunks and its last, partial chunk run."""
    if request.param:
        monkeypatch.setattr(configs, "CPU_CHUNK_ELEMS", 1)
    return request.param


@pytest.mark.parametrize("n", ALL_N)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_float64(n, dtype):
    x = torch.randn(max(2, 2**13 // n) + 1, n, dtype=dtype)
    y = hadamard_transform(x, n**-0.5)
    assert y.dtype == dtype and y.shape == x.shape
    ref = hadamard_reference(x, n**-0.5, out_dtype=torch.float64)
    if dtype == torch.float32:
        assert accuracy.rel_rms(y, ref) <= 1e-6
    else:  # exact inputs, float32 sums, one rounding
        assert accuracy.error_over_floor(y, ref) <= 1.01


@pytest.mark.parametrize("n", [1, 8, 128, 256, 2048])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunks_in_place_and_strided(n, dtype, chunks):
    x = torch.randn(5, n + 3, dtype=dtype)[:, :n]  # rows 3 elements apart
    ref = hadamard_reference(x, 0.5, out_dtype=torch.float64)
    y = hadamard_transform(x, 0.5)
    tol = 1e-6 if dtype == torch.float32 else 2 * accuracy.rounding_floor(ref, dtype)
    assert accuracy.rel_rms(y, ref) <= tol
    z = x.contiguous()
    assert hadamard_transform(z, 0.5, inplace=True) is z and torch.equal(z, y)
    base = torch.randn(5, 2, n, dtype=dtype)
    view = base[:, 1]
    expected = hadamard_transform(view.clone(), 0.5)
    hadamard_transform(view, 0.5, inplace=True)
    assert torch.equal(base[:, 1], expected)


def test_plans_one_product_then_two():
    for n in ALL_N:
        p = plan.plan(torch.empty(3, n), torch.empty(3, n))
        a, b = p.config["factors"]
        assert p.path == "cpu" and a * b == n and a <= b
        assert (a == 1) == (n <= configs.CPU_DENSE_MAX_N)
        assert p.config["rows"] * n <= max(n, configs.CPU_CHUNK_ELEMS)


def test_nan_and_inf_stay_in_their_row():
    for n in (64, 1024):
        x = torch.randn(9, n, dtype=torch.float16)
        x[2, 17] = float("nan")
        x[5, 3] = float("inf")
        y = hadamard_transform(x)
        assert torch.isnan(y[2]).all()
        assert not torch.isfinite(y[5]).any()  # +-inf everywhere (or NaN where the float32 sums meet both)
        clean = [0, 1, 3, 4, 6, 7, 8]
        assert torch.isfinite(y[clean]).all()
        assert accuracy.error_over_floor(y[clean], hadamard_reference(x[clean], 1.0, out_dtype=torch.float64)) <= 1.01


def test_autograd_and_rotation():
    x = torch.randn(4, 512, requires_grad=True)
    g = torch.randn(4, 512)
    hadamard_transform(x, 0.3).backward(g)
    assert accuracy.rel_rms(x.grad, hadamard_reference(g, 0.3, out_dtype=torch.float64)) <= 1e-6
    rot = tilecore.nn.HadamardRotation(4096, randomized=True, seed=0)
    v = torch.randn(3, 4096)
    assert torch.allclose(rot.inverse(rot(v)), v, atol=1e-5)


def test_n1_with_a_strided_last_dimension():
    x = torch.randn(1, 5).t()  # (5, 1) with stride 5 along n
    assert torch.equal(hadamard_transform(x, 2.0), x * 2.0)


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_small_n_packed_sixteen_wide(n, dtype, chunks):
    """Rows of n < 16 packed 16 // n at a time (launch._cpu_h_packed), in place too."""
    x = torch.randn(48, n, dtype=dtype)  # 48 n elements: a multiple of 16
    ref = hadamard_reference(x, 0.25, out_dtype=torch.float64)
    y = hadamard_transform(x, 0.25)
    if dtype == torch.float32:
        assert accuracy.rel_rms(y, ref) <= 1e-6
    else:
        assert accuracy.error_over_floor(y, ref) <= 1.01
    # in place runs the product a chunk of rows at a time, out of place as one product: float32 sums of
    # the same 16 terms may round differently between the BLAS kernels a CPU picks for the two shapes
    assert hadamard_transform(x, 0.25, inplace=True) is x
    if dtype == torch.float32:
        assert accuracy.rel_rms(x, ref) <= 1e-6 and torch.allclose(x, y, rtol=1e-6, atol=1e-7)
    else:
        assert accuracy.error_over_floor(x, ref) <= 1.01
