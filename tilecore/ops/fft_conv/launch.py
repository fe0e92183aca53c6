"""One convolution of a plan (plan.py): y = causal conv of u with the filter whose spectrum is K
(rfft of length 2N, (H, N + 1) complex64), or with its conjugate (the backward's correlation)."""
from __future__ import annotations

import functools
import importlib
import math

import torch

from tilecore import dispatch
from tilecore.ops.fft_conv import kernels, kernels_bins, kernels_long, kernels_mono, kernels_pair
from tilecore.ops.fft_conv.plan import Plan
from tilecore.tiles.launch import LRU, CachedLaunch, TmaOperand, tma_describable

_conv = CachedLaunch(kernels.fft_conv_kernel)
_conv_pair = CachedLaunch(kernels_pair.fft_conv_pair_kernel)
_conv_pair1 = CachedLaunch(kernels_pair.fft_conv_pair1_kernel)
_dk_pair = CachedLaunch(kernels_pair.fft_conv_dk_pair_kernel)
_conv_mono = CachedLaunch(kernels_mono.fft_conv_mono_kernel)
CONV_GLUON = CachedLaunch(lambda: importlib.import_module(
    "tilecore.ops.fft_conv.gluon_onepass").fft_conv_gluon_onepass_kernel)
CONV_GLUON_CHUNKED = CachedLaunch(lambda: importlib.import_module(
    "tilecore.ops.fft_conv.gluon_onepass").fft_conv_gluon_chunked_kernel)
DK_GLUON = CachedLaunch(lambda: importlib.import_module("tilecore.ops.fft_conv.gluon_onepass").fft_conv_gluon_dk_kernel)
_long_columns = CachedLaunch(kernels_long.long_columns_kernel)
_long_rows = CachedLaunch(kernels_long.long_rows_kernel)
_long_inverse = CachedLaunch(kernels_long.long_inverse_columns_kernel)


def output(shape, dtype, device) -> torch.Tensor:
    """A tensor that the kernel writes whole (tests fill it with NaN first, to see that it does)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _dft(size: int, rows: int, cols: int, denominator: int) -> tuple[torch.Tensor, torch.Tensor]:
    """exp(-2 pi i r c / denominator) for r < rows, c < cols, as float32 (re, im), from float64."""
    r = torch.arange(rows, dtype=torch.float64)[:, None]
    c = torch.arange(cols, dtype=torch.float64)[None, :]
    angle = -2 * math.pi * ((r * c) % denominator) / denominator  # reduced first: exact angles
    return angle.cos().float(), angle.sin().float()


@functools.lru_cache(maxsize=32)
def dft_operands(n1: int, n2: int, device: torch.device) -> dict:
    """The kernel's constant operands for L = n1 n2: F_N1, F_N2 and the twiddles W_L^(k1 n2)."""
    f1re, f1im = _dft(n1, n1, n1, n1)
    f2re, f2im = _dft(n2, n2, n2, n2)
    twre, twim = _dft(n1 * n2, n1, n2, n1 * n2)
    tensors = dict(F1RE=f1re, F1IM=f1im, F2RE=f2re, F2IM=f2im, TWRE=twre, TWIM=twim)
    return {name: t.to(device) for name, t in tensors.items()}


@functools.lru_cache(maxsize=32)
def dft_operands16(n1: int, n2: int, device: torch.device) -> dict:
    """The pair kernel's operands: F_N1, F_N2 in float16 (2^-12 relative), the twiddles in float32."""
    ops = dft_operands(n1, n2, device)
    half = {name: ops[name].half() for name in ("F1RE", "F1IM", "F2RE", "F2IM")}
    return ops | half


