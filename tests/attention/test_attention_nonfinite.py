"""NaN and inf propagate as in SDPA's math, on every CPU path: the tl and split-key kernels through
the interpreter, the CPU path without it (the float32 math: torch's CPU kernel drops a NaN score,
so such inputs do not take it), and the float64 reference. A row with a NaN or +inf score gives NaN
outputs and lse NaN and its NaN reaches the keys it sees; every other row is untouched; a row with
no key (masked, or every score -inf) gives 0 and lse -inf; a masked score is -inf whatever Q K^T
gave. On a GPU (TRITON_INTERPRET=0), test_gpu_kernels runs the same rows through the compiled tl
and Gluon kernels."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilecore import accuracy, dispatch
from tilecore.ops.attention import attention, attention_reference, launch

from attention_testing import F16, check_lse, make  # tests/attention

PATHS = ["tl", "decode", "cpu"]  # the first two through the interpreter


def run_forward(path, q, k, v, causal, scale, monkeypatch):
    """(out, lse) by ``path``, into NaN-poisoned buffers where a kernel writes them."""
    if path == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        return attention(q, k, v, causal=causal, scale=scale, return_lse=True)
    out = torch.full(q.shape, 7.0, dtype=q.dtype)  # not NaN: a NaN found is the kernel's
    lse = torch.full(q.shape[:3], 7.0)
    launch.forward_into(q, k, v, out, lse, causal, scale, path=path)
    return out, lse


def run_backward(path, dout, q, k, v, out, lse, causal, scale, monkeypatch):
    if path == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        o = attention(qg, kg, vg, causal=causal, scale=scale)
        return torch.autograd.grad(o, (qg, kg, vg), dout)
    grads = [torch.full(t.shape, 7.0, dtype=t.dtype) for t in (q, k, v)]
    launch.backward_into(dout, q, k, v, out, lse, None, *grads, causal, scale, path="tl")
    return grads


def sdpa_math(q, k, v, causal, scale):
    """SDPA's math backend on float32 upcasts (the definition NaN and inf follow)."""
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, scale=scale,
                                              enable_gqa=True)


def poisoned(causal, d=32, dtype=F16):
    """Inputs with four bad query rows: +inf in one element, NaN in one, both, -inf in one (its
    scores are +-inf: a +inf among them); causal with N > Nk, the first 10 rows see no key."""
    q, k, v = make(1, 2, 1, 40, 30 if causal else 40, d, dtype=dtype)
    q[0, 0, 15, 3] = float("inf")
    q[0, 0, 22, 5] = float("nan")
    q[0, 0, 31, 1], q[0, 0, 31, 2] = float("inf"), float("nan")
    q[0, 1, 20, 0] = float("-inf")
    bad = torch.zeros(1, 2, 40, dtype=torch.bool)
    bad[0, 0, [15, 22, 31]] = True
    bad[0, 1, 20] = True
    return q, k, v, bad


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("path", PATHS)
def test_nan_and_inf_scores_give_nan_rows_and_leave_the_others(path, causal, monkeypatch):
    q, k, v, bad = poisoned(causal)
    out, lse = run_forward(path, q, k, v, causal, 0.125, monkeypatch)
    ref, ref_lse = attention_reference(q, k, v, causal=causal, scale=0.125)
    assert torch.equal(torch.isnan(ref).any(-1), bad) and torch.isnan(ref[bad]).all()
    assert torch.equal(torch.isnan(out).any(-1), bad) and torch.isnan(out[bad]).all()
    check_lse(lse, ref_lse)  # NaN exactly where the reference's is: the bad rows
    assert torch.isnan(lse[bad]).all()
    good = ~bad
    assert accuracy.error_over_floor(out[good], ref[good]) <= 2.0
    if causal:  # rows with no key: 0 and -inf, as before
        assert (out[:, :, :10] == 0).all() and torch.isneginf(lse[:, :, :10]).all()
    if not causal:  # SDPA's math agrees (causal, it adds the mask to Q K^T: a masked +inf would be NaN)
        expect = sdpa_math(q, k, v, causal, 0.125)
        assert torch.equal(torch.isnan(expect).any(-1), bad)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("path", ["tl", "cpu"])
