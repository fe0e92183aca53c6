"""The one-pass FFT convolution at order 3 in Gluon (issue 37): one kernel, u read once and y written
once. ON at N = 8192 (two programs a multiprocessor) and 16384 (two warpgroups a pair, WARPGROUPS 2):
configs.GLUON_ORDER3 / _HALF.

The chunked kernel's method (gluon_onepass.py: two sequences of a channel as z = u_a + i u_b, one complex DFT
of L = 2N = A B, B = 64 rows, n = B a + m, f = k_a + A k_b) with its first factor A split once more,
A = 16 A2 (A2 = 16 at 8192, 32 at 16384), so no DFT matrix larger than 64 x 64 is held (order 2's F_A half at 8192:
192 KiB):

    a = A2 a1 + a2 (a1 < 16, only a1 < 8 nonzero: the zero padding), k_a = k1 + 16 k2 (k1 < 16, k2 < A2)
    W_A^(a k_a) = W_16^(a1 k1) W_A^(a2 k1) W_A2^(a2 k2)

    1a. T[k1, a2, m] = W_A^(a2 k1) sum_a1 z[B (A2 a1 + a2) + m] W_16^(a1 k1)
        once a pair, two columns a2 a wgmma wait: x_a2 [B, 16] (a1 >= 8 masked to 0) @ F_16 -> [B, 16], the
        twiddle, float16 into T (shared memory: 64 KiB for both planes at 8192, 128 KiB at 16384); x_a2 is read from u
        at those offsets (L1 / L2: the pair's scale pass read all of u just before)
    then 16 / KG chunks of KG = 64 / A2 values of k1 (each chunk's tile transposed, [k_a, m]: its KG A2 = 64 rows
    k_a = k1 + l + 16 k2 at row A2 l + k2 are the wgmma's M; _tchunk):
    1b. R^T = F2 @ T[chunk]                             F2: KG copies of F_A2 on the diagonal (both from shared memory)
    2, 3, the spectrum product, 3', 2' (the twiddles W_L^(m k_a) computed, the spectrum's float16 bins read at
        f = k_a + A k_b, each chunk's product at its own scale s_j; R^T and Y^T the next product's register A operands)
    1'b. T'^T = conj(F2) @ D^T                          written over the chunk (the chunk owns it: no accumulator)
    after the chunks:
    1'a. out[m, a1] of a2 = sum_k1 (s_k1 / s) conj(W_A^(a2 k1)) T'[k1, a2, m] conj(W_16^(a1 k1)), a1 < 8
        [B, 16] @ conj(F_16)[:, :8]; s = the largest chunk scale; y[B (A2 a1 + a2) + m] = out s / L x the
        sequence's scale (x the channel's bin scale KS[h] with KSCALE)

T is held as the wgmma's NVMMA tiles (1a and 1'a address the same bytes as plain rows: _stack_offsets). STACK (on at 8192):
1a and 1'a four columns a2 a product, [B, (j, a1)] @ F2 (F_16 four times on its diagonal at A2 = 16), in the wgmmas'
own layouts (no layout conversion through shared memory: _ST5), u read once a pair. FLOPs a pair
(complex multiply-adds, as the wgmmas run them): 1a B 16 16 A2, 1b and 1'b B A C each, 3 and 3' B B A each, 1'a B 16 8
A2 (model.order3_flops). Products: float16 operands, float32 sums, as the chunked kernel; one more float16 rounding
(T) than order 2 (bf16 1.07x the floor on the H100, fp16 3.2x). The arithmetic step for step in torch:
gluon_emulate.emulate_order3 (tests against float64); Gluon cannot be interpreted.
"""
from triton.experimental import gluon

from tilecore.ops.fft_conv.gluon_onepass import (Stages, _complex_mma, _load_raw, _max4, _resident, _scaled_both,
                                                 _spectrum_at, _twiddles, _unpack_half_bin, _walk)
from tilecore.tiles.gluon import struct, wgmma_layout
from tilecore.tiles.gluon.compat import fence_async_shared, gl, mbarrier, warpgroup_mma, warpgroup_mma_wait

SUPPORTED_N = (8192, 16384)  # (plan.ORDER3_PER_SM: programs a multiprocessor)
WORKER_REGS = 256  # WARPGROUPS 2: the second warpgroup's registers (setmaxnreg)


def factors(n: int) -> tuple[int, int, int]:
    """(A, B, A2) of L = 2n = A B, B = 64, A = 16 A2."""
    a = 2 * n // 64
    return a, 64, a // 16


@gluon.jit
def _issue(a1, b1, a2, b2, a3, b3, a4, b4, zeros):
    """The four wgmmas of a complex product (a1 b1 + a2 b2, a3 b3 + a4 b4) issued, not waited for."""
    p = warpgroup_mma(a1, b1, zeros, use_acc=False, is_async=True)
    p = warpgroup_mma(a2, b2, p, is_async=True)
    q = warpgroup_mma(a3, b3, zeros, use_acc=False, is_async=True)
    q = warpgroup_mma(a4, b4, q, is_async=True)
    return p, q


# STACK (N = 8192: A2 = 16, so F2 is F_16 four times on its diagonal): 1a and 1'a take four columns a2 = 4 g + j at
# once, [B, 64] @ F2 (the products' K and N are (j, a1) and (j, k1)), with no layout conversion through shared memory: the
# tile's row r = 16 w + 8 h + t holds T's plain position P = 16 w + 2 t + h, so the two rows a thread holds in the
# wgmma's layouts (r, r + 8) are two neighbouring positions: u's loads, T's stores and loads and y's stores are 4 bytes
# wide straight from (to) those layouts. The [64, 64] tile is seen as [4 w, 2 h, 8 t, 4 j, 16 a1] (the accumulator's
# own layout, its registers ordered h first, so that neighbouring positions are neighbouring registers).
_ST5 = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 8], [0, 0, 0, 1, 0], [0, 0, 0, 2, 0]],
    lane_bases=[[0, 0, 0, 0, 2], [0, 0, 0, 0, 4], [0, 0, 1, 0, 0], [0, 0, 2, 0, 0], [0, 0, 4, 0, 0]],
    warp_bases=[[1, 0, 0, 0, 0], [2, 0, 0, 0, 0]], block_bases=[], shape=[4, 2, 8, 4, 16]))
_ST5H = gl.constexpr(gl.DistributedLinearLayout(  # the same without the a1 >= 8 half (u's zero padding, y's unused)
    reg_bases=[[0, 1, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 1, 0], [0, 0, 0, 2, 0]],
    lane_bases=[[0, 0, 0, 0, 2], [0, 0, 0, 0, 4], [0, 0, 1, 0, 0], [0, 0, 2, 0, 0], [0, 0, 4, 0, 0]],
    warp_bases=[[1, 0, 0, 0, 0], [2, 0, 0, 0, 0]], block_bases=[], shape=[4, 2, 8, 4, 8]))


