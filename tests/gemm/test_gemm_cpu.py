"""tilecore.gemm and gemm_fp8 on CPU tensors without Triton's interpreter: torch's CPU matmul (plan
path "cpu"), float32 as is, 16-bit and fp8 upcast to float32 a block at a time, checked against the
float64 references."""
import pytest
import torch

import tilecore
from tilecore import accuracy, dispatch
from tilecore.ops.gemm import configs, launch, plan, reference


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # CPU tensors take torch's CPU path


@pytest.fixture(params=[False, True], ids=["one-block", "many-blocks"])
def blocks(request, monkeypatch):
    """Also with blocks of 64 x 64 (the minimum), so that the loops over blocks and their edges run."""
    if request.param:
        monkeypatch.setattr(configs, "CPU_BLOCK_ELEMS", 1)
    return request.param


@pytest.fixture(params=[False, True], ids=["this-cpu", "no-native-16bit"])
def upcast_cpu(request, monkeypatch):
    """The plan multiplies 16-bit operands natively where this CPU can (AVX512-BF16, AMX) and upcasts
    elsewhere: also as on a CPU without native 16-bit matmul, so both paths run on any machine."""
    if request.param:
        monkeypatch.setattr(dispatch, "cpu_native_matmul", lambda dtype: dtype == torch.float32)
    return request.param


SHAPES = [(1, 1, 1), (70, 45, 100), (130, 200, 33), (5, 129, 64)]


@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias_dtype", [None, "same", torch.float32])
def test_matches_float64(M, N, K, dtype, bias_dtype, blocks, upcast_cpu):
    a = torch.randn(M, K, dtype=dtype)
    b = torch.randn(K, N, dtype=dtype)
    bias = None if bias_dtype is None else torch.randn(N, dtype=dtype if bias_dtype == "same" else bias_dtype)
    ref = reference.gemm_f64(a, b, bias)
    p = plan.plan(a, b, out_dtype=dtype, bias=bias)
    # native: float32, or a 16-bit dtype the CPU multiplies natively with nothing that needs more precision
    native = dtype == torch.float32 or (dispatch.cpu_native_matmul(dtype) and (bias is None or bias.dtype == dtype))
    assert not (upcast_cpu and native and dtype != torch.float32)
    assert p.path == "cpu" and (p.operand_dtype is None) == native
    if blocks and not native:
        assert p.block == (min(M, 64), min(N, 64))
    for out_dtype in {dtype, torch.float32, torch.bfloat16}:
        out = tilecore.gemm(a, b, bias=bias, out_dtype=out_dtype)
        assert out.shape == (M, N) and out.dtype == out_dtype
        if out_dtype == torch.float32:
            assert accuracy.rel_rms(out, ref) < 1e-6
        else:  # accumulated in float32, rounded once
            assert accuracy.error_over_floor(out, ref) < 1.05


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_native_16_bit_matmul_where_the_cpu_has_it(monkeypatch, dtype):
    """Where dispatch says the CPU multiplies 16-bit natively, torch.mm runs in that dtype (its own fp32
    accumulation); a float32 bias or output still goes through float32."""
    monkeypatch.setattr(dispatch, "cpu_native_matmul", lambda dt: True)
    a = torch.randn(40, 50, dtype=dtype)
    b = torch.randn(50, 30, dtype=dtype)
    bias = torch.randn(30, dtype=dtype)
    p = plan.plan(a, b, out_dtype=dtype, bias=bias)
    assert p.path == "cpu" and p.operand_dtype is None
    assert accuracy.error_over_floor(tilecore.gemm(a, b, bias=bias), reference.gemm_f64(a, b, bias)) < 1.6
    assert plan.plan(a, b, out_dtype=torch.float32).operand_dtype == torch.float32
    assert plan.plan(a, b, out_dtype=dtype, bias=bias.float()).operand_dtype == torch.float32


