"""hadamard_quantize's epilogue on the Gluon kernels (gluon_quantize_wide.py, gluon_quantize_kron.py; issue 32:
one copy for both): the codes and scales of [64, 64] float32 blocks in the wgmma accumulator layout
(a thread holds column pairs 2i, 2i + 1 of two sub-rows), in quantize_kernels' FAST arithmetic (y times the group's
reciprocal; fp8 by cvt.rn.satfinite, ints by cvt.rni, e2m1 by the exponent-made magic number; nvfp4's scale by
Markstein divisions and cvt e4m3).

The op-level pieces take the kernel's op struct (its fields: scales, gscale, stride_scales, rows, rscale, xchg, xbar,
M, FORMAT, G, STATIC, QMAX, SCALE_ONCE, FOLD, E2M1_PAIRS) and, where the kernels lay their scales out differently, call
back the op's ``_group_slots`` / ``_pair_slots`` for the scale offsets and masks.
"""
from triton.experimental import gluon
from triton.language import core as _tl_core

from tilecore.tiles.gluon.compat import gl, mbarrier
from tilecore.tiles.hadamard import bf16_pieces

# FORMAT ids (quantize_reference.FORMATS' kernel_id, quantize_kernels' constants), nvfp4's first pass, the values
E4M3: gl.constexpr = gl.constexpr(0)
E5M2: gl.constexpr = gl.constexpr(1)
INT8: gl.constexpr = gl.constexpr(2)
MXFP4: gl.constexpr = gl.constexpr(3)
NVFP4: gl.constexpr = gl.constexpr(4)
INT4: gl.constexpr = gl.constexpr(5)
AMAX: gl.constexpr = gl.constexpr(6)  # each row's largest |y| into amax_out[row] (nvfp4's dynamic global scale)
STORE: gl.constexpr = gl.constexpr(7)  # the rotated values themselves (x's dtype): the plain transform

BLOCK: gl.constexpr = gl.constexpr(64)  # a block's sub-rows and columns


@gluon.jit
def _max_nan(a, b):
    return gl.maximum(a, b, propagate_nan=_tl_core.PropagateNan.ALL)  # max.NaN: a NaN wins


@gluon.jit
def _amax(v, axis: gl.constexpr):
    """max |v| along ``axis``, NaN where any element is NaN (gl.max drops NaN)."""
    return gl.reduce(gl.abs(v), axis, _max_nan)


