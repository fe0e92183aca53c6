"""The split dK/dV backward (launch.backward_plan(split=True): kernels_tl.la_bwd_dkv_kernel PART 1 writes
dk with a head's every value column, PART 2 dv with every key channel, no partial sums) and the backward's
gradients stored by the kernels in the inputs' dtype (native): against the float64 recurrence, into
NaN-filled buffers (every element written), with and without a decay, beta, grouped q/k heads, initial
and final states, several key/value blocks and a ragged last chunk."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.linear_attention import configs, launch, linear_attention
from tilecore.ops.linear_attention.plan import IDENTITY, tl_plan

from la_testing import F16, F32, make, reference

SMALL_SPLIT = dict(split_BT=16, split_BKB=16, split_BV=16, dq_BKQ=16)  # several blocks at head dims of 32


def _split_plan(q, v, g, **over):
    return launch.backward_plan(tl_plan(q, v, g, IDENTITY, 16), q, v, g, IDENTITY, None, split=True,
                                **{**SMALL_SPLIT, **over})


@pytest.mark.parametrize("decay,beta,group", [(None, False, 1), ("scalar", True, 2), ("channel", False, 1)])
def test_split_kernels_write_every_element_and_match_float64(decay, beta, group):
    torch.manual_seed(1)
    B, N, Hqk, Dk, Dv = 1, 37, 1, 32, 48  # N: a ragged last chunk; Dv: not a power of two
    H = Hqk * group
    q, k, v, g, s0 = make(B, N, Hqk, H, Dk, Dv, dtype=F32, decay=decay, h0=True)
    bt = torch.rand(B, N, H) + 0.5 if beta else None
    do, dht = torch.randn(B, N, H, Dv), torch.randn(B, H, Dk, Dv)
    p = _split_plan(q, v, g)
    assert launch.part_counts(p) == (1, 1)
    nan = float("nan")
    dq = torch.full((B, N, H, Dk), nan)
    dkp, dvp = torch.full((1, B, N, H, Dk), nan), torch.full((1, B, N, H, Dv), nan)
    dh0 = torch.full((B, H, Dk, Dv), nan)
    r = torch.full((B, N, H), nan) if launch.strict_diagonal(IDENTITY, g) else None
    scale = Dk ** -0.5
    calls = launch.backward_calls(p, do, q, k, v, g, bt, s0, dht, dq, dkp, dvp, dh0, scale, IDENTITY, r)
    assert [c[3]["PART"] for c in calls[1:]] == [1, 2]
    assert calls[1][1][0] == B * H * 2 and calls[2][1][0] == B * H * 3  # key blocks of 16, value blocks of 16
    for kernel, grid, args, kw in calls:
        kernel[grid](*args, **kw)
    for name, t in (("dq", dq), ("dk", dkp), ("dv", dvp), ("dh0", dh0), ("r", r)):
        assert t is None or not torch.isnan(t).any(), f"{name}: some elements were never written"
    # the whole backward on the split plan against float64 (beta enters through the reference's k and v)
    buffers = (dq, dkp, dvp, dh0, r)
    o, ht, _ = launch.forward(p, q, k, v, g, bt, None, None, s0, scale, IDENTITY, final_state=True,
                              keep_linear=False)
    got = launch.backward_combine_kernel(buffers, q, k, v, g, bt, ht, dht)
    want = launch.backward(tl_plan(q, v, g, IDENTITY, 16), do, q, k, v, g, bt, s0, None, ht, dht, scale, IDENTITY)
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), got, want):
        assert (a is None) == (b is None), name
        if a is not None:
            assert accuracy.rel_rms(a, b) < 2e-5, (name, accuracy.rel_rms(a, b))
    if beta:  # the unsplit path itself against float64 is test_linear_attention's; here one direct check
        return
    _, _, ref = reference(q, k, v, g, s0, dout=do, dstate=dht)
    for name, a, b in zip(("dq", "dk", "dv"), got, ref):
        assert accuracy.rel_rms(a, b) < 2e-5, name


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("decay", [None, "scalar"])
def test_autograd_gradients_in_the_inputs_dtype(monkeypatch, split, decay):
    """Through the op and autograd, fp16: the gradients come in fp16, at the rounding floor of the float64
    reference's (the kernels store them; no float32 buffers cast after)."""
    if split:
        monkeypatch.setattr(configs, "BWD_SPLIT_KINDS", (0, 1))
        small = dict(BT=16, BKB=16, BV=16, warps=4, stages=2)
        monkeypatch.setattr(configs, "BWD_SPLIT", {0: small, 1: small})
        small_dq = dict(BKQ=16, warps=4, stages=3)
        monkeypatch.setattr(configs, "BWD_SPLIT_DQ", {0: small_dq, 1: small_dq})
    torch.manual_seed(2)
    B, N, H, D = 1, 40, 2, 32
    q, k, v, g, s0 = make(B, N, H, H, D, D, dtype=F16, decay=decay, h0=True)
    inputs = [t.requires_grad_() for t in (q, k, v, g, s0) if t is not None]
    o, ht = linear_attention(q, k, v, decay=g, initial_state=s0, return_final_state=True)
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    grads = torch.autograd.grad((o.float() * do.float()).sum() + (ht * dht).sum(), inputs)
    _, _, ref = reference(q, k, v, g, s0, dout=do, dstate=dht)
    for name, a, b in zip(("dq", "dk", "dv"), grads, ref):
        assert a.dtype == F16, name
        assert not torch.isnan(a).any(), name
        assert accuracy.error_over_floor(a, b) < 2.5, (name, accuracy.error_over_floor(a, b))
    if decay:
        assert accuracy.rel_rms(grads[3], ref[3]) < 5e-3


