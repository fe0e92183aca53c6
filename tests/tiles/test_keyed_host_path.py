"""The eager host path (issue 31) of layer_norm, apply_rotary, attention_with_kvcache and (session 28)
linear_attention, its decode steps, attention_varlen, hadamard_quantize, attention_fp8 and fft_conv: a
CUDA call's signature skips the checks, finds the plan and launches each kernel by key
(CachedLaunch.launch_keyed). The keyed launch is sound
only where the key fixes every argument's specialization, so here, with the signature let through for
CPU tensors (the interpreter runs the kernels), every keyed launch is recorded with Triton's own key of
its arguments (a compiled-mode JITFunction's): one launch key must never meet two Triton keys, and the
keyed calls give the plain calls' bits."""
import contextlib

import pytest
import torch
from triton.runtime.jit import JITFunction

from tilecore.ops.attention_kvcache import op as kvcache
from tilecore.ops.attention_kvcache.reference import kvcache_reference
from tilecore.ops.norm import launch as norm_launch
from tilecore.ops.norm import op
from tilecore.ops.rotary import op as rotary_op
from tilecore.tiles import eager
from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.launch import CachedLaunch

MODULES = (op, rotary_op, kvcache, eager)  # each one's signature (eager's: the backward's key)


def _cpu_signature(*items):
    """tiles.launch.signature with CPU tensors let through."""
    out = []
    for t in items:
        if isinstance(t, torch.Tensor):
            out.append((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0))
        elif t is None or isinstance(t, tiles_launch._KEY_SCALARS):
            out.append(t)
        else:
            return None
    return tuple(out)


