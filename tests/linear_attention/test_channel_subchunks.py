"""Per-channel decay (GLA) by sub-chunks (kernels_tl._channel_scores, _channel_dq, _channel_dk): chunks
of 64 tokens made of four sub-chunks of 16, whose off-diagonal scores are tensor-core dots through each
key sub-chunk's reference token and whose diagonal blocks are elementwise. Against the float64
recurrence in the interpreter: forward into NaN buffers (fp16), gradients (float32), every backward
output written, decays strong enough that a single reference per chunk would overflow, and decays
near 0 and -inf (resets)."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.linear_attention import linear_attention

from la_testing import F32, backward_poisoned, check_extreme_decays, forward_poisoned, make, reference

CHUNK = 64  # four sub-chunks


def _strong(shape):
    """Log decays in [-6, 0] per channel: across 64 tokens exp(-G) reaches e^200 (overflows float32), so
    only the factored form's bounded factors are finite."""
    return -torch.rand(shape) * 6.0


@pytest.mark.parametrize("N,strong", [(130, False), (100, True)])
def test_forward_fp16_sub_chunks(N, strong):
    q, k, v, g, s0 = make(1, N, 1, 2, 32, 16, decay="channel", h0=True)
    if strong:
        g = _strong(g.shape)
    ref, ref_state = reference(q, k, v, g, s0)
    o, ht, _ = forward_poisoned(q, k, v, g, s0, chunk=CHUNK)
    assert torch.isfinite(o).all()
    assert accuracy.error_over_floor(o, ref) <= 2.0
    assert accuracy.rel_rms(ht, ref_state) < 1e-3


def test_backward_fp32_sub_chunks():
    q, k, v, g, s0 = make(1, 100, 1, 2, 16, 16, dtype=F32, decay="channel", h0=True)
    g = _strong(g.shape)
    inputs = [t.requires_grad_() for t in (q, k, v, g, s0)]
    o, ht = linear_attention(q, k, v, decay=g, initial_state=s0, return_final_state=True, chunk_size=CHUNK)
    dout, dstate = torch.randn_like(o), torch.randn_like(ht)
    grads = torch.autograd.grad((o * dout).sum() + (ht * dstate).sum(), inputs)
    _, _, ref_grads = reference(q, k, v, g, s0, dout=dout, dstate=dstate)
    for name, got, ref in zip(("dq", "dk", "dv", "dg", "ds0"), grads, ref_grads):
        assert torch.isfinite(got).all(), name
        tol = 2e-4 if name == "dg" else 2e-5
        assert accuracy.rel_rms(got, ref) < tol, (name, accuracy.rel_rms(got, ref))


def test_backward_kernels_write_everything_sub_chunks():
    B, N, H, Dk, Dv = 1, 80, 2, 32, 16
    q, k, v, g, s0 = make(B, N, 1, H, Dk, Dv, decay="channel", h0=True)
    do, dht = torch.randn(B, N, H, Dv), torch.randn(s0.shape)
    dq, dk, dv, dh0 = backward_poisoned(do, q, k, v, g, s0, dht, chunk=CHUNK)
    _, _, ref = reference(q, k, v, g, s0, dout=do, dstate=dht)
    assert accuracy.rel_rms(dq.view(B, N, 1, H, Dk).sum(3), ref[0]) < 2e-3
    assert accuracy.rel_rms(dk.view(B, N, 1, H, Dk).sum(3), ref[1]) < 2e-3
    assert accuracy.rel_rms(dv, ref[2]) < 2e-3
    assert accuracy.rel_rms(dh0, ref[4]) < 2e-3


def test_decays_near_zero_and_minus_infinity_sub_chunks():
    q, k, v, g, s0 = make(1, 90, 1, 1, 16, 16, dtype=F32, decay="channel", h0=True)
    g = -torch.rand(g.shape) * 1e-6
    g[:, 5, :, :4] = -1e30
    g[:, 20, :, 3:9] = float("-inf")  # resets some channels inside the first chunk's second sub-chunk
    g[:, 47] = -200.0  # the last token of a sub-chunk (a reference)
    g[:, 70:] = -60.0
    check_extreme_decays(q, k, v, g, s0, CHUNK, reference_dg_vanishes=False)
