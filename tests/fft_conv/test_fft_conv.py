"""fft_conv on both CPU paths (the Monarch Triton kernel through the interpreter, torch.fft without it)
against float64: every kernel length, other lengths, short filters, gradients in u and k, the spectrum
form, strided views, NaN, bad input, torch.compile, offsets past 2^31 elements."""
import math

import pytest
import torch

from tilecore import accuracy, dispatch
from tilecore.ops.fft_conv import configs, fft_conv, fft_conv_reference, filter_spectrum, launch, plan
from tilecore.ops.fft_conv.reference import fft_conv_direct

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(params=["interpreter", "cpu"])
def path(request, monkeypatch):
    """Both CPU paths; kernel outputs start as NaN (a finite result was written)."""
    if request.param == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(launch, "output", lambda shape, dtype, device: torch.full(shape, math.nan, dtype=dtype,
                                                                                  device=device))
    return request.param


def assert_close(out, ref, what="y", pair=False, fp16_bound=3.0):
    """float32: float32's accuracy; 16-bit: one rounding of a float32 result (the interpreter truncates
    to bf16: twice the floor's RMS); the pair kernel's float16 products (``pair``): fp16 at <= 3x."""
    assert torch.isfinite(out).all(), f"{what}: non-finite elements (unwritten?)"
    if out.dtype == torch.float32:
        assert accuracy.rel_rms(out, ref) <= 2e-6, what
    else:
        bound = 2.6 if out.dtype == torch.bfloat16 and dispatch.interpreter_enabled() else 1.1
        if pair and out.dtype == torch.float16:
            bound = fp16_bound
        err = accuracy.error_over_floor(out, ref)
        assert err <= bound, f"{what}: {err:.3f}x the rounding floor"


def expected_path(path, n, dtype):
    if path != "interpreter":
        return "torch"
    if dtype != torch.float32 and n in configs.PAIR_CONFIGS:
        return "pair"
    if dtype != torch.float32 and n in configs.LONG_CONFIGS:
        return "long"
    return "tl" if n in configs.TL_FACTORS else "torch"


def inputs(B, H, N, dtype, filter_len=None):
    u = torch.randn(B, H, N).to(dtype).requires_grad_()
    k = (torch.randn(H, filter_len or N) / math.sqrt(filter_len or N)).to(dtype).requires_grad_()
    return u, k


def test_the_64_by_64_factors_for_2048(monkeypatch):
    """Not shipped (it spills on sm_90a: configs.py), but the kernel is correct with them."""
    monkeypatch.setitem(configs.TL_FACTORS, 2048, (64, 64))
    monkeypatch.setitem(configs.TL_WARPS, 2048, 8)
    u, k = inputs(1, 2, 2048, torch.float32)
    assert_close(fft_conv(u.detach(), k.detach()), fft_conv_reference(u.detach(), k.detach()))


def test_reference_is_the_direct_sum():
    u, k = torch.randn(2, 3, 50), torch.randn(3, 20)
    assert accuracy.rel_rms(fft_conv_reference(u, k), fft_conv_direct(u, k)) < 1e-14


