"""FP8 (e4m3) attention forward on Hopper: a layout and callbacks on the tiles template
(:mod:`tilecore.tiles.gluon.pipeline`), the structure of the bf16 forward (ops/attention/gluon_kernels.py)
with what FP8 changes. Only what the shipped configs (configs.GLUON_FORWARD) reach is here; the variants that were
tried and left off (ping-pong, FMA-unit exp2, conditional rescaling, split key steps, P V from shared memory,
exponentials before the row max, the timing probes) are in notes/attention_fp8/README.md's decision log, their code
at commit 741bc3b (S ahead at ecb1c8e).

A tile is CONSUMERS x BLOCK_M query rows of one (batch, head); each consumer warpgroup takes BLOCK_M
of them, and its steps walk the key blocks. Per step the producer warp TMA-loads a K block
[BN, D] and a V^T block [D, BN] into one stage: e4m3 wgmma takes both shared operands K-major (the
reduction dimension contiguous), which for P V is the keys, so V comes as V^T (B, Hkv, D, Nk),
keys contiguous and permuted within each 32 (reference.key_position; op.py says who writes it). Rows or keys past
N or Nk arrive as zeros. Step j issues

    S_j = Q K_j^T  and  O += P8_{j-1} V_{j-1}     (two e4m3 wgmma, together; l's chunks P8 x ones before P V)
    m, P_j = online softmax(S_j * descales)       (registers, base 2, the row max as a tree)
    O, l *= alpha                                 (once both are done)

With SERIAL a step's P V comes in that step, after its softmax (no P carried from step to step: 64 float32 registers a
thread fewer), which lets three consumer warpgroups fit in 160 registers a thread (the convenience path's D64: more
warps to hide the softmax's latency, which bounds the step).

FP8's differences from the bf16 forward:
* descales: q's and k's per (batch, head) fold into the base-2 score scale (no extra work); per row
  (per block of rows, or per token), q's are a per-row factor loaded once a tile and k's a per-key
  factor loaded each step (one multiply an element), or one scalar a step per block of BN keys (K_PER_BLOCK);
* P is rounded to e4m3 as 2^8 p (``fp8_softmax_update`` shifts the exponent by 8: p in [0, 256],
  FlashAttention-3's max offset; reference.py), carried in float32 in wgmma's register-operand order (``p_operand``,
  no data moved) and rounded just before its wgmma (``to_e4m3x4``); l sums the rounded P on the tensor cores
  (``row_sum_mma``: P times a block of e4m3 ones), and the epilogue divides by it and multiplies by v's descale.
"""
from triton.experimental import gluon

from tilecore.tiles.gluon.compat import fence_async_shared, gl, tma, warpgroup_mma, warpgroup_mma_wait
from tilecore.tiles.gluon import (LOG2E, Layout, TileOperand, as_column, mask_scores, needs_mask,
                                  online_softmax_start, opaque_int, row_max, run, ring, split_n, stage_struct,
                                  store_block, store_rows, struct, wgmma_layout, wgmma_lhs_layout)
from tilecore.tiles.schedule import head_grouped_tile


@stage_struct
class KVt:
    """One stage: a block of keys [1, 1, BN, D] and the block of values as V^T [1, 1, D, BN]."""
    k: object
    vt: object


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
    return Rows(start_m, bh, gl.cdiv(hi, op.BN))


# float32 -> e4m3 for 4 elements at once, packed in one register in their order (cvt's first operand goes to
# the high byte): what the wgmma register operand holds (4 consecutive k of one row)
E4M3X4_PTX: gl.constexpr = gl.constexpr("{\n\t.reg .b16 lo, hi;\n\t"
                                        "cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n\t"
                                        "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n\t"
                                        "mov.b32 $0, {lo, hi};\n\t}")


# P_LINEAR: x already holds each e4m3 byte b as a float32 y = b * 2^-24 (fp8_softmax_update), which
# float16 represents as the subnormal whose bits are b (round to nearest even; relu: y < 0 gives 0, NaN the canonical
# 0x7fff, whose low byte 0xff is e4m3's NaN); the low bytes of the two float16 halves of each cvt are the e4m3 codes
LINEAR_E4M3X4_PTX: gl.constexpr = gl.constexpr("{\n\t.reg .b32 lo, hi;\n\t"
                                               "cvt.rn.relu.f16x2.f32 lo, $2, $1;\n\t"
                                               "cvt.rn.relu.f16x2.f32 hi, $4, $3;\n\t"
                                               "prmt.b32 $0, lo, hi, 0x6420;\n\t}")
LINEAR_SCALE: gl.constexpr = gl.constexpr(8.0 * 2.0 ** -24)  # y = (8 log2(2^P_SHIFT p) + 56) * 2^-24: b's scale
LINEAR_BIAS: gl.constexpr = gl.constexpr(56.0 * 2.0 ** -24)  # and its offset (e4m3's exponent bias 7, times 8)
LINEAR_LSE_BIAS: gl.constexpr = gl.constexpr(0.05708148)  # reference.LINEAR_LSE_BIAS (log2 of P's mean overestimate)