@gluon.constexpr_function
def _one_axis(L, d):
    """The layout of dimension d alone of a rank-5 layout L (the others sliced away, the last first)."""
    for k in (4, 3, 2, 1, 0):
        if k != d:
            L = gl.SliceLayout(k, L)
    return L


@gluon.jit
def _axis5(n: gl.constexpr, d: gl.constexpr, L: gl.constexpr):
    """arange(n) along dimension d of a rank-5 tensor of layout L, expanded to rank 5."""
    x = gl.arange(0, n, layout=_one_axis(L, d))
    for k in gl.static_range(5):
        if k != d:
            x = gl.expand_dims(x, k)
    return x


@gluon.jit
def _stack_offsets(g4: gl.constexpr, A2: gl.constexpr, B: gl.constexpr):
    """STACK: the sequence offsets B (A2 a1 + a2) + m of group g4's [4 w, 2 h, 8 t, 4 j, 8 a1] view (a1 < 8), column
    a2 = 4 g4 + j, at T's plain position P = 16 w + 2 t + h (in _ST5H): T is the wgmma's NVMMA tile [16 A2, B] (rows
    of 128 B, the 128-byte swizzle: a row's 16-byte unit lies at unit ^ (row % 8), row % 8 = a2 % 8), so plain
    position P of column a2 holds m = ((P / 8) ^ (a2 % 8)) 8 + P % 8 (written so that neighbouring P are neighbouring
    m for the compiler: 4-byte accesses)."""
    P = 16 * _axis5(4, 0, _ST5H) + 2 * _axis5(8, 2, _ST5H) + _axis5(2, 1, _ST5H)
    a2 = 4 * g4 + _axis5(4, 3, _ST5H)
    m = ((P // 8) ^ (a2 % 8)) * 8 + P % 8
    return (_axis5(8, 4, _ST5H) * A2 + a2) * B + m


@gluon.jit
def _stack_view(T, g4: gl.constexpr):
    """STACK: T's plain rows [16 k1, A2, B] as group g4's [16 k1, 4 j, 4 w, 8 t, 2 h] (position P = 16 w + 2 t + h)."""
    A2: gl.constexpr = T.shape[1]
    plain5: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[4, 3, 2, 1, 0])
    return T._reinterpret(gl.float16, [16, A2, 4, 8, 2], plain5).slice(4 * g4, 4, 1)


@gluon.jit
def _stack_u(U, b_re, batch, row_re, row_im, g4: gl.constexpr, A2: gl.constexpr, B: gl.constexpr):
    """STACK: group g4's u as it is ([4 w, 2 h, 8 t, 4 j, 8 a1] of each sequence, _stack_offsets; 0 past the batch)."""
    off = _stack_offsets(g4, A2, B)
    xre = gl.load(U + row_re + off, mask=(off >= 0) & (b_re < batch), other=0.0)
    xim = gl.load(U + row_im + off, mask=(off >= 0) & (b_re + 1 < batch), other=0.0)
    return xre, xim


@gluon.jit
def _stack_scales(raws):
    """STACK: the pair's (scale_re, bad_re, scale_im, bad_im) as _scaled_both gives them (each sequence's largest |u|
    over its finite elements, 1 where that is 0, and whether it holds a non-finite element) from its four groups' u as
    _stack_u read them (together every element of both sequences), one 4-operand reduction."""
    are = gl.zeros_like(raws[0][0]).to(gl.float32)
    bre = are
    aim = are
    bim = are
    for c in gl.static_range(4):
        xre = raws[c][0].to(gl.float32)
        xim = raws[c][1].to(gl.float32)
        fre = gl.abs(xre) < float("inf")  # False for NaN and +-inf
        fim = gl.abs(xim) < float("inf")
        are = gl.maximum(are, gl.where(fre, gl.abs(xre), 0.0))
        bre = gl.maximum(bre, gl.where(fre, 0.0, 1.0))
        aim = gl.maximum(aim, gl.where(fim, gl.abs(xim), 0.0))
        bim = gl.maximum(bim, gl.where(fim, 0.0, 1.0))
    are, bre, aim, bim = gl.reduce((gl.reshape(are, [64, 32]), gl.reshape(bre, [64, 32]), gl.reshape(aim, [64, 32]),
                                    gl.reshape(bim, [64, 32])), 1, _max4)
    are, bre, aim, bim = gl.reduce((are, bre, aim, bim), 0, _max4)
    return gl.where(are > 0, are, 1.0), bre > 0, gl.where(aim > 0, aim, 1.0), bim > 0


@gluon.jit
def _stack_operand(x, inv, B: gl.constexpr, acc: gl.constexpr, lhs: gl.constexpr):
    """STACK: _stack_u's tile of one sequence as the [B, (j, a1)] float16 A operand: over its largest |u| (``inv``: 1 /
    that), non-finite elements zeroed, a1 >= 8 zeros (registers only: no data crosses threads)."""
    x = x.to(gl.float32)
    x = gl.where(gl.abs(x) < float("inf"), x * inv, 0.0).to(gl.float16)
    x = gl.reshape(gl.permute(gl.join(x, gl.zeros_like(x)), (0, 1, 2, 3, 5, 4)), [B, 64])  # [.., 2, 8] -> 16 a1
    return gl.convert_layout(gl.convert_layout(x, acc), lhs)


@gluon.jit
def _stage_1a_stacked(T_re, T_im, raw, inv_re, inv_im, f2re, f2im, f2nim, t1re, t1im, g4: gl.constexpr,
                      B: gl.constexpr, acc: gl.constexpr, lhs: gl.constexpr):
    """STACK's stage 1a of columns a2 = 4 g4 .. 4 g4 + 3: T[:, a2, :] = W_A^(a2 k1) (x @ F2), x [B, (j, a1)] from
    ``raw`` (_stack_u of this group, held since the pair's scales), float16 into T's planes from the accumulator's
    layout (4-byte stores)."""
    xre = _stack_operand(raw[0], inv_re, B, acc, lhs)
    xim = _stack_operand(raw[1], inv_im, B, acc, lhs)
    zeros = gl.zeros([B, 64], gl.float32, acc)
    p, q = _issue(xre, f2re, xim, f2nim, xre, f2im, xim, f2re, zeros)
    p, q, xre, xim = warpgroup_mma_wait(0, deps=(p, q, xre, xim))
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, acc))  # (j, k1): W_A^(a2 k1) at T1[a2, k1] = T1 + 64 g4 + c
    twre = gl.expand_dims(gl.load(t1re + 64 * g4 + c), 0)
    twim = gl.expand_dims(gl.load(t1im + 64 * g4 + c), 0)
    tre, tim = p * twre - q * twim, p * twim + q * twre
    tre = gl.convert_layout(gl.reshape(tre.to(gl.float16), [4, 2, 8, 4, 16]), _ST5)
    tim = gl.convert_layout(gl.reshape(tim.to(gl.float16), [4, 2, 8, 4, 16]), _ST5)
    _stack_view(T_re, g4).store(gl.permute(tre, (4, 3, 0, 2, 1)))
    _stack_view(T_im, g4).store(gl.permute(tim, (4, 3, 0, 2, 1)))


