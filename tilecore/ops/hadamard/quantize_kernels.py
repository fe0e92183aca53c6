"""hadamard_quantize's kernel: rotate a row (or each block of it) and quantize it in one pass: one read of
x, one write of the codes and scales (quantize_reference.py defines every format and byte layout).

A tile is kernels_kron's: B rows of M_PAD sub-rows of P elements, S slices of [B M_PAD, Q], each loaded
(times the random signs), transformed (MIX: H_M over sub-rows, Sylvester or from memory; TRANSFORM: H_Q
along the slice) and, with BUTTERFLY, combined over slices by H_S, so the whole rotated tile is in
registers in float32. Which rotation a plan builds from these (quantize.plan_quantize):
* the whole row, n a power of two <= 1024: B rows, M_PAD = 1, P = n, H_Q and H_S;
* the whole row, n a power of two > 1024: one row, M_PAD sub-rows mixed by Sylvester's H_M (MIX 2);
* the whole row, n = m 2^k: one row (or B), H_m from memory (MIX 1), as the transform;
* blocks of ``block`` (or no rotation): sub-rows of P = block, H_P each (no mixing, no butterfly).

The epilogue computes each group's largest |y| from the registers, its scale, and the codes:
* GROUP 0, "spanning": a group is SPG consecutive tile rows across all slices (SPG = M_PAD: a whole
  row, the per-token scale; SPG = g / P: groups of g spanning sub-rows);
* GROUP 1, "within a slice": groups of G contiguous elements inside a slice (G divides Q).
NaN-propagating maxima (max.NaN reductions; Triton's max drops NaN): a NaN in a group makes its amax NaN.

The codes (_codes_fast, shared with pow2_quantize_kernel below): y / scale as one correctly rounded
reciprocal a group and an FMA correction a value (Markstein; div.rn in the interpreter), then fp8 by the
GPU's cvt.rn.satfinite (the interpreter's fp8 casts do not round to nearest: there float32 and bit
arithmetic, _fp8_code), int8 / int4 by cvt.rni (the interpreter: 1.5 x 2^23 added and subtracted), e2m1
by one FMA onto the code (_e2m1_fast, the same on both).
"""
import triton
import triton.language as tl

from tilecore.ops.hadamard import kernels
from tilecore.ops.hadamard.kernels import _INTERPRETED
from tilecore.ops.hadamard.kernels_kron import butterfly4, load_slice_transform, slice_offsets, slice_transform
from tilecore.tiles.hadamard import sylvester_tile

# FORMAT ids (quantize_reference.FORMATS), and the first pass of nvfp4's dynamic global scale
E4M3: tl.constexpr = tl.constexpr(0)
E5M2: tl.constexpr = tl.constexpr(1)
INT8: tl.constexpr = tl.constexpr(2)
MXFP4: tl.constexpr = tl.constexpr(3)
NVFP4: tl.constexpr = tl.constexpr(4)
INT4: tl.constexpr = tl.constexpr(5)
AMAX: tl.constexpr = tl.constexpr(6)


@triton.jit
def _exponent(a):
    """floor(log2 a) for a >= 0 from float32 bits (-127 for 0 and float32 subnormals)."""
    return ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127


