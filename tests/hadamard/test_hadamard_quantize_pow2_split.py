"""The tl pow2 quantize kernel on splits whose slice holds a whole group on one thread, and PAIRS' lo by one max
(issue 32).

* Splits (plan tuning ``split`` with ``perm``; configs.QUANT_POW2_FORMAT_TUNING once the GPU shows them faster): under
  PERM a thread holds N2 / 4 consecutive outputs of a tile row, so at N2 = 64 an nvfp4 group of 16 (at N2 = 128 an mxfp4
  group of 32) is one thread's: its maximum without a shuffle and its scale computed once, not on two or four threads.
  The sums run in another order than the shipped split's: checked against the float64 reference (codes >= 99.9% equal,
  the rest one step apart, scales exact, every byte written) in the interpreter.
  With one product a slice (N1 == 1: n = 128, 256 as (2, 1, 128)) PERM multiplies x by the column-permuted H_N2.
* CLAMP_LO (MID_PIECES -3, plan tuning ``clamp_lo``, configs.QUANT_POW2_CLAMP_LO): kernels._pairs_dot's lo as
  max(x - h, -2^120) instead of a compare and a select; the same pieces for every finite x and the same infinities
  (torch emulation below); in the interpreter -3 runs as 2 pieces. An sm_90a compile in a fresh process shows both in
  the loop's SASS."""

import pytest
import torch

from tilecore.ops.hadamard import quantize
from tilecore.ops.hadamard.quantize_reference import FORMATS, code_order, hadamard_quantize_reference
from compiled_run import compiled_json_lines

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered")


def _run(x, fmt, scale, poison=True, **tuning):
    rows, n = x.shape
    group = FORMATS[fmt].default_group
    plan = quantize.kernel_plan(rows, n, x.dtype, fmt, group, None, True, scale is not None, False, 4, True, **tuning)
    codes, scales, _ = quantize.run_plan(plan, x, fmt, group, None, True, scale, poison=poison)
    return plan, codes, scales


def _bytes(t):
    return [s.contiguous().view(torch.uint8) for s in (t if isinstance(t, tuple) else (t,))]


@pytest.mark.parametrize("fmt,n,split,dtype", [("nvfp4", 1024, (1, 16, 64), torch.float16),
                                               ("mxfp4", 2048, (1, 16, 128), torch.float16),
                                               ("int4", 1024, (1, 16, 64), torch.float16),
                                               ("fp8_e4m3", 1024, (1, 16, 64), torch.float32),
                                               # one product (N1 == 1): x by the column-permuted H_N2
                                               ("nvfp4", 128, (1, 1, 128), torch.bfloat16),
                                               ("mxfp4", 256, (2, 1, 128), torch.float16),
                                               ("nvfp4", 256, (2, 1, 128), torch.float32),
                                               # four 64 x 64 slices (16384, two programs an SM); 2048 as
                                               # 1024's slice twice
                                               ("int8", 16384, (4, 64, 64), torch.bfloat16),
                                               ("int8", 2048, (2, 16, 64), torch.float16),
                                               ("int4", 2048, (2, 16, 64), torch.bfloat16)])
