"""Based's linear attention forward for Hopper on the tiles template (tilecore/tiles/gluon/pipeline.py):
feature dim Dk = 16 (Based's 2nd-order Taylor map), no decay, value dims a multiple of 64.

Based's map phi(x) = [1, x, vec(x x^T) / sqrt(2)] (1 + 16 + 256 features; phi(q) . phi(k) = 1 + s + s^2 / 2
with s = scale q . k) has 136 distinct quadratic products (x_a x_b, a <= b), so this kernel runs on the
153 SYMMETRIC features, padded to F = 160:

    f = 0          1                         (q side weight 1)
    f = 1 + a      x_a                       (q side weight scale)
    f = 17 + t     x_a x_b, pair t = (a, b), a <= b   (q side weight scale^2, or scale^2 / 2 on the diagonal)
    f = 153..159   0

so phi_q . phi_k = 1 + s + s^2 / 2 with the weights on the query side only. Each feature is a product of two
"selected" columns of x~ = [x, 1]; the selections are two [16, F] 0/1 matrices (``selection``, built on the
host), so a piece of 32 features is two K = 16 wgmmas (exact: bf16 values picked out in float32) plus a
column constant (the 1) and one product, rounded once to bf16: no gather, no [BT, 16, 16] tensor.

The template's parts:

* a tile is two units of (head, BV = 64 value columns) of one batch row (consecutive units: two heads at
  Dv = 64); ``setup`` gives cdiv(N, BT) steps, one chunk of BT = 64 tokens each;
* a stage is each unit's q, k [BT, 16] and v [BT, BV], TMA-loaded by the 1-warp producer through 4-D
  descriptors of (B, H, N, D) views (tokens past N arrive as zeros: their k features are 0 but the constant,
  whose v row is 0, so they add nothing);
* consumer c (a warpgroup) owns unit c: its state, held TRANSPOSED, S^T [BV, F] float32 (80 registers a
  thread), lives in registers as a wgmma accumulator for the whole walk (as [BV, F] its M is the 64 value
  columns, so the 160 features are the instruction's N). Each step (chunk):

      phi_q, phi_k [BT, F]  = (x Sel_a + c_a) * (x Sel_b + c_b) (* w)      10 + 10 K=16 wgmmas, to shared memory
      P    = mask(1 + s + s^2 / 2),  s = scale Q K^T                       wgmma, Q and K from shared memory
      o    = phi_q S + P V                                                 S^T as bf16 in shared memory (B operand)
      S^T <- S^T + V^T phi_k                                               V^T and phi_k from shared memory
      o TMA-stored (rows past N clipped)

Rounding: phi_q, phi_k, P and S go to the tensor cores in the input dtype (bf16/fp16), as la_fwd_kernel's
(decision 8 of notes/linear_attention); S accumulates in float32.

States in memory are the op's layout [1, Dk, Dk x Dk] rows (all Dk^2 quadratic products, each / sqrt(2));
the host maps an initial state to the kernel's symmetric rows (``compress``: the pair (a, b)'s row carries
(h[ab] + h[ba]) / sqrt(2), the diagonal's sqrt(2) h[aa]) and the final state back (``expand``), adding the
initial state's antisymmetric part back so the final state is the recurrence's, element for element.
"""
import math

import torch
from triton.experimental import gluon

from tilecore.tiles.gluon import (Layout, ring, run, split_n, stage_struct, store_block, struct, wgmma_layout,
                                  wgmma_lhs_layout)
from tilecore.tiles.gluon.compat import fence_async_shared, gl, tma, warpgroup_mma, warpgroup_mma_wait

DK = 16  # Based's feature dim (the kernel's q/k head dim)
FEATURES = 160  # 1 + 16 + 136 symmetric features, padded to 5 pieces of 32
PIECE = 32  # features built a step (two [BT, PIECE] float32 tiles live)
# FEAT_ALU's blocks of products (column groups (G, H) of 4), two a piece of 32 features: the 6 blocks G < H, then
# the 4 diagonal ones (their upper triangles and squares, the linear features and the constant in their lower ones)
ALU_BLOCKS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3), (0, 0), (1, 1), (2, 2), (3, 3))
ALU_G = gl.constexpr(tuple(b[0] for b in ALU_BLOCKS))
ALU_H = gl.constexpr(tuple(b[1] for b in ALU_BLOCKS))
BT_BASED = 64  # tokens a chunk (a wgmma's M)
BV_BASED = 64  # value columns a consumer
# timing probes (the kernel's PROBE; experiments/linear_attention/gpu_forward.py --set s30): each bit leaves a
# part of a chunk's work out, so the time it saves says what binds. Outputs are wrong; never in a real launch.
# The plain (not OVERLAP) walk only.
PROBE_NO_INTRA = gl.constexpr(1)  # no Q K^T and no P V wgmma (P made from zeros)
PROBE_NO_UPDATE = gl.constexpr(2)  # no state-update wgmmas (S^T += V^T phi_k)
PROBE_NO_STORE = gl.constexpr(4)  # o made, not stored
PROBE_NO_INTER = gl.constexpr(8)  # no phi_q S wgmmas
PROBE_NO_FEATURES = gl.constexpr(32)  # no feature pieces (selection wgmmas, products, their stores)


@stage_struct
class BasedChunk:
    qa: object  # [1, 1, BT, 16]: unit 0's
    ka: object
    va: object  # [1, 1, BT, BV]
    qb: object  # unit 1's
    kb: object
    vb: object


@struct
class BasedUnits:
    b: object  # batch row
    u0: object  # the first unit: (head, value block) = (u0 // VB, u0 % VB)


@struct
class BasedWalk:
    S: object  # [BV, 128] float32: the unit's state, transposed (S^T), features 0..127: a wgmma accumulator
    T: object  # [BV, 32] float32: features 128..159


