"""The Gluon one-pass kernels' arithmetic in torch (gluon_onepass.py): Gluon cannot be interpreted, so
the tests check each kernel's stage math, signs, table indices and scales here, step for step, against
float64 (the kernels' roundings: float16 operands where they cast, float32 sums)."""
import torch

from tilecore.ops.fft_conv.launch import mono_operands, mono_spectrum

def kernel_spectrum(spectrum, a: int, b: int, conj: bool, rfft: bool):
    """The spectrum (H, 2, b, a) as the kernel reads it at f = k_a + a k_b: with ``rfft`` its own gather
    (gluon_onepass._spectrum_at: bins past L/2 the conjugates of L - f, then CONJ), else the host's layout."""
    H = spectrum.shape[0]
    if not rfft:
        return mono_spectrum(spectrum, a, b, 1, False, conj).view(H, 2, b, a)
    L = a * b
    f = torch.arange(L)
    mirrored = f > L // 2
    bins = torch.where(mirrored, L - f, f)
    kre, kim = spectrum.real[:, bins], spectrum.imag[:, bins]
    kim = torch.where(mirrored != conj, -kim, kim)
    return torch.stack((kre, kim), 1).view(H, 2, b, a)


def emulate(u, spectrum, conj: bool, a: int, b: int, rfft: bool = False):
    """fft_conv_gluon_onepass_kernel's arithmetic, step for step (the same tables, float16 roundings where
    the kernel casts, float32 sums). u (B, H, N) with 2N = a b; spectrum: the rfft (H, N + 1); ``rfft``:
    the kernel's RFFT (it reads the bins itself)."""
    Bt, H, N = u.shape
    half, L = a // 2, a * b
    ops = {name: t.float() for name, t in mono_operands(a, b, 1, u.device).items()}
    tile = kernel_spectrum(spectrum, a, b, conj, rfft)
    fa1re, fa1im = ops["FARE"][:half], ops["FAIM"][:half]
    fa2re, fa2im = ops["FARE"][:, :half], ops["FAIM"][:, :half]
    fbre, fbim = ops["FBRE"], ops["FBIM"]
    twre, twim = ops["TFRE"], ops["TFIM"]
    h16 = lambda x: x.half().float()  # noqa: E731 (the kernel's float16 casts)
    y = torch.empty(Bt, H, N, dtype=u.dtype)
    x = u.float().reshape(Bt, H, half, b).transpose(-1, -2)  # x[m, a] = u[b a + m]: [b, half]
    finite = torch.isfinite(x)
    bad = ~finite.flatten(2).all(-1)
    x = torch.where(finite, x, 0.0)
    scale = x.abs().flatten(2).amax(-1)
    scale = torch.where(scale > 0, scale, 1.0)
    x = x / scale[..., None, None]
    for h in range(H):
        for g in range(0, Bt, 2):
            xre = h16(x[g, h])
            xim = h16(x[g + 1, h]) if g + 1 < Bt else torch.zeros_like(xre)
            rre = xre @ fa1re + (-xim) @ fa1im
            rim = xre @ fa1im + xim @ fa1re
            rre, rim = rre * twre - rim * twim, rre * twim + rim * twre
            rre, rim = h16(rre), h16(rim)
            sre = fbre @ rre + (-fbim) @ rim
            sim = fbre @ rim + fbim @ rre
            kre, kim = tile[h, 0], tile[h, 1]
            yre, yim = sre * kre - sim * kim, sre * kim + sim * kre
            spec_scale = torch.maximum(yre.abs().max(), yim.abs().max())
            spec_scale = torch.where(spec_scale > 0, spec_scale, 1.0)
            yre, yim = h16(yre / spec_scale), h16(yim / spec_scale)
            dre = fbre @ yre + fbim @ yim
            dim = fbre @ yim + (-fbim) @ yre
            dre, dim = dre * twre + dim * twim, dim * twre - dre * twim
            dre, dim = h16(dre), h16(dim)
            ore = dre @ fa2re + dim @ fa2im
            oim = dim @ fa2re + (-dre) @ fa2im
            for j, o in ((g, ore), (g + 1, oim)):
                if j < Bt:
                    o = o * (spec_scale / L * scale[j, h])
                    o = torch.where(bad[j, h], float("nan"), o)
                    y[j, h] = o.transpose(0, 1).reshape(N).to(u.dtype)
    return y


