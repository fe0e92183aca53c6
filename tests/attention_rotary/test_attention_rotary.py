"""attention(q, k, v, rotary=(cos, sin)) (issue 37) against the float64 reference (q and k turned in
float64 by rotary's reference, then attention's): the tl kernels with Q and K turned in the kernel
(the interpreter, float16; outputs poisoned with NaN, so every element must be written), both
layouts, partial rotary dims, GQA / MQA, causal with N < Nk, a window, a softcap, D not a power of
two; the CPU path without the interpreter (apply_rotary, then torch's CPU attention); the routing
(plan.rotary_path, the Gluon entry and its fallback); bad input; the custom ops' fake
implementations and torch.compile(fullgraph=True); precision="fp8".

Bounds: the kernels round the turned q and k to the input dtype once (as a separate apply_rotary
pass does), one rounding more than plain attention has: forward <= 2.5x the rounding floor
(measured 1.5-1.9x), gradients <= 3x (1.7-2.4x)."""
import math

import pytest
import torch

import tilecore
from tilecore import accuracy, dispatch
from tilecore.ops.attention_rotary import configs, launch, op as op_rotary, plan
from tilecore.ops.attention_rotary.reference import rotary_attention_reference

F16 = torch.float16
NAN = float("nan")


def tables(rows, pairs, dtype=torch.float32):
    angle = torch.rand(rows, pairs, dtype=torch.float64) * 2 * math.pi
    return angle.cos().to(dtype), angle.sin().to(dtype)


def inputs(b, hq, hkv, n, nk, d, dtype=F16):
    return [torch.randn(*s, dtype=dtype, requires_grad=True) for s in ((b, hq, n, d), (b, hkv, nk, d), (b, hkv, nk, d))]


def reference(q, k, v, cos, sin, dout, **options):
    """(O, lse, dq, dk, dv) in float64."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o, lse = rotary_attention_reference(q64, k64, v64, cos, sin, **options)
    return (o.detach(), lse.detach(), *torch.autograd.grad(o, (q64, k64, v64), dout.double()))


def assert_near(got, ref, bound, what):
    assert torch.isfinite(got).all(), f"{what}: non-finite elements (unwritten?)"
    err = accuracy.error_over_floor(got.detach(), ref)
    assert err <= bound, f"{what}: {err:.2f} x the rounding floor"


def assert_right(q, k, v, cos, sin, out, **options):
    """out and its gradients (for a fresh random dout) against the float64 reference: O <= 2.5x the rounding floor,
    dq, dk, dv <= 3x. Returns (dout, (dq, dk, dv))."""
    dout = torch.randn(out.shape, dtype=out.dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref = reference(q, k, v, cos, sin, dout, **options)
    assert_near(out, ref[0], 2.5, "O")
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref[2:]):
        assert_near(g, r, 3.0, name)
    return dout, grads


def assert_lse(lse, ref):
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref))
    live = torch.isfinite(ref)
    assert torch.allclose(lse[live].double(), ref[live], rtol=1e-3, atol=1e-3)


@pytest.fixture
def poisoned(monkeypatch):
    """The tl rotary path's outputs start as NaN."""
    monkeypatch.setattr(launch, "rotary_buffer", lambda shape, dtype, device: torch.full(shape, NAN, dtype=dtype,
                                                                                         device=device))


# B, Hq, Hkv, N, Nk, D, rotary pairs, causal, window, softcap. Interpreter blocks: forward 32 x 16,
# backward 16 x 32, so several blocks each way.
CASES = [
    (1, 2, 2, 40, 40, 32, 16, False, (-1, -1), 0.0),  # rotary_dim = D
    (1, 2, 1, 24, 40, 32, 6, True, (-1, -1), 0.0),  # partial (12 of 32), GQA, causal with N < Nk
    (1, 4, 1, 30, 37, 16, 8, False, (9, 4), 5.0),  # MQA, a window and a softcap
    (2, 2, 2, 17, 17, 48, 10, True, (-1, -1), 0.0),  # D not a power of two, two batches
    (1, 2, 2, 1, 33, 32, 16, False, (-1, -1), 0.0),  # one query, at the last position
]
IDS = [f"N{c[3]}-Nk{c[4]}-D{c[5]}-R{2 * c[6]}-H{c[1]}/{c[2]}-{'causal' if c[7] else 'full'}-w{c[8][0]},{c[8][1]}"
       f"-cap{c[9]}" for c in CASES]


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_tl_kernels_turn_q_and_k(case, interleaved, poisoned):
    b, hq, hkv, n, nk, d, pairs, causal, window, softcap = case
    q, k, v = inputs(b, hq, hkv, n, nk, d)
    cos, sin = tables(nk + 3, pairs)
    assert plan.rotary_path(q, k, v, 1.0) == "tl"
    out, lse = tilecore.attention(q, k, v, causal=causal, window_size=window, softcap=softcap, return_lse=True,
                                  rotary=(cos, sin), rotary_interleaved=interleaved)
    dout = torch.randn(out.shape, dtype=F16)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref = reference(q, k, v, cos, sin, dout, interleaved=interleaved, causal=causal, window_size=window,
                    softcap=softcap)
    assert_near(out, ref[0], 2.5, "O")
    assert_lse(lse, ref[1])
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref[2:]):
        assert_near(g, r, 3.0, name)