@gluon.jit
def _stack_t(T_re, T_im, g4: gl.constexpr):
    """STACK: T'[:, a2, :] of columns a2 = 4 g4 + j as it is, [4 w, 2 h, 8 t, 4 j, 16 k1] float16 (4-byte loads)."""
    vl: gl.constexpr = gl.permute(gl.zeros([4, 2, 8, 4, 16], gl.float16, _ST5), (4, 3, 0, 2, 1)).type.layout
    return (gl.permute(_stack_view(T_re, g4).load(vl), (2, 4, 3, 1, 0)),
            gl.permute(_stack_view(T_im, g4).load(vl), (2, 4, 3, 1, 0)))


@gluon.jit
def _stage_1a_inverse_stacked(T_re, T_im, Y, b_re, batch, row_re, row_im, raw, ratio, t1re, t1im, f2re, f2im, f2nim,
                              out_re, out_im, g4: gl.constexpr, A2: gl.constexpr, B: gl.constexpr, acc: gl.constexpr,
                              lhs: gl.constexpr, NEXT: gl.constexpr):
    """STACK's stage 1'a of columns a2 = 4 g4 .. 4 g4 + 3: V [B, (j, k1)] = T'[:, a2, :] (``raw``: _stack_t of this
    group) times ``ratio`` ([64] at (j, k1): s_k1 / s) and conj(W_A^(a2 k1)), float16, @ conj(F2) -> [B, (j, a1)], its
    a1 < 8 to y (4-byte stores). NEXT: the next group's T' read between the wgmmas' issue and their wait; returns it
    (else ``raw``)."""
    vre = gl.convert_layout(gl.reshape(raw[0], [B, 64]), acc).to(gl.float32)
    vim = gl.convert_layout(gl.reshape(raw[1], [B, 64]), acc).to(gl.float32)
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, acc))
    cre = gl.expand_dims(gl.load(t1re + 64 * g4 + c) * ratio, 0)
    cim = gl.expand_dims(gl.load(t1im + 64 * g4 + c) * ratio, 0)
    vre, vim = vre * cre + vim * cim, vim * cre - vre * cim
    vre = gl.convert_layout(vre.to(gl.float16), lhs)
    vim = gl.convert_layout(vim.to(gl.float16), lhs)
    zeros = gl.zeros([B, 64], gl.float32, acc)
    p, q = _issue(vre, f2re, vim, f2im, vim, f2re, vre, f2nim, zeros)
    if NEXT:
        raw = _stack_t(T_re, T_im, g4 + 1)
    p, q, vre, vim = warpgroup_mma_wait(0, deps=(p, q, vre, vim))
    # a1 < 8 only: [.., 16 a1] -> [.., 2, 8] -> the first half
    ore, _ = gl.split(gl.permute(gl.reshape(gl.convert_layout(gl.reshape(p, [4, 2, 8, 4, 16]), _ST5),
                                            [4, 2, 8, 4, 2, 8]), (0, 1, 2, 3, 5, 4)))
    oim, _ = gl.split(gl.permute(gl.reshape(gl.convert_layout(gl.reshape(q, [4, 2, 8, 4, 16]), _ST5),
                                            [4, 2, 8, 4, 2, 8]), (0, 1, 2, 3, 5, 4)))
    off = _stack_offsets(g4, A2, B)
    ty: gl.constexpr = Y.dtype.element_ty
    gl.store(Y + row_re + off, (gl.convert_layout(ore, _ST5H) * out_re).to(ty), mask=(off >= 0) & (b_re < batch))
    gl.store(Y + row_im + off, (gl.convert_layout(oim, _ST5H) * out_im).to(ty), mask=(off >= 0) & (b_re + 1 < batch))
    return raw


# Without STACK (16384: F2 is F_32 twice there): the same addressing one column a product (j of size 1), x [64, 16] @
# F_16 and V [64, 16] @ conj(F_16)[:, :8], u, T and y read and written in the [64, 16] / [64, 8] wgmma layouts
_SC5 = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 8]],
    lane_bases=[[0, 0, 0, 0, 2], [0, 0, 0, 0, 4], [0, 0, 1, 0, 0], [0, 0, 2, 0, 0], [0, 0, 4, 0, 0]],
    warp_bases=[[1, 0, 0, 0, 0], [2, 0, 0, 0, 0]], block_bases=[], shape=[4, 2, 8, 1, 16]))
_SC5H = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1, 0, 0, 0], [0, 0, 0, 0, 1]],
    lane_bases=[[0, 0, 0, 0, 2], [0, 0, 0, 0, 4], [0, 0, 1, 0, 0], [0, 0, 2, 0, 0], [0, 0, 4, 0, 0]],
    warp_bases=[[1, 0, 0, 0, 0], [2, 0, 0, 0, 0]], block_bases=[], shape=[4, 2, 8, 1, 8]))