@struct
class BasedForward:
    q_desc: object
    k_desc: object
    v_desc: object
    o_desc: object
    SEL: object  # [2 F, 16] bf16/fp16: the selections by pieces (host: kernel_selection())
    H0: object  # [B, H, F, Dv] float32: the initial state in the kernel's rows (compress())
    HT: object  # [B, H, F, Dv] float32: the final state in the kernel's rows
    s0b: object
    s0h: object
    s0f: object
    s0v: object
    stb: object
    sth: object
    stf: object
    stv: object
    N: object
    H: object
    VB: object
    scale: object
    # shared memory (power-of-two shapes: the features are a block of 128 and a tail of 32)
    sel_main: object  # [256, 16]: pieces 0..3 of 32 features, each its Sel_a^T rows then its Sel_b^T rows
    sel_tail: object  # [64, 16]: piece 4 (features 128..159): both consumers read them
    phiq_main: object  # [2, BT, 128]: each consumer's phi_q (the A operand of phi_q S)
    phiq_tail: object  # [2, BT, 32]
    phik_main: object  # [2, BT, 128]: each consumer's phi_k (the B operand of V^T phi_k)
    phik_tail: object  # [2, BT, 32]
    state_main: object  # [2, BV, 128]: each consumer's S^T in the input dtype (S: the B operand of phi_q S)
    state_tail: object  # [2, BV, 32]
    BT: gl.constexpr
    BV: gl.constexpr
    F: gl.constexpr
    HAS_H0: gl.constexpr
    STORE_HT: gl.constexpr
    OVERLAP: gl.constexpr  # paired selections (one N = 64 wgmma a piece) and the chunk's wgmmas issued together
    PAIRED: gl.constexpr  # OVERLAP's paired selections alone (one N = 64 wgmma a piece, k's under q's product);
    # the chunk's other wgmmas synchronous as without OVERLAP
    CHAIN: gl.constexpr  # OVERLAP's chunk wgmmas alone (o's three and the update's two issued async, one wait);
    # the selections as without OVERLAP
    SEL_ASYNC: gl.constexpr  # not OVERLAP/PAIRED: a piece's two selections async with one wait (1); q's and k's
    # four together, q's product under k's (2); the pieces software-pipelined (3: features_pipelined)
    PROBE: gl.constexpr  # timing probes only (wrong outputs; 0 in every real launch)
    SEL_REG: gl.constexpr  # (with SEL_ASYNC 3) q and k loaded once a chunk into registers: the selections' A operand
    # from registers, so each reads only its [32, 16] selection from shared memory (3 KB -> 1 KB a wgmma)
    PHIQ_REG: gl.constexpr  # (with SEL_ASYNC 3 and CHAIN) phi_q kept in registers: each piece the A operand of
    # o's phi_q S wgmma (K = 32), issued async as soon as the piece is made (under the next selections), no
    # phi_q buffer in shared memory (40 KB free: 3 stages fit)
    FEAT_ALU: gl.constexpr  # (1, 2, 3) the features by the CUDA cores, no selection wgmmas (``features_alu``); 2: Q K^T
    # issued async before them (the tensor cores run it under the features' ALU work); 3: as 2, and phi_q S and the
    # update issued before P is made (P V after them, one wait). The kernel's
    # features in ``feature_pairs(alu=True)``'s order; phiq_main / phiq_tail [2, 2 BT, .] hold each consumer's phi_q
    # rows, then its phi_k rows
    O: object  # OUT_DIRECT: o's base pointer and its (batch, token, head) strides (elements)
    sob: object
    son: object
    soh: object
    OUT_DIRECT: gl.constexpr  # o stored from registers by gl.store (no epilogue buffer: the 16 KB a 4th stage needs)
    XL3: gl.constexpr  # FEAT_ALU: [2 (q, k), BT, 16] a thread a row of q or k
    XL4: gl.constexpr  # FEAT_ALU: [2, BT, 4, 4] a block of products
    SL: gl.constexpr  # [BT, BT] scores and [BT, BV] outputs (BT == BV)
    STL: gl.constexpr  # [BV, 128] state
    TTL: gl.constexpr  # [BV, 32] state's tail
    FL: gl.constexpr  # [BT, 32] a feature piece's factor (not OVERLAP)
    PL: gl.constexpr  # P as the register operand of P V (and PHIQ_REG's phi_q pieces of phi_q S)
    QL: gl.constexpr  # SEL_REG: q, k [BT, 16] as the register operand of a selection ([BT, 32] accumulator)

    @gluon.jit
    def setup(self, tile_id):
        units = self.H * self.VB // 2
        return BasedUnits(tile_id // units, (tile_id % units) * 2), gl.cdiv(self.N, self.BT)

    @gluon.jit
    def unit(self, tile, c: gl.constexpr):
        """(head, first value column) of the tile's unit c."""
        u = tile.u0 + c
        return u // self.VB, (u % self.VB) * self.BV

    @gluon.jit
    def load(self, stage, bar, tile, step):
        h0, c0 = self.unit(tile, 0)
        h1, c1 = self.unit(tile, 1)
        t0 = step * self.BT
        tma.async_copy_global_to_shared(self.q_desc, [tile.b, h0, t0, 0], bar, stage.qa)
        tma.async_copy_global_to_shared(self.k_desc, [tile.b, h0, t0, 0], bar, stage.ka)
        tma.async_copy_global_to_shared(self.v_desc, [tile.b, h0, t0, c0], bar, stage.va)
        tma.async_copy_global_to_shared(self.q_desc, [tile.b, h1, t0, 0], bar, stage.qb)
        tma.async_copy_global_to_shared(self.k_desc, [tile.b, h1, t0, 0], bar, stage.kb)
        tma.async_copy_global_to_shared(self.v_desc, [tile.b, h1, t0, c1], bar, stage.vb)

    @gluon.jit
    def start(self, ctx, tile, prev):
        c: gl.constexpr = ctx.index
        # the selections into shared memory (each consumer writes the same values, every tile)
        sel_layout: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [gl.num_warps(), 1], [1, 0])
        cols = gl.expand_dims(gl.arange(0, 16, layout=gl.SliceLayout(0, sel_layout)), 0)
        rows_main = gl.expand_dims(gl.arange(0, 256, layout=gl.SliceLayout(1, sel_layout)), 1)
        rows_tail = gl.expand_dims(256 + gl.arange(0, 64, layout=gl.SliceLayout(1, sel_layout)), 1)
        if not self.FEAT_ALU:
            gl.thread_barrier()  # the previous tile's wgmmas have read them
            self.sel_main.store(gl.load(self.SEL + rows_main * 16 + cols))
            self.sel_tail.store(gl.load(self.SEL + rows_tail * 16 + cols))
            fence_async_shared()
            gl.thread_barrier()
        S = gl.zeros([self.BV, 128], gl.float32, self.STL)
        T = gl.zeros([self.BV, 32], gl.float32, self.TTL)
        if self.HAS_H0:
            h, col = self.unit(tile, c)
            S = gl.load(self.state_ptrs(self.H0, tile.b, h, col, self.s0b, self.s0h, self.s0f, self.s0v, 0, 128,
                                        self.STL))
            T = gl.load(self.state_ptrs(self.H0, tile.b, h, col, self.s0b, self.s0h, self.s0f, self.s0v, 128, 32,
                                        self.TTL))
        return BasedWalk(S, T)

    @gluon.jit
    def state_ptrs(self, base, b, h, col, sb, sh, sf, sv, f0: gl.constexpr, FN: gl.constexpr,
                   layout: gl.constexpr):
        """[BV, FN] pointers of a (B, H, F, Dv) state's features f0.. f0 + FN, value columns col.. col + BV
        (transposed): a 64-bit base, 32-bit offsets within the head's F x Dv state."""
        vcols = col + gl.arange(0, self.BV, layout=gl.SliceLayout(1, layout))
        feats = f0 + gl.arange(0, FN, layout=gl.SliceLayout(0, layout))
        head = base + b.to(gl.int64) * sb + h.to(gl.int64) * sh
        return head + (gl.expand_dims(vcols * sv, 1) + gl.expand_dims(feats * sf, 0))

    @gluon.jit
    def selected(self, x, sel, PIECE_KIND: gl.constexpr, QUERY: gl.constexpr):
        """Issue [x Sel_a + c_a (* w), x Sel_b + c_b] [BT, 64] of a piece of 32 features (sel [64, 16]: the
        piece's Sel_a^T rows, then its Sel_b^T rows; x [BT, 16] in shared memory). The column constants
        ride in the accumulator, the query side's weights w come after (``product``). PIECE_KIND 0:
        features 0..31 (the squares; the linear ones, c_b = 1); 1: pairs a < b; 2: the tail (pairs, then
        the constant at column 24: c_a = c_b = 1). The constants come from the column index (loads of
        them were hoisted out of the walk and spilled)."""
        col = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, self.SL)), 0)
        zero = gl.zeros([self.BT, 64], gl.float32, self.SL)
        if PIECE_KIND == 0:
            acc = zero + gl.where(col >= 48, 1.0, 0.0)
        elif PIECE_KIND == 1:
            acc = zero
        else:
            acc = zero + gl.where(col % 32 == 24, 1.0, 0.0)
        return warpgroup_mma(x, sel.permute((1, 0)), acc, is_async=True)

    @gluon.jit
    def product(self, acc, out, PIECE_KIND: gl.constexpr, QUERY: gl.constexpr):
        """The piece's features (x Sel_a + c_a) * (x Sel_b + c_b) (* w on the query side: scale^2 / 2 on
        the squares, scale on the linear ones, scale^2 on the pairs, 1 on the constant) into ``out``
        [BT, 32] (shared memory, the input dtype). The halves split without data movement (split_n)."""
        if QUERY:
            col = gl.expand_dims(gl.arange(0, 64, layout=gl.SliceLayout(0, self.SL)), 0)
            sq = self.scale * self.scale
            if PIECE_KIND == 0:
                w = gl.where(col < 16, 0.5 * sq, self.scale)
            elif PIECE_KIND == 1:
                w = gl.where(col < 32, sq, 1.0) + gl.zeros([1, 64], gl.float32, self.SL)
            else:
                w = gl.where(col == 24, 1.0, sq)
            acc = acc * gl.where(col < 32, w, 1.0)
        xa, xb = split_n(acc)
        out.store((xa * xb).to(out.dtype))

    @gluon.jit
    def features(self, q, k, sel, phiq, phik, PIECE_KIND: gl.constexpr):
        """A piece of 32 features of q and of k (k's selection runs under q's product; both in flight at once
        spilled 150 B more)."""
        tq = self.selected(q, sel, PIECE_KIND, True)
        aq = warpgroup_mma_wait(0, deps=(tq,))
        tk = self.selected(k, sel, PIECE_KIND, False)
        self.product(aq, phiq, PIECE_KIND, True)
        ak = warpgroup_mma_wait(0, deps=(tk,))
        self.product(ak, phik, PIECE_KIND, False)

    @gluon.jit
    def features_single(self, x, sel_a, sel_b, out, PIECE_KIND: gl.constexpr, QUERY: gl.constexpr):
        """(Not OVERLAP: run 7's form.) A piece of 32 features of x [BT, 16] (shared memory) into ``out``
        [BT, 32] (shared memory, the input dtype), two synchronous N = 32 selections: (x Sel_a + c_a) *
        (x Sel_b + c_b), times w on the query side (sel_a, sel_b [32, 16]).
        PIECE_KIND 0: features 0..31 (the squares, w = scale^2 / 2; the linear ones, c_b = 1, w = scale);
        1: pairs a < b (w = scale^2); 2: the tail (pairs, then the constant at column 24: c_a = c_b = 1,
        w = 1). The column constants come from the column index (no loads: loop-invariant loads were
        hoisted out of the walk and spilled)."""
        zero = gl.zeros([self.BT, 32], gl.float32, self.FL)
        if self.SEL_ASYNC:  # both selections in flight, one wait
            xa = warpgroup_mma(x, sel_a.permute((1, 0)), zero, use_acc=False, is_async=True)
            xb = warpgroup_mma(x, sel_b.permute((1, 0)), zero, use_acc=False, is_async=True)
            xa, xb = warpgroup_mma_wait(0, deps=(xa, xb))
        else:
            xa = warpgroup_mma(x, sel_a.permute((1, 0)), zero, use_acc=False)
            xb = warpgroup_mma(x, sel_b.permute((1, 0)), zero, use_acc=False)
        self.feature_product(xa, xb, out, PIECE_KIND, QUERY)

    @gluon.jit
    def features_both(self, q, k, sel_a, sel_b, phiq, phik, PIECE_KIND: gl.constexpr):
        """(SEL_ASYNC 2) A piece of 32 features of q and of k: the four selections issued together, q's
        product made while k's run."""
        zero = gl.zeros([self.BT, 32], gl.float32, self.FL)
        qa = warpgroup_mma(q, sel_a.permute((1, 0)), zero, use_acc=False, is_async=True)
        qb = warpgroup_mma(q, sel_b.permute((1, 0)), zero, use_acc=False, is_async=True)
        ka = warpgroup_mma(k, sel_a.permute((1, 0)), zero, use_acc=False, is_async=True)
        kb = warpgroup_mma(k, sel_b.permute((1, 0)), zero, use_acc=False, is_async=True)
        qa, qb = warpgroup_mma_wait(2, deps=(qa, qb))
        self.feature_product(qa, qb, phiq, PIECE_KIND, True)
        ka, kb = warpgroup_mma_wait(0, deps=(ka, kb))
        self.feature_product(ka, kb, phik, PIECE_KIND, False)

    @gluon.jit
    def select_async(self, x, p: gl.constexpr):
        """Issue piece p's two selections of x (async): pieces 0..3 from sel_main, 4 the tail."""
        zero = gl.zeros([self.BT, 32], gl.float32, self.FL)
        if p < 4:
            sel_a = self.sel_main.slice(p * 64, 32)
            sel_b = self.sel_main.slice(p * 64 + 32, 32)
        else:
            sel_a = self.sel_tail.slice(0, 32)
            sel_b = self.sel_tail.slice(32, 32)
        xa = warpgroup_mma(x, sel_a.permute((1, 0)), zero, use_acc=False, is_async=True)
        xb = warpgroup_mma(x, sel_b.permute((1, 0)), zero, use_acc=False, is_async=True)
        return xa, xb

    @gluon.jit
    def features_pipelined(self, q, k, phiq, phik, phiq_t, phik_t):
        """(SEL_ASYNC 3) The five pieces software-pipelined: piece p + 1's q selections issued before piece
        p's k product, so a product always runs under selections in flight."""
        qa, qb = self.select_async(q, 0)
        for p in gl.static_range(5):
            ka, kb = self.select_async(k, p)
            qa, qb = warpgroup_mma_wait(2, deps=(qa, qb))
            if p < 4:
                self.feature_product(qa, qb, phiq.slice(p * 32, 32, dim=1), 0 if p == 0 else 1, True)
                qa, qb = self.select_async(q, p + 1)
                ka, kb = warpgroup_mma_wait(2, deps=(ka, kb))
                self.feature_product(ka, kb, phik.slice(p * 32, 32, dim=1), 0 if p == 0 else 1, False)
            else:
                self.feature_product(qa, qb, phiq_t, 2, True)
                ka, kb = warpgroup_mma_wait(0, deps=(ka, kb))
                self.feature_product(ka, kb, phik_t, 2, False)

    @gluon.jit
    def features_pipelined_o(self, q, k, phik, phik_t, S_smem, T_smem):
        """(PHIQ_REG, SEL_ASYNC 3) features_pipelined with phi_q in registers: piece p's phi_q, once made, is the
        register A operand of o += phi_q[:, 32 p: 32 p + 32] S[32 p: 32 p + 32, :] (async; S^T is in shared memory
        already), so o's inter-chunk wgmmas run under the next pieces' selections and products. Returns o [BT, BV]
        float32 with its last wgmma possibly in flight. In-order wgmma groups (pending lists in the comments):
        each product waits for its own selections and everything issued before them."""
        dtype: gl.constexpr = phik.dtype
        o = gl.zeros([self.BT, self.BV], gl.float32, self.SL)
        qa, qb = self.select_async(q, 0)  # [q(0)]
        prev = o  # (the previous piece's phi_q: kept live until the wait that retires its wgmma)
        for p in gl.static_range(5):
            ka, kb = self.select_async(k, p)  # [o(p - 1), q(p), k(p)]
            qa, qb, prev = warpgroup_mma_wait(2, deps=(qa, qb, prev))  # [k(p)]
            phq = gl.convert_layout(self.feature_values(qa, qb, 0 if p == 0 else (1 if p < 4 else 2), True).to(dtype),
                                    self.PL)
            if p < 4:
                o = warpgroup_mma(phq, S_smem.slice(p * 32, 32, dim=1).permute((1, 0)), o, is_async=True)
                qa, qb = self.select_async(q, p + 1)  # [k(p), o(p), q(p + 1)]
                ka, kb = warpgroup_mma_wait(3, deps=(ka, kb))  # [o(p), q(p + 1)]
                self.feature_product(ka, kb, phik.slice(p * 32, 32, dim=1), 0 if p == 0 else 1, False)
                prev = phq
            else:
                o = warpgroup_mma(phq, T_smem.permute((1, 0)), o, is_async=True)  # [k(4), o(4)]
                ka, kb, phq, o = warpgroup_mma_wait(0, deps=(ka, kb, phq, o))
                self.feature_product(ka, kb, phik_t, 2, False)
        return o

    @gluon.jit
    def alu_block(self, x, G: gl.constexpr, H: gl.constexpr):
        """FEAT_ALU: block (G, H) of the products, [2, BT, 16] float32 (column 4 i + j), from x's column groups G, H
        ([2, BT, 4] each, a thread's registers): x_(4G + i) x_(4H + j); on a diagonal block (G == H) the squares
        times sqrt(1/2), the lower triangle the linear features (i, j) = (1, 0), (2, 1), (3, 2): x_(4G + j), (3, 0):
        x_(4G + 3), and block (0, 0)'s (2, 0) the constant 1; the rest 0 (feature_pairs(alu=True) lists them).
        The masks are constants a register (the block's columns live in registers), so each element is one
        multiply or a move."""
        xa = gl.expand_dims(gl.convert_layout(self.alu_group(x, G), gl.SliceLayout(3, self.XL4)), 3)  # [2, BT, 4, 1]
        xb = gl.expand_dims(gl.convert_layout(self.alu_group(x, H), gl.SliceLayout(2, self.XL4)), 2)  # [2, BT, 1, 4]
        prod = xa * xb
        if G != H:
            val = prod
        else:
            i = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, self.XL4))))
            j = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, self.XL4))))
            i = gl.expand_dims(gl.expand_dims(gl.expand_dims(i, 0), 1), 3)  # [1, 1, 4, 1]
            j = gl.expand_dims(gl.expand_dims(gl.expand_dims(j, 0), 1), 2)  # [1, 1, 1, 4]
            zero = gl.zeros([2, self.BT, 4, 4], gl.float32, self.XL4)
            val = gl.where(i < j, prod, zero)
            val = gl.where(i == j, prod * 0.7071067811865476, val)
            val = gl.where(((i == 1) & (j == 0)) | ((i == 2) & (j == 1)) | ((i == 3) & (j == 2)), xb + zero, val)
            val = gl.where((i == 3) & (j == 0), xa + zero, val)
            if G == 0:
                val = gl.where((i == 2) & (j == 0), zero + 1.0, val)
        return gl.reshape(val, [2, self.BT, 16])

    @gluon.jit
    def alu_group(self, x, G: gl.constexpr):
        """Columns 4 G .. 4 G + 3 of x [2, BT, 16] (registers: no data moves)."""
        lo, hi = gl.split(gl.permute(gl.reshape(x, [2, self.BT, 2, 8]), [0, 1, 3, 2]))  # columns 0..7, 8..15
        half = lo if G < 2 else hi
        a, b = gl.split(gl.permute(gl.reshape(half, [2, self.BT, 2, 4]), [0, 1, 3, 2]))
        return a if G % 2 == 0 else b

    @gluon.jit
    def features_alu(self, q, k, both, both_t):
        """FEAT_ALU: phi_q and phi_k of the chunk by the CUDA cores into ``both`` [2 BT, 128] (phi_q's rows, then
        phi_k's) and ``both_t`` [2 BT, 32]: a thread takes one row of q (times scale) or of k, and each piece of
        32 features is two blocks of products (``alu_block``, pieces as ALU_BLOCKS), joined column by column
        (feature 32 p + 2 (4 i + j) + w is block 2 p + w's (i, j)). No selection wgmmas, no selection reads."""
        side = gl.arange(0, 2, layout=gl.SliceLayout(1, gl.SliceLayout(2, self.XL3)))
        side = gl.expand_dims(gl.expand_dims(side, 1), 2)  # [2, 1, 1]
        qv = gl.expand_dims(q.load(gl.SliceLayout(0, self.XL3)).to(gl.float32), 0)  # [1, BT, 16]
        kv = gl.expand_dims(k.load(gl.SliceLayout(0, self.XL3)).to(gl.float32), 0)
        x = gl.where(side == 0, qv * self.scale, kv)  # [2, BT, 16]
        for p in gl.static_range(5):
            piece = gl.join(self.alu_block(x, ALU_G[2 * p], ALU_H[2 * p]),
                            self.alu_block(x, ALU_G[2 * p + 1], ALU_H[2 * p + 1]))  # [2, BT, 16, 2]
            piece = gl.reshape(piece, [2 * self.BT, 32]).to(both.dtype)
            if p < 4:
                both.slice(p * 32, 32, dim=1).store(piece)
            else:
                both_t.store(piece)

    @gluon.jit
    def feature_values(self, xa, xb, PIECE_KIND: gl.constexpr, QUERY: gl.constexpr):
        """feature_product's features [BT, 32] float32 (not stored)."""
        col = gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, self.FL)), 0)
        sq = self.scale * self.scale
        if PIECE_KIND == 0:
            phi = xa * (xb + gl.where(col >= 16, 1.0, 0.0))
            if QUERY:
                phi = phi * gl.where(col < 16, 0.5 * sq, self.scale)
        elif PIECE_KIND == 1:
            phi = xa * xb
            if QUERY:
                phi = phi * sq
        else:
            one = gl.where(col == 24, 1.0, 0.0)
            phi = (xa + one) * (xb + one)
            if QUERY:
                phi = phi * gl.where(col == 24, 1.0, sq)
        return phi

    @gluon.jit
    def feature_product(self, xa, xb, out, PIECE_KIND: gl.constexpr, QUERY: gl.constexpr):
        """The piece's features from its selected columns xa, xb [BT, 32] (see features_single) into ``out``."""
        out.store(self.feature_values(xa, xb, PIECE_KIND, QUERY).to(out.dtype))

    @gluon.jit
    def compute(self, ctx, walk, stage, tile, step):
        c: gl.constexpr = ctx.index
        h, col = self.unit(tile, c)
        if c == 0:
            q = stage.qa.reshape([self.BT, 16])
            k = stage.ka.reshape([self.BT, 16])
            v = stage.va.reshape([self.BT, self.BV])
        else:
            q = stage.qb.reshape([self.BT, 16])
            k = stage.kb.reshape([self.BT, 16])
            v = stage.vb.reshape([self.BT, self.BV])
        dtype: gl.constexpr = self.q_desc.dtype
        t0 = step * self.BT
        if self.FEAT_ALU:
            both = self.phiq_main.index(c)
            both_t = self.phiq_tail.index(c)
            phiq = both.slice(0, self.BT, dim=0)
            phik = both.slice(self.BT, self.BT, dim=0)
            phiq_t = both_t.slice(0, self.BT, dim=0)
            phik_t = both_t.slice(self.BT, self.BT, dim=0)
        else:
            phiq = self.phiq_main.index(c)
            phik = self.phik_main.index(c)
            phiq_t = self.phiq_tail.index(c)
            phik_t = self.phik_tail.index(c)
        S_smem = self.state_main.index(c)
        T_smem = self.state_tail.index(c)

        # the old state and the chunk's features to shared memory (operands of the chunk's wgmmas)
        gl.thread_barrier()  # the previous step's wgmmas have read phi_q, phi_k and S
        S_smem.store(walk.S.to(dtype))
        T_smem.store(walk.T.to(dtype))
        qx = q
        kx = k
        if self.SEL_REG:  # the selections' A operand from registers
            qx = q.load(self.QL)
            kx = k.load(self.QL)
        if self.FEAT_ALU:
            if self.FEAT_ALU >= 2:  # Q K^T on the tensor cores while the CUDA cores make the features
                s_early = warpgroup_mma(q, k.permute((1, 0)), gl.zeros([self.BT, self.BT], gl.float32, self.SL),
                                        use_acc=False, is_async=True)
            self.features_alu(q, k, both, both_t)
        elif self.PHIQ_REG:  # o's phi_q S wgmmas read S^T while the features are made
            fence_async_shared()
            gl.thread_barrier()
            o_inter = self.features_pipelined_o(qx, kx, phik, phik_t, S_smem, T_smem)
        elif self.OVERLAP or self.PAIRED:
            for p in gl.static_range(4):
                self.features(q, k, self.sel_main.slice(p * 64, 64), phiq.slice(p * 32, 32, dim=1),
                              phik.slice(p * 32, 32, dim=1), 0 if p == 0 else 1)
            self.features(q, k, self.sel_tail, phiq_t, phik_t, 2)
        elif (self.PROBE & PROBE_NO_FEATURES) == 0:
            if self.SEL_ASYNC == 3:
                self.features_pipelined(qx, kx, phiq, phik, phiq_t, phik_t)
            for p in gl.static_range(4 if self.SEL_ASYNC != 3 else 0):
                sel_a = self.sel_main.slice(p * 64, 32)
                sel_b = self.sel_main.slice(p * 64 + 32, 32)
                if self.SEL_ASYNC == 2:
                    self.features_both(q, k, sel_a, sel_b, phiq.slice(p * 32, 32, dim=1),
                                       phik.slice(p * 32, 32, dim=1), 0 if p == 0 else 1)
                else:
                    self.features_single(q, sel_a, sel_b, phiq.slice(p * 32, 32, dim=1), 0 if p == 0 else 1, True)
                    self.features_single(k, sel_a, sel_b, phik.slice(p * 32, 32, dim=1), 0 if p == 0 else 1, False)
            sel_a = self.sel_tail.slice(0, 32)
            sel_b = self.sel_tail.slice(32, 32)
            if self.SEL_ASYNC == 3:
                pass
            elif self.SEL_ASYNC == 2:
                self.features_both(q, k, sel_a, sel_b, phiq_t, phik_t, 2)
            else:
                self.features_single(q, sel_a, sel_b, phiq_t, 2, True)
                self.features_single(k, sel_a, sel_b, phik_t, 2, False)
        fence_async_shared()
        gl.thread_barrier()

        if self.FEAT_ALU == 3:  # phi_q S and the update in flight while P is made, then P V: one wait
            zero_o = gl.zeros([self.BT, self.BV], gl.float32, self.SL)
            o = warpgroup_mma(phiq, S_smem.permute((1, 0)), zero_o, use_acc=False, is_async=True)
            o = warpgroup_mma(phiq_t, T_smem.permute((1, 0)), o, is_async=True)
            S = warpgroup_mma(v.permute((1, 0)), phik, walk.S, is_async=True)
            T = warpgroup_mma(v.permute((1, 0)), phik_t, walk.T, is_async=True)
            s = warpgroup_mma_wait(4, deps=(s_early,))  # Q K^T, issued first
            p = self.intra_scores(s, dtype)
            o = warpgroup_mma(p, v, o, is_async=True)
            o, S, T = warpgroup_mma_wait(0, deps=(o, S, T))
            self.store_o(ctx, o, tile, h, t0, col)
            return BasedWalk(S, T)

        # intra-chunk: P = mask(1 + s + s^2 / 2), s = scale Q K^T
        if self.PROBE & PROBE_NO_INTRA:
            s = gl.zeros([self.BT, self.BT], gl.float32, self.SL) + self.scale
        elif self.FEAT_ALU == 2:
            s = warpgroup_mma_wait(0, deps=(s_early,))
        else:
            s = warpgroup_mma(q, k.permute((1, 0)), gl.zeros([self.BT, self.BT], gl.float32, self.SL), use_acc=False)
        s = s * self.scale
        rows = gl.arange(0, self.BT, layout=gl.SliceLayout(1, self.SL))
        cols = gl.arange(0, self.BT, layout=gl.SliceLayout(0, self.SL))
        causal = gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0)
        p_f = gl.where(causal, 1.0 + s + 0.5 * s * s, 0.0)
        p = gl.convert_layout(p_f.to(dtype), self.PL)

        # o = phi_q S + P V and S^T <- S^T + V^T phi_k (both feature blocks); OVERLAP: issued together
        zero_o = gl.zeros([self.BT, self.BV], gl.float32, self.SL)
        if self.PHIQ_REG:  # phi_q S is issued (features_pipelined_o): P V and the update after it, one wait
            o = warpgroup_mma(p, v, o_inter, is_async=True)
            S = warpgroup_mma(v.permute((1, 0)), phik, walk.S, is_async=True)
            T = warpgroup_mma(v.permute((1, 0)), phik_t, walk.T, is_async=True)
            o, S, T = warpgroup_mma_wait(0, deps=(o, S, T))
        elif (self.OVERLAP or self.CHAIN) and self.PROBE == 0:
            o = warpgroup_mma(phiq, S_smem.permute((1, 0)), zero_o, use_acc=False, is_async=True)
            o = warpgroup_mma(phiq_t, T_smem.permute((1, 0)), o, is_async=True)
            o = warpgroup_mma(p, v, o, is_async=True)
            S = warpgroup_mma(v.permute((1, 0)), phik, walk.S, is_async=True)
            T = warpgroup_mma(v.permute((1, 0)), phik_t, walk.T, is_async=True)
            o, S, T = warpgroup_mma_wait(0, deps=(o, S, T))
        else:
            if self.PROBE & PROBE_NO_INTER:
                o = zero_o
            else:
                o = warpgroup_mma(phiq, S_smem.permute((1, 0)), zero_o, use_acc=False)
                o = warpgroup_mma(phiq_t, T_smem.permute((1, 0)), o)
            if self.PROBE & PROBE_NO_INTRA:
                o = o + p_f  # (P's elementwise work kept: BT == BV)
            else:
                o = warpgroup_mma(p, v, o)
            if self.PROBE & PROBE_NO_UPDATE:
                S = walk.S
                T = walk.T
            else:
                S = warpgroup_mma(v.permute((1, 0)), phik, walk.S)
                T = warpgroup_mma(v.permute((1, 0)), phik_t, walk.T)
        if self.PROBE & PROBE_NO_STORE:
            if t0 < 0:  # never: o is made but not stored
                store_block(o, self.o_desc, ctx.out, [tile.b, h, t0, col])
        else:
            self.store_o(ctx, o, tile, h, t0, col)
        return BasedWalk(S, T)

    @gluon.jit
    def store_o(self, ctx, o, tile, h, t0, col):
        """o [BT, BV] of unit (h, col), tokens t0.. (rows past N dropped): by TMA through the epilogue buffer, or
        (OUT_DIRECT) from registers by gl.store (64-bit offsets)."""
        if self.OUT_DIRECT:
            rows = t0 + gl.arange(0, self.BT, layout=gl.SliceLayout(1, self.SL))
            cols = col + gl.arange(0, self.BV, layout=gl.SliceLayout(0, self.SL))
            base = self.O + tile.b.to(gl.int64) * self.sob + h.to(gl.int64) * self.soh
            ptrs = base + gl.expand_dims(rows.to(gl.int64) * self.son, 1) + gl.expand_dims(cols, 0)
            mask = gl.expand_dims(rows < self.N, 1) & gl.expand_dims(cols >= 0, 0)
            gl.store(ptrs, o.to(self.q_desc.dtype), mask=mask)
        else:
            store_block(o, self.o_desc, ctx.out, [tile.b, h, t0, col])

    @gluon.jit
    def intra_scores(self, s, dtype: gl.constexpr):
        """P = mask(1 + s' + s'^2 / 2), s' = scale s, as the register operand of P V (FEAT_ALU 3)."""
        s = s * self.scale
        rows = gl.arange(0, self.BT, layout=gl.SliceLayout(1, self.SL))
        cols = gl.arange(0, self.BT, layout=gl.SliceLayout(0, self.SL))
        causal = gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0)
        return gl.convert_layout(gl.where(causal, 1.0 + s + 0.5 * s * s, 0.0).to(dtype), self.PL)

    @gluon.jit
    def wait(self, ctx, walk):
        return walk

    @gluon.jit
    def finish(self, ctx, walk, tile):
        if self.STORE_HT:
            h, col = self.unit(tile, ctx.index)
            gl.store(self.state_ptrs(self.HT, tile.b, h, col, self.stb, self.sth, self.stf, self.stv, 0, 128, self.STL),
                     walk.S)
            gl.store(self.state_ptrs(self.HT, tile.b, h, col, self.stb, self.sth, self.stf, self.stv, 128, 32,
                                     self.TTL),
                     walk.T)


