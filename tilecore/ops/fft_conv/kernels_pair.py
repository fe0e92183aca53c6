"""The fast FFT convolution: two real sequences as one complex one, 16-bit DFT matrices on tensor cores.

Two sequences of the same channel h share the filter, so they ride as the real and imaginary parts of
one complex sequence z = u_a + i u_b: DFT(z) K = DFT(u_a) K + i DFT(u_b) K and, K being the spectrum of
a real filter, the inverse of that product is y_a + i y_b. One complex DFT of length L = 2N (u zero-
padded: the circular convolution is the causal one) then serves two real sequences, with no
post-processing (the real-input FFT at half length costs the same, plus an index reversal).

The DFT of length L = N1 N2 is Monarch / Cooley-Tukey as in kernels.py, written with every product as
a right multiplication (rows of tiles times a DFT matrix) so that S pairs stack into the rows of one
tl.dot:

    x[s, n2, n1] = z_s[N2 n1 + n2]                              n1 < N1/2 (the rest is the padding)
    a[s, n2, k1] = sum_n1 x[s, n2, n1] F_N1[n1, k1]              (S N2, N1/2) @ (N1/2, N1)
    b[s, k1, n2] = a[s, n2, k1] W_L^(k1 n2)                     (transposed: the next sum is over n2)
    X[s, k1, k2] = sum_n2 b[s, k1, n2] F_N2[n2, k2]              (S N1, N2) @ (N2, N2): X at f = k1 + N1 k2
    Y = X K                                                     (K laid out the same way: launch.py)
and backwards with conjugates; the last product forms only the first N1/2 columns (y's N outputs).

Precision: the DFT matrices are float16 (2^-12 relative), each tile is cast to float16 before its
product after a scale that keeps it in range: every sequence is divided by its largest |u| as it is
loaded (so the pair's two halves are on one scale, whatever their own), the spectrum product by its
largest |Y| per pair; the sums accumulate in float32 and the scales are undone on the way out. A
non-finite element of a sequence is zeroed for the transform and its sequence's outputs set to NaN
(as torch.fft's convolution gives it), so it does not reach the other half of the pair.
"""
import triton
import triton.language as tl


@triton.jit
def _cmul16(are, aim, bre, bim, CONJ_B: tl.constexpr):
    """(are + i aim) @ (bre +- i bim): float16 operands, float32 sums (four real products)."""
    rr = tl.dot(are, bre)
    ii = tl.dot(aim, bim)
    ri = tl.dot(are, bim)
    ir = tl.dot(aim, bre)
    if CONJ_B:
        return rr + ii, ir - ri
    return rr - ii, ri + ir


@triton.jit
def _amax3(x):
    """max |x| over the last two axes of x [S, R, C] -> [S]."""
    return tl.max(tl.max(tl.abs(x), axis=2), axis=1)


@triton.jit
def _load_sequence(ptr, b, batch, h, stride_b, stride_h, offsets):
    """One half of the pairs: u[b[s], h, offsets] as float32 [S, N2, HALF], its non-finite elements
    zeroed and each sequence divided by its largest |u|; also (the scale [S], whether the sequence had
    a non-finite element [S])."""
    valid = (b < batch)[:, None, None]
    row = b.to(tl.int64)[:, None, None] * stride_b + h * stride_h
    x = tl.load(ptr + row + offsets, mask=valid, other=0.0).to(tl.float32)
    finite = tl.abs(x) < float("inf")  # False for NaN and +-inf
    bad = tl.max(tl.max(tl.where(finite, 0, 1), axis=2), axis=1) > 0
    x = tl.where(finite, x, 0.0)
    scale = _amax3(x)
    scale = tl.where(scale > 0, scale, 1.0)
    return x / scale[:, None, None], scale, bad