def emulate_chunked(u, spectrum, conj: bool, a: int, b: int, chunk: int, rfft: bool = False):
    """fft_conv_gluon_chunked_kernel's arithmetic, step for step: the tile's k_a columns ``chunk`` at a
    time, each chunk's spectrum product at its own scale, the output accumulated at a running scale."""
    Bt, H, N = u.shape
    half, L = a // 2, a * b
    ops = {name: t.float() for name, t in mono_operands(a, b, 1, u.device).items()}
    tile = kernel_spectrum(spectrum, a, b, conj, rfft)
    fbre, fbim = ops["FBRE"], ops["FBIM"]
    h16 = lambda x: x.half().float()  # noqa: E731 (the kernel's float16 casts)
    y = torch.empty(Bt, H, N, dtype=u.dtype)
    x = u.float().reshape(Bt, H, half, b).transpose(-1, -2)  # x[m, a] = u[b a + m]: [b, half]
    finite = torch.isfinite(x)
    bad = ~finite.flatten(2).all(-1)
    x = torch.where(finite, x, 0.0)
    scale = x.abs().flatten(2).amax(-1)
    scale = torch.where(scale > 0, scale, 1.0)
    x = x / scale[..., None, None]
    for h in range(H):
        for g in range(0, Bt, 2):
            xre = h16(x[g, h])
            xim = h16(x[g + 1, h]) if g + 1 < Bt else torch.zeros_like(xre)
            ore = torch.zeros(b, half)
            oim = torch.zeros(b, half)
            running = torch.tensor(0.0)
            for j in range(a // chunk):
                cols = slice(j * chunk, (j + 1) * chunk)
                fre, fim = ops["FARE"][:half, cols], ops["FAIM"][:half, cols]
                twre, twim = ops["TFRE"][:, cols], ops["TFIM"][:, cols]
                rre = xre @ fre + xim @ (-fim)
                rim = xre @ fim + xim @ fre
                rre, rim = h16(rre * twre - rim * twim), h16(rre * twim + rim * twre)
                sre = fbre @ rre + (-fbim) @ rim
                sim = fbre @ rim + fbim @ rre
                kre, kim = tile[h, 0][:, cols], tile[h, 1][:, cols]
                yre, yim = sre * kre - sim * kim, sre * kim + sim * kre
                chunk_scale = torch.maximum(yre.abs().max(), yim.abs().max())
                chunk_scale = torch.where(chunk_scale > 0, chunk_scale, 1.0)
                yre, yim = h16(yre / chunk_scale), h16(yim / chunk_scale)
                dre = fbre @ yre + fbim @ yim
                dim = fbre @ yim + (-fbim) @ yre
                dre, dim = dre * twre + dim * twim, dim * twre - dre * twim
                grown = torch.maximum(running, chunk_scale)
                alpha = running / grown
                running = grown
                ratio = chunk_scale / grown
                dre, dim = h16(dre * ratio), h16(dim * ratio)
                ore = ore * alpha + dre @ fre.T + dim @ fim.T
                oim = oim * alpha + dim @ fre.T + (-dre) @ fim.T
            for i, o in ((g, ore), (g + 1, oim)):
                if i < Bt:
                    o = o * (running * scale[i, h] / L)
                    o = torch.where(bad[i, h], float("nan"), o)
                    y[i, h] = o.transpose(0, 1).reshape(N).to(u.dtype)
    return y
