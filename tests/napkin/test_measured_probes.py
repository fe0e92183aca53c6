"""Issue 36's probes measured on the H100 (notes/napkin/runs/): why a one-block-a-row Hadamard kernel (Dao's
fast-hadamard-transform's launch) runs at 29% of copy at n = 128, and the 192 x 256 GEMM tile as three 64-row
pieces; each figure read from the committed run, the napkin's prediction beside it."""
import json
from pathlib import Path

import pytest

from tilecore.napkin import models, validate
from tilecore.napkin.engine import group, relabel, stream
from tilecore.napkin.errors import CapacityError

RUNS = Path(__file__).resolve().parents[2] / "notes" / "napkin" / "runs"
GEOMETRY = RUNS / "hh_geom_s40a_run2_session40_h100_napkin_launch_geometry.json"
TILE192 = RUNS / "hh_tile192_s40a_run2_session40_h100_napkin_tile192.json"
# Dao's kernel's share of the copy bandwidth on the lent H100 (shared/anchors.md, 2026-11-22; 2^28 elements)
DAO_OF_COPY = {128: 0.29, 256: 0.57, 512: 1.00}


def rows(path):
    return {r["name"]: r for r in json.loads(path.read_text())["rows"]}


def test_an_sm_starts_a_block_every_80_ns():
    # grids of blocks that do nothing: 2^19-2^21 blocks, 1 or 4 warps, the same time a block an SM
    empty = [r for name, r in rows(GEOMETRY).items() if name.startswith("nothing")]
    assert len(empty) == 6
    for r in empty:
        assert r["ns_per_block_per_sm"] == pytest.approx(validate.BLOCK_TURNOVER_S * 1e9, rel=0.02)


def test_one_block_a_row_is_bound_by_the_block_turnover_below_n_512():
    gpu = validate.lab_gpu()
    for name, r in rows(GEOMETRY).items():
        if not name.startswith("dao-geom"):
            continue
        assert r["pass"]  # every element copied bit for bit
        n = r["n"]
        t, bound = validate.one_block_a_row_time(2**28 // n, n, "bf16", gpu)
        assert t * 1e3 == pytest.approx(r["probe_ms"], rel=0.02)
        assert (bound == "block turnover") == (n < 512)
        if n in DAO_OF_COPY:  # the measured copy of the same run over the model's time: Dao's figures
            assert r["copy_ms"] / (t * 1e3) == pytest.approx(DAO_OF_COPY[n], abs=0.02)
            assert r["of_copy"] == pytest.approx(DAO_OF_COPY[n], abs=0.02)


def test_more_rows_a_block_reach_the_copy():
    # the same bytes in fewer blocks: 2 rows of 128 a block run as 1 of 256, 4 at the copy's rate
    r = rows(GEOMETRY)
    assert r["n128 rows2"]["probe_ms"] == pytest.approx(r["dao-geom n256"]["probe_ms"], rel=0.02)
    assert r["n128 rows4"]["of_copy"] > 0.85 and r["n256 rows2"]["of_copy"] > 0.95


def _gemm(bm, bn, stages, **kw):
    return relabel(models.matmul(8064, 8192, 8192), validate.lab_gpu(),
                   {"m": group(bm), "n": group(bn), "k": stream(64)}, warpgroups=bm // 64 if bm == 192 else 2,
                   stages=stages, split_axis="m", **kw)


def test_the_192x256_tile_measured():
    # three 64-row pieces, three tl.dot a K step, C stored from registers: the fastest tl tile of the run
    r = rows(TILE192)
    timed = {name[5:]: v for name, v in r.items() if name.startswith("time ")}
    assert all(v["pass"] for name, v in r.items() if name.startswith("check "))
    best = max((v["tflops"], name) for name, v in timed.items() if name != "cuBLAS")
    assert best[1] == "192x256x64 s3 (3 pieces)"
    assert timed["192x256x64 s3 (3 pieces)"]["tflops"] > 1.05 * timed["128x256x64 s3 (plain)"]["tflops"]
    assert timed["192x256x64 s3 (3 pieces)"]["of_cublas"] > 0.9
    # the napkin staged C whole in shared memory: 264 KiB at 3 stages, refused; stored from registers 168 KiB
    with pytest.raises(CapacityError, match="264.0 KiB"):
        _gemm(192, 256, 3)
    predicted = _gemm(192, 256, 3, stage_output=False)
    assert predicted.bound == "tensor"
    assert predicted.tflops / timed["192x256x64 s3 (3 pieces)"]["tflops"] == pytest.approx(1.05, abs=0.02)
    # what it lacks: it puts 128 x 256 (tensor-bound, 705) above 192 x 256 (685), measured the other way round
    assert _gemm(128, 256, 3, stage_output=False).tflops > predicted.tflops


def test_stage_output_only_drops_the_output_tile():
    staged, unstaged = _gemm(128, 256, 3), _gemm(128, 256, 3, stage_output=False)
    assert staged.time == unstaged.time and staged.H == unstaged.H
    _gemm(128, 256, 4, stage_output=False)  # 192 KiB of stages, as the tl kernel ran it
    with pytest.raises(CapacityError):
        _gemm(128, 256, 4)
