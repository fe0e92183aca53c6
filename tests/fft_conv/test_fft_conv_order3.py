"""The order-3 one-pass FFT convolution in Gluon at N = 8192 and 16384 (tilecore/ops/fft_conv/gluon_order3.py).
Gluon is not interpretable, so: its arithmetic step for step in torch (gluon_emulate.emulate_order3: the same tables,
float16 roundings, signs and scales) against float64 at the floor; the shipped builds compile for sm_90a (wgmma, the
programs a multiprocessor the plan asks for fit by shared memory and registers); the host launch binds every kernel
argument."""
import inspect
import math

import pytest
import torch

from tilecore import accuracy
from tilecore.ops.fft_conv import fft_conv_reference, filter_spectrum, gluon_emulate, gluon_order3
from tilecore.ops.fft_conv import launch as conv_launch
from tilecore.ops.fft_conv.reference import scaled_half_bins
from compiled_run import compiled_json


def _correlation(u64, k64):
    n = u64.shape[-1]
    spectrum = torch.fft.rfft(u64, n=2 * n) * torch.fft.rfft(k64, n=2 * n).conj()
    return torch.fft.irfft(spectrum, n=2 * n)[..., :n]


@pytest.mark.parametrize("n, dtype, conj, bound, scaled", [(8192, torch.bfloat16, False, 1.2, True),
                                                           (8192, torch.bfloat16, True, 1.2, True),
                                                           (8192, torch.float16, False, 3.5, True),
                                                           (8192, torch.bfloat16, False, 1.2, False),
                                                           (16384, torch.bfloat16, False, 1.2, True),
                                                           (16384, torch.bfloat16, True, 1.2, True),
                                                           (16384, torch.float16, False, 3.5, False)])
def test_order3_arithmetic_matches_float64(n, dtype, conj, bound, scaled):
    """The shipped kernel's arithmetic on the launch's bins: RFFT 4 (``scaled``: a complex64 spectrum cast to float16
    over each channel's largest part, the outputs times it) and RFFT 3 (a float16 spectrum as it is)."""
    a, b, _ = gluon_order3.factors(n)
    g = torch.Generator().manual_seed(34 + conj)
    u = torch.randn(3, 1, n, generator=g).to(dtype)  # an odd batch: the last pair's half absent
    # a filter whose spectrum peaks away from chunk 0's bins: the chunks' scales differ (1'a's ratios < 1)
    k = (torch.randn(1, n, generator=g) * torch.cos(torch.arange(n) * 2.9) / math.sqrt(n)).to(dtype)
    if scaled:
        bins, ks = scaled_half_bins(filter_spectrum(k, n))
    else:
        bins, ks = filter_spectrum(k, n, torch.float16), None
    y = gluon_emulate.emulate_order3(u, bins, conj, a, b, ks)
    ref = (_correlation if conj else fft_conv_reference)(u.double(), k.double())
    assert torch.isfinite(y).all()
    err = accuracy.error_over_floor(y, ref)
    # bf16 at ~1.07x (order 2's 1.04x: one float16 rounding more, T); fp16 at the float16 products' ~3x
    assert err <= bound, err


def test_order3_scaled_float16_bins_keep_the_floor_past_float16s_range():
    """RFFT 4 (reference.scaled_half_bins, launch's in torch): a complex64 spectrum cast to float16 bins over each channel's largest |re|,
    |im|, the outputs times that value: at the floor where the plain float16 bins (RFFT 3) overflow (a channel whose
    taps sum past 65504) and as RFFT 3 elsewhere; a NaN filter's channel NaN."""
    n = 8192
    a, b, _ = gluon_order3.factors(n)
    g = torch.Generator().manual_seed(40)
    u = torch.randn(2, 3, n, generator=g).to(torch.bfloat16)
    k = (torch.randn(3, n, generator=g) * torch.cos(torch.arange(n) * 2.9) / math.sqrt(n)).to(torch.bfloat16)
    k[1] = k[1] * 2.0 ** 17  # |bins| up to ~2e6: past float16's 65504 unscaled
    k[2, 7] = float("nan")
    spectrum = filter_spectrum(k, n)
    bins, scale = scaled_half_bins(spectrum)
    assert bins.dtype == torch.float16 and bins.shape == (3, n + 1, 2) and scale.shape == (3,)
    assert torch.isfinite(bins[:2]).all() and bins[:2].abs().max() <= 1 and torch.isnan(bins[2]).any()
    assert torch.isinf(torch.view_as_real(spectrum[1]).half()).any()  # (unscaled: overflows)
    # (u's bf16 values in float32: the emulation's output unrounded, times the scale, then rounded once as the kernel)
    y = gluon_emulate.emulate_order3(u, bins, False, a, b, scale)
    ref = fft_conv_reference(u[:, :2].double(), k[:2].double())
    assert accuracy.error_over_floor(y[:, :2], ref) <= 1.2
    assert torch.isnan(y[:, 2]).all()