def test_bfloat16_and_float32_in_the_interpreter(poisoned):
    """bf16 runs on its exact float32 upcast there (the plan's operand dtype), cos / sin in bf16."""
    for dtype, bound in ((torch.bfloat16, 1.6), (torch.float32, None)):
        q, k, v = inputs(1, 2, 1, 20, 28, 32, dtype)
        cos, sin = tables(30, 12, torch.bfloat16)
        out = tilecore.attention(q, k, v, causal=True, rotary=(cos, sin))
        dout = torch.randn(out.shape, dtype=dtype)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        ref = reference(q, k, v, cos, sin, dout, causal=True)
        for name, got, r in zip(("O", "dq", "dk", "dv"), (out, *grads), (ref[0], *ref[2:])):
            if bound is None:
                assert accuracy.rel_rms(got.detach(), r) <= 2e-5, name
            else:
                assert_near(got, r, bound, name)


def test_lse_gradient_and_kv_heads_turned_alike(poisoned):
    """A loss on lse flows back through the rotary op; every kv head turns the same (q's heads 0 and
    1 share kv head 0: equal q rows give equal outputs)."""
    q, k, v = inputs(1, 4, 2, 12, 20, 16)
    with torch.no_grad():
        q[:, 1] = q[:, 0]
    cos, sin = tables(20, 8)
    out, lse = tilecore.attention(q, k, v, return_lse=True, rotary=(cos, sin))
    assert torch.equal(out[:, 0], out[:, 1])
    dlse = torch.randn(lse.shape)
    grads = torch.autograd.grad((lse * dlse).sum(), (q, k, v))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    _, ref_lse = rotary_attention_reference(q64, k64, v64, cos, sin)
    ref = torch.autograd.grad((ref_lse * dlse.double()).sum(), (q64, k64))
    for g, r in zip(grads, ref):
        assert accuracy.rel_rms(g, r) <= 4e-3
    assert grads[2].abs().max() <= 1e-3  # lse does not depend on v


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_cpu_path_without_the_interpreter(interleaved, monkeypatch):
    """CPU tensors without the interpreter: apply_rotary's torch path, then torch's CPU attention."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = inputs(2, 4, 2, 24, 40, 32, dtype)
        cos, sin = tables(45, 10)
        assert plan.rotary_path(q, k, v, 1.0) == "composite"
        out = tilecore.attention(q, k, v, causal=True, rotary=(cos, sin), rotary_interleaved=interleaved)
        dout = torch.randn(out.shape, dtype=dtype)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        ref = reference(q, k, v, cos, sin, dout, interleaved=interleaved, causal=True)
        for name, got, r in zip(("O", "dq", "dk", "dv"), (out, *grads), (ref[0], *ref[2:])):
            if dtype == torch.float32:
                assert accuracy.rel_rms(got.detach(), r) <= 2e-5, name
            else:
                assert_near(got, r, 3.0, name)


def test_the_paths_by_device():
    """Hopper's Gluon forward dims: q and k turned by apply_rotary's kernel (no case in ROTARY_IN_KERNEL_CASES)
    or the Gluon entry (the call's case, where it exists); other head dims and other GPUs: the tl kernels; past
    256: turned."""
    meta = lambda *s: torch.empty(*s, dtype=torch.bfloat16, device="meta")
    q, k, v = meta(2, 4, 64, 128), meta(2, 4, 64, 128), meta(2, 4, 64, 128)
    with dispatch.pretend(dispatch.TARGETS["sm_90a"]), pytest.MonkeyPatch.context() as off:
        off.setattr(configs, "ROTARY_IN_KERNEL_CASES", frozenset())
        assert plan.rotary_path(q, k, v, 0.1, False, False) == "turned"
        assert plan.rotary_path(meta(2, 4, 64, 96), meta(2, 4, 64, 96), meta(2, 4, 64, 96), 0.1) == "tl"
        assert plan.rotary_path(q, k, v, -0.1) == "tl"  # the Gluon forward takes a positive scale
        big = meta(2, 4, 8, 320)
        assert plan.rotary_path(big, big, big, 0.1) == "turned"
        with pytest.MonkeyPatch.context() as m:
            m.setattr(configs, "ROTARY_IN_KERNEL_CASES", frozenset({(128, False), (128, True)}))
            m.setattr(plan, "gluon_rotary_forward", lambda: (lambda *a, **kw: None))
            assert plan.rotary_path(q, k, v, 0.1, False, False) == "gluon"
            assert plan.rotary_path(q, k, v, 0.1, True, False) == "turned"  # its turned q, k serve the backward
            m.setattr(plan, "gluon_rotary_forward", lambda: None)
            assert plan.rotary_path(q, k, v, 0.1, False, False) == "turned"
        with pytest.MonkeyPatch.context() as m:  # by case: (D, causal) in ROTARY_IN_KERNEL_CASES
            m.setattr(configs, "ROTARY_IN_KERNEL_CASES", frozenset({(128, True)}))
            m.setattr(plan, "gluon_rotary_forward", lambda: (lambda *a, **kw: None))
            assert plan.rotary_path(q, k, v, 0.1, False, True) == "gluon"
            assert plan.rotary_path(q, k, v, 0.1, False, False) == "turned"
            assert plan.rotary_path(q, k, v, 0.1, True, True) == "turned"
            assert plan.rotary_path(q, k, v, 0.1) == "turned"  # causal unknown
    with dispatch.pretend(dispatch.TARGETS["sm_80"]):
        assert plan.rotary_path(q, k, v, 0.1) == "tl"


def test_the_gluon_entry_is_called_and_falls_back(monkeypatch):
    """The "gluon" path calls gluon_forward's forward with its keyword signature; a case it does not
    take (plan.RotaryNotTaken) runs the turned path's forward; the backward is the turned path's on q and k
    turned again. Any other error of that forward propagates (a ValueError, a NotImplementedError of its own)."""
    q, k, v = inputs(1, 2, 1, 16, 24, 32)
    cos, sin = tables(24, 16)
    calls = []

    def entry(q_, k_, v_, cos_, sin_, *, causal, scale, interleaved, window, softcap, sm_margin):
        calls.append(dict(causal=causal, scale=scale, interleaved=interleaved, window=window, softcap=softcap,
                          sm_margin=sm_margin))
        raise plan.RotaryNotTaken("not this case")

    monkeypatch.setattr(op_rotary, "rotary_path", lambda *a: "gluon")
    monkeypatch.setattr(op_rotary, "gluon_rotary_forward", lambda: entry)
    out = tilecore.attention(q, k, v, causal=True, rotary=(cos, sin), rotary_interleaved=True)
    assert calls == [dict(causal=True, scale=32**-0.5, interleaved=True, window=(-1, -1), softcap=0.0, sm_margin=0)]
    assert_right(q, k, v, cos, sin, out, interleaved=True, causal=True)
    for error in (ValueError("a real error"), NotImplementedError("not the limits' type")):
        def failing(*a, **kw):
            raise error
        monkeypatch.setattr(op_rotary, "gluon_rotary_forward", lambda: failing)
        with pytest.raises(type(error), match=str(error)):
            tilecore.attention(q, k, v, causal=True, rotary=(cos, sin), rotary_interleaved=True)


def test_the_training_forward_by_case():
    """plan.rotary_train_in_kernel: the Gluon forward's calls whose (D, causal) ROTARY_TRAIN_IN_KERNEL_CASES names,
    where gluon_forward's forward exists; no other GPU, head dim or scale."""
    meta = lambda *s: torch.empty(*s, dtype=torch.bfloat16, device="meta")
    q = meta(2, 4, 64, 128)
    with dispatch.pretend(dispatch.TARGETS["sm_90a"]), pytest.MonkeyPatch.context() as m:
        m.setattr(plan, "gluon_rotary_forward", lambda: (lambda *a, **kw: None))
        m.setattr(configs, "ROTARY_TRAIN_IN_KERNEL_CASES", frozenset({(128, True), (128, False)}))
        long = meta(2, 4, 4096, 128)
        assert plan.rotary_train_in_kernel(q, q, q, 0.1, True)
        assert plan.rotary_train_in_kernel(long, long, long, 0.1, False)
        assert not plan.rotary_train_in_kernel(q, q, q, 0.1, False)  # 64 rows: the carried kernel
        m.setattr(configs, "ROTARY_TRAIN_IN_KERNEL_CASES", frozenset({(128, True)}))
        assert plan.rotary_train_in_kernel(q, q, q, 0.1, True)
        assert not plan.rotary_train_in_kernel(long, long, long, 0.1, False)
        assert not plan.rotary_train_in_kernel(q, q, q, -0.1, True)  # the Gluon forward takes a positive scale
        m.setattr(configs, "ROTARY_TRAIN_IN_KERNEL_CASES", frozenset({(96, True)}))
        d96 = meta(2, 4, 64, 96)
        assert not plan.rotary_train_in_kernel(d96, d96, d96, 0.1, True)  # no Gluon forward at D96
        m.setattr(configs, "ROTARY_TRAIN_IN_KERNEL_CASES", frozenset({(128, True)}))
        m.setattr(plan, "gluon_rotary_forward", lambda: None)
        assert not plan.rotary_train_in_kernel(q, q, q, 0.1, True)
    with dispatch.pretend(dispatch.TARGETS["sm_80"]), pytest.MonkeyPatch.context() as m:
        m.setattr(configs, "ROTARY_TRAIN_IN_KERNEL_CASES", frozenset({(128, True)}))
        assert not plan.rotary_train_in_kernel(q, q, q, 0.1, True)


def test_the_training_forward_keeps_what_the_entry_turned(monkeypatch):
    """On the turned path with rotary_train_in_kernel, the turned forward is gluon_forward's with keep_turned: its
    (O, lse, turned q, turned k) go to the shipped backward (the entry here gives the turned path's own, marked,
    so the gradients show which q and k the backward used); a case it does not take (plan.RotaryNotTaken) runs the
    turned path's math, bit for bit; another error propagates."""
    q, k, v = inputs(1, 2, 1, 16, 24, 32)
    cos, sin = tables(24, 16)
    calls = []

    def entry(q_, k_, v_, cos_, sin_, *, causal, scale, interleaved, window, softcap, sm_margin, keep_turned):
        calls.append(dict(causal=causal, interleaved=interleaved, window=window, keep_turned=keep_turned))
        return op_rotary.turned_forward_impl(q_, k_, v_, cos_, sin_, causal, scale, interleaved, window, softcap,
                                             sm_margin)

    monkeypatch.setattr(op_rotary, "rotary_path", lambda *a: "turned")
    monkeypatch.setattr(op_rotary, "rotary_train_in_kernel", lambda *a: not calls)  # the entry's own call: turned
    monkeypatch.setattr(op_rotary, "gluon_rotary_forward", lambda: entry)
    out = tilecore.attention(q, k, v, causal=True, rotary=(cos, sin), rotary_interleaved=True)
    assert calls == [dict(causal=True, interleaved=True, window=(-1, -1), keep_turned=True)]
    dout, grads = assert_right(q, k, v, cos, sin, out, interleaved=True, causal=True)

    def limited(*a, **kw):
        raise plan.RotaryNotTaken("rotary_dim 96")
    monkeypatch.setattr(op_rotary, "rotary_train_in_kernel", lambda *a: True)
    monkeypatch.setattr(op_rotary, "gluon_rotary_forward", lambda: limited)
    again = tilecore.attention(q, k, v, causal=True, rotary=(cos, sin), rotary_interleaved=True)
    assert torch.equal(again, out)
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(again, (q, k, v), dout), grads))

    def failing(*a, **kw):
        raise ValueError("a real error")
    monkeypatch.setattr(op_rotary, "gluon_rotary_forward", lambda: failing)
    with pytest.raises(ValueError, match="a real error"):
        tilecore.attention(q, k, v, causal=True, rotary=(cos, sin), rotary_interleaved=True)