class Keyed(dict):
    """{(kernel name, launch key): {Triton keys}} of every keyed launch; ``plain()``: calls without keys."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.monkeypatch = monkeypatch

    @contextlib.contextmanager
    def plain(self):
        for module in MODULES:
            self.monkeypatch.setattr(module, "signature", lambda *items: None)
        try:
            yield
        finally:
            for module in MODULES:
                self.monkeypatch.setattr(module, "signature", _cpu_signature)


@pytest.fixture
def keyed(monkeypatch):
    seen = Keyed(monkeypatch)

    def launch_keyed(self, key, grid, args, kwargs):  # recorded, then launched as a plain launch
        triton_key, _ = CachedLaunch(JITFunction(self.kernel.fn)).key(args, kwargs)
        seen.setdefault((self.kernel.fn.__name__, key), set()).add(triton_key)
        return self[grid](*args, **kwargs)

    caches = (op._CHECKED, op._PLANS, norm_launch._FORWARD_OPTIONS, rotary_op._CHECKED, rotary_op._PLANS, kvcache._CHECKED,
              kvcache._LAYOUTS, kvcache._LAUNCHES)
    for module in MODULES:
        monkeypatch.setattr(module, "signature", _cpu_signature)
    monkeypatch.setattr(CachedLaunch, "launch_keyed", launch_keyed)
    for cache in caches:
        cache.clear()
    yield seen
    for cache in caches:
        cache.clear()


def _norm_call(x, w, b, res, rms, prenorm):
    out = op.layer_norm(x, w, b, residual=res, rms=rms, prenorm=prenorm)
    y, h = out if prenorm else (out, None)
    loss = (y.float() * torch.linspace(-1, 1, y.shape[-1])).sum()
    if h is not None:
        loss = loss + h.float().square().sum()
    loss.backward()
    return y


def _leaves(*ts):
    return [None if t is None else t.detach().clone().requires_grad_() for t in ts]


@pytest.mark.parametrize("rms", [False, True])
def test_norm_one_launch_key_one_specialization_and_the_plain_bits(keyed, rms):
    torch.manual_seed(0)
    shapes = [(3, 48), (16, 48), (3, 48), (5, 37), (16, 48), (2, 3, 40)]
    for i, shape in enumerate(shapes):
        n = shape[-1]
        x = torch.randn(shape, dtype=torch.float16)
        w = torch.randn(n, dtype=torch.float16)
        b = None if rms else torch.randn(n, dtype=torch.float16)
        res = torch.randn(shape, dtype=torch.float16) if i % 2 else None
        runs = []
        for plain in (False, True):
            leaves = _leaves(x, w, b, res)
            with keyed.plain() if plain else contextlib.nullcontext():
                before = len(keyed)
                y = _norm_call(*leaves, rms, prenorm=bool(i % 2))
                assert (len(keyed) == before) if plain else True  # the plain call makes no keyed launch
            runs.append([y] + [t.grad for t in leaves if t is not None])
        assert all(torch.equal(a, c) for a, c in zip(*runs))
    assert {name for name, _ in keyed} >= {"norm_forward_kernel", "norm_backward_kernel"}
    assert all(len(triton_keys) == 1 for triton_keys in keyed.values())
    # repeated signatures found their checks: one entry each
    assert len(op._CHECKED) == len({(s, i % 2) for i, s in enumerate(shapes)})


def test_norm_misaligned_and_strided_inputs_get_their_own_keys(keyed):
    torch.manual_seed(1)
    n = 32
    w = torch.randn(n, dtype=torch.float16)
    base = torch.randn(8 * n + 1, dtype=torch.float16)
    aligned, misaligned = base[:8 * n].view(8, n), base[1:].view(8, n)
    wide = torch.randn(8, 2 * n, dtype=torch.float16)[:, :n]  # row stride 2n
    for x in (aligned, misaligned, wide, aligned):
        y = op.layer_norm(x, w, rms=True)
        ref = torch.nn.functional.rms_norm(x.float(), (n,), w.float(), eps=1e-5)
        assert (y.float() - ref).abs().max() < 1e-2
    assert len([k for name, k in keyed if name == "norm_forward_kernel"]) == 3
    assert all(len(v) == 1 for v in keyed.values())


def test_norm_generator_or_bad_argument_takes_the_checked_path(keyed):
    x = torch.randn(4, 16, dtype=torch.float16)
    w = torch.randn(16, dtype=torch.float16)
    op.layer_norm(x, w, dropout_p=0.5, generator=torch.Generator().manual_seed(0))
    assert len(op._CHECKED) == 0  # a generator: no key
    for _ in range(2):  # refused each time: a failed check is never remembered
        with pytest.raises(ValueError, match="eps"):
            op.layer_norm(x, w, eps=-1.0)
    assert len(op._CHECKED) == 0


def test_rotary_keyed_forward_backward_and_in_place(keyed):
    torch.manual_seed(2)
    cos, sin = torch.randn(40, 8), torch.randn(40, 8)
    cases = [((2, 5, 3, 32), False), ((2, 5, 3, 32), True), ((1, 7, 2, 20), False), ((2, 5, 3, 32), False)]
    for i, (shape, with_pos) in enumerate(cases):
        x = torch.randn(shape, dtype=torch.float16)
        pos = torch.randint(0, 40, shape[:2]) if with_pos else None
        grad = torch.randn(shape, dtype=torch.float16)
        runs = []
        for plain in (False, True):
            with keyed.plain() if plain else contextlib.nullcontext():
                (xi,) = _leaves(x)
                y = rotary_op.apply_rotary(xi, cos, sin, position_ids=pos, interleaved=bool(i % 2))
                y.backward(grad)
                z = x.clone()
                rotary_op.apply_rotary(z, cos, sin, position_ids=pos, interleaved=bool(i % 2), inplace=True)
            runs.append((y.detach(), xi.grad, z))
        assert all(torch.equal(a, c) for a, c in zip(*runs))
    assert {name for name, _ in keyed} == {"rotary_kernel"}
    assert len(keyed) >= 5  # forward, backward and in-place keys of three signatures
    assert all(len(v) == 1 for v in keyed.values())
    with pytest.raises(ValueError, match="position_ids"):  # a cached signature still checks new positions' shape
        rotary_op.apply_rotary(torch.randn(2, 5, 3, 32, dtype=torch.float16), cos, sin,
                               position_ids=torch.zeros(3, 5, dtype=torch.int64))


def test_kvcache_keyed_decode_steps_append_and_attend_as_the_plain_path(keyed):
    """Paged decode steps with the new token appended: the keyed call (checks skipped from the second
    step, three kernels launched by key) writes the same caches and outputs as the plain call."""
    torch.manual_seed(3)
    B, Hq, Hkv, D, page, pages = 2, 4, 2, 32, 16, 8
    table = torch.randperm(pages, dtype=torch.int32).view(B, pages // B)
    caches = [torch.randn(pages, page, Hkv, D, dtype=torch.float16) for _ in range(2)]
    runs = []
    for plain in (False, True):
        kc, vc = (c.clone() for c in caches)
        lengths = torch.tensor([5, 40], dtype=torch.int32)
        outs = []
        with keyed.plain() if plain else contextlib.nullcontext():
            for step in range(3):
                gen = torch.Generator().manual_seed(step)
                q = torch.randn(B, 1, Hq, D, dtype=torch.float16, generator=gen)
                k, v = (torch.randn(B, 1, Hkv, D, dtype=torch.float16, generator=gen) for _ in range(2))
                outs.append(kvcache.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=lengths, block_table=table,
                                                           causal=True))
                ref, _ = kvcache_reference(q.double(), kc.double(), vc.double(), lengths + 1, block_table=table,
                                           causal=True)
                assert (outs[-1].double() - ref).abs().max() < 5e-3
                lengths = lengths + 1
        runs.append(outs + [kc, vc])
    assert all(torch.equal(a, c) for a, c in zip(*runs))
    assert {name for name, _ in keyed} >= {"kvcache_append", "kvcache_fwd_split"}
    assert len(kvcache._CHECKED) == 1  # one signature over the three steps
    assert all(len(v) == 1 for v in keyed.values())


# --------------------------------------------------------------------------------------------
# linear attention, its decode steps (session 28)

from tilecore.ops.linear_attention import gluon_forward as la_gluon  # noqa: E402
from tilecore.ops.linear_attention import op as la_op  # noqa: E402
from tilecore.tiles.launch import TmaOperand  # noqa: E402


@pytest.fixture
def keyed_la(keyed, monkeypatch):
    monkeypatch.setattr(la_op, "signature", _cpu_signature)
    for cache in (la_op._CHECKED, la_op._PLANS, la_op._MAMBA_STEPS):
        cache.clear()
    yield keyed
    for cache in (la_op._CHECKED, la_op._PLANS, la_op._MAMBA_STEPS):
        cache.clear()


def _plain(keyed, monkeypatch, plain):
    """keyed.plain() with linear attention's signature off too."""
    if not plain:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(keyed.plain())
    stack.enter_context(monkeypatch.context())
    monkeypatch.setattr(la_op, "signature", lambda *items: None)

    def restore():
        monkeypatch.setattr(la_op, "signature", _cpu_signature)
    stack.callback(restore)
    return stack


