"""hadamard_quantize at the wide model widths on Hopper (issue 32): rows of n = m x 64 with
128 < m <= 192 (Llama-2-7B's 11008 = 172 x 64; QuaRot's 140, 148, 156 x 64), 16-bit inputs, as a kernel of
the tiles template (tilecore.tiles.gluon.pipeline). The plan path "gluon_wide" (quantize.py); off by default
(configs.QUANT_GLUON_WIDE) until a GPU run checks it.

Why: the tl wide kernel (quantize_wide.py) ran the same products at ~280 effective TFLOPS, 16-44% of copy
at 11008 (notes/hadamard): Triton fetches H_m's chunks from L2 for every row and keeps one
row in flight a program. Here H_m stays in shared memory for the whole program and the rows stream in by TMA.

A row is m sub-rows of 64: X [m, 64], Y = rscale H_m X H_64 (H_m zero-padded to 192 x 192). A tile is two
rows; the producer warp loads each row as three [64, 64] chunks X_k (a 3-D descriptor (rows, m, 64): sub-rows
past m arrive as zeros) and consumer warpgroup c owns row 2 tile + c:

    W_j = sum_k H[j, k] X_k           [64, 64] blocks, j, k < 3: H's nine blocks resident (wgmma A), X's chunks
                                      from the ring (B); float32 sums of 16-bit x times +-1
    Y_j = (hi(W_j) + lo(W_j)) H_64    W_j's two bf16 pieces from registers (A), H_64 resident (B): kernels.py's
                                      accuracy design (the final rounding the only one that matters)

then each block's codes in registers, in the wgmma accumulator layout (a thread holds column pairs 2i, 2i + 1
of two sub-rows): the per-token scale's amax over the three blocks, or each group's inside its sub-row (mxfp4
32, nvfp4 16) or over a sub-row pair (int4's 128); the codes through a staging buffer, one TMA store a block
(descriptor (rows, m, bytes a sub-row): sub-rows past m and rows past the end are clipped), the scales by
pointers. The arithmetic of the codes and scales is quantize_kernels' FAST epilogue (y times the group's
reciprocal; fp8 by cvt.rn.satfinite, ints by cvt.rni, e2m1 by the exponent-made magic number). Shapes:
three [64, 64] float32 accumulators a consumer (96 registers a thread), shared memory 80 KiB resident H,
2 x 24 KiB a ring stage, 2 x 16 KiB staging (8-bit codes).
"""
from triton.experimental import gluon

from tilecore.ops.hadamard.gluon_epilogue import (AMAX, INT4, INT8, MXFP4, NVFP4, STORE, _amax, _group_scale, _int_bits,
                                                  _max_nan, _pack, _rni,
                                                  exchange, folded, group_codes, pieces, relabel, row_amax, token_codes,
                                                  token_recip)
from tilecore.tiles.gluon import Layout, TileOperand, ring, run, stage_struct, struct, wgmma_layout
from tilecore.tiles.gluon.compat import fence_async_shared, gl, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

BLOCK: gl.constexpr = gl.constexpr(64)  # a block's sub-rows, a K chunk's, and P
NB: gl.constexpr = gl.constexpr(3)  # blocks (and K chunks) a row: 128 < m <= 192


@stage_struct
class RowPair:
    """One ring stage: the tile's two rows, each as its three [1, 64, 64] chunks of sub-rows."""
    a0: object
    a1: object
    a2: object
    b0: object
    b1: object
    b2: object


@stage_struct
class RowJoint:
    """JOINT's ring stage: HALVES 2, the tile's row as its three [1, 64, 128] chunks of sub-rows (both column halves);
    HALVES 1, the tile's two rows as three [2, 64, 64] chunks (row a's chunk k, then row b's: 128-byte lines in the
    order of a [64, 128] tile's two 64-column swizzle atoms, so one buffer is both rows' N = 128 operand)."""
    a0: object
    a1: object
    a2: object


@struct
class Mixed:
    """A consumer's row: its three [64, 64] float32 blocks (start: zeros; after compute: Y_j, rotated and scaled)."""
    w0: object
    w1: object
    w2: object
    t: object  # HALVES 2: the consumer's tile count (the amax exchange's parity); else 0


@struct
class Quad:
    """UNITS (HALVES 2): a consumer's output blocks (J, h) of its row units, in staging order: consumer 0 (J 0, h 0),
    (0, 1), (1, 0), (1, 1); consumer 1 (2, 0), (2, 1) and two unused zeros; the tile count (the amax exchange's
    parity)."""
    y0: object
    y1: object
    y2: object
    y3: object
    t: object


