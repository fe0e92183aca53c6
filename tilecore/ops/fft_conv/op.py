"""``tilecore.fft_conv``: the public function, its checks, custom ops and autograd."""
from __future__ import annotations

import torch

from tilecore import dispatch
from tilecore.ops.fft_conv import launch
from tilecore.ops.fft_conv.plan import dk_plan, plan
from tilecore.tiles import eager
from tilecore.tiles import launch as tiles_launch
from tilecore.tiles.launch import LRU, KeyedLaunch, SignatureMemo, TmaOperand
from tilecore.tiles.launch import signature  # noqa: F401 (_CALL_KEY builds its misses by this module's name)
from tilecore.tiles.switches import generation

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


SPECTRUM_DTYPES = (torch.complex64, torch.float16)


def filter_spectrum(k: torch.Tensor, n: int, dtype: torch.dtype = torch.complex64) -> torch.Tensor:
    """The spectrum of a filter, for ``fft_conv(u, spectrum)`` in place of ``fft_conv(u, k)``.

    k: (channels, filter_len), float16, bfloat16 or float32, 1 <= filter_len <= n; n: the sequence length
    of the u it will convolve. Returns ``torch.fft.rfft(k.float(), n=2 * n)``: complex64 (channels, n + 1);
    with ``dtype=torch.float16`` its bins as float16 (re, im) pairs, (channels, n + 1, 2)
    (``torch.view_as_real(spectrum).half()``): see below.
    fft_conv computes this spectrum every call it is given the filter (a real FFT of channels x 2n: ~20 us at
    H 768, n 1024 on an H100); computed once and passed instead, that work and its launches leave the call,
    as FlashFFTConv's users keep k's FFT. The same result as passing k, bit for bit.

    It is an ordinary tensor made by torch.fft.rfft, so it is differentiable: where k requires grad, the
    spectrum's gradient from fft_conv's backward flows to k (the same dk as fft_conv(u, k) gives, up to
    float32 rounding); torch.compile traces it; ``.detach()`` it for inference. Typical use::

        spectrum = tilecore.filter_spectrum(k, seqlen)   # once, per filter (per step while training k)
        y1 = tilecore.fft_conv(u1, spectrum)             # every call: the kernel only
        y2 = tilecore.fft_conv(u2, spectrum)

    A float16 spectrum is half the bytes the kernels gather each call; on Hopper the Gluon kernels that read it as it
    is (configs.GLUON_ONEPASS_HALF / GLUON_ORDER3_HALF: n = 1024 .. 16384, 1.02-1.13x the complex64 spectrum's call on
    the H100 in bf16) take it where they have n, and every other path widens it to complex64 a call (a conversion:
    keep complex64 there). Its bins are rounded to float16 (2^-11 relative: bf16 outputs ~0.01 of their rounding
    floor more against float64, 1.05x where complex64 gives 1.04x at 1024-4096 and 1.075x / 1.07x at 8192-16384;
    fp16 ~0.2 more, ~2.6-3.1x), and float16 holds |bin| <= 65504: a channel whose taps' absolute sum exceeds that
    may overflow (an inf bin: that channel's outputs NaN, never a finite wrong value). Its gradient (a trained filter) is
    float16 too: train with complex64, keep float16 for inference.
    """
    if not isinstance(k, torch.Tensor):
        raise TypeError(f"filter_spectrum: k must be a tensor (channels, filter_len); got {type(k).__name__}")
    if k.is_complex() or k.dtype not in DTYPES:
        raise TypeError(f"filter_spectrum: k must be float16, bfloat16 or float32; got {_name(k.dtype)}")
    if isinstance(n, bool) or not isinstance(n, (int, torch.SymInt)) or n < 1:
        raise ValueError(f"filter_spectrum: n (the sequence length) must be an int >= 1; got {n!r}")
    if k.dim() != 2 or not 1 <= k.shape[1] <= n:
        raise ValueError(f"filter_spectrum: k must be (channels, filter_len) with 1 <= filter_len <= n = {n}; got "
                         f"shape {tuple(k.shape)}")
    if dtype not in SPECTRUM_DTYPES:
        raise TypeError(f"filter_spectrum: dtype is torch.complex64 or torch.float16 (float16 (re, im) bins); got {dtype}")
    spectrum = _spectrum(k, n)
    return spectrum if dtype == torch.complex64 else torch.view_as_real(spectrum).to(torch.float16)