@gluon.jit
def to_e4m3x4(x, P_LINEAR: gl.constexpr = 0):
    """x (float32) rounded to e4m3 (saturating), 4 elements an inline asm: pairs of cvt packed into one register.
    P_LINEAR: x holds the codes (LINEAR_E4M3X4_PTX)."""
    if P_LINEAR:
        return gl.inline_asm_elementwise(LINEAR_E4M3X4_PTX, "=r,f,f,f,f", [x], dtype=gl.float8e4nv, is_pure=True,
                                         pack=4)
    return gl.inline_asm_elementwise(E4M3X4_PTX, "=r,f,f,f,f", [x], dtype=gl.float8e4nv, is_pure=True, pack=4)


@gluon.jit
def fp8_operand_order(x, layout: gl.constexpr):
    """x [m, n] in a wgmma accumulator's layout relabelled as an e4m3 register operand in ``layout`` without moving
    data: column c = 32 t + 16 j_hi + 8 j_lo + 2 r + e becomes operand index 32 t + 16 j_hi + 4 r + 2 j_lo + e
    (AttentionFp8.p_operand's relabelling; its docstring says why)."""
    y = gl.reshape(x, [x.shape[0], x.shape[1] // 32, 2, 2, 4, 2])
    y = gl.permute(y, (0, 1, 2, 4, 3, 5))
    return gl.convert_layout(gl.reshape(y, [x.shape[0], x.shape[1]]), layout, assert_trivial=True)


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
def fp8_softmax_update(m_i, s, row_scale, PER_ROW: gl.constexpr, P_SHIFT: gl.constexpr = 8.0,
                       P_LINEAR: gl.constexpr = 0):
    """One online-softmax step on raw scores ``s`` [m, 128] with a positive base-2 scale (a scalar, or
    with PER_ROW a [m] vector in s's row slice layout): the new row max m of the scaled scores (row_max_tree),
    P = 2^(s * scale - m + P_SHIFT) in [0, 2^P_SHIFT] (float32; rounded to e4m3 by the caller) and
    alpha = 2^(m_old - m); l is left to the caller (the tensor cores: AttentionFp8.row_sum_mma).
    As tiles.gluon.online_softmax_update: m starts at -inf, the shift is 0 while it is -inf (a masked row
    keeps P = 0); a scaled score that overflows (m = +inf) makes its row NaN in ``finish``, not by a select a step
    (P is 0 or NaN there, l 0 or NaN: finish takes l for NaN where m is +inf).
    P_LINEAR: no exp2 for P; P is e4m3's code b = round(8 x + 56), x = log2(2^P_SHIFT p) (the exponent
    and mantissa bits read as one fixed-point number: 2^x with its mantissa interpolated linearly, up to 6% over and
    4% under, 4% over on average), returned as y = b * 2^-24 before rounding (one FFMA an element, as the exp2's
    argument was), rounded and packed by to_e4m3x4 (reference.py: linear_e4m3). Shipped (configs p_linear 1:
    faster than the exp2 form on the H100, notes/attention_fp8's decision log)."""
    s_max = row_max_tree(s)
    m_new = gl.maximum(m_i, s_max * row_scale)
    if PER_ROW:
        c = gl.expand_dims(row_scale, 1)
    else:
        c = row_scale
    m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)  # (+inf kept: finish makes its row NaN)
    if P_LINEAR:
        gl.static_assert(P_SHIFT <= 8.0, "P_LINEAR: codes up to 8 P_SHIFT + 56 <= 120 (e4m3's 256)")
        p = s * (c * LINEAR_SCALE) - gl.expand_dims((m_ref - P_SHIFT) * LINEAR_SCALE - LINEAR_BIAS, 1)
    else:
        p = gl.exp2(s * c - gl.expand_dims(m_ref - P_SHIFT, 1))
    alpha = gl.exp2(m_i - m_ref)
    return m_new, p, alpha


@gluon.jit
def signed_hadamard_t(signs, D: gl.constexpr, dtype: gl.constexpr, num_warps: gl.constexpr,
                      PERMUTED: gl.constexpr = False):
    """(diag(s) H)^T [D, D] in ``dtype`` (+-1: exact), H Sylvester's Hadamard matrix (H[i, j] = (-1)^popcount(i & j),
    symmetric), s the signs at ``signs`` (float32): element [n, k] = H[n, k] s_k, so that x [m, D] times its transpose
    is x diag(s) H (kernels_tl.signed_hadamard's matrix, stored K-major for wgmma's B). Made in registers (a parity of
    8 bits: D <= 256), nothing loaded but the signs. PERMUTED (Q_REG): row c is row f(c) of that, f the relabelling of
    fp8_operand_order (c = 32 t + 16 j_hi + 8 j_lo + 2 r + e -> 32 t + 16 j_hi + 4 r + 2 j_lo + e), so that the
    rotation's accumulator column c, read as S's register operand index f(c), holds the rotated q's column f(c)."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    n = gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(1, layout)), 1)
    if PERMUTED:
        n = (n >> 4 << 4) | (((n >> 1) & 3) << 2) | (((n >> 3) & 1) << 1) | (n & 1)
    kk = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    bits = n & gl.expand_dims(kk, 0)
    bits = bits ^ (bits >> 4)
    bits = bits ^ (bits >> 2)
    bits = bits ^ (bits >> 1)
    s = gl.load(signs + kk)
    return ((1 - 2 * (bits & 1)).to(gl.float32) * gl.expand_dims(s, 0)).to(dtype)


@struct
class Running:
    """A consumer's online softmax: row max m (base 2), the output accumulator, the last P (float32 in the
    register-operand order, rounded to e4m3 for the next P V), its rows, its rows' base-2 score scale (q's descale x
    softmax scale x log2 e: one value, or per row), l (of 2^8 p) in every column of a [BM, L_COLS] tile in the
    wgmma layout (row_sum_mma's accumulator), and with V_PER_BLOCK the descale of the V block whose P V comes next
    (acc is held in its units) and the next block's (loaded a step ahead; else 1.0, unused)."""
    m: object
    acc: object
    p: object
    rows: object
    q_scale: object
    l_acc: object
    vd: object  # V_PER_BLOCK: the descale of the V block whose P V is next (acc is carried in its units)
    vn: object  # V_PER_BLOCK: the block's after it (loaded a step ahead)
    qr: object  # Q_REG: Q's e4m3 codes as S's register operand (rotate_q_reg; else None)


L_COLS: gl.constexpr = gl.constexpr(8)  # row_sum_mma: P times a [32, 8] block of ones (wgmma's narrowest N)
E4M3_ONE_BITS: gl.constexpr = gl.constexpr(0x38)  # 1.0 in e4m3 (sign 0, exponent 7 = the bias, mantissa 0)
ONES_SHAPE: gl.constexpr = gl.constexpr([L_COLS, 32])  # the ones block [rows, keys], keys contiguous (K-major B)


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
    v_n_scales: object  # V_PER_BLOCK: v's descales a kv head (blocks of BN keys)
    CAUSAL: gl.constexpr
    Q_PER_ROW: gl.constexpr
    K_PER_ROW: gl.constexpr
    K_PER_BLOCK: gl.constexpr  # k's descales per block of BN keys: one scalar a step (a factor of the row scale)
    P_SHIFT: gl.constexpr  # P is rounded to e4m3 as 2^P_SHIFT p (reference.P_SHIFT: 8)
    P_LINEAR: gl.constexpr  # P's e4m3 codes by one FFMA, no exp2 (fp8_softmax_update; configs key p_linear)
    V_PER_BLOCK: gl.constexpr  # v's descales per block of BN keys, folded into O's rescale (v_block_scale)
    Q_ROTATE: gl.constexpr  # q arrives in bf16/fp16 and is rotated and quantized in start (rotate_q)
    Q_REG: gl.constexpr  # Q_ROTATE with the codes kept in registers as S's A operand (rotate_q_reg)
    HIDE_FIRST_KEY: gl.constexpr  # CAUSAL: a tile's first key offset through opaque_int (AttentionFp8.first_key)
    MASK32: gl.constexpr  # the mask as one 32-bit comparison an element (AttentionFp8.mask32)
    SERIAL: gl.constexpr  # a step's P V in that step, after its softmax (serial_step): no P carried between steps
    ones: object  # the ones block (e4m3) in shared memory, ONES_SHAPE (row_sum_mma's B operand)
    rotation: object  # Q_ROTATE: diag(s) H transposed [D, D] in q's dtype, in shared memory (else None)
    Q8: gl.constexpr  # Q_ROTATE: the shared layout of the e4m3 Q written over its bf16 tile operand's buffer
    out_scale: object  # Q_ROTATE: the rotation's 1 / sqrt(D)
    BM: gl.constexpr  # a consumer's query rows
    BN: gl.constexpr  # keys per step
    D: gl.constexpr
    CONSUMERS: gl.constexpr
    S: gl.constexpr  # the layouts of S = Q K^T [BM, BN], of O [BM, D], and of P as P V's register operand
    O: gl.constexpr
    P: gl.constexpr
    L: gl.constexpr  # l's accumulator [BM, L_COLS], and P as its register operand
    PL: gl.constexpr
    R: gl.constexpr  # Q_ROTATE: the rotation's accumulator [BM, D] (a 16-bit wgmma's)

    @gluon.jit
    def setup(self, tile_id):
        """The tile's rows and its steps: a step per key block and one for the last P V (SERIAL: none)."""
        rows = query_tile(self, tile_id, self.BM * self.CONSUMERS)
        if self.SERIAL:
            steps = rows.n_blocks
        else:
            steps = gl.where(rows.n_blocks > 0, rows.n_blocks + 1, 0)
        return rows, steps

    @gluon.jit
    def load(self, stage, bar, tile, step):
        """Step ``step``'s K block and the V^T block of the step before (the first step reloads V block
        0, the last step K block n - 1, unused: a stage's byte count is fixed); SERIAL: the step's own V^T block."""
        b, h, hk = head_of(tile.bh, self.H, self.GROUP)
        k_block = gl.minimum(step, tile.n_blocks - 1)
        if self.SERIAL:
            v_block = step
        else:
            v_block = gl.maximum(step - 1, 0)
        tma.async_copy_global_to_shared(self.k_desc, [b, hk, k_block * self.BN, 0], bar, stage.k)
        tma.async_copy_global_to_shared(self.vt_desc, [b, hk, 0, v_block * self.BN], bar, stage.vt)

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
            n_own = gl.minimum(gl.maximum(gl.cdiv(own_hi, self.BN), 1), tile.n_blocks)
        qr = None
        if self.Q_REG:
            q_scale, qr = self.rotate_q_reg(ctx)
            q_scale = q_scale * self.scale_log2e
        elif self.Q_ROTATE:
            q_scale = self.rotate_q(ctx) * self.scale_log2e
        elif self.Q_PER_ROW:
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
        p = gl.zeros([self.BM, self.BN], gl.float32, self.P)
        l_acc = gl.zeros([self.BM, L_COLS], gl.float32, self.L)
        vd = 1.0
        vn = 1.0
        if self.V_PER_BLOCK:  # (SERIAL: vn is the descale of the block whose P V comes in the step)
            vd = self.v_block_scale(tile.bh, 0)
            vn = self.v_block_scale(tile.bh, 0 if self.SERIAL else 1)
        return Running(m, acc, p, Rows(first, tile.bh, n_own), q_scale, l_acc, vd, vn, qr)

    @gluon.jit
    def rotated_rows(self, ctx):
        """This consumer's Q rows (bf16/fp16, as TMA loaded them; rows past N are 0) times diag(s) H / sqrt(D): one
        [BM, D] x [D, D] wgmma against the rotation in shared memory (exact +-1 in q's dtype; float32 sums). Float32
        [BM, D]. (The split rotation, two half products and a butterfly, was removed: code at c77489fb, verdict in
        notes/attention_fp8.)"""
        x = ctx.operand.reshape([self.BM, self.D])
        tok = warpgroup_mma(x, self.rotation.permute((1, 0)), gl.zeros([self.BM, self.D], gl.float32, self.R),
                            use_acc=False, is_async=True)
        return warpgroup_mma_wait(0, deps=(tok,)) * self.out_scale

    @gluon.jit
    def rotate_q(self, ctx):
        """Q_ROTATE: this consumer's Q rows rotated (rotated_rows) and quantized per row: descale = amax / 448 (1 where
        amax = 0), codes = y * (1 / descale), saturated at +-448 by the conversion (NaN kept), written over the first
        half of the bf16 buffer once the wgmma has read it (q_operand; the next tile's Q loads into the buffer only
        after this tile's wgmma are done). Returns the rows' descales (S's row slice). quantize.rotate_quantize_rows is
        its twin (quantize.rotate_quantize's math, the division by a row's descale replaced by a multiply by its
        reciprocal)."""
        y = self.rotated_rows(ctx)
        amax = gl.max(gl.abs(y), axis=1)
        descale = gl.where(amax > 0, amax / 448.0, 1.0)
        codes = (y * gl.expand_dims(1.0 / descale, 1)).to(gl.float8e4nv)
        gl.thread_barrier()  # the warpgroup's wgmma has read the bf16 rows before any of them is overwritten
        self.q_operand(ctx).store(codes)
        fence_async_shared()
        gl.thread_barrier()  # the warpgroup's stores are in before its S wgmma reads them
        return gl.convert_layout(descale, gl.SliceLayout(1, self.S))

    @gluon.jit
    def rotate_q_reg(self, ctx):
        """Q_REG: rotate_q with the codes kept in registers as S's A operand (no stores, fence or barriers): the
        rotation's columns are permuted (signed_hadamard_t's PERMUTED) so that relabelling the accumulator as the
        e4m3 operand moves no data (fp8_operand_order, as P's for P V). Returns (the rows' descales, the codes)."""
        y = self.rotated_rows(ctx)
        amax = gl.max(gl.abs(y), axis=1)
        descale = gl.where(amax > 0, amax / 448.0, 1.0)
        qa: gl.constexpr = wgmma_lhs_layout(self.BM, self.BN, gl.num_warps(), 8)
        codes = to_e4m3x4(fp8_operand_order(y * gl.expand_dims(1.0 / descale, 1), qa))
        return gl.convert_layout(descale, gl.SliceLayout(1, self.S)), codes

    @gluon.jit
    def q_operand(self, ctx):
        """S's A operand [BM, D] e4m3: the tile operand as loaded, or with Q_ROTATE the codes rotate_q wrote over
        its (bf16) buffer."""
        if self.Q_ROTATE:
            q = ctx.operand._reinterpret(gl.float8e4nv, [self.BM, self.D], self.Q8)
        else:
            q = ctx.operand.reshape([self.BM, self.D])
        return q

    @gluon.jit
    def v_block_scale(self, bh, block):
        """V_PER_BLOCK: the descale of kv head bh's V block ``block`` (of BN keys). acc is carried in the units of
        the block whose P V is next: when step j (1 <= j < n) rescales acc by alpha it also multiplies by
        d_{j-1} / d_j, so that P_j V8_j adds in d_j's units; finish multiplies by the last block's d. One scalar
        load a step, a step ahead (loaded in the step that uses it, ptxas put it in S's accumulator registers and the S
        issue waited for P's conversion: slower, notes/attention_fp8), and a division (2 multiplies a thread folded
        into alpha's). A block past the last reads the last (unused)."""
        b, h, hk = head_of(bh, self.H, self.GROUP)
        bhk = b * (self.H // self.GROUP) + hk
        return gl.load(self.v_scales + bhk.to(gl.int64) * self.v_n_scales + gl.minimum(block, self.v_n_scales - 1))

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
    def softmax(self, s, st, first_key, k_scale):
        """Descale the scores, mask them where needed, one online-softmax step.
        Returns (m, P in float32 (2^P_SHIFT p), alpha (a row vector))."""
        if self.K_PER_ROW:
            s = s * gl.expand_dims(k_scale, 0)
        row_scale = st.q_scale
        if self.K_PER_BLOCK:
            row_scale = row_scale * k_scale
        if needs_mask(st.rows.first, first_key, self.BN, self.N, self.Nk, self.CAUSAL):
            if self.MASK32:
                s = self.mask32(s, st.rows.first, first_key)
            else:
                s = mask_scores(s, self.S, st.rows.first, first_key, self.N, self.Nk, self.CAUSAL, KEY_AXIS=1)
        return fp8_softmax_update(st.m, s, row_scale, self.Q_PER_ROW, self.P_SHIFT, self.P_LINEAR)

    @gluon.jit
    def mask32(self, s, first_query, first_key):
        """MASK32: mask_scores' mask (-inf where a key is past Nk or, causal, after the query's diagonal) as one 32-bit
        comparison an element against its row's last key, min(query + Nk - N, Nk - 1). The key offset goes through
        opaque_int: LLVM widened the step-derived offset to 64 bits (sm_90a: two ISETP a comparison, and the bound by
        Nk a second select an element)."""
        keys = opaque_int(first_key) + gl.arange(0, self.BN, layout=gl.SliceLayout(0, self.S))
        last = self.Nk - 1
        if self.CAUSAL:
            rows = first_query + gl.arange(0, self.BM, layout=gl.SliceLayout(1, self.S))
            last = gl.minimum(rows + (self.Nk - self.N), last)
            ok = gl.expand_dims(keys, 0) <= gl.expand_dims(last, 1)
        else:
            ok = gl.expand_dims(keys <= last, 0)
        return gl.where(ok, s, float("-inf"))

    @gluon.jit
    def p_operand(self, p):
        """P (float32) in the P V register operand's order, its keys permuted within each 32
        (reference.key_position) so that each thread keeps its own values: column c = 32 t + 16 j_hi + 8 j_lo + 2 r + e
        (the accumulator's: lane r of a quad holds e = 0, 1 of every 8) goes to k = 32 t + 16 j_hi + 4 r + 2 j_lo + e
        (the register operand's: lane r holds 4 consecutive k of every 16). P stays float32 here (moved by register
        renaming only) and is rounded just before its wgmma (to_e4m3x4): carried as e4m3 bytes, LLVM unpacked and
        packed them every step (~190 PRMT/LOP3/SHF a step at D 128; notes/attention_fp8)."""
        x = gl.reshape(p, [self.BM, p.shape[1] // 32, 2, 2, 4, 2])
        x = gl.permute(x, (0, 1, 2, 4, 3, 5))
        return gl.convert_layout(gl.reshape(x, [self.BM, p.shape[1]]), self.P, assert_trivial=True)

    @gluon.jit
    def row_sum_mma(self, p8):
        """The rows' sums of P as rounded (the P that multiplies V) over this key block, on the tensor cores:
        each 32-key chunk of the e4m3 P operand times a [32, L_COLS] block of ones, one m64n8k32 wgmma from a zero
        accumulator each (4 issued async, in place of BN / 2 FADD a thread and row); the caller adds the 4 partial
        sums and l in float32 registers. Why chunks: FP8 wgmma adds into its accumulator with a narrow internal
        precision (about 14 bits kept, DeepSeek-V3's finding), which drops the small positive terms once the sum is
        large: l accumulated across key blocks in the tensor cores was off by factors of 2 to 13 on
        the H100 (notes/attention_fp8); 32 terms from zero lose only what is under 2^-13 of the chunk's largest."""
        gl.static_assert(self.BN == 128, "row_sum_mma: key blocks of 128 (4 chunks of 32)")
        ones_t = self.ones.permute((1, 0))  # [32, L_COLS], keys contiguous: K-major
        # the chunk index is K's bits 32 and 64, register bits of the operand layout: the split moves no data
        x = gl.permute(gl.reshape(p8, [self.BM, 2, 2, 32]), (0, 3, 1, 2))
        lo, hi = gl.split(x)
        c0, c1 = gl.split(lo)
        c2, c3 = gl.split(hi)
        zero = gl.zeros([self.BM, L_COLS], gl.float32, self.L)
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
    def s_and_pv(self, q, k_t, v, st, first_key):
        """S = Q K^T, l's chunk sums of the last P and acc + P V issued together, the softmax of S while P V runs.
        Returns (m, P in float32, alpha, acc + P V, l_acc + P ones)."""
        k_scale = self.key_scales(st, first_key)
        p8 = to_e4m3x4(st.p, self.P_LINEAR)  # (before S's accumulator is allocated, so float32 P never meets it)
        s_tok = warpgroup_mma(q, k_t, gl.zeros([self.BM, self.BN], gl.float32, self.S), use_acc=False, is_async=True)
        t0, t1, t2, t3 = self.row_sum_mma(p8)  # issued before P V, so that the wait for S covers them too
        o_tok = warpgroup_mma(p8, v, st.acc, is_async=True)
        s, l0, l1, l2, l3 = warpgroup_mma_wait(1, deps=(s_tok, t0, t1, t2, t3))  # all but P V are done
        l_acc = st.l_acc + ((l0 + l1) + (l2 + l3))  # float32 (16 adds a thread); times alpha with O
        m, p32, alpha = self.softmax(s, st, first_key, k_scale)
        acc = warpgroup_mma_wait(0, deps=(o_tok,))
        return m, p32, alpha, acc, l_acc

    @gluon.jit
    def compute(self, ctx, st, stage, tile, step):
        """S_j and P_{j-1} V_{j-1} issued together, the softmax of S_j while P V runs (ptxas puts P V's wait after the
        first row max: notes/attention_fp8). Every branch ends with its wgmma complete, so the stage is free when
        compute returns."""
        if self.Q_REG:
            q = st.qr
        else:
            q = self.q_operand(ctx)
        k_t = stage.k.reshape([self.BN, self.D]).permute((1, 0))  # [D, BN], D contiguous: K-major
        v = stage.vt.reshape([self.D, self.BN]).permute((1, 0))  # [BN, D], keys contiguous: K-major
        if self.SERIAL:
            if step < st.rows.n_blocks:
                st = self.serial_step(st, q, k_t, v, step)
        elif step == 0:
            k_scale = self.key_scales(st, 0)
            s_tok = warpgroup_mma(q, k_t, gl.zeros([self.BM, self.BN], gl.float32, self.S), use_acc=False,
                                  is_async=True)
            s = warpgroup_mma_wait(0, deps=(s_tok,))
            m, p32, alpha = self.softmax(s, st, self.first_key(), k_scale)
            st = st.replace(m=m, p=self.p_operand(p32))
        elif step < st.rows.n_blocks:
            m, p32, alpha, acc, l_acc = self.s_and_pv(q, k_t, v, st, step * self.BN)
            if self.V_PER_BLOCK:  # acc from the units of block step - 1's descale to block step's (st.vn)
                acc = acc * as_column(alpha * (st.vd / st.vn), self.O)
                st = st.replace(vd=st.vn, vn=self.v_block_scale(st.rows.bh, step + 1))
            else:
                acc = acc * as_column(alpha, self.O)
            l_acc = l_acc * as_column(alpha, self.L)
            st = st.replace(m=m, acc=acc, l_acc=l_acc, p=self.p_operand(p32))
        elif step == st.rows.n_blocks:  # the step after this consumer's last block: its P V only
            p8 = to_e4m3x4(st.p, self.P_LINEAR)
            t0, t1, t2, t3 = self.row_sum_mma(p8)
            o_tok = warpgroup_mma(p8, v, st.acc, is_async=True)
            acc, l0, l1, l2, l3 = warpgroup_mma_wait(0, deps=(o_tok, t0, t1, t2, t3))
            st = st.replace(acc=acc, l_acc=st.l_acc + ((l0 + l1) + (l2 + l3)))
        return st  # (causal: a step past this consumer's keys does nothing; the other's rows see more)

    @gluon.jit
    def serial_step(self, st, q, k_t, v, step):
        """SERIAL: S_step, its softmax, then P_step V_step with l's chunks, every wgmma of the step done within it and
        no P carried to the next (the registers of three consumers: 160 a thread). SERIAL 1: P V into a zero
        accumulator, added to O * alpha (FFMA: the rescale runs under the P V); 2: O rescaled first and P V added in
        place (no second accumulator: D128's registers)."""
        key = step * self.BN
        k_scale = self.key_scales(st, key)
        s_tok = warpgroup_mma(q, k_t, gl.zeros([self.BM, self.BN], gl.float32, self.S), use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s_tok,))
        m, p32, alpha = self.softmax(s, st, key, k_scale)
        p8 = to_e4m3x4(self.p_operand(p32), self.P_LINEAR)
        if self.V_PER_BLOCK:  # acc from block step - 1's descale's units to block step's (st.vn)
            factor = alpha * (st.vd / st.vn)
            st = st.replace(vd=st.vn, vn=self.v_block_scale(st.rows.bh, step + 1))
        else:
            factor = alpha
        t0, t1, t2, t3 = self.row_sum_mma(p8)
        if self.SERIAL == 2:
            o_tok = warpgroup_mma(p8, v, st.acc * as_column(factor, self.O), is_async=True)
            acc, l0, l1, l2, l3 = warpgroup_mma_wait(0, deps=(o_tok, t0, t1, t2, t3))
        else:
            o_tok = warpgroup_mma(p8, v, gl.zeros([self.BM, self.D], gl.float32, self.O), use_acc=False,
                                  is_async=True)
            pv, l0, l1, l2, l3 = warpgroup_mma_wait(0, deps=(o_tok, t0, t1, t2, t3))
            acc = st.acc * as_column(factor, self.O) + pv
        l_acc = st.l_acc * as_column(alpha, self.L) + ((l0 + l1) + (l2 + l3))
        return st.replace(m=m, acc=acc, l_acc=l_acc)

    @gluon.jit
    def first_key(self):
        """A tile's first key (step 0's, 0). With HIDE_FIRST_KEY (causal) through opaque_int, as the bf16 forward's
        first_key: a constant offset makes the causal mask's comparisons depend on the tile alone, and LLVM hoists them
        to the tile's start (62 ISETP, ~190 LOP3 packing predicates, 48 SEL every tile at D128 causal, sm_90a) and
        runs step 0's masking as selects whether the block needs a mask or not."""
        if self.HIDE_FIRST_KEY:
            key = opaque_int(0)
        else:
            key = 0
        return key

    @gluon.jit
    def wait(self, ctx, st):
        return st.replace(acc=warpgroup_mma_wait(0, deps=(st.acc,)))

    @gluon.jit
    def finish(self, ctx, st, tile):
        """O = acc * v's descale / l and lse (natural log; l counts 2^8 p) of the rows: lse stored, O by
        a TMA store (rows past N clipped). A row with no key: 0 and -inf; a NaN l or a max of +inf: NaN and NaN."""
        b, h, hk = head_of(st.rows.bh, self.H, self.GROUP)
        if self.V_PER_BLOCK:  # acc is in the units of the last V block's descale
            v_scale = st.vd
        else:
            v_scale = gl.load(self.v_scales + b * (self.H // self.GROUP) + hk)
        # every column of l_acc holds the row's sum (all NaN where one is: a NaN l stays NaN)
        l = gl.convert_layout(gl.max(st.l_acc, axis=1), gl.SliceLayout(1, self.S))
        l = gl.where(st.m == float("inf"), float("nan"), l)  # a scaled score overflowed (fp8_softmax_update)
        no_key = l < 1.0  # l >= 2^P_SHIFT where a row has a key (its max's term); a NaN l stays NaN
        l_safe = gl.where(no_key, 1.0, l)
        out = st.acc * gl.expand_dims(gl.convert_layout(v_scale / l_safe, gl.SliceLayout(1, self.O)), 1)
        if self.P_LINEAR:  # l of the codes' values, on average 2^LINEAR_LSE_BIAS over the exact P's
            lse = gl.where(no_key, float("-inf"), (st.m + gl.log2(l_safe) - (self.P_SHIFT + LINEAR_LSE_BIAS)) / LOG2E)
        else:
            lse = gl.where(no_key, float("-inf"), (st.m + gl.log2(l_safe) - self.P_SHIFT) / LOG2E)
        store_rows(lse, self.lse, st.rows.bh, st.rows.first, self.N)
        store_block(out, self.o_desc, ctx.out, [b, h, st.rows.first, 0])


@gluon.jit
def attention_fp8_fwd_kernel(q_desc, k_desc, vt_desc, o_desc, lse_ptr, q_scales, k_scales, v_scales, H, N, Nk, GROUP,
                             scale_log2e, q_n_scales, q_rows_per_scale, k_n_scales, k_rows_per_scale, num_bh,
                             head_group, schedule, v_n_scales, CAUSAL: gl.constexpr, Q_PER_ROW: gl.constexpr,
                             K_PER_ROW: gl.constexpr, STAGES: gl.constexpr, CONSUMERS: gl.constexpr,
                             Q_BUFFERS: gl.constexpr = 1, K_PER_BLOCK: gl.constexpr = False,
                             P_SHIFT: gl.constexpr = 8.0, P_LINEAR: gl.constexpr = 0,
                             V_PER_BLOCK: gl.constexpr = False, signs=None, Q_ROTATE: gl.constexpr = False,
                             Q_REG: gl.constexpr = False,
                             HIDE_FIRST_KEY: gl.constexpr = False, MASK32: gl.constexpr = False,
                             SERIAL: gl.constexpr = 0, Q_LAST_BUFFERS: gl.constexpr = 0, WRAP: gl.constexpr = None,
                             wrap_arg=None):
    """O and lse of FP8 attention for every (query block, batch * head); a persistent grid. vt_desc: V^T with its keys
    permuted within each 32 (reference.keys_permuted). Q_ROTATE: q_desc is q in bf16/fp16, rotated by diag(signs) H
    / sqrt(D) and quantized per row inside the kernel (AttentionFp8.rotate_q; q_scales unused); Q_REG: its codes kept
    in registers as S's operand (AttentionFp8.rotate_q_reg). Q_LAST_BUFFERS (0: Q_BUFFERS): the last consumer's Q
    buffers (causal: its rows have the most keys; its next Q loads first, under this tile). WRAP (never set by the
    library's launches): a jit function (op, wrap_arg) -> an op whose callbacks wrap this one's, so that a probe
    instruments this kernel as it is (experiments/attention_fp8/stamps.py: clock stamps of each tile's phases)
    instead of a copy of it."""
    gl.static_assert(CONSUMERS == 2 or (CONSUMERS == 3 and SERIAL > 0), "two consumer warpgroups (three with SERIAL)")
    BM: gl.constexpr = o_desc.block_type.shape[2]
    BN: gl.constexpr = k_desc.block_type.shape[2]
    D: gl.constexpr = k_desc.block_type.shape[3]
    # e4m3 ones, written once by the kernel's warps before the partitions start, as their bytes (0x38 = 1.0 in e4m3),
    # not converted: ptxas 12.8 compiles the float16 constant's conversion (cvt.rn.satfinite.e4m3x2.f16x2 of an
    # immediate, then mov.b32 {h, h}) to one F2FP ... MERGE_C whose high half is another register's: half of each 4
    # bytes of the block were not ones (on the H100 l was half the true l: notes/attention_fp8;
    # experiments/attention_fp8/gpu_ones_probe.py: B loaded from memory is read right in every layout)
    ones = gl.allocate_shared_memory(gl.float8e4nv, ONES_SHAPE,
                                     gl.NVMMASharedLayout.get_default_for(ONES_SHAPE, gl.float8e4nv),
                                     gl.full(ONES_SHAPE, E4M3_ONE_BITS, gl.uint8,
                                             gl.BlockedLayout([1, 4], [8, 4], [gl.num_warps(), 1], [1, 0]))
                                     .to(gl.float8e4nv, bitcast=True))
    if Q_ROTATE:
        gl.static_assert(Q_PER_ROW, "Q_ROTATE: q's descales are per row")
        rotation = gl.allocate_shared_memory(q_desc.dtype, [D, D], gl.NVMMASharedLayout.get_default_for(
            [D, D], q_desc.dtype), signed_hadamard_t(signs, D, q_desc.dtype, gl.num_warps(), Q_REG))
        out_scale = D ** -0.5
    else:
        rotation = None
        out_scale = 1.0
    fence_async_shared()
    op = AttentionFp8(q_desc, k_desc, vt_desc, o_desc, lse_ptr, q_scales, k_scales, v_scales, H, N, Nk, GROUP,
                      scale_log2e, q_n_scales, q_rows_per_scale, k_n_scales, k_rows_per_scale, num_bh, head_group,
                      v_n_scales, CAUSAL, Q_PER_ROW, K_PER_ROW, K_PER_BLOCK, P_SHIFT, P_LINEAR, V_PER_BLOCK,
                      Q_ROTATE, Q_REG, HIDE_FIRST_KEY, MASK32, SERIAL, ones, rotation,
                      gl.NVMMASharedLayout.get_default_for([BM, D], gl.float8e4nv), out_scale, BM, BN, D, CONSUMERS,
                      wgmma_layout(BM, BN, gl.num_warps(), 8), wgmma_layout(BM, D, gl.num_warps(), 8),
                      wgmma_lhs_layout(BM, D, gl.num_warps(), 8), wgmma_layout(BM, L_COLS, gl.num_warps(), 8),
                      wgmma_lhs_layout(BM, L_COLS, gl.num_warps(), 8), wgmma_layout(BM, D, gl.num_warps(), 16))
    if WRAP is not None:
        op = WRAP(op, wrap_arg)
    layout = Layout(o_desc, STAGES, CONSUMERS=CONSUMERS, CONSUMER_REGS=160 if CONSUMERS == 3 else 232,
                    PRODUCER_REGS=24 if CONSUMERS == 3 else 40, LATE_RELEASE=0,
                    tile_operand=TileOperand(q_desc, BUFFERS=Q_BUFFERS, LAST_BUFFERS=Q_LAST_BUFFERS), schedule=schedule)
    run(op, layout, KVt(ring(k_desc, STAGES), ring(vt_desc, STAGES)), gl.cdiv(N, BM * CONSUMERS) * num_bh)
