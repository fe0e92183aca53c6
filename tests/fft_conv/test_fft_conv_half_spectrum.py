"""The float16 filter spectrum (session 38): filter_spectrum(k, n, torch.float16) gives the bins as float16 (re, im)
pairs, fft_conv takes them (the Gluon tuples of configs.GLUON_ONEPASS_HALF / GLUON_ORDER3_HALF read them as they are on
Hopper; every other path widens them to complex64), at the floor against float64, differentiable."""
import math

import pytest
import torch

from tilecore import accuracy, dispatch
from tilecore.ops.fft_conv import configs, fft_conv, fft_conv_reference, filter_spectrum, gluon_emulate, gluon_order3
from tilecore.ops.fft_conv import plan as conv_plan
from compiled_run import compiled_json


def _correlation(u64, k64):
    n = u64.shape[-1]
    return torch.fft.irfft(torch.fft.rfft(u64, n=2 * n) * torch.fft.rfft(k64, n=2 * n).conj(), n=2 * n)[..., :n]


def test_filter_spectrum_float16_is_the_rounded_bins():
    g = torch.Generator().manual_seed(38)
    k = torch.randn(3, 50, generator=g)
    half = filter_spectrum(k, 64, torch.float16)
    full = filter_spectrum(k, 64)
    assert half.dtype == torch.float16 and half.shape == (3, 65, 2) and half.is_contiguous()
    assert torch.equal(half, torch.view_as_real(full).half())
    assert filter_spectrum(k, 64, torch.complex64).dtype == torch.complex64
    with pytest.raises(TypeError, match="complex64 or torch.float16"):
        filter_spectrum(k, 64, torch.bfloat16)


@pytest.mark.parametrize("n, dtype, grows", [(256, torch.bfloat16, 0.05), (100, torch.bfloat16, 0.05),
                                             (256, torch.float16, 0.6), (100, torch.float16, 0.6)])
def test_fft_conv_takes_a_float16_spectrum_at_the_floor(n, dtype, grows):
    """On the CPU (the interpreter's pair kernel at 256, torch.fft at 100) the float16 bins are widened to complex64:
    the same bits as passing that widened spectrum; against float64 of the filter itself the error (a multiple of the
    rounding floor) is the complex64 spectrum's plus the bins' float16 rounding (2^-11 relative): under bf16's floor
    (measured +0.01), near fp16's (+0.26 at 256, 1.0 -> 1.46 on torch.fft at 100)."""
    g = torch.Generator().manual_seed(n)
    u = torch.randn(3, 2, n, generator=g).to(dtype)
    k = (torch.randn(2, n, generator=g) / math.sqrt(n)).to(dtype)
    half = filter_spectrum(k, n, torch.float16)
    y = fft_conv(u, half)
    assert y.dtype == dtype and y.shape == u.shape
    assert torch.equal(y, fft_conv(u, torch.view_as_complex(half.float())))
    ref = fft_conv_reference(u.double(), k.double())
    err, err64 = (accuracy.error_over_floor(out, ref) for out in (y, fft_conv(u, filter_spectrum(k, n))))
    assert err <= err64 + grows, (err, err64)


def test_fft_conv_rejects_a_float16_spectrum_of_the_wrong_shape_or_dtype():
    u = torch.randn(2, 3, 16)
    k = torch.randn(3, 16)
    half = filter_spectrum(k, 16, torch.float16)
    for bad in (half[..., :1], half.float(), half[:, :16], half[:2], torch.zeros(3, 17, 2, dtype=torch.bfloat16)):
        with pytest.raises(ValueError, match=r"float16 \(3, 17, 2\)"):
            fft_conv(u, bad)


def test_float16_spectrum_gradients_are_the_complex64_ones_rounded():
    """A float16 spectrum's gradient is the complex64 spectrum's (as pairs) in float16, du the same bits, and through
    filter_spectrum(..., torch.float16) the filter's gradient matches the complex64 route's to float16 rounding."""
    n = 40
    g = torch.Generator().manual_seed(7)
    u = torch.randn(3, 2, n, generator=g)
    k = torch.randn(2, n, generator=g) / math.sqrt(n)
    dy = torch.randn(3, 2, n, generator=g)
    half = filter_spectrum(k, n, torch.float16).requires_grad_()
    wide = torch.view_as_complex(half.detach().float()).requires_grad_()
    grads = []
    for s in (half, wide):
        uu = u.clone().requires_grad_()
        fft_conv(uu, s).backward(dy)
        grads.append((uu.grad, s.grad))
    (du16, ds16), (du64, ds64) = grads
    assert ds16.dtype == torch.float16 and ds16.shape == half.shape
    assert torch.equal(ds16, torch.view_as_real(ds64).half()) and torch.equal(du16, du64)
    k16 = k.clone().requires_grad_()
    k64 = k.clone().requires_grad_()
    fft_conv(u, filter_spectrum(k16, n, torch.float16)).backward(dy)
    fft_conv(u, filter_spectrum(k64, n)).backward(dy)
    assert k16.grad.dtype == torch.float32
    assert torch.allclose(k16.grad, k64.grad, rtol=0, atol=2e-3 * k64.grad.abs().max())


