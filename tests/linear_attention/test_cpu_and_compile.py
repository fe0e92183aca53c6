"""linear_attention and mamba2_chunk_scan on CPU tensors without the interpreter (the chunked form on
torch's CPU ops, float32 math), the custom ops' checks, and torch.compile(fullgraph=True)."""
import pytest
import torch

import tilecore  # noqa: F401
from tilecore import accuracy
from tilecore.ops.linear_attention import (linear_attention, linear_attention_step, mamba2_chunk_scan,
                                           mamba2_reference)

from la_testing import BF16, F16, F32, make, reference


@pytest.mark.parametrize("dtype,feature_map,decay", [(BF16, None, "scalar"), (F32, "based", "scalar"),
                                                     (F16, None, "channel")])
def test_cpu_path_without_the_interpreter(monkeypatch, dtype, feature_map, decay):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # CPU tensors then take the chunked form in torch
    q, k, v, g, s0 = make(1, 45, 1, 2, 8, 16, dtype=dtype, feature_map=feature_map, decay=decay, h0=True)
    inputs = [t.requires_grad_() for t in (q, k, v, g, s0)]
    o, ht = linear_attention(q, k, v, feature_map=feature_map, decay=g, initial_state=s0, return_final_state=True)
    dout, dstate = torch.randn(o.shape, dtype=dtype), torch.randn_like(ht)
    grads = torch.autograd.grad((o.float() * dout.float()).sum() + (ht * dstate).sum(), inputs)
    ref, ref_state, ref_grads = reference(q, k, v, g, s0, feature_map=feature_map, dout=dout, dstate=dstate)
    if dtype == F32:
        assert accuracy.rel_rms(o, ref) < 1e-5
    else:
        assert accuracy.error_over_floor(o, ref) <= 1.1  # float32 math, rounded once
    assert accuracy.rel_rms(ht, ref_state) < 1e-5
    for got, r in zip(grads, ref_grads):
        assert got.dtype == r.dtype or got.dtype == dtype or got.dtype == F32
        assert accuracy.rel_rms(got, r) < (1e-4 if dtype == F32 else 5e-3)


def test_mamba2_and_step_without_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, dt, A = torch.randn(1, 30, 2, 8), torch.randn(1, 30, 2), -torch.rand(2)
    B, C, D, z = torch.randn(1, 30, 1, 16), torch.randn(1, 30, 1, 16), torch.randn(2), torch.randn(1, 30, 2, 8)
    y, hT = mamba2_chunk_scan(x, dt, A, B, C, D=D, z=z, dt_softplus=True, return_final_states=True)
    ry, rh = mamba2_reference(x, dt, A, B, C, D=D, z=z, dt_softplus=True)
    assert accuracy.rel_rms(y, ry) < 1e-5 and accuracy.rel_rms(hT, rh) < 1e-5
    # with beta the op's final state is laid out (b, h, p, s) (gluon_forward.empty_state): the (b, h, p, s) states
    # come out contiguous as its transposed view
    assert hT.is_contiguous()
    q, k, v, g, s0 = make(1, 1, 1, 2, 16, 16, dtype=F32, decay="channel", h0=True)
    ref, ref_state = reference(q, k, v, g, s0)
    o = linear_attention_step(q[:, 0], k[:, 0], v[:, 0], s0, decay=g[:, 0])
    assert accuracy.rel_rms(o, ref[:, 0]) < 1e-5 and accuracy.rel_rms(s0, ref_state) < 1e-5


def test_custom_ops_opcheck_and_compile_fullgraph():
    q, k, v, g, s0 = make(1, 20, 1, 2, 16, 16, dtype=F32, decay="scalar", h0=True)
    beta = torch.rand(1, 20, 2)
    torch.library.opcheck(torch.ops.tilecore.linear_attention_forward.default,
                          (q, k, v, g, beta, None, None, s0, 0.25, 0, 16, True, False))
    # (opcheck compares the fake's strides with the implementation's: with beta the final state (B, H, F, Dv) is the
    # transposed view of a (B, H, Dv, F) buffer on every path)
    ht = torch.ops.tilecore.linear_attention_forward.default(q, k, v, g, beta, None, None, s0, 0.25, 0, 16, True,
                                                             False)[1]
    assert ht.shape == (1, 2, 16, 16) and ht.stride()[2:] == (1, 16)
    inputs = [t.requires_grad_() for t in (q, k, v, g, s0)]

    def f(q, k, v, g, s0):
        o, ht = linear_attention(q, k, v, decay=g, initial_state=s0, return_final_state=True, chunk_size=16)
        return (o * 2).sum() + ht.square().sum()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(*inputs), inputs)
    expect = torch.autograd.grad(f(*inputs), inputs)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(got, expect))

    def step(q, k, v, state):
        return linear_attention_step(q, k, v, state) * 2
    state = torch.zeros(1, 2, 16, 16)
    with torch.no_grad():
        out = torch.compile(step, fullgraph=True, backend="aot_eager")(q[:, 0].detach(), k[:, 0].detach(),
                                                                        v[:, 0].detach(), state)
    assert out.shape == (1, 2, 16) and state.abs().sum() > 0  # the state was updated in place
