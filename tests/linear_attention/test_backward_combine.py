"""The backward's combine kernel (kernels_backward.la_bwd_combine_kernel) against the torch combine it
replaces (launch.backward_combine), on the same dQ and dK/dV kernel buffers: partial sums over several
key and value blocks, the diagonal's factor added back, beta's gradient, the log decay's gradient with
its reverse sum along the sequence and the final state's term, grouped q/k heads; and every output
written (outputs are fresh buffers: a NaN would show an unwritten element)."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.linear_attention import launch
from tilecore.ops.linear_attention.plan import BASED, IDENTITY, tl_plan

from la_testing import F32, make


@pytest.mark.parametrize("decay,beta,group,feature", [
    (None, False, 1, IDENTITY), ("scalar", True, 2, IDENTITY), ("channel", True, 1, IDENTITY),
    (None, False, 1, BASED)])
def test_combine_kernel_matches_torch_combine(decay, beta, group, feature):
    torch.manual_seed(0)
    B, N, H, Dk, Dv = 1, 45, 2, 32 if feature == IDENTITY else 8, 32
    q, k, v, g, s0 = make(B, N, H // group, H, Dk, Dv, dtype=F32, decay=decay, h0=True,
                          feature_map="based" if feature == BASED else None)
    bt = torch.rand(B, N, H) if beta else None
    do, dht = torch.randn(v.shape), torch.randn(s0.shape)
    over = dict(BKQ=16, BKB=16, BVB=16) if feature == IDENTITY else dict(BVB=16)  # several partial sums
    p = tl_plan(q, v, g, feature, 32, **over)
    scale = Dk ** -0.5
    _, ht, o_lin = launch.forward(p, q, k, v, g, bt, None, None, s0, scale, feature, final_state=True,
                                  keep_linear=True)
    buffers = launch.backward_kernels(p, do, q, k, v, g, bt, s0, dht, scale, feature)
    assert buffers[1].shape[0] > 1 or buffers[2].shape[0] > 1
    want = launch.backward_combine(tuple(t if t is None else t.clone() for t in buffers), do, q, k, v, g, bt, o_lin,
                                   ht, dht)
    got = launch.backward_combine_kernel(buffers, q, k, v, g, bt, ht, dht)
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), got, want):
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.isfinite(a).all(), name
            assert accuracy.rel_rms(a, b) < 2e-6, (name, accuracy.rel_rms(a, b))