def test_scaled_bins_kernel_gives_the_torch_casts_bits():
    """RFFT 4's cast (launch.scaled_half_bins, one kernel; here through the interpreter): the same bins and scales, bit
    for bit, as its torch statement (reference.scaled_half_bins: five passes) on channels past float16's range, all zero, with a NaN bin
    (scale 1, as torch's where(amax > 0) gives) and with an infinite one; a conjugate view and strided rows too."""
    n = 1000  # (N + 1 = 1001 bins: more than one block a row is not needed for the bits, the row's tail is)
    g = torch.Generator().manual_seed(43)
    k = torch.randn(5, n, generator=g)
    k[1] *= 2.0 ** 20
    k[2] = 0
    spectrum = filter_spectrum(k, n)
    spectrum[3, 7] = complex(float("nan"), 0.0)
    spectrum[4, 9] = complex(float("inf"), 1.0)
    wide = torch.zeros(5, n + 9, dtype=torch.complex64)
    wide[:, :n + 1] = spectrum
    for s in (spectrum, spectrum.conj(), wide[:, :n + 1]):
        bins, scale = scaled_half_bins(s)
        fused, fused_scale = conv_launch.scaled_half_bins(s)
        assert fused.shape == bins.shape and fused.dtype == torch.float16 and fused.is_contiguous()
        assert torch.equal(fused.view(torch.int16), bins.view(torch.int16))
        assert torch.equal(fused_scale.view(torch.int32), scale.view(torch.int32))
    assert scale.tolist()[2:4] == [1.0, 1.0] and scale[4] == float("inf") and scale[1] > 2.0 ** 20


