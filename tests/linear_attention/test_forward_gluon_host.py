"""The Gluon forward's host side on the CPU: the chunk-local cumulative log decay and beta it reads (head-major, log2
units, padded to whole chunks) by the one-pass prep kernel (kernels_forward.chunk_heads_kernel, interpreted) against
its torch reference and the plain definition (the floor, NaN kept, a partial last chunk), the descriptors' checks
(launch_args) and which inputs it takes (``fits``). The kernel itself runs only on the GPU:
experiments/linear_attention/gpu_forward.py and gpu_mamba.py check it there against the float64 recurrence."""
import pytest
import torch

from tilecore.ops.linear_attention import gluon_forward as gf


def test_the_torch_reference_is_the_clamped_sum_within_each_chunk():
    torch.manual_seed(0)
    B, N, H, T = 2, gf.BT_GLUON + 6, 3, gf.BT_GLUON  # a partial last chunk
    g = -torch.rand(B, N, H)
    g[0, 5, 1] = float("-inf")  # a reset: the floor
    g[1, 3, 0] = float("nan")  # NaN propagates within its chunk
    G = gf.chunk_cumulative_heads(g, T)
    floored = g.clamp_min(gf.LOG_DECAY_FLOOR_HOST) * gf.LOG2E
    want = torch.cat([floored[:, :T].cumsum(1), floored[:, T:].cumsum(1)], 1).transpose(1, 2)
    assert G.shape == (B, H, 2 * T) and G.dtype == torch.float32 and G.is_contiguous()
    assert torch.equal(G[:, :, :N].isnan(), want.isnan()) and G.isnan()[1, 0, 3:T].all()
    torch.testing.assert_close(G[:, :, :N].nan_to_num(), want.nan_to_num())
    assert not G[1, 0, T:].isnan().any()  # the next chunk starts afresh
    assert torch.equal(G[:, :, N:], G[:, :, N - 1:N].expand(B, H, 2 * T - N))  # the pad: the last token's G


@pytest.mark.parametrize("N,H", [(1, 3), (77, 5), (130, 80)])
def test_prep_kernel_matches_torch(N, H):
    torch.manual_seed(N)
    g = -torch.rand(2, N, H) * 0.5
    g[0, N // 2, 1 % H] = float("-inf")  # a reset: the floor
    g[1, 0, 2 % H] = float("nan")  # NaN stays (its chunk's later sums too)
    g[1, -1, 0] = -1e30
    beta = torch.rand(2, N, H)
    G, beta_h = gf.chunk_heads_prep(g, beta, gf.BT_GLUON)
    want = gf.chunk_cumulative_heads(g, gf.BT_GLUON)
    n_pad = -(-N // gf.BT_GLUON) * gf.BT_GLUON
    assert G.shape == (2, H, n_pad) and G.is_contiguous() and G.dtype == torch.float32
    torch.testing.assert_close(G, want, equal_nan=True, rtol=1e-6, atol=1e-4)
    assert torch.equal(beta_h, gf.chunk_heads(beta, gf.BT_GLUON)) and (beta_h[:, :, N:] == 0).all()
    last = want.view(2, H, -1, gf.BT_GLUON)[:, :, -1, -1]
    torch.testing.assert_close(last, want[:, :, N - 1], equal_nan=True)
    # any strides (a transposed tensor's view), beta left out
    G2, none = gf.chunk_heads_prep(g.transpose(1, 2).contiguous().transpose(1, 2), None, gf.BT_GLUON)
    assert none is None and torch.equal(G2.isnan(), G.isnan())
    torch.testing.assert_close(G2, G, equal_nan=True)


def test_launch_args_take_only_the_head_major_g_and_beta():
    bf = torch.bfloat16
    q = torch.empty(1, 100, 2, 128, dtype=bf)
    v = torch.empty(1, 100, 2, 128, dtype=bf)
    o = torch.empty_like(v)
    with pytest.raises(ValueError, match="chunk_heads_prep"):
        gf.launch_args(q, q, v, torch.empty(1, 100, 2), None, None, None, None, o, None, 1.0)
    G = torch.empty(1, 2, 128)
    with pytest.raises(ValueError, match="chunk_heads_prep"):
        gf.launch_args(q, q, v, G, torch.empty(1, 100, 2), None, None, None, o, None, 1.0)
    with pytest.raises(ValueError, match="with its G"):
        gf.launch_args(q, q, v, None, G, None, None, None, o, None, 1.0)
    with pytest.raises(ValueError, match="chunk_scores"):  # (Mamba-2's step reads the chunks' scores)
        gf.launch_args(q, q, v, G, torch.empty(1, 2, 128), None, None, None, o, None, 1.0)
    with pytest.raises(ValueError, match="chunk_scores"):  # (in q's dtype)
        gf.launch_args(q, q, v, G, torch.empty(1, 2, 128), None, None, None, o, None, 1.0,
                       cb=torch.empty(1, 2, 128, gf.BT_GLUON))
    _, args, _ = gf.launch_args(q, q, v, G, torch.empty(1, 2, 128), None, None, None, o, None, 1.0,
                                cb=torch.empty(1, 2, 128, gf.BT_GLUON, dtype=bf))
    assert args["DECAY"] and args["HAS_BETA"] and not args["HAS_Z"]
    assert args["g_desc"].block_shape == [1, 1, gf.BT_GLUON] and args["b_desc"].block_shape == [1, 1, gf.BT_GLUON]


def test_fits_says_what_it_does_not_take():
    bf = torch.bfloat16
    q = torch.empty(1, 8, 2, 128, dtype=bf)
    v = torch.empty(1, 8, 2, 128, dtype=bf)
    g = torch.empty(1, 8, 2)
    assert "CUDA" in gf.fits(q, q, v, None, 0)  # a CPU tensor: the tl kernels
    assert "CUDA" in gf.fits(q, q, v, g, 0, g, torch.empty_like(v))  # Mamba-2's inputs: only the device turns away
    assert "feature map" in gf.fits(q, q, v, None, 1)
    assert "per-channel" in gf.fits(q, q, v, torch.empty(1, 8, 2, 128), 0)
    assert "beta without a decay" in gf.fits(q, q, v, None, 0, g)
    assert "z without beta" in gf.fits(q, q, v, g, 0, None, torch.empty_like(v))
    assert "D or a gate z without beta" in gf.fits(q, q, v, g, 0, None, None, torch.empty(2, 128))