def test_plan_reads_a_float16_spectrum_only_behind_its_half_tables(monkeypatch):
    meta = torch.device("meta")
    monkeypatch.setattr(dispatch, "interpreter_enabled", lambda: False)  # (as on the GPU)
    with dispatch.pretend(dispatch.TARGETS["sm_90a"]):
        for table, n in ((configs.GLUON_ONEPASS_HALF, 4096), (configs.GLUON_ORDER3_HALF, 8192)):
            monkeypatch.delitem(table, n, raising=False)
            shipped = conv_plan.plan(n, meta, torch.bfloat16)
            assert conv_plan.plan(n, meta, torch.bfloat16, True) == shipped  # off: the shipped plan (widened bins)
        monkeypatch.setitem(configs.GLUON_ONEPASS_HALF, 4096, configs.GLUON_ONEPASS_HALF_CANDIDATES[4096][0])
        got = conv_plan.plan(4096, meta, torch.bfloat16, True)
        assert got.path == "gluon" and got.rfft == 3
        assert conv_plan.plan(4096, meta, torch.bfloat16).rfft == 2  # a complex64 spectrum keeps the shipped tuple
        monkeypatch.setitem(configs.GLUON_ORDER3_HALF, 8192, (2, 1, 3))
        got = conv_plan.plan(8192, meta, torch.bfloat16, True)
        assert got.path == "order3" and got.rfft == 3
        assert conv_plan.plan(8192, meta, torch.float32, True).path not in ("order3", "gluon")  # 16-bit u only
    for n, cands in configs.GLUON_ONEPASS_HALF_CANDIDATES.items():
        assert all(conv_plan.gluon_plan(*c).rfft == 3 for c in cands)
    # what ships reads float16 bins (rfft 3) and factors 2N
    assert all(conv_plan.order3_plan(n, *c).rfft == 3 for n, c in configs.GLUON_ORDER3_HALF.items())
    for n, c in configs.GLUON_ONEPASS_HALF.items():
        assert conv_plan.gluon_plan(*c).rfft == 3 and c[0] * c[1] == 2 * n
    with pytest.raises(ValueError, match="rfft"):
        conv_plan.order3_plan(8192, 2, 1, 1)
    with pytest.raises(ValueError, match="prefetch"):  # (the chunked kernel takes KPRE 0 or 1)
        conv_plan.gluon_plan(128, 64, 1, True, True, 32, 3, 2, 4, True, False, 2, True, 1)
    assert conv_plan.gluon_plan(32, 64, 3, False, True, 0, 3, 1, 4, True, True, 3, False, 3, 168).kpre == 3


@pytest.mark.parametrize("n, conj", [(1024, False), (2048, True)])
def test_whole_tile_float16_bins_arithmetic_matches_float64(n, conj):
    """The whole-tile kernel (1024, 2048) reading float16 bins (RFFT 3; with KPRE 2 or 3 they come by 32-bit cp.async,
    the same values): its arithmetic against float64 at the bf16 floor."""
    a, b = 2 * n // 64, 64
    g = torch.Generator().manual_seed(n + 38)
    u = torch.randn(3, 1, n, generator=g).to(torch.bfloat16)
    k = (torch.randn(1, n, generator=g) / math.sqrt(n)).to(torch.bfloat16)
    y = gluon_emulate.emulate(u, filter_spectrum(k, n, torch.float16), conj, a, b, 3, 0, True)
    ref = (_correlation if conj else fft_conv_reference)(u.double(), k.double())
    assert torch.isfinite(y).all() and accuracy.error_over_floor(y, ref) <= 1.2


@pytest.mark.parametrize("dtype, conj, bound", [(torch.bfloat16, False, 1.2), (torch.bfloat16, True, 1.2),
                                               (torch.float16, False, 3.5)])
def test_order3_float16_bins_arithmetic_matches_float64(dtype, conj, bound):
    """The order-3 kernel at 8192 with RFFT 3 (a float16 spectrum as it is): its arithmetic (emulate_order3) against
    float64; a float16 spectrum's bins are its complex64 one's rounded there."""
    n = 8192
    a, b, _ = gluon_order3.factors(n)
    g = torch.Generator().manual_seed(38 + conj)
    u = torch.randn(3, 1, n, generator=g).to(dtype)
    k = (torch.randn(1, n, generator=g) * torch.cos(torch.arange(n) * 2.9) / math.sqrt(n)).to(dtype)
    half = filter_spectrum(k, n, torch.float16)
    tile = gluon_emulate.kernel_spectrum(half, a, b, conj, 3)
    assert torch.equal(tile, gluon_emulate.kernel_spectrum(filter_spectrum(k, n), a, b, conj, 3))
    y = gluon_emulate.emulate_order3(u, half, conj, a, b)
    ref = (_correlation if conj else fft_conv_reference)(u.double(), k.double())
    assert torch.isfinite(y).all()
    assert accuracy.error_over_floor(y, ref) <= bound