def _is_spectrum(k: torch.Tensor) -> bool:
    """k is a spectrum (filter_spectrum's: complex64 (H, N + 1), or float16 (H, N + 1, 2)), not a filter."""
    return k.is_complex() or k.dim() == 3


def _spectrum(k: torch.Tensor, n: int) -> torch.Tensor:
    """filter_spectrum without its checks (k checked by fft_conv's): the same call, the same bits."""
    return torch.fft.rfft(k.float(), n=2 * n)


def check(u, k) -> None:
    if not isinstance(u, torch.Tensor) or u.dim() != 3:
        got = f"shape {tuple(u.shape)}" if isinstance(u, torch.Tensor) else type(u).__name__
        raise ValueError(f"fft_conv expects u of shape (batch, channels, seqlen); got {got}")
    if u.dtype not in DTYPES:
        raise TypeError(f"fft_conv accepts float16, bfloat16 and float32 u; got {_name(u.dtype)}")
    dispatch.backend_for(u.device)
    B, H, N = u.shape
    if N < 1:
        raise ValueError(f"fft_conv needs seqlen >= 1; got u of shape {tuple(u.shape)}")
    if not isinstance(k, torch.Tensor):
        raise TypeError(f"fft_conv: k must be a tensor (the filter or its spectrum); got {type(k).__name__}")
    if k.device != u.device:
        raise ValueError(f"fft_conv: k is on {k.device} and u on {u.device}")
    if _is_spectrum(k):
        if not ((k.dtype == torch.complex64 and k.shape == (H, N + 1))
                or (k.dtype == torch.float16 and k.shape == (H, N + 1, 2))):
            raise ValueError(f"fft_conv: a spectrum k must be complex64 of shape (channels, seqlen + 1) = ({H}, "
                             f"{N + 1}), as filter_spectrum(filter, {N}) gives, or float16 ({H}, {N + 1}, 2), as "
                             f"filter_spectrum(filter, {N}, torch.float16) gives; got {_name(k.dtype)} "
                             f"{tuple(k.shape)}")
        return
    if k.dtype not in DTYPES:
        raise TypeError(f"fft_conv: a filter k must be float16, bfloat16 or float32 (or a complex64 spectrum); "
                        f"got {_name(k.dtype)}")
    if k.dim() != 2 or k.shape[0] != H or not 1 <= k.shape[1] <= N:
        raise ValueError(f"fft_conv: a filter k must be (channels, filter_len) with channels = {H} and "
                         f"1 <= filter_len <= seqlen = {N}; got shape {tuple(k.shape)}")


def _rows(u: torch.Tensor) -> torch.Tensor:
    return u if u.stride(-1) == 1 else u.contiguous()


def _conv_impl(u, spectrum, conj: bool, key=None):
    """``key``: fft_conv's signature of u and k (k: the filter, whose fresh spectrum this is, or the spectrum
    itself), or None. The launch key adds conj and the spectrum's conj bit (a conjugate view is resolved into
    a fresh, aligned copy: another specialization than the keyed tensor's own)."""
    y = launch.output(u.shape, u.dtype, u.device)
    launch_key = None if key is None else (key, conj, spectrum.is_conj())
    half = spectrum.dtype == torch.float16  # (H, N + 1, 2) float16 bins: read as they are where the plan's rfft is 3
    p = _PLANS.memo(key, lambda: plan(u.shape[-1], u.device, u.dtype, half_spectrum=True) if half
                    else plan(u.shape[-1], u.device, u.dtype))
    if half and p.rfft != 3:  # (every other plan reads complex64 bins)
        spectrum = torch.view_as_complex(spectrum.float().contiguous())
    launch.launch(p, _rows(u), spectrum, y, conj, key=launch_key)
    return y


# The eager host path (issue 31): a CUDA call's signature (u's and k's) skips the checks and finds the plan.
# The filter's spectrum is computed every call (it reads k's values); pass filter_spectrum(k, seqlen) where
# one filter serves many calls
_CHECKED = LRU(256)  # signatures of CUDA calls whose checks passed
_PLANS = LRU(256)  # a call's signature (with the switches' generation) -> its plan (of seqlen, device, dtype, configs)
_CALL_KEY = SignatureMemo(globals())  # fft_conv's signature of (u, k), checked against the last repeated one


