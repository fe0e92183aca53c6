"""tilecore.gemm and gemm_fp8 on the CPU: the tl kernel through the interpreter (the same template
and tile code the Hopper kernel is written with), checked against float64."""
import pytest
import torch

import tilecore
from tilecore import accuracy
from tilecore import dispatch
from tilecore.ops.gemm import configs, launch, plan, reference


def rel(out, ref):
    return accuracy.rel_rms(out, ref)


SHAPES = [(1, 1, 1), (70, 45, 100), (33, 65, 17), (64, 96, 128), (5, 130, 40)]


@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemm_matches_float64(M, N, K, dtype):
    a = torch.randn(M, K, dtype=dtype)
    b = torch.randn(K, N, dtype=dtype)
    out = tilecore.gemm(a, b)
    assert out.shape == (M, N) and out.dtype == dtype
    ref = reference.gemm_f64(a, b)
    assert torch.isfinite(out).all()
    assert accuracy.error_over_floor(out, ref) < 1.6


def test_bias_out_dtype_and_layouts():
    a = torch.randn(40, 72, dtype=torch.float16)
    bt = torch.randn(50, 72, dtype=torch.float16)  # B^T row-major: b is a column-major view
    bias = torch.randn(50)
    out = tilecore.gemm(a, bt.t(), bias=bias, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert rel(out, reference.gemm_f64(a, bt.t(), bias)) < 1e-6
    a_view = torch.randn(72, 40, dtype=torch.float16).t()  # non-contiguous A
    out = tilecore.gemm(a_view, bt.t(), bias=bias.half())
    assert accuracy.error_over_floor(out, reference.gemm_f64(a_view, bt.t(), bias.half())) < 1.6


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_every_element_written(dtype):
    # the launcher writes into a poisoned buffer; every element must be overwritten, none outside
    M, N, K = 45, 77, 50
    a = torch.randn(M, K, dtype=torch.float16)
    b = torch.randn(K, N, dtype=torch.float16)
    big = torch.full((M + 3, N + 5), float("nan"), dtype=dtype)
    c = big[1:M + 1, 2:N + 2]
    p = plan.plan(a, b, out_dtype=dtype, config=configs.TL_CPU)
    assert p.path == "tl" and p.c_dtype == dtype  # written in place
    launch.launch(p, a, b, out=c)
    assert torch.isfinite(c).all()
    assert torch.isnan(big[0]).all() and torch.isnan(big[M + 1:]).all()
    assert torch.isnan(big[:, :2]).all() and torch.isnan(big[:, N + 2:]).all()
    assert rel(c, reference.gemm_f64(a, b)) < 2e-3


# (M, N, K) whose 32 x 32 tiles leave the interpreter's 3 programs a partial last wave, with K long
# enough (>= 8 steps of 32) for the stream-K tail: 4 tiles, 5 tiles with a K tail, 1 tile over 3 programs
STREAM_K_SHAPES = [(64, 64, 256), (160, 32, 300), (20, 30, 400)]


@pytest.mark.parametrize("M,N,K", STREAM_K_SHAPES)
def test_stream_k_tail_matches_float64(M, N, K):
    from tilecore.tiles import schedule

    tiles, k_steps = schedule.num_tiles(M, N, 32, 32), -(-K // 32)
    assert schedule.stream_k_plan(tiles, k_steps, torch.device("cpu"), "always")[1] > 0  # the case is stream-K
    a = torch.randn(M, K, dtype=torch.float16)
    b = torch.randn(K, N, dtype=torch.float16)
    bias = torch.randn(N)
    ref = reference.gemm_f64(a, b, bias)
    outs = []
    for _ in range(2):  # the flags a launch leaves must let the next one run the same way
        big = torch.full((M + 2, N + 2), float("nan"))
        c = big[1:M + 1, 1:N + 1]
        p = plan.plan(a, b, out_dtype=torch.float32, bias=bias, config=configs.TL_CPU)
        assert p.stream_k and p.c_dtype == torch.float32
        launch.launch(p, a, b, bias, out=c)
        assert torch.isnan(big[0]).all() and torch.isnan(big[M + 1]).all()
        assert torch.isnan(big[:, 0]).all() and torch.isnan(big[:, N + 1]).all()
        assert torch.isfinite(c).all() and rel(c, ref) < 1e-6
        _, flags = schedule.stream_k_buffers(torch.device("cpu"), 1, 1)
        assert (flags == 0).all()
        outs.append(c.clone())
    assert torch.equal(outs[0], outs[1])
    whole = torch.empty(M, N)
    p = plan.plan(a, b, out_dtype=torch.float32, bias=bias, config=dict(configs.TL_CPU, stream_k="off"))
    assert not p.stream_k
    launch.launch(p, a, b, bias, out=whole)
    assert rel(whole, ref) < 1e-6


def test_tile_orders_agree():
    a = torch.randn(100, 64, dtype=torch.float16)
    b = torch.randn(64, 120, dtype=torch.float16)
    outs = []
    for group in (1, 2, 8):
        c = torch.full((100, 120), float("nan"))
        launch.launch(plan.plan(a, b, out_dtype=torch.float32, config=dict(configs.TL_CPU, group_m=group)), a, b,
                      out=c)
        outs.append(c)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_empty_and_zero_k():
    a = torch.randn(4, 0, dtype=torch.float16)
    b = torch.randn(0, 3, dtype=torch.float16)
    bias = torch.randn(3, dtype=torch.float16)
    torch.testing.assert_close(tilecore.gemm(a, b, bias=bias), bias.expand(4, 3))
    assert tilecore.gemm(torch.randn(0, 5, dtype=torch.float16), torch.randn(5, 3, dtype=torch.float16)).shape == (0, 3)


def test_autograd_matches_float64():
    a = torch.randn(30, 40, dtype=torch.float16, requires_grad=True)
    b = torch.randn(40, 20, dtype=torch.float16, requires_grad=True)
    bias = torch.randn(20, requires_grad=True)
    w = torch.randn(30, 20, dtype=torch.float64)
    (tilecore.gemm(a, b, bias=bias, out_dtype=torch.float32).double() * w).sum().backward()
    a64, b64, bias64 = (t.detach().double().requires_grad_() for t in (a, b, bias))
    ((a64 @ b64 + bias64) * w).sum().backward()
    assert rel(a.grad, a64.grad) < 2e-3 and rel(b.grad, b64.grad) < 2e-3
    assert rel(bias.grad, bias64.grad) < 1e-6


def test_custom_op_opcheck_and_compile():
    a = torch.randn(24, 40, dtype=torch.float16)
    b = torch.randn(40, 16, dtype=torch.float16)
    torch.library.opcheck(torch.ops.tilecore.gemm.default, (a, b, None, torch.float16),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    f = torch.compile(lambda x, y: tilecore.gemm(x, y) * 2, fullgraph=True, backend="eager")
    torch.testing.assert_close(f(a, b), tilecore.gemm(a, b) * 2)


def test_float32_through_the_interpreter():
    a = torch.randn(50, 70)
    b = torch.randn(70, 40)
    bias = torch.randn(40)
    p = plan.plan(a, b, out_dtype=torch.float32, bias=bias)
    assert p.path == "tl" and p.operand_dtype == torch.float32
    assert rel(tilecore.gemm(a, b, bias=bias), reference.gemm_f64(a, b, bias)) < 1e-6
    out = tilecore.gemm(a, b, out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16 and accuracy.error_over_floor(out, reference.gemm_f64(a, b)) < 1.05


def test_float32_is_for_cpu_tensors_only(monkeypatch):
    monkeypatch.setattr(dispatch, "backend_for", lambda device: "kernel")  # meta tensors stand in for a GPU's
    a = torch.empty(4, 4, device="meta")
    with pytest.raises(TypeError, match="float32 on CPU tensors only"):
        tilecore.gemm(a, a)


def test_leading_batch_dimensions():
    """A [B, S, K] times B [K, N], as torch.matmul and F.linear take it: C [B, S, N], gradients too."""
    x = torch.randn(2, 3, 40, dtype=torch.float16, requires_grad=True)
    w = torch.randn(40, 24, dtype=torch.float16, requires_grad=True)
    bias = torch.randn(24)
    out = tilecore.gemm(x, w, bias=bias, out_dtype=torch.float32)
    assert out.shape == (2, 3, 24)
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    ref = x64 @ w64 + bias.double()
    assert rel(out.detach(), ref.detach()) < 1e-6
    g = torch.randn(2, 3, 24, dtype=torch.float64)
    (out.double() * g).sum().backward()
    (ref * g).sum().backward()
    assert x.grad.shape == x.shape and rel(x.grad, x64.grad) < 2e-3 and rel(w.grad, w64.grad) < 2e-3
    a = torch.randn(8, 5, 6, dtype=torch.bfloat16)[:, ::2]  # a strided batch: reshaped (copied) first
    b = torch.randn(6, 7, dtype=torch.bfloat16)
    assert tilecore.gemm(a, b).shape == (8, 3, 7)
    assert accuracy.error_over_floor(tilecore.gemm(a, b), a.double() @ b.double()) < 1.6
    assert tilecore.gemm(torch.randn(0, 3, 6, dtype=torch.float16), b.half()).shape == (0, 3, 7)
    a8 = (torch.randn(2, 3, 32) * 4).to(torch.float8_e4m3fn)
    b8 = (torch.randn(16, 32) * 4).to(torch.float8_e4m3fn).t()
    sa, sb = torch.rand(2, 3, 1) + 0.5, torch.rand(1, 16) + 0.5  # per row of every matrix of the batch
    out = tilecore.gemm_fp8(a8, b8, sa, sb, out_dtype=torch.float32)
    assert out.shape == (2, 3, 16)
    assert rel(out, reference.gemm_fp8_f64(a8.reshape(6, 32), b8, sa.reshape(6), sb).reshape(2, 3, 16)) < 1e-6
    with pytest.raises(ValueError, match="scale_a"):
        tilecore.gemm_fp8(a8, b8, torch.rand(3, 2, 1), sb)  # 6 elements, but not the batch's layout


def test_gemm_fp8_backward_is_tilecores_error():
    a = torch.randn(8, 16).to(torch.float8_e4m3fn)
    b = torch.randn(4, 16).to(torch.float8_e4m3fn).t()
    scale = torch.tensor(0.5, requires_grad=True)
    out = tilecore.gemm_fp8(a, b, scale, torch.tensor(1.0))
    assert out.requires_grad
    with pytest.raises(NotImplementedError, match="gemm_fp8 has no backward.*tilecore.gemm in bfloat16"):
        out.float().sum().backward()


@pytest.mark.parametrize("rows", [False, True])
def test_gemm_fp8(rows):
    M, N, K = 40, 48, 64
    a = (torch.randn(M, K) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(N, K) * 4).to(torch.float8_e4m3fn).t()
    sa = torch.rand(M, 1) + 0.5 if rows else torch.tensor(0.75)
    sb = torch.rand(1, N) + 0.5 if rows else torch.tensor(1.25)
    out = tilecore.gemm_fp8(a, b, sa, sb)
    assert out.dtype == torch.bfloat16
    assert accuracy.error_over_floor(out, reference.gemm_fp8_f64(a, b, sa, sb)) < 1.6
    out32 = tilecore.gemm_fp8(a, b, sa, sb, out_dtype=torch.float32)
    assert rel(out32, reference.gemm_fp8_f64(a, b, sa, sb)) < 1e-6


@pytest.mark.parametrize("args,kwargs,exc,match", [
    ((torch.randn(3, 4, dtype=torch.float16), torch.randn(4, 5, dtype=torch.bfloat16)), {}, TypeError, "one dtype"),
    ((torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)), {}, TypeError,
     "bfloat16, float16, float32"),
    ((torch.randn(3, 4, dtype=torch.float16), torch.randn(5, 5, dtype=torch.float16)), {}, ValueError, "K = 4"),
    ((torch.randn(2, 3, 4, dtype=torch.float16), torch.randn(5, 5, dtype=torch.float16)), {}, ValueError, "2x3x4"),
    ((torch.randn(4, dtype=torch.float16), torch.randn(4, 5, dtype=torch.float16)), {}, ValueError, r"\[\.\.\., M, K\]"),
    ((torch.randn(3, 4, dtype=torch.float16), torch.randn(2, 4, 5, dtype=torch.float16)), {}, ValueError,
     r"2-D matrix \[K, N\]"),
    ((torch.randn(3, 4, dtype=torch.float16), torch.randn(4, 5, dtype=torch.float16)),
     {"bias": torch.randn(4)}, ValueError, "N = 5"),
    ((torch.randn(3, 4, dtype=torch.float16), torch.randn(4, 5, dtype=torch.float16)),
     {"bias": torch.randn(5, dtype=torch.float64)}, TypeError, "bias"),
    ((torch.randn(3, 4, dtype=torch.float16), torch.randn(4, 5, dtype=torch.float16)),
     {"out_dtype": torch.int8}, TypeError, "out_dtype"),
])
def test_gemm_errors(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        tilecore.gemm(*args, **kwargs)


def test_gemm_fp8_errors():
    a = torch.randn(8, 16).to(torch.float8_e4m3fn)
    b = torch.randn(16, 4).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    with pytest.raises(TypeError, match="one dtype"):
        tilecore.gemm_fp8(a, b.half(), one, one)
    with pytest.raises(ValueError, match="K = 8"):
        tilecore.gemm_fp8(a, torch.randn(8, 4).to(torch.float8_e4m3fn), one, one)
    with pytest.raises(ValueError, match="scale_a"):
        tilecore.gemm_fp8(a, b, torch.ones(3), torch.ones(4))
    with pytest.raises(TypeError, match="float32"):
        tilecore.gemm_fp8(a, b, one.half(), one)


def test_gluon_plan_is_for_hopper_only():
    a = torch.randn(64, 64, dtype=torch.bfloat16)
    assert plan.plan(a, a, out_dtype=torch.bfloat16).path == "tl"
    assert plan.plan(a, a, out_dtype=torch.bfloat16, path="gluon").path == "tl"


def as_if_hopper(monkeypatch):
    """Plans for CPU tensors as for CUDA tensors on an H100 (the plan asks only dispatch)."""
    monkeypatch.setattr(dispatch, "interpreted", lambda device: False)
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: True)


@pytest.mark.parametrize("napkin_topk", [0, 4])
def test_hopper_plans(monkeypatch, napkin_topk):
    """The fit checks of plan.plan, as on Hopper: which kernel, configuration and operand form. CPU
    tensors cannot time the napkin's candidates (configs.NAPKIN_TOPK): the table's rows either way."""
    as_if_hopper(monkeypatch)
    monkeypatch.setattr(configs, "NAPKIN_TOPK", napkin_topk)
    a = torch.randn(256, 512, dtype=torch.bfloat16)
    b = torch.randn(512, 384, dtype=torch.bfloat16)
    p = plan.plan(a, b, out_dtype=torch.bfloat16)
    assert p.path == "gluon" and p.config is configs.GLUON_BF16 and not (p.b_t or p.copy_a or p.copy_b)
    assert plan.plan(a, b.t().contiguous().t(), out_dtype=torch.float32).b_t  # column-major B: B^T as is
    assert plan.plan(a[:, :256], b[:256], out_dtype=torch.bfloat16).config is configs.GLUON_BF16_SMALL_K
    p = plan.plan(a.t().contiguous().t(), b[:, 1:257], out_dtype=torch.bfloat16)  # B's base 2 bytes off
    assert p.path == "gluon" and p.copy_a and p.copy_b and not p.b_t  # both copied row-major
    p = plan.plan(a, b[:, :100], out_dtype=torch.bfloat16)  # rows of 200 bytes: not TMA's
    assert p.path == "tl" and p.config is configs.TL_GPU and "TMA cannot describe" in p.notice
    assert plan.plan(a, b, out_dtype=torch.bfloat16, path="tl").path == "tl"
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    p = plan.plan(a8, b8, out_dtype=torch.bfloat16, scales=(torch.ones(256, 1), torch.ones(1)))
    assert p.path == "gluon" and p.config is configs.GLUON_FP8 and p.b_t and p.copy_b and p.scales == 2
    assert plan.plan(a8, b8.t().contiguous().t(), out_dtype=torch.bfloat16,
                     scales=(torch.ones(1), torch.ones(384))).copy_b is False
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: False)
    p = plan.plan(a, b, out_dtype=torch.bfloat16)
    assert p.path == "tl" and p.config is configs.TL_GPU and "older than Hopper" in p.notice