@gluon.jit
def _col_offsets(a2: gl.constexpr, A2: gl.constexpr, B: gl.constexpr):
    """Column a2's offsets B (A2 a1 + a2) + m as [4 w, 2 h, 8 t, 1, 8 a1] (_SC5H; m at P = 16 w + 2 t + h)."""
    P = 16 * _axis5(4, 0, _SC5H) + 2 * _axis5(8, 2, _SC5H) + _axis5(2, 1, _SC5H)
    return (_axis5(8, 4, _SC5H) * A2 + a2) * B + ((P // 8) ^ (a2 % 8)) * 8 + P % 8


@gluon.jit
def _col_view(T, a2: gl.constexpr):
    """T's plain rows [16 k1, A2, B] as column a2's [16 k1, 1, 4 w, 8 t, 2 h]."""
    A2: gl.constexpr = T.shape[1]
    return T._reinterpret(gl.float16, [16, A2, 4, 8, 2],
                          gl.SwizzledSharedLayout(1, 1, 1, order=[4, 3, 2, 1, 0])).slice(a2, 1, 1)


@gluon.jit
def _col_x(U, row, ok, inv, a2: gl.constexpr, A2: gl.constexpr, B: gl.constexpr, acc1: gl.constexpr,
           lhs1: gl.constexpr):
    """x_a2 [B, 16] of one sequence as the float16 A operand, read in its layout (a1 >= 8 zeros)."""
    off = _col_offsets(a2, A2, B)
    x = gl.load(U + row + off, mask=(off >= 0) & ok, other=0.0).to(gl.float32)
    x = gl.where(gl.abs(x) < float("inf"), x * inv, 0.0).to(gl.float16)
    x = gl.reshape(gl.permute(gl.join(x, gl.zeros_like(x)), (0, 1, 2, 3, 5, 4)), [B, 16])
    return gl.convert_layout(gl.convert_layout(x, acc1), lhs1)


@gluon.jit
def _col_t(T_re, T_im, p, q, t1re, t1im, a2: gl.constexpr):
    """T[:, a2, :] = W_A^(a2 k1) (p + i q) as float16 from the [B, 16] accumulator's layout."""
    k1 = gl.arange(0, 16, layout=gl.SliceLayout(0, p.type.layout))
    twre = gl.expand_dims(gl.load(t1re + a2 * 16 + k1), 0)
    twim = gl.expand_dims(gl.load(t1im + a2 * 16 + k1), 0)
    tre, tim = p * twre - q * twim, p * twim + q * twre
    _col_view(T_re, a2).store(gl.permute(gl.convert_layout(gl.reshape(tre.to(gl.float16), [4, 2, 8, 1, 16]), _SC5),
                                         (4, 3, 0, 2, 1)))
    _col_view(T_im, a2).store(gl.permute(gl.convert_layout(gl.reshape(tim.to(gl.float16), [4, 2, 8, 1, 16]), _SC5),
                                         (4, 3, 0, 2, 1)))


@gluon.jit
def _stage_1a(T_re, T_im, U, b_re, batch, row_re, row_im, inv_re, inv_im, f16re, f16im, t1re, t1im,
              a2: gl.constexpr, A2: gl.constexpr, B: gl.constexpr, acc1: gl.constexpr, lhs1: gl.constexpr):
    """Stage 1a of columns a2 and a2 + 1 (their eight wgmmas issued together, one wait): T[:, a2, :] = W_A^(a2 k1)
    (x_a2 @ F_16), x_a2 [B, 16] (a1 >= 8 zero) read and T written in the wgmma's layouts (4-byte accesses)."""
    zeros1 = gl.zeros([B, 16], gl.float32, acc1)
    xre = _col_x(U, row_re, b_re < batch, inv_re, a2, A2, B, acc1, lhs1)
    xim = _col_x(U, row_im, b_re + 1 < batch, inv_im, a2, A2, B, acc1, lhs1)
    nxim = -xim
    p, q = _issue(xre, f16re, nxim, f16im, xre, f16im, xim, f16re, zeros1)
    xre2 = _col_x(U, row_re, b_re < batch, inv_re, a2 + 1, A2, B, acc1, lhs1)
    xim2 = _col_x(U, row_im, b_re + 1 < batch, inv_im, a2 + 1, A2, B, acc1, lhs1)
    nxim2 = -xim2
    p2, q2 = _issue(xre2, f16re, nxim2, f16im, xre2, f16im, xim2, f16re, zeros1)
    p, q, p2, q2, xre, xim, nxim, xre2, xim2, nxim2 = warpgroup_mma_wait(
        0, deps=(p, q, p2, q2, xre, xim, nxim, xre2, xim2, nxim2))
    _col_t(T_re, T_im, p, q, t1re, t1im, a2)
    _col_t(T_re, T_im, p2, q2, t1re, t1im, a2 + 1)


@gluon.jit
def _col_v(T_re, T_im, ratio, t1re, t1im, a2: gl.constexpr, B: gl.constexpr, acc1: gl.constexpr,
           lhs8: gl.constexpr):
    """1'a's operand of column a2: T'[:, a2, :] ([B, 16 k1]; chunk k1 at its scale s_k1) times ``ratio`` [16] = s_k1 / s
    and conj(W_A^(a2 k1)), float16 (re, im, -re), read in the wgmma layouts."""
    vl: gl.constexpr = gl.permute(gl.zeros([4, 2, 8, 1, 16], gl.float16, _SC5), (4, 3, 0, 2, 1)).type.layout
    vre = gl.reshape(gl.permute(_col_view(T_re, a2).load(vl), (2, 4, 3, 1, 0)), [B, 16])
    vim = gl.reshape(gl.permute(_col_view(T_im, a2).load(vl), (2, 4, 3, 1, 0)), [B, 16])
    vre = gl.convert_layout(vre, acc1).to(gl.float32)
    vim = gl.convert_layout(vim, acc1).to(gl.float32)
    k1 = gl.arange(0, 16, layout=gl.SliceLayout(0, acc1))
    r = gl.expand_dims(gl.convert_layout(ratio, gl.SliceLayout(0, acc1)), 0)
    cre = gl.expand_dims(gl.load(t1re + a2 * 16 + k1), 0) * r
    cim = gl.expand_dims(gl.load(t1im + a2 * 16 + k1), 0) * r
    vre, vim = vre * cre + vim * cim, vim * cre - vre * cim
    vre = gl.convert_layout(vre.to(gl.float16), lhs8)
    vim = gl.convert_layout(vim.to(gl.float16), lhs8)
    return vre, vim, -vre


@gluon.jit
def _col_y(Y, b_re, batch, row_re, row_im, ore, oim, out_re, out_im, a2: gl.constexpr, A2: gl.constexpr,
           B: gl.constexpr):
    """y of column a2 from the [B, 8] accumulator's layout (4-byte stores)."""
    off = _col_offsets(a2, A2, B)
    ty: gl.constexpr = Y.dtype.element_ty
    ore = gl.convert_layout(gl.reshape(ore, [4, 2, 8, 1, 8]), _SC5H)
    oim = gl.convert_layout(gl.reshape(oim, [4, 2, 8, 1, 8]), _SC5H)
    gl.store(Y + row_re + off, (ore * out_re).to(ty), mask=(off >= 0) & (b_re < batch))
    gl.store(Y + row_im + off, (oim * out_im).to(ty), mask=(off >= 0) & (b_re + 1 < batch))


@gluon.jit
def _stage_1a_inverse(T_re, T_im, Y, b_re, batch, row_re, row_im, ratio, t1re, t1im, f8re, f8im, out_re, out_im,
                      a2: gl.constexpr, A2: gl.constexpr, B: gl.constexpr, acc1: gl.constexpr, lhs8: gl.constexpr,
                      acc8: gl.constexpr):
    """Stage 1'a of columns a2 and a2 + 1 (their eight wgmmas issued together, one wait): _col_v's operand @
    conj(F_16)[:, :8], y of both from the accumulator's layout (_col_y)."""
    zeros8 = gl.zeros([B, 8], gl.float32, acc8)
    vre, vim, nvre = _col_v(T_re, T_im, ratio, t1re, t1im, a2, B, acc1, lhs8)
    p, q = _issue(vre, f8re, vim, f8im, vim, f8re, nvre, f8im, zeros8)
    vre2, vim2, nvre2 = _col_v(T_re, T_im, ratio, t1re, t1im, a2 + 1, B, acc1, lhs8)
    p2, q2 = _issue(vre2, f8re, vim2, f8im, vim2, f8re, nvre2, f8im, zeros8)
    p, q, p2, q2, vre, vim, nvre, vre2, vim2, nvre2 = warpgroup_mma_wait(
        0, deps=(p, q, p2, q2, vre, vim, nvre, vre2, vim2, nvre2))
    _col_y(Y, b_re, batch, row_re, row_im, p, q, out_re, out_im, a2, A2, B)
    _col_y(Y, b_re, batch, row_re, row_im, p2, q2, out_re, out_im, a2 + 1, A2, B)


# KFULL (the launch's laid-out bins, launch.laid_half_bins): chunk j's [64 rows k_a, 64 k_b] bins stored as the wgmma
# accumulator's layout holds them, a thread's four registers (column c0 = c % 2, row half h) one 16-byte vector and a
# warp's 32 lanes 512 contiguous bytes; the tile seen as [4 w, 8 t, 4 lc, 8 cg, 4 q] (row 16 w + 8 (q // 2) + t, column
# 8 cg + 2 lc + q % 2), its registers in the accumulator's order (q, then cg): a permute and reshape from [64, 64]
_KL5 = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 1, 0], [0, 0, 0, 2, 0], [0, 0, 0, 4, 0]],
    lane_bases=[[0, 0, 1, 0, 0], [0, 0, 2, 0, 0], [0, 1, 0, 0, 0], [0, 2, 0, 0, 0], [0, 4, 0, 0, 0]],
    warp_bases=[[1, 0, 0, 0, 0], [2, 0, 0, 0, 0]], block_bases=[], shape=[4, 8, 4, 8, 4]))


