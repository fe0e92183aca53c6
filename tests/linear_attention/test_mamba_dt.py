"""mamba_dt (session 29, issue 31's host time): mamba2_step's dt_eff = clamp(dt + dt_bias, dt_limit) and
g = dt_eff A in one launch equal torch's ops bit for bit (interpreter), NaN kept, every element written, and
mamba2_step through it (its switch on, the keyed path) equals the torch-ops step bit for bit."""
import pytest
import torch

from tilecore.ops.linear_attention import mamba_dt
from tilecore.ops.linear_attention import op as la_op


def _torch_ops(dt, bias, A, limit):
    d = la_op._mamba_dt(dt, bias, False, limit)
    return d, d * A.float()


@pytest.mark.parametrize("limit", [(0.0, float("inf")), (0.05, 0.5), (float("-inf"), float("inf"))])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("clamp", ["select", "max"])
def test_equals_the_torch_ops_bit_for_bit(limit, with_bias, clamp):
    torch.manual_seed(0)
    B, H = 3, 37  # 111 entries: one partial block
    dt = torch.randn(H, B).t()  # strided (B, H)
    dt[1, 5] = float("nan")
    dt[2, 7] = -0.0
    bias = torch.randn(H, dtype=torch.float16) if with_bias else None
    A = -torch.rand(H) * 4
    d_ref, g_ref = _torch_ops(dt, bias, A, limit)
    if clamp == "max" and limit[0] > float("-inf"):  # max.f32 gives +0.0 for -0.0 at lo = 0 (torch's CPU clamp: -0.0)
        d_ref = torch.where(d_ref == 0, torch.zeros_like(d_ref), d_ref)
        g_ref = d_ref * A.float()
    d, g = mamba_dt.mamba_dt(dt, bias, A, limit, clamp=clamp)
    assert d.shape == g.shape == (B, H) and d.is_contiguous()
    assert torch.equal(d.isnan(), d_ref.isnan()) and d.isnan().any()  # NaN kept where torch keeps it
    fin = ~d_ref.isnan()
    assert torch.equal(d[fin].view(torch.int32), d_ref[fin].view(torch.int32))
    fin = ~g_ref.isnan()
    assert torch.equal(g[fin].view(torch.int32), g_ref[fin].view(torch.int32))


def test_mamba2_step_through_it_equals_the_torch_ops_step(monkeypatch):
    monkeypatch.setattr(mamba_dt, "MAMBA_DT_KERNEL", True)
    monkeypatch.setattr(la_op, "signature", lambda *items: tuple(
        (t.shape, t.stride(), t.dtype, t.device) if isinstance(t, torch.Tensor) else t for t in items))
    la_op._CHECKED.clear()
    la_op._PLANS.clear()
    torch.manual_seed(1)
    b, h, p, n = 2, 4, 16, 16
    x = torch.randn(b, h, p, dtype=torch.float16)
    dt, A = torch.rand(b, h), -torch.rand(h)
    Bm, Cm = torch.randn(b, 1, n, dtype=torch.float16), torch.randn(b, 1, n, dtype=torch.float16)
    bias = torch.randn(h)
    state0 = torch.randn(b, h, p, n)
    la_op._MAMBA_STEPS.clear()
    # the dt kernel's launches (the first step's through mamba_dt.mamba_dt, the next by the key's recipe)
    outs, launched, run = [], [], mamba_dt._MAMBA_DT.run
    monkeypatch.setattr(mamba_dt._MAMBA_DT, "run", lambda *args, **kw: launched.append(True) or run(*args, **kw))
    for kernel in (True, False):
        monkeypatch.setattr(mamba_dt, "MAMBA_DT_KERNEL", kernel)
        state = state0.clone()
        ys = [la_op.mamba2_step(state, x, dt, A, Bm, Cm, dt_bias=bias, dt_limit=(0.1, 0.9)) for _ in range(2)]
        outs.append(ys + [state])
    assert all(torch.equal(a, c) for a, c in zip(*outs))
    assert launched == [True, True]  # the switch on: both steps through the kernel; off: none
    la_op._CHECKED.clear()
    la_op._PLANS.clear()
    la_op._MAMBA_STEPS.clear()


def test_an_unknown_clamp_form_is_refused():
    with pytest.raises(ValueError, match="'select' or 'max'"):
        mamba_dt.mamba_dt(torch.rand(2, 3), None, -torch.rand(3), (0.0, 1.0), clamp="fmax")
