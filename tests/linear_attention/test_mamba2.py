"""tilecore.mamba2_chunk_scan against mamba_ssm's semantics, stated as the float64 recurrence
(reference.mamba2_reference): grouped B/C, D of (h,) and (h, p), the z gate, dt_bias, softplus, dt_limit,
initial and final states, gradients of every input. Through Triton's interpreter."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.linear_attention import mamba2_chunk_scan, mamba2_reference


def make(b=1, n=37, h=4, g=2, p=16, s=16, dtype=torch.float32, d_per_dim=False):
    x = torch.randn(b, n, h, p, dtype=dtype)
    dt = torch.randn(b, n, h)
    A = -torch.rand(h) * 3 - 0.1
    B = torch.randn(b, n, g, s, dtype=dtype)
    C = torch.randn(b, n, g, s, dtype=dtype)
    D = torch.randn(h, p) if d_per_dim else torch.randn(h)
    z = torch.randn(b, n, h, p, dtype=dtype)
    dt_bias = torch.randn(h) * 0.1
    s0 = torch.randn(b, h, p, s)
    return x, dt, A, B, C, D, z, dt_bias, s0


def test_forward_and_every_gradient_fp32():
    inputs = make(d_per_dim=True)
    for t in inputs:
        t.requires_grad_()
    x, dt, A, B, C, D, z, dt_bias, s0 = inputs
    y, hT = mamba2_chunk_scan(x, dt, A, B, C, chunk_size=16, D=D, z=z, dt_bias=dt_bias, dt_softplus=True,
                              initial_states=s0, return_final_states=True)
    assert y.shape == x.shape and hT.shape == s0.shape and hT.dtype == torch.float32
    dy, dh = torch.randn_like(y), torch.randn_like(hT)
    grads = torch.autograd.grad((y * dy).sum() + (hT * dh).sum(), inputs)
    r = [t.detach().double().requires_grad_() for t in inputs]
    ry, rh = mamba2_reference(*r[:5], D=r[5], z=r[6], dt_bias=r[7], dt_softplus=True, initial_states=r[8])
    ref_grads = torch.autograd.grad((ry * dy.double()).sum() + (rh * dh.double()).sum(), r)
    assert accuracy.rel_rms(y, ry) < 1e-5 and accuracy.rel_rms(hT, rh) < 1e-5
    for name, got, ref in zip(("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states"), grads, ref_grads):
        # dt and A reach the output through the log decay, whose gradient is a reverse sum of differences
        assert accuracy.rel_rms(got, ref) < (2e-4 if name in ("dt", "A", "dt_bias") else 2e-5), name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_forward_16_bit_near_the_rounding_floor(dtype):
    x, dt, A, B, C, D, z, dt_bias, s0 = make(n=50, h=2, g=1, dtype=dtype)
    y = mamba2_chunk_scan(x, dt, A, B, C, chunk_size=32, D=D, z=z, dt_bias=dt_bias, dt_softplus=True)
    ry, _ = mamba2_reference(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True)
    # fp16: P and the state round to fp16 for the tensor-core dots (1.8x the floor before D and z, 2.9x
    # after them here, where large terms of o cancel); bf16 runs on its float32 upcast in the interpreter
    assert y.dtype == dtype and accuracy.error_over_floor(y, ry) <= (3.5 if dtype == torch.float16 else 1.1)


def test_chunk_size_changes_only_rounding_and_dt_limit_clamps():
    x, dt, A, B, C, *_ = make(n=70, h=2, g=1)
    ys = [mamba2_chunk_scan(x, dt, A, B, C, chunk_size=c) for c in (256, 16, 1)]
    ry, _ = mamba2_reference(x, dt, A, B, C)  # dt_limit (0, inf): negative dt count as 0
    for y in ys:
        assert accuracy.rel_rms(y, ry) < 1e-5
    y = mamba2_chunk_scan(x, dt, A, B, C, dt_limit=(0.01, 0.5))
    ry, _ = mamba2_reference(x, dt, A, B, C, dt_limit=(0.01, 0.5))
    assert accuracy.rel_rms(y, ry) < 1e-5