@pytest.mark.parametrize("n", sorted(configs.TL_FACTORS) + [2048, 100, 1])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_float64_with_gradients(path, n, dtype):
    kind = plan.plan(n, torch.device("cpu"), dtype).path
    assert kind == expected_path(path, n, dtype)
    u, k = inputs(2, 3, n, dtype, filter_len=max(1, n // 3) if n == 512 else None)
    y = fft_conv(u, k)
    assert y.shape == u.shape and y.dtype == dtype
    pair = kind in ("pair", "long")
    assert_close(y, fft_conv_reference(u.detach(), k.detach()), pair=pair)
    dy = torch.randn(u.shape).to(dtype)
    du, dk = torch.autograd.grad(y, (u, k), dy)
    u64, k64 = u.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    ref_du, ref_dk = torch.autograd.grad(fft_conv_reference(u64, k64), (u64, k64), dy.double())
    assert du.dtype == dtype and dk.dtype == dtype and dk.shape == k.shape
    assert_close(du, ref_du, "du", pair=pair)
    assert_close(dk, ref_dk, "dk")


def test_spectrum_form(path):
    u, k = inputs(2, 4, 256, torch.float16)
    spectrum = filter_spectrum(k.detach(), 256)
    y = fft_conv(u, spectrum)
    assert torch.equal(y, fft_conv(u, k.detach()))
    (du,) = torch.autograd.grad(y, u, torch.ones_like(y))
    (du_filter,) = torch.autograd.grad(fft_conv(u, k.detach()), u, torch.ones_like(y))
    assert torch.equal(du, du_filter)


@pytest.mark.parametrize("n, filter_len", [(256, 256), (256, 77), (300, 300), (1, 1)])
def test_spectrum_form_is_differentiable_to_the_filter(path, n, filter_len):
    """fft_conv(u, filter_spectrum(k, n)) with k requiring grad: du and dk (through the spectrum's gradient and
    rfft's backward) against float64, and equal to fft_conv(u, k)'s own up to float32 rounding; the spectrum's
    gradient itself against torch's autograd of the float64 torch.fft convolution with the spectrum a leaf."""
    u, k = inputs(3, 2, n, torch.float32, filter_len)
    dy = torch.randn(3, 2, n)
    du, dk = torch.autograd.grad(fft_conv(u, filter_spectrum(k, n)), (u, k), dy)
    u64, k64 = u.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    ref_du, ref_dk = torch.autograd.grad(fft_conv_reference(u64, k64), (u64, k64), dy.double())
    assert dk.shape == k.shape and dk.dtype == k.dtype
    assert_close(du, ref_du, "du")
    assert accuracy.rel_rms(dk, ref_dk) <= 2e-6, accuracy.rel_rms(dk, ref_dk)
    du_f, dk_f = torch.autograd.grad(fft_conv(u, k), (u, k), dy)
    assert accuracy.rel_rms(dk, dk_f) <= 2e-6 and accuracy.rel_rms(du, du_f) <= 2e-6
    # the spectrum as a leaf: PyTorch's complex gradient convention (dL/dRe + i dL/dIm), bins 0 and N included
    spectrum = filter_spectrum(k.detach(), n).requires_grad_()
    (got,) = torch.autograd.grad(fft_conv(u.detach(), spectrum), spectrum, dy)
    s64 = spectrum.detach().to(torch.complex128).requires_grad_()
    y64 = torch.fft.irfft(torch.fft.rfft(u64.detach(), n=2 * n) * s64, n=2 * n)[..., :n]
    (want,) = torch.autograd.grad(y64, s64, dy.double())
    assert got.dtype == torch.complex64 and got.shape == (2, n + 1)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_spectrum_gradient_of_the_correlation():
    """The backward's correlation (conj: u with conj(K)) has the conjugate gradient in K (op.spectrum_grad's
    conj), against torch's autograd in float64."""
    from tilecore.ops.fft_conv.op import spectrum_grad

    n = 64
    u, dy = torch.randn(3, 2, n), torch.randn(3, 2, n)
    s64 = torch.fft.rfft(torch.randn(2, n, dtype=torch.float64), n=2 * n).requires_grad_()
    y64 = torch.fft.irfft(torch.fft.rfft(u.double(), n=2 * n) * s64.conj(), n=2 * n)[..., :n]
    (want,) = torch.autograd.grad(y64, s64, dy.double())
    got = spectrum_grad(u, dy, conj=True)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_spectrum_form_under_torch_compile():
    """filter_spectrum and fft_conv(u, spectrum) in one fullgraph trace: forward and the gradients in u and k
    (through the spectrum) as eager."""
    u, k = inputs(2, 3, 256, torch.float32, 100)

    def f(u, k):
        return fft_conv(u, filter_spectrum(k, u.shape[-1])) * 2

    got = torch.compile(f, fullgraph=True, backend="aot_eager")(u, k)
    want = f(u, k)
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got.sum(), (u, k)), torch.autograd.grad(want.sum(), (u, k))):
        torch.testing.assert_close(a, b)


