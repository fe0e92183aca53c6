"""hadamard_quantize (and the plain transform) at the model widths n = m x p with m <= 32 and p = 128..1024 on
Hopper (issue 32): Llama-3-8B / Mistral-7B's 14336 = 28 x 512, Llama-3-70B's 28672 = 28 x 1024; 12 and
20 x 2^k too. A kernel of the tiles template (tilecore.tiles.gluon.pipeline), plan path "gluon_kron" (quantize.py),
off by default (configs.QUANT_GLUON_KRON) until a GPU run checks it.

A row X is m x p; Y = rscale (H_m (x) H_p) x. Write p = 64 F (F = 2..16) and H_p = H_F (x) H_64: sub-row (i, a) of
64 elements (i < m, a < F; the row's memory order) mixes by H_m[i', i] H_F[a, a'], then H_64 along its 64 columns.
The mixing is split as H_F = H_{F/2} (x) H_2 (a = 2 q + l): one [64, 64] block A = H_32 (x) H_2 (H_m zero-padded to
32) holds H_m and the low bit l; a TMA box [1, 32, 2, 64] of the rows seen as (rows, m, F, 64) holds sub-rows
(i, 2q + l) for i < 32 (past m: zeros) and l < 2 as the 64 x 64 operand B_q (sub-row 2 i + l of the box). Then

    W_q = A B_q                      [64, 64] wgmma (A resident, B from the ring), float32 sums of x times +-1
    W'  = H_{F/2} over q             a float32 butterfly across the blocks (elementwise: the same layout)
    Y_q = rscale (hi + lo)(W'_q) H_64    the second product on the bf16 pieces (kernels.py's accuracy design)

and the codes of each block Y_q in registers, in the wgmma accumulator layout (quantize_kernels' FAST arithmetic,
as gluon_quantize_wide.py: the same helpers), staged and TMA-stored as boxes [1, 32, 2, W] (sub-rows past m and rows
past the end clipped), the scales by pointers.

SPLIT (constexpr): 1, a tile is two rows and consumer warpgroup c owns row 2 tile + c, all F / 2 blocks (32 F
float32 registers a thread: F <= 8); 2, a tile is one row and consumer c owns the output blocks q = c F / 4 + v
(the top bit of q equal to c; 16 F registers: F <= 16), mixing both input halves into each, W_v = A B_v +- A B_(v +
F / 4) (the sign by c: -A is resident too), so the mixing runs twice (the products are cheap at m <= 32: K = 64);
then the per-token amax is the maximum of both consumers', exchanged through shared memory on an mbarrier pair.
"""
from triton.experimental import gluon

from tilecore.ops.hadamard.gluon_epilogue import (AMAX, INT4, INT8, MXFP4, NVFP4, STORE, exchange, folded, group_codes,
                                                  pieces,
                                                  relabel, row_amax, token_codes, token_recip)
from tilecore.tiles.gluon import Layout, TileOperand, run, stage_struct, struct, wgmma_layout
from tilecore.tiles.gluon.compat import fence_async_shared, gl, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

BLOCK: gl.constexpr = gl.constexpr(64)  # a block's sub-rows (32 i's x 2 l's), its columns, and the mixing's K
HALF: gl.constexpr = gl.constexpr(32)  # i's a block (H_m zero-padded to 32)


@stage_struct
class Boxes:
    """One ring stage: the tile's rows as [NBS, 32, 2, 64] boxes (NBS = the tile's rows x F / 2)."""
    x: object


@struct
class Blocks:
    """A consumer's row (its blocks: four [64, 64] float32 tensors, the unused ones zeros) and its tile count."""
    y0: object
    y1: object
    y2: object
    y3: object
    t: object


@gluon.constexpr_function
def _parity(v, vp):
    """popcount(v & vp) mod 2: the sign of H_(2^k)[v, vp] (Sylvester), 1 for -1."""
    return bin(int(v) & int(vp)).count("1") & 1


