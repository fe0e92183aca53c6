"""The paper's formulas and Hopper numbers, from the closed forms and from the derivation engine."""
import math

import pytest

from tilecore.napkin import closed_forms as cf
from tilecore.napkin import engine as D
from tilecore.napkin import models
from tilecore.napkin.hardware import H100, abstract_level


def _values(r, level="HBM", q=2):
    return r.H[level] / q


def test_matmul_square_tiles_give_2abc_over_sqrt_M_plus_ac():
    a, b, c, g = 2048, 1024, 4096, 64
    M = g * g + 2 * g  # output tile + one column of A and one row of B
    r = D.relabel(models.matmul(m=a, n=c, k=b, dtype="fp16"), abstract_level(M),
                  {"m": D.group(g), "n": D.group(g), "k": D.stream(1)})
    assert r.M["SMEM"] / 2 == M
    assert _values(r) == pytest.approx(cf.matmul_io(a, b, c, g, g))
    assert cf.matmul_io(a, b, c, g, g) == pytest.approx(2 * a * b * c / g + a * c)
    assert cf.matmul_io_optimal(a, b, c, g * g) == pytest.approx(2 * a * b * c / g + a * c)


def test_matmul_search_finds_near_square_tiles():
    a = b = c = 1024
    M = 4096
    r = D.derive(models.matmul(a, c, b, dtype="fp16"), abstract_level(M))
    h = _values(r)
    assert cf.matmul_lower_bound(a, c, b, M) <= h <= 1.25 * cf.matmul_io_optimal(a, b, c, M)
    g_m, g_n = r.parts["m"].size, r.parts["n"].size
    assert 0.5 <= g_m / g_n <= 2 and r.parts["k"].kind == "stream"


def test_attention_io_is_2qd_plus_4xqd2_over_M():
    q, x, d, g_q = 4096, 4096, 64, 256
    r = D.relabel(models.attention(batch=1, heads=1, seq=q, d=d, dtype="fp16"), abstract_level(1e9),
                  {"q": D.group(g_q), "x": D.stream(1)})
    assert _values(r) == pytest.approx(cf.attention_io(q, x, d, g_q))
    assert r.M["SMEM"] / 2 == 2 * g_q * d + 2 * 1 * d          # M = 2 g_q d + 2 s_x d
    M = 2 * g_q * d
    assert cf.attention_io(q, x, d, g_q) == pytest.approx(cf.attention_io_optimal(q, x, d, M))


def test_attention_search_reaches_the_closed_form():
    q = x = 2048
    d, M = 64, 2 * 128 * 64 + 2 * 64
    r = D.derive(models.attention(batch=1, heads=1, seq=q, d=d, dtype="fp16"), abstract_level(M))
    h = _values(r)
    assert cf.attention_lower_bound(q, d, M) <= h <= 1.25 * cf.attention_io_optimal(q, x, d, M)
    assert r.parts["x"].kind == "stream" and r.parts["q"].kind == "group"


@pytest.mark.parametrize("model,beta", [("attention", 1.0), ("matmul", 0.5)])
def test_quantization_scales_io_time_as_q_to_the_1_plus_beta(model, beta):
    capacity_bytes = 2 ** 16

    def io_bytes(dtype):
        q = 2 if dtype == "fp16" else 1
        diag = (models.attention(batch=1, heads=1, seq=4096, d=64, dtype=dtype) if model == "attention"
                else models.matmul(4096, 4096, 4096, dtype=dtype))
        r = D.derive(diag, abstract_level(capacity_bytes / q, dtype))
        return r.H["HBM"] - r.compulsory_bytes   # the M-dependent term

    ratio = io_bytes("fp16") / io_bytes("fp8")
    assert ratio == pytest.approx(cf.quantized_io_time_ratio(beta, 2, 1), rel=0.15)
    assert cf.quantized_io_time_ratio(1.0, 2, 1) == 4 and cf.quantized_io_time_ratio(0.5, 2, 1) == pytest.approx(2 ** 1.5)


def test_hopper_ridge_group_and_l2_memory():
    assert cf.ridge(H100, "HBM", "fp16") == pytest.approx(1.69e-3, rel=0.01)
    assert 295 <= cf.min_query_group(H100, "HBM", "fp16") < 296
    # the paper's shared-memory figure, 6.0e12 fp16 values/s, gives g_q >= 82
    assert math.floor(cf.min_query_group(H100, bandwidth_values=6.0e12)) == 82
    assert cf.min_l2_memory_bytes(H100, "fp16") / 1024 == pytest.approx(681, abs=1)


def test_hopper_attention_configuration():
    h = cf.hopper_attention(H100, d=128, w_q=128, s_x=64, qk="fp8", pv="fp16", acc="fp16")
    assert h.smem_per_block == 48 * 1024 and h.smem_per_warpgroup == 48 * 1024
    assert h.limits["SMEM"] == pytest.approx((227 - 48) / 48)
    assert h.warpgroups == 3 and h.g_q == 384 and h.g_q >= cf.min_query_group(H100)
    assert h.step_compute_s == pytest.approx(1.26e-6, rel=0.01)
    assert h.step_transfer_s == pytest.approx(0.97e-6, rel=0.01)
    assert h.step_compute_s > h.step_transfer_s                     # compute-bound
    assert h.ideal_flops == pytest.approx(1.32e15, rel=0.005)


def test_fa3_softmax_overhead_account():
    assert cf.softmax_overhead_efficiency(H100, "fp16") == pytest.approx(0.75, abs=0.005)
    assert cf.softmax_overhead_efficiency(H100, "fp8") == pytest.approx(0.60, abs=0.005)
    # the same account through the engine: large attention, exposed-SFU time model
    for dtype, expect in (("fp16", 0.75), ("fp8", 0.60)):
        diag = models.attention(batch=16, heads=16, seq=8192, d=128, dtype=dtype)
        r = D.relabel(diag, H100, {"q": D.group(128), "x": D.stream(128)}, warpgroups=2,
                      time_model="exposed-sfu")
        compute = r.times["tensor"] + 2 / 3 * r.times["sfu"]
        ideal = r.flops / H100.rate("tensor", dtype)
        assert ideal / compute == pytest.approx(expect, abs=0.01)
