"""Helpers shared by the attention tests: random inputs, the float64 reference's gradients, and the
lse comparison (where -inf marks a row with no key)."""
import torch

from tilecore.ops.attention import attention_reference

F16 = torch.float16


def make(b, hq, hkv, n, nk, d, dtype=F16, grad=False):
    q = torch.randn(b, hq, n, d, dtype=dtype)
    k = torch.randn(b, hkv, nk, d, dtype=dtype)
    v = torch.randn(b, hkv, nk, d, dtype=dtype)
    return [t.requires_grad_(grad) for t in (q, k, v)]


def reference_grads(q, k, v, dout, dlse, causal, scale):
    """dq, dk, dv by torch.autograd through the float64 reference (an lse of -inf carries no loss)."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o, lse = attention_reference(q64, k64, v64, causal=causal, scale=scale)
    loss = (o * dout.double()).sum()
    if dlse is not None:
        loss = loss + (torch.where(torch.isneginf(lse), 0.0, lse) * dlse.double()).sum()
    return torch.autograd.grad(loss, (q64, k64, v64))


def check_lse(lse, ref_lse, tol=1e-5):
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    assert torch.equal(torch.isnan(lse), torch.isnan(ref_lse))
    live = torch.isfinite(ref_lse)
    assert torch.allclose(lse[live].double(), ref_lse[live], rtol=tol, atol=tol)
