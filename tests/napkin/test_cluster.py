"""Thread-block clusters and TMA multicast (issue 36's paper coverage): relabel's ``cluster`` option."""
import dataclasses

import pytest

from tilecore.napkin import H100, models
from tilecore.napkin.engine import MAX_CLUSTER, group, relabel, stream

PARTS = {"m": group(128), "n": group(128), "k": stream(64)}


def _gemm(gpu=H100, cluster=None):
    return relabel(models.matmul(8192, 8192, 8192), gpu, PARTS, warpgroups=2, stages=3, split_axis="m",
                   cluster=cluster)


def test_multicast_divides_the_l2_bytes_of_the_arrays_that_lack_the_axis():
    plain, by_m, by_mn = _gemm(), _gemm(cluster={"m": 2}), _gemm(cluster={"m": 2, "n": 2})
    # A (m, k) and B (k, n) each bring K N 2 bytes a block row (column) into shared memory, 64 times; a cluster
    # of two along m loads B's tile once for both blocks (B lacks m): half of B's bytes; 2 x 2 halves A's too.
    # C's stores (M N 2 bytes) are the blocks' own
    operand = 8192 * 8192 * 2 * (8192 // 128)
    assert plain.H["L2"] == pytest.approx(2 * operand + 8192 * 8192 * 2)
    assert by_m.H["L2"] == pytest.approx(plain.H["L2"] - operand / 2)
    assert by_mn.H["L2"] == pytest.approx(plain.H["L2"] - operand)
    assert by_m.H["HBM"] == plain.H["HBM"] and by_m.H["SMEM"] == plain.H["SMEM"]   # L2 shared them already
    assert by_m.cluster == {"m": 2} and plain.cluster == {}


def test_the_issues_l2_bound_claim_and_what_a_cluster_would_do():
    # with the 10 TB/s L2 estimate the issue's 128 x 128 tiles at 8192^3 were L2-bound near 635 TFLOP/s; a
    # cluster of two along m makes them 1.33x faster there and 2 x 2 tensor-bound: a claim to measure where a
    # kernel runs clusters (none of tilecore's does)
    est = dataclasses.replace(H100, levels=(H100.levels[0], dataclasses.replace(H100.levels[1], bandwidth=10e12))
                              + H100.levels[2:])
    plain, by_m, by_mn = _gemm(est), _gemm(est, {"m": 2}), _gemm(est, {"m": 2, "n": 2})
    assert plain.bound.startswith("L2") and plain.tflops == pytest.approx(635, rel=0.03)
    assert by_m.tflops == pytest.approx(plain.tflops * 4 / 3, rel=0.01) and by_m.bound.startswith("L2")
    assert by_mn.bound == "tensor"


@pytest.mark.parametrize("cluster, match", [({"k": 2}, "grouped axis"), ({"m": 3}, "power of two"),
                                            ({"m": 8, "n": 4}, "at most")])
def test_cluster_errors(cluster, match):
    assert MAX_CLUSTER == 16
    with pytest.raises(ValueError, match=match):
        _gemm(cluster=cluster)
