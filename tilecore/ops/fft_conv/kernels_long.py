"""The pair kernel's method for long sequences (N = 8192, 16384), in three passes through a float16
scratch: the whole length-L sequence of a pair no longer fits one program's registers.

L = 2N = N1 N2 as in kernels_pair.py (x[n1, n2] = z[N2 n1 + n2], z = u_a + i u_b the pair of sequences
of one channel), one pass per DFT stage that needs all of a dimension:

1. columns (a program a pair): each sequence divided by its largest |u| (a first loop over it finds
   that, and whether it holds a non-finite element), then for blocks of BN columns n2
   a[n2, k1] = sum_n1 x[n1, n2] F_N1[n1, k1] W_L^(k1 n2), stored as A[q, k1, n2] (|a| <= N1/2 sqrt(2)).
2. rows (a program BK1 rows k1 of a pair): X = A F_N2, Y = X K (K at f = k1 + N1 k2), each row
   divided by its largest |Y| (kept in RSCALE), then D = (Y conj(F_N2)) conj(W_L^(k1 n2)), stored in
   place of A (|D| <= N2 sqrt(2)).
3. inverse columns (a program BN columns of a pair): y[N2 n1 + n2] = sum_k1 D[k1, n2] RSCALE[k1]
   conj(F_N1)[k1, n1] for n1 < N1/2, the rows' scales as a fraction of their largest (so float16
   holds them), the contraction over k1 in chunks of KC (the DFT matrices as wgmma's shared-memory
   operand: a 256 x 256 complex float16 pair would not fit).

GAUSS: each complex product in three real ones (a quarter fewer tensor-core FLOPs; these passes are
compute-bound at 8192 and 16384), its operand sums rounded to float16 once more.

HBM traffic a pair: u and y (2 L bytes each in 16 bits) and the scratch written and read twice
(4 L bytes each way, twice): 20 L bytes against the 4 L of one pass.
"""
import triton
import triton.language as tl

from tilecore.ops.fft_conv.kernels_pair import _cmul16


@triton.jit
def _cmul16_gauss(are, aim, bre, bim, CONJ_B: tl.constexpr):
    """_cmul16 in three real products (Gauss): t1 = (Ar + Ai) Br, t2 = Ar (Bi - Br), t3 = Ai (Br + Bi),
    re = t1 - t3, im = t1 + t2 (B conjugated with CONJ_B). The sums are rounded to float16 once more."""
    if CONJ_B:
        bim = -bim
    br = bre.to(tl.float32)
    bi = bim.to(tl.float32)
    t1 = tl.dot((are.to(tl.float32) + aim.to(tl.float32)).to(tl.float16), bre)
    t2 = tl.dot(are, (bi - br).to(tl.float16))
    t3 = tl.dot(aim, (br + bi).to(tl.float16))
    return t1 - t3, t1 + t2


@triton.jit
def _cmul(are, aim, bre, bim, CONJ_B: tl.constexpr, GAUSS: tl.constexpr):
    if GAUSS:
        return _cmul16_gauss(are, aim, bre, bim, CONJ_B)
    return _cmul16(are, aim, bre, bim, CONJ_B)