def test_native_buffers_are_the_outputs():
    """Without a decay, beta or head groups, the kernels' buffers are the gradients themselves in the inputs'
    dtype (nothing combined, nothing cast); with a decay dq and dk stay float32 (the combine reads them)."""
    q, k, v, g, _ = make(1, 20, 2, 2, 16, 16, dtype=F16)
    out = dict(dq=F16, dk=F16, dv=F16)
    for split in (False, True):
        p = launch.backward_plan(tl_plan(q, v, None, IDENTITY), q, v, None, IDENTITY, None, split=split)
        dq, dkp, dvp, _, _ = launch.backward_kernels(p, torch.randn(v.shape, dtype=F16), q, k, v, None, None, None,
                                                     None, 0.25, IDENTITY, out_dtypes=out)
        assert (dq.dtype, dkp.dtype, dvp.dtype) == (F16, F16, F16)
    g = -torch.rand(1, 20, 2)
    p = tl_plan(q, v, g, IDENTITY)
    dq, dkp, dvp, _, r = launch.backward_kernels(p, torch.randn(v.shape), q, k, v, g, None, None, None, 0.25, IDENTITY,
                                                 out_dtypes=out)
    assert dq.dtype == F32 and dkp.dtype == F32 and r is not None


def test_backward_plan_rejects_unknown_options():
    q, k, v, g, _ = make(1, 4, 1, 1, 16, 16, dtype=F32)
    with pytest.raises(ValueError, match="split_BKB"):
        launch.backward_plan(tl_plan(q, v, None, IDENTITY), q, v, None, IDENTITY, None, split_bkb=16)


