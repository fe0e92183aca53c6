"""TRUNC_HI on the pow2 quantize kernel (issue 32): the second product's hi piece truncated by one prmt a column pair
instead of rounded by cvt.rn.bf16x2 (kernels._pairs_dot's TRUNC, MID_PIECES -4, plan tuning ``trunc_hi``,
configs.QUANT_POW2_TRUNC_HI), lo = a - hi rounded to bf16 as before: one conversion a pair instead of two.

* The pieces: the interpreter's emulation (kernels._trunc_pieces, by bits) equals hi = a's upper half and lo =
  bf16(a - hi) rounded half to even (torch's rounding, as the GPU's cvt.rn), within 2^-15 |a| of a (normal lo); inf keeps
  hi inf,
  lo 0.
* The interpreter's codes against the float64 reference (>= 99.9% equal, none two apart, scales exact, every byte
  written), NaN / inf / tiny rows included, per-token and group formats.
* sm_90a: the prmt in the PTX, half the loop's conversions, no spills, the loop no longer."""

import pytest
import torch
import triton
import triton.language as tl

from tilecore.ops.hadamard import kernels, quantize
from tilecore.ops.hadamard.quantize_reference import FORMATS, code_order, hadamard_quantize_reference
from compiled_run import compiled_json_lines

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered")


@triton.jit
def _pieces_kernel(a, hi, lo, N: tl.constexpr):
    i = tl.arange(0, N)
    h, r = kernels._trunc_pieces(tl.load(a + i))
    tl.store(hi + i, h)
    tl.store(lo + i, r)


def test_trunc_pieces_are_the_upper_half_and_the_rounded_rest():
    torch.manual_seed(3)
    n = 4096
    a = torch.randn(n, dtype=torch.float64) * torch.exp2(torch.randint(-120, 120, (n,)).double())
    a = a.to(torch.float32)
    a[:8] = torch.tensor([0.0, -0.0, 1.0, -3.0, 2.0**-140, float("inf"), -float("inf"), 1.0 + 2.0**-9])
    # ties of lo's rounding: a - hi exactly half a bf16 step of lo
    a[8:16] = (torch.tensor([1.0, 1.5, -1.25, 3.0, 7.0, -5.0, 1.75, 1.125]) * (1 + 2.0**-7 + 2.0**-16 + 2.0**-23))
    hi, lo = torch.empty_like(a), torch.empty_like(a)
    _pieces_kernel[(1,)](a, hi, lo, N=n)
    want_hi = (a.view(torch.int32) & -65536).view(torch.float32)
    rest = torch.where(torch.isfinite(a), a - want_hi, torch.zeros_like(a))
    want_lo = rest.to(torch.bfloat16).to(torch.float32)
    assert torch.equal(hi.view(torch.int32), want_hi.view(torch.int32))
    assert torch.equal(lo.view(torch.int32), want_lo.view(torch.int32))
    fin = torch.isfinite(a) & (a.abs() >= 2.0**-100)  # (lo a normal bf16: tinier a keep an absolute bound)
    err = (a[fin].double() - hi[fin].double() - lo[fin].double()).abs()
    assert bool((err <= 2.0**-15 * a[fin].double().abs()).all())
    assert torch.equal(hi[5:7], a[5:7]) and torch.equal(lo[5:7], torch.zeros(2))


def _run(x, fmt, poison=True, **tuning):
    rows, n = x.shape
    group = FORMATS[fmt].default_group
    scale = torch.tensor([0.002]) if fmt == "nvfp4" else None
    plan = quantize.kernel_plan(rows, n, x.dtype, fmt, group, None, True, scale is not None, False, 4, True, **tuning)
    codes, scales, _ = quantize.run_plan(plan, x, fmt, group, None, True, scale, poison=poison)
    return plan, codes, scales, scale


