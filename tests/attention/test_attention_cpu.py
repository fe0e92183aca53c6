"""tilecore.attention on CPU tensors without Triton's interpreter: torch's own CPU attention kernel
(SDPA's flash kernel, forward and backward, with its lse) in float32, bfloat16 and float16, against
the float64 reference; tilecore's bottom-right causal where N != Nk; the float32 math, a block of
query rows at a time, where a score may not be finite."""
import pytest
import torch
import torch.nn.functional as F

from tilecore import accuracy
from tilecore.ops.attention import attention, attention_reference, launch, plan
from tilecore.ops.attention_cpu import launch as cpu_launch

from attention_testing import check_lse, make, reference_grads  # tests/attention

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# B, Hq, Hkv, N, Nk, D, causal: GQA and MQA, N < Nk (the bottom-right mask), N > Nk (rows with no
# key), N = Nk (the kernel's own causal), D not a power of two
CASES = [
    (1, 4, 2, 30, 20, 48, True),
    (2, 2, 2, 17, 40, 16, True),
    (1, 4, 1, 33, 33, 64, True),
    (1, 2, 2, 10, 50, 32, False),
    (2, 6, 3, 1, 37, 64, True),
]
IDS = [f"B{b}-H{h}/{hk}-N{n}-Nk{nk}-D{d}-{'causal' if c else 'full'}" for b, h, hk, n, nk, d, c in CASES]


@pytest.fixture(autouse=True)
def _no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")


def near(out, ref, floors: float) -> bool:
    """Within ``floors`` rounding floors of out's dtype; float32: relative RMS error below 1e-5."""
    if out.dtype == torch.float32:
        return accuracy.rel_rms(out, ref) < 1e-5
    return accuracy.error_over_floor(out, ref) <= floors


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_and_backward_match_the_reference(case, dtype):
    b, hq, hkv, n, nk, d, causal = case
    q, k, v = make(*case[:6], dtype=dtype, grad=True)
    scale = 0.2
    assert plan.plan_forward(q, k, v, causal, scale).path == "sdpa"
    out, lse = attention(q, k, v, causal=causal, scale=scale, return_lse=True)
    ref, ref_lse = attention_reference(q.detach(), k.detach(), v.detach(), causal=causal, scale=scale)
    assert out.dtype == dtype and near(out, ref, 1.5)
    # the kernel's exp for bf16 and fp16 is a fast one (~1e-5 relative): lse within 1e-4
    check_lse(lse, ref_lse, 1e-5 if dtype == torch.float32 else 1e-4)
    if causal and n > nk:
        assert (out[:, :, :n - nk] == 0).all() and torch.isneginf(lse[:, :, :n - nk]).all()
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    loss = (out.float() * dout.float()).sum() + (torch.where(torch.isneginf(lse), 0.0, lse) * dlse).sum()
    grads = torch.autograd.grad(loss, (q, k, v))
    for g, r in zip(grads, reference_grads(q, k, v, dout, dlse, causal, scale)):
        assert g.dtype == dtype and near(g, r, 3.0)  # torch's CPU backward: up to 2.7 here


def test_without_the_kernels_grouped_heads(monkeypatch):
    """Where torch's CPU kernel does not take grouped heads (torch < 2.5), kv heads are repeated for it
    and their gradients summed back: the same answer."""
    q, k, v = make(1, 6, 2, 20, 31, 32, dtype=torch.float32, grad=True)
    dout = torch.randn(q.shape)
    answers = []
    for native in (True, False):
        monkeypatch.setattr(cpu_launch, "SDPA_CPU_GQA", native)
        out, lse = attention(q, k, v, causal=True, return_lse=True)
        answers.append((out, lse, *torch.autograd.grad((out * dout).sum() + lse.sum(), (q, k, v))))
    for a, b in zip(*answers):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_no_key_at_all_and_no_query():
    q, k, v = make(1, 2, 2, 5, 0, 32, dtype=torch.float32, grad=True)
    out, lse = attention(q, k, v, causal=True, return_lse=True)
    assert (out == 0).all() and torch.isneginf(lse).all()
    (out.sum() + torch.where(torch.isneginf(lse), 0.0, lse).sum()).backward()
    assert (q.grad == 0).all() and k.grad.shape == k.shape
    q, k, v = make(1, 2, 2, 0, 7, 32, dtype=torch.float32, grad=True)
    out = attention(q, k, v)
    out.sum().backward()
    assert out.shape == q.shape and (k.grad == 0).all() and (v.grad == 0).all()


