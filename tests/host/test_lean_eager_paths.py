"""Session 30's lean eager paths (issue 31's host time): an eager call with nothing to record allocates only what
it returns, and gives the bits of the call that records a gradient (interpreter)."""
import torch

import tilecore
from tilecore import dispatch
from tilecore.ops.norm import launch as norm_launch
from host_testing import plain_signature as _cpu_signature


def test_norm_direct_call_makes_only_y_and_rstd(monkeypatch):
    made = []
    output = norm_launch.output
    monkeypatch.setattr(norm_launch, "output", lambda shape, dtype, device: made.append(shape) or output(
        shape, dtype, device))
    torch.manual_seed(0)
    x, w = torch.randn(5, 48, dtype=torch.float16), torch.randn(48, dtype=torch.float16)
    y = tilecore.layer_norm(x, w, rms=True)
    assert made == [(5, 48), (5,)]  # y and rstd: no empty h, no empty mean
    made.clear()
    xg = x.clone().requires_grad_()
    y_recorded = tilecore.layer_norm(xg, w, rms=True)
    assert len(made) == 4 and y_recorded.grad_fn is not None  # recording: the op's four outputs
    assert torch.equal(y, y_recorded.detach())
    made.clear()
    y_layer, h = tilecore.layer_norm(x, w, torch.randn(48, dtype=torch.float16), residual=torch.randn_like(x),
                                     prenorm=True)
    assert made == [(5, 48), (5, 48), (5,), (5,)] and h.shape == x.shape  # prenorm keeps h; LayerNorm its mean


def test_plain_eager_is_eager_modes_direct():
    x = torch.randn(3)
    assert dispatch.plain_eager(x, None) and dispatch.eager_mode(x, None) == "direct"
    xg = torch.randn(3, requires_grad=True)
    assert not dispatch.plain_eager(xg) and dispatch.eager_mode(xg) == "autograd"
    with torch.no_grad():
        assert dispatch.plain_eager(xg)
    assert not dispatch.plain_eager(torch.empty(2, device="meta"))


def test_signature_keys_scalars_and_refuses_what_it_cannot_key():
    """tiles.launch.signature's exact-type fast path keeps its old answers: scalars (int subclasses too) as they
    are, CPU tensors, tensor subclasses and other objects uncached (None)."""
    import enum

    from tilecore.tiles.launch import signature

    class Flag(enum.IntEnum):
        ON = 1

    assert signature(1, 2.0, True, None, "a", torch.float16, Flag.ON) == (1, 2.0, True, None, "a", torch.float16,
                                                                          Flag.ON)
    x = torch.randn(3)
    assert signature(x) is None and signature(object()) is None and signature([1]) is None
    assert signature(x.as_subclass(type("Sub", (torch.Tensor,), {}))) is None


def test_one_look_at_the_modes_a_keyed_call(monkeypatch):
    """Session 35 (issue 31's host time): a keyed layer_norm call recording a gradient (the key's recipe kept) and an
    fft_conv call recording one ask dispatch.eager_mode once each (they asked twice, fft_conv three times where the
    key's plain call had kept its recipe: run 2's profile), with the same outputs and gradients as without a key."""
    from tilecore.ops.fft_conv import op as fft_op
    from tilecore.ops.norm import op as norm_op

    asked = []
    mode = dispatch.eager_mode
    monkeypatch.setattr(dispatch, "eager_mode", lambda *t: asked.append(1) or mode(*t))
    torch.manual_seed(1)
    x, w = torch.randn(4, 32, dtype=torch.float16), torch.randn(32, dtype=torch.float16)
    u, k = torch.randn(2, 4, 256, dtype=torch.float16), torch.randn(4, 256)
    runs = []
    for sig in (_cpu_signature, lambda *items: None):
        monkeypatch.setattr(norm_op, "signature", sig)
        monkeypatch.setattr(fft_op, "signature", sig)
        for cache in (norm_op._CHECKED, norm_op._PLANS, norm_op._FORWARDS, fft_op._CHECKED, fft_op._PLANS):
            cache.clear()
        outs = []
        for call in range(3):
            xg, wg, ug, kg = (t.clone().requires_grad_() for t in (x, w, u, k))
            asked.clear()
            y = tilecore.layer_norm(xg, wg, rms=True)
            if sig is _cpu_signature and call:  # (the key's first call keeps the recipe; later ones use it)
                assert len(asked) == 1, asked
            asked.clear()
            z = tilecore.fft_conv(ug, kg)
            assert len(asked) == 1, asked
            (y.float().sum() + z.float().sum()).backward()
            outs += [y.detach(), z.detach(), xg.grad, wg.grad, ug.grad, kg.grad]
        runs.append(outs)
    assert all(torch.equal(a, b) for a, b in zip(*runs))