@functools.lru_cache(maxsize=32)
def mono_operands(a: int, b: int, c: int, device: torch.device) -> dict:
    """The one-pass kernel's constants for L = a b c: F_A, F_B, F_C in float16 and the twiddle tables
    T1 (b, a) = W_AB^(b k_a), T2 (c, a) = W_L^(c k_a), T3 (b, c) = W_BC^(c k_b) in float32; TF (b c, a) =
    W_L^(m k_a), the whole stage-2 table (KFULL)."""
    tables = {}
    for name, (rows, cols, size) in dict(FA=(a, a, a), FB=(b, b, b), FC=(c, c, c)).items():
        re, im = _dft(size, rows, cols, size)
        tables[name + "RE"], tables[name + "IM"] = re.half(), im.half()
    for name, (rows, cols, size) in dict(T1=(b, a, a * b), T2=(c, a, a * b * c), T3=(b, c, b * c),
                                         TF=(b * c, a, a * b * c)).items():
        tables[name + "RE"], tables[name + "IM"] = _dft(size, rows, cols, size)
    return {name: t.to(device) for name, t in tables.items()}


def mono_spectrum(spectrum: torch.Tensor, a: int, b: int, c: int, permute: bool, conj: bool) -> torch.Tensor:
    """The rfft ``spectrum`` (H, N + 1), 2N = a b c, laid out as the mono kernel's tile ([b, c, a] flat; [c,
    b, a] with ``permute``: the natural order f = 0..2N-1), bins past N the conjugates of 2N - f,
    conjugated with ``conj``: float32 (H, 2, 2N) planes (re, im) for KFULL."""
    size = a * b * c
    if permute and c > 1:
        f = torch.arange(size, device=spectrum.device)
    else:
        kb, kc, ka = torch.meshgrid(*(torch.arange(s, device=spectrum.device) for s in (b, c, a)), indexing="ij")
        f = (ka + a * kb + a * b * kc).reshape(-1)
    mirrored = f > size // 2
    full = spectrum[:, torch.where(mirrored, size - f, f)]
    im = torch.where(mirrored, -full.imag, full.imag)
    return torch.stack((full.real, -im if conj else im), dim=1).contiguous()


