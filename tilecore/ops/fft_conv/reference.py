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


def fft_conv_direct(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The same sum computed term by term (small N only: tests check the FFT reference with it)."""
    n = u.shape[-1]
    kk = torch.zeros(k.shape[0], n, dtype=torch.float64)
    kk[:, :k.shape[-1]] = k.double()
    y = torch.zeros(u.shape, dtype=torch.float64)
    for m in range(n):
        y[..., m:] += u.double()[..., m:m + 1] * kk[:, :n - m]
    return y
