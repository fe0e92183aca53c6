"""The napkin's rotary model (tilecore.napkin.rotary, issue 37): apply_rotary against the committed H100 run,
and the in-kernel rotary forward's overhead terms."""
import json
import math

import pytest

from tilecore.napkin import H100, rotary, validate


def test_standalone_against_the_session24_run():
    # apply_rotary measured at 98.2-99.1% of copy (B16 N4096 H32 D128 bf16); the model, calibrated with
    # that run's copy of the same bytes, predicts x read and written plus the cos / sin rows
    run = json.loads(validate.ROTARY_RUN.read_text())
    rows = [r for r in run["time"] if r["case"].startswith("rotary")]
    assert len(rows) == 4
    for r in rows:
        nbytes = 2 * 16 * 4096 * 32 * 128 * 2
        gpu = H100.calibrated(copy_bytes_per_s=nbytes / (r["copy_ms"] * 1e-3))
        t = rotary.standalone_time(16, 4096, 32, 128, gpu=gpu)
        assert r["ms"] * 1e-3 / t == pytest.approx(1.0, abs=0.02), r["case"]
        assert 0.97 < r["copy_ms"] * 1e-3 / t < 1.0  # the tables' reads: a little more than a copy


def test_fused_terms_follow_the_kernel_structure():
    p = rotary.fused_overhead(16, 16, 4096, 128, False)
    blk = rotary.FORWARD_BLOCKS[128]
    pairs = blk["block_n"] * 64
    # the transform warpgroup's issue and shared-memory clocks a block, as counted
    assert p.per_block["turn issue"] == pytest.approx(pairs * rotary.TURN_OPS_PER_PAIR / 128)
    assert p.per_block["turn smem"] == pytest.approx(2 * pairs * 2 * 2 / 128)
    # at the engine's step (thousands of clocks) the K block's turn hides behind the MMAs: only Q's turn,
    # once a tile and before its first MMA, is exposed
    assert p.per_block["step"] > p.per_block["turn smem"] + p.per_block["wgmma smem"]
    assert set(k for k, v in p.terms.items() if v > 0) == {"Q: turned once a tile"}
    tiles = 16 * 16 * math.ceil(4096 / 128)
    q = (max(64 * 64 * rotary.TURN_OPS_PER_PAIR / 128, 2 * 64 * 64 * 4 / 128) + rotary.L2_LATENCY_S * H100.clock_hz)
    assert p.terms["Q: turned once a tile"] == pytest.approx(q * tiles / H100.sms / H100.clock_hz)
    assert p.fraction == pytest.approx(p.seconds / p.base_s)


def test_fused_overhead_grows_where_the_step_shrinks():
    full = rotary.fused_overhead(16, 16, 4096, 128, False)
    causal = rotary.fused_overhead(16, 16, 4096, 128, True)
    half = rotary.fused_overhead(16, 16, 4096, 128, False, rotary_dim=64)
    assert causal.fraction > full.fraction  # the same Q turns over half the MMAs
    assert half.seconds < full.seconds
    # a step shorter than the turn (a forward 20x faster than the engine's): the K terms are exposed
    fast = rotary.fused_overhead(16, 16, 4096, 128, False, base_s=full.base_s / 20)
    assert fast.terms["K: shared memory"] > 0 and fast.terms["K: stage latency"] > 0


def test_fused_table_prints_the_measured_overhead_beside():
    text = rotary.fused_table({"d128": {"base_ms": 2.0, "rotary_ms": 2.04}})
    row = next(ln for ln in text.splitlines() if ln.startswith("| d128 |"))
    assert "| 2.000 |" in row and "+2.00%" in row
    pred = rotary.fused_overhead(16, 16, 4096, 128, False, base_s=2.0e-3)
    assert f"{100 * pred.fraction:+.2f}%" in row
    assert "(engine)" in next(ln for ln in text.splitlines() if ln.startswith("| d64 |"))