@triton.jit
def _first_matrix(F1RE, F1IM, N1: tl.constexpr):
    """F_N1[:HALF, :] ([HALF, N1] float16 re, im)."""
    f1 = tl.arange(0, N1 // 2)[:, None] * N1 + tl.arange(0, N1)[None, :]
    return tl.load(F1RE + f1), tl.load(F1IM + f1)


@triton.jit
def _last_matrix(F1RE, F1IM, N1: tl.constexpr):
    """F_N1[:, :HALF] ([N1, HALF] float16 re, im; the product conjugates it)."""
    f1t = tl.arange(0, N1)[:, None] * N1 + tl.arange(0, N1 // 2)[None, :]
    return tl.load(F1RE + f1t), tl.load(F1IM + f1t)


@triton.jit
def _second_matrix(F2RE, F2IM, N2: tl.constexpr):
    """F_N2 ([N2, N2] float16 re, im)."""
    f2 = tl.arange(0, N2)[:, None] * N2 + tl.arange(0, N2)[None, :]
    return tl.load(F2RE + f2), tl.load(F2IM + f2)


@triton.jit
def _twiddles(TWRE, TWIM, N1: tl.constexpr, N2: tl.constexpr, TRANSPOSED: tl.constexpr):
    """W_L^(k1 n2) as [1, N1, N2] (the table's layout), or [1, N2, N1] with TRANSPOSED."""
    if TRANSPOSED:
        tw = tl.arange(0, N1)[None, :] * N2 + tl.arange(0, N2)[:, None]
    else:
        tw = tl.arange(0, N1)[:, None] * N2 + tl.arange(0, N2)[None, :]
    return tl.load(TWRE + tw)[None, :, :], tl.load(TWIM + tw)[None, :, :]


@triton.jit
def _spectrum(K, h, stride_kh, N1: tl.constexpr, N2: tl.constexpr, CONJ: tl.constexpr):
    """The filter's spectrum at f = k1 + N1 k2 as [1, N1, N2] (re, im), bins past N the conjugates of
    L - f, all conjugated with CONJ."""
    L: tl.constexpr = N1 * N2
    f = tl.arange(0, N1)[:, None] + N1 * tl.arange(0, N2)[None, :]
    mirrored = f > L // 2
    bin = tl.where(mirrored, L - f, f)
    kre = tl.load(K + h * stride_kh + 2 * bin)
    kim = tl.load(K + h * stride_kh + 2 * bin + 1)
    return kre[None, :, :], tl.where(mirrored != CONJ, -kim, kim)[None, :, :]


@triton.jit
def fft_conv_pair_kernel(U, K, Y, F1RE, F1IM, F2RE, F2IM, TWRE, TWIM, batch, heads,
                         stride_ub, stride_uh, stride_yb, stride_yh, stride_kh,
                         N1: tl.constexpr, N2: tl.constexpr, PAIRS: tl.constexpr, CONJ: tl.constexpr,
                         LOOP: tl.constexpr = 1, STAGES: tl.constexpr = 1, HOIST: tl.constexpr = False):
    """Y[b, h, :N] = first N of IDFT_L(DFT_L(pad(U[b, h])) * K[h]) for the 2 PAIRS sequences
    b = g 2 PAIRS + j (j < 2 PAIRS, b < batch) of channel h, for the LOOP groups g = LOOP c + i
    (i < LOOP) of program_id(0) = h * chunks + c (the programs of one channel adjacent: they read the
    same spectrum from L2). STAGES: the loop's software pipelining; HOIST: the DFT matrices, the
    twiddles and the channel's spectrum loaded once for the LOOP groups (else each group loads them,
    after the first from L1, as the kernel without a loop did).

    U, Y: (batch, heads, N) rows, unit stride, N = N1 N2 / 2. K: the filter's rfft (heads, N + 1)
    complex64 as float32 (re, im) pairs (torch.view_as_real), read at f = k1 + N1 k2 (bins past N as
    the conjugates of L - f; all conjugated with CONJ, the backward's correlation). F1: (N1, N1), F2: (N2, N2)
    float16 DFT matrices; TW: (N1, N2) float32 twiddles W_L^(k1 n2); W = exp(-2 pi i / size)."""
    HALF: tl.constexpr = N1 // 2
    L: tl.constexpr = N1 * N2
    groups = tl.cdiv(batch, 2 * PAIRS)
    chunks = tl.cdiv(groups, LOOP)
    pid = tl.program_id(0)
    h = (pid // chunks).to(tl.int64)
    c = pid % chunks
    s = tl.arange(0, PAIRS)
    r_n2 = tl.arange(0, N2)
    c_half = tl.arange(0, HALF)
    r_n1 = tl.arange(0, N1)
    # x[s, n2, n1] = u[N2 n1 + n2]: [PAIRS, N2, HALF]
    seq = (N2 * c_half)[None, None, :] + r_n2[None, :, None]
    if HOIST:  # once for the LOOP groups (live across the loop: more registers)
        f1re, f1im = _first_matrix(F1RE, F1IM, N1)
        twre_t, twim_t = _twiddles(TWRE, TWIM, N1, N2, True)
        f2re, f2im = _second_matrix(F2RE, F2IM, N2)
        kre, kim = _spectrum(K, h, stride_kh, N1, N2, CONJ)
        twre, twim = _twiddles(TWRE, TWIM, N1, N2, False)
        f1tre, f1tim = _last_matrix(F1RE, F1IM, N1)
    for i in tl.range(0, LOOP, num_stages=STAGES):
        g = c * LOOP + i
        b_re = g * 2 * PAIRS + s  # the pair's real half
        b_im = b_re + PAIRS  # and its imaginary half
        xre, scale_re, bad_re = _load_sequence(U, b_re, batch, h, stride_ub, stride_uh, seq)
        xim, scale_im, bad_im = _load_sequence(U, b_im, batch, h, stride_ub, stride_uh, seq)

        # (without HOIST each constant is loaded where it is first used, again each group: from L1 after
        # the first; fewer registers live across the chain)
        # forward, first stage: a = x @ F_N1[:HALF, :]  ([PAIRS N2, HALF] @ [HALF, N1])
        if not HOIST:
            f1re, f1im = _first_matrix(F1RE, F1IM, N1)
        are, aim = _cmul16(tl.reshape(xre, (PAIRS * N2, HALF)).to(tl.float16),
                           tl.reshape(xim, (PAIRS * N2, HALF)).to(tl.float16), f1re, f1im, False)
        are = tl.reshape(are, (PAIRS, N2, N1))
        aim = tl.reshape(aim, (PAIRS, N2, N1))
        if not HOIST:
            twre_t, twim_t = _twiddles(TWRE, TWIM, N1, N2, True)
        bre = are * twre_t - aim * twim_t  # |b| <= HALF sqrt(2): float16 holds it
        bim = are * twim_t + aim * twre_t
        # second stage over n2: [PAIRS N1, N2] @ F_N2
        bre = tl.reshape(tl.permute(bre, (0, 2, 1)), (PAIRS * N1, N2)).to(tl.float16)
        bim = tl.reshape(tl.permute(bim, (0, 2, 1)), (PAIRS * N1, N2)).to(tl.float16)
        if not HOIST:
            f2re, f2im = _second_matrix(F2RE, F2IM, N2)
        xre_f, xim_f = _cmul16(bre, bim, f2re, f2im, False)
        xre_f = tl.reshape(xre_f, (PAIRS, N1, N2))
        xim_f = tl.reshape(xim_f, (PAIRS, N1, N2))

        # the product with the filter's spectrum, then a scale per pair for float16
        if not HOIST:
            kre, kim = _spectrum(K, h, stride_kh, N1, N2, CONJ)
        yre = xre_f * kre - xim_f * kim
        yim = xre_f * kim + xim_f * kre
        spec_scale = tl.maximum(_amax3(yre), _amax3(yim))
        spec_scale = tl.where(spec_scale > 0, spec_scale, 1.0)  # (NaN stays NaN: a NaN filter's outputs)
        inv = (1.0 / spec_scale)[:, None, None]
        yre = tl.reshape(yre * inv, (PAIRS * N1, N2)).to(tl.float16)
        yim = tl.reshape(yim * inv, (PAIRS * N1, N2)).to(tl.float16)

        # inverse, second stage: c = y @ conj(F_N2) ([PAIRS N1, N2]), conjugate twiddles
        cre, cim = _cmul16(yre, yim, f2re, f2im, True)
        cre = tl.reshape(cre, (PAIRS, N1, N2))
        cim = tl.reshape(cim, (PAIRS, N1, N2))
        if not HOIST:
            twre, twim = _twiddles(TWRE, TWIM, N1, N2, False)
        dre = cre * twre + cim * twim  # |d| <= N2 sqrt(2)
        dim = cim * twre - cre * twim
        # inverse, first stage over k1, the first HALF outputs: [PAIRS N2, N1] @ conj(F_N1)[:, :HALF]
        dre = tl.reshape(tl.permute(dre, (0, 2, 1)), (PAIRS * N2, N1)).to(tl.float16)
        dim = tl.reshape(tl.permute(dim, (0, 2, 1)), (PAIRS * N2, N1)).to(tl.float16)
        if not HOIST:
            f1tre, f1tim = _last_matrix(F1RE, F1IM, N1)
        ore, oim = _cmul16(dre, dim, f1tre, f1tim, True)
        ore = tl.reshape(ore, (PAIRS, N2, HALF))
        oim = tl.reshape(oim, (PAIRS, N2, HALF))

        out_scale = spec_scale * (1.0 / L)
        ore = ore * (out_scale * scale_re)[:, None, None]
        oim = oim * (out_scale * scale_im)[:, None, None]
        ore = tl.where(bad_re[:, None, None], float("nan"), ore)
        oim = tl.where(bad_im[:, None, None], float("nan"), oim)
        ty = Y.dtype.element_ty
        y_re = b_re.to(tl.int64)[:, None, None] * stride_yb + h * stride_yh + seq
        y_im = b_im.to(tl.int64)[:, None, None] * stride_yb + h * stride_yh + seq
        tl.store(Y + y_re, ore.to(ty), mask=(b_re < batch)[:, None, None])
        tl.store(Y + y_im, oim.to(ty), mask=(b_im < batch)[:, None, None])


@triton.jit
def _conj_cmul16(are, aim, bre, bim):
    """conj(are + i aim) @ (bre + i bim): float16 operands, float32 sums."""
    rr = tl.dot(are, bre)
    ii = tl.dot(aim, bim)
    ri = tl.dot(are, bim)
    ir = tl.dot(aim, bre)
    return rr + ii, ri - ir


@triton.jit
def _load_sequence_2d(ptr, b, batch, h, stride_b, stride_h, offsets):
    """_load_sequence for one sequence b (a scalar) and 2-D offsets: (x [N2, HALF] float16, scale, bad)."""
    x = tl.load(ptr + b.to(tl.int64) * stride_b + h * stride_h + offsets, mask=b < batch, other=0.0)
    x = x.to(tl.float32)
    finite = tl.abs(x) < float("inf")
    bad = tl.max(tl.max(tl.where(finite, 0, 1), axis=1), axis=0) > 0
    x = tl.where(finite, x, 0.0)
    scale = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
    scale = tl.where(scale > 0, scale, 1.0)
    return (x / scale).to(tl.float16), scale, bad


@triton.jit
def fft_conv_pair1_kernel(U, K, Y, F1RE, F1IM, F2RE, F2IM, TWRE, TWIM, batch, heads,
                          stride_ub, stride_uh, stride_yb, stride_yh, stride_kh,
                          N1: tl.constexpr, N2: tl.constexpr, CONJ: tl.constexpr):
    """fft_conv_pair_kernel for one pair a program, with no transposes: the second stage and its
    inverse are left products (F_N2 @ b, conj(F_N2) @ Y) on the [N2, N1] tile the first stage leaves,
    so no tile is permuted (the permute + reshape + dot chains of the PAIRS kernel hit illegal memory
    accesses and wrong results at some N1 x N2 on the H200 under Triton 3.6: notes/fft_conv), and one
    [N2, N1] twiddle tile serves both directions. Arguments as fft_conv_pair_kernel's (PAIRS = 1)."""
    HALF: tl.constexpr = N1 // 2
    L: tl.constexpr = N1 * N2
    groups = tl.cdiv(batch, 2)
    pid = tl.program_id(0)
    h = (pid // groups).to(tl.int64)
    b_re = 2 * (pid % groups)
    b_im = b_re + 1
    r_n2 = tl.arange(0, N2)
    c_half = tl.arange(0, HALF)
    r_n1 = tl.arange(0, N1)
    # x[n2, n1] = u[N2 n1 + n2]: [N2, HALF]
    seq = (N2 * c_half)[None, :] + r_n2[:, None]
    xre, scale_re, bad_re = _load_sequence_2d(U, b_re, batch, h, stride_ub, stride_uh, seq)
    xim, scale_im, bad_im = _load_sequence_2d(U, b_im, batch, h, stride_ub, stride_uh, seq)
    # first stage: a = x @ F_N1[:HALF, :] ([N2, HALF] @ [HALF, N1]), twiddles W_L^(k1 n2)
    f1 = c_half[:, None] * N1 + r_n1[None, :]
    are, aim = _cmul16(xre, xim, tl.load(F1RE + f1), tl.load(F1IM + f1), False)
    tw = r_n1[None, :] * N2 + r_n2[:, None]  # [N2, N1]
    twre = tl.load(TWRE + tw)
    twim = tl.load(TWIM + tw)
    bre = (are * twre - aim * twim).to(tl.float16)  # |b| <= HALF sqrt(2)
    bim = (are * twim + aim * twre).to(tl.float16)
    # second stage over n2, a left product: X[k2, k1] = F_N2 @ b (F_N2 symmetric)
    f2 = r_n2[:, None] * N2 + r_n2[None, :]
    f2re = tl.load(F2RE + f2)
    f2im = tl.load(F2IM + f2)
    xre_f, xim_f = _cmul16(f2re, f2im, bre, bim, False)  # [N2, N1], f = k1 + N1 k2
    f = r_n1[None, :] + N1 * r_n2[:, None]
    mirrored = f > L // 2
    bin = tl.where(mirrored, L - f, f)
    kre = tl.load(K + h * stride_kh + 2 * bin)
    kim = tl.load(K + h * stride_kh + 2 * bin + 1)
    kim = tl.where(mirrored != CONJ, -kim, kim)
    yre = xre_f * kre - xim_f * kim
    yim = xre_f * kim + xim_f * kre
    spec_scale = tl.maximum(tl.max(tl.max(tl.abs(yre), axis=1), axis=0),
                            tl.max(tl.max(tl.abs(yim), axis=1), axis=0))
    spec_scale = tl.where(spec_scale > 0, spec_scale, 1.0)
    inv = 1.0 / spec_scale
    # inverse second stage: C[n2, k1] = conj(F_N2) @ Y, conjugate twiddles
    cre, cim = _conj_cmul16(f2re, f2im, (yre * inv).to(tl.float16), (yim * inv).to(tl.float16))
    dre = (cre * twre + cim * twim).to(tl.float16)  # |d| <= N2 sqrt(2)
    dim = (cim * twre - cre * twim).to(tl.float16)
    # inverse first stage, the first HALF outputs: [N2, N1] @ conj(F_N1)[:, :HALF]
    f1t = r_n1[:, None] * N1 + c_half[None, :]
    ore, oim = _cmul16(dre, dim, tl.load(F1RE + f1t), tl.load(F1IM + f1t), True)
    ore = ore * (spec_scale * (1.0 / L) * scale_re)
    oim = oim * (spec_scale * (1.0 / L) * scale_im)
    ore = tl.where(bad_re, float("nan"), ore)
    oim = tl.where(bad_im, float("nan"), oim)
    ty = Y.dtype.element_ty
    tl.store(Y + b_re.to(tl.int64) * stride_yb + h * stride_yh + seq, ore.to(ty), mask=b_re < batch)
    tl.store(Y + b_im.to(tl.int64) * stride_yb + h * stride_yh + seq, oim.to(ty), mask=b_im < batch)


@triton.jit
def _pair_spectrum(xre, xim, f1re, f1im, twre_t, twim_t, f2re, f2im, N1: tl.constexpr, N2: tl.constexpr):
    """The forward DFT of the pair x [N2, HALF] (x[n2, n1] = z[N2 n1 + n2], already scaled, float32):
    X [N1, N2] float32 (re, im) at f = k1 + N1 k2 (fft_conv_pair_kernel's first two stages)."""
    are, aim = _cmul16(xre.to(tl.float16), xim.to(tl.float16), f1re, f1im, False)  # [N2, N1]
    bre = are * twre_t - aim * twim_t
    bim = are * twim_t + aim * twre_t
    bre = tl.permute(bre, (1, 0)).to(tl.float16)  # [N1, N2]
    bim = tl.permute(bim, (1, 0)).to(tl.float16)
    return _cmul16(bre, bim, f2re, f2im, False)


@triton.jit
def fft_conv_dk_pair_kernel(U, DY, P, F1RE, F1IM, F2RE, F2IM, TWRE, TWIM, batch, heads,
                            stride_ub, stride_uh, stride_db, stride_dh,
                            N1: tl.constexpr, N2: tl.constexpr, LOOP: tl.constexpr):
    """The filter's gradient in the frequency domain, summed over the batch: for the pairs g = LOOP c + i
    (i < LOOP) of channel h (program_id(0) = h * chunks + c), P[program_id(0)] = sum over its pairs of
    c_g DFT(z_dy) conj(DFT(z_u)), (2, N1, N2) float32 (re, im) at f = k1 + N1 k2, where z_u = u_a / a
    + i u_b / b and z_dy = dy_a t_a + i dy_b t_b, the scales chosen so that both halves weigh 1 / c_g.

    Why it works: for real sequences the cross terms of Z_dy conj(Z_u) (i (DY_b conj U_a - DY_a conj U_b))
    are anti-Hermitian, so its Hermitian part is DY_a conj U_a + DY_b conj U_b: dk = the real part of
    IDFT(sum P), its first filter_len elements (launch.dk_pair), no index reversal. A non-finite element
    in any sequence makes the program's P NaN (as torch.fft's dk: every element of its channel)."""
    HALF: tl.constexpr = N1 // 2
    groups = tl.cdiv(batch, 2)
    chunks = tl.cdiv(groups, LOOP)
    pid = tl.program_id(0)
    h = (pid // chunks).to(tl.int64)
    c = pid % chunks
    zero = tl.zeros([1], dtype=tl.int32)  # b as a [1] vector: _load_sequence's [S] pairs, S = 1
    r_n2 = tl.arange(0, N2)
    c_half = tl.arange(0, HALF)
    r_n1 = tl.arange(0, N1)
    seq = (N2 * c_half)[None, None, :] + r_n2[None, :, None]  # [1, N2, HALF]
    f1re, f1im = _first_matrix(F1RE, F1IM, N1)
    twre_t, twim_t = _twiddles(TWRE, TWIM, N1, N2, True)
    f2re, f2im = _second_matrix(F2RE, F2IM, N2)
    twre_t = tl.reshape(twre_t, (N2, N1))
    twim_t = tl.reshape(twim_t, (N2, N1))
    acc_re = tl.zeros([N1, N2], dtype=tl.float32)
    acc_im = tl.zeros([N1, N2], dtype=tl.float32)
    bad = tl.zeros([1], dtype=tl.int1)
    for i in range(LOOP):
        b_a = 2 * (c * LOOP + i) + zero
        b_b = b_a + 1
        ua, sa, bad_ua = _load_sequence(U, b_a, batch, h, stride_ub, stride_uh, seq)
        ub, sb, bad_ub = _load_sequence(U, b_b, batch, h, stride_ub, stride_uh, seq)
        da, ta, bad_da = _load_sequence(DY, b_a, batch, h, stride_db, stride_dh, seq)
        db, tb, bad_db = _load_sequence(DY, b_b, batch, h, stride_db, stride_dh, seq)
        bad = bad | bad_ua | bad_ub | bad_da | bad_db
        # both halves' products weigh 1 / weight: dy's halves rescaled by (their scales) / weight <= 1
        wa = sa * ta
        wb = sb * tb
        weight = tl.maximum(wa, wb)
        da = da * (wa / weight)[:, None, None]
        db = db * (wb / weight)[:, None, None]
        xre, xim = _pair_spectrum(tl.reshape(ua, (N2, HALF)), tl.reshape(ub, (N2, HALF)), f1re, f1im, twre_t,
                                  twim_t, f2re, f2im, N1, N2)
        yre, yim = _pair_spectrum(tl.reshape(da, (N2, HALF)), tl.reshape(db, (N2, HALF)), f1re, f1im, twre_t,
                                  twim_t, f2re, f2im, N1, N2)
        w = tl.reshape(weight, (1, 1))
        acc_re += (yre * xre + yim * xim) * w  # Y conj(X)
        acc_im += (yim * xre - yre * xim) * w
    nan = tl.reshape(bad, (1, 1))
    acc_re = tl.where(nan, float("nan"), acc_re)
    acc_im = tl.where(nan, float("nan"), acc_im)
    out = r_n1[:, None] * N2 + r_n2[None, :]
    base = P + pid.to(tl.int64) * (2 * N1 * N2)
    tl.store(base + out, acc_re)
    tl.store(base + N1 * N2 + out, acc_im)
