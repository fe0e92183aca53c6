"""hadamard_quantize through Triton's interpreter and the CPU path: codes and scales against the float64
reference (rotate in float64, round to nearest even into the format) for every format and rotation
layout, byte layouts, round trips through dequantize, NaN/inf, torch.compile and bad input."""
import math

import pytest
import torch
import triton
import triton.language as tl

from tilecore.ops.hadamard import quantize
from tilecore.ops.hadamard.quantize import dequantize, hadamard_quantize
from tilecore.ops.hadamard.quantize_kernels import _e2m1_code, _e2m1_fast
from tilecore.ops.hadamard.quantize_reference import (E2M1_VALUES, FORMATS, FP8_DTYPES, code_order,
                                                      hadamard_quantize_reference)

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered")


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Codes and scales start as garbage (0x5A bytes, NaN scales): an element the kernel never writes
    fails the comparison with the reference."""
    made = quantize._outputs

    def poisoned(*args, **kwargs):
        codes, scales = made(*args, **kwargs)
        codes.view(torch.uint8).fill_(0x5A)
        scales.fill_(float("nan")) if scales.dtype == torch.float32 else scales.fill_(0x5A)
        return codes, scales
    monkeypatch.setattr(quantize, "_outputs", poisoned)


def assert_far_codes_are_tiny(codes, scales, ref_codes, ref_scales, fmt, far, group):
    """Codes more than one step from the reference's must stand for values within the float32 rotation's
    own error: below 2^-13 of their row's largest. (A rotated value that nearly cancels has an absolute
    error of ~2^-17 of the row's size, the bf16 pieces' and float32's rounding; fp8_e5m2's subnormals
    reach 2^-32 of the scale, far finer than float32 can place a value.)"""
    if not far.any():
        return
    ours = dequantize(codes, scales, format=fmt, group=group).double()
    ref = dequantize(ref_codes, ref_scales, format=fmt, group=group).double()
    bound = 2.0**-13 * ref.abs().amax(dim=-1, keepdim=True)
    far = far.reshape(ours.shape)
    assert ((ours - ref).abs() <= bound)[far].all(), "a code more than one step away, on a value that is not tiny"


def assert_matches_reference(x, **kwargs):
    fmt = kwargs["format"]
    codes, scales = hadamard_quantize(x, **kwargs)
    ref_codes, ref_scales = hadamard_quantize_reference(x, **kwargs)
    assert codes.dtype == ref_codes.dtype and codes.shape == ref_codes.shape
    a, b = code_order(codes, fmt), code_order(ref_codes, fmt)
    assert (a == b).float().mean() >= 0.999, f"{(a != b).float().mean():.5f} of the codes differ"
    assert_far_codes_are_tiny(codes, scales, ref_codes, ref_scales, fmt, (a - b).abs() > 1, kwargs.get("group"))
    pairs = zip(scales, ref_scales) if isinstance(scales, tuple) else [(scales, ref_scales)]
    for s, r in pairs:
        assert s.dtype == r.dtype and s.shape == r.shape
        if s.dtype == torch.float32:  # a = the largest |y| of the kernel's float32 rotation: within 2^-15
            assert torch.allclose(s, r, rtol=2**-15, atol=0), (s - r).abs().max()
        else:  # e8m0 and e4m3 scales: exactly
            assert torch.equal(s.view(torch.uint8), r.view(torch.uint8))
    return codes, scales


# (n, dtype, block, rotate): whole rows of a power of two <= 1024 (rows of B a tile) and > 1024 (Sylvester
# mixing over sub-rows), n = m 2^k (H_m from memory), blocks, and no rotation
LAYOUTS = [(256, torch.float16, None, True), (2048, torch.bfloat16, None, True), (12 * 64, torch.float16, None, True),
           (28 * 8, torch.float32, None, True), (512, torch.bfloat16, 16, True), (384, torch.float16, 128, True),
           (640, torch.float16, None, False)]


# every layout with three of the formats, every format with three or four layouts (the interpreter's time)
CASES = [(layout, fmt) for layout in range(len(LAYOUTS)) for j, fmt in enumerate(FORMATS) if (j - layout) % 2 == 0]


@pytest.mark.parametrize("layout, fmt", CASES, ids=lambda v: v if isinstance(v, str) else "n{}-{}-block{}-rotate{}".format(
    LAYOUTS[v][0], str(LAYOUTS[v][1]).removeprefix("torch."), LAYOUTS[v][2], LAYOUTS[v][3]))
def test_matches_the_float64_reference(layout, fmt):
    n, dtype, block, rotate = LAYOUTS[layout]
    if n % (FORMATS[fmt].default_group or 1):
        pytest.skip("the group does not divide n")
    x = torch.randn(3, n, dtype=dtype)
    x[:, 5] *= 60  # an outlier channel
    assert_matches_reference(x, format=fmt, block=block, rotate=rotate)


@pytest.mark.parametrize("fmt, group", [("fp8_e4m3", 128), ("fp8_e5m2", 16), ("fp8_e4m3", 64), ("int4", 32),
                                        ("int4", 64)])
def test_group_sizes(fmt, group):
    assert_matches_reference(torch.randn(4, 256, dtype=torch.float16), format=fmt, group=group)


def test_values_that_nearly_cancel_in_a_wide_format():
    """fp8_e5m2's subnormals reach 2^-32 of a row's largest value: a rotated value that nearly cancels
    can sit many codes from the float64 reference's, within the float32 rotation's error (found by the
    GPU check's dry run: 11 codes apart on 0.05% of elements)."""
    x = torch.randn(32, 2048, dtype=torch.float16)
    x[:, 7] *= 80
    assert_matches_reference(x, format="fp8_e5m2")


@pytest.mark.parametrize("block", [16, 32, 64, 128])
def test_block_sizes(block):
    """Blocks smaller than int4's groups of 128 (a group spans several blocks) and larger than mxfp4's 32."""
    x = torch.randn(3, 512, dtype=torch.float16)
    assert_matches_reference(x, format="int4", block=block)
    assert_matches_reference(x, format="mxfp4", block=block)


def test_per_token_scale_over_non_power_of_two_groups_of_sub_rows():
    # n = 28 x 8: mxfp4's groups of 32 span 4 sub-rows of 8 (zero-padded to 16 columns in the kernel)
    assert_matches_reference(torch.randn(5, 28 * 8, dtype=torch.float16), format="mxfp4")
    assert_matches_reference(torch.randn(5, 20 * 16, dtype=torch.float16), format="int4", group=64)


def test_randomized_signs_and_static_scales():
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    signs = torch.where(torch.rand(256) < 0.5, -1.0, 1.0)
    codes, scales = assert_matches_reference(x, format="fp8_e4m3", randomized_signs=signs)
    plain, _ = hadamard_quantize((x.float() * signs).to(torch.bfloat16), format="fp8_e4m3")
    assert torch.equal(codes.view(torch.uint8), plain.view(torch.uint8))
    codes, scales = assert_matches_reference(x, format="fp8_e4m3", scale=torch.tensor([0.002]))
    assert torch.equal(scales, torch.tensor([0.002]))
    assert codes.to(torch.float32).abs().max() == 448  # saturated, not NaN
    assert_matches_reference(x, format="nvfp4", scale=torch.tensor([0.001]))


def test_fp8_codes_are_torchs_float8_of_the_scaled_values():
    x = torch.randn(3, 128, dtype=torch.float32)
    for fmt, dtype in FP8_DTYPES.items():
        codes, scales = hadamard_quantize(x, format=fmt, rotate=False)
        assert codes.dtype == dtype
        expected = (x / scales).clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).to(dtype)
        assert (codes.view(torch.uint8) != expected.view(torch.uint8)).float().mean() < 2e-3


