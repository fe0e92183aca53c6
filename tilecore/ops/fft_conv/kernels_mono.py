"""The one-pass FFT convolution with three DFT factors (order-3 Monarch), no transposes.

As kernels_pair.py, two sequences of a channel ride as one complex sequence z = u_a + i u_b and one
complex DFT of length L = 2N (u zero-padded) serves both. Here L = A B C (C = 1: order 2) and every stage
is a product over one axis of the pair's tile with no permute: only reshapes that keep the row-major
order of the elements. With n = B C a + C b + c and f = k_a + A k_b + A B k_c,

    W_L^(n f) = W_A^(a k_a) . W_AB^(b k_a) W_L^(c k_a) . W_B^(b k_b) . W_BC^(c k_b) . W_C^(c k_c)

so the forward DFT is, on tiles (M = B C):

    x[m, a] = z[M a + m]                       [M, A/2] (rows a >= A/2 are the zero padding: skipped)
    1. R = x @ F_A[:A/2, :]                    [M, A/2] @ [A/2, A]          -> [m = C b + c, k_a]
    2. R *= W_AB^(b k_a) W_L^(c k_a)           twiddles from two small tables ([B, A] and [C, A])
    3. S = F_B @ R.reshape(B, C A)             [B, B] @ [B, C A]            -> [k_b, (c, k_a)]
    4. S *= W_BC^(c k_b)                       (order 3)
    5. X = F_C @ S.reshape(B, C, A)            a product batched over k_b   -> [k_b, k_c, k_a]
    then Y = X K (the filter's spectrum gathered at f, bins past N the conjugates of L - f), and the
    inverse backwards with conjugates; its last product forms only the first A/2 columns (y's N
    outputs): y[M a + m] = (R' @ conj(F_A)[:, :A/2])[m, a] / L.

Products: float16 operands (DFT matrices 2^-12 relative), float32 sums; each sequence scaled by its
largest |u| at load, the spectrum product by its largest |Y| a pair (as kernels_pair.py: the tiles stay
in float16's range). FLOPs a pair: 8 L A + 16 L B + 16 L C (order 2 of the same L: 8 L A + 16 L B C).
A non-finite element of a sequence is zeroed for the transform and that sequence's outputs set to NaN.
"""
import triton
import triton.language as tl


@triton.jit
def _cdot(are, aim, bre, bim, CONJ_A: tl.constexpr, CONJ_B: tl.constexpr):
    """(are +- i aim) @ (bre +- i bim) (conjugates with CONJ_A / CONJ_B): float16 operands, float32 sums,
    four real products chained through the accumulator (two float32 tiles live, not four)."""
    if CONJ_A:
        if CONJ_B:  # conj(a) conj(b) = conj(a b)
            return tl.dot(are, bre, -tl.dot(aim, bim)), -tl.dot(are, bim, tl.dot(aim, bre))
        return tl.dot(are, bre, tl.dot(aim, bim)), tl.dot(are, bim, -tl.dot(aim, bre))
    if CONJ_B:
        return tl.dot(are, bre, tl.dot(aim, bim)), tl.dot(aim, bre, -tl.dot(are, bim))
    return tl.dot(are, bre, -tl.dot(aim, bim)), tl.dot(are, bim, tl.dot(aim, bre))


@triton.jit
def _cmul(are, aim, bre, bim, CONJ_B: tl.constexpr):
    """Elementwise (are + i aim)(bre +- i bim)."""
    if CONJ_B:
        return are * bre + aim * bim, aim * bre - are * bim
    return are * bre - aim * bim, are * bim + aim * bre


@triton.jit
def _load_half(ptr, b, batch, h, stride_b, stride_h, offsets, SCALED: tl.constexpr = True):
    """u[b, h, offsets] (b a scalar) as float32, non-finite elements zeroed, divided by its largest |u|;
    also (that scale, whether a non-finite element was there)."""
    x = tl.load(ptr + b.to(tl.int64) * stride_b + h * stride_h + offsets, mask=b < batch, other=0.0)
    x = x.to(tl.float32)
    if SCALED:
        finite = tl.abs(x) < float("inf")  # False for NaN and +-inf
        bad = tl.max(tl.max(tl.where(finite, 0, 1), axis=1), axis=0) > 0
        x = tl.where(finite, x, 0.0)
        scale = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
        scale = tl.where(scale > 0, scale, 1.0)
        x = x / scale
    else:  # (a timing probe: no reductions)
        bad = b < 0
        scale = tl.where(b < 0, 1.0, 1.0)
    return x, scale, bad


