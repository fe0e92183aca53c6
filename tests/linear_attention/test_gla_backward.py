"""GLA's backward (per-channel decay) on its session-30 paths, in the interpreter into NaN-filled buffers against
the float64 recurrence's autograd: the split kernels with the GLA epilogue (kernels_backward_gla.py: dq, dk, dv
stored whole in the inputs' dtypes, dg's per-channel reverse sum in the dK kernel, no combine pass) and the
chunk-parallel form (kernels_backward_gla_chunked.py). Weak decays (the factored terms), strong decays with resets
(the sub-chunk fallback, dg 0 where the floor clamps), several key and value blocks, tails, N = 1, with and without
states. experiments/linear_attention/gpu_gla_bwd.py checks the same kernels on the H100."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.linear_attention import configs_gla_bwd, kernels_backward_gla, kernels_backward_gla_chunked, launch
from tilecore.ops.linear_attention.plan import IDENTITY, plan, tl_plan

from la_testing import F16, F32, make, reference

NAN = float("nan")


def run(q, k, v, g, s0, do, dht, ht, *, chunk=64, **blocks):
    """kernels_backward_gla.backward into NaN-filled buffers (asserting every element written): dq, dk, dv, dg, dh0."""
    p = kernels_backward_gla.split_plan(tl_plan(q, v, g, IDENTITY, chunk), q, v, g, chunk, **blocks)
    out = dict(dq=torch.full_like(q, NAN), dk=torch.full_like(k, NAN), dv=torch.full_like(v, NAN),
               dg=torch.full_like(g, NAN, dtype=torch.float32))
    if s0 is not None:
        out["dh0"] = torch.full_like(s0, NAN)
    dq, dk, dv, dg, dbeta, dh0 = kernels_backward_gla.backward(p, do, q, k, v, g, s0, ht, dht, q.shape[-1] ** -0.5,
                                                               out=out)
    assert dbeta is None and (dq, dk, dv, dg) == (out["dq"], out["dk"], out["dv"], out["dg"])
    for name, t in out.items():
        assert not torch.isnan(t).any(), f"{name}: some elements were never written"
    assert (dq.dtype, dk.dtype, dv.dtype, dg.dtype) == (q.dtype, k.dtype, v.dtype, F32)
    return [dq, dk, dv, dg] + ([dh0] if s0 is not None else [])


def test_fp16_weak_decays_several_blocks_and_a_tail():
    """fp16, N 77 (a partial chunk), Dk 32 in two dQ / dK key blocks, Dv 24 in two dV value blocks (one
    partial), an initial state and the final state's gradient: dq, dk, dv within 2.5x the rounding floor (the
    interpreter: 1.1-1.6x), dg and dh0 at fp16's relative error."""
    torch.manual_seed(0)
    q, k, v, g, s0 = make(1, 77, 1, 1, 32, 24, dtype=F16, decay="channel", h0=True)
    do, dht = torch.randn(v.shape, dtype=F16), torch.randn(s0.shape)
    _, st, ref = reference(q, k, v, g, s0, dout=do, dstate=dht)
    got = run(q, k, v, g, s0, do, dht, st.float(), dq_BKQ=16, split_BKB=16, split_BV=16)
    for name, x, r in zip(("dq", "dk", "dv"), got, ref):
        assert accuracy.error_over_floor(x, r) <= 2.5, (name, accuracy.error_over_floor(x, r))
    assert accuracy.rel_rms(got[3], ref[3]) < 5e-3  # dg: a reverse sum of differences
    assert accuracy.rel_rms(got[4], ref[4]) < 1e-3


def test_float32_strong_decays_resets_and_chunk_32():
    """float32, log decays in [-6, 0] (a chunk's span of G past the factored limit: the sub-chunk fallback), a
    reset (-inf) on a quarter of the channels at token 40 and -1e30 at token 9: every gradient at float32 noise,
    dg 0 where the floor clamped g; chunk 32, no initial state."""
    torch.manual_seed(1)
    q, k, v, g, _ = make(1, 70, 1, 1, 32, 32, dtype=F32, decay="channel", strong=True)
    g[:, 40, :, :8] = float("-inf")
    g[:, 9, :, 3] = -1e30
    do, dht = torch.randn(v.shape), torch.randn(1, 1, 32, 32)
    _, st, ref = reference(q, k, v, g, None, dout=do, dstate=dht)
    dq, dk, dv, dg = run(q, k, v, g, None, do, dht, st.float(), chunk=32)
    for name, x, r in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        assert accuracy.rel_rms(x, r) < 2e-5, name
    live = g >= -100
    assert (dg[~live] == 0).all()
    assert accuracy.rel_rms(dg[live], ref[3][live]) < 2e-4


