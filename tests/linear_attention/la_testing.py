"""Helpers of the linear-attention tests: random inputs, the float64 reference's outputs and gradients,
and kernel runs into NaN-filled buffers (so an unwritten element shows)."""
import torch

from tilecore import accuracy
from tilecore.ops.linear_attention import launch, linear_attention, linear_attention_reference
from tilecore.ops.linear_attention.plan import BASED, IDENTITY, plan

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def make(B, N, Hqk, H, Dk, Dv, *, dtype=F16, feature_map=None, decay=None, h0=False, strong=False):
    """q, k, v, log decay (None, 'scalar', 'channel'), initial state; log decays in [-0.5, 0] (strong:
    in [-6, 0], with some near -inf)."""
    q = torch.randn(B, N, Hqk, Dk, dtype=dtype)
    k = torch.randn(B, N, Hqk, Dk, dtype=dtype)
    v = torch.randn(B, N, H, Dv, dtype=dtype)
    rows = 1 + Dk + Dk * Dk if feature_map == "based" else Dk
    g = None
    if decay is not None:
        shape = (B, N, H) if decay == "scalar" else (B, N, H, rows)
        g = -torch.rand(shape) * (6.0 if strong else 0.5)
    s0 = torch.randn(B, H, rows, Dv) if h0 else None
    return q, k, v, g, s0


def reference(q, k, v, g, s0, *, feature_map=None, scale=None, dout=None, dstate=None, weights=None):
    """(o, state) in float64 and, with dout, the gradients of <o, dout> + <state, dstate> for the
    inputs that are not None: [dq, dk, dv, (dg), (ds0), (dW)]."""
    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (q, k, v, g, s0)]
    w = None
    if weights is not None:
        w = weights.detach().double().requires_grad_()
    o, st = linear_attention_reference(*leaves[:3], feature_map=feature_map, feature_weights=w, decay=leaves[3],
                                       scale=scale, initial_state=leaves[4])
    if dout is None:
        return o.detach(), st.detach()
    loss = (o * dout.double()).sum()
    if dstate is not None:
        loss = loss + (st * dstate.double()).sum()
    wanted = [t for t in leaves if t is not None] + ([w] if w is not None else [])
    return o.detach(), st.detach(), torch.autograd.grad(loss, wanted)


def forward_poisoned(q, k, v, g, s0, *, feature=IDENTITY, scale=None, chunk=None, beta=None, d_skip=None, z=None):
    """The forward kernel's (o, final state, o before D and z) written into NaN-filled buffers; asserts
    every element was written."""
    scale = (q.shape[-1] ** -0.5) if scale is None else scale
    p = plan(q, v, g, feature, chunk)
    B, N, H, Dv = v.shape
    rows = launch.feature_rows(feature, q.shape[-1])
    o = torch.full(v.shape, float("nan"), dtype=v.dtype)
    o_lin = torch.full(v.shape, float("nan"), dtype=torch.float32)
    ht = torch.full((B, H, rows, Dv), float("nan"), dtype=torch.float32)
    kernel, grid, args, kw = launch.forward_call(p, q, k, v, g, beta, d_skip, z, s0, o, ht, o_lin, scale, feature)
    kernel[grid](*args, **kw)
    for name, t in (("o", o), ("final state", ht), ("o before D and z", o_lin)):
        assert not torch.isnan(t).any(), f"{name}: some elements were never written"
    return o, ht, o_lin


__all__ = ["make", "reference", "forward_poisoned", "F16", "BF16", "F32", "BASED", "IDENTITY"]


def backward_poisoned(do, q, k, v, g, s0, dht, *, feature=IDENTITY, scale=None, chunk=None, beta=None):
    """The backward kernels' raw outputs (dq per v head, dk_hat and dv_hat summed over their parts, dh0)
    written into NaN-filled buffers (with the diagonal added back where the kernels leave it out, as
    launch.backward does); asserts every element was written."""
    scale = (q.shape[-1] ** -0.5) if scale is None else scale
    p = plan(q, v, g, feature, chunk)
    cfg = p.config
    B, N, H, Dv = v.shape
    Dk = q.shape[-1]
    nan = float("nan")
    dq = torch.full((B, N, H, Dk), nan)
    dk_parts = torch.full((cfg["dkv_value_blocks"], B, N, H, Dk), nan)
    dv_parts = torch.full((cfg["dkv_key_blocks"], B, N, H, Dv), nan)
    dh0 = torch.full((B, H, launch.feature_rows(feature, Dk), Dv), nan) if s0 is not None else None
    r = torch.full((B, N, H), nan) if launch.strict_diagonal(feature, g) else None
    for kernel, grid, args, kw in launch.backward_calls(p, do, q, k, v, g, beta, s0, dht, dq, dk_parts, dv_parts,
                                                        dh0, scale, feature, r):
        kernel[grid](*args, **kw)
    for name, t in (("dq", dq), ("dk", dk_parts), ("dv", dv_parts), ("dh0", dh0), ("r", r)):
        assert t is None or not torch.isnan(t).any(), f"{name}: some elements were never written"
    dk = dk_parts.sum(0)
    if r is not None:
        group = H // q.shape[2]
        dq = dq + r[..., None] * k.float().repeat_interleave(group, dim=2)
        dk = dk + r[..., None] * q.float().repeat_interleave(group, dim=2)
    return dq, dk, dv_parts.sum(0), dh0


__all__ += ["backward_poisoned"]


def check_extreme_decays(q, k, v, g, s0, chunk, *, reference_dg_vanishes=True):
    """float32 forward and gradients (through autograd) of log decays g holding extremes (near 0, -1e30,
    -inf, below the -100 floor) against the float64 reference: all finite, at float32 noise, the decay's
    gradient 0 where the floor clamps (and the reference's below 1e-40 there, unless told otherwise)."""
    inputs = [t.requires_grad_() for t in (q, k, v, g, s0)]
    o, ht = linear_attention(q, k, v, decay=g, initial_state=s0, return_final_state=True, chunk_size=chunk)
    dout, dstate = torch.randn_like(o), torch.randn_like(ht)
    grads = torch.autograd.grad((o * dout).sum() + (ht * dstate).sum(), inputs)
    ref, ref_state, ref_grads = reference(q, k, v, g, s0, dout=dout, dstate=dstate)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    assert accuracy.rel_rms(o, ref) < 1e-5 and accuracy.rel_rms(ht, ref_state) < 1e-5
    for name, got, r in zip(("dq", "dk", "dv", "dg", "ds0"), grads, ref_grads):
        assert torch.isfinite(got).all(), name
        if name == "dg":  # where the floor clamps, 0; elsewhere the float32 reverse sum of differences
            assert (got[g < -100] == 0).all()
            if reference_dg_vanishes:
                assert (r[g < -100].abs() < 1e-40).all()
            live = g >= -100
            assert accuracy.rel_rms(got[live], r[live]) < 1e-3, name
        else:
            assert accuracy.rel_rms(got, r) < 2e-5, name