def test_filter_spectrum_bad_input():
    k = torch.randn(3, 16)
    cases = [(dict(k=3.0), TypeError, "must be a tensor"), (dict(k=k.double()), TypeError, "float16, bfloat16"),
             (dict(k=torch.fft.rfft(k)), TypeError, "float16, bfloat16"), (dict(n=0), ValueError, "int >= 1"),
             (dict(n=8), ValueError, "filter_len <= n = 8"), (dict(k=torch.randn(16)), ValueError, "channels"),
             (dict(n=16.0), ValueError, "int >= 1")]
    for kwargs, error, words in cases:
        args = dict(k=k, n=16) | kwargs
        with pytest.raises(error, match=words):
            filter_spectrum(args["k"], args["n"])


def test_strided_views_and_nan(path):
    base = torch.randn(3, 2, 512, dtype=torch.float16)
    u = base.transpose(0, 1)[..., ::2]  # (2, 3, 256), features 2 apart, batch and channels swapped
    k = torch.randn(3, 256, dtype=torch.float16) / 16
    assert_close(fft_conv(u, k), fft_conv_reference(u, k), pair=True)
    v = torch.randn(2, 3, 256)
    v[1, 2, 17] = math.nan
    y = fft_conv(v, k.float())
    # as torch.fft's convolution: the NaN reaches every output of its sequence, and no other
    assert torch.isnan(y[1, 2]).all() and torch.isfinite(y[0]).all() and torch.isfinite(y[1, :2]).all()
    assert torch.equal(torch.isnan(y), torch.isnan(fft_conv_reference(v, k)))


def test_bad_input():
    u, k = torch.randn(2, 3, 16), torch.randn(3, 16)
    cases = [
        (dict(u=torch.randn(3, 16)), ValueError, "batch, channels, seqlen"),
        (dict(u=u.int()), TypeError, "float16, bfloat16 and float32"),
        (dict(k=torch.randn(4, 16)), ValueError, "channels = 3"),
        (dict(k=torch.randn(3, 17)), ValueError, "filter_len <= seqlen = 16"),
        (dict(k=torch.fft.rfft(k, n=16)), ValueError, r"\(3, 17\)"),
        (dict(k=k.double()), TypeError, "complex64 spectrum"),
        (dict(k=3.0), TypeError, "must be a tensor"),
    ]
    for kwargs, error, words in cases:
        args = dict(u=u, k=k) | kwargs
        with pytest.raises(error, match=words):
            fft_conv(args["u"], args["k"])


def test_torch_compile_fullgraph():
    u, k = inputs(2, 3, 256, torch.float32)

    def f(u, k):
        return fft_conv(u, k) * 2

    got = torch.compile(f, fullgraph=True, backend="aot_eager")(u, k)
    want = f(u, k)
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got.sum(), (u, k)), torch.autograd.grad(want.sum(), (u, k))):
        torch.testing.assert_close(a, b)


def test_rows_past_2_31_elements():
    """Sequences of a view 2^30 + 256 elements apart: the last starts past 2^31 (the storage is never
    filled; the OS maps only the pages touched)."""
    stride = (1 << 30) + 256
    base = torch.empty(2 * stride + 256, dtype=torch.float16)
    u = base.as_strided((1, 3, 256), (0, stride, 1))
    u.copy_(torch.randn(1, 3, 256))
    k = torch.randn(3, 256, dtype=torch.float16) / 16
    assert_close(fft_conv(u, k), fft_conv_reference(u, k), pair=True)


@pytest.mark.parametrize("config", [(32, 16, 2, 4), (64, 32, 1, 4), (32, 64, 2, 8), (32, 16, 0, 4), (64, 32, 0, 4),
                                    (32, 16, 1, 4, 2), (32, 16, 1, 4, 4, 2), (32, 16, 2, 4, 2, 1, True)])