@triton.jit
def _square(PRE, PIM, SIZE: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, COL0: tl.constexpr):
    """P[:ROWS, COL0:COL0 + COLS] of a (SIZE, SIZE) table (re, im)."""
    idx = tl.arange(0, ROWS)[:, None] * SIZE + COL0 + tl.arange(0, COLS)[None, :]
    return tl.load(PRE + idx), tl.load(PIM + idx)


@triton.jit
def _stage2_twiddles(T1RE, T1IM, T2RE, T2IM, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr,
                     LOADED: tl.constexpr = True, FULL: tl.constexpr = False):
    """W_AB^(b k_a) W_L^(c k_a) on the tile [m = C b + c, k_a] (float32 re, im; not LOADED: 1, a probe;
    FULL: T1 is the whole (M, A) table W_L^(m k_a), read in order)."""
    r_m = tl.arange(0, B * C)
    r_a = tl.arange(0, A)
    t1 = (r_m // C)[:, None] * A + r_a[None, :]
    if not LOADED:
        return tl.where(t1 >= 0, 1.0, 1.0), tl.where(t1 >= 0, 0.0, 0.0)
    if FULL:
        t = r_m[:, None] * A + r_a[None, :]
        return tl.load(T1RE + t), tl.load(T1IM + t)
    twre = tl.load(T1RE + t1)
    twim = tl.load(T1IM + t1)
    if C > 1:
        t2 = (r_m % C)[:, None] * A + r_a[None, :]
        twre, twim = _cmul(twre, twim, tl.load(T2RE + t2), tl.load(T2IM + t2), False)
    return twre, twim


@triton.jit
def _stage4_twiddles(T3RE, T3IM, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr, LOADED: tl.constexpr = True):
    """W_BC^(c k_b) on the tile [k_b, c, k_a] (float32 re, im; not LOADED: 1, a probe)."""
    t3 = (tl.arange(0, B) * C)[:, None, None] + tl.arange(0, C)[None, :, None] + 0 * tl.arange(0, A)[None, None, :]
    if not LOADED:
        return tl.where(t3 >= 0, 1.0, 1.0), tl.where(t3 >= 0, 0.0, 0.0)
    return tl.load(T3RE + t3), tl.load(T3IM + t3)


@triton.jit
def fft_conv_mono_kernel(U, K, Y, FARE, FAIM, FBRE, FBIM, FCRE, FCIM, T1RE, T1IM, T2RE, T2IM, T3RE, T3IM,
                         batch, heads, stride_ub, stride_uh, stride_yb, stride_yh, stride_kh,
                         A: tl.constexpr, B: tl.constexpr, C: tl.constexpr, CONJ: tl.constexpr,
                         LOOP: tl.constexpr, STAGES: tl.constexpr = 1, PERMUTE: tl.constexpr = False,
                         PROBE: tl.constexpr = 0, KFULL: tl.constexpr = False):
    """Y[b, h, :N] = first N of IDFT_L(DFT_L(pad(U[b, h])) * K[h]) for the pairs (2g, 2g + 1) of channel h,
    g = LOOP c + i (i < LOOP), program_id(0) = h * chunks + c (a channel's programs adjacent: they read its
    spectrum from L2); the DFT matrices loaded once a program, the twiddles each pair (from L1); STAGES:
    the loop's software pipelining (1: none). PERMUTE: stage 5 (over the middle axis c) as a 2-D left
    product after a permute of the tile's first two axes (else a product batched over k_b).
    KFULL: T1 is the whole stage-2 table (M, A) = W_L^(m k_a) (launch.mono_operands' "TF"), and K the spectrum
    laid out as the tile, (heads, 2, L) float32 planes (re, im), conjugated
    with CONJ on the host (launch.mono_spectrum): contiguous loads, no bin arithmetic (sm_90a: the
    gather's per-element pointers and indices are what push the tile into spills).
    PROBE (timing probes of where the time goes, WRONG results; the plans never set it): a sum of 1 (the
    square products of stages 3 and 5 and their inverses left out), 2 (no scale reductions), 4 (no
    twiddle or spectrum loads: constants).

    U, Y: (batch, heads, N) rows, unit stride along N = A B C / 2. K: the filter's rfft (heads, N + 1)
    complex64 as float32 (re, im) pairs (torch.view_as_real), all conjugated with CONJ (the backward's
    correlation). FA (A, A), FB (B, B), FC (C, C): float16 DFT matrices (symmetric); T1 (B, A) = W_AB^(b k_a),
    T2 (C, A) = W_L^(c k_a), T3 (B, C) = W_BC^(c k_b): float32 twiddles; W_s = exp(-2 pi i / s). C = 1:
    order 2 (stages 4 and 5 and T2, T3 unused)."""
    HALF: tl.constexpr = A // 2
    M: tl.constexpr = B * C
    L: tl.constexpr = A * M
    groups = tl.cdiv(batch, 2)
    chunks = tl.cdiv(groups, LOOP)
    pid = tl.program_id(0)
    h = (pid // chunks).to(tl.int64)
    c0 = pid % chunks
    r_m = tl.arange(0, M)
    r_a = tl.arange(0, A)
    seq = (M * tl.arange(0, HALF))[None, :] + r_m[:, None]  # x[m, a] = z[M a + m]: [M, HALF]

    # the constants (small: loaded once a program)
    fa1re, fa1im = _square(FARE, FAIM, A, HALF, A, 0)  # F_A[:HALF, :]
    fa2re, fa2im = _square(FARE, FAIM, A, A, HALF, 0)  # F_A[:, :HALF] (conjugated in its product)
    fbre, fbim = _square(FBRE, FBIM, B, B, B, 0)
    if C > 1:
        fcre, fcim = _square(FCRE, FCIM, C, C, C, 0)
        if not PERMUTE:  # F_C for the product batched over k_b
            fcre = tl.broadcast_to(fcre[None, :, :], (B, C, C))
            fcim = tl.broadcast_to(fcim[None, :, :], (B, C, C))

    for i in tl.range(0, LOOP, num_stages=STAGES):
        b_re = 2 * (c0 * LOOP + i)
        b_im = b_re + 1
        xre, scale_re, bad_re = _load_half(U, b_re, batch, h, stride_ub, stride_uh, seq, (PROBE & 2) == 0)
        xim, scale_im, bad_im = _load_half(U, b_im, batch, h, stride_ub, stride_uh, seq, (PROBE & 2) == 0)
        # 1. over a: [M, HALF] @ F_A[:HALF, :] -> [M, A] (|.| <= HALF sqrt 2)
        rre, rim = _cdot(xre.to(tl.float16), xim.to(tl.float16), fa1re, fa1im, False, False)
        # 2. twiddles W_AB^(b k_a) W_L^(c k_a) [M, A], m = C b + c (tables from L1, not held across the
        # loop: registers); 3. over b: F_B @ [B, C A] (|.| <= HALF B sqrt 2)
        tw2re, tw2im = _stage2_twiddles(T1RE, T1IM, T2RE, T2IM, A, B, C, (PROBE & 4) == 0, KFULL)
        rre, rim = _cmul(rre, rim, tw2re, tw2im, False)
        if (PROBE & 1) == 0:
            sre, sim = _cdot(fbre, fbim, tl.reshape(rre, (B, C * A)).to(tl.float16),
                             tl.reshape(rim, (B, C * A)).to(tl.float16), False, False)
        else:
            sre, sim = tl.reshape(rre, (B, C * A)), tl.reshape(rim, (B, C * A))
        sre = tl.reshape(sre, (B, C, A))
        sim = tl.reshape(sim, (B, C, A))
        if C > 1:
            # 4. W_BC^(c k_b); 5. over c: F_C @ [C, A] batched over k_b (|.| <= HALF B C sqrt 2)
            tw3re, tw3im = _stage4_twiddles(T3RE, T3IM, A, B, C, (PROBE & 4) == 0)
            sre, sim = _cmul(sre, sim, tw3re, tw3im, False)
            if PROBE & 1:
                pass
            elif PERMUTE:  # [k_b, c, k_a] -> [c, (k_b, k_a)], a left product F_C @ -> [k_c, k_b, k_a]
                sre = tl.reshape(tl.permute(sre, (1, 0, 2)), (C, B * A)).to(tl.float16)
                sim = tl.reshape(tl.permute(sim, (1, 0, 2)), (C, B * A)).to(tl.float16)
                sre, sim = _cdot(fcre, fcim, sre, sim, False, False)
                sre = tl.reshape(sre, (C, B, A))
                sim = tl.reshape(sim, (C, B, A))
            else:
                sre, sim = _cdot(fcre, fcim, sre.to(tl.float16), sim.to(tl.float16), False, False)
        # the filter's spectrum at f = k_a + A k_b + A B k_c on the tile [k_b, k_c, k_a] ([B, 1, A] at
        # order 2; [k_c, k_b, k_a] with PERMUTE), bins past N the conjugates of L - f; then one scale a
        # pair for float16
        if PERMUTE and C > 1:
            f = (A * B * tl.arange(0, C))[:, None, None] + (A * tl.arange(0, B))[None, :, None] + r_a[None, None, :]
        else:
            f = (A * tl.arange(0, B))[:, None, None] + (A * B * tl.arange(0, C))[None, :, None] + r_a[None, None, :]
        mirrored = f > L // 2
        bin = tl.where(mirrored, L - f, f)
        flip = mirrored != CONJ
        if PROBE & 4:
            kre = tl.where(flip, 1.0, 1.0)
            kim = tl.where(flip, 0.0, 0.0)
        elif KFULL:  # the tile's elements in order: [B, C, A] (or [C, B, A]) flat
            flat = ((tl.arange(0, B) * C)[:, None, None] + tl.arange(0, C)[None, :, None]) * A + r_a[None, None, :]
            if PERMUTE and C > 1:
                flat = ((tl.arange(0, C) * B)[:, None, None] + tl.arange(0, B)[None, :, None]) * A + r_a[None, None, :]
            kre = tl.load(K + h * stride_kh + flat)
            kim = tl.load(K + h * stride_kh + L + flat)
        else:
            kre = tl.load(K + h * stride_kh + 2 * bin)
            kim = tl.load(K + h * stride_kh + 2 * bin + 1)
            kim = tl.where(flip, -kim, kim)
        yre, yim = _cmul(sre, sim, kre, kim, False)
        if PROBE & 2:
            spec_scale = scale_re
        else:
            spec_scale = tl.maximum(tl.max(tl.max(tl.max(tl.abs(yre), axis=2), axis=1), axis=0),
                                    tl.max(tl.max(tl.max(tl.abs(yim), axis=2), axis=1), axis=0))
            spec_scale = tl.where(spec_scale > 0, spec_scale, 1.0)  # (NaN stays NaN: a NaN filter's outputs)
        inv = 1.0 / spec_scale
        yre = yre * inv
        yim = yim * inv
        if C > 1:
            # 5'. over k_c: conj(F_C) @ ..., then conj(W_BC^(c k_b))
            if PROBE & 1:
                pass
            elif PERMUTE:  # [k_c, (k_b, k_a)] -> [c, k_b, k_a] -> [k_b, c, k_a]
                yre, yim = _cdot(fcre, fcim, tl.reshape(yre, (C, B * A)).to(tl.float16),
                                 tl.reshape(yim, (C, B * A)).to(tl.float16), True, False)
                yre = tl.permute(tl.reshape(yre, (C, B, A)), (1, 0, 2))
                yim = tl.permute(tl.reshape(yim, (C, B, A)), (1, 0, 2))
            else:
                yre, yim = _cdot(fcre, fcim, yre.to(tl.float16), yim.to(tl.float16), True, False)
            tw3re, tw3im = _stage4_twiddles(T3RE, T3IM, A, B, C, (PROBE & 4) == 0)
            yre, yim = _cmul(yre, yim, tw3re, tw3im, True)
        # 3'. over k_b: conj(F_B) @ [B, C A]; 2'. conjugate twiddles
        if (PROBE & 1) == 0:
            dre, dim = _cdot(fbre, fbim, tl.reshape(yre, (B, C * A)).to(tl.float16),
                             tl.reshape(yim, (B, C * A)).to(tl.float16), True, False)
        else:
            dre, dim = tl.reshape(yre, (B, C * A)), tl.reshape(yim, (B, C * A))
        tw2re, tw2im = _stage2_twiddles(T1RE, T1IM, T2RE, T2IM, A, B, C, (PROBE & 4) == 0, KFULL)
        dre, dim = _cmul(tl.reshape(dre, (M, A)), tl.reshape(dim, (M, A)), tw2re, tw2im, True)
        # 1'. over k_a, the first HALF outputs: [M, A] @ conj(F_A)[:, :HALF]
        ore, oim = _cdot(dre.to(tl.float16), dim.to(tl.float16), fa2re, fa2im, False, True)
        out_scale = spec_scale * (1.0 / L)
        ore = ore * (out_scale * scale_re)
        oim = oim * (out_scale * scale_im)
        ore = tl.where(bad_re, float("nan"), ore)
        oim = tl.where(bad_im, float("nan"), oim)
        ty = Y.dtype.element_ty
        tl.store(Y + b_re.to(tl.int64) * stride_yb + h * stride_yh + seq, ore.to(ty), mask=b_re < batch)
        tl.store(Y + b_im.to(tl.int64) * stride_yb + h * stride_yh + seq, oim.to(ty), mask=b_im < batch)
