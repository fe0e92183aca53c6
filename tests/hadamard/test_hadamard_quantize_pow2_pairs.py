"""PAIRS on the tl pow2 quantize kernel (session 33; plan tuning ``pairs``, configs.QUANT_POW2_PAIRS; MID_PIECES -2:
kernels._pairs_dot): the second product's hi piece made a column pair at a time by one asm block, the pieces
dot_split's. In the interpreter (no inline asm) -2 runs as 2 pieces: the codes and scales equal the shipped plan's
bit for bit (the plumbing) and the float64 reference's (>= 99.9%); an sm_90a compile in a fresh process: the asm's
words paired with their elements' subtractions, no cvt.f32.bf16, fewer loop SASS. The GPU job (experiments/hadamard/
gpu_gluon_widths.py --set s33e) compares the bytes with the shipped plan's on the GPU."""
import re

import pytest
import torch

from tilecore.ops.hadamard import quantize
from tilecore.ops.hadamard.quantize_reference import FORMATS, code_order, hadamard_quantize_reference
from compiled_run import compiled_json_lines

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered")


def _run(x, fmt, scale, **tuning):
    rows, n = x.shape
    group = FORMATS[fmt].default_group
    plan = quantize.kernel_plan(rows, n, x.dtype, fmt, group, None, True, scale is not None, False, 4, True, **tuning)
    codes, scales, _ = quantize.run_plan(plan, x, fmt, group, None, True, scale, poison=True)
    return plan, codes, scales


@pytest.mark.parametrize("fmt", ["mxfp4", "fp8_e4m3", "nvfp4"])
def test_pairs_plan_equals_the_shipped_plan_in_the_interpreter(fmt):
    torch.manual_seed(7)
    x = torch.randn(8, 512, dtype=torch.float16)
    x[:, 5] *= 60  # an outlier channel
    x[3, 7] = float("nan")
    scale = torch.tensor([0.002]) if fmt == "nvfp4" else None
    p0, c0, s0 = _run(x, fmt, scale, pairs=False)
    p1, c1, s1 = _run(x, fmt, scale, pairs=True)
    assert p0.path == p1.path == "pow2" and p0.config["MID_PIECES"] == 2 and p1.config["MID_PIECES"] == -2
    assert torch.equal(c0.view(torch.uint8), c1.view(torch.uint8))
    for a, b in zip(s0 if isinstance(s0, tuple) else (s0,), s1 if isinstance(s1, tuple) else (s1,)):
        assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    ref, _ = hadamard_quantize_reference(x, format=fmt, **({"scale": scale} if scale is not None else {}))
    a, b = code_order(c1.reshape(ref.shape), fmt), code_order(ref, fmt)
    assert (a == b).double().mean() >= 0.999


def test_pairs_off_for_float32_and_by_default():
    assert quantize.kernel_plan(64, 4096, torch.float32, "mxfp4", 32, None, True, False, False, 132, False,
                                pairs=True).config["MID_PIECES"] == 3
    plan = quantize.kernel_plan(64, 4096, torch.bfloat16, "mxfp4", 32, None, True, False, False, 132, False)
    pairs = quantize._by_format(quantize.configs.QUANT_POW2_PAIRS, "mxfp4", 4096)
    clamp = quantize._by_format(quantize.configs.QUANT_POW2_CLAMP_LO, "mxfp4", 4096)
    assert plan.config["MID_PIECES"] == ((-3 if clamp else -2) if pairs else 2)


_COMPILE = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from experiments.hadamard import sass_quantize as sq
for pairs in (False, True):
    plan, k = sq.compile_case("mxfp4", 4096, True, pairs=pairs)
    body = sq.loop_body(sq.sass_lines(k.asm["cubin"]))
    print(json.dumps(dict(pairs=pairs, loop=len(body), ptx=k.asm["ptx"] if pairs else "")))