@gluon.jit
def _laid_bins(spectrum, j, acc: gl.constexpr):
    """KFULL: chunk j's bins (float16 (re, im) packed in an int32, the mirrored bins already conjugated) in the [64, 64]
    accumulator layout ``acc``, eight 16-byte loads a thread (a warp's load 512 contiguous bytes)."""
    lane = _axis5(8, 1, _KL5) * 4 + _axis5(4, 2, _KL5)
    off = ((_axis5(4, 0, _KL5) * 8 + _axis5(8, 3, _KL5)) * 32 + lane) * 4 + _axis5(4, 4, _KL5)
    x = gl.load(spectrum.to(gl.pointer_type(gl.int32), bitcast=True) + j * 4096 + off)
    x = gl.permute(gl.reshape(x, [4, 8, 4, 8, 2, 2]), (0, 4, 1, 3, 2, 5))  # [w, h, t, cg, lc, c0]
    return gl.convert_layout(gl.reshape(x, [64, 64]), acc)


@struct
class Order3Shared:
    """What every warpgroup of the order-3 kernel reads: the tensors and sizes, the pair's intermediate T (shared
    memory: one a program) and, with two warpgroups, their exchange (chunk scales, barriers)."""
    U: object
    K: object
    Y: object
    F16RE: object
    F16IM: object
    F2RE: object
    F2IM: object
    FBRE: object
    FBIM: object
    T1RE: object
    T1IM: object
    batch: object
    heads: object
    stride_ub: object
    stride_uh: object
    stride_yb: object
    stride_yh: object
    stride_kh: object
    T_re: object  # [16 / KG, C, B] float16 NVMMA tiles: T, then T' (chunk j's rows (k1, a2) at [j]; _stack_offsets)
    T_im: object
    scl: object  # [32] float32: each warpgroup's chunk scales at 16 p + k1 (WARPGROUPS 2), else None
    bars: object  # [2, 1] mbarriers: T written, T' written (WARPGROUPS 2), else None
    A: gl.constexpr
    B: gl.constexpr
    CONJ: gl.constexpr
    KS: object  # (heads,) float32: each channel's bins were divided by it (launch.scaled_half_bins), else None
    KSCALE: gl.constexpr  # KS given (the launch's RFFT 4): the outputs times KS[h]
    STACK: gl.constexpr  # 1a / 1'a four columns a2 a product against F2, in the wgmmas' layouts, u read once (8192)
    KFULL: gl.constexpr  # K the launch's laid-out bins (launch.laid_half_bins: a chunk's tile as its loads take it)


@struct
class Order3Tables:
    """A warpgroup's resident DFT matrices (shared memory; WARPGROUPS 2: each warpgroup its own, so that only T's and
    the tensors' addresses cross into the partitions: captured values live in registers there)."""
    f16re: object  # [16, 16] float16: F_16 (stage 1a's B)
    f16im: object
    f8re: object  # [16, 8]: F_16[:, :8] (stage 1'a's, conjugated)
    f8im: object
    f2re: object  # [C, C]: KG x F_A2 on the diagonal (1b, 1'b: both operands from shared memory)
    f2im: object
    f2nim: object  # -Im F2
    fbre: object  # [B, B] float16 (stage 3's and 3''s B; the register A operands negated where a difference needs it)
    fbim: object


@gluon.jit
def _order3_tables(F16RE, F16IM, F2RE, F2IM, FBRE, FBIM, B: gl.constexpr, C: gl.constexpr,
                   STACK: gl.constexpr = False):
    table: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
    if STACK:  # (1a and 1'a take F2)
        f16re = None
        f16im = None
        f8re = None
        f8im = None
    else:
        f16re = _resident(F16RE, 16, 16, 16, 0, False, table)  # F_16: stage 1a's B
        f16im = _resident(F16IM, 16, 16, 16, 0, False, table)
        f8re = _resident(F16RE, 16, 8, 16, 0, False, table)  # F_16[:, :8]: stage 1''a's (conjugated)
        f8im = _resident(F16IM, 16, 8, 16, 0, False, table)
    f2re = _resident(F2RE, C, C, C, 0, False, table)  # KG x F_A2 on the diagonal: stages 1b, 1'b
    f2im = _resident(F2IM, C, C, C, 0, False, table)
    fbre = _resident(FBRE, B, B, B, 0, False, table)
    fbim = _resident(FBIM, B, B, B, 0, False, table)
    f2nim = _resident(F2IM, C, C, C, 0, True, table)  # (no -Im F_B: two programs a SM fit at 8192)
    return Order3Tables(f16re, f16im, f8re, f8im, f2re, f2im, f2nim, fbre, fbim)


