"""Hedgehog's lean eager path (issue 31's host time): linear_attention(feature_map="hedgehog") keyed on
its tensors and weights (op.KEYED_HEDGEHOG) and the core's backward planned and launched by key
(op.KEYED_BACKWARD). Interpreter, CPU tensors keyed through a stand-in signature (the real one keys CUDA tensors
only): the same bits as the shipped path, and a key's later calls run no checks and no plans and launch every
kernel by a key."""
import pytest
import torch
from triton.runtime.interpreter import InterpretedFunction

from host_testing import plain_signature as _signature
from tilecore.ops.linear_attention import linear_attention
from tilecore.ops.linear_attention import op as la_op
from tilecore.tiles import eager
from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.launch import CachedLaunch
from tilecore.tiles.switches import patched

B, N, H, DK, F, DV = 1, 40, 2, 16, 8, 16


@pytest.fixture
def keyed_cpu(monkeypatch):
    """CPU calls keyed as CUDA calls are (the op's and the backward key's signature), caches empty."""
    monkeypatch.setattr(la_op, "signature", _signature)
    monkeypatch.setattr(eager, "signature", _signature)
    for cache in (la_op._CHECKED, la_op._PLANS, la_op._BACKWARD_PLANS, la_op._MAP_BWD_BLOCKS, la_op._MAP_RECIPES):
        cache.clear()


def _inputs(seed=0, pair=False):
    torch.manual_seed(seed)
    q, k = torch.randn(B, N, H, DK, dtype=torch.float16), torch.randn(B, N, H, DK, dtype=torch.float16)
    v = torch.randn(B, N, H, DV, dtype=torch.float16)
    w = [torch.randn(H, DK, F) * DK ** -0.5 for _ in range(2 if pair else 1)]
    return q, k, v, w, torch.randn(B, N, H, DV, dtype=torch.float16)


def _call(q, k, v, w, do, grad=True):
    """o and the gradients of q, k, v and each weight (fresh leaves each call)."""
    q, k, v = (t.clone().requires_grad_(grad) for t in (q, k, v))
    w = [t.clone().requires_grad_(grad) for t in w]
    o = linear_attention(q, k, v, feature_map="hedgehog", feature_weights=w[0] if len(w) == 1 else tuple(w))
    if not grad:
        return [o]
    o.backward(do)
    return [o.detach(), q.grad, k.grad, v.grad, *(t.grad for t in w)]


@pytest.mark.parametrize("pair,recipes", [(False, True), (True, True), (False, False)])
def test_keyed_hedgehog_gives_the_shipped_bits(keyed_cpu, pair, recipes):
    """Calls 1..3 of a key, recording a gradient and not, with both switches on (the maps' recipes on and off:
    OP_RECIPES): the output and every gradient (q, k, v, the weights) bit for bit the shipped path's; the keyed
    calls filled the caches they say."""
    args = _inputs(1, pair)
    with patched(la_op, KEYED_HEDGEHOG=False, KEYED_BACKWARD=False):
        shipped, shipped_plain = _call(*args), _call(*args, grad=False)
        assert len(la_op._CHECKED) == 0 and len(la_op._BACKWARD_PLANS) == 0
    with patched(la_op, KEYED_HEDGEHOG=True, KEYED_BACKWARD=True), patched(tiles_launch, OP_RECIPES=recipes):
        for _ in range(3):
            lean = _call(*args)
            assert all(torch.equal(a, b) for a, b in zip(shipped, lean, strict=True))
            assert torch.equal(_call(*args, grad=False)[0], shipped_plain[0])
    assert len(la_op._CHECKED) == 1  # (recording a gradient or not: one key, the checks' result the same)
    assert len(la_op._BACKWARD_PLANS) == 1 and len(la_op._MAP_BWD_BLOCKS) == 2  # (the q map's and the k map's)
    # each map's forward and backward launch kept as a _MapLaunch (OP_RECIPES), which calls 2..3 went through
    assert len(la_op._MAP_RECIPES) == (4 if recipes else 0)
    assert all(entry[0] for entry in la_op._MAP_RECIPES._data.values())


