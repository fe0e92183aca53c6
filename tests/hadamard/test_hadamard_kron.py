"""hadamard_transform for n = m x 2^k, m not a power of two (orders.py, kron.py, kernels_kron.py): the
matrices, the tl kernel through Triton's interpreter (fused and two-pass), the CPU path, autograd,
transpose, in place, torch.compile and bad input."""
import numpy as np
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.hadamard import configs, hadamard_matrix, hadamard_reference, hadamard_transform, kron, orders


def truncate_to_bf16(t: torch.Tensor) -> torch.Tensor:
    """Round toward zero to bf16, as Triton 3.6's interpreter does (test_hadamard.py has the same helper)."""
    return (t.float().view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


def run_poisoned(x, scale, transpose=False, **tuning):
    """kron.launch into a NaN-filled output: every element must be written."""
    m, p = orders.split(x.shape[-1])
    out = torch.full_like(x, float("nan"))
    kron.launch(kron.kron_plan(x, m, p, **tuning), x, out, scale, transpose and not orders.is_symmetric(m))
    assert torch.isfinite(out).all(), "some outputs were never written"
    return out


@pytest.mark.parametrize("m", orders.LISTED)
def test_every_order_is_hadamard(m):
    h = orders.hadamard_of_order(m)
    assert h.shape == (m, m) and torch.equal(h.abs(), torch.ones(m, m, dtype=torch.float64))
    assert torch.equal(h @ h.T, m * torch.eye(m, dtype=torch.float64))
    assert orders.is_symmetric(m) == (m not in (156, 172))


def test_williamson_search_finds_sequences_that_satisfy_the_definition():
    for w in (13, 43):
        rows = orders.williamson(w)
        mats = [orders._circulant(r) for r in rows]
        assert all((r == 1) | (r == -1) for row in rows for r in row)
        assert all(np.array_equal(a, a.T) for a in mats)  # symmetric circulants
        assert np.array_equal(sum(a @ a for a in mats), 4 * w * np.eye(w, dtype=np.int64))


@pytest.mark.parametrize("n, parts", [(12, (12, 1)), (24, (12, 2)), (40, (20, 2)), (14336, (28, 512)),
                                      (28672, (28, 1024)), (11008, (172, 64)), (18944, (148, 128)),
                                      (4096, (1, 4096)), (6, None), (76, None), (100, None), (60, (60, 1))])
def test_split(n, parts):
    assert orders.split(n) == parts


def test_matrix_is_the_kronecker_product_in_daos_order():
    # element i p + j of a row is X[i, j]: y = (H_m (x) H_p) x, the power-of-two part along contiguous elements
    for n in (24, 40, 156 * 2):
        m, p = orders.split(n)
        expected = torch.kron(orders.hadamard_of_order(m), hadamard_matrix(p))
        assert torch.equal(hadamard_matrix(n), expected)
        x = torch.randn(3, n, dtype=torch.float64)
        assert torch.allclose(hadamard_reference(x), x @ expected.T)


@pytest.mark.parametrize("m, p", [(m, 1 + 3 * (i % 2)) for i, m in enumerate(orders.ORDERS)])
def test_fp16_every_order_at_the_rounding_floor(m, p):
    n = m * p
    x = torch.randn(max(3, 1024 // n), n, dtype=torch.float16)  # >= 1024 elements: the floor's estimate
    for transpose in (False, True) if not orders.is_symmetric(m) else (False,):
        out = run_poisoned(x, n**-0.5, transpose)
        ref = hadamard_reference(x, n**-0.5, out_dtype=torch.float64, transpose=transpose)
        assert accuracy.error_over_floor(out, ref) <= 1.02


@pytest.mark.parametrize("m, p", [(12, 16), (20, 64), (12, 128), (28, 256), (12, 512)])
def test_fp16_slices_of_every_count(m, p):
    """S = 1, 2, 4, 8 slices of Q columns combined by the float32 butterfly."""
    Q, S = kron.slices(p)
    assert Q * S == p
    x = torch.randn(2, m * p, dtype=torch.float16)
    out = run_poisoned(x, 0.125)
    assert accuracy.error_over_floor(out, hadamard_reference(x, 0.125, out_dtype=torch.float64)) <= 1.02


@pytest.mark.parametrize("m, p", [(28, 8), (172, 2), (20, 128)])
def test_bf16_within_the_interpreters_truncation(m, p):
    # the interpreter truncates to bf16 where the GPU rounds to nearest: compare with the exact answer truncated
    x = torch.randn(3, m * p, dtype=torch.bfloat16)
    out = run_poisoned(x, 0.5)
    ref = hadamard_reference(x, 0.5, out_dtype=torch.float64)
    assert accuracy.rel_rms(out, ref) <= 1.02 * accuracy.rel_rms(truncate_to_bf16(ref), ref)


@pytest.mark.parametrize("m, p", [(12, 2), (44, 16), (156, 4)])
def test_fp32_within_1e6(m, p):
    x = torch.randn(3, m * p, dtype=torch.float32) * 1e3
    for transpose in (False, True):
        out = run_poisoned(x, 1.0, transpose)
        assert accuracy.rel_rms(out, hadamard_reference(x, 1.0, out_dtype=torch.float64, transpose=transpose)) <= 1e-6


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_two_pass_path(dtype):
    """Rows too long for one program: H_m X into a float32 workspace in column chunks, then the
    power-of-two kernel (forced here on a small row)."""
    from tilecore.tiles.switches import patched

    x = torch.randn(3, 12 * 64, dtype=dtype)
    with patched(configs, KRON_CHUNK_COLUMNS=16):  # (kron.kernel_plan's memo keys on the patch)
        plan = kron.kron_plan(x, 12, 64, force="two-pass")
    assert plan.path == "two-pass" and plan.config["CHUNKS"] == 4
    out = torch.full_like(x, float("nan"))
    kron.launch(plan, x, out, 0.25)
    ref = hadamard_reference(x, 0.25, out_dtype=torch.float64)
    assert torch.isfinite(out).all()
    if dtype == torch.float16:
        assert accuracy.error_over_floor(out, ref) <= 1.02
    else:
        assert accuracy.rel_rms(out, ref) <= 1e-6


def test_plans_fuse_model_widths_and_split_long_rows():
    def path(n):
        m, p = orders.split(n)
        return kron.kron_plan(torch.empty(1, n), m, p).path
    assert [path(n) for n in (14336, 28672, 11008, 18944, 12 * 2048, 20 * 2048)] == ["fused"] * 5 + ["two-pass"]


def test_long_rows_fold_a_factor_into_the_mixing():
    """p = 2048: H_12 (x) H_2048 = (H_12 (x) H_2) (x) H_1024, one pass over 24 sub-rows of 1024 (the only
    m whose m f sub-rows of 1024 fit a program: 12 x 2048; 20 x 2048 keeps two passes)."""
    x = torch.randn(1, 12 * 2048, dtype=torch.float16)
    plan = kron.kron_plan(x, 12, 2048)
    assert plan.path == "fused" and plan.fold == 2 and plan.config["M"] == 24 and plan.config["P"] == 1024
    out = torch.full_like(x, float("nan"))
    kron.launch(plan, x, out, (12 * 2048) ** -0.5)
    ref = hadamard_reference(x, (12 * 2048) ** -0.5, out_dtype=torch.float64)
    assert torch.isfinite(out).all() and accuracy.error_over_floor(out, ref) <= 1.02


def test_public_call_leading_dims_in_place_and_strides():
    x = torch.randn(2, 3, 20 * 8, dtype=torch.float16)
    ref = hadamard_reference(x, 0.5, out_dtype=torch.float64)
    y = hadamard_transform(x, 0.5)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert accuracy.error_over_floor(y, ref) <= 1.02
    z = x.clone()
    assert hadamard_transform(z, 0.5, inplace=True) is z and torch.equal(z, y)
    wide = torch.randn(4, 2 * 160, dtype=torch.float16)
    view = wide[:, ::2]  # a stride of 2 along n: copied first
    assert accuracy.error_over_floor(hadamard_transform(view, 0.5),
                                     hadamard_reference(view, 0.5, out_dtype=torch.float64)) <= 1.02


@pytest.mark.parametrize("m", [12, 172])
def test_gradient_is_the_transposed_transform(m):
    n = m * 2
    x = torch.randn(3, n, dtype=torch.float32, requires_grad=True)
    g = torch.randn(3, n)
    hadamard_transform(x, 0.3).backward(g)
    assert torch.allclose(x.grad, hadamard_reference(g, 0.3, transpose=True), atol=1e-5)
    # and through the custom op (as torch.compile and modes see it)
    x2 = x.detach().clone().requires_grad_()
    torch.ops.tilecore.hadamard_transform(x2, 0.3, False).backward(g)
    assert torch.allclose(x2.grad, x.grad)


def test_transpose_inverts_the_orthonormal_rotation():
    for n in (172 * 2, 156, 28 * 4):
        x = torch.randn(3, n, dtype=torch.float32)
        y = hadamard_transform(x, n**-0.5)
        back = hadamard_transform(y, n**-0.5, transpose=True)
        assert accuracy.rel_rms(back, x) <= 1e-6


def test_compile_fullgraph_non_power_of_two():
    def f(x):
        return hadamard_transform(x * 2, 0.5, transpose=True) + 1

    x = torch.randn(4, 172, dtype=torch.float32)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert torch.allclose(compiled(x), f(x))
    torch.library.opcheck(torch.ops.tilecore.hadamard_transform.default, (x, 0.5, True))


def test_nan_and_inf_stay_in_their_row():
    x = torch.randn(5, 12 * 16, dtype=torch.float16)
    x[1, 17] = float("nan")
    x[3, 40] = float("inf")
    y = hadamard_transform(x)
    ref = hadamard_reference(x, 1.0, out_dtype=torch.float64)
    assert torch.isnan(y[1]).all() and torch.equal(torch.isnan(y[3]), torch.isnan(ref[3]))
    assert torch.equal(torch.isinf(y[3]), torch.isinf(ref[3])) and torch.isinf(y[3]).all()
    assert accuracy.error_over_floor(y[[0, 2, 4]], ref[[0, 2, 4]]) <= 1.02


class TestCpuPath:
    """CPU tensors without the interpreter: torch's matmul, float32, one rounding."""

    @pytest.fixture(autouse=True)
    def no_interpreter(self, monkeypatch):
        monkeypatch.setenv("TRITON_INTERPRET", "0")

    @pytest.mark.parametrize("m, dtype", [(m, (torch.float32, torch.bfloat16, torch.float16)[i % 3])
                                          for i, m in enumerate(orders.ORDERS)])
    def test_every_order_and_dtype(self, m, dtype):
        n = m * 4
        x = torch.randn(5, n, dtype=dtype)
        for transpose in (False, True):
            y = hadamard_transform(x, n**-0.5, transpose=transpose)
            ref = hadamard_reference(x, n**-0.5, out_dtype=torch.float64, transpose=transpose)
            if dtype == torch.float32:
                assert accuracy.rel_rms(y, ref) <= 1e-6
            else:
                assert accuracy.error_over_floor(y, ref) <= 1.02

    def test_gradcheck(self):
        x = torch.randn(2, 156, dtype=torch.float32, requires_grad=True)  # H_156 is not symmetric
        assert torch.autograd.gradcheck(lambda t: hadamard_transform(t, 0.1), (x,), eps=1e-2, atol=1e-3, rtol=1e-3,
                                        fast_mode=True)

    def test_chunks_and_in_place(self, monkeypatch):
        monkeypatch.setattr(configs, "CPU_CHUNK_ELEMS", 1)  # a row at a time
        x = torch.randn(4, 28 * 256, dtype=torch.bfloat16)
        ref = hadamard_reference(x, 0.1, out_dtype=torch.float64)
        y = hadamard_transform(x, 0.1)
        assert accuracy.error_over_floor(y, ref) <= 1.02
        z = x.clone()
        hadamard_transform(z, 0.1, inplace=True)
        assert torch.equal(z, y)
