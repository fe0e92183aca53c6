"""hadamard_quantize's kron-tiled kernel (n = m x 2^k) with interleaved slices (plan tuning ``interleave``,
configs.QUANT_INTERLEAVE; quantize_kernels._epilogue_interleaved): slice t is the columns q S + t of each
sub-row, so a quantization group lies in a few columns of every slice and a thread's codes are consecutive
bytes. The same products as contiguous slices (H_P = H_Q (x) H_S = H_S (x) H_Q up to the index split) summed
in another order: codes within one step of the contiguous plan's and of the float64 reference's (>= 99.9%
equal to it), float32 scales within 2^-20 of the contiguous plan's, discrete scales equal. Through the
interpreter, outputs poisoned (once with two different bytes: every element written), rows with NaN and inf,
more rows than programs (the persistent loop). interleave=2 loads all S slices as one vector a column
(quantize_kernels._load_il) and splits them in registers: the same values as the strided loads. Last, the
pow2 kernel's permuted columns (plan tuning ``perm``), bit for bit the shipped codes."""
import pytest
import torch

from tilecore.ops.hadamard import quantize
from tilecore.ops.hadamard.quantize_reference import FORMATS, code_order, hadamard_quantize_reference

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered")


def _run(x, fmt, interleave, scale=None, signs=None, poison=True, tile_elems=None):
    rows, n = x.shape
    group = FORMATS[fmt].default_group
    plan = quantize.kernel_plan(rows, n, x.dtype, fmt, group, None, True, scale is not None, signs is not None,
                                2, True, interleave=interleave, tile_elems=tile_elems)
    codes, scales, _ = quantize.run_plan(plan, x, fmt, group, None, True, scale, signs, poison=poison)
    return plan, codes, scales


def _bytes(t):
    return t.contiguous().view(torch.uint8) if t.dtype != torch.float32 else t.nan_to_num(7.0)


def _same_scales(a, b):
    if a.dtype == torch.float32:  # another summation order: the float32 amax may move by an ulp
        a, b = a.nan_to_num(7.0), b.nan_to_num(7.0)
        return bool(((a - b).abs() <= 2.0**-20 * b.abs()).all())
    return torch.equal(_bytes(a), _bytes(b))


# (format, m, p, slices S, interleave: True, each slice loaded strided; 2, one vector load a column): the join
# trees of 1, 2, 4 and 8 bytes a column, groups of 2..64 columns a slice, the split trees of 2, 4 and 8 slices
CASES = [("mxfp4", 12, 128, 2, True), ("fp8_e4m3", 12, 256, 4, 2), ("int4", 12, 256, 2, 2), ("int8", 12, 512, 8, True),
         ("nvfp4", 12, 512, 8, 2)]


@pytest.mark.parametrize("fmt, m, p, S, interleave", CASES)
def test_interleaved_slices_match_the_contiguous_plan_and_the_reference(fmt, m, p, S, interleave):
    torch.manual_seed(1)
    n = m * p
    x = torch.randn(3, n, dtype=torch.float16)  # 3 rows on 2 programs: the persistent loop, a partial last pass
    x[:, 7] *= 60  # an outlier channel
    x[1, 3] = float("nan")
    x[2, 9] = float("inf")
    scale = torch.tensor([0.002]) if fmt == "nvfp4" else None
    plan, codes, scales = _run(x, fmt, interleave, scale, tile_elems=16 * p)
    assert plan.path == "fused" and plan.config["IL"] == S == plan.config["S"] and plan.config["B"] == 1
    assert plan.config["ILV"] == (interleave == 2)
    if S == 8 and fmt == "nvfp4":  # every element written; and the vector load through TMA (il_tma) alike
        _, codes2, scales2 = _run(x, fmt, interleave, scale, poison=0xA5, tile_elems=16 * p)
        assert torch.equal(_bytes(codes), _bytes(codes2)) and torch.equal(_bytes(scales), _bytes(scales2))
        tplan = quantize.plan_quantize(x, fmt, FORMATS[fmt].default_group, None, True, True, False,
                                       interleave=2, il_tma=True, tile_elems=16 * p)
        assert tplan.config["TMA_LOAD"] and tplan.config["ILV"]
        tcodes, tscales, _ = quantize.run_plan(tplan, x, fmt, FORMATS[fmt].default_group, None, True, scale,
                                               poison=True)
        assert torch.equal(_bytes(codes), _bytes(tcodes)) and torch.equal(_bytes(scales), _bytes(tscales))
    base, base_codes, base_scales = _run(x, fmt, False, scale, tile_elems=16 * p)
    assert base.config["IL"] == 0 and base.config["S"] == S
    assert _same_scales(scales, base_scales)
    kw = {"scale": scale} if scale is not None else {}
    ref_codes, _ = hadamard_quantize_reference(x, format=fmt, **kw)
    a, b = code_order(codes.reshape(ref_codes.shape), fmt), code_order(ref_codes, fmt)
    e = code_order(base_codes.reshape(ref_codes.shape), fmt)
    finite = torch.isfinite(x).all(dim=-1)
    assert (a == b).double().mean() >= 0.999
    assert (a - b)[finite].abs().max() <= 1
    assert (a - e)[finite].abs().max() <= 1
    assert torch.equal(a[~finite], e[~finite])  # NaN / inf rows: the formats' rules, as the contiguous plan