def test_keyed_hedgehog_later_calls_check_plan_and_launch_nothing_unkeyed(keyed_cpu, monkeypatch):
    """A key's second call (forward and backward): no argument checks, no plan, and each of its 8 launches (two
    maps, the forward, the dQ and two dK/dV kernels, the two maps' backward) through a CachedLaunch by a key; the
    shipped path launches all 8 unkeyed (7 by kernel[grid], the forward by CachedLaunch without a key). The maps'
    four launches go through their kept _MapLaunch."""
    seen = {"checks": 0, "plans": 0, "keyed": 0, "plain": 0, "map recipes": 0}
    inside = []
    check_qkv, plan, run, jit_run = la_op._check_qkv, la_op.plan, CachedLaunch.run, InterpretedFunction.run

    def counting_run(self, key, grid, args, kwargs):
        seen["keyed" if key is not None else "plain"] += 1
        inside.append(1)
        try:
            return run(self, key, grid, args, kwargs)
        finally:
            inside.pop()

    def counting_jit(self, *args, **kwargs):
        if not inside:
            seen["plain"] += 1
        return jit_run(self, *args, **kwargs)

    monkeypatch.setattr(la_op, "_check_qkv", lambda *a: seen.__setitem__("checks", seen["checks"] + 1) or
                        check_qkv(*a))
    monkeypatch.setattr(la_op, "plan", lambda *a: seen.__setitem__("plans", seen["plans"] + 1) or plan(*a))
    for name in ("forward", "backward"):
        kept = getattr(la_op._MapLaunch, name)
        monkeypatch.setattr(la_op._MapLaunch, name, lambda self, *a, kept=kept: seen.__setitem__(
            "map recipes", seen["map recipes"] + 1) or kept(self, *a))
    monkeypatch.setattr(CachedLaunch, "run", counting_run)
    monkeypatch.setattr(InterpretedFunction, "run", counting_jit)
    args = _inputs(2)
    for on, expected in ((False, {"checks": 1, "plans": 2, "keyed": 0, "plain": 8, "map recipes": 0}),
                         (True, {"checks": 0, "plans": 0, "keyed": 8, "plain": 0, "map recipes": 4})):
        with patched(la_op, KEYED_HEDGEHOG=on, KEYED_BACKWARD=on):
            _call(*args)  # (a key's first call: checks and plans)
            seen.update(dict.fromkeys(seen, 0))
            _call(*args)
        assert seen == expected, (on, seen)


def test_keyed_hedgehog_still_checks_new_weights(keyed_cpu):
    """The weights are part of the key: after keyed calls, weights of another shape or device type are checked
    (and refused) as on the shipped path."""
    q, k, v, w, do = _inputs(3)
    with patched(la_op, KEYED_HEDGEHOG=True, KEYED_BACKWARD=True):
        _call(q, k, v, w, do)
        _call(q, k, v, w, do)
        with pytest.raises(ValueError, match="feature_weights must be"):
            _call(q, k, v, [torch.randn(H, DK + 1, F)], do)
        with pytest.raises(TypeError, match="feature_weights"):
            linear_attention(q, k, v, feature_map="hedgehog", feature_weights=[w[0], None])


@pytest.mark.parametrize("decay,feature_map,hqk", [(None, None, H), ("scalar", None, H), ("channel", None, H),
                                                   ("scalar", "based", H), (None, None, 1)])
def test_keyed_backward_gives_the_shipped_bits(keyed_cpu, decay, feature_map, hqk):
    """KEYED_BACKWARD alone on linear attention (no decay, a scalar decay with an initial and a final state, a
    per-channel decay, Based with a scalar decay, grouped q/k heads): calls 1..2 of a key give the shipped path's
    gradients bit for bit, and the key's plans are kept once."""
    torch.manual_seed(4)
    dk = 4 if feature_map == "based" else DK
    q, k = torch.randn(B, N, hqk, dk, dtype=torch.float16), torch.randn(B, N, hqk, dk, dtype=torch.float16)
    v = torch.randn(B, N, H, DV, dtype=torch.float16)
    g = None if decay is None else -torch.rand(B, N, H, *((dk,) if decay == "channel" else ())) * 0.2
    rows = 1 + dk + dk * dk if feature_map == "based" else dk
    h0 = torch.randn(B, H, rows, DV) if decay == "scalar" else None
    do, dht = torch.randn_like(v), torch.randn(B, H, rows, DV)

    def call():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        extra = {n: t.clone().requires_grad_() for n, t in (("decay", g), ("initial_state", h0)) if t is not None}
        out = linear_attention(*leaves, **extra, return_final_state=h0 is not None, feature_map=feature_map)
        if h0 is not None:
            torch.autograd.backward(out, [do, dht])
        else:
            out.backward(do)
        return [t.grad for t in leaves] + [t.grad for t in extra.values()]

    with patched(la_op, KEYED_BACKWARD=False):
        shipped = call()
    assert len(la_op._BACKWARD_PLANS) == 0
    with patched(la_op, KEYED_BACKWARD=True):
        for _ in range(2):
            assert all(torch.equal(a, b) for a, b in zip(shipped, call(), strict=True))
    assert len(la_op._BACKWARD_PLANS) == 1