@pytest.mark.parametrize("beta,group", [(True, 2), (False, 1)])
def test_split_epilogue_writes_every_element_and_matches_the_combine(beta, group):
    """The split path's kernels doing the combine's work (scalar decay: the diagonal added back, beta applied,
    the decay's and beta's per-token parts) against the same kernels followed by the combine kernel and
    against float64; every element of dq, dk, dv and the parts written."""
    torch.manual_seed(3)
    B, N, Hqk, Dk, Dv = 1, 37, 1, 32, 48
    H = Hqk * group
    q, k, v, g, s0 = make(B, N, Hqk, H, Dk, Dv, dtype=F32, decay="scalar", h0=True)
    g[:, 5] = float("-inf")  # a reset: the floor's zero gradient
    bt = torch.rand(B, N, H) + 0.5 if beta else None
    do, dht = torch.randn(B, N, H, Dv), torch.randn(B, H, Dk, Dv)
    scale = Dk ** -0.5
    p = _split_plan(q, v, g)
    p_combine = _split_plan(q, v, g, split_epilogue=False)
    assert launch.split_epilogue(p, g, IDENTITY) and not launch.split_epilogue(p_combine, g, IDENTITY)
    nan = float("nan")
    bufs = [torch.full((B, N, H, Dk), nan), torch.full((1, B, N, H, Dk), nan), torch.full((1, B, N, H, Dv), nan)]
    parts = (torch.full((2, B, N, H), nan), torch.full((2, B, N, H), nan), torch.full((3, B, N, H), nan) if beta
             else None)
    for kernel, grid, args, kw in launch.backward_calls(p, do, q, k, v, g, bt, None, None, *bufs, None, scale,
                                                        IDENTITY, bufs[0], epilogue=parts):
        kernel[grid](*args, **kw)
    for name, t in zip(("dq", "dk", "dv", "dG q", "dG k", "dbeta"), (*bufs, *parts)):
        assert t is None or not torch.isnan(t).any(), f"{name}: some elements were never written"
    _, ht, _ = launch.forward(p, q, k, v, g, bt, None, None, s0, scale, IDENTITY, final_state=True, keep_linear=False)
    got = launch.backward(p, do, q, k, v, g, bt, s0, None, ht, dht, scale, IDENTITY)
    want = launch.backward(p_combine, do, q, k, v, g, bt, s0, None, ht, dht, scale, IDENTITY)
    names = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
    for name, a, b in zip(names, got, want):
        assert (a is None) == (b is None), name
        if a is not None:
            assert accuracy.rel_rms(a, b) < 2e-6, (name, accuracy.rel_rms(a, b))
    assert (got[3][:, 5] == 0).all()
    leaves = [t.double().requires_grad_() for t in (q, k, v, g)] + ([bt.double().requires_grad_()] if beta else [])
    from tilecore.ops.linear_attention import linear_attention_reference
    o_ref, st_ref = linear_attention_reference(*leaves[:3], decay=leaves[3], scale=scale, initial_state=s0.double(),
                                               beta=leaves[4] if beta else None)
    ref = torch.autograd.grad((o_ref * do.double()).sum() + (st_ref * dht.double()).sum(), leaves)
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta"), [t for t in got if t is not None], ref):
        live = g >= -100 if name == "dg" else slice(None)
        assert accuracy.rel_rms(a[live], b[live]) < 1e-4, (name, accuracy.rel_rms(a[live], b[live]))


def test_kernels_read_do_as_the_gpu_checked_them():
    """launch.kernel_do: the unsplit backward with a decay reads float32 do (its dQ kernel reading bf16 do
    was wrong on the H100, run 2 of session 27: Mamba-2 with D and no gate), the split path do in v's dtype
    (bf16 checked there), and without a decay do as it comes."""
    q, k, v, g, _ = make(1, 8, 1, 1, 16, 16, dtype=torch.bfloat16, decay="scalar")
    do = torch.randn(v.shape, dtype=torch.bfloat16)
    unsplit = launch.backward_plan(tl_plan(q, v, g, IDENTITY), q, v, g, IDENTITY, None, split=False)
    split = launch.backward_plan(tl_plan(q, v, g, IDENTITY), q, v, g, IDENTITY, None, split=True)
    assert launch.kernel_do(unsplit, do, v, g).dtype == F32
    assert launch.kernel_do(split, do.float(), v, g).dtype == torch.bfloat16
    assert launch.kernel_do(unsplit, do, v, None) is do
    # the default follows configs.BWD_SPLIT_KINDS (the scalar decay: checked, untimed, off)
    assert bool(launch.backward_plan(tl_plan(q, v, g, IDENTITY), q, v, g, IDENTITY).config.get("split")) \
        == (1 in configs.BWD_SPLIT_KINDS)