def test_nan_rows_reach_the_gradients_of_the_keys_they_see(path, causal, monkeypatch):
    q, k, v, bad = poisoned(causal)
    dout = torch.randn(q.shape, dtype=F16)
    out, lse = run_forward(path, q, k, v, causal, 0.125, monkeypatch)
    dq, dk, dv = run_backward(path, dout, q, k, v, out, lse, causal, 0.125, monkeypatch)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    o64, _ = attention_reference(q64, k64, v64, causal=causal, scale=0.125)
    ref_dq, _, _ = torch.autograd.grad(o64, (q64, k64, v64), dout.double())
    assert torch.isnan(dq[bad]).all()
    good = ~bad
    assert torch.isfinite(dq[good]).all() and accuracy.error_over_floor(dq[good], ref_dq[good]) <= 3.0
    seen = 40 - 10 - 1 if causal else 39  # key 19 is seen by rows 29 on: by bad row 31 (and not 15 or 22)
    assert torch.isnan(dk[0, 0, :seen + 1]).all() and torch.isnan(dv[0, 0, :seen + 1]).all()


@pytest.mark.parametrize("path", PATHS)
def test_a_nan_key_reaches_only_the_rows_that_see_it(path, monkeypatch):
    q, k, v = make(1, 2, 2, 40, 40, 16)
    k[0, 1, 25, 4] = float("nan")
    out, lse = run_forward(path, q, k, v, True, 0.25, monkeypatch)
    assert torch.isnan(out[0, 1, 25:]).all() and torch.isnan(lse[0, 1, 25:]).all()
    assert torch.isfinite(out[0, 1, :25]).all() and torch.isfinite(out[0, 0]).all()
    ref, ref_lse = attention_reference(q, k, v, causal=True, scale=0.25)
    assert accuracy.error_over_floor(out[0, 1, :25], ref[0, 1, :25]) <= 2.0
    check_lse(lse, ref_lse)


@pytest.mark.parametrize("dtype", [F16, torch.float32])
@pytest.mark.parametrize("path", PATHS)
def test_scores_past_float32s_range_give_one_answer_on_every_path(path, dtype, monkeypatch):
    """scale = 1e38: q.k = +-10 overflows to +-inf (a +inf: the row is NaN; all -inf: no key, 0 and
    -inf), |q.k| <= 0.1 stays finite (the row is its best key's value, lse its score), on every path
    and in SDPA's math (float32). Scores within a factor log2(e) of float32's largest value are
    left out: the kernels scale in base 2, where those are already inf (the float64 reference, with
    its wider range, is not compared)."""
    q, k, v = overflowing(16, dtype)
    out, lse = run_forward(path, q, k, v, False, 1e38, monkeypatch)
    check_overflowing(q, k, v, out, lse, 1e38)


def overflowing(d, dtype, big=10.0):
    """Inputs for scale = 1e38 (see the test above): row (0, 0, 3)'s scores all big (+inf once
    scaled), row (0, 1, 7)'s all -big, every other score finite; row (0, 0, 5)'s all near -1e38 (a
    running max that starts at a finite sentinel such as -1e30 took that row for one with no key)."""
    torch.manual_seed(1)
    q = (0.01 * torch.randn(1, 2, 24, d)).to(dtype)
    k = (0.1 * torch.randn(1, 2, 16, d)).to(dtype)
    v = torch.randn(1, 2, 16, d).to(dtype)
    k[..., 0] = 1.0
    q[0, 0, 3] = 0.0
    q[0, 0, 3, 0] = big  # every score +inf
    q[0, 1, 7] = 0.0
    q[0, 1, 7, 0] = -big  # every score -inf
    q[0, 0, 5, 0] = -1.0  # every score about -1e38: finite
    return q, k, v