@pytest.mark.parametrize("case", [CASES[1], CASES[2]], ids=[IDS[1], IDS[2]])
def test_the_turned_ops(case, monkeypatch):
    """The "turned" path (Hopper's today, forced here: its kernels are the interpreter's): q and k turned
    into contiguous buffers kept for the backward, the shipped kernels on them, dQ and dK turned back."""
    b, hq, hkv, n, nk, d, pairs, causal, window, softcap = case
    q, k, v = inputs(b, hq, hkv, n, nk, d)
    cos, sin = tables(nk, pairs)
    monkeypatch.setattr(op_rotary, "rotary_path", lambda *a: "turned")
    out, lse = tilecore.attention(q, k, v, causal=causal, window_size=window, softcap=softcap, return_lse=True,
                                  rotary=(cos, sin), rotary_interleaved=True)
    dout = torch.randn(out.shape, dtype=F16)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref = reference(q, k, v, cos, sin, dout, interleaved=True, causal=causal, window_size=window, softcap=softcap)
    assert_near(out, ref[0], 2.5, "O")
    assert_lse(lse, ref[1])
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref[2:]):
        assert_near(g, r, 3.0, name)


def test_the_turned_ops_opcheck():
    q, k, v = (t.detach() for t in inputs(1, 2, 1, 8, 12, 16))
    cos, sin = tables(12, 4)
    args = (q, k, v, cos, sin, True, 0.25, True, -1, -1, 0.0, 0)
    torch.library.opcheck(torch.ops.tilecore.attention_rotary_turned_forward.default, args)
    out, lse, qr, kr = op_rotary.turned_forward_op(*args)
    assert qr.is_contiguous() and kr.is_contiguous()
    torch.library.opcheck(torch.ops.tilecore.attention_rotary_turned_backward.default,
                          (torch.randn(out.shape, dtype=F16), qr, kr, v, cos, sin, out, lse, None, *args[5:]))


