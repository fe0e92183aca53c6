"""Per-channel decay (GLA) with one reference a chunk (plan diag 3, kernels_tl._channel_chunk): the
intra-chunk scores as ONE tensor-core dot of q exp(G - m) against k exp(m - G), m the middle of the chunk's
span of G per channel, where that span is <= _factor_span (fp16 8, bf16 / float32 64), else the sub-chunk
form. Against the float64 recurrence in the interpreter, into NaN-filled buffers: weak decays (the factored
path), spans near the limit, strong decays and resets (the fallback), tails."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.linear_attention import launch
from tilecore.ops.linear_attention.plan import IDENTITY, tl_plan

from la_testing import F16, F32, make, reference


def forward_diag(q, k, v, g, s0, *, diag, chunk=64, **overrides):
    """The tl forward with plan diag ``diag`` into NaN buffers: (o, final state); every element written."""
    p = tl_plan(q, v, g, IDENTITY, chunk, diag=diag, **overrides)
    B, N, H, Dv = v.shape
    o = torch.full(v.shape, float("nan"), dtype=v.dtype)
    ht = torch.full((B, H, q.shape[-1], Dv), float("nan"), dtype=torch.float32)
    kernel, grid, args, kw = launch.forward_call(p, q, k, v, g, None, None, None, s0, o, ht, None,
                                                 q.shape[-1] ** -0.5, IDENTITY)
    kernel[grid](*args, **kw)
    assert not torch.isnan(o).any() and not torch.isnan(ht).any(), "some elements were never written"
    return o, ht


def _span_decays(shape, per_token):
    """Log decays of about ``per_token`` each (+-20%): a chunk of 64 spans ~64 per_token."""
    return -per_token * (0.8 + 0.4 * torch.rand(shape))


# the fp16 interpreter's multiples of the rounding floor (seeds 0, 1): diag 0 (sub-chunks) 1.54-1.74, diag 3
# (operands rounded once) 1.89-2.08, diag 4 (operands split hi + lo) 1.45-1.52
FLOOR_MULTIPLE = {3: 2.3, 4: 1.7}


@pytest.mark.parametrize("dtype,N,per_token,diag", [(F16, 130, 0.05, 4), (F16, 77, 0.11, 3), (F16, 77, 0.11, 4),
                                                     (F32, 100, 0.9, 4)])
def test_factored_path_against_float64(dtype, N, per_token, diag):
    """Spans under the limit (fp16: 64 x 0.11 x 1.2 ~ 8.4 straddles 8: both paths in one run; float32
    ~ 55 of 64: factors up to e^28): within the floor multiples above, the state at float32 noise."""
    torch.manual_seed(0)
    q, k, v, g, s0 = make(1, N, 1, 2, 32, 16, dtype=dtype, decay="channel", h0=True)
    g = _span_decays(g.shape, per_token)
    ref, ref_state = reference(q, k, v, g, s0)
    o, ht = forward_diag(q, k, v, g, s0, diag=diag)
    assert torch.isfinite(o).all()
    if dtype == F32:  # float32 operands (IEEE): factors up to e^28 lose nothing past float32 noise
        assert accuracy.rel_rms(o, ref) < 1e-5
    else:
        floor_multiple = accuracy.error_over_floor(o, ref)
        assert floor_multiple <= FLOOR_MULTIPLE[diag], floor_multiple
    assert accuracy.rel_rms(ht, ref_state) < (1e-3 if dtype == F16 else 1e-5)


def test_factored_path_taken_and_fallback_taken():
    """Weak decays: diag 3 differs from diag 0 (another summation: the factored dot ran) and both are
    right. Strong decays in [-6, 0] (a chunk's e^-G reaches e^200, past float32) and resets: diag 3 and
    diag 4 (which differ only in the factored branch) agree bit for bit, so the sub-chunk fallback ran,
    and stay finite and right."""
    torch.manual_seed(1)
    q, k, v, g, s0 = make(1, 96, 1, 1, 16, 16, dtype=F32, decay="channel", h0=True)
    weak = -torch.rand(g.shape) * 0.2
    o3, _ = forward_diag(q, k, v, weak, s0, diag=3)
    o0, _ = forward_diag(q, k, v, weak, s0, diag=0)
    assert not torch.equal(o3, o0)
    ref, _ = reference(q, k, v, weak, s0)
    assert accuracy.rel_rms(o3, ref) < 1e-5 and accuracy.rel_rms(o0, ref) < 1e-5
    strong = -torch.rand(g.shape) * 6.0
    strong[:, 40, :, 2:5] = float("-inf")
    o4, h4 = forward_diag(q, k, v, strong, s0, diag=4)
    o3, h3 = forward_diag(q, k, v, strong, s0, diag=3)
    assert torch.equal(o3, o4) and torch.equal(h3, h4)
    ref, ref_state = reference(q, k, v, strong, s0)
    assert torch.isfinite(o4).all() and accuracy.rel_rms(o4, ref) < 1e-5
    assert accuracy.rel_rms(h4, ref_state) < 1e-5


def test_single_reference_needs_the_span_bound():
    """Why the span test: one fp16 factor pair about the chunk's middle with strong decays (span ~190)
    overflows fp16 (inf) and underflows to 0, while the kernel with the same decays stays finite and right
    (its fallback)."""
    torch.manual_seed(2)
    q, k, v, g, s0 = make(1, 64, 1, 1, 16, 16, dtype=F16, decay="channel", h0=True)
    g = -torch.rand(g.shape) * 6.0
    G = g[0, :, 0].cumsum(0)
    mid = 0.5 * (G.max(0).values + G.min(0).values)
    naive = (q[0, :, 0].float() * torch.exp(G - mid)).to(F16)
    assert torch.isinf(naive).any() or (naive == 0).float().mean() > 0.2
    o, _ = forward_diag(q, k, v, g, s0, diag=4)
    ref, _ = reference(q, k, v, g, s0)
    assert torch.isfinite(o).all() and accuracy.error_over_floor(o, ref) <= 2.0


def test_nan_decay_propagates_as_the_recurrence():
    """A NaN log decay at token t, channel d: rows before t untouched, rows from t NaN (as the reference)."""
    q, k, v, g, s0 = make(1, 40, 1, 1, 16, 16, dtype=F32, decay="channel")
    g = -torch.rand(g.shape) * 0.1
    g[:, 21, :, 3] = float("nan")
    p = tl_plan(q, v, g, IDENTITY, 32, diag=4)
    o = torch.full(v.shape, float("nan"))
    kernel, grid, args, kw = launch.forward_call(p, q, k, v, g, None, None, None, None, o, None, None, 0.25,
                                                 IDENTITY)
    kernel[grid](*args, **kw)
    ref, _ = reference(q, k, v, g, None, scale=0.25)
    assert torch.equal(torch.isnan(o), torch.isnan(ref))
    assert accuracy.rel_rms(o[:, :21], ref[:, :21]) < 1e-5


def test_value_blocks_and_chunk_32():
    """Two value blocks (BV 16 of Dv 32), chunk 32, a tail (N 45), grouped q/k heads."""
    torch.manual_seed(3)
    q, k, v, g, s0 = make(2, 45, 1, 2, 16, 32, dtype=F16, decay="channel", h0=True)
    g = -torch.rand(g.shape) * 0.1
    ref, ref_state = reference(q, k, v, g, s0)
    o, ht = forward_diag(q, k, v, g, s0, diag=4, chunk=32, BV=16)
    assert accuracy.error_over_floor(o, ref) <= FLOOR_MULTIPLE[4]
    assert accuracy.rel_rms(ht, ref_state) < 1e-3


def test_switches_route_the_op(monkeypatch):
    """configs.CHANNEL_FWD_DIAG / CHANNEL_FWD_BLOCKS on: the plan's forward takes diag 4 at its own blocks while
    the backward keeps its chunk (and reads DIAG 4 as 0); the public op's output and gradients against float64
    (float32 in the interpreter)."""
    from tilecore.ops.linear_attention import configs, linear_attention

    monkeypatch.setattr(configs, "CHANNEL_FWD_DIAG", 4)
    monkeypatch.setattr(configs, "CHANNEL_FWD_BLOCKS", dict(BT=32, BV=128, warps=8, stages=2))
    torch.manual_seed(4)
    q, k, v, g, s0 = make(1, 50, 1, 2, 16, 16, dtype=F32, decay="channel", h0=True)
    g = -torch.rand(g.shape) * 0.3
    cfg = tl_plan(q, v, g, IDENTITY).config
    assert (cfg["diag"], cfg["BT"], cfg["BV"], cfg["fwd_warps"], cfg["BT_BWD"]) == (4, 32, 16, 8, 64)
    assert tl_plan(q, v, g, IDENTITY, 64).config["BT"] == 64  # a chunk the caller gives is kept
    inputs = [t.requires_grad_() for t in (q, k, v, g, s0)]
    o, ht = linear_attention(q, k, v, decay=g, initial_state=s0, return_final_state=True)
    dout, dstate = torch.randn_like(o), torch.randn_like(ht)
    grads = torch.autograd.grad((o * dout).sum() + (ht * dstate).sum(), inputs)
    ref, ref_state, ref_grads = reference(q, k, v, g, s0, dout=dout, dstate=dstate)
    assert accuracy.rel_rms(o, ref) < 1e-5 and accuracy.rel_rms(ht, ref_state) < 1e-5
    for name, got, r in zip(("dq", "dk", "dv", "dg", "ds0"), grads, ref_grads):
        assert accuracy.rel_rms(got, r) < (2e-4 if name == "dg" else 2e-5), name


@pytest.mark.parametrize("diag,dtype", [(5, F32), (6, F16)])
def test_backward_factored_against_float64(monkeypatch, diag, dtype):
    """The backward's factored intra-chunk terms (plan diag 5 / 6: configs.CHANNEL_BWD_FACTORED): gradients
    through the public op against float64, weak decays (the factored path) and strong ones with a reset (the
    fallback) in one sequence; float32 at float32 noise, fp16 within 2x the floor."""
    from tilecore.ops.linear_attention import configs, linear_attention

    monkeypatch.setattr(configs, "CHANNEL_FWD_DIAG", diag - 2)
    monkeypatch.setattr(configs, "CHANNEL_BWD_FACTORED", True)
    torch.manual_seed(5)
    q, k, v, g, s0 = make(1, 140, 1, 2, 16, 16, dtype=dtype, decay="channel", h0=True)
    g = -torch.rand(g.shape) * 0.1
    g[:, 70:130] = -torch.rand(g[:, 70:130].shape) * 6.0
    g[:, 100, :, :3] = float("-inf")
    assert tl_plan(q, v, g, IDENTITY).config["diag"] == diag
    inputs = [t.requires_grad_() for t in (q, k, v, g, s0)]
    o, ht = linear_attention(q, k, v, decay=g, initial_state=s0, return_final_state=True, chunk_size=64)
    dout, dstate = torch.randn(o.shape), torch.randn(ht.shape)
    grads = torch.autograd.grad((o.float() * dout).sum() + (ht * dstate).sum(), inputs)
    _, _, ref_grads = reference(q, k, v, g, s0, dout=dout, dstate=dstate)
    for name, got, r in zip(("dq", "dk", "dv", "dg", "ds0"), grads, ref_grads):
        assert torch.isfinite(got).all(), name
        if dtype == F32:
            assert accuracy.rel_rms(got, r) < (2e-4 if name == "dg" else 2e-5), name
        elif name in ("dq", "dk", "dv"):  # fp16 (seed 5): diag 6 1.44-1.75x the floor, diag 0 1.63-1.86x
            assert accuracy.error_over_floor(got, r) <= 2.0, name
        else:  # dg (float32; 0 where the floor clamps) 5e-4 relative, ds0 3e-4
            live = g >= -100 if name == "dg" else torch.ones_like(got, dtype=torch.bool)
            assert accuracy.rel_rms(got[live], r[live]) < 2e-3, name
