"""Issue 35 part A: sliding window (window_size), logit softcap and v's head size Dv != D in
tilecore.attention, forward and backward, against the float64 reference (reference.py).

The tl kernels (query-block forward, split-key decode, backward) run in Triton's interpreter on
float16 (its bf16 dot is wrong); outputs are poisoned with NaN first, so every element must be
written. Block-range skipping is checked by poisoning K/V (or Q/dO) rows that no program may load
with NaN: a masked score's p is 0, but 0 x NaN in P V (or P^T dO) is NaN, so a load shows. The CPU
path without the interpreter (torch's flash kernel with the window's mask, or float32 math) is
checked in float32 too (issue 35: float32 CPU tensors)."""
import pytest
import torch
import triton
import triton.language as tl

from tilecore import accuracy
from tilecore.ops.attention import attention, launch, plan
from tilecore.ops.attention.kernels_tl import tanh_from_exp2
from tilecore.ops.attention.reference import attention_reference
from tilecore.ops.attention_decode import plan as decode_plan

F16 = torch.float16
NAN = float("nan")


def inputs(b, hq, hkv, n, nk, d, dv, dtype=F16, spread=1.0):
    q = torch.randn(b, hq, n, d, dtype=torch.float32).mul(spread).to(dtype)
    k = torch.randn(b, hkv, nk, d, dtype=dtype)
    v = torch.randn(b, hkv, nk, dv, dtype=dtype)
    return q, k, v