def test_fp4_byte_layout():
    """Two e2m1 codes a byte, element 2j in the low nibble; sign in bit 3; torchao's floor scale."""
    values = torch.tensor([[0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0] * 4], dtype=torch.float32)
    values[0, 1::2] *= -1
    codes, scales = hadamard_quantize(values, format="mxfp4", rotate=False)
    # amax 6: scale 2^(floor(log2 6) - 2) = 1, e8m0 byte 127
    assert scales.view(torch.uint8).tolist() == [[127]]
    expected = [0x0 | (0x9 << 4), 0x2 | (0xB << 4), 0x4 | (0xD << 4), 0x6 | (0xF << 4)] * 4
    assert codes.tolist() == [expected]
    back = dequantize(codes, scales, format="mxfp4")
    assert torch.equal(back, values)


def test_int4_byte_layout():
    x = torch.tensor([[7.0, -7.0, 1.0, -1.0] + [0.0] * 124], dtype=torch.float32)
    codes, scales = hadamard_quantize(x, format="int4", rotate=False)
    assert scales.tolist() == [[1.0]] and codes[0, :2].tolist() == [0x7 | (0x9 << 4), 0x1 | (0xF << 4)]
    assert torch.equal(dequantize(codes, scales, format="int4"), x)


@pytest.mark.parametrize("fmt, worst", [("fp8_e4m3", 0.04), ("fp8_e5m2", 0.08), ("int8", 0.01), ("mxfp4", 0.2),
                                        ("nvfp4", 0.12), ("int4", 0.2)])
