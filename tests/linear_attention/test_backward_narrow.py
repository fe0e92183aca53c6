"""configs.BWD_SPLIT_NARROW (session 35, Hedgehog's backward): the split backward's key / value / dQ key blocks where
both head dims are <= configs.BWD_SPLIT_NARROW_DIM, so a head's features and values at d64 are two programs a kernel
(as d128's are from blocks of 64) instead of one. launch.backward_plan takes them (clipped to the padded head dims);
the public op's gradients with them are the float64 recurrence's (Hedgehog's map under autograd, no decay and a
scalar decay, a ragged last chunk) and the shipped blocks' within float32 noise."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.linear_attention import configs, launch, linear_attention
from tilecore.ops.linear_attention.plan import IDENTITY, tl_plan
from tilecore.tiles.switches import patched

from la_testing import F32, make, reference

NARROW = dict(BKB=32, BV=32, BKQ=32)


def _plan(dk, dv, narrow):
    q, v = torch.empty(1, 8, 2, dk), torch.empty(1, 8, 2, dv)
    with patched(configs, BWD_SPLIT_NARROW=narrow):
        return launch.backward_plan(tl_plan(q, v, None, IDENTITY), q, v, None, IDENTITY).config


def test_the_plan_takes_the_narrow_blocks_up_to_the_dim():
    base = _plan(64, 64, None)
    assert (base["split_BKB"], base["split_BV"], base["dq_BKQ"]) == (64, 64, 64)  # one program a head
    cfg = _plan(64, 64, NARROW)
    assert (cfg["split_BKB"], cfg["split_BV"], cfg["dq_BKQ"]) == (32, 32, 32)
    cfg = _plan(16, 64, NARROW)  # clipped to the padded key dim
    assert (cfg["split_BKB"], cfg["split_BV"], cfg["dq_BKQ"]) == (16, 32, 16)
    wide = _plan(128, 64, NARROW)  # past BWD_SPLIT_NARROW_DIM: the shipped blocks
    assert (wide["split_BKB"], wide["split_BV"], wide["dq_BKQ"]) == (64, 64, 64)


@pytest.mark.parametrize("decay", [None, "scalar"])
def test_hedgehog_gradients_with_narrow_blocks(monkeypatch, decay):
    B, N, H, Dk, Fh, Dv = 1, 45, 2, 16, 16, 32  # features 2 x 16 = 32: two key blocks of 16, two value blocks
    torch.manual_seed(3)
    q, k, v, g, _ = make(B, N, H, H, Dk, Dv, dtype=F32, decay=decay)
    w = (torch.randn(H, Dk, Fh) * 0.3).requires_grad_()
    dout = torch.randn(B, N, H, Dv)
    grads = {}
    for name, narrow in (("shipped", None), ("narrow", dict(BKB=16, BV=16, BKQ=16))):
        monkeypatch.setattr(configs, "BWD_SPLIT_NARROW", narrow)
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)] + [w]
        o = linear_attention(*leaves[:3], feature_map="hedgehog", feature_weights=w, decay=g, chunk_size=16)
        grads[name] = torch.autograd.grad((o * dout).sum(), leaves)
    ref, _, ref_grads = reference(q, k, v, g, None, feature_map="hedgehog", weights=w, dout=dout)
    for got, shipped, r in zip(grads["narrow"], grads["shipped"], ref_grads[:3] + ref_grads[-1:]):
        assert accuracy.rel_rms(got, r) < 2e-5
        assert accuracy.rel_rms(got, shipped) < 1e-5