def test_split_matches_the_float64_reference(fmt, n, split, dtype):
    torch.manual_seed(11)
    x = torch.randn(5, n, dtype=dtype)  # 5 rows: a partial tile (B >= 8)
    x[:, 3] *= 70  # an outlier channel
    scale = torch.tensor([0.003]) if fmt == "nvfp4" else None
    perm = fmt not in ("fp8_e4m3", "int8")
    plan, codes, scales = _run(x, fmt, scale, split=split, **({"perm": True} if perm else {}))
    cfg = plan.config
    assert plan.path == "pow2" and (cfg["S"], cfg["N1"], cfg["N2"]) == split and cfg["PERM"] == perm
    _, codes2, scales2 = _run(x, fmt, scale, poison=0xA5, split=split, **({"perm": True} if perm else {}))
    assert all(torch.equal(a, b) for a, b in zip(_bytes(codes) + _bytes(scales), _bytes(codes2) + _bytes(scales2)))
    ref, ref_scales = hadamard_quantize_reference(x, format=fmt, **({"scale": scale} if scale is not None else {}))
    a, b = code_order(codes.reshape(ref.shape), fmt), code_order(ref, fmt)
    assert (a == b).double().mean() >= 0.999 and int((a - b).abs().max()) <= 1
    got = scales if isinstance(scales, tuple) else (scales,)
    want = ref_scales if isinstance(ref_scales, tuple) else (ref_scales,)
    for s, r in zip(got, want):
        s = s.reshape(r.shape)
        if r.dtype == torch.float32:  # per-token float32 scales: the amax of a float32 rotation
            assert torch.allclose(s, r, rtol=2.0**-15, atol=0)
        else:  # e8m0 / e4m3 bytes exactly
            assert torch.equal(s.view(torch.uint8), r.view(torch.uint8))


def test_clamp_lo_plan_and_interpreter_bytes():
    torch.manual_seed(3)
    x = torch.randn(4, 512, dtype=torch.bfloat16)
    x[1, 9] = float("inf")
    p0, c0, s0 = _run(x, "mxfp4", None, pairs=True)
    p1, c1, s1 = _run(x, "mxfp4", None, pairs=True, clamp_lo=True)
    assert p0.config["MID_PIECES"] == -2 and p1.config["MID_PIECES"] == -3
    assert all(torch.equal(a, b) for a, b in zip(_bytes(c0) + _bytes(s0), _bytes(c1) + _bytes(s1)))
    # clamp_lo means nothing without PAIRS, and float32 keeps its three pieces
    assert quantize.kernel_plan(4, 512, torch.bfloat16, "mxfp4", 32, None, True, False, False, 4, True,
                                pairs=False, clamp_lo=True).config["MID_PIECES"] == 2
    assert quantize.kernel_plan(4, 512, torch.float32, "mxfp4", 32, None, True, False, False, 4, True,
                                pairs=True, clamp_lo=True).config["MID_PIECES"] == 3


def test_clamp_lo_pieces_equal_the_selects():
    """lo = max(x - h, -2^120) (the GPU's max.f32 returns the non-NaN operand: torch.fmax) against the shipped
    where(h == x, 0, x - h): the same bf16 bits for every finite x; for +-inf the pieces' sum hi + lo stays +-inf."""
    g = torch.Generator().manual_seed(5)
    parts = [torch.randn(200000, generator=g) * 10.0 ** torch.randint(-30, 30, (200000,), generator=g).float(),
             torch.randn(1000, generator=g).to(torch.bfloat16).float(),  # exact in bf16: lo 0
             torch.tensor([0.0, -0.0, 1e-38, -1e-38, 1e-45, 3.0e38, -3.0e38, 2.0**-126, 2.0**119, -(2.0**119)])]
    x = torch.cat(parts)
    hi = x.to(torch.bfloat16)
    h = hi.float()
    lo_sel = torch.where(h == x, torch.zeros_like(x), x - h).to(torch.bfloat16)
    lo_max = torch.fmax(x - h, torch.full_like(x, -2.0**120)).to(torch.bfloat16)
    finite = torch.isfinite(h)  # (x past bf16's largest rounds hi to inf: both pieces' sums are non-finite there)
    assert torch.equal(lo_sel[finite].view(torch.int16), lo_max[finite].view(torch.int16))
    inf = torch.tensor([float("inf"), float("-inf")])
    hi_i = inf.to(torch.bfloat16).float()
    lo_i = torch.fmax(inf - hi_i, torch.full_like(inf, -2.0**120)).to(torch.bfloat16).float()
    assert torch.equal(hi_i + lo_i, inf) and torch.equal(lo_i, torch.full_like(inf, -2.0**120))
    nan = torch.tensor([float("nan")])
    assert torch.isnan(nan.to(torch.bfloat16).float()).all()  # NaN goes through hi