@gluon.jit
def _rni(q):
    """q rounded to the nearest integer, ties to even, as int32 (cvt.rni; NaN -> 0)."""
    return gl.inline_asm_elementwise("cvt.rni.s32.f32 $0, $1;", "=r,r", [q], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _int_bits(q):
    """INT_BITS: the integer code of q (|q| <= qmax (1 + 2^-22)) in the low bits of q + 1.5 x 2^23 (the sum rounds q
    half to even onto an integer left in its low mantissa bits: its low byte is the code's two's-complement byte, its
    low nibble int4's), with no conversion instruction (cvt.rni's F2I): quantize_kernels._int_bits. NaN q gives bits
    that are no code: callers zero them (the group's keep mask, or token_codes' max)."""
    return (q + 12582912.0).to(gl.int32, bitcast=True)


@gluon.jit
def _e2m1_fast(v):
    """The e2m1 nibble of float32 v, saturating at +-6, ties to even (quantize_kernels._e2m1_fast: M = 1.5 x 2^23
    times the binade's step, built from the exponent bits, added to |v| leaves the code in the low bits)."""
    a = gl.minimum(gl.abs(v), 6.0)
    e = gl.maximum(a.to(gl.int32, bitcast=True) >> 23, 127)
    magic = (e * 0x800002 + 0x0B3FFF02).to(gl.float32, bitcast=True)
    mag = (a + magic).to(gl.int32, bitcast=True) & 7
    return mag | ((v.to(gl.int32, bitcast=True) >> 28) & 8)


@gluon.jit
def _e2m1_pair(q0, q1):
    """The byte of two e2m1 nibbles, q0's low (_pack(_e2m1_fast) of a column pair, bit for bit in its low 8 bits; the
    bits above are not zero: the byte store truncates). _e2m1_fast's sum t = bits(|v| + M) holds the magnitude code in
    its bits 0-2 and zeros in bits 3-21 (M's mantissa is 1.5's plus at most 7 units), so t0 + 16 t1 has both
    magnitudes in its low byte; the signs go to bits 3 and 7 by arithmetic shifts of the float32 bits: no mask of
    each code and no separate pack (E2M1_PAIRS)."""
    a0 = gl.minimum(gl.abs(q0), 6.0)
    a1 = gl.minimum(gl.abs(q1), 6.0)
    e0 = gl.maximum(a0.to(gl.int32, bitcast=True) >> 23, 127)
    e1 = gl.maximum(a1.to(gl.int32, bitcast=True) >> 23, 127)
    t0 = (a0 + (e0 * 0x800002 + 0x0B3FFF02).to(gl.float32, bitcast=True)).to(gl.int32, bitcast=True)
    t1 = (a1 + (e1 * 0x800002 + 0x0B3FFF02).to(gl.float32, bitcast=True)).to(gl.int32, bitcast=True)
    s0 = (q0.to(gl.int32, bitcast=True) >> 28) & 8
    return (t0 + (t1 << 4)) | s0 | ((q1.to(gl.int32, bitcast=True) >> 24) & 0x80)


@gluon.jit
def _fp8(q, FORMAT: gl.constexpr):
    """The fp8 byte of float32 q (cvt.rn.satfinite: saturating, NaN to the format's NaN), as int32."""
    if FORMAT == E4M3:
        code = q.to(gl.float8e4nv, fp_downcast_rounding="rtne")
    else:
        code = q.to(gl.float8e5, fp_downcast_rounding="rtne")
    return code.to(gl.uint8, bitcast=True).to(gl.int32)


@gluon.jit
def _div_by(y, d, r):
    """y / d correctly rounded given r = RN(1 / d) (quantize_kernels._div_by: Markstein's correction)."""
    q = y * r
    return gl.where(gl.abs(q) == float("inf"), q, gl.fma(gl.fma(-q, d, y), r, q))


@gluon.jit
def _group_scale(ga, gscale, FORMAT: gl.constexpr, QMAX: gl.constexpr, INT_BITS: gl.constexpr = False):
    """(the reciprocal codes multiply by, the byte or float stored, the codes' keep mask) from a group's
    amax ``ga`` (quantize_kernels._scale and _group_divisor, FAST). int4 keeps a group whose amax is not NaN; with
    INT_BITS (_int_bits) one whose amax is finite (an inf group's codes are 0 either way: y x 0, and inf x 0 = NaN,
    which cvt.rni makes 0 but _int_bits does not)."""
    if FORMAT == MXFP4:
        e = gl.minimum(gl.maximum(((ga.to(gl.int32, bitcast=True) >> 23) & 0xFF) - 127 - 2, -127), 127)
        finite = (ga == ga) & (ga < float("inf"))
        # 1 / 2^e from the exponent bits: 2^-e for e > -127, 2^127 for e = -127 (then 2^e is subnormal 2^-127)
        recip = gl.where(e == -127, 0x7F000000, gl.where(e == 127, 0x00400000, (127 - e) << 23)).to(gl.float32,
                                                                                                     bitcast=True)
        stored = gl.where(finite, e + 127, 255)
        keep = finite
    elif FORMAT == NVFP4:
        g = gl.load(gscale)
        s = _div_by(_div_by(ga, 6.0, 1.0 / 6.0), g, 1.0 / g)
        s = gl.where(s != s, s, gl.minimum(gl.maximum(s, 0.015625), 448.0))
        s_fp8 = s.to(gl.float8e4nv, fp_downcast_rounding="rtne")
        stored = s_fp8.to(gl.uint8, bitcast=True).to(gl.int32)
        div = gl.where(ga < float("inf"), g * s_fp8.to(gl.float32), float("nan"))
        recip = gl.div_rn(gl.full_like(div, 1.0), div)
        keep = div < float("inf")  # NaN div: false
    else:  # int4's groups, dynamic: s = amax / qmax (1 where amax is 0)
        div = gl.where(ga == 0, 1.0, gl.div_rn(ga, gl.full_like(ga, QMAX)))
        recip = gl.div_rn(gl.full_like(div, 1.0), div)
        stored = div
        keep = ga < float("inf") if INT_BITS else ga == ga
    return recip, stored, keep


@gluon.jit
def _scales_once(ga, gscale, FORMAT: gl.constexpr, QMAX: gl.constexpr):
    """_group_scale of the [64, GR] group maxima computed once a group: in a layout of one or two groups a thread
    (not each group on every thread of its quad, as the accumulator layout's reduction leaves them), then the
    reciprocals and keep masks back in ga's layout. Returns (recip, keep in ga's layout; stored in the compact
    layout)."""
    SL: gl.constexpr = ga.type.layout
    GR: gl.constexpr = ga.shape[1]
    DL: gl.constexpr = gl.BlockedLayout([1, GR // 2], [16, 2], [gl.num_warps(), 1], [1, 0])
    recip, stored, keep = _group_scale(gl.convert_layout(ga, DL), gscale, FORMAT, QMAX)
    keep = gl.convert_layout(keep.to(gl.int8), SL) != 0
    return gl.convert_layout(recip, SL), keep, stored


@gluon.jit
def _pack(code, ROWS: gl.constexpr, COLS: gl.constexpr):
    """[ROWS, COLS] nibbles -> [ROWS, COLS / 2] bytes, element 2i low (a thread holds each column pair)."""
    lo, hi = gl.split(gl.reshape(code, [ROWS, COLS // 2, 2]))
    return (lo & 0xF) | ((hi & 0xF) << 4)


@gluon.jit
def relabel(y):
    """PERM: a [R, 64] block of the second product by the column-permuted H_64 (gluon_operand's perm: its
    column c = 8 j + 2 q + b is H_64's column 16 q + 2 j + b, so the wgmma accumulator's column c holds output
    16 q + 2 j + b) relabelled into the outputs' order: [R, 8 (j), 4 (q), 2 (b)] -> [R, 4, 8, 2]. A thread (q its lane
    mod 4) then holds 16 consecutive outputs of its sub-rows: no data moves."""
    R: gl.constexpr = y.shape[0]
    return gl.reshape(gl.permute(gl.reshape(y, [R, 8, 4, 2]), [0, 2, 1, 3]), [R, 64])


LO_FLOOR: gl.constexpr = gl.constexpr(-2.0**120)  # pieces' CLAMP: below any finite lo of a float32 (|lo| < 2^119)


@gluon.jit
def pieces(x, CLAMP: gl.constexpr):
    """float32 ``x`` as hi + lo, two bf16 tiles (the second product's A: kernels.py's accuracy design). Without CLAMP,
    tiles.hadamard.bf16_pieces (lo 0 where hi holds x whole: a compare and a select a value). CLAMP:
    lo = max(x - h, -2^120), one max a value: the same lo for every finite x (x - h is exact and above -2^119); for an
    infinite x, x - h is NaN and max returns -2^120, finite, so the product stays the infinity hi makes it (64 terms of
    2^120 are far from float32's overflow). CLAMP == 2: the same pieces, hi's pairs converted once (below)."""
    if CLAMP == 2:  # PAIRS: a column pair's hi by one cvt.rn.bf16x2 and its float32 values by a shift and a
        # mask of that word, in one asm block: Triton's x.to(bf16) then hi.to(float32) made ptxas split the conversion
        # into two F2F and a PRMT, then unpack it by two IMAD.U32 (5 instructions a pair against 3). Bit-identical.
        hi, h = gl.inline_asm_elementwise(
            "cvt.rn.bf16x2.f32 $0, $4, $3; shl.b32 $1, $0, 16; and.b32 $2, $0, -65536;", "=r,=r,=r,r,r", [x],
            dtype=(gl.bfloat16, gl.float32), is_pure=True, pack=2)
        lo = gl.maximum(x - h, LO_FLOOR).to(gl.bfloat16)
    elif CLAMP:
        hi = x.to(gl.bfloat16)
        lo = gl.maximum(x - hi.to(gl.float32), LO_FLOOR).to(gl.bfloat16)
    else:
        hi, lo = bf16_pieces(x)
    return hi, lo


@gluon.jit
def folded(op, v):
    """FOLD: v x rscale (a maximum of the unscaled products, or a reciprocal: y / s = W x (rscale / s)); else v."""
    if op.FOLD:
        v = v * op.rscale
    return v


@gluon.jit
def row_amax(ys, N: gl.constexpr):
    """The largest |y| over the first N blocks of ``ys`` (NaN if any is)."""
    m = gl.abs(ys[0])
    for v in gl.static_range(1, N):
        m = _max_nan(m, gl.abs(ys[v]))
    return _amax(_amax(m, 1), 0)


@gluon.jit
def exchange(op, ctx, a, t):
    """max(a, the other consumer's a) for a row the two consumers share (NaN if either is): each writes its own into
    the tile parity's slot of op.xchg, arrives on that parity's barrier of op.xbar, waits for both, reads the other's."""
    L1: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    slot = t & 1
    op.xchg.index(2 * slot + ctx.index).store(gl.full([1], a, gl.float32, L1))
    mbarrier.arrive(op.xbar.index(slot))  # releases the store above (the arriving thread made it too)
    mbarrier.wait(op.xbar.index(slot), (t >> 1) & 1)
    other = gl.reduce(op.xchg.index(2 * slot + 1 - ctx.index).load(L1), 0, _max_nan)
    return _max_nan(a, other)


@gluon.jit
def token_recip(op, a, row, STORE_SCALE: gl.constexpr):
    """One scale a row from its amax ``a``: the divisor (a / QMAX, 1 where a is 0; fp8 static: the given scale),
    stored at scales[row] where STORE_SCALE; returns the reciprocal the codes multiply by (0 where the divisor is
    inf: y x 0 = y / inf)."""
    if op.STATIC:
        div = gl.load(op.gscale)
    else:
        # (a tensor of QMAX, not QMAX + 0 x a: an inf amax must give an inf scale, as the reference's)
        div = gl.where(a == 0, 1.0, gl.div_rn(a, gl.where(a == 0, op.QMAX, op.QMAX)))
        if STORE_SCALE:
            gl.store(op.scales + row.to(gl.int64) * op.stride_scales, div, mask=row < op.rows)
    return folded(op, gl.div_rn(gl.where(div == 0, 1.0, 1.0), div))


@gluon.jit
def token_codes(q, FORMAT: gl.constexpr, INT_BITS: gl.constexpr = False):
    """Codes of q = y / s (one scale a row) as int32. INT_BITS (int8): by _int_bits, q + 1.5 x 2^23 held at or above
    1.5 x 2^23 - 256 (max.f32 returns the other operand for NaN, whose code is then 0 as cvt.rni's; finite sums are
    within 128 of 1.5 x 2^23 and unchanged)."""
    if FORMAT == INT8:
        if INT_BITS:
            code = gl.maximum(q + 12582912.0, 12582656.0).to(gl.int32, bitcast=True)
        else:
            code = _rni(q)
    else:
        code = _fp8(q, FORMAT)
    return code


@gluon.jit
def group_codes(op, y, row, K0: gl.constexpr, K1: gl.constexpr):
    """A block's group scales (stored) and codes (returned, packed bytes as int32): groups of G <= 64 inside a
    sub-row (the scales at op._group_slots), or spanning G / 64 sub-rows (int4's 128: a sub-row pair, at
    op._pair_slots). K0, K1: the block's place, as the op's slot functions read it."""
    L: gl.constexpr = y.type.layout
    if op.G <= BLOCK:
        GR: gl.constexpr = BLOCK // op.G  # groups a sub-row
        y3 = gl.reshape(y, [BLOCK, GR, op.G])
        ga = folded(op, _amax(y3, 2))  # [64, GR], each held by every thread holding a part of the group
        if op.SCALE_ONCE:
            recip, keep, stored = _scales_once(ga, op.gscale, op.FORMAT, op.QMAX)
            SL: gl.constexpr = stored.type.layout  # the scales' stores from the compact layout: once a group
        else:
            recip, stored, keep = _group_scale(ga, op.gscale, op.FORMAT, op.QMAX, op.INT_BITS)
            SL: gl.constexpr = recip.type.layout
        offs, mask = op._group_slots(SL, GR, row, K0, K1)
        gl.store(op.scales + row.to(gl.int64) * op.stride_scales + offs, stored.to(op.scales.dtype.element_ty),
                 mask=mask)
        q = y3 * gl.expand_dims(folded(op, recip), 2)
        if op.E2M1_PAIRS and op.FORMAT != INT4:  # a byte a column pair, 0 in the groups not kept
            q0, q1 = gl.split(gl.reshape(gl.convert_layout(gl.reshape(q, [BLOCK, BLOCK]), L), [BLOCK, BLOCK // 2, 2]))
            b = _e2m1_pair(q0, q1)
            PL: gl.constexpr = b.type.layout
            b3 = gl.reshape(b, [BLOCK, GR, op.G // 2])
            k3 = gl.expand_dims(gl.convert_layout(keep, gl.SliceLayout(2, b3.type.layout)), 2)
            packed = gl.convert_layout(gl.reshape(gl.where(k3, b3, 0), [BLOCK, BLOCK // 2]), PL)
        else:
            if op.FORMAT == INT4:
                code = _int_bits(q) if op.INT_BITS else _rni(q)
            else:
                code = _e2m1_fast(q)
            code = gl.where(gl.expand_dims(keep, 2), code, 0)
            packed = _pack(gl.convert_layout(gl.reshape(code, [BLOCK, BLOCK]), L), BLOCK, BLOCK)
    else:  # groups of SPG sub-rows (int4's 128: a sub-row pair)
        SPG: gl.constexpr = op.G // BLOCK
        y3 = gl.reshape(y, [BLOCK // SPG, SPG, BLOCK])
        recip, stored, keep = _group_scale(folded(op, _amax(_amax(y3, 2), 1)), op.gscale, op.FORMAT, op.QMAX,
                                           op.INT_BITS)
        recip = folded(op, recip)
        SL: gl.constexpr = recip.type.layout
        offs, last, mask = op._pair_slots(SL, row, K0, K1)  # (the kron kernel's pair index added last, as it was)
        gl.store(op.scales + row.to(gl.int64) * op.stride_scales + offs + last, stored.to(op.scales.dtype.element_ty),
                 mask=mask)
        q = y3 * gl.expand_dims(gl.expand_dims(recip, 1), 2)
        code = _int_bits(q) if op.INT_BITS else _rni(q)
        code = gl.where(gl.expand_dims(gl.expand_dims(keep, 1), 2), code, 0)
        packed = _pack(gl.convert_layout(gl.reshape(code, [BLOCK, BLOCK]), L), BLOCK, BLOCK)
    return packed