@struct
class WideQuantize:
    x_desc: object  # (rows, m, 64) x, [1, 64, 64] boxes
    codes_desc: object  # (rows, m, bytes a sub-row) codes (STORE: (rows, m, 64) values), [1, 64, W] boxes
    h_desc: object  # the resident operand: ten [64, 64] blocks as bf16 bits (gluon_operand)
    scales: object  # the scales (per token: [rows] float32; groups: (rows, n / G) bytes or float32)
    gscale: object  # fp8 static / nvfp4: the given (global) scale, one float32
    amax_out: object  # AMAX: [rows] float32
    rows: object
    stride_scales: object
    rscale: object  # 1 / sqrt(n)
    M: gl.constexpr
    FORMAT: gl.constexpr
    G: gl.constexpr  # group size (0: per token)
    STATIC: gl.constexpr  # fp8 with a given scale
    QMAX: gl.constexpr
    PROBE: gl.constexpr  # experiments only (0 ships): 1, no products (Y_j = the row's chunk j as loaded, times rscale)
    HALVES: gl.constexpr  # 2: rows of m x 128 (18944 = 148 x 128), a tile one row, consumer c its output columns 64 c..
    xchg: object  # HALVES 2: [4, 1] float32 shared (tile parity x consumer), the per-token amax exchange; else None
    xbar: object  # HALVES 2: two mbarriers (tile parity), both consumers arrive; else None
    xrows: object  # HALVES 2 with groups of 128: [12, 64] float32 shared (parity x consumer x block), else None
    SCALE_ONCE: gl.constexpr  # groups <= 64: each group's scale computed once (_scales_once), not on its whole quad
    KTRIM: gl.constexpr  # the last K chunk of the mixing cut at the 16-multiple past m (_product)
    FOLD: gl.constexpr  # quantized formats: rscale folded into the maxima and reciprocals, not multiplied a value
    UNITS: gl.constexpr  # HALVES 2: consumer 0 the output sub-row blocks J 0, 1 of both halves, consumer 1 J 2 (_unit)
    NOZERO: gl.constexpr  # group formats and STORE: sub-rows past m not zeroed (their scales and codes never stored)
    CLAMP_LO: gl.constexpr  # the second product's lo piece by one max, not a compare and a select (epilogue.pieces)
    STORE2: gl.constexpr  # UNITS STORE: two staging slots a consumer (two ring stages fit), consumer 0's J 0 in compute
    PERM: gl.constexpr  # H_64's columns permuted (gluon_operand perm), blocks relabelled (epilogue.relabel): HALVES 1;
    # HALVES 2 with UNITS for groups of <= 64 (the codes made in _unit from relabelled blocks)
    STREAM: gl.constexpr  # HALVES 1 STORE: each block stored from compute as made, two staging slots (two stages fit)
    E2M1_PAIRS: gl.constexpr  # mxfp4 / nvfp4: a column pair's two codes made into one byte (epilogue._e2m1_pair)
    INT_BITS: gl.constexpr  # int8 / int4: codes from the bits of q + 1.5 x 2^23, no cvt.rni (epilogue._int_bits)
    BALANCE: gl.constexpr  # UNITS: consumer c the unit J = c and block 2's column half c (three blocks each, not 4 / 2;
    # block 2's mixing made by both): groups of 16 / 32 (inside a half) and their AMAX pass
    JOINT: gl.constexpr  # UNITS: both column halves' mixing as one N = 128 product (a chunk a [1, 64, 128] box): H's
    # block read once for both halves, half the wgmma instructions; W_J0 and W_J1 split from its accumulator. HALVES 1
    # (group formats): the tile's two rows' mixing as one N = 128 product (a chunk a [2, 64, 64] box), its six output
    # blocks (J, row) split 3 : 3 (_compute_pair); AMAX exchanges both rows' maxima

    @gluon.jit
    def setup(self, tile):
        return tile, 1  # a tile is two rows, one ring step

    @gluon.jit
    def load(self, stage, bar, tile, step):
        if self.JOINT:  # HALVES 2: the row's three chunks, both column halves each; HALVES 1: both rows' chunks
            jbufs = (stage.a0, stage.a1, stage.a2)
            for k in gl.static_range(NB):
                tma.async_copy_global_to_shared(self.x_desc, [(3 - self.HALVES) * tile, BLOCK * k, 0], bar, jbufs[k])
        else:
            for r in gl.static_range(2):
                if r == 0:
                    bufs = (stage.a0, stage.a1, stage.a2)
                else:
                    bufs = (stage.b0, stage.b1, stage.b2)
                for k in gl.static_range(NB):
                    if self.HALVES == 2:  # the tile's row, column half r (a: columns 0..63, b: 64..127)
                        tma.async_copy_global_to_shared(self.x_desc, [tile, BLOCK * k, BLOCK * r], bar, bufs[k])
                    else:
                        tma.async_copy_global_to_shared(self.x_desc, [2 * tile + r, BLOCK * k, 0], bar, bufs[k])

    @gluon.jit
    def load_tile(self, bufs, bar, tile, consumer):
        """The resident operand: H_m's nine [64, 64] blocks (j, k) at 3 j + k (x's dtype, as bf16 bits), H_64 in bf16."""
        for b in gl.static_range(NB * NB + 1):
            tma.async_copy_global_to_shared(self.h_desc, [BLOCK * b, 0], bar, bufs.index(b))

    @gluon.jit
    def start(self, ctx, tile, prev):
        z = gl.zeros([BLOCK, BLOCK], gl.float32, wgmma_layout(BLOCK, BLOCK, gl.num_warps()))
        if self.UNITS:
            if self.PERM:  # the held codes are made from relabelled blocks (_unit): the state's zeros in their layout
                zo = self._held(relabel(z))
            else:
                zo = self._held(z)
            return Quad(zo, zo, zo, zo, tile * 0)
        elif self.JOINT:  # HALVES 1: three held blocks, in _pair_out's form (packed codes; AMAX float32)
            if self.PERM:
                zo = self._held(relabel(z))
            else:
                zo = self._held(z)
            return Mixed(zo, zo, zo, tile * 0)
        elif self.HALVES == 2:
            return Mixed(z, z, z, tile * 0)
        else:
            return Mixed(z, z, z, 0)

    @gluon.jit
    def compute(self, ctx, state, stage, tile, step):
        """This consumer's row: W_j = sum_k H[j, k] X_k, then Y_j from it, block by block (so that at most one
        W_j is live beside the finished Y's); the stage is released after. UNITS: _compute_units."""
        if self.UNITS:
            out = self._compute_units(ctx, state, stage, tile)
        elif self.JOINT:
            out = self._compute_pair(ctx, stage, tile)
        else:
            out = self._compute_rows(ctx, state, stage, tile)
        return out

    @gluon.jit
    def _compute_pair(self, ctx, stage, tile):
        """JOINT at HALVES 1: the tile's rows a = 2 tile, b = 2 tile + 1 as one N = 128 operand; consumer c makes output
        block J = 2 c of both rows (one [64, 128] mixing: H's blocks read once for both) and block 1 of row a + c (a
        [64, 64] mixing): three blocks each, (J, a), (J, b), (1, a + c), held in _pair_out's form."""
        h64 = ctx.operand.index(NB * NB)
        dt: gl.constexpr = self.x_desc.dtype
        JL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        xj = (stage.a0._reinterpret(dt, [BLOCK, 2 * BLOCK], JL), stage.a1._reinterpret(dt, [BLOCK, 2 * BLOCK], JL),
              stage.a2._reinterpret(dt, [BLOCK, 2 * BLOCK], JL))
        xs = (stage.a0.reshape([2 * BLOCK, BLOCK]).slice(BLOCK * ctx.index, BLOCK, 0),  # row a + c's chunks
              stage.a1.reshape([2 * BLOCK, BLOCK]).slice(BLOCK * ctx.index, BLOCK, 0),
              stage.a2.reshape([2 * BLOCK, BLOCK]).slice(BLOCK * ctx.index, BLOCK, 0))
        JN: gl.constexpr = 2 * ctx.index
        w = gl.zeros([BLOCK, 2 * BLOCK], gl.float32, wgmma_layout(BLOCK, 2 * BLOCK, gl.num_warps()))
        for k in gl.static_range(NB):
            w = self._product(ctx, JN, k, xj[k], w, k > 0)
        v = gl.zeros([BLOCK, BLOCK], gl.float32, wgmma_layout(BLOCK, BLOCK, gl.num_warps()))
        for k in gl.static_range(NB):
            v = self._product(ctx, 1, k, xs[k], v, k > 0)
        w, v = warpgroup_mma_wait(0, deps=(w, v))
        wa, wb = gl.split(gl.permute(gl.reshape(w, [BLOCK, 2, BLOCK]), [0, 2, 1]))
        wa = gl.convert_layout(wa, v.type.layout)  # (the same registers: a thread's columns 8 j + 2 q + b, j < 8)
        wb = gl.convert_layout(wb, v.type.layout)
        y0 = self._pair_out(self._rotated(wa, h64, JN), 2 * tile, JN)
        y1 = self._pair_out(self._rotated(wb, h64, JN), 2 * tile + 1, JN)
        y2 = self._pair_out(self._rotated(v, h64, 1), 2 * tile + ctx.index, 1)
        return Mixed(y0, y1, y2, ctx.ring_step)

    @gluon.jit
    def _pair_out(self, y, row, J: gl.constexpr):
        """JOINT at HALVES 1: a finished block (J, row) in the form held until finish: relabelled (PERM), then the
        group format's codes (its scales stored now); AMAX: float32 for the row's maximum."""
        y = self._ordered(y)
        if self.FORMAT != AMAX:
            y = group_codes(self, y, row, J, 0)
        return y

    @gluon.jit
    def _held(self, y):
        """UNITS: the form a finished block is held in until finish: STORE's output values and the group formats'
        packed codes are made in compute (_unit: 16 registers a block, not 32), the per-token formats' and AMAX's
        float32 blocks wait for the row's maximum."""
        if self.FORMAT == STORE:
            out = y.to(self.codes_desc.dtype)
        elif self.G != 0 and self.FORMAT != AMAX:
            out = _pack(y.to(gl.int32), BLOCK, BLOCK)
        else:
            out = y
        return out

    @gluon.jit
    def _compute_units(self, ctx, state, stage, row):
        """UNITS: each output block once, consumer 0 J = 0, 1, consumer 1 J = 2, both column halves each."""
        h64 = ctx.operand.index(NB * NB)
        z = gl.zeros([BLOCK, BLOCK], gl.float32, wgmma_layout(BLOCK, BLOCK, gl.num_warps()))
        if ctx.index == 0 and self.STORE2:  # unit 0's values staged and stored under unit 1's products
            u0, u1 = self._unit(ctx, stage, z, h64, 0, row)
            tma.store_wait(0)  # the previous row's stores have read the staging buffer
            self._stage(ctx, 0, u0)
            self._stage(ctx, 1, u1)
            self._store_pair(ctx, row, 0)
            u0, u1 = self._unit(ctx, stage, z, h64, 1, row)  # the pair finish stores (J = 1)
            u2 = state.y2
            u3 = state.y3
        elif self.BALANCE:  # consumer c: the unit J = c (both halves), then block 2's column half c
            u0, u1 = self._unit(ctx, stage, z, h64, ctx.index, row)
            u2 = self._half_unit(ctx, stage, z, h64, 2, row, ctx.index)
            u3 = state.y3
        elif ctx.index == 0:
            u0, u1 = self._unit(ctx, stage, z, h64, 0, row)
            u2, u3 = self._unit(ctx, stage, z, h64, 1, row)
        else:
            u0, u1 = self._unit(ctx, stage, z, h64, 2, row)
            u2 = state.y2
            u3 = state.y3
        return Quad(u0, u1, u2, u3, ctx.ring_step)

    @gluon.jit
    def _compute_rows(self, ctx, state, stage, tile):
        if ctx.index == 0:
            xs = (stage.a0.reshape([BLOCK, BLOCK]), stage.a1.reshape([BLOCK, BLOCK]), stage.a2.reshape([BLOCK, BLOCK]))
        else:
            xs = (stage.b0.reshape([BLOCK, BLOCK]), stage.b1.reshape([BLOCK, BLOCK]), stage.b2.reshape([BLOCK, BLOCK]))
        h64 = ctx.operand.index(NB * NB)
        if self.HALVES == 2:  # block J: both halves' mixing, then W = W_0 +- W_1 (H_2 of H_128 = H_2 (x) H_64; - for c 1)
            y0 = self._halves(ctx, stage, state.w0, h64, 0)
            y1 = self._halves(ctx, stage, state.w1, h64, 1)
            y2 = self._halves(ctx, stage, state.w2, h64, 2)
        elif self.PROBE == 1:  # what the loads, the epilogue and the stores cost without the products
            L: gl.constexpr = state.w0.type.layout
            y0 = self._scaled(xs[0].load(L).to(gl.float32), 0)
            y1 = self._scaled(xs[1].load(L).to(gl.float32), 1)
            y2 = self._scaled(xs[2].load(L).to(gl.float32), 2)
        elif self.STREAM:  # the values stored block by block as made; nothing held for finish
            self._stream(ctx, self._rotated(self._mixed(ctx, xs, state.w0, 0), h64, 0), tile, 0)
            self._stream(ctx, self._rotated(self._mixed(ctx, xs, state.w1, 1), h64, 1), tile, 1)
            self._stream(ctx, self._rotated(self._mixed(ctx, xs, state.w2, 2), h64, 2), tile, 2)
            y0 = state.w0
            y1 = state.w1
            y2 = state.w2
        else:
            y0 = self._rotated(self._mixed(ctx, xs, state.w0, 0), h64, 0)
            y1 = self._rotated(self._mixed(ctx, xs, state.w1, 1), h64, 1)
            y2 = self._rotated(self._mixed(ctx, xs, state.w2, 2), h64, 2)
        if self.HALVES == 2:
            return Mixed(y0, y1, y2, ctx.ring_step)
        else:
            return Mixed(y0, y1, y2, 0)

    @gluon.jit
    def _stream(self, ctx, y, tile, J: gl.constexpr):
        """STREAM (HALVES 1, STORE): block J's values stored as soon as made, through two staging slots
        (blocks 0 and 2 slot 0, block 1 slot 1): three slots a consumer with two ring stages would pass shared memory
        (80 KiB resident + 2 x 48 ring + 2 x 24) and a staging buffer's block count is a power of two; four (the
        default) fit one stage only. Block 0 waits for the previous row's stores to have read both slots, block 2 for
        block 0's (block 1's may still run)."""
        if J == 0:
            tma.store_wait(0)
        elif J == NB - 1:
            tma.store_wait(1)
        self._stage(ctx, J % 2, y)
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(self.codes_desc, [2 * tile + ctx.index, BLOCK * J, 0], ctx.out.slice(J % 2, 1))

    @gluon.jit
    def _halves(self, ctx, stage, z, h64, J: gl.constexpr):
        """HALVES 2: Y_J of this consumer's column half c: (W_J0 + (-1)^c W_J1) through the second product, where W_Jh =
        sum_k H[J, k] X_kh (X_kh: the row's chunk k of column half h; both issued, then waited for)."""
        bufs = ctx.operand
        dt: gl.constexpr = self.x_desc.dtype
        lay: gl.constexpr = bufs.type.layout
        xa = (stage.a0.reshape([BLOCK, BLOCK]), stage.a1.reshape([BLOCK, BLOCK]), stage.a2.reshape([BLOCK, BLOCK]))
        xb = (stage.b0.reshape([BLOCK, BLOCK]), stage.b1.reshape([BLOCK, BLOCK]), stage.b2.reshape([BLOCK, BLOCK]))
        # one accumulator: consumer 0 sums both halves' products; consumer 1 negates W_J0 in registers before adding
        # W_J1's, then negates the sum: W_J0 - W_J1 (negation is exact)
        w = z
        for k in gl.static_range(NB):
            w = self._product(ctx, J, k, xa[k], w, k > 0)
        if ctx.index == 1:
            w = -warpgroup_mma_wait(0, deps=(w,))
        for k in gl.static_range(NB):
            w = self._product(ctx, J, k, xb[k], w, True)
        w = warpgroup_mma_wait(0, deps=(w,))
        if ctx.index == 1:
            w = -w
        return self._rotated(w, h64, J)

    @gluon.jit
    def _unit(self, ctx, stage, z, h64, J: gl.constexpr, row):
        """UNITS: output block J of both column halves, each mixing product once: W_Jh = sum_k H[J, k] X_kh (both
        chains issued, then waited for), then Y_J0 = (W_J0 + W_J1) H_64 and Y_J1 = (W_J0 - W_J1) H_64 (H_128 =
        H_2 (x) H_64) on the bf16 pieces, rscale and the sub-rows past m as _rotated."""
        wa, wb = self._unit_mix(ctx, stage, z, J)
        d = wa - wb
        y0 = self._rotated(wa + wb, h64, J)
        if self.FORMAT == STORE:  # the output values now: the final rounding (half the registers held)
            y0 = y0.to(self.codes_desc.dtype)
        elif self.G != 0 and self.FORMAT != AMAX and self.G <= BLOCK:  # the codes now (scales stored), packed bytes held
            y0 = group_codes(self, self._ordered(y0), row, J, 0)
        y1 = self._rotated(d, h64, J)
        if self.FORMAT == STORE:
            y1 = y1.to(self.codes_desc.dtype)
        elif self.G != 0 and self.FORMAT != AMAX and self.G <= BLOCK:
            y1 = group_codes(self, self._ordered(y1), row, J, 1)
        elif self.G != 0 and self.FORMAT != AMAX:  # int4's groups of 128: a sub-row, both of its halves here
            y0, y1 = self._subrow_pair(y0, y1, J, row)
        return y0, y1

    @gluon.jit
    def _half_unit(self, ctx, stage, z, h64, J: gl.constexpr, row, h: gl.constexpr):
        """BALANCE: output block J's column half h alone: both halves' mixing (_unit_mix), then Y_Jh = (W_J0 +- W_J1)
        H_64, in _held's form (group codes made now)."""
        wa, wb = self._unit_mix(ctx, stage, z, J)
        if h == 0:
            y = self._rotated(wa + wb, h64, J)
        else:
            y = self._rotated(wa - wb, h64, J)
        if self.FORMAT == STORE:
            y = y.to(self.codes_desc.dtype)
        elif self.G != 0 and self.FORMAT != AMAX:
            y = group_codes(self, self._ordered(y), row, J, h)
        return y

    @gluon.jit
    def _unit_mix(self, ctx, stage, z, J: gl.constexpr):
        """UNITS: W_J0, W_J1, block J's mixing of both column halves (JOINT: one N = 128 product, split)."""
        if self.JOINT:  # one [64, 128] accumulator: columns 0..63 are W_J0's, 64..127 W_J1's
            xj = (stage.a0.reshape([BLOCK, 2 * BLOCK]), stage.a1.reshape([BLOCK, 2 * BLOCK]),
                  stage.a2.reshape([BLOCK, 2 * BLOCK]))
            w = gl.zeros([BLOCK, 2 * BLOCK], gl.float32, wgmma_layout(BLOCK, 2 * BLOCK, gl.num_warps()))
            for k in gl.static_range(NB):
                w = self._product(ctx, J, k, xj[k], w, k > 0)
            w = warpgroup_mma_wait(0, deps=(w,))
            wa, wb = gl.split(gl.permute(gl.reshape(w, [BLOCK, 2, BLOCK]), [0, 2, 1]))
            wa = gl.convert_layout(wa, z.type.layout)  # (the same registers: a thread's columns 8 j + 2 q + b, j < 8)
            wb = gl.convert_layout(wb, z.type.layout)
        else:
            xa = (stage.a0.reshape([BLOCK, BLOCK]), stage.a1.reshape([BLOCK, BLOCK]), stage.a2.reshape([BLOCK, BLOCK]))
            xb = (stage.b0.reshape([BLOCK, BLOCK]), stage.b1.reshape([BLOCK, BLOCK]), stage.b2.reshape([BLOCK, BLOCK]))
            wa = z
            wb = z
            for k in gl.static_range(NB):
                wa = self._product(ctx, J, k, xa[k], wa, k > 0)
            for k in gl.static_range(NB):
                wb = self._product(ctx, J, k, xb[k], wb, k > 0)
            wa, wb = warpgroup_mma_wait(0, deps=(wa, wb))
        return wa, wb

    @gluon.jit
    def _ordered(self, y):
        """PERM: a block of the column-permuted second product relabelled into the outputs' order (a thread's 16 values
        of a sub-row consecutive outputs: a group of 16 one thread's, of 32 two threads'); else the block."""
        if self.PERM:
            y = relabel(y)
        return y

    @gluon.jit
    def _subrow_pair(self, y0, y1, J: gl.constexpr, row):
        """UNITS, groups of 128 (int4): block J's sub-row scales from both halves' maxima (stored), and the two
        halves' codes (packed bytes as int32)."""
        ga = folded(self, _max_nan(_amax(y0, 1), _amax(y1, 1)))
        recip, stored, keep = _group_scale(ga, self.gscale, self.FORMAT, self.QMAX, self.INT_BITS)  # [64]
        recip = gl.expand_dims(folded(self, recip), 1)
        i = gl.arange(0, BLOCK, layout=stored.type.layout) + J * BLOCK
        gl.store(self.scales + row.to(gl.int64) * self.stride_scales + i, stored.to(self.scales.dtype.element_ty),
                 mask=(i < self.M) & (row < self.rows))
        keep = gl.expand_dims(keep, 1)
        if self.INT_BITS:
            return (_pack(gl.where(keep, _int_bits(y0 * recip), 0), BLOCK, BLOCK),
                    _pack(gl.where(keep, _int_bits(y1 * recip), 0), BLOCK, BLOCK))
        return (_pack(gl.where(keep, _rni(y0 * recip), 0), BLOCK, BLOCK),
                _pack(gl.where(keep, _rni(y1 * recip), 0), BLOCK, BLOCK))

    @gluon.jit
    def _product(self, ctx, J: gl.constexpr, k: gl.constexpr, x, w, use_acc: gl.constexpr):
        """w (+)= H[J, k] X_k issued (not waited for); with KTRIM the last chunk's K stops at the 16-multiple past m
        (172: 48 of 64, 148: 32: the padded sub-rows' zeros are not multiplied)."""
        bufs = ctx.operand
        dt: gl.constexpr = self.x_desc.dtype
        lay: gl.constexpr = bufs.type.layout
        a = bufs.index(NB * J + k)._reinterpret(dt, [BLOCK, BLOCK], lay)
        KL: gl.constexpr = (self.M - (NB - 1) * BLOCK + 15) // 16 * 16
        if self.KTRIM and k == NB - 1 and KL < BLOCK:
            if KL == 48:  # slices of power-of-two sizes: 32, then 16
                w = warpgroup_mma(a.slice(0, 32, 1), x.slice(0, 32, 0), w, use_acc=use_acc, is_async=True)
                return warpgroup_mma(a.slice(32, 16, 1), x.slice(32, 16, 0), w, is_async=True)
            else:
                return warpgroup_mma(a.slice(0, KL, 1), x.slice(0, KL, 0), w, use_acc=use_acc, is_async=True)
        else:
            return warpgroup_mma(a, x, w, use_acc=use_acc, is_async=True)

    @gluon.jit
    def _mixed(self, ctx, xs, w, J: gl.constexpr):
        """W_J = sum_k H[J, k] X_k (float32, exact products of 16-bit x and +-1)."""
        bufs = ctx.operand
        dt: gl.constexpr = self.x_desc.dtype
        lay: gl.constexpr = bufs.type.layout
        for k in gl.static_range(NB):
            w = self._product(ctx, J, k, xs[k], w, k > 0)
        return warpgroup_mma_wait(0, deps=(w,))

    @gluon.jit
    def wait(self, ctx, state):
        return state

    @gluon.jit
    def finish(self, ctx, state, tile):
        if self.UNITS:
            self._finish_units(ctx, state, tile)
        elif self.JOINT:
            self._finish_pair(ctx, state, tile)
        else:
            self._finish_rows(ctx, state, tile)

    @gluon.jit
    def _finish_pair(self, ctx, state, tile):
        """JOINT at HALVES 1 (group formats): consumer c's blocks (J, a), (J, b), (1, a + c) (J = 2 c), their codes made in
        compute, staged and stored; AMAX (nvfp4's pass): each row's maximum the larger of the two consumers' (one exchange
        of both rows' a tile), consumer 0 storing row a's, consumer 1 row b's."""
        ra = 2 * tile
        tma.store_wait(0)  # this consumer's previous tile's stores have read the staging buffer
        if self.FORMAT == AMAX:
            a0 = row_amax((state.w0,), 1)
            a1 = row_amax((state.w1,), 1)
            if ctx.index == 0:
                a0 = _max_nan(a0, row_amax((state.w2,), 1))
            else:
                a1 = _max_nan(a1, row_amax((state.w2,), 1))
            a0, a1 = self._exchange_pair(ctx, folded(self, a0), folded(self, a1), state.t)
            if ctx.index == 0:
                gl.store(self.amax_out + ra, a0, mask=ra < self.rows)
            else:
                gl.store(self.amax_out + ra + 1, a1, mask=ra + 1 < self.rows)
        else:
            self._stage(ctx, 0, state.w0)
            self._stage(ctx, 1, state.w1)
            self._stage(ctx, 2, state.w2)
            self._store_pair_rows(ctx, ra)

    @gluon.jit
    def _exchange_pair(self, ctx, a0, a1, t):
        """JOINT at HALVES 1: both rows' maxima maxed with the other consumer's (NaN if either is), through the tile
        parity's slots of op.xchg ([8, 1]: parity x consumer x row) and the barrier pair of the per-token exchange."""
        L1: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        slot = t & 1
        mine = 4 * slot + 2 * ctx.index
        other = 4 * slot + 2 - 2 * ctx.index
        self.xchg.index(mine).store(gl.full([1], a0, gl.float32, L1))
        self.xchg.index(mine + 1).store(gl.full([1], a1, gl.float32, L1))
        gl.thread_barrier()  # both stores before the arrive (one thread of the partition arrives)
        mbarrier.arrive(self.xbar.index(slot))
        mbarrier.wait(self.xbar.index(slot), (t >> 1) & 1)
        b0 = gl.reduce(self.xchg.index(other).load(L1), 0, _max_nan)
        b1 = gl.reduce(self.xchg.index(other + 1).load(L1), 0, _max_nan)
        return _max_nan(a0, b0), _max_nan(a1, b1)

    @gluon.jit
    def _store_pair_rows(self, ctx, ra):
        """JOINT at HALVES 1: the staged blocks (J, a), (J, b), (1, a + c) stored (rows past the end clipped)."""
        fence_async_shared()
        gl.thread_barrier()
        JN: gl.constexpr = 2 * ctx.index
        tma.async_copy_shared_to_global(self.codes_desc, [ra, BLOCK * JN, 0], ctx.out.slice(0, 1))
        tma.async_copy_shared_to_global(self.codes_desc, [ra + 1, BLOCK * JN, 0], ctx.out.slice(1, 1))
        tma.async_copy_shared_to_global(self.codes_desc, [ra + ctx.index, BLOCK, 0], ctx.out.slice(2, 1))

    @gluon.jit
    def _finish_units(self, ctx, state, row):
        """UNITS: this consumer's blocks (j: J = 2 c + j // 2, column half h = j % 2; consumer 0 four, 1 two; BALANCE:
        three each, (J c, half 0), (J c, half 1), (J 2, half c))."""
        NU: gl.constexpr = 3 if self.BALANCE else 4 - 2 * ctx.index
        ys = (state.y0, state.y1, state.y2, state.y3)
        tma.store_wait(0)  # this consumer's previous row's stores have read the staging buffer
        if self.FORMAT == AMAX:  # each consumer's share of the row: amax_out[2 row + c]
            a = folded(self, row_amax(ys, NU))
            gl.store(self.amax_out + 2 * row + ctx.index, a, mask=row < self.rows)
        elif self.FORMAT == STORE and self.STORE2:  # one pair left: J = 1 (consumer 0; J = 0 went in compute) or 2
            self._stage(ctx, 0, ys[0])
            self._stage(ctx, 1, ys[1])
            self._store_pair(ctx, row, 1 + ctx.index)
        elif self.FORMAT == STORE:
            for j in gl.static_range(NU):
                self._stage(ctx, j, ys[j])
            self._store_units(ctx, row, NU)
        elif self.G == 0:  # one scale a row: the maximum of both consumers'
            a = exchange(self, ctx, folded(self, row_amax(ys, NU)), state.t)
            recip = token_recip(self, a, row, ctx.index == 0)
            for j in gl.static_range(NU):
                self._stage(ctx, j, token_codes(ys[j] * recip, self.FORMAT, self.INT_BITS))
            self._store_units(ctx, row, NU)
        else:  # group formats: the codes made in compute (_unit), held packed
            for j in gl.static_range(NU):
                self._stage(ctx, j, ys[j])
            self._store_units(ctx, row, NU)

    @gluon.jit
    def _store_pair(self, ctx, row, J: gl.constexpr):
        """STORE2: the two staged blocks (slots 0, 1: block J's column halves) stored."""
        fence_async_shared()
        gl.thread_barrier()
        W: gl.constexpr = self.codes_desc.block_type.shape[2]
        tma.async_copy_shared_to_global(self.codes_desc, [row, BLOCK * J, 0], ctx.out.slice(0, 1))
        tma.async_copy_shared_to_global(self.codes_desc, [row, BLOCK * J, W], ctx.out.slice(1, 1))

    @gluon.jit
    def _store_units(self, ctx, row, NU: gl.constexpr):
        fence_async_shared()
        gl.thread_barrier()
        W: gl.constexpr = self.codes_desc.block_type.shape[2]
        for j in gl.static_range(NU):
            if self.BALANCE:  # j = 0, 1: (J c, half j); j = 2: (J 2, half c)
                if j < 2:
                    tma.async_copy_shared_to_global(self.codes_desc, [row, BLOCK * ctx.index, W * j],
                                                    ctx.out.slice(j, 1))
                else:
                    tma.async_copy_shared_to_global(self.codes_desc, [row, BLOCK * 2, W * ctx.index],
                                                    ctx.out.slice(j, 1))
            else:
                tma.async_copy_shared_to_global(self.codes_desc, [row, BLOCK * (2 * ctx.index + j // 2), W * (j % 2)],
                                                ctx.out.slice(j, 1))

    @gluon.jit
    def _finish_rows(self, ctx, state, tile):
        if self.HALVES == 2:
            row = tile
        else:
            row = 2 * tile + ctx.index
        y0 = state.w0
        y1 = state.w1
        y2 = state.w2
        if self.PERM:  # the outputs' order: a thread's 16 values of a sub-row are consecutive outputs
            y0 = relabel(y0)
            y1 = relabel(y1)
            y2 = relabel(y2)
        if not self.STREAM:  # (STREAM: the row was stored from compute)
            tma.store_wait(0)  # this consumer's previous row's stores have read the staging buffer
        if self.STREAM:
            pass
        elif self.FORMAT == AMAX:
            a = folded(self, row_amax((y0, y1, y2), NB))
            if self.HALVES == 2:
                gl.store(self.amax_out + 2 * row + ctx.index, a, mask=row < self.rows)
            else:
                gl.store(self.amax_out + row, a, mask=row < self.rows)
        elif self.FORMAT == STORE:
            self._stage(ctx, 0, y0)
            self._stage(ctx, 1, y1)
            self._stage(ctx, 2, y2)
            self._store(ctx, row)
        elif self.G == 0:  # one scale a row
            a = folded(self, row_amax((y0, y1, y2), NB))
            if self.HALVES == 2:
                a = exchange(self, ctx, a, state.t)
            recip = token_recip(self, a, row, self.HALVES == 1 or ctx.index == 0)
            self._stage(ctx, 0, token_codes(y0 * recip, self.FORMAT, self.INT_BITS))
            self._stage(ctx, 1, token_codes(y1 * recip, self.FORMAT, self.INT_BITS))
            self._stage(ctx, 2, token_codes(y2 * recip, self.FORMAT, self.INT_BITS))
            self._store(ctx, row)
        elif self.HALVES == 2 and self.G == 2 * BLOCK:  # int4's groups of 128: a sub-row, both consumers' halves
            g0, g1, g2 = self._exchange_rows(ctx, folded(self, _amax(y0, 1)), folded(self, _amax(y1, 1)),
                                             folded(self, _amax(y2, 1)), state.t)
            self._stage(ctx, 0, self._subrow_codes(ctx, y0, g0, 0, row))
            self._stage(ctx, 1, self._subrow_codes(ctx, y1, g1, 1, row))
            self._stage(ctx, 2, self._subrow_codes(ctx, y2, g2, 2, row))
            self._store(ctx, row)
        else:
            self._stage(ctx, 0, group_codes(self, y0, row, 0, ctx.index))
            self._stage(ctx, 1, group_codes(self, y1, row, 1, ctx.index))
            self._stage(ctx, 2, group_codes(self, y2, row, 2, ctx.index))
            self._store(ctx, row)

    @gluon.jit
    def _exchange_rows(self, ctx, a0, a1, a2, t):
        """HALVES 2, groups of 128 (a sub-row of 128 = both consumers' halves): each block's [64] sub-row maxima
        maxed with the other consumer's (NaN if either is), through the tile parity's rows of ``xrows`` and the
        barrier pair that the per-token exchange uses (the two never run in one kernel)."""
        slot = t & 1
        base = 6 * slot + 3 * ctx.index
        other = 6 * slot + 3 * (1 - ctx.index)
        self.xrows.index(base).store(a0)
        self.xrows.index(base + 1).store(a1)
        self.xrows.index(base + 2).store(a2)
        gl.thread_barrier()  # every warp's stores before the arrive (one thread of the partition arrives)
        mbarrier.arrive(self.xbar.index(slot))
        mbarrier.wait(self.xbar.index(slot), (t >> 1) & 1)
        L: gl.constexpr = a0.type.layout
        b0 = self.xrows.index(other).load(L)
        b1 = self.xrows.index(other + 1).load(L)
        b2 = self.xrows.index(other + 2).load(L)
        return _max_nan(a0, b0), _max_nan(a1, b1), _max_nan(a2, b2)

    @gluon.jit
    def _subrow_codes(self, ctx, y, ga, J: gl.constexpr, row):
        """HALVES 2, groups of 128: block J's codes (packed bytes as int32) from its sub-rows' maxima ``ga`` (both
        halves'); the scales (one a sub-row) stored by consumer 0."""
        L: gl.constexpr = y.type.layout
        recip, stored, keep = _group_scale(ga, self.gscale, self.FORMAT, self.QMAX, self.INT_BITS)  # [64]
        recip = folded(self, recip)
        SL: gl.constexpr = recip.type.layout
        i = gl.arange(0, BLOCK, layout=SL) + J * BLOCK
        if ctx.index == 0:
            gl.store(self.scales + row.to(gl.int64) * self.stride_scales + i, stored.to(self.scales.dtype.element_ty),
                     mask=(i < self.M) & (row < self.rows))
        q = y * gl.expand_dims(recip, 1)
        code = _int_bits(q) if self.INT_BITS else _rni(q)
        code = gl.where(gl.expand_dims(keep, 1), code, 0)
        return _pack(code, BLOCK, BLOCK)

    @gluon.jit
    def _rotated(self, w, h64, J: gl.constexpr):
        """Y_j = rscale (hi + lo) H_64 from W_j, sub-rows past m zeroed (there 0 x inf gave NaN)."""
        acc_layout: gl.constexpr = w.type.layout
        operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        hi, lo = pieces(w, self.CLAMP_LO)
        y = warpgroup_mma(gl.convert_layout(hi, operand), h64, gl.zeros_like(w), use_acc=False, is_async=True)
        y = warpgroup_mma(gl.convert_layout(lo, operand), h64, y, is_async=True)
        return self._scaled(warpgroup_mma_wait(0, deps=(y,)), J)

    @gluon.jit
    def _scaled(self, y, J: gl.constexpr):
        """rscale Y_J, sub-rows past m zeroed."""
        acc_layout: gl.constexpr = y.type.layout
        if not self.FOLD:  # FOLD: rscale goes into the maxima and the reciprocals instead (once a group, not a value)
            y = y * self.rscale
        if (J + 1) * BLOCK > self.M and not self.NOZERO:
            i = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, acc_layout)) + J * BLOCK
            y = gl.where(gl.expand_dims(i, 1) < self.M, y, 0.0)
        return y

    @gluon.jit
    def _group_slots(self, SL: gl.constexpr, GR: gl.constexpr, row, J: gl.constexpr, C: gl.constexpr):
        """gluon_epilogue.group_codes' scale offsets and mask for block J's groups of G <= 64 (layout SL, GR a sub-row):
        sub-row i = 64 J + r; HALVES 2: sub-row i holds 128 values, groups 2 GR a sub-row, column half C's from C GR."""
        i = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, SL)) + J * BLOCK
        g = gl.arange(0, GR, layout=gl.SliceLayout(0, SL))
        if self.HALVES == 2:
            offs = gl.expand_dims(i, 1) * (2 * GR) + C * GR + gl.expand_dims(g, 0)
        else:
            offs = gl.expand_dims(i, 1) * GR + gl.expand_dims(g, 0)
        mask = (gl.expand_dims(i, 1) < self.M) & (row < self.rows)
        return offs, mask

    @gluon.jit
    def _pair_slots(self, SL: gl.constexpr, row, J: gl.constexpr, C: gl.constexpr):
        """gluon_epilogue.group_codes' scale offsets and mask for block J's groups of SPG sub-rows (int4's 128: a
        sub-row pair): group i = 64 J / SPG + r."""
        gl.static_assert(self.HALVES == 1, "HALVES 2: groups inside a consumer's 64 columns")
        SPG: gl.constexpr = self.G // BLOCK
        i = (gl.arange(0, BLOCK // SPG, layout=SL) + J * (BLOCK // SPG))
        return i, 0, (i * SPG < self.M) & (row < self.rows)

    @gluon.jit
    def _stage(self, ctx, J: gl.constexpr, values):
        """Block J's codes (or values) into the staging buffer."""
        ctx.out.slice(J, 1).store(gl.reshape(values.to(self.codes_desc.dtype), [1] + values.shape))

    @gluon.jit
    def _store(self, ctx, row):
        fence_async_shared()
        gl.thread_barrier()
        W: gl.constexpr = self.codes_desc.block_type.shape[2]
        for j in gl.static_range(NB):
            if self.HALVES == 2:  # this consumer's columns of the row's sub-rows of 128
                tma.async_copy_shared_to_global(self.codes_desc, [row, BLOCK * j, W * ctx.index], ctx.out.slice(j, 1))
            else:
                tma.async_copy_shared_to_global(self.codes_desc, [row, BLOCK * j, 0], ctx.out.slice(j, 1))


@gluon.jit
def gluon_wide_quantize_kernel(x_desc, codes_desc, staging_desc, h_desc, scales, gscale, amax_out, rows, stride_scales,
                               rscale, row_counter, M: gl.constexpr, FORMAT: gl.constexpr, G: gl.constexpr,
                               STATIC: gl.constexpr, QMAX: gl.constexpr, STAGES: gl.constexpr,
                               PROBE: gl.constexpr = 0,
                               HALVES: gl.constexpr = 1, SCALE_ONCE: gl.constexpr = False, KTRIM: gl.constexpr = False,
                               FOLD: gl.constexpr = False, UNITS: gl.constexpr = False, NOZERO: gl.constexpr = False,
                               CLAMP_LO: gl.constexpr = False, STORE2: gl.constexpr = False,
                               PERM: gl.constexpr = False, STREAM: gl.constexpr = False,
                               E2M1_PAIRS: gl.constexpr = False, INT_BITS: gl.constexpr = False,
                               JOINT: gl.constexpr = False, BALANCE: gl.constexpr = False):
    """codes, scales = quantize(rscale (H_M (x) H_64) x) for ``rows`` rows of 64 M elements (module docstring).
    x_desc: (rows, M, 64) with [1, 64, 64] boxes; codes_desc: (rows, M, W) bytes (W = 64, or 32 packed; STORE: x's
    dtype, W = 64) with [1, 64, W] boxes; staging_desc: the same with [4, 64, W] boxes (only its shape and layout
    are used: a consumer's staging buffer); h_desc: gluon_operand's ten [64, 64] blocks. ``row_counter``: an int32,
    zero at launch and left so, from which programs draw row pairs. JOINT (UNITS): x_desc's boxes [1, 64, 128]."""
    rows = gl.to_tensor(rows)  # a one-row call: Triton passes rows == 1 as a constant; the tile count is a tensor
    if HALVES == 2 or JOINT:  # the per-token amax exchange between the consumers sharing a row (JOINT HALVES 1: two)
        xchg = gl.allocate_shared_memory(gl.float32, [4 * (3 - HALVES), 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        xbar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(xbar.index(0), count=2)
        mbarrier.init(xbar.index(1), count=2)
    else:
        xchg = None
        xbar = None
    gl.static_assert(not UNITS or (HALVES == 2 and PROBE == 0), "UNITS: HALVES 2 alone")
    gl.static_assert(not STREAM or (HALVES == 1 and FORMAT == STORE and PROBE == 0),
                     "STREAM: HALVES 1 STORE alone")
    # PERM: HALVES 1, or UNITS' group formats with groups inside a sub-row (their codes made and held in _unit); the
    # AMAX pass of such a plan (nvfp4's dynamic global scale) takes the permuted operand but needs no relabelling:
    # a block's largest |y| is the same in any column order
    gl.static_assert(not PERM or HALVES == 1 or (UNITS and ((G != 0 and G <= BLOCK) or FORMAT == AMAX) and FORMAT != STORE),
                     "PERM: HALVES 1 (m x 64), or UNITS with groups of <= 64")
    if HALVES == 2 and G == 128 and not UNITS:  # the sub-rows' maxima exchanged (int4's groups of 128 span both halves)
        xrows = gl.allocate_shared_memory(gl.float32, [12, 64], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    else:
        xrows = None
    op = WideQuantize(x_desc, codes_desc, h_desc, scales, gscale, amax_out, rows, stride_scales, rscale, M, FORMAT, G,
                      STATIC, QMAX, PROBE, HALVES, xchg, xbar, xrows, SCALE_ONCE, KTRIM,
                      FOLD and FORMAT != STORE, UNITS,
                      NOZERO and (FORMAT == STORE or (G != 0 and FORMAT != AMAX)), CLAMP_LO,
                      STORE2 and UNITS and FORMAT == STORE, PERM and (HALVES == 1 or FORMAT != AMAX), STREAM,
                      E2M1_PAIRS and (FORMAT == MXFP4 or FORMAT == NVFP4),
                      INT_BITS and (FORMAT == INT8 or FORMAT == INT4), BALANCE, JOINT and (UNITS or HALVES == 1))
    # BALANCE: the groups inside a column half (per token it ran 0.91-0.94x: block 2's mixing twice; int4's groups span both)
    gl.static_assert(not BALANCE or (UNITS and (G == 16 or G == 32 or FORMAT == AMAX)),
                     "BALANCE: UNITS, groups of 16 / 32 (and AMAX)")
    # JOINT at HALVES 1: the group formats and their AMAX pass (per token it ran 0.91-0.93x: the exchange of both rows'
    # maxima; STORE: not timed)
    gl.static_assert(not JOINT or UNITS or (HALVES == 1 and PROBE == 0 and FORMAT != STORE and (G != 0 or FORMAT == AMAX)),
                     "JOINT: UNITS, or HALVES 1 for the group formats (and AMAX)")
    layout = Layout(staging_desc, STAGES, CONSUMERS=2, CONSUMER_REGS=240, PRODUCER_REGS=24, LATE_RELEASE=0,
                    tile_operand=TileOperand(h_desc, COUNT=NB * NB + 1, RESIDENT=True), tile_counter=row_counter)
    if JOINT:
        stages = RowJoint(ring(x_desc, STAGES), ring(x_desc, STAGES), ring(x_desc, STAGES))
    else:
        stages = RowPair(ring(x_desc, STAGES), ring(x_desc, STAGES), ring(x_desc, STAGES), ring(x_desc, STAGES),
                         ring(x_desc, STAGES), ring(x_desc, STAGES))
    if HALVES == 2:
        run(op, layout, stages, rows)
    else:
        run(op, layout, stages, (rows + 1) // 2)


# --------------------------------------------------------------------------------------------- host side

def fits(n: int, m: int, p: int) -> bool:
    """Whether gluon_wide_quantize_kernel takes rows of n = m p: p = 64 (HALVES 1) or 128 (HALVES 2: 18944 = 148 x
    128) and 128 < m <= 192 (three blocks)."""
    return p in (BLOCK.value, 2 * BLOCK.value) and NB.value * BLOCK.value - BLOCK.value < m <= NB.value * BLOCK.value \
        and n == m * p


def perm_columns():
    """PERM's column order of H_64 (a list: column c of the permuted matrix is H_64's column perm[c]): c = 8 j + 2 q + b
    -> 16 q + 2 j + b (the wgmma accumulator's thread q = lane mod 4 holds columns 8 j + 2 q + b)."""
    return [16 * ((c % 8) // 2) + 2 * (c // 8) + c % 2 for c in range(BLOCK.value)]


def gluon_operand(m: int, dtype, device, transpose: bool = False, perm: bool = False):
    """The resident operand, [640, 64] as bf16 bits: H_m zero-padded to 192 x 192 as nine [64, 64] blocks (j, k)
    at rows 64 (3 j + k), in ``dtype`` (x's: the first product's A), then H_64 in bf16 (the second product's B;
    ``perm``: its columns in perm_columns' order)."""
    import torch

    from tilecore.ops.hadamard import orders
    from tilecore.ops.hadamard.reference import hadamard_matrix

    key = (m, dtype, str(device), transpose, perm)
    if key not in _OPERANDS:
        size = NB.value * BLOCK.value
        h = torch.zeros(size, size, dtype=torch.float64)
        hm = orders.hadamard_of_order(m).to(torch.float64)
        h[:m, :m] = hm.T if transpose else hm  # H_m^T: the transform's backward
        blocks = [h[BLOCK.value * j:BLOCK.value * (j + 1), BLOCK.value * k:BLOCK.value * (k + 1)].to(dtype).view(torch.bfloat16)
                  for j in range(NB.value) for k in range(NB.value)]
        h64 = hadamard_matrix(BLOCK.value, torch.float64)
        blocks.append((h64[:, perm_columns()] if perm else h64).to(torch.bfloat16).contiguous())
        _OPERANDS[key] = torch.cat(blocks).contiguous().to(device)
    return _OPERANDS[key]


_OPERANDS = {}


def _layout(block, bits):
    from triton.experimental.gluon import language as gll

    inner = block[-1] * bits // 8
    swizzle = 128 if inner % 128 == 0 else 64 if inner % 64 == 0 else 32 if inner % 32 == 0 else 0
    return gll.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=bits, rank=len(block))


def descriptors(x2, out, m: int, packed: bool, halves: int = 1, slots: int = 4, joint: bool = False):
    """(x_desc, codes_desc, staging_desc) for (rows, m 64 halves) rows ``x2`` and their codes (or values) ``out``:
    3-D views (rows, m, 64 halves, or 32 halves packed) with [1, 64, W] boxes (W = 64 or 32: a consumer's columns;
    sub-rows past m: zeros on loads, clipped on stores); the staging buffer ``slots`` blocks (STORE2: 2). ``joint``
    (JOINT): x's boxes [1, 64, 128], both column halves (halves 2), or [2, 64, 64], a tile's two rows (halves 1: the
    second row past the end of an odd count loads as zeros)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    rows = x2.shape[0]
    P = BLOCK.value
    xb = ([1, P, P * halves] if halves == 2 else [2, P, P]) if joint else [1, P, P]
    x_desc = TensorDescriptor(x2, [rows, m, P * halves], [x2.stride(0), P * halves, 1], xb, _layout(xb, 16))
    w = P // 2 if packed else P
    bits = out.element_size() * 8
    shape, strides = [rows, m, w * halves], [out.stride(0), w * halves, 1]
    codes_desc = TensorDescriptor(out, shape, strides, [1, P, w], _layout([1, P, w], bits))
    staging_desc = TensorDescriptor(out, shape, strides, [slots, P, w], _layout([slots, P, w], bits))
    return x_desc, codes_desc, staging_desc
