"""hadamard_quantize's power-of-two rows on the Gluon kron kernel (plan tuning "gluon_pow2", configs.QUANT_GLUON_POW2;
issue 32, session 40): n = m p with Sylvester's H_m resident (gluon_quantize_kron._operand_a), so that the kernel's
H_m (x) H_p is H_n itself. Gluon kernels do not run in the interpreter: here the resident operand, the kernel's data
flow replayed in float64 (gluon_quantize_kron.emulate) against the float64 transform of n, the plan's choices, and an
sm_90a compile in a fresh process. The codes are checked on the GPU against the float64 reference
(experiments/hadamard/gpu_quantize_sets.py --set n)."""

import pytest
import torch

from tilecore.ops.hadamard import configs, gluon_quantize_kron as gk, quantize
from tilecore.ops.hadamard.reference import hadamard_matrix, hadamard_reference
from compiled_run import compiled_json_lines


@pytest.mark.parametrize("m", [16, 32])
def test_resident_operand_is_sylvester_h_m_kron_h_2(m):
    a = gk.gluon_operand(m, torch.bfloat16, "cpu")[:64].view(torch.bfloat16).double()
    hm = torch.zeros(32, 32, dtype=torch.float64)
    hm[:m, :m] = hadamard_matrix(m, torch.float64)
    assert torch.equal(a, torch.kron(hm, hadamard_matrix(2, torch.float64)))


@pytest.mark.parametrize("m, p, split", [(32, 512, 2), (32, 1024, 2), (16, 1024, 2), (32, 256, 1)])
def test_kernel_data_flow_is_the_power_of_two_transform(m, p, split):
    assert gk.fits(m, p, split)
    n = m * p
    torch.manual_seed(n + split)
    x = torch.randn(2, n, dtype=torch.float64)
    y, blocks = gk.emulate(x, m, p, split, False, n**-0.5)
    assert (y - hadamard_reference(x, n**-0.5, out_dtype=torch.float64)).abs().max() < 1e-12
    assert sorted((r, q) for r, q, _ in blocks) == [(r, q) for r in range(2) for q in range(p // 128)]


def _plan(fmt, n, **tuning):
    f = quantize.FORMATS[fmt]
    return quantize.kernel_plan((1 << 28) // n, n, torch.bfloat16, fmt, f.default_group, None, True, fmt == "nvfp4",
                                False, 132, **tuning)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "int8", "mxfp4", "nvfp4", "int4"])
def test_plan_takes_the_kron_kernel_only_where_asked_and_able(fmt):
    assert all(t["gluon_pow2"] & (t["gluon_pow2"] - 1) == 0 for t in configs.QUANT_GLUON_POW2.values())
    for n in (16384, 32768):
        if (fmt, n) not in configs.QUANT_GLUON_POW2:  # not asked (the transform's pipeline where its table asks)
            assert _plan(fmt, n, _gluon_ok=True).path == ("gluon_rows" if (fmt, n) in configs.QUANT_GLUON_ROWS
                                                          else "pow2")
        assert _plan(fmt, n, gluon_pow2=32).path == "pow2"  # no Hopper / Gluon (plan_quantize's _gluon_ok)
        plan = _plan(fmt, n, gluon_pow2=32, _gluon_ok=True, inside=False)
        assert plan.path == "gluon_kron" and plan.rscale == n**-0.5
        cfg = plan.config
        assert (cfg["M"], cfg["F"], cfg["SPLIT"], cfg["INSIDE"]) == (32, n // 32 // 64, 2, False)
        assert cfg["FORMAT"] == quantize.FORMATS[fmt].kernel_id
    assert _plan(fmt, 16384, gluon_pow2=16, _gluon_ok=True).config["M"] == 16
    # shapes the kernel does not take: p = 4096, m = 64
    assert _plan(fmt, 32768, gluon_pow2=8, _gluon_ok=True).path == "pow2"
    assert _plan(fmt, 16384, gluon_pow2=64, _gluon_ok=True).path == "pow2"
    # a table entry's switches go to the kron plan only (the pow2 plan where it does not apply reads none of them)
    from tilecore.tiles.switches import patched

    shipped = _plan(fmt, 16384).config
    with patched(configs, QUANT_GLUON_POW2={(fmt, 16384): dict(gluon_pow2=32, perm=True, num_warps=8)}):
        plan = _plan(fmt, 16384, _gluon_ok=True)
        assert plan.path == "gluon_kron" and plan.config["PERM"] and plan.config["M"] == 32
        assert _plan(fmt, 16384).config == shipped  # no Gluon here: the pow2 plan, none of the entry's tuning
    # blocks, no rotation, random signs: the pow2 kernel's
    f = quantize.FORMATS[fmt]
    signed = quantize.kernel_plan(1 << 14, 16384, torch.bfloat16, fmt, f.default_group, None, True, fmt == "nvfp4",
                                  True, 132, gluon_pow2=32, _gluon_ok=True)
    assert signed.path != "gluon_kron"


_COMPILE = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from experiments.hadamard.kron_gluon_compile import compile_one
for m, p, fmt, kw in ((32, 512, "fp8_e4m3", dict(clamp_lo=2, perm=True)), (32, 1024, "fp8_e4m3", dict(fold=True)),
                      (32, 512, "nvfp4", dict(fold=True, nozero=True, clamp_lo=2, perm=True, scale_once=True))):
    print(json.dumps(compile_one(m, p, 2, fmt, **kw)))
"""


def test_pow2_rows_compile_for_sm90():
    """sm_90a in a fresh process, as the 28-row shapes compile (test_hadamard_quantize_gluon_kron): wgmma, TMA, not
    serialized, within 227 KiB; 32 x 1024 spills as 28 x 1024's register butterfly does (228 B), 32 x 512 none."""
    res = compiled_json_lines(_COMPILE, timeout=900)
    assert [x["wgmma"] for x in res] == [64, 128, 64], res
    for x in res:
        assert x["tma"] and not x["wgmma_serialized"] and x["shared_meta"] <= 227 * 1024, x
        assert x["spill_stores"] <= (256 if x["p"] == 1024 else 0), x


def test_shipped_where_checked_and_faster():
    """Session 40 runs 3 (notes/hadamard/runs/he_s40c_run3_session40_h100.txt, he_s40d_run3_session40_h100.txt; H100,
    float64-checked): int4 16384 1.19x (twice), mxfp4 16384 1.10x (twice) the pow2 plans, on 32 x p with the 28-row
    plan's switches at that p (int4 32768 1.26x, since session 41 on the transform's pipeline: QUANT_GLUON_ROWS); the rest
    lost (fp8 / e5m2 16384 1.01x, nvfp4 0.94x, int8 0.88x) and is off. The shipped plans are the measured ones."""
    assert set(configs.QUANT_GLUON_POW2) == {("int4", 16384), ("mxfp4", 16384)}
    for (fmt, n), entry in configs.QUANT_GLUON_POW2.items():
        plan = _plan(fmt, n, _gluon_ok=True)
        assert plan.path == "gluon_kron" and plan.config["M"] == entry["gluon_pow2"] == 32, (fmt, n)
        assert not plan.config["INSIDE"] and plan.config.get("FOLD") and plan.config.get("NOZERO"), (fmt, n)
    assert _plan("mxfp4", 16384, _gluon_ok=True).config.get("E2M1_PAIRS")
    assert _plan("int4", 16384, _gluon_ok=True).config.get("INT_BITS")
