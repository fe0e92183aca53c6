"""The one-pass FFT convolution for Hopper in Gluon: every DFT stage a wgmma (issue 37).

The stage math is kernels_mono.py's at order 2 (its tl twin: the same products, tables and scales,
tested under the interpreter; this kernel cannot be interpreted, tests compile it for sm_90a). Two
sequences of a channel ride as z = u_a + i u_b, one complex DFT of L = 2N = A B serves both (u
zero-padded), M = B, n = B a + m, f = k_a + A k_b:

    x[m, a] = z[M a + m]                         [M, A/2]   (rows a >= A/2: the padding, skipped)
    1. R = x @ F_A[:A/2, :]                      [M, A/2] @ [A/2, A]   wgmma, x from registers
    2. R *= W_L^(m k_a)                          the (M, A) twiddle table (launch.mono_operands' TF)
    3. S = F_B @ R                               [B, B] @ [B, A]       wgmma, both from shared memory
       Y = S K / max|S K|                        the spectrum laid out as the tile (launch.mono_spectrum)
    3'. D = conj(F_B) @ Y                        wgmma from shared memory
    2'. D *= conj(W_L^(m k_a))
    1'. out = D @ conj(F_A)[:, :A/2]             [M, A] @ [A, A/2]     wgmma, D from registers
    y[b, h, M a + m] = out[m, a] * max|S K| / L * (the sequence's scale)

With B = 64 every product has M = 64: one warpgroup's wgmma (4 warps). The DFT matrices (F_A's two
halves, F_B and -Im F_B, float16) are loaded into shared memory once a program and stay there; a
program walks pairs (channel-major, so neighbouring programs read one channel's spectrum from L2) in a
persistent grid-stride loop. Per pair: u's two rows (float32 in registers: scale, non-finite check,
float16 for the tensor cores), R and Y staged through two [M, A] float16 tiles in shared memory (the B
operands of the square products), the twiddles and the spectrum read in the accumulator's layout
(L1 / L2). Numbers as kernels_mono.py: float16 operands, float32 sums; each sequence scaled by its
largest |u| (non-finite elements zeroed, that sequence's outputs NaN), the spectrum product by its
largest |Y| a pair.

Complex products: four real wgmmas chained through the accumulator; a negated operand where a
difference is needed (in registers for x and D, -Im F_B resident in shared memory).
"""
from triton.experimental import gluon

from tilecore.tiles.gluon import struct, wgmma_layout
from tilecore.tiles.gluon.compat import fence_async_shared, gl, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.language.nvidia.ampere import async_copy  # (cp.async: KPRE 2; the same names 3.6-3.9)

SUPPORTED_N = (1024,)  # the sizes the kernel is built for (A = 32, B = 64); 2048 (64 x 64) compiles too


def factors(n: int) -> tuple[int, int]:
    """(A, B) of L = 2n for the kernel: B = 64 (the wgmma's M), A = 2n / 64."""
    return 2 * n // 64, 64


@gluon.jit
def _load_square(ptr, ROWS: gl.constexpr, COLS: gl.constexpr, STRIDE: gl.constexpr, COL0: gl.constexpr,
                 layout: gl.constexpr):
    """ptr[r * STRIDE + COL0 + c] for r < ROWS, c < COLS in ``layout``."""
    r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    c = gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    return gl.load(ptr + gl.expand_dims(r, 1) * STRIDE + COL0 + gl.expand_dims(c, 0))


@gluon.jit
def _resident(ptr, ROWS: gl.constexpr, COLS: gl.constexpr, STRIDE: gl.constexpr, COL0: gl.constexpr,
              NEGATE: gl.constexpr, layout: gl.constexpr):
    """A float16 table block [ROWS, COLS] (negated with NEGATE) in shared memory for wgmma."""
    x = _load_square(ptr, ROWS, COLS, STRIDE, COL0, layout)
    if NEGATE:
        x = -x
    smem_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, COLS], gl.float16)
    return gl.allocate_shared_memory(gl.float16, [ROWS, COLS], smem_layout, x)


@gluon.jit
def _complex_mma(a1, b1, a2, b2, a3, b3, a4, b4, zeros, ASYNC: gl.constexpr, REGS: gl.constexpr):
    """(a1 b1 + a2 b2, a3 b3 + a4 b4): the real and imaginary parts of a complex product, float32 sums.
    ASYNC: the four wgmmas issued together and waited for once (else each waits for itself); REGS: the
    a operands are registers, kept alive until the wait."""
    if ASYNC:
        p = warpgroup_mma(a1, b1, zeros, use_acc=False, is_async=True)
        p = warpgroup_mma(a2, b2, p, is_async=True)
        q = warpgroup_mma(a3, b3, zeros, use_acc=False, is_async=True)
        q = warpgroup_mma(a4, b4, q, is_async=True)
        if REGS:
            p, q, a1, a2, a3, a4 = warpgroup_mma_wait(0, deps=(p, q, a1, a2, a3, a4))
        else:
            p, q = warpgroup_mma_wait(0, deps=(p, q))
        return p, q
    return (warpgroup_mma(a2, b2, warpgroup_mma(a1, b1, zeros, use_acc=False)),
            warpgroup_mma(a4, b4, warpgroup_mma(a3, b3, zeros, use_acc=False)))


@gluon.jit
def _spectrum_at(spectrum, f, L: gl.constexpr, RFFT: gl.constexpr, CONJ: gl.constexpr):
    """The filter's spectrum at the bins f (float32 re, im). RFFT: ``spectrum`` is a channel's rfft bins
    as (re, im) pairs (torch.view_as_real), bins past L/2 the conjugates of L - f, all conjugated with
    CONJ (RFFT 2: each bin read as one 64-bit load, not two 32-bit ones; RFFT 3: the pairs in float16, a bin
    one 32-bit load: half the bytes and registers); else the host's layout (launch.mono_spectrum: planes re, im
    of L, conjugated there)."""
    if RFFT:
        mirrored = f > L // 2
        bin = gl.where(mirrored, L - f, f)
        if RFFT == 2:  # a bin's (re, im) as one 64-bit load (complex64 bins are 8-byte aligned)
            kre, kim = _unpack_bin(gl.load(spectrum.to(gl.pointer_type(gl.int64), bitcast=True) + bin))
        elif RFFT == 3:  # a bin's float16 (re, im) as one 32-bit load
            kre, kim = _unpack_half_bin(_half_bins(spectrum, f, L))
        else:
            kre = gl.load(spectrum + 2 * bin)
            kim = gl.load(spectrum + 2 * bin + 1)
        kim = _conjugated(kim, mirrored, CONJ)
    else:
        kre = gl.load(spectrum + f)
        kim = gl.load(spectrum + L + f)
    return kre, kim


@gluon.jit
def _unpack_bin(pair):
    """A complex64 bin read as one int64: (re, im) float32."""
    return (pair & 0xFFFFFFFF).to(gl.uint32).to(gl.float32, bitcast=True), (pair >> 32).to(gl.uint32).to(gl.float32,
                                                                                                       bitcast=True)


