"""hadamard_quantize's "wide_rows" kernel (quantize_wide_rows.wide_rows_quantize_kernel; plan tuning ``wide_rows``,
configs.QUANT_WIDE_ROWS, off until a GPU run): the wide kernel with its mixing 128 columns wide, two rows' slices at
p = 64 (R = 2) or a row's two slices at p = 128 (R = 1), as one [MB, 128] product split afterwards (SPLIT) or two
[MB, 64] products sharing each H chunk ("pair"). Through the interpreter at m = 108 (two blocks, the second short)
and 140 (three): codes >= 99.9% equal to the float64 reference's and within one step of the wide plan's (equal on
rows holding NaN or inf), scales as the wide plan's, every element written (two poison bytes), nvfp4's dynamic
global scale, random signs; the plain transform (STORE) at the
rounding floor; and an sm_90a compile without spills, wgmma in the PTX."""
import os

import pytest
import torch

from tilecore.ops.hadamard import configs, quantize
from tilecore.ops.hadamard.quantize_reference import FORMATS, code_order, hadamard_quantize_reference
from compiled_run import compiled_json

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _plan(x, fmt, signs, **tuning):
    rows, n = x.shape
    return quantize.kernel_plan(rows, n, x.dtype, fmt, FORMATS[fmt].default_group, None, True, False,
                                signs is not None, 2, True, **tuning)


def _run(plan, x, fmt, signs, poison=True):
    return quantize.run_plan(plan, x, fmt, FORMATS[fmt].default_group, None, True, None, signs, poison=poison)


def _bytes(t):
    return t.contiguous().view(torch.uint8) if t.dtype != torch.float32 else t.nan_to_num(7.0)


# (format, m, p, rows, wide_rows, random signs, compare with the wide plan): per token, two rows a tile; groups of 32
# in a slice, paired products, with signs; nvfp4's dynamic global scale (the AMAX pass) over a row's two slices
# (p = 128); int8 per token over a row's two slices, paired, against the wide plan (an odd row count, the last
# tile half past the end: tests/hadamard/test_kron_wide_rows.py)
CASES = [("fp8_e4m3", 108, 64, 2, True, False, False), ("mxfp4", 108, 64, 2, "pair", True, False),
         ("nvfp4", 108, 128, 1, True, False, False), ("int8", 108, 128, 1, "pair", False, True)]