def reference(q, k, v, causal, scale, window, softcap, dout):
    """(O, lse, dq, dk, dv) in float64 (autograd through the reference)."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o, lse = attention_reference(q64, k64, v64, causal=causal, scale=scale, window_size=window, softcap=softcap)
    grads = torch.autograd.grad(o, (q64, k64, v64), dout.double()) if o.numel() else (None,) * 3
    return (o.detach(), lse.detach(), *grads)


def run_kernels(q, k, v, causal, scale, window, softcap, dout, **options):
    """(O, lse, dq, dk, dv) by launch.forward_into / backward_into into NaN-poisoned buffers."""
    b, hq, n, _ = q.shape
    out = torch.full((b, hq, n, v.shape[-1]), NAN, dtype=q.dtype)
    lse = torch.full((b, hq, n), NAN)
    launch.forward_into(q, k, v, out, lse, causal, scale, window, softcap, **options)
    grads = [torch.full(t.shape, NAN, dtype=t.dtype) for t in (q, k, v)]
    launch.backward_into(dout, q, k, v, out, lse, None, *grads, causal, scale, window, softcap)
    return (out, lse, *grads)


def assert_near(got, ref, floors):
    assert not torch.isnan(got).any(), "an element was not written (or a NaN was loaded)"
    if ref.abs().max() == 0:  # e.g. dq where each row sees one key: 0 up to rounding
        assert got.abs().max() <= 1e-4
    else:
        err = accuracy.error_over_floor(got, ref)
        assert err <= floors, f"{err:.2f} x the rounding floor"


def assert_lse(lse, ref):
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref))
    live = torch.isfinite(ref)
    assert torch.allclose(lse[live].double(), ref[live], rtol=1e-4, atol=1e-4)


# B, Hq, Hkv, N, Nk, D, Dv, causal, window, softcap: windows bounded on one side or both, with
# causal, N > Nk (leading rows with no key), N < Nk, GQA, Dv < D and Dv > D, softcap alone and with
# every other feature. Interpreter blocks: forward 32 x 16, backward 16 x 32, decode 16 keys.
CASES = [
    (1, 2, 1, 40, 40, 16, 16, False, (9, 4), 0.0),
    (1, 2, 2, 24, 40, 32, 32, True, (17, -1), 0.0),
    (1, 2, 1, 50, 20, 16, 16, False, (5, 0), 0.0),  # rows before 25 see no key
    (1, 2, 2, 20, 20, 16, 16, False, (0, 0), 0.0),  # the diagonal alone
    (1, 2, 2, 30, 34, 32, 32, True, (-1, -1), 5.0),
    (1, 4, 2, 30, 37, 32, 16, False, (-1, -1), 0.0),  # Dv < D
    (1, 2, 1, 30, 35, 16, 48, True, (12, -1), 2.0),  # Dv > D (not a power of two), window, softcap, MQA
]
IDS = [f"N{c[3]}-Nk{c[4]}-D{c[5]}/{c[6]}-{'causal' if c[7] else 'full'}-w{c[8][0]},{c[8][1]}-cap{c[9]}"
       for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_tl_kernels_match_the_reference(case):
    b, hq, hkv, n, nk, d, dv, causal, window, softcap = case
    q, k, v = inputs(b, hq, hkv, n, nk, d, dv)
    scale = d ** -0.5
    dout = torch.randn(b, hq, n, dv, dtype=F16)
    got = run_kernels(q, k, v, causal, scale, window, softcap, dout)
    ref = reference(q, k, v, causal, scale, window, softcap, dout)
    assert got[0].shape == (b, hq, n, dv)
    assert_near(got[0], ref[0], 1.6)
    assert_lse(got[1], ref[1])
    for g, r in zip(got[2:], ref[2:]):
        assert_near(g, r, 2.5)


@pytest.mark.parametrize("window,softcap", [((6, 0), 0.0), ((-1, 2), 3.0), ((3, 3), 0.0)])
def test_decode_path_matches_the_reference(window, softcap):
    """The split-key kernel (several key ranges, merged) with windows and softcap, GQA and Dv != D."""
    q, k, v = inputs(1, 4, 1, 3, 200, 32, 16)
    p = plan.plan_forward(q, k, v, False, 0.2, window=window, softcap=softcap)
    assert p.path == "decode" and p.grid[1] > 1
    out = torch.full((1, 4, 3, 16), NAN, dtype=F16)
    lse = torch.full((1, 4, 3), NAN)
    launch.forward(p, q, k, v, out, lse, False, 0.2, window, softcap)
    ref_o, ref_lse = attention_reference(q, k, v, scale=0.2, window_size=window, softcap=softcap)
    assert_near(out, ref_o, 1.6)
    assert_lse(lse, ref_lse)


def test_blocks_outside_every_window_are_never_loaded():
    """Forward: 32 queries at key positions 96..127 with a window of 8 keys to the left: the key
    blocks before 80 (16-key blocks) are outside every row's window; their V rows are NaN, which P V
    would spread (p = 0 times NaN). Backward: 128 queries against 16 keys with window (0, 8): query
    rows before 104 see no key, and the dk/dv program must not load the blocks before 96 (NaN Q and
    dO; 16-row blocks)."""
    q, k, v = inputs(1, 2, 1, 32, 128, 16, 16)
    v[:, :, :80] = NAN
    k[:, :, :80] = NAN
    for path in ("tl", "decode"):
        out = torch.full((1, 2, 32, 16), NAN, dtype=F16)
        lse = torch.full((1, 2, 32), NAN)
        launch.forward_into(q, k, v, out, lse, False, 0.25, (8, 0), 0.0, path=path)
        ref_o, _ = attention_reference(q, k[:, :, 80:], v[:, :, 80:], scale=0.25, window_size=(8, 0))
        assert_near(out, ref_o, 1.6)

    q, k, v = inputs(1, 2, 1, 128, 16, 16, 16)
    dout = torch.randn(1, 2, 128, 16, dtype=F16)
    q[:, :, :96] = NAN
    dout[:, :, :96] = NAN
    got = run_kernels(q, k, v, False, 0.25, (0, 8), 0.0, dout, path="tl")
    rows = slice(96, 128)
    ref = reference(q[:, :, rows], k, v, False, 0.25, (0, 8), 0.0, dout[:, :, rows])  # the same windows
    assert torch.all(got[0][:, :, :104] == 0) and torch.all(torch.isneginf(got[1][:, :, :104]))
    assert_near(got[0][:, :, rows], ref[0], 1.6)
    assert torch.all(got[2][:, :, :96] == 0)
    assert_near(got[2][:, :, rows], ref[2], 2.5)
    assert_near(got[3], ref[3], 2.5)
    assert_near(got[4], ref[4], 2.5)


def test_softcap_saturated_scores():
    """Scores far past the cap (q x 60): tanh saturates to +-1 without overflow, as the reference."""
    q, k, v = inputs(1, 2, 2, 20, 28, 16, 16, spread=60.0)
    dout = torch.randn(1, 2, 20, 16, dtype=F16)
    got = run_kernels(q, k, v, True, 0.25, (-1, -1), 4.0, dout)
    ref = reference(q, k, v, True, 0.25, (-1, -1), 4.0, dout)
    for g, r, floors in zip(got, ref, (1.6, None, 2.5, 2.5, 2.5)):
        if floors is None:
            assert_lse(g, r)
        else:
            assert_near(g, r, floors)


@triton.jit
def _tanh_kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(Y + offs, tanh_from_exp2(tl.load(X + offs, mask=offs < n)), mask=offs < n)


def test_tanh_from_exp2_is_stable_everywhere():
    x = torch.tensor([float("-inf"), -1e30, -100.0, -3.0, -1e-3, -1e-30, 0.0, 1e-30, 1e-6, 0.3, 5.0, 88.0,
                      1e30, float("inf"), NAN])
    y = torch.empty_like(x)
    _tanh_kernel[(1,)](x, y, x.numel(), BLOCK=16)
    ref = torch.tanh(x.double())
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    assert torch.allclose(y.double()[~torch.isnan(ref)], ref[~torch.isnan(ref)], rtol=0, atol=2e-7)


def test_mla_prefill_head_sizes():
    """DeepSeek MLA prefill: q and k of head size 192, v of 128 (scaled down in N), tl forward and
    backward."""
    q, k, v = inputs(1, 2, 2, 20, 20, 192, 128)
    dout = torch.randn(1, 2, 20, 128, dtype=F16)
    long_q, long_v = torch.empty(1, 16, 4096, 192, dtype=F16), torch.empty(1, 16, 4096, 128, dtype=F16)
    assert plan.plan_forward(long_q, long_q, long_v, True, 192 ** -0.5).path == "tl"
    got = run_kernels(q, k, v, True, 192 ** -0.5, (-1, -1), 0.0, dout, path="tl")
    ref = reference(q, k, v, True, 192 ** -0.5, (-1, -1), 0.0, dout)
    assert_near(got[0], ref[0], 1.6)
    for g, r in zip(got[2:], ref[2:]):
        assert_near(g, r, 2.5)


def test_mla_decode_576_512_with_128_heads_over_one_latent():
    """MLA decode: 128 q heads over one kv head (the latent), q/k 576 (Q K^T by 64-column chunks), v
    512: the split-key path, which packs the 128 heads into tiles of 32 rows."""
    q, k, v = inputs(1, 128, 1, 1, 24, 576, 512)
    p = plan.plan_forward(q, k, v, False, 576 ** -0.5)
    assert p.path == "decode" and p.config["BLOCK_M"] == 32
    out = torch.full((1, 128, 1, 512), NAN, dtype=F16)
    lse = torch.full((1, 128, 1), NAN)
    launch.forward(p, q, k, v, out, lse, False, 576 ** -0.5)
    ref_o, ref_lse = attention_reference(q, k, v, scale=576 ** -0.5)
    assert_near(out, ref_o, 1.6)
    assert_lse(lse, ref_lse)


def test_large_head_dims_forward_and_backward():
    """Head dims past 256 take the split-key kernel at any N (forward) and the tl backward."""
    q, k, v = inputs(1, 2, 1, 6, 12, 320, 288)
    dout = torch.randn(1, 2, 6, 288, dtype=F16)
    assert plan.plan_forward(q, k, v, True, 0.05).path == "decode"
    long_q, long_kv = torch.empty(1, 64, 600, 320, dtype=F16), torch.empty(1, 64, 600, 320, dtype=F16)
    assert not decode_plan.decode_fits(long_q, long_kv)
    assert plan.plan_forward(long_q, long_kv, long_kv, True, 0.05).path == "decode"
    got = run_kernels(q, k, v, True, 0.05, (3, -1), 0.0, dout)
    ref = reference(q, k, v, True, 0.05, (3, -1), 0.0, dout)
    assert_near(got[0], ref[0], 1.6)
    for g, r in zip(got[2:], ref[2:]):
        assert_near(g, r, 2.5)


def test_public_function_autograd_in_the_interpreter():
    q, k, v = (t.requires_grad_() for t in inputs(1, 4, 2, 18, 22, 16, 8))
    out, lse = attention(q, k, v, causal=True, window_size=(7, 2), softcap=3.0, return_lse=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad((out * dout).sum(), (q, k, v))
    ref = reference(q, k, v, True, 0.25, (7, 2), 3.0, dout)
    assert out.shape == (1, 4, 18, 8)
    assert_near(out, ref[0], 1.6)
    for g, r in zip(grads, ref[2:]):
        assert_near(g, r, 2.5)


# --------------------------------------------------------------------------------------------
# the CPU without the interpreter: torch's flash kernel (a window as its mask) or float32 math


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("window,softcap,dv,path", [((5, 2), 0.0, 32, "sdpa"), ((-1, 0), 0.0, 32, "sdpa"),
                                                    ((3, -1), 0.0, 32, "sdpa"), ((-1, -1), 2.0, 32, "reference"),
                                                    ((4, 4), 1.0, 16, "reference")])
def test_cpu_paths(monkeypatch, dtype, window, softcap, dv, path):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = (t.requires_grad_() for t in inputs(2, 4, 2, 40, 30, 32, dv, dtype=dtype))
    assert plan.plan_forward(q, k, v, False, 0.2, window=window, softcap=softcap).path == path
    out, lse = attention(q, k, v, scale=0.2, window_size=window, softcap=softcap, return_lse=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad((out * dout).sum(), (q, k, v))
    ref = reference(q, k, v, False, 0.2, window, softcap, dout)
    assert out.dtype == dtype and out.shape == (2, 4, 40, dv)
    assert_lse(lse, ref[1])
    for got, r in zip((out, *grads), (ref[0], *ref[2:])):
        if dtype == torch.float32:
            assert accuracy.rel_rms(got, r) < 1e-5
        else:
            assert_near(got, r, 3.0)


def test_compile_fullgraph_with_the_new_options(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = inputs(1, 4, 2, 12, 16, 24, 8, dtype=torch.float32)
    torch.library.opcheck(torch.ops.tilecore.attention_forward.default, (q, k, v, False, 0.3, 4, 1, 2.0),
                          test_utils=("test_schema", "test_faketensor"))
    out = attention(q, k, v, scale=0.3, window_size=(4, 1), softcap=2.0)

    def f(q, k, v):
        return attention(q, k, v, scale=0.3, window_size=(4, 1), softcap=2.0)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert torch.allclose(compiled(q, k, v), out, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window", [(-2, 0), (0, -5), (1.5, 0), ("8", 0), (True, 0), (3,), (1, 2, 3), 4, None])
def test_bad_windows_are_refused(window):
    q, k, v = inputs(1, 2, 2, 4, 4, 16, 16)
    with pytest.raises((TypeError, ValueError), match="window_size must be a pair"):
        attention(q, k, v, window_size=window)


@pytest.mark.parametrize("softcap", [-1.0, float("nan"), float("inf"), True, "2", None])
def test_bad_softcaps_are_refused(softcap):
    q, k, v = inputs(1, 2, 2, 4, 4, 16, 16)
    with pytest.raises((TypeError, ValueError), match="softcap must be a finite real number >= 0"):
        attention(q, k, v, softcap=softcap)


def test_shape_errors_name_what_is_accepted():
    q, k, v = inputs(1, 2, 2, 4, 4, 16, 8)
    with pytest.raises(ValueError, match="same \\(batch, kv_heads, keys\\)"):
        attention(q, k, v[:, :, :3])
    with pytest.raises(ValueError, match="head_dim"):
        attention(q, k, torch.randn(1, 2, 4, 600, dtype=F16))


def test_gluon_plans_take_only_what_the_kernels_do():
    """The Gluon forward takes a window and a softcap (forced, or where configs.GLUON_FORWARD_FEATURES
    names them) and of the Dv != D pairs only MLA's (192, 128) (session 27; tests/attention/test_mla_gluon.py);
    the Gluon backward and dq kernels take window and softcap too since session 26
    (tests/attention/test_window_softcap_gluon.py)."""
    q, k, v = inputs(1, 2, 2, 4, 4, 16, 8)
    with pytest.raises(ValueError, match=r"head dims 64 and 128 with v's as q's, or \(q's, v's\) in \[\(192, 128\)\]"):
        plan.plan_forward(q, k, v, False, 0.25, path="gluon")
    assert plan.features(q, v, True) == {"dv"}
    assert plan.features(q, q, True, (-1, 3)) == set()  # causal folds the right edge to 0
    assert plan.features(q, q, False, (2, -1), 1.0) == {"window", "softcap"}