def test_matches_sdpa_with_torchs_bottom_right_causal_bias():
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = make(2, 4, 4, 24, 57, 64, dtype=torch.float32)
    expect = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(24, 57))
    assert torch.allclose(attention(q, k, v, causal=True), expect, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("q_scale, scale, path", [
    (1.0, 0.125, "sdpa"), (1.0, 1e37, "reference"), (float("nan"), 0.125, "reference"),
    (float("inf"), 0.125, "reference"), (1e20, 1.0, "sdpa"), (1e37, 1.0, "reference")])
def test_scores_that_may_not_be_finite_take_the_float32_math(q_scale, scale, path):
    """torch's CPU kernel drops a NaN score (it answers as if the key were not there) and turns an
    overflowed row finite, so only inputs whose every score is sure to be finite take it."""
    q, k, v = make(1, 2, 2, 8, 8, 16, dtype=torch.float32)
    q[0, 0, 3, 1] = q_scale * q[0, 0, 3, 1]
    assert plan.plan_forward(q, k, v, False, scale).path == path
    assert plan.plan_backward(q, q, k, v, False, scale).path == path


def test_the_float32_math_holds_a_block_of_rows_at_a_time():
    q, k, v = make(2, 4, 2, 37, 29, 16, dtype=torch.float16)
    dout = torch.randn(q.shape, dtype=torch.float16)
    dlse = torch.randn(q.shape[:3])
    results = []
    for max_scores in (None, 2 * 4 * 29 * 5):  # all rows, or 5 a block
        fwd = plan.Plan("reference", sizes=dict(max_scores=max_scores))
        out, lse = torch.empty_like(q), torch.empty(q.shape[:3])
        launch.forward(fwd, q, k, v, out, lse, True, 0.3)
        grads = [torch.empty_like(t) for t in (q, k, v)]
        launch.backward(fwd, dout, q, k, v, out, lse, dlse, *grads, True, 0.3)
        results.append((out, lse, *grads))
    for a, b in zip(*results):
        assert torch.allclose(a.float(), b.float(), rtol=1e-3, atol=1e-3)
    ref, _ = attention_reference(q, k, v, causal=True, scale=0.3)
    assert accuracy.error_over_floor(results[1][0], ref) <= 1.5
    for g, r in zip(results[1][2:], reference_grads(q, k, v, dout, dlse, True, 0.3)):
        assert accuracy.error_over_floor(g, r) <= 2.0


def test_custom_ops_on_the_cpu_path():
    q, k, v = make(1, 4, 2, 20, 24, 32, dtype=torch.float32)
    torch.library.opcheck(torch.ops.tilecore.attention_forward.default, (q, k, v, True, 0.25))
    out, lse = attention(q, k, v, causal=True, scale=0.25, return_lse=True)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    torch.library.opcheck(torch.ops.tilecore.attention_backward.default,
                          (dout, q, k, v, out, lse, dlse, True, 0.25))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lse_gradients_of_any_size(dtype):
    """The lse gradient rides into torch's CPU backward in extra columns, scaled per row by a power
    of two: zeros, 1e-6 and 1e5 (past fp16's range) come through as the reference has them."""
    q, k, v = make(1, 2, 1, 12, 20, 32, dtype=dtype, grad=True)
    out, lse = attention(q, k, v, causal=True, scale=0.3, return_lse=True)
    dout = torch.zeros_like(out)
    dlse = torch.tensor([0.0, 1e-6, 1e5, -3e4, 1.0, -2.5] * 4).reshape(1, 2, 12)
    dq, dk, dv = torch.autograd.grad((lse * dlse).sum(), (q, k, v))
    assert (dv == 0).all()  # lse does not depend on v
    for g, r in zip((dq, dk), reference_grads(q, k, v, dout, dlse, True, 0.3)):
        assert torch.isfinite(g).all() and near(g, r, 3.0)


def test_strided_inputs_give_the_same_answer():
    # (B, N, H, D) memory (flash-attn's layout) viewed as (B, H, N, D)
    q, k, v = (torch.randn(2, n, h, 64).transpose(1, 2).requires_grad_() for n, h in ((30, 4), (45, 2), (45, 2)))
    out = attention(q, k, v, causal=True)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    dense = [t.detach().contiguous().requires_grad_() for t in (q, k, v)]
    expect = attention(*dense, causal=True)
    assert torch.allclose(out, expect, rtol=1e-6, atol=1e-6)
    for g, e in zip(grads, torch.autograd.grad(expect.sum(), dense)):
        assert torch.allclose(g, e, rtol=1e-5, atol=1e-6)


def test_an_unused_lse_costs_the_backward_nothing(monkeypatch):
    """Autograd hands the backward a zero lse gradient where lse went unused: no extra columns then
    (they cost a copy of q, k, v, O and dO, and a wider head dim)."""
    q, k, v = make(1, 2, 2, 16, 16, 32, dtype=torch.float32, grad=True)
    out, lse = attention(q, k, v, causal=True, return_lse=True)

    def refuse(*args):
        raise AssertionError("dlse columns made for a zero lse gradient")
    monkeypatch.setattr(cpu_launch, "_dlse_columns", refuse)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    for g, r in zip(grads, reference_grads(q, k, v, torch.ones_like(out), None, True, 32**-0.5)):
        assert near(g, r, 3.0)
