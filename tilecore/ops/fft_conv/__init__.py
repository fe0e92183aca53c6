"""Causal FFT long convolution (Hyena / M2 style): a Monarch-factored DFT in one Triton kernel, torch.fft
elsewhere."""
from tilecore.ops.fft_conv.op import fft_conv, filter_spectrum
from tilecore.ops.fft_conv.reference import fft_conv_reference

__all__ = ["fft_conv", "filter_spectrum", "fft_conv_reference"]