def test_linear_attention_keyed_forward_and_steps_as_the_plain_calls(keyed_la, monkeypatch):
    """linear_attention (tl forward), linear_attention_step (with and without the token axis, a decay) and
    mamba2_step: keyed calls (checks skipped from the second call, kernels launched by key) give the plain
    calls' bits, states included; one launch key, one specialization."""
    torch.manual_seed(4)
    f16 = dict(dtype=torch.float16)
    B, N, H, D = 1, 20, 2, 16
    q, k, v = (torch.randn(B, N, H, D, **f16) for _ in range(3))
    g = -torch.rand(B, N, H)
    qs, ks, vs = (torch.randn(2, H, D, **f16) for _ in range(3))
    gs = -torch.rand(2, H)
    x, dt, A = torch.randn(2, 4, 8, **f16), torch.rand(2, 4), -torch.rand(4)
    Bm, Cm, Dm, z = torch.randn(2, 1, 16, **f16), torch.randn(2, 1, 16, **f16), torch.randn(4), torch.randn(2, 4, 8, **f16)
    state0, mstate0 = torch.randn(2, H, D, D), torch.randn(2, 4, 8, 16)
    runs = []
    for plain in (False, True):
        outs = []
        with _plain(keyed_la, monkeypatch, plain):
            for _ in range(2):
                outs += list(la_op.linear_attention(q, k, v, decay=g, return_final_state=True))
                outs.append(la_op.linear_attention(q, k, v, chunk_size=16))
                state, mstate = state0.clone(), mstate0.clone()
                outs.append(la_op.linear_attention_step(qs, ks, vs, state, decay=gs))
                outs.append(la_op.linear_attention_step(qs[:, None], ks[:, None], vs[:, None], state, decay=gs))
                outs.append(la_op.mamba2_step(mstate, x, dt, A, Bm, Cm, D=Dm, z=z, dt_softplus=True))
                outs.append(la_op.mamba2_step(mstate, x, dt, A, Bm, Cm))
                outs += [state, mstate]
        runs.append(outs)
    assert all(a.shape == c.shape and torch.equal(a, c) for a, c in zip(*runs))
    names = {name for name, _ in keyed_la}
    assert names >= {"la_fwd_kernel", "la_step_kernel"}
    assert all(len(v) == 1 for v in keyed_la.values())
    assert len(la_op._CHECKED) == 6  # two forward signatures, two step signatures, two mamba2 ones