@gluon.jit
def _half_bins(spectrum, f, L: gl.constexpr):
    """RFFT 3: the float16 (re, im) bins of f (past L/2: of L - f) as int32s, packed (_unpack_half_bin)."""
    return gl.load(spectrum.to(gl.pointer_type(gl.int32), bitcast=True) + gl.where(f > L // 2, L - f, f))


@gluon.jit
def _unpack_half_bin(pair):
    """A float16 (re, im) bin read as one int32: (re, im) float32."""
    bits = pair.to(gl.uint32, bitcast=True)
    return ((bits & 0xFFFF).to(gl.uint16).to(gl.float16, bitcast=True).to(gl.float32),
            (bits >> 16).to(gl.uint16).to(gl.float16, bitcast=True).to(gl.float32))


@gluon.jit
def _conjugated(kim, mirrored, CONJ: gl.constexpr):
    """The imaginary part of the spectrum at f from its bin's: the bins past L/2 (``mirrored``) are the
    conjugates of L - f (the filter is real); all conjugated with CONJ (the correlation)."""
    if CONJ:
        kim = gl.where(mirrored, kim, -kim)
    else:
        kim = gl.where(mirrored, -kim, kim)
    return kim


@gluon.jit
def _spectrum_issue(st, spectrum, f, fresh=True):
    """KPRE: start reading the bins f of the spectrum (``spectrum``: the channel's row) before the block's
    stage 1. KPRE 1: loaded into registers now, returned (kre, kim) (_spectrum_at); KPRE 2 (RFFT 2; RFFT 3: 32-bit): each bin's
    (re, im) gathered as one 64-bit cp.async into st.kbuf (f's layout, so a thread reads back what it
    copied), returns (0, 0); KPRE 3 (the whole-tile kernel: st.kbuf holds the channel's whole tile): as 2
    where ``fresh`` (the pair's channel is not the previous pair's: CONTIG walks a channel's pairs in a
    row), else kbuf is kept; else nothing is read here."""
    if st.KPRE == 1:
        if st.RFFT == 3:  # the packed float16 bins held (one register a bin), unpacked at the product
            kre = _half_bins(spectrum, f, st.L)
            kim = kre
        else:
            kre, kim = _spectrum_at(spectrum, f, st.L, st.RFFT, st.CONJ)
    elif st.KPRE >= 2:
        gl.static_assert(st.RFFT == 2 or st.RFFT == 3, "KPRE 2, 3 gather a bin as one copy: RFFT 2 (64-bit), 3 (32-bit)")
        if st.KPRE == 2 or fresh:
            bin = gl.where(f > st.L // 2, st.L - f, f)
            word: gl.constexpr = gl.int64 if st.RFFT == 2 else gl.int32  # (a bin: complex64, or float16 pairs)
            async_copy.async_copy_global_to_shared(st.kbuf, spectrum.to(gl.pointer_type(word), bitcast=True) + bin)
            async_copy.commit_group()
        kre = 0.0
        kim = 0.0
    else:
        kre = 0.0
        kim = 0.0
    return kre, kim


@gluon.jit
def _spectrum_take(st, spectrum, f, kpre):
    """The spectrum at the bins f for the product (float32 re, im): what _spectrum_issue requested (KPRE 1
    its registers ``kpre``; KPRE 2 st.kbuf once the copies landed, conjugated as _spectrum_at), else read
    now."""
    if st.KPRE == 1:
        kre, kim = kpre
        if st.RFFT == 3:
            kre, kim = _unpack_half_bin(kre)
            kim = _conjugated(kim, f > st.L // 2, st.CONJ)
    elif st.KPRE >= 2:
        async_copy.wait_group(0)
        if st.RFFT == 3:
            kre, kim = _unpack_half_bin(st.kbuf.load(f.type.layout))
        else:
            kre, kim = _unpack_bin(st.kbuf.load(f.type.layout))
        kim = _conjugated(kim, f > st.L // 2, st.CONJ)
    else:
        kre, kim = _spectrum_at(spectrum, f, st.L, st.RFFT, st.CONJ)
    return kre, kim


@gluon.jit
def _load_raw(ptr, b, batch, row_offset, offsets):
    """u[b, h, offsets] (row_offset = h * stride_h; 0 past the batch)."""
    return gl.load(ptr + row_offset + offsets, mask=(offsets >= 0) & (b < batch), other=0.0)


@gluon.jit
def _load_half(ptr, b, batch, row_offset, offsets):
    """u[b, h, offsets] (row_offset = h * stride_h) as float32 divided by its largest |u|, non-finite
    elements zeroed; also (that scale, whether a non-finite element was there)."""
    return _scaled(_load_raw(ptr, b, batch, row_offset, offsets))


@gluon.jit
def _scaled(x):
    """x as float32 divided by its largest |x|, non-finite elements zeroed; (that, the scale, whether a
    non-finite element was there)."""
    x = x.to(gl.float32)
    finite = gl.abs(x) < float("inf")  # False for NaN and +-inf
    bad = gl.max(gl.max(gl.where(finite, 0, 1), axis=1), axis=0) > 0
    x = gl.where(finite, x, 0.0)
    scale = gl.max(gl.max(gl.abs(x), axis=1), axis=0)
    scale = gl.where(scale > 0, scale, 1.0)
    return x / scale, scale, bad


@gluon.jit
def _max4(a0, a1, a2, a3, b0, b1, b2, b3):
    return gl.maximum(a0, b0), gl.maximum(a1, b1), gl.maximum(a2, b2), gl.maximum(a3, b3)


@gluon.jit
def _scaled_both(xre, xim):
    """_scaled of both sequences of a pair (the same values) with their four reductions (each one's largest |x|
    and non-finite flag) as one: one exchange across the warps (LEAN 1)."""
    xre = xre.to(gl.float32)
    xim = xim.to(gl.float32)
    fre = gl.abs(xre) < float("inf")  # False for NaN and +-inf
    fim = gl.abs(xim) < float("inf")
    xre = gl.where(fre, xre, 0.0)
    xim = gl.where(fim, xim, 0.0)
    are, bre, aim, bim = gl.reduce((gl.abs(xre), gl.where(fre, 0.0, 1.0), gl.abs(xim), gl.where(fim, 0.0, 1.0)), 1,
                                   _max4)
    are, bre, aim, bim = gl.reduce((are, bre, aim, bim), 0, _max4)
    scale_re = gl.where(are > 0, are, 1.0)
    scale_im = gl.where(aim > 0, aim, 1.0)
    return xre / scale_re, scale_re, bre > 0, xim / scale_im, scale_im, bim > 0


@struct
class Stages:
    """What both kernels' square stages read: F_B (re, im, -im: differences as sums) resident in shared
    memory, the two staging tiles (R, then Y: the square products' B operands), the (B, A) twiddle table
    W_L^(m k_a) (launch.mono_operands' TF) and how the spectrum is read; ASYNC: a complex product's four
    wgmmas issued at once, one wait; PROBE: timing probes, WRONG results (never in the plans): 1 the square
    products left out (S = R, D = Y), 2 the spectrum product's scale reduction (scale 1), 4 the twiddle
    and spectrum loads (constants); what each saves is that part's share of the time. TW_SFU: the twiddles
    computed (_twiddles) instead of read from the table. KPRE: the spectrum's bins of a block
    requested before its stage 1 (_spectrum_issue), so their L2 latency runs under stages 1-3: 1 loaded
    into registers there and held, 2 gathered by cp.async into ``kbuf`` ([B, C] int64: a bin's (re, im),
    RFFT 2) and read from shared memory at the product (no registers held)."""
    fbre: object
    fbim: object
    fbnim: object
    tile_re: object  # [B, C] float16 (C: the columns a step, A or CHUNK)
    tile_im: object
    TFRE: object
    TFIM: object
    L: gl.constexpr
    RFFT: gl.constexpr
    CONJ: gl.constexpr
    ASYNC: gl.constexpr
    PROBE: gl.constexpr
    TW_SFU: gl.constexpr
    kbuf: object  # [B, C] int64 (int32: RFFT 3) in shared memory (KPRE 2, 3), else None
    KPRE: gl.constexpr
    LEAN: gl.constexpr  # 1: the spectrum product's scale as one reduction (of max(|re|, |im|))


# W_L^(m k_a) from the tables' offset i = m A + k_a (A, L powers of two): t = (m k_a) mod L as a signed
# [-L/2, L/2) (the shifts), angle = t (-2 pi / L), its cosine and sine. One asm block: the index arithmetic
# inside it, so nothing of it is hoisted out of the pair loop (registers)
_TWIDDLE_ASM = """{{
.reg .s32 m, k, t;
.reg .f32 a;
shr.u32 m, $2, {a};
and.b32 k, $2, {a_mask};
mul.lo.s32 t, m, k;
and.b32 t, t, {l_mask};
shl.b32 t, t, {shift};
shr.s32 t, t, {shift};
cvt.rn.f32.s32 a, t;
mul.f32 a, a, {scale};
cos.approx.ftz.f32 $0, a;
sin.approx.ftz.f32 $1, a;
}}"""


def _twiddle_asm_for(L: int) -> str:
    """_TWIDDLE_ASM for L = 64 A."""
    import struct as binary

    a = L // 64
    scale = binary.unpack("<I", binary.pack("<f", -6.283185307179586 / L))[0]  # PTX's 0fXXXXXXXX float32
    return _TWIDDLE_ASM.format(a=a.bit_length() - 1, a_mask=a - 1, l_mask=L - 1, shift=33 - L.bit_length(),
                               scale="0f%08X" % scale)


# (made here: a constexpr_function may not call a plain Python function, Triton's dependency check says)
_TWIDDLE_ASMS = {L: _twiddle_asm_for(L) for L in (2048, 4096, 8192, 16384, 32768)}


@gluon.constexpr_function
def _twiddle_asm(L):
    return _TWIDDLE_ASMS[L]


@gluon.jit
def _twiddles(st, tab, col):
    """W_L^(m k_a) at the tables' offsets tab + col = m A + k_a (A = L / 64): read from the table (float32,
    from L1 / L2), or (st.TW_SFU) computed: the exponent m k_a reduced mod L exactly in integers, to
    [-L/2, L/2), its angle's cosine and sine by the SFU (cos.approx / sin.approx: ~2^-21 absolute on
    [-pi, pi], far below the float16 rounding the products apply after). At 4096 the table is 64 KiB a
    plane and a program's 218 KiB of shared memory leaves L1 ~28 KiB: read, it comes from L2 each chunk.
    (One asm block, marked impure, so that it is computed where used: as gl ops and pure asm the compiler
    hoisted the loop-invariant twiddles and their indices out of the pair loop, 166 -> 207 registers at
    1024.)"""
    if st.TW_SFU:
        twre, twim = gl.inline_asm_elementwise(_twiddle_asm(st.L), "=r,=r,r", [tab + col],
                                               dtype=(gl.float32, gl.float32), is_pure=False, pack=1)
    else:
        twre = gl.load(st.TFRE + tab + col)
        twim = gl.load(st.TFIM + tab + col)
    return twre, twim


@gluon.jit
def _forward_stages(st, x_re, x_im, fa_re, fa_im, fa_nim, tab, col, K, h, stride_kh, zeros, X_REGS: gl.constexpr,
                    kpre=(0.0, 0.0)):
    """Stages 1-3 and the spectrum product of a [B, C] block of the tile's columns k_a (the whole tile, or
    one chunk: ``tab`` + ``col`` the block's offsets m A + k_a into the (B, A) tables, f = k_a + A k_b):

        1. R = x @ F_A[:HALF, cols]      x [B, HALF]: registers (X_REGS; -Im x negated there) or shared
                                         memory (then ``fa_nim`` = -Im F_A resident); |R| <= HALF sqrt 2
        2. R *= W_L^(m k_a)
        3. S = F_B @ R                   R staged as float16 in st's tiles; |S| <= HALF B sqrt 2
           Y = S K                       K: channel h's spectrum (row h of K) at f (_spectrum_at; with KPRE
                                         what _spectrum_issue requested, ``kpre``: _spectrum_take)

    Returns (Y re, Y im) float32 and its largest |Y| (1 where Y is 0; NaN stays NaN: a NaN filter's)."""
    if X_REGS:
        rre, rim = _complex_mma(x_re, fa_re, -x_im, fa_im, x_re, fa_im, x_im, fa_re, zeros, st.ASYNC, True)
    else:
        rre, rim = _complex_mma(x_re, fa_re, x_im, fa_nim, x_re, fa_im, x_im, fa_re, zeros, st.ASYNC, False)
    if st.PROBE & 4:
        twre = zeros + 0.5
        twim = zeros + 0.25
    else:
        twre, twim = _twiddles(st, tab, col)
    rre, rim = rre * twre - rim * twim, rre * twim + rim * twre
    gl.thread_barrier()  # the previous step's wgmmas have read the staging tiles
    st.tile_re.store(rre.to(gl.float16))
    st.tile_im.store(rim.to(gl.float16))
    fence_async_shared()
    gl.thread_barrier()
    if st.PROBE & 1:
        sre = rre
        sim = rim
    else:
        sre, sim = _complex_mma(st.fbre, st.tile_re, st.fbnim, st.tile_im, st.fbre, st.tile_im, st.fbim, st.tile_re,
                                zeros, st.ASYNC, False)
    if st.PROBE & 4:
        kre = twre
        kim = twim
    else:
        kre, kim = _spectrum_take(st, K + h * stride_kh, tab + col, kpre)
    yre = sre * kre - sim * kim
    yim = sre * kim + sim * kre
    if st.PROBE & 2:
        scale = 1.0
    elif st.LEAN & 1:  # (the same largest value: one reduction, not two)
        scale = gl.max(gl.max(gl.maximum(gl.abs(yre), gl.abs(yim)), axis=1), axis=0)
        scale = gl.where(scale > 0, scale, 1.0)
    else:
        scale = gl.maximum(gl.max(gl.max(gl.abs(yre), axis=1), axis=0), gl.max(gl.max(gl.abs(yim), axis=1), axis=0))
        scale = gl.where(scale > 0, scale, 1.0)  # (NaN stays NaN: a NaN filter's outputs)
    return yre, yim, scale


@gluon.jit
def _inverse_stages(st, yre, yim, scale, tab, col, fa_re, fa_im, zeros_out, zeros, lhs_out: gl.constexpr):
    """Stages 3'-1' of the block _forward_stages gave (Y, its ``scale``):

        3'. D = conj(F_B) @ (Y / scale)  staged as float16 in st's tiles
        2'. D *= conj(W_L^(m k_a))       (the twiddles read again from L1: held across they cost registers)
        1'. out = D @ conj(F_A)[cols, :HALF]   D from registers; ``fa_re``, ``fa_im``: F_A[cols, :HALF]

    Returns out (re, im) at ``scale`` (``zeros_out``: its first accumulator)."""
    inv = 1.0 / scale
    gl.thread_barrier()  # stage 3's wgmmas have read R
    st.tile_re.store((yre * inv).to(gl.float16))
    st.tile_im.store((yim * inv).to(gl.float16))
    fence_async_shared()
    gl.thread_barrier()
    if st.PROBE & 1:
        dre = yre * inv
        dim = yim * inv
    else:
        dre, dim = _complex_mma(st.fbre, st.tile_re, st.fbim, st.tile_im, st.fbre, st.tile_im, st.fbnim, st.tile_re,
                                zeros, st.ASYNC, False)
    if st.PROBE & 4:
        twre = zeros + 0.5
        twim = zeros + 0.25
    else:
        twre, twim = _twiddles(st, tab, col)
    dre, dim = dre * twre + dim * twim, dim * twre - dre * twim
    dre16 = gl.convert_layout(dre.to(gl.float16), lhs_out)
    dim16 = gl.convert_layout(dim.to(gl.float16), lhs_out)
    return _complex_mma(dre16, fa_re, dim16, fa_im, dim16, fa_re, -dre16, fa_im, zeros_out, st.ASYNC, True)


@struct
class PairIO:
    """How a walker reads its pairs' u and writes their y (both kernels): the tensors and strides, and with TMA
    the [2, 1, HALF, B] boxes' descriptors, u's two-slot ring (the next pair's u loaded under this one's products)
    with its mbarriers, and y's box (else None)."""
    U: object
    Y: object
    u_desc: object
    y_desc: object
    u_smem: object  # [2, 2, 1, HALF, B] (TMA)
    y_smem: object  # [2, 1, HALF, B] (TMA)
    u_ready: object  # [2, 1] mbarriers (TMA)
    batch: object
    stride_ub: object
    stride_uh: object
    stride_yb: object
    stride_yh: object
    groups: object  # pairs a channel: work item w is pair w % groups of channel w // groups
    HALF: gl.constexpr
    B: gl.constexpr
    TMA: gl.constexpr
    YALIAS: gl.constexpr  # y's box is the ring slot its pair's u came in (no y_smem; the next u requested later)
    LEAN: gl.constexpr  # 1: both sequences' scales and flags in one reduction (_scaled_both)


@gluon.jit
def _request_u(io, w, slot):
    """TMA: pair w's u (sequences 2 g, 2 g + 1 of channel h: one [2, 1, HALF, B] box) into ring slot ``slot``."""
    U_BYTES: gl.constexpr = 2 * io.HALF * io.B * io.U.dtype.element_ty.primitive_bitwidth // 8
    mbarrier.expect(io.u_ready.index(slot), U_BYTES)
    tma.async_copy_global_to_shared(io.u_desc, [2 * (w % io.groups), w // io.groups, 0, 0], io.u_ready.index(slot),
                                    io.u_smem.index(slot))


@gluon.jit
def _first_u(io, start, stop):
    """TMA: the walker's first pair's u requested (slot 0)."""
    if io.TMA:
        if start < stop:
            _request_u(io, start, 0)


@gluon.jit
def _pair_u(io, w, start, step, stop, h, b_re, seq, layout: gl.constexpr, ROWS_A: gl.constexpr = False):
    """Pair w's two sequences x[m, a] = u[B a + m] as [B, HALF] float32 tiles in ``layout``, each over its largest
    |u| (non-finite elements zeroed): (x_re, its scale, whether it had a non-finite element, the same of x_im).
    TMA: the next pair's u requested into the other slot first, this one's read from its slot (each sequence's
    [HALF, B] box rows transposed; ROWS_A: as they are, x^T [HALF, B]); else pointer loads at ``seq`` (b_re: the
    pair's first batch row, past the batch masked)."""
    if io.TMA:
        i = (w - start) // step  # this walker's pair count: the slot and its phase
        after = w + step
        if not io.YALIAS:
            if after < stop:  # the next pair's u, under this pair's products
                _request_u(io, after, (i + 1) % 2)
        mbarrier.wait(io.u_ready.index(i % 2), (i // 2) & 1)
        pair = io.u_smem.index(i % 2).reshape([2 * io.HALF, io.B])
        if ROWS_A:  # (x^T: the box's rows a as they are; one reduction for both, LEAN 1's)
            xre, scale_re, bad_re, xim, scale_im, bad_im = _scaled_both(
                pair.slice(0, io.HALF).load(layout), pair.slice(io.HALF, io.HALF).load(layout))
        elif io.LEAN & 1:
            xre, scale_re, bad_re, xim, scale_im, bad_im = _scaled_both(
                pair.slice(0, io.HALF).permute((1, 0)).load(layout), pair.slice(io.HALF, io.HALF).permute((1, 0)).load(layout))
        else:
            xre, scale_re, bad_re = _scaled(pair.slice(0, io.HALF).permute((1, 0)).load(layout))
            xim, scale_im, bad_im = _scaled(pair.slice(io.HALF, io.HALF).permute((1, 0)).load(layout))
    elif io.LEAN & 1:
        b_im = b_re + 1
        xre, scale_re, bad_re, xim, scale_im, bad_im = _scaled_both(
            _load_raw(io.U, b_re, io.batch, b_re.to(gl.int64) * io.stride_ub + h * io.stride_uh, seq),
            _load_raw(io.U, b_im, io.batch, b_im.to(gl.int64) * io.stride_ub + h * io.stride_uh, seq))
    else:
        b_im = b_re + 1
        xre, scale_re, bad_re = _load_half(io.U, b_re, io.batch, b_re.to(gl.int64) * io.stride_ub + h * io.stride_uh,
                                           seq)
        xim, scale_im, bad_im = _load_half(io.U, b_im, io.batch, b_im.to(gl.int64) * io.stride_ub + h * io.stride_uh,
                                           seq)
    return xre, scale_re, bad_re, xim, scale_im, bad_im


@gluon.jit
def _next_u(io, w, start, step, stop):
    """YALIAS: the next pair's u requested into the other slot, once this walker's previous y store (that slot,
    its y's box) has read it; called after this pair's u was read (TMA, one thread issues both: its wait orders
    them)."""
    if io.TMA and io.YALIAS:
        i = (w - start) // step
        after = w + step
        tma.store_wait(0)
        if after < stop:
            _request_u(io, after, (i + 1) % 2)


@gluon.jit
def _pair_y(io, ore, oim, w, start, step, h, b_re, seq, layout: gl.constexpr, ROWS_A: gl.constexpr = False):
    """Pair (b_re, b_re + 1) of channel h's outputs (finished [B, HALF] float32 tiles: scaled, NaN where the
    sequence was not finite) as y's dtype: TMA: transposed into y's box (YALIAS: the slot pair w's u came in) once
    the previous pair's store has read it, one TMA store (ROWS_A: the tiles are out^T [HALF, B], stored as they
    are); else pointer stores at ``seq`` in ``layout`` (past the batch masked)."""
    ty: gl.constexpr = io.Y.dtype.element_ty
    if io.TMA:  # [B, HALF] tiles into the pair's [2, 1, HALF, B] box, transposed, then one TMA store
        if io.YALIAS:
            box = io.u_smem.index(((w - start) // step) % 2)
        else:
            box = io.y_smem
        tma.store_wait(0)  # the previous pair's store has read y_smem
        gl.thread_barrier()
        out = box.reshape([2 * io.HALF, io.B])
        if ROWS_A:
            out.slice(0, io.HALF).store(ore.to(ty))
            out.slice(io.HALF, io.HALF).store(oim.to(ty))
        else:
            out.slice(0, io.HALF).permute((1, 0)).store(ore.to(ty))
            out.slice(io.HALF, io.HALF).permute((1, 0)).store(oim.to(ty))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(io.y_desc, [b_re, h.to(gl.int32), 0, 0], box)
    else:
        ok = seq >= 0
        b_im = b_re + 1
        gl.store(io.Y + b_re.to(gl.int64) * io.stride_yb + h * io.stride_yh + seq, gl.convert_layout(ore, layout).to(ty),
                 mask=ok & (b_re < io.batch))
        gl.store(io.Y + b_im.to(gl.int64) * io.stride_yb + h * io.stride_yh + seq, gl.convert_layout(oim, layout).to(ty),
                 mask=ok & (b_im < io.batch))


@gluon.jit
def _last_y(io):
    """TMA: the walker's last store waited for, the ring's barriers invalidated."""
    if io.TMA:
        tma.store_wait(0)
        mbarrier.invalidate(io.u_ready.index(0))
        mbarrier.invalidate(io.u_ready.index(1))


@gluon.jit
def _spectrum_buffer(B: gl.constexpr, C: gl.constexpr, KPRE: gl.constexpr, RFFT: gl.constexpr = 2):
    """KPRE 2 and 3's [B, C] shared tile of a block's spectrum bins, int64 (RFFT 2: complex64 bins) or int32 (RFFT 3:
    float16 pairs), rows XOR-swizzled by 16-byte vectors (the accumulator layout's threads read 8 rows at once), else
    None."""
    if KPRE >= 2 and RFFT == 3:
        kbuf = gl.allocate_shared_memory(gl.int32, [B, C], gl.SwizzledSharedLayout(4, 1, 8, order=[1, 0]))
    elif KPRE >= 2:
        layout: gl.constexpr = gl.SwizzledSharedLayout(2, 1, 8, order=[1, 0])
        kbuf = gl.allocate_shared_memory(gl.int64, [B, C], layout)
    else:
        kbuf = None
    return kbuf


@gluon.jit
def _tile_offsets(B: gl.constexpr, HALF: gl.constexpr, A: gl.constexpr, COLS: gl.constexpr, io: gl.constexpr,
                  acc: gl.constexpr):
    """The offsets every kernel's tiles take (the convolution's two kernels and the filter gradient's): ``seq`` = B a +
    m of x[m, a] = z[B a + m] ([B, HALF] in ``io``: u's and y's pointer loads and stores), ``tab`` = m A + k_a of the
    (B, A) tables' first COLS columns ([B, COLS] in ``acc``: the twiddles, the spectrum's bins; a chunk adds its first
    column), and float32 zeros [B, COLS] in ``acc`` (the products' first accumulators)."""
    io_m = gl.arange(0, B, layout=gl.SliceLayout(1, io))
    io_a = gl.arange(0, HALF, layout=gl.SliceLayout(0, io))
    seq = gl.expand_dims(io_a, 0) * B + gl.expand_dims(io_m, 1)
    t_m = gl.arange(0, B, layout=gl.SliceLayout(1, acc))
    t_k = gl.arange(0, COLS, layout=gl.SliceLayout(0, acc))
    tab = gl.expand_dims(t_m, 1) * A + gl.expand_dims(t_k, 0)
    return seq, tab, gl.zeros([B, COLS], gl.float32, acc)


@gluon.jit
def _walk(first, programs, total, CONTIG: gl.constexpr):
    """(start, stop, step) of the work items a walker takes: w = first, first + programs, ... (strided:
    neighbouring walkers on one channel's pairs at once, its spectrum shared through L2), or (CONTIG) a
    contiguous block of cdiv(total, programs) items: a walker's consecutive pairs are one channel's, so its
    spectrum comes from L1 after the first (where L1 has room: 1024, 2048)."""
    if CONTIG:
        per = gl.cdiv(total, programs)
        start = first * per
        return start, gl.minimum(start + per, total), 1
    return first, total, programs


@gluon.jit
def _walk_shared(pid, nprog, total, part, PARTS: gl.constexpr):
    """CONTIG 2 (the chunked kernel's two walkers): program ``pid`` takes a contiguous block of cdiv(total, nprog) items
    and its walkers interleave on it (walker ``part`` every PARTS-th), so both are on one channel's pairs at once (its
    spectrum's chunks read by both close together: L1 may serve the second)."""
    per = gl.cdiv(total, nprog)
    base = pid * per
    return base + part, gl.minimum(base + per, total), PARTS


@gluon.jit
def fft_conv_gluon_onepass_kernel(U, K, Y, FARE, FAIM, FBRE, FBIM, TFRE, TFIM,
                                  batch, heads, stride_ub, stride_uh, stride_yb, stride_yh, stride_kh,
                                  A: gl.constexpr, B: gl.constexpr, ASYNC: gl.constexpr = False,
                                  u_desc=None, y_desc=None, TMA: gl.constexpr = False, RFFT: gl.constexpr = False,
                                  CONJ: gl.constexpr = False, PROBE: gl.constexpr = 0, TW_SFU: gl.constexpr = False,
                                  CONTIG: gl.constexpr = False, KPRE: gl.constexpr = 0, LEAN: gl.constexpr = 0):
    """Y[b, h, :N] = the first N of IDFT_L(DFT_L(pad(U[b, h])) K[h]) for every pair (2g, 2g + 1) of every
    channel h; work item w = h * groups + g, program p runs w = p, p + programs, ...

    U, Y: (batch, heads, N) rows with unit stride along N = A B / 2. K: the spectrum laid out as the
    tile, (heads, 2, L) float32 planes (re, im) at f = k_a + A k_b, conjugated on the host for the
    correlation (launch.mono_spectrum with c = 1). FA (A, A), FB (B, B): float16 DFT matrices; TF (B, A)
    = W_L^(m k_a) float32 (launch.mono_operands). 4 warps (one warpgroup); B = 64. ASYNC: each complex
    product's four wgmmas issued at once, one wait (else one wait each). TMA: u and y through TMA
    descriptors of the (batch, heads, A/2, B) views, boxes [2, 1, A/2, B] (a pair; past the batch zeros
    in, clipped out), the next pair's u loaded into a second buffer while this one's products run
    (else pointer loads and stores). RFFT: K is the rfft itself, (heads, N + 1) complex64 as float32 (re,
    im) pairs, read at the tile's bins in the kernel (conjugated with CONJ): no host layout a call. KPRE: the
    pair's spectrum requested at the top of the pair, before its u (Stages). LEAN (the same bits): 1 fewer reductions
    (u's four scales and flags as one, the spectrum product's scale as one), 2 (TMA) x read from u's box
    straight into the wgmma's operand layout (no layout conversion through shared memory)."""
    gl.static_assert(B == 64, "the kernel's products have M = B = 64 (one warpgroup)")
    WARPS: gl.constexpr = gl.num_warps()
    gl.static_assert(WARPS == 4 or WARPS == 8, "one warpgroup, or two splitting each product's columns")
    HALF: gl.constexpr = A // 2
    L: gl.constexpr = A * B
    # register layouts: the accumulators of [B, A] and [B, HALF] products, their register A operands,
    # and a coalesced layout for u and y ([B, HALF] at offset B a + m: threads along m)
    acc: gl.constexpr = wgmma_layout(B, A, WARPS)
    acc_out: gl.constexpr = wgmma_layout(B, HALF, WARPS)
    lhs: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc, k_width=2)
    lhs_out: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_out, k_width=2)
    io: gl.constexpr = gl.BlockedLayout([4, 1], [16, 2], [1, WARPS], [0, 1])
    table: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [WARPS, 1], [1, 0])

    # the DFT matrices, resident in shared memory for the program's whole walk
    fa1re = _resident(FARE, HALF, A, A, 0, False, table)  # F_A[:HALF, :]: stage 1's B operand
    fa1im = _resident(FAIM, HALF, A, A, 0, False, table)
    fa2re = _resident(FARE, A, HALF, A, 0, False, table)  # F_A[:, :HALF]: stage 1''s (conjugated)
    fa2im = _resident(FAIM, A, HALF, A, 0, False, table)
    fbre = _resident(FBRE, B, B, B, 0, False, table)
    fbim = _resident(FBIM, B, B, B, 0, False, table)
    fbnim = _resident(FBIM, B, B, B, 0, True, table)  # -Im F_B: differences as sums
    stage_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([B, A], gl.float16)
    tile_re = gl.allocate_shared_memory(gl.float16, [B, A], stage_layout)  # R, then Y: square products' B
    tile_im = gl.allocate_shared_memory(gl.float16, [B, A], stage_layout)
    kbuf = _spectrum_buffer(B, A, KPRE, RFFT)
    if TMA:
        u_smem = gl.allocate_shared_memory(u_desc.dtype, [2] + u_desc.block_type.shape, u_desc.layout)
        y_smem = gl.allocate_shared_memory(y_desc.dtype, y_desc.block_type.shape, y_desc.layout)
        u_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(u_ready.index(0), count=1)
        mbarrier.init(u_ready.index(1), count=1)
    else:
        u_smem = None
        y_smem = None
        u_ready = None
    fence_async_shared()
    gl.thread_barrier()

    seq, tab, zeros = _tile_offsets(B, HALF, A, A, io, acc)
    zeros_out = gl.zeros([B, HALF], gl.float32, acc_out)
    st = Stages(fbre, fbim, fbnim, tile_re, tile_im, TFRE, TFIM, L, RFFT, CONJ, ASYNC, PROBE, TW_SFU, kbuf, KPRE, LEAN)

    groups = gl.cdiv(batch, 2)
    total = heads * groups
    first = gl.program_id(0)
    programs = gl.num_programs(0)
    pio = PairIO(U, Y, u_desc, y_desc, u_smem, y_smem, u_ready, batch, stride_ub, stride_uh, stride_yb, stride_yh, groups,
                 HALF, B, TMA, False, LEAN)
    start, stop, step = _walk(first, programs, total, CONTIG)
    gl.static_assert(KPRE < 3 or CONTIG, "KPRE 3 keeps a channel's spectrum for its next pairs: a CONTIG walk")
    last_h = (start * 0 - 1).to(gl.int64)  # (KPRE 3: the previous pair's channel)
    _first_u(pio, start, stop)
    for w in range(start, stop, step):
        h = (w // groups).to(gl.int64)
        b_re = 2 * (w % groups)
        kpre = _spectrum_issue(st, K + h * stride_kh, tab, h != last_h)  # (KPRE: under this pair's u and stages 1-3)
        last_h = h
        if TMA and (LEAN & 2):  # (x straight into the wgmma's operand layout)
            xre, scale_re, bad_re, xim, scale_im, bad_im = _pair_u(pio, w, start, step, stop, h, b_re, seq, lhs)
        else:
            xre, scale_re, bad_re, xim, scale_im, bad_im = _pair_u(pio, w, start, step, stop, h, b_re, seq, io)
        xre = gl.convert_layout(xre.to(gl.float16), lhs)
        xim = gl.convert_layout(xim.to(gl.float16), lhs)
        yre, yim, spec_scale = _forward_stages(st, xre, xim, fa1re, fa1im, None, tab, 0, K, h, stride_kh, zeros, True,
                                               kpre)
        ore, oim = _inverse_stages(st, yre, yim, spec_scale, tab, 0, fa2re, fa2im, zeros_out, zeros, lhs_out)
        out_scale = spec_scale * (1.0 / L)
        if TMA:
            ore = gl.where(bad_re, float("nan"), ore * (out_scale * scale_re))
            oim = gl.where(bad_im, float("nan"), oim * (out_scale * scale_im))
        else:  # (the pointer stores' layout first)
            ore = gl.where(bad_re, float("nan"), gl.convert_layout(ore, io) * (out_scale * scale_re))
            oim = gl.where(bad_im, float("nan"), gl.convert_layout(oim, io) * (out_scale * scale_im))
        _pair_y(pio, ore, oim, w, start, step, h, b_re, seq, io)
    _last_y(pio)


@struct
class ChunkedGlobals:
    """What every warpgroup of the chunked kernel reads: the tensors, sizes, the resident DFT matrices
    (shared memory) and the compile-time shape."""
    U: object
    K: object
    Y: object
    TFRE: object
    TFIM: object
    batch: object
    heads: object
    stride_ub: object
    stride_uh: object
    stride_yb: object
    stride_yh: object
    stride_kh: object
    u_desc: object
    y_desc: object
    fare: object  # [CHUNKS, HALF, CHUNK] float16: F_A[:HALF, chunk c]
    faim: object
    fanim: object  # -Im F_A
    fbre: object  # [B, B] float16
    fbim: object
    fbnim: object  # -Im F_B
    A: gl.constexpr
    B: gl.constexpr
    CHUNK: gl.constexpr
    TMA: gl.constexpr
    RFFT: gl.constexpr
    CONJ: gl.constexpr
    PROBE: gl.constexpr
    TW_SFU: gl.constexpr
    CONTIG: gl.constexpr
    KPRE: gl.constexpr
    YALIAS: gl.constexpr
    LEAN: gl.constexpr


@struct
class ChunkedBuffers:
    """One walker's shared memory: [2, HALF, B] float16 planes (x^T in [1], then chunk 1's D^T; chunk 0's D^T in [0])
    and with TMA u's two-buffer ring, its barriers (and y's box: None with YALIAS, y goes to its pair's u slot)."""
    x_re: object
    x_im: object
    u_smem: object  # [2, 2, 1, HALF, B] (TMA)
    y_smem: object  # [2, 1, HALF, B] (TMA without YALIAS)
    u_ready: object  # [2, 1] mbarriers (TMA)


@gluon.jit
def _chunked_buffers(u_desc, y_desc, B: gl.constexpr, HALF: gl.constexpr, TMA: gl.constexpr, YALIAS: gl.constexpr):
    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HALF, B], gl.float16)
    x_re = gl.allocate_shared_memory(gl.float16, [2, HALF, B], x_layout)
    x_im = gl.allocate_shared_memory(gl.float16, [2, HALF, B], x_layout)
    if TMA:
        u_smem = gl.allocate_shared_memory(u_desc.dtype, [2] + u_desc.block_type.shape, u_desc.layout)
        if YALIAS:  # (y's box is u's slot: the same box, dtype and layout)
            gl.static_assert(y_desc.dtype == u_desc.dtype, "YALIAS: y's box in u's ring takes u's dtype")
            y_smem = None
        else:
            y_smem = gl.allocate_shared_memory(y_desc.dtype, y_desc.block_type.shape, y_desc.layout)
        u_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(u_ready.index(0), count=1)
        mbarrier.init(u_ready.index(1), count=1)
    else:
        u_smem = None
        y_smem = None
        u_ready = None
    return ChunkedBuffers(x_re, x_im, u_smem, y_smem, u_ready)


@gluon.jit
def fft_conv_gluon_chunked_kernel(U, K, Y, FARE, FAIM, FBRE, FBIM, TFRE, TFIM,
                                  batch, heads, stride_ub, stride_uh, stride_yb, stride_yh, stride_kh,
                                  A: gl.constexpr, B: gl.constexpr, CHUNK: gl.constexpr,
                                  u_desc=None, y_desc=None, TMA: gl.constexpr = False, RFFT: gl.constexpr = False,
                                  CONJ: gl.constexpr = False, WARPGROUPS: gl.constexpr = 1,
                                  WORKER_REGS: gl.constexpr = 240, PROBE: gl.constexpr = 0,
                                  TW_SFU: gl.constexpr = False, CONTIG: gl.constexpr = False, KPRE: gl.constexpr = 0,
                                  YALIAS: gl.constexpr = False, LEAN: gl.constexpr = 0):
    """fft_conv_gluon_onepass_kernel's convolution (same arguments) for larger A (N = 4096: A = 128), the
    tile's k_a columns CHUNK = 64 at a time, each chunk transposed (LEAN 4, which the kernel requires:
    _transposed_walk): stages 1..3' act on each column alone, so a chunk's tile is [k_a, m] and its stages chain
    through the wgmmas' register A operands; each chunk's spectrum product has a scale of its own (its largest |Y|),
    the two chunks' last products summed at the larger. F_A[:HALF, :] and -Im of it are resident by chunks ([HALF,
    CHUNK] each; stage 1 reads one transposed: F_A is symmetric), F_B and -Im F_B whole. WARPGROUPS 2: two warpgroups
    (4 + 4 warps, gl.warp_specialize) walk alternate pairs with buffers of their own, sharing the resident matrices
    (two pairs in flight a multiprocessor); WORKER_REGS: the second one's registers. YALIAS (TMA): y's box is the ring
    slot its pair's u came in, the next pair's u requested once the pair's x^T is in shared memory and the previous y
    store has read that slot. (The untransposed chunks and their history: notes/fft_conv.)"""
    gl.static_assert(B == 64, "the kernel's products have M = B = 64 (one warpgroup)")
    gl.static_assert(gl.num_warps() == 4, "one warpgroup (and with WARPGROUPS 2 one more, a worker partition)")
    gl.static_assert((LEAN & 4) == 4, "the chunked kernel's chunks are transposed (LEAN 4)")
    HALF: gl.constexpr = A // 2
    CHUNKS: gl.constexpr = A // CHUNK
    table: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
    chunk_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HALF, CHUNK], gl.float16)
    fare = gl.allocate_shared_memory(gl.float16, [CHUNKS, HALF, CHUNK], chunk_layout)  # F_A[:HALF, chunk c]
    faim = gl.allocate_shared_memory(gl.float16, [CHUNKS, HALF, CHUNK], chunk_layout)
    fanim = gl.allocate_shared_memory(gl.float16, [CHUNKS, HALF, CHUNK], chunk_layout)  # -Im F_A
    for c in gl.static_range(CHUNKS):
        fare.index(c).store(_load_square(FARE, HALF, CHUNK, A, c * CHUNK, table))
        im = _load_square(FAIM, HALF, CHUNK, A, c * CHUNK, table)
        faim.index(c).store(im)
        fanim.index(c).store(-im)
    fbre = _resident(FBRE, B, B, B, 0, False, table)
    fbim = _resident(FBIM, B, B, B, 0, False, table)
    fbnim = _resident(FBIM, B, B, B, 0, True, table)
    g = ChunkedGlobals(U, K, Y, TFRE, TFIM, batch, heads, stride_ub, stride_uh, stride_yb, stride_yh, stride_kh,
                       u_desc, y_desc, fare, faim, fanim, fbre, fbim, fbnim, A, B, CHUNK, TMA, RFFT, CONJ,
                       PROBE, TW_SFU, CONTIG, KPRE, YALIAS, LEAN)
    first = _chunked_buffers(u_desc, y_desc, B, HALF, TMA, YALIAS)
    if WARPGROUPS == 1:
        fence_async_shared()
        gl.thread_barrier()
        _transposed_walk(g, first, 0, 1)
    else:
        gl.static_assert(WARPGROUPS == 2, "WARPGROUPS is 1 or 2")
        second = _chunked_buffers(u_desc, y_desc, B, HALF, TMA, YALIAS)
        fence_async_shared()
        gl.thread_barrier()
        gl.warp_specialize([(_transposed_walk, (g, first, 0, 2)), (_transposed_walk, (g, second, 1, 2))], [4],
                           [WORKER_REGS])


@gluon.jit
def _transposed_chunk(st, spectrum, rows, cols, j, x_re, x_im, d_re, d_im, fare, faim, fanim, before, zeros,
                      lhs: gl.constexpr):
    """LEAN 4: chunk j's stages 1-2' on the transposed tile (rows k_a; _transposed_walk), D^T [CHUNK, B] stored as
    float16 into (d_re, d_im) at the chunk's scale s over max(``before``, s) (<= 1: ``before`` the earlier chunks'
    largest scale, 0 for none); returns s (its largest |Y|). ``rows`` (k_a of chunk 0) and ``cols`` (m, or k_b, times
    A): the tile's offsets, added here (held as one [CHUNK, B] tile across the pairs they cost registers)."""
    CHUNK: gl.constexpr = d_re.shape[0]
    f = gl.expand_dims(rows + j * CHUNK, 1) + gl.expand_dims(cols, 0)  # m A + k_a (twiddles), k_a + A k_b (bins)
    kpre = _spectrum_issue(st, spectrum, f)  # (KPRE 1: under stages 1-3)
    fat = fare.index(j).permute((1, 0))  # F_A[chunk, :HALF] (F_A symmetric)
    # 1. R^T = F_A[chunk, :HALF] @ x^T
    rre, rim = _complex_mma(fat, x_re, fanim.index(j).permute((1, 0)), x_im, fat, x_im, faim.index(j).permute((1, 0)),
                            x_re, zeros, True, False)
    twre, twim = _twiddles(st, f, 0)
    rre, rim = rre * twre - rim * twim, rre * twim + rim * twre
    rre = gl.convert_layout(rre.to(gl.float16), lhs)
    rim = gl.convert_layout(rim.to(gl.float16), lhs)
    # 3. S^T = R^T @ F_B (R^T the register A operand), Y^T = S^T K over its largest |Y|; KPRE 0: the bins loaded while
    # the wgmmas run
    if st.KPRE == 0:
        p = warpgroup_mma(rre, st.fbre, zeros, use_acc=False, is_async=True)
        p = warpgroup_mma(rim, st.fbnim, p, is_async=True)
        q = warpgroup_mma(rre, st.fbim, zeros, use_acc=False, is_async=True)
        q = warpgroup_mma(rim, st.fbre, q, is_async=True)
        kre, kim = _spectrum_take(st, spectrum, f, kpre)
        sre, sim, rre, rim = warpgroup_mma_wait(0, deps=(p, q, rre, rim))
    else:
        sre, sim = _complex_mma(rre, st.fbre, rim, st.fbnim, rre, st.fbim, rim, st.fbre, zeros, True, True)
        kre, kim = _spectrum_take(st, spectrum, f, kpre)
    yre = sre * kre - sim * kim
    yim = sre * kim + sim * kre
    scale = gl.max(gl.max(gl.maximum(gl.abs(yre), gl.abs(yim)), axis=1), axis=0)
    scale = gl.where(scale > 0, scale, 1.0)  # (NaN stays NaN: a NaN filter's outputs)
    inv = 1.0 / scale
    yre = gl.convert_layout((yre * inv).to(gl.float16), lhs)
    yim = gl.convert_layout((yim * inv).to(gl.float16), lhs)
    # 3'. D^T = Y^T @ conj(F_B) (Y^T the register A operand); 2'. the conjugate twiddles
    dre, dim = _complex_mma(yre, st.fbre, yim, st.fbim, yim, st.fbre, yre, st.fbnim, zeros, True, True)
    twre, twim = _twiddles(st, f, 0)
    ratio = scale / gl.maximum(before, scale)
    dre, dim = (dre * twre + dim * twim) * ratio, (dim * twre - dre * twim) * ratio
    gl.thread_barrier()  # every warp's stage-1 wgmmas have read x^T (chunk 1's D^T goes over it)
    d_re.store(dre.to(gl.float16))
    d_im.store(dim.to(gl.float16))
    return scale


@gluon.jit
def _transposed_walk(g, bufs, part, PARTS: gl.constexpr):
    """LEAN 4: _chunked_walk's pairs (the same walk, scales and roundings) with each chunk's tile transposed, rows k_a,
    so that a stage's output is the next stage's register A operand (a wgmma's accumulator is the next one's A operand
    without shared memory), and the two chunks' last products after both (CHUNK = HALF = B = 64, N = 4096):

        1.  R^T = F_A[chunk, :HALF] @ x^T          both from shared memory (F_A symmetric: the resident block read
                                                   transposed); x^T [HALF, B] = u's box rows, scaled, float16
        2.  R^T *= W_L^(m k_a)
        3.  S^T = R^T @ F_B                        R^T float16 in registers (F_B symmetric); Y^T = S^T K at f = k_a + A
                                                   k_b, over its largest |Y|: the chunk's scale s_j
        3'. D^T = Y^T @ conj(F_B)                  Y^T float16 in registers
        2'. D^T *= conj(W_L^(m k_a)), float16 into shared memory: chunk 0's into the staging tile at s_0, chunk 1's
            into x^T's (read by now) at s_1 / max(s_0, s_1)
        1'. out^T = conj(F_A)[:HALF, chunk 0] @ D_0^T, times s_0 / max; += conj(F_A)[:HALF, chunk 1] @ D_1^T

    (the running scale's roundings: chunk 0's D at its own scale, chunk 1's at s_1 over the larger, the sum rescaled
    where chunk 1's is larger), so no output accumulator is live across the chunks. out^T [HALF, B] goes to y's box as
    it is (rows a). gluon_emulate's emulate(..., chunk=64) is its arithmetic (the float32 sums in the wgmmas' own
    order). With TMA, YALIAS (two walkers' buffers beside the resident matrices fit only with y's box in u's ring);
    without (u or y not describable: the launch's choice a call), u and y by pointers at x^T's offsets B a + m."""
    K = g.K
    A: gl.constexpr = g.A
    B: gl.constexpr = g.B
    CHUNK: gl.constexpr = g.CHUNK
    HALF: gl.constexpr = A // 2
    L: gl.constexpr = A * B
    gl.static_assert(CHUNK == 64, "LEAN 4: two chunks of 64 rows k_a (N 4096)")
    gl.static_assert(HALF == 64, "LEAN 4: out^T's 64 rows a (N 4096)")
    gl.static_assert(g.YALIAS or not g.TMA, "LEAN 4 with TMA: y's box in u's ring (YALIAS; else over shared memory)")
    gl.static_assert(g.KPRE < 2, "LEAN 4: KPRE 0 or 1")
    fare = g.fare
    faim = g.faim
    fanim = g.fanim
    d_re = bufs.x_re  # [2, CHUNK, B]: chunk j's D^T in [j]; x^T [HALF, B] in [1] until chunk 1's stage 1 has read it
    d_im = bufs.x_im
    x_re = d_re.index(1)
    x_im = d_im.index(1)
    acc: gl.constexpr = wgmma_layout(CHUNK, B, 4)  # [k_a, m] and [k_a, k_b]
    acc_out: gl.constexpr = wgmma_layout(HALF, B, 4)  # [a, m]
    lhs: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc, k_width=2)
    rows_io: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # x^T read from u's box: 16 B a thread
    io_a = gl.arange(0, HALF, layout=gl.SliceLayout(1, rows_io))
    io_m = gl.arange(0, B, layout=gl.SliceLayout(0, rows_io))
    seq = gl.expand_dims(io_a, 1) * B + gl.expand_dims(io_m, 0)  # B a + m of x^T [a, m] (u and y by pointers)
    t_k = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, acc))
    t_m = gl.arange(0, B, layout=gl.SliceLayout(0, acc)) * A
    zeros = gl.zeros([CHUNK, B], gl.float32, acc)
    zeros_out = gl.zeros([HALF, B], gl.float32, acc_out)
    st = Stages(g.fbre, g.fbim, g.fbnim, d_re.index(0), d_im.index(0), g.TFRE, g.TFIM, L, g.RFFT, g.CONJ, True, g.PROBE,
                g.TW_SFU, None, g.KPRE, g.LEAN)

    groups = gl.cdiv(g.batch, 2)
    total = g.heads * groups
    pio = PairIO(g.U, g.Y, g.u_desc, g.y_desc, bufs.u_smem, bufs.y_smem, bufs.u_ready, g.batch, g.stride_ub, g.stride_uh,
                 g.stride_yb, g.stride_yh, groups, HALF, B, g.TMA, g.YALIAS, g.LEAN)
    if g.CONTIG == 2:
        start, stop, step = _walk_shared(gl.program_id(0), gl.num_programs(0), total, part, PARTS)
    else:
        start, stop, step = _walk(gl.program_id(0) * PARTS + part, gl.num_programs(0) * PARTS, total, g.CONTIG)
    _first_u(pio, start, stop)
    for w in range(start, stop, step):
        h = (w // groups).to(gl.int64)
        b_re = 2 * (w % groups)
        xre, scale_re, bad_re, xim, scale_im, bad_im = _pair_u(pio, w, start, step, stop, h, b_re, seq, rows_io, True)
        gl.thread_barrier()  # the previous pair's last products have read x^T's buffer and the tile
        x_re.store(xre.to(gl.float16))
        x_im.store(xim.to(gl.float16))
        spectrum = K + h * g.stride_kh
        fence_async_shared()
        gl.thread_barrier()
        _next_u(pio, w, start, step, stop)  # (YALIAS: the next pair's u, now that this one's is read)
        running = scale_re * 0.0  # the chunks' largest scale so far (0: none)
        first_scale = running
        for j in range(2):  # (a loop, not unrolled: unrolled, both chunks' bin offsets were hoisted out of the pair loop)
            s = _transposed_chunk(st, spectrum, t_k, t_m, j, x_re, x_im, d_re.index(j), d_im.index(j), fare, faim, fanim,
                                  running, zeros, lhs)
            first_scale = gl.where(j == 0, s, first_scale)
            running = gl.maximum(running, s)
        fence_async_shared()
        gl.thread_barrier()
        # 1'. out^T = conj(F_A)[:HALF, chunk 0] @ D_0^T at s_0 / max, += conj(F_A)[:HALF, chunk 1] @ D_1^T (a loop:
        # unrolled, the products' shared-memory descriptors were hoisted out of the pair loop and spilled)
        ore = zeros_out
        oim = zeros_out
        for c in range(2):
            p = warpgroup_mma(fare.index(c), d_re.index(c), ore, is_async=True)
            p = warpgroup_mma(faim.index(c), d_im.index(c), p, is_async=True)
            q = warpgroup_mma(fare.index(c), d_im.index(c), oim, is_async=True)
            q = warpgroup_mma(fanim.index(c), d_re.index(c), q, is_async=True)
            ore, oim = warpgroup_mma_wait(0, deps=(p, q))
            rescale = gl.where(c == 0, first_scale / running, 1.0)
            ore = ore * rescale
            oim = oim * rescale
        ore = gl.where(bad_re, float("nan"), ore * (running * scale_re / L))
        oim = gl.where(bad_im, float("nan"), oim * (running * scale_im / L))
        _pair_y(pio, ore, oim, w, start, step, h, b_re, seq, rows_io, True)
    _last_y(pio)


@gluon.jit
def _transform_stages(st, x_re, x_im, fa_re, fa_im, tab, zeros):
    """Stages 1-3 of _forward_stages (x in registers, ASYNC products) without the spectrum product: S = F_B @
    (W_L^(m k_a) (x @ F_A[:HALF, :])), the DFT of the pair's z = x_re + i x_im at f = k_a + A k_b, float32."""
    rre, rim = _complex_mma(x_re, fa_re, -x_im, fa_im, x_re, fa_im, x_im, fa_re, zeros, True, True)
    twre, twim = _twiddles(st, tab, 0)
    rre, rim = rre * twre - rim * twim, rre * twim + rim * twre
    gl.thread_barrier()  # the previous transform's wgmmas have read the staging tiles
    st.tile_re.store(rre.to(gl.float16))
    st.tile_im.store(rim.to(gl.float16))
    fence_async_shared()
    gl.thread_barrier()
    return _complex_mma(st.fbre, st.tile_re, st.fbnim, st.tile_im, st.fbre, st.tile_im, st.fbim, st.tile_re, zeros, True,
                        False)


@gluon.jit
def fft_conv_gluon_dk_kernel(U, DY, P, FARE, FAIM, FBRE, FBIM, TFRE, TFIM, batch, heads,
                             stride_ub, stride_uh, stride_db, stride_dh,
                             A: gl.constexpr, B: gl.constexpr, LOOP: gl.constexpr, TW_SFU: gl.constexpr = True,
                             XSMEM: gl.constexpr = False):
    """The filter's gradient in the frequency domain on the one-pass kernel's forward stages (the
    math of kernels_pair.fft_conv_dk_pair_kernel, its tl twin): program p = h chunks + c takes the pairs g = LOOP c + i
    (i < LOOP) of channel h and writes P[p] = sum over them of w_g DFT(z_dy) conj(DFT(z_u)), (2, B, A) float32 (re,
    im) at f = k_a + A k_b, where z_u = u_a / s_a + i u_b / s_b (each sequence over its largest |u|) and z_dy = dy_a
    (s_a t_a / w_g) / t_a + i dy_b (s_b t_b / w_g) / t_b, w_g = max(s_a t_a, s_b t_b): both halves weigh 1 / w_g. For
    real sequences the cross terms are anti-Hermitian: the real part of IDFT(sum P) is sum_b correlation(dy_b, u_b),
    dk (launch.dk_gluon). Each transform: x @ F_A[:HALF, :] (x from registers), the twiddles, F_B @ R (_transform_stages,
    every product a wgmma, ASYNC); the DFT matrices resident in shared memory. A non-finite element in any sequence
    makes the program's P NaN (as torch.fft's dk: its channel's every element). 4 warps, B = 64. XSMEM (2048's
    candidate): u's transform parked in shared memory (float32) while dy's runs, read back for the product (held in
    registers, the two transforms and the sum spilled 600 B at 64 x 64)."""
    gl.static_assert(B == 64, "the kernel's products have M = B = 64 (one warpgroup)")
    gl.static_assert(gl.num_warps() == 4, "one warpgroup")
    HALF: gl.constexpr = A // 2
    L: gl.constexpr = A * B
    acc: gl.constexpr = wgmma_layout(B, A, 4)
    lhs: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc, k_width=2)
    io: gl.constexpr = gl.BlockedLayout([4, 1], [16, 2], [1, 4], [0, 1])
    table: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
    fa1re = _resident(FARE, HALF, A, A, 0, False, table)  # F_A[:HALF, :]
    fa1im = _resident(FAIM, HALF, A, A, 0, False, table)
    fbre = _resident(FBRE, B, B, B, 0, False, table)
    fbim = _resident(FBIM, B, B, B, 0, False, table)
    fbnim = _resident(FBIM, B, B, B, 0, True, table)
    stage_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([B, A], gl.float16)
    tile_re = gl.allocate_shared_memory(gl.float16, [B, A], stage_layout)
    tile_im = gl.allocate_shared_memory(gl.float16, [B, A], stage_layout)
    if XSMEM:
        park_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
        park = gl.allocate_shared_memory(gl.float32, [2, B, A], park_layout)
        sums = gl.allocate_shared_memory(gl.float32, [2, B, A], park_layout)  # (the sum, each thread its own elements)
    fence_async_shared()
    gl.thread_barrier()
    st = Stages(fbre, fbim, fbnim, tile_re, tile_im, TFRE, TFIM, L, False, False, True, 0, TW_SFU, None, 0, 1)

    seq, tab, zeros = _tile_offsets(B, HALF, A, A, io, acc)
    if XSMEM:
        sums.index(0).store(zeros)
        sums.index(1).store(zeros)

    groups = gl.cdiv(batch, 2)
    chunks = gl.cdiv(groups, LOOP)
    pid = gl.program_id(0)
    h = (pid // chunks).to(gl.int64)
    c = pid % chunks
    acc_re = zeros
    acc_im = zeros
    bad = pid < 0  # (False: any non-finite element of the program's sequences)
    for i in range(LOOP):
        b_a = 2 * (c * LOOP + i)
        b_b = b_a + 1
        ua, sa, bad_ua, ub, sb, bad_ub = _scaled_both(
            _load_raw(U, b_a, batch, b_a.to(gl.int64) * stride_ub + h * stride_uh, seq),
            _load_raw(U, b_b, batch, b_b.to(gl.int64) * stride_ub + h * stride_uh, seq))
        da, ta, bad_da, db, tb, bad_db = _scaled_both(
            _load_raw(DY, b_a, batch, b_a.to(gl.int64) * stride_db + h * stride_dh, seq),
            _load_raw(DY, b_b, batch, b_b.to(gl.int64) * stride_db + h * stride_dh, seq))
        bad = bad | bad_ua | bad_ub | bad_da | bad_db
        wa = sa * ta
        wb = sb * tb
        weight = gl.maximum(wa, wb)
        xre, xim = _transform_stages(st, gl.convert_layout(ua.to(gl.float16), lhs),
                                     gl.convert_layout(ub.to(gl.float16), lhs), fa1re, fa1im, tab, zeros)
        if XSMEM:  # (each thread reads back what it wrote: no barrier)
            park.index(0).store(xre)
            park.index(1).store(xim)
        yre, yim = _transform_stages(st, gl.convert_layout((da * (wa / weight)).to(gl.float16), lhs),
                                     gl.convert_layout((db * (wb / weight)).to(gl.float16), lhs), fa1re, fa1im, tab,
                                     zeros)
        if XSMEM:  # (one plane of the sum at a time: fewer registers live)
            xre = park.index(0).load(acc)
            xim = park.index(1).load(acc)
            sums.index(0).store(sums.index(0).load(acc) + (yre * xre + yim * xim) * weight)
            sums.index(1).store(sums.index(1).load(acc) + (yim * xre - yre * xim) * weight)
        else:
            acc_re += (yre * xre + yim * xim) * weight  # Y conj(X)
            acc_im += (yim * xre - yre * xim) * weight
    if XSMEM:
        acc_re = sums.index(0).load(acc)
        acc_im = sums.index(1).load(acc)
    acc_re = gl.where(bad, float("nan"), acc_re)
    acc_im = gl.where(bad, float("nan"), acc_im)
    base = P + pid.to(gl.int64) * (2 * L)
    gl.store(base + tab, acc_re)
    gl.store(base + L + tab, acc_im)
