"""The decode steps: tokens one at a time against a carried state (in place) give linear_attention's
and mamba2_chunk_scan's outputs and final states. Through Triton's interpreter."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.linear_attention import linear_attention_step, mamba2_reference, mamba2_step

from la_testing import F16, F32, make, reference


@pytest.mark.parametrize("feature_map,decay", [(None, "scalar"), (None, "channel"), ("based", "scalar")])
def test_steps_carry_linear_attentions_state(feature_map, decay):
    B, N, Hqk, H, Dk, Dv = 1, 5, 1, 2, 16 if feature_map is None else 4, 80
    q, k, v, g, s0 = make(B, N, Hqk, H, Dk, Dv, dtype=F32, feature_map=feature_map, decay=decay, h0=True)
    ref, ref_state = reference(q, k, v, g, s0, feature_map=feature_map)
    state = s0.clone()
    for t in range(N):
        o = linear_attention_step(q[:, t], k[:, t], v[:, t], state, feature_map=feature_map, decay=g[:, t])
        assert accuracy.rel_rms(o, ref[:, t]) < 1e-5
    assert accuracy.rel_rms(state, ref_state) < 1e-5


def test_step_takes_a_token_axis_and_a_16_bit_state():
    q, k, v, g, s0 = make(2, 1, 1, 2, 32, 16, decay="scalar", h0=True)
    ref, ref_state = reference(q, k, v, g, s0)
    state = s0.to(F16)
    o = linear_attention_step(q, k, v, state, decay=g)  # (B, 1, H, D) tensors, g (B, 1, H)
    assert o.shape == v.shape and o.dtype == F16
    assert accuracy.error_over_floor(o, ref) <= 2.5  # the state went in rounded to fp16
    assert accuracy.error_over_floor(state, ref_state) <= 2.5


def test_mamba2_step_updates_mambas_state_layout_in_place():
    b, h, g, p, s = 2, 4, 2, 16, 32
    x = torch.randn(b, 1, h, p)
    dt, A = torch.randn(b, 1, h), -torch.rand(h) * 2
    B, C = torch.randn(b, 1, g, s), torch.randn(b, 1, g, s)
    D, z, bias = torch.randn(h), torch.randn(b, 1, h, p), torch.randn(h) * 0.1
    state = torch.randn(b, h, p, s)
    ry, rstate = mamba2_reference(x, dt, A, B, C, D=D, z=z, dt_bias=bias, dt_softplus=True, initial_states=state)
    y = mamba2_step(state, x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], D=D, z=z[:, 0], dt_bias=bias, dt_softplus=True)
    assert accuracy.rel_rms(y, ry[:, 0]) < 1e-5
    assert accuracy.rel_rms(state, rstate) < 1e-5


def test_steps_refuse_gradients():
    q, k, v, _, _ = make(1, 1, 1, 1, 16, 16, dtype=F32)
    state = torch.zeros(1, 1, 16, 16)
    with pytest.raises(RuntimeError, match="no gradient"):
        linear_attention_step(q[:, 0].requires_grad_(), k[:, 0], v[:, 0], state)