def _bad(**change):
    q, k, v = (torch.zeros(1, 2, 8, 32, dtype=F16), torch.zeros(1, 1, 12, 32, dtype=F16),
               torch.zeros(1, 1, 12, 32, dtype=F16))
    cos, sin = torch.zeros(12, 16), torch.zeros(12, 16)
    args = dict(q=q, k=k, v=v, rotary=(cos, sin), rotary_interleaved=False)
    args.update(change)
    return args


@pytest.mark.parametrize("change,error,words", [
    (dict(rotary=torch.zeros(12, 16)), TypeError, "pair \\(cos, sin\\)"),
    (dict(rotary=(torch.zeros(12, 16),)), TypeError, "pair \\(cos, sin\\)"),
    (dict(rotary=(torch.zeros(12, 16), 1.0)), TypeError, "sin of type float"),
    (dict(rotary=(torch.zeros(12), torch.zeros(12))), ValueError, "shape \\(12,\\)"),
    (dict(rotary=(torch.zeros(12, 16, dtype=torch.float64),) * 2), TypeError, "float16, bfloat16 or float32"),
    (dict(rotary=(torch.zeros(12, 16, device="meta"),) * 2), ValueError, "on meta and q on cpu"),
    (dict(rotary=(torch.zeros(12, 16), torch.zeros(12, 8))), ValueError, "one shape"),
    (dict(rotary=(torch.zeros(12, 17), torch.zeros(12, 17))), ValueError, "rotary_dim = 2 \\* cos.shape\\[1\\] = 34"),
    (dict(rotary=(torch.zeros(11, 16), torch.zeros(11, 16))), ValueError, "11 positions, fewer than the 12 keys"),
    (dict(k=torch.zeros(1, 1, 6, 32, dtype=F16), v=torch.zeros(1, 1, 6, 32, dtype=F16)), ValueError, "N <= Nk"),
    (dict(rotary_interleaved=1), TypeError, "rotary_interleaved must be True or False"),
])
def test_bad_rotary_input(change, error, words):
    with pytest.raises(error, match=words):
        tilecore.attention(**_bad(**change))


