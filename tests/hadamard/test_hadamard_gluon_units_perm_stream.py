"""PERM under UNITS at 148 x 128 and STREAM for the 172 x 64 and 28 x 1024 transforms (session 34): the Gluon kernels.

PERM (H_64's columns permuted, blocks relabelled into the outputs' order: session 33, HALVES 1 only until now) applies
under UNITS for groups of 16 / 32, whose codes _unit makes from relabelled blocks (shipped for mxfp4 and nvfp4 at 18944:
run 3 of session 34, notes/hadamard/runs/gluon_widths_s34_run3_session34_h100.txt). STREAM stores each block of the
172 x 64 transform from compute through two staging slots, so that two ring stages fit (shipped: 1.32x, 74.7 -> 98.8% of
copy in the same run). Gluon does not run in the interpreter: here the slots' arithmetic, the plan switches and an
sm_90a compile. (BALANCE, tried in the same run and lost, was removed: git df274c9 holds it.)"""

import torch
from compiled_run import compiled_json_lines

from tilecore.ops.hadamard import configs, gluon_launch, gluon_quantize_kron as gk, gluon_quantize_wide as gw, kron, quantize
from tilecore.ops.hadamard.reference import hadamard_matrix


def _plan(fmt, n=18944, **tuning):
    group = quantize.FORMATS[fmt].default_group
    return quantize.kernel_plan(1 << 14, n, torch.bfloat16, fmt, group, None, True, False, False, 132, False,
                                _gluon_ok=True, **tuning)