@triton.jit
def _pair_of(q, batch):
    """The pair q = h * groups + g: (h, b of the real half, b of the imaginary half)."""
    groups = tl.cdiv(batch, 2)
    h = (q // groups).to(tl.int64)
    b_re = 2 * (q % groups)
    return h, b_re, b_re + 1


@triton.jit
def _sequence_scale(U, b, batch, h, stride_ub, stride_uh, N: tl.constexpr, CH: tl.constexpr):
    """The largest |u| of sequence (b, h) (1 where it is 0), NaN where it holds a non-finite element."""
    base = U + b.to(tl.int64) * stride_ub + h * stride_uh
    amax = tl.zeros([CH], dtype=tl.float32)
    bad = tl.zeros([CH], dtype=tl.int32)
    for start in range(0, N, CH):
        x = tl.load(base + start + tl.arange(0, CH), mask=b < batch, other=0.0).to(tl.float32)
        finite = tl.abs(x) < float("inf")
        bad = tl.maximum(bad, tl.where(finite, 0, 1))
        amax = tl.maximum(amax, tl.where(finite, tl.abs(x), 0.0))
    scale = tl.max(amax, axis=0)
    scale = tl.where(scale > 0, scale, 1.0)
    return tl.where(tl.max(bad, axis=0) > 0, float("nan"), scale)


@triton.jit
def _load_columns(U, b, batch, h, stride_ub, stride_uh, offsets, scale):
    """u[b, h, offsets] / scale as float16 (non-finite elements zeroed: the scale marks them)."""
    x = tl.load(U + b.to(tl.int64) * stride_ub + h * stride_uh + offsets, mask=b < batch, other=0.0)
    x = x.to(tl.float32)
    x = tl.where(tl.abs(x) < float("inf"), x, 0.0)
    safe = tl.where(scale == scale, scale, 1.0)
    return (x / safe).to(tl.float16)


@triton.jit
def long_columns_kernel(U, A, SCALE, F1RE, F1IM, TWRE, TWIM, batch, stride_ub, stride_uh,
                        N1: tl.constexpr, N2: tl.constexpr, BN: tl.constexpr, KC: tl.constexpr,
                        CH: tl.constexpr, GAUSS: tl.constexpr = False):
    """Pass 1 for the pair q = program_id(0): A[q, (re, im), k1, n2] float16 (Q, 2, N1, N2),
    SCALE[q, (re half, im half)] float32 (NaN: the sequence holds a non-finite element)."""
    HALF: tl.constexpr = N1 // 2
    L: tl.constexpr = N1 * N2
    q = tl.program_id(0)
    h, b_re, b_im = _pair_of(q, batch)
    scale_re = _sequence_scale(U, b_re, batch, h, stride_ub, stride_uh, L // 2, CH)
    scale_im = _sequence_scale(U, b_im, batch, h, stride_ub, stride_uh, L // 2, CH)
    tl.store(SCALE + 2 * q, scale_re)
    tl.store(SCALE + 2 * q + 1, scale_im)
    n1 = tl.arange(0, HALF)
    a_base = A + q.to(tl.int64) * (2 * L)
    for c in tl.range(0, N2, BN, num_stages=1):  # (pipelined, it asked 480 KiB of shared memory at 16384)
        n2 = c + tl.arange(0, BN)
        seq = n2[:, None] + (N2 * n1)[None, :]  # x[n2, n1]: [BN, HALF]
        xre = _load_columns(U, b_re, batch, h, stride_ub, stride_uh, seq, scale_re)
        xim = _load_columns(U, b_im, batch, h, stride_ub, stride_uh, seq, scale_im)
        for kc in tl.static_range(N1 // KC):
            k1 = kc * KC + tl.arange(0, KC)
            f1 = n1[:, None] * N1 + k1[None, :]  # F_N1[n1, k1]: [HALF, KC]
            are, aim = _cmul(xre, xim, tl.load(F1RE + f1), tl.load(F1IM + f1), False, GAUSS)  # [BN, KC]
            tw = k1[None, :] * N2 + n2[:, None]  # W_L^(k1 n2): [BN, KC]
            twre = tl.load(TWRE + tw)
            twim = tl.load(TWIM + tw)
            tl.store(a_base + tw, (are * twre - aim * twim).to(tl.float16))
            tl.store(a_base + L + tw, (are * twim + aim * twre).to(tl.float16))


@triton.jit
def long_rows_kernel(A, RSCALE, K, F2RE, F2IM, TWRE, TWIM, batch, stride_kh,
                     N1: tl.constexpr, N2: tl.constexpr, BK1: tl.constexpr, CONJ: tl.constexpr,
                     GAUSS: tl.constexpr = False):
    """Pass 2 for rows k1 in [BK1 program_id(1), + BK1) of pair q = program_id(0): A's rows become D's
    (in place), RSCALE[q, k1] float32 (Q, N1) their scales. K: (heads, N + 1) complex64 as float32
    pairs, conjugated with CONJ (the backward)."""
    L: tl.constexpr = N1 * N2
    q = tl.program_id(0)
    h, b_re, b_im = _pair_of(q, batch)
    k1 = tl.program_id(1) * BK1 + tl.arange(0, BK1)
    c2 = tl.arange(0, N2)  # n2 or k2
    rows = k1[:, None] * N2 + c2[None, :]  # [BK1, N2]
    a_base = A + q.to(tl.int64) * (2 * L)
    are = tl.load(a_base + rows)
    aim = tl.load(a_base + L + rows)
    f2 = c2[:, None] * N2 + c2[None, :]
    f2re = tl.load(F2RE + f2)
    f2im = tl.load(F2IM + f2)
    xre, xim = _cmul(are, aim, f2re, f2im, False, GAUSS)  # X[k1, k2], f = k1 + N1 k2
    f = k1[:, None] + N1 * c2[None, :]
    mirrored = f > L // 2
    bin = tl.where(mirrored, L - f, f)
    kre = tl.load(K + h * stride_kh + 2 * bin)
    kim = tl.load(K + h * stride_kh + 2 * bin + 1)
    kim = tl.where(mirrored != CONJ, -kim, kim)
    yre = xre * kre - xim * kim
    yim = xre * kim + xim * kre
    scale = tl.maximum(tl.max(tl.abs(yre), axis=1), tl.max(tl.abs(yim), axis=1))
    scale = tl.where(scale > 0, scale, 1.0)
    tl.store(RSCALE + q.to(tl.int64) * N1 + k1, scale)
    inv = (1.0 / scale)[:, None]
    cre, cim = _cmul((yre * inv).to(tl.float16), (yim * inv).to(tl.float16), f2re, f2im, True, GAUSS)
    twre = tl.load(TWRE + rows)
    twim = tl.load(TWIM + rows)
    tl.store(a_base + rows, (cre * twre + cim * twim).to(tl.float16))
    tl.store(a_base + L + rows, (cim * twre - cre * twim).to(tl.float16))


@triton.jit
def long_inverse_columns_kernel(A, RSCALE, SCALE, Y, F1RE, F1IM, batch, stride_yb, stride_yh,
                                N1: tl.constexpr, N2: tl.constexpr, BN: tl.constexpr, KC: tl.constexpr,
                                GAUSS: tl.constexpr = False):
    """Pass 3 for columns n2 in [BN program_id(1), + BN) of pair q = program_id(0): y's elements
    N2 n1 + n2, n1 < N1 / 2, of the pair's two sequences."""
    HALF: tl.constexpr = N1 // 2
    L: tl.constexpr = N1 * N2
    q = tl.program_id(0)
    h, b_re, b_im = _pair_of(q, batch)
    n2 = tl.program_id(1) * BN + tl.arange(0, BN)
    n1 = tl.arange(0, HALF)
    r_base = RSCALE + q.to(tl.int64) * N1
    rmax = tl.max(tl.load(r_base + tl.arange(0, N1)), axis=0)
    a_base = A + q.to(tl.int64) * (2 * L)
    ore = tl.zeros([BN, HALF], dtype=tl.float32)
    oim = tl.zeros([BN, HALF], dtype=tl.float32)
    for kc in tl.static_range(N1 // KC):
        k1 = kc * KC + tl.arange(0, KC)
        rel = (tl.load(r_base + k1) / rmax)[None, :]  # the rows' scales, <= 1
        d = k1[None, :] * N2 + n2[:, None]  # D[k1, n2] as [BN, KC]
        dre = (tl.load(a_base + d).to(tl.float32) * rel).to(tl.float16)
        dim = (tl.load(a_base + L + d).to(tl.float32) * rel).to(tl.float16)
        f1 = k1[:, None] * N1 + n1[None, :]  # F_N1[k1, n1]: [KC, HALF]
        pre, pim = _cmul(dre, dim, tl.load(F1RE + f1), tl.load(F1IM + f1), True, GAUSS)
        ore += pre
        oim += pim
    out = rmax * (1.0 / L)
    ore = ore * (out * tl.load(SCALE + 2 * q))
    oim = oim * (out * tl.load(SCALE + 2 * q + 1))
    seq = n2[:, None] + (N2 * n1)[None, :]
    ty = Y.dtype.element_ty
    tl.store(Y + b_re.to(tl.int64) * stride_yb + h * stride_yh + seq, ore.to(ty), mask=b_re < batch)
    tl.store(Y + b_im.to(tl.int64) * stride_yb + h * stride_yh + seq, oim.to(ty), mask=b_im < batch)
