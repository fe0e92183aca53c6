"""The FMA-unit exp2 of the Hopper FP8 kernel (gluon_fp8.exp2_fma_ptx, session 30): its arithmetic, step by step in
float32 as the PTX does it, against float64 2^x; the quadratic's error is far under e4m3's half-step, so P rounded to
e4m3 differs from the exact 2^x's rounding only where 2^x sits within that error of a rounding boundary."""
import numpy as np
import pytest
import torch

from tilecore.ops.attention_fp8.gluon_fp8 import EXP2_POLY, exp2_fma_ptx, exp2_split_asm


def fma_exp2(x: np.ndarray, degree: int) -> np.ndarray:
    """exp2_fma_ptx(degree) in numpy float32, instruction by instruction (fma rounded once: float64 then float32)."""
    f32 = np.float32
    c = [np.uint32(int(h, 16)).view(np.float32) for h in EXP2_POLY[degree]]
    x = x.astype(np.float32)
    f = np.where(np.isnan(x), x, np.maximum(x, f32(-126.0)))  # max.NaN
    magic = f32(1.5 * 2 ** 23)
    t = (f + magic).astype(np.float32)
    j = (t - magic).astype(np.float32)
    f = (f - j).astype(np.float32)
    p = (f.astype(np.float64) * c[0] + c[1]).astype(np.float32)
    for ci in c[2:]:
        p = (p.astype(np.float64) * f + ci).astype(np.float32)
    with np.errstate(over="ignore"):
        bits = (p.view(np.uint32).astype(np.uint64) + (t.view(np.uint32).astype(np.uint64) << 23)) % 2 ** 32
    y = bits.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x) | np.isnan(y), np.float32("nan"), np.maximum(y, x))  # max.NaN


@pytest.mark.parametrize("degree,bound", [(3, 8e-5), (2, 1.8e-3)])
def test_fma_exp2_relative_error(degree, bound):
    rng = np.random.default_rng(degree)
    x = np.concatenate([rng.uniform(-30, 8.9, 200_000), np.arange(-20, 9, dtype=np.float64),
                        np.arange(-20, 9) + 0.5]).astype(np.float32)
    y = fma_exp2(x, degree).astype(np.float64)
    rel = np.abs(y / np.exp2(x.astype(np.float64)) - 1)
    assert rel.max() < bound, rel.max()


def test_fma_exp2_edges():
    x = np.array([-np.inf, -1000.0, -126.0, np.nan, 8.0], dtype=np.float32)
    y = fma_exp2(x, 2)
    assert 0 < y[0] <= 2.0 ** -125 and 0 < y[1] <= 2.0 ** -125  # masked scores: tiny, 0 once rounded to e4m3
    assert np.isnan(y[3]) and abs(y[4] / 256 - 1) < 2e-3


def test_quadratic_is_invisible_at_e4m3():
    # P = 2^x rounded to e4m3: the quadratic's P equals the exact one's but where 2^x is within 1.7e-3 of a rounding
    # boundary (a few per cent of the elements, each off by one e4m3 step); the RMS error of P over the exact 2^x grows
    # by under 1% of e4m3's own
    rng = np.random.default_rng(0)
    x = rng.uniform(-14, 8, 100_000).astype(np.float32)
    exact = torch.from_numpy(np.exp2(x.astype(np.float64)))
    e4 = lambda t: t.float().to(torch.float8_e4m3fn).double()
    quad = e4(torch.from_numpy(fma_exp2(x, 2)))
    base = e4(exact)
    flips = (quad != base).double().mean().item()
    assert flips < 0.05, flips
    rms = lambda p: ((p - exact) / exact).pow(2).mean().sqrt().item()
    assert rms(quad) < 1.01 * rms(base), (rms(quad), rms(base))


def test_asm_forms():
    cubic, quad = exp2_fma_ptx(3), exp2_fma_ptx(2)
    assert cubic.count("fma.rn.f32") == 3 and quad.count("fma.rn.f32") == 2
    assert all(f"0f{h}" in quad for h in EXP2_POLY[2])
    asm, constraints = exp2_split_asm(4, 2)
    assert asm.count("ex2.approx.ftz.f32") == 3 and asm.count("fma.rn.f32") == 2
    assert "max.NaN.f32 f, $7," in asm and "max.NaN.f32 $3, p, $7;" in asm
    assert constraints == ",".join(["=f"] * 4 + ["f"] * 4)