@gluon.jit
def _butterfly(w0, w1, w2, w3, NBLK: gl.constexpr):
    """H_NBLK (Sylvester) across the blocks: block v' = sum_v (-1)^popcount(v & v') w_v, in float32."""
    if NBLK == 2:
        w0, w1 = w0 + w1, w0 - w1
    elif NBLK == 4:
        a0, a1, a2, a3 = w0 + w1, w0 - w1, w2 + w3, w2 - w3
        w0, w1, w2, w3 = a0 + a2, a1 + a3, a0 - a2, a1 - a3
    return w0, w1, w2, w3


@struct
class KronQuantize:
    x_desc: object  # (rows, m, F, 64) x, [1, 32, 2, 64] boxes
    codes_desc: object  # (rows, m, F, W) codes (STORE: (rows, m, F, 64) values), [1, 32, 2, W] boxes
    h_desc: object  # the resident operand: three [64, 64] blocks as bf16 bits (gluon_operand)
    scales: object  # per token: [rows] float32; groups: (rows, n / G) bytes or float32
    gscale: object  # fp8 static / nvfp4: the given (global) scale, one float32
    amax_out: object  # AMAX: [rows x SPLIT] float32 (each consumer's share of its row)
    rows: object
    stride_scales: object
    rscale: object  # 1 / sqrt(n) (the transform: the caller's scale)
    xchg: object  # SPLIT 2: [4, 1] float32 shared (tile parity x consumer), the per-token amax exchange; else None
    xbar: object  # SPLIT 2: two mbarriers (tile parity), both consumers arrive; else None
    M: gl.constexpr
    F: gl.constexpr  # p / 64
    SPLIT: gl.constexpr
    FORMAT: gl.constexpr
    G: gl.constexpr  # group size (0: per token)
    STATIC: gl.constexpr
    QMAX: gl.constexpr
    INSIDE: gl.constexpr  # the butterfly across blocks by the signs of the mixing (each block's own products)
    SCALE_ONCE: gl.constexpr  # groups <= 64: each group's scale computed once (gluon_quantize_wide._scales_once)
    FOLD: gl.constexpr  # quantized formats: rscale folded into the maxima and reciprocals, not multiplied a value
    NOZERO: gl.constexpr  # group formats and STORE: sub-rows past m not zeroed (their scales and codes never stored)
    CLAMP_LO: gl.constexpr  # the second product's lo piece by one max, not a compare and a select (epilogue.pieces)
    PERM: gl.constexpr  # H_64's columns permuted (gluon_operand perm), blocks relabelled (epilogue.relabel)
    STREAM: gl.constexpr  # STORE, four blocks a consumer: the butterfly's top level by the mixing's signs, the blocks
    # rotated and stored from compute two at a time (_compute_stream)
    E2M1_PAIRS: gl.constexpr  # mxfp4 / nvfp4: a column pair's two codes made into one byte (epilogue._e2m1_pair)
    INT_BITS: gl.constexpr  # int8 / int4: codes from the bits of q + 1.5 x 2^23, no cvt.rni (epilogue._int_bits)

    @gluon.jit
    def setup(self, tile):
        return tile, 1  # a tile (two rows, or one with SPLIT 2) is one ring step

    @gluon.jit
    def load(self, stage, bar, tile, step):
        PAIRS: gl.constexpr = self.F // 2
        for r in gl.static_range(3 - self.SPLIT):  # SPLIT 1: two rows; 2: one
            row = (3 - self.SPLIT) * tile + r
            for q in gl.static_range(PAIRS):
                tma.async_copy_global_to_shared(self.x_desc, [row, 0, 2 * q, 0], bar, stage.x.slice(r * PAIRS + q, 1))

    @gluon.jit
    def load_tile(self, bufs, bar, tile, consumer):
        """The resident operand: A = H_32 (x) H_2 (x's dtype, as bf16 bits), -A, H_64 (bf16)."""
        for b in gl.static_range(3):
            tma.async_copy_global_to_shared(self.h_desc, [BLOCK * b, 0], bar, bufs.index(b))

    @gluon.jit
    def start(self, ctx, tile, prev):
        z = gl.zeros([BLOCK, BLOCK], gl.float32, wgmma_layout(BLOCK, BLOCK, gl.num_warps()))
        return Blocks(z, z, z, z, tile * 0)  # t: a run-time int32, as compute's ring step

    @gluon.jit
    def _b(self, stage, k: gl.constexpr):
        NBS: gl.constexpr = stage.x.shape[0]
        return stage.x.reshape([NBS * BLOCK, BLOCK]).slice(k * BLOCK, BLOCK)

    @gluon.jit
    def _block_inside(self, ctx, stage, VP: gl.constexpr, z):
        """INSIDE mixing: output block VP's W' = sum_v (-1)^popcount(v & VP) A B_v (+- the other half's), its
        butterfly taken by the sign of A (-A resident), then its second product: one block's registers at a time."""
        NBLK: gl.constexpr = self.F // (2 * self.SPLIT)
        dt: gl.constexpr = self.x_desc.dtype
        bufs = ctx.operand
        lay: gl.constexpr = bufs.type.layout
        base: gl.constexpr = ctx.index * NBLK if self.SPLIT == 1 else 0
        w = z
        for v in gl.static_range(NBLK):
            w = warpgroup_mma(bufs.index(_parity(v, VP))._reinterpret(dt, [BLOCK, BLOCK], lay),
                              self._b(stage, base + v), w, use_acc=v > 0, is_async=True)
            if self.SPLIT == 2:
                w = warpgroup_mma(bufs.index(_parity(v, VP) ^ ctx.index)._reinterpret(dt, [BLOCK, BLOCK], lay),
                                  self._b(stage, NBLK + v), w, is_async=True)
        w = warpgroup_mma_wait(0, deps=(w,))
        return self._rotated(w, bufs.index(2))

    @gluon.jit
    def _mix_half(self, ctx, stage, t: gl.constexpr, v0: gl.constexpr, z):
        """STREAM: U_(t, v0) = sum_v1 (-1)^(v1 t) A B_(2 v1 + v0) (+- the other half's at SPLIT 2): the butterfly's top
        level (over v1) by the sign of A (-A resident), issued, not waited for."""
        NBLK: gl.constexpr = self.F // (2 * self.SPLIT)
        dt: gl.constexpr = self.x_desc.dtype
        bufs = ctx.operand
        lay: gl.constexpr = bufs.type.layout
        base: gl.constexpr = ctx.index * NBLK if self.SPLIT == 1 else 0
        w = z
        for v1 in gl.static_range(2):  # block v = 2 v1 + v0
            w = warpgroup_mma(bufs.index(_parity(v1, t))._reinterpret(dt, [BLOCK, BLOCK], lay),
                              self._b(stage, base + 2 * v1 + v0), w, use_acc=v1 > 0, is_async=True)
            if self.SPLIT == 2:
                w = warpgroup_mma(bufs.index(_parity(v1, t) ^ ctx.index)._reinterpret(dt, [BLOCK, BLOCK], lay),
                                  self._b(stage, NBLK + 2 * v1 + v0), w, is_async=True)
        return w

    @gluon.jit
    def _compute_stream(self, ctx, state, stage, tile):
        """STREAM (STORE, four blocks a consumer: 28 x 1024): output block v' = 2 t + b is sum_v0 (-1)^(v0 b) U_(t, v0)
        (H_4 = H_2 (x) H_2 over v = 2 v1 + v0); for t = 0, 1: U_(t, 0), U_(t, 1) by the mixing (its signs doing the top
        level: twice the mixing products of the register butterfly, half of INSIDE's), then U_(t, 0) +- U_(t, 1)
        rotated and stored from compute as made. Two blocks live at a time, not four (sm_90a: the spills go)."""
        h64 = ctx.operand.index(2)
        z = state.y0
        row = tile if self.SPLIT == 2 else 2 * tile + ctx.index
        tma.store_wait(0)  # the previous row's stores have read the staging slots
        for t in gl.static_range(2):
            u0 = self._mix_half(ctx, stage, t, 0, z)
            u1 = self._mix_half(ctx, stage, t, 1, z)
            u0, u1 = warpgroup_mma_wait(0, deps=(u0, u1))
            self._stream_out(ctx, 2 * t, self._rotated(u0 + u1, h64), row)
            self._stream_out(ctx, 2 * t + 1, self._rotated(u0 - u1, h64), row)
        return Blocks(z, z, z, z, ctx.ring_step)

    @gluon.jit
    def _stream_out(self, ctx, v: gl.constexpr, y, row):
        """STREAM: block v's values staged in its slot, TMA-stored."""
        NBLK: gl.constexpr = self.F // (2 * self.SPLIT)
        self._stage(ctx, v, y)
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(self.codes_desc, [row, 0, 2 * self._pair(ctx, v, NBLK), 0], ctx.out.slice(v, 1))

    @gluon.jit
    def compute(self, ctx, state, stage, tile, step):
        """This consumer's blocks: the mixing (all issued, then waited for), the butterfly, the second products."""
        NBLK: gl.constexpr = self.F // (2 * self.SPLIT)
        if self.STREAM:
            return self._compute_stream(ctx, state, stage, tile)
        if self.INSIDE:
            z = state.y0
            y0 = self._block_inside(ctx, stage, 0, z)
            y1 = z
            y2 = z
            y3 = z
            if NBLK >= 2:
                y1 = self._block_inside(ctx, stage, 1, z)
            if NBLK >= 4:
                y2 = self._block_inside(ctx, stage, 2, z)
                y3 = self._block_inside(ctx, stage, 3, z)
            return Blocks(y0, y1, y2, y3, ctx.ring_step)
        dt: gl.constexpr = self.x_desc.dtype
        bufs = ctx.operand
        lay: gl.constexpr = bufs.type.layout
        a = bufs.index(0)._reinterpret(dt, [BLOCK, BLOCK], lay)
        h64 = bufs.index(2)
        z = state.y0
        if self.SPLIT == 1:
            base: gl.constexpr = ctx.index * NBLK
            w0 = warpgroup_mma(a, self._b(stage, base), z, use_acc=False, is_async=True)
            w1 = z
            w2 = z
            w3 = z
            if NBLK >= 2:
                w1 = warpgroup_mma(a, self._b(stage, base + 1), z, use_acc=False, is_async=True)
            if NBLK >= 4:
                w2 = warpgroup_mma(a, self._b(stage, base + 2), z, use_acc=False, is_async=True)
                w3 = warpgroup_mma(a, self._b(stage, base + 3), z, use_acc=False, is_async=True)
        else:
            a2 = bufs.index(ctx.index)._reinterpret(dt, [BLOCK, BLOCK], lay)  # consumer 1: -A
            w0 = warpgroup_mma(a, self._b(stage, 0), z, use_acc=False, is_async=True)
            w0 = warpgroup_mma(a2, self._b(stage, NBLK), w0, is_async=True)
            w1 = z
            w2 = z
            w3 = z
            if NBLK >= 2:
                w1 = warpgroup_mma(a, self._b(stage, 1), z, use_acc=False, is_async=True)
                w1 = warpgroup_mma(a2, self._b(stage, NBLK + 1), w1, is_async=True)
            if NBLK >= 4:
                w2 = warpgroup_mma(a, self._b(stage, 2), z, use_acc=False, is_async=True)
                w2 = warpgroup_mma(a2, self._b(stage, NBLK + 2), w2, is_async=True)
                w3 = warpgroup_mma(a, self._b(stage, 3), z, use_acc=False, is_async=True)
                w3 = warpgroup_mma(a2, self._b(stage, NBLK + 3), w3, is_async=True)
        if NBLK == 1:
            w0 = warpgroup_mma_wait(0, deps=(w0,))
        elif NBLK == 2:
            w0, w1 = warpgroup_mma_wait(0, deps=(w0, w1))
        else:
            w0, w1, w2, w3 = warpgroup_mma_wait(0, deps=(w0, w1, w2, w3))
        w0, w1, w2, w3 = _butterfly(w0, w1, w2, w3, NBLK)
        y0 = self._rotated(w0, h64)
        y1 = w1
        y2 = w2
        y3 = w3
        if NBLK >= 2:
            y1 = self._rotated(w1, h64)
        if NBLK >= 4:
            y2 = self._rotated(w2, h64)
            y3 = self._rotated(w3, h64)
        return Blocks(y0, y1, y2, y3, ctx.ring_step)

    @gluon.jit
    def _rotated(self, w, h64):
        """rscale (hi + lo)(W) H_64, sub-rows past m (i >= M) zeroed (there 0 x inf gave NaN)."""
        L: gl.constexpr = w.type.layout
        operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=L, k_width=2)
        hi, lo = pieces(w, self.CLAMP_LO)
        y = warpgroup_mma(gl.convert_layout(hi, operand), h64, gl.zeros_like(w), use_acc=False, is_async=True)
        y = warpgroup_mma(gl.convert_layout(lo, operand), h64, y, is_async=True)
        y = warpgroup_mma_wait(0, deps=(y,))
        if not self.FOLD:  # FOLD: rscale goes into the maxima and the reciprocals instead (once a group, not a value)
            y = y * self.rscale
        if self.M < HALF and not self.NOZERO:
            r = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, L))
            y = gl.where(gl.expand_dims(r // 2, 1) < self.M, y, 0.0)
        return y

    @gluon.jit
    def wait(self, ctx, state):
        return state

    @gluon.jit
    def finish(self, ctx, state, tile):
        NBLK: gl.constexpr = self.F // (2 * self.SPLIT)
        if self.SPLIT == 1:
            row = 2 * tile + ctx.index
        else:
            row = tile
        if self.PERM:  # the outputs' order: a thread's 16 values of a sub-row are consecutive outputs
            ys = (relabel(state.y0), relabel(state.y1), relabel(state.y2), relabel(state.y3))
        else:
            ys = (state.y0, state.y1, state.y2, state.y3)
        if not self.STREAM:  # (STREAM: the row was stored from compute)
            tma.store_wait(0)  # this consumer's previous row's stores have read the staging buffer
        if self.STREAM:
            pass
        elif self.FORMAT == AMAX:
            a = folded(self, row_amax(ys, NBLK))
            if self.SPLIT == 1:
                gl.store(self.amax_out + row, a, mask=row < self.rows)
            else:
                gl.store(self.amax_out + 2 * row + ctx.index, a, mask=row < self.rows)
        elif self.FORMAT == STORE:
            for v in gl.static_range(NBLK):
                self._stage(ctx, v, ys[v])
            self._store(ctx, row, NBLK)
        elif self.G == 0:  # one scale a row
            a = folded(self, row_amax(ys, NBLK))
            if self.SPLIT == 2:
                a = exchange(self, ctx, a, state.t)
            recip = token_recip(self, a, row, ctx.index == 0 or self.SPLIT == 1)
            for v in gl.static_range(NBLK):
                self._stage(ctx, v, token_codes(ys[v] * recip, self.FORMAT, self.INT_BITS))
            self._store(ctx, row, NBLK)
        else:
            for v in gl.static_range(NBLK):
                self._stage(ctx, v, group_codes(self, ys[v], row, self._pair(ctx, v, NBLK), 0))
            self._store(ctx, row, NBLK)

    @gluon.jit
    def _pair(self, ctx, v: gl.constexpr, NBLK: gl.constexpr):
        """The pair index q (sub-rows a = 2 q, 2 q + 1) of this consumer's block v."""
        if self.SPLIT == 1:
            return v
        else:
            return ctx.index * NBLK + v

    @gluon.jit
    def _group_slots(self, SL: gl.constexpr, GR: gl.constexpr, row, q, K1: gl.constexpr):
        """gluon_epilogue.group_codes' scale offsets and mask for the block of pair q, groups of G <= 64 (layout SL,
        GR a sub-row): the block's sub-row r = 2 i + l is the row's sub-row i F + 2 q + l."""
        r = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, SL))
        g = gl.arange(0, GR, layout=gl.SliceLayout(0, SL))
        sub = (r // 2) * self.F + 2 * q + (r % 2)
        offs = gl.expand_dims(sub, 1) * GR + gl.expand_dims(g, 0)
        mask = (gl.expand_dims(r // 2, 1) < self.M) & (row < self.rows)
        return offs, mask

    @gluon.jit
    def _pair_slots(self, SL: gl.constexpr, row, q, K1: gl.constexpr):
        """gluon_epilogue.group_codes' scale offsets and mask for the block of pair q, groups of 128: the sub-row pair
        (i, 2 q), (i, 2 q + 1), adjacent in the block; group i F / 2 + q."""
        i = gl.arange(0, HALF, layout=SL)
        return i * (self.F // 2), q, (i < self.M) & (row < self.rows)

    @gluon.jit
    def _stage(self, ctx, v: gl.constexpr, values):
        """Block v's codes (or values) into the staging buffer, as the box [1, 32, 2, W] they are stored from."""
        W: gl.constexpr = values.shape[1]
        ctx.out.slice(v, 1).store(gl.reshape(values.to(self.codes_desc.dtype), [1, HALF, 2, W]))

    @gluon.jit
    def _store(self, ctx, row, NBLK: gl.constexpr):
        fence_async_shared()
        gl.thread_barrier()
        for v in gl.static_range(NBLK):
            q = self._pair(ctx, v, NBLK)
            tma.async_copy_shared_to_global(self.codes_desc, [row, 0, 2 * q, 0], ctx.out.slice(v, 1))


@gluon.jit
def gluon_kron_quantize_kernel(x_desc, codes_desc, staging_desc, h_desc, scales, gscale, amax_out, rows, stride_scales,
                               rscale, row_counter, M: gl.constexpr, F: gl.constexpr, SPLIT: gl.constexpr,
                               FORMAT: gl.constexpr, G: gl.constexpr, STATIC: gl.constexpr, QMAX: gl.constexpr,
                               STAGES: gl.constexpr, INSIDE: gl.constexpr = False, SCALE_ONCE: gl.constexpr = False,
                               FOLD: gl.constexpr = False, NOZERO: gl.constexpr = False,
                               CLAMP_LO: gl.constexpr = False, PERM: gl.constexpr = False, STREAM: gl.constexpr = False,
                               E2M1_PAIRS: gl.constexpr = False, INT_BITS: gl.constexpr = False):
    """codes, scales = quantize(rscale (H_M (x) H_(64 F)) x) for ``rows`` rows of 64 M F elements (module
    docstring). x_desc: (rows, M, F, 64) with [1, 32, 2, 64] boxes; codes_desc: (rows, M, F, W) bytes (W = 64, or
    32 packed; STORE: x's dtype, W = 64) with [1, 32, 2, W] boxes; staging_desc: the same with [F / (2 SPLIT), 32,
    2, W] boxes (its shape and layout only: a consumer's staging buffer); h_desc: gluon_operand's three [64, 64]
    blocks. ``row_counter``: an int32, zero at launch and left so, from which programs draw tiles."""
    rows = gl.to_tensor(rows)  # a one-row call: Triton passes rows == 1 as a constant; the tile count is a tensor
    if SPLIT == 2:
        xchg = gl.allocate_shared_memory(gl.float32, [4, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        xbar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(xbar.index(0), count=2)
        mbarrier.init(xbar.index(1), count=2)
    else:
        xchg = None
        xbar = None
    gl.static_assert(not STREAM or (FORMAT == STORE and not INSIDE and F // (2 * SPLIT) == 4),
                     "STREAM: STORE, four blocks a consumer, not INSIDE")
    op = KronQuantize(x_desc, codes_desc, h_desc, scales, gscale, amax_out, rows, stride_scales, rscale, xchg, xbar,
                      M, F, SPLIT, FORMAT, G, STATIC, QMAX, INSIDE, SCALE_ONCE, FOLD and FORMAT != STORE,
                      NOZERO and (FORMAT == STORE or (G != 0 and FORMAT != AMAX)), CLAMP_LO, PERM,
                      STREAM, E2M1_PAIRS and (FORMAT == MXFP4 or FORMAT == NVFP4),
                      INT_BITS and (FORMAT == INT8 or FORMAT == INT4))
    layout = Layout(staging_desc, STAGES, CONSUMERS=2, CONSUMER_REGS=240, PRODUCER_REGS=24, LATE_RELEASE=0,
                    tile_operand=TileOperand(h_desc, COUNT=3, RESIDENT=True), tile_counter=row_counter)
    NBS: gl.constexpr = (3 - SPLIT) * (F // 2)  # boxes a stage
    stages = Boxes(gl.allocate_shared_memory(x_desc.dtype, [STAGES, NBS, HALF, 2, BLOCK], x_desc.layout))
    if SPLIT == 1:
        run(op, layout, stages, (rows + 1) // 2)
    else:
        run(op, layout, stages, rows)


# --------------------------------------------------------------------------------------------- host side

def fits(m: int, p: int, split: int) -> bool:
    """Whether gluon_kron_quantize_kernel takes rows of m x p with ``split``: 1 < m <= 32, p = 64 F with a
    consumer's blocks F / (2 split) in 1, 2, 4."""
    return 1 < m <= HALF.value and p % BLOCK.value == 0 and split in (1, 2) \
        and (p // BLOCK.value) // (2 * split) in (1, 2, 4) and (p // BLOCK.value) % (2 * split) == 0


def gluon_operand(m: int, dtype, device, transpose: bool = False, perm: bool = False):
    """The resident operand, [192, 64] as bf16 bits: A = H_m (H_m^T with ``transpose``) zero-padded to 32, (x) H_2
    (row 2 i' + l' is output sub-row (i', l')), in ``dtype`` (x's: the first product's A); then -A; then H_64 in
    bf16 (the second product's B; ``perm``: its columns in gluon_quantize_wide.perm_columns' order)."""
    import torch

    from tilecore.ops.hadamard.reference import hadamard_matrix

    from tilecore.ops.hadamard.gluon_quantize_wide import perm_columns

    key = (m, dtype, str(device), transpose, perm)
    if key not in _OPERANDS:
        a = _operand_a(m, transpose)
        h64 = hadamard_matrix(BLOCK.value, torch.float64)
        blocks = [a.to(dtype).view(torch.bfloat16), (-a).to(dtype).view(torch.bfloat16),
                  (h64[:, perm_columns()] if perm else h64).to(torch.bfloat16).contiguous()]
        _OPERANDS[key] = torch.cat(blocks).contiguous().to(device)
    return _OPERANDS[key]


_OPERANDS = {}


def _layout(block, bits):
    from triton.experimental.gluon import language as gll

    inner = block[-1] * bits // 8
    swizzle = 128 if inner % 128 == 0 else 64 if inner % 64 == 0 else 32 if inner % 32 == 0 else 0
    return gll.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=bits, rank=len(block))


def descriptors(x2, out, m: int, p: int, split: int, packed: bool):
    """(x_desc, codes_desc, staging_desc) for (rows, m p) rows ``x2`` and their codes (or values) ``out``: 4-D views
    (rows, m, F, 64 or 32) with [1, 32, 2, W] boxes (sub-rows past m: zeros on loads, clipped on stores)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    rows = x2.shape[0]
    P, H = BLOCK.value, HALF.value
    F = p // P
    x_desc = TensorDescriptor(x2, [rows, m, F, P], [x2.stride(0), p, P, 1], [1, H, 2, P], _layout([1, H, 2, P], 16))
    w = P // 2 if packed else P
    bits = out.element_size() * 8
    shape, strides = [rows, m, F, w], [out.stride(0), F * w, w, 1]
    codes_desc = TensorDescriptor(out, shape, strides, [1, H, 2, w], _layout([1, H, 2, w], bits))
    nblk = F // (2 * split)
    staging_desc = TensorDescriptor(out, shape, strides, [nblk, H, 2, w], _layout([nblk, H, 2, w], bits))
    return x_desc, codes_desc, staging_desc


def emulate(x, m: int, p: int, split: int, inside: bool, scale: float, transpose: bool = False):
    """The kernel's data flow in float64 torch on the CPU (the tests' check of its index arithmetic, which the
    interpreter cannot run): each row's [1, 32, 2, 64] boxes as the 64 x 64 operands B_q (sub-row 2 i + l), each
    consumer's mixing (the butterfly across blocks in registers, or INSIDE by the signs of A), the second product,
    and the blocks stored back as boxes at pair q. Returns (y, blocks): y (rows, m p) float64 and, for every stored
    block, (row, pair q, its [64, 64] values) in the order the consumers store them."""
    import torch

    from tilecore.ops.hadamard.reference import hadamard_matrix

    rows, n = x.shape
    F = p // BLOCK.value
    H = HALF.value
    a = _operand_a(m, transpose)
    h64 = hadamard_matrix(BLOCK.value, torch.float64)
    nblk = F // (2 * split)
    x4 = torch.zeros(rows, H, F, BLOCK.value, dtype=torch.float64)
    x4[:, :m] = x.double().reshape(rows, m, F, BLOCK.value)
    y4 = torch.zeros_like(x4)
    blocks = []
    for row in range(rows):
        b = [x4[row, :, 2 * q:2 * q + 2, :].reshape(BLOCK.value, BLOCK.value) for q in range(F // 2)]  # B_q
        for c in range(split):  # split 1: one consumer owns the row (its boxes from 0); 2: consumer c, sign (-1)^c
            sign = -1.0 if c == 1 else 1.0
            mixed = []
            for vp in range(nblk):
                if inside:
                    w = sum((-1.0) ** _parity(v, vp) * (a @ b[v]) for v in range(nblk))
                    if split == 2:
                        w = w + sum((-1.0) ** _parity(v, vp) * sign * (a @ b[nblk + v]) for v in range(nblk))
                    mixed.append(w)
                else:
                    w = [a @ b[v] + (sign * (a @ b[nblk + v]) if split == 2 else 0.0) for v in range(nblk)]
                    mixed.append(sum((-1.0) ** _parity(v, vp) * w[v] for v in range(nblk)))
            for v in range(nblk):
                yv = (mixed[v] @ h64) * scale
                q = c * nblk + v if split == 2 else v
                blocks.append((row, q, yv))
                y4[row, :, 2 * q:2 * q + 2, :] = yv.reshape(H, 2, BLOCK.value)
    return y4[:, :m].reshape(rows, n), blocks


def _operand_a(m: int, transpose: bool):
    """A = H_m (or H_m^T) zero-padded to 32, (x) H_2, float64 (gluon_operand's first block). m a power of two: Sylvester's
    H_m, so that H_m (x) H_p is H_(m p) itself (a power-of-two row on this kernel: quantize's "gluon_pow2" plan)."""
    import torch

    from tilecore.ops.hadamard import orders
    from tilecore.ops.hadamard.reference import hadamard_matrix

    h = torch.zeros(HALF.value, HALF.value, dtype=torch.float64)
    hm = hadamard_matrix(m, torch.float64) if m & (m - 1) == 0 else orders.hadamard_of_order(m).to(torch.float64)
    h[:m, :m] = hm.T if transpose else hm
    return torch.kron(h, hadamard_matrix(2, torch.float64))
