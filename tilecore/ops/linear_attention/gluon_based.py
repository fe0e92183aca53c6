"""Based's linear attention forward for Hopper on the tiles template (tilecore/tiles/gluon/pipeline.py):
feature dim Dk = 16 (Based's 2nd-order Taylor map), no decay, value dims a multiple of 64.

Based's map phi(x) = [1, x, vec(x x^T) / sqrt(2)] (1 + 16 + 256 features; phi(q) . phi(k) = 1 + s + s^2 / 2
with s = scale q . k) has 136 distinct quadratic products (x_a x_b, a <= b), so this kernel runs on the
153 SYMMETRIC features, padded to F = 160 (``feature_pairs``): the constant 1, the 16 linear ones, the 16
squares times sqrt(1/2) and the 120 pairs a < b (scale q on the query side: phi(scale q) . phi(k) = 1 + s + s^2 / 2).
The CUDA cores make them: a thread takes one row of scale q or of k, and each piece of 32 features is two 4 x 4
blocks of products of column groups (``features_alu``; ALU_BLOCKS), rounded once to bf16 into shared memory.

The template's parts:

* a tile is two units of (head, BV = 64 value columns) of one batch row (consecutive units: two heads at
  Dv = 64); ``setup`` gives cdiv(N, BT) steps, one chunk of BT = 64 tokens each;
* a stage is each unit's q, k [BT, 16] and v [BT, BV], TMA-loaded by the 1-warp producer through 4-D
  descriptors of (B, H, N, D) views (tokens past N arrive as zeros: their k features are 0 but the constant,
  whose v row is 0, so they add nothing);
* consumer c (a warpgroup) owns unit c: its state, held TRANSPOSED, S^T [BV, F] float32 (80 registers a
  thread), lives in registers as a wgmma accumulator for the whole walk (as [BV, F] its M is the 64 value
  columns, so the 160 features are the instruction's N). Each step (chunk):

      phi_q, phi_k [BT, F]  by the CUDA cores (blocks of products), to shared memory
      P    = mask(1 + s + s^2 / 2),  s = scale Q K^T                       wgmma, Q and K from shared memory
      o    = phi_q S + P V                                                 S^T as bf16 in shared memory (B operand)
      S^T <- S^T + V^T phi_k                                               V^T and phi_k from shared memory
      (o's three wgmmas and the update's two issued async, one wait); o TMA-stored (rows past N clipped)

Rounding: phi_q, phi_k, P and S go to the tensor cores in the input dtype (bf16/fp16), as la_fwd_kernel's
(decision 8 of notes/linear_attention); S accumulates in float32.

States in memory are the op's layout [1, Dk, Dk x Dk] rows (all Dk^2 quadratic products, each / sqrt(2));
the host maps an initial state to the kernel's symmetric rows (``compress``: the pair (a, b)'s row carries
(h[ab] + h[ba]) / sqrt(2), the square's row h[aa]) and the final state back (``expand``), adding the
initial state's antisymmetric part back so the final state is the recurrence's, element for element.
"""
import math

import torch
from triton.experimental import gluon

from tilecore.tiles.gluon import Layout, ring, run, stage_struct, store_block, struct, wgmma_layout, wgmma_lhs_layout
from tilecore.tiles.gluon.compat import fence_async_shared, gl, tma, warpgroup_mma, warpgroup_mma_wait