def test_pair_kernel_odd_batch_and_unequal_scales(config):
    """The pair kernel at configurations the GPU check times: an odd batch (the last pair's second
    half is masked), several pairs a program, a program looping over groups of pairs (LOOP 2: the
    last program's second group half empty; LOOP 4: past the batch), and halves of a pair 10^6 apart
    in scale (each sequence is scaled to its own largest |u| before pairing: the small one keeps its
    relative accuracy)."""
    n1, n2, pairs = config[:3]
    n = n1 * n2 // 2
    u = torch.randn(5, 2, n, dtype=torch.float64)
    u[0] *= 1e3
    u[pairs] *= 1e-3  # the partner of sequence 0
    u = u.half()
    k = torch.randn(2, n) / math.sqrt(n)
    y = torch.full_like(u, math.nan)
    launch.launch(plan.pair_plan(*config), u, filter_spectrum(k, n), y, False)
    ref = fft_conv_reference(u, k)
    for b in range(5):
        assert_close(y[b], ref[b], f"y[{b}]", pair=True)


@pytest.mark.parametrize("config", [(32, 16, 4, 4), (32, 16, 0, 4)])
def test_pair_kernel_nonfinite_stays_in_its_sequence(config):
    """A NaN or inf in one half of a pair makes that sequence's outputs NaN (as torch.fft's convolution)
    and leaves its partner's finite; a NaN filter makes its channel's outputs NaN."""
    u = torch.randn(4, 3, 256, dtype=torch.float16)
    k = torch.randn(3, 256) / 16
    u[0, 1, 5] = math.nan
    u[3, 2, 100] = math.inf
    k[0, 7] = math.nan
    y = torch.full_like(u, 0.0)
    launch.launch(plan.pair_plan(*config), u, filter_spectrum(k, 256), y, False)
    bad = torch.zeros(4, 3, dtype=torch.bool)
    bad[0, 1] = bad[3, 2] = True
    bad[:, 0] = True
    assert torch.isnan(y[bad]).all() and torch.isfinite(y[~bad]).all()
    assert torch.equal(torch.isfinite(y), torch.isfinite(fft_conv_reference(u, k)))


@pytest.mark.parametrize("config", [(32, 16, 16, 16, 16, 4, 4), (32, 16, 16, 16, 16, 4, 4, True)])
def test_long_kernels(config):
    """The three-pass form (kernels_long.py) at small N1 x N2 (the GPU's are 128 x 128 and 256 x 128):
    the convolution and the backward's correlation (conj), an odd batch, a pair's halves 10^6 apart in
    scale, a NaN in one sequence kept there and a NaN filter's channel; also with Gauss's three-product
    complex products (fp16 <= 4.5x its floor: one more float16 rounding of the operand sums)."""
    n1, n2 = config[:2]
    fp16_bound = 4.5 if len(config) > 7 and config[7] else 3.0
    n = n1 * n2 // 2
    u = torch.randn(3, 2, n, dtype=torch.float64)
    u[0] *= 1e3
    u[1] *= 1e-3
    u = u.half()
    k = torch.randn(2, n) / math.sqrt(n)
    spectrum = filter_spectrum(k, n)
    y = torch.full_like(u, math.nan)
    launch.launch(plan.long_plan(*config), u, spectrum, y, False)
    ref = fft_conv_reference(u, k)
    for b in range(3):
        assert_close(y[b], ref[b], f"y[{b}]", pair=True, fp16_bound=fp16_bound)
    launch.launch(plan.long_plan(*config), u, spectrum, y, True)
    correlation = fft_conv_reference(u.double().flip(-1), k).flip(-1)
    assert_close(y, correlation, "correlation", pair=True, fp16_bound=fp16_bound)
    u[1, 0, 3] = math.nan
    spectrum[1, 5] = math.nan
    launch.launch(plan.long_plan(*config), u, spectrum, y, False)
    bad = torch.zeros(3, 2, dtype=torch.bool)
    bad[1, 0] = True
    bad[:, 1] = True
    assert torch.isnan(y[bad]).all() and torch.isfinite(y[~bad]).all()


def test_plans():
    cuda = torch.device("cuda")
    assert plan.plan(8192, cuda, torch.bfloat16) == plan.long_plan(*configs.LONG_CONFIGS[8192])
    assert plan.plan(1024, cuda, torch.float16) == plan.pair_plan(*configs.PAIR_CONFIGS[1024])
    assert plan.plan(1024, cuda, torch.float32).path == "tl"
    assert plan.plan(8192, cuda, torch.float32).path == "torch"
    assert plan.plan(3000, cuda, torch.bfloat16).path == "torch"