_COMPILE = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from experiments.hadamard import sass_quantize as sq
from tilecore.tiles.compile import resources
for name, kw in (("before", dict(pairs=True, clamp_lo=False, split=(1, 128, 32))),
                 ("split_clamp", dict(pairs=True, clamp_lo=True, split=(1, 64, 64), perm=True))):
    plan, k = sq.compile_case("nvfp4", 4096, True, static=True, **kw)
    body = sq.loop_body(sq.sass_lines(k.asm["cubin"]))
    kinds = sq.kinds(body)
    print(json.dumps(dict(name=name, loop=len(body), shfl=kinds["shuffle"], mufu=kinds["mufu"],
                          spills=resources(k).spill_stores, clamp="0fFB800000" in k.asm["ptx"],
                          n2=plan.config["N2"], pieces=plan.config["MID_PIECES"])))
"""


def test_split_and_clamp_compile_for_sm90_shorter():
    """nvfp4 4096 (sm_90a): a (1, 128, 32) tile with PAIRS against (1, 64, 64) + PERM + CLAMP_LO: a tenth fewer
    loop instructions or more, half the shuffles and reciprocals (each group's scale once), the clamp's -2^120 in
    the PTX, no spills."""
    base, new = compiled_json_lines(_COMPILE, timeout=900)
    assert base["pieces"] == -2 and new["pieces"] == -3 and new["n2"] == 64
    assert new["loop"] < 0.9 * base["loop"], (base, new)
    assert new["shfl"] < base["shfl"] and new["mufu"] < base["mufu"], (base, new)
    assert new["clamp"] and not base["clamp"] and new["spills"] == 0


@pytest.mark.parametrize("fmt,n,tuning", [("nvfp4", 1024, {"split": (1, 16, 64)}),
                                          ("mxfp4", 2048, {"split": (1, 16, 128), "perm": True}),
                                          ("nvfp4", 128, {"perm": True})])
def test_e2m1_pairs_bytes_equal_the_codes_a_value(fmt, n, tuning):
    """E2M1_PAIRS (plan tuning e2m1_pairs, configs.QUANT_POW2_E2M1_PAIRS): a column pair's byte by _e2m1_pair, the
    groups not kept (a NaN or inf in the group: scale NaN / 255) zeroed once a byte: the same bytes as the codes made
    a value at a time (interpreter), outliers, ties, saturation, NaN and inf rows, subnormal scales included."""
    torch.manual_seed(5)
    x = torch.randn(6, n, dtype=torch.bfloat16)
    x[:, 3] *= 90
    x[1, 7] = float("nan")
    x[2, 9] = float("inf")
    x[3] *= 1e-30  # tiny rows: scales at the bottom of e8m0 / e4m3's range
    x[4, : n // 2] = 0.0
    scale = torch.tensor([0.002]) if fmt == "nvfp4" else None
    p0, c0, s0 = _run(x, fmt, scale, e2m1_pairs=False, **tuning)
    p1, c1, s1 = _run(x, fmt, scale, e2m1_pairs=True, **tuning)
    assert "E2M1_PAIRS" not in p0.config and p1.config["E2M1_PAIRS"]
    assert all(torch.equal(a, b) for a, b in zip(_bytes(c0) + _bytes(s0), _bytes(c1) + _bytes(s1)))


def test_e2m1_pairs_plan_where_it_applies():
    """E2M1_PAIRS only for mxfp4 / nvfp4 with FAST and groups inside a tile row (not int4's 128, not per token)."""
    def cfg(fmt, n, group, **t):
        return quantize.kernel_plan(64, n, torch.bfloat16, fmt, group, None, True, False, False, 4, True, **t).config
    assert cfg("nvfp4", 4096, 16, e2m1_pairs=True).get("E2M1_PAIRS")
    assert not cfg("nvfp4", 4096, 16, e2m1_pairs=True, fast=False).get("E2M1_PAIRS")
    assert not cfg("int4", 4096, 128, e2m1_pairs=True).get("E2M1_PAIRS")
    assert not cfg("fp8_e4m3", 4096, None, e2m1_pairs=True).get("E2M1_PAIRS")
    assert not cfg("nvfp4", 4096, 16).get("E2M1_PAIRS") or quantize.configs.QUANT_POW2_E2M1_PAIRS


_TWO_A_SM = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from experiments.hadamard import sass_quantize as sq
from tilecore.tiles.compile import resources
for fmt in ("int8", "nvfp4"):  # the most shared memory (3 stages) and registers (255) of the four
    plan, k = sq.compile_case(fmt, 16384, True, static=fmt == "nvfp4")
    r = resources(k)
    print(json.dumps(dict(fmt=fmt, split=[plan.config[c] for c in ("S", "N1", "N2")], warps=plan.config["num_warps"],
                          grid=plan.grid[0], registers=r.registers, spills=r.spill_stores, shared=r.shared)))
"""


def test_16384_plans_fit_two_programs_an_sm():
    """The shipped 16384 plans (configs.QUANT_POW2_FORMAT_TUNING: four 64 x 64 slices on 4 warps, 2 programs an SM, the
    GPU's 1.03-1.26x over one program of 8 warps) of int8 (3 stages: the most shared memory) and nvfp4 (the most
    registers): compiled for sm_90a, two programs fit an SM's registers (64K) and shared memory (228 KiB, 1 KiB reserved
    a block), with no spills."""
    for row in compiled_json_lines(_TWO_A_SM, timeout=900):
        assert row["split"] == [4, 64, 64] and row["warps"] == 4 and row["grid"] == 2 * 132, row
        regs = -(-row["registers"] // 8) * 8  # allocated in units of 8 a thread
        assert row["spills"] == 0 and 2 * regs * 32 * row["warps"] <= 65536, row
        assert 2 * (row["shared"] + 1024) <= 228 * 1024, row



def test_e5m2_reads_e4m3_tables():
    """tables_of (configs.QUANT_POW2_TABLES_OF): fp8_e5m2's pow2 plan is fp8_e4m3's measured one but the format (the same
    kernel, another conversion), its own entries first (n = 128); in the interpreter its codes match the float64
    reference."""
    big = {n: (1 << 28) // n for n in (128, 1024, 8192, 16384)}
    for n, rows in big.items():
        a = quantize.kernel_plan(rows, n, torch.bfloat16, "fp8_e4m3", None, None, True, False, False, 132, False).config
        b = quantize.kernel_plan(rows, n, torch.bfloat16, "fp8_e5m2", None, None, True, False, False, 132, False,
                                 tables_of="fp8_e4m3").config
        assert {k for k in a if a[k] != b.get(k)} == {"FORMAT", "QMAX"}, n
    torch.manual_seed(5)
    x = torch.randn(5, 1024, dtype=torch.bfloat16)
    x[:, 3] *= 70
    x[2, 9] = float("inf")
    plan, codes, scales = _run(x, "fp8_e5m2", None, tables_of="fp8_e4m3")
    assert plan.path == "pow2" and (plan.config["N1"], plan.config["N2"]) == (16, 64)
    ref, ref_scales = hadamard_quantize_reference(x, format="fp8_e5m2")
    a, b = code_order(codes.reshape(ref.shape), "fp8_e5m2"), code_order(ref, "fp8_e5m2")
    assert (a == b).double().mean() >= 0.999 and int((a - b).abs().max()) <= 1
    assert torch.allclose(scales.reshape(ref_scales.shape), ref_scales, rtol=2.0**-15, atol=0, equal_nan=True)
