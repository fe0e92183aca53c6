"""BALANCE and PERM under UNITS (session 34): the Gluon wide kernel at 148 x 128 (18944, HALVES 2).

UNITS gave consumer 0 the output sub-row blocks J = 0, 1 of both column halves (four [64, 64] blocks' epilogues) and
consumer 1 J = 2 (two blocks, 20 of whose 64 sub-rows are real): the row waits on consumer 0. BALANCE gives consumer c
the unit J = c (both halves) and block J = 2's column half c, whose mixing W_20, W_21 both consumers run (the products
are cheap; the epilogue is not): three blocks each. PERM (H_64's columns permuted, blocks relabelled: session 33) now
also applies under UNITS for groups of 16 / 32, whose codes _unit makes. Gluon does not run in the interpreter: here
the data flow in float64 (every output block written once, the transform), the plan switches, and an sm_90a compile
(wgmma count, no spills, fewer shuffles with PERM). The GPU job: experiments/hadamard/gpu_gluon_widths.py --set s34
(float64 checks, bytes compared with the shipped UNITS plans)."""
import json
import os
import subprocess
import sys

import torch

from tilecore.ops.hadamard import configs, gluon_quantize_wide as gw, orders, quantize
from tilecore.ops.hadamard.reference import hadamard_matrix, hadamard_reference


def _plan(fmt, n=18944, **tuning):
    group = quantize.FORMATS[fmt].default_group
    return quantize.kernel_plan(1 << 14, n, torch.bfloat16, fmt, group, None, True, False, False, 132, False,
                                _gluon_ok=True, **tuning)


