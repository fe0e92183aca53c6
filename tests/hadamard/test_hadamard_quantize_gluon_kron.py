"""hadamard_quantize's Gluon kron kernel (gluon_quantize_kron.py, plan path "gluon_kron"; issue 32, session 31): rows of
m x p with m <= 32 and p = 128..1024 (14336 = 28 x 512, 28672 = 28 x 1024).

Gluon kernels do not run in the interpreter: here the resident operand against H_m (x) H_2 and H_64, the kernel's
data flow replayed in float64 (gluon_quantize_kron.emulate: boxes, both splits, the butterfly in registers or by
the mixing's signs, H_m^T) against the float64 transform, the sub-row and group indices the epilogue stores scales at,
the plan's choices, and an sm_90a compile in a fresh process (wgmma, TMA, not serialized, spills, shared memory).
The codes are checked on the GPU by experiments/hadamard/gpu_gluon_widths.py against the float64 reference."""

import pytest
import torch

from tilecore.ops.hadamard import configs, gluon_quantize_kron as gk, kron, orders, quantize
from tilecore.ops.hadamard.reference import hadamard_matrix, hadamard_reference
from compiled_run import compiled_json_lines


@pytest.mark.parametrize("m, dtype, transpose", [(28, torch.bfloat16, False), (12, torch.float16, False),
                                                 (20, torch.bfloat16, True)])
def test_resident_operand_is_h_m_kron_h_2_its_negative_and_h_64(m, dtype, transpose):
    h = gk.gluon_operand(m, dtype, "cpu", transpose)
    assert h.shape == (192, 64) and h.dtype == torch.bfloat16
    a = h[:64].view(dtype).double()
    hm = torch.zeros(32, 32, dtype=torch.float64)
    hm[:m, :m] = orders.hadamard_of_order(m).double().T if transpose else orders.hadamard_of_order(m).double()
    for i2 in range(32):
        for l2 in range(2):
            for i in range(32):
                for l in (0, 1):
                    assert a[2 * i2 + l2, 2 * i + l] == hm[i2, i] * (-1 if l2 and l else 1)
    assert torch.equal(h[64:128].view(dtype).double(), -a)
    assert torch.equal(h[128:].double(), hadamard_matrix(64, torch.float64))


@pytest.mark.parametrize("m, p, split, inside", [(28, 512, 2, False), (28, 512, 1, False), (28, 512, 1, True),
                                                 (28, 1024, 2, True), (28, 1024, 2, False), (12, 256, 1, False),
                                                 (20, 128, 1, False), (20, 1024, 2, True), (12, 512, 2, True)])