def test_round_trip(fmt, worst):
    x = torch.randn(2, 256, dtype=torch.float16).float()
    codes, scales = hadamard_quantize(x.half(), format=fmt)
    back = dequantize(codes, scales, format=fmt, rotate=True)
    err = float((back - x).norm() / x.norm())
    assert 0 < err < worst


def test_nan_and_inf_reach_their_row_or_block():
    x = torch.randn(4, 256, dtype=torch.float16)
    x[1, 7] = float("nan")
    x[2, 9] = float("inf")
    codes, scales = hadamard_quantize(x, format="fp8_e4m3")
    ref_codes, ref_scales = hadamard_quantize_reference(x, format="fp8_e4m3")
    assert torch.isnan(scales[1]).all() and torch.isinf(scales[2]).all()
    assert torch.isnan(codes[1].float()).all()
    assert torch.equal(torch.isnan(codes.float()), torch.isnan(ref_codes.float()))
    back = dequantize(codes, scales, format="fp8_e4m3")
    assert torch.isnan(back[1]).all() and torch.isnan(back[2]).any() and torch.isfinite(back[[0, 3]]).all()
    codes, scales = hadamard_quantize(x, format="mxfp4", block=32)
    bits = scales.view(torch.uint8)
    assert (bits[1, 0] == 255) and (bits[2, 0] == 255) and (bits[[0, 3]] != 255).all() and (bits[1, 1:] != 255).all()
    assert (codes[1, :16] == 0).all()


def test_inf_in_a_non_power_of_two_row_matches_the_reference():
    """Padded sub-rows and columns (zero rows of H_m, zero columns of H_Q) would give 0 x inf = NaN: they
    stay out of the amax, so the scale is inf as the reference's."""
    x = torch.randn(3, 12 * 8, dtype=torch.float16)
    x[1, 4] = float("inf")
    for fmt in ("fp8_e4m3", "int8"):
        codes, scales = hadamard_quantize(x, format=fmt)
        ref_codes, ref_scales = hadamard_quantize_reference(x, format=fmt)
        assert torch.equal(torch.isinf(scales), torch.isinf(ref_scales)) and torch.isinf(scales[1]).all()
        assert torch.equal(torch.isnan(scales), torch.isnan(ref_scales))


def test_empty_and_leading_dimensions():
    codes, scales = hadamard_quantize(torch.randn(2, 0, 64, dtype=torch.float16), format="int8")
    assert codes.shape == (2, 0, 64) and scales.shape == (2, 0, 1)
    codes, (block_scales, g) = hadamard_quantize(torch.randn(2, 3, 64, dtype=torch.bfloat16), format="nvfp4")
    assert codes.shape == (2, 3, 32) and block_scales.shape == (2, 3, 4) and g.shape == (1,)


