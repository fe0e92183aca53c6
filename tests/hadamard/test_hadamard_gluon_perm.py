"""PERM (session 33): the Gluon kernels' second product by H_64 with its columns permuted (gluon_quantize_wide.
perm_columns: column c = 8 j + 2 q + b is H_64's 16 q + 2 j + b), each block relabelled into the outputs' order
(gluon_epilogue.relabel: [R, 8, 4, 2] -> [R, 4, 8, 2]), so that a thread of the wgmma accumulator layout (columns
8 j + 2 q + b, q its lane mod 4) holds 16 consecutive outputs: group maxima with fewer shuffles, codes staged by
vector stores. Gluon does not run in the interpreter: here the data flow in float64 (the permuted product relabelled
is the product), the operands, the plan switches, an sm_90a compile (fewer shuffles and shared stores, nothing spilled).
The GPU job (experiments/hadamard/gpu_gluon_widths.py --set s33c) compares the bytes with the shipped plan's."""

import torch

from tilecore.ops.hadamard import configs, gluon_launch, kron, quantize
from tilecore.ops.hadamard import gluon_quantize_kron as gk, gluon_quantize_wide as gw
from tilecore.ops.hadamard.reference import hadamard_matrix
from compiled_run import compiled_json_lines


def _plan(fmt, n, **tuning):
    group = quantize.FORMATS[fmt].default_group
    return quantize.kernel_plan(1 << 14, n, torch.bfloat16, fmt, group, None, True, False, False, 132, False,
                                _gluon_ok=True, **tuning)


def _relabel(y):  # gluon_epilogue.relabel's reshape / permute / reshape, in torch
    r = y.shape[0]
    return y.reshape(r, 8, 4, 2).permute(0, 2, 1, 3).reshape(r, 64)


def test_permuted_product_relabelled_is_the_product():
    """W (H_64 with perm_columns' columns), relabelled, equals W H_64 exactly (float64), and the accumulator's thread
    q (columns 8 j + 2 q + b) holds outputs 16 q .. 16 q + 15 after the relabelling."""
    perm = gw.perm_columns()
    assert sorted(perm) == list(range(64))
    h = hadamard_matrix(64, torch.float64)
    w = torch.randn(64, 64, dtype=torch.float64)
    assert torch.equal(_relabel(w @ h[:, perm]), w @ h)
    for q in range(4):
        held = [perm[8 * j + 2 * q + b] for j in range(8) for b in range(2)]
        assert sorted(held) == list(range(16 * q, 16 * q + 16))


def test_operands_carry_the_permuted_h64():
    """Both kernels' resident operands: the same blocks but the last, whose columns are perm_columns' (bf16 bits)."""
    p = gw.perm_columns()
    for mod, m in ((gw, 172), (gk, 28)):
        a = mod.gluon_operand(m, torch.bfloat16, "cpu")
        b = mod.gluon_operand(m, torch.bfloat16, "cpu", perm=True)
        assert torch.equal(a[:-64], b[:-64]) and torch.equal(a[-64:][:, p], b[-64:])
        assert not torch.equal(a[-64:], b[-64:])


def test_plan_switch_carries_perm():
    """tuning perm reaches the wide kernel at m x 64 (at m x 128 only with UNITS: session 34), the kron kernel, and the transforms' STORE plans;
    configs.QUANT_GLUON_PERM (session 33 run 5: gluon_widths_s33c_run5_session33_h100.txt) turns it on by (format,
    n)."""
    assert _plan("int4", 11008, gluon=True, perm=True).config.get("PERM")
    assert not _plan("nvfp4", 18944, gluon=True, units=False, perm=True).config.get("PERM")  # HALVES 2 without UNITS
    assert _plan("mxfp4", 18944, gluon=True, perm=True).config.get("PERM")  # UNITS (shipped there): session 34
    assert _plan("int8", 14336, gluon_kron=True, perm=True).config.get("PERM")
    assert not _plan("int4", 11008, gluon=True).config.get("PERM")
    assert not _plan("mxfp4", 11008, gluon=True, perm=False).config.get("PERM")
    for (fmt, n), on in configs.QUANT_GLUON_PERM.items():
        assert on and _plan(fmt, n, gluon=True, gluon_kron=True).config.get("PERM"), (fmt, n)
    assert not _plan("mxfp4", 28672, gluon_kron=True).config.get("PERM")  # run 5: 0.73x (spills)
    for m, p in ((172, 64), (28, 512)):
        cfg = kron.gluon_config(m, p, {"perm": True})
        stages = cfg.pop("stages", None)
        assert gluon_launch.store_plan(1 << 14, m * p, torch.bfloat16, 132, stages=stages, **cfg).config["PERM"]


_COMPILE = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from experiments.hadamard import kron_gluon_compile as kc, wide_gluon_compile as wc
for perm in (False, True):
    print(json.dumps(wc.compile_one(172, 64, "mxfp4", fold=True, nozero=True, clamp_lo=2, perm=perm)))
for perm in (False, True):
    print(json.dumps(kc.compile_one(28, 512, 2, "nvfp4", scale_once=True, fold=True, nozero=True, clamp_lo=2,
                                    perm=perm)))
print(json.dumps(wc.compile_one(172, 64, "store", clamp_lo=2, perm=True)))
"""


def test_perm_compiles_for_sm90_with_fewer_shuffles_and_stores():
    w0, w1, k0, k1, st = compiled_json_lines(_COMPILE, timeout=900)
    for a, b in ((w0, w1), (k0, k1)):
        assert b["sass"] < a["sass"] and b["sass_shfl"] < a["sass_shfl"] and b["spill_stores"] == 0, (a, b)
        assert b["wgmma"] == a["wgmma"] and b["tma"] and not b["wgmma_serialized"], b
    assert st["spill_stores"] <= 512 and st["tma"], st