@pytest.mark.parametrize("fmt,n,tuning", [("fp8_e4m3", 1024, {"split": (1, 16, 64)}), ("int8", 2048, {}),
                                          ("mxfp4", 512, {}), ("nvfp4", 1024, {"split": (1, 16, 64), "perm": True}),
                                          ("int4", 1024, {"split": (1, 16, 64), "perm": True, "int_bits": True})])
def test_interpreter_codes_match_the_float64_reference(fmt, n, tuning):
    torch.manual_seed(11)
    x = torch.randn(6, n, dtype=torch.bfloat16)
    x[:, 3] *= 90  # an outlier channel
    x[1, 7] = float("nan")  # a NaN row
    x[2, 9] = float("inf")  # an inf row
    x[3] *= 1e-30  # a tiny row
    plan, codes, scales, scale = _run(x, fmt, trunc_hi=True, **tuning)
    _, codes2, scales2, _ = _run(x, fmt, poison=0xA5, trunc_hi=True, **tuning)
    assert plan.path == "pow2" and plan.config["MID_PIECES"] == -4
    assert torch.equal(codes.view(torch.uint8), codes2.view(torch.uint8))  # every byte written
    ref_codes, ref_scales = hadamard_quantize_reference(x, format=fmt, **({"scale": scale} if scale is not None else {}))
    a, b = code_order(codes.reshape(ref_codes.shape), fmt), code_order(ref_codes, fmt)
    assert (a == b).double().mean() >= 0.999 and int(((a - b).abs() > 1).sum()) == 0
    ours = scales[0] if isinstance(scales, tuple) else scales
    ref = ref_scales[0] if isinstance(ref_scales, tuple) else ref_scales
    ours = ours.reshape(ref.shape)
    if ours.dtype == torch.float32:
        r = ref.to(torch.float32)
        assert bool((((ours - r).abs() <= 2.0**-15 * r.abs()) | (ours == r) | (ours.isnan() & r.isnan())).all())
    else:
        assert torch.equal(ours.view(torch.uint8), ref.view(torch.uint8))


def test_trunc_hi_off_by_default_and_for_float32():
    assert not quantize.configs.QUANT_POW2_TRUNC_HI or all(quantize.configs.QUANT_POW2_TRUNC_HI.values())
    plan = quantize.kernel_plan(64, 4096, torch.float32, "fp8_e4m3", None, None, True, False, False, 132, False,
                                trunc_hi=True)
    assert plan.config["MID_PIECES"] == 3
    plan = quantize.kernel_plan(64, 4096, torch.bfloat16, "fp8_e4m3", None, None, True, False, False, 132, False,
                                trunc_hi=False)
    assert plan.config["MID_PIECES"] != -4


_COMPILE = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from experiments.hadamard import sass_quantize as sq
from tilecore.tiles.compile import resources
for fmt, n in (("fp8_e4m3", 4096),):
    for trunc in (False, True):
        plan, k = sq.compile_case(fmt, n, True, trunc_hi=trunc, pairs=True, clamp_lo=True)
        body = sq.loop_body(sq.sass_lines(k.asm["cubin"]))
        print(json.dumps(dict(fmt=fmt, trunc=trunc, loop=len(body), convert=sq.kinds(body)["convert"],
                              spills=resources(k).spill_stores, prmt=k.asm["ptx"].count("0x7632;"),
                              pieces=plan.config["MID_PIECES"])))
"""


def test_trunc_hi_compiles_for_sm90_with_half_the_conversions():
    rows = compiled_json_lines(_COMPILE, timeout=900)
    for base, trunc in zip(rows[::2], rows[1::2]):
        assert base["pieces"] == -3 and trunc["pieces"] == -4 and base["prmt"] == 0 and trunc["prmt"] >= 8, (base, trunc)
        assert trunc["spills"] == base["spills"] == 0 and trunc["loop"] <= base["loop"], (base, trunc)
        # the pieces' hi conversions gone: one a value pair fewer (fp8: 1.5 -> 1 a value; mxfp4: 1 -> 0.5)
        assert trunc["convert"] <= base["convert"] - base["convert"] // 3, (base, trunc)

