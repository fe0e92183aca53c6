"""INT_BITS on the pow2 quantize kernel (issue 32): int8 / int4 codes from the bits of fma(y, 1 / s, 1.5 x 2^23)
(quantize_kernels._int_bits) instead of FAST's multiply and cvt.rni (plan tuning ``int_bits``,
configs.QUANT_POW2_INT_BITS).

* The bit trick: for |q| <= 2^22, q + 1.5 x 2^23 rounded to float32 is 1.5 x 2^23 + round_half_even(q), so the low byte
  of its bits is round(q)'s two's-complement byte (torch, every tie and both ends of int8 / int4).
* The interpreter (whose fma rounds twice, so the same codes as the shipped path's): the same bytes as the plan without
  INT_BITS, NaN / inf rows (codes 0) and int4 groups included.
* sm_90a: no F2I in the loop (the conversion pipe's cvt.rni), no spills."""

import pytest
import torch

from tilecore.ops.hadamard import quantize
from tilecore.ops.hadamard.quantize_reference import FORMATS
from compiled_run import compiled_json_lines

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered")

M = 12582912.0  # 1.5 x 2^23


def test_low_byte_of_the_sum_is_the_rounded_code():
    k = torch.arange(-130, 131, dtype=torch.float64)
    q = torch.cat([k, k + 0.5, k - 0.5, k + 0.25, k + 0.75, k + 0.5 - 2.0**-16, k + 0.5 + 2.0**-16,
                   torch.tensor([-0.0, 2.0**-30, -(2.0**-30)], dtype=torch.float64)]).to(torch.float32)
    bits = (q + torch.tensor(M, dtype=torch.float32)).view(torch.int32)
    want = torch.round(q.double()).to(torch.int64)  # torch.round: half to even
    assert torch.equal((bits & 0xFF).to(torch.int64), want & 0xFF)  # the int8 byte
    assert torch.equal((bits & 0xF).to(torch.int64), want & 0xF)  # int4's nibble
    assert torch.equal(bits.to(torch.int64) - 0x4B400000, want)  # the whole code in the low mantissa bits


def _run(x, fmt, poison=True, **tuning):
    rows, n = x.shape
    group = FORMATS[fmt].default_group
    plan = quantize.kernel_plan(rows, n, x.dtype, fmt, group, None, True, False, False, 4, True, **tuning)
    codes, scales, _ = quantize.run_plan(plan, x, fmt, group, None, True, None, poison=poison)
    return plan, [t.contiguous().view(torch.uint8) for t in (codes, scales)]


@pytest.mark.parametrize("fmt,n,tuning", [("int8", 2048, {}), ("int8", 256, {}),
                                          ("int4", 1024, {"split": (1, 16, 64), "perm": True}), ("int4", 512, {})])
def test_interpreter_bytes_equal_the_conversion(fmt, n, tuning):
    torch.manual_seed(7)
    x = torch.randn(6, n, dtype=torch.bfloat16)
    x[:, 3] *= 90  # an outlier channel
    x[1, 7] = float("nan")  # a NaN row (int4: its group)
    x[2, 9] = float("inf")  # an inf row
    x[3] *= 1e-30  # a tiny row
    x[4] = 0.0  # a zero row (scale 1)
    p0, b0 = _run(x, fmt, int_bits=False, **tuning)
    p1, b1 = _run(x, fmt, int_bits=True, **tuning)
    _, b2 = _run(x, fmt, poison=0xA5, int_bits=True, **tuning)
    assert "INT_BITS" not in p0.config and p1.config["INT_BITS"]
    assert all(torch.equal(a, b) for a, b in zip(b0, b1)) and all(torch.equal(a, b) for a, b in zip(b1, b2))


def test_int_bits_plan_only_for_integer_formats_with_fast():
    """The tuning reaches int8 / int4 plans with FAST only; configs.QUANT_POW2_INT_BITS where it measured faster."""
    def cfg(fmt, **t):
        return quantize.kernel_plan(64, 1024, torch.bfloat16, fmt, FORMATS[fmt].default_group, None, True, False,
                                    False, 4, True, int_bits=True, **t).config
    assert cfg("int8").get("INT_BITS") and cfg("int4").get("INT_BITS")
    assert not cfg("int8", fast=False).get("INT_BITS")
    assert not any(cfg(f).get("INT_BITS") for f in ("fp8_e4m3", "mxfp4", "nvfp4"))
    shipped = quantize.kernel_plan(64, 1024, torch.bfloat16, "int4", 128, None, True, False, False, 4, True).config
    assert shipped.get("INT_BITS") == bool(quantize.configs.QUANT_POW2_INT_BITS.get(("int4", 1024)))



