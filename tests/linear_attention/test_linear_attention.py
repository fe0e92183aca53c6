"""tilecore.linear_attention through Triton's interpreter against the float64 recurrence: every path
(no decay, scalar and per-channel decay, Based, Hedgehog, grouped heads, initial and final states),
N = 1, 17, 100 with chunks of 16 and 32, forward into NaN-filled buffers, backward by autograd. Math
in fp16 and fp32 (the interpreter's bf16 tl.dot is wrong: bf16 runs on its exact float32 upcast here,
and is checked on the GPU by experiments/linear_attention/gpu_check.py)."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.linear_attention import linear_attention

from la_testing import BASED, F16, F32, BF16, IDENTITY, backward_poisoned, forward_poisoned, make, reference

# B, N, Hqk, H, Dk, Dv, feature map, decay, initial state, chunk
CASES = [
    (1, 1, 1, 2, 16, 32, None, None, False, 16),
    (1, 17, 1, 2, 16, 32, None, "scalar", True, 16),
    (2, 100, 1, 1, 32, 16, None, "scalar", False, 32),
    (1, 17, 1, 2, 32, 16, None, "channel", True, 16),
    (1, 100, 1, 1, 16, 16, None, "channel", False, 32),
    (1, 17, 1, 2, 16, 32, "based", None, True, 16),
    (1, 40, 1, 1, 8, 16, "based", "scalar", True, 32),
    (1, 33, 1, 2, 20, 24, None, "scalar", True, 16),   # head dims not powers of two
]
IDS = [f"N{c[1]}-H{c[2]}/{c[3]}-Dk{c[4]}-Dv{c[5]}-{c[6] or 'linear'}-{c[7] or 'nodecay'}-{'h0' if c[8] else ''}-"
       f"chunk{c[9]}" for c in CASES]


def _feature(fm):
    return BASED if fm == "based" else IDENTITY


def _close(out, ref, floors):
    if out.dtype == F32:
        return accuracy.rel_rms(out, ref) < 2e-5
    return accuracy.error_over_floor(out, ref) <= floors


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_fp16_near_the_rounding_floor(case):
    B, N, Hqk, H, Dk, Dv, fm, decay, h0, chunk = case
    q, k, v, g, s0 = make(B, N, Hqk, H, Dk, Dv, feature_map=fm, decay=decay, h0=h0)
    ref, ref_state = reference(q, k, v, g, s0, feature_map=fm)
    o, ht, _ = forward_poisoned(q, k, v, g, s0, feature=_feature(fm), chunk=chunk)
    assert accuracy.error_over_floor(o, ref) <= 2.0
    assert accuracy.rel_rms(ht, ref_state) < 1e-3  # the state's k v^T products are fp16 dots
    public, public_state = linear_attention(q, k, v, feature_map=fm, decay=g, initial_state=s0,
                                            return_final_state=True, chunk_size=chunk)
    assert torch.equal(public, o) and torch.equal(public_state, ht)


@pytest.mark.parametrize("case", CASES[1:], ids=IDS[1:])
def test_backward_fp32_against_float64(case):
    B, N, Hqk, H, Dk, Dv, fm, decay, h0, chunk = case
    B, N = 1, min(N, 50)  # the interpreter's time
    q, k, v, g, s0 = make(B, N, Hqk, H, Dk, Dv, dtype=F32, feature_map=fm, decay=decay, h0=h0)
    inputs = [t.requires_grad_() for t in (q, k, v, g, s0) if t is not None]
    o, ht = linear_attention(q, k, v, feature_map=fm, decay=g, initial_state=s0, return_final_state=True,
                             chunk_size=chunk)
    dout, dstate = torch.randn_like(o), torch.randn_like(ht)
    grads = torch.autograd.grad((o * dout).sum() + (ht * dstate).sum(), inputs)
    _, _, ref_grads = reference(q, k, v, g, s0, feature_map=fm, dout=dout, dstate=dstate)
    for name, got, ref in zip(("dq", "dk", "dv", "dg" if g is not None else "ds0", "ds0"), grads, ref_grads):
        # the log decay's gradient is a reverse sum of differences (q.dq - k.dk): float32's cancellation
        tol = 2e-4 if name == "dg" else 2e-5
        assert accuracy.rel_rms(got, ref) < tol, (name, accuracy.rel_rms(got, ref))


@pytest.mark.parametrize("case", [CASES[3], CASES[6]], ids=[IDS[3], IDS[6]])
def test_backward_kernels_write_everything_fp16(case):
    B, N, Hqk, H, Dk, Dv, fm, decay, h0, chunk = case
    q, k, v, g, s0 = make(B, N, Hqk, H, Dk, Dv, feature_map=fm, decay=decay, h0=h0)
    do = torch.randn(B, N, H, Dv)
    dht = torch.randn(s0.shape) if s0 is not None else None
    dq, dk, dv, dh0 = backward_poisoned(do, q, k, v, g, s0, dht, feature=_feature(fm), chunk=chunk)
    _, _, ref = reference(q, k, v, g, s0, feature_map=fm, dout=do, dstate=dht)
    group = H // Hqk
    assert accuracy.rel_rms(dq.view(B, N, Hqk, group, Dk).sum(3), ref[0]) < 2e-3
    assert accuracy.rel_rms(dk.view(B, N, Hqk, group, Dk).sum(3), ref[1]) < 2e-3
    assert accuracy.rel_rms(dv, ref[2]) < 2e-3
    assert accuracy.rel_rms(dh0, ref[-1]) < 2e-3


def test_bf16_runs_on_its_float32_upcast_in_the_interpreter():
    q, k, v, g, s0 = make(1, 40, 1, 2, 16, 32, dtype=BF16, decay="scalar", h0=True)
    ref, _ = reference(q, k, v, g, s0)
    o = linear_attention(q, k, v, decay=g, initial_state=s0)
    assert o.dtype == BF16 and accuracy.error_over_floor(o, ref) <= 1.1


def test_chunks_agree():
    q, k, v, g, _ = make(1, 70, 1, 1, 16, 16, dtype=F32, decay="scalar")
    outs = [linear_attention(q, k, v, decay=g, chunk_size=c) for c in (16, 32, 64)]
    ref, _ = reference(q, k, v, g, None)
    for o in outs:
        assert accuracy.rel_rms(o, ref) < 1e-5


def test_hedgehog_features_and_their_weights_gradient():
    B, N, H, Dk, Fh = 1, 24, 2, 16, 8
    q, k, v, g, _ = make(B, N, H, H, Dk, 16, dtype=F32, decay="scalar")
    g = -torch.rand(B, N, H) * 0.5
    w = (torch.randn(H, Dk, Fh) * 0.3).requires_grad_()
    for t in (q, k, v):
        t.requires_grad_()
    o = linear_attention(q, k, v, feature_map="hedgehog", feature_weights=w, decay=g, chunk_size=16)
    dout = torch.randn_like(o)
    grads = torch.autograd.grad((o * dout).sum(), (q, k, v, w))
    ref, _, ref_grads = reference(q, k, v, g, None, feature_map="hedgehog", weights=w, dout=dout)
    assert accuracy.rel_rms(o, ref) < 1e-5
    for got, r in zip(grads, ref_grads[:3] + ref_grads[-1:]):
        assert accuracy.rel_rms(got, r) < 2e-5


def test_strided_views_and_the_head_first_transpose():
    # (B, H, N, D) tensors go in as .transpose(1, 2); q, k, v as slices of one projection
    B, N, H, D = 1, 21, 2, 16
    qkv = torch.randn(B, N, 3 * H, D, dtype=F16)
    q, k, v = qkv.split(H, dim=2)
    g_hf = -torch.rand(B, H, N) * 0.3  # head-first log decay
    o = linear_attention(q, k, v, decay=g_hf.transpose(1, 2))
    ref, _ = reference(q.contiguous(), k.contiguous(), v.contiguous(), g_hf.transpose(1, 2).contiguous(), None)
    assert accuracy.error_over_floor(o, ref) <= 2.0
    o_hf = linear_attention(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, decay=g_hf.transpose(1, 2))
    assert torch.equal(o_hf, o)
