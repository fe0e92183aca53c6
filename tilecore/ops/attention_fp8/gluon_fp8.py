"""FP8 (e4m3) attention forward on Hopper: a layout and callbacks on the tiles template
(:mod:`tilecore.tiles.gluon.pipeline`), the structure of the bf16 forward (ops/attention/gluon_kernels.py)
with what FP8 changes.

A tile is CONSUMERS x BLOCK_M query rows of one (batch, head); each consumer warpgroup takes BLOCK_M
of them, and its steps walk the key blocks. Per step the producer warp TMA-loads a K block
[BN, D] and a V^T block [D, BN] into one stage: e4m3 wgmma takes both shared operands K-major (the
reduction dimension contiguous), which for P V is the keys, so V comes as V^T (B, Hkv, D, Nk),
keys contiguous (op.py says who writes it). Rows or keys past N or Nk arrive as zeros. Step j issues

    S_j = Q K_j^T  and  O += P8_{j-1} V_{j-1}     (two e4m3 wgmma, together)
    m, l, P_j = online softmax(S_j * descales)    (registers, base 2, while P V runs)
    O *= alpha                                    (once both are done)

FP8's differences from the bf16 forward:
* descales: q's and k's per (batch, head) fold into the base-2 score scale (no extra work); per row
  (per block of rows, or per token), q's are a per-row factor loaded once a tile and k's a per-key
  factor loaded each step (one multiply an element);
* P is rounded to e4m3 as 2^8 p (``fp8_softmax_update`` shifts the exponent by 8: p in [0, 256],
  FlashAttention-3's max offset; reference.py), converted in registers from the accumulator layout to
  wgmma's register-operand layout (``p_operand``); l sums the float32 p, and the epilogue divides by
  it and multiplies by v's descale.
"""
from triton.experimental import gluon

from tilecore.tiles.gluon.compat import fence_async_shared, gl, tma, warpgroup_mma, warpgroup_mma_wait
from tilecore.tiles.gluon import (LOG2E, Layout, TileOperand, as_column, mask_scores, needs_mask, online_softmax_start,
                                  row_max, row_sum, run, ring, split_n, stage_struct, store_block, store_rows, struct,
                                  wgmma_layout, wgmma_lhs_layout)
from tilecore.tiles.schedule import head_grouped_tile



@stage_struct
class KVt:
    """One stage: a block of keys [1, 1, BN, D] and the block of values as V^T [1, 1, D, BN]."""
    k: object
    vt: object


@stage_struct
class KVt2:
    """One stage of a split key step (BN2 > 0, session 30): BN + BN2 keys as two K blocks [1, 1, BN, D] and
    [1, 1, BN2, D] and two V^T blocks [1, 1, D, BN] and [1, 1, D, BN2] (Gluon's TMA boxes are powers of two: 192 keys
    are 128 + 64)."""
    k: object
    k2: object
    vt: object
    vt2: object


@struct
class Rows:
    """Query rows of one head: the first, the flat batch * head index, the key blocks they see."""
    first: object
    bh: object
    n_blocks: object


@gluon.jit
def head_of(bh, H, GROUP):
    """(batch, q head, kv head) of the flat index bh = batch * H + q head."""
    return bh // H, bh % H, (bh % H) // GROUP


@gluon.jit
def query_tile(op, tile_id, TILE_M: gl.constexpr):
    """A tile of TILE_M query rows (as the bf16 forward's: heads in L2 groups of head_group; causal,
    the heaviest query blocks first, counted from the last row)."""
    bh, mb = head_grouped_tile(tile_id, gl.cdiv(op.N, TILE_M), op.num_bh, op.head_group)
    if op.CAUSAL:  # query i sees keys j <= i + Nk - N
        start_m = gl.maximum(op.N - (mb + 1) * TILE_M, 0)
        hi = gl.maximum(gl.minimum(op.Nk, start_m + TILE_M + (op.Nk - op.N)), 0)
    else:
        start_m = mb * TILE_M
        hi = op.Nk
    return Rows(start_m, bh, gl.cdiv(hi, op.BNS))


# 2^x for x <= 8 (or NaN) by FMA-unit arithmetic, for one element of every pack: x clamped at -126 (max.NaN keeps a
# NaN), j = round(x) by the 1.5 * 2^23 shift, 2^f for f = x - j in [-1/2, 1/2] by a polynomial, j added to the exponent
# bits; the max with x (2^x > x everywhere) makes a NaN x NaN. A masked x (-inf) gives 2^-126, not 0: it rounds to 0 in
# e4m3 and adds 1e-38 to l, which is >= 256 in a row with a key (its max's term) and at most BN 2^-126 in one without
# (finish tells them apart by l < 1). EXP2_POLY[degree]: the polynomial's coefficients (float32 bits, highest first),
# fitted for the least maximum relative error on [-1/2, 1/2]: the cubic's 7.5e-5 (a 50th of P's e4m3 half-step
# 2^-5), the quadratic's 1.7e-3 (session 30: an 18th of the half-step, one FFMA fewer)
EXP2_POLY = {3: ("3D61FB53", "3E786EE6", "3F31798D", "3F7FFB4A"), 2: ("3E7425DE", "3F3414D4", "3F800E84")}


def exp2_fma_ptx(degree: int = 3) -> str:
    """The PTX of one FMA-unit 2^X into Y (X, Y: placeholders), with EXP2_POLY[degree]."""
    c = EXP2_POLY[degree]
    horner = f"fma.rn.f32 p, f, 0f{c[0]}, 0f{c[1]};\n\t" + "".join(
        f"fma.rn.f32 p, p, f, 0f{x};\n\t" for x in c[2:])
    return ("max.NaN.f32 f, X, 0fC2FC0000;\n\t"
            "add.rn.f32 t, f, 0f4B400000;\n\t"
            "sub.rn.f32 j, t, 0f4B400000;\n\t"
            "sub.rn.f32 f, f, j;\n\t" + horner +
            "mov.b32 ti, t;\n\t"
            "shl.b32 ti, ti, 23;\n\t"
            "mov.b32 pi, p;\n\t"
            "add.s32 pi, pi, ti;\n\t"
            "mov.b32 p, pi;\n\t"
            "max.NaN.f32 Y, p, X;")


_EXP2_FMA_PTX = exp2_fma_ptx(3)


def exp2_split_asm(every: int, degree: int = 3) -> tuple[str, str]:
    """(PTX, constraints) of exp2_split's inline asm for packs of ``every`` elements: the first every - 1 by
    ex2.approx, the last by exp2_fma_ptx(degree). Outputs $0..$(every - 1), inputs $every..$(2 every - 1)."""
    mufu = "".join(f"ex2.approx.ftz.f32 ${i}, ${i + every};\n\t" for i in range(every - 1))
    fma = exp2_fma_ptx(degree).replace("X", f"${2 * every - 1}").replace("Y", f"${every - 1}")
    asm = "{\n\t.reg .f32 f, t, j, p;\n\t.reg .b32 ti, pi;\n\t" + mufu + fma + "\n\t}"
    return asm, ",".join(["=f"] * every + ["f"] * every)


EXP2_ASM_2: gl.constexpr = gl.constexpr(exp2_split_asm(2)[0])
EXP2_CONSTRAINTS_2: gl.constexpr = gl.constexpr(exp2_split_asm(2)[1])
EXP2_ASM_4: gl.constexpr = gl.constexpr(exp2_split_asm(4)[0])
EXP2_CONSTRAINTS_4: gl.constexpr = gl.constexpr(exp2_split_asm(4)[1])
EXP2_ASM_8: gl.constexpr = gl.constexpr(exp2_split_asm(8)[0])
EXP2_CONSTRAINTS_8: gl.constexpr = gl.constexpr(exp2_split_asm(8)[1])
# the quadratic's (exp2_fma_every negative: -2, -4, -8 are 2, 4, 8 with the quadratic; session 30)
EXP2_ASM_Q2: gl.constexpr = gl.constexpr(exp2_split_asm(2, 2)[0])
EXP2_ASM_Q4: gl.constexpr = gl.constexpr(exp2_split_asm(4, 2)[0])
EXP2_ASM_Q8: gl.constexpr = gl.constexpr(exp2_split_asm(8, 2)[0])


@gluon.jit
def exp2_split(x, FMA_EVERY: gl.constexpr):
    """2^x (x <= 9, float32), one element in FMA_EVERY (2, 4 or 8) computed on the FMA units (exp2_fma_ptx: the
    cubic), the others by MUFU's ex2: FlashAttention-4's way to take load off the MUFU (16 results a clock an SM, about
    the tensor cores' pace at FP8 D 128). -2, -4, -8: the same with the quadratic (one FFMA fewer, 1.7e-3 relative
    error: under e4m3's half-step). 0: every element by gl.exp2. -1: a timing probe, WRONG results: no exp2 at all
    (2^x replaced by x: what the step costs without the MUFU's 64 ex2 a thread)."""
    gl.static_assert(FMA_EVERY == 0 or FMA_EVERY == 2 or FMA_EVERY == 4 or FMA_EVERY == 8 or FMA_EVERY == -1
                     or FMA_EVERY == -2 or FMA_EVERY == -4 or FMA_EVERY == -8,
                     "FMA_EVERY: 0, 2, 4 or 8 (negative: the quadratic; -1: the no-exp2 probe)")
    if FMA_EVERY == -1:
        y = x
    elif FMA_EVERY == 8:
        y = gl.inline_asm_elementwise(EXP2_ASM_8, EXP2_CONSTRAINTS_8, [x], dtype=gl.float32, is_pure=True, pack=8)
    elif FMA_EVERY == 2:
        y = gl.inline_asm_elementwise(EXP2_ASM_2, EXP2_CONSTRAINTS_2, [x], dtype=gl.float32, is_pure=True, pack=2)
    elif FMA_EVERY == 4:
        y = gl.inline_asm_elementwise(EXP2_ASM_4, EXP2_CONSTRAINTS_4, [x], dtype=gl.float32, is_pure=True, pack=4)
    elif FMA_EVERY == -8:
        y = gl.inline_asm_elementwise(EXP2_ASM_Q8, EXP2_CONSTRAINTS_8, [x], dtype=gl.float32, is_pure=True, pack=8)
    elif FMA_EVERY == -2:
        y = gl.inline_asm_elementwise(EXP2_ASM_Q2, EXP2_CONSTRAINTS_2, [x], dtype=gl.float32, is_pure=True, pack=2)
    elif FMA_EVERY == -4:
        y = gl.inline_asm_elementwise(EXP2_ASM_Q4, EXP2_CONSTRAINTS_4, [x], dtype=gl.float32, is_pure=True, pack=4)
    else:
        y = gl.exp2(x)
    return y


# float32 -> e4m3 for 4 elements at once, packed in one register in their order (cvt's first operand goes to
# the high byte): what the wgmma register operand holds (4 consecutive k of one row)
E4M3X4_PTX: gl.constexpr = gl.constexpr("{\n\t.reg .b16 lo, hi;\n\t"
                                        "cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n\t"
                                        "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n\t"
                                        "mov.b32 $0, {lo, hi};\n\t}")


# a timing probe (PROBE_NO_SOFTMAX 3, session 31; WRONG results): 4 floats' high bytes as "e4m3" by PRMT (the ALU)
# instead of two cvt...e4m3x2 (F2FP): what P's conversion costs a step
PROBE_BYTES_PTX: gl.constexpr = gl.constexpr("{\n\t.reg .b32 t, u;\n\t"
                                             "prmt.b32 t, $1, $2, 0x0073;\n\t"
                                             "prmt.b32 u, $3, $4, 0x0073;\n\t"
                                             "prmt.b32 $0, t, u, 0x5410;\n\t}")