def test_compile_fullgraph():
    def f(x):
        codes, scales = hadamard_quantize(x * 2, format="mxfp4")
        return codes, scales

    x = torch.randn(4, 64, dtype=torch.float32)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    c1, s1 = compiled(x)
    c2, s2 = f(x)
    assert torch.equal(c1, c2) and torch.equal(s1.view(torch.uint8), s2.view(torch.uint8))
    torch.library.opcheck(torch.ops.tilecore.hadamard_quantize.default, (x, "nvfp4", 0, 16, None, True, None))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(format="fp4"), ValueError, "unknown format 'fp4'; formats: fp8_e4m3, fp8_e5m2, int8, mxfp4, nvfp4, int4"),
    (dict(format="mxfp4", block=48), ValueError, r"block must be one of \(16, 32, 64, 128\)"),
    (dict(format="int8", block=128, rotate=False), ValueError, "needs rotate=True"),
    (dict(format="int8", group=128), ValueError, r"int8 takes group in \(None,\)"),
    (dict(format="fp8_e4m3", scale=torch.ones(2)), ValueError, "one element"),
    (dict(format="fp8_e4m3", scale=-1.0), ValueError, "finite and > 0"),
    (dict(format="int4", group=32, scale=1.0), ValueError, "int4 takes no scale"),
    (dict(format="fp8_e4m3", randomized_signs=torch.ones(3)), ValueError, "tensor of 96 elements"),
    (dict(format="fp8_e4m3", randomized_signs=torch.full((96,), 2.0)), ValueError, r"only \+1 and -1"),
])
def test_bad_arguments_name_what_is_accepted(kwargs, error, match):
    with pytest.raises(error, match=match):
        hadamard_quantize(torch.randn(2, 96), **kwargs)


def test_bad_sizes_and_dtypes():
    with pytest.raises(ValueError, match="no Hadamard matrix of order 200"):
        hadamard_quantize(torch.randn(2, 200), format="int8")  # 200 = 8 x 25
    assert hadamard_quantize(torch.randn(2, 200), format="int8", rotate=False)[0].shape == (2, 200)
    with pytest.raises(ValueError, match="groups of 32 must divide"):
        hadamard_quantize(torch.randn(2, 48), format="mxfp4", block=16)
    with pytest.raises(TypeError, match="float16, bfloat16 and float32"):
        hadamard_quantize(torch.randn(2, 64, dtype=torch.float64), format="int8")


