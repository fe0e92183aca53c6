"""Based's backward by its quadratic state's symmetry (configs.BASED_BWD_SYM, kernels_tl's SYM, session 34): where the
quadratic state starts at zeros (no initial state for the dQ kernel's S2, no final state's gradient for the dK/dV
kernel's dS2) every update adds a symmetric vec(x x^T), so (M + M^T) q = 2 M^T q and one reduction does. Against the
float64 recurrence in Triton's interpreter: float32 (a few ulp), fp16 (at the switch-off path's multiple of the
rounding floor), with a scalar decay, and with a non-symmetric initial state and final-state gradient (the switch then
stays off in the kernel that would see them: still right)."""
import pytest
import torch

from la_testing import F16, F32, make, reference
from tilecore import accuracy
from tilecore.ops.linear_attention import configs, launch, linear_attention


def grads(q, k, v, g, s0, dout, dstate):
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (q, k, v, g, s0)]
    o, ht = linear_attention(*leaves[:3], feature_map="based", decay=leaves[3], initial_state=leaves[4],
                             return_final_state=True)
    loss = (o.float() * dout.float()).sum() + ((ht * dstate).sum() if dstate is not None else 0)
    return torch.autograd.grad(loss, [t for t in leaves if t is not None])


@pytest.mark.parametrize("dtype,N", [(F32, 37), (F16, 37), (F32, 1), (F16, 17)])
@pytest.mark.parametrize("decay,state", [(None, False), ("scalar", False), (None, True), ("scalar", True)])
def test_the_symmetric_backward_is_the_recurrences(monkeypatch, dtype, N, decay, state):
    torch.manual_seed(7)
    B, H, Dk, Dv = 1, 2, 16, 32
    q, k, v, g, s0 = make(B, N, H, H, Dk, Dv, dtype=dtype, feature_map="based", decay=decay, h0=state)
    dout = torch.randn(B, N, H, Dv).to(dtype)
    dstate = torch.randn(B, H, 1 + Dk + Dk * Dk, Dv) if state else None  # (neither s0 nor dstate symmetric)
    seen = []
    calls = launch.backward_calls
    monkeypatch.setattr(launch, "backward_calls", lambda *a, **kw: seen.append(r := calls(*a, **kw)) or r)
    monkeypatch.setattr(configs, "BASED_BWD_SYM", True)
    on = grads(q, k, v, g, s0, dout, dstate)
    syms = [c[3]["SYM"] for c in seen[-1]]
    assert syms == [not state, not state]  # (dQ, dK/dV: off where a state comes in)
    monkeypatch.setattr(configs, "BASED_BWD_SYM", False)
    off = grads(q, k, v, g, s0, dout, dstate)
    assert [c[3]["SYM"] for c in seen[-1]] == [False, False]
    _, _, ref = reference(q, k, v, g, s0, feature_map="based", dout=dout, dstate=dstate)
    scale = max(float(r.norm()) for r in ref)  # (N = 1: dg is 0 in float64, float32 noise in ours and the off path's)
    for name, a, b, r in zip(("dq", "dk", "dv", "dg", "ds0"), on, off, ref):
        assert torch.isfinite(a).all(), name
        if dtype == F32:
            assert float((a.double() - r).norm()) < 2e-5 * max(float(r.norm()), 1e-2 * scale), name
        else:
            assert accuracy.error_over_floor(a, r) <= 1.1 * max(1.0, accuracy.error_over_floor(b, r)), name
