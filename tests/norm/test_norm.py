"""layer_norm's Triton kernels through the interpreter: forward and backward against float64, the wide-row
path, dropout (statistics, reproducibility, the same mask forward and backward), NaN/inf, torch.compile,
bad input, offsets past 2^31 elements."""
import math

import pytest
import torch
import torch.nn.functional as F
from norm_testing import assert_close_to, make_inputs, run_and_check

import triton
import triton.language as tl

from tilecore.ops.norm import configs, dropout_mask, launch, layer_norm, layer_norm_reference, plan

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    """Every kernel output starts as NaN: a result that is finite was written."""
    monkeypatch.setattr(launch, "output", lambda shape, dtype, device: torch.full(shape, math.nan, dtype=dtype,
                                                                                  device=device))


@pytest.fixture
def wide(monkeypatch):
    """Rows wider than 64 take the two-kernel path, 64 columns at a time."""
    monkeypatch.setattr(configs, "WHOLE_ROW_MAX", 64)
    monkeypatch.setattr(configs, "WIDE_BLOCK", 64)


@pytest.mark.parametrize("n", [1, 7, 64, 300, 1024])
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_float64(n, rms, dtype):
    if dtype == torch.bfloat16 and n < 64:
        pytest.skip("interpreted bf16 truncates: over so few elements its error ratio is noise (test_norm_cpu.py)")
    x, w, b, r = make_inputs(9, n, dtype, shift=3.0)
    run_and_check(x, w, b, r, rms=rms)


@pytest.mark.parametrize("case", ["no weight, no bias", "no residual", "float32 residual", "float32 weight",
                                  "not prenorm", "dropout", "dropout, no residual", "dropout, float32 residual"])
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_variants(case, rms):
    dtype = torch.float16
    x, w, b, r = make_inputs(
        6, 96, dtype, weight="weight" not in case, bias="bias" not in case, residual="no residual" not in case,
        res_dtype=torch.float32 if "float32 residual" in case else None,
        param_dtype=torch.float32 if "float32 weight" in case else None)
    run_and_check(x, w, b, r, rms=rms, prenorm=case != "not prenorm", dropout_p=0.25 if "dropout" in case else 0.0)


@pytest.mark.parametrize("n, rms, dropout_p", [(65, False, 0.3), (200, False, 0.0), (65, True, 0.0),
                                                (200, True, 0.3)])
def test_wide_rows(wide, n, rms, dropout_p):
    assert not plan.plan(3, n, torch.device("cpu")).whole_row
    x, w, b, r = make_inputs(3, n, torch.float16, shift=100.0)  # a large mean: the merged statistics hold
    run_and_check(x, w, b, r, rms=rms, dropout_p=dropout_p)


def test_wide_rows_give_what_whole_rows_give(monkeypatch):
    """The mask is keyed by the element's place, not the tiling: both paths draw the same one."""
    x, w, b, r = make_inputs(2, 130, torch.float32)
    outs = []
    for whole_row_max in (8192, 64):
        monkeypatch.setattr(configs, "WHOLE_ROW_MAX", whole_row_max)
        y, h = layer_norm(x, w, b, residual=r, dropout_p=0.5, prenorm=True,
                          generator=torch.Generator().manual_seed(1))
        outs.append((y.detach(), torch.autograd.grad(y.sum(), (x, w, b, r))))
    (y0, g0), (y1, g1) = outs
    torch.testing.assert_close(y1, y0, rtol=1e-5, atol=1e-5)
    for a, c in zip(g1, g0):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-4)


