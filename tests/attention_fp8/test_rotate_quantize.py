"""The fused rotate-and-quantize kernel (quantize.rotate_quantize, kernels_tl.rotate_quantize) in Triton's
interpreter: the rotation is tilecore's Hadamard transform with the signs, the codes and descales are
quantize_fp8's on the float64-rotated rows (per row, per block of 128 rows, a given descale), tails; and the
convenience path through it (attention_fp8_rotated(quantizer="fused")) against float64 attention."""
import pytest
import torch

import tilecore
from tilecore.ops.attention_fp8 import attention_fp8_rotated, quantize_fp8
from tilecore.ops.attention_fp8.quantize import signed_hadamard, rotate_quantize, rotation_signs

E4M3_STEP = 0.126  # a relative step of e4m3's 3 mantissa bits (1/8), with room for float32 ties


def rotated64(x, signs):
    D = x.shape[-1]
    return (x.double() @ signed_hadamard(signs).double()) * D ** -0.5


def testsigned_hadamard_is_the_hadamard_transform_with_signs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=g)
    signs = rotation_signs(64, x.device)
    want = tilecore.hadamard_transform(x * signs, scale=64 ** -0.5).double()
    assert torch.allclose(rotated64(x, signs), want, atol=1e-5)


@pytest.mark.parametrize("scales", ["token", "block", "tensor"])
def test_codes_and_descales_are_quantize_fp8_of_the_rotated_rows(scales):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(1, 2, 130, 64, generator=g) * 3).to(torch.float16)  # 130: a block of 128 and a tail of 2
    x[0, 1, 129] = 0.0  # a zero row: descale 1 (token)
    signs = rotation_signs(64, x.device)
    y = rotated64(x, signs).float()
    given = torch.tensor([0.05]) if scales == "tensor" else None
    codes = torch.full(x.shape, float("nan")).to(torch.float8_e4m3fn)
    codes, descale = rotate_quantize(x, signs=signs, scales=scales, descale=given)
    assert codes.shape == x.shape and codes.dtype == torch.float8_e4m3fn and codes.is_contiguous()
    if scales == "tensor":
        want = (y / 0.05).clamp(-448, 448).to(torch.float8_e4m3fn)
        assert descale is given
    else:
        want, want_descale = quantize_fp8(y, per=scales)
        assert descale.shape == want_descale.shape == ((1, 2, 130) if scales == "token" else (1, 2, 2))
        assert torch.allclose(descale, want_descale, rtol=2e-6, atol=0)
        if scales == "token":
            assert descale[0, 1, 129] == 1.0
    assert torch.isfinite(codes.float()).all()  # every element written
    diff = (codes.float() - want.float()).abs() / want.float().abs().clamp_min(2 ** -6)
    assert (diff <= E4M3_STEP).all() and (diff == 0).float().mean() > 0.99


def test_without_rotation_it_quantizes_and_a_nan_stays_in_its_row():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 1, 40, 32, generator=g).to(torch.float16)
    codes, descale = rotate_quantize(x, rotate=False, scales="token")
    want, want_descale = quantize_fp8(x, per="token")
    assert torch.equal(codes.float(), want.float()) and torch.allclose(descale, want_descale)
    # a NaN: its row's codes are garbage here (the interpreter casts NaN to e4m3 wrongly, as every float32 -> e4m3;
    # the GPU's cvt.satfinite keeps NaN: experiments/attention_fp8/gpu_speed_s26.py, at commit 741bc3b, checked it); the other rows exact
    x[0, 0, 7, 3] = float("nan")
    nan_codes, nan_descale = rotate_quantize(x, rotate=False, scales="token")
    rows = torch.arange(40) != 7
    assert torch.equal(nan_codes[0, 0, rows].float(), codes[0, 0, rows].float())
    assert torch.equal(nan_descale[0, 0, rows], descale[0, 0, rows])