# the spectrum form: differentiable in u and in the spectrum (so in the filter it came from)


@torch.library.custom_op("tilecore::fft_conv_spectrum", mutates_args=())
def _spectrum_op(u: torch.Tensor, spectrum: torch.Tensor, conj: bool) -> torch.Tensor:
    return _conv_impl(u, spectrum, conj)


@_spectrum_op.register_fake
def _(u, spectrum, conj):
    return u.new_empty(u.shape)


def _spectrum_setup(ctx, inputs, output):
    u, spectrum, conj = inputs
    ctx.save_for_backward(u, spectrum)
    ctx.conj = conj


def spectrum_grad(u: torch.Tensor, dy: torch.Tensor, conj: bool = False) -> torch.Tensor:
    """The gradient (PyTorch's convention for complex tensors: dL/dRe + i dL/dIm) of a real loss L in the
    spectrum K (H, N + 1) of y = first N of irfft(U K, 2N) (conj: of U conj(K)), U = rfft(u, 2N), given dy:
    dL/dX = (c / 2N) rfft(dy, 2N) with c = 2 at the bins 1..N-1 that irfft counts twice and 1 at bins 0 and N
    (whose imaginary parts irfft ignores: rfft(dy) is real there), and dL/dK = sum over the batch of
    conj(U) dL/dX (conj: its conjugate). torch.fft in float32; rfft's own backward takes it to the filter."""
    n = u.shape[-1]
    cross = (torch.fft.rfft(dy.float(), n=2 * n) * torch.conj_physical(torch.fft.rfft(u.float(), n=2 * n))).sum(0)
    weight = torch.full((n + 1,), 1.0 / n, dtype=torch.float32, device=cross.device)
    weight[0] = weight[n] = 0.5 / n
    grad = cross * weight
    return torch.conj_physical(grad) if conj else grad


def _spectrum_backward(ctx, dy):
    u, spectrum = ctx.saved_tensors
    du = dk = None
    if ctx.needs_input_grad[0]:
        # y = first N of irfft(U K): its adjoint in u is the correlation with k, the product with conj(K)
        du = eager.backward_call(_spectrum_op, _conv_impl, dy, spectrum, not ctx.conj)
    if ctx.needs_input_grad[1]:
        dk = spectrum_grad(u, dy, ctx.conj)
        if spectrum.dtype == torch.float16:  # (a float16 spectrum's gradient: its (re, im) pairs)
            dk = torch.view_as_real(dk).to(torch.float16)
    return du, dk, None


_spectrum_op.register_autograd(_spectrum_backward, setup_context=_spectrum_setup)


# the filter form: differentiable in u and k


def _filter_impl(u, k, key=None):
    """The filter form's forward. With a key (an eager call recording a gradient: _FilterFunction) and
    RECORDED_RECIPES, by the key's _GluonConv where one is kept (made here or by a plain call of the key), the
    general path else."""
    if key is not None and RECORDED_RECIPES and tiles_launch.BIND_KEYED_LAUNCHES:
        prepared = _GLUON_CONVS.get(key)
        if prepared:
            return prepared(u, k)
        y = _conv_impl(u, _spectrum(k, u.shape[-1]), False, key=key)
        if key not in _GLUON_CONVS:
            _GLUON_CONVS.put(key, _GluonConv.of(key, u, k, y))
        return y
    return _conv_impl(u, _spectrum(k, u.shape[-1]), False, key=key)


# an eager filter-form call recording a gradient launches by the key's _GluonConv (issue 31's host time: the
# general path's plan, spectrum layout, operands and keyed hit each call otherwise); the same launch as the
# plain call's recipe. Read each call. On: the same bits on the H100 and 0.62x the general path's host time
# (notes/host's decision log)
RECORDED_RECIPES = True