@pytest.mark.parametrize("N", [1, 17])
def test_short_sequences_without_states(N):
    """N 1 and 17 (one partial chunk), no initial state, no final-state gradient: dh0 absent, dg from the
    outputs alone."""
    torch.manual_seed(2)
    q, k, v, g, _ = make(1, N, 1, 1, 16, 16, dtype=F32, decay="channel")
    do = torch.randn(v.shape)
    _, _, ref = reference(q, k, v, g, None, dout=do)
    got = run(q, k, v, g, None, do, None, None)
    for name, x, r in zip(("dq", "dk", "dv"), got, ref):
        assert accuracy.rel_rms(x, r) < 2e-5, name
    if N == 1:  # one token: only its diagonal term, which cancels in dG
        assert torch.allclose(got[3].double(), ref[3], atol=1e-6) and (got[3] == 0).all()
    else:
        assert accuracy.rel_rms(got[3], ref[3]) < 2e-4


def test_takes_only_what_it_computes(monkeypatch):
    """The switch (off: nothing), then per-channel decay, phi(x) = x, no beta, q/k heads = v heads, dims <= 128, a
    plan not yet split (run's "split" path calls launch.backward with one)."""
    q, k, v, g, _ = make(1, 8, 1, 1, 16, 16, dtype=F16, decay="channel")
    p = plan(q, v, g, IDENTITY)
    monkeypatch.setattr(configs_gla_bwd, "GLA_BWD_PATH", None)
    assert not kernels_backward_gla.takes(p, q, v, g, None, IDENTITY)
    monkeypatch.setattr(configs_gla_bwd, "GLA_BWD_PATH", "split")
    assert kernels_backward_gla.takes(p, q, v, g, None, IDENTITY)
    assert not kernels_backward_gla.takes(kernels_backward_gla.split_plan(p, q, v, g), q, v, g, None, IDENTITY)
    assert not kernels_backward_gla.takes(p, q, v, g, torch.ones(1, 8, 1), IDENTITY)  # beta
    assert not kernels_backward_gla.takes(p, q, v, g[..., 0], None, IDENTITY)  # a scalar decay
    v2 = torch.randn(1, 8, 2, 16, dtype=F16)
    assert not kernels_backward_gla.takes(p, q, v2, torch.zeros(1, 8, 2, 16), None, IDENTITY)  # grouped heads
    wide = torch.randn(1, 8, 1, 256, dtype=F16)
    assert not kernels_backward_gla.takes(p, wide, wide, torch.zeros(1, 8, 1, 256), None, IDENTITY)


def test_bad_output_buffers_are_refused():
    q, k, v, g, _ = make(1, 8, 1, 1, 16, 16, dtype=F16, decay="channel")
    p = kernels_backward_gla.split_plan(tl_plan(q, v, g, IDENTITY, 64), q, v, g)
    out = dict(dq=torch.empty_like(q), dk=torch.empty_like(k), dv=torch.empty_like(v), dg=torch.empty(1, 8, 1, 8))
    with pytest.raises(ValueError, match="contiguous"):
        kernels_backward_gla.backward(p, v, q, k, v, g, None, None, None, 0.25, out=out)
    out["dg"] = torch.empty(g.shape, dtype=F16)
    with pytest.raises(ValueError, match="float32"):
        kernels_backward_gla.backward(p, v, q, k, v, g, None, None, None, 0.25, out=out)


def test_matches_launch_backward():
    """The same gradients as the shipped path (launch.backward: unsplit kernels, combine kernel), float32."""
    torch.manual_seed(3)
    q, k, v, g, s0 = make(1, 40, 1, 1, 16, 16, dtype=F32, decay="channel", h0=True)
    do, dht, ht = torch.randn(v.shape), torch.randn(s0.shape), torch.randn(s0.shape)
    p = plan(q, v, g, IDENTITY)
    want = launch.backward(p, do, q, k, v, g, None, s0, None, ht, dht, 0.25, IDENTITY, native=True)
    got = kernels_backward_gla.backward(p, do, q, k, v, g, s0, ht, dht, 0.25)
    for name, x, w in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), got, want):
        if w is None:
            assert x is None
        else:
            assert accuracy.rel_rms(x, w) < 2e-5, name


