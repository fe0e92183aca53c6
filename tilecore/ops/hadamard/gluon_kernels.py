"""The Hadamard transform of long rows (n = 8192 S, S = 2 or 4) on Hopper, as a kernel of the tiles'
tiles template (tilecore.tiles.gluon.pipeline): the same math as kernels.py's plan (S, 128, 64),
with the data movement made explicit.

A tile is one row: S slices X_s of 128 x 64 elements (the rows seen as lines of 64 elements). The
producer warp streams each slice through the ring as two 64-line halves (top, bottom) by TMA; two
consumer warpgroups share every slice, consumer c owning lines 64c .. 64c + 63 of each transform:

    T_s = H_128 X_s H_64,   and H_128 = H_2 (x) H_64,  so  rows of consumer c:
    Y_s[64c + i] = (H_128 X_s)[64c + i] = H_64 top + (-1)^c H_64 bottom   (16-bit inputs times +-1, float32 sums)
    T_s[64c + i] = (hi + lo) H_64                                        (bf16 pieces of the float32 sums)
    out_j       += H_S[j, s] T_s                                         (float32, as the slices arrive)

All three operands +-H_64 sit in shared memory, resident (loaded once per program): H_64 and -H_64 in
the input's dtype for the first product, H_64 in bf16 for the second. Each consumer's chain is
software-pipelined by one slice: while slice s's first product runs on the tensor cores, slice s-1's
second product is added to the outputs. Before that a row's chain of wgmma waits bounded the kernel;
now its memory pattern does (notes/hadamard/README.md). The error analysis is kernels.py's: the
final rounding to the output dtype is the only one that matters. Each consumer then writes its S
output blocks into one staging buffer and issues their TMA stores back to back, so a row's stores
never wait for each other.

hadamard_quantize's power-of-two rows (issue 32) run the same pipeline with gluon_epilogue's codes in
place of the values (``hadamard_gluon_quantize_kernel``): the two consumers hold the whole row in
registers when its last slice is added, so a per-token scale needs no second pass over the row: each
consumer's largest |y| is exchanged through shared memory (gluon_epilogue.exchange); int4's groups of
128 are a line pair of one block. The rotation's 1 / sqrt(n) is folded into the maxima and the
reciprocals. Codes are staged as bytes (two codes a byte for int4) and TMA-stored as the values are.

OWN (hadamard_quantize at n = 16384): a consumer owns a row, a tile is two rows, and a ring step brings both rows' next
64-line slice (X_s: the row's lines 64 s .. 64 s + 63, s < S = n / 4096). Each consumer runs the pow2 kernel's (S, 64, 64)
split on its row: T_s = H_64 X_s H_64 (one K = 64 first product: 384 tensor FLOP an element, against the shared row's
512, whose first product is H_128 over two consumers' halves), out_j += H_S[j, s] T_s for its S blocks in registers,
and the per-token scale from its own blocks (no exchange); block j is the row's lines 64 j .. 64 j + 63.

SWAP (per token, n = 8192 S): the row shared as above, but consumer c multiplies only its half of each slice (X_sc, the
slice's lines 64 c ..: one K = 64 first product, as OWN), so its blocks are V_jc = sum_s H_S[j, s] H_64 X_sc H_64 and the
row's output block (j, h) is V_j0 + (-1)^h V_j1 (H_128 = H_2 (x) H_64: the H_2 level moved after the products). Consumer c
sends the S / 2 blocks it does not output (j >= S / 2 for consumer 0, j < S / 2 for 1) through shared memory as float32,
takes the other's, and outputs blocks (j, 0), (j, 1) of its j: the row's lines 64 (c S + b), b < S. The per-token
exchange that follows is the proof both have read the swapped blocks before either writes the next row's.
"""
from triton.experimental import gluon

from tilecore.ops.hadamard.gluon_epilogue import (STORE, exchange, folded, group_codes, pieces, relabel, row_amax,
                                                  token_codes, token_recip)
