"""apply_rotary on both CPU paths (the Triton kernel through the interpreter, and torch operations
without it) against float64: layouts, partial rotary dims, position_ids, gradients, in place, strided
views, NaN, bad input, torch.compile, offsets past 2^31 elements."""
import math

import pytest
import torch

from tilecore import accuracy, dispatch
from tilecore.ops.rotary import apply_rotary, launch, plan, rotary_reference

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(params=["interpreter", "cpu"])
def path(request, monkeypatch):
    """Both CPU paths; kernel outputs start as NaN (a finite result was written)."""
    if request.param == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(launch, "output", lambda shape, dtype, device: torch.full(shape, math.nan, dtype=dtype,
                                                                                  device=device))
    return request.param


def tables(n_max, pairs, dtype=torch.float32):
    angle = torch.rand(n_max, pairs) * 2 * math.pi
    return angle.cos().to(dtype), angle.sin().to(dtype)


def assert_close(out, ref, what="out"):
    assert torch.isfinite(out).all(), f"{what}: non-finite elements (unwritten?)"
    if out.dtype == torch.float32:
        assert accuracy.rel_rms(out, ref) <= 1e-6, what
    else:
        # one rounding of a float32 result; the interpreter truncates to bf16 (twice the floor's RMS,
        # give or take the sample's spread)
        bound = 2.6 if out.dtype == torch.bfloat16 and dispatch.interpreter_enabled() else 1.1
        err = accuracy.error_over_floor(out, ref)
        assert err <= bound, f"{what}: {err:.3f}x the rounding floor"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim, positions", [(64, None), (40, "per sequence"), (2, "shared")])