def test_linear_attention_step_keyed_refuses_what_the_checks_refuse(keyed_la):
    qs, ks, vs = (torch.randn(2, 2, 16, dtype=torch.float16) for _ in range(3))
    state = torch.zeros(2, 2, 16, 16)
    la_op.linear_attention_step(qs, ks, vs, state)
    for _ in range(2):  # a bad state never reaches the cache
        with pytest.raises(ValueError, match="state"):
            la_op.linear_attention_step(qs, ks, vs, torch.zeros(2, 2, 16, 8))
    with pytest.raises(TypeError, match="scale"):
        la_op.linear_attention_step(qs, ks, vs, state, scale=float("nan"))
    q4 = torch.randn(1, 20, 2, 16, dtype=torch.float16)
    la_op.linear_attention(q4, q4, q4, return_final_state=True)
    with pytest.raises(TypeError, match="return_final_state"):  # 1 is not True to the key
        la_op.linear_attention(q4, q4, q4, return_final_state=1)
    assert len(la_op._CHECKED) == 2


def test_gluon_forward_launch_args_as_tma_operands():
    """The keyed Gluon forward's arguments: TmaOperands whose descriptors are the plain launch's."""
    B, N, H, D = 1, 128, 2, 64
    q, k, v = (torch.randn(B, N, H, D, dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(v)
    try:
        plain = la_gluon.launch_args(q, k, v, None, None, None, None, None, o, None, 0.1)
    except Exception as err:  # noqa: BLE001 (no Gluon descriptor on this machine)
        pytest.skip(f"gluon descriptors: {err}")
    ops = la_gluon.launch_args(q, k, v, None, None, None, None, None, o, None, 0.1, operand=TmaOperand)
    assert plain[2] == ops[2] and set(plain[1]) == set(ops[1])
    for name in ("q_desc", "k_desc", "v_desc", "o_desc", "z_desc"):
        a, b = plain[1][name], ops[1][name].descriptor()
        assert (a.shape, a.strides, a.block_shape, a.base.data_ptr()) == (b.shape, b.strides, b.block_shape,
                                                                          b.base.data_ptr())
    assert all(plain[1][n] is ops[1][n] or not isinstance(plain[1][n], torch.Tensor) or
               plain[1][n].shape == ops[1][n].shape for n in plain[1])


# --------------------------------------------------------------------------------------------
# attention_varlen (session 28)

from tilecore.ops.attention_varlen import op as varlen_op  # noqa: E402
from tilecore.ops.attention_varlen.reference import varlen_reference  # noqa: E402


def test_varlen_keyed_forward_reads_new_lengths_each_call(keyed, monkeypatch):
    """attention_varlen keyed: one signature, different cu_seqlens values on each call (the checks and
    launches found by key, the lengths read each time: no stale table), the plain call's bits, through
    the eager Function (a gradient recorded)."""
    monkeypatch.setattr(varlen_op, "signature", _cpu_signature)
    varlen_op._CHECKED.clear()
    varlen_op._GLUON_FITS.clear()
    torch.manual_seed(5)
    total, H, D = 24, 1, 16
    q, k, v = (torch.randn(total, H, D, dtype=torch.float16) for _ in range(3))
    lengths = ([0, 5, 24], [0, 20, 24], [0, 5, 24])
    runs = []
    for plain in (False, True):
        outs = []
        with keyed.plain() if plain else contextlib.nullcontext():
            if plain:
                monkeypatch.setattr(varlen_op, "signature", lambda *items: None)
            for values in lengths:
                cu = torch.tensor(values, dtype=torch.int32)
                leaves = _leaves(q, k, v)
                out = varlen_op.attention_varlen(*leaves, cu, cu, 24, 24, causal=True, validate=False)
                ref, _ = varlen_reference(q.double(), k.double(), v.double(), cu, cu, causal=True)
                assert (out.double() - ref).abs().max() < 5e-3  # the lengths of this call, not a cached table's
                assert out.requires_grad  # through the eager Function (its forward keyed)
                outs.append(out.detach())
            monkeypatch.setattr(varlen_op, "signature", _cpu_signature)
        runs.append(outs)
    assert all(torch.equal(a, c) for a, c in zip(*runs))
    assert "varlen_fwd" in {name for name, _ in keyed}
    assert all(len(v) == 1 for v in keyed.values())
    assert len(varlen_op._CHECKED) == 1
    with pytest.raises(ValueError, match="window_size"):  # a new window is checked
        varlen_op.attention_varlen(q, k, v, cu, cu, 24, 24, window_size=(-2, 0), validate=False)
    with pytest.raises(TypeError, match="causal"):  # 1 is not True to the key: checked and refused
        varlen_op.attention_varlen(q, k, v, cu, cu, 24, 24, causal=1, validate=False)
    varlen_op._CHECKED.clear()
    varlen_op._GLUON_FITS.clear()


# --------------------------------------------------------------------------------------------
# hadamard_quantize (session 28)

from tilecore.ops.hadamard import quantize as hq  # noqa: E402


def test_hadamard_quantize_keyed_as_the_plain_calls(keyed, monkeypatch):
    """hadamard_quantize keyed (no scale, no signs): the plain calls' codes and scales, nvfp4's two
    launches of one kernel under two keys; a scale or signs (values the checks read) are never keyed."""
    hq._CHECKED.clear()
    hq._PLANS.clear()
    torch.manual_seed(6)
    # the fused path (n = 3 x 16; the pow2 kernel takes ~6 s a call in the interpreter: the GPU script
    # host_time.py checks its keyed bits); fp8 twice: the second call a cached signature
    cases = [((2, 48), "fp8_e4m3"), ((2, 48), "nvfp4"), ((2, 48), "fp8_e4m3")]
    xs = [torch.randn(shape, dtype=torch.float16) for shape, _ in cases]
    runs = []
    for signature_of in (_cpu_signature, lambda *items: None):
        monkeypatch.setattr(hq, "signature", signature_of)
        outs = []
        for x, (_, fmt) in zip(xs, cases):
            codes, scales = hq.hadamard_quantize(x, format=fmt)
            outs += [codes.view(torch.uint8)] + [s.view(torch.uint8) if s.dtype.itemsize == 1 else s
                                                 for s in (scales if isinstance(scales, tuple) else (scales,))]
        runs.append(outs)
    assert all(a.shape == c.shape and torch.equal(a, c) for a, c in zip(*runs))
    assert len(hq._CHECKED) == 2 and len(hq._PLANS) == 2
    assert all(len(v) == 1 for v in keyed.values())
    assert len([k for name, k in keyed if name == "rotate_quantize_kernel"]) == 3  # nvfp4: amax and codes keys
    monkeypatch.setattr(hq, "signature", _cpu_signature)
    x = xs[0]
    with pytest.raises(ValueError, match="scale"):  # a scale's value is checked each call
        hq.hadamard_quantize(x, format="fp8_e4m3", scale=-1.0)
    assert len(hq._CHECKED) == 2
    hq._CHECKED.clear()
    hq._PLANS.clear()


# --------------------------------------------------------------------------------------------
# attention_fp8 (session 28)

from tilecore.ops.attention_fp8 import op as fp8_op  # noqa: E402


def test_attention_fp8_keyed_as_the_plain_calls_and_scales_checked_each_call(keyed, monkeypatch):
    fp8_op._CHECKED.clear()
    fp8_op._PLANS.clear()
    torch.manual_seed(7)
    q, k, v = (torch.randn(1, 2, 20, 32).to(torch.float8_e4m3fn) for _ in range(3))
    qs, ks, vs = (torch.rand(1, 2) + 0.5 for _ in range(3))
    runs = []
    for signature_of in (_cpu_signature, lambda *items: None):
        monkeypatch.setattr(fp8_op, "signature", signature_of)
        runs.append([fp8_op.attention_fp8(q, k, v, q_scale=qs, k_scale=ks, v_scale=vs, causal=causal,
                                          out_dtype=torch.float16, check_scales=check)
                     for causal, check in ((True, True), (False, False), (True, False))])
    assert all(torch.equal(a, c) for a, c in zip(*runs))
    assert len(fp8_op._CHECKED) == 2 and all(len(v) == 1 for v in keyed.values())
    assert {name for name, _ in keyed} == {"attn_fp8_fwd"}
    monkeypatch.setattr(fp8_op, "signature", _cpu_signature)
    with pytest.raises(ValueError, match="k_scale"):  # a cached signature still checks the descales' values
        fp8_op.attention_fp8(q, k, v, q_scale=qs, k_scale=-ks, v_scale=vs, causal=True, out_dtype=torch.float16)
    with pytest.raises(RuntimeError, match="forward-only"):  # a gradient to record is never keyed
        fp8_op.attention_fp8(q, k, v, q_scale=qs.requires_grad_(), k_scale=ks, v_scale=vs, causal=True,
                             out_dtype=torch.float16)
    fp8_op._CHECKED.clear()
    fp8_op._PLANS.clear()


# --------------------------------------------------------------------------------------------
# fft_conv (session 28)

from tilecore.ops.fft_conv import op as fft_op  # noqa: E402


def test_fft_conv_keyed_reads_the_new_filter_each_call(monkeypatch):
    """fft_conv keyed: the checks and plan found by signature, the filter's spectrum computed from this
    call's values (two filters of one signature give their own results, as the plain calls do)."""
    fft_op._CHECKED.clear()
    fft_op._PLANS.clear()
    fft_op._GLUON_CONVS.clear()
    torch.manual_seed(8)
    u = torch.randn(1, 2, 64, dtype=torch.float16)
    filters = [torch.randn(2, 16) for _ in range(2)]
    runs = []
    for signature_of in (_cpu_signature, lambda *items: None):
        monkeypatch.setattr(fft_op, "signature", signature_of)
        runs.append([fft_op.fft_conv(u, k) for k in filters + filters[:1]])
    assert all(torch.equal(a, c) for a, c in zip(*runs))
    assert not torch.equal(runs[0][0], runs[0][1]) and torch.equal(runs[0][0], runs[0][2])
    assert len(fft_op._CHECKED) == 1 and len(fft_op._PLANS) == 1
    monkeypatch.setattr(fft_op, "signature", _cpu_signature)
    with pytest.raises(ValueError, match="filter_len"):  # a new filter shape is checked
        fft_op.fft_conv(u, torch.randn(2, 65))
    fft_op._CHECKED.clear()
    fft_op._PLANS.clear()
    fft_op._GLUON_CONVS.clear()


def test_fft_conv_kernels_launched_by_key_as_the_plain_calls(keyed, monkeypatch):
    """fft_conv's kernels launched by key (session 29): the pair kernel (bf16/fp16 u at 256) and the float32
    tl kernel, filter and spectrum forms, a conjugate spectrum view (resolved into a fresh copy: its own
    key), misaligned u; one launch key never meets two Triton keys, the plain calls' bits, and a new
    filter's values read each call."""
    fft_op._CHECKED.clear()
    fft_op._PLANS.clear()
    fft_op._GLUON_CONVS.clear()
    torch.manual_seed(12)
    n = 256
    base = torch.randn(3 * 2 * n + 1, dtype=torch.float16)
    u16, u16_misaligned = base[:-1].view(3, 2, n), base[1:].view(3, 2, n)
    u32 = torch.randn(3, 2, n)
    filters = [torch.randn(2, 40) for _ in range(2)]
    spectrum = fft_op.filter_spectrum(filters[0], n)
    calls = [(u16, filters[0]), (u16, filters[1]), (u16_misaligned, filters[0]), (u32, filters[1]),
             (u16, spectrum), (u16, spectrum.conj()), (u16, spectrum), (u16, filters[0])]
    runs = []
    for signature_of in (_cpu_signature, lambda *items: None):
        monkeypatch.setattr(fft_op, "signature", signature_of)
        runs.append([fft_op.fft_conv(u, k) for u, k in calls])
    assert all(torch.equal(a, c) for a, c in zip(*runs))
    assert not torch.equal(runs[0][0], runs[0][1]) and torch.equal(runs[0][0], runs[0][7])
    assert not torch.equal(runs[0][4], runs[0][5])  # the conjugate is another filter
    names = {name for name, _ in keyed}
    assert names == {"fft_conv_pair_kernel", "fft_conv_kernel"}
    assert all(len(v) == 1 for v in keyed.values())
    # u16 filter, misaligned u16, u32, spectrum, its conjugate view: five launch keys
    assert len(keyed) == 5
    fft_op._CHECKED.clear()
    fft_op._PLANS.clear()
    fft_op._GLUON_CONVS.clear()


def test_ranked_work_table_is_the_sorted_table():
    """varlen_work.varlen_work_table_ranked (the order and the table in one launch): entry for entry
    work_table_torch's (argsort descending, stable: ties in batch order), zero lengths, ties, Nk != N."""
    torch.manual_seed(9)
    for batch, tile_m, heads in ((1, 16, 1), (5, 16, 2), (37, 32, 3)):
        lens_q = torch.randint(0, 40, (batch,))
        lens_q[::3] = lens_q[0]  # ties
        lens_k = torch.where(torch.arange(batch) % 2 == 0, lens_q, torch.randint(0, 40, (batch,)))
        cu_q = torch.cat([torch.zeros(1, dtype=torch.int64), lens_q.cumsum(0)]).to(torch.int32)
        cu_k = torch.cat([torch.zeros(1, dtype=torch.int64), lens_k.cumsum(0)]).to(torch.int32)
        total = int(cu_q[-1])
        ranked = varlen_op.work_table(cu_q, cu_k, total, heads, tile_m, ranked=True)
        expected = varlen_op.work_table_torch(cu_q, cu_k, total, heads, tile_m)
        assert torch.equal(ranked, expected)
        assert torch.equal(varlen_op.work_table(cu_q, cu_k, total, heads, tile_m, ranked=False), expected)


def test_linear_attention_eager_autograd_as_the_custom_op(monkeypatch):
    """linear_attention and mamba2_chunk_scan recording a gradient go through tiles.eager's Function (no
    custom op's host time): outputs, final state and every gradient equal the custom op's bit for bit."""
    from tilecore import dispatch

    torch.manual_seed(10)
    f16 = dict(dtype=torch.float16)
    B, N, H, D = 1, 20, 2, 16
    base = [torch.randn(B, N, H, D, **f16) for _ in range(3)] + [-torch.rand(B, N, H), torch.randn(B, H, D, D)]
    x, dt, A = torch.randn(1, 20, 2, 16, **f16), torch.rand(1, 20, 2), -torch.rand(2)
    Bm, Cm, Dm, z = (torch.randn(1, 20, 1, 16, **f16), torch.randn(1, 20, 1, 16, **f16), torch.randn(2),
                     torch.randn(1, 20, 2, 16, **f16))
    runs = []
    for mode in (None, "op"):
        with monkeypatch.context() as patch:
            if mode:
                patch.setattr(dispatch, "eager_mode", lambda *tensors: "op")
            else:  # keyed, as a CUDA call would be
                patch.setattr(la_op, "signature", _cpu_signature)
            q, k, v, g, h0 = _leaves(*base)
            o, ht = la_op.linear_attention(q, k, v, decay=g, initial_state=h0, return_final_state=True)
            (o.float().square().sum() + ht.sum()).backward()
            assert ("LinearAttentionFunction" in type(o.grad_fn).__name__) == (mode is None)
            leaves = _leaves(x, dt, Bm, Cm, Dm, z)
            y = la_op.mamba2_chunk_scan(leaves[0], leaves[1], A, leaves[2], leaves[3], D=leaves[4], z=leaves[5],
                                        chunk_size=16)
            y.float().sum().backward()
            runs.append([o, ht] + [t.grad for t in (q, k, v, g, h0)] + [y] + [t.grad for t in leaves])
    assert all(a is not None and torch.equal(a, c) for a, c in zip(*runs))
    la_op._CHECKED.clear()
    la_op._PLANS.clear()


def test_fft_conv_eager_autograd_as_the_custom_op(monkeypatch):
    """fft_conv recording a gradient goes through tiles.eager's Functions (filter and spectrum forms): the
    custom ops' outputs and gradients bit for bit, needs_input_grad read over the op's inputs (only u or
    only k requiring a gradient), and a spectrum's gradient as the op gives it."""
    from tilecore import dispatch

    torch.manual_seed(11)
    u0, k0 = torch.randn(2, 2, 64), torch.randn(2, 16)  # float32 at 64: torch.fft (the Functions are the point)
    runs = []
    for mode in (None, "op"):
        with monkeypatch.context() as patch:
            if mode:
                patch.setattr(dispatch, "eager_mode", lambda *tensors: "op")
            outs = []
            for wants in ((True, True), (True, False), (False, True)):
                u, k = (t.detach().clone().requires_grad_(w) for t, w in zip((u0, k0), wants))
                y = fft_op.fft_conv(u, k)
                assert ("FftConvFunction" in type(y.grad_fn).__name__) == (mode is None)
                y.float().square().sum().backward()
                outs += [y.detach()] + [t.grad for t in (u, k) if t.requires_grad]
            u = u0.clone().requires_grad_()
            y = fft_op.fft_conv(u, fft_op.filter_spectrum(k0, 64))
            y.float().sum().backward()
            outs += [y.detach(), u.grad]
            spectrum = fft_op.filter_spectrum(k0, 64).requires_grad_()
            fft_op.fft_conv(u0, spectrum).float().square().sum().backward()
            outs.append(spectrum.grad)
            runs.append(outs)
    assert len(runs[0]) == len(runs[1]) and all(torch.equal(a, c) for a, c in zip(*runs))


def test_varlen_gluon_forward_layout_kept_per_key_as_the_plain_launch(monkeypatch):
    """forward_gluon's settings kept per launch key (session 29): a keyed call hands the launch what the
    plain call does (grid, every argument but the fresh tensors, options), its work table from this call's
    lengths; packed_operand's (heads, total, D) view of the memory without a view op."""
    calls = []

    class Recorder:  # CachedLaunch.run
        def run(self, key, grid, args, kwargs):
            calls.append((key, grid, args, kwargs))

    monkeypatch.setattr(varlen_op, "GLUON_VARLEN_FWD", Recorder())
    monkeypatch.setattr(varlen_op.dispatch, "num_sms", lambda device: 132)
    monkeypatch.setattr(varlen_op, "work_table", lambda cu_q, cu_k, total, heads, rows, key=None, ranked=None:
                        varlen_op.work_table_torch(cu_q, cu_k, total, heads, rows))
    varlen_op._GLUON_FORWARD_LAYOUTS.clear()
    q = torch.randn(60, 4, 64, dtype=torch.bfloat16)
    for lengths in ([0, 10, 60], [0, 50, 60], [0, 50, 60]):
        cu = torch.tensor(lengths, dtype=torch.int32)
        for key in (None, ("test", 1)):
            varlen_op.forward_gluon(q, q, q, cu, cu, True, 0.125, 0.0, key=key)
        (_, grid0, args0, opts0), (key1, grid1, args1, opts1) = calls[-2:]
        assert key1 == ("test", 1) and grid0 == grid1 and opts0 == opts1
        for a, b in zip(args0, args1):
            if isinstance(a, tiles_launch.TmaOperand):
                assert (a.shape, a.strides, a.block_shape, a.key[:4]) == (b.shape, b.strides, b.block_shape,
                                                                           b.key[:4])
            elif isinstance(a, torch.Tensor):
                assert a.shape == b.shape and (a.dtype != torch.int32 or torch.equal(a, b))  # tables: this call's
            else:
                assert a == b
    assert len(varlen_op._GLUON_FORWARD_LAYOUTS) == 1
    view = q.transpose(0, 1)
    operand = varlen_op.packed_operand(q, 64)
    assert operand.shape == list(view.shape) and operand.strides == list(view.stride())
    assert operand.base.data_ptr() == view.data_ptr()
    varlen_op._GLUON_FORWARD_LAYOUTS.clear()
    varlen_op._GLUON_FORWARDS.clear()


def test_attention_fp8_gluon_layout_kept_per_key_as_the_plain_launch(monkeypatch):
    """attention_fp8's Gluon launch settings kept per launch key (session 29): a keyed call hands the launch
    the plain call's grid, options and arguments (descriptors of the same layouts)."""
    from tilecore.ops.attention_fp8 import launch as fp8_launch

    calls = []

    class Recorder:  # CachedLaunch.run
        def run(self, key, grid, args, kwargs):
            calls.append((key, grid, args, kwargs))

    monkeypatch.setattr(fp8_launch, "GLUON_FWD", Recorder())
    monkeypatch.setattr(fp8_launch, "_tiling", lambda q, k, rows, block_n, causal: ((7,), 2, 1))
    fp8_launch._GLUON_LAYOUTS.clear()
    fp8_launch._TILINGS.clear()
    torch.manual_seed(13)
    q, k = (torch.randn(1, 2, 40, 64).to(torch.float8_e4m3fn) for _ in range(2))
    v = torch.randn(1, 2, 40, 64).to(torch.float8_e4m3fn)
    scales = [torch.rand(1, 2) + 0.5, torch.rand(1, 2, 1) + 0.5, torch.rand(1, 2) + 0.5]
    for causal in (True, False, True):
        p = fp8_launch.plan(q, k, causal, path="gluon")
        for key in (None, ("test", causal)):
            fp8_launch.forward(p, q, k, v, *scales, causal, 0.125, torch.bfloat16, key=key)
        (_, grid0, args0, opts0), (key1, grid1, args1, opts1) = calls[-2:]
        assert key1 == ("test", causal) and grid0 == grid1 == (7,) and opts0 == opts1
        assert opts0["CAUSAL"] is causal and opts0["K_PER_ROW"] is False  # one k scale a block: K_PER_BLOCK
        for a, b in zip(args0, args1):
            if isinstance(a, tiles_launch.TmaOperand):
                assert (a.shape, a.strides, a.block_shape) == (b.shape, b.strides, b.block_shape)
            elif isinstance(a, torch.Tensor):
                assert a.shape == b.shape and a.dtype == b.dtype
            else:
                assert a == b
    assert len(fp8_launch._GLUON_LAYOUTS) == 2
    fp8_launch._GLUON_LAYOUTS.clear()
    fp8_launch._TILINGS.clear()