from tilecore.tiles.gluon.compat import fence_async_shared, gl, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from tilecore.tiles.gluon import Layout, TileOperand, ring, run, stage_struct, struct, wgmma_layout

LINES = gl.constexpr(64)  # a slice half: lines of 64 elements; also H_64's size


@stage_struct
class Slice:
    """One stage: a slice's two 64-line halves."""
    top: object
    bottom: object


@struct
class RowState:
    """A consumer's running row: Y of the last slice (its wgmma maybe in flight) and the S output
    blocks accumulated so far."""
    y: object
    outs: object  # a tuple of S [64, 64] float32 blocks
    t: object  # the consumer's rows so far (the per-token exchange's parity)


@gluon.jit
def _sign(j: gl.constexpr, s):
    """H_S[j, s] for S <= 4: (-1)^popcount(j & s), as a float."""
    b = j & s
    return 1.0 - 2.0 * ((b ^ (b >> 1)) & 1).to(gl.float32)


@gluon.jit
def _second_product(y, h_smem, CLAMP: gl.constexpr):
    """y H_64 for float32 ``y``: its two bf16 pieces (gluon_epilogue.pieces, CLAMP its lo's form) times H_64
    (shared memory), accumulated in float32; returned with the wgmma in flight."""
    acc_layout: gl.constexpr = y.type.layout
    operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    hi, lo = pieces(y, CLAMP)
    t = warpgroup_mma(gl.convert_layout(hi, operand), h_smem, gl.zeros_like(y), use_acc=False, is_async=True)
    return warpgroup_mma(gl.convert_layout(lo, operand), h_smem, t, is_async=True)


@gluon.jit
def _accumulate(outs, t, s):
    """outs + H_S[:, s] t: slice s's transform T_s = t added to each output block."""
    if len(outs) == 2:
        return outs[0] + t * _sign(0, s), outs[1] + t * _sign(1, s)
    else:
        return (outs[0] + t * _sign(0, s), outs[1] + t * _sign(1, s), outs[2] + t * _sign(2, s),
                outs[3] + t * _sign(3, s))


