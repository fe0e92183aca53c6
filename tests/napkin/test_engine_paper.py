"""The paper's Hopper and Ampere accounts, derived by the generic engine (closed_forms.py is the oracle)."""
import math

import pytest

from tilecore.napkin import closed_forms as cf
from tilecore.napkin import engine as D
from tilecore.napkin import models
from tilecore.napkin.errors import CapacityError
from tilecore.napkin.hardware import A100, H100

# the paper's Hopper configuration: fp8 Q K^T, fp16 P V, O kept in fp16, w_q = 128 a warpgroup,
# s_x = 64, d = 128, three warpgroups (g_q = 384); seq = 33 x 384 so no tile is padded and the
# 16 x 16 x 33 thread blocks fill 64 whole waves of 132 SMs
PAPER = dict(batch=16, heads=16, seq=384 * 33, d=128, dtype="fp16", qk_dtype="fp8", pv_dtype="fp16")


def paper(time_model="ideal", acc="fp16", wgs=3):
    return D.relabel(models.attention(**PAPER), H100, {"q": D.group(128 * wgs), "x": D.stream(64)},
                     warpgroups=wgs, acc_dtype=acc, time_model=time_model)


def test_engine_accepts_the_papers_hopper_configuration():
    r = paper()
    assert r.warpgroups == 3 and r.parts["q"].size == 384
    assert r.M["SMEM"] == 4 * 48 * 1024       # K, V double-buffered (48 KiB) + 3 x (Q, O) 48 KiB
    assert r.M["SMEM"] <= 227 * 1024 and r.ctas_per_sm == 1
    assert r.M["RF"] * 3 <= 256 * 1024         # 81.5 KiB a warpgroup (the paper: 74.75)
    with pytest.raises(CapacityError, match="registers"):
        paper(acc="fp32")                      # O in fp32 does not fit three warpgroups


def test_per_thread_throughput_table_is_the_papers_step_7():
    clocks = {(label.split(" ")[0], unit, dt): c for (label, unit, dt), c in paper().thread_clocks.items()}
    assert clocks[("Q", "tensor", "fp8")] == pytest.approx(2.0, rel=1e-3)           # 16384 ops at 8192 / clk
    assert clocks[("softmax_x(S)", "tensor", "fp16")] == pytest.approx(4.0, rel=1e-3)   # 16384 at 4096 / clk
    assert clocks[("softmax_x(S)", "sfu", "fp32")] == pytest.approx(4.0, rel=1e-3)  # 64 exp at 16 / clk (paper 65)
    assert clocks[("rescale", "alu", "fp16")] == pytest.approx(0.5, rel=0.1)  # 256 at 512 / clk (554 here)


def test_step_compute_and_transfer_and_the_ideal_rate():
    r = paper()
    tensor = sum(c for (_, unit, _), c in r.thread_clocks.items() if unit == "tensor")
    step_compute = tensor * 128 * r.warpgroups / H100.clock_hz
    step_bytes = sum(math.prod(r.S["SMEM"][a] for a in r.diagram.arrays[x].axes) * b
                     for x, b in (("K", 1), ("V", 2)))
    step_transfer = step_bytes / (H100.level("HBM").bandwidth / H100.sms)
    assert step_compute == pytest.approx(1.26e-6, rel=0.01)
    assert step_transfer == pytest.approx(0.97e-6, rel=0.01)
    assert r.bound == "tensor" and r.tflops * 1e12 == pytest.approx(1.32e15, rel=0.015)
    oracle = cf.hopper_attention(H100, d=128, w_q=128, s_x=64, qk="fp8", pv="fp16", acc="fp16")
    assert r.tflops * 1e12 == pytest.approx(oracle.ideal_flops, rel=0.015)
    assert r.warpgroups == oracle.warpgroups


def test_default_schedule_exposes_the_softmax_as_the_papers_fa3_account():
    # the default (overlap) schedule: 2/3 of the exponentials between Q K^T and P V are exposed, the
    # paper's account of FA3 (75% of peak in fp16, 60% in fp8)
    for dtype, lo, hi in (("fp16", 0.73, 0.77), ("fp8", 0.58, 0.62)):
        r = D.relabel(models.attention(batch=16, heads=16, seq=8192, d=128, dtype=dtype), H100,
                      {"q": D.group(128), "x": D.stream(128)}, warpgroups=2)
        ideal = r.flops / H100.rate("tensor", dtype)
        assert lo < ideal / r.compute_time < hi, (dtype, ideal / r.compute_time)
    # a GEMM has no exponentials: the schedule is the plain overlap
    g = D.relabel(models.matmul(8192, 8192, 8192), H100, {"m": D.group(128), "n": D.group(256), "k": D.stream(64)},
                  warpgroups=2, stages=3)
    assert g.compute_time == pytest.approx(g.times["tensor"])


def test_engine_default_is_right_for_attention_not_the_97_percent_of_peak():
    r = D.derive(models.attention(batch=16, heads=16, seq=4096, d=128), H100)
    assert r.tflops < 0.8 * 989.4          # was 974 (98% of peak) with full overlap
    ideal = D.derive(models.attention(batch=16, heads=16, seq=4096, d=128), H100, time_model="ideal")
    assert ideal.tflops > 0.9 * 989.4


def test_ampere_warps_per_sm_against_flashattention2():
    # The paper: 13 warps (of 16 query rows) per A100 SM against FlashAttention-2's 8. The engine's
    # account: a thread block of 192 rows (12 warps) fits shared memory with 64-key steps and 256 rows
    # (16 warps) does not; 12 warps put g_q = 192 above the A100's HBM ridge (g_q >= 153), FA2's
    # 128 rows sit below it. Reproduced in direction (12 vs the paper's 13: the paper rounds 12.5 up).
    assert 152 < cf.min_query_group(A100, "HBM", "fp16") < 154
    d = models.attention(batch=16, heads=16, seq=4096, d=128, dtype="fp16")
    fits = D.relabel(d, A100, {"q": D.group(192), "x": D.stream(64)}, warpgroups=3, mma="mma.sync")
    assert fits.ctas_per_sm * 192 // 16 == 12
    with pytest.raises(CapacityError):
        D.relabel(d, A100, {"q": D.group(256), "x": D.stream(64)}, warpgroups=4, mma="mma.sync")
    fa2 = D.relabel(d, A100, {"q": D.group(128), "x": D.stream(64)}, warpgroups=2, mma="mma.sync")
    assert fa2.ctas_per_sm * 128 // 16 == 8
    assert 128 < cf.min_query_group(A100, "HBM", "fp16") < 192


def test_bad_time_model_is_a_value_error_not_a_capacity_error():
    with pytest.raises(ValueError, match="accepted: overlap, ideal"):
        D.derive(models.matmul(256, 256, 256), H100, time_model="bogus")
    with pytest.raises(ValueError, match="accepted: wgmma"):
        D.derive(models.matmul(256, 256, 256), H100, mma="mfma")