@pytest.mark.parametrize("k_scales,causal", [("block", True), ("tensor", False)])
def test_fused_convenience_path_near_float64(k_scales, causal):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 40, 64, generator=g) for _ in range(3))
    k[..., 5] += 6.0  # an outlier channel (the rotation spreads it)
    qd, kd, vd = (t.double() for t in (q, k, v))
    s = qd @ kd.transpose(-1, -2) / 8
    if causal:
        s = s.masked_fill(torch.ones(40, 40, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.softmax(s, -1) @ vd
    out = attention_fp8_rotated(q, k, v, causal=causal, quantizer="fused", k_scales=k_scales)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    err = ((out.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
    assert err < 0.07, err  # FP8 attention's level (P's 3 mantissa bits; k's coarse per-tensor bound): 0.04-0.053 here


def test_bad_arguments_say_what_is_accepted():
    x = torch.randn(1, 1, 8, 16)
    with pytest.raises(ValueError, match="quantizer must be"):
        attention_fp8_rotated(x, x, x, quantizer="triton")
    with pytest.raises(ValueError, match="needs quantizer='fused'"):
        attention_fp8_rotated(x, x, x, k_scales="block", quantizer="hadamard_quantize")
    with pytest.raises(ValueError, match="k_scales must be"):
        attention_fp8_rotated(x, x, x, k_scales="row")
    with pytest.raises(ValueError, match="scales must be one of"):
        rotate_quantize(x, scales="head")
    with pytest.raises(ValueError, match="descale is given"):
        rotate_quantize(x, scales="tensor")


def test_v_quantizer_options_write_the_same():
    from tilecore.ops.attention_fp8.quantize import quantize_v_permuted

    g = torch.Generator().manual_seed(4)
    v = (torch.randn(2, 2, 45, 48, generator=g) * 3).to(torch.float16)
    want, want_descale = quantize_fp8(v, per="head", layout="keys_permuted")
    for options in (dict(amax_kernel=True), dict(permute_in_registers=True)):
        codes, descale = quantize_v_permuted(v, **options)
        assert torch.equal(descale, want_descale) and torch.equal(codes.float(), want.float()), options


def test_programs_of_several_row_blocks_write_the_same():
    # the GPU's shape takes several blocks of 128 rows a program (D128: 8); the interpreter's default takes one
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 1, 300, 32, generator=g).to(torch.float16)
    signs = rotation_signs(32, x.device)
    for scales in ("token", "block"):
        one = rotate_quantize(x, signs=signs, scales=scales)
        three = rotate_quantize(x, signs=signs, scales=scales, config=dict(row_blocks=3))
        assert torch.equal(one[0].float(), three[0].float()) and torch.equal(one[1], three[1]), scales


def test_convenience_path_traces_under_torch_compile_fullgraph():
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 40, 32, generator=g) for _ in range(3))

    def f(q, k, v):
        return attention_fp8_rotated(q, k, v, causal=True) * 2

    got = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    assert torch.equal(got, f(q, k, v))



def test_fewer_row_blocks_where_the_grid_would_leave_sms_idle(monkeypatch):
    """quantize.FILL_SMS's launch shape: the configured blocks of 128 rows a program (8 at D128) where the grid gives
    every SM two programs, fewer (1 at least) where it would not. (Any count gives the same bits:
    test_programs_of_several_row_blocks_write_the_same.)"""
    from tilecore import dispatch
    from tilecore.ops.attention_fp8.quantize import filled_row_blocks

    monkeypatch.setattr(dispatch, "num_sms", lambda device: 132)
    cpu = torch.device("cpu")
    assert filled_row_blocks(8, 16 * 16, 32, cpu) == 8  # B16 H16 N4096: 1,024 programs of 8
    assert filled_row_blocks(8, 1 * 16, 8, cpu) == 1  # B1 H16 N1024: 128 programs of 1, not 16 of 8
    assert filled_row_blocks(8, 16 * 16, 8, cpu) == 4  # B16 H16 N1024: cut to 7, evened out: 2 programs of 4 a head
    assert filled_row_blocks(8, 1 * 16, 32, cpu) == 1 and filled_row_blocks(4, 4 * 16, 32, cpu) == 4
    assert filled_row_blocks(8, 2 * 16, 20, cpu) == 2  # 640 blocks: cut to 2, 10 programs of 2 a head