def test_bad_attention_input_is_still_named_first():
    with pytest.raises(ValueError, match="4-D"):
        tilecore.attention(**_bad(q=torch.zeros(2, 8, 32, dtype=F16)))


def test_custom_ops_opcheck_and_compile_fullgraph():
    q, k, v = inputs(1, 2, 1, 12, 20, 32)
    cos, sin = tables(20, 12)
    args = (q.detach(), k.detach(), v.detach(), cos, sin, True, 0.25, False, -1, -1, 0.0, 0)
    torch.library.opcheck(torch.ops.tilecore.attention_rotary_forward.default, args)
    out, lse = op_rotary.forward_op(*args)
    dout = torch.randn(out.shape, dtype=F16)
    torch.library.opcheck(torch.ops.tilecore.attention_rotary_backward.default,
                          (dout, *args[:5], out, lse, None, *args[5:]))

    def f(q, k, v, cos, sin):
        o, lse = tilecore.attention(q, k, v, causal=True, scale=0.25, return_lse=True, rotary=(cos, sin))
        return (o.float() * 2).sum() + lse.sum()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    loss = compiled(q, k, v, cos, sin)
    got = torch.autograd.grad(loss, (q, k, v))
    expect = torch.autograd.grad(f(q, k, v, cos, sin), (q, k, v))
    assert all(torch.equal(a, b) for a, b in zip(got, expect))