KPRE_TILE = """
import json, re
from tilecore.ops.fft_conv import configs
from tilecore.ops.fft_conv.report import gluon_options, gluon_variant
from tilecore.tiles.compile import compile_kernel, resources
c = configs.GLUON_ONEPASS_HALF_CANDIDATES[1024][0]
name, kernel, args, warps, _ = gluon_variant(*c[:2], 0, *c[3:])
ptx = (compiled := compile_kernel(kernel, args, num_warps=warps, **gluon_options(c))).asm["ptx"]
sizes = re.findall(r"cp\\.async\\.ca\\.shared\\.global [^;]*, (0x[0-9a-f]+);", ptx)
print(json.dumps(dict(sizes=sorted(set(sizes)), **vars(resources(compiled)))))
"""


def test_kpre_tile_of_float16_bins_compiles_at_three_programs_a_multiprocessor():
    """1024's shipped tuple (KPRE 3: the channel's bins gathered once by cp.async into shared memory) at RFFT 3: the
    copies 4 bytes a bin (8 with complex64), no spill at maxnreg 168, three programs a multiprocessor still fit (the
    tile 8 KiB smaller)."""
    row = compiled_json(KPRE_TILE, timeout=600)
    assert row["sizes"] == ["0x4"] and row["spill_stores"] == 0 and row["registers"] <= 168, row
    assert 3 * row["shared"] <= 227 * 1024, row


def test_keyed_gluon_call_reads_a_float16_spectrum_as_the_general_path(monkeypatch):
    """A plain eager call's kept Gluon launch (op._GluonConv) with a float16 spectrum under an RFFT 3 plan (1024's
    HALF tuple standing in for the H100's plan; the Gluon launches recorded, not run): its calls hand the kernel the
    float16 rows themselves, as the key's first (general) call does, with the same row stride; a float16 spectrum
    under a complex64 plan keeps no such recipe (it is widened every call on the general path)."""
    from host_testing import cpu_signature
    from tilecore.ops.fft_conv import launch as conv_launch
    from tilecore.ops.fft_conv import op as fft_op
    from tilecore.tiles import launch

    calls = []

    class Recorder:  # CachedLaunch's run and keyed (nothing kept: every launch through run)
        keyed = launch.LRU(4)

        def run(self, key, grid, args, kwargs):
            calls.append((key, args, kwargs))

    def clear():
        for cache in (fft_op._CHECKED, fft_op._PLANS, fft_op._GLUON_CONVS, conv_launch._GLUON_LAUNCHES):
            cache.clear()

    half_plan = conv_plan.gluon_plan(*configs.GLUON_ONEPASS_HALF_CANDIDATES[1024][0])
    monkeypatch.setattr(conv_launch, "CONV_GLUON", Recorder())
    monkeypatch.setattr(dispatch, "num_sms", lambda device: 4)
    monkeypatch.setattr(fft_op, "signature", lambda *items: cpu_signature(*items, scalars=(bool, int, float, str)))
    monkeypatch.setattr(fft_op, "plan", lambda n, device, dtype, half_spectrum=False: half_plan)
    clear()
    g = torch.Generator().manual_seed(38)
    u = torch.randn(4, 2, 1024, generator=g).to(torch.bfloat16)
    half = filter_spectrum(torch.randn(2, 1024, generator=g), 1024, torch.float16)
    for _ in range(3):
        fft_op.fft_conv(u, half)
    assert len(fft_op._GLUON_CONVS) == 1 and next(iter(fft_op._GLUON_CONVS._data.values()))[0]
    assert len(calls) == 3
    for key, args, kwargs in calls:
        assert key is not None and args[0] is u and args[1] is half and args[-1] == half.stride(0) == 2 * 1025
        assert kwargs["RFFT"] == 3 and kwargs["KPRE"] == 3
    clear()
    calls.clear()
    monkeypatch.setattr(fft_op, "plan", lambda n, device, dtype, half_spectrum=False: conv_plan.gluon_plan(
        *configs.GLUON_ONEPASS[1024]))
    for _ in range(2):
        fft_op.fft_conv(u, half)
    assert not next(iter(fft_op._GLUON_CONVS._data.values()))[0]  # (False: the general path serves the key)
    assert all(args[1].dtype == torch.float32 and kwargs["RFFT"] == 2 for _, args, kwargs in calls)
    clear()


def test_float16_spectrum_under_torch_compile():
    """filter_spectrum(..., torch.float16) and fft_conv(u, it) in one fullgraph trace: forward and the gradients in u
    and k (through the float16 spectrum) as eager."""
    g = torch.Generator().manual_seed(5)
    u = torch.randn(2, 3, 256, generator=g).requires_grad_()
    k = (torch.randn(3, 100, generator=g) / 10).requires_grad_()

    def f(u, k):
        return fft_conv(u, filter_spectrum(k, u.shape[-1], torch.float16)) * 2

    got = torch.compile(f, fullgraph=True, backend="aot_eager")(u, k)
    want = f(u, k)
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got.sum(), (u, k)), torch.autograd.grad(want.sum(), (u, k))):
        torch.testing.assert_close(a, b)
