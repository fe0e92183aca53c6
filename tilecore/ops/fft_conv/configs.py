"""The FFT convolution's tables (plan.py reads them). Not yet timed on a GPU: notes/fft_conv/README.md."""
from __future__ import annotations

# N (the sequence; the DFT is 2N long) -> (N1, N2), 2N = N1 N2: the tl kernel's factors. N1 >= 32 so
# that its first product (N1 x N1/2) has the 16-wide inner dimension tl.dot needs. The whole sequence
# is one program's registers (the N1 x N2 complex tiles and the N2 x N2 DFT matrices as operands): at
# N = 2048 (64 x 64) that spilled 1.7 KB (tf32x3, 8 warps; 0.6 KB at tf32; more warps cap the
# registers lower and spill more: report.py), so 2048 and up run torch.fft (plan.py) until a kernel
# that streams the matrices through shared memory. (64, 64) for 2048 is correct in the interpreter.
TL_FACTORS = {256: (32, 16), 512: (32, 32), 1024: (32, 64)}

# warps per program by N (1024: 170-255 registers, 0-8 bytes of spill)
TL_WARPS = {256: 4, 512: 4, 1024: 8}

# tensor-core precision of the kernel's float32 products on a GPU ("tf32x3": about float32's accuracy)
TL_PRECISION = "tf32x3"