def test_kernel_data_flow_is_the_transform(m, p, split, inside):
    assert gk.fits(m, p, split)
    n = m * p
    torch.manual_seed(m + p + split)
    x = torch.randn(3, n, dtype=torch.float64)
    y, blocks = gk.emulate(x, m, p, split, inside, n**-0.5)
    ref = hadamard_reference(x, n**-0.5, out_dtype=torch.float64)
    assert (y - ref).abs().max() < 1e-12
    # H_m^T (the transform's backward): H_m^T on the sub-rows, then H_p
    yt, _ = gk.emulate(x, m, p, split, inside, n**-0.5, transpose=True)
    t = torch.einsum("ji,rjc->ric", orders.hadamard_of_order(m).double(), x.reshape(-1, m, p))
    assert (yt - (t @ hadamard_matrix(p, torch.float64)).reshape(-1, n) * n**-0.5).abs().max() < 1e-12
    # every (row, pair) stored once; each block row r = 2 i + l is the row's sub-row i F + 2 q + l (the index the
    # epilogue stores group scales at: sub-row x 64 / G + g, int4's 128: i F / 2 + q), zero past m
    F = p // 64
    assert sorted((r, q) for r, q, _ in blocks) == [(r, q) for r in range(3) for q in range(F // 2)]
    sub_rows = ref.reshape(3, m * F, 64)
    for row, q, blk in blocks:
        for r in range(64):
            i, l = divmod(r, 2)
            if i < m:
                sub = i * F + 2 * q + l
                assert (blk[r] - sub_rows[row, sub]).abs().max() < 1e-12
                assert sub // 2 == i * (F // 2) + q  # int4's group of 128
            else:
                assert blk[r].abs().max() < 1e-12


def test_fits():
    assert gk.fits(28, 512, 1) and gk.fits(28, 512, 2) and gk.fits(28, 1024, 2) and gk.fits(12, 128, 1)
    assert not gk.fits(28, 1024, 1)  # eight blocks a consumer: no
    assert not gk.fits(28, 2048, 2) and not gk.fits(28, 64, 1) and not gk.fits(36, 512, 2) and not gk.fits(28, 128, 2)


def _plan(fmt, n=14336, **tuning):
    f = quantize.FORMATS[fmt]
    return quantize.kernel_plan(1 << 14, n, torch.bfloat16, fmt, f.default_group, None, True, fmt == "nvfp4", False,
                                132, **tuning)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2", "int8", "mxfp4", "nvfp4", "int4"])
def test_plan_takes_the_kron_kernel_only_where_asked_and_able(fmt):
    assert all(isinstance(k, (str, tuple)) for k in configs.QUANT_GLUON_KRON)
    assert _plan(fmt, gluon_kron=True).path != "gluon_kron"  # no Hopper / Gluon (plan_quantize's _gluon_ok)
    assert _plan(fmt, gluon_kron=False, _gluon_ok=True).path != "gluon_kron"
    f = quantize.FORMATS[fmt]
    # session 31 runs 2, 4: INSIDE off; nvfp4 at 28672 too since session 32 run 1
    for n, split, inside, grid in ((14336, 2, False, 132), (28672, 2, False, 132)):
        plan = _plan(fmt, n=n, gluon_kron=True, _gluon_ok=True)
        assert plan.path == "gluon_kron", n
        cfg = plan.config
        assert (cfg["M"], cfg["F"], cfg["SPLIT"], cfg["INSIDE"]) == (28, n // 28 // 64, split, inside)
        assert cfg["FORMAT"] == f.kernel_id and cfg["G"] == (f.default_group or 0) and plan.grid == (grid,)
        assert plan.rscale == n**-0.5
    plan = _plan(fmt, gluon_kron=True, _gluon_ok=True, split=1, inside=True)
    assert (plan.config["SPLIT"], plan.config["INSIDE"]) == (1, True)
    # SCALE_ONCE where asked (nvfp4 by default since run 4) and the groups lie inside a sub-row (mxfp4's 32, nvfp4's 16)
    assert _plan(fmt, gluon_kron=True, _gluon_ok=True).config.get("SCALE_ONCE", False) == (fmt == "nvfp4")
    once = _plan(fmt, gluon_kron=True, _gluon_ok=True, scale_once=True).config.get("SCALE_ONCE", False)
    assert once == (fmt in ("mxfp4", "nvfp4"))
    assert _plan(fmt, n=28 * 2048, gluon_kron=True, _gluon_ok=True).path != "gluon_kron"  # p = 2048: not its shape
    assert _plan(fmt, n=11008, gluon_kron=True, _gluon_ok=True).path != "gluon_kron"  # m = 172: the wide kernel's


def test_shipped_where_checked_and_faster():
    """Session 31 runs 2 and 4 (H100): the kron kernel on for every format at 14336 and 28672 (nvfp4 with SCALE_ONCE,
    run 4), the wide kernel at 18944 (int4 since run 4), the transform's Gluon plan at the four widths; only where the
    kernel takes the shape; KTRIM only on the wide kernel's widths."""
    for (fmt, n), on in configs.QUANT_GLUON_KRON.items():
        m, p = orders.split(n)
        assert on and gk.fits(m, p, quantize.gluon_kron_tuning(m, p, {}, fmt)[0])
    assert {f for (f, n) in configs.QUANT_GLUON_KRON} == {"fp8_e4m3", "int8", "mxfp4", "nvfp4", "int4"}
    assert all(n in (11008, 18944) for (_, n) in configs.QUANT_GLUON_KTRIM)
    for (m, p) in configs.KRON_GLUON:
        from tilecore.ops.hadamard import gluon_quantize_wide as gw

        assert gw.fits(m * p, m, p) or gk.fits(m, p, quantize.gluon_kron_tuning(m, p, {})[0])


def test_transform_plan_takes_gluon_only_on_hopper_cuda():
    assert configs.KRON_GLUON == {} or all(len(k) == 2 for k in configs.KRON_GLUON)
    x = torch.randn(4, 14336, dtype=torch.bfloat16)
    assert not kron._gluon_fits(x, 28, 512, False, {"gluon": True})  # a CPU tensor
    assert kron.kron_plan(x, 28, 512, gluon=True).path != "gluon"  # the interpreter (the tests) or the CPU path


_COMPILE = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
sys.argv = ["x"]
from experiments.hadamard.kron_gluon_compile import compile_one
for m, p, split, fmt, inside, once in ((28, 512, 2, "fp8_e4m3", False, False), (28, 512, 2, "mxfp4", False, False),
                                       (28, 1024, 2, "fp8_e4m3", True, False), (28, 1024, 2, "nvfp4", True, False),
                                       (28, 1024, 2, "nvfp4", True, True)):
    print(json.dumps(compile_one(m, p, split, fmt, inside=inside, scale_once=once)))
"""


def test_kron_kernel_compiles_for_sm90():
    """sm_90a in a fresh process: wgmma (28 x 512 split 2: a consumer's 4 mixing products and 2 blocks x 2 pieces, 4 K
    steps each = 32; 28 x 1024 INSIDE: 8 products for each of 4 blocks and 4 x 2 pieces = 160), TMA, not serialized,
    within 227 KiB, spills: none but nvfp4's 48 B at 28 x 1024 (12 B with SCALE_ONCE, and ~15% fewer SASS instructions
    there: each group's scale computed once)."""
    res = compiled_json_lines(_COMPILE, timeout=900)
    assert [x["wgmma"] for x in res] == [64, 64, 320, 320, 320], res
    for x in res:
        assert x["tma"] and not x["wgmma_serialized"] and x["shared_meta"] <= 227 * 1024, x
        assert x["spill_stores"] <= (64 if x["format"] == "nvfp4" else 0), x
    assert res[4]["sass"] < 0.9 * res[3]["sass"], (res[3]["sass"], res[4]["sass"])


@pytest.mark.parametrize("m, p", [(172, 64), (148, 128), (28, 512), (28, 1024), (12, 256), (20, 1024)])
def test_store_plan_is_the_quantize_plan_it_replaced(m, p):
    """Session 32: the transform's Gluon plan moved from quantize.py (plan_quantize keyed by fp8 e4m3 with split and
    inside from gluon_kron_tuning, ktrim, fold, nozero, clamp_lo, units, perm and joint off unless asked: fp8's own table
    entries are not the transform's) to gluon_launch.store_plan (so that kron.py no
    longer imports quantize.py): the same path, grid, rotation scale and constexprs (the kernel's specialization, so
    the same PTX) for every shape the "gluon" kron plan takes, row counts and tunings."""
    from tilecore.ops.hadamard import gluon_launch

    n = m * p
    seen = set()
    for rows in (1, 2, 3, 2049, 1 << 16):
        for dtype in (torch.bfloat16, torch.float16):
            for tuning in ({}, {"ktrim": True}, {"units": True}, {"stages": 3}, {"waves": 2}, {"split": 1},
                           {"inside": True}, {"split": 2, "inside": False}, {"nozero": True, "clamp_lo": True}):
                split, inside = configs.gluon_kron_tuning(m, p, tuning)
                old = quantize.kernel_plan(rows, n, dtype, "fp8_e4m3", None, None, True, False, False, 132, False,
                                           gluon=True, gluon_kron=True, _gluon_ok=True,
                                           **{"ktrim": False, "fold": False, "nozero": False, "clamp_lo": False,
                                              "units": False, "perm": False, "joint": False, **tuning, "split": split,
                                              "inside": inside})
                new = gluon_launch.store_plan(rows, n, dtype, 132, **tuning)
                if old.path not in ("gluon_wide", "gluon_kron"):
                    assert new is None, (rows, tuning, old.path)
                    continue
                assert (new.path, new.grid, new.rscale, new.config) == (old.path, old.grid, old.rscale, old.config), \
                    (rows, dtype, tuning)
                seen.add((new.path, new.config.get("UNITS", False), new.config.get("KTRIM", False)))
    assert {path for path, _, _ in seen} == {"gluon_wide" if m > 32 else "gluon_kron"}
    assert any(units for _, units, _ in seen) == (p == 128) and any(k for _, _, k in seen) == (m > 32)
    assert gluon_launch.store_plan(4, 4096, torch.bfloat16, 132) is None  # a power of two: not these kernels'
    assert gluon_launch.store_plan(4, n, torch.float32, 132) is None
