"""The register butterfly for n < 16 (ops/hadamard/butterfly.py) through Triton's interpreter: the
transform in every dtype against float64, masking of partial blocks, strides, and the public path."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.hadamard import butterfly, hadamard_reference, hadamard_transform

SMALL_N = [1, 2, 4, 8]


def truncate_to_bf16(t: torch.Tensor) -> torch.Tensor:
    """Round toward zero to bf16, as Triton 3.6's interpreter does (test_hadamard.py has the same helper;
    --import-mode=importlib keeps test files from importing each other)."""
    return (t.float().view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


def block_rows(n):
    return butterfly.BLOCK_ELEMS // n


def run_poisoned(x, scale, extra_rows=0):
    """butterfly.launch into a NaN-filled output followed by ``extra_rows`` more NaN rows, which must
    stay NaN (nothing written past the last row)."""
    rows, n = x.shape
    buf = torch.full((rows + extra_rows, n), float("nan"), dtype=x.dtype)
    butterfly.launch(x, buf[:rows], scale)
    assert torch.isnan(buf[rows:]).all(), "written past the last row"
    out = buf[:rows]
    assert torch.isfinite(out).all(), "some outputs were never written"
    return out


@pytest.mark.parametrize("n", SMALL_N)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 3, "block+1", "2block+5"])
def test_butterfly_matches_float64(n, dtype, rows):
    rows = {"block+1": block_rows(n) + 1, "2block+5": 2 * block_rows(n) + 5}.get(rows, rows)
    x = torch.randn(rows, n, dtype=dtype)
    # bf16: a power-of-two scale adds no rounding, so the float32 result truncates as the exact answer does
    scale = 0.5 if dtype == torch.bfloat16 else n**-0.5
    out = run_poisoned(x, scale, extra_rows=block_rows(n))
    ref = hadamard_reference(x, scale, out_dtype=torch.float64)
    if dtype == torch.float16:
        assert accuracy.error_over_floor(out, ref) <= 1.05
    elif dtype == torch.bfloat16:
        # The interpreter truncates float32 -> bf16 where the GPU rounds to nearest (the floor ratio
        # would read 1.7-2x): the answer must be the exact transform truncated once, bit for bit.
        assert torch.equal(out, truncate_to_bf16(ref))
    else:
        assert accuracy.rel_rms(out, ref) < 1e-6


@pytest.mark.parametrize("n", SMALL_N)
@pytest.mark.parametrize("strided", ["x", "out", "both"])
def test_row_strides_of_wider_tensors(n, strided):
    rows = block_rows(n) + 3
    x = torch.randn(rows, n + 5, dtype=torch.float16)[:, 2:2 + n]  # row stride n + 5
    if strided == "out":
        x = x.contiguous()
    buf = torch.full((rows, 16), float("nan"), dtype=torch.float16)
    out = buf[:, 3:3 + n] if strided != "x" else torch.full((rows, n), float("nan"), dtype=torch.float16)
    butterfly.launch(x, out, 1.0)
    ref = hadamard_reference(x, 1.0, out_dtype=torch.float64)
    assert torch.isfinite(out).all()
    assert torch.isnan(buf[:, :3]).all() and torch.isnan(buf[:, 3 + n:]).all(), "written outside out"
    assert accuracy.error_over_floor(out, ref) <= 1.05


def test_nan_and_inf_stay_in_their_row():
    n = 8
    x = torch.randn(9, n, dtype=torch.float16)
    x[2, 5] = float("nan")
    x[5, 3] = float("inf")
    y = torch.zeros_like(x)  # not NaN-poisoned: every row is checked below, so none can go unwritten
    butterfly.launch(x, y, 1.0)
    assert torch.isnan(y[2]).all()
    assert torch.isinf(y[5]).all()  # +-inf in every output: each is +-x[5, 3] plus finite values
    clean = [0, 1, 3, 4, 6, 7, 8]
    ref = hadamard_reference(x[clean], 1.0, out_dtype=torch.float64)
    assert torch.isfinite(y[clean]).all()
    assert accuracy.error_over_floor(y[clean], ref) <= 1.05


def test_public_path_goes_through_the_butterfly(monkeypatch):
    calls = []
    real = butterfly.launch
    monkeypatch.setattr(butterfly, "launch", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    x = torch.randn(5, 7, 4, dtype=torch.float16)
    y = hadamard_transform(x, 0.5)
    assert calls == [(35, 4)]
    assert y.shape == x.shape and y.dtype == x.dtype
    assert accuracy.error_over_floor(y, hadamard_reference(x, 0.5, out_dtype=torch.float64)) <= 1.05


def test_inplace():
    x = torch.randn(block_rows(8) + 7, 8, dtype=torch.float16)
    expected = hadamard_transform(x, 0.25)
    assert hadamard_transform(x, 0.25, inplace=True) is x
    assert torch.equal(x, expected)
