"""hadamard_quantize's power-of-two rows on hadamard_transform's Gluon pipeline (gluon_kernels.
hadamard_gluon_quantize_kernel, plan path "gluon_rows", configs.QUANT_GLUON_ROWS; issue 32, session 41): per token
(fp8, int8) and int4's groups of 128.

Gluon kernels do not run in the interpreter: here the pipeline's data flow replayed in float64 (each consumer's
output blocks as the kernel forms and stores them) against the float64 transform, the groups int4's scales are stored
at (every one once), the plan's choices, and an sm_90a compile in a fresh process. The codes
are checked on the GPU against the float64 reference (experiments/hadamard/gpu_quantize_sets.py --set r)."""

import pytest
import torch

from tilecore.ops.hadamard import configs, quantize
from tilecore.ops.hadamard.reference import hadamard_matrix, hadamard_reference
from compiled_run import compiled_json_lines


def _blocks(x, n):
    """The kernel's math in float64: a row is S slices X_s of 128 lines x 64; consumer c's block j of line r is
    out_j[r] = sum_s H_S[j, s] (H_128 X_s H_64)[64 c + r]; stored at the row's line 128 j + 64 c + r (finish)."""
    S = n // 8192
    xs = x.reshape(x.shape[0], S, 128, 64)
    t = hadamard_matrix(128, torch.float64) @ xs @ hadamard_matrix(64, torch.float64)
    out = torch.einsum("js,rsab->rjab", hadamard_matrix(S, torch.float64), t) * n**-0.5
    lines = torch.empty(x.shape[0], n // 64, 64, dtype=torch.float64)
    for j in range(S):
        for c in range(2):
            for r in range(64):
                lines[:, 128 * j + 64 * c + r] = out[:, j, 64 * c + r]
    return lines.reshape(x.shape[0], n)


@pytest.mark.parametrize("n", [16384, 32768])
def test_kernel_data_flow_is_the_transform(n):
    torch.manual_seed(n)
    x = torch.randn(2, n, dtype=torch.float64)
    assert (_blocks(x, n) - hadamard_reference(x, n**-0.5, out_dtype=torch.float64)).abs().max() < 1e-12


@pytest.mark.parametrize("n", [16384, 32768])
def test_every_int4_group_scale_is_stored_once(n):
    """_pair_slots (int4's groups of 128: consumer c's block j, line pair i at the row's group 64 j + 32 c + i) over
    every consumer, block and pair: the row's n / 128 groups, once each, each the group holding the pair's lines."""
    seen = []
    for j in range(n // 8192):
        for c in range(2):
            for i in range(32):
                slot = 64 * j + 32 * c + i
                assert slot == (64 * (128 * j + 64 * c + 2 * i)) // 128 == (64 * (128 * j + 64 * c + 2 * i + 1)) // 128
                seen.append(slot)
    assert sorted(seen) == list(range(n // 128))


def _plan(fmt, n, rows=None, dtype=torch.bfloat16, **tuning):
    f = quantize.FORMATS[fmt]
    return quantize.kernel_plan(rows or (1 << 28) // n, n, dtype, fmt, f.default_group, None, True, fmt == "nvfp4",
                                False, 132, **tuning)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_plan_never_takes_the_pipeline_for_groups_of_16_or_32(fmt):
    for n in (16384, 32768):  # (run 3: 0.76-0.89x, but mxfp4 32768 1.01x, then 0.96x in run 5: not in the kernel)
        assert _plan(fmt, n, gluon_rows=True, _gluon_ok=True).path != "gluon_rows"


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2", "int8", "int4"])
def test_plan_takes_the_pipeline_only_where_asked_and_able(fmt):
    f = quantize.FORMATS[fmt]
    for n in (16384, 32768):
        plan = _plan(fmt, n, gluon_rows=True, _gluon_ok=True)
        assert plan.path == "gluon_rows" and plan.rscale == n**-0.5 and plan.grid == (132,)
        cfg = plan.config
        stages, lookahead = configs.GLUON_TUNING[n]
        assert (cfg["S"], cfg["STAGES"], cfg["LOOKAHEAD"]) == (n // 8192, stages, lookahead)
        assert (cfg["FORMAT"], cfg["G"], cfg["QMAX"], cfg["PACKED"]) == (f.kernel_id, f.default_group or 0, f.qmax,
                                                                         f.packed)
        assert _plan(fmt, n, gluon_rows=True, _gluon_ok=True, stages=3, clamp_lo=2).config["STAGES"] == 3
        assert _plan(fmt, n, gluon_rows=True, _gluon_ok=True, clamp_lo=2).config["CLAMP_LO"] == 2
        if (fmt, n) not in configs.QUANT_GLUON_ROWS:
            assert _plan(fmt, n, _gluon_ok=True).path != "gluon_rows"  # not asked
        assert _plan(fmt, n, gluon_rows=True).path != "gluon_rows"  # no Hopper / Gluon (plan_quantize's _gluon_ok)
        assert _plan(fmt, n, rows=64, gluon_rows=True, _gluon_ok=True).path != "gluon_rows"  # under 2^24 elements
        assert _plan(fmt, n, dtype=torch.float32, gluon_rows=True, _gluon_ok=True).path != "gluon_rows"
        assert _plan(fmt, n, gluon_rows=False, _gluon_ok=True).path != "gluon_rows"
        if fmt == "int4":  # the caller's gluon_pow2 asks for the kron kernel
            assert _plan(fmt, n, gluon_pow2=32, _gluon_ok=True).path == "gluon_kron"
    assert _plan(fmt, 8192, gluon_rows=True, _gluon_ok=True).path != "gluon_rows"  # not a pipeline size
    signed = quantize.kernel_plan(1 << 14, 16384, torch.bfloat16, fmt, f.default_group, None, True, fmt == "nvfp4",
                                  True, 132, gluon_rows=True, _gluon_ok=True)
    assert signed.path != "gluon_rows"


_COMPILE = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from experiments.hadamard.kron_gluon_compile import compile_rows
for n, fmt, stages, lookahead, extra in ((16384, "fp8_e4m3", 4, 0, {"CLAMP_LO": 2}),
                                         (32768, "int4", 8, 4, {"INT_BITS": True, "CLAMP_LO": 2}),
                                         (32768, "int8", 8, 4, {"INT_BITS": True, "CLAMP_LO": 2})):
    print(json.dumps(compile_rows(n, fmt, stages, lookahead, extra=extra)))
"""


def test_pipeline_rows_compile_for_sm90():
    """sm_90a in a fresh process: 8 wgmma a slice and consumer (two first products, two pieces of the second) and
    the spare second product a row, TMA, not serialized, no spills, within 227 KiB."""
    res = compiled_json_lines(_COMPILE, timeout=900)
    assert len(res) == 3, res
    for x in res:
        assert x["tma"] and not x["wgmma_serialized"] and x["shared_meta"] <= 227 * 1024, x
        assert x["spill_stores"] == 0 and x["wgmma"] > 0, x


def test_shipped_where_checked_and_faster():
    """Session 41 runs 3 and 5 (notes/hadamard/runs/he_rows_s41a_run3_session41_h100.txt,
    he_rows_s41b_run5_session41_h100.txt; H100, float64-checked): int4 32768 1.057x / 1.072x the kron plan, int8 32768
    1.015x / 1.050x the pow2 plan, with PAIRS and INT_BITS; every other (format, n) lost (0.76-0.90x) and is off."""
    assert set(configs.QUANT_GLUON_ROWS) == {("int4", 32768), ("int8", 32768)}
    for fmt, n in configs.QUANT_GLUON_ROWS:
        plan = _plan(fmt, n, _gluon_ok=True)
        assert plan.path == "gluon_rows", (fmt, n)
        assert plan.config["CLAMP_LO"] == 2 and plan.config["INT_BITS"] and plan.config["LOOKAHEAD"] == 4, (fmt, n)
        assert _plan(fmt, n).path != "gluon_rows"  # no Hopper here