def test_model_counts_the_kernels_products():
    """model.py's FLOPs are the pair kernel's four products (each four real ones, 2 FLOPs a multiply-add:
    [N2, N1/2] @ [N1/2, N1], [N1, N2] @ [N2, N2] twice, [N2, N1] @ [N1, N1/2]); the long form's bytes
    are the op's plus the float16 scratch (16 L bytes a pair) and u read twice."""
    from tilecore.ops.fft_conv import model

    n1, n2 = 32, 64
    products = [(n2, n1 // 2, n1), (n1, n2, n2), (n1, n2, n2), (n2, n1, n1 // 2)]
    assert model.pair_flops(n1, n2) == sum(4 * 2 * m * k * n for m, k, n in products)
    B, H, n = 4, 6, n1 * n2 // 2
    pair, = model.passes("pair", B, H, n, n1, n2)
    assert pair["bytes"] == model.op_bytes(B, H, n) and pair["flops"] == B // 2 * H * model.pair_flops(n1, n2)
    long = model.passes("long", B, H, n, n1, n2)
    assert sum(p["flops"] for p in long) == pair["flops"]
    assert sum(p["bytes"] for p in long) == model.op_bytes(B, H, n) + B * H * n * 2 + B // 2 * H * 16 * 2 * n
    assert model.bound_ms("long", B, H, n, n1, n2) > model.bound_ms("pair", B, H, n, n1, n2) > 0
    assert model.passes("torch", B, H, n) == []


@pytest.mark.parametrize("config,batch", [((32, 16, 2, 4), 5), ((32, 32, 8, 4), 4)])
def test_filter_gradient_kernel(config, batch):
    """dk through the pair kernel's transforms (launch.dk_pair): against float64 at a filter shorter
    than N, an odd batch (a masked half), groups past the batch (loop 8), sequences 10^6 apart in scale
    (float16 products: at a bf16 dk's floor); a NaN in u makes its channel's dk NaN, the others finite."""
    n1, n2 = config[:2]
    n = n1 * n2 // 2
    u = torch.randn(batch, 3, n, dtype=torch.float64)
    u[0] *= 1e3
    u[1] *= 1e-3
    u = u.half()
    dy = torch.randn(batch, 3, n).half()
    k = torch.zeros(3, n // 2 + 3, dtype=torch.float64, requires_grad=True)
    want, = torch.autograd.grad(fft_conv_reference(u.double(), k), k, dy.double())
    got = launch.dk_pair(config, u, dy, k.shape[-1])
    assert got.shape == want.shape and got.dtype == torch.float32
    assert accuracy.error_over_floor(got.bfloat16(), want) < 1.1
    top = want.abs().max()  # (fp16's range: u at 10^3 makes dk ~10^5)
    assert accuracy.error_over_floor((got / top).half(), want / top) < 3.0
    u[batch - 1, 1, 7] = math.nan
    got = launch.dk_pair(config, u, dy, k.shape[-1])
    assert torch.isnan(got[1]).all() and torch.isfinite(got[[0, 2]]).all()


def test_filter_gradient_kernel_through_autograd(monkeypatch):
    """fft_conv(u, k)'s backward takes dk from the kernel where configs.DK_CONFIGS has N (bf16 u and k):
    du and dk against float64; the torch path's backward (N not in the plans) shares rfft(dy)."""
    monkeypatch.setitem(configs.DK_CONFIGS, 256, (32, 16, 4, 4))
    for n in (256, 300):
        u = torch.randn(3, 2, n).half().requires_grad_()
        k = (torch.randn(2, n - 5) / math.sqrt(n)).half().requires_grad_()
        dy = torch.randn(3, 2, n).half()
        du, dk = torch.autograd.grad(fft_conv(u, k), (u, k), dy)
        u64, k64 = u.detach().double().requires_grad_(), k.detach().double().requires_grad_()
        ref_du, ref_dk = torch.autograd.grad(fft_conv_reference(u64, k64), (u64, k64), dy.double())
        assert accuracy.error_over_floor(du, ref_du) < 3.0 and accuracy.error_over_floor(dk, ref_dk) < 3.0


def test_filter_gradient_launch_is_chosen_once_and_handed_down(monkeypatch):
    """The backward looks the dk launch up once (plan.dk_plan) and hands that choice to the launch (session 32's review:
    it was looked up twice, with dy's dtype the second time): the pair kernel's config reaches launch.dk_pair as
    chosen; a float32 filter (not a 16-bit one) takes torch.fft's dk, whatever u's dtype."""
    from tilecore.ops.fft_conv import op as conv_op

    monkeypatch.setitem(configs.DK_CONFIGS, 256, (32, 16, 4, 4))
    chosen, launched = [], []
    real_plan, real_pair = conv_op.dk_plan, launch.dk_pair
    monkeypatch.setattr(conv_op, "dk_plan", lambda *a: chosen.append(real_plan(*a)) or chosen[-1])
    monkeypatch.setattr(launch, "dk_pair", lambda config, *a: launched.append(config) or real_pair(config, *a))
    u = torch.randn(3, 2, 256).half().requires_grad_()
    dy = torch.randn(3, 2, 256).half()
    for k_dtype, want in ((torch.float16, [("pair", (32, 16, 4, 4))]), (torch.float32, [None])):
        chosen.clear()
        launched.clear()
        k = (torch.randn(2, 200) / 16).to(k_dtype).requires_grad_()
        dk, = torch.autograd.grad(fft_conv(u, k), k, dy)
        assert chosen == want and launched == ([want[0][1]] if want[0] else []), (chosen, launched)
        u64, k64 = u.detach().double(), k.detach().double().requires_grad_()
        ref, = torch.autograd.grad(fft_conv_reference(u64, k64), k64, dy.double())
        assert dk.dtype == k_dtype
        if k_dtype == torch.float16:
            assert accuracy.error_over_floor(dk, ref) < 3.0
        else:  # (torch.fft in float32: its FFT's own rounding, several times float32's floor)
            assert accuracy.rel_rms(dk, ref) < 1e-5


def test_filter_gradient_kernel_under_torch_compile(monkeypatch):
    """The dk kernel's custom op (tilecore::fft_conv_filter_grad) traces with its fake: fullgraph
    forward + backward, the same gradients as eager."""
    monkeypatch.setitem(configs.DK_CONFIGS, 256, (32, 16, 2, 4))
    u = torch.randn(3, 2, 256).half().requires_grad_()
    k = (torch.randn(2, 256) / 16).half().requires_grad_()

    def f(u, k):
        return fft_conv(u, k).float().sum()

    got = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(u, k), (u, k))
    want = torch.autograd.grad(f(u, k), (u, k))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("config", [(64, 64, 1, 8), (64, 64, 2, 8), (128, 32, 1, 8)])
def test_pair_kernel_2048_stays_in_bounds(config):
    """N = 2048's pair configurations (which fault on the H100: notes/fft_conv) read and write only
    their own elements: u, y and the spectrum are views inside NaN-filled buffers, so a read past them
    would make y NaN and a write past y would touch the guards (the interpreter checks no bounds)."""
    n, batch, heads = 2048, 3, 2
    u_buf = torch.full((batch + 2, heads, n + 64), math.nan, dtype=torch.float16)
    u = u_buf[1:-1, :, 32:32 + n]
    u.copy_(torch.randn(batch, heads, n))
    y_buf = torch.full_like(u_buf, math.nan)
    y = y_buf[1:-1, :, 32:32 + n]
    k = torch.randn(heads, n) / math.sqrt(n)
    s_buf = torch.full((heads + 2, n + 1 + 16), complex(math.nan, math.nan), dtype=torch.complex64)
    spectrum = s_buf[1:-1, 8:8 + n + 1]
    spectrum.copy_(filter_spectrum(k, n))
    launch.launch(plan.pair_plan(*config), u, spectrum, y, False)
    assert_close(y, fft_conv_reference(u, k), pair=True)
    guard = torch.ones_like(y_buf, dtype=torch.bool)
    guard[1:-1, :, 32:32 + n] = False
    assert torch.isnan(y_buf[guard]).all()