def test_dropout_statistics_and_reproducibility():
    rows, n = 32, 512
    for p in (0.1, 0.5):
        x = torch.ones(rows, n)
        keep = dropout_mask(x, p, torch.Generator().manual_seed(11))
        sigma = math.sqrt(p * (1 - p) / keep.numel())
        assert abs(keep.float().mean().item() - (1 - p)) < 5 * sigma
        # one Philox call serves 8 columns: each of the 8 lanes is kept as often, and neighbours
        # (within a call, and across calls and rows) independently
        lanes = keep.float().view(rows, n // 8, 8).mean((0, 1))
        assert ((lanes - (1 - p)).abs() < 5 * sigma * math.sqrt(8)).all()
        k = keep.float()
        for both in ((k[:, :-1] * k[:, 1:]).mean(), (k[:, 7:-1:8] * k[:, 8::8]).mean(), (k[:-1] * k[1:]).mean()):
            assert abs(both.item() - (1 - p) ** 2) < 0.02
        # h = dropout(1): mean 1, variance p / (1 - p)
        _, h = layer_norm(x, None, prenorm=True, dropout_p=p, generator=torch.Generator().manual_seed(11))
        assert torch.equal(h != 0, keep)
        assert abs(h.mean().item() - 1) < 5 * sigma / (1 - p)
        assert abs(h.var().item() - p / (1 - p)) < 0.05 * p / (1 - p)
    same = dropout_mask(x, 0.5, torch.Generator().manual_seed(3))
    assert torch.equal(same, dropout_mask(x, 0.5, torch.Generator().manual_seed(3)))
    assert not torch.equal(same, dropout_mask(x, 0.5, torch.Generator().manual_seed(4)))
    assert torch.equal(dropout_mask(x, 0.0), torch.ones_like(same)) and not dropout_mask(x, 1.0).any()


def test_backward_uses_the_forward_mask():
    x, w, b, r = make_inputs(16, 128, torch.float32)
    p = 0.4
    y, h = layer_norm(x, w, b, residual=r, dropout_p=p, prenorm=True, generator=torch.Generator().manual_seed(5))
    keep = dropout_mask(x, p, torch.Generator().manual_seed(5))
    dx, dres = torch.autograd.grad(y.sum(), (x, r))
    assert torch.equal(dx != 0, keep)  # dres has no zeros (random dh); dx is 0 exactly where dropped
    torch.testing.assert_close(dx[keep], dres[keep] / (1 - p), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(h - r, torch.where(keep, x / (1 - p), 0).detach(), rtol=1e-6, atol=1e-6)


def test_nan_and_inf_as_torch():
    x = torch.randn(8, 64)
    x[2, 5] = math.nan
    x[5, 7] = math.inf
    w, b = torch.randn(64), torch.randn(64)
    for rms in (False, True):
        y = layer_norm(x, w, b, rms=rms)
        expected = F.rms_norm(x, (64,), w, 1e-5) + b if rms else F.layer_norm(x, (64,), w, b, 1e-5)
        assert torch.equal(torch.isnan(y), torch.isnan(expected)) and torch.isnan(y[2]).all()
        assert torch.equal(torch.isinf(y), torch.isinf(expected))
        clean = [0, 1, 3, 4, 6, 7]
        ref, _ = layer_norm_reference(x[clean], w, b, rms=rms)
        assert_close_to(y[clean], ref, "clean rows")
    # a dropped NaN is still NaN (x * 0), as in torch's dropout
    y = layer_norm(x, w, b, dropout_p=0.999, generator=torch.Generator().manual_seed(0))
    assert torch.isnan(y[2]).all() and torch.isnan(y[5]).all() and not torch.isnan(y[[0, 1, 3, 4, 6, 7]]).any()


def test_shapes_strides_and_empty():
    x = torch.randn(2, 3, 80, dtype=torch.float16)[:, :, ::2]  # (2, 3, 40), stride 2 along the row
    w = torch.randn(40, dtype=torch.float16)
    ref, _ = layer_norm_reference(x, w)
    assert_close_to(layer_norm(x, w), ref, "strided")
    xt = torch.randn(40, 6).t()  # rows 1 element apart
    assert_close_to(layer_norm(xt, None), layer_norm_reference(xt)[0], "transposed")
    e = torch.randn(0, 5, 16, requires_grad=True)
    y = layer_norm(e, torch.ones(16, requires_grad=True), residual=torch.zeros(0, 5, 16))
    assert y.shape == (0, 5, 16)
    y.sum().backward()
    assert e.grad.shape == e.shape


def test_torch_compile_fullgraph():
    x, w, b, r = make_inputs(8, 96, torch.float32)

    def block(x, w, b, r):
        y, h = layer_norm(x, w, b, residual=r, prenorm=True)
        return y * 2, h + 1

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    got, want = compiled(x, w, b, r), block(x, w, b, r)
    for a, c in zip(got, want):
        torch.testing.assert_close(a, c)
    g_got = torch.autograd.grad(sum(t.sum() for t in got), (x, w, b, r))
    g_want = torch.autograd.grad(sum(t.sum() for t in want), (x, w, b, r))
    for a, c in zip(g_got, g_want):
        torch.testing.assert_close(a, c)


def test_bad_input():
    x = torch.randn(4, 8)
    cases = [
        (dict(x=torch.randn(4, 8).int()), TypeError, "float16, bfloat16 and float32"),
        (dict(x=torch.randn(())), ValueError, "last dimension"),
        (dict(x=torch.randn(4, 0)), ValueError, "at least one element"),
        (dict(weight=torch.randn(7)), ValueError, "vector of N = 8"),
        (dict(bias=torch.randn(8, 1)), ValueError, "vector of N = 8"),
        (dict(residual=torch.randn(4, 7)), ValueError, "x's shape"),
        (dict(weight=torch.randn(8, dtype=torch.float64)), TypeError, "float16, bfloat16 or float32"),
        (dict(dropout_p=1.5), ValueError, "dropout_p"),
        (dict(eps=-1.0), ValueError, "eps"),
        (dict(generator=3), TypeError, "torch.Generator"),
    ]
    for kwargs, error, words in cases:
        args = dict(x=x, weight=None) | kwargs
        with pytest.raises(error, match=words):
            layer_norm(args.pop("x"), args.pop("weight"), **args)


def test_rows_past_2_31_elements():
    """x and the residual as views whose last row starts past 2^31 elements (the storage is never
    filled: the OS maps only the pages touched)."""
    n, stride = 64, (1 << 30) + 256
    base = torch.empty(2 * stride + 2 * n, dtype=torch.float16)
    x = base.as_strided((3, n), (stride, 1))
    r = base.as_strided((3, n), (stride, 1), storage_offset=n)
    x.copy_(torch.randn(3, n))
    r.copy_(torch.randn(3, n))
    w = torch.randn(n, dtype=torch.float16, requires_grad=True)
    y, h = layer_norm(x, w, residual=r, prenorm=True, dropout_p=0.2, generator=torch.Generator().manual_seed(2))
    keep = dropout_mask(x, 0.2, torch.Generator().manual_seed(2))
    ref, ref_h = layer_norm_reference(x, w.detach(), residual=r, keep=keep, dropout_p=0.2)
    assert_close_to(y, ref, "y")
    # the backward recomputes h from the far-apart x and residual
    y2 = layer_norm(x, w, residual=r, dropout_p=0.2, generator=torch.Generator().manual_seed(2))
    (dw,) = torch.autograd.grad(y2.float().sum(), (w,))
    rw = w.detach().double().requires_grad_()
    (ref_dw,) = torch.autograd.grad(layer_norm_reference(x, rw, residual=r, keep=keep, dropout_p=0.2)[0].sum(), (rw,))
    assert_close_to(dw, ref_dw, "dweight")


def test_interpreter_truncates_to_bfloat16():
    """Why bf16 tolerances are wider under the interpreter (norm_testing.INTERPRETED_BF16): its float32
    to bfloat16 conversion truncates; the GPU rounds to nearest. If this fails, tighten them."""
    @triton.jit
    def to_bf16(X, Y, BLOCK: tl.constexpr):
        c = tl.arange(0, BLOCK)
        tl.store(Y + c, tl.load(X + c).to(tl.bfloat16))

    x = torch.randn(1024)
    y = torch.empty(1024, dtype=torch.bfloat16)
    to_bf16[(1,)](x, y, BLOCK=1024)
    assert not torch.equal(y, x.bfloat16())
    assert torch.equal(y, (x.view(torch.int32) & -65536).view(torch.float32).bfloat16())


@pytest.mark.parametrize("finish", ["kernel", "torch"])
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_backward_finish_matches_float64(monkeypatch, finish, rms):
    """dweight / dbias from the partials by norm_partials_kernel ("kernel", shipped) and by torch sums ("torch")
    against float64, the kernel stepping over the partials several times (a small tile) at a column count that is no
    multiple of its columns a program; with and without a residual stream, a float32 weight without a bias."""
    monkeypatch.setattr(configs, "BACKWARD_FINISH", finish)
    monkeypatch.setattr(configs, "FINISH_TILE_ELEMS", 64)
    p = plan.plan(37, 300, torch.device("cpu"))
    assert p.finish == finish
    assert p.finish_rows < p.groups and 300 % p.finish_cols  # several steps over the partials; a partial column block
    x, w, b, r = make_inputs(37, 300, torch.float16, shift=2.0)
    run_and_check(x, w, b, r, rms=rms, dropout_p=0.2)
    x, w, b, r = make_inputs(37, 300, torch.float16, bias=False, residual=False, param_dtype=torch.float32)
    run_and_check(x, w, b, r, rms=rms, prenorm=False)


@pytest.mark.parametrize("weight, bias", [(True, True), (True, False), (False, True)])
def test_backward_finish_kernel_gives_the_torch_sums(weight, bias):
    """The same inputs through the launch with both finishes: dx bit for bit, dweight / dbias in the parameters'
    dtypes and equal to float32 summation order (every output poisoned first: written whole)."""
    rows, n, dtype = 50, 200, torch.float16
    x = torch.randn(rows, n).to(dtype)
    dy = torch.randn(rows, n).to(dtype)
    w = (1 + 0.5 * torch.randn(n)).to(dtype) if weight else None
    b = torch.randn(n).to(dtype) if bias else None
    base = plan.tl_plan(rows, n, configs.INTERPRETER_SMS, finish="torch")
    _, _, mean, rstd = launch.forward(base, x, None, w, b, None, 0.0, 1e-5, False, False, dtype)
    ref = launch.backward(base, dy, x, None, None, w, b, mean, rstd, None, None, 0.0, False, dtype, dtype, False)
    p = plan.tl_plan(rows, n, configs.INTERPRETER_SMS, finish="kernel")
    out = launch.backward(p, dy, x, None, None, w, b, mean, rstd, None, None, 0.0, False, dtype, dtype, False)
    assert torch.equal(out[0], ref[0])
    for got, want in zip(out[2:], ref[2:]):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-3, atol=1e-3)


def test_backward_tables_pick_tile_warps_and_groups(monkeypatch):
    """configs.PLAIN_BACKWARD (rows without a residual stream) and FUSED_BACKWARD give the backward's (tile elements,
    warps, groups an SM) at their BLOCK_N, each for its own kind of plan; the keywords still win; elsewhere the
    defaults; and the op through such a plan matches float64."""
    monkeypatch.setattr(configs, "PLAIN_BACKWARD", {512: (1024, 2, 3)})
    monkeypatch.setattr(configs, "FUSED_BACKWARD", {512: (512, 4, 1)})
    sms = 4
    plain, fused = plan.tl_plan(1000, 300, sms), plan.tl_plan(1000, 300, sms, fused=True)
    assert (plain.backward_rows, plain.backward_warps, plain.groups) == (2, 2, 3 * sms)
    assert (fused.backward_rows, fused.backward_warps, fused.groups) == (1, 4, sms)
    assert plan.tl_plan(1000, 300, sms, groups_per_sm=5).groups == 5 * sms
    other = plan.tl_plan(1000, 100, sms)  # BLOCK_N 128: not in the table
    assert (other.backward_rows, other.groups) == (configs.BACKWARD_TILE_ELEMS // 128, configs.BACKWARD_GROUPS_PER_SM * sms)
    x, w, b, r = make_inputs(41, 300, torch.float16, residual=False)
    run_and_check(x, w, b, r, prenorm=False)


def test_fused_backward_at_1024_columns_one_row_a_program():
    """configs.FUSED_BACKWARD[1024]: the fused backward (a residual stream) at BLOCK_N 1024 runs one row a program over
    2 warps, 6 groups an SM (the plain backward keeps PLAIN_BACKWARD's 2-row tiles); through the op, with dropout and the
    prenorm gradient, groups that run several rows and a ragged count of them match float64."""
    fused, plain = plan.tl_plan(65536, 1024, 132, fused=True), plan.tl_plan(65536, 1024, 132)
    assert (fused.backward_rows, fused.backward_warps, fused.groups) == (1, 2, 6 * 132)
    assert (plain.backward_rows, plain.groups) == (2, 4 * 132)
    rows, sms = 37, configs.INTERPRETER_SMS
    assert plan.tl_plan(rows, 1000, sms, fused=True).groups == 6 * sms < rows  # several rows a group, not all alike
    x, w, b, r = make_inputs(rows, 1000, torch.float16, shift=1.0)
    run_and_check(x, w, b, r, dropout_p=0.2)
