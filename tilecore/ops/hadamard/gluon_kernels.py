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
"""
from triton.experimental import gluon

from tilecore.ops.hadamard.gluon_epilogue import (STORE, exchange, folded, group_codes, pieces, row_amax, token_codes,
                                                  token_recip)
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

    @gluon.jit
    def setup(self, row):
        return row, self.S  # a tile is a row; its S slices are the ring's steps

    @gluon.jit
    def load(self, stage, bar, row, s):
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
        if self.FORMAT == STORE:
            for j in gl.static_range(self.S):
                ctx.out.slice(j * LINES, LINES).store((state.outs[j] * self.scale).to(self.out_desc.dtype))
        elif self.G == 0:  # one scale a row: the maximum of both consumers' halves
            a = exchange(self, ctx, folded(self, row_amax(state.outs, self.S)), state.t)
            recip = token_recip(self, a, row, ctx.index == 0)
            for j in gl.static_range(self.S):
                ctx.out.slice(j * LINES, LINES).store(
                    token_codes(state.outs[j] * recip, self.FORMAT, self.INT_BITS).to(self.out_desc.dtype))
        else:  # int4's groups of 128 (gluon_epilogue.group_codes: a line pair, at _pair_slots)
            for j in gl.static_range(self.S):
                ctx.out.slice(j * LINES, LINES).store(
                    group_codes(self, state.outs[j], row, j, ctx.index).to(self.out_desc.dtype))
        fence_async_shared()
        gl.thread_barrier()
        line = row * self.LINES_PER_ROW + LINES * ctx.index
        for j in gl.static_range(self.S):
            tma.async_copy_shared_to_global(self.out_desc, [line + 2 * LINES * j, 0], ctx.out.slice(j * LINES, LINES))

    @gluon.jit
    def _pair_slots(self, SL: gl.constexpr, row, j: gl.constexpr, c: gl.constexpr):
        """gluon_epilogue.group_codes' scale offsets and mask for consumer c's block j, groups of 128 (int4): the
        block's line r is the row's line 128 j + 64 c + r, so its line pair i is the row's group 64 j + 32 c + i."""
        i = gl.arange(0, LINES // 2, layout=SL)
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
                  False, 1.0, False, False, False)
    layout = Layout(staging_desc, STAGES, CONSUMERS=2, CONSUMER_REGS=240, PRODUCER_REGS=24, LATE_RELEASE=1,
                    LOOKAHEAD=LOOKAHEAD, tile_operand=TileOperand(h_desc, COUNT=3, RESIDENT=True),
                    tile_counter=row_counter)
    run(op, layout, Slice(ring(x_desc, STAGES), ring(x_desc, STAGES)), rows)


@gluon.jit
def hadamard_gluon_quantize_kernel(x_desc, codes_desc, staging_desc, h_desc, scales, gscale, rows, stride_scales, rscale,
                                   row_counter, S: gl.constexpr, STAGES: gl.constexpr, FORMAT: gl.constexpr,
                                   G: gl.constexpr, STATIC: gl.constexpr, QMAX: gl.constexpr,
                                   LOOKAHEAD: gl.constexpr = 0, CLAMP_LO: gl.constexpr = False,
                                   INT_BITS: gl.constexpr = False):
    """codes, scales = quantize(rscale H_n x) for ``rows`` rows of n = 8192 S (module docstring): the transform's
    pipeline with gluon_epilogue's codes (FORMAT: fp8 / int8 per token, int4 in groups of 128; STORE: the values).
    x_desc: the rows as (rows n / 64, 64) lines, [64, 64] boxes; codes_desc: the codes as (rows n / 64, W) byte lines
    (W = 64, 32 for int4), [64, W] boxes; staging_desc: the same with [64 S, W] boxes (a consumer's staging buffer);
    h_desc and row_counter as hadamard_gluon_kernel's."""
    gl.static_assert(G == 0 or G == 128, "per token, or int4's groups of 128")
    xchg = gl.allocate_shared_memory(gl.float32, [4, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    xbar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(xbar.index(0), count=2)
    mbarrier.init(xbar.index(1), count=2)
    op = Hadamard(x_desc, codes_desc, h_desc, rscale, S, 128 * S, scales, gscale, gl.to_tensor(rows), stride_scales,
                  rscale, xchg, xbar, FORMAT, G, STATIC, QMAX, True, CLAMP_LO, INT_BITS and (FORMAT == 2 or FORMAT == 5))
    layout = Layout(staging_desc, STAGES, CONSUMERS=2, CONSUMER_REGS=240, PRODUCER_REGS=24, LATE_RELEASE=1,
                    LOOKAHEAD=LOOKAHEAD, tile_operand=TileOperand(h_desc, COUNT=3, RESIDENT=True),
                    tile_counter=row_counter)
    run(op, layout, Slice(ring(x_desc, STAGES), ring(x_desc, STAGES)), rows)