# --------------------------------------------------------------------------------------------
# the chunk-parallel form (kernels_backward_gla_chunked.py)


def run_chunked(q, k, v, g, s0, do, dht, ht, **blocks):
    """kernels_backward_gla_chunked.backward into NaN-filled buffers (every element written): dq, dk, dv, dg, dh0."""
    p = tl_plan(q, v, g, IDENTITY, 64)
    out = dict(dq=torch.full_like(q, NAN), dk=torch.full_like(k, NAN), dv=torch.full_like(v, NAN),
               dg=torch.full_like(g, NAN, dtype=torch.float32))
    if s0 is not None:
        out["dh0"] = torch.full_like(s0, NAN)
    got = kernels_backward_gla_chunked.backward(p, do, q, k, v, g, s0, ht, dht, q.shape[-1] ** -0.5, out=out, **blocks)
    for name, t in out.items():
        assert not torch.isnan(t).any(), f"{name}: some elements were never written"
    assert got[4] is None and (got[1].dtype, got[3].dtype) == (k.dtype, F32)
    return [x for x in got if x is not None]


# (the whole-columns forms by name: dq / dk apart and dk_at take no value loop and no dg from the dqk kernel, whatever
# configs' CHUNKED has)
@pytest.mark.parametrize("options", [{}, dict(dqk_apart=True, dv_BV=32, dqk_VB=None, dg_fused=False)])
def test_chunked_fp16_weak_decays_blocks_and_a_tail(options):
    """fp16, N 45 in chunks of 16 (a partial last chunk), Dk 32 in two key blocks of the dqk kernel and two of the
    dv kernel's score steps, Dv 24 in two value blocks (one partial), states: dq, dk, dv within 2.5x the rounding
    floor, dg, dh0 at fp16's relative error; dq and dk by two launches, the dv kernel's own value block."""
    torch.manual_seed(4)
    q, k, v, g, s0 = make(1, 45, 1, 1, 32, 24, dtype=F16, decay="channel", h0=True)
    do, dht = torch.randn(v.shape, dtype=F16), torch.randn(s0.shape)
    _, st, ref = reference(q, k, v, g, s0, dout=do, dstate=dht)
    got = run_chunked(q, k, v, g, s0, do, dht, st.float(), BT=16, BKB=16, KD=16, BV=16, BK_DG=16, **options)
    for name, x, r in zip(("dq", "dk", "dv"), got, ref):
        assert accuracy.error_over_floor(x, r) <= 2.5, (name, accuracy.error_over_floor(x, r))
    assert accuracy.rel_rms(got[3], ref[3]) < 5e-3
    assert accuracy.rel_rms(got[4], ref[4]) < 1e-3


@pytest.mark.parametrize("options", [dict(wide_apart=False), dict(wide_apart=True, dv_wide_apart=True, walks_fused=True,
                                                                   dk_at=True, dqk_VB=None, dg_fused=False)])
def test_chunked_float32_strong_decays_and_resets(options):
    """float32, log decays in [-6, 0] (the sub-chunk fallback in dq, dk and the dv scores) with a reset and -1e30,
    no initial state, N 40 in chunks of 32 (the first chunk's first key block weak: both forms in one run): float32
    noise, dg 0 where the floor clamped; the fallback in a launch of its own, both walks in one launch."""
    torch.manual_seed(5)
    q, k, v, g, _ = make(1, 40, 1, 1, 16, 16, dtype=F32, decay="channel", strong=True)
    g[:, 20, :, :4] = float("-inf")
    g[:, 3, :, 5] = -1e30
    g[:, 32:, :, :] *= 0.01
    do, dht = torch.randn(v.shape), torch.randn(1, 1, 16, 16)
    _, st, ref = reference(q, k, v, g, None, dout=do, dstate=dht)
    dq, dk, dv, dg = run_chunked(q, k, v, g, None, do, dht, st.float(), BT=32, **options)
    for name, x, r in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        assert accuracy.rel_rms(x, r) < 2e-5, name
    live = g >= -100
    assert (dg[~live] == 0).all()
    assert accuracy.rel_rms(dg[live], ref[3][live]) < 2e-4


