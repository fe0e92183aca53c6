"""The Gluon one-pass kernels' arithmetic in torch (gluon_onepass.py): Gluon cannot be interpreted, so
the tests check each kernel's stage math, signs, table indices and scales here, step for step, against
float64 (the kernels' roundings: float16 operands where they cast, float32 sums). One helper a direction
(``forward_stages``, ``inverse_stages``) serves both kernels, as gluon_onepass's _forward_stages and
_inverse_stages do: the whole-tile kernel is one block of A columns, the chunked one A / CHUNK blocks
whose outputs accumulate at a running scale."""
import math

import torch

from tilecore.ops.fft_conv.launch import mono_operands, mono_spectrum


def _h16(x):
    """The kernels' float16 casts (operands of the tensor cores)."""
    return x.half().float()


def _prescaled_columns(u, half: int, b: int):
    """u (Bt, H, N) as the kernels read it: x[m, a] = u[b a + m] ([Bt, H, b, half] float32), each row's
    non-finite values zeroed and flagged (bad: [Bt, H]), then divided by its largest magnitude (scale; 1 for
    an all-zero row)."""
    Bt, H = u.shape[:2]
    x = u.float().reshape(Bt, H, half, b).transpose(-1, -2)
    finite = torch.isfinite(x)
    bad = ~finite.flatten(2).all(-1)
    x = torch.where(finite, x, 0.0)
    scale = x.abs().flatten(2).amax(-1)
    scale = torch.where(scale > 0, scale, 1.0)
    return x / scale[..., None, None], bad, scale


def kernel_spectrum(spectrum, a: int, b: int, conj: bool, rfft: bool):
    """The spectrum (H, 2, b, a) as the kernel reads it at f = k_a + a k_b: with ``rfft`` its own gather
    (gluon_onepass._spectrum_at: bins past L/2 the conjugates of L - f, then CONJ; rfft 3: the bins in float16, as a
    float16 spectrum (H, N + 1, 2) holds them or a complex64 one rounded), else the host's layout."""
    H = spectrum.shape[0]
    if spectrum.dtype == torch.float16:  # (filter_spectrum(..., torch.float16)'s pairs)
        spectrum = torch.view_as_complex(spectrum.float().contiguous())
    if not rfft:
        return mono_spectrum(spectrum, a, b, 1, False, conj).view(H, 2, b, a)
    L = a * b
    f = torch.arange(L)
    mirrored = f > L // 2
    bins = torch.where(mirrored, L - f, f)
    kre, kim = spectrum.real[:, bins], spectrum.imag[:, bins]
    if rfft == 3:  # the bins in float16
        kre, kim = kre.half().float(), kim.half().float()
    kim = torch.where(mirrored != conj, -kim, kim)
    return torch.stack((kre, kim), 1).view(H, 2, b, a)