"""


def test_pairs_compiles_for_sm90_shorter_and_paired():
    base, pairs = compiled_json_lines(_COMPILE, timeout=900)
    assert pairs["loop"] < 0.97 * base["loop"], (base["loop"], pairs["loop"])
    ptx = pairs["ptx"]
    asm = re.findall(r"cvt\.rn\.bf16x2\.f32 (%r\d+), (%r\d+), (%r\d+); shl\.b32 (%r\d+), \1, 16; "
                     r"and\.b32 (%r\d+), \1, -65536;", ptx)
    assert len(asm) >= 16, len(asm)
    for d, x1, x0, h0, h1 in asm:
        assert re.search(rf"sub\.f32 \t*%r\d+, {x0}, {h0};", ptx) and re.search(rf"sub\.f32 \t*%r\d+, {x1}, {h1};", ptx)
    assert "cvt.f32.bf16" not in ptx


def test_format_tuning_table_under_the_callers_tuning():
    """configs.QUANT_POW2_FORMAT_TUNING by (format, n) goes under the caller's tuning; its TMA only from
    TMA_MIN_ELEMENTS elements and never for float32 (the pointer path below: the descriptors' host cost)."""
    from tilecore.ops.hadamard import configs
    from tilecore.tiles.switches import patched

    # (no memo cleared: kernel_plan keys on switches.generation(), which the patch moves, so neither a plan made before it
    # nor one made under it is served on the other side)
    with patched(configs, QUANT_POW2_FORMAT_TUNING={("mxfp4", 128): dict(tma="load", waves=2)}):
        big = (1 << 28) // 128
        plan = quantize.kernel_plan(big, 128, torch.bfloat16, "mxfp4", 32, None, True, False, False, 132, False)
        assert plan.config["TMA_LOAD"] and plan.config["TMA_STORE"] and plan.grid == (264,), (plan.grid, plan.config)
        plan = quantize.kernel_plan(big, 128, torch.bfloat16, "mxfp4", 32, None, True, False, False, 132, False,
                                    waves=1, tma="none")
        assert not plan.config["TMA_LOAD"] and plan.grid == (132,)
        small = quantize.kernel_plan(64, 128, torch.bfloat16, "mxfp4", 32, None, True, False, False, 132, False)
        assert not small.config["TMA_LOAD"]
        f32 = quantize.kernel_plan(big, 128, torch.float32, "mxfp4", 32, None, True, False, False, 132, False)
        assert not f32.config["TMA_LOAD"]
        other = quantize.kernel_plan(big, 128, torch.bfloat16, "fp8_e4m3", None, None, True, False, False, 132, False)
        assert not other.config["TMA_LOAD"] and other.grid == (132,)
    # the shipped table again after the block: fp8_e4m3 128's codes by TMA (not the plan memoized under the patch)
    other = quantize.kernel_plan(big, 128, torch.bfloat16, "fp8_e4m3", None, None, True, False, False, 132, False)
    assert other.config["TMA_LOAD"]


def _tiles(plan):
    c = plan.config
    return c["S"], c["N1"], c["N2"], c["num_warps"], c["num_stages"]


def test_kernel_plan_memo_follows_the_tables():
    """quantize.kernel_plan and kron.kernel_plan are memoized by their arguments and configs' tables (switches.memo:
    the generation, moved by switches.patched): a plan memoized before a patch is not served under it, nor one made
    under it after (an lru_cache over the arguments alone served the stale plan both ways)."""
    from tilecore.ops.hadamard import configs, kron
    from tilecore.tiles.switches import patched

    args = ((1 << 28) // 4096, 4096, torch.bfloat16, "fp8_e4m3", None, None, True, False, False, 132, False)
    shipped = quantize.kernel_plan(*args)
    assert quantize.kernel_plan(*args) is shipped  # memoized while the tables stay
    variant = dict(split=(1, 128, 32), num_warps=8, num_stages=2)
    assert _tiles(shipped) != (1, 128, 32, 8, 2)
    with patched(configs, QUANT_POW2_FORMAT_TUNING={**configs.QUANT_POW2_FORMAT_TUNING, ("fp8_e4m3", 4096): variant}):
        assert _tiles(quantize.kernel_plan(*args)) == (1, 128, 32, 8, 2)
    assert quantize.kernel_plan(*args).config == shipped.config
    # kron.kernel_plan: 28 x 512 on configs.KRON_TUNING's 3 stages, 2 without the entry
    kargs = ((1 << 28) // 14336, 28, 512, torch.bfloat16, 132)
    assert kron.kernel_plan(*kargs).config["num_stages"] == 3
    with patched(configs, KRON_TUNING={}):
        assert kron.kernel_plan(*kargs).config["num_stages"] == 2
    assert kron.kernel_plan(*kargs).config["num_stages"] == 3


_COMPILE_128 = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from experiments.hadamard import sass_quantize as sq
from tilecore.tiles.compile import resources
for fmt in ("mxfp4", "nvfp4", "int4"):
    plan, k = sq.compile_case(fmt, 128, True, **({"static": True} if fmt == "nvfp4" else {}))
    ptx = k.asm["ptx"]
    print(json.dumps(dict(fmt=fmt, tma_load=plan.config["TMA_LOAD"], tma_store=plan.config["TMA_STORE"],
                          grid=plan.grid[0], bulk=ptx.count("cp.async.bulk.tensor"), spills=resources(k).spill_stores)))
"""


def test_shipped_128_4bit_plans_compile_with_tma_for_sm90():
    """The shipped 4-bit plans at n = 128 (QUANT_POW2_FORMAT_TUNING, session 35: 2.3-3.5x the pointer plans on the
    H100) at 2^28 elements: TMA loads and code stores in the sm_90a PTX, nothing spilled; mxfp4 / int4 on 2 programs
    an SM."""
    rows = {d["fmt"]: d for d in compiled_json_lines(_COMPILE_128, timeout=900)}
    for fmt, d in rows.items():
        assert d["tma_load"] and d["tma_store"] and d["bulk"] >= 2 and d["spills"] == 0, d
    assert rows["mxfp4"]["grid"] == rows["int4"]["grid"] == 2 * rows["nvfp4"]["grid"] == 264, rows