@gluon.jit
def based_fwd_gluon_kernel(q_desc, k_desc, v_desc, o_desc, SEL, H0, HT,
                           s0b, s0h, s0f, s0v, stb, sth, stf, stv, N, H, VB, scale, num_tiles,
                           STAGES: gl.constexpr, HAS_H0: gl.constexpr, STORE_HT: gl.constexpr,
                           OVERLAP: gl.constexpr = False, PAIRED: gl.constexpr = False, CHAIN: gl.constexpr = False,
                           SEL_ASYNC: gl.constexpr = 0, PROBE: gl.constexpr = 0, SEL_REG: gl.constexpr = False,
                           PHIQ_REG: gl.constexpr = False, FEAT_ALU: gl.constexpr = 0,
                           OUT_DIRECT: gl.constexpr = False, O=None, sob=0, son=0, soh=0):
    """o (and the final states) of every unit of (batch, head, 64 value columns) under Based's map; a
    persistent grid, two consumer warpgroups (num_warps = 4) and a producer warp."""
    BT: gl.constexpr = q_desc.block_type.shape[2]
    BV: gl.constexpr = v_desc.block_type.shape[3]
    F: gl.constexpr = 160
    gl.static_assert(BT == BV or OUT_DIRECT, "the scores' and the outputs' layouts are one: BT == BV")
    gl.static_assert(not OUT_DIRECT or (FEAT_ALU and O is not None), "OUT_DIRECT comes with FEAT_ALU and O")
    gl.static_assert(q_desc.block_type.shape[3] == 16, "Based's q/k head dim is 16")
    SL: gl.constexpr = wgmma_layout(BT, BV, gl.num_warps())
    STL: gl.constexpr = wgmma_layout(BV, 128, gl.num_warps())
    TTL: gl.constexpr = wgmma_layout(BV, 32, gl.num_warps())
    FL: gl.constexpr = wgmma_layout(BT, 32, gl.num_warps())
    PL: gl.constexpr = wgmma_lhs_layout(BT, BV, gl.num_warps())
    QL: gl.constexpr = wgmma_lhs_layout(BT, 32, gl.num_warps())
    gl.static_assert(not (SEL_REG or PHIQ_REG) or (SEL_ASYNC == 3 and not (OVERLAP or PAIRED) and PROBE == 0),
                     "SEL_REG and PHIQ_REG ride on SEL_ASYNC 3 (no OVERLAP, PAIRED or PROBE)")
    gl.static_assert(not FEAT_ALU or not (SEL_REG or PHIQ_REG or OVERLAP or PAIRED or PROBE),
                     "FEAT_ALU makes the features without selections (no SEL_REG, PHIQ_REG, OVERLAP, PAIRED, PROBE)")
    # PHIQ_REG: phi_q never goes to shared memory (a token buffer in place of the [2, BT, 160] one); FEAT_ALU: each
    # consumer's phi_q and phi_k rows in one buffer [2 BT, 160] (phik_main / phik_tail unused)
    PQ: gl.constexpr = 16 if PHIQ_REG else 128
    PQT: gl.constexpr = 16 if PHIQ_REG else 32
    PROWS: gl.constexpr = 2 * BT if FEAT_ALU else BT
    PK: gl.constexpr = 16 if FEAT_ALU else 128
    PKT: gl.constexpr = 16 if FEAT_ALU else 32
    XL3: gl.constexpr = gl.BlockedLayout([1, 1, 16], [1, 32, 1], [2, gl.num_warps() // 2, 1], [2, 1, 0])
    XL4: gl.constexpr = gl.BlockedLayout([1, 1, 4, 4], [1, 32, 1, 1], [2, gl.num_warps() // 2, 1, 1], [3, 2, 1, 0])
    # 64-byte swizzle: 32 columns, so a feature piece of 32 is one swizzle atom wide
    wide: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
    narrow: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16, rank=2)
    dt: gl.constexpr = q_desc.dtype
    op = BasedForward(q_desc, k_desc, v_desc, o_desc, SEL, H0, HT, s0b, s0h, s0f, s0v, stb, sth, stf, stv,
                      N, H, VB, scale,
                      gl.allocate_shared_memory(dt, [256, 16], narrow),
                      gl.allocate_shared_memory(dt, [64, 16], narrow),
                      gl.allocate_shared_memory(dt, [2, PROWS, PQ], narrow if PHIQ_REG else wide),
                      gl.allocate_shared_memory(dt, [2, PROWS, PQT], narrow if PHIQ_REG else wide),
                      gl.allocate_shared_memory(dt, [2, BT, PK], narrow if FEAT_ALU else wide),
                      gl.allocate_shared_memory(dt, [2, BT, PKT], narrow if FEAT_ALU else wide),
                      gl.allocate_shared_memory(dt, [2, BV, 128], wide), gl.allocate_shared_memory(dt, [2, BV, 32], wide),
                      BT, BV, F, HAS_H0, STORE_HT, OVERLAP, PAIRED, CHAIN, SEL_ASYNC, PROBE, SEL_REG, PHIQ_REG,
                      FEAT_ALU, O, sob, son, soh, OUT_DIRECT, XL3, XL4, SL, STL, TTL, FL, PL, QL)
    stages = BasedChunk(ring(q_desc, STAGES), ring(k_desc, STAGES), ring(v_desc, STAGES),
                        ring(q_desc, STAGES), ring(k_desc, STAGES), ring(v_desc, STAGES))
    # a tensor even where the launch specialized num_tiles == 1 to a constant (the template's _Pipeline holds a
    # tensor: B1 with two units compiled to a CompilationError, H100 run 7)
    num_tiles = gl.program_id(0) * 0 + num_tiles
    run(op, Layout(o_desc, STAGES, CONSUMERS=2, LATE_RELEASE=0), stages, num_tiles)


# --------------------------------------------------------------------------------------------
# host side

SQRT_HALF = math.sqrt(0.5)


def feature_pairs() -> list[tuple[int, int]]:
    """The kernel's F features as pairs (a, b) of x~ = [x_0 .. x_15, 1] columns (16: the constant 1;
    -1: a padding feature, 0), in the order its pieces of 32 take them (``features``' PIECE_KIND): the
    squares, the linear ones, the pairs a < b, the constant (tail column 24), padding."""
    pairs = ([(a, a) for a in range(DK)] + [(a, DK) for a in range(DK)]
             + [(a, b) for a in range(DK) for b in range(a + 1, DK)] + [(DK, DK)])
    assert pairs.index((DK, DK)) == 128 + 24
    return pairs + [(-1, -1)] * (FEATURES - len(pairs))


def feature_pairs_alu() -> list[tuple[int, int]]:
    """FEAT_ALU's F features as pairs of x~ = [x_0 .. x_15, 1] columns (16: the constant; (-1, -1): 0), in the
    kernel's order (``features_alu``): feature 32 p + 2 (4 i + j) + w is block ALU_BLOCKS[2 p + w] = (G, H)'s (i, j):
    (4 G + i, 4 H + j) off the diagonal blocks and above their diagonals, squares on it; below it the linear
    features ((1, 0), (2, 1), (3, 2): x_(4 G + j); (3, 0): x_(4 G + 3)), block (0, 0)'s (2, 0) the constant."""
    pairs = [(-1, -1)] * FEATURES
    for p in range(FEATURES // PIECE):
        for w in range(2):
            G, H = ALU_BLOCKS[2 * p + w]
            for i in range(4):
                for j in range(4):
                    f = PIECE * p + 2 * (4 * i + j) + w
                    a, b = 4 * G + i, 4 * H + j
                    if G != H or i <= j:
                        pairs[f] = (a, b)
                    elif (i, j) in ((1, 0), (2, 1), (3, 2)):
                        pairs[f] = (b, DK)
                    elif (i, j) == (3, 0):
                        pairs[f] = (a, DK)
                    elif (i, j) == (2, 0) and G == 0:
                        pairs[f] = (DK, DK)
    return pairs


def alu_features(x: torch.Tensor) -> torch.Tensor:
    """FEAT_ALU's features of x (..., 16) (the query side: x = scale q): (..., F) in feature_pairs_alu's order,
    squares times sqrt(1/2) (on both sides: phi(scale q) . phi(k) = 1 + s + s^2 / 2)."""
    pairs = feature_pairs_alu()
    xt = torch.cat([x, torch.ones_like(x[..., :1])], -1)
    a = torch.tensor([max(pa, 0) if pa >= 0 else DK for pa, _ in pairs], device=x.device)
    b = torch.tensor([pb if pb >= 0 else DK for _, pb in pairs], device=x.device)
    w = torch.tensor([0.0 if pa < 0 else (SQRT_HALF if pa == pb < DK else 1.0) for pa, pb in pairs],
                     dtype=x.dtype, device=x.device)
    return xt[..., a] * xt[..., b] * w


_TABLES: dict = {}


def selection(dtype: torch.dtype, device) -> torch.Tensor:
    """SEL [2, F, 16] in ``dtype``: Sel_a^T, Sel_b^T (row f picks column a, resp. b, of x; none for the
    constant 1 and padding). The kernel reads it as ``kernel_selection``'s pieces."""
    key = (dtype, str(device))
    if key not in _TABLES:
        sel = torch.zeros(2, FEATURES, DK, dtype=torch.float32)
        for f, pair in enumerate(feature_pairs()):
            for side, x in enumerate(pair):
                if 0 <= x < DK:
                    sel[side, f, x] = 1.0
        _TABLES[key] = sel.to(dtype).to(device)
    return _TABLES[key]


def kernel_selection(dtype: torch.dtype, device) -> torch.Tensor:
    """The selections as the kernel reads them: [2 F, 16], piece p of 32 features in rows 64 p .. 64 p + 63
    (its Sel_a^T rows, then its Sel_b^T rows: one K = 16, N = 64 wgmma selects both factors)."""
    key = ("pieces", dtype, str(device))
    if key not in _TABLES:
        sel = selection(dtype, device)
        _TABLES[key] = sel.view(2, FEATURES // PIECE, PIECE, DK).transpose(0, 1).reshape(2 * FEATURES, DK).contiguous()
    return _TABLES[key]


def feature_constants(scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(c_a, c_b, w) [F] float32: what the kernel adds to the selected columns and the query side's weights
    (``features`` computes the same from the column index), so phi_q . phi_k = 1 + s + s^2 / 2."""
    ca, cb, w = (torch.zeros(FEATURES) for _ in range(3))
    for f, (a, b) in enumerate(feature_pairs()):
        if a == DK:
            ca[f] = cb[f] = w[f] = 1.0
        elif b == DK:
            cb[f], w[f] = 1.0, scale
        elif a >= 0:
            w[f] = scale * scale * (0.5 if a == b else 1.0)
    return ca, cb, w


def emulate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x0: torch.Tensor | None, scale: float, chunk: int = 64,
            alu: bool = False):
    """The kernel's math in float64 torch (the features from the selections and constants, or with ``alu``
    FEAT_ALU's, the chunked walk with S^T in the kernel's rows): (o, final kernel-row state). For tests of the
    tables and maps on the CPU (the kernel itself cannot run in the interpreter)."""
    B, N, H, Dv = v.shape
    qd, kd, vd = q.double(), k.double(), v.double()
    if alu:
        phi_q, phi_k = alu_features(qd * scale), alu_features(kd)
    else:
        sel = selection(torch.float64, q.device)
        ca, cb, w = (t.double().to(q.device) for t in feature_constants(scale))
        phi_q = (qd @ sel[0].T + ca) * (qd @ sel[1].T + cb) * w  # (B, N, H, F)
        phi_k = (kd @ sel[0].T + ca) * (kd @ sel[1].T + cb)
    S = x0.double().clone() if x0 is not None else torch.zeros(B, H, FEATURES, Dv, dtype=torch.float64)
    o = torch.empty(B, N, H, Dv, dtype=torch.float64)
    for t0 in range(0, N, chunk):
        t1 = min(N, t0 + chunk)
        s = torch.einsum("bihd,bjhd->bhij", qd[:, t0:t1], kd[:, t0:t1]) * scale
        n = t1 - t0
        p = torch.where(torch.ones(n, n, dtype=torch.bool).tril(), 1 + s + 0.5 * s * s, 0.0)
        o[:, t0:t1] = (torch.einsum("bhij,bjhv->bihv", p, vd[:, t0:t1])
                       + torch.einsum("bihf,bhfv->bihv", phi_q[:, t0:t1], S))
        S = S + torch.einsum("bjhf,bjhv->bhfv", phi_k[:, t0:t1], vd[:, t0:t1])
    return o, S


def _maps(device, alu: bool = False):
    """(rows of the op's state layout each kernel feature reads on compress: two [F] index tensors and
    their [F] weights; the kernel feature each op-layout row reads on expand: [1 + Dk + Dk^2] indices and
    weights). ``alu``: FEAT_ALU's features (its squares carry sqrt(1/2) on the key side, so their rows are the
    op's rows as they are)."""
    key = ("maps", str(device), alu)
    if key not in _TABLES:
        pairs = feature_pairs_alu() if alu else feature_pairs()
        ra, rb, wc = [], [], []
        rows = 1 + DK + DK * DK
        fe, we = [0] * rows, [0.0] * rows
        for f, (a, b) in enumerate(pairs):
            if a == DK:  # the constant: row 0
                ra.append(0), rb.append(0), wc.append(0.5)
                fe[0], we[0] = f, 1.0
            elif b == DK:  # linear: row 1 + a
                ra.append(1 + a), rb.append(1 + a), wc.append(0.5)
                fe[1 + a], we[1 + a] = f, 1.0
            elif alu and a == b >= 0:  # FEAT_ALU's square: the op's row h[aa] itself
                ra.append(1 + DK + a * DK + a), rb.append(1 + DK + a * DK + a), wc.append(0.5)
                fe[1 + DK + a * DK + a], we[1 + DK + a * DK + a] = f, 1.0
            elif a >= 0:  # the pair's two rows (the same row on the diagonal: sqrt(2) h[aa] in all)
                ra.append(1 + DK + a * DK + b), rb.append(1 + DK + b * DK + a), wc.append(SQRT_HALF)
                fe[1 + DK + a * DK + b], we[1 + DK + a * DK + b] = f, SQRT_HALF
                fe[1 + DK + b * DK + a], we[1 + DK + b * DK + a] = f, SQRT_HALF
            else:
                ra.append(0), rb.append(0), wc.append(0.0)
        t = lambda x, dt: torch.tensor(x, dtype=dt, device=device)  # noqa: E731
        _TABLES[key] = (t(ra, torch.long), t(rb, torch.long), t(wc, torch.float32), t(fe, torch.long),
                        t(we, torch.float32))
    return _TABLES[key]


def compress(h: torch.Tensor, alu: bool = False) -> torch.Tensor:
    """An op-layout state (B, H, 1 + 16 + 256, Dv) as the kernel's rows: (B, H, F, Dv) float32, contiguous (alu:
    FEAT_ALU's rows)."""
    ra, rb, wc, _, _ = _maps(h.device, alu)
    hf = h.float()
    return (hf[:, :, ra] + hf[:, :, rb]) * wc[:, None]


def expand(x: torch.Tensor, alu: bool = False) -> torch.Tensor:
    """The kernel's rows (B, H, F, Dv) as the op's state layout (B, H, 1 + 16 + 256, Dv) (alu: FEAT_ALU's rows)."""
    _, _, _, fe, we = _maps(x.device, alu)
    return x[:, :, fe] * we[:, None]


def fits(q, k, v, g, beta=None, d_skip=None, z=None) -> str | None:
    """None where this kernel takes these (Based) inputs, else why not (the tl kernels run them)."""
    if g is not None or beta is not None or d_skip is not None or z is not None:
        return "a decay or Mamba-2's terms"
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return "not bf16/fp16"
    if q.shape[-1] != DK or q.shape[2] != v.shape[2] or v.shape[-1] % BV_BASED:
        return f"Dk {q.shape[-1]} (takes {DK}), grouped heads, or Dv {v.shape[-1]} (a multiple of {BV_BASED})"
    if (v.shape[2] * (v.shape[-1] // BV_BASED)) % 2:
        return "an odd number of (head, value block) units a batch row"
    if q.device.type != "cuda" or v.numel() == 0:
        return "not a CUDA tensor, or empty"
    for t in (q, k, v):
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any((s * t.element_size()) % 16 for s in t.stride()[:-1]):
            return "strides or alignment TMA does not take"
    return None


def _head_major(t: torch.Tensor):
    B, N, H, D = t.shape
    return [B, H, N, D], [t.stride(0), t.stride(2), t.stride(1), t.stride(3)]


def launch_args(q, k, v, x0, o, xt, scale: float, stages: int = 2, overlap: bool = False, probe: int = 0,
                paired: bool = False, chain: bool = False, sel_async: int = 0, sel_reg: bool = False,
                phiq_reg: bool = False, feat_alu: int = 0, out_direct: bool = False, operand=None):
    """(grid, arguments by name, num_warps) of based_fwd_gluon_kernel; x0, xt: kernel-row states or None;
    overlap: the kernel's OVERLAP. ``operand(t, block, shape, strides)`` makes the descriptors (default
    gluon_descriptor; a keyed launch passes tiles.launch.TmaOperand, as gluon_forward's)."""
    from tilecore.tiles.launch import gluon_descriptor

    gluon_descriptor = operand or gluon_descriptor
    from tilecore.tiles.schedule import persistent_programs

    B, N, H, Dv = v.shape
    BT, BV = BT_BASED, BV_BASED
    VB = Dv // BV
    out_direct = bool(out_direct and feat_alu)
    # (OUT_DIRECT: o's descriptor only sizes the template's epilogue buffer, 8 rows; the kernel stores o itself)
    descs = [gluon_descriptor(t, [1, 1, 8 if (out_direct and t is o) else BT, blk], *_head_major(t))
             for t, blk in ((q, DK), (k, DK), (v, BV), (o, BV))]
    sel = kernel_selection(q.dtype, q.device)
    dummy = torch.empty(1, dtype=torch.float32, device=v.device)
    st = lambda t: tuple(t.stride()) if t is not None else (0,) * 4  # noqa: E731
    s0, sht = st(x0), st(xt)
    num_tiles = B * H * VB // 2
    args = dict(q_desc=descs[0], k_desc=descs[1], v_desc=descs[2], o_desc=descs[3], SEL=sel,
                H0=x0 if x0 is not None else dummy, HT=xt if xt is not None else dummy,
                s0b=s0[0], s0h=s0[1], s0f=s0[2], s0v=s0[3], stb=sht[0], sth=sht[1], stf=sht[2], stv=sht[3],
                N=N, H=H, VB=VB, scale=scale, num_tiles=num_tiles, STAGES=stages, HAS_H0=x0 is not None,
                STORE_HT=xt is not None,
                OVERLAP=overlap)
    if paired and not overlap:  # (absent otherwise: the launches' keys as before)
        args["PAIRED"] = True
    if chain and not overlap:
        args["CHAIN"] = True
    if sel_async and not (overlap or paired):
        args["SEL_ASYNC"] = sel_async
    if probe:  # (timing probes only: the kernel's PROBE)
        args["PROBE"] = probe
    if sel_reg:
        args["SEL_REG"] = True
    if phiq_reg:
        args["PHIQ_REG"] = True
    if feat_alu:  # (x0, xt then in feature_pairs(alu=True)'s rows: compress / expand with alu=True)
        args["FEAT_ALU"] = int(feat_alu)
        args.pop("SEL_ASYNC", None)
    if out_direct:
        args.update(O=o, sob=o.stride(0), son=o.stride(1), soh=o.stride(2), OUT_DIRECT=True)
    return (persistent_programs(num_tiles, v.device),), args, 4


def forward(q, k, v, h0, scale: float, final_state: bool, stages: int = 2, overlap: bool | None = None,
            paired: bool | None = None, chain: bool | None = None, sel_async: int | None = None,
            sel_reg: bool | None = None, phiq_reg: bool | None = None, feat_alu: int | None = None,
            out_direct: bool | None = None, operand=None, launch=None):
    """(o, final state (B, H, 1 + 16 + 256, Dv) float32 or None) by the Gluon kernel (``fits`` must have
    said None). h0: the op-layout initial state or None. overlap: the kernel's OVERLAP (None:
    configs.GLUON_BASED_OVERLAP). paired, chain, sel_async: the kernel's PAIRED, CHAIN and SEL_ASYNC (None:
    configs.GLUON_BASED_PAIRED, GLUON_BASED_CHAIN, GLUON_BASED_SEL_ASYNC); sel_reg, phiq_reg: SEL_REG and PHIQ_REG
    (None: configs.GLUON_BASED_SEL_REG, GLUON_BASED_PHIQ_REG; they need SEL_ASYNC 3, else off). ``operand``:
    launch_args's (the descriptors' maker); ``launch(grid, args, num_warps)``: the launch (default: the kernel's
    own; a keyed path passes a CachedLaunch's, as launch.gluon_forward_keyed does for gluon_forward)."""
    from tilecore.ops.linear_attention import configs

    overlap = configs.GLUON_BASED_OVERLAP if overlap is None else overlap
    paired = configs.GLUON_BASED_PAIRED if paired is None else paired
    chain = configs.GLUON_BASED_CHAIN if chain is None else chain
    sel_async = configs.GLUON_BASED_SEL_ASYNC if sel_async is None else sel_async
    sel_reg = configs.GLUON_BASED_SEL_REG if sel_reg is None else sel_reg
    phiq_reg = configs.GLUON_BASED_PHIQ_REG if phiq_reg is None else phiq_reg
    if sel_async != 3 or overlap or paired:
        sel_reg = phiq_reg = False
    feat_alu = configs.GLUON_BASED_FEAT_ALU if feat_alu is None else feat_alu
    out_direct = configs.GLUON_BASED_OUT_DIRECT if out_direct is None else out_direct
    if feat_alu:  # (its own feature path: the selection switches do not apply)
        overlap = paired = sel_reg = phiq_reg = False
    B, N, H, Dv = v.shape
    o = torch.empty(B, N, H, Dv, dtype=v.dtype, device=v.device)
    x0 = compress(h0, feat_alu) if h0 is not None else None
    xt = torch.empty(B, H, FEATURES, Dv, dtype=torch.float32, device=v.device) if final_state else None
    grid, args, warps = launch_args(q, k, v, x0, o, xt, scale, stages, overlap, paired=paired, chain=chain,
                                    sel_async=sel_async, sel_reg=sel_reg, phiq_reg=phiq_reg, feat_alu=feat_alu,
                                    out_direct=out_direct, operand=operand)
    if launch is None:
        based_fwd_gluon_kernel[grid](**args, num_warps=warps)
    else:
        launch(grid, args, warps)
    ht = None
    if final_state:
        ht = expand(xt, feat_alu)
        if h0 is not None:  # the initial state's part the symmetric rows do not carry, back as it was
            ht += h0.float() - expand(x0, feat_alu)
    return o, ht


# --------------------------------------------------------------------------------------------
# compile report (no GPU): compile_report(states) compiles the kernel for sm_90a; TRITON_INTERPRET must be unset


def compile_report(states: bool = True, stages: int = 2, overlap: bool = False, probe: int = 0,
                   paired: bool = False, chain: bool = False, sel_async: int = 0, sel_reg: bool = False,
                   phiq_reg: bool = False, feat_alu: int = 0, out_direct: bool = False) -> dict:
    from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources

    B, N, H, Dv, bf = 2, 4096, 16, 64, torch.bfloat16
    q = torch.empty(B, N, H, DK, dtype=bf)
    v = torch.empty(B, N, H, Dv, dtype=bf)
    x = torch.empty(B, H, FEATURES, Dv, dtype=torch.float32) if states else None
    grid, args, warps = launch_args(q, q, v, x, torch.empty_like(v), x, 0.25, stages, overlap, probe, paired, chain,
                                    sel_async, sel_reg, phiq_reg, feat_alu, out_direct)
    compiled = compile_kernel(based_fwd_gluon_kernel, args, num_warps=warps)
    r = resources(compiled)
    return dict(case=f"based states={states} stages={stages} overlap={overlap} sel_async={sel_async} "
                     f"sel_reg={sel_reg} phiq_reg={phiq_reg} feat_alu={feat_alu} out_direct={out_direct}", spill_bytes=r.spill_stores,
                registers=r.registers,
                shared=r.shared, threads=r.threads, wgmma_serialized=r.wgmma_serialized,
                **has_hopper_instructions(compiled.asm["ptx"]))