def check_overflowing(q, k, v, out, lse, scale):
    """``overflowing``'s inputs' (out, lse) against SDPA's math (float32, on the CPU)."""
    q, k, v, out, lse = (t.cpu() for t in (q, k, v, out, lse))
    dtype = q.dtype
    expect = sdpa_math(q, k, v, False, scale)
    nan_rows = torch.isnan(expect).any(-1)
    assert nan_rows[0, 0, 3] and nan_rows.sum() == 1
    assert torch.equal(torch.isnan(out).any(-1), nan_rows) and torch.isnan(lse[0, 0, 3])
    assert (out[0, 1, 7] == 0).all() and (expect[0, 1, 7] == 0).all() and torch.isneginf(lse[0, 1, 7])
    live = ~nan_rows
    assert torch.equal(out[live].float(), expect[live].to(dtype).float())  # each row one key's value
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    finite = live.clone()
    finite[0, 1, 7] = False
    assert torch.allclose(lse[finite], scores.amax(-1)[finite], rtol=1e-5)
    assert lse[0, 0, 5] < -1e35 and (out[0, 0, 5] != 0).any()


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available() or dispatch.interpreter_enabled(),
                               reason="the compiled kernels: a GPU and TRITON_INTERPRET=0")


@needs_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("path", ["tl", "gluon"])
def test_gpu_kernels(path, causal):
    """The compiled kernels on the poisoned rows, forward and backward, against the float64
    reference: NaN rows and lse NaN where it has them, the other rows near it (not run in CI)."""
    dev = torch.device("cuda")
    if path == "gluon" and not dispatch.is_hopper(dev):
        pytest.skip("the Gluon kernels run on Hopper")
    q, k, v, bad = poisoned(causal, d=64, dtype=torch.bfloat16)
    ref, ref_lse = attention_reference(q, k, v, causal=causal, scale=0.125)
    qc, kc, vc = (t.to(dev) for t in (q, k, v))
    out, lse = torch.full_like(qc, 7.0), torch.full(q.shape[:3], 7.0, device=dev)
    launch.forward_into(qc, kc, vc, out, lse, causal, 0.125, path=path)
    out, lse = out.cpu(), lse.cpu()
    assert torch.equal(torch.isnan(out).any(-1), bad) and torch.isnan(out[bad]).all()
    check_lse(lse, ref_lse)
    assert accuracy.error_over_floor(out[~bad], ref[~bad]) <= 2.0
    dout = torch.randn(q.shape, dtype=q.dtype)
    grads = [torch.full_like(t, 7.0) for t in (qc, kc, vc)]
    launch.backward_into(dout.to(dev), qc, kc, vc, out.to(dev), lse.to(dev), None, *grads, causal, 0.125, path=path)
    dq, dk, dv = (g.cpu() for g in grads)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    o64, _ = attention_reference(q64, k64, v64, causal=causal, scale=0.125)
    ref_dq, _, _ = torch.autograd.grad(o64, (q64, k64, v64), dout.double())
    assert torch.isnan(dq[bad]).all() and accuracy.error_over_floor(dq[~bad], ref_dq[~bad]) <= 3.0
    seen = 40 - 10 - 1 if causal else 39
    assert torch.isnan(dk[0, 0, :seen + 1]).all() and torch.isnan(dv[0, 0, :seen + 1]).all()


@needs_gpu
@pytest.mark.parametrize("path", ["tl", "gluon"])
def test_gpu_kernels_scores_past_float32s_range(path):
    """Scores past float32's range on the compiled kernels (as
    test_scores_past_float32s_range_give_one_answer_on_every_path): the Gluon forward's running max
    starts at -inf, so a row of finite scores below -1e30 is kept (its former -1e30 start wrote such
    a row as 0 with lse -inf). The scale makes scale * log2(e) a power of two, 2^120: the Gluon
    kernel takes that factor inside the exponent's FMA (exp2(s * c - m), m the rounded max of s * c),
    which gives the best score p = exp2(s c - rn(s c)) instead of 1, a factor every p of the row
    shares until it overflows or flushes to 0 (|s c| past ~2^31, as at scale 1e38; as in
    FlashAttention-2/3's kernels; notes/attention/README.md); exact products keep it 1."""
    dev = torch.device("cuda")
    if path == "gluon" and not dispatch.is_hopper(dev):
        pytest.skip("the Gluon kernels run on Hopper")
    scale = 2.0 ** 120 / math.log2(math.e)
    q, k, v = (t.to(dev) for t in overflowing(64, torch.bfloat16, big=1000.0))
    out, lse = torch.full_like(q, 7.0), torch.full(q.shape[:3], 7.0, device=dev)
    launch.forward_into(q, k, v, out, lse, False, scale, path=path)
    check_overflowing(q, k, v, out, lse, scale)
