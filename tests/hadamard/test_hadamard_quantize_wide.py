"""hadamard_quantize's wide kernel (quantize_wide.wide_quantize_kernel; plan tuning ``wide``, configs.QUANT_WIDE):
n = m x 2^k with m > 64, the mixing in output blocks of 64 sub-rows and K chunks that stop at m instead of the
kron-tiled kernel's M_PAD. The same products up to the order of the float32 sums: codes >= 99.9% equal to the
float64 reference's and within one step of the kron-tiled plan's (equal on rows holding NaN or inf), float32
scales within 2^-20 of it, discrete scales equal. Through the interpreter at m = 108 (two blocks, the second
short) and 140 (three), outputs poisoned twice with different bytes (every element written), more rows than
programs (the persistent loop), each epilogue: per token, groups inside a slice, groups spanning sub-rows, the
blocks one at a time (j_outer), nvfp4's dynamic global scale (the AMAX pass), random signs."""
import pytest
import torch

from tilecore.ops.hadamard import configs, quantize
from tilecore.ops.hadamard.quantize_reference import FORMATS, code_order, hadamard_quantize_reference
from compiled_run import compiled_json

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered")


def _plan(x, fmt, scale, signs, **tuning):
    rows, n = x.shape
    return quantize.kernel_plan(rows, n, x.dtype, fmt, FORMATS[fmt].default_group, None, True, scale is not None,
                                signs is not None, 2, True, **tuning)


def _run(plan, x, fmt, scale, signs, poison=True):
    return quantize.run_plan(plan, x, fmt, FORMATS[fmt].default_group, None, True, scale, signs, poison=poison)


def _bytes(t):
    return t.contiguous().view(torch.uint8) if t.dtype != torch.float32 else t.nan_to_num(7.0)


def _same_scales(a, b):
    if a.dtype == torch.float32:  # another summation order: the float32 amax may move by an ulp
        a, b = a.nan_to_num(7.0), b.nan_to_num(7.0)
        return bool(((a - b).abs() <= 2.0**-20 * b.abs()).all())
    return torch.equal(_bytes(a), _bytes(b))


# (format, m, p, rows, tuning, compare with the kron-tiled plan, random signs): per token over 2 blocks; groups
# of 32 in a slice over 3 blocks, one at a time, with signs; int4's groups of 128 spanning 4 sub-rows of 32 with
# K chunks of 32 (2 rows); nvfp4's dynamic global scale (the AMAX pass) with S = 2 slices (p = 128: Q 64), one row;
# per token over 2 blocks of 128 sub-rows with K chunks of 64 (the tiles session 28's second GPU round times)
CASES = [("fp8_e4m3", 108, 16, 3, {"kc": 16, "num_stages": 1}, True, False), ("mxfp4", 140, 16, 3, {"j_outer": True, "kc": 32}, False, True),
         ("int4", 108, 32, 2, {"kc": 32}, False, False), ("nvfp4", 108, 128, 1, {"kc": 32}, False, False),
         ("int8", 140, 16, 3, {"kc": 64, "mb": 128, "num_stages": 2}, False, False)]


