"""The napkin ranks GEMM tile configurations (a Triton perf_model hook too) and folds measured
constants into the presets."""
import dataclasses
import json
import math
from pathlib import Path

import pytest

from tilecore.napkin import validate
from tilecore.napkin.engine import gemm_perf_model, rank_gemm_configs
from tilecore.napkin.hardware import H100, from_constants_json


def test_shipped_gemm_tile_is_in_the_napkins_top_k_at_8192_cubed():
    shipped = validate.gemm_configs()["bf16"]      # tilecore/ops/gemm/configs.py GLUON_BF16
    top = rank_gemm_configs(8192, 8192, 8192, "bf16", "h100", top_k=3)
    assert (shipped["block"], shipped["stages"]) in [(c.block, c.stages) for c in top]
    ranked = rank_gemm_configs(8192, 8192, 8192, "bf16", "h100")
    assert [c.time for c in ranked] == sorted(c.time for c in ranked)
    assert all(c.derivation.M["SMEM"] <= 227 * 1024 for c in ranked)
    # the claim came from the 10 TB/s L2 estimate: 128 x 128 tiles L2-bound near 635 TFLOP/s;
    # at the SMs' measured L2 intake (13.96 TB/s) they are tensor-bound (notes/napkin: the claim's cause is refuted)
    estimate = dataclasses.replace(H100, levels=(H100.levels[0], dataclasses.replace(H100.levels[1], bandwidth=10e12))
                                   + H100.levels[2:])
    old = next(c for c in rank_gemm_configs(8192, 8192, 8192, "bf16", estimate) if c.block == (128, 128, 64))
    assert old.derivation.bound.startswith("L2") and old.tflops == pytest.approx(635, rel=0.03)
    now = next(c for c in ranked if c.block == (128, 128, 64))
    assert now.tflops > 1.05 * old.tflops and now.time > top[0].time


def test_perf_model_hook_orders_triton_configs():
    model = gemm_perf_model("h100", "bf16")
    big = model(M=8192, N=8192, K=8192, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=3, num_warps=8)
    small = model(M=8192, N=8192, K=8192, BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, num_stages=3,
                  num_warps=4)
    huge = model(M=8192, N=8192, K=8192, BLOCK_M=512, BLOCK_N=512, BLOCK_K=128, num_stages=4, num_warps=8)
    assert 0 < big < small and math.isinf(huge)
    same = next(c for c in rank_gemm_configs(8192, 8192, 8192) if (c.block, c.stages, c.warpgroups) == ((128, 256, 64), 3, 2))
    assert big == pytest.approx(same.time * 1e3)   # ms
    with pytest.raises(ValueError, match="BLOCK_M"):
        model(M=1, N=1, K=1)


def test_measured_constants_fold_into_the_preset(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"source": "gpu_constants.py on an H100 (test)", "constants": {
        "hbm_bytes_per_s": 3.0e12, "l2_bytes_per_s": 7.5e12, "sfu_exp2_per_s": 3.5e12, "launch_s": 5e-6,
        "graph_launch_s": 2e-6, "tile_latency_s": 0.6e-6, "matmul_flops": {"bf16": 750e12}}}))
    g = from_constants_json(path)
    assert g.level("HBM").bandwidth == 3.0e12 and g.level("L2").bandwidth == 7.5e12
    assert g.rate("sfu", "fp32") == 3.5e12 and g.rate("tensor", "bf16") == 750e12
    assert (g.launch_s, g.graph_launch_s, g.tile_latency_s) == (5e-6, 2e-6, 0.6e-6)
    assert "gpu_constants.py on an H100 (test)" in g.level("L2").source
    assert g.rate("tensor", "fp8") == pytest.approx(H100.rate("tensor", "fp8") * 750 / 989.4, rel=1e-3)
    # the launches as the preset's are meant: an empty kernel's, where the run timed one (session 26's H100 run)
    s26 = H100.with_constants(json.loads((Path(__file__).resolve().parents[2] / "notes" / "napkin" / "runs"
                                          / "napkin_gpu_constants_session26_h100.json").read_text()))
    assert s26.launch_s == pytest.approx(H100.launch_s, abs=0.1e-6)
    assert s26.graph_launch_s == pytest.approx(H100.graph_launch_s, abs=0.1e-6)
    partial = H100.with_constants({"constants": {"l2_bytes_per_s": 6e12}})
    assert partial.level("HBM").bandwidth == H100.level("HBM").bandwidth and partial.level("L2").bandwidth == 6e12


@pytest.mark.parametrize("d,shipped", [(128, ((128, 128, 128), 2, 2)), (64, ((192, 128, 64), 3, 3))])
def test_shipped_attention_forward_tile_is_in_the_top_k(d, shipped):
    # tilecore/ops/attention/configs.py: D128 two consumers of 64 rows, 128 keys, 2 stages; D64 from
    # N 2048 three consumers (192 rows), 3 stages. With the key-step term (engine.ATTENTION_STEP_S) the D128
    # tile is the napkin's first; at D64 only 256- and 176-key steps, which the Gluon kernel does not take, rank
    # above it, and among the tiles it takes (64-row consumers, 64 or 128 keys) it ties the first (2 or 3 stages)
    from tilecore.napkin.engine import rank_attention_configs

    # (a 192-row tile computes whole tiles: 22 of them, 4224 rows, for N 4096, which costs it 3% against 128-row
    # tiles; three consumers fit the kernel's shared memory at D64 only: plan.napkin_forward_configs)
    ranked = rank_attention_configs(16, 16, 4096, d)
    top = [(c.block, c.warpgroups, c.stages) for c in ranked[:4]]
    assert shipped in top
    mine = next(c for c in ranked if (c.block, c.warpgroups, c.stages) == shipped)
    assert mine.time <= 1.05 * ranked[0].time
    taken = [c for c in ranked if c.block[0] == 64 * c.warpgroups and c.block[1] in (64, 128)
             and (c.warpgroups == 2 or d <= 64)]
    assert mine.time == taken[0].time