@gluon.jit
def to_e4m3x4(x):
    """x (float32) rounded to e4m3 (saturating), 4 elements an inline asm: pairs of cvt packed into one register."""
    return gl.inline_asm_elementwise(E4M3X4_PTX, "=r,f,f,f,f", [x], dtype=gl.float8e4nv, is_pure=True, pack=4)


@gluon.jit
def pack_e4m3x4(p):
    """P (float32 [m, n] in the register-operand layout: 4 consecutive k of a row a register) rounded to e4m3 and packed,
    4 k a register, into an int32 [m, n / 4] tile (CAST_LATE 2): splitting k's two low bits moves no data (they are
    register bits), and an int32 crosses the loop's phi as one register, where e4m3 bytes were kept as single bytes
    by LLVM and unpacked and packed again each step (session 26)."""
    M: gl.constexpr = p.shape[0]
    N: gl.constexpr = p.shape[1]
    a, b = gl.split(gl.reshape(p, [M, N // 4, 2, 2]))  # k = 4 j + 2 u + w: a w = 0, b w = 1
    a0, a1 = gl.split(a)  # k = 4 j, 4 j + 2
    b0, b1 = gl.split(b)  # k = 4 j + 1, 4 j + 3
    return gl.inline_asm_elementwise(E4M3X4_PTX, "=r,f,f,f,f", [a0, b0, a1, b1], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def unpack_e4m3x4(q, layout: gl.constexpr):
    """pack_e4m3x4's inverse: the int32 [m, n / 4] tile as e4m3 [m, n] in ``layout`` (the register operand's): each
    int32 joined to 4 copies (register bits, no data moved), an asm returning it as 4 e4m3 (one register)."""
    M: gl.constexpr = q.shape[0]
    N: gl.constexpr = q.shape[1] * 4
    z = gl.join(q, q)
    z = gl.reshape(gl.join(z, z), [M, N // 4, 4])
    x = gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r,r,r", [z], dtype=gl.float8e4nv, is_pure=True, pack=4)
    return gl.convert_layout(gl.reshape(x, [M, N]), layout, assert_trivial=True)


@gluon.jit
def to_e4m3x4_pinned(x):
    """to_e4m3x4 as an asm with side effects: LLVM keeps it where it is written (before the S wgmma issue), instead of
    sinking it to its use (the P V wgmma), which would keep P's float32 registers live beside S's accumulator."""
    return gl.inline_asm_elementwise(E4M3X4_PTX, "=r,f,f,f,f", [x], dtype=gl.float8e4nv, is_pure=False, pack=4)


@gluon.jit
def row_max_tree(s):
    """The max of each row of a [m, 128] tile in the wgmma accumulator layout, as a tree: four halvings on the column
    bits that are register bits (64, 32, 16, 8: split_n moves no data), each an elementwise max of independent pairs,
    then gl.max of the last 8 columns (2 a thread and row, then the quad's shuffles). gl.max alone is a chain of 31
    dependent FMNMX a row (sm_90a SASS), the two rows of a thread one after the other: with two consumer warps a
    sub-partition, little hides its latency before the exp2 can start."""
    gl.static_assert(s.shape[1] == 128, "row_max_tree: 128 columns")
    a, b = split_n(s)
    x = gl.maximum(a, b)  # [m, 64]
    a, b = split_n(x)
    x = gl.maximum(a, b)  # [m, 32]
    a, b = split_n(x)
    x = gl.maximum(a, b)  # [m, 16]
    a, b = split_n(x)
    x = gl.maximum(a, b)  # [m, 8]
    return gl.convert_layout(row_max(x), gl.SliceLayout(1, s.type.layout))


@gluon.jit
def row_max_tree2(s, s2):
    """The max of each row of [s | s2], s [m, 128] and s2 [m, 64 or 32] in their wgmma accumulator layouts: each halved to
    8 columns (register bits: no data moves), the two [m, 8] maxed (the same registers in both layouts), then gl.max
    of the 8 (2 a thread and row, then the quad's shuffles): one quad reduction for the 192 columns."""
    gl.static_assert(s.shape[1] == 128 and (s2.shape[1] == 64 or s2.shape[1] == 32), "row_max_tree2: 128 + 64 or 32")
    a, b = split_n(s)
    x = gl.maximum(a, b)  # [m, 64]
    a, b = split_n(x)
    x = gl.maximum(a, b)  # [m, 32]
    a, b = split_n(x)
    x = gl.maximum(a, b)  # [m, 16]
    a, b = split_n(x)
    x = gl.maximum(a, b)  # [m, 8]
    y = s2
    if s2.shape[1] == 64:
        a, b = split_n(y)
        y = gl.maximum(a, b)  # [m, 32]
    a, b = split_n(y)
    y = gl.maximum(a, b)  # [m, 16]
    a, b = split_n(y)
    y = gl.maximum(a, b)  # [m, 8]
    x = gl.maximum(x, gl.convert_layout(y, x.type.layout, assert_trivial=True))
    return gl.convert_layout(row_max(x), gl.SliceLayout(1, s.type.layout))


@gluon.jit
def fp8_softmax_update_split(m_i, s, s2, row_scale, PER_ROW: gl.constexpr, EXP2_FMA_EVERY: gl.constexpr = 0,
                             P_SHIFT: gl.constexpr = 8.0):
    """fp8_softmax_update over a split key step, scores [s | s2] (s [m, 128], s2 [m, 64]), the row max as a tree and
    l left to the tensor cores (L_MMA): returns (m, P of s, P of s2 (float32, 2^P_SHIFT p), alpha)."""
    s_max = row_max_tree2(s, s2)
    m_new = gl.maximum(m_i, s_max * row_scale)
    m_ref = gl.where(m_new == float("-inf"), 0.0, gl.where(m_new == float("inf"), float("nan"), m_new))
    ROWS2: gl.constexpr = gl.SliceLayout(1, s2.type.layout)
    if PER_ROW:
        c = gl.expand_dims(row_scale, 1)
        c2 = gl.expand_dims(gl.convert_layout(row_scale, ROWS2, assert_trivial=True), 1)
    else:
        c = row_scale
        c2 = row_scale
    shift = m_ref - P_SHIFT
    p = exp2_split(s * c - gl.expand_dims(shift, 1), EXP2_FMA_EVERY)
    p2 = exp2_split(s2 * c2 - gl.expand_dims(gl.convert_layout(shift, ROWS2, assert_trivial=True), 1), EXP2_FMA_EVERY)
    alpha = gl.exp2(m_i - m_ref)
    return m_new, p, p2, alpha


@gluon.jit
def fp8_softmax_update(m_i, l_i, s, row_scale, PER_ROW: gl.constexpr, EXP2_FMA_EVERY: gl.constexpr = 0,
                       P_SHIFT: gl.constexpr = 8.0, RESCALE_TAU: gl.constexpr = 0.0, ROW_SUM: gl.constexpr = True,
                       MAX_TREE: gl.constexpr = False):
    """One online-softmax step on raw scores ``s`` [m, n] with a positive base-2 scale (a scalar, or
    with PER_ROW a [m] vector in s's row slice layout): the new row max m of the scaled scores, the
    row sum l of P, P = 2^(s * scale - m + P_SHIFT) in [0, 2^P_SHIFT] (float32; rounded to e4m3 by the
    caller), alpha = 2^(m_old - m), and whether any row's m moved (an int32 scalar, 1 without RESCALE_TAU).
    As tiles.gluon.online_softmax_update: m starts at -inf, the shift is 0 while it is -inf (a masked row
    keeps l = 0, P = 0), NaN where m is +inf. RESCALE_TAU > 0 (reference.py, FlashAttention-4): m moves
    only where the row max exceeds it by more than RESCALE_TAU (then P <= 2^(P_SHIFT + RESCALE_TAU));
    elsewhere alpha is exactly 1, and where no row moved the caller skips O *= alpha. Without ROW_SUM l is
    returned as given (the caller sums P on the tensor cores: AttentionFp8.L_MMA). MAX_TREE: the row max by
    row_max_tree (the same value)."""
    if MAX_TREE:
        s_max = row_max_tree(s)
    else:
        s_max = row_max(s)
    m_new = gl.maximum(m_i, s_max * row_scale)
    if PER_ROW:
        c = gl.expand_dims(row_scale, 1)
    else:
        c = row_scale
    moved = 1
    if RESCALE_TAU > 0:
        grew = m_new > m_i + RESCALE_TAU  # m_i = -inf: any finite max moves it; a NaN max does not
        m_new = gl.where(grew, m_new, m_i)
        moved = gl.max(grew.to(gl.int32), axis=0)  # the warpgroup's rows: one scalar for a uniform branch
    m_ref = gl.where(m_new == float("-inf"), 0.0, gl.where(m_new == float("inf"), float("nan"), m_new))
    p = exp2_split(s * c - gl.expand_dims(m_ref - P_SHIFT, 1), EXP2_FMA_EVERY)
    alpha = gl.exp2(m_i - m_ref)
    l_new = l_i
    if ROW_SUM:
        l_new = l_i * alpha + row_sum(p)
    return m_new, l_new, p, alpha, moved


@gluon.jit
def fp8_softmax_from_max(m_i, s, s_max, row_scale, PER_ROW: gl.constexpr, EXP2_FMA_EVERY: gl.constexpr = 0,
                         P_SHIFT: gl.constexpr = 8.0):
    """fp8_softmax_update (no RESCALE_TAU, l left to the tensor cores) with the rows' raw max ``s_max`` given (the
    caller took it first: PINGPONG 2 passes the turn right after it). Returns (m, P in float32, alpha)."""
    m_new = gl.maximum(m_i, s_max * row_scale)
    if PER_ROW:
        c = gl.expand_dims(row_scale, 1)
    else:
        c = row_scale
    m_ref = gl.where(m_new == float("-inf"), 0.0, gl.where(m_new == float("inf"), float("nan"), m_new))
    p = exp2_split(s * c - gl.expand_dims(m_ref - P_SHIFT, 1), EXP2_FMA_EVERY)
    alpha = gl.exp2(m_i - m_ref)
    return m_new, p, alpha


@gluon.jit
def arrive_after(x, bar_id):
    """bar.arrive on the named barrier ``bar_id`` for the 256 consumer threads, once a thread (x: a row vector of the
    wgmma layout, two rows a thread: pack 2), after ``x`` is computed: x goes through the asm (returned as it is), so
    the arrive depends on it and what uses x waits for the arrive (a plain arrive, depending on nothing, may be
    issued anywhere)."""
    bar = gl.full(x.shape, 0, gl.int32, x.type.layout) + bar_id
    return gl.inline_asm_elementwise("bar.arrive $4, 256;\n\tmov.b32 $0, $2;\n\tmov.b32 $1, $3;", "=f,=f,f,f,r,r",
                                     [x, bar], dtype=gl.float32, is_pure=False, pack=2)


@gluon.jit
def named_barrier(bar_id, ARRIVE: gl.constexpr):
    """bar.sync (wait) or, with ARRIVE, bar.arrive (signal, no wait) on the named barrier ``bar_id``
    (an int32 tensor) for the 256 threads of the two consumer warpgroups (Triton's own take ids 0..2)."""
    if ARRIVE:
        gl.inline_asm_elementwise("bar.arrive $1, 256;\n\tmov.b32 $0, $1;", "=r,r", [bar_id], dtype=gl.int32,
                                  is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise("bar.sync $1, 256;\n\tmov.b32 $0, $1;", "=r,r", [bar_id], dtype=gl.int32,
                                  is_pure=False, pack=1)


# EARLY_EXP2 (session 31): the exponentials taken against the running max m_old before the block's row max is known,
# then times 2^(m_old - m_new) (one multiply an element); the row max runs beside the MUFU instead of before it. Exact
# while a row's max moves by at most EARLY_LIMIT (base 2): 2^(s - m_old + 8) <= 2^(EARLY_LIMIT + 8) stays finite, and
# at a row's first block (m_old taken as 0) the max element's p0 >= 2^(8 - EARLY_LIMIT) stays normal; a warp with a row
# past it takes them again against m_new (a warp-uniform branch inside the asm, by a vote)
EARLY_LIMIT: gl.constexpr = gl.constexpr(100.0)
WARP_ANY_PTX: gl.constexpr = gl.constexpr("{\n\t.reg .pred p, q;\n\t.reg .b32 t;\n\t"
                                          "or.b32 t, $2, $3;\n\t"
                                          "setp.ne.s32 p, t, 0;\n\t"
                                          "vote.sync.any.pred q, p, 0xffffffff;\n\t"
                                          "selp.s32 $0, 1, 0, q;\n\t"
                                          "selp.s32 $1, 1, 0, q;\n\t}")
EARLY_FIX_PTX: gl.constexpr = gl.constexpr(
    "{\n\t.reg .pred q;\n\t.reg .f32 t;\n\t"
    "mul.rn.f32 $0, $4, $12;\n\tmul.rn.f32 $1, $5, $13;\n\tmul.rn.f32 $2, $6, $14;\n\tmul.rn.f32 $3, $7, $15;\n\t"
    "setp.ne.s32 q, $20, 0;\n\t"
    "@!q bra $$EARLY_DONE${:uid};\n\t"
    "sub.rn.f32 t, $8, $16;\n\tex2.approx.ftz.f32 $0, t;\n\t"
    "sub.rn.f32 t, $9, $17;\n\tex2.approx.ftz.f32 $1, t;\n\t"
    "sub.rn.f32 t, $10, $18;\n\tex2.approx.ftz.f32 $2, t;\n\t"
    "sub.rn.f32 t, $11, $19;\n\tex2.approx.ftz.f32 $3, t;\n\t"
    "$$EARLY_DONE${:uid}:\n\t}")

EARLY_FIX_CONSTRAINTS: gl.constexpr = gl.constexpr("=f,=f,=f,=f," + ",".join(["f"] * 16 + ["r"] * 4))


@gluon.jit
def warp_any(flag):
    """flag (int32 row vector of the wgmma layout, two rows a thread) -> 1 in every element where any row of the
    warp is flagged (vote.sync.any: the same value in all 32 lanes), else 0."""
    return gl.inline_asm_elementwise(WARP_ANY_PTX, "=r,=r,r,r", [flag], dtype=gl.int32, is_pure=True, pack=2)


@gluon.jit
def fp8_softmax_early(m_i, s, row_scale, PER_ROW: gl.constexpr, P_SHIFT: gl.constexpr = 8.0):
    """fp8_softmax_update (row max by the tree, l left to the tensor cores) with the exponentials taken before the row
    max is known (EARLY_EXP2): p0 = 2^(s * scale - m_old + P_SHIFT), then P = p0 * 2^(m_old - m_new) (EARLY_FIX_PTX),
    where m_old is the running max (0 while -inf: a row with no key so far has no key at all, so its p0 are 0). Where
    a warp has a row whose max grew by more than EARLY_LIMIT, that warp takes every exponential again against m_new.
    NaN as fp8_softmax_update (a NaN m_new makes the factor NaN). Returns (m, P (float32, 2^P_SHIFT p), alpha)."""
    if PER_ROW:
        c = gl.expand_dims(row_scale, 1)
    else:
        c = row_scale
    m_old = gl.where(m_i == float("-inf"), 0.0, gl.where(m_i == float("inf"), float("nan"), m_i))
    x = s * c - gl.expand_dims(m_old - P_SHIFT, 1)
    p0 = gl.exp2(x)
    s_max = row_max_tree(s)
    m_new = gl.maximum(m_i, s_max * row_scale)
    m_ref = gl.where(m_new == float("-inf"), 0.0, gl.where(m_new == float("inf"), float("nan"), m_new))
    delta = m_ref - m_old
    corr = gl.exp2(-delta)
    alpha = gl.exp2(m_i - m_ref)
    # past the limit either way: a max far above m_old (p0 would overflow), or, at a row's first key block (m_old = 0 for
    # -inf), far below it (p0 would underflow to 0 and the factor to inf)
    far = warp_any(((delta > EARLY_LIMIT) | (delta < -EARLY_LIMIT)).to(gl.int32))
    zero = gl.zeros_like(x)
    p = gl.inline_asm_elementwise(EARLY_FIX_PTX, EARLY_FIX_CONSTRAINTS,
                                  [p0, x, zero + gl.expand_dims(corr, 1), zero + gl.expand_dims(delta, 1),
                                   zero.to(gl.int32) + gl.expand_dims(far, 1)], dtype=gl.float32, is_pure=True, pack=4)
    return m_new, p, alpha


PINGPONG_BARRIER: gl.constexpr = gl.constexpr(8)  # consumer c waits on PINGPONG_BARRIER + c before issuing


@struct
class Running:
    """A consumer's online softmax: row max m and sum l (base 2, l of 2^8 p), the output accumulator,
    the last P (e4m3, the register operand of the next P V), its rows, and its rows' base-2 score
    scale (q's descale x softmax scale x log2 e: one value, or per row)."""
    m: object
    l: object
    acc: object
    p: object
    rows: object
    q_scale: object
    l_acc: object  # L_MMA: l in every column of a [BM, L_COLS] tile in the wgmma layout, float32 (else None)
    alpha: object  # RESCALE_LATE: the last softmax's alpha, applied to O (and l_acc) at the next step (else None)
    p2: object  # BN2 > 0: the last P of the step's second key block [BM, BN2] (as p; else None)


L_COLS: gl.constexpr = gl.constexpr(8)  # L_MMA: P times a [32, 8] block of ones (wgmma's narrowest N)
E4M3_ONE_BITS: gl.constexpr = gl.constexpr(0x38)  # 1.0 in e4m3 (sign 0, exponent 7 = the bias, mantissa 0)
L_MMA_MODES = (1, 2, 3, 4, 5)  # how the ones block is stored and read (AttentionFp8.L_MMA); session 28 checks them


@gluon.constexpr_function
def ones_shape(mode):
    """L_MMA: the ones block's shape in shared memory, [rows, keys] (keys contiguous: the K-major B operand)."""
    return [16 if mode in (3, 4, 5) else 8, 128 if mode in (2, 5) else 32]


@gluon.constexpr_function
def ones_layout(mode):
    """L_MMA: the ones block's shared layout, the default for its shape (32 keys: a 32-byte swizzle; 128: 128-byte;
    an unswizzled one does not compile in 3.6)."""
    return gl.NVMMASharedLayout.get_default_for(ones_shape(mode), gl.float8e4nv)


@struct
class AttentionFp8:
    """The op: its globals (descriptors, descales, sizes, options, layouts), whose methods are the
    template's callbacks."""
    q_desc: object
    k_desc: object
    vt_desc: object
    o_desc: object
    lse: object
    q_scales: object
    k_scales: object
    v_scales: object
    H: object
    N: object
    Nk: object
    GROUP: object  # q heads per kv head
    scale_log2e: object
    q_n_scales: object  # per-row descales: head bh's are scales[bh * n_scales + row // rows_per_scale]
    q_rows_per_scale: object
    k_n_scales: object
    k_rows_per_scale: object
    num_bh: object
    head_group: object
    CAUSAL: gl.constexpr
    Q_PER_ROW: gl.constexpr
    K_PER_ROW: gl.constexpr
    K_PER_BLOCK: gl.constexpr  # k's descales per block of BN keys: one scalar a step (a factor of the row scale)
    EXP2_FMA_EVERY: gl.constexpr  # exp2_split: one exp2 in this many on the FMA units (0: none)
    CAST_LATE: gl.constexpr  # p_operand: P rounded to e4m3 after its move to the operand layout; 2 (session 30): at
    # the softmax's end, carried packed as int32 (pack_e4m3x4): ptxas issues S's wgmma before a float32 P's conversion,
    # so the carried float32 P (64 registers at BN 128) sat beside S; with 232 registers a thread the allocator then
    # put the softmax's exponentials in the P V operand's registers and waited for P V first (the SASS's
    # WARPGROUP.DEPBAR before the row max): no softmax under P V
    P_SHIFT: gl.constexpr  # P is rounded to e4m3 as 2^P_SHIFT p (reference.P_SHIFT: 8)
    RESCALE_TAU: gl.constexpr  # > 0: O rescaled only where a row's max grew by more than this (reference.py)
    RESCALE_LATE: gl.constexpr  # O *= alpha at the next step, between the S and P V issues (FlashAttention-3's place)
    L_MMA: gl.constexpr  # l = the rows' sum of the e4m3 P, by P times ones on the tensor cores (reference.py): 0 off,
    # else how the ones block is stored and read (ones_shape): 1 [8, 32] 32-byte swizzle (the descriptor's stride SBO
    # 0); 2 [8, 128] 128-byte swizzle, its first 32 keys (SBO 0); 3 [16, 32] 32-byte swizzle, N = 16 (SBO 256); 4 [16,
    # 32] 32-byte swizzle, its first 8 rows (N = 8, SBO 256); 5 [16, 128] 128-byte swizzle, its first 8 rows and 32
    # keys (N = 8, SBO 1024)
    ones: object  # L_MMA: the ones block (e4m3) in shared memory, [LC, 32 or 128] (else None)
    LC: gl.constexpr  # L_MMA: the columns of the row-sum wgmma (its N: 8, or 16 for mode 3)
    MAX_TREE: gl.constexpr  # the row max as a tree (row_max_tree) instead of gl.max's chain
    PROBE_NO_SOFTMAX: gl.constexpr  # timing probes, wrong results: 1 P = S (no max, exp2 or sum), alpha = 1; 2 no row
    # max (the running max stays at 0: P saturates at 448 where a score passes 0.8); 3 (session 31) the softmax as
    # shipped but P's e4m3 bytes taken by PRMT instead of F2FP (pv_operand)
    BM: gl.constexpr  # a consumer's query rows
    BN: gl.constexpr  # keys per step
    D: gl.constexpr
    CONSUMERS: gl.constexpr
    PERMUTED_V: gl.constexpr
    PINGPONG: gl.constexpr
    S: gl.constexpr  # the layouts of S = Q K^T [BM, BN], of O [BM, D], and of P as P V's register operand
    O: gl.constexpr
    P: gl.constexpr
    L: gl.constexpr  # L_MMA: l's accumulator [BM, L_COLS], and P as its register operand
    PL: gl.constexpr
    BN2: gl.constexpr  # > 0 (session 30): a step takes BN + BN2 keys, a second K / V^T block of BN2 (KVt2)
    BNS: gl.constexpr  # keys per step: BN + BN2
    S2: gl.constexpr  # BN2 > 0: the layout of the second block's scores [BM, BN2]
    k2_desc: object  # BN2 > 0: the descriptors of the second blocks, K [1, 1, BN2, D] and V^T [1, 1, D, BN2]
    vt2_desc: object
    trace: object  # TRACE (a timing probe, session 30): int32 [2 consumers, 64 steps, 8 points] of %clock, program 0
    TRACE: gl.constexpr
    PV_SMEM: gl.constexpr  # session 31: P V from shared memory (compute_one, s_and_pv): 0 off, 1 on
    p_smem: object  # PV_SMEM: e4m3 [CONSUMERS * 2, BM, BN], two P buffers a consumer (else None)
    p2_smem: object  # PV_SMEM with BN2 > 0: e4m3 [CONSUMERS * 2, BM, BN2], the second key block's P (else None)
    EARLY_EXP2: gl.constexpr  # session 31: exponentials before the row max (fp8_softmax_early)

    @gluon.jit
    def stamp(self, ctx, step, point: gl.constexpr):
        """TRACE: program 0's SM clock at ``point`` of step ``step`` (< 64) of this consumer (its first tile's steps;
        later tiles overwrite them), a predicated store (no branch). Points: 0 compute's entry, 1 the wgmma issued, 2 S
        waited for, 3 the softmax done, 4 P V waited for."""
        if self.TRACE:
            t = gl.inline_asm_elementwise("mov.u32 $0, %clock;", "=r,r", [gl.program_id(0) * 0], dtype=gl.int32,
                                          is_pure=False, pack=1)
            gl.store(self.trace + (ctx.index * 64 + gl.minimum(step, 63)) * 8 + point, t,
                     mask=(gl.program_id(0) == 0) & (step < 64))

    @gluon.jit
    def setup(self, tile_id):
        """The tile's rows and its steps: a step per key block and one for the last P V."""
        rows = query_tile(self, tile_id, self.BM * self.CONSUMERS)
        return rows, gl.where(rows.n_blocks > 0, rows.n_blocks + 1, 0)

    @gluon.jit
    def load(self, stage, bar, tile, step):
        """Step ``step``'s K block and the V^T block of the step before (the first step reloads V block
        0, the last step K block n - 1, unused: a stage's byte count is fixed)."""
        b, h, hk = head_of(tile.bh, self.H, self.GROUP)
        k_block = gl.minimum(step, tile.n_blocks - 1)
        v_block = gl.maximum(step - 1, 0)
        tma.async_copy_global_to_shared(self.k_desc, [b, hk, k_block * self.BNS, 0], bar, stage.k)
        if self.PV_SMEM >= 2:  # compute_pipe_smem: the first half's V^T of this step, the second half's of the step before
            tma.async_copy_global_to_shared(self.vt_desc, [b, hk, 0, k_block * self.BNS], bar, stage.vt)
        else:
            tma.async_copy_global_to_shared(self.vt_desc, [b, hk, 0, v_block * self.BNS], bar, stage.vt)
        if self.BN2 > 0:  # the step's second blocks (past Nk: TMA fills zeros, the mask -inf)
            tma.async_copy_global_to_shared(self.k2_desc, [b, hk, k_block * self.BNS + self.BN, 0], bar, stage.k2)
            tma.async_copy_global_to_shared(self.vt2_desc, [b, hk, 0, v_block * self.BNS + self.BN], bar, stage.vt2)

    @gluon.jit
    def load_tile(self, q_smem, bar, tile, consumer):
        """Consumer ``consumer``'s BLOCK_M query rows (rows past N arrive as 0)."""
        b, h, hk = head_of(tile.bh, self.H, self.GROUP)
        tma.async_copy_global_to_shared(self.q_desc, [b, h, tile.first + consumer * self.BM, 0], bar, q_smem)

    @gluon.jit
    def start(self, ctx, tile, prev):
        first = tile.first + ctx.index * self.BM  # this consumer's rows
        n_own = tile.n_blocks
        if self.CAUSAL:  # this consumer's rows skip the tile's later blocks (all masked for them) but for the last P V
            own_hi = gl.maximum(gl.minimum(self.Nk, first + self.BM + (self.Nk - self.N)), 0)
            n_own = gl.minimum(gl.maximum(gl.cdiv(own_hi, self.BNS), 1), tile.n_blocks)
        if self.Q_PER_ROW:
            offs = first + gl.arange(0, self.BM, layout=gl.SliceLayout(1, self.S))
            q_scale = gl.load(self.q_scales + tile.bh.to(gl.int64) * self.q_n_scales + offs // self.q_rows_per_scale,
                              mask=offs < self.N, other=0.0) * self.scale_log2e
        else:
            q_scale = gl.load(self.q_scales + tile.bh) * self.scale_log2e
        if not self.K_PER_ROW and not self.K_PER_BLOCK:  # the head's k descale folds in once a tile (not a load a step)
            b, h, hk = head_of(tile.bh, self.H, self.GROUP)
            q_scale = q_scale * gl.load(self.k_scales + b * (self.H // self.GROUP) + hk)
        m, l = online_softmax_start(self.BM, self.S)
        acc = gl.zeros([self.BM, self.D], gl.float32, self.O)
        if self.PV_SMEM:  # P goes through shared memory: nothing carried
            p = gl.constexpr(None)
        elif self.CAST_LATE == 2:  # P packed 4 e4m3 an int32 (pack_e4m3x4)
            p = self.p_operand(gl.zeros([self.BM, self.BN], gl.float32, self.S))
        else:
            p = gl.zeros([self.BM, self.BN], gl.float32 if self.CAST_LATE else self.q_desc.dtype, self.P)
        l_acc = gl.constexpr(None)  # (a constexpr: nothing carried through the loop)
        if self.L_MMA:
            l_acc = gl.zeros([self.BM, self.LC], gl.float32, self.L)
        alpha = gl.constexpr(None)
        if self.RESCALE_LATE:
            alpha = gl.full([self.BM], 1.0, gl.float32, gl.SliceLayout(1, self.S))
        p2 = gl.constexpr(None)
        if self.BN2 > 0 and not self.PV_SMEM:
            p2 = gl.zeros([self.BM, self.BN2], gl.float32, self.P)
        return Running(m, l, acc, p, Rows(first, tile.bh, n_own), q_scale, l_acc, alpha, p2)

    @gluon.jit
    def key_scales(self, st, first_key):
        """K_PER_ROW: the step's keys' descales; K_PER_BLOCK: the step's key block's one descale (a scalar);
        loaded before the step's wgmma are issued, so that the load's latency hides under them; else None
        (the head's is in st.q_scale)."""
        k_scale = None
        if self.K_PER_BLOCK:
            b, h, hk = head_of(st.rows.bh, self.H, self.GROUP)
            bhk = b * (self.H // self.GROUP) + hk
            k_scale = gl.load(self.k_scales + bhk.to(gl.int64) * self.k_n_scales + first_key // self.BN)
        elif self.K_PER_ROW:
            b, h, hk = head_of(st.rows.bh, self.H, self.GROUP)
            bhk = b * (self.H // self.GROUP) + hk
            keys = first_key + gl.arange(0, self.BN, layout=gl.SliceLayout(0, self.S))
            k_scale = gl.load(self.k_scales + bhk.to(gl.int64) * self.k_n_scales + keys // self.k_rows_per_scale,
                              mask=keys < self.Nk, other=0.0)
        return k_scale

    @gluon.jit
    def softmax(self, s, st, first_key, k_scale, ctx=None, ARRIVE: gl.constexpr = False):
        """Descale the scores, mask them where needed, one online-softmax step.
        Returns (m, l, P in float32 (2^P_SHIFT p), alpha (a row vector), whether any row's m moved).
        ARRIVE (PINGPONG 2 and 3, the steady step): the other consumer's turn is passed here, after the row max (2) or
        after the exponentials (3), instead of right after this consumer's issue."""
        if self.K_PER_ROW:
            s = s * gl.expand_dims(k_scale, 0)
        row_scale = st.q_scale
        if self.K_PER_BLOCK:
            row_scale = row_scale * k_scale
        if needs_mask(st.rows.first, first_key, self.BN, self.N, self.Nk, self.CAUSAL):
            s = mask_scores(s, self.S, st.rows.first, first_key, self.N, self.Nk, self.CAUSAL, KEY_AXIS=1)
        if self.PROBE_NO_SOFTMAX == 1:  # what the step costs without its softmax (the wgmma, loads, P's cvt, O *= alpha)
            return st.m, st.l, s, st.m * 0.0 + 1.0, 1
        if self.PROBE_NO_SOFTMAX == 2:  # without the row max (its 64 FMNMX a thread, the quad's shuffles)
            m0 = gl.maximum(st.m, 0.0)
            p = exp2_split(s * row_scale - gl.expand_dims(m0 - self.P_SHIFT, 1), self.EXP2_FMA_EVERY)
            return m0, st.l, p, gl.exp2(st.m - m0), 1
        if ARRIVE:
            bar_id = PINGPONG_BARRIER + 1 - ctx.index
            s_max = row_max_tree(s)
            if self.PINGPONG == 2:
                s_max = arrive_after(s_max, bar_id)
            m, p, alpha = fp8_softmax_from_max(st.m, s, s_max, row_scale, self.Q_PER_ROW, self.EXP2_FMA_EVERY,
                                               self.P_SHIFT)
            if self.PINGPONG == 3:
                alpha = arrive_after(alpha, bar_id)
            return m, st.l, p, alpha, 1
        if self.EARLY_EXP2:
            m, p, alpha = fp8_softmax_early(st.m, s, row_scale, self.Q_PER_ROW, self.P_SHIFT)
            return m, st.l, p, alpha, 1
        return fp8_softmax_update(st.m, st.l, s, row_scale, self.Q_PER_ROW, self.EXP2_FMA_EVERY, self.P_SHIFT,
                                  self.RESCALE_TAU, not self.L_MMA, self.MAX_TREE)

    @gluon.jit
    def p_operand(self, p):
        """P in e4m3 as the P V register operand (made with no wgmma in flight: ptxas C7513), its keys
        permuted within each 32 (reference.key_position) so that each thread keeps its own values."""
        if self.PERMUTED_V:
            # column c = 32 t + 16 j_hi + 8 j_lo + 2 r + e (the accumulator's: lane r of a quad holds e = 0, 1
            # of every 8) goes to k = 32 t + 16 j_hi + 4 r + 2 j_lo + e (the register operand's: lane r holds
            # 4 consecutive k of every 16). CAST_LATE: P stays float32 here (moved by register renaming only) and
            # is rounded just before its wgmma (pv_operand); else rounded first, and its bytes, carried from step
            # to step as single bytes, are unpacked and packed again (~190 PRMT/LOP3/SHF a step at D 128)
            x = p if self.CAST_LATE else p.to(self.q_desc.dtype)
            x = gl.reshape(x, [self.BM, p.shape[1] // 32, 2, 2, 4, 2])
            x = gl.permute(x, (0, 1, 2, 4, 3, 5))
            x = gl.convert_layout(gl.reshape(x, [self.BM, p.shape[1]]), self.P, assert_trivial=True)
        else:
            x = gl.convert_layout(p.to(self.q_desc.dtype), self.P)
        if self.CAST_LATE == 2:  # rounded now and carried packed: no float32 P beside the next S (see CAST_LATE)
            x = pack_e4m3x4(x)
        return x

    @gluon.jit
    def pv_operand(self, p):
        """The P V register operand from Running.p: with CAST_LATE rounded to e4m3 here, four k of a row a
        register (to_e4m3x4), in the basic block of the wgmma, so that no byte is unpacked; else p as it is."""
        operand = p
        if self.PROBE_NO_SOFTMAX == 3:  # timing probe (session 31), WRONG results: P's bytes by PRMT, no F2FP
            operand = gl.inline_asm_elementwise(PROBE_BYTES_PTX, "=r,f,f,f,f", [p], dtype=gl.float8e4nv, is_pure=True,
                                                pack=4)
        elif self.CAST_LATE == 2:
            operand = unpack_e4m3x4(p, self.P)
        elif self.CAST_LATE:
            if self.BN2 > 0:
                operand = to_e4m3x4_pinned(p)
            else:
                operand = to_e4m3x4(p)
        return operand

    @gluon.jit
    def row_sum_mma(self, p8):
        """L_MMA: the rows' sums of P as rounded (the P that multiplies V) over this key block, on the tensor cores:
        each 32-key chunk of the e4m3 P operand times a [32, L_COLS] block of ones, one m64n8k32 wgmma from a zero
        accumulator each (4 issued async, in place of BN / 2 FADD a thread and row); the caller adds the 4 partial
        sums and l in float32 registers. Why chunks: FP8 wgmma adds into its accumulator with a narrow internal
        precision (about 14 bits kept, DeepSeek-V3's finding), which drops the small positive terms once the sum is
        large: l accumulated across key blocks in the tensor cores (session 27 runs 3-4) was off by factors of 2
        to 13; 32 terms from zero lose only what is under 2^-13 of the chunk's largest."""
        gl.static_assert(self.BN == 128, "L_MMA: key blocks of 128 (4 chunks of 32)")
        ones = self.ones
        if self.L_MMA == 2 or self.L_MMA == 5:  # 128 keys with the K operand's 128-byte swizzle: the first 32
            ones = ones.slice(0, 32, dim=1)
        if self.L_MMA == 4 or self.L_MMA == 5:  # 16 rows: the first 8 (N = 8, the descriptor's stride that of 16)
            ones = ones.slice(0, 8, dim=0)
        ones_t = ones.permute((1, 0))  # [32, LC], keys contiguous: K-major
        # the chunk index is K's bits 32 and 64, register bits of the operand layout: the split moves no data
        x = gl.permute(gl.reshape(p8, [self.BM, 2, 2, 32]), (0, 3, 1, 2))
        lo, hi = gl.split(x)
        c0, c1 = gl.split(lo)
        c2, c3 = gl.split(hi)
        zero = gl.zeros([self.BM, self.LC], gl.float32, self.L)
        t0 = warpgroup_mma(gl.convert_layout(c0, self.PL, assert_trivial=True), ones_t, zero, use_acc=False,
                           is_async=True)
        t1 = warpgroup_mma(gl.convert_layout(c1, self.PL, assert_trivial=True), ones_t, zero, use_acc=False,
                           is_async=True)
        t2 = warpgroup_mma(gl.convert_layout(c2, self.PL, assert_trivial=True), ones_t, zero, use_acc=False,
                           is_async=True)
        t3 = warpgroup_mma(gl.convert_layout(c3, self.PL, assert_trivial=True), ones_t, zero, use_acc=False,
                           is_async=True)
        return t0, t1, t2, t3

    @gluon.jit
    def row_sum_split(self, p8, p8b):
        """L_MMA over a split step: the rows' sums of the e4m3 P operands [BM, 128] and [BM, BN2] by 32-key chunk wgmma
        against the ones block, as row_sum_mma. BN2 64: six chunks, each from zero. BN2 32: the first block's chunks
        chained in pairs (the second wgmma adding into the first's accumulator: 64 terms, the FP8 accumulator's narrow
        sums (row_sum_mma) losing under 2^-13 of a pair's sum) and the second block's one: three accumulators
        (sm_90a, D64: 40 bytes of spills against 144 with five). Returns six tokens (BN2 32: the first three, then
        the third again, unused)."""
        ones_t = self.ones.permute((1, 0))  # [32, LC] (L_MMA mode 1)
        zero = gl.zeros([self.BM, self.LC], gl.float32, self.L)
        if self.BN2 == 64:
            t0, t1, t2, t3 = self.row_sum_mma(p8)
            d0, d1 = gl.split(gl.permute(gl.reshape(p8b, [self.BM, 2, 32]), (0, 2, 1)))
            t4 = warpgroup_mma(gl.convert_layout(d0, self.PL, assert_trivial=True), ones_t, zero, use_acc=False,
                               is_async=True)
            t5 = warpgroup_mma(gl.convert_layout(d1, self.PL, assert_trivial=True), ones_t, zero, use_acc=False,
                               is_async=True)
        else:
            x = gl.permute(gl.reshape(p8, [self.BM, 2, 2, 32]), (0, 3, 1, 2))
            lo, hi = gl.split(x)
            c0, c1 = gl.split(lo)
            c2, c3 = gl.split(hi)
            t0 = warpgroup_mma(gl.convert_layout(c0, self.PL, assert_trivial=True), ones_t, zero, use_acc=False,
                               is_async=True)
            t0 = warpgroup_mma(gl.convert_layout(c1, self.PL, assert_trivial=True), ones_t, t0, is_async=True)
            t1 = warpgroup_mma(gl.convert_layout(c2, self.PL, assert_trivial=True), ones_t, zero, use_acc=False,
                               is_async=True)
            t1 = warpgroup_mma(gl.convert_layout(c3, self.PL, assert_trivial=True), ones_t, t1, is_async=True)
            t2 = warpgroup_mma(gl.convert_layout(p8b, self.PL, assert_trivial=True), ones_t, zero, use_acc=False,
                               is_async=True)
            t3 = t2
            t4 = t2
            t5 = t2
        return t0, t1, t2, t3, t4, t5

    @gluon.jit
    def softmax_split(self, s, s2, st, first_key):
        """softmax over a split step's scores [s | s2] (keys first_key.. and first_key + BN..): masks where the step
        needs one, then fp8_softmax_update_split. Returns (m, P, P2 in float32, alpha)."""
        if needs_mask(st.rows.first, first_key, self.BNS, self.N, self.Nk, self.CAUSAL):
            s = mask_scores(s, self.S, st.rows.first, first_key, self.N, self.Nk, self.CAUSAL, KEY_AXIS=1)
            s2 = mask_scores(s2, self.S2, st.rows.first, first_key + self.BN, self.N, self.Nk, self.CAUSAL, KEY_AXIS=1)
        return fp8_softmax_update_split(st.m, s, s2, st.q_scale, self.Q_PER_ROW, self.EXP2_FMA_EVERY, self.P_SHIFT)

    @gluon.jit
    def compute_split(self, ctx, st, stage, tile, step):
        """compute for split steps (BN2 > 0): S = Q [K1 | K2]^T as two wgmma (N = BN and BN2), P V as two into the
        same accumulator, l by 4 + 2 chunk wgmma; the schedule of compute's (S_j and P_{j-1} V_{j-1} together, the
        softmax under P V). Every branch ends with its wgmma complete."""
        q = ctx.operand.reshape([self.BM, self.D])
        k_t = stage.k.reshape([self.BN, self.D]).permute((1, 0))
        k2_t = stage.k2.reshape([self.BN2, self.D]).permute((1, 0))
        v = stage.vt.reshape([self.D, self.BN]).permute((1, 0))
        v2 = stage.vt2.reshape([self.D, self.BN2]).permute((1, 0))
        self.my_turn(ctx, step)
        if step == 0:
            s_tok = warpgroup_mma(q, k_t, gl.zeros([self.BM, self.BN], gl.float32, self.S), use_acc=False,
                                  is_async=True)
            s2_tok = warpgroup_mma(q, k2_t, gl.zeros([self.BM, self.BN2], gl.float32, self.S2), use_acc=False,
                                   is_async=True)
            self.their_turn(ctx)
            s, s2 = warpgroup_mma_wait(0, deps=(s_tok, s2_tok))
            m, p32, p32b, alpha = self.softmax_split(s, s2, st, 0)
            st = st.replace(m=m, p=self.p_operand(p32), p2=self.p_operand(p32b))
        elif step < st.rows.n_blocks:
            p8 = self.pv_operand(st.p)
            p8b = self.pv_operand(st.p2)
            s_tok = warpgroup_mma(q, k_t, gl.zeros([self.BM, self.BN], gl.float32, self.S), use_acc=False,
                                  is_async=True)
            s2_tok = warpgroup_mma(q, k2_t, gl.zeros([self.BM, self.BN2], gl.float32, self.S2), use_acc=False,
                                   is_async=True)
            t0, t1, t2, t3, t4, t5 = self.row_sum_split(p8, p8b)
            o_tok = warpgroup_mma(p8, v, st.acc, is_async=True)
            o_tok = warpgroup_mma(p8b, v2, o_tok, is_async=True)
            self.their_turn(ctx)
            if self.BN2 == 64:
                s, s2, l0, l1, l2, l3, l4, l5 = warpgroup_mma_wait(2, deps=(s_tok, s2_tok, t0, t1, t2, t3, t4, t5))
                l_acc = st.l_acc + (((l0 + l1) + (l2 + l3)) + (l4 + l5))
            else:
                s, s2, l0, l1, l2 = warpgroup_mma_wait(2, deps=(s_tok, s2_tok, t0, t1, t2))
                l_acc = st.l_acc + ((l0 + l1) + l2)
            m, p32, p32b, alpha = self.softmax_split(s, s2, st, step * self.BNS)
            acc = warpgroup_mma_wait(0, deps=(o_tok,))
            acc, l_acc = self.rescale(acc, l_acc, alpha, 1)
            st = st.replace(m=m, acc=acc, p=self.p_operand(p32), p2=self.p_operand(p32b), l_acc=l_acc)
        elif step == st.rows.n_blocks:  # the step after this consumer's last block: its P V only
            p8 = self.pv_operand(st.p)
            p8b = self.pv_operand(st.p2)
            t0, t1, t2, t3, t4, t5 = self.row_sum_split(p8, p8b)
            o_tok = warpgroup_mma(p8, v, st.acc, is_async=True)
            o_tok = warpgroup_mma(p8b, v2, o_tok, is_async=True)
            self.their_turn(ctx)
            if self.BN2 == 64:
                acc, l0, l1, l2, l3, l4, l5 = warpgroup_mma_wait(0, deps=(o_tok, t0, t1, t2, t3, t4, t5))
                l_sum = ((l0 + l1) + (l2 + l3)) + (l4 + l5)
            else:
                acc, l0, l1, l2 = warpgroup_mma_wait(0, deps=(o_tok, t0, t1, t2))
                l_sum = (l0 + l1) + l2
            st = st.replace(acc=acc, l_acc=st.l_acc + l_sum)
        else:  # causal: a step past this consumer's keys
            self.their_turn(ctx)
        return st

    @gluon.jit
    def row_sum_split_smem(self, pb, pb2):
        """PV_SMEM over a split step (BN2 64): the rows' sums of P from its two shared buffers, six 32-key chunks each
        from zero (row_sum_smem's four and the second buffer's two)."""
        gl.static_assert(self.BN2 == 64, "PV_SMEM split steps: BN2 64")
        t0, t1, t2, t3 = self.row_sum_smem(pb)
        ones_t = self.ones.permute((1, 0))
        zero = gl.zeros([self.BM, self.LC], gl.float32, self.L)
        t4 = warpgroup_mma(pb2.slice(0, 32, dim=1), ones_t, zero, use_acc=False, is_async=True)
        t5 = warpgroup_mma(pb2.slice(32, 32, dim=1), ones_t, zero, use_acc=False, is_async=True)
        return t0, t1, t2, t3, t4, t5

    @gluon.jit
    def compute_split_smem(self, ctx, st, stage, tile, step):
        """compute_split with P V from shared memory (PV_SMEM, session 31): steps of BN + BN2 (128 + 64) keys, P of the
        two blocks stored to this consumer's two buffer pairs (alternating by step), P V as two SS wgmma, l by six
        chunk wgmma on the buffers: no P carried between steps, which is what left split steps no registers at D128
        (session 30). Every branch ends with its wgmma complete."""
        q = ctx.operand.reshape([self.BM, self.D])
        k_t = stage.k.reshape([self.BN, self.D]).permute((1, 0))
        k2_t = stage.k2.reshape([self.BN2, self.D]).permute((1, 0))
        v = stage.vt.reshape([self.D, self.BN]).permute((1, 0))
        v2 = stage.vt2.reshape([self.D, self.BN2]).permute((1, 0))
        self.my_turn(ctx, step)
        if step == 0:
            s_tok = warpgroup_mma(q, k_t, gl.zeros([self.BM, self.BN], gl.float32, self.S), use_acc=False,
                                  is_async=True)
            s2_tok = warpgroup_mma(q, k2_t, gl.zeros([self.BM, self.BN2], gl.float32, self.S2), use_acc=False,
                                   is_async=True)
            self.their_turn(ctx)
            s, s2 = warpgroup_mma_wait(0, deps=(s_tok, s2_tok))
            m, p32, p32b, alpha = self.softmax_split(s, s2, st, 0)
            self.write_p(p32, self.p_buffer(ctx, 0))
            self.write_p(p32b, self.p2_smem.index(ctx.index * 2))
            fence_async_shared()
            gl.thread_barrier()
            st = st.replace(m=m)
        elif step < st.rows.n_blocks:
            pb = self.p_buffer(ctx, step - 1)
            pb2 = self.p2_smem.index(ctx.index * 2 + (step - 1) % 2)
            s_tok = warpgroup_mma(q, k_t, gl.zeros([self.BM, self.BN], gl.float32, self.S), use_acc=False,
                                  is_async=True)
            s2_tok = warpgroup_mma(q, k2_t, gl.zeros([self.BM, self.BN2], gl.float32, self.S2), use_acc=False,
                                   is_async=True)
            t0, t1, t2, t3, t4, t5 = self.row_sum_split_smem(pb, pb2)
            o_tok = warpgroup_mma(pb, v, st.acc, is_async=True)
            o_tok = warpgroup_mma(pb2, v2, o_tok, is_async=True)
            self.their_turn(ctx)
            self.stamp(ctx, step, 1)
            s, s2, l0, l1, l2, l3, l4, l5 = warpgroup_mma_wait(1, deps=(s_tok, s2_tok, t0, t1, t2, t3, t4, t5))
            self.stamp(ctx, step, 2)
            l_acc = st.l_acc + (((l0 + l1) + (l2 + l3)) + (l4 + l5))
            m, p32, p32b, alpha = self.softmax_split(s, s2, st, step * self.BNS)
            self.write_p(p32, self.p_buffer(ctx, step))
            self.write_p(p32b, self.p2_smem.index(ctx.index * 2 + step % 2))
            fence_async_shared()
            gl.thread_barrier()
            self.stamp(ctx, step, 3)
            acc = warpgroup_mma_wait(0, deps=(o_tok,))
            self.stamp(ctx, step, 4)
            acc, l_acc = self.rescale(acc, l_acc, alpha, 1)
            st = st.replace(m=m, acc=acc, l_acc=l_acc)
        elif step == st.rows.n_blocks:  # the step after this consumer's last block: its P V only
            pb = self.p_buffer(ctx, step - 1)
            pb2 = self.p2_smem.index(ctx.index * 2 + (step - 1) % 2)
            t0, t1, t2, t3, t4, t5 = self.row_sum_split_smem(pb, pb2)
            o_tok = warpgroup_mma(pb, v, st.acc, is_async=True)
            o_tok = warpgroup_mma(pb2, v2, o_tok, is_async=True)
            self.their_turn(ctx)
            acc, l0, l1, l2, l3, l4, l5 = warpgroup_mma_wait(0, deps=(o_tok, t0, t1, t2, t3, t4, t5))
            st = st.replace(acc=acc, l_acc=st.l_acc + (((l0 + l1) + (l2 + l3)) + (l4 + l5)))
        else:  # causal: a step past this consumer's keys
            self.their_turn(ctx)
        return st

    @gluon.jit
    def publish_p(self):
        """PV_SMEM: the P just stored, fenced for the async proxy and the warpgroup's threads met."""
        fence_async_shared()
        gl.thread_barrier()

    @gluon.jit
    def softmax_b(self, s2, st, first_key, k_scale):
        """compute_pipe_smem's second half's softmax: scores [BM, BN2] in the S2 layout (BN2 = 128: self.softmax);
        BN2 64: masked by its own width and the row max by gl.max (row_max_tree takes 128 columns). Returns as
        softmax."""
        if self.BN2 == self.BN:
            m, l, p, alpha, moved = self.softmax(s2, st, first_key, k_scale)
        else:
            row_scale = st.q_scale
            if self.K_PER_BLOCK:
                row_scale = row_scale * k_scale
            if needs_mask(st.rows.first, first_key, self.BN2, self.N, self.Nk, self.CAUSAL):
                s2 = mask_scores(s2, self.S2, st.rows.first, first_key, self.N, self.Nk, self.CAUSAL, KEY_AXIS=1)
            if self.Q_PER_ROW:
                row_scale = gl.convert_layout(row_scale, gl.SliceLayout(1, self.S2), assert_trivial=True)
            m_i = gl.convert_layout(st.m, gl.SliceLayout(1, self.S2), assert_trivial=True)
            m, l, p, alpha, moved = fp8_softmax_update(m_i, st.l, s2, row_scale, self.Q_PER_ROW, self.EXP2_FMA_EVERY,
                                                       self.P_SHIFT, 0.0, False, False)
            m = gl.convert_layout(m, gl.SliceLayout(1, self.S), assert_trivial=True)
            alpha = gl.convert_layout(alpha, gl.SliceLayout(1, self.S), assert_trivial=True)
        return m, l, p, alpha, moved

    @gluon.jit
    def sum_b(self, l0, l1, l2, l3):
        """row_sum_b's partial sums added (BN2 64: two; the other two tokens repeat them)."""
        if self.BN2 == self.BN:
            r = (l0 + l1) + (l2 + l3)
        else:
            r = l0 + l1
        return r

    @gluon.jit
    def row_sum_b(self, pb):
        """compute_pipe_smem: the row sums of the second half's P from its buffer (4 or 2 chunks of 32 keys); 4 tokens
        (BN2 64: the second two repeat the first two's, unused)."""
        if self.BN2 == self.BN:
            t0, t1, t2, t3 = self.row_sum_smem(pb)
        else:
            ones_t = self.ones.permute((1, 0))
            zero = gl.zeros([self.BM, self.LC], gl.float32, self.L)
            t0 = warpgroup_mma(pb.slice(0, 32, dim=1), ones_t, zero, use_acc=False, is_async=True)
            t1 = warpgroup_mma(pb.slice(32, 32, dim=1), ones_t, zero, use_acc=False, is_async=True)
            t2 = t0
            t3 = t1
        return t0, t1, t2, t3

    @gluon.jit
    def pipe_second_half(self, st, m_a, acc, l_acc, sb_tok, pa, pb, va, first_key, k_scale):
        """compute_pipe_smem's second half: P_a V_a (and P_a's row sums) issued, S_b waited for (P_a V_a still
        running), softmax_b, P_b stored, P_a V_a waited for, O and l times alpha_b. Returns the state."""
        t0, t1, t2, t3 = self.row_sum_smem(pa)
        o_tok = warpgroup_mma(pa, va, acc, is_async=True)
        s2 = warpgroup_mma_wait(5, deps=(sb_tok,))  # S_b done; the row sums and P_a V_a may still run
        m_b, l_b, p32b, alpha_b, moved_b = self.softmax_b(s2, st.replace(m=m_a), first_key + self.BN, k_scale)
        self.write_p(p32b, pb)
        self.publish_p()
        acc, l0, l1, l2, l3 = warpgroup_mma_wait(0, deps=(o_tok, t0, t1, t2, t3))
        l_acc = l_acc + ((l0 + l1) + (l2 + l3))
        acc, l_acc = self.rescale(acc, l_acc, alpha_b, moved_b)
        return st.replace(m=m_b, acc=acc, l_acc=l_acc)

    @gluon.jit
    def compute_pipe_smem(self, ctx, st, stage, tile, step):
        """PV_SMEM 2 (session 31): steps of two 128-key halves a and b (BN2 = BN = 128: K_a, K_b, V_a of this step and
        V_b of the step before in a stage) with one S product in flight under each softmax, FlashAttention-3's
        intra-warpgroup pipelining inside a step:

            S_a, [P_b V_b of the step before] | wait S_a | S_b | softmax_a -> P_a | wait P_b V_b | O *= alpha_a
            | P_a V_a | wait S_b | softmax_b -> P_b | wait P_a V_a | O *= alpha_b

        S_b runs under softmax_a, P_a V_a under softmax_b; only S_a's latency is exposed, once a 256 keys (the trace
        of sessions 30-31: the issue and S wait ~600 of the step's ~2,300 cycles a 128 keys). P goes through shared
        memory (one buffer a half and consumer: each is read by its P V before the next store). l: P's 32-key
        chunks times ones (L_MMA 1) issued with their P V, rescaled with O. The running max moves per half, so the
        emulation's key block is 128. Every branch ends with its wgmma complete."""
        q = ctx.operand.reshape([self.BM, self.D])
        k_t = stage.k.reshape([self.BN, self.D]).permute((1, 0))
        k2_t = stage.k2.reshape([self.BN2, self.D]).permute((1, 0))
        va = stage.vt.reshape([self.D, self.BN]).permute((1, 0))
        vb = stage.vt2.reshape([self.D, self.BN2]).permute((1, 0))
        pa = self.p_smem.index(ctx.index * 2)
        if self.BN2 == self.BN:
            pb = self.p_smem.index(ctx.index * 2 + 1)
        else:
            pb = self.p2_smem.index(ctx.index * 2)
        self.my_turn(ctx, step)
        if step == 0:
            k_scale = self.key_scales(st, 0)
            sa_tok = warpgroup_mma(q, k_t, gl.zeros([self.BM, self.BN], gl.float32, self.S), use_acc=False,
                                   is_async=True)
            self.their_turn(ctx)
            s = warpgroup_mma_wait(0, deps=(sa_tok,))
            sb_tok = warpgroup_mma(q, k2_t, gl.zeros([self.BM, self.BN2], gl.float32, self.S2), use_acc=False,
                                   is_async=True)
            m_a, l_a, p32, alpha_a, moved = self.softmax(s, st, 0, k_scale)
            self.write_p(p32, pa)
            self.publish_p()
            st = self.pipe_second_half(st, m_a, st.acc, st.l_acc, sb_tok, pa, pb, va, 0, k_scale)
        elif step < st.rows.n_blocks:
            first_key = step * self.BNS
            k_scale = self.key_scales(st, first_key)
            sa_tok = warpgroup_mma(q, k_t, gl.zeros([self.BM, self.BN], gl.float32, self.S), use_acc=False,
                                   is_async=True)
            t0, t1, t2, t3 = self.row_sum_b(pb)  # the second half of the step before: its row sums and P V
            o_tok = warpgroup_mma(pb, vb, st.acc, is_async=True)
            self.their_turn(ctx)
            self.stamp(ctx, step, 1)
            if self.PV_SMEM == 3:  # P_b V_b waited for with S_a: O is not in flight under softmax_a (fewer registers)
                s, acc, l0, l1, l2, l3 = warpgroup_mma_wait(0, deps=(sa_tok, o_tok, t0, t1, t2, t3))
                l_acc = st.l_acc + self.sum_b(l0, l1, l2, l3)
                self.stamp(ctx, step, 2)
                sb_tok = warpgroup_mma(q, k2_t, gl.zeros([self.BM, self.BN2], gl.float32, self.S2), use_acc=False,
                                       is_async=True)
                m_a, l_a, p32, alpha_a, moved = self.softmax(s, st, first_key, k_scale)
                self.write_p(p32, pa)
                self.publish_p()
                self.stamp(ctx, step, 3)
            else:
                s, l0, l1, l2, l3 = warpgroup_mma_wait(1, deps=(sa_tok, t0, t1, t2, t3))
                l_acc = st.l_acc + self.sum_b(l0, l1, l2, l3)
                self.stamp(ctx, step, 2)
                sb_tok = warpgroup_mma(q, k2_t, gl.zeros([self.BM, self.BN2], gl.float32, self.S2), use_acc=False,
                                       is_async=True)
                m_a, l_a, p32, alpha_a, moved = self.softmax(s, st, first_key, k_scale)
                self.write_p(p32, pa)
                self.publish_p()
                self.stamp(ctx, step, 3)
                acc = warpgroup_mma_wait(1, deps=(o_tok,))  # P_b V_b of the step before (S_b may still run)
            acc, l_acc = self.rescale(acc, l_acc, alpha_a, moved)
            st = self.pipe_second_half(st, m_a, acc, l_acc, sb_tok, pa, pb, va, first_key, k_scale)
            self.stamp(ctx, step, 4)
        elif step == st.rows.n_blocks:  # the step after this consumer's last keys: the last half's P V
            t0, t1, t2, t3 = self.row_sum_b(pb)
            o_tok = warpgroup_mma(pb, vb, st.acc, is_async=True)
            self.their_turn(ctx)
            acc, l0, l1, l2, l3 = warpgroup_mma_wait(0, deps=(o_tok, t0, t1, t2, t3))
            st = st.replace(acc=acc, l_acc=st.l_acc + self.sum_b(l0, l1, l2, l3))
        else:  # causal: a step past this consumer's keys
            self.their_turn(ctx)
        return st

    @gluon.jit
    def rescale_late(self, st):
        """RESCALE_LATE: (O, L_MMA's l) times the last softmax's alpha, issued after S's wgmma and before P V's (as
        FlashAttention-3 places rescale_o): its 64 FMUL a thread at D 128 run under S on the tensor cores instead of
        between P V's end and the next step's issue. Else (O, l) as they are."""
        acc = st.acc
        l_acc = 0  # (without L_MMA a placeholder: a jit function returns no None)
        if self.L_MMA:
            l_acc = st.l_acc
            if self.RESCALE_LATE:
                l_acc = l_acc * as_column(st.alpha, self.L)
        if self.RESCALE_LATE:
            acc = acc * as_column(st.alpha, self.O)
        return acc, l_acc

    @gluon.jit
    def rescale(self, acc, l_acc, alpha, moved):
        """O (and L_MMA's l) times alpha; with RESCALE_TAU only where a row of the warpgroup moved (else alpha is 1
        in every row: 64 or 32 multiplies a thread saved at D 128, 64)."""
        if self.RESCALE_TAU > 0:
            if moved > 0:
                acc = acc * as_column(alpha, self.O)
                if self.L_MMA:
                    l_acc = l_acc * as_column(alpha, self.L)
        else:
            acc = acc * as_column(alpha, self.O)
            if self.L_MMA:
                l_acc = l_acc * as_column(alpha, self.L)
        return acc, l_acc

    @gluon.jit
    def my_turn(self, ctx, step):
        """PINGPONG (FlashAttention-3's warp-scheduler barriers): the two consumers issue their wgmma in
        turn, so that one's softmax runs under the other's products. Consumer 0 waits for consumer 1's
        issue of the step before (not at a tile's first step: its finish takes that wait), 1 for 0's."""
        if self.PINGPONG:
            if ctx.index == 1 or step > 0:
                named_barrier(gl.program_id(0) * 0 + PINGPONG_BARRIER + ctx.index, False)

    @gluon.jit
    def their_turn(self, ctx):
        """PINGPONG: this consumer has issued its step's wgmma: the other's turn."""
        if self.PINGPONG:
            named_barrier(gl.program_id(0) * 0 + PINGPONG_BARRIER + 1 - ctx.index, True)

    @gluon.jit
    def p_source(self, ctx, st, block):
        """P V's A operand for key block ``block``: P rounded to e4m3 in registers (pv_operand of Running.p), or with
        PV_SMEM the shared buffer the softmax of that block stored it to."""
        if self.PV_SMEM:
            a = self.p_buffer(ctx, block)
        else:
            a = self.pv_operand(st.p)
        return a

    @gluon.jit
    def row_sums(self, a):
        """L_MMA: the rows' sums of P (p_source's operand) by four 32-key chunk wgmma: row_sum_mma or row_sum_smem."""
        if self.PV_SMEM:
            t0, t1, t2, t3 = self.row_sum_smem(a)
        else:
            t0, t1, t2, t3 = self.row_sum_mma(a)
        return t0, t1, t2, t3

    @gluon.jit
    def s_and_pv(self, ctx, q, k_t, v, st, first_key):
        """S = Q K^T and acc + P V issued together, the softmax of S while P V runs (PV_SMEM: P stored to its buffer
        before P V is waited for). Returns (m, l, P in float32, alpha, acc + P V, whether any row's m moved, L_MMA:
        l_acc + P ones)."""
        k_scale = self.key_scales(st, first_key)
        p8 = self.p_source(ctx, st, first_key // self.BN - 1)  # (CAST_LATE: before S's accumulator is allocated, so
        # float32 P never meets it)
        s_tok = warpgroup_mma(q, k_t, gl.zeros([self.BM, self.BN], gl.float32, self.S), use_acc=False, is_async=True)
        l_acc = 0  # (without L_MMA a placeholder: a jit function returns no None)
        if self.L_MMA:  # issued before P V, so that the wait for S (at most one group left) covers it too
            t0, t1, t2, t3 = self.row_sums(p8)
            acc, l_in = self.rescale_late(st)
            o_tok = warpgroup_mma(p8, v, acc, is_async=True)
            if self.PINGPONG < 2:
                self.their_turn(ctx)
            self.stamp(ctx, first_key // self.BN, 1)
            s, l0, l1, l2, l3 = warpgroup_mma_wait(1, deps=(s_tok, t0, t1, t2, t3))  # all but P V are done
            self.stamp(ctx, first_key // self.BN, 2)
            l_acc = l_in + ((l0 + l1) + (l2 + l3))  # float32 (16 adds a thread); times alpha with O
        else:
            acc, l_in = self.rescale_late(st)
            o_tok = warpgroup_mma(p8, v, acc, is_async=True)
            self.their_turn(ctx)
            s = warpgroup_mma_wait(1, deps=(s_tok,))  # S is done; P V may still be running
        m, l, p32, alpha, moved = self.softmax(s, st, first_key, k_scale, ctx, self.PINGPONG >= 2)
        if self.PV_SMEM:  # stored before P V's wait: nothing of the softmax writes a register P V reads
            self.store_p(ctx, p32, first_key // self.BN)
        if self.TRACE:  # (alpha through the stamp's asm: the stamp after the softmax's last values)
            self.stamp(ctx, first_key // self.BN, 3)
        acc = warpgroup_mma_wait(0, deps=(o_tok,))
        self.stamp(ctx, first_key // self.BN, 4)
        return m, l, p32, alpha, acc, moved, l_acc

    @gluon.jit
    def with_p(self, st, p32):
        """The state with P_j for the next step's P V: p_operand's register operand (PV_SMEM: already in its buffer,
        the state as it is)."""
        if not self.PV_SMEM:
            st = st.replace(p=self.p_operand(p32))
        return st

    @gluon.jit
    def compute(self, ctx, st, stage, tile, step):
        if self.PV_SMEM >= 2:
            self.stamp(ctx, step, 0)
            st = self.compute_pipe_smem(ctx, st, stage, tile, step)
        elif self.BN2 > 0 and self.PV_SMEM:
            self.stamp(ctx, step, 0)
            st = self.compute_split_smem(ctx, st, stage, tile, step)
        elif self.BN2 > 0:
            st = self.compute_split(ctx, st, stage, tile, step)
        else:
            self.stamp(ctx, step, 0)
            st = self.compute_one(ctx, st, stage, tile, step)
        return st

    @gluon.jit
    def p_buffer(self, ctx, step):
        """PV_SMEM: the shared buffer of the P made at step ``step`` (two a consumer, alternating: the softmax of step
        j writes one while P_{j-1} V_{j-1} reads the other)."""
        return self.p_smem.index(ctx.index * 2 + step % 2)

    @gluon.jit
    def write_p(self, p32, buf):
        """PV_SMEM: P (float32, the softmax's, [BM, BN or BN2]) rounded to e4m3 and stored to ``buf``, its keys permuted
        within 32s as V's (p_operand's order, 4 consecutive keys of a row a register: STSM)."""
        x = p32
        if self.PERMUTED_V:
            x = gl.reshape(x, [self.BM, p32.shape[1] // 32, 2, 2, 4, 2])
            x = gl.permute(x, (0, 1, 2, 4, 3, 5))
            x = gl.convert_layout(gl.reshape(x, [self.BM, p32.shape[1]]), self.P, assert_trivial=True)
        buf.store(to_e4m3x4(x))

    @gluon.jit
    def store_p(self, ctx, p32, step):
        """PV_SMEM: write_p to the step's buffer, then fenced for the async proxy and a warpgroup barrier: every
        thread's bytes are in place before the wgmma that reads them."""
        self.write_p(p32, self.p_buffer(ctx, step))
        fence_async_shared()
        gl.thread_barrier()

    @gluon.jit
    def row_sum_smem(self, pb):
        """PV_SMEM with L_MMA: row_sum_mma with P's 32-key chunks read from its shared buffer (SS wgmma, each from a
        zero accumulator; K-slices of the buffer: the descriptor's start advanced 32 bytes a chunk)."""
        gl.static_assert(self.BN == 128, "L_MMA: key blocks of 128 (4 chunks of 32)")
        ones_t = self.ones.permute((1, 0))  # [32, LC], keys contiguous: K-major (L_MMA mode 1)
        zero = gl.zeros([self.BM, self.LC], gl.float32, self.L)
        t0 = warpgroup_mma(pb.slice(0, 32, dim=1), ones_t, zero, use_acc=False, is_async=True)
        t1 = warpgroup_mma(pb.slice(32, 32, dim=1), ones_t, zero, use_acc=False, is_async=True)
        t2 = warpgroup_mma(pb.slice(64, 32, dim=1), ones_t, zero, use_acc=False, is_async=True)
        t3 = warpgroup_mma(pb.slice(96, 32, dim=1), ones_t, zero, use_acc=False, is_async=True)
        return t0, t1, t2, t3

    @gluon.jit
    def compute_one(self, ctx, st, stage, tile, step):
        """S_j and P_{j-1} V_{j-1} issued together, the softmax of S_j while P V runs. P V's A operand: P in registers
        (Running.p), or with PV_SMEM (session 31) from shared memory: the softmax of step j stores P_j (e4m3) to this
        consumer's buffer j % 2 and step j + 1's P V reads it there. With the A operand in registers ptxas waits for
        P V before the softmax writes P's registers (its DEPBAR lands after the first row max: notes/attention_fp8);
        from shared memory the only registers in flight are O's, so the wait stays after the softmax and no P is
        carried (64 float32 registers a thread fewer at BN 128). Every branch ends with its wgmma complete, so the
        stage is free when compute returns."""
        q = ctx.operand.reshape([self.BM, self.D])
        k_t = stage.k.reshape([self.BN, self.D]).permute((1, 0))  # [D, BN], D contiguous: K-major
        v = stage.vt.reshape([self.D, self.BN]).permute((1, 0))  # [BN, D], keys contiguous: K-major
        self.my_turn(ctx, step)
        if step == 0:
            k_scale = self.key_scales(st, 0)
            s_tok = warpgroup_mma(q, k_t, gl.zeros([self.BM, self.BN], gl.float32, self.S), use_acc=False,
                                  is_async=True)
            self.their_turn(ctx)
            s = warpgroup_mma_wait(0, deps=(s_tok,))
            m, l, p32, alpha, moved = self.softmax(s, st, 0, k_scale)
            if self.PV_SMEM:
                self.store_p(ctx, p32, 0)
            st = self.with_p(st.replace(m=m, l=l), p32)
            if self.RESCALE_LATE:  # (acc is 0: alpha's 0 or NaN from the first max goes on as the bf16 forward's)
                st = st.replace(alpha=alpha)
        elif step < st.rows.n_blocks:
            m, l, p32, alpha, acc, moved, l_acc = self.s_and_pv(ctx, q, k_t, v, st, step * self.BN)
            if self.RESCALE_LATE:
                st = st.replace(alpha=alpha)
            else:
                acc, l_acc = self.rescale(acc, l_acc, alpha, moved)
            if self.L_MMA:
                st = self.with_p(st.replace(m=m, l=l, acc=acc, l_acc=l_acc), p32)
            else:
                st = self.with_p(st.replace(m=m, l=l, acc=acc), p32)
        elif step == st.rows.n_blocks:  # the step after this consumer's last block: its P V only
            p8 = self.p_source(ctx, st, step - 1)
            if self.L_MMA:
                t0, t1, t2, t3 = self.row_sums(p8)
                acc, l_in = self.rescale_late(st)
                o_tok = warpgroup_mma(p8, v, acc, is_async=True)
                self.their_turn(ctx)
                acc, l0, l1, l2, l3 = warpgroup_mma_wait(0, deps=(o_tok, t0, t1, t2, t3))
                st = st.replace(acc=acc, l_acc=l_in + ((l0 + l1) + (l2 + l3)))
            else:
                acc, l_in = self.rescale_late(st)
                o_tok = warpgroup_mma(p8, v, acc, is_async=True)
                self.their_turn(ctx)
                st = st.replace(acc=warpgroup_mma_wait(0, deps=(o_tok,)))
        else:  # causal: a step past this consumer's keys (the other's rows see more)
            self.their_turn(ctx)
        return st

    @gluon.jit
    def wait(self, ctx, st):
        return st.replace(acc=warpgroup_mma_wait(0, deps=(st.acc,)))

    @gluon.jit
    def finish(self, ctx, st, tile):
        """O = acc * v's descale / l and lse (natural log; l counts 2^8 p) of the rows: lse stored, O by
        a TMA store (rows past N clipped). A row with no key: 0 and -inf; a NaN l: NaN and NaN."""
        if self.PINGPONG:  # consumer 0: the wait its next tile's first step skips (none for a tile with no step)
            if ctx.index == 0 and tile.n_blocks > 0:
                named_barrier(gl.program_id(0) * 0 + PINGPONG_BARRIER, False)
        b, h, hk = head_of(st.rows.bh, self.H, self.GROUP)
        v_scale = gl.load(self.v_scales + b * (self.H // self.GROUP) + hk)
        if self.L_MMA:  # every column holds the row's sum (all NaN where one is: a NaN l stays NaN)
            st = st.replace(l=gl.convert_layout(gl.max(st.l_acc, axis=1), gl.SliceLayout(1, self.S)))
        no_key = st.l < 1.0  # l >= 2^P_SHIFT where a row has a key (its max's term); a NaN l stays NaN
        l_safe = gl.where(no_key, 1.0, st.l)
        out = st.acc * gl.expand_dims(gl.convert_layout(v_scale / l_safe, gl.SliceLayout(1, self.O)), 1)
        lse = gl.where(no_key, float("-inf"), (st.m + gl.log2(l_safe) - self.P_SHIFT) / LOG2E)
        store_rows(lse, self.lse, st.rows.bh, st.rows.first, self.N)
        store_block(out, self.o_desc, ctx.out, [b, h, st.rows.first, 0])


@gluon.jit
def attention_fp8_fwd_kernel(q_desc, k_desc, vt_desc, o_desc, lse_ptr, q_scales, k_scales, v_scales, H, N, Nk, GROUP,
                             scale_log2e, q_n_scales, q_rows_per_scale, k_n_scales, k_rows_per_scale, num_bh,
                             head_group, schedule, CAUSAL: gl.constexpr, Q_PER_ROW: gl.constexpr,
                             K_PER_ROW: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr,
                             Q_BUFFERS: gl.constexpr = 1, PERMUTED_V: gl.constexpr = False,
                             PINGPONG: gl.constexpr = False, K_PER_BLOCK: gl.constexpr = False,
                             EXP2_FMA_EVERY: gl.constexpr = 0, CAST_LATE: gl.constexpr = False,
                             P_SHIFT: gl.constexpr = 8.0, RESCALE_TAU: gl.constexpr = 0.0,
                             L_MMA: gl.constexpr = False, PROBE_NO_SOFTMAX: gl.constexpr = False,
                             MAX_TREE: gl.constexpr = False, RESCALE_LATE: gl.constexpr = False,
                             BN2: gl.constexpr = 0, k2_desc=None, vt2_desc=None, trace=None,
                             TRACE: gl.constexpr = False, PV_SMEM: gl.constexpr = 0,
                             EARLY_EXP2: gl.constexpr = False):
    """O and lse of FP8 attention for every (query block, batch * head); a persistent grid. BN2 > 0: steps of
    BN + BN2 keys, the second blocks by k2_desc [1, 1, BN2, D] and vt2_desc [1, 1, D, BN2] (compute_split)."""
    gl.static_assert(not (RESCALE_LATE and RESCALE_TAU > 0), "RESCALE_LATE or RESCALE_TAU, not both")
    gl.static_assert(BN2 == 0 or ((BN2 == 64 or BN2 == 32 or (BN2 == 128 and PV_SMEM >= 2)) and L_MMA == 1
                                  and (MAX_TREE or PV_SMEM >= 2) and CAST_LATE == 1 and PERMUTED_V and not K_PER_ROW
                                  and not K_PER_BLOCK and RESCALE_TAU == 0 and not RESCALE_LATE and not PROBE_NO_SOFTMAX),
                     "BN2 (split steps): 64 or 32, with L_MMA 1, MAX_TREE, CAST_LATE 1, PERMUTED_V and per-head or per-row q "
                     "descales, per-head k descales")
    gl.static_assert(CONSUMERS == 2 or (CONSUMERS == 3 and not PINGPONG), "two or three consumer warpgroups "
                     "(PINGPONG: two)")
    gl.static_assert(PINGPONG < 2 or (L_MMA and MAX_TREE and RESCALE_TAU == 0 and not PROBE_NO_SOFTMAX and BN2 == 0),
                     "PINGPONG 2 / 3 (the turn passed after the row max / the exponentials): with L_MMA and MAX_TREE")
    BM: gl.constexpr = o_desc.block_type.shape[2]
    BN: gl.constexpr = k_desc.block_type.shape[2]
    D: gl.constexpr = k_desc.block_type.shape[3]
    gl.static_assert(PV_SMEM == 0 or (((PV_SMEM == 1 and (BN2 == 0 or BN2 == 64)) or (PV_SMEM >= 2 and PV_SMEM <= 3 and (BN2 == 128 or BN2 == 64) and L_MMA == 1
                                                                                         and not RESCALE_LATE))
                                      and PERMUTED_V and PINGPONG < 2
                                      and (L_MMA == 0 or L_MMA == 1) and not PROBE_NO_SOFTMAX),
                     "PV_SMEM: 128 or 128 + 64-key steps, PERMUTED_V, L_MMA 0 or 1, not with PINGPONG 2/3 or probes")
    gl.static_assert(not EARLY_EXP2 or (L_MMA == 1 and MAX_TREE and RESCALE_TAU == 0 and EXP2_FMA_EVERY == 0
                                        and not PROBE_NO_SOFTMAX and PINGPONG < 2),
                     "EARLY_EXP2: with L_MMA 1 and MAX_TREE, without RESCALE_TAU, EXP2_FMA_EVERY, probes or PINGPONG 2/3")
    p_smem = gl.constexpr(None)
    p2_smem = gl.constexpr(None)
    if PV_SMEM:  # two P buffers a consumer (PV_SMEM: p_buffer), keys contiguous: the K-major A operand
        p_smem = gl.allocate_shared_memory(gl.float8e4nv, [CONSUMERS * 2, BM, BN],
                                           gl.NVMMASharedLayout.get_default_for([BM, BN], gl.float8e4nv))
        if BN2 > 0 and (PV_SMEM == 1 or BN2 != BN):
            p2_smem = gl.allocate_shared_memory(gl.float8e4nv, [CONSUMERS * 2, BM, BN2],
                                                gl.NVMMASharedLayout.get_default_for([BM, BN2], gl.float8e4nv))
    ones = gl.constexpr(None)  # (a constexpr: nothing passed to the partitions)
    LC: gl.constexpr = 16 if L_MMA == 3 else L_COLS
    if L_MMA:  # e4m3 ones, written once by the kernel's warps before the partitions start
        # as their bytes (0x38 = 1.0 in e4m3), not converted: ptxas 12.8 compiles the float16 constant's conversion
        # (cvt.rn.satfinite.e4m3x2.f16x2 of an immediate, then mov.b32 {h, h}) to one F2FP ... MERGE_C whose high half is
        # another register's: half of each 4 bytes of the block were not ones (session 28, H100: l was half the true l;
        # experiments/attention_fp8/gpu_ones_probe.py: B loaded from memory is read right in every layout)
        ONES_SHAPE: gl.constexpr = ones_shape(L_MMA)
        ones = gl.allocate_shared_memory(gl.float8e4nv, ONES_SHAPE, ones_layout(L_MMA),
                                         gl.full(ONES_SHAPE, E4M3_ONE_BITS, gl.uint8,
                                                 gl.BlockedLayout([1, 4], [8, 4], [gl.num_warps(), 1], [1, 0]))
                                         .to(gl.float8e4nv, bitcast=True))
        fence_async_shared()
    op = AttentionFp8(q_desc, k_desc, vt_desc, o_desc, lse_ptr, q_scales, k_scales, v_scales, H, N, Nk, GROUP,
                      scale_log2e, q_n_scales, q_rows_per_scale, k_n_scales, k_rows_per_scale, num_bh, head_group,
                      CAUSAL, Q_PER_ROW, K_PER_ROW, K_PER_BLOCK, EXP2_FMA_EVERY, CAST_LATE, P_SHIFT, RESCALE_TAU, RESCALE_LATE, L_MMA, ones,
                      LC, MAX_TREE, PROBE_NO_SOFTMAX, BM, BN, D, CONSUMERS, PERMUTED_V, PINGPONG,
                      wgmma_layout(BM, BN, gl.num_warps(), 8), wgmma_layout(BM, D, gl.num_warps(), 8),
                      wgmma_lhs_layout(BM, D, gl.num_warps(), 8), wgmma_layout(BM, LC, gl.num_warps(), 8),
                      wgmma_lhs_layout(BM, LC, gl.num_warps(), 8), BN2, BN + BN2,
                      wgmma_layout(BM, BN2 if BN2 > 0 else BN, gl.num_warps(), 8), k2_desc, vt2_desc, trace, TRACE, PV_SMEM, p_smem, p2_smem, EARLY_EXP2)
    # three consumer warpgroups (13 warps) share the register file more thinly
    layout = Layout(o_desc, STAGES, CONSUMERS=CONSUMERS, CONSUMER_REGS=160 if CONSUMERS == 3 else 232,
                    PRODUCER_REGS=24 if CONSUMERS == 3 else 40, LATE_RELEASE=0,
                    tile_operand=TileOperand(q_desc, BUFFERS=Q_BUFFERS), schedule=schedule)
    if BN2 > 0:
        stages = KVt2(ring(k_desc, STAGES), ring(k2_desc, STAGES), ring(vt_desc, STAGES), ring(vt2_desc, STAGES))
    else:
        stages = KVt(ring(k_desc, STAGES), ring(vt_desc, STAGES))
    run(op, layout, stages, gl.cdiv(N, op.BM * CONSUMERS) * num_bh)