def _laid_order(n):
    """KFULL's spec: the bin f (0 <= f < L = 2n) at each position of the laid-out spectrum: chunk j's [64, 64] tile (row
    r: k_a = 16 (r % A2) + r // A2 + KG j, column c: k_b, f = k_a + A k_b) at j 4096 + ((w 8 + cg) 32 + lane) 4 + q,
    as gluon_order3._laid_bins reads it (r = 16 w + 8 (q // 2) + t, c = 8 cg + 2 lc + q % 2, lane = 4 t + lc: a
    thread's four bins one 16-byte vector, a warp's 512 bytes contiguous)."""
    a, _, a2 = gluon_order3.factors(n)
    kg = 64 // a2
    j, w, cg, t, lc, q = torch.meshgrid(*(torch.arange(s) for s in (16 // kg, 4, 8, 8, 4, 4)), indexing="ij")
    r = 16 * w + 8 * (q // 2) + t
    c = 8 * cg + 2 * lc + q % 2
    return (16 * (r % a2) + r // a2 + kg * j + a * c).reshape(-1)


def test_laid_bins_are_each_chunks_bins_in_the_kernels_read_order():
    """KFULL (launch.laid_half_bins, one kernel a half row; here through the interpreter): position p of a channel's
    laid-out row holds bin f = _laid_order[p] (every f < L once): f <= N the bin, past N the conjugate of L - f (0 - im,
    the kernel's negation); the bins' bits RFFT 4's (a complex64 spectrum; a channel with a NaN bin, one whose largest
    part is bin N and one whose is bin 0: the halves' scale from all but one bin and the one it lacks) or the float16
    spectrum's as they are; and the order is the kernel's chunk tile: position ((j 4 + w) 8 + cg) 128 + 4 lane + q at
    row r = 16 w + 8 (q // 2) + t, column c = 8 cg + 2 lc + q % 2 of chunk j, its bin k_a + A k_b with k_a = 16 (r %
    A2) + r // A2 + KG j (as the walk's offsets f). Only N = 8192 is laid out."""
    n = 8192
    a, b, a2 = gluon_order3.factors(n)
    L = 2 * n
    order = _laid_order(n)
    assert torch.equal(torch.sort(order).values, torch.arange(L))
    p = torch.tensor([0, 1, 2, 3, 4, 5, 4096 + 130, L - 1])
    q, lane, cg, w, j = p % 4, p // 4 % 32, p // 128 % 8, p // 1024 % 4, p // 4096
    r, c = 16 * w + 8 * (q // 2) + lane // 4, 8 * cg + 2 * (lane % 4) + q % 2
    assert torch.equal(order[p], 16 * (r % a2) + r // a2 + (64 // a2) * j + a * c)
    g = torch.Generator().manual_seed(44)
    k = torch.randn(4, n, generator=g) / math.sqrt(n)
    spectrum = filter_spectrum(k, n)
    spectrum[1, 5] = complex(float("nan"), 0.0)
    spectrum[2, n] = complex(-9.0, 0.0)
    spectrum[3, 0] = complex(0.0, 9.0)
    for given, (bins, scale) in ((spectrum, scaled_half_bins(spectrum)),
                                 (filter_spectrum(k, n, torch.float16), (filter_spectrum(k, n, torch.float16), None))):
        laid, laid_scale = conv_launch.laid_half_bins(given, n)
        assert laid.shape == (4, L, 2) and laid.dtype == torch.float16
        assert (laid_scale is None) == (scale is None) and (scale is None or torch.equal(laid_scale, scale))
        mirrored = order > n
        at = bins[:, torch.where(mirrored, L - order, order)]
        im = torch.where(mirrored, torch.zeros_like(at[..., 1]) - at[..., 1], at[..., 1])
        want = torch.stack((at[..., 0], im), -1)
        assert torch.equal(laid.view(torch.int16), want.view(torch.int16))
    with pytest.raises(ValueError, match="8192"):
        conv_launch.laid_half_bins(filter_spectrum(k[:, :4096], 4096), 4096)


CODE_LAID = """
import json, re, sys, torch
from tilecore.ops.fft_conv import kernels_bins
from tilecore.tiles.compile import compile_kernel, resources
scale = sys.argv[1] == "1"
X = torch.empty(4, 8193, 2, dtype=torch.float32 if scale else torch.float16)
Y = torch.empty(4, 16384, 2, dtype=torch.float16)
compiled = compile_kernel(kernels_bins.laid_half_bins_kernel, dict(X=X, Y=Y, S=torch.empty(4), stride_h=8193,
                                                                          SCALE=scale), num_warps=8)
ptx = compiled.asm["ptx"]
print(json.dumps(dict(ldg=len(re.findall(r"ld\\.global", ptx)), stg=len(re.findall(r"st\\.global", ptx)),
                      stg16=len(re.findall(r"st\\.global\\.v4\\.b32", ptx)), **vars(resources(compiled)))))
"""


@pytest.mark.parametrize("scale", [1, 0])
def test_laid_bins_kernel_compiles_for_hopper(scale):
    """KFULL's layout kernel (kernels_bins.laid_half_bins_kernel) on sm_90a: no spill, two programs a multiprocessor
    by registers; a thread's half row by 32 loads (8-byte float pairs or 4-byte float16 pairs: in order, no index
    table), its 32 bins' words stored as eight 16-byte vectors (the permute a layout conversion in shared memory), and
    RFFT 4's scale and lacking bin (SCALE) one more load and one more store."""
    row = compiled_json(CODE_LAID, str(scale), timeout=600)
    assert row["spill_stores"] == 0 and row["threads"] == 256 and 2 * row["registers"] * 256 <= 65536, row
    assert row["ldg"] == 32 + scale and row["stg16"] == 8 and row["stg"] == 8 + scale, row


def test_order3_arithmetic_keeps_nonfinite_in_its_sequence():
    n = 8192
    a, b, _ = gluon_order3.factors(n)
    g = torch.Generator().manual_seed(7)
    u = torch.randn(2, 1, n, generator=g).to(torch.bfloat16)
    u[1, 0, 5000] = float("inf")
    k = (torch.randn(1, n, generator=g) / math.sqrt(n)).to(torch.bfloat16)
    y = gluon_emulate.emulate_order3(u, filter_spectrum(k, n, torch.float16), False, a, b)
    assert torch.isnan(y[1]).all() and torch.isfinite(y[0]).all()
    assert accuracy.error_over_floor(y[:1], fft_conv_reference(u[:1].double(), k.double())) <= 1.2


def test_order3_operands_are_the_dft_factors():
    """W_A^(a k_a) = W_16^(a1 k1) W_A^(a2 k1) W_A2^(a2 k2) for a = A2 a1 + a2, k_a = k1 + 16 k2: the tables' product
    rebuilds F_A (the factorization the kernel's stages 1a, 1b rest on)."""
    a, b, a2 = gluon_order3.factors(8192)
    ops = {k: v.double() for k, v in conv_launch.order3_operands(a, b, torch.device("cpu")).items()}
    f16 = torch.complex(ops["F16RE"], ops["F16IM"])
    f2 = torch.complex(ops["F2RE"], ops["F2IM"])
    t1 = torch.complex(ops["T1RE"], ops["T1IM"])
    idx = torch.arange(a)
    a1, a2i = idx // a2, idx % a2
    k1, k2 = idx % 16, idx // 16
    built = f16[a1[:, None], k1[None, :]] * t1[a2i[:, None], k1[None, :]] * f2[a2i[:, None], k2[None, :]]
    angle = -2 * math.pi * ((idx[:, None] * idx[None, :]) % a).double() / a
    assert torch.allclose(built, torch.polar(torch.ones_like(angle), angle), atol=3e-3)  # (float16 tables)


CODE_T = """
import json, re, sys
from tilecore.ops.fft_conv.report import order3_variant
from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources
n, per_sm, wg, rfft, stack, kfull = (int(a) for a in sys.argv[1:7])
name, kernel, args, warps, _ = order3_variant(n, per_sm, wg, rfft, bool(stack), bool(kfull))
compiled = compile_kernel(kernel, args, num_warps=warps)
ptx = compiled.asm["ptx"]
inside = inside16 = 0  # 32-bit (16-byte: KFULL) global loads (the float16 bins) between a wgmma issue and its wait
pending = False
for line in ptx.splitlines():
    if "wgmma.mma_async" in line:
        pending = True
    elif "wgmma.wait_group" in line:
        pending = False
    elif pending and "ld.global" in line and ".v4" in line:
        inside16 += 1
    elif pending and "ld.global" in line and ".b32" in line:
        inside += 1
ldg32 = len(re.findall(r"ld\\.global\\.b32", ptx))
stg32 = len(re.findall(r"st\\.global\\.b32", ptx))
print(json.dumps(dict(mmas=len(re.findall(r"wgmma\\.mma_async", ptx)), waits=len(re.findall(r"wgmma\\.wait_group", ptx)),
                      inside=inside, inside16=inside16, bars=len(re.findall(r"bar\\.sync|barrier\\.sync", ptx)), b16=len(re.findall(r"(?:ld|st)\\.global[.\\w]*\\.b16", ptx)),
                      sins=len(re.findall(r"sin\\.approx", ptx)), ldg32=ldg32, stg32=stg32,
                      arrives=len(re.findall(r"mbarrier\\.arrive", ptx)),
                      inits=re.findall(r"mbarrier\\.init\\.shared::cta\\.b64 \\[%r\\d+\\], (\\d+)", ptx),
                      regs=[int(r) for r in re.findall(r"setmaxnreg\\.\\w+\\.sync\\.aligned\\.u32\\s+(\\d+)", ptx)],
                      **vars(resources(compiled)), **has_hopper_instructions(ptx))))
"""


@pytest.mark.parametrize("n, per_sm, wg, rfft, stack, kfull", [(8192, 2, 1, 4, 1, 1), (8192, 2, 1, 3, 1, 1),
                                                               (16384, 1, 2, 4, 0, 0), (16384, 1, 2, 3, 0, 0)])
def test_order3_shipped_builds_compile_for_hopper(n, per_sm, wg, rfft, stack, kfull):
    """The shipped builds (configs.GLUON_ORDER3 and GLUON_ORDER3_HALF at 8192 and 16384): wgmma, the twiddles by the
    SFU, the programs a multiprocessor the plan asks for fit by shared memory (T as the wgmma's tiles, no staging tile,
    no -Im F_B) and registers (8192: two; 16384, two warpgroups on a T of 128 KiB: one); the chunk loop's four complex
    products (1b, 3, 3', 1'b: four m64n64k16 wgmmas each) once with a wait each, 1a's and 1'a's A2 columns a warpgroup
    two a wait; the chunk's float16 bins loaded under stage 3's wgmmas; u, T and y read and written in the wgmma layouts
    (4-byte accesses, no layout conversion, no 2-byte access); two warpgroups: two mbarriers of two arrivals, the worker under 256
    registers. Spill: scalars (8192 ~140 B, 16384 under 1 KB), as measured faster on the H100 all the same
    (notes/fft_conv). (RFFT 4: the channels' scales, KS.) STACK (8192): 1a and 1'a four columns a2 a product (four
    [64, 64] complex products each, one wait each), no layout conversion through shared memory (a handful of barriers a
    pair, not ~200), u and y accessed 4 bytes wide from / to the wgmmas' layouts, u read once a pair (its four groups'
    loads only: no second pass over u). KFULL (8192): a chunk's bins eight 16-byte loads (the launch's laid-out bins),
    under stage 3's wgmmas, no 4-byte gather."""
    from tilecore.ops.fft_conv import configs

    shipped = configs.GLUON_ORDER3_HALF if rfft == 3 else configs.GLUON_ORDER3
    assert tuple(shipped[n]) + (False,) * (5 - len(shipped[n])) == (per_sm, wg, rfft, bool(stack), bool(kfull))
    args = [str(a) for a in (n, per_sm, wg, rfft, stack, kfull)]
    row = compiled_json(CODE_T, *args, timeout=600)
    assert row["wgmma"] and not row["wgmma_serialized"] and row["sins"] > 0 and row["threads"] == 128 * wg, row
    assert per_sm * (row["shared"] + 1024) <= 228 * 1024 and per_sm * row["registers"] * 128 * wg <= 65536, row
    assert row["spill_stores"] <= (256 if n == 8192 else 1024), row
    a2 = gluon_order3.factors(n)[2]
    if stack:  # (1a, 1'a: a2 / 4 groups of four [64, 64] x K 64 wgmmas (4 instructions each), a wait each)
        assert row["mmas"] == 2 * (a2 // 4) * 4 * 4 + 4 * 4 * 4 and row["waits"] == 2 * (a2 // 4) + 4, row
        # u: a group's 2 x 8 4-byte loads, once (beside the chunk's 32 bins and RFFT 4's channel scale); y: a group's
        # 2 x 8 4-byte stores
        assert row["bars"] < 30 and row["stg32"] == (a2 // 4) * 16, row
        bins = 0 if kfull else 32
        assert (a2 // 4) * 16 + bins <= row["ldg32"] <= (a2 // 4) * 16 + bins + 1, row
    else:
        assert row["mmas"] == wg * (2 * (a2 // wg) * 4 + 4 * 4 * 4) and row["waits"] == wg * (2 * (a2 // wg) // 2 + 4), row
    if kfull:  # (the chunk's bins load while stage 3's wgmmas run)
        assert row["inside16"] >= 8 and row["inside"] == 0, row
    else:
        assert row["inside"] >= 32, row
    assert row["b16"] == 0, row  # (u's loads and y's stores 4 bytes wide, from / to the wgmma layouts)
    assert row["bars"] < 120, row  # (no layout conversion in 1a / 1'a: 571 bar.sync at 16384 with them)
    if wg == 2:
        assert row["mbarrier"] and row["arrives"] >= 2 and row["inits"] == ["2", "2"] and max(row["regs"]) <= 256, row


def test_order3_launch_binds_every_argument(monkeypatch):
    seen = {}

    def run(key, grid, args, options):
        seen.update(key=key, grid=grid, args=args, options=options)

    monkeypatch.setattr(conv_launch.CONV_GLUON_ORDER3, "run", run)
    monkeypatch.setattr(conv_launch.dispatch, "num_sms", lambda device: 132)
    n = 8192
    u = torch.randn(5, 3, n).to(torch.bfloat16)
    y = torch.empty_like(u)
    spectrum = filter_spectrum(torch.randn(3, n), n)
    conv_launch.launch_order3(u, spectrum, y, True, per_sm=2, rfft=4)
    kernel = gluon_order3.fft_conv_gluon_order3_kernel
    names = [p.name for p in kernel.params]
    bound = dict(zip(names, seen["args"])) | seen["options"]
    assert set(names) <= set(bound), set(names) - set(bound)
    assert bound["U"] is u and bound["Y"] is y and bound["A"] == 256 and bound["B"] == 64 and bound["CONJ"] is True
    assert bound["batch"] == 5 and bound["heads"] == 3 and bound["KSCALE"] is True
    assert bound["WARPGROUPS"] == 1 and bound["WORKER_REGS"] == gluon_order3.WORKER_REGS
    assert bound["K"].dtype == torch.float16 and bound["K"].shape == (3, n + 1, 2) and bound["KS"].shape == (3,)
    assert bound["stride_kh"] == 2 * (n + 1) and bound["stride_ub"] == 3 * n and bound["stride_uh"] == n
    bins = torch.view_as_complex(bound["K"].float()) * bound["KS"][:, None]
    assert torch.allclose(bins, spectrum, rtol=2e-3, atol=2e-3 * float(bound["KS"].max()))
    assert seen["grid"] == (min(3 * 3, 2 * 132),)  # never more programs than pairs (3 channels x 3 pairs)
    # F2: four copies of F_16 on the diagonal of a 64 x 64 (a chunk's stage 1b on its 64 rows k_a)
    assert bound["T1RE"].shape == (16, 16) and bound["F2RE"].dtype == torch.float16 and bound["F2RE"].shape == (64, 64)
    assert torch.equal(bound["F2RE"][48:, 48:], bound["F16RE"]) and not bound["F2IM"][:16, 16:].any()
    assert inspect.signature(conv_launch.launch_order3).parameters["per_sm"].default == 2
    # a float16 spectrum's bins as they are (RFFT 3: no scale); complex64 bins under rfft 3: an error naming both
    half = filter_spectrum(torch.randn(3, n), n, torch.float16)
    conv_launch.launch_order3(u, half, y, False, rfft=3)
    assert seen["args"][1] is half and seen["args"][-1] is None and seen["options"]["KSCALE"] is False
    with pytest.raises(ValueError, match="float16 spectrum"):
        conv_launch.launch_order3(u, spectrum, y, False, rfft=3)
    # RFFT 4's bins the torch statement's bits; KFULL: the bins laid out (H, L, 2), a row 4 n halves apart, the scales
    # as RFFT 4's (complex64) or none (a float16 spectrum)
    ref_bins, ref_scale = scaled_half_bins(spectrum)
    assert torch.equal(bound["K"], ref_bins) and torch.equal(bound["KS"], ref_scale) and bound["KFULL"] is False
    for given, scaled in ((spectrum, True), (half, False)):
        conv_launch.launch_order3(u, given, y, False, rfft=4 if scaled else 3, kfull=True)
        laid = dict(zip(names, seen["args"])) | seen["options"]
        assert laid["KFULL"] is True and laid["KSCALE"] is scaled and laid["K"].shape == (3, 2 * n, 2)
        assert laid["stride_kh"] == 4 * n and (laid["KS"] is None) != scaled


def test_plan_takes_the_order3_kernel_only_behind_its_switch_on_hopper(monkeypatch):
    from tilecore import dispatch
    from tilecore.ops.fft_conv import configs
    from tilecore.ops.fft_conv import plan as conv_plan

    meta = torch.device("meta")
    monkeypatch.setattr(dispatch, "interpreter_enabled", lambda: False)  # (as on the GPU)
    with dispatch.pretend(dispatch.TARGETS["sm_90a"]):
        monkeypatch.delitem(configs.GLUON_ORDER3, 8192, raising=False)
        assert conv_plan.plan(8192, meta, torch.bfloat16).path == "long"  # off: no entry
        monkeypatch.setitem(configs.GLUON_ORDER3, 8192, (1, 1, 4))
        assert conv_plan.plan(8192, meta, torch.bfloat16) == conv_plan.order3_plan(8192, 1, 1, 4)
        assert conv_plan.plan(8192, meta, torch.float32).path != "order3"  # 16-bit u only
        assert conv_plan.plan(16384, meta, torch.bfloat16) == conv_plan.order3_plan(16384, *configs.GLUON_ORDER3[16384])
    assert conv_plan.plan(8192, torch.device("cpu"), torch.bfloat16).path != "order3"  # never interpreted
    with pytest.raises(ValueError, match="N = 4096"):
        conv_plan.order3_plan(4096)  # (A2 = 8: a chunk's 64 rows k_a would take 8 values of k1)
    with pytest.raises(ValueError, match="programs a multiprocessor"):
        conv_plan.order3_plan(8192, 3)
    with pytest.raises(ValueError, match="programs a multiprocessor"):
        conv_plan.order3_plan(16384, 2)  # (219 KiB of shared memory a program)
    with pytest.raises(ValueError, match="warpgroups"):
        conv_plan.order3_plan(8192, 2, 2)  # (two warpgroups a pair: one program a multiprocessor)
    with pytest.raises(ValueError, match="rfft 3"):
        conv_plan.order3_plan(8192, 2, 1, 2)  # (complex64 bins in the kernel: removed)
    with pytest.raises(ValueError, match="only at N = 8192"):
        conv_plan.order3_plan(16384, 1, 2, 4, True)  # (F2 is F_32 twice there, not F_16 four times)
    with pytest.raises(ValueError, match="kfull only at N = 8192"):
        conv_plan.order3_plan(16384, 1, 2, 4, False, True)  # (the layout kernel's index fields are L = 16384's)
    for table in (configs.GLUON_ORDER3, configs.GLUON_ORDER3_HALF):
        for n, c in table.items():
            p = conv_plan.order3_plan(n, *c)
            assert p.path == "order3" and p.rfft == (3 if table is configs.GLUON_ORDER3_HALF else 4)


def test_launch_routes_the_order3_plan(monkeypatch):
    from tilecore.ops.fft_conv import plan as conv_plan

    seen = []
    monkeypatch.setattr(conv_launch, "launch_order3", lambda *args: seen.append(args))
    u = torch.randn(2, 1, 8192).to(torch.bfloat16)
    y = torch.empty_like(u)
    spectrum = filter_spectrum(torch.randn(1, 8192), 8192)
    conv_launch.launch(conv_plan.order3_plan(8192, 1, 1, 4), u, spectrum, y, True, key="k")
    assert len(seen) == 1 and seen[0][0] is u and seen[0][2] is y
    assert seen[0][3:] == (True, 1, "k", 1, 4, False, False)  # (conj, per_sm, key, warpgroups, RFFT, STACK, KFULL)
    seen.clear()
    conv_launch.launch(conv_plan.order3_plan(16384, 1, 2, 3), u, spectrum, y, False, key=None)
    assert seen[0][3:] == (False, 1, None, 2, 3, False, False)  # (two warpgroups a pair, float16 bins)
    seen.clear()
    conv_launch.launch(conv_plan.order3_plan(8192, 2, 1, 4, True), u, spectrum, y, False, key=None)
    assert seen[0][3:] == (False, 2, None, 1, 4, True, False)  # (STACK)
    seen.clear()
    conv_launch.launch(conv_plan.order3_plan(8192, 2, 1, 4, True, True), u, spectrum, y, False, key=None)
    assert seen[0][3:] == (False, 2, None, 1, 4, True, True)  # (KFULL)


def test_model_counts_order3_below_order2():
    from tilecore.ops.fft_conv import model

    assert model.order3_flops(256, 64) * 2 < model.mono_flops(256, 64, 1)
    # STACK's 1a / 1'a (K, N 64 against F_16 four times on F2's diagonal): 6.3 M complex multiply-adds a pair at 8192
    assert model.order3_wgmma_flops(256, 64, stack=True) == 8 * 6291456 > model.order3_wgmma_flops(256, 64) * 1.3
    assert model.bound_ms("order3", 16, 768, 8192, 256, 64) < model.bound_ms("long", 16, 768, 8192, 128, 128) / 3
