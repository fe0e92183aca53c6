"""The Gluon forward's host side on the CPU: the chunk-local cumulative log decay it reads (the floor,
NaN kept, a partial last chunk) and which inputs it takes (``fits``)."""
import torch

from tilecore.ops.linear_attention.gluon_forward import BT_GLUON, chunk_cumulative, fits


def test_chunk_cumulative_is_the_clamped_sum_within_each_chunk():
    torch.manual_seed(0)
    g = -torch.rand(2, BT_GLUON + 6, 3)  # a partial last chunk
    g[0, 5, 1] = float("-inf")  # a reset: the floor
    g[1, 3, 0] = float("nan")  # NaN propagates within its chunk
    G = chunk_cumulative(g, BT_GLUON)
    floored = g.clamp_min(-100.0)
    want = torch.cat([floored[:, :BT_GLUON].cumsum(1), floored[:, BT_GLUON:].cumsum(1)], 1)
    assert G.shape == g.shape and G.dtype == torch.float32
    assert torch.equal(G.isnan(), want.isnan()) and G.isnan()[1, 3:BT_GLUON, 0].all()
    assert torch.allclose(G.nan_to_num(), want.nan_to_num())
    assert not G[1, BT_GLUON:, 0].isnan().any()  # the next chunk starts afresh


def test_fits_says_what_it_does_not_take():
    bf = torch.bfloat16
    q = torch.empty(1, 8, 2, 128, dtype=bf)
    v = torch.empty(1, 8, 2, 128, dtype=bf)
    assert "CUDA" in fits(q, q, v, None, 0)  # a CPU tensor: the tl kernels
    assert "feature map" in fits(q, q, v, None, 1)
    assert "per-channel" in fits(q, q, v, torch.empty(1, 8, 2, 128), 0)
