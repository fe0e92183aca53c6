"""PAIRS (session 33): the Gluon kernels' second-product pieces with hi converted a column pair at a time
(gluon_epilogue.pieces with CLAMP == 2, plan tuning "clamp_lo": 2). Gluon does not run in the interpreter: here the
asm's operand order emulated against tiles.hadamard.bf16_pieces' pieces, the plan switches, and an sm_90a compile in a fresh
process whose PTX pairs each word's halves with the right float32 values (a structural check of the asm's operands)
and whose SASS is shorter than CLAMP_LO's with nothing spilled. The GPU job (experiments/hadamard/gpu_gluon_widths.py
--set s33b) compares every variant's bytes with the shipped plan's."""
import re

import torch

from tilecore.ops.hadamard import gluon_launch, kron, quantize
from compiled_run import compiled_json_lines


def _plan(fmt, n, **tuning):
    group = quantize.FORMATS[fmt].default_group
    return quantize.kernel_plan(1 << 14, n, torch.bfloat16, fmt, group, None, True, False, False, 132, False,
                                _gluon_ok=True, **tuning)


def test_pairs_asm_order_gives_the_pieces():
    """cvt.rn.bf16x2.f32 d, a, b puts RN_bf16(a) in d's upper half and RN_bf16(b) in its lower; the asm passes
    a = element 1 ($4), b = element 0 ($3), so d is the two bf16 elements in Triton's packing (element 0 low), d << 16
    is element 0's hi as float32 and d & 0xffff0000 element 1's; lo = max(x - hi, -2^120): bf16_pieces' pieces for
    finite x (random values over many binades, ties of bf16 rounding included)."""
    torch.manual_seed(5)
    x = torch.randn(1 << 16) * 10.0 ** torch.randint(-20, 20, (1 << 16,)).float()
    ties = (torch.randint(-2**15, 2**15, (1024,), dtype=torch.int32) << 16 | 0x8000).view(torch.float32)
    x = torch.cat([x, ties[torch.isfinite(ties)]])
    x = x[: x.numel() // 2 * 2]
    x0, x1 = x[0::2], x[1::2]
    b0 = x0.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    b1 = x1.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    d = (b1 << 16) | b0  # cvt.rn.bf16x2.f32 d, x1, x0
    h0 = (d << 16).view(torch.float32)
    h1 = (d & -65536).view(torch.float32)
    hi_ref = x.to(torch.bfloat16)  # tiles.hadamard.bf16_pieces: hi = RN_bf16(x), lo = 0 where hi is x, else x - hi
    lo_ref = torch.where(hi_ref.float() == x, torch.zeros_like(x), x - hi_ref.float()).to(torch.bfloat16)
    h = torch.stack([h0, h1], 1).reshape(-1)
    assert torch.equal(h, hi_ref.float())
    lo = torch.maximum(x - h, torch.tensor(-2.0**120)).to(torch.bfloat16)
    finite = torch.isfinite(hi_ref.float())
    assert torch.equal(lo[finite].view(torch.int16), lo_ref[finite].view(torch.int16))


def test_plan_switch_carries_pairs():
    """tuning clamp_lo = 2 reaches both Gluon kernels' configs (and the transform's STORE plan) as CLAMP_LO 2; True
    stays True (the kernels' specialization of session 32)."""
    assert _plan("mxfp4", 11008, gluon=True, clamp_lo=2).config["CLAMP_LO"] == 2
    assert _plan("fp8_e4m3", 14336, gluon_kron=True, clamp_lo=2).config["CLAMP_LO"] == 2
    assert _plan("nvfp4", 18944, gluon=True, clamp_lo=True).config["CLAMP_LO"] is True
    cfg = kron.gluon_config(148, 128, {"clamp_lo": 2})
    stages = cfg.pop("stages")
    assert gluon_launch.store_plan(1 << 14, 18944, torch.bfloat16, 132, stages=stages, **cfg).config["CLAMP_LO"] == 2
    assert gluon_launch.store_plan(1 << 14, 14336, torch.bfloat16, 132, clamp_lo=True).config["CLAMP_LO"] is True


_COMPILE = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from experiments.hadamard import kron_gluon_compile as kc, wide_gluon_compile as wc
import tilecore.tiles.compile as C
orig = C.compile_kernel
seen = []
def grab(*a, **k):
    seen.append(orig(*a, **k))
    return seen[-1]
C.compile_kernel = grab
for clamp in (True, 2):
    r = wc.compile_one(172, 64, "mxfp4", fold=True, nozero=True, clamp_lo=clamp)
    print(json.dumps(dict(r, ptx=seen[-1].asm["ptx"] if clamp == 2 else "")))
for clamp in (True, 2):
    r = kc.compile_one(28, 512, 2, "fp8_e4m3", clamp_lo=clamp)
    print(json.dumps(dict(r, ptx="")))
"""


def test_pairs_compiles_for_sm90_shorter_and_paired():
    wide1, wide2, kron1, kron2 = compiled_json_lines(_COMPILE, timeout=900)
    for a, b in ((wide1, wide2), (kron1, kron2)):
        assert b["sass"] < 0.97 * a["sass"] and b["spill_stores"] == 0 and b["wgmma"] == a["wgmma"], (a, b)
    ptx = wide2["ptx"]
    asm = re.findall(r"cvt\.rn\.bf16x2\.f32 (%r\d+), (%r\d+), (%r\d+); shl\.b32 (%r\d+), \1, 16; "
                     r"and\.b32 (%r\d+), \1, -65536;", ptx)
    assert len(asm) >= 96, len(asm)  # a consumer's three blocks: 3 x 16 pairs, two consumers
    for d, x1, x0, h0, h1 in asm:  # lo = x - hi pairs element 0 with d << 16 and element 1 with d & 0xffff0000
        assert re.search(rf"sub\.f32 \t*%r\d+, {x0}, {h0};", ptx) and re.search(rf"sub\.f32 \t*%r\d+, {x1}, {h1};", ptx)
    assert "cvt.f32.bf16" not in ptx  # hi's float32 values no longer converted back