@pytest.mark.parametrize("fmt, m, p, rows, tuning, compare, with_signs", CASES)
def test_wide_kernel_matches_the_reference_and_the_kron_tiled_plan(fmt, m, p, rows, tuning, compare, with_signs):
    torch.manual_seed(4)
    n = m * p
    x = torch.randn(rows, n, dtype=torch.bfloat16)  # 3 rows on 2 programs: the persistent loop
    x[:, 7] *= 60  # an outlier channel
    if rows > 1:
        x[1, 3] = float("nan")
        x[-1, 70 * p + 5] = float("inf")  # in the second block of sub-rows
    signs = (torch.randint(0, 2, (n,)) * 2 - 1).to(torch.bfloat16) if with_signs else None
    plan = _plan(x, fmt, None, signs, wide=True, **tuning)
    mb = tuning.get("mb", 64)
    assert plan.path == "wide" and plan.config["NB"] == -(-m // mb) and plan.config["S"] == (2 if p == 128 else 1)
    assert plan.config["J_OUTER"] == bool(tuning.get("j_outer")) and plan.config["KC"] == tuning.get("kc", configs.QUANT_WIDE_KC)
    codes, scales, gs = _run(plan, x, fmt, None, signs)
    if fmt in ("fp8_e4m3", "int4"):  # every element written: other poison bytes, the same outputs
        codes2, scales2, _ = _run(plan, x, fmt, None, signs, poison=0xA5)
        assert torch.equal(_bytes(codes), _bytes(codes2)) and torch.equal(_bytes(scales), _bytes(scales2))
    kw = {"randomized_signs": signs} if signs is not None else {}
    ref_codes, ref_scales = hadamard_quantize_reference(x, format=fmt, **kw)
    a, b = code_order(codes.reshape(ref_codes.shape), fmt), code_order(ref_codes, fmt)
    finite = torch.isfinite(x).all(dim=-1)
    assert (a == b)[finite].double().mean() >= 0.999
    assert (a - b)[finite].abs().max() <= 1
    if fmt == "nvfp4":  # the dynamic global scale: the largest |y| over the tensor / (448 x 6), as the reference's
        assert torch.allclose(gs.reshape(()), ref_scales[1].reshape(()).to(torch.float32), rtol=2.0**-20)
    if compare:
        base = _plan(x, fmt, None, signs)
        assert base.path == "fused"
        base_codes, base_scales, _ = _run(base, x, fmt, None, signs)
        assert _same_scales(scales, base_scales)
        e = code_order(base_codes.reshape(ref_codes.shape), fmt)
        assert (a - e)[finite].abs().max() <= 1
        assert torch.equal(a[~finite], e[~finite])  # NaN / inf rows: the formats' rules, as the kron-tiled plan


def test_wide_plan_only_where_asked_and_where_it_applies():
    bf16 = torch.bfloat16

    def plan(n, fmt="mxfp4", dtype=bf16, **tuning):
        return quantize.kernel_plan(24385, n, dtype, fmt, FORMATS[fmt].default_group, None, True, fmt == "nvfp4",
                                    False, 132, **tuning)

    for n in (11008, 18944):  # where configs.QUANT_WIDE names the format and width (session 28's H100 run 10)
        for fmt in ("fp8_e4m3", "int8", "mxfp4", "nvfp4", "int4"):
            assert plan(n, fmt).path == ("wide" if quantize._by_format(configs.QUANT_WIDE, fmt, n) else "fused")
    p = plan(11008, wide=True, kc=16)
    assert (p.path, p.config["M"], p.config["NB"], p.config["NK"], p.config["S"]) == ("wide", 172, 3, 11, 1)
    p = plan(18944, "fp8_e4m3", wide=True, kc=16, mb=64)  # mb given: configs.QUANT_WIDE_TUNING has 128 there
    assert (p.path, p.config["M"], p.config["NB"], p.config["NK"], p.config["S"]) == ("wide", 148, 3, 10, 2)
    p = plan(11008, wide=True, mb=128, kc=64)
    assert (p.config["NB"], p.config["NK"]) == (2, 3)
    assert not p.config["J_OUTER"] and not plan(18944, "fp8_e4m3", wide=True, j_outer=True).config["J_OUTER"]
    # not: m <= 64 (14336 = 28 x 512), float32 inputs, more than 2 slices (172 x 512), more than 4 blocks
    assert plan(14336, wide=True).path == "fused"
    assert plan(11008, dtype=torch.float32, wide=True).path == "fused"
    assert plan(172 * 512, wide=True).path != "wide"
    assert plan(11008, wide=True, mb=32).path == "fused"


def test_wide_transform_is_the_transform_at_the_rounding_floor():
    """quantize.wide_transform (the kernel's FORMAT STORE: the plain transform on its tiling, for the GPU probe):
    float16 (the interpreter's bf16 products are not the GPU's) within 1.25x the rounding floor of the float64
    transform, every element written (NaN-poisoned output); no wide plan for m <= 64: a clear error."""
    from tilecore import accuracy
    from tilecore.ops.hadamard import hadamard_reference

    torch.manual_seed(5)
    n = 108 * 16
    x = torch.randn(3, n, dtype=torch.float16)
    out = torch.full_like(x, float("nan"))
    plan = quantize.wide_transform(x, out)
    assert plan.path == "wide" and bool(torch.isfinite(out).all())
    ref = hadamard_reference(x, n**-0.5, out_dtype=torch.float64)
    assert accuracy.error_over_floor(out, ref) <= 1.25
    with pytest.raises(ValueError, match="no wide plan"):
        quantize.wide_transform(torch.randn(2, 12 * 64, dtype=torch.float16), torch.empty(2, 12 * 64, dtype=torch.float16))


_COMPILE_WIDE = """
import json, torch
from tilecore.ops.hadamard import quantize
from tilecore.ops.hadamard.quantize_wide import wide_quantize_kernel
from tilecore.tiles.compile import compile_kernel, resources
rows, n = 1 << 16, 11008
plan = quantize.kernel_plan(rows, n, torch.bfloat16, "fp8_e4m3", None, None, True, False, False, 132, wide=True)
cfg = dict(plan.config)
warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
x = torch.empty(64, n, dtype=torch.bfloat16)
codes, scales = torch.empty(64, n, dtype=torch.uint8), torch.empty(64, 1)
h = torch.empty(cfg["M_PAD"], cfg["M_PAD"], dtype=torch.bfloat16)
args = dict(x=x, codes=codes, scales=scales, h=h, signs=x, gscale=scales, amax_out=scales, rows=rows, stride_x=n,
            stride_codes=n, stride_scales=1, rscale=0.5, **cfg)
k = compile_kernel(wide_quantize_kernel, args, num_warps=warps, num_stages=stages)
print(json.dumps({**vars(resources(k)), "wgmma": "wgmma" in k.asm["ptx"]}))
"""


def test_wide_kernel_compiles_for_sm90_without_spills():
    """The GPU-only code of the wide kernel (the plan the probe runs: fp8 per token at 11008, its NB x S blocks all
    live) compiles for sm_90a on this machine (a fresh process without the interpreter): wgmma, no spills
    (session 28: 155 registers a thread at 8 warps)."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    res = compiled_json(_COMPILE_WIDE, timeout=600, cwd=root, env={"PYTHONPATH": root})
    assert res["wgmma"] and res["spill_stores"] == 0 and not res["wgmma_serialized"], res


def test_kron_tiled_mixing_stopping_at_m_gives_the_same_bytes():
    """The kron-tiled kernel's K-chunked mixing without its all-zero last chunks (plan tuning ``k_stop``,
    configs.QUANT_K_STOP): the same products plus fewer exact zeros, so codes and scales bit for bit the shipped
    plan's, every element written; the plain transform's kernel keeps all M_PAD / 64 chunks (its default)."""
    torch.manual_seed(6)
    n = 140 * 16  # M_PAD 256: 3 of 4 chunks hold sub-rows < 140
    x = torch.randn(3, n, dtype=torch.float16)
    x[1, 3] = float("nan")
    out = []
    for k_stop in (False, True):
        plan = _plan(x, "mxfp4", None, None, k_stop=k_stop)
        assert plan.path == "fused" and plan.config["K_STOP"] == k_stop
        out.append(_run(plan, x, "mxfp4", None, None, poison=0xA5 if k_stop else True)[:2])
    (c0, s0), (c1, s1) = out
    assert torch.equal(_bytes(c0), _bytes(c1)) and torch.equal(_bytes(s0), _bytes(s1))
    assert not _plan(torch.randn(2, 28 * 64), "mxfp4", None, None, k_stop=True).config["K_STOP"]  # M_PAD 32: no chunks