def computed_twiddles(a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """gluon_onepass._twiddles with TW_SFU: W_L^(m k_a) (b, a) from the exponent m k_a reduced mod L = a b
    exactly, to [-L/2, L/2), its float32 angle's cosine and sine (the kernel's SFU approximations differ
    from these by ~2^-21)."""
    L = a * b
    t = (torch.arange(b)[:, None] * torch.arange(a)[None, :]) % L
    t = torch.where(t >= L // 2, t - L, t)
    angle = t.float() * torch.tensor(-2 * math.pi / L, dtype=torch.float32)
    return angle.cos(), angle.sin()


def forward_stages(x_re, x_im, fa_re, fa_im, tw_re, tw_im, fb_re, fb_im, k_re, k_im):
    """gluon_onepass._forward_stages on a block of columns: x (float16 values, [B, HALF]) @ F_A[:HALF, cols],
    the twiddles, R cast to float16, F_B @ R, the spectrum product. Returns (Y re, Y im, its largest |Y|:
    1 where Y is 0)."""
    rre = x_re @ fa_re + x_im @ (-fa_im)
    rim = x_re @ fa_im + x_im @ fa_re
    rre, rim = _h16(rre * tw_re - rim * tw_im), _h16(rre * tw_im + rim * tw_re)
    sre = fb_re @ rre + (-fb_im) @ rim
    sim = fb_re @ rim + fb_im @ rre
    yre, yim = sre * k_re - sim * k_im, sre * k_im + sim * k_re
    scale = torch.maximum(yre.abs().max(), yim.abs().max())
    return yre, yim, torch.where(scale > 0, scale, 1.0)


def inverse_stages(yre, yim, scale, fa_re, fa_im, tw_re, tw_im, fb_re, fb_im, ore=None, oim=None, running=None):
    """gluon_onepass._inverse_stages: Y / scale cast to float16, conj(F_B) @ Y, conjugate twiddles, D @
    conj(F_A)[cols, :HALF] (``fa_re``, ``fa_im``: F_A[cols, :HALF]). With (ore, oim, running) the chunked
    kernel's accumulation: the sum rescaled to the grown running scale, D cast at scale / running.
    Returns (ore, oim, the running scale)."""
    yre, yim = _h16(yre / scale), _h16(yim / scale)
    dre = fb_re @ yre + fb_im @ yim
    dim = fb_re @ yim + (-fb_im) @ yre
    dre, dim = dre * tw_re + dim * tw_im, dim * tw_re - dre * tw_im
    if ore is None:
        dre, dim = _h16(dre), _h16(dim)
        return dre @ fa_re + dim @ fa_im, dim @ fa_re + (-dre) @ fa_im, scale
    grown = torch.maximum(running, scale)
    alpha = running / grown
    ratio = scale / grown
    dre, dim = _h16(dre * ratio), _h16(dim * ratio)
    return ore * alpha + dre @ fa_re + dim @ fa_im, oim * alpha + dim @ fa_re + (-dre) @ fa_im, grown


def emulate(u, spectrum, conj: bool, a: int, b: int, rfft: bool = False, chunk: int = 0, tw_sfu: bool = False):
    """A Gluon one-pass kernel's arithmetic, step for step (the same tables, float16 roundings where the
    kernel casts, float32 sums): fft_conv_gluon_onepass_kernel, or with ``chunk`` > 0
    fft_conv_gluon_chunked_kernel (the tile's k_a columns ``chunk`` at a time, each block's spectrum
    product at its own scale, the output accumulated at a running scale). u (B, H, N) with 2N = a b;
    spectrum: the rfft (H, N + 1); ``rfft``: the kernel's RFFT (it reads the bins itself); ``tw_sfu``: its
    TW_SFU (the twiddles computed, not read from the table)."""
    Bt, H, N = u.shape
    half, L = a // 2, a * b
    ops = {name: t.float() for name, t in mono_operands(a, b, 1, u.device).items()}
    if tw_sfu:
        ops["TFRE"], ops["TFIM"] = computed_twiddles(a, b)
    tile = kernel_spectrum(spectrum, a, b, conj, rfft)
    fb_re, fb_im = ops["FBRE"], ops["FBIM"]
    blocks = [slice(0, a)] if not chunk else [slice(j * chunk, (j + 1) * chunk) for j in range(a // chunk)]
    y = torch.empty(Bt, H, N, dtype=u.dtype)
    x, bad, scale = _prescaled_columns(u, half, b)
    for h in range(H):
        for g in range(0, Bt, 2):
            x_re = _h16(x[g, h])
            x_im = _h16(x[g + 1, h]) if g + 1 < Bt else torch.zeros_like(x_re)
            ore = oim = running = None
            if chunk:
                ore, oim, running = torch.zeros(b, half), torch.zeros(b, half), torch.tensor(0.0)
            for cols in blocks:
                fa_re, fa_im = ops["FARE"][:half, cols], ops["FAIM"][:half, cols]
                tw_re, tw_im = ops["TFRE"][:, cols], ops["TFIM"][:, cols]
                yre, yim, block_scale = forward_stages(x_re, x_im, fa_re, fa_im, tw_re, tw_im, fb_re, fb_im,
                                                       tile[h, 0][:, cols], tile[h, 1][:, cols])
                # F_A[cols, :HALF] = F_A[:HALF, cols]^T (F_A is symmetric)
                ore, oim, running = inverse_stages(yre, yim, block_scale, fa_re.T, fa_im.T, tw_re, tw_im, fb_re,
                                                   fb_im, ore, oim, running)
            for i, o in ((g, ore), (g + 1, oim)):
                if i < Bt:
                    # the kernels' epilogues: (scale / L) x the sequence's; chunked: running x the sequence's / L
                    o = o * (running * scale[i, h] / L) if chunk else o * (running / L * scale[i, h])
                    o = torch.where(bad[i, h], float("nan"), o)
                    y[i, h] = o.transpose(0, 1).reshape(N).to(u.dtype)
    return y


def emulate_chunked(u, spectrum, conj: bool, a: int, b: int, chunk: int, rfft: bool = False, tw_sfu: bool = False):
    """fft_conv_gluon_chunked_kernel's arithmetic: emulate(..., chunk=chunk)."""
    return emulate(u, spectrum, conj, a, b, rfft, chunk, tw_sfu)


def emulate_dk(u, dy, a: int, b: int, filter_len: int, tw_sfu: bool = True):
    """gluon_onepass.fft_conv_gluon_dk_kernel's arithmetic with launch.dk_gluon's host sum and inverse DFT: each pair's
    z_u (each sequence over its largest |u|) and z_dy (its halves rescaled so both weigh 1 / w) through the forward
    stages (forward_stages with the spectrum 1: S), w Z_dy conj(Z_u) summed over the batch, the inverse DFT's real part,
    its first filter_len elements; NaN for a channel with a non-finite element. float32 (H, filter_len)."""
    Bt, H, N = u.shape
    half = a // 2
    ops = {name: t.float() for name, t in mono_operands(a, b, 1, u.device).items()}
    if tw_sfu:
        ops["TFRE"], ops["TFIM"] = computed_twiddles(a, b)
    fa_re, fa_im = ops["FARE"][:half], ops["FAIM"][:half]
    one, zero = torch.ones(b, a), torch.zeros(b, a)

    def tiles(t):  # x[m, a] = t[b a + m], each sequence over its largest |t| (non-finite zeroed): (x, scale, bad)
        x = t.float().reshape(Bt, H, half, b).transpose(-1, -2)
        finite = torch.isfinite(x)
        x = torch.where(finite, x, 0.0)
        scale = x.abs().flatten(2).amax(-1)
        return x / torch.where(scale > 0, scale, 1.0)[..., None, None], torch.where(scale > 0, scale, 1.0), \
            ~finite.flatten(2).all(-1)

    xu, su, bad_u = tiles(u)
    xd, sd, bad_d = tiles(dy)
    spectrum = torch.zeros(H, 2, b, a)
    for h in range(H):
        for g in range(0, Bt, 2):
            pair = [g, g + 1] if g + 1 < Bt else [g]
            w = [su[i, h] * sd[i, h] for i in pair]
            weight = max(w)
            x = [xu[i, h] for i in pair] + [torch.zeros(b, half)] * (2 - len(pair))
            d = [xd[i, h] * (wi / weight) for i, wi in zip(pair, w)] + [torch.zeros(b, half)] * (2 - len(pair))
            xre, xim, _ = forward_stages(_h16(x[0]), _h16(x[1]), fa_re, fa_im, ops["TFRE"], ops["TFIM"], ops["FBRE"],
                                         ops["FBIM"], one, zero)
            yre, yim, _ = forward_stages(_h16(d[0]), _h16(d[1]), fa_re, fa_im, ops["TFRE"], ops["TFIM"], ops["FBRE"],
                                         ops["FBIM"], one, zero)
            spectrum[h, 0] += (yre * xre + yim * xim) * weight
            spectrum[h, 1] += (yim * xre - yre * xim) * weight
    bad = (bad_u | bad_d).any(0)  # (H,)
    total = torch.complex(spectrum[:, 0], spectrum[:, 1]).reshape(H, a * b)
    dk = torch.fft.ifft(total, dim=-1).real[:, :filter_len]
    return torch.where(bad[:, None], float("nan"), dk)


def emulate_order3(u, spectrum, conj: bool, a: int, b: int, ks=None):
    """gluon_order3.fft_conv_gluon_order3_kernel's arithmetic, step for step (float16 bins, the twiddles computed):
    A = 16 A2, a = A2 a1 + a2, k_a = k1 + 16 k2; 1a (x_a2 @ F_16, the twiddle W_A^(a2 k1), float16 into T), per chunk
    of KG = b / A2 values of k1 the chunked kernel's stages on its 64 columns k_a (at A2 l + k2, k_a = k1 + l + 16 k2;
    forward_stages / inverse_stages with F2, KG copies of F_A2 on the diagonal, in F_A's place: one scale a chunk; the
    kernel's transposed tile rounds the same values), T' float16, then 1'a (T' x s_k1 / s x conj(W_A^(a2 k1)), float16,
    @ conj(F_16)[:, :8]) and the epilogue (s / L x ``ks``[h] x the sequence's scale). u (B, H, N), 2N = a b;
    spectrum: the bins as float16 pairs (H, N + 1, 2), or a complex64 rfft (H, N + 1) rounded to them; ``ks`` (H,):
    the channels' bin scales (launch.scaled_half_bins: RFFT 4), else 1."""
    from tilecore.ops.fft_conv.launch import order3_operands

    Bt, H, N = u.shape
    half, L, a2n = a // 2, a * b, a // 16
    kg = b // a2n
    ops = {name: t.float() for name, t in order3_operands(a, b, u.device).items()}
    tf_re, tf_im = computed_twiddles(a, b)
    tile = kernel_spectrum(spectrum, a, b, conj, 3)
    f16re, f16im, f2re, f2im = ops["F16RE"], ops["F16IM"], ops["F2RE"], ops["F2IM"]
    t1re, t1im = ops["T1RE"], ops["T1IM"]  # (A2, 16): W_A^(a2 k1)
    y = torch.empty(Bt, H, N, dtype=u.dtype)
    x, bad, scale = _prescaled_columns(u, half, b)
    for h in range(H):
        for g in range(0, Bt, 2):
            x_re = _h16(x[g, h])
            x_im = _h16(x[g + 1, h]) if g + 1 < Bt else torch.zeros_like(x_re)
            t_re = torch.empty(16, a2n, b)
            t_im = torch.empty(16, a2n, b)
            for a2 in range(a2n):  # 1a: columns a = A2 a1 + a2, a1 < 8
                xr, xi = x_re[:, a2::a2n], x_im[:, a2::a2n]  # [b, 8]
                rre = xr @ f16re[:8] - xi @ f16im[:8]
                rim = xr @ f16im[:8] + xi @ f16re[:8]
                rre, rim = rre * t1re[a2] - rim * t1im[a2], rre * t1im[a2] + rim * t1re[a2]
                t_re[:, a2], t_im[:, a2] = _h16(rre).T, _h16(rim).T
            scales = torch.zeros(16)
            for k1 in range(0, 16, kg):  # the chunks: column A2 l + k2 at k_a = k1 + l + 16 k2
                cols = (k1 + torch.arange(kg)[:, None] + 16 * torch.arange(a2n)[None, :]).reshape(-1)
                xre = t_re[k1:k1 + kg].reshape(kg * a2n, b).T
                xim = t_im[k1:k1 + kg].reshape(kg * a2n, b).T
                yre, yim, s = forward_stages(xre, xim, f2re, f2im, tf_re[:, cols], tf_im[:, cols],
                                             ops["FBRE"], ops["FBIM"], tile[h, 0][:, cols], tile[h, 1][:, cols])
                dre, dim, s = inverse_stages(yre, yim, s, f2re, f2im, tf_re[:, cols], tf_im[:, cols], ops["FBRE"],
                                             ops["FBIM"])
                t_re[k1:k1 + kg] = _h16(dre).T.reshape(kg, a2n, b)
                t_im[k1:k1 + kg] = _h16(dim).T.reshape(kg, a2n, b)
                scales[k1:k1 + kg] = s
            running = scales.max()
            ratio = scales / running
            out_re = torch.empty(b, half)
            out_im = torch.empty(b, half)
            for a2 in range(a2n):  # 1'a
                vre, vim = t_re[:, a2].T, t_im[:, a2].T  # [b, 16 k1]
                cre, cim = t1re[a2] * ratio, t1im[a2] * ratio
                vre, vim = _h16(vre * cre + vim * cim), _h16(vim * cre - vre * cim)
                out_re[:, a2::a2n] = vre @ f16re[:, :8] + vim @ f16im[:, :8]
                out_im[:, a2::a2n] = vim @ f16re[:, :8] - vre @ f16im[:, :8]
            for i, o in ((g, out_re), (g + 1, out_im)):
                if i < Bt:
                    o = o * (running * (1.0 / L) * (1.0 if ks is None else ks[h]) * scale[i, h])
                    o = torch.where(bad[i, h], float("nan"), o)
                    y[i, h] = o.transpose(0, 1).reshape(N).to(u.dtype)
    return y
