"""FP8 attention's portable kernel in Triton ``tl`` (any GPU, and the CPU through the interpreter): the
twin of the Hopper kernel's math (reference.py's module docstring), FlashAttention-2's loop.

Layout: q8 (B, Hq, N, D), k8 and v8 (B, Hkv, Nk, D), e4m3, any strides, or with ``PERMUTED_V`` v8 in
the Hopper kernel's layout (reference.keys_permuted: (B, Hkv, D, keys), keys permuted within 32s); O (B, Hq, N, D) and lse (B, Hq, N) contiguous. q head h reads kv
head h // (Hq // Hkv). Batch and head offsets are 64-bit.

Descales: q's and k's per (batch, head) (``*_PER_ROW`` off: one value, ``scales[bh]``) or per row
(``scales[bh * n_scales + row // rows_per_scale]``: per block of rows or per row), v's per (batch,
kv head). They fold into the scores' base-2 scale, one multiply an element (per row) or none.

``UPCAST``: the dots on the e4m3 codes' exact float16 upcasts, and P rounded to e4m3 values by
float32 arithmetic (``round_to_e4m3``) kept in float16: what Triton's interpreter runs, whose
float32 -> e4m3 cast is wrong. The products of two e4m3 numbers are exact in float32 either way.

``RESCALE_TAU`` > 0 and ``P_SHIFT``: conditional rescaling and P's scale 2^P_SHIFT (reference.py): the Hopper
kernel's math, here without the skipped multiply (alpha is exactly 1 where a row's m stays). ``L_ROUNDED``: l sums
P as rounded to e4m3 (the Hopper kernel's ``L_MMA``, which sums it on the tensor cores).
"""
from __future__ import annotations

import triton
import triton.language as tl

from tilecore.tiles.ops import (LOG2E_IN_KERNEL, block_ptrs, bounds_mask, mask_scores, needs_mask,
                                online_softmax_update, row_max, row_sum)


@triton.jit
def round_to_e4m3(x):
    """x >= 0 (float32, at most 448) rounded to the nearest e4m3 value, ties to even, in float32
    arithmetic: the interpreter's float32 -> float8e4nv cast is wrong (it gave 0.25 for 0.4907 and 0
    for 0.001: tests/attention_fp8). e4m3 keeps 3 mantissa bits down to 2^-6 and steps of 2^-9 below."""
    exponent = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    ulp = (((tl.maximum(exponent, -6) - 3) + 127) << 23).to(tl.float32, bitcast=True)
    magic = 12582912.0  # 1.5 * 2^23: y + magic - magic rounds y (|y| <= 16 here) to an integer, ties to even
    return ((x / ulp + magic) - magic) * ulp