@triton.jit
def _pow2(e):
    """2^e as float32 for integer e in [-126, 127], from bits."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _round_half_even(t):
    """t rounded to the nearest integer, ties to even (t exact in float32, |t| < 2^22)."""
    f = tl.floor(t)
    d = t - f
    odd = (f.to(tl.int32) & 1) == 1
    return f + tl.where((d > 0.5) | ((d == 0.5) & odd), 1.0, 0.0)


@triton.jit
def _clamp(v, lo, hi):
    """v clamped to [lo, hi], NaN kept (comparisons with NaN are false)."""
    return tl.where(v > hi, hi, tl.where(v < lo, lo, v))


@triton.jit
def _fp8_code(v, MANT: tl.constexpr, BIAS: tl.constexpr, QMAX: tl.constexpr):
    """The fp8 byte (e4m3fn or e5m2) of float32 v, saturating; NaN -> 0x7F."""
    c = _clamp(v, -QMAX, QMAX)
    a = tl.abs(c)
    min_exp: tl.constexpr = 1 - BIAS
    e = tl.maximum(_exponent(a), min_exp)
    quantum = _pow2(e - MANT)
    r = _round_half_even(a / quantum) * quantum  # exact: division by a power of two
    bits = r.to(tl.int32, bitcast=True)
    normal = r >= _pow2(tl.full(r.shape, min_exp, tl.int32))
    biased = tl.where(normal, ((bits >> 23) & 0xFF) - 127 + BIAS, 0)
    sub = (r * _pow2(tl.full(r.shape, MANT - min_exp, tl.int32))).to(tl.int32)
    mant = tl.where(normal, (bits >> (23 - MANT)) & ((1 << MANT) - 1), sub)
    sign = (c.to(tl.int32, bitcast=True) >> 31) & 1
    code = (sign << 7) | (biased << MANT) | mant
    return tl.where(c != c, 0x7F, code)


@triton.jit
def _e2m1_code(v):
    """The e2m1 nibble of float32 v (saturating at +-6, ties to even); NaN -> 0."""
    c = _clamp(v, -6.0, 6.0)
    a = tl.abs(c)
    half = a < 2.0
    step = tl.where(half, 0.5, tl.where(a < 4.0, 1.0, 2.0))
    q = _round_half_even(a / step) * step  # exact: division by a power of two
    mag = tl.where(q < 2.0, q * 2.0, tl.where(q < 4.0, q + 2.0, q * 0.5 + 4.0)).to(tl.int32)
    sign = (c.to(tl.int32, bitcast=True) >> 31) & 1
    return tl.where(c != c, 0, (sign << 3) | mag)


@triton.jit
def _nan_max(v, axis: tl.constexpr):
    """max |v| along ``axis``, NaN where any element is NaN (Triton's max drops NaN): _amax's max.NaN."""
    return _amax(v, axis)


@triton.jit
def _nan_maximum(a, b):
    """Elementwise max, NaN where either is NaN (max.NaN; tl.maximum's default drops NaN on the GPU)."""
    return _max_nan(a, b)


@triton.jit
def _slices_max(o0, o1, o2, o3, o4, o5, o6, o7, S: tl.constexpr):
    """Each tile row's largest |y| over the S slices (NaN-propagating): elementwise over the slices, then
    one reduction across threads (not one a slice)."""
    m = tl.abs(o0)
    if S > 1:
        m = _nan_maximum(m, tl.abs(o1))
    if S > 2:
        m = _nan_maximum(_nan_maximum(m, tl.abs(o2)), tl.abs(o3))
    if S > 4:
        m = _nan_maximum(_nan_maximum(m, tl.abs(o4)), tl.abs(o5))
        m = _nan_maximum(_nan_maximum(m, tl.abs(o6)), tl.abs(o7))
    return _nan_max(m, 1)


@triton.jit
def _scale(amax, gscale_ptr, FORMAT: tl.constexpr, STATIC: tl.constexpr, QMAX: tl.constexpr):
    """(what to divide y by, what to store) from a group's amax: fp8/int: (s, s); mxfp4: (2^e, e + 127 as
    int, 255 where amax is not finite); nvfp4: (G s8, s8's e4m3 byte)."""
    if FORMAT == MXFP4:
        e = tl.minimum(tl.maximum(_exponent(amax) - 2, -127), 127)
        finite = (amax == amax) & (amax < float("inf"))
        div = tl.where(finite, _pow2(tl.maximum(e, -126)) * tl.where(e < -126, 0.5, 1.0), float("nan"))
        stored = tl.where(finite, e + 127, 255)
    elif FORMAT == NVFP4:
        g = tl.load(gscale_ptr)
        if _INTERPRETED:
            s = tl.math.div_rn(tl.math.div_rn(amax, 6.0), g)
            s = tl.where(s != s, s, _clamp(s, 0.015625, 448.0))
            stored = _fp8_code(s, 3, 7, 448.0)
            # the e4m3 value of the stored byte (s > 0): s rounded as _fp8_code rounds it
            e = tl.maximum(_exponent(s), -6)
            quantum = _pow2(e - 3)
            s8 = _round_half_even(s / quantum) * quantum
        else:
            # the same values in fewer instructions (a group's scale is computed by each of the 4 threads
            # holding its values: ~8 groups a thread at n = 4096): the two divisions correctly rounded by
            # Markstein's correction with the reciprocals of 6 and of g (g once a tile), the e4m3 byte by
            # cvt.rn.satfinite (s is clamped, NaN stays NaN: 0x7F) and its value by converting it back
            s = _div_by(_div_by(amax, 6.0, 1.0 / 6.0), g, 1.0 / g)
            s = tl.where(s != s, s, _clamp(s, 0.015625, 448.0))
            s_fp8 = s.to(tl.float8e4nv, fp_downcast_rounding="rtne")
            stored = s_fp8.to(tl.uint8, bitcast=True)
            s8 = s_fp8.to(tl.float32)
        # a block whose amax is not finite has codes 0 (quantize_reference): its divisor NaN says so (a
        # static global scale keeps s finite where amax is inf)
        div = tl.where(amax < float("inf"), g * s8, float("nan"))
    else:
        if STATIC:
            div = tl.load(gscale_ptr) + tl.zeros_like(amax)
        else:
            div = tl.where(amax == 0, 1.0, tl.math.div_rn(amax, QMAX))
        stored = div
    return div, stored


@triton.jit
def _div_by(y, d, r):
    """y / d correctly rounded, given r = RN(1 / d) (Markstein: q = RN(y r), then q + (y - q d) r in two
    FMAs; d finite and > 0, y / d not subnormal); q = +-inf (y infinite, or the quotient overflowing) is
    kept, as y / d gives it (the correction would make it NaN)."""
    q = y * r
    return tl.where(tl.abs(q) == float("inf"), q, tl.fma(tl.fma(-q, d, y), r, q))


@triton.jit
def _store_codes(codes, tile, t, code, rows, stride_codes, M: tl.constexpr, M_PAD: tl.constexpr,
                 P: tl.constexpr, Q: tl.constexpr, B: tl.constexpr, PACKED: tl.constexpr):
    """A slice's codes: bytes at the elements' offsets, or (PACKED) nibble pairs, element 2j low, at
    offset / 2 (Q, P even)."""
    offs, mask, col = slice_offsets(tile, t, rows, stride_codes, M, M_PAD, P, Q, B, 1)
    if PACKED:
        R: tl.constexpr = B * M_PAD
        lo, hi = tl.split(tl.reshape(code, (R, Q // 2, 2)))
        even_offs, _ = tl.split(tl.reshape(offs - col + col // 2, (R, Q // 2, 2)))
        even_mask, _ = tl.split(tl.reshape(mask, (R, Q // 2, 2)))
        tl.store(codes + even_offs, (lo | (hi << 4)).to(tl.uint8), mask=even_mask)
    else:
        tl.store(codes + offs, code.to(codes.dtype.element_ty), mask=mask)


@triton.jit
def _group_rows(tile, rows, M: tl.constexpr, M_PAD: tl.constexpr, B: tl.constexpr, SPG: tl.constexpr):
    """For spanning groups (SPG tile rows each): each group's (row, index within the row, in bounds)."""
    R: tl.constexpr = B * M_PAD
    first = tl.arange(0, R // SPG) * SPG  # the group's first tile row
    i = first % M_PAD
    row = (first // M_PAD).to(tl.int64) + tile * B
    return row, i // SPG, (row < rows) & (i < M)


@triton.jit
def _epilogue(codes, scales, gscale, tile, rows, stride_codes, stride_scales,
              o0, o1, o2, o3, o4, o5, o6, o7, S: tl.constexpr,
              M: tl.constexpr, M_PAD: tl.constexpr, P: tl.constexpr, Q: tl.constexpr, B: tl.constexpr,
              FORMAT: tl.constexpr, GROUP: tl.constexpr, G: tl.constexpr, SPG: tl.constexpr,
              STATIC: tl.constexpr, PACKED: tl.constexpr, QMAX: tl.constexpr, FAST: tl.constexpr):
    """Scales and codes of a tile's S rotated slices o0..o{S-1} (the rest are placeholders)."""
    R: tl.constexpr = B * M_PAD
    if GROUP == 0:
        a = _slices_max(o0, o1, o2, o3, o4, o5, o6, o7, S)
        if SPG == R:  # one group a tile (a whole row, B == 1): scalars, broadcast without layout changes
            div, stored = _scale(_nan_max(a, 0), gscale, FORMAT, STATIC, QMAX)
            if not STATIC:
                tl.store(scales + tl.cast(tile, tl.int64) * stride_scales, stored.to(scales.dtype.element_ty),
                         mask=tile < rows)
            recip, div_e = _group_divisor(div, FORMAT)
            zero = tl.zeros([R, 1], tl.float32)
            div_r = div + zero
            st_r = stored + tl.zeros([R, 1], stored.dtype)
            rc_r = recip + zero
            de_r = div_e + zero
        else:
            ga = _nan_max(tl.reshape(a, (R // SPG, SPG)), 1)  # [groups]
            div, stored = _scale(ga, gscale, FORMAT, STATIC, QMAX)
            if not STATIC:
                grow, gidx, gmask = _group_rows(tile, rows, M, M_PAD, B, SPG)
                tl.store(scales + grow * stride_scales + gidx, stored.to(scales.dtype.element_ty), mask=gmask)
            recip, div_e = _group_divisor(div, FORMAT)
            div_r = tl.reshape(tl.broadcast_to(div[:, None], (R // SPG, SPG)), (R,))[:, None]
            st_r = tl.reshape(tl.broadcast_to(stored[:, None], (R // SPG, SPG)), (R,))[:, None]
            rc_r = tl.reshape(tl.broadcast_to(recip[:, None], (R // SPG, SPG)), (R,))[:, None]
            de_r = tl.reshape(tl.broadcast_to(div_e[:, None], (R // SPG, SPG)), (R,))[:, None]
        _store_codes(codes, tile, 0, _codes_fast(o0, div_r, st_r, rc_r, de_r, FORMAT, QMAX, STATIC, FAST), rows,
                     stride_codes, M, M_PAD, P, Q, B, PACKED)
        if S > 1:
            _store_codes(codes, tile, 1, _codes_fast(o1, div_r, st_r, rc_r, de_r, FORMAT, QMAX, STATIC, FAST), rows,
                         stride_codes, M, M_PAD, P, Q, B, PACKED)
        if S > 2:
            _store_codes(codes, tile, 2, _codes_fast(o2, div_r, st_r, rc_r, de_r, FORMAT, QMAX, STATIC, FAST), rows,
                         stride_codes, M, M_PAD, P, Q, B, PACKED)
            _store_codes(codes, tile, 3, _codes_fast(o3, div_r, st_r, rc_r, de_r, FORMAT, QMAX, STATIC, FAST), rows,
                         stride_codes, M, M_PAD, P, Q, B, PACKED)
        if S > 4:
            _store_codes(codes, tile, 4, _codes_fast(o4, div_r, st_r, rc_r, de_r, FORMAT, QMAX, STATIC, FAST), rows,
                         stride_codes, M, M_PAD, P, Q, B, PACKED)
            _store_codes(codes, tile, 5, _codes_fast(o5, div_r, st_r, rc_r, de_r, FORMAT, QMAX, STATIC, FAST), rows,
                         stride_codes, M, M_PAD, P, Q, B, PACKED)
            _store_codes(codes, tile, 6, _codes_fast(o6, div_r, st_r, rc_r, de_r, FORMAT, QMAX, STATIC, FAST), rows,
                         stride_codes, M, M_PAD, P, Q, B, PACKED)
            _store_codes(codes, tile, 7, _codes_fast(o7, div_r, st_r, rc_r, de_r, FORMAT, QMAX, STATIC, FAST), rows,
                         stride_codes, M, M_PAD, P, Q, B, PACKED)
    else:
        _slice_groups(codes, scales, gscale, tile, 0, o0, rows, stride_codes, stride_scales, M, M_PAD, P, Q, B,
                      FORMAT, G, STATIC, PACKED, QMAX, FAST)
        if S > 1:
            _slice_groups(codes, scales, gscale, tile, 1, o1, rows, stride_codes, stride_scales, M, M_PAD, P, Q, B,
                          FORMAT, G, STATIC, PACKED, QMAX, FAST)
        if S > 2:
            _slice_groups(codes, scales, gscale, tile, 2, o2, rows, stride_codes, stride_scales, M, M_PAD, P, Q, B,
                          FORMAT, G, STATIC, PACKED, QMAX, FAST)
            _slice_groups(codes, scales, gscale, tile, 3, o3, rows, stride_codes, stride_scales, M, M_PAD, P, Q, B,
                          FORMAT, G, STATIC, PACKED, QMAX, FAST)
        if S > 4:
            _slice_groups(codes, scales, gscale, tile, 4, o4, rows, stride_codes, stride_scales, M, M_PAD, P, Q, B,
                          FORMAT, G, STATIC, PACKED, QMAX, FAST)
            _slice_groups(codes, scales, gscale, tile, 5, o5, rows, stride_codes, stride_scales, M, M_PAD, P, Q, B,
                          FORMAT, G, STATIC, PACKED, QMAX, FAST)
            _slice_groups(codes, scales, gscale, tile, 6, o6, rows, stride_codes, stride_scales, M, M_PAD, P, Q, B,
                          FORMAT, G, STATIC, PACKED, QMAX, FAST)
            _slice_groups(codes, scales, gscale, tile, 7, o7, rows, stride_codes, stride_scales, M, M_PAD, P, Q, B,
                          FORMAT, G, STATIC, PACKED, QMAX, FAST)


@triton.jit
def _slice_groups(codes, scales, gscale, tile, t, y, rows, stride_codes, stride_scales,
                  M: tl.constexpr, M_PAD: tl.constexpr, P: tl.constexpr, Q: tl.constexpr, B: tl.constexpr,
                  FORMAT: tl.constexpr, G: tl.constexpr, STATIC: tl.constexpr, PACKED: tl.constexpr,
                  QMAX: tl.constexpr, FAST: tl.constexpr):
    """Groups of G contiguous elements inside slice t ([R, Q], G divides Q): scales and codes."""
    R: tl.constexpr = B * M_PAD
    y3 = tl.reshape(y, (R, Q // G, G))
    div, stored = _scale(_nan_max(y3, 2), gscale, FORMAT, STATIC, QMAX)  # [R, Q / G]
    recip, div_e = _group_divisor(div, FORMAT)
    r = tl.arange(0, R)
    i = r % M_PAD
    row = (r // M_PAD).to(tl.int64) + tile * B
    k = tl.arange(0, Q // G)
    col = (i[:, None] * P + t * Q) // G + k[None, :]
    mask = (row[:, None] < rows) & (i[:, None] < M) & (k[None, :] * G < P)
    tl.store(scales + row[:, None] * stride_scales + col, stored.to(scales.dtype.element_ty), mask=mask)
    code = tl.reshape(_codes_fast(y3, div[:, :, None], stored[:, :, None], recip[:, :, None], div_e[:, :, None],
                                  FORMAT, QMAX, STATIC, FAST), (R, Q))
    _store_codes(codes, tile, t, code, rows, stride_codes, M, M_PAD, P, Q, B, PACKED)


@triton.jit
def _valid_only(y, M: tl.constexpr, M_PAD: tl.constexpr, P: tl.constexpr, Q: tl.constexpr, B: tl.constexpr):
    """y with padded sub-rows (i >= M) and columns (q >= P) set to 0: there the zero rows of H_m and
    columns of H_Q give 0 x NaN = NaN for a row holding inf or NaN, which must not reach the amax."""
    if M_PAD > M or Q > P:
        i = tl.arange(0, B * M_PAD) % M_PAD
        q = tl.arange(0, Q)
        y = tl.where((i[:, None] < M) & (q[None, :] < P), y, 0.0)
    return y


# ---------------------------------------------------------------------------------------------------------
# Interleaved slices (plan tuning "interleave"; kernels_kron.slice_offsets' IL): slice t holds
# the columns q S + t of every sub-row, so output column c S + s of a sub-row is column c of slice s. A thread
# then holds, for each of its (sub-row, c), the S consecutive outputs c S .. c S + S - 1 (one in each slice):
# a group of G consecutive outputs is G / S consecutive columns of every slice (nvfp4 at S = 8: the two columns
# a thread holds; mxfp4: four, one lane pair), so its amax is an elementwise max over the slices and a
# reduction within a thread or a lane pair, where contiguous slices spread a group over several warps (the
# mma layout puts warps along the columns at M_PAD = 32) and reduce it through shared memory, with barriers,
# once a slice and group. The codes of a (sub-row, c) are S / 2 bytes (packed) or S bytes in a row: joined
# into one vector a thread stores.

@triton.jit
def _codes_il(y, div, stored, recip, div_e, R: tl.constexpr, Q: tl.constexpr, C: tl.constexpr,
              FORMAT: tl.constexpr, QMAX: tl.constexpr, STATIC: tl.constexpr, FAST: tl.constexpr):
    """Codes of one slice [R, Q] with a scale every C consecutive columns (div etc. [R, Q / C])."""
    if C == 1:
        return _codes_fast(y, div, stored, recip, div_e, FORMAT, QMAX, STATIC, FAST)
    y3 = tl.reshape(y, (R, Q // C, C))
    code = _codes_fast(y3, div[:, :, None], stored[:, :, None], recip[:, :, None], div_e[:, :, None], FORMAT, QMAX,
                       STATIC, FAST)
    return tl.reshape(code, (R, Q))


@triton.jit
def _nibbles(a, b):
    """One byte of two codes' nibbles, a low (the even element)."""
    return ((a & 0xF) | ((b & 0xF) << 4)).to(tl.uint8)


@triton.jit
def _store_il(codes, tile, rows, stride_codes, c0, c1, c2, c3, c4, c5, c6, c7, S: tl.constexpr, M: tl.constexpr,
              M_PAD: tl.constexpr, P: tl.constexpr, Q: tl.constexpr, PACKED: tl.constexpr):
    """The codes of one row (B == 1) from its S >= 2 interleaved slices: column c of slice s is element c S + s
    of its sub-row; each (sub-row, c) is K = S / 2 (packed) or S bytes in a row, stored as one vector. tl.join
    adds a last (fastest) index: byte f = 4 a + 2 b + c of a (sub-row, c) is joined at [..., a, b, c]."""
    K: tl.constexpr = S // 2 if PACKED else S
    if PACKED:
        if S == 2:
            v = _nibbles(c0, c1)
        elif S == 4:
            v = tl.join(_nibbles(c0, c1), _nibbles(c2, c3))
        else:
            v = tl.join(tl.join(_nibbles(c0, c1), _nibbles(c4, c5)), tl.join(_nibbles(c2, c3), _nibbles(c6, c7)))
    else:
        b0 = c0.to(tl.uint8)
        b1 = c1.to(tl.uint8)
        if S == 2:
            v = tl.join(b0, b1)
        elif S == 4:
            v = tl.join(tl.join(b0, c2.to(tl.uint8)), tl.join(b1, c3.to(tl.uint8)))
        else:
            v = tl.join(tl.join(tl.join(b0, c4.to(tl.uint8)), tl.join(c2.to(tl.uint8), c6.to(tl.uint8))),
                        tl.join(tl.join(b1, c5.to(tl.uint8)), tl.join(c3.to(tl.uint8), c7.to(tl.uint8))))
    v = tl.reshape(v, (M_PAD, Q * K))
    i = tl.arange(0, M_PAD)
    j = tl.arange(0, Q * K)
    W: tl.constexpr = P // 2 if PACKED else P  # bytes a sub-row
    row = tl.zeros([M_PAD], tl.int64) + tile  # 64-bit offsets
    offs = row[:, None] * stride_codes + i[:, None] * W + j[None, :]
    tl.store(codes + offs, v, mask=(i[:, None] < M) & (tile < rows))


@triton.jit
def _epilogue_interleaved(codes, scales, gscale, tile, rows, stride_codes, stride_scales,
                          o0, o1, o2, o3, o4, o5, o6, o7, S: tl.constexpr, M: tl.constexpr, M_PAD: tl.constexpr,
                          P: tl.constexpr, Q: tl.constexpr, FORMAT: tl.constexpr, GROUP: tl.constexpr,
                          G: tl.constexpr, STATIC: tl.constexpr, PACKED: tl.constexpr, QMAX: tl.constexpr,
                          FAST: tl.constexpr):
    """_epilogue for one row (B == 1) of S interleaved slices: a per-token scale (GROUP 0) or groups of G
    consecutive elements (GROUP 1, G a multiple of S: C = G / S consecutive columns of every slice)."""
    if GROUP == 0:
        C: tl.constexpr = 1
        a = _slices_max(o0, o1, o2, o3, o4, o5, o6, o7, S)  # [M_PAD]: each sub-row's, over slices and columns
        div, stored = _scale(_nan_max(a, 0), gscale, FORMAT, STATIC, QMAX)
        if not STATIC:
            first = tl.arange(0, M_PAD) == 0  # the row's scale, stored once
            tl.store(scales + (tl.zeros([M_PAD], tl.int64) + tile) * stride_scales + tl.zeros([M_PAD], tl.int32),
                     stored.to(scales.dtype.element_ty) + tl.zeros([M_PAD], scales.dtype.element_ty),
                     mask=first & (tile < rows))
        recip, div_e = _group_divisor(div, FORMAT)
        zero = tl.zeros([M_PAD, Q], tl.float32)
        div_r = div + zero
        st_r = stored + tl.zeros([M_PAD, Q], stored.dtype)
        rc_r = recip + zero
        de_r = div_e + zero
    else:
        C: tl.constexpr = G // S
        m = tl.abs(o0)
        if S > 1:
            m = _nan_maximum(m, tl.abs(o1))
        if S > 2:
            m = _nan_maximum(_nan_maximum(m, tl.abs(o2)), tl.abs(o3))
        if S > 4:
            m = _nan_maximum(_nan_maximum(m, tl.abs(o4)), tl.abs(o5))
            m = _nan_maximum(_nan_maximum(m, tl.abs(o6)), tl.abs(o7))
        if C == 1:
            ga = m  # [M_PAD, Q]
        else:
            ga = _nan_max(tl.reshape(m, (M_PAD, Q // C, C)), 2)  # [M_PAD, Q / C]: the groups of each sub-row
        div_r, st_r = _scale(ga, gscale, FORMAT, STATIC, QMAX)
        if not STATIC:
            i = tl.arange(0, M_PAD)
            k = tl.arange(0, Q // C)
            row = tl.zeros([M_PAD], tl.int64) + tile  # 64-bit: rows * stride may pass 2^31
            tl.store(scales + row[:, None] * stride_scales + i[:, None] * (P // G) + k[None, :],
                     st_r.to(scales.dtype.element_ty), mask=(i[:, None] < M) & (tile < rows))
        rc_r, de_r = _group_divisor(div_r, FORMAT)
    c0 = _codes_il(o0, div_r, st_r, rc_r, de_r, M_PAD, Q, C, FORMAT, QMAX, STATIC, FAST)
    c1 = c0
    c2 = c0
    c3 = c0
    c4 = c0
    c5 = c0
    c6 = c0
    c7 = c0
    if S > 1:
        c1 = _codes_il(o1, div_r, st_r, rc_r, de_r, M_PAD, Q, C, FORMAT, QMAX, STATIC, FAST)
    if S > 2:
        c2 = _codes_il(o2, div_r, st_r, rc_r, de_r, M_PAD, Q, C, FORMAT, QMAX, STATIC, FAST)
        c3 = _codes_il(o3, div_r, st_r, rc_r, de_r, M_PAD, Q, C, FORMAT, QMAX, STATIC, FAST)
    if S > 4:
        c4 = _codes_il(o4, div_r, st_r, rc_r, de_r, M_PAD, Q, C, FORMAT, QMAX, STATIC, FAST)
        c5 = _codes_il(o5, div_r, st_r, rc_r, de_r, M_PAD, Q, C, FORMAT, QMAX, STATIC, FAST)
        c6 = _codes_il(o6, div_r, st_r, rc_r, de_r, M_PAD, Q, C, FORMAT, QMAX, STATIC, FAST)
        c7 = _codes_il(o7, div_r, st_r, rc_r, de_r, M_PAD, Q, C, FORMAT, QMAX, STATIC, FAST)
    _store_il(codes, tile, rows, stride_codes, c0, c1, c2, c3, c4, c5, c6, c7, S, M, M_PAD, P, Q, PACKED)


@triton.jit
def _load_il(x, signs, tile, rows, stride_x, M: tl.constexpr, M_PAD: tl.constexpr, P: tl.constexpr, Q: tl.constexpr,
             S: tl.constexpr, SIGNS: tl.constexpr, TMA: tl.constexpr = False):
    """One row's S interleaved slices (B == 1, Q S = P) by one load of [M_PAD, Q, S]: the S elements c S .. c S +
    S - 1 of a sub-row are one vector of a thread (16 bytes at S = 8, 16-bit x), split in registers into the
    slices [M_PAD, Q] (the rest are placeholders); sub-rows past M and rows past the end are zeros."""
    i = tl.arange(0, M_PAD)
    c = tl.arange(0, Q)
    s = tl.arange(0, S)
    col = i[:, None, None] * P + (c[:, None] * S + s[None, :])[None, :, :]  # [M_PAD, Q, S]
    row = tl.zeros([M_PAD], tl.int64) + tile  # 64-bit: rows * stride may pass 2^31
    mask = (i[:, None, None] < M) & (row[:, None, None] < rows)
    if TMA:  # x: a descriptor over (rows, M, Q, S) with [1, M_PAD, Q, S] boxes (kron.descriptor), zero-filled
        v = tl.reshape(x.load([tile, 0, 0, 0]), (M_PAD, Q, S))
    else:
        v = tl.load(x + row[:, None, None] * stride_x + col, mask=mask, other=0.0)
    if SIGNS:  # in float32 and back (exact: +-1)
        v = (v.to(tl.float32) * tl.load(signs + col, mask=mask, other=0.0).to(tl.float32)).to(v.dtype)
    if S == 2:
        s0, s1 = tl.split(v)
        return s0, s1, s0, s0, s0, s0, s0, s0
    elif S == 4:  # s = 2 a + b: the last index b first
        e, o = tl.split(tl.reshape(v, (M_PAD, Q, 2, 2)))
        s0, s2 = tl.split(e)
        s1, s3 = tl.split(o)
        return s0, s1, s2, s3, s0, s0, s0, s0
    else:  # S == 8, s = 4 a + 2 b + c
        e, o = tl.split(tl.reshape(v, (M_PAD, Q, 2, 2, 2)))
        ee, eo = tl.split(e)
        oe, oo = tl.split(o)
        s0, s4 = tl.split(ee)
        s2, s6 = tl.split(eo)
        s1, s5 = tl.split(oe)
        s3, s7 = tl.split(oo)
        return s0, s1, s2, s3, s4, s5, s6, s7


@triton.jit
def _slice_il(x, h, signs, tile, t, rows, stride_x, M: tl.constexpr, M_PAD: tl.constexpr, P: tl.constexpr,
              Q: tl.constexpr, B: tl.constexpr, MIX: tl.constexpr, TRANSFORM: tl.constexpr, SIGNS: tl.constexpr,
              IN_PIECES: tl.constexpr, MID_PIECES: tl.constexpr, MMA_DTYPE: tl.constexpr,
              PIECE_DTYPE: tl.constexpr, TMA_LOAD: tl.constexpr, IL: tl.constexpr, ILV: tl.constexpr, v,
              K_STOP: tl.constexpr = False):
    """Slice t transformed: from ``v`` (already loaded by _load_il, ILV) or loaded here (K_STOP: the K-chunked
    mixing stops at the last chunk holding sub-rows < M, kernels_kron._chunked_mix)."""
    if ILV:
        y = slice_transform(v, h, M_PAD, Q, P, B, MIX, TRANSFORM, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE)
    else:
        y = load_slice_transform(x, h, signs, tile, t, rows, stride_x, M, M_PAD, P, Q, B, 1, MIX, TRANSFORM, SIGNS,
                                 IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE, TMA_LOAD, IL, K_STOP)
    return y


@triton.jit
def rotate_quantize_kernel(x, codes, scales, h, signs, gscale, amax_out, rows, stride_x, stride_codes,
                           stride_scales, rscale,
                           M: tl.constexpr, M_PAD: tl.constexpr, P: tl.constexpr, Q: tl.constexpr, S: tl.constexpr,
                           B: tl.constexpr, MIX: tl.constexpr, TRANSFORM: tl.constexpr, BUTTERFLY: tl.constexpr,
                           SIGNS: tl.constexpr, FORMAT: tl.constexpr, GROUP: tl.constexpr, G: tl.constexpr,
                           SPG: tl.constexpr, STATIC: tl.constexpr, PACKED: tl.constexpr, QMAX: tl.constexpr,
                           IN_PIECES: tl.constexpr, MID_PIECES: tl.constexpr, MMA_DTYPE: tl.constexpr,
                           PIECE_DTYPE: tl.constexpr, GRID: tl.constexpr, FAST: tl.constexpr = False,
                           TMA_LOAD: tl.constexpr = False, IL: tl.constexpr = 0,
                           ILV: tl.constexpr = False, K_STOP: tl.constexpr = False):
    """codes, scales = quantize(rscale * rotation(signs * x)) for ``rows`` rows (module docstring); a
    persistent grid of GRID programs, B rows a tile. FORMAT == AMAX: only each program's largest |y|,
    written to amax_out[program] (nvfp4's dynamic global scale, a first pass). TMA_LOAD: ``x`` is a
    descriptor over (rows, M, P) with [B, M_PAD, Q] boxes (kernels_kron.load_slice_transform)."""
    tiles = tl.cdiv(rows, B)
    run_max = tl.zeros([B * M_PAD], tl.float32)
    for tile in range(tl.program_id(0), tiles, GRID):
        if ILV:  # interleaved slices by one vector load of each column's S elements (_load_il)
            v0, v1, v2, v3, v4, v5, v6, v7 = _load_il(x, signs, tile, rows, stride_x, M, M_PAD, P, Q, S, SIGNS, TMA_LOAD)
        else:  # placeholders: each slice loads its own
            v0, v1, v2, v3, v4, v5, v6, v7 = tile, tile, tile, tile, tile, tile, tile, tile
        t0 = _valid_only(_slice_il(x, h, signs, tile, 0, rows, stride_x, M, M_PAD, P, Q, B, MIX, TRANSFORM,
                                  SIGNS, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE, TMA_LOAD, IL, ILV, v0, K_STOP) * rscale, M, M_PAD, P, Q, B)
        o1 = t0
        o2 = t0
        o3 = t0
        o4 = t0
        o5 = t0
        o6 = t0
        o7 = t0
        o0 = t0
        if S > 1:
            t1 = _valid_only(_slice_il(x, h, signs, tile, 1, rows, stride_x, M, M_PAD, P, Q, B, MIX, TRANSFORM,
                                      SIGNS, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE, TMA_LOAD, IL, ILV, v1, K_STOP) * rscale, M, M_PAD, P, Q, B)
            if S == 2:
                if BUTTERFLY:
                    o0 = t0 + t1
                    o1 = t0 - t1
                else:
                    o1 = t1
            else:
                t2 = _valid_only(_slice_il(x, h, signs, tile, 2, rows, stride_x, M, M_PAD, P, Q, B, MIX,
                                          TRANSFORM, SIGNS, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE, TMA_LOAD, IL, ILV, v2, K_STOP) * rscale, M, M_PAD, P, Q, B)
                t3 = _valid_only(_slice_il(x, h, signs, tile, 3, rows, stride_x, M, M_PAD, P, Q, B, MIX,
                                          TRANSFORM, SIGNS, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE, TMA_LOAD, IL, ILV, v3, K_STOP) * rscale, M, M_PAD, P, Q, B)
                if BUTTERFLY:
                    a0, a1, a2, a3 = butterfly4(t0, t1, t2, t3)
                else:
                    a0, a1, a2, a3 = t0, t1, t2, t3
                o0, o1, o2, o3 = a0, a1, a2, a3
                if S == 8:
                    t4 = _valid_only(_slice_il(x, h, signs, tile, 4, rows, stride_x, M, M_PAD, P, Q, B, MIX,
                                              TRANSFORM, SIGNS, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE, TMA_LOAD, IL, ILV, v4, K_STOP) * rscale, M, M_PAD, P, Q, B)
                    t5 = _valid_only(_slice_il(x, h, signs, tile, 5, rows, stride_x, M, M_PAD, P, Q, B, MIX,
                                              TRANSFORM, SIGNS, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE, TMA_LOAD, IL, ILV, v5, K_STOP) * rscale, M, M_PAD, P, Q, B)
                    t6 = _valid_only(_slice_il(x, h, signs, tile, 6, rows, stride_x, M, M_PAD, P, Q, B, MIX,
                                              TRANSFORM, SIGNS, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE, TMA_LOAD, IL, ILV, v6, K_STOP) * rscale, M, M_PAD, P, Q, B)
                    t7 = _valid_only(_slice_il(x, h, signs, tile, 7, rows, stride_x, M, M_PAD, P, Q, B, MIX,
                                              TRANSFORM, SIGNS, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE, TMA_LOAD, IL, ILV, v7, K_STOP) * rscale, M, M_PAD, P, Q, B)
                    if BUTTERFLY:
                        b0, b1, b2, b3 = butterfly4(t4, t5, t6, t7)
                        o0, o1, o2, o3 = a0 + b0, a1 + b1, a2 + b2, a3 + b3
                        o4, o5, o6, o7 = a0 - b0, a1 - b1, a2 - b2, a3 - b3
                    else:
                        o4, o5, o6, o7 = t4, t5, t6, t7
        if FORMAT == AMAX:
            run_max = _nan_maximum(run_max, _slices_max(o0, o1, o2, o3, o4, o5, o6, o7, S))
        elif IL > 0:
            _epilogue_interleaved(codes, scales, gscale, tile, rows, stride_codes, stride_scales, o0, o1, o2, o3, o4,
                                  o5, o6, o7, S, M, M_PAD, P, Q, FORMAT, GROUP, G, STATIC, PACKED, QMAX, FAST)
        else:
            _epilogue(codes, scales, gscale, tile, rows, stride_codes, stride_scales, o0, o1, o2, o3, o4, o5, o6, o7,
                      S, M, M_PAD, P, Q, B, FORMAT, GROUP, G, SPG, STATIC, PACKED, QMAX, FAST)
    if FORMAT == AMAX:
        tl.store(amax_out + tl.program_id(0), _nan_max(run_max, 0))


# ---------------------------------------------------------------------------------------------------------
# Power-of-two rows on the transform's own tile (issue 32's speed work). The kron-structured kernel above
# rotates a row of 4096 as 16 sub-rows x 4 slices of 64 with batched 3-D products: its transform alone (the
# AMAX pass) took 1.4 ms at 2^28 bf16 elements on the H100, 8x a copy. hadamard_transform's tl kernel
# (kernels.py) runs the same rows at copy speed, so this kernel is that kernel with the quantizing epilogue
# in place of its store: a tile is B rows as S slices of [B N1, N2] (configs.SPLITS / TMA_TUNING), each
# slice transformed by kernels._slice_transform and combined by the H_S butterfly, then quantized.
# Groups sit inside a slice (G <= N1 N2: quantize.pow2_split picks such a split) or are the whole row.

@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)  # max.NaN.f32: one instruction


@triton.jit
def _amax(v, axis: tl.constexpr):
    """max |v| along ``axis``, NaN where any element is NaN: one max.NaN a value (the interpreter's
    np.maximum propagates NaN as well)."""
    return tl.reduce(tl.abs(v), axis, _max_nan)


@triton.jit
def _rint(t):
    """t rounded to the nearest integer, ties to even, for |t| <= 2^22: adding and subtracting 1.5 x 2^23
    leaves no fraction bits, and float32 addition rounds half to even (two instructions, interpreter too)."""
    return (t + 12582912.0) - 12582912.0


@triton.jit
def _e2m1_fast(v):
    """The e2m1 nibble of float32 v, saturating at +-6, ties to even, for v not NaN (callers zero the codes
    of blocks whose scale is not finite, the only blocks holding NaN quotients). The grid's step is
    q = 2^(E - 1) with E the exponent of max(|v|, 1) (0.5 below 2, 1 below 4, 2 up to 6): adding
    M = 1.5 x 2^23 q rounds |v| half to even onto a multiple of q, left as an integer in M's low mantissa
    bits; M made from E's bits plus 2 E (the binade's first code: 0, 2, 4) leaves the code itself there.
    No compares or selects: shift, integer max, one multiply-add (M's bits), add, and; then the sign bit."""
    a = tl.minimum(tl.abs(v), 6.0)
    e = tl.maximum(a.to(tl.int32, bitcast=True) >> 23, 127)  # 127 + E (a >= 0: its bits order as it does)
    # M's bits: (e + 22) << 23 | 1.5's mantissa, plus 2 E = 2 e - 254: e (2^23 + 2) + 0x0B3FFF02
    magic = (e * 0x800002 + 0x0B3FFF02).to(tl.float32, bitcast=True)
    mag = (a + magic).to(tl.int32, bitcast=True) & 7
    return mag | ((v.to(tl.int32, bitcast=True) >> 28) & 8)


@triton.jit
def _e2m1_pair(q0, q1):
    """The byte of two e2m1 nibbles, q0's low, in the low 8 bits of an int32 (the bits above are not zero: the byte
    conversion drops them): _e2m1_fast's sum t = bits(|v| + M) holds the magnitude code in bits 0-2 and zeros in bits
    3-21 (M's mantissa is 1.5's plus at most 7 units), so t0 + 16 t1 has both magnitudes in its low byte, and the signs
    go to bits 3 and 7 by shifts of the float32 bits: no mask of each code, no separate pack (gluon_epilogue's
    E2M1_PAIRS). q0, q1 not NaN (as _e2m1_fast)."""
    a0 = tl.minimum(tl.abs(q0), 6.0)
    a1 = tl.minimum(tl.abs(q1), 6.0)
    e0 = tl.maximum(a0.to(tl.int32, bitcast=True) >> 23, 127)
    e1 = tl.maximum(a1.to(tl.int32, bitcast=True) >> 23, 127)
    t0 = (a0 + (e0 * 0x800002 + 0x0B3FFF02).to(tl.float32, bitcast=True)).to(tl.int32, bitcast=True)
    t1 = (a1 + (e1 * 0x800002 + 0x0B3FFF02).to(tl.float32, bitcast=True)).to(tl.int32, bitcast=True)
    s0 = (q0.to(tl.int32, bitcast=True) >> 28) & 8
    return (t0 + (t1 << 4)) | s0 | ((q1.to(tl.int32, bitcast=True) >> 24) & 0x80)


@triton.jit
def _fp8_fast(v, FORMAT: tl.constexpr):
    """The fp8 byte of float32 v, saturating (as _fp8_code). On the GPU one cvt.rn.satfinite converts two
    values (it saturates by itself; NaN gives the format's NaN); the interpreter's fp8 conversion does not
    round to nearest, so there the bits are assembled as _fp8_code does."""
    if _INTERPRETED:
        if FORMAT == E4M3:
            code = _fp8_code(v, 3, 7, 448.0)
        else:
            code = _fp8_code(v, 2, 15, 57344.0)
    else:
        if FORMAT == E4M3:
            code = v.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
        else:
            code = v.to(tl.float8e5, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    return code


@triton.jit
def _group_divisor(div, FORMAT: tl.constexpr):
    """(1 / div correctly rounded, div with inf made 0): a group's once-computed operands of _quotient.
    mxfp4's divisor is a power of two, 2^-127..2^127 (or NaN: its codes are zeroed): its reciprocal from
    the exponent bits, exact, without a division (a division's reciprocal, FCHK and slow path per group)."""
    if FORMAT == MXFP4:
        biased = (div.to(tl.int32, bitcast=True) >> 23) & 0xFF  # 0 for 2^-127 (subnormal): 2^127 below
        bits = tl.where(biased == 254, 0x00400000, (254 - biased) << 23)  # 2^127: 2^-127, subnormal
        recip = bits.to(tl.float32, bitcast=True)
    else:
        recip = tl.math.div_rn(1.0, div)
    return recip, tl.where(div == float("inf"), 0.0, div)


@triton.jit
def _quotient(y, div, recip, div_e, STATIC: tl.constexpr):
    """y / div rounded to nearest as div.rn rounds it, in three instructions a value on the GPU: with
    r = RN(1 / div) and q = RN(y r), the residual y - q div is exact in an FMA and q + (y - q div) r
    rounds to RN(y / div) (Markstein's theorem; no overflow or underflow here: |y / div| <= the format's
    qmax). div = inf (div_e = 0): q = y x 0, which is y / inf (0, NaN for inf). The interpreter's fma
    rounds twice: there div_rn itself. STATIC (a given finite scale): y = +-inf keeps q = +-inf (the
    residual would be inf - inf), which the format saturates, as inf / s does."""
    if _INTERPRETED:
        return tl.math.div_rn(y, div)
    q = y * recip
    r = tl.fma(tl.fma(-q, div_e, y), recip, q)
    if STATIC:
        r = tl.where(tl.abs(q) == float("inf"), q, r)
    return r


@triton.jit
def _int_bits(y, recip, div):
    """int8 / int4 codes of y / s without a conversion instruction (FAST: recip = RN(1 / s), |y recip| <= qmax (1 +
    2^-22)): M = 1.5 x 2^23 added to y recip in one FMA rounds the product half to even onto an integer left in M's
    low mantissa bits, so the low byte of the result's bits is the two's-complement byte of the code (the byte store
    and int4's nibble mask keep only those bits). One FFMA a value for FAST's FMUL and cvt.rni's F2I (the conversion
    pipe, an eighth of the FMA pipe's rate on sm_90); the product rounded once, not first to float32: a code can differ
    from cvt.rni(RN(y recip))'s only where that rounding made a tie (the interpreter's fma rounds twice: there the
    same codes as cvt.rni's). A group whose scale is not finite (amax NaN or inf: y / s is 0 or NaN there, cvt.rni's
    NaN -> 0) gets codes 0, by a select on its divisor."""
    return tl.where(div < float("inf"), tl.fma(y, recip, 12582912.0).to(tl.int32, bitcast=True), 0)


@triton.jit
def _codes_fast(y, div, stored, recip, div_e, FORMAT: tl.constexpr, QMAX: tl.constexpr, STATIC: tl.constexpr,
                FAST: tl.constexpr = False, INT_BITS: tl.constexpr = False):
    """_codes with fewer instructions a value (the same codes but for fp8 NaN's sign bit:
    tests/hadamard/test_hadamard_quantize.py; the GPU check experiments/hadamard/gpu_quantize_probe.py).
    FAST: y times the group's reciprocal, one multiply a value (no Markstein correction), the same on the GPU
    and in the interpreter; recip may carry the rotation's 1 / sqrt(n) (_pow2 kernel's fold). Two roundings
    (of 1 / s, then of y r) instead of one: a quotient within ~1 ulp of a rounding boundary of the format
    can land on the other side, so a code can move by one step there (<= 1e-4 of codes measured: tests).
    INT_BITS (int8 / int4 with FAST): the integer codes by _int_bits (y recip rounded once)."""
    if FAST:
        if INT_BITS:
            tl.static_assert(FORMAT == INT8 or FORMAT == INT4, "INT_BITS: int8 / int4")
            code = _int_bits(y, recip, div)
            if FORMAT == INT4:
                code = code & 0xF
            return code
        q = y * recip  # recip = 0 where s = inf: y x 0 = y / inf (0, NaN for inf); NaN where s is NaN
        if FORMAT == MXFP4:
            code = tl.where(stored == 255, 0, _e2m1_fast(q))
        elif FORMAT == NVFP4:
            code = tl.where(div < float("inf"), _e2m1_fast(q), 0)  # NaN div: the comparison is false
        elif FORMAT == E4M3 or FORMAT == E5M2:
            code = _fp8_fast(q, FORMAT)
        else:
            if _INTERPRETED:
                code = tl.where(q != q, 0, _rint(q).to(tl.int32))
            else:
                code = tl.extra.cuda.libdevice.float2int_rn(q)
            if FORMAT == INT4:
                code = code & 0xF
        return code
    if FORMAT == MXFP4:
        code = tl.where(stored == 255, 0, _e2m1_fast(y * (1.0 / div)))  # 1 / 2^e is exact
    elif FORMAT == NVFP4:
        code = tl.where(div == div, _e2m1_fast(_quotient(y, div, recip, div_e, False)), 0)
        code = tl.where(div < float("inf"), code, 0)
    elif FORMAT == E4M3 or FORMAT == E5M2:
        code = _fp8_fast(_quotient(y, div, recip, div_e, STATIC), FORMAT)
    else:
        # int8, int4: dynamic scales only, so |y / s| <= qmax (1 + 2^-23) rounds within +-qmax: no clamp
        v = _quotient(y, div, recip, div_e, False)
        if _INTERPRETED:
            code = tl.where(v != v, 0, _rint(v).to(tl.int32))
        else:
            code = tl.extra.cuda.libdevice.float2int_rn(v)  # cvt.rni: half to even, NaN -> 0
        if FORMAT == INT4:
            code = code & 0xF
    return code


@triton.jit
def _sylvester_cols_permuted(N2: tl.constexpr, dtype: tl.constexpr):
    """H_N2 with its columns permuted: column 8 j + 2 q + b of the tile is column q N2 / 4 + 2 j + b of H_N2
    (j < N2 / 8, q < 4, b < 2). In the tensor cores' accumulator a thread holds columns 8 j + 2 q + b for one
    q (its lane mod 4): with this tile they are the 8 consecutive outputs q N2 / 4 .. q N2 / 4 + 7."""
    i = tl.arange(0, N2)[:, None]
    c = tl.arange(0, N2)[None, :]
    v = i & (((c // 2) % 4) * (N2 // 4) + (c // 8) * 2 + c % 2)
    v = v ^ (v >> 8)  # the parity of popcount(i & column), as tiles.hadamard.sylvester_tile
    v = v ^ (v >> 4)
    v = v ^ (v >> 2)
    v = v ^ (v >> 1)
    return tl.where((v & 1) == 0, 1.0, -1.0).to(dtype)


@triton.jit
def _pow2_transformed(x, signs, rows, stride_x, tile, s, N: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr,
                      B: tl.constexpr, TMA: tl.constexpr, SIGNS: tl.constexpr, IN_PIECES: tl.constexpr,
                      MID_PIECES: tl.constexpr, MMA_DTYPE: tl.constexpr, PIECE_DTYPE: tl.constexpr,
                      PERM: tl.constexpr = False):
    """Slice s of ``tile``'s B rows, times the signs (exact: +-1), transformed: [B N1, N2] float32.
    PERM (N2 a multiple of 8): the last product by _sylvester_cols_permuted, then the columns relabelled back to
    their order (reshape and permute: no data moves), so that each thread holds N2 / 4 consecutive outputs of a row
    (at N2 = 32 one 4-byte word of nibbles, 8 bytes of fp8) instead of pairs 8 apart: at N2 = 64 an nvfp4 group of
    16, at N2 = 128 an mxfp4 group of 32, is one thread's. N1 == 1: the one product x H_N2 so (exact 16-bit x)."""
    v = kernels._load_slice(x, rows, stride_x, tile, s, N, N1, N2, B, TMA)  # [B, N1, N2]
    if SIGNS:
        i = tl.arange(0, N1)
        j = tl.arange(0, N2)
        sg = tl.load(signs + s * N1 * N2 + i[:, None] * N2 + j[None, :], mask=j[None, :] < N, other=0.0)
        v = (v.to(tl.float32) * sg.to(tl.float32)[None, :, :]).to(v.dtype)
    if PERM and N1 == 1:
        x2 = tl.reshape(v, (B, N2))
        if IN_PIECES == 1:
            z = tl.dot(x2.to(MMA_DTYPE), _sylvester_cols_permuted(N2, MMA_DTYPE), out_dtype=tl.float32)
        else:
            z = kernels._split_dot(x2.to(tl.float32), _sylvester_cols_permuted(N2, PIECE_DTYPE), True, IN_PIECES,
                                   PIECE_DTYPE)
        z = tl.reshape(tl.permute(tl.reshape(z, (B, N2 // 8, 4, 2)), (0, 2, 1, 3)), (B, N2))
    elif PERM:
        if IN_PIECES == 1:
            h1 = sylvester_tile(N1, N1, N1, MMA_DTYPE)
        else:
            h1 = sylvester_tile(N1, N1, N1, PIECE_DTYPE)
        if B == 1:
            x1 = tl.reshape(v, (N1, N2))
            if IN_PIECES == 1:
                y = tl.dot(h1, x1.to(MMA_DTYPE), out_dtype=tl.float32)
            else:
                y = kernels._split_dot(h1, x1.to(tl.float32), False, IN_PIECES, PIECE_DTYPE)
        else:  # one product per row (batched), so that rows never mix
            h1b = tl.broadcast_to(h1[None, :, :], (B, N1, N1))
            if IN_PIECES == 1:
                y = tl.dot(h1b, v.to(MMA_DTYPE), out_dtype=tl.float32)
            else:
                y = kernels._split_dot(h1b, v.to(tl.float32), False, IN_PIECES, PIECE_DTYPE)
            y = tl.reshape(y, (B * N1, N2))
        z = kernels._split_dot(y, _sylvester_cols_permuted(N2, PIECE_DTYPE), True, MID_PIECES, PIECE_DTYPE)
        z = tl.reshape(tl.permute(tl.reshape(z, (B * N1, N2 // 8, 4, 2)), (0, 2, 1, 3)), (B * N1, N2))
    else:
        z = kernels._slice_transform(v, N, N1, N2, B, IN_PIECES, MID_PIECES, MMA_DTYPE, PIECE_DTYPE)
    return z


@triton.jit
def _pow2_store_codes(codes, rows, stride_codes, tile, s, code, N: tl.constexpr, N1: tl.constexpr,
                      N2: tl.constexpr, B: tl.constexpr, PACKED: tl.constexpr, TMA: tl.constexpr,
                      PAIRED: tl.constexpr = False):
    """A slice's codes ([B N1, N2] int32): bytes, or (PACKED) nibble pairs, element 2j low, at j / 2; PAIRED: ``code``
    is those pairs already ([B N1, N2 / 2], the byte in the low 8 bits).
    TMA: ``codes`` is a descriptor over the codes as (rows, columns / W, W) bytes with [B, N1, W] boxes
    (W = N2, or N2 / 2 packed): registers -> shared memory -> one bulk copy, rows past the end clipped."""
    if PAIRED:
        byte = code.to(tl.uint8)
        W: tl.constexpr = N2 // 2
    elif PACKED:
        lo, hi = tl.split(tl.reshape(code, (B * N1, N2 // 2, 2)))
        byte = (lo | (hi << 4)).to(tl.uint8)
        W: tl.constexpr = N2 // 2
    else:
        byte = code.to(tl.uint8)
        W: tl.constexpr = N2
    if TMA:
        codes.store([tile * B, s * N1, 0], tl.reshape(byte, (B, N1, W)))
    else:
        r = tl.arange(0, B * N1)
        row = (r // N1).to(tl.int64) + tile * B  # 64-bit: rows * stride may pass 2^31
        col = (s * N1 * N2 + (r % N1) * N2) // (N2 // W)
        j = tl.arange(0, W)
        offs = row[:, None] * stride_codes + col[:, None] + j[None, :]
        mask = (row[:, None] < rows) & (j[None, :] * (N2 // W) < N)
        tl.store(codes + offs, byte, mask=mask)


@triton.jit
def _pow2_quantize_slice(codes, scales, gscale, rows, stride_codes, stride_scales, tile, s, y, row_div, row_stored,
                         row_recip, row_div_e, rscale, N: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr,
                         B: tl.constexpr, FORMAT: tl.constexpr, G: tl.constexpr, STATIC: tl.constexpr,
                         PACKED: tl.constexpr, QMAX: tl.constexpr, TMA_STORE: tl.constexpr, FAST: tl.constexpr,
                         E2M1_PAIRS: tl.constexpr = False, INT_BITS: tl.constexpr = False):
    """Scales (groups of G inside this slice; G == N: the row's, given as row_* [B N1]) and codes of
    slice s, y: [B N1, N2] float32 (FAST: not yet times rscale, which joins each group's amax and
    reciprocal instead: RN(max |y| r) = max RN(|y| r), so the scales are the same). E2M1_PAIRS (mxfp4 / nvfp4, FAST,
    groups inside a tile row): a column pair's byte by _e2m1_pair, the groups not kept zeroed once a byte."""
    R: tl.constexpr = B * N1
    if G == N:
        code = _codes_fast(y, row_div[:, None], row_stored[:, None], row_recip[:, None], row_div_e[:, None],
                           FORMAT, QMAX, STATIC, FAST, INT_BITS)
    elif G < N2:  # groups inside a tile row: [R, N2 / G, G]
        y3 = tl.reshape(y, (R, N2 // G, G))
        ga = _amax(y3, 2)  # [R, N2 / G]
        if FAST:
            ga = ga * rscale
        div, stored = _scale(ga, gscale, FORMAT, STATIC, QMAX)
        recip, div_e = _group_divisor(div, FORMAT)
        if FAST:
            recip = recip * rscale
        r = tl.arange(0, R)
        row = (r // N1).to(tl.int64) + tile * B
        k = tl.arange(0, N2 // G)
        col = (s * N1 * N2 + (r % N1) * N2) // G
        tl.store(scales + row[:, None] * stride_scales + col[:, None] + k[None, :],
                 stored.to(scales.dtype.element_ty), mask=row[:, None] < rows)
        if E2M1_PAIRS:
            tl.static_assert(FAST and (FORMAT == MXFP4 or FORMAT == NVFP4), "E2M1_PAIRS: mxfp4 / nvfp4 with FAST")
            q0, q1 = tl.split(tl.reshape(y3 * recip[:, :, None], (R, N2 // G, G // 2, 2)))
            if FORMAT == MXFP4:
                keep = stored != 255
            else:
                keep = div < float("inf")  # (NaN: false)
            code = tl.reshape(tl.where(keep[:, :, None], _e2m1_pair(q0, q1), 0), (R, N2 // 2))
        else:
            code = tl.reshape(_codes_fast(y3, div[:, :, None], stored[:, :, None], recip[:, :, None],
                                          div_e[:, :, None], FORMAT, QMAX, STATIC, FAST, INT_BITS), (R, N2))
    else:  # groups of SPAN consecutive tile rows (of one row: N1 % SPAN == 0)
        SPAN: tl.constexpr = G // N2
        if SPAN == 1:
            ga = _amax(y, 1)  # [R]
        else:
            ga = _amax(tl.reshape(_amax(y, 1), (R // SPAN, SPAN)), 1)  # [groups]
        if FAST:
            ga = ga * rscale
        div, stored = _scale(ga, gscale, FORMAT, STATIC, QMAX)
        gi = tl.arange(0, R // SPAN)
        row = (gi // (N1 // SPAN)).to(tl.int64) + tile * B
        col = (s * N1 * N2) // G + gi % (N1 // SPAN)
        tl.store(scales + row * stride_scales + col, stored.to(scales.dtype.element_ty), mask=row < rows)
        recip, div_e = _group_divisor(div, FORMAT)
        if FAST:
            recip = recip * rscale
        if SPAN > 1:
            div = tl.reshape(tl.broadcast_to(div[:, None], (R // SPAN, SPAN)), (R,))
            stored = tl.reshape(tl.broadcast_to(stored[:, None], (R // SPAN, SPAN)), (R,))
            recip = tl.reshape(tl.broadcast_to(recip[:, None], (R // SPAN, SPAN)), (R,))
            div_e = tl.reshape(tl.broadcast_to(div_e[:, None], (R // SPAN, SPAN)), (R,))
        code = _codes_fast(y, div[:, None], stored[:, None], recip[:, None], div_e[:, None], FORMAT, QMAX, STATIC,
                           FAST, INT_BITS)
    _pow2_store_codes(codes, rows, stride_codes, tile, s, code, N, N1, N2, B, PACKED, TMA_STORE,
                      E2M1_PAIRS and G < N2)


@triton.jit
def _pow2_row_scale(scales, gscale, rows, stride_scales, tile, a, rscale, N1: tl.constexpr, B: tl.constexpr,
                    FORMAT: tl.constexpr, STATIC: tl.constexpr, QMAX: tl.constexpr, FAST: tl.constexpr):
    """The per-token scale from each tile row's largest |y| over the slices (a: [B N1]): stored once a
    row, returned (divisor, stored, _group_divisor's pair) broadcast back to the tile rows ([B N1] each).
    One row a tile (B == 1): the scale is a scalar, broadcast for free (no reshape: Triton converts the
    layouts of the reshaped vectors through shared memory, with barriers)."""
    if B == 1 and N1 > 1:
        div, stored = _scale(_amax(a, 0), gscale, FORMAT, STATIC, QMAX)
        if not STATIC:
            tl.store(scales + tl.cast(tile, tl.int64) * stride_scales, stored.to(scales.dtype.element_ty), mask=tile < rows)
        recip, div_e = _group_divisor(div, FORMAT)
        if FAST:
            recip = recip * rscale
        zero = tl.zeros([N1], tl.float32)
        return div + zero, stored + tl.zeros([N1], stored.dtype), recip + zero, div_e + zero
    if N1 == 1:
        ra = a
    else:
        ra = _amax(tl.reshape(a, (B, N1)), 1)  # [B]
    div, stored = _scale(ra, gscale, FORMAT, STATIC, QMAX)
    if not STATIC:
        row = tl.arange(0, B).to(tl.int64) + tile * B
        tl.store(scales + row * stride_scales, stored.to(scales.dtype.element_ty), mask=row < rows)
    recip, div_e = _group_divisor(div, FORMAT)
    if FAST:
        recip = recip * rscale  # a was already scaled (the kernel's fold)
    if N1 > 1:
        div = tl.reshape(tl.broadcast_to(div[:, None], (B, N1)), (B * N1,))
        stored = tl.reshape(tl.broadcast_to(stored[:, None], (B, N1)), (B * N1,))
        recip = tl.reshape(tl.broadcast_to(recip[:, None], (B, N1)), (B * N1,))
        div_e = tl.reshape(tl.broadcast_to(div_e[:, None], (B, N1)), (B * N1,))
    return div, stored, recip, div_e


@triton.jit
def pow2_quantize_kernel(x, codes, scales, signs, gscale, amax_out, rows, stride_x, stride_codes, stride_scales,
                         rscale, N: tl.constexpr, S: tl.constexpr, N1: tl.constexpr, N2: tl.constexpr,
                         B: tl.constexpr, IN_PIECES: tl.constexpr, MID_PIECES: tl.constexpr,
                         MMA_DTYPE: tl.constexpr, PIECE_DTYPE: tl.constexpr, GRID: tl.constexpr,
                         TMA_LOAD: tl.constexpr, TMA_STORE: tl.constexpr, SIGNS: tl.constexpr, FORMAT: tl.constexpr,
                         G: tl.constexpr, STATIC: tl.constexpr, PACKED: tl.constexpr, QMAX: tl.constexpr,
                         FAST: tl.constexpr = False, PERM: tl.constexpr = False, E2M1_PAIRS: tl.constexpr = False,
                         INT_BITS: tl.constexpr = False):
    """codes, scales = quantize(rscale * H_N (signs * x)) for ``rows`` rows of N = S N1 N2 (a power of two);
    a persistent grid of GRID programs, B rows a tile. ``x`` is a pointer, or with TMA_LOAD a descriptor
    with [B, N1, N2] boxes (kernels._load_slice); ``codes`` with TMA_STORE one too (_pow2_store_codes). Groups of G elements (G == N: per token). FORMAT == AMAX:
    only each program's largest |y|, written to amax_out[program] (nvfp4's dynamic global scale)."""
    tiles = tl.cdiv(rows, B)
    run_max = tl.zeros([B * N1], tl.float32)
    for tile in range(tl.program_id(0), tiles, GRID):
        t0 = _pow2_transformed(x, signs, rows, stride_x, tile, 0, N, N1, N2, B, TMA_LOAD, SIGNS, IN_PIECES,
                               MID_PIECES, MMA_DTYPE, PIECE_DTYPE, PERM)
        o0 = t0
        o1 = t0
        o2 = t0
        o3 = t0
        if S > 1:
            t1 = _pow2_transformed(x, signs, rows, stride_x, tile, 1, N, N1, N2, B, TMA_LOAD, SIGNS, IN_PIECES,
                                   MID_PIECES, MMA_DTYPE, PIECE_DTYPE, PERM)
            if S == 2:
                o0 = t0 + t1
                o1 = t0 - t1
            else:  # S == 4
                t2 = _pow2_transformed(x, signs, rows, stride_x, tile, 2, N, N1, N2, B, TMA_LOAD, SIGNS, IN_PIECES,
                                       MID_PIECES, MMA_DTYPE, PIECE_DTYPE, PERM)
                t3 = _pow2_transformed(x, signs, rows, stride_x, tile, 3, N, N1, N2, B, TMA_LOAD, SIGNS, IN_PIECES,
                                       MID_PIECES, MMA_DTYPE, PIECE_DTYPE, PERM)
                o0, o1, o2, o3 = butterfly4(t0, t1, t2, t3)
        if not FAST:  # FAST: rscale joins the amax and the reciprocals instead (_pow2_quantize_slice)
            o0 = o0 * rscale
            if S > 1:
                o1 = o1 * rscale
            if S > 2:
                o2 = o2 * rscale
                o3 = o3 * rscale
        if FORMAT == AMAX or G == N:
            # elementwise over the slices first, then one reduction along the slice's columns (each
            # reduction crosses threads: S of them cost S times the shuffles)
            m = tl.abs(o0)
            if S > 1:
                m = _max_nan(m, tl.abs(o1))
            if S > 2:
                m = _max_nan(_max_nan(m, tl.abs(o2)), tl.abs(o3))
            a = _amax(m, 1)
            if FAST:
                a = a * rscale
        if FORMAT == AMAX:
            run_max = _max_nan(run_max, a)
        else:
            if G == N:
                row_div, row_stored, row_recip, row_div_e = _pow2_row_scale(scales, gscale, rows, stride_scales, tile,
                                                                            a, rscale, N1, B, FORMAT, STATIC, QMAX,
                                                                            FAST)
            else:
                row_div = tl.zeros([B * N1], tl.float32)
                row_stored = row_div
                row_recip = row_div
                row_div_e = row_div
            _pow2_quantize_slice(codes, scales, gscale, rows, stride_codes, stride_scales, tile, 0, o0, row_div,
                                 row_stored, row_recip, row_div_e, rscale, N, N1, N2, B, FORMAT, G, STATIC, PACKED,
                                 QMAX, TMA_STORE, FAST, E2M1_PAIRS, INT_BITS)
            if S > 1:
                _pow2_quantize_slice(codes, scales, gscale, rows, stride_codes, stride_scales, tile, 1, o1, row_div,
                                     row_stored, row_recip, row_div_e, rscale, N, N1, N2, B, FORMAT, G, STATIC, PACKED,
                                     QMAX, TMA_STORE, FAST, E2M1_PAIRS, INT_BITS)
            if S > 2:
                _pow2_quantize_slice(codes, scales, gscale, rows, stride_codes, stride_scales, tile, 2, o2, row_div,
                                     row_stored, row_recip, row_div_e, rscale, N, N1, N2, B, FORMAT, G, STATIC, PACKED,
                                     QMAX, TMA_STORE, FAST, E2M1_PAIRS, INT_BITS)
                _pow2_quantize_slice(codes, scales, gscale, rows, stride_codes, stride_scales, tile, 3, o3, row_div,
                                     row_stored, row_recip, row_div_e, rscale, N, N1, N2, B, FORMAT, G, STATIC, PACKED,
                                     QMAX, TMA_STORE, FAST, E2M1_PAIRS, INT_BITS)
    if FORMAT == AMAX:
        tl.store(amax_out + tl.program_id(0), _amax(run_max, 0))
