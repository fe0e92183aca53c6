"""The linear-attention plan memos (op._PLANS, op._BACKWARD_PLANS: a launch key -> its plan) key on
tiles.switches.generation: a call inside a ``switches.patched`` block that changes a configs table is planned under
that table, and the first call after the block under the restored one, never served a plan made under the other.
CPU tensors keyed as CUDA calls are (host_testing's stand-in signature; the real one keys CUDA tensors only), torch's
chunked path (no interpreter: its plan reads configs.CHUNK like the kernels')."""
import pytest
import torch

from host_testing import plain_signature
from tilecore import accuracy
from tilecore.ops.linear_attention import configs, linear_attention
from tilecore.ops.linear_attention import op as la_op
from tilecore.tiles import eager
from tilecore.tiles.switches import patched


@pytest.fixture
def keyed_cpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(la_op, "signature", plain_signature)
    monkeypatch.setattr(eager, "signature", plain_signature)
    for cache in (la_op._CHECKED, la_op._PLANS, la_op._BACKWARD_PLANS):
        cache.clear()
    yield
    for cache in (la_op._CHECKED, la_op._PLANS, la_op._BACKWARD_PLANS):
        cache.clear()


def _chunks(memo, pick=lambda p: p):
    return sorted(pick(entry[0]).chunk for entry in memo._data.values())


def test_a_patched_table_gets_its_own_plan_and_the_restored_one_its_own(keyed_cpu):
    torch.manual_seed(0)
    q, k = torch.randn(1, 48, 2, 16), torch.randn(1, 48, 2, 16)
    v, do = torch.randn(1, 48, 2, 16), torch.randn(1, 48, 2, 16)
    g = -torch.rand(1, 48, 2, 16) * 0.5  # per-channel log decays

    def call():
        leaves = [t.clone().requires_grad_() for t in (q, k, v, g)]
        o = linear_attention(*leaves[:3], decay=leaves[3])
        o.backward(do)
        return [o.detach()] + [t.grad for t in leaves]

    shipped = configs.CHUNK[2]
    before = call()
    assert _chunks(la_op._PLANS) == [shipped]
    other = 32 if shipped != 32 else 16
    with patched(configs, CHUNK={**configs.CHUNK, 2: other}):
        inside = call()
        assert _chunks(la_op._PLANS) == sorted([shipped, other])  # a plan of its own, not the key's first
        assert other in _chunks(la_op._BACKWARD_PLANS, lambda p: p[0])
    after = call()
    assert _chunks(la_op._PLANS) == sorted([shipped, shipped, other])  # planned again under the restored table
    for a, b, c in zip(before, inside, after):
        assert torch.equal(a, c)
        assert accuracy.rel_rms(b, a) < 1e-5  # another chunk: the same gradients to float32 rounding
