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
    # at session 36's measured forward without rotary (3.730 ms: a 3,437-clock step)
    p = rotary.fused_overhead(16, 16, 4096, 128, False, ahead=3, base_s=3.730e-3)
    blk = rotary.FORWARD_BLOCKS[128]
    pairs = blk["block_n"] * 64
    # the transform warpgroup's issue, shared-memory and angle-chain clocks a block, as counted
    assert p.per_block["turn issue"] == pytest.approx(pairs * rotary.TURN_OPS_PER_PAIR / 128)
    assert p.per_block["turn smem"] == pytest.approx(2 * pairs * 2 * 2 / 128)
    chunks = 128 // (1024 // 64)  # 16 rows a chunk at R 64: 8 chunks, 3 in flight
    assert p.per_block["turn's angle chain"] == pytest.approx(chunks * rotary.L2_LATENCY_S * H100.clock_hz / 3)
    # with three chunks of angles in flight the K block's turn keeps pace and hides behind the MMAs: only
    # Q's turn, once a tile and before its first MMA, is exposed
    assert p.per_block["step"] > p.per_block["turn's angle chain"] + H100.tile_latency_s * H100.clock_hz
    assert set(k for k, v in p.terms.items() if v > 0) == {"Q: turned once a tile"}
    tiles = 16 * 16 * math.ceil(4096 / 128)
    q = (max(64 * 64 * rotary.TURN_OPS_PER_PAIR / 128, 2 * 64 * 64 * 4 / 128) + rotary.L2_LATENCY_S * H100.clock_hz)
    assert p.terms["Q: turned once a tile"] == pytest.approx(q * tiles / H100.sms / H100.clock_hz)
    assert p.fraction == pytest.approx(p.seconds / p.base_s)


def test_fused_against_the_session36_run():
    # gpu_rotary_kernel.py's first run (one angle chunk ahead): +63.2% (D128), +61.9% (causal), +40.6%
    # (D64), +35.1% (D64 causal) over the forward without rotary. L2_LATENCY_S was fitted to the D128 row
    # alone; the other three are predicted within 10% of their time (0.91-0.96: under), all by the
    # transform's pace (8 or 4 chunks of angles a block, each an L2 round trip, longer than a step)
    run = json.loads(validate.FUSED_ROTARY_RUN.read_text())
    rows = [r for r in run["timing"] if "variant" not in r]
    assert len(rows) == 4
    for r in rows:
        p = rotary.fused_overhead(r["B"], r["H"], r["N"], r["D"], r["causal"], base_s=r["base_ms"] * 1e-3,
                                  blocks=r["rotary_cfg"])
        assert (p.base_s + p.seconds) * 1e3 / r["rotary_ms"] == pytest.approx(1.0, abs=0.10), r["case"]
        assert max(p.terms, key=p.terms.get) == "K: transform's pace"
        # the prediction to test next: three chunks in flight (gluon_rotary.AHEAD) keep the turn under 3%
        assert rotary.fused_overhead(r["B"], r["H"], r["N"], r["D"], r["causal"], base_s=r["base_ms"] * 1e-3,
                                     blocks=r["rotary_cfg"], ahead=3).fraction < 0.03


def test_fused_overhead_grows_where_the_step_shrinks():
    full = rotary.fused_overhead(16, 16, 4096, 128, False, ahead=3, base_s=3.730e-3)  # session 36's forwards
    causal = rotary.fused_overhead(16, 16, 4096, 128, True, ahead=3, base_s=2.019e-3)
    half = rotary.fused_overhead(16, 16, 4096, 128, False, rotary_dim=64, ahead=3, base_s=3.730e-3)
    assert causal.fraction > full.fraction  # the same Q turns over half the MMAs
    assert half.seconds < full.seconds
    # a step shorter than the turn (a forward 20x faster than the engine's): the K terms are exposed
    fast = rotary.fused_overhead(16, 16, 4096, 128, False, base_s=full.base_s / 20, ahead=3)
    assert fast.terms["K: shared memory"] > 0 and fast.terms["K: transform's pace"] > 0


def test_fused_table_prints_the_measured_overhead_beside():
    text = rotary.fused_table({"d128": {"base_ms": 2.0, "rotary_ms": 2.04}})
    row = next(ln for ln in text.splitlines() if ln.startswith("| d128 |"))
    assert "| 2.000 |" in row and "+2.0%" in row
    pred = rotary.fused_overhead(16, 16, 4096, 128, False, base_s=2.0e-3)
    assert f"{100 * pred.fraction:+.1f}%" in row
    assert "(engine)" in next(ln for ln in text.splitlines() if ln.startswith("| d64 |"))
