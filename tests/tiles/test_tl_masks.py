"""tiles.ops' attention masks (the tl twins of tiles.gluon's mask_scores and needs_mask) through the
interpreter, against the rule they share: key j of Nk is masked for query i of N when j >= Nk or,
causal, j > i + Nk - N."""
import pytest
import torch
import triton
import triton.language as tl

from tilecore.tiles import ops


@triton.jit
def _mask_kernel(out_t, out, need, first_query, first_key, N, Nk, Q: tl.constexpr, K: tl.constexpr,
                 CAUSAL: tl.constexpr):
    rq = tl.arange(0, Q)
    rk = tl.arange(0, K)
    s = ops.mask_scores(tl.zeros([Q, K], tl.float32), first_query, first_key, N, Nk, CAUSAL, KEY_AXIS=1)
    tl.store(out + rq[:, None] * K + rk[None, :], s)
    s_t = ops.mask_scores(tl.zeros([K, Q], tl.float32), first_query, first_key, N, Nk, CAUSAL, KEY_AXIS=0)
    tl.store(out_t + rk[:, None] * Q + rq[None, :], s_t)
    tl.store(need, ops.needs_mask(first_query, first_key, K, N, Nk, CAUSAL).to(tl.int32))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("first_query,first_key,n,nk", [
    (0, 0, 16, 16), (16, 0, 64, 64), (0, 16, 64, 64), (32, 16, 40, 60), (0, 48, 20, 60), (16, 32, 100, 40)])
def test_mask_scores_and_needs_mask(causal, first_query, first_key, n, nk):
    Q, K = 16, 32
    out, out_t = torch.full((Q, K), float("nan")), torch.full((K, Q), float("nan"))
    need = torch.full((1,), -1, dtype=torch.int32)
    _mask_kernel[(1,)](out_t, out, need, first_query, first_key, n, nk, Q, K, causal)
    i = first_query + torch.arange(Q)[:, None]
    j = first_key + torch.arange(K)[None, :]
    masked = (j >= nk) | ((j > i + nk - n) if causal else torch.zeros(Q, K, dtype=torch.bool))
    expect = torch.where(masked, float("-inf"), 0.0)
    assert torch.equal(out, expect) and torch.equal(out_t, expect.t())
    # from the block's first query, which sees the fewest keys: whether any score of the block is masked
    assert bool(need.item()) == bool(masked.any())