def _slot(c, j):
    """_store_units' box under BALANCE for consumer c's slot j: (J, column half h), the kernel's arithmetic."""
    return c + (j // 2) * (2 - c), j % 2 + (j // 2) * c


def test_balance_data_flow_is_the_transform():
    """Consumer c: the unit J = c (Y_c0 = (W_c0 + W_c1) H_64, Y_c1 = (W_c0 - W_c1) H_64) into slots 0, 1, then J = 2's
    half c ((W_20 +- W_21) H_64, + for consumer 0) into slot 2, stored at _slot(c, j): every [64, 64] output block of
    the (192, 128) padded row exactly once, and the rows' first 148 sub-rows are the transform (float64)."""
    m, p = 148, 128
    torch.manual_seed(3)
    x = torch.randn(3, m * p, dtype=torch.float64)
    x[0, 5] = 1e30  # a large value: the products are exact sums of x times +-1 either way
    H = torch.zeros(192, 192, dtype=torch.float64)
    H[:m, :m] = orders.hadamard_of_order(m).double()
    h64 = hadamard_matrix(64, torch.float64)
    ref = hadamard_reference(x, (m * p)**-0.5, out_dtype=torch.float64).reshape(3, m, p)
    for r in range(3):
        X = torch.zeros(192, p, dtype=torch.float64)
        X[:m] = x[r].reshape(m, p)

        def mixed(J, h):
            return sum(H[64 * J:64 * J + 64, 64 * k:64 * k + 64] @ X[64 * k:64 * k + 64, 64 * h:64 * h + 64]
                       for k in range(3))

        out = torch.full((192, p), float("nan"), dtype=torch.float64)
        for c in range(2):
            wa, wb = mixed(c, 0), mixed(c, 1)
            held = [(wa + wb) @ h64, (wa - wb) @ h64]
            w2a, w2b = mixed(2, 0), mixed(2, 1)
            held.append(((w2a + w2b) if c == 0 else (w2a - w2b)) @ h64)
            for j, y in enumerate(held):
                J, h = _slot(c, j)
                assert torch.isnan(out[64 * J:64 * J + 64, 64 * h:64 * h + 64]).all()  # each block once
                out[64 * J:64 * J + 64, 64 * h:64 * h + 64] = y * (m * p)**-0.5
        assert not torch.isnan(out).any()
        assert ((out[:m] - ref[r]).abs() <= 1e-12 * ref[r].abs().amax()).all()
        # int4 (groups of 128 = a sub-row of both halves): consumer c's own half of J = 2 and the other (o), whose
        # sub-row maxima both consumers take alike, are the padded row's sub-rows 128..191 over all 128 columns
        w2a, w2b = mixed(2, 0), mixed(2, 1)
        for c in range(2):
            own, o = ((w2a + w2b), (w2a - w2b)) if c == 0 else ((w2a - w2b), (w2a + w2b))
            ga = torch.maximum((own @ h64).abs().amax(1), (o @ h64).abs().amax(1)) * (m * p)**-0.5
            assert torch.allclose(ga, out[128:].abs().amax(1), rtol=1e-12, atol=0)


def test_relabelled_block_keeps_halves_2_group_slots():
    """PERM under UNITS: the relabelled block is in the outputs' order, so group g of a sub-row's column half C keeps
    HALVES 2's scale slot i 2 GR + C GR + g (the half's columns 64 C + G g ..): the permuted product relabelled is the
    product, column by column, in both halves."""
    perm = gw.perm_columns()
    h = hadamard_matrix(64, torch.float64)
    w = torch.randn(64, 64, dtype=torch.float64)
    y = (w @ h[:, perm]).reshape(64, 8, 4, 2).permute(0, 2, 1, 3).reshape(64, 64)
    assert torch.equal(y, w @ h)
    for G in (16, 32):  # _group_slots' HALVES 2 offset against the group of the sub-row of 128 each column is in
        GR = 64 // G
        for i in (0, 1, 147):
            for C in range(2):
                for g in range(GR):
                    cols = torch.arange(64 * C + G * g, 64 * C + G * (g + 1))
                    assert bool(((i * 128 + cols) // G == i * 2 * GR + C * GR + g).all())


def test_stream_plan_switch_and_slots():
    """STREAM (session 34): the transform's tuning "stream" reaches the wide kernel's STORE plan at m x 64 only (HALVES
    1), through kron.gluon_config (GLUON_KEYS), with the ring's two stages as asked; off in the shipped table."""
    from tilecore.ops.hadamard import gluon_launch, kron

    cfg = kron.gluon_config(172, 64, {"stream": True, "stages": 2})
    assert cfg["stream"] and cfg["stages"] == 2
    stages = cfg.pop("stages")
    plan = gluon_launch.store_plan(1 << 14, 172 * 64, torch.bfloat16, 132, stages=stages, **cfg)
    assert plan.config.get("STREAM") and plan.config["STAGES"] == 2
    assert not gluon_launch.store_plan(1 << 14, 148 * 128, torch.bfloat16, 132, stream=True).config.get("STREAM")
    assert not kron.gluon_config(172, 64, {}).get("stream")  # configs.KRON_GLUON_TUNING: off until timed
    x = torch.empty(4, 172 * 64, dtype=torch.bfloat16)
    assert gw.descriptors(x, x, 172, False, 1, 2)[2].block_shape[0] == 2  # the staging buffer's two slots


def test_plan_switches_balance_and_perm_at_halves_2():
    """balance reaches the kernel only with UNITS (every format; int4's groups of 128 span both halves of J = 2: each
    consumer makes the other half's values too, for the sub-row maxima); perm at m x 128 only with UNITS and groups of
    16 / 32; configs.QUANT_GLUON_BALANCE is empty (untimed) and no shipped plan at 18944 changes."""
    for fmt in ("fp8_e4m3", "int8", "mxfp4", "nvfp4", "int4"):
        cfg = _plan(fmt, gluon=True, units=True, balance=True).config
        assert cfg.get("UNITS") and cfg.get("BALANCE"), fmt
        assert not _plan(fmt, gluon=True, units=False, balance=True).config.get("BALANCE")
        assert not _plan(fmt, gluon=True).config.get("BALANCE")  # off by default
    assert _plan("mxfp4", gluon=True, units=True, perm=True).config.get("PERM")
    assert _plan("nvfp4", gluon=True, units=True, perm=True).config.get("PERM")
    assert not _plan("nvfp4", gluon=True, units=False, perm=True).config.get("PERM")  # HALVES 2 without UNITS
    for fmt in ("fp8_e4m3", "int8", "int4"):  # per token, or groups of 128
        assert not _plan(fmt, gluon=True, units=True, perm=True).config.get("PERM"), fmt
    assert configs.QUANT_GLUON_BALANCE == {}
    for fmt in ("fp8_e4m3", "int8", "mxfp4", "nvfp4", "int4"):  # the shipped plans: neither switch
        cfg = _plan(fmt, gluon=True).config
        assert not cfg.get("PERM") and not cfg.get("BALANCE"), fmt


_COMPILE = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from experiments.hadamard.wide_gluon_compile import compile_one
M = dict(units=True, ktrim=True, fold=True, nozero=True, clamp_lo=2)  # mxfp4's shipped plan at 18944
N = dict(units=True, scale_once=True, ktrim=True, nozero=True, clamp_lo=2)
F = dict(units=True, ktrim=True, fold=True, clamp_lo=2)  # fp8's
for fmt, kw in (("mxfp4", M), ("mxfp4", dict(M, balance=True)), ("mxfp4", dict(M, balance=True, perm=True)),
                ("nvfp4", dict(N, balance=True, perm=True)), ("amax", dict(N, balance=True, perm=True)),
                ("fp8_e4m3", F), ("fp8_e4m3", dict(F, balance=True)), ("int4", dict(F, balance=True))):
    print(json.dumps(compile_one(148, 128, fmt, **kw)))
for kw in (dict(stages=1, clamp_lo=2), dict(stages=2, clamp_lo=2, stream=True)):  # the 172 x 64 transform
    print(json.dumps(compile_one(172, 64, "store", **kw)))
"""


def test_balance_and_perm_compile_for_sm90_without_spills():
    """sm_90a: BALANCE runs 128 wgmma (J = 2's mixing on both consumers) against UNITS' 108 and spills nothing (UNITS:
    mxfp4 56 B, fp8 84 B: consumer 0's four held blocks); PERM on top cuts the shuffles (mxfp4 SHFL 50 -> 14) and the
    instructions; the AMAX pass of a PERM plan compiles (no relabelling); TMA, not serialized, within 227 KiB. int4
    (groups of 128) compiles too. STREAM (the 172 x 64 transform) fits two ring stages where the shipped plan has one."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, env=env, timeout=1200,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert r.returncode == 0, r.stderr[-3000:]
    units, bal, balp, nv, amax, f8, f8b, i4, st1, st2 = [json.loads(line) for line in r.stdout.strip().splitlines()
                                           if line.startswith("{")]
    assert units["wgmma"] == 108 and f8["wgmma"] == 108
    for x in (bal, balp, nv, amax, f8b):
        assert x["wgmma"] == 128 and x["tma"] and not x["wgmma_serialized"], x
        assert x["shared_meta"] <= 227 * 1024 and x["spill_stores"] == 0, x
    assert units["spill_stores"] > 0 and f8["spill_stores"] > 0  # what BALANCE removes
    assert balp["sass_shfl"] < bal["sass_shfl"] and balp["sass"] < bal["sass"], (bal, balp)
    # int4: J = 2's other half through the second product too (144 wgmma); 160 B spilled (UNITS: 80)
    assert i4["wgmma"] == 144 and i4["tma"] and not i4["wgmma_serialized"] and i4["spill_stores"] <= 192, i4
    # STREAM: the 172 x 64 transform at two ring stages within 227 KiB (two staging slots a consumer, not four)
    assert st2["stages"] == 2 and st2["shared_meta"] <= 227 * 1024 < st1["shared_meta"] + 48 * 1024, (st1, st2)
    assert st2["wgmma"] == st1["wgmma"] == 120 and st2["spill_stores"] == 0 and st2["tma"], st2