def test_chunked_one_token_and_unknown_blocks():
    torch.manual_seed(6)
    q, k, v, g, s0 = make(1, 1, 1, 1, 16, 16, dtype=F32, decay="channel", h0=True)
    do, dht = torch.randn(v.shape), torch.randn(s0.shape)
    _, st, ref = reference(q, k, v, g, s0, dout=do, dstate=dht)
    dq, dk, dv, dg, dh0 = run_chunked(q, k, v, g, s0, do, dht, st.float(), BT=16)
    for name, x, r in zip(("dq", "dk", "dv", "dg", "dh0"), (dq, dk, dv, dg, dh0), ref):
        assert accuracy.rel_rms(x, r) < 2e-5, name  # dg: only the final state's term
    with pytest.raises(ValueError, match="unknown overrides"):
        kernels_backward_gla_chunked.backward(tl_plan(q, v, g, IDENTITY, 64), do, q, k, v, g, s0, None, None, 0.25,
                                              BKQ=16)


@pytest.mark.parametrize("path", ["split", "split_combine", "epilogue", "chunked"])
def test_run_takes_each_path(monkeypatch, path):
    """kernels_backward_gla.run (op.py's _backward_impl calls it where takes) on each configs_gla_bwd.GLA_BWD_PATH:
    float32 gradients against float64 (N 40: a partial chunk at each path's chunk), native and float32 outputs;
    an unknown path is refused."""
    monkeypatch.setattr(configs_gla_bwd, "GLA_BWD_PATH", path)
    torch.manual_seed(7)
    q, k, v, g, s0 = make(1, 40, 1, 1, 16, 16, dtype=F32, decay="channel", h0=True)
    do, dht = torch.randn(v.shape), torch.randn(s0.shape)
    _, st, ref = reference(q, k, v, g, s0, dout=do, dstate=dht)
    p = plan(q, v, g, IDENTITY)
    assert kernels_backward_gla.takes(p, q, v, g, None, IDENTITY)
    dq, dk, dv, dg, dbeta, dh0 = kernels_backward_gla.run(p, do, q, k, v, g, s0, st.float(), dht, 0.25, native=False)
    assert dbeta is None
    for name, x, r in zip(("dq", "dk", "dv", "dg", "dh0"), (dq, dk, dv, dg, dh0), ref):
        assert x.dtype == F32 and accuracy.rel_rms(x, r) < 2e-5, name
    monkeypatch.setattr(configs_gla_bwd, "GLA_BWD_PATH", "fast")
    with pytest.raises(ValueError, match="accepted"):
        kernels_backward_gla.run(p, do, q, k, v, g, s0, st.float(), dht, 0.25)


def test_split_combine_by_key_blocks_fp16(monkeypatch):
    """backward_split (launch's split kernels, dv stored by the dV kernel in fp16, the combine kernel by key blocks
    of 16 here): fp16 N 45, Dk 48 in three combine blocks (one partial), every element written, within 2.5x the
    floor."""
    torch.manual_seed(8)
    q, k, v, g, s0 = make(1, 45, 1, 1, 48, 16, dtype=F16, decay="channel", h0=True)
    do, dht = torch.randn(v.shape, dtype=F16), torch.randn(s0.shape)
    _, st, ref = reference(q, k, v, g, s0, dout=do, dstate=dht)
    p = kernels_backward_gla.split_plan(tl_plan(q, v, g, IDENTITY, 64), q, v, g, 16, dq_BKQ=16, split_BKB=16,
                                        split_BV=16)
    out = dict(dq=torch.full_like(q, NAN), dk=torch.full_like(k, NAN), dv=torch.full_like(v, NAN),
               dg=torch.full_like(g, NAN), dh0=torch.full_like(s0, NAN))
    monkeypatch.setattr(configs_gla_bwd, "COMBINE_KEY_BLOCK", 16)
    got = kernels_backward_gla.backward_split(p, do, q, k, v, g, s0, st.float(), dht, 48 ** -0.5, out=out)
    for name, t in out.items():
        assert not torch.isnan(t).any(), f"{name}: some elements were never written"
    for name, x, r in zip(("dq", "dk", "dv"), got, ref):
        assert accuracy.error_over_floor(x, r) <= 2.5, (name, accuracy.error_over_floor(x, r))
    assert accuracy.rel_rms(got[3], ref[3]) < 5e-3 and accuracy.rel_rms(got[5], ref[4]) < 1e-3
