"""tilecore.attention_varlen: packed variable-length batches through Triton's interpreter (fp16; bf16
is checked on the GPU by experiments/attention/gpu_varlen.py) against the float64 per-sequence
reference, into NaN-poisoned outputs and gradients; the CPU path (float32 too); the custom ops under
torch.compile; bad input."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.attention_varlen import op as varlen
from tilecore.ops.attention_varlen.reference import varlen_reference
from tilecore.ops.attention_varlen import attention_varlen

F16 = torch.float16


def packed(lens_q, lens_k, hq, hkv, d, dv, dtype=F16):
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(sum(lens_q), hq, d, dtype=dtype)
    k = torch.randn(sum(lens_k), hkv, d, dtype=dtype)
    v = torch.randn(sum(lens_k), hkv, dv, dtype=dtype)
    return q, k, v, cu_q, cu_k


def grads64(q, k, v, cu_q, cu_k, dout, dlse, **options):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, lse = varlen_reference(q64, k64, v64, cu_q, cu_k, **options)
    loss = (out * dout.double()).sum() + (torch.where(torch.isneginf(lse), 0.0, lse) * dlse.double()).sum()
    return torch.autograd.grad(loss, (q64, k64, v64))


def check_lse(lse, ref):
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref)) and torch.equal(torch.isnan(lse), torch.isnan(ref))
    live = torch.isfinite(ref)
    assert torch.allclose(lse[live].double(), ref[live], rtol=1e-5, atol=1e-5)


# lengths 0, 1, odd, one past a 16-row block and several blocks (the interpreter's blocks are 16 rows);
# (lens_q, lens_k, Hq, Hkv, D, Dv, options)
CASES = [
    ([5, 0, 1, 19, 17], [5, 3, 1, 24, 17], 2, 1, 32, 32, dict()),
    ([7, 1, 0, 30], [7, 1, 0, 21], 2, 2, 16, 16, dict(causal=True)),  # rows of the 34 past its 21 keys: no key
    ([19, 3, 20], [19, 9, 20], 2, 1, 16, 24, dict(causal=True, window_size=(5, -1), softcap=1.5)),
    ([21, 2, 17], [24, 2, 17], 2, 1, 24, 16, dict(window_size=(3, 6), scale=-0.4)),
    ([60, 2], [64, 2], 2, 1, 16, 16, dict(window_size=(40, 8))),  # whole blocks inside the window: unmasked
]
IDS = ["gqa-odd-lengths", "causal-empty-rows", "causal-window-softcap-dv", "two-sided-window-negative-scale",
       "wide-window-unmasked-blocks"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_kernels_near_the_rounding_floor(case):
    lens_q, lens_k, hq, hkv, d, dv, options = case
    q, k, v, cu_q, cu_k = packed(lens_q, lens_k, hq, hkv, d, dv)
    scale = options.get("scale", d ** -0.5)
    left, right = options.get("window_size", (-1, -1))
    args = (cu_q, cu_k, options.get("causal", False), scale, left, right, options.get("softcap", 0.0))
    out = torch.full((q.shape[0], hq, dv), float("nan"), dtype=F16)
    lse = torch.full((hq, q.shape[0]), float("nan"))
    varlen.forward_kernels(q, k, v, *args, out=out, lse=lse)
    ref, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, **options)
    assert not out.isnan().any() and not lse.isnan().any(), "some outputs were never written"
    assert accuracy.error_over_floor(out, ref) <= 2.0
    check_lse(lse, ref_lse)
    assert (out[torch.isneginf(ref_lse).t()] == 0).all()

    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse)
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    delta_free = lse.clone()
    varlen.backward_kernels(dout, q, k, v, out, delta_free, dlse, *args, grads=grads)
    for name, g, r in zip("qkv", grads, grads64(q, k, v, cu_q, cu_k, dout, dlse, **options)):
        assert not g.isnan().any(), f"d{name} not fully written"
        assert accuracy.error_over_floor(g, r) <= 3.0, name


def test_autograd_through_the_public_function():
    q, k, v, cu_q, cu_k = packed([3, 9], [3, 12], 2, 1, 16, 16)
    for t in (q, k, v):
        t.requires_grad_()
    out, lse = attention_varlen(q, k, v, cu_q, cu_k, 9, 12, causal=True, return_lse=True)
    ref, ref_lse = varlen_reference(q.detach(), k.detach(), v.detach(), cu_q, cu_k, causal=True)
    assert accuracy.error_over_floor(out.detach(), ref) <= 2.0
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    for g, r in zip(got, grads64(q, k, v, cu_q, cu_k, dout, torch.zeros_like(lse), causal=True)):
        assert accuracy.error_over_floor(g, r) <= 3.0


def test_nan_stays_in_its_row_and_sequence():
    q, k, v, cu_q, cu_k = packed([6, 10], [6, 10], 2, 1, 16, 16)
    q[8, 1, 3] = float("nan")  # second sequence, its row 2, head 1
    out, lse = attention_varlen(q, k, v, cu_q, cu_k, 10, 10, return_lse=True)
    ref, ref_lse = varlen_reference(q, k, v, cu_q, cu_k)
    assert torch.equal(out.isnan(), ref.isnan()) and out[8, 1].isnan().all() and out.isnan().sum() == 16
    live = ~ref.isnan()
    assert accuracy.error_over_floor(out[live], ref[live]) <= 2.0
    check_lse(lse, ref_lse)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_path_without_the_interpreter(monkeypatch, dtype):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v, cu_q, cu_k = packed([3, 0, 11, 1], [5, 2, 11, 1], 4, 2, 16, 8, dtype=dtype)
    for t in (q, k, v):
        t.requires_grad_()
    options = dict(causal=True, window_size=(4, -1), softcap=3.0)
    out, lse = attention_varlen(q, k, v, cu_q, cu_k, 11, 11, return_lse=True, **options)
    ref, ref_lse = varlen_reference(q.detach(), k.detach(), v.detach(), cu_q, cu_k, **options)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    got = torch.autograd.grad((out * dout).sum() + (lse.nan_to_num(neginf=0.0) * dlse).sum(), (q, k, v))
    check_lse(lse, ref_lse)
    bound = 1e-5 if dtype == torch.float32 else None
    for g, r in zip((out.detach(),) + got, (ref,) + grads64(q, k, v, cu_q, cu_k, dout, dlse, **options)):
        if bound:
            assert accuracy.rel_rms(g, r) < bound
        else:
            assert accuracy.error_over_floor(g, r) <= 3.0


def test_custom_ops_opcheck_and_compile_fullgraph(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v, cu_q, cu_k = packed([4, 7], [6, 7], 2, 1, 16, 16, dtype=torch.float32)
    args = (cu_q, cu_k, True, 0.3, 2, -1, 1.0)
    # the forward's opcheck (fake against real, schema, autograd registration); the backward op is
    # traced below through the compiled graph's autograd
    torch.library.opcheck(torch.ops.tilecore.attention_varlen_forward.default, (q, k, v, *args),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))

    def f(q, k, v):
        o, lse = attention_varlen(q, k, v, cu_q, cu_k, 7, 7, causal=True, scale=0.3, window_size=(2, -1),
                                  softcap=1.0, return_lse=True)
        return (o * 2).sum() + lse.nan_to_num(neginf=0.0).sum()

    torch._dynamo.reset()
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    loss = torch.compile(f, fullgraph=True, backend="aot_eager")(qg, kg, vg)
    got = torch.autograd.grad(loss, (qg, kg, vg))
    expect = torch.autograd.grad(f(qg, kg, vg), (qg, kg, vg))
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, expect))


def _bad(**change):
    q, k, v, cu_q, cu_k = packed([3, 4], [3, 4], 2, 1, 16, 16)
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=4, max_seqlen_k=4)
    args.update(change)
    return args


@pytest.mark.parametrize("change,words", [
    (dict(cu_seqlens_q=torch.tensor([0, 5, 3, 7], dtype=torch.int32)), "one entry per sequence"),
    (dict(cu_seqlens_q=torch.tensor([0, 5, 2], dtype=torch.int32).add(0)), "never decrease"),
    (dict(cu_seqlens_k=torch.tensor([0, 3, 6], dtype=torch.int32)), "cu_seqlens_k\\[-1\\] must be"),
    (dict(cu_seqlens_q=torch.tensor([0, 3, 7], dtype=torch.int64)), "1-D int32"),
    (dict(cu_seqlens_q=torch.tensor([1, 3, 7], dtype=torch.int32)), "start at 0"),
    (dict(max_seqlen_q=3), "less than the longest"),
    (dict(q=torch.randn(7, 2, 2, 16, dtype=F16)), "3-D"),
    (dict(k=torch.randn(7, 3, 16, dtype=F16), v=torch.randn(7, 3, 16, dtype=F16)), "multiple"),
    (dict(v=torch.randn(7, 1, 16, dtype=torch.bfloat16)), "one dtype"),
    (dict(window_size=(-2, 0)), "window_size must be a pair"),
    (dict(window_size=(1.5, 0)), "window_size must be a pair"),
    (dict(softcap=-1.0), "softcap must be"),
    (dict(causal=1), "causal must be"),
])
def test_bad_input_is_refused_clearly(change, words):
    window = change.pop("window_size", (-1, -1))
    softcap = change.pop("softcap", 0.0)
    causal = change.pop("causal", False)
    args = _bad(**change)
    with pytest.raises((TypeError, ValueError), match=words):
        attention_varlen(*args.values(), window_size=window, softcap=softcap, causal=causal)


def test_search_of_a_block_sequence_and_empty_batches():
    # all sequences empty but the last; no query at all
    q, k, v, cu_q, cu_k = packed([0, 0, 0, 18], [0, 4, 0, 18], 2, 1, 16, 16)
    out = attention_varlen(q, k, v, cu_q, cu_k, 18, 18)
    assert accuracy.error_over_floor(out, varlen_reference(q, k, v, cu_q, cu_k)[0]) <= 2.0
    q, k, v, cu_q, cu_k = packed([0, 0], [3, 0], 2, 1, 16, 16)
    out, lse = attention_varlen(q, k, v, cu_q, cu_k, 0, 3, return_lse=True)
    assert out.shape == (0, 2, 16) and lse.shape == (2, 0)
