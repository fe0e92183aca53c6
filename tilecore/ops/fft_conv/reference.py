"""Causal convolution in float64, plainly: the reference every result is compared with."""
from __future__ import annotations

import torch


def fft_conv_reference(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """y[b, h, n] = sum_{m <= n} u[b, h, m] k[h, n - m] for u (B, H, N) and k (H, Nk), Nk <= N (a
    shorter filter is zero past its end), in float64 (a float64 FFT of length 2N: error ~1e-15)."""
    n = u.shape[-1]
    size = 2 * n
    spectrum = torch.fft.rfft(u.double(), n=size) * torch.fft.rfft(k.double(), n=size)
    return torch.fft.irfft(spectrum, n=size)[..., :n]


def scaled_half_bins(spectrum: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the order-3 kernel's RFFT 4 reads, in torch: a complex64 spectrum (H, N + 1) as float16 (re, im) pairs over
    each channel's largest |re|, |im| (so no bin overflows float16: a bin of a channel whose taps sum past 65504 would)
    and those largest values (H,) float32 (1 where a channel's bins are all 0 or one is NaN, as where(amax > 0) gives;
    NaN stays NaN in the bins), the outputs times the channel's value. launch.scaled_half_bins makes the same bits by one
    kernel (tests compare them)."""
    pairs = torch.view_as_real(spectrum.resolve_conj())
    scale = pairs.abs().amax(dim=(1, 2))
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (pairs / scale[:, None, None]).to(torch.float16), scale


def fft_conv_direct(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The same sum computed term by term (small N only: tests check the FFT reference with it)."""
    n = u.shape[-1]
    kk = torch.zeros(k.shape[0], n, dtype=torch.float64)
    kk[:, :k.shape[-1]] = k.double()
    y = torch.zeros(u.shape, dtype=torch.float64)
    for m in range(n):
        y[..., m:] += u.double()[..., m:m + 1] * kk[:, :n - m]
    return y