@triton.jit
def key_position(j):
    """reference.key_position: where key j sits in the Hopper kernel's V layout (permuted within 32s)."""
    c = j % 32
    return j - c + 16 * (c // 16) + 4 * ((c % 8) // 2) + 2 * ((c // 8) % 2) + c % 2


@triton.jit
def row_descales(scales, bh, n_scales, rows_per_scale, rows, n_rows, PER_ROW: tl.constexpr):
    """The descale of each of ``rows`` (a [m] vector of row indices, those from n_rows on get 0) of head
    ``bh``, or, without PER_ROW, the head's one descale (a scalar)."""
    if PER_ROW:
        return tl.load(scales + bh.to(tl.int64) * n_scales + rows // rows_per_scale, mask=rows < n_rows, other=0.0)
    else:
        return tl.load(scales + bh)


@triton.jit
def attn_fp8_fwd(Q, K, V, O, LSE, QS, KS, VS,
                 sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, son, sod,
                 H, N, Nk, D, GROUP, scale_log2e, q_n_scales, q_rows_per_scale, k_n_scales, k_rows_per_scale,
                 CAUSAL: tl.constexpr, Q_PER_ROW: tl.constexpr, K_PER_ROW: tl.constexpr, UPCAST: tl.constexpr,
                 PERMUTED_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 P_SHIFT: tl.constexpr = 8, RESCALE_TAU: tl.constexpr = 0.0, L_ROUNDED: tl.constexpr = False,
                 v_n_scales=1, V_PER_BLOCK: tl.constexpr = False):
    """One program per (batch * q head, block of BLOCK_M queries): its rows' O and lse over every key.
    ``V_PER_BLOCK``: v's descales per block of 128 keys (VS[bhk * v_n_scales + key // 128]; BLOCK_N divides 128),
    each step's P V times its block's descale."""
    if V_PER_BLOCK:
        tl.static_assert(128 % BLOCK_N == 0, "V_PER_BLOCK: a step's keys in one block of 128")
    blocks = tl.cdiv(N, BLOCK_M)
    bh = tl.program_id(0) // blocks
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    hk = h // GROUP
    bhk = b * (H // GROUP) + hk
    start_m = (tl.program_id(0) % blocks) * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D

    q = tl.load(block_ptrs(Q + b * sqb + h * sqh, start_m, tl.arange(0, BLOCK_M), offs_d, sqn, sqd),
                mask=bounds_mask(offs_m, offs_d, N, D), other=0.0)  # [BM, BD] e4m3
    if UPCAST:
        q = q.to(tl.float16)
    # the rows' base-2 score scale: softmax scale * log2 e * q's descale (per row or the head's)
    q_scale = row_descales(QS, bh, q_n_scales, q_rows_per_scale, offs_m, N, Q_PER_ROW) * scale_log2e
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh

    P_SCALE: tl.constexpr = 2.0 ** P_SHIFT  # P is rounded to e4m3 as 2^P_SHIFT p (reference.P_SCALE: 256)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    hi = Nk
    if CAUSAL:  # query i sees keys j <= i + Nk - N
        hi = tl.maximum(tl.minimum(Nk, start_m + BLOCK_M + (Nk - N)), 0)
    for start_n in range(0, hi, BLOCK_N):
        kv_ok = (start_n + offs_n0[:, None] < Nk) & d_ok[None, :]
        k = tl.load(block_ptrs(k_base, start_n, offs_n0, offs_d, skn, skd), mask=kv_ok, other=0.0)  # [BN, BD]
        if PERMUTED_V:  # the Hopper kernel's layout: key j at position key_position(j) (reference.py)
            v = tl.load(block_ptrs(v_base, 0, key_position(start_n + offs_n0), offs_d, svn, svd), mask=kv_ok, other=0.0)
        else:
            v = tl.load(block_ptrs(v_base, start_n, offs_n0, offs_d, svn, svd), mask=kv_ok, other=0.0)  # [BN, BD]
        if UPCAST:
            k = k.to(tl.float16)
            v = v.to(tl.float16)
        s = tl.dot(q, tl.trans(k))  # [BM, BN] float32: e4m3 products are exact
        if K_PER_ROW:
            k_scale = row_descales(KS, bhk, k_n_scales, k_rows_per_scale, start_n + offs_n0, Nk, True)
            s = s * k_scale[None, :]
            if Q_PER_ROW:
                s = s * q_scale[:, None]
            else:
                s = s * q_scale
        else:
            k_scale = row_descales(KS, bhk, k_n_scales, k_rows_per_scale, start_n + offs_n0, Nk, False)
            if Q_PER_ROW:
                s = s * (q_scale * k_scale)[:, None]
            else:
                s = s * (q_scale * k_scale)
        if needs_mask(start_m, start_n, BLOCK_N, N, Nk, CAUSAL):
            s = mask_scores(s, start_m, start_n, N, Nk, CAUSAL, 1)
        if RESCALE_TAU > 0 or L_ROUNDED:
            m_new = tl.maximum(m_i, row_max(s))
            if RESCALE_TAU > 0:  # m moves only where the row max grows by more than RESCALE_TAU (reference.py)
                m_new = tl.where(m_new > m_i + RESCALE_TAU, m_new, m_i)
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_ref)
            p = tl.exp2(s - m_ref[:, None])
            l_i = l_i * alpha
            if not L_ROUNDED:
                l_i = l_i + row_sum(p)
            acc = acc * alpha[:, None]
            m_i = m_new
        else:
            m_i, l_i, acc, p = online_softmax_update(m_i, l_i, acc, s, 1.0)
        if UPCAST:  # e4m3 values are exact in float16
            p8 = round_to_e4m3(p * P_SCALE).to(tl.float16)
        else:
            p8 = (p * P_SCALE).to(tl.float8e4nv)  # P rounded to e4m3 as 2^P_SHIFT p
        if L_ROUNDED:  # l of the P that multiplies V
            l_i = l_i + row_sum(p8.to(tl.float32)) / P_SCALE
        if V_PER_BLOCK:  # this block's v descale (one scalar a step)
            acc = acc + tl.dot(p8, v) * tl.load(VS + bhk * v_n_scales + start_n // 128)
        else:
            acc = tl.dot(p8, v, acc)
    if V_PER_BLOCK:
        v_scale = 1.0
    else:
        v_scale = tl.load(VS + bhk)
    no_key = l_i == 0.0  # not "not l > 0": a NaN l (a NaN score) stays NaN
    l_safe = tl.where(no_key, 1.0, l_i)
    out = acc * (v_scale / (P_SCALE * l_safe))[:, None]
    lse = tl.where(no_key, float("-inf"), (m_i + tl.log2(l_safe)) / LOG2E_IN_KERNEL)
    tl.store(block_ptrs(O + b * sob + h * soh, start_m, tl.arange(0, BLOCK_M), offs_d, son, sod),
             out.to(O.dtype.element_ty), mask=bounds_mask(offs_m, offs_d, N, D))
    tl.store(LSE + bh.to(tl.int64) * N + offs_m, lse, mask=offs_m < N)


def grid(heads: int, rows: int, block_m: int) -> tuple[int]:
    return (heads * triton.cdiv(rows, block_m),)


@triton.jit
def quantize_v_permuted(V, OUT, DESCALE, svb, svh, svn, svd, H, Nk, D, n_out,
                        EMULATE_CAST: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                        PERMUTE_IN_REGISTERS: tl.constexpr = False, PER_BLOCK: tl.constexpr = False, n_scales=1,
                        CLAMP: tl.constexpr = False):
    """v (B, H, Nk, D), any strides, quantized to e4m3 with its head's descale (v / DESCALE[bh], saturated
    at 448) into the Hopper kernel's layout (reference.keys_permuted): OUT (B, H, D, n_out) contiguous,
    key j of a head at column key_position(j); the padding keys (Nk .. n_out) are written as 0. One
    program per (batch * head, block of BLOCK_K keys, a multiple of 32). ``EMULATE_CAST``: the
    interpreter (its e4m3 cast is wrong): rounded by round_to_e4m3 first.
    ``PER_BLOCK`` (BLOCK_K = 128): the descale is the block's own, amax / 448 of its keys (1 where 0),
    computed here and stored at DESCALE[bh * n_scales + block]: one read of v, no pass before it for a head's amax."""
    bh = tl.program_id(0)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    keys = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (keys[:, None] < Nk) & (offs_d[None, :] < D)
    v = tl.load(block_ptrs(V + b * svb + h * svh, 0, keys, offs_d, svn, svd), mask=ok, other=0.0).to(tl.float32)
    if PER_BLOCK:
        amax = tl.max(tl.max(tl.abs(v), axis=1), axis=0)
        descale = tl.where(amax > 0, amax / 448.0, 1.0)
        tl.store(DESCALE + bh.to(tl.int64) * n_scales + tl.program_id(1), descale,
                 mask=tl.program_id(1) * BLOCK_K < Nk)
        y = v / descale
        if EMULATE_CAST or CLAMP:  # a NaN stays NaN (its code NaN): the clamps propagate it; compiled, the e4m3
            # conversion saturates as they do (cvt.rn.satfinite, NaN kept)
            y = tl.minimum(tl.maximum(y, -448.0, tl.PropagateNan.ALL), 448.0, tl.PropagateNan.ALL)
    else:  # (a NaN in v: torch's amax, the head's descale, is NaN)
        y = tl.minimum(tl.maximum(v / tl.load(DESCALE + bh), -448.0), 448.0)  # [BLOCK_K, BLOCK_D]
    if EMULATE_CAST:
        y = tl.where(y != y, y, tl.where(y < 0, -round_to_e4m3(-y), round_to_e4m3(y)))
    out = OUT + bh.to(tl.int64) * D * n_out
    if PERMUTE_IN_REGISTERS:
        # the tile transposed to [BLOCK_D, BLOCK_K] and its keys put in key_position's order in registers
        # ((chunk, a, b, r, e) -> (chunk, a, r, b, e)), so that the store's addresses run contiguous along keys
        # (coalesced), not scattered by a computed permutation
        yt = tl.reshape(tl.trans(y.to(tl.float8e4nv)), [BLOCK_D, BLOCK_K // 32, 2, 2, 4, 2])
        yt = tl.reshape(tl.permute(yt, (0, 1, 2, 4, 3, 5)), [BLOCK_D, BLOCK_K])
        tl.store(out + offs_d[:, None].to(tl.int64) * n_out + keys[None, :], yt,
                 mask=(keys[None, :] < n_out) & (offs_d[:, None] < D))
    else:
        tl.store(out + offs_d[None, :].to(tl.int64) * n_out + key_position(keys)[:, None], y.to(tl.float8e4nv),
                 mask=(keys[:, None] < n_out) & (offs_d[None, :] < D))


@triton.jit
def signed_hadamard(SIGNS, BLOCK_D: tl.constexpr):
    """[BLOCK_D, BLOCK_D] float32 matrix diag(s) H, H Sylvester's Hadamard matrix (H[i, j] = (-1)^popcount(i & j),
    the natural order of tilecore.hadamard_transform), s the signs at SIGNS: a row x times it is H (s * x).
    Made in registers (a parity of 8 bits: BLOCK_D <= 256), nothing loaded but the signs."""
    i = tl.arange(0, BLOCK_D)[:, None]
    j = tl.arange(0, BLOCK_D)[None, :]
    bits = i & j
    bits = bits ^ (bits >> 4)
    bits = bits ^ (bits >> 2)
    bits = bits ^ (bits >> 1)
    signs = tl.load(SIGNS + tl.arange(0, BLOCK_D))
    return (1 - 2 * (bits & 1)).to(tl.float32) * signs[:, None]


SCALE_ROW = tl.constexpr(0)  # rotate_quantize's SCALE: a descale per row, computed (q per token)
SCALE_BLOCK_ROWS = tl.constexpr(1)  # per block of BLOCK_R rows, computed (k per block of 128 keys)
SCALE_GIVEN = tl.constexpr(2)  # one given descale for the tensor (DESCALE[0], on the device: no host sync)


@triton.jit
def rotate_quantize(X, OUT, DESCALE, SIGNS, sxb, sxh, sxn, sxd, H, N, n_scales, out_scale,
                    ROTATE: tl.constexpr, SCALE: tl.constexpr, UPCAST: tl.constexpr, BLOCK_R: tl.constexpr,
                    BLOCK_D: tl.constexpr, ROW_BLOCKS: tl.constexpr, CLAMP: tl.constexpr = False):
    """x (B, H, N, D = BLOCK_D, a power of two), any strides, bf16/fp16 (float32 in the interpreter) ->
    OUT (B, H, N, D) e4m3 contiguous: y = H (s * x) * out_scale (with ROTATE; else y = x), then codes =
    y / descale saturated at 448, with descale = amax / 448 (1 where amax = 0) per row (SCALE_ROW:
    DESCALE (B, H, N)), per block of BLOCK_R rows (SCALE_BLOCK_ROWS: DESCALE (B, H, n_scales)), or
    DESCALE[0] as given (SCALE_GIVEN). One read of x, one write of the codes: the rotation is a
    [BLOCK_R, D] x [D, D] tensor-core product on the exact 16-bit inputs (the +-1 matrix is exact in
    them) in float32, rounded once, to e4m3. One program per (batch * head, ROW_BLOCKS blocks of
    BLOCK_R rows): the matrix is made once a program. ``UPCAST``: the interpreter (float32 dot, and
    its e4m3 cast is wrong: rounded by round_to_e4m3 first)."""
    bh = tl.program_id(0)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    if ROTATE:
        rotation = signed_hadamard(SIGNS, BLOCK_D)
        if not UPCAST:
            rotation = rotation.to(X.dtype.element_ty)  # +-1: exact in bf16/fp16
    x_base = X + b * sxb + h * sxh
    out_base = OUT + bh.to(tl.int64) * N * BLOCK_D
    for i in range(ROW_BLOCKS):
        block = tl.program_id(1) * ROW_BLOCKS + i
        rows = block * BLOCK_R + tl.arange(0, BLOCK_R)
        ok = rows[:, None] < N
        x = tl.load(block_ptrs(x_base, 0, rows, offs_d, sxn, sxd), mask=ok, other=0.0)  # [BLOCK_R, D]
        if ROTATE:
            if UPCAST:
                y = tl.dot(x.to(tl.float32), rotation, input_precision="ieee") * out_scale
            else:
                y = tl.dot(x, rotation) * out_scale  # exact products, float32 sums
        else:
            y = x.to(tl.float32)
        if SCALE == SCALE_ROW:
            amax = tl.max(tl.abs(y), axis=1)
            descale = tl.where(amax > 0, amax / 448.0, 1.0)
            tl.store(DESCALE + bh.to(tl.int64) * N + rows, descale, mask=rows < N)
            codes = y / descale[:, None]
        elif SCALE == SCALE_BLOCK_ROWS:
            amax = tl.max(tl.max(tl.abs(y), axis=1), axis=0)
            descale = tl.where(amax > 0, amax / 448.0, 1.0)
            tl.store(DESCALE + bh.to(tl.int64) * n_scales + block, descale, mask=block * BLOCK_R < N)
            codes = y / descale
        else:
            codes = y / tl.load(DESCALE)
        if UPCAST or CLAMP:  # (compiled, the e4m3 conversion saturates: cvt.rn.satfinite, NaN kept)
            codes = tl.minimum(tl.maximum(codes, -448.0, tl.PropagateNan.ALL), 448.0, tl.PropagateNan.ALL)
        if UPCAST:  # (a NaN kept as it is: round_to_e4m3 reads exponent bits)
            codes = tl.where(codes != codes, codes, tl.where(codes < 0, -round_to_e4m3(-codes), round_to_e4m3(codes)))
        tl.store(out_base + rows[:, None].to(tl.int64) * BLOCK_D + offs_d[None, :], codes.to(tl.float8e4nv), mask=ok)


@triton.jit
def head_amax(X, AMAX, sxb, sxh, sxn, sxd, H, N, D, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """AMAX[bh] = max |x| over head bh's rows (AMAX zeroed first: atomic maxima of non-negative floats). One
    program per (batch * head, block of BLOCK_R rows). A NaN is not propagated (the caller's codes carry it)."""
    bh = tl.program_id(0)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    x = tl.load(block_ptrs(X + b * sxb + h * sxh, 0, rows, offs_d, sxn, sxd), mask=bounds_mask(rows, offs_d, N, D),
                other=0.0)
    tl.atomic_max(AMAX + bh, tl.max(tl.max(tl.abs(x.to(tl.float32)), axis=1), axis=0))