def test_relabelled_block_keeps_halves_2_group_slots():
    """PERM under UNITS: the relabelled block is in the outputs' order, so group g of a sub-row's column half C keeps
    HALVES 2's scale slot i 2 GR + C GR + g (_group_slots): the permuted product relabelled is the product, and each
    column's group in the sub-row of 128 is that slot."""
    perm = gw.perm_columns()
    h = hadamard_matrix(64, torch.float64)
    w = torch.randn(64, 64, dtype=torch.float64)
    y = (w @ h[:, perm]).reshape(64, 8, 4, 2).permute(0, 2, 1, 3).reshape(64, 64)
    assert torch.equal(y, w @ h)
    for G in (16, 32):
        GR = 64 // G
        for i in (0, 1, 147):
            for C in range(2):
                for g in range(GR):
                    cols = torch.arange(64 * C + G * g, 64 * C + G * (g + 1))
                    assert bool(((i * 128 + cols) // G == i * 2 * GR + C * GR + g).all())


def test_plan_switches_perm_under_units():
    """perm at m x 128 only with UNITS and groups of 16 / 32; shipped (configs.QUANT_GLUON_PERM, QUANT_GLUON_UNITS) for
    mxfp4 and nvfp4 at 18944; not for the per-token formats or int4's groups of 128."""
    assert _plan("mxfp4", units=True, perm=True).config.get("PERM")
    assert not _plan("nvfp4", units=False, perm=True).config.get("PERM")  # HALVES 2 without UNITS
    for fmt in ("fp8_e4m3", "int8", "int4"):
        assert not _plan(fmt, gluon=True, units=True, perm=True).config.get("PERM"), fmt
    for fmt in ("mxfp4", "nvfp4"):
        cfg = _plan(fmt).config
        assert cfg.get("UNITS") and cfg.get("PERM") and cfg.get("HALVES") == 2, (fmt, cfg)
    assert configs.QUANT_GLUON_PERM[("nvfp4", 18944)] and configs.QUANT_GLUON_UNITS[("nvfp4", 18944)]


def test_stream_plan_switch_and_slots():
    """STREAM: the transform's tuning "stream" reaches the wide kernel's STORE plan at m x 64 only (HALVES 1), through
    kron.gluon_config (GLUON_KEYS), with the ring's two stages; shipped at 172 x 64 (configs.KRON_GLUON_TUNING); the
    launch's staging buffer then has two slots."""
    cfg = kron.gluon_config(172, 64, {})
    assert cfg == dict(clamp_lo=2, stream=True, stages=2)
    stages = cfg.pop("stages")
    plan = gluon_launch.store_plan(1 << 14, 172 * 64, torch.bfloat16, 132, stages=stages, **cfg)
    assert plan.config.get("STREAM") and plan.config["STAGES"] == 2 and plan.config["CLAMP_LO"] == 2
    assert not gluon_launch.store_plan(1 << 14, 148 * 128, torch.bfloat16, 132, stream=True).config.get("STREAM")
    assert not gluon_launch.store_plan(1 << 14, 172 * 64, torch.bfloat16, 132, stream=False).config.get("STREAM")
    x = torch.empty(4, 172 * 64, dtype=torch.bfloat16)
    assert gw.descriptors(x, x, 172, False, 1, 2)[2].block_shape[0] == 2


def test_kron_stream_data_flow_is_the_kernels():
    """The kron kernel's STREAM at 28 x 1024 (SPLIT 2, four blocks a consumer) in float64: output block v' = 2 t + b of
    consumer c is sum_v0 (-1)^(v0 b) U_(t, v0), U_(t, v0) = sum_v1 (-1)^(v1 t) (A B_(2 v1 + v0) + (-1)^c A B_(4 + 2 v1 +
    v0)) (the top level of H_4 by the sign of A), stored at pair q = 4 c + v': the same values as the register
    butterfly's data flow (gluon_quantize_kron.emulate), every block once."""
    m, p = 28, 1024
    torch.manual_seed(4)
    x = torch.randn(2, m * p, dtype=torch.float64)
    scale = (m * p)**-0.5
    ref, _ = gk.emulate(x, m, p, 2, False, scale)
    a = gk._operand_a(m, False)
    h64 = hadamard_matrix(64, torch.float64)
    y4 = torch.full((2, 32, p // 64, 64), float("nan"), dtype=torch.float64)
    x4 = torch.zeros(2, 32, p // 64, 64, dtype=torch.float64)
    x4[:, :m] = x.reshape(2, m, p // 64, 64)
    for r in range(2):
        b = [x4[r, :, 2 * q:2 * q + 2, :].reshape(64, 64) for q in range(p // 128)]
        for c in range(2):
            sign = -1.0 if c else 1.0
            for t in range(2):
                u = [sum((-1.0) ** (v1 * t) * (a @ b[2 * v1 + v0] + sign * (a @ b[4 + 2 * v1 + v0])) for v1 in range(2))
                     for v0 in range(2)]
                for bb in range(2):
                    q = 4 * c + 2 * t + bb
                    assert torch.isnan(y4[r, :, 2 * q:2 * q + 2]).all()  # each block once
                    y4[r, :, 2 * q:2 * q + 2] = ((u[0] + (-1.0) ** bb * u[1]) @ h64 * scale).reshape(32, 2, 64)
    assert torch.allclose(y4[:, :m].reshape(2, m * p), ref, rtol=0, atol=1e-12)


def test_kron_stream_plan_switch():
    """stream reaches the kron kernel's STORE plan where a consumer holds four blocks and the butterfly is in registers
    (28 x 1024), not at 28 x 512 (two blocks); shipped at 28 x 1024 with NOZERO and PAIRS (session 35 call 1,
    notes/hadamard/runs/gluon_widths_s34c_run1_session35_h100.txt: checked at the floor, 1.07x, 96.1% of copy)."""
    plan = gluon_launch.store_plan(1 << 14, 28 * 1024, torch.bfloat16, 132, **kron.gluon_config(28, 1024, {"stream": True}))
    assert plan.path == "gluon_kron" and plan.config.get("STREAM") and not plan.config["INSIDE"]
    assert not gluon_launch.store_plan(1 << 14, 28 * 512, torch.bfloat16, 132, stream=True).config.get("STREAM")
    assert not gluon_launch.store_plan(1 << 14, 28 * 1024, torch.bfloat16, 132, stream=True, inside=True).config.get(
        "STREAM")
    cfg = kron.gluon_config(28, 1024, {})
    assert cfg == dict(nozero=True, clamp_lo=2, stream=True), cfg
    plan = gluon_launch.store_plan(1 << 14, 28 * 1024, torch.bfloat16, 132, **cfg)
    assert plan.config.get("STREAM") and plan.config["CLAMP_LO"] == 2 and plan.config.get("NOZERO")


def test_kron_stream_is_the_transforms_only():
    """hadamard_quantize's plans never take STREAM (the group formats' STREAM at 28672 ran 0.93-0.98x in the same run
    and was removed): the tuning "stream" is not a quantize key."""
    for fmt in ("mxfp4", "nvfp4", "int4", "fp8_e4m3", "int8"):
        assert not _plan(fmt, 28672, gluon_kron=True, stream=True).config.get("STREAM"), fmt
    assert not hasattr(configs, "QUANT_GLUON_STREAM")


_COMPILE = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from experiments.hadamard.wide_gluon_compile import compile_one
M = dict(units=True, ktrim=True, fold=True, nozero=True, clamp_lo=2)  # mxfp4's plan at 18944 before PERM
N = dict(units=True, scale_once=True, ktrim=True, nozero=True, clamp_lo=2)  # nvfp4's with UNITS
for fmt, kw in (("mxfp4", M), ("mxfp4", dict(M, perm=True)), ("nvfp4", N), ("nvfp4", dict(N, perm=True)),
                ("amax", dict(N, perm=True))):
    print(json.dumps(compile_one(148, 128, fmt, **kw)))
for kw in (dict(stages=1, clamp_lo=2), dict(stages=2, clamp_lo=2, stream=True)):  # the 172 x 64 transform
    print(json.dumps(compile_one(172, 64, "store", **kw)))
from experiments.hadamard.kron_gluon_compile import compile_one as kron_one
for kw in (dict(nozero=True, clamp_lo=True), dict(nozero=True, clamp_lo=2, stream=True)):  # 28 x 1024: before, shipped
    print(json.dumps(kron_one(28, 1024, 2, "store", **kw)))
"""


def test_perm_under_units_and_stream_compile_for_sm90():
    """sm_90a: PERM under UNITS cuts the shuffles and instructions (mxfp4 SHFL 50 -> 14, SASS 5144 -> 4936) and the
    spills (56 -> 40 B; nvfp4 136 -> 60), same wgmma (108); the AMAX pass of a PERM plan compiles (no relabelling).
    STREAM fits the 172 x 64 transform's two ring stages within 227 KiB (two staging slots a consumer, not four); the
    kron kernel's STREAM (28 x 1024) spills nothing."""
    mx, mxp, nv, nvp, amax, st1, st2, k0, k1 = compiled_json_lines(_COMPILE, timeout=1200)
    for a, b in ((mx, mxp), (nv, nvp)):
        assert b["sass"] < a["sass"] and b["sass_shfl"] < a["sass_shfl"] and b["spill_stores"] < a["spill_stores"], (a, b)
        assert b["wgmma"] == a["wgmma"] == 108 and b["tma"] and not b["wgmma_serialized"], b
        assert b["shared_meta"] <= 227 * 1024 and b["spill_stores"] <= 64, b
    assert amax["wgmma"] == 108 and amax["tma"], amax
    assert st2["stages"] == 2 and st2["shared_meta"] <= 227 * 1024 < st1["shared_meta"] + 48 * 1024, (st1, st2)
    assert st2["wgmma"] == st1["wgmma"] == 120 and st2["spill_stores"] == 0 and st2["tma"], st2
    # the kron kernel's STREAM at 28 x 1024 (shipped, with PAIRS): the mixing twice (192 wgmma against 128), nothing
    # spilled (the register butterfly before it: 244 B)
    assert k0["wgmma"] == 128 and k0["spill_stores"] > 0, k0
    assert k1["wgmma"] == 192 and k1["spill_stores"] == 0 and k1["tma"] and not k1["wgmma_serialized"], k1
    assert k1["shared_meta"] <= 227 * 1024, k1