def test_interleaved_slices_with_random_signs_and_where_the_plan_does_not_apply():
    torch.manual_seed(2)
    n = 12 * 128
    x = torch.randn(2, n, dtype=torch.bfloat16)
    signs = (torch.randint(0, 2, (n,)) * 2 - 1).to(torch.bfloat16)
    _, base_codes, base_scales = _run(x, "mxfp4", False, signs=signs, tile_elems=2048)
    e = code_order(base_codes, "mxfp4")
    for interleave in (True, 2):
        plan, codes, scales = _run(x, "mxfp4", interleave, signs=signs, tile_elems=2048)
        assert plan.config["IL"] == 2 and plan.config["ILV"] == (interleave == 2)
        a = code_order(codes, "mxfp4")
        assert (a - e).abs().max() <= 1 and (a == e).double().mean() >= 0.999
        assert _same_scales(scales, base_scales)
    # the shipped plans (configs.QUANT_INTERLEAVE): one vector load a column for the 4-bit formats at 16 bits,
    # the contiguous slices for fp8 / int8 (per token: slower interleaved on the H100) and float32 inputs
    for fmt, dtype, mode in (("mxfp4", torch.bfloat16, (8, True)), ("nvfp4", torch.float16, (8, True)),
                             ("int4", torch.bfloat16, (4, True)), ("fp8_e4m3", torch.bfloat16, (0, False)),
                             ("mxfp4", torch.float32, (0, False))):
        plan = quantize.kernel_plan(18724, 14336, dtype, fmt, FORMATS[fmt].default_group, None, True, fmt == "nvfp4",
                                    False, 132)
        assert (plan.config["IL"], plan.config["ILV"]) == mode, (fmt, dtype, plan.config)
    plan = quantize.kernel_plan(9448, 28672, torch.bfloat16, "nvfp4", 16, None, True, True, False, 132)
    assert plan.config["IL"] == 8  # checked on the GPU at that width in session 28 (configs.QUANT_INTERLEAVE)
    plan = quantize.kernel_plan(14170, 18944, torch.bfloat16, "int4", 32, None, True, False, False, 132)
    assert plan.path == "fused" and plan.config["IL"] == 0  # not yet checked on the GPU at that width
    # several rows a tile (B > 1) or one slice: the contiguous epilogue, whatever the tuning asks
    for n in (12 * 64, 20 * 128):
        plan = quantize.kernel_plan(64, n, torch.bfloat16, "mxfp4", 32, None, True, False, False, 2, True,
                                    interleave=True)
        assert plan.config["IL"] == 0, (n, plan.config)


@pytest.mark.parametrize("fmt, n", [("nvfp4", 512), ("mxfp4", 2048), ("fp8_e4m3", 1024)])
def test_pow2_permuted_columns_give_the_shipped_codes(fmt, n):
    """The pow2 kernel with the second product's columns permuted (plan tuning ``perm``, configs.
    QUANT_PERM_COLUMNS): each output is the same dot product, so codes and scales equal the shipped plan's
    bit for bit, and every element is written (poisoned outputs)."""
    torch.manual_seed(3)
    x = torch.randn(4, n, dtype=torch.float16)
    x[:, 5] *= 60
    x[1, 3] = float("nan")
    group = FORMATS[fmt].default_group
    scale = torch.tensor([0.002]) if fmt == "nvfp4" else None
    out = []
    for perm in (False, True):
        plan = quantize.kernel_plan(4, n, x.dtype, fmt, group, None, True, scale is not None, False, 2, True, perm=perm)
        assert plan.path == "pow2" and plan.config["PERM"] == perm
        out.append(quantize.run_plan(plan, x, fmt, group, None, True, scale, poison=True)[:2])
    (c0, s0), (c1, s1) = out
    assert torch.equal(_bytes(c0), _bytes(c1)) and torch.equal(_bytes(s0), _bytes(s1))
    kw = {"scale": scale} if scale is not None else {}
    ref_codes, _ = hadamard_quantize_reference(x, format=fmt, **kw)
    a, b = code_order(c1.reshape(ref_codes.shape), fmt), code_order(ref_codes, fmt)
    assert (a == b).double().mean() >= 0.999