def test_matches_float64_with_gradient(path, dtype, interleaved, rotary_dim, positions):
    B, N, H, D = 2, 5, 3, 64
    cos, sin = tables(11, rotary_dim // 2)
    pos = {None: None, "per sequence": torch.randint(0, 11, (B, N)), "shared": torch.randperm(11)[:N]}[positions]
    x = torch.randn(B, N, H, D, dtype=dtype, requires_grad=True)
    y = apply_rotary(x, cos, sin, interleaved=interleaved, position_ids=pos)
    assert y.shape == x.shape and y.dtype == dtype
    assert_close(y, rotary_reference(x.detach(), cos, sin, interleaved=interleaved, position_ids=pos))
    g = torch.randn(B, N, H, D, dtype=dtype)
    (dx,) = torch.autograd.grad(y, x, g)
    ref_dx = rotary_reference(g, cos, sin, interleaved=interleaved, position_ids=pos, conjugate=True)
    assert_close(dx, ref_dx, "dx")
    # the same gradient as float64 autograd through the reference
    x64 = x.detach().double().requires_grad_()
    (auto_dx,) = torch.autograd.grad(rotary_reference(x64, cos, sin, interleaved=interleaved, position_ids=pos),
                                     x64, g.double())
    torch.testing.assert_close(auto_dx, ref_dx)


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_in_place_and_strided(path, interleaved):
    B, N, H, D = 2, 6, 4, 32
    cos, sin = tables(8, 12, torch.bfloat16)  # bf16 tables, rotary_dim 24 < 32
    qkv = torch.randn(B, N, 3, H, D, dtype=torch.float16)
    q = qkv[:, :, 0]  # a view: token stride 3 H D
    expected = apply_rotary(q.contiguous(), cos, sin, interleaved=interleaved)
    assert_close(expected, rotary_reference(q, cos, sin, interleaved=interleaved))
    assert torch.equal(apply_rotary(q, cos, sin, interleaved=interleaved), expected)
    k_bhnd = torch.randn(B, H, N, D, dtype=torch.float16)  # SDPA's layout, transposed in
    assert torch.equal(apply_rotary(k_bhnd.transpose(1, 2), cos, sin, interleaved=interleaved),
                       apply_rotary(k_bhnd.transpose(1, 2).contiguous(), cos, sin, interleaved=interleaved))
    before = qkv.clone()
    assert apply_rotary(q, cos, sin, interleaved=interleaved, inplace=True) is q
    assert torch.equal(qkv[:, :, 0], expected) and torch.equal(qkv[:, :, 1:], before[:, :, 1:])
    odd = torch.randn(B, N, H, 2 * D, dtype=torch.float16)[..., ::2]  # features 2 apart: copied, then written back
    want = apply_rotary(odd.contiguous(), cos, sin, interleaved=interleaved)
    apply_rotary(odd, cos, sin, interleaved=interleaved, inplace=True)
    assert torch.equal(odd, want)
    with pytest.raises(RuntimeError, match="cannot record a gradient"):
        apply_rotary(torch.randn(B, N, H, D, requires_grad=True), cos, sin, inplace=True)


def test_nan_stays_in_its_pair(path):
    cos, sin = tables(4, 8)
    x = torch.randn(1, 4, 2, 16)
    x[0, 1, 1, 3] = math.nan
    y = apply_rotary(x, cos, sin)
    nan = torch.isnan(y)
    assert nan.sum() == 2 and nan[0, 1, 1, 3] and nan[0, 1, 1, 11]  # pair (3, 3 + 8)
    assert torch.equal(nan, torch.isnan(rotary_reference(x, cos, sin)))


def test_positions_out_of_range_give_nan_in_the_kernel():
    """On a GPU a bad position is not checked (a sync): the kernel reads nothing and writes NaN."""
    x = torch.randn(1, 3, 2, 8)
    cos, sin = tables(4, 4)
    pos = torch.tensor([[0, 4, -1]])
    out = torch.zeros_like(x)
    launch.launch(plan.plan(1, 3, 2, 8, 4, x.device), x, cos, sin, pos, out, False, False)
    assert torch.isfinite(out[0, 0]).all() and torch.isnan(out[0, 1:]).all()


def test_bad_input():
    x = torch.randn(2, 5, 3, 16)
    cos, sin = tables(8, 8)
    cases = [
        (dict(x=torch.randn(5, 3, 16)), ValueError, "batch, seqlen, heads, head_dim"),
        (dict(x=x.int()), TypeError, "float16, bfloat16 and float32"),
        (dict(cos=cos[:, :4]), ValueError, "one shape"),
        (dict(cos=tables(8, 9)[0], sin=tables(8, 9)[1]), ValueError, "exceeds head_dim"),
        (dict(cos=cos[:4], sin=sin[:4]), ValueError, "fewer than x's seqlen 5"),
        (dict(cos=cos.double()), TypeError, "float16, bfloat16 or float32"),
        (dict(position_ids=torch.zeros(2, 5)), TypeError, "int32 or int64"),
        (dict(position_ids=torch.zeros(3, 5, dtype=torch.long)), ValueError, r"\(batch, seqlen\) = \(2, 5\)"),
        (dict(position_ids=torch.full((2, 5), 8)), ValueError, r"\[0, 8\)"),
        (dict(position_ids=torch.full((5,), -1)), ValueError, r"\[0, 8\)"),
    ]
    for kwargs, error, words in cases:
        args = dict(x=x, cos=cos, sin=sin) | kwargs
        with pytest.raises(error, match=words):
            apply_rotary(args.pop("x"), args.pop("cos"), args.pop("sin"), **args)


def test_torch_compile_fullgraph():
    cos, sin = tables(16, 16)
    x = torch.randn(2, 16, 4, 32, requires_grad=True)
    pos = torch.arange(16).flip(0)

    def f(x):
        return apply_rotary(x, cos, sin, position_ids=pos) * 2

    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x)
    want = f(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0], torch.autograd.grad(want.sum(), x)[0])


def test_rows_past_2_31_elements():
    """Tokens of a view 2^30 + 256 elements apart: the last starts past 2^31 (the storage is never
    filled; the OS maps only the pages touched)."""
    stride = (1 << 30) + 256
    base = torch.empty(2 * stride + 64, dtype=torch.float16)
    x = base.as_strided((1, 3, 2, 32), (0, stride, 32, 1))
    x.copy_(torch.randn(1, 3, 2, 32))
    cos, sin = tables(3, 16)
    ref = rotary_reference(x, cos, sin, interleaved=True)
    assert_close(apply_rotary(x, cos, sin, interleaved=True), ref)
    apply_rotary(x, cos, sin, interleaved=True, inplace=True)
    assert_close(x, ref, "in place")