DK = 16  # Based's feature dim (the kernel's q/k head dim)
FEATURES = 160  # 1 + 16 + 136 symmetric features, padded to 5 pieces of 32
PIECE = 32  # features built a step (two [BT, PIECE] float32 tiles live)
# the blocks of products (column groups (G, H) of 4), two a piece of 32 features: the 6 blocks G < H, then
# the 4 diagonal ones (their upper triangles and squares, the linear features and the constant in their lower ones)
ALU_BLOCKS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3), (0, 0), (1, 1), (2, 2), (3, 3))
ALU_G = gl.constexpr(tuple(b[0] for b in ALU_BLOCKS))
ALU_H = gl.constexpr(tuple(b[1] for b in ALU_BLOCKS))
BT_BASED = 64  # tokens a chunk (a wgmma's M)
BV_BASED = 64  # value columns a consumer


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
    phi_main: object  # [2, 2 BT, 128]: each consumer's phi_q rows (the A operand of phi_q S), then its phi_k rows
    # (the B operand of V^T phi_k)
    phi_tail: object  # [2, 2 BT, 32]: features 128..159
    state_main: object  # [2, BV, 128]: each consumer's S^T in the input dtype (S: the B operand of phi_q S)
    state_tail: object  # [2, BV, 32]
    BT: gl.constexpr
    BV: gl.constexpr
    F: gl.constexpr
    HAS_H0: gl.constexpr
    STORE_HT: gl.constexpr
    XL3: gl.constexpr  # [2 (q, k), BT, 16] a thread a row of q or k
    XL4: gl.constexpr  # [2, BT, 4, 4] a block of products
    SL: gl.constexpr  # [BT, BT] scores and [BT, BV] outputs (BT == BV)
    STL: gl.constexpr  # [BV, 128] state
    TTL: gl.constexpr  # [BV, 32] state's tail
    PL: gl.constexpr  # P as the register operand of P V

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
    def alu_block(self, x, G: gl.constexpr, H: gl.constexpr):
        """Block (G, H) of the products, [2, BT, 16] float32 (column 4 i + j), from x's column groups G, H
        ([2, BT, 4] each, a thread's registers): x_(4G + i) x_(4H + j); on a diagonal block (G == H) the squares
        times sqrt(1/2), the lower triangle the linear features (i, j) = (1, 0), (2, 1), (3, 2): x_(4G + j), (3, 0):
        x_(4G + 3), and block (0, 0)'s (2, 0) the constant 1; the rest 0 (feature_pairs lists them).
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
        """phi_q and phi_k of the chunk by the CUDA cores into ``both`` [2 BT, 128] (phi_q's rows, then
        phi_k's) and ``both_t`` [2 BT, 32]: a thread takes one row of q (times scale) or of k, and each piece of
        32 features is two blocks of products (``alu_block``, pieces as ALU_BLOCKS), joined column by column
        (feature 32 p + 2 (4 i + j) + w is block 2 p + w's (i, j))."""
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
        both = self.phi_main.index(c)
        both_t = self.phi_tail.index(c)
        phiq = both.slice(0, self.BT, dim=0)
        phik = both.slice(self.BT, self.BT, dim=0)
        phiq_t = both_t.slice(0, self.BT, dim=0)
        phik_t = both_t.slice(self.BT, self.BT, dim=0)
        S_smem = self.state_main.index(c)
        T_smem = self.state_tail.index(c)

        # the old state and the chunk's features to shared memory (operands of the chunk's wgmmas)
        gl.thread_barrier()  # the previous step's wgmmas have read phi_q, phi_k and S
        S_smem.store(walk.S.to(dtype))
        T_smem.store(walk.T.to(dtype))
        self.features_alu(q, k, both, both_t)
        fence_async_shared()
        gl.thread_barrier()

        # intra-chunk: P = mask(1 + s + s^2 / 2), s = scale Q K^T
        s = warpgroup_mma(q, k.permute((1, 0)), gl.zeros([self.BT, self.BT], gl.float32, self.SL), use_acc=False)
        s = s * self.scale
        rows = gl.arange(0, self.BT, layout=gl.SliceLayout(1, self.SL))
        cols = gl.arange(0, self.BT, layout=gl.SliceLayout(0, self.SL))
        causal = gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0)
        p_f = gl.where(causal, 1.0 + s + 0.5 * s * s, 0.0)
        p = gl.convert_layout(p_f.to(dtype), self.PL)

        # o = phi_q S + P V and S^T <- S^T + V^T phi_k (both feature blocks): issued together, one wait
        zero_o = gl.zeros([self.BT, self.BV], gl.float32, self.SL)
        o = warpgroup_mma(phiq, S_smem.permute((1, 0)), zero_o, use_acc=False, is_async=True)
        o = warpgroup_mma(phiq_t, T_smem.permute((1, 0)), o, is_async=True)
        o = warpgroup_mma(p, v, o, is_async=True)
        S = warpgroup_mma(v.permute((1, 0)), phik, walk.S, is_async=True)
        T = warpgroup_mma(v.permute((1, 0)), phik_t, walk.T, is_async=True)
        o, S, T = warpgroup_mma_wait(0, deps=(o, S, T))
        store_block(o, self.o_desc, ctx.out, [tile.b, h, t0, col])
        return BasedWalk(S, T)

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
def based_fwd_gluon_kernel(q_desc, k_desc, v_desc, o_desc, H0, HT,
                           s0b, s0h, s0f, s0v, stb, sth, stf, stv, N, H, VB, scale, num_tiles,
                           STAGES: gl.constexpr, HAS_H0: gl.constexpr, STORE_HT: gl.constexpr):
    """o (and the final states) of every unit of (batch, head, 64 value columns) under Based's map; a
    persistent grid, two consumer warpgroups (num_warps = 4) and a producer warp."""
    BT: gl.constexpr = q_desc.block_type.shape[2]
    BV: gl.constexpr = v_desc.block_type.shape[3]
    F: gl.constexpr = 160
    gl.static_assert(BT == BV, "the scores' and the outputs' layouts are one: BT == BV")
    gl.static_assert(q_desc.block_type.shape[3] == 16, "Based's q/k head dim is 16")
    SL: gl.constexpr = wgmma_layout(BT, BV, gl.num_warps())
    STL: gl.constexpr = wgmma_layout(BV, 128, gl.num_warps())
    TTL: gl.constexpr = wgmma_layout(BV, 32, gl.num_warps())
    PL: gl.constexpr = wgmma_lhs_layout(BT, BV, gl.num_warps())
    XL3: gl.constexpr = gl.BlockedLayout([1, 1, 16], [1, 32, 1], [2, gl.num_warps() // 2, 1], [2, 1, 0])
    XL4: gl.constexpr = gl.BlockedLayout([1, 1, 4, 4], [1, 32, 1, 1], [2, gl.num_warps() // 2, 1, 1], [3, 2, 1, 0])
    # 64-byte swizzle: 32 columns, so a feature piece of 32 is one swizzle atom wide
    wide: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
    dt: gl.constexpr = q_desc.dtype
    op = BasedForward(q_desc, k_desc, v_desc, o_desc, H0, HT, s0b, s0h, s0f, s0v, stb, sth, stf, stv,
                      N, H, VB, scale,
                      gl.allocate_shared_memory(dt, [2, 2 * BT, 128], wide),
                      gl.allocate_shared_memory(dt, [2, 2 * BT, 32], wide),
                      gl.allocate_shared_memory(dt, [2, BV, 128], wide),
                      gl.allocate_shared_memory(dt, [2, BV, 32], wide),
                      BT, BV, F, HAS_H0, STORE_HT, XL3, XL4, SL, STL, TTL, PL)
    stages = BasedChunk(ring(q_desc, STAGES), ring(k_desc, STAGES), ring(v_desc, STAGES),
                        ring(q_desc, STAGES), ring(k_desc, STAGES), ring(v_desc, STAGES))
    # a tensor even where the launch specialized num_tiles == 1 to a constant (the template's _Pipeline holds a
    # tensor: B1 with two units compiled to a CompilationError on the H100)
    num_tiles = gl.program_id(0) * 0 + num_tiles
    run(op, Layout(o_desc, STAGES, CONSUMERS=2, LATE_RELEASE=0), stages, num_tiles)


# --------------------------------------------------------------------------------------------
# host side

SQRT_HALF = math.sqrt(0.5)


def feature_pairs() -> list[tuple[int, int]]:
    """The kernel's F features as pairs of x~ = [x_0 .. x_15, 1] columns (16: the constant; (-1, -1): 0), in its
    order (``features_alu``): feature 32 p + 2 (4 i + j) + w is block ALU_BLOCKS[2 p + w] = (G, H)'s (i, j):
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


def features(x: torch.Tensor) -> torch.Tensor:
    """The kernel's features of x (..., 16) (the query side: x = scale q): (..., F) in feature_pairs' order,
    squares times sqrt(1/2) (on both sides: phi(scale q) . phi(k) = 1 + s + s^2 / 2)."""
    pairs = feature_pairs()
    xt = torch.cat([x, torch.ones_like(x[..., :1])], -1)
    a = torch.tensor([max(pa, 0) if pa >= 0 else DK for pa, _ in pairs], device=x.device)
    b = torch.tensor([pb if pb >= 0 else DK for _, pb in pairs], device=x.device)
    w = torch.tensor([0.0 if pa < 0 else (SQRT_HALF if pa == pb < DK else 1.0) for pa, pb in pairs],
                     dtype=x.dtype, device=x.device)
    return xt[..., a] * xt[..., b] * w


_TABLES: dict = {}


def emulate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x0: torch.Tensor | None, scale: float,
            chunk: int = 64):
    """The kernel's math in float64 torch (its features, the chunked walk with S^T in the kernel's rows): (o, final
    kernel-row state). For tests of the tables and maps on the CPU (the kernel itself cannot run in the
    interpreter)."""
    B, N, H, Dv = v.shape
    qd, kd, vd = q.double(), k.double(), v.double()
    phi_q, phi_k = features(qd * scale), features(kd)
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


def _maps(device):
    """(rows of the op's state layout each kernel feature reads on compress: two [F] index tensors and
    their [F] weights; the kernel feature each op-layout row reads on expand: [1 + Dk + Dk^2] indices and
    weights). The squares carry sqrt(1/2) on the key side, so their rows are the op's rows as they are."""
    key = ("maps", str(device))
    if key not in _TABLES:
        ra, rb, wc = [], [], []
        rows = 1 + DK + DK * DK
        fe, we = [0] * rows, [0.0] * rows
        for f, (a, b) in enumerate(feature_pairs()):
            if a == DK:  # the constant: row 0
                ra.append(0), rb.append(0), wc.append(0.5)
                fe[0], we[0] = f, 1.0
            elif b == DK:  # linear: row 1 + a
                ra.append(1 + a), rb.append(1 + a), wc.append(0.5)
                fe[1 + a], we[1 + a] = f, 1.0
            elif a == b >= 0:  # a square: the op's row h[aa] itself
                ra.append(1 + DK + a * DK + a), rb.append(1 + DK + a * DK + a), wc.append(0.5)
                fe[1 + DK + a * DK + a], we[1 + DK + a * DK + a] = f, 1.0
            elif a >= 0:  # the pair's two rows
                ra.append(1 + DK + a * DK + b), rb.append(1 + DK + b * DK + a), wc.append(SQRT_HALF)
                fe[1 + DK + a * DK + b], we[1 + DK + a * DK + b] = f, SQRT_HALF
                fe[1 + DK + b * DK + a], we[1 + DK + b * DK + a] = f, SQRT_HALF
            else:
                ra.append(0), rb.append(0), wc.append(0.0)
        t = lambda x, dt: torch.tensor(x, dtype=dt, device=device)  # noqa: E731
        _TABLES[key] = (t(ra, torch.long), t(rb, torch.long), t(wc, torch.float32), t(fe, torch.long),
                        t(we, torch.float32))
    return _TABLES[key]


def compress(h: torch.Tensor) -> torch.Tensor:
    """An op-layout state (B, H, 1 + 16 + 256, Dv) as the kernel's rows: (B, H, F, Dv) float32, contiguous."""
    ra, rb, wc, _, _ = _maps(h.device)
    hf = h.float()
    return (hf[:, :, ra] + hf[:, :, rb]) * wc[:, None]


def expand(x: torch.Tensor) -> torch.Tensor:
    """The kernel's rows (B, H, F, Dv) as the op's state layout (B, H, 1 + 16 + 256, Dv)."""
    _, _, _, fe, we = _maps(x.device)
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


def launch_args(q, k, v, x0, o, xt, scale: float, stages: int = 3, operand=None):
    """(grid, arguments by name, num_warps) of based_fwd_gluon_kernel; x0, xt: kernel-row states or None.
    ``operand(t, block, shape, strides)`` makes the descriptors (default gluon_descriptor; a keyed launch passes
    tiles.launch.TmaOperand, as gluon_forward's)."""
    from tilecore.tiles.launch import gluon_descriptor

    gluon_descriptor = operand or gluon_descriptor
    from tilecore.tiles.schedule import persistent_programs

    B, N, H, Dv = v.shape
    BT, BV = BT_BASED, BV_BASED
    VB = Dv // BV
    descs = [gluon_descriptor(t, [1, 1, BT, blk], *_head_major(t)) for t, blk in ((q, DK), (k, DK), (v, BV), (o, BV))]
    dummy = torch.empty(1, dtype=torch.float32, device=v.device)
    st = lambda t: tuple(t.stride()) if t is not None else (0,) * 4  # noqa: E731
    s0, sht = st(x0), st(xt)
    num_tiles = B * H * VB // 2
    args = dict(q_desc=descs[0], k_desc=descs[1], v_desc=descs[2], o_desc=descs[3],
                H0=x0 if x0 is not None else dummy, HT=xt if xt is not None else dummy,
                s0b=s0[0], s0h=s0[1], s0f=s0[2], s0v=s0[3], stb=sht[0], sth=sht[1], stf=sht[2], stv=sht[3],
                N=N, H=H, VB=VB, scale=scale, num_tiles=num_tiles, STAGES=stages, HAS_H0=x0 is not None,
                STORE_HT=xt is not None)
    return (persistent_programs(num_tiles, v.device),), args, 4


def forward(q, k, v, h0, scale: float, final_state: bool, stages: int = 3, operand=None, launch=None):
    """(o, final state (B, H, 1 + 16 + 256, Dv) float32 or None) by the Gluon kernel (``fits`` must have
    said None). h0: the op-layout initial state or None. ``operand``: launch_args's (the descriptors' maker);
    ``launch(grid, args, num_warps)``: the launch (default: the kernel's own; a keyed path passes a CachedLaunch's,
    as launch.gluon_forward_keyed does for gluon_forward)."""
    B, N, H, Dv = v.shape
    o = torch.empty(B, N, H, Dv, dtype=v.dtype, device=v.device)
    x0 = compress(h0) if h0 is not None else None
    xt = torch.empty(B, H, FEATURES, Dv, dtype=torch.float32, device=v.device) if final_state else None
    grid, args, warps = launch_args(q, k, v, x0, o, xt, scale, stages, operand=operand)
    if launch is None:
        based_fwd_gluon_kernel[grid](**args, num_warps=warps)
    else:
        launch(grid, args, warps)
    ht = None
    if final_state:
        ht = expand(xt)
        if h0 is not None:  # the initial state's part the symmetric rows do not carry, back as it was
            ht += h0.float() - expand(x0)
    return o, ht


# --------------------------------------------------------------------------------------------
# compile report (no GPU): compile_report(states, stages) compiles the kernel for sm_90a; TRITON_INTERPRET must be
# unset


def compile_report(states: bool = True, stages: int = 3) -> dict:
    from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources

    B, N, H, Dv, bf = 2, 4096, 16, 64, torch.bfloat16
    q = torch.empty(B, N, H, DK, dtype=bf)
    v = torch.empty(B, N, H, Dv, dtype=bf)
    x = torch.empty(B, H, FEATURES, Dv, dtype=torch.float32) if states else None
    grid, args, warps = launch_args(q, q, v, x, torch.empty_like(v), x, 0.25, stages)
    compiled = compile_kernel(based_fwd_gluon_kernel, args, num_warps=warps)
    r = resources(compiled)
    return dict(case=f"based states={states} stages={stages}", spill_bytes=r.spill_stores, registers=r.registers,
                shared=r.shared, threads=r.threads, wgmma_serialized=r.wgmma_serialized,
                **has_hopper_instructions(compiled.asm["ptx"]))