@torch.library.custom_op("tilecore::fft_conv", mutates_args=())
def _filter_op(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return _filter_impl(u, k)


@_filter_op.register_fake
def _(u, k):
    return u.new_empty(u.shape)


def _filter_setup(ctx, inputs, output):
    u, k = inputs
    ctx.save_for_backward(u, k)


@torch.library.custom_op("tilecore::fft_conv_filter_grad", mutates_args=())
def _filter_grad_op(u: torch.Tensor, dy: torch.Tensor, filter_len: int, config: list[int], gluon: bool) -> torch.Tensor:
    """dk (float32 (H, filter_len)) through the launch the backward chose (plan.dk_plan: ``gluon``, the Gluon kernel's
    forward stages, else the pair kernel's transforms) at its ``config``."""
    return _filter_grad_impl(u, dy, filter_len, config, gluon)


def _filter_grad_impl(u, dy, filter_len, config, gluon, key=None):
    run = launch.dk_gluon if gluon else launch.dk_pair
    if key is None:
        return run(tuple(config), _rows(u), _rows(dy), filter_len)
    return run(tuple(config), _rows(u), _rows(dy), filter_len, key=key)


@_filter_grad_op.register_fake
def _(u, dy, filter_len, config, gluon):
    return u.new_empty((u.shape[1], filter_len), dtype=torch.float32)


def _filter_backward(ctx, dy):
    u, k = ctx.saved_tensors
    n = u.shape[-1]
    need_du, need_dk = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    torch_du = need_du and plan(n, u.device, u.dtype).path == "torch"
    dk_launch = dk_plan(n, u.device, u.dtype, k.dtype) if need_dk else None  # (chosen once, handed to the launch)
    return _filter_grads(u, k, dy, _spectrum(k, n) if need_du else None, need_du, need_dk, torch_du, dk_launch)


def _filter_grads(u, k, dy, spectrum, need_du: bool, need_dk: bool, torch_du: bool, dk_launch, key=None):
    """The filter form's (du, dk), either None where not needed: du by torch.fft (``torch_du``) or the kernel's
    correlation with the filter's ``spectrum``; dk by the kernel launch dk_plan chose (``dk_launch``) or torch.fft.
    ``key``: the backward's launch key (KEYED_BACKWARD's plain eager call: the implementations, launched by it; dk's
    as (key, "dk")); None: eager.backward_call's (the implementations where nothing is recorded, traced or
    create_graph: the ops)."""
    n = u.shape[-1]
    # rfft(dy) once where torch.fft takes both du and dk (the torch path: long N, CPU tensors)
    dy_spectrum = torch.fft.rfft(dy.float(), n=2 * n) if torch_du or (need_dk and not dk_launch) else None
    du = dk = None
    if need_du and torch_du:
        # y = first N of irfft(U K): its adjoint in u is the correlation with k, the product with conj(K)
        du = torch.fft.irfft(dy_spectrum * torch.conj_physical(spectrum), n=2 * n)[..., :n].to(u.dtype)
    elif need_du:
        du = eager.backward_call(_spectrum_op, _conv_impl, dy, spectrum, True) if key is None else \
            _conv_impl(dy, spectrum, True, key=key)
    if need_dk and dk_launch:
        kind, config = dk_launch
        args = (u, dy, k.shape[-1], [int(c) for c in config], kind == "gluon")
        dk = (eager.backward_call(_filter_grad_op, _filter_grad_impl, *args) if key is None else
              _filter_grad_impl(*args, key=(key, "dk"))).to(k.dtype)
    elif need_dk:
        # dk[j] = sum over batch and n of dy[n] u[n - j]: the correlation of dy with u, summed over the
        # batch in the frequency domain (torch.fft in float32)
        cross = (dy_spectrum * torch.conj_physical(torch.fft.rfft(u.float(), n=2 * n))).sum(0)
        dk = torch.fft.irfft(cross, n=2 * n)[:, :k.shape[-1]].to(k.dtype)
    return du, dk


_filter_op.register_autograd(_filter_backward, setup_context=_filter_setup)

# eager calls that record a gradient: the custom ops' autograd without their host time (~100 us a call)
_SpectrumFunction = eager.eager_autograd("_FftConvSpectrumFunction", _conv_impl, _spectrum_setup, _spectrum_backward)
_FilterFunction = eager.eager_autograd("_FftConvFunction", _filter_impl, _filter_setup, _filter_backward)


class _RecordedConv(torch.autograd.Function):
    """_FilterFunction for a key whose _GluonConv is kept, applied by fft_conv itself (RECORDED_FUNCTION): the
    recipe, u and k its arguments; the forward the recipe's call (what _filter_impl calls for the key), the backward
    _FilterFunction's (_filter_backward over the same saved u and k: the first argument's entry None). No checks lookup, eager.run, launch key or second recipe lookup."""

    @staticmethod
    def forward(ctx, prepared, u, k):
        ctx.set_materialize_grads(False)
        y = prepared(u, k)
        ctx.save_for_backward(u, k)
        ctx.prepared = prepared
        return y

    @staticmethod
    def backward(ctx, dy):
        if KEYED_BACKWARD and dy is not None:
            grads = _keyed_backward(ctx.prepared, ctx, dy)
            if grads is not None:
                return (None, *grads)
        return _FilterFunction.backward(ctx, dy)  # (None for the recipe, then _filter_backward's du and dk)


def _keyed_backward(prepared, ctx, dy):
    """_filter_backward's (du, dk) for a recorded call of the recipe ``prepared``'s key, by _filter_grads with du's
    and dk's launches keyed by the backward's launch key (eager.backward_key: the forward's key with dy's signature,
    which fixes dy's layout; u's is the forward key's; the spectrum, du and dk's partials are fresh tensors of the keys'
    shapes) and the plans the forward's key fixes kept in the recipe: the same launches and torch.fft calls as
    _filter_backward's, so the same bits, without its plan lookups and du's and dk's unkeyed launches (launch parts and
    Triton's argument specialization each call); the filter's spectrum padded as the forward pads it (PAD_BY_CAT).
    None (_filter_backward then) where the backward is not plain eager (create_graph, modes) or dy has no key."""
    u, k = ctx.saved_tensors
    if dispatch.eager_mode(dy, u, k) != "direct":
        return None
    key = eager.backward_key(prepared, dy)
    if key is None:
        return None
    need_du, need_dk = ctx.needs_input_grad[1], ctx.needs_input_grad[2]
    spectrum = None
    if need_du:  # (PAD_BY_CAT: the forward's padding by the recipe's kept zeros, the same spectrum as _spectrum's)
        spectrum = torch.fft.rfft(torch.cat((k, prepared.zeros), 1)) if PAD_BY_CAT else _spectrum(k, u.shape[-1])
    dk_launch = prepared.dk_launch
    if dk_launch is None:  # (dk_plan's choice: a function of n, the device and the dtypes, which the key fixes)
        dk_launch = prepared.dk_launch = dk_plan(u.shape[-1], u.device, u.dtype, k.dtype) or False
    # (the recipe's plan is Gluon's: du by the kernel, never torch.fft's)
    return _filter_grads(u, k, dy, spectrum, need_du, need_dk, False, dk_launch, key=key)


# a recorded call's backward through its recipe (_RecordedConv) launches du by the backward's launch key and keeps
# the forward key's plans in the recipe (issue 31's host time: _filter_backward's plan and dk_plan lookups, du's launch
# parts and Triton's unkeyed argument specialization each call); the same launches and bits. Read each call; False:
# _filter_backward. On: the same bits and float64 checks on the H100, faster in its A/B (notes/host's decision log)
KEYED_BACKWARD = True


# a keyed filter-form call recording a gradient whose key keeps a _GluonConv applies _RecordedConv straight from
# fft_conv (issue 31's host time: the general path's checks lookup, _is_spectrum, eager.run, the Function's key and
# setup frames and a second lookup of the recipe each call otherwise); the same launches, so the same bits. Read each
# call (with RECORDED_RECIPES); False: _FilterFunction. On since the H100's A/B (notes/host's decision log)
RECORDED_FUNCTION = True


def fft_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Causal long convolution along the sequence, y[b, h, n] = sum_{m <= n} u[b, h, m] k[h, n - m].

    u: (batch, channels, seqlen), float16, bfloat16 or float32 (y has its dtype and shape). k: the
    filter (channels, filter_len), filter_len <= seqlen (zero past its end), or its spectrum
    ``filter_spectrum(k, seqlen)`` (complex64 (channels, seqlen + 1); or float16 (channels, seqlen + 1, 2) with
    ``dtype=torch.float16``: filter_spectrum says where that pays), precomputed once for many calls.
    Computed through a DFT of length 2 seqlen. bf16 / fp16 u at seqlen 1024, 2048, 4096 on Hopper: one
    Gluon kernel (every DFT stage a wgmma, u and y by TMA); at seqlen 256..4096 elsewhere: one Triton kernel
    for two sequences of a channel at a time (as the real and imaginary parts of one complex sequence),
    the DFT factored into small float16 matrices on tensor cores, u read once and y written once; at
    seqlen 8192 and 16384 on Hopper one Gluon kernel at order 3 (no DFT matrix above 64 x 64; at 16384 two
    warpgroups on each pair), elsewhere the same method in three passes through a float16 scratch (bf16 at
    ~1.04-1.07x its rounding floor, fp16 at ~2.5-3.2x). float32 u at 256, 512, 1024: a kernel with float32
    products. Other lengths (any seqlen >= 1) and CPU tensors: torch.fft in float32.

    Differentiable in u and in k: the filter, or its spectrum (a gradient reaching it flows on to the filter
    it was computed from, through torch.fft.rfft's backward). du is the same kernel's correlation; the filter's
    gradient (16-bit u and filter) is a kernel's at seqlen 1024 and 2048 (Hopper: on the Gluon kernel's forward stages)
    and 4096 (the pair kernel's), elsewhere torch.fft's (float32).
    """
    # (the switches the plans read, tiles.switches.generation: a probe's patched block plans, keeps recipes and launches
    # of its own, and after it the shipped ones again)
    key = _CALL_KEY(u, k, generation())
    mode = dispatch.eager_mode(u, k)  # (one look at the modes a call: issue 31's host time)
    if key is not None and tiles_launch.BIND_KEYED_LAUNCHES:  # the Gluon kernel as the key's first call kept it
        prepared = _GLUON_CONVS.get(key)
        if prepared and not (prepared.given and k.is_conj()):
            if mode == "direct":
                return prepared(u, k)
            if mode == "autograd" and RECORDED_FUNCTION and RECORDED_RECIPES and not prepared.given:
                return eager.apply(_RecordedConv, prepared, u, k)
    _CHECKED.memo(key, lambda: check(u, k) or True)
    # eager: the implementation, or its autograd Function where a gradient is recorded; torch.compile,
    # fake tensors, modes: the ops
    if _is_spectrum(k):
        if mode == "direct":
            y = _conv_impl(u, k, False, key=key)
            if key is not None and tiles_launch.BIND_KEYED_LAUNCHES and key not in _GLUON_CONVS:
                _GLUON_CONVS.put(key, _GluonConv.of(key, u, k, y))
            return y
        return eager.run(_spectrum_op, _conv_impl, _SpectrumFunction, u, k, False, key=key, mode=mode)
    if mode == "direct":
        y = _conv_impl(u, _spectrum(k, u.shape[-1]), False, key=key)
        if key is not None and tiles_launch.BIND_KEYED_LAUNCHES and key not in _GLUON_CONVS:
            _GLUON_CONVS.put(key, _GluonConv.of(key, u, k, y))
        return y
    return eager.run(_filter_op, _filter_impl, _FilterFunction, u, k, key=key, mode=mode)


class _GluonConv:
    """fft_conv's plain eager call of a filter k by the Gluon one-pass kernel, for one signature (issue
    31's host time): the kernel's KeyedLaunch (u's and y's TMA descriptors as u and y: KeyedLaunch's derived
    descriptors, encoded once per address) and every argument the key fixes (the DFT tables, sizes, strides),
    made after the key's first call; a call then computes the filter's spectrum (every call: it reads k's values),
    allocates y and launches. A spectrum k (``given``: filter_spectrum's, contiguous rows, not a conjugate
    view, which the caller checks) is read as it is: no rfft a call. ``of`` gives False for every other path (the
    general path serves them)."""

    __slots__ = ("launch", "plan", "rows", "tail", "shape", "dtype", "device", "k_float", "given", "zeros", "key",
                 "dk_launch")

    @classmethod
    def of(cls, key, u, k, y):
        p = _PLANS.get(key)
        parts = launch._GLUON_LAUNCHES.get((key, False, False))  # (_conv_impl's launch key of a fresh spectrum)
        given = _is_spectrum(k)
        half = k.dtype == torch.float16 and given  # (float16 bins: only a plan of rfft 3 reads them as they are)
        if p is None or p.path != "gluon" or parts is None or u.numel() == 0 or (
                given and (k.is_conj() or k.stride(-1) != 1 or not p.rfft)) or (p.rfft == 3) != half or (
                half and k.stride(-2) != 2):
            return False
        self = cls()
        kernel, grid, tables, options, tma = parts
        self.plan, self.rows, self.given = p, u.stride(-1) != 1, given  # (rows: _rows' copy; the key fixes strides)
        u = _rows(u)
        B, H, N = u.shape
        spectrum = launch.gluon_spectrum(p, k if given else filter_spectrum(k, N), False)
        self.tail = (*tables, B, H, u.stride(0), u.stride(1), y.stride(0), y.stride(1), spectrum.stride(0))
        derived = None
        if tma:  # (launch.gluon_operands' views)
            half, b = p.n1 // 2, p.n2
            u_view = ([B, H, half, b], [u.stride(0), u.stride(1), b, 1])
            y_view = ([B, H, half, b], [y.stride(0), y.stride(1), b, 1])
            derived = {"u_desc": (0, lambda t: TmaOperand(t, [2, 1, half, b], *u_view)),
                       "y_desc": (2, lambda t: TmaOperand(t, [2, 1, half, b], *y_view))}
        self.launch = KeyedLaunch(kernel, (key, False, False), grid, options, derived=derived)
        self.key, self.dk_launch = key, None  # (dk_launch: dk_plan's choice, kept at the key's first keyed backward)
        self.shape, self.dtype, self.device = tuple(y.shape), y.dtype, y.device
        self.k_float = k.dtype == torch.float32  # (filter_spectrum's k.float(): k itself)
        # the zeros padding the filter, kept (read-only: never written, so no stream or graph can race on them), one
        # tensor per (device, channels, pad) shared by every recipe of that shape (a model's layers, batch sizes)
        self.zeros = None if given else _ZEROS.memo(
            (k.device, H, 2 * N - k.shape[-1]),
            lambda: torch.zeros((H, 2 * N - k.shape[-1]), dtype=torch.float32, device=k.device))
        return self

    @property
    def launch_key(self):  # (eager.backward_key reads it, as from an eager_autograd ctx)
        return self.key

    def __call__(self, u, k) -> torch.Tensor:
        if self.rows:
            u = u.contiguous()
        n = self.shape[-1]
        if self.given:  # (a spectrum: its bins as they are)
            spectrum = k
        elif PAD_BY_CAT:  # filter_spectrum's padded k (as float32) in one launch, then the same transform
            spectrum = torch.fft.rfft(torch.cat((k, self.zeros), 1))
        else:
            spectrum = torch.fft.rfft(k if self.k_float else k.float(), n=2 * n)  # (filter_spectrum)
        if self.plan.rfft and self.launch.kept():  # the bins as float32 pairs: the fresh spectrum's own memory
            spectrum = spectrum.data_ptr()
        else:
            spectrum = launch.gluon_spectrum(self.plan, spectrum, False)
        y = u.new_empty(self.shape)  # (u's dtype and device: ~0.7 us under torch.empty's on the H100's host)
        self.launch((u, spectrum, y, *self.tail))
        return y


_GLUON_CONVS = LRU(256)  # a plain eager call's signature -> its _GluonConv (False: the general path)
_ZEROS = LRU(8)  # (device, channels, pad) -> the float32 zeros the recipes of that shape pad their filter with

# a keyed Gluon call pads the filter by one torch.cat with its recipe's kept zeros (k cast to float32 by the cat's
# type promotion), then takes torch.fft.rfft of it: the input rfft(k.float(), n=2N) pads for itself (an allocation, a
# fill and a copy launch, and k.float()'s where k is 16-bit) and the same transform, so the same bits with one or two
# launches fewer a call (issue 31's host time). Read each call; False: rfft(k.float(), n=2N) as filter_spectrum does.
# On: the same bits on the H100, host time 0.86x (plain call) and 0.67x (recording a gradient) of the switch off
# (notes/host/runs/host_rows37_run2_session37_h100.txt, notes/host's decision log)
PAD_BY_CAT = True