def test_pow2_plans_under_128_registers_where_measured():
    """Session 44 runs 1-2 (notes/hadamard/runs/he_s44a_run1_session44_h200.txt, he_s44b_run2_session44_h200.txt; H200,
    float64-checked): registers capped at 128 (four programs an SM, not three) at int4 2048 with INT_BITS (uncapped it
    takes 129, three programs: 0.92x in session 39; capped 1.043x / 1.009x) and a persistent grid (1.037x more), mxfp4
    2048 1.048x, nvfp4 2048 1.027x, int4 512 with INT_BITS 1.039x, nvfp4 512 1.021x; not mxfp4 512 / 1024 (0.96x).
    float32 inputs keep Triton's registers."""
    def plan(fmt, n, dtype=torch.bfloat16, **t):
        return quantize.kernel_plan((1 << 28) // n, n, dtype, fmt, FORMATS[fmt].default_group, None, True,
                                    fmt == "nvfp4", False, 132, **t)
    for fmt, n in (("int4", 2048), ("mxfp4", 2048), ("nvfp4", 2048), ("int4", 512), ("nvfp4", 512)):
        cfg = plan(fmt, n).config
        assert cfg["maxnreg"] == 128 and cfg["num_warps"] == 4, (fmt, n, cfg)
        assert bool(cfg.get("INT_BITS")) == (fmt == "int4"), (fmt, n, cfg)
        assert "maxnreg" not in plan(fmt, n, torch.float32).config
        assert "maxnreg" not in plan(fmt, n, maxnreg=None).config
    assert plan("int4", 2048).grid == (4 * 132,) and plan("int4", 2048, waves=64).grid == (64 * 132,)
    # run 3 (he_s44c_run3_session44_h200.txt): int4 8192 on the three programs an SM that fit (59 KB) 1.048x
    assert plan("int4", 8192).grid == (3 * 132,) and plan("mxfp4", 8192).grid == (32 * 132,)
    assert "INT_BITS" not in plan("int4", 2048, int_bits=False).config
    assert all("maxnreg" not in plan("mxfp4", n).config for n in (512, 1024))


_COMPILE = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from experiments.hadamard import sass_quantize as sq
from tilecore.tiles.compile import resources
for fmt, n in (("int8", 8192), ("int4", 4096), ("int4", 2048)):
    for on in (False, True):
        plan, k = sq.compile_case(fmt, n, True, int_bits=on, **({} if on else {"maxnreg": None}))
        body = sq.loop_body(sq.sass_lines(k.asm["cubin"]))
        print(json.dumps(dict(fmt=fmt, on=on, loop=len(body), f2i=sum(i.split()[0].startswith("F2I") for i in body),
                              spills=resources(k).spill_stores, flag=bool(plan.config.get("INT_BITS")),
                              registers=resources(k).registers)))