@functools.lru_cache(maxsize=32)
def _permutation(n1: int, n2: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(index into the rfft's N + 1 bins, whether to conjugate) for each f = k1 + n1 k2 of the kernel's
    N1 x N2 spectrum tile (bins past N are the conjugates of L - f: the filter is real)."""
    size, n = n1 * n2, n1 * n2 // 2
    f = torch.arange(n1)[:, None] + n1 * torch.arange(n2)[None, :]
    mirrored = f > n
    return torch.where(mirrored, size - f, f).to(device), mirrored.to(device)


def permuted_spectrum(spectrum: torch.Tensor, n1: int, n2: int, conj: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(re, im) float32 (H, n1, n2): the kernel's layout of the rfft ``spectrum`` (H, N + 1), conjugated
    with ``conj``."""
    index, mirrored = _permutation(n1, n2, spectrum.device)
    full = spectrum[:, index]  # (H, n1, n2)
    # the conjugates as negated imaginary parts: a lazy .conj() view read through .imag came out
    # unconjugated inside torch.compile's graphs (aot_eager, torch 2.13)
    im = torch.where(mirrored, -full.imag, full.imag)
    return full.real.contiguous(), (-im if conj else im).contiguous()


def launch(plan: Plan, u: torch.Tensor, spectrum: torch.Tensor, y: torch.Tensor, conj: bool, key=None) -> None:
    """y (B, H, N) = the causal convolution of u (B, H, N; unit stride along N) with the filter of
    ``spectrum`` (or the correlation, with ``conj``). ``key``: the call's launch key (op.py: the
    signature of u and of the filter or spectrum with conj and the spectrum's conj bit, which fix every
    argument's specialization: the ints are u's sizes and strides, the other tensors fresh ones, the
    DFT tables or the keyed spectrum), or None (the plain launches)."""
    B, H, N = u.shape
    if u.numel() == 0:
        return
    if plan.path == "torch":
        k = torch.conj_physical(spectrum) if conj else spectrum
        y.copy_(torch.fft.irfft(torch.fft.rfft(u.float(), n=2 * N) * k, n=2 * N)[..., :N])
        return
    if plan.path == "gluon":
        _launch_gluon(plan, u, spectrum, y, conj, key)
        return
    if plan.path == "order3":
        launch_order3(u, spectrum, y, conj, plan.per_sm, key, plan.warpgroups, plan.rfft, plan.stack, plan.kfull)
        return
    if plan.path in ("pair", "long", "mono"):  # the kernels read the rfft's bins themselves
        spectrum = spectrum.resolve_conj()
        spectrum_f32 = torch.view_as_real(spectrum if spectrum.stride(-1) == 1 else spectrum.contiguous())
    if plan.path == "long":
        _launch_long(plan, u, spectrum_f32, y, conj, key)
        return
    if plan.path == "mono":
        ops = mono_operands(plan.n1, plan.n2, plan.n3, u.device)
        if plan.kfull:  # the spectrum in the tile's order (conjugated here, not in the kernel)
            spectrum_f32 = mono_spectrum(spectrum, plan.n1, plan.n2, plan.n3, plan.permute, conj)
            conj = False
        chunks = -(-(-(-B // 2)) // plan.loop)
        tables = ("FA", "FB", "FC", "TF" if plan.kfull else "T1", "T2", "T3")
        _conv_mono.run(key, (H * chunks,),
                       (u, spectrum_f32, y, *(ops[name + part] for name in tables for part in ("RE", "IM")),
                        B, H, u.stride(0), u.stride(1), y.stride(0), y.stride(1), spectrum_f32.stride(0)),
                       dict(A=plan.n1, B=plan.n2, C=plan.n3, CONJ=conj, LOOP=plan.loop, PERMUTE=plan.permute,
                            PROBE=plan.probe, KFULL=plan.kfull, num_warps=plan.num_warps))
        return
    if plan.path == "pair":
        ops = dft_operands16(plan.n1, plan.n2, u.device)
        if plan.pairs == 0:  # one pair a program, no transposes
            _conv_pair1.run(key, (H * -(-B // 2),),
                            (u, spectrum_f32, y, ops["F1RE"], ops["F1IM"], ops["F2RE"], ops["F2IM"], ops["TWRE"],
                             ops["TWIM"], B, H, u.stride(0), u.stride(1), y.stride(0), y.stride(1),
                             spectrum_f32.stride(0)),
                            dict(N1=plan.n1, N2=plan.n2, CONJ=conj, num_warps=plan.num_warps))
            return
        chunks = -(-(-(-B // (2 * plan.pairs))) // plan.loop)
        _conv_pair.run(key, (H * chunks,),
                       (u, spectrum_f32, y, ops["F1RE"], ops["F1IM"], ops["F2RE"], ops["F2IM"], ops["TWRE"],
                        ops["TWIM"], B, H, u.stride(0), u.stride(1), y.stride(0), y.stride(1),
                        spectrum_f32.stride(0)),
                       dict(N1=plan.n1, N2=plan.n2, PAIRS=plan.pairs, CONJ=conj, LOOP=plan.loop, STAGES=plan.stages,
                            HOIST=plan.hoist, num_warps=plan.num_warps))
        return
    kre, kim = permuted_spectrum(spectrum, plan.n1, plan.n2, conj)
    ops = dft_operands(plan.n1, plan.n2, u.device)
    _conv.run(key, (B * H,),
              (u, kre, kim, y, ops["F1RE"], ops["F1IM"], ops["F2RE"], ops["F2IM"], ops["TWRE"], ops["TWIM"],
               H, u.stride(0), u.stride(1), y.stride(0), y.stride(1), kre.stride(0)),
              dict(N1=plan.n1, N2=plan.n2, PRECISION=plan.precision, num_warps=plan.num_warps))


def gluon_grid(plan: Plan, B: int, H: int, device: torch.device) -> int:
    """Programs of the Gluon one-pass kernel: one a pair of sequences, or (plan.per_sm) that many a
    multiprocessor, each walking pairs p, p + programs, ... (never more programs than pairs)."""
    pairs = H * -(-B // 2)
    if plan.per_sm == 0:
        return pairs
    return max(1, min(pairs, plan.per_sm * dispatch.num_sms(device)))


def _launch_gluon(plan: Plan, u: torch.Tensor, spectrum: torch.Tensor, y: torch.Tensor, conj: bool, key=None) -> None:
    """gluon_onepass.py's kernels: the spectrum as the kernel reads it (gluon_spectrum)."""
    launch_gluon_kernel(plan, u, gluon_spectrum(plan, spectrum, conj), y, conj, key=key)


def gluon_spectrum(plan: Plan, spectrum: torch.Tensor, conj: bool) -> torch.Tensor:
    """The spectrum (H, N + 1) as the Gluon kernel of ``plan`` reads it: with plan.rfft its bins as float32
    (re, im) pairs (the kernel conjugates; rfft 3: float16 pairs, a conversion a call), else laid out as the tile
    (mono_spectrum, conjugated here); a float16 spectrum ((H, N + 1, 2): filter_spectrum(..., torch.float16)) with
    rfft 3 as it is (its rows contiguous)."""
    if plan.rfft == 3:
        return half_bins(spectrum)
    spectrum = spectrum.resolve_conj()
    if plan.rfft:
        return torch.view_as_real(spectrum if spectrum.stride(-1) == 1 else spectrum.contiguous())
    return mono_spectrum(spectrum, plan.n1, plan.n2, 1, False, conj)


def half_bins(spectrum: torch.Tensor) -> torch.Tensor:
    """The spectrum's bins as float16 (re, im) pairs, (H, N + 1, 2) with contiguous rows (what RFFT 3 reads, a bin one
    32-bit load): a float16 spectrum as it is (made contiguous where it is not), a complex64 one converted."""
    if spectrum.dtype == torch.float16:
        return spectrum if spectrum.stride(-1) == 1 and spectrum.stride(-2) == 2 else spectrum.contiguous()
    return torch.view_as_real(spectrum.resolve_conj()).to(torch.float16)


def scaled_half_bins(spectrum: torch.Tensor, key=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A complex64 spectrum (H, N + 1) as float16 (re, im) pairs over each channel's largest |re|, |im| and those
    largest values (H,) float32: what the order-3 kernel's RFFT 4 reads (reference.scaled_half_bins: the same bits in
    torch), by one kernel (kernels_bins: a program a channel, the spectrum's bytes read twice, the bins written once;
    torch's five passes cost 3x its time). ``key``: the op's launch key (it names the spectrum's signature)."""
    spectrum = spectrum.resolve_conj()
    pairs = torch.view_as_real(spectrum if spectrum.stride(-1) == 1 else spectrum.contiguous())
    H, count = pairs.shape[0], pairs.shape[1]
    bins = torch.empty(H, count, 2, dtype=torch.float16, device=pairs.device)
    scale = torch.empty(H, dtype=torch.float32, device=pairs.device)
    if H:
        SCALED_HALF_BINS.run(key, (H,), (pairs, bins, scale, count, pairs.stride(0) // 2),
                             dict(BLOCK=2048, num_warps=8))
    return bins, scale


def laid_half_bins(spectrum: torch.Tensor, n: int, key=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """KFULL (N = 8192): the spectrum's float16 bins laid out as the order-3 kernel's chunks read them ((H, L, 2): chunk
    j's [64, 64] tile in the wgmma accumulator's register order, bins past N conjugated here) by one kernel, a
    program a half row (kernels_bins.laid_half_bins_kernel): a complex64 spectrum (H, N + 1) scaled as
    scaled_half_bins (the same bins' bits; the scales returned), float16 pairs (H, N + 1, 2) as they are (None).
    ``key``: a keyed launch."""
    if n != 8192:
        raise ValueError(f"the laid-out bins (KFULL) are N = 8192's (the layout kernel's index fields are L = "
                         f"16384's); got N = {n}")
    if spectrum.dtype == torch.float16:
        pairs, scale = half_bins(spectrum), None
    else:
        spectrum = spectrum.resolve_conj()
        pairs = torch.view_as_real(spectrum if spectrum.stride(-1) == 1 else spectrum.contiguous())
        scale = torch.empty(pairs.shape[0], dtype=torch.float32, device=pairs.device)
    H = pairs.shape[0]
    laid = torch.empty(H, 2 * n, 2, dtype=torch.float16, device=pairs.device)
    if H:
        LAID_HALF_BINS.run(key, (H, 2), (pairs, laid, laid if scale is None else scale, pairs.stride(0) // 2),
                           dict(SCALE=scale is not None, num_warps=8))
    return laid, scale


# A keyed call's launch, all but its tensors (the grid, the DFT tables, the constexprs): a function of the
# launch key (op.py: u's and the filter's signatures, conj), made at the key's first call
_GLUON_LAUNCHES = LRU(256)


def _gluon_launch_parts(plan: Plan, u: torch.Tensor, y: torch.Tensor, conj: bool) -> tuple:
    """(kernel, grid, the DFT tables, the constexprs and options, whether u and y go by TMA) of ``plan``'s
    Gluon kernel for this u and y."""
    B, H, N = u.shape
    a, b = plan.n1, plan.n2
    ops = mono_operands(a, b, 1, u.device)
    tables = tuple(ops[name] for name in ("FARE", "FAIM", "FBRE", "FBIM", "TFRE", "TFIM"))
    tma = plan.tma and tma_describable(u) and tma_describable(y)
    options = dict(A=a, B=b, TMA=tma, RFFT=plan.rfft, CONJ=bool(conj and plan.rfft), PROBE=plan.probe, TW_SFU=plan.tw_sfu,
                   CONTIG=plan.contig, KPRE=plan.kpre, LEAN=plan.lean)
    if plan.maxnreg:  # (a launch option: only where set, so the other plans' launches are as before)
        options["maxnreg"] = plan.maxnreg
    if plan.chunk:  # (WORKER_REGS 248: 4096's two warpgroups without spill)
        kernel = CONV_GLUON_CHUNKED
        options.update(CHUNK=plan.chunk, WARPGROUPS=plan.warpgroups, WORKER_REGS=248, num_warps=4,
                       YALIAS=plan.yalias and tma)
    else:
        kernel = CONV_GLUON
        options.update(ASYNC=plan.async_mma, num_warps=plan.num_warps)
    return kernel, (gluon_grid(plan, B, H, u.device),), tables, options, tma


def launch_gluon_kernel(plan: Plan, u: torch.Tensor, kernel_spectrum: torch.Tensor, y: torch.Tensor,
                        conj: bool = False, key=None) -> None:
    """The Gluon one-pass kernel of ``plan`` alone (the GPU check times it so): ``kernel_spectrum`` as
    gluon_spectrum gives it (conj: the correlation, where the kernel conjugates: plan.rfft); u and y by
    TMA (gluon_operands) where plan.tma and both are describable, else pointer loads and stores; the DFT
    matrices and the (B, A) twiddle table of mono_operands. ``key``: the call's launch key (op.py's: it
    fixes u's sizes, strides and alignment, and y is a fresh contiguous tensor), or None: the launch
    parts are then made again and the launch specialized the checked way (CachedLaunch.run)."""
    B, H, N = u.shape
    kernel, grid, tables, options, tma = _GLUON_LAUNCHES.memo(key, lambda: _gluon_launch_parts(plan, u, y, conj))
    u_op, y_op = gluon_operands(u, y, plan.n1, plan.n2) if tma else (None, None)
    kernel.run(key, grid, (u, kernel_spectrum, y, *tables, B, H, u.stride(0), u.stride(1), y.stride(0), y.stride(1),
                           kernel_spectrum.stride(0)),
               dict(options, u_desc=u_op, y_desc=y_op))


def gluon_operands(u: torch.Tensor, y: torch.Tensor, a: int, b: int) -> tuple[TmaOperand, TmaOperand]:
    """u and y (B, H, N = a b / 2) as TMA operands of their (B, H, a/2, b) views, boxes [2, 1, a/2, b]: one
    pair of sequences of a channel (gluon_onepass.py's TMA). The launch that compiles gets the checked
    descriptors; later keyed launches hand Triton's launcher only base, shape and strides."""
    half = a // 2
    return (TmaOperand(u, [2, 1, half, b], [u.shape[0], u.shape[1], half, b], [u.stride(0), u.stride(1), b, 1]),
            TmaOperand(y, [2, 1, half, b], [y.shape[0], y.shape[1], half, b], [y.stride(0), y.stride(1), b, 1]))


def gluon_descriptors(u: torch.Tensor, y: torch.Tensor, a: int, b: int) -> tuple:
    """gluon_operands' checked TMA descriptors (compile-only callers: report.py)."""
    return tuple(op.descriptor() for op in gluon_operands(u, y, a, b))


def _launch_long(plan: Plan, u: torch.Tensor, spectrum_f32: torch.Tensor, y: torch.Tensor, conj: bool,
                 key=None) -> None:
    """The three passes of kernels_long.py, through a float16 scratch of 2 L elements a pair."""
    B, H, N = u.shape
    n1, n2 = plan.n1, plan.n2
    pairs = H * -(-B // 2)
    ops = dft_operands16(n1, n2, u.device)
    scratch = torch.empty((pairs, 2, n1, n2), dtype=torch.float16, device=u.device)
    row_scale = torch.empty((pairs, n1), dtype=torch.float32, device=u.device)
    seq_scale = torch.empty((pairs, 2), dtype=torch.float32, device=u.device)
    warps = plan.num_warps
    _long_columns.run(key, (pairs,),
                      (u, scratch, seq_scale, ops["F1RE"], ops["F1IM"], ops["TWRE"], ops["TWIM"], B, u.stride(0),
                       u.stride(1)),
                      dict(N1=n1, N2=n2, BN=plan.bn, KC=plan.kc, CH=min(N, 1024), GAUSS=plan.gauss, num_warps=warps))
    _long_rows.run(key, (pairs, n1 // plan.bk1),
                   (scratch, row_scale, spectrum_f32, ops["F2RE"], ops["F2IM"], ops["TWRE"], ops["TWIM"], B,
                    spectrum_f32.stride(0)),
                   dict(N1=n1, N2=n2, BK1=plan.bk1, CONJ=conj, GAUSS=plan.gauss, num_warps=plan.rows_warps))
    _long_inverse.run(key, (pairs, n2 // plan.bn),
                      (scratch, row_scale, seq_scale, y, ops["F1RE"], ops["F1IM"], B, y.stride(0), y.stride(1)),
                      dict(N1=n1, N2=n2, BN=plan.bn, KC=plan.kc, GAUSS=plan.gauss, num_warps=warps))


def _dk_spectrum_sum(u: torch.Tensor, loop: int, tile: tuple[int, int], transposed: bool, filter_len: int,
                     run_partials) -> torch.Tensor:
    """The host tail both filter-gradient launches share: ``chunks`` = cdiv(cdiv(batch, 2), loop) programs a channel,
    each writing its partial spectrum (float32 (re, im) planes of ``tile``) into one (H chunks, 2, *tile) buffer that
    ``run_partials(partial, chunks)`` launches the kernel on (nothing runs where the batch is empty: the buffer is
    zeroed); the partials summed over a channel's programs, as complex, its rows in the DFT's natural order
    (``transposed``: the tile holds f = k1 + N1 k2 at [k1, k2], so its transpose is; else at [k_b, k_a], f = k_a + A
    k_b, already), one inverse DFT a channel, the real part's first ``filter_len`` lags (float32 (H, filter_len))."""
    B, H, _ = u.shape
    chunks = -(-(-(-B // 2)) // loop)
    partial = torch.empty((H * chunks, 2, *tile), dtype=torch.float32, device=u.device)
    if B == 0:
        partial.zero_()
    else:
        run_partials(partial, chunks)
    total = partial.view(H, chunks, 2, *tile).sum(1)
    spectrum = torch.complex(total[:, 0], total[:, 1])
    if transposed:
        spectrum = spectrum.transpose(1, 2)
    return torch.fft.ifft(spectrum.reshape(H, tile[0] * tile[1]), dim=-1).real[:, :filter_len]


def dk_pair(config: tuple, u: torch.Tensor, dy: torch.Tensor, filter_len: int, key=None) -> torch.Tensor:
    """The filter's gradient dk[h, j] = sum_b sum_n dy[b, h, n] u[b, h, n - j], j < filter_len, float32
    (H, filter_len), through kernels_pair.fft_conv_dk_pair_kernel (u, dy: (B, H, N) 16-bit rows, unit
    stride); config = (N1, N2, pair groups a program, warps), N1 N2 = 2N; the host tail _dk_spectrum_sum's (the
    partials at f = k1 + N1 k2). ``key``: a launch key fixing u's and dy's layouts (op.py's keyed backward), or None."""
    n1, n2, loop, warps = config
    B, H, N = u.shape

    def run(partial, chunks):
        ops = dft_operands16(n1, n2, u.device)
        _dk_pair.run(key, (H * chunks,), (u, dy, partial, ops["F1RE"], ops["F1IM"], ops["F2RE"], ops["F2IM"],
                                          ops["TWRE"], ops["TWIM"], B, H, u.stride(0), u.stride(1), dy.stride(0),
                                          dy.stride(1)), dict(N1=n1, N2=n2, LOOP=loop, num_warps=warps))

    return _dk_spectrum_sum(u, loop, (n1, n2), True, filter_len, run)


def dk_gluon(config: tuple, u: torch.Tensor, dy: torch.Tensor, filter_len: int, key=None) -> torch.Tensor:
    """dk as dk_pair gives it, through gluon_onepass.fft_conv_gluon_dk_kernel (the Gluon one-pass kernel's
    forward stages; Hopper only): config = (A, B, pair groups a program[, XSMEM]), A B = 2N, B = 64; u, dy: (batch, H, N) 16-bit
    rows with unit stride. The host tail _dk_spectrum_sum's (the partials (B, A) at f = k_a + A k_b: the tile's rows in
    order are the natural order). ``key``: as dk_pair's."""
    a, b, loop, *xsmem = config  # (a 4th element: XSMEM, u's transform parked in shared memory: 2048's candidate)
    B, H, N = u.shape

    def run(partial, chunks):
        ops = mono_operands(a, b, 1, u.device)
        DK_GLUON.run(key, (H * chunks,), (u, dy, partial, ops["FARE"], ops["FAIM"], ops["FBRE"], ops["FBIM"], ops["TFRE"],
                                           ops["TFIM"], B, H, u.stride(0), u.stride(1), dy.stride(0), dy.stride(1)),
                     dict(A=a, B=b, LOOP=loop, TW_SFU=True, XSMEM=bool(xsmem and xsmem[0]), num_warps=4))

    return _dk_spectrum_sum(u, loop, (b, a), False, filter_len, run)


@functools.lru_cache(maxsize=8)
def order3_operands(a: int, b: int, device: torch.device) -> dict:
    """gluon_order3's constants for L = a b, a = 16 A2: F_16, F_B and F2 (b / A2 copies of F_A2 on the diagonal of a
    (b, b) matrix: a chunk's stage 1b on its 64 rows k_a) in float16, T1 (A2, 16) = W_A^(a2 k1) in float32."""
    a2 = a // 16
    tables = {}
    for name, size in dict(F16=16, F2=a2, FB=b).items():
        re, im = _dft(size, size, size, size)
        if name == "F2":
            re, im = torch.block_diag(*[re] * (b // a2)), torch.block_diag(*[im] * (b // a2))
        tables[name + "RE"], tables[name + "IM"] = re.half(), im.half()
    tables["T1RE"], tables["T1IM"] = _dft(a, a2, 16, a)
    return {name: t.to(device) for name, t in tables.items()}


SCALED_HALF_BINS = CachedLaunch(lambda: kernels_bins.scaled_half_bins_kernel)
LAID_HALF_BINS = CachedLaunch(lambda: kernels_bins.laid_half_bins_kernel)
CONV_GLUON_ORDER3 = CachedLaunch(lambda: importlib.import_module(
    "tilecore.ops.fft_conv.gluon_order3").fft_conv_gluon_order3_kernel)


def launch_order3(u: torch.Tensor, spectrum: torch.Tensor, y: torch.Tensor, conj: bool = False, per_sm: int = 2,
                  key=None, warpgroups: int = 1, rfft: int = 3, stack: bool = False, kfull: bool = False) -> None:
    """gluon_order3's kernel (N = 8192, 16384 on Hopper): y = the causal convolution of u (B, H, N; unit stride along
    N) with the filter of ``spectrum`` (the rfft (H, N + 1) complex64, or its float16 pairs (H, N + 1, 2); the kernel
    reads its bins, conjugated with ``conj``: the correlation); ``per_sm`` persistent programs a multiprocessor;
    ``warpgroups`` 2: two warpgroups a pair (its WARPGROUPS); ``rfft`` 3: a float16 spectrum's bins read as they are
    (half_bins); 4: a complex64 spectrum cast to float16 bins a call, each channel over its largest part
    (scaled_half_bins: one kernel), the outputs scaled back; ``stack``: 1a / 1'a four columns a product in the wgmmas'
    layouts, u read once a pair (its STACK; 8192); ``kfull``: the bins laid out a call as the kernel's chunks read them
    (laid_half_bins, one kernel, 8192: 16-byte loads in the kernel instead of a 4-byte gather a bin)."""
    B, H, N = u.shape
    if u.numel() == 0:
        return
    a, b = 2 * N // 64, 64
    ops = order3_operands(a, b, u.device)
    ks = None
    bins_key = None if key is None else (key, "bins")
    if spectrum.dtype != torch.float16 and rfft != 4:
        raise ValueError(f"the order-3 kernel reads float16 bins: rfft 3 takes a float16 spectrum (H, N + 1, 2), "
                         f"rfft 4 a complex64 one (H, N + 1); got rfft {rfft} and {spectrum.dtype}")
    if kfull:  # (laid out a call: 16-byte loads in the kernel; a complex64 spectrum scaled as RFFT 4's)
        k, ks = laid_half_bins(spectrum, N, bins_key)
    elif spectrum.dtype == torch.float16:  # (bins the caller keeps: read as they are)
        k = half_bins(spectrum)
    else:  # a complex64 spectrum as scaled float16 bins a call (the kernel's KS)
        k, ks = scaled_half_bins(spectrum, bins_key)
    pairs = H * -(-B // 2)
    grid = (max(1, min(pairs, per_sm * dispatch.num_sms(u.device))),)
    options = dict(A=a, B=b, CONJ=bool(conj), WARPGROUPS=warpgroups,
                   WORKER_REGS=importlib.import_module("tilecore.ops.fft_conv.gluon_order3").WORKER_REGS,
                   KSCALE=ks is not None, STACK=bool(stack), KFULL=bool(kfull), num_warps=4)
    CONV_GLUON_ORDER3.run(key, grid, (u, k, y, *(ops[n] for n in ("F16RE", "F16IM", "F2RE", "F2IM", "FBRE", "FBIM",
                                                                   "T1RE", "T1IM")),
                                      B, H, u.stride(0), u.stride(1), y.stride(0), y.stride(1), k.stride(0), ks),
                          options)