@pytest.mark.parametrize("fmt, m, p, rows, wide_rows, with_signs, compare", CASES)
def test_wide_rows_matches_the_reference_and_the_wide_plan(fmt, m, p, rows, wide_rows, with_signs, compare):
    torch.manual_seed(6)
    n = m * p
    x = torch.randn(rows, n, dtype=torch.bfloat16)
    x[:, 7] *= 60  # an outlier channel
    if rows > 1:
        x[1, 3] = float("nan")
        x[-1, 70 * p + 5] = float("inf")  # in the second block of sub-rows
    signs = (torch.randint(0, 2, (n,)) * 2 - 1).to(torch.bfloat16) if with_signs else None
    tuning = dict(wide=True, kc=64, mb=64, num_stages=2)
    plan = _plan(x, fmt, signs, wide_rows=wide_rows, **tuning)
    assert plan.path == "wide_rows" and plan.config["R"] == (2 if p == 64 else 1)
    assert plan.config["SPLIT"] == (wide_rows is True) and plan.config["NB"] == -(-m // 64)
    codes, scales, gs = _run(plan, x, fmt, signs)
    if rows > 1:  # every element written: other poison bytes, the same bytes
        codes2, scales2, _ = _run(plan, x, fmt, signs, poison=0xA5)
        assert torch.equal(_bytes(codes), _bytes(codes2)) and torch.equal(_bytes(scales), _bytes(scales2))
    kw = {"randomized_signs": signs} if signs is not None else {}
    ref_codes, ref_scales = hadamard_quantize_reference(x, format=fmt, **kw)
    a, b = code_order(codes.reshape(ref_codes.shape), fmt), code_order(ref_codes, fmt)
    finite = torch.isfinite(x).all(dim=-1)
    assert (a == b)[finite].double().mean() >= 0.999
    assert (a - b)[finite].abs().max() <= 1
    if fmt == "nvfp4":  # the dynamic global scale: the largest |y| over the tensor / (448 x 6), as the reference's
        assert torch.allclose(gs.reshape(()), ref_scales[1].reshape(()).to(torch.float32), rtol=2.0**-20)
        assert torch.equal(_bytes(scales), _bytes(ref_scales[0].reshape(scales.shape)))
    if not compare:
        return
    base = _plan(x, fmt, signs, **tuning)
    assert base.path == "wide"
    base_codes, base_scales, _ = _run(base, x, fmt, signs)
    if base_scales.dtype == torch.float32:  # another summation order: the float32 amax may move by an ulp
        assert bool(((scales.nan_to_num(7.0) - base_scales.nan_to_num(7.0)).abs()
                     <= 2.0**-20 * base_scales.nan_to_num(7.0).abs()).all())
    else:
        assert torch.equal(_bytes(scales), _bytes(base_scales))
    e = code_order(base_codes.reshape(ref_codes.shape), fmt)
    assert (a - e)[finite].abs().max() <= 1
    assert torch.equal(a[~finite], e[~finite])  # NaN / inf rows: the formats' rules, as the wide plan


def test_wide_rows_plan_only_where_asked_and_where_it_applies():
    def plan(n, fmt="fp8_e4m3", **tuning):
        return quantize.kernel_plan(24385, n, torch.bfloat16, fmt, FORMATS[fmt].default_group, None, True,
                                    fmt == "nvfp4", False, 132, **tuning)

    for n in (11008, 18944):  # off by default (configs.QUANT_WIDE_ROWS), and only on top of the wide plan
        for fmt in ("fp8_e4m3", "mxfp4"):
            assert plan(n, fmt).path == ("wide_rows" if quantize._by_format(configs.QUANT_WIDE_ROWS, fmt, n) else
                                         "wide" if quantize._by_format(configs.QUANT_WIDE, fmt, n) else "fused")
    p = plan(11008, wide=True, wide_rows=True, mb=64, num_warps=8)
    assert (p.path, p.config["R"], p.config["S"], p.config["NB"], p.config["NK"]) == ("wide_rows", 2, 1, 3, 3)
    assert p.grid == (min(-(-24385 // 2), 132 * configs.KRON_WAVES),)
    p = plan(18944, wide=True, wide_rows="pair", mb=64)
    assert (p.path, p.config["R"], p.config["S"], p.config["SPLIT"]) == ("wide_rows", 1, 2, False)
    assert plan(11008, "mxfp4", wide=True, wide_rows=True, j_outer=True).path == "wide"  # one block at a time: no
    assert plan(14336, wide=True, wide_rows=True).path == "fused"  # m <= 64: no wide plan at all


def test_wide_rows_transform_is_the_transform_at_the_rounding_floor():
    """quantize.wide_transform on this kernel (FORMAT STORE), float16, 3 rows (R = 2: the last tile half past the
    end): within 1.25x the rounding floor of the float64 transform, every element written (NaN-poisoned)."""
    from tilecore import accuracy
    from tilecore.ops.hadamard import hadamard_reference

    torch.manual_seed(7)
    n = 108 * 64
    x = torch.randn(3, n, dtype=torch.float16)
    out = torch.full_like(x, float("nan"))
    plan = quantize.wide_transform(x, out, wide_rows=True, kc=64, mb=64)
    assert plan.path == "wide_rows" and bool(torch.isfinite(out).all())
    ref = hadamard_reference(x, n**-0.5, out_dtype=torch.float64)
    assert accuracy.error_over_floor(out, ref) <= 1.25


_COMPILE = """
import json, re, torch
from tilecore.ops.hadamard import quantize
from tilecore.ops.hadamard.quantize_wide_rows import wide_rows_quantize_kernel
from tilecore.tiles.compile import compile_kernel, resources
rows, n = 1 << 16, 11008
plan = quantize.kernel_plan(rows, n, torch.bfloat16, "fp8_e4m3", None, None, True, False, False, 132, wide=True,
                            wide_rows="pair", mb=64, num_warps=8)
cfg = dict(plan.config)
warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
x = torch.empty(64, n, dtype=torch.bfloat16)
codes, scales = torch.empty(64, n, dtype=torch.uint8), torch.empty(64, 1)
h = torch.empty(cfg["M_PAD"], cfg["M_PAD"], dtype=torch.bfloat16)
args = dict(x=x, codes=codes, scales=scales, h=h, signs=x, gscale=scales, amax_out=scales, rows=rows, stride_x=n,
            stride_codes=n, stride_scales=1, rscale=0.5, **cfg)
k = compile_kernel(wide_rows_quantize_kernel, args, num_warps=warps, num_stages=stages)
r = resources(k)
ptx = k.asm["ptx"]
print(json.dumps(dict(spills=r.spill_stores + r.spill_loads, registers=r.registers, serialized=r.wgmma_serialized,
                      wgmma=len(re.findall(r"wgmma.mma_async", ptx)), mma_sync=len(re.findall(r"mma.sync", ptx)))))
"""


def test_wide_rows_compiles_for_sm90_without_spills():
    """fp8 11008, paired products on 8 warps (the probe's first variant): wgmma (no mma.sync), none serialized,
    no spills (ptxas, sm_90a, compiled on this GPU-less machine in a fresh process without the interpreter)."""
    rep = compiled_json(_COMPILE, timeout=600, cwd=ROOT, env={"PYTHONPATH": ROOT})
    assert rep["spills"] == 0 and rep["wgmma"] > 0 and rep["mma_sync"] == 0 and not rep["serialized"], rep