@pytest.mark.parametrize("rows", [False, True])
def test_fp8(rows, blocks):
    M, N, K = 150, 70, 96
    a = (torch.randn(M, K) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(N, K) * 4).to(torch.float8_e4m3fn).t()
    sa = torch.rand(M, 1) + 0.5 if rows else torch.tensor(0.75)
    sb = torch.rand(1, N) + 0.5 if rows else torch.tensor(1.25)
    ref = reference.gemm_fp8_f64(a, b, sa, sb)
    assert accuracy.error_over_floor(tilecore.gemm_fp8(a, b, sa, sb), ref) < 1.05
    assert accuracy.rel_rms(tilecore.gemm_fp8(a, b, sa, sb, out_dtype=torch.float32), ref) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_writes_into_a_strided_out_and_nowhere_else(dtype, blocks):
    M, N, K = 90, 77, 50
    a = torch.randn(M, K, dtype=dtype)
    b = torch.randn(K, N, dtype=dtype)
    bias = torch.randn(N)
    for out_dtype in (torch.float32, torch.float16):
        big = torch.full((M + 3, N + 5), float("nan"), dtype=out_dtype)
        c = big[1:M + 1, 2:N + 2]
        assert launch.launch(plan.plan(a, b, out_dtype=out_dtype, bias=bias), a, b, bias, out=c) is c
        assert torch.isfinite(c).all()
        assert torch.isnan(big[0]).all() and torch.isnan(big[M + 1:]).all()
        assert torch.isnan(big[:, :2]).all() and torch.isnan(big[:, N + 2:]).all()
        assert accuracy.rel_rms(c, reference.gemm_f64(a, b, bias)) < 1e-3


def test_empty_products_and_nonfinite_rows():
    bias = torch.randn(3, dtype=torch.bfloat16)
    out = tilecore.gemm(torch.randn(4, 0, dtype=torch.bfloat16), torch.randn(0, 3, dtype=torch.bfloat16), bias=bias)
    assert torch.equal(out, bias.expand(4, 3))
    assert tilecore.gemm(torch.randn(0, 5), torch.randn(5, 3)).shape == (0, 3)
    assert tilecore.gemm(torch.randn(2, 0, 5), torch.randn(5, 3)).shape == (2, 0, 3)
    a = torch.randn(6, 20, dtype=torch.bfloat16)
    b = torch.randn(20, 9, dtype=torch.bfloat16)
    a[1, 3] = float("nan")
    a[4, 0] = float("inf")
    out = tilecore.gemm(a, b)
    assert torch.isnan(out[1]).all() and not torch.isfinite(out[4]).all()
    clean = [0, 2, 3, 5]
    assert torch.isfinite(out[clean]).all()
    assert accuracy.error_over_floor(out[clean], reference.gemm_f64(a[clean], b)) < 1.05


def test_autograd_and_batches_on_the_cpu_path():
    x = torch.randn(2, 5, 16, requires_grad=True)
    w = torch.randn(16, 8, requires_grad=True)
    out = tilecore.gemm(x, w)
    ref = x.detach().double() @ w.detach().double()
    assert out.shape == (2, 5, 8) and accuracy.rel_rms(out.detach(), ref) < 1e-6
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(2, 5, 8) @ w.detach().t())
    torch.testing.assert_close(w.grad, x.detach().reshape(10, 16).t() @ torch.ones(10, 8))


def test_blocks_bound_the_temporaries(monkeypatch):
    """A 2048^3 bf16 GEMM on a CPU without native bf16 matmul converts A and B in blocks of at most
    CPU_BLOCK_ELEMS elements (and C's block too), not whole float32 copies."""
    monkeypatch.setattr(dispatch, "cpu_native_matmul", lambda dtype: dtype == torch.float32)
    a = torch.empty(2048, 2048, dtype=torch.bfloat16)
    p = plan.plan(a, a, out_dtype=torch.bfloat16)
    bm, bn = p.block
    assert bm * 2048 <= configs.CPU_BLOCK_ELEMS and 2048 * bn <= configs.CPU_BLOCK_ELEMS
    assert bm * bn <= configs.CPU_BLOCK_ELEMS and min(bm, bn) >= 64
    x = torch.empty(4096, 64, dtype=torch.bfloat16)  # small K: wide blocks, C's block still bounded
    bm, bn = plan.plan(x, torch.empty(64, 4096, dtype=torch.bfloat16), out_dtype=torch.bfloat16).block
    assert bm * bn <= configs.CPU_BLOCK_ELEMS and bn == 4096
    a8 = torch.empty(2048, 2048, dtype=torch.float8_e4m3fn)  # fp8's B converts whole, once
    bm, bn = plan.plan(a8, a8, out_dtype=torch.bfloat16, scales=(torch.ones(1), torch.ones(1))).block
    assert bn == 2048 and bm * 2048 <= configs.CPU_BLOCK_ELEMS