"""


def test_int_bits_compiles_for_sm90_without_conversions():
    """int8 8192, int4 4096 and 2048 (their shipped splits, sm_90a; 2048 capped at 128 registers): the loop's F2I (one
    a value) gone, no more loop instructions than before, no spills; int4 2048 at 128 registers (four programs an SM)."""
    rows = compiled_json_lines(_COMPILE, timeout=900)
    assert len(rows) == 6, rows
    for off, on in zip(rows[::2], rows[1::2]):
        assert not off["flag"] and on["flag"] and off["f2i"] > 0 and on["f2i"] == 0, (off, on)
        assert on["loop"] <= off["loop"] + 4 and on["spills"] == 0, (off, on)
    assert rows[5]["registers"] <= 128, rows[5]


def test_gluon_token_max_zeroes_nan_and_keeps_codes():
    """The Gluon kernels' int8 per-token INT_BITS (gluon_epilogue.token_codes): max(q + M, M - 256) (max.f32 returns
    the other operand for NaN: torch.fmax) has low byte 0 for NaN q (a NaN row, or inf x 0 in an inf row: cvt.rni's 0)
    and leaves every finite |q| <= 127 (1 + 2^-22) alone."""
    q = torch.cat([torch.linspace(-127.00002, 127.00002, 100001), torch.tensor([float("nan"), 0.0, -0.0])])
    m = torch.tensor(M, dtype=torch.float32)
    t = torch.fmax(q + m, m - 256).view(torch.int32)
    want = torch.where(torch.isnan(q), torch.zeros_like(q), torch.round(q.double()).float()).to(torch.int64)
    assert torch.equal((t & 0xFF).to(torch.int64), want & 0xFF)


def test_gluon_plan_switch():
    """The tuning "int_bits" reaches both Gluon kernels' plans (11008 / 18944 wide, 14336 / 28672 kron) for int8 and
    int4 only; off in the shipped table (configs.QUANT_GLUON_INT_BITS) until a GPU run times it."""
    for n in (11008, 14336, 18944, 28672):
        for fmt in ("int8", "int4"):
            plan = quantize.kernel_plan(1 << 14, n, torch.bfloat16, fmt, FORMATS[fmt].default_group, None, True, False,
                                        False, 132, False, _gluon_ok=True, int_bits=True)
            assert plan.path in ("gluon_wide", "gluon_kron") and plan.config.get("INT_BITS"), (fmt, n, plan.path)
        for fmt in ("fp8_e4m3", "mxfp4"):
            plan = quantize.kernel_plan(1 << 14, n, torch.bfloat16, fmt, FORMATS[fmt].default_group, None, True, False,
                                        False, 132, False, _gluon_ok=True, int_bits=True)
            assert not plan.config.get("INT_BITS"), (fmt, n)


_GLUON = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from experiments.hadamard import kron_gluon_compile as K, wide_gluon_compile as W
for name, r in (("kron int4 14336", K.compile_one(28, 512, 2, "int4", fold=True, nozero=True, clamp_lo=2,
                                                  extra={"INT_BITS": True})),
                ("wide int8 11008", W.compile_one(172, 64, "int8", ktrim=True, fold=True, clamp_lo=2,
                                                  extra={"INT_BITS": True}))):
    print(json.dumps(dict(name=name, cvt_rni=r["cvt_rni"], spills=r["spill_stores"])))
"""


def test_gluon_int_bits_compiles_without_cvt_rni():
    """Both Gluon kernels with INT_BITS (sm_90a): no cvt.rni in the PTX (128 / 192 without it), no spills
    (as without it)."""
    for row in compiled_json_lines(_GLUON, timeout=900):
        assert row["cvt_rni"] == 0 and row["spills"] == 0, row


def test_gluon_int4_keeps_only_finite_groups():
    """Run 4 (notes/hadamard/runs/pow2_s38c_run4_session38_h100.txt) showed the Gluon int4 codes with INT_BITS wrong on
    an inf row: its groups' amax is inf, the reciprocal 0, and inf x 0 = NaN, which cvt.rni makes 0 but whose bits end
    in 0xF; gluon_epilogue._group_scale's keep (amax not NaN) let it through. With INT_BITS the keep is amax < inf:
    the group's codes 0, as the reference's (torch emulation of the group path: keep, then the nibble)."""
    y = torch.tensor([[1.5, float("inf"), -2.0, 0.25], [1.0, -3.0, 0.5, 7.0], [float("nan"), 1.0, 2.0, 3.0]])
    ga = y.abs().amax(1, keepdim=True)
    div = torch.where(ga == 0, torch.ones_like(ga), ga / 7.0)
    q = y * (1.0 / div)
    t = q + torch.tensor(M, dtype=torch.float32)
    # the GPU's arithmetic makes NaN as 0x7FFFFFFF (the CPU's 0x7FC00000 ends in 0): the bits _int_bits reads there
    bits = torch.where(torch.isnan(t), torch.tensor(0x7FFFFFFF, dtype=torch.int32), t.view(torch.int32)) & 0xF
    old_keep, new_keep = ga == ga, ga < float("inf")
    want = torch.tensor([[0, 0, 0, 0], [1, -3 & 0xF, 0, 7], [0, 0, 0, 0]], dtype=torch.int32)
    assert torch.equal(torch.where(new_keep, bits, 0), want)
    assert not torch.equal(torch.where(old_keep, bits, 0), want)  # the inf row's NaN codes: 0xF