@gluon.jit
def _pair_scales(U, b_re, batch, row_re, row_im, B: gl.constexpr, HALF: gl.constexpr, COLS: gl.constexpr,
                 io: gl.constexpr):
    """(scale_re, bad_re, scale_im, bad_im) of a pair's two sequences as _scaled_both gives them (each one's largest
    |u| over its finite elements, 1 where that is 0, and whether it holds a non-finite element), read COLS columns of
    the [B, HALF] view at a time: fewer registers live than the whole sequences at once (the same values: a max is
    exact)."""
    m = gl.arange(0, B, layout=gl.SliceLayout(1, io))
    a = gl.arange(0, COLS, layout=gl.SliceLayout(0, io))
    base = gl.expand_dims(a, 0) * B + gl.expand_dims(m, 1)
    for c in gl.static_range(HALF // COLS):
        xre = _load_raw(U, b_re, batch, row_re, base + c * COLS * B).to(gl.float32)
        xim = _load_raw(U, b_re + 1, batch, row_im, base + c * COLS * B).to(gl.float32)
        fre = gl.abs(xre) < float("inf")  # False for NaN and +-inf
        fim = gl.abs(xim) < float("inf")
        part = gl.reduce((gl.where(fre, gl.abs(xre), 0.0), gl.where(fre, 0.0, 1.0), gl.where(fim, gl.abs(xim), 0.0),
                          gl.where(fim, 0.0, 1.0)), 1, _max4)
        part = gl.reduce(part, 0, _max4)
        if c == 0:
            are, bre, aim, bim = part
        else:
            are, bre, aim, bim = _max4(are, bre, aim, bim, *part)
    return gl.where(are > 0, are, 1.0), bre > 0, gl.where(aim > 0, aim, 1.0), bim > 0


@gluon.jit
def _both_arrived(bars, which: gl.constexpr, phase, PARTS: gl.constexpr):
    """WARPGROUPS 2: this warpgroup's shared-memory writes done (its own barrier), then barrier ``which`` arrived at
    (one arrival a warpgroup) and waited for: both warpgroups' writes are visible; else this warpgroup's barrier."""
    gl.thread_barrier()
    if PARTS == 2:
        mbarrier.arrive(bars.index(which))
        mbarrier.wait(bars.index(which), phase)


@gluon.jit
def fft_conv_gluon_order3_kernel(U, K, Y, F16RE, F16IM, F2RE, F2IM, FBRE, FBIM, T1RE, T1IM,
                                 batch, heads, stride_ub, stride_uh, stride_yb, stride_yh, stride_kh, KS,
                                 A: gl.constexpr, B: gl.constexpr, CONJ: gl.constexpr = False,
                                 WARPGROUPS: gl.constexpr = 1, WORKER_REGS: gl.constexpr = 240,
                                 KSCALE: gl.constexpr = False, STACK: gl.constexpr = False,
                                 KFULL: gl.constexpr = False):
    """Y[b, h, :N] = the first N of IDFT_L(DFT_L(pad(U[b, h])) K[h]) for every pair (2g, 2g + 1) of every channel h
    (or the correlation, CONJ): the module's order-3 stages; work item w = h groups + g, a persistent grid, each
    program's items contiguous (a channel's pairs in a row).

    U, Y: (batch, heads, N) rows with unit stride along N = A B / 2. K: the spectrum's bins as float16 (re, im) pairs
    (heads, N + 1, 2) (one 32-bit load a bin; the kernel reads bins f and L - f itself). F16 (16, 16), F2 (64, 64: KG
    = 64 / A2 copies of F_A2 on the diagonal, launch.order3_operands), FB (B, B): float16 DFT matrices; T1 (A2, 16)
    float32 = W_A^(a2 k1). 4 warps; B = 64, A = 16 A2. Each chunk (_tchunk) takes KG values of k1, its tile
    transposed: KG A2 = 64 rows k_a, the wgmma's M (KG 4 at 8192, 2 at 16384); T is the wgmma's NVMMA tile, stage 1b
    reads its chunk from there as the B operand, stages 1b and 3 feed stages 3 and 3' as register A operands, D^T and
    T' go back over the chunk (no staging tile, no -Im F_B: 8192's two programs a SM fit). Stages 1a and 1'a take
    two columns a2 a wgmma wait (eight wgmmas in flight). WARPGROUPS 2: two warpgroups (4 + 4 warps,
    gl.warp_specialize; WORKER_REGS the second one's registers) share each pair and its T: warpgroup p takes the
    columns a2 of half p in 1a and 1'a and every other chunk; two mbarriers order them (T written; T' and the chunk
    scales written), so a program holds one T with two warpgroups on it (16384: one T of 128 KiB a multiprocessor).
    1a / 1'a read and write u, T and y in the wgmmas' own layouts, 4 bytes wide (_stack_offsets). STACK (on at 8192, one warpgroup): 1a and 1'a take
    four columns a2 a product against F2 ([B, (j, a1)] @ F_16 four times on the diagonal; 4 + 4 wgmma waits a pair, not
    8 + 8), every access of u, T and y straight from / to the wgmmas' layouts (_ST5: no layout conversion through shared
    memory, ~40 barriers a pair instead of ~230), u read once a pair (its scales and 1a from the same registers), each
    group's T' read under the previous group's wgmmas; the same values. KSCALE, KS (heads,) float32: K's bins are the spectrum
    over KS[h] (launch.scaled_half_bins: a complex64 spectrum cast a call, each channel over its largest |re|, |im|, so
    no bin overflows float16), the outputs times KS[h]. KFULL: K is the launch's laid-out bins (launch.laid_half_bins:
    (heads, L) float16 pairs, each chunk's [64, 64] tile in the accumulator's register order, bins past N conjugated
    there), read by 16-byte loads, a warp's 512 contiguous bytes, instead of a 4-byte gather a bin. The same roundings
    as gluon_emulate.emulate_order3."""
    gl.static_assert(B == 64, "the kernel's products have M = B = 64 (one warpgroup)")
    gl.static_assert(gl.num_warps() == 4, "one warpgroup (and with WARPGROUPS 2 one more, a worker partition)")
    A2: gl.constexpr = A // 16
    gl.static_assert(A2 * 16 == A and (A2 == 16 or A2 == 32), "A = 16 A2, A2 16 or 32 (N 8192, 16384)")
    gl.static_assert(WARPGROUPS == 1 or WARPGROUPS == 2, "WARPGROUPS: 1 or 2 a pair")
    gl.static_assert(not STACK or (A2 == 16 and WARPGROUPS == 1),
                     "STACK: N = 8192 (F2 = F_16 on the diagonal), one warpgroup a pair")
    KG: gl.constexpr = B // A2  # k1 values a chunk: its KG A2 = 64 rows k_a
    C: gl.constexpr = KG * A2
    if WARPGROUPS == 1:
        tabs = _order3_tables(F16RE, F16IM, F2RE, F2IM, FBRE, FBIM, B, C, STACK)
    # T as the wgmma's tiles: chunk j's [C, B] rows (k1, a2) at [j] (1a and 1'a: _stack_offsets)
    t_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([C, B], gl.float16)
    T_re = gl.allocate_shared_memory(gl.float16, [16 // KG, C, B], t_layout)
    T_im = gl.allocate_shared_memory(gl.float16, [16 // KG, C, B], t_layout)
    if WARPGROUPS == 2:
        scl = gl.allocate_shared_memory(gl.float32, [32], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(bars.index(0), count=2)  # (one arrival a warpgroup)
        mbarrier.init(bars.index(1), count=2)
    else:
        scl = None
        bars = None
    g = Order3Shared(U, K, Y, F16RE, F16IM, F2RE, F2IM, FBRE, FBIM, T1RE, T1IM, batch, heads, stride_ub, stride_uh,
                     stride_yb, stride_yh, stride_kh, T_re, T_im, scl, bars, A, B, CONJ, KS, KSCALE, STACK, KFULL)
    fence_async_shared()
    gl.thread_barrier()
    if WARPGROUPS == 1:
        _order3_walk(g, tabs, 0, 1)
    else:
        gl.warp_specialize([(_order3_walk, (g, None, 0, 2)), (_order3_walk, (g, None, 1, 2))], [4], [WORKER_REGS])


@gluon.jit
def _tchunk(st, spectrum, f, t_re, t_im, f2re, f2im, f2nim, zeros, lhs: gl.constexpr, j, KFULL: gl.constexpr,
            acc: gl.constexpr):
    """One chunk's stages 1b-1'b on its transposed tile (rows k_a; ``f`` its offsets m A + k_a, read as k_a + A
    k_b after stage 3), T's chunk [C, B] (``t_re``, ``t_im``: rows (k1, a2) of the chunk) in, T'^T's out over it:

        1b. R^T = F2 @ T[chunk]                 both from shared memory (F2 symmetric: KG copies of F_A2)
        2.  R^T *= W_L^(m k_a)
        3.  S^T = R^T @ F_B                     R^T float16 in registers (-Im R^T negated there: no -Im F_B);
                                                Y^T = S^T K at f over its largest |Y|: the chunk's scale s
        3'. D^T = Y^T @ conj(F_B)               Y^T float16 in registers
        2'. D^T *= conj(W_L^(m k_a)), float16 over the chunk (1b has read it)
        1'b. T'^T = conj(F2) @ D^T              float16 over the chunk again: 1'a's input at the chunk's scale

    The roundings of gluon_onepass's _forward_stages / _inverse_stages (R, Y / s, D and T' to float16;
    gluon_emulate.emulate_order3); returns s. KFULL: ``spectrum`` the channel's laid-out bins, chunk ``j``'s tile read
    as a whole (_laid_bins)."""
    # 1b (nothing of the spectrum read early: KPRE 0; its bins load under stage 3's wgmmas)
    rre, rim = _complex_mma(f2re, t_re, f2nim, t_im, f2re, t_im, f2im, t_re, zeros, True, False)
    twre, twim = _twiddles(st, f, 0)
    rre, rim = rre * twre - rim * twim, rre * twim + rim * twre
    rre = gl.convert_layout(rre.to(gl.float16), lhs)
    rim = gl.convert_layout(rim.to(gl.float16), lhs)
    nrim = -rim
    # 3, the bins loaded while its wgmmas run
    p = warpgroup_mma(rre, st.fbre, zeros, use_acc=False, is_async=True)
    p = warpgroup_mma(nrim, st.fbim, p, is_async=True)
    q = warpgroup_mma(rre, st.fbim, zeros, use_acc=False, is_async=True)
    q = warpgroup_mma(rim, st.fbre, q, is_async=True)
    if KFULL:
        kre, kim = _unpack_half_bin(_laid_bins(spectrum, j, acc))
        if st.CONJ:
            kim = -kim
    else:
        kre, kim = _spectrum_at(spectrum, f, st.L, st.RFFT, st.CONJ)
    sre, sim, rre, rim, nrim = warpgroup_mma_wait(0, deps=(p, q, rre, rim, nrim))
    yre = sre * kre - sim * kim
    yim = sre * kim + sim * kre
    scale = gl.max(gl.max(gl.maximum(gl.abs(yre), gl.abs(yim)), axis=1), axis=0)
    scale = gl.where(scale > 0, scale, 1.0)  # (NaN stays NaN: a NaN filter's outputs)
    inv = 1.0 / scale
    yre = gl.convert_layout((yre * inv).to(gl.float16), lhs)
    yim = gl.convert_layout((yim * inv).to(gl.float16), lhs)
    # 3'. D^T = Y^T @ conj(F_B): (Yr Fr + Yi Fi, Yi Fr - Yr Fi)
    dre, dim = _complex_mma(yre, st.fbre, yim, st.fbim, yim, st.fbre, -yre, st.fbim, zeros, True, True)
    twre, twim = _twiddles(st, f, 0)
    dre, dim = dre * twre + dim * twim, dim * twre - dre * twim
    gl.thread_barrier()  # every warp's stage-1b wgmmas have read the chunk
    t_re.store(dre.to(gl.float16))
    t_im.store(dim.to(gl.float16))
    fence_async_shared()
    gl.thread_barrier()
    # 1'b. T'^T = conj(F2) @ D^T: (F2r Dr + F2i Di, F2r Di - F2i Dr)
    ore, oim = _complex_mma(f2re, t_re, f2im, t_im, f2re, t_im, f2nim, t_re, zeros, True, False)
    gl.thread_barrier()  # every warp's 1'b wgmmas have read D^T
    t_re.store(ore.to(gl.float16))
    t_im.store(oim.to(gl.float16))
    return scale


@gluon.jit
def _order3_walk(g, tabs, PART: gl.constexpr, PARTS: gl.constexpr):
    """One warpgroup's walk over the program's pairs (PARTS 1: each pair whole, ``tabs`` the program's tables; PARTS 2:
    warpgroup PART's share of each pair, the other warpgroup on the same pair: columns a2 of half PART in 1a and 1'a,
    chunks PART, PART + 2, ...; its own tables, allocated here)."""
    U = g.U
    K = g.K
    Y = g.Y
    T1RE = g.T1RE
    T1IM = g.T1IM
    batch = g.batch
    heads = g.heads
    stride_ub = g.stride_ub
    stride_uh = g.stride_uh
    stride_yb = g.stride_yb
    stride_yh = g.stride_yh
    stride_kh = g.stride_kh
    A: gl.constexpr = g.A
    B: gl.constexpr = g.B
    A2: gl.constexpr = A // 16
    KG: gl.constexpr = B // A2  # k1 values a chunk
    C: gl.constexpr = KG * A2  # a chunk's rows k_a
    L: gl.constexpr = A * B
    COLS: gl.constexpr = A2 // PARTS  # a warpgroup's columns a2 in 1a and 1'a: PART COLS ..
    if PARTS == 2:
        tabs = _order3_tables(g.F16RE, g.F16IM, g.F2RE, g.F2IM, g.FBRE, g.FBIM, B, C)
        fence_async_shared()
        gl.thread_barrier()
    # T's NVMMA tiles as they are (the chunks); 1a and 1'a see the same bytes as plain rows [16, A2, B]
    Tk_re = g.T_re
    Tk_im = g.T_im
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[2, 1, 0])
    T_re = Tk_re._reinterpret(gl.float16, [16, A2, B], plain)
    T_im = Tk_im._reinterpret(gl.float16, [16, A2, B], plain)
    acc1: gl.constexpr = wgmma_layout(B, 16, 4)
    lhs1: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc1, k_width=2)
    acc: gl.constexpr = wgmma_layout(B, C, 4)
    lhs: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc, k_width=2)
    acc8: gl.constexpr = wgmma_layout(B, 8, 4)
    lhs8: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc8, k_width=2)
    io: gl.constexpr = gl.BlockedLayout([4, 1], [16, 2], [1, 4], [0, 1])  # threads along m (u's, y's rows)
    # (the float16 bins, RFFT 3; the twiddles computed, TW_SFU; no staging tiles: None)
    st = Stages(tabs.fbre, tabs.fbim, tabs.fbim, None, None, T1RE, T1IM, L, 3, g.CONJ, True, 0, True, None, 0, 1)

    # the transposed tile's row r = A2 l + k2 at k_a = k1 + l + 16 k2 (k1, the chunk's first, added a chunk), column
    # m (or k_b) at m A: the offsets m A + k_a of the twiddles W_L^(m k_a) and, read as f = k_a + A k_b after stage 3,
    # the spectrum's bins
    r_k = gl.arange(0, C, layout=gl.SliceLayout(1, acc))
    r_k = 16 * (r_k % A2) + r_k // A2
    r_m = gl.arange(0, B, layout=gl.SliceLayout(0, acc)) * A
    zeros = gl.zeros([B, C], gl.float32, acc)
    HALF: gl.constexpr = A // 2
    s_m = gl.arange(0, B, layout=gl.SliceLayout(1, io))
    s_a = gl.arange(0, HALF, layout=gl.SliceLayout(0, io))
    seq = gl.expand_dims(s_a, 0) * B + gl.expand_dims(s_m, 1)  # the whole sequence [B, HALF] (its scale)
    kvec = gl.arange(0, 16, layout=gl.SliceLayout(0, acc1))
    cvec = gl.arange(0, 64, layout=gl.SliceLayout(0, acc))

    groups = gl.cdiv(batch, 2)
    total = heads * groups
    start, stop, step = _walk(gl.program_id(0), gl.num_programs(0), total, True)
    for w in range(start, stop, step):
        h = (w // groups).to(gl.int64)
        b_re = 2 * (w % groups)
        row_re = b_re.to(gl.int64) * stride_ub + h * stride_uh
        row_im = row_re + stride_ub
        if g.STACK:  # (u read once: its four groups held from here through stage 1a)
            raws = (_stack_u(U, b_re, batch, row_re, row_im, 0, A2, B),
                    _stack_u(U, b_re, batch, row_re, row_im, 1, A2, B),
                    _stack_u(U, b_re, batch, row_re, row_im, 2, A2, B),
                    _stack_u(U, b_re, batch, row_re, row_im, 3, A2, B))
            scale_re, bad_re, scale_im, bad_im = _stack_scales(raws)
        elif PARTS == 2:  # (by blocks of columns: the whole pair at once spilled beside the partitions' live-ins)
            scale_re, bad_re, scale_im, bad_im = _pair_scales(U, b_re, batch, row_re, row_im, B, HALF, 64, io)
        else:
            _, scale_re, bad_re, _, scale_im, bad_im = _scaled_both(_load_raw(U, b_re, batch, row_re, seq),
                                                                    _load_raw(U, b_re + 1, batch, row_im, seq))
        inv_re = 1.0 / scale_re
        inv_im = 1.0 / scale_im
        gl.thread_barrier()  # the previous pair's 1'a has read T (PARTS 2: this warpgroup's columns, its own 1'a's)
        if g.STACK:
            for c in gl.static_range(A2 // 4):
                _stage_1a_stacked(T_re, T_im, raws[c], inv_re, inv_im, tabs.f2re, tabs.f2im, tabs.f2nim, T1RE, T1IM, c,
                                  B, acc, lhs)
        else:
            for c in gl.static_range(COLS // 2):
                _stage_1a(T_re, T_im, U, b_re, batch, row_re, row_im, inv_re, inv_im, tabs.f16re, tabs.f16im, T1RE,
                          T1IM, PART * COLS + 2 * c, A2, B, acc1, lhs1)
        fence_async_shared()  # (1b's wgmmas read T)
        phase = ((w - start) // step) & 1
        _both_arrived(g.bars, 0, phase, PARTS)  # T written
        spectrum = K + h * stride_kh
        running = scale_re * 0.0  # the largest chunk scale
        scales = gl.zeros([16], gl.float32, gl.SliceLayout(0, acc1))
        scales64 = gl.zeros([64], gl.float32, gl.SliceLayout(0, acc))  # (STACK: at the columns (j, k1))
        for j in range(PART, 16 // KG, PARTS):  # (a loop, not unrolled)
            k1 = j * KG
            f = gl.expand_dims(r_k + k1, 1) + gl.expand_dims(r_m, 0)  # m A + k_a (twiddles), k_a + A k_b (bins)
            s = _tchunk(st, spectrum, f, Tk_re.index(j), Tk_im.index(j), tabs.f2re, tabs.f2im, tabs.f2nim, zeros, lhs,
                        j, g.KFULL, acc)
            if g.STACK:
                scales64 = gl.where(cvec % 16 // KG == j, s, scales64)
            else:
                scales = gl.where(kvec // KG == j, s, scales)
            running = gl.maximum(running, s)
        if PARTS == 2:  # (the other warpgroup's chunk scales: each row 0 at the other's k1)
            g.scl.slice(16 * PART, 16).store(scales)
            _both_arrived(g.bars, 1, phase, PARTS)  # T' and the scales written
            scales = gl.maximum(g.scl.slice(0, 16).load(scales.type.layout),
                                g.scl.slice(16, 16).load(scales.type.layout))
            running = gl.max(scales, axis=0)
        else:
            gl.thread_barrier()  # T' written
        ratio = scales / running
        out_scale = running * (1.0 / L)
        if g.KSCALE:  # (the channel's float16 bins were K / KS[h])
            out_scale = out_scale * gl.load(g.KS + h)
        out_re = gl.where(bad_re, float("nan"), out_scale * scale_re)
        out_im = gl.where(bad_im, float("nan"), out_scale * scale_im)
        yrow_re = b_re.to(gl.int64) * stride_yb + h * stride_yh
        if g.STACK:
            ratio64 = scales64 / running
            raw = _stack_t(T_re, T_im, 0)  # (each next group's T' read under this group's wgmmas)
            for c in gl.static_range(A2 // 4):
                raw = _stage_1a_inverse_stacked(T_re, T_im, Y, b_re, batch, yrow_re, yrow_re + stride_yb, raw, ratio64,
                                                T1RE, T1IM, tabs.f2re, tabs.f2im, tabs.f2nim, out_re, out_im, c, A2, B,
                                                acc, lhs, c + 1 < A2 // 4)
        else:
            for c in gl.static_range(COLS // 2):
                _stage_1a_inverse(T_re, T_im, Y, b_re, batch, yrow_re, yrow_re + stride_yb, ratio, T1RE, T1IM,
                                  tabs.f8re, tabs.f8im, out_re, out_im, PART * COLS + 2 * c, A2, B, acc1, lhs8, acc8)