class TestCpuPath:
    """CPU tensors without the interpreter: hadamard_transform's CPU path, then torch's operations."""

    @pytest.fixture(autouse=True)
    def no_interpreter(self, monkeypatch):
        monkeypatch.setenv("TRITON_INTERPRET", "0")

    @pytest.mark.parametrize("fmt", list(FORMATS))
    def test_matches_the_reference(self, fmt):
        x = torch.randn(5, 14336 // 16, dtype=torch.bfloat16)  # 896 = 28 x 32
        assert_matches_reference(x, format=fmt)
        assert_matches_reference(x, format=fmt, block=32)


def test_dequantize_rejects_unknown_formats():
    with pytest.raises(ValueError, match="unknown format"):
        dequantize(torch.zeros(2, 4, dtype=torch.uint8), torch.ones(2, 1), format="e3m4")
    assert math.isclose(E2M1_VALUES[-1], 6.0)


# ------------------------------------------------------------------------ issue 32's "pow2" path (speed work)

def _plan(n, fmt, rows=64, **kw):
    return quantize.kernel_plan(rows, n, torch.bfloat16, fmt, kw.pop("group", FORMATS[fmt].default_group),
                                kw.pop("block", None), True, False, False, 4, True, **kw)


def test_power_of_two_rows_take_the_transforms_tile():
    """Power-of-two rows, and blocks that hold their groups, run pow2_quantize_kernel on hadamard_transform's
    split; groups spanning blocks and n = m 2^k keep the kron-tiled kernel; a group never spans slices."""
    assert _plan(4096, "fp8_e4m3").path == "pow2"
    assert _plan(4096, "mxfp4", block=32).path == "pow2" and _plan(4096, "mxfp4", block=32).config["N"] == 32
    assert _plan(512, "int4", block=16).path == "fused"  # int4's groups of 128 span blocks of 16
    assert _plan(12 * 64, "fp8_e4m3").path == "fused"
    cfg = _plan(256, "int4").config  # hadamard_transform's split of 256 is (4, 1, 64): slices of 64 < 128
    assert cfg["N1"] * cfg["N2"] >= 128 and cfg["S"] * cfg["N1"] * cfg["N2"] == 256
    assert _plan(4096, "fp8_e4m3", legacy=True).path == "fused"


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "mxfp4"])
def test_codes_through_tma_descriptors(fmt):
    """The input and the codes through TMA descriptors (the interpreter runs them as loads and stores),
    rows past the last tile's end clipped."""
    rows, n = 37, 1024
    plan = _plan(n, fmt, rows=rows, tma="load", tma_store=True)
    assert plan.path == "pow2" and plan.config["TMA_LOAD"] and plan.config["TMA_STORE"]
    x = torch.randn(rows, n, dtype=torch.bfloat16)
    x[:, 3] *= 50
    group = FORMATS[fmt].default_group
    codes, scales, _ = quantize.run_plan(plan, x, fmt, group, poison=True)
    ref_codes, ref_scales = hadamard_quantize_reference(x, format=fmt)
    a, b = code_order(codes, fmt), code_order(ref_codes, fmt)
    assert (a == b).float().mean() >= 0.999 and (a - b).abs().max() <= 1
    assert torch.equal(scales.view(torch.uint8), ref_scales.view(torch.uint8)) if fmt == "mxfp4" else \
        torch.allclose(scales, ref_scales, rtol=2**-15, atol=0)


@triton.jit
def _e2m1_both(v_ptr, fast_ptr, slow_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    v = tl.load(v_ptr + i)
    tl.store(fast_ptr + i, _e2m1_fast(v))
    tl.store(slow_ptr + i, _e2m1_code(v))


def test_e2m1_by_one_fma_matches_the_bitwise_rounding():
    """quantize_kernels._e2m1_fast (the pow2 path's) against _e2m1_code on every multiple of 2^-6 in
    [-8, 8] (every grid value, midpoint and tie) and its float32 neighbours."""
    base = torch.arange(-512, 513, dtype=torch.float32) / 64
    v = torch.cat([base, torch.nextafter(base, torch.tensor(9.0)), torch.nextafter(base, torch.tensor(-9.0)),
                   torch.tensor([-0.0, 100.0, -1e30])])
    size = triton.next_power_of_2(v.numel())
    v = torch.cat([v, torch.zeros(size - v.numel())])
    fast, slow = torch.empty(size, dtype=torch.int32), torch.empty(size, dtype=torch.int32)
    _e2m1_both[(1,)](v, fast, slow, N=size)
    assert torch.equal(fast, slow)


def test_nvfp4_static_global_scale_zeroes_blocks_with_inf():
    """A block whose amax is inf has codes 0 (the reference's rule) under a given global scale too, where
    the block scale clamps to 448 and stays finite (the kron-tiled kernel wrote code 7 there)."""
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    x[2, 9] = float("inf")
    codes, (block_scales, g) = hadamard_quantize(x, format="nvfp4", scale=torch.tensor([0.001]))
    ref_codes, (ref_scales, _) = hadamard_quantize_reference(x, format="nvfp4", scale=torch.tensor([0.001]))
    assert (codes[2] == 0).all() and torch.equal(codes, ref_codes)
    assert torch.equal(block_scales.view(torch.uint8), ref_scales.view(torch.uint8))


def test_float32_rows_on_the_pow2_path():
    """float32 input: three bf16 pieces a product (kernels.py's accuracy design) on the pow2 path too."""
    x = torch.randn(3, 512, dtype=torch.float32)
    x[:, 3] *= 40
    assert _plan(512, "fp8_e4m3").path == "pow2"
    assert_matches_reference(x, format="fp8_e4m3")
    assert_matches_reference(x, format="int4")
