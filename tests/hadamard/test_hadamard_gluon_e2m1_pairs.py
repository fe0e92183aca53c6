"""E2M1_PAIRS (session 35): the Gluon kernels' mxfp4 / nvfp4 codes made a column pair at a time
(gluon_epilogue._e2m1_pair): the magic-number sum of _e2m1_fast keeps a code's magnitude in bits 0-2 and zeros in bits
3-21, so t0 + 16 t1 holds both magnitudes in its low byte and the signs go to bits 3 and 7 by two shifts: the same
bytes as _pack(_e2m1_fast) with fewer instructions (no per-code mask, no separate pack; the keep mask once a byte).
Gluon does not run in the interpreter: here the pair's integer arithmetic in torch against the float64 e2m1 reference
(every tie, both zeros, saturation, subnormals, random values), the plan switch, and an sm_90a compile."""

import torch

from tilecore.ops.hadamard import configs, quantize
from tilecore.ops.hadamard.quantize_reference import pack_nibbles, round_half_even_e2m1
from compiled_run import compiled_json_lines


def _sum_bits(q):
    """bits(min(|q|, 6) + M) as _e2m1_pair makes them (float32 add, int32 bit operations)."""
    a = q.abs().clamp(max=6.0)
    e = torch.clamp(a.view(torch.int32) >> 23, min=127)
    return (a + (e * 0x800002 + 0x0B3FFF02).to(torch.int32).view(torch.float32)).view(torch.int32)


def _pair_bytes(q0, q1):
    """gluon_epilogue._e2m1_pair in torch: its low byte."""
    t0, t1 = _sum_bits(q0), _sum_bits(q1)
    s0 = (q0.view(torch.int32) >> 28) & 8
    return ((t0 + (t1 << 4)) | s0 | ((q1.view(torch.int32) >> 24) & 0x80)) & 0xFF


def _reference(q):
    """The e2m1 codes of float32 q (float64 rounding, half to even, saturating at 6, the sign bit kept), packed."""
    v = q.to(torch.float64).clamp(-6.0, 6.0)
    return pack_nibbles(round_half_even_e2m1(v) | (torch.signbit(q).to(torch.int32) << 3)).to(torch.int32)


def test_pair_bytes_equal_the_reference_codes():
    torch.manual_seed(35)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float64)
    near = torch.cat([ties * (1 + k * 2.0**-p) for k in (-1, 0, 1) for p in (10, 20, 23, 24)])
    special = torch.tensor([0.0, 6.0, 7.0, 1e30, 2.0**-149, 2.0**-126, 0.5, 1.0, 2.0, 3.0, 4.0, 5.99999],
                           dtype=torch.float64)
    q = torch.cat([near, special, torch.rand(200000, dtype=torch.float64) * 7,
                   torch.rand(50000, dtype=torch.float64) * 2.0**torch.randint(-30, 3, (50000,))]).to(torch.float32)
    q = torch.cat([q, -q])  # -0.0 among them: code 8
    q = q[torch.randperm(q.numel())]  # random pairs of every sign and size
    assert q.numel() % 2 == 0 and bool(torch.signbit(q[q == 0]).any())
    ref = _reference(q)
    got = _pair_bytes(q[0::2].contiguous(), q[1::2].contiguous())
    assert torch.equal(got, ref), int((got != ref).sum())


def test_sum_keeps_bits_3_to_21_zero():
    """The claim _e2m1_pair rests on: the sum's bits 3-21 are zero and bits 0-2 are the magnitude code, for every
    float32 magnitude up to 6 on a fine grid (and past 6: saturated)."""
    a = torch.linspace(0, 8, 1 << 20, dtype=torch.float32)
    t = _sum_bits(a)
    assert bool(((t >> 3) & ((1 << 19) - 1) == 0).all())
    assert torch.equal(t & 7, round_half_even_e2m1(a.to(torch.float64).clamp(max=6.0)))


def _plan(fmt, n, **tuning):
    group = quantize.FORMATS[fmt].default_group
    return quantize.kernel_plan(1 << 14, n, torch.bfloat16, fmt, group, None, True, False, False, 132, False,
                                _gluon_ok=True, **tuning)


def test_plan_switch():
    """The tuning "e2m1_pairs" reaches both Gluon kernels' plans for mxfp4 and nvfp4 only; off in the shipped table
    (configs.QUANT_GLUON_E2M1_PAIRS) until a GPU run times it."""
    for n in (11008, 14336, 18944, 28672):
        for fmt in ("mxfp4", "nvfp4"):
            plan = _plan(fmt, n, e2m1_pairs=True)
            assert plan.path in ("gluon_wide", "gluon_kron") and plan.config.get("E2M1_PAIRS"), (fmt, n, plan.path)
            assert not _plan(fmt, n).config.get("E2M1_PAIRS") or configs.QUANT_GLUON_E2M1_PAIRS
        for fmt in ("fp8_e4m3", "int8", "int4"):
            assert not _plan(fmt, n, e2m1_pairs=True).config.get("E2M1_PAIRS"), (fmt, n)


_COMPILE = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
import torch
from experiments.hadamard.sass_s33 import _compile
from tilecore.ops.hadamard import quantize
for fmt, n in (("mxfp4", 11008), ("nvfp4", 14336)):
    for tun in ({"e2m1_pairs": False}, {"e2m1_pairs": True}):
        group = quantize.FORMATS[fmt].default_group
        plan = quantize.kernel_plan((1 << 28) // n, n, torch.bfloat16, fmt, group, None, True, False, False, 132,
                                    _gluon_ok=True, **tun)
        print(json.dumps(_compile(plan, fmt, n)))
"""


def test_e2m1_pairs_compile_for_sm90():
    """sm_90a: fewer SASS instructions with E2M1_PAIRS (mxfp4 11008 on the wide kernel, nvfp4 14336 on the kron one),
    the same wgmma, no more spilled."""
    rows = compiled_json_lines(_COMPILE, timeout=1200)
    for off, on in (rows[0:2], rows[2:4]):
        assert on["config"].get("E2M1_PAIRS") and not off["config"].get("E2M1_PAIRS"), (off, on)
        assert on["sass"] < off["sass"] and on["spills"] <= off["spills"] and on["wgmma"] == off["wgmma"], (off, on)