def test_compile_fullgraph_on_the_composite(monkeypatch):
    """The composite (CPU without the interpreter) traces as apply_rotary's and attention's custom ops."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = inputs(1, 2, 1, 12, 20, 32, torch.float32)
    cos, sin = tables(20, 12)

    def f(q, k, v, cos, sin):
        return tilecore.attention(q, k, v, causal=True, rotary=(cos, sin), rotary_interleaved=True).sum()
    got = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, cos, sin), (q, k, v))
    expect = torch.autograd.grad(f(q, k, v, cos, sin), (q, k, v))
    assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-6) for a, b in zip(got, expect))


def test_cos_and_sin_get_no_gradient():
    q, k, v = inputs(1, 2, 2, 8, 8, 16)
    cos, sin = (t.requires_grad_() for t in tables(8, 8))
    out = tilecore.attention(q, k, v, rotary=(cos, sin))
    out.sum().backward()
    assert cos.grad is None and sin.grad is None and q.grad is not None


def test_empty_inputs():
    q, k, v = inputs(1, 2, 2, 0, 8, 16)
    cos, sin = tables(8, 8)
    out = tilecore.attention(q, k, v, rotary=(cos, sin))
    assert out.shape == (1, 2, 0, 16)


def test_fp8_precision_turns_q_and_k_first():
    """precision="fp8": apply_rotary on q and k, then the FP8 convenience path (forward only)."""
    from tilecore.ops.attention_fp8 import attention_fp8_rotated

    q, k, v = (t.detach() for t in inputs(1, 2, 2, 24, 40, 64))
    cos, sin = tables(40, 24)
    out = tilecore.attention(q, k, v, causal=True, precision="fp8", rotary=(cos, sin))
    qr = tilecore.apply_rotary(q.transpose(1, 2), cos[16:], sin[16:]).transpose(1, 2)
    kr = tilecore.apply_rotary(k.transpose(1, 2), cos, sin).transpose(1, 2)
    assert torch.equal(out, attention_fp8_rotated(qr, kr, v, causal=True))
    exact, _ = rotary_attention_reference(q.double(), k.double(), v.double(), cos, sin, causal=True)
    assert 0 < accuracy.rel_rms(out, exact) < 0.1  # e4m3 operands: a few percent
    with pytest.raises(RuntimeError, match="forward-only"):
        tilecore.attention(q.requires_grad_(), k, v, precision="fp8", rotary=(cos, sin))


def test_compile_fullgraph_on_the_turned_ops(monkeypatch):
    """The turned path (forced) traces as its two custom ops; the turned q and k outputs carry no gradient."""
    monkeypatch.setattr(op_rotary, "rotary_path", lambda *a: "turned")
    q, k, v = inputs(1, 2, 1, 12, 20, 32)
    cos, sin = tables(20, 12)

    def f(q, k, v, cos, sin):
        o, lse = tilecore.attention(q, k, v, causal=True, return_lse=True, rotary=(cos, sin))
        return (o.float() * 2).sum() + lse.sum()
    got = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, cos, sin), (q, k, v))
    expect = torch.autograd.grad(f(q, k, v, cos, sin), (q, k, v))
    assert all(torch.equal(a, b) for a, b in zip(got, expect))


def test_sm_margin_passes_through():
    """sm_margin is checked as attention's and changes no result (the tl kernels have no persistent grid)."""
    q, k, v = (t.detach() for t in inputs(1, 2, 2, 16, 16, 32))
    cos, sin = tables(16, 16)
    base = tilecore.attention(q, k, v, causal=True, rotary=(cos, sin))
    assert torch.equal(tilecore.attention(q, k, v, causal=True, rotary=(cos, sin), sm_margin=2), base)
    with pytest.raises(ValueError, match="sm_margin"):
        tilecore.attention(q, k, v, rotary=(cos, sin), sm_margin=4)  # the interpreter stands for 4 SMs
