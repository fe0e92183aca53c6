"""Causal FFT convolution of one sequence per program, FlashFFTConv's way: the length-L DFT (L = 2N: u
zero-padded, so the circular convolution is the causal one) factored into DFT matrices applied with
tl.dot (Monarch / Cooley-Tukey with L = N1 N2),

    x[n1, n2] = x[N2 n1 + n2]
    X[k1 + N1 k2] = sum_n2 F_N2[n2, k2] * W_L^(n2 k1) * sum_n1 F_N1[k1, n1] x[n1, n2]

so the spectrum comes out as an N1 x N2 tile in the order f = k1 + N1 k2, multiplied there by the
filter's spectrum laid out the same way (launch.permuted_spectrum), and the inverse runs the steps
backwards with conjugate matrices. u is read once and y written once; only the first N1 / 2 rows of
x are nonzero (the padding) and only the first N outputs are needed, so the first and last products
are N1 x N1/2 and N1/2 x N1. Complex products are four real ones (re, im parts in float32).

On a GPU the float32 products run on tensor cores at PRECISION ("tf32x3": three TF32 products, about
float32's accuracy; "tf32": one, 2^-11 relative). The interpreter multiplies in float32.
"""
import triton
import triton.language as tl


@triton.jit
def _cdot(are, aim, bre, bim, PRECISION: tl.constexpr):
    """(are + i aim) @ (bre + i bim) in float32, as four real products."""
    re = tl.dot(are, bre, input_precision=PRECISION) - tl.dot(aim, bim, input_precision=PRECISION)
    im = tl.dot(are, bim, input_precision=PRECISION) + tl.dot(aim, bre, input_precision=PRECISION)
    return re, im


@triton.jit
def fft_conv_kernel(U, KRE, KIM, Y, F1RE, F1IM, F2RE, F2IM, TWRE, TWIM, heads,
                    stride_ub, stride_uh, stride_yb, stride_yh, stride_kh,
                    N1: tl.constexpr, N2: tl.constexpr, PRECISION: tl.constexpr):
    """Y[b, h, :N] = first N of IDFT_L(DFT_L(pad(U[b, h])) * K[h]) for program_id(0) = b * heads + h.

    U, Y: (B, H, N) rows, unit stride; N = N1 N2 / 2. KRE, KIM: (H, N1, N2) float32, the filter's
    spectrum at f = k1 + N1 k2 (conjugated for the backward). F1: (N1, N1) DFT matrix, F2: (N2, N2),
    TW: (N1, N2) twiddles W_L^(k1 n2); all float32, W = exp(-2 pi i / size)."""
    HALF: tl.constexpr = N1 // 2
    L: tl.constexpr = N1 * N2
    pid = tl.program_id(0)
    b = (pid // heads).to(tl.int64)
    h = (pid % heads).to(tl.int64)
    n1 = tl.arange(0, HALF)
    k1 = tl.arange(0, N1)
    c2 = tl.arange(0, N2)  # n2 or k2
    # x: [HALF, N2], the nonzero rows
    x = tl.load(U + b * stride_ub + h * stride_uh + (N2 * n1)[:, None] + c2[None, :]).to(tl.float32)
    # F_N1[:, :HALF]: [N1, HALF] (F_N1 is symmetric: its transpose is F_N1[:HALF, :] for the inverse)
    f1 = k1[:, None] * N1 + n1[None, :]
    f1re = tl.load(F1RE + f1)
    f1im = tl.load(F1IM + f1)
    tw = k1[:, None] * N2 + c2[None, :]
    twre = tl.load(TWRE + tw)
    twim = tl.load(TWIM + tw)
    f2 = c2[:, None] * N2 + c2[None, :]
    f2re = tl.load(F2RE + f2)
    f2im = tl.load(F2IM + f2)
    # forward DFT: the columns (x real: two products), twiddles, the rows
    are = tl.dot(f1re, x, input_precision=PRECISION)  # [N1, N2]
    aim = tl.dot(f1im, x, input_precision=PRECISION)
    bre = are * twre - aim * twim
    bim = are * twim + aim * twre
    xre, xim = _cdot(bre, bim, f2re, f2im, PRECISION)  # spectrum at f = k1 + N1 k2
    kre = tl.load(KRE + h * stride_kh + tw)
    kim = tl.load(KIM + h * stride_kh + tw)
    yre = xre * kre - xim * kim
    yim = xre * kim + xim * kre
    # inverse DFT: the rows by conj(F_N2), conjugate twiddles, the columns by conj(F_N1) (real part,
    # the first HALF rows: y's first N elements)
    cre, cim = _cdot(yre, yim, f2re, -f2im, PRECISION)
    dre = cre * twre + cim * twim
    dim = cim * twre - cre * twim
    y = tl.dot(tl.trans(f1re), dre, input_precision=PRECISION) + tl.dot(tl.trans(f1im), dim,
                                                                      input_precision=PRECISION)
    y = y * (1.0 / L)
    tl.store(Y + b * stride_yb + h * stride_yh + (N2 * n1)[:, None] + c2[None, :], y.to(Y.dtype.element_ty))