@struct
class Hadamard:
    x_desc: object
    out_desc: object  # the values (STORE), or the codes as bytes: (rows n / 64, W) lines, [64, W] boxes
    h_desc: object
    scale: object
    S: gl.constexpr  # slices a row: n = 8192 S
    LINES_PER_ROW: gl.constexpr
    # hadamard_quantize (gluon_epilogue's fields; None for the plain transform)
    scales: object  # per token: [rows] float32; int4: (rows, n / 128) float32
    gscale: object  # fp8 static: the given scale, one float32
    rows: object
    stride_scales: object
    rscale: object  # 1 / sqrt(n), folded into the maxima and reciprocals
    xchg: object  # per token: [4, 1] float32 shared (row parity x consumer), the amax exchange
    xbar: object  # per token: two mbarriers (row parity), both consumers arrive
    FORMAT: gl.constexpr  # gluon_epilogue's ids: fp8, int8 (per token), int4 (groups of 128); STORE: the transform
    G: gl.constexpr  # group size (0: per token)
    STATIC: gl.constexpr
    QMAX: gl.constexpr
    FOLD: gl.constexpr
    CLAMP_LO: gl.constexpr  # the second product's lo piece (gluon_epilogue.pieces' CLAMP)
    INT_BITS: gl.constexpr
    OWN: gl.constexpr  # a consumer owns a row (module docstring): S slices of 64 lines, a tile two rows
    swap: object  # SWAP: [S, 64, 64] float32 shared (consumer x its S / 2 sent blocks), else None
    sbar: object  # SWAP: two mbarriers (row parity), both consumers arrive when their sent blocks are written
    SWAP: gl.constexpr  # the H_2 level after the products, by an exchange of blocks (module docstring)
    SCALE_ONCE: gl.constexpr  # OWN, groups of 16 / 32: each group's scale once (gluon_epilogue._scales_once)
    E2M1_PAIRS: gl.constexpr  # OWN, mxfp4 / nvfp4: a column pair's two codes as one byte (gluon_epilogue._e2m1_pair)
    PERM: gl.constexpr  # OWN, groups of 16 / 32: H_64's columns permuted (h_desc's first), blocks relabelled (a thread's
    # 16 values of a line consecutive outputs: an nvfp4 group one thread's)

    @gluon.jit
    def setup(self, row):
        return row, self.S  # a tile is a row; its S slices are the ring's steps

    @gluon.jit
    def load(self, stage, bar, row, s):
        if self.OWN:  # tile ``row`` is rows 2 row (top) and 2 row + 1 (bottom; past the end: zeros), slice s of each
            line = 2 * row * self.LINES_PER_ROW + LINES * s
            tma.async_copy_global_to_shared(self.x_desc, [line, 0], bar, stage.top)
            tma.async_copy_global_to_shared(self.x_desc, [line + self.LINES_PER_ROW, 0], bar, stage.bottom)
        else:
            line = row * self.LINES_PER_ROW + 2 * LINES * s
            tma.async_copy_global_to_shared(self.x_desc, [line, 0], bar, stage.top)
            tma.async_copy_global_to_shared(self.x_desc, [line + LINES, 0], bar, stage.bottom)

    @gluon.jit
    def load_tile(self, bufs, bar, row, consumer):
        """The resident operand: H_64 in bf16, then H_64 and -H_64 in the input's dtype."""
        for k in gl.static_range(3):
            tma.async_copy_global_to_shared(self.h_desc, [LINES * k, 0], bar, bufs.index(k))

    @gluon.jit
    def start(self, ctx, row, prev):
        z = gl.zeros([LINES, LINES], gl.float32, wgmma_layout(LINES, LINES, gl.num_warps()))
        if self.S == 2:
            outs = (z, z)
        else:
            outs = (z, z, z, z)
        return RowState(z, outs, row * 0)

    @gluon.jit
    def compute(self, ctx, state, stage, row, s):
        """Issue slice s's first product, add slice s-1's transform to the outputs while it runs, and
        return with Y_s's wgmma in flight. At s = 0 the second product is of the initial zeros (adds 0):
        one spare product per row keeps the step free of branches, which ptxas needs to keep the wgmma
        in flight (with a branch on s it serializes every wgmma: C7512)."""
        bufs = ctx.operand
        h = bufs.index(1)._reinterpret(self.x_desc.dtype, [LINES, LINES], bufs.type.layout)
        h_bottom = bufs.index(1 + ctx.index)._reinterpret(self.x_desc.dtype, [LINES, LINES], bufs.type.layout)
        y_prev = warpgroup_mma_wait(0, deps=(state.y,))
        t = _second_product(y_prev, bufs.index(0), self.CLAMP_LO)  # issued before Y_s: waiting for it leaves Y_s
        if self.OWN or self.SWAP:  # Y_s = H_64 X_s of this consumer's row (SWAP: of its half of the row's slice)
            if ctx.index == 0:
                first = warpgroup_mma(h, stage.top, gl.zeros_like(y_prev), use_acc=False, is_async=True)
            else:
                first = warpgroup_mma(h, stage.bottom, gl.zeros_like(y_prev), use_acc=False, is_async=True)
        else:
            first = warpgroup_mma(h, stage.top, gl.zeros_like(y_prev), use_acc=False, is_async=True)
            first = warpgroup_mma(h_bottom, stage.bottom, first, is_async=True)
        t, y = warpgroup_mma_wait(1, deps=(t, first))  # t is done; Y_s may still run
        return RowState(y, _accumulate(state.outs, t, s - 1), ctx.ring_step // self.S)

    @gluon.jit
    def wait(self, ctx, state):
        """The row's last slice: its second product, which no later first product hides."""
        y = warpgroup_mma_wait(0, deps=(state.y,))
        t = warpgroup_mma_wait(0, deps=(_second_product(y, ctx.operand.index(0), self.CLAMP_LO),))
        return RowState(y, _accumulate(state.outs, t, self.S - 1), state.t)

    @gluon.jit
    def finish(self, ctx, state, row):
        """This consumer's S output blocks of the row: scaled and rounded once (STORE), or quantized; stored
        by TMA."""
        tma.store_wait(0)  # the previous row's stores have read the staging buffer
        if self.OWN:
            row = 2 * row + ctx.index  # this consumer's row of the tile (past the end: its stores are clipped)
        if self.FORMAT == STORE:
            for j in gl.static_range(self.S):
                ctx.out.slice(j * LINES, LINES).store((state.outs[j] * self.scale).to(self.out_desc.dtype))
        elif self.SWAP:
            gl.static_assert(self.G == 0, "SWAP: per token (its amax exchange orders the swapped blocks' reuse)")
            outs = self._swapped(ctx, state)
            a = exchange(self, ctx, folded(self, row_amax(outs, self.S)), state.t)
            recip = token_recip(self, a, row, ctx.index == 0)
            for j in gl.static_range(self.S):
                ctx.out.slice(j * LINES, LINES).store(
                    token_codes(outs[j] * recip, self.FORMAT, self.INT_BITS).to(self.out_desc.dtype))
        elif self.G == 0:  # one scale a row: the maximum of both consumers' halves (OWN: of the consumer's own row)
            a = folded(self, row_amax(state.outs, self.S))
            if not self.OWN:
                a = exchange(self, ctx, a, state.t)
            recip = token_recip(self, a, row, self.OWN or ctx.index == 0)
            for j in gl.static_range(self.S):
                ctx.out.slice(j * LINES, LINES).store(
                    token_codes(state.outs[j] * recip, self.FORMAT, self.INT_BITS).to(self.out_desc.dtype))
        else:  # int4's groups of 128 (gluon_epilogue.group_codes: a line pair, at _pair_slots)
            for j in gl.static_range(self.S):
                y = state.outs[j]
                if self.PERM:
                    y = relabel(y)
                ctx.out.slice(j * LINES, LINES).store(group_codes(self, y, row, j, ctx.index).to(self.out_desc.dtype))
        fence_async_shared()
        gl.thread_barrier()
        if self.SWAP:  # consumer c's blocks: the row's lines 64 c S ..
            for j in gl.static_range(self.S):
                line = row * self.LINES_PER_ROW + LINES * (ctx.index * self.S + j)
                tma.async_copy_shared_to_global(self.out_desc, [line, 0], ctx.out.slice(j * LINES, LINES))
        elif self.OWN:  # block j: the row's lines 64 j ..
            for j in gl.static_range(self.S):
                tma.async_copy_shared_to_global(self.out_desc, [row * self.LINES_PER_ROW + LINES * j, 0],
                                                ctx.out.slice(j * LINES, LINES))
        else:
            line = row * self.LINES_PER_ROW + LINES * ctx.index
            for j in gl.static_range(self.S):
                tma.async_copy_shared_to_global(self.out_desc, [line + 2 * LINES * j, 0],
                                                ctx.out.slice(j * LINES, LINES))

    @gluon.jit
    def _swapped(self, ctx, state):
        """SWAP: this consumer's S output blocks in line order, (j, 0), (j, 1) for its j (S = 2: one j, S = 4: two), from its
        blocks V_jc and the other consumer's V_j(1-c), taken through self.swap (consumer c's sent blocks at c S / 2 ..)."""
        o = state.outs
        slot = state.t & 1
        L: gl.constexpr = o[0].type.layout
        if self.S == 2:  # consumer 0 outputs j = 0 and sends V_10; consumer 1 outputs j = 1 and sends V_01
            if ctx.index == 0:
                self.swap.index(0).store(o[1])
            else:
                self.swap.index(1).store(o[0])
        else:  # consumer 0 outputs j = 0, 1 and sends V_20, V_30; consumer 1 the reverse
            if ctx.index == 0:
                self.swap.index(0).store(o[2])
                self.swap.index(1).store(o[3])
            else:
                self.swap.index(2).store(o[0])
                self.swap.index(3).store(o[1])
        gl.thread_barrier()  # every warp's stores before the arrive (one thread of the partition arrives)
        mbarrier.arrive(self.sbar.index(slot))
        mbarrier.wait(self.sbar.index(slot), (state.t >> 1) & 1)
        if self.S == 2:
            if ctx.index == 0:
                v0 = o[0]
                v1 = self.swap.index(1).load(L)
            else:
                v0 = self.swap.index(0).load(L)
                v1 = o[1]
            res = (v0 + v1, v0 - v1)
        else:
            if ctx.index == 0:
                a0 = o[0]
                a1 = self.swap.index(2).load(L)
                b0 = o[1]
                b1 = self.swap.index(3).load(L)
            else:
                a0 = self.swap.index(0).load(L)
                a1 = o[2]
                b0 = self.swap.index(1).load(L)
                b1 = o[3]
            res = (a0 + a1, a0 - a1, b0 + b1, b0 - b1)
        return res

    @gluon.jit
    def _group_slots(self, SL: gl.constexpr, GR: gl.constexpr, row, j: gl.constexpr, c: gl.constexpr):
        """gluon_epilogue.group_codes' scale offsets and mask for block j's groups of G <= 64 (OWN: layout SL, GR a line):
        the block's line r is the row's line 64 j + r, which may lie past the end."""
        r = gl.arange(0, LINES, layout=gl.SliceLayout(1, SL))
        g = gl.arange(0, GR, layout=gl.SliceLayout(0, SL))
        offs = gl.expand_dims(LINES * j + r, 1) * GR + gl.expand_dims(g, 0)
        return offs, (offs < self.LINES_PER_ROW * GR) & (row < self.rows)

    @gluon.jit
    def _pair_slots(self, SL: gl.constexpr, row, j: gl.constexpr, c: gl.constexpr):
        """gluon_epilogue.group_codes' scale offsets and mask for consumer c's block j, groups of 128 (int4): the
        block's line r is the row's line 128 j + 64 c + r, so its line pair i is the row's group 64 j + 32 c + i
        (OWN: line 64 j + r, group 32 j + i, of the consumer's row, which may lie past the end)."""
        i = gl.arange(0, LINES // 2, layout=SL)
        if self.OWN:
            return i, (LINES // 2) * j, (i < LINES // 2) & (row < self.rows)
        return i, LINES * j + (LINES // 2) * c, i < LINES // 2


@gluon.jit
def hadamard_gluon_kernel(x_desc, out_desc, staging_desc, h_desc, rows, scale, row_counter, S: gl.constexpr,
                          STAGES: gl.constexpr, LOOKAHEAD: gl.constexpr = 0):
    """scale * H_n of each of ``rows`` contiguous rows, n = 8192 S. x_desc/out_desc: the rows as
    (rows * n / 64, 64) lines with [64, 64] boxes; staging_desc: the same with [64 S, 64] boxes (only its
    shape and layout are used: a consumer's staging buffer); h_desc: three [64, 64] boxes as bf16 bits,
    H_64 in bf16, then H_64 and -H_64 in the input's dtype (kernels.gluon_args). LOOKAHEAD: the
    template's (a ring of STAGES that fills at the start, LOOKAHEAD deep after). ``row_counter``: an
    int32, zero at launch and left so, from which programs draw rows as they get to them; or None:
    program p takes rows p, p + P, ..."""
    op = Hadamard(x_desc, out_desc, h_desc, scale, S, 128 * S, None, None, None, None, None, None, None, STORE, 0,
                  False, 1.0, False, False, False, False, None, None, False, False, False, False)
    layout = Layout(staging_desc, STAGES, CONSUMERS=2, CONSUMER_REGS=240, PRODUCER_REGS=24, LATE_RELEASE=1,
                    LOOKAHEAD=LOOKAHEAD, tile_operand=TileOperand(h_desc, COUNT=3, RESIDENT=True),
                    tile_counter=row_counter)
    run(op, layout, Slice(ring(x_desc, STAGES), ring(x_desc, STAGES)), rows)


@gluon.jit
def hadamard_gluon_quantize_kernel(x_desc, codes_desc, staging_desc, h_desc, scales, gscale, rows, stride_scales, rscale,
                                   row_counter, S: gl.constexpr, STAGES: gl.constexpr, FORMAT: gl.constexpr,
                                   G: gl.constexpr, STATIC: gl.constexpr, QMAX: gl.constexpr,
                                   LOOKAHEAD: gl.constexpr = 0, CLAMP_LO: gl.constexpr = False,
                                   INT_BITS: gl.constexpr = False, OWN: gl.constexpr = False,
                                   SWAP: gl.constexpr = False, SCALE_ONCE: gl.constexpr = False,
                                   E2M1_PAIRS: gl.constexpr = False, PERM: gl.constexpr = False):
    """codes, scales = quantize(rscale H_n x) for ``rows`` rows of n = 8192 S (module docstring): the transform's
    pipeline with gluon_epilogue's codes (FORMAT: fp8 / int8 per token, int4 in groups of 128; STORE: the values).
    x_desc: the rows as (rows n / 64, 64) lines, [64, 64] boxes; codes_desc: the codes as (rows n / 64, W) byte lines
    (W = 64, 32 for int4), [64, W] boxes; staging_desc: the same with [64 S, W] boxes (a consumer's staging buffer);
    h_desc and row_counter as hadamard_gluon_kernel's. OWN (module docstring): n = 4096 S, S <= 4, the staging buffer
    [64 S, W]. SWAP (module docstring): per token, [S, 64, 64] float32 more shared memory."""
    gl.static_assert(G == 0 or G == 128 or (OWN and (G == 16 or G == 32)),
                     "per token, int4's groups of 128, or (OWN) mxfp4's 32 / nvfp4's 16")
    gl.static_assert(not OWN or S <= 4, "OWN: a consumer's S blocks of 64 x 64 in registers, S <= 4")
    rows = gl.to_tensor(rows)
    xchg = gl.allocate_shared_memory(gl.float32, [4, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    xbar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(xbar.index(0), count=2)
    mbarrier.init(xbar.index(1), count=2)
    gl.static_assert(not (OWN and SWAP), "OWN or SWAP")
    if SWAP:
        swap = gl.allocate_shared_memory(gl.float32, [S, 64, 64],
                                         gl.SwizzledSharedLayout(2, 1, 8, [1, 0]))
        sbar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(sbar.index(0), count=2)
        mbarrier.init(sbar.index(1), count=2)
    else:
        swap = None
        sbar = None
    op = Hadamard(x_desc, codes_desc, h_desc, rscale, S, (64 if OWN else 128) * S, scales, gscale, rows, stride_scales,
                  rscale, xchg, xbar, FORMAT, G, STATIC, QMAX, True, CLAMP_LO, INT_BITS and (FORMAT == 2 or FORMAT == 5),
                  OWN, swap, sbar, SWAP, SCALE_ONCE and G <= 32, E2M1_PAIRS and (FORMAT == 3 or FORMAT == 4),
                  PERM and OWN and G <= 32 and G > 0)
    layout = Layout(staging_desc, STAGES, CONSUMERS=2, CONSUMER_REGS=240, PRODUCER_REGS=24, LATE_RELEASE=1,
                    LOOKAHEAD=LOOKAHEAD, tile_operand=TileOperand(h_desc, COUNT=3, RESIDENT=True),
                    tile_counter=row_counter)
    run(op, layout, Slice(ring(x_desc, STAGES), ring(x_desc, STAGES)), (rows + 1) // 2 if OWN else rows)
