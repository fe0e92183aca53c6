"""GLA backward's dq / dk kernel (the chunk-parallel form's common launch) for Hopper on the tiles template
(tilecore/tiles/gluon/pipeline.py): the loads of the next tile run under the current tile's chain.

The math is kernels_backward_gla_chunked.gla_dqk_flat_kernel's (its ``tl`` twin, tested in the interpreter against
float64): per (batch * head, chunk c of BT = 64 tokens, key block of BKB = 32 channels), from the states walks' S_c
and dS_c, with G the chunk's cumulative log decay (clamped at -100 a token), m the middle of its span per channel,
E = e^(G - m), Ei = e^(m - G):

    a   = do v^T (strictly lower), r_t = scale do_t . v_t (a's diagonal)
    dq  = scale (E (a (k Ei)) + (do S_c^T) e^G) + r k
    dk  = scale Ei (a^T (q E)) + (v dS_c^T) e^(G_last - G) + r q
    dg  = the reverse sum over the chunk of q dq - k dk (without r) + e^G_last <S_c, dS_c> + sum_t k (v dS_c^T)
          e^(G_last - G), 0 where the floor clamped g
    the flag 1 where a channel's span is past the factor span (the fallback's launch writes the block again)

The template's parts:

* a tile is (batch * head, chunk, a pair of key blocks); ``setup`` gives it one step;
* a stage is the chunk's v, do [BT, Dv] and, for each key block of the pair, q, k, g [BT, BKB] and S_c, dS_c
  [BKB, Dv], TMA-loaded by the 1-warp producer from 2-D views (q, k, v, g, do (B, N, H, D) as (B N, H D); the
  states (B, H, NT, Dk, Dv) as (B H NT Dk, Dv));
* consumer c (a warpgroup) takes key block c of the pair: do v^T, do S_c^T and v dS_c^T by async wgmma from the
  stage while it sums G over tokens (FORM 2: by products with 0/1 matrices; FORM 0, fp16: by scans, with a fourth
  product v do^T for a^T), then k Ei and q E go to shared memory as the B operands of a (k Ei) and a^T (q E); a's A
  operand comes from registers, a^T's (FORM 2) from a's bf16 tile in shared memory read transposed.

With two stages the producer loads tile t + 1 while the consumers compute tile t, and the two consumers are two
chains an SM (the tl kernel's two programs an SM, without its waits on loads). Conditions (``fits``, and the flat
launch's: Hopper, every view TMA-aligned): N a multiple of BT, Dv = 32, 64 or 128, Dk a multiple of 2 BKB; the launcher
falls back to the tl kernels elsewhere.

FORM (a constexpr of bits): 0 (fp16 inputs) scans G and dG over tokens in a blocked layout (``chain_scan``); 2 (bf16)
makes every sum over tokens a product with a 0/1 matrix on the tensor cores (``chain_dots``: m = G_last / 2), and the
bits beside 2 say where its results are stored (STORE_TMA, DG_TMA, DG_LATE), where J is read from (J_SMEM), how the
pieces of those sums are cut (PIECES_RZ) and how many pieces dG's sums take (DG_TWO) (below).
configs_gla_bwd.CHUNKED_FLAT_DIMS picks the FORM per head dim; the bits do not add up (each FORM is its own ptxas
schedule), so a combination ships only where a run timed it. Gluon does not run in the interpreter:
tests/linear_attention/test_gla_bwd_gluon_compile.py compiles it for sm_90a (and checks the routing),
tests/linear_attention/test_gla_bwd_gluon_twin.py replays chain_dots' arithmetic in torch against float64, and
experiments/linear_attention/gpu_gla_bwd_forms.py checks the kernel on the GPU against float64."""
import torch
from triton.experimental import gluon

from tilecore.tiles.gluon import Layout, ring, run, stage_struct, struct, wgmma_layout, wgmma_lhs_layout
from tilecore.tiles.gluon.compat import fence_async_shared, gl, tma, warpgroup_mma, warpgroup_mma_wait

BT_GLUON = 64  # tokens a chunk (a wgmma's M)
BKB_GLUON = 32  # key channels a consumer
FLOOR = gl.constexpr(-100.0)  # kernels_tl.LOG_DECAY_FLOOR
# FORM bits beside 2 (chain_dots): the stores by TMA from shared memory (DQ, DK_OUT, DG then descriptors of the 2-D views
# (B N, H Dk)): no per-element 64-bit addresses on the chain; launch_args drops a bit where its buffers do not allow it
STORE_TMA = gl.constexpr(512)  # dq through the stage's k buffer (k kept in registers), dk through its q buffer
DG_TMA = gl.constexpr(1024)  # dg through the stage's g buffer (float32 g only); with either bit the stage is released
# only once the stores have read it (tma.store_wait at the chain's end)
DG_LATE = gl.constexpr(2048)  # instead of DG_TMA: dg through the pieces' buffers p1, p2 (a float32 view of their 8 KB),
# its store waited for at the next tile's start (before G's pieces are written), not before the stage's release
J_SMEM = gl.constexpr(8192)  # J (all ones) from shared memory like L (8 KB), not a register A operand: a constant held in
# up to 48 registers while the sums run
PIECES_RZ = gl.constexpr(32768)  # the bf16 pieces by truncation (the float32 pattern's low 16 bits cleared: a logic op)
# instead of conversions to bf16 and back (F2F a piece and element): the three pieces still sum to x exactly
DG_TWO = gl.constexpr(65536)  # dG's two sums by two bf16 pieces, not three (two dots a sum: dG within 2^-17 |dG| a
# token, far below the bf16 products q dq and k dk it sums)


@stage_struct
class DqkChunk:
    v: object  # [BT, Dv]
    do: object  # [BT, Dv]
    q0: object  # [BT, BKB]: key block 0 of the pair (consumer 0)
    q1: object  # key block 1 (consumer 1)
    k0: object
    k1: object
    g0: object  # [BT, BKB] the log decays (float32 or the inputs' dtype)
    g1: object
    hs0: object  # [BKB, Dv] S_c's rows of key block 0
    hs1: object
    dhs0: object  # [BKB, Dv] dS_c's rows
    dhs1: object

    @gluon.jit
    def of(self, cid: gl.constexpr):
        """Consumer cid's buffers of the stage (key block cid of the pair): q, k, g [BT, BKB], S_c's and dS_c's rows
        [BKB, Dv], the chunk's v and do [BT, Dv]."""
        if cid == 0:
            blk = (self.q0, self.k0, self.g0, self.hs0, self.dhs0, self.v, self.do)
        else:
            blk = (self.q1, self.k1, self.g1, self.hs1, self.dhs1, self.v, self.do)
        return blk


@stage_struct
class DqkTwoChunks:
    """A stage of two chunks (CHUNKS 2, Dk = BKB: one key block a chunk), consumer c taking chunk c of the pair."""
    v0: object  # [BT, Dv]
    v1: object
    do0: object  # [BT, Dv]
    do1: object
    q0: object  # [BT, BKB]
    q1: object
    k0: object
    k1: object
    g0: object  # [BT, BKB]
    g1: object
    hs0: object  # [BKB, Dv]
    hs1: object
    dhs0: object  # [BKB, Dv]
    dhs1: object

    @gluon.jit
    def of(self, cid: gl.constexpr):
        """Consumer cid's buffers (chunk cid of the pair), as DqkChunk.of's."""
        if cid == 0:
            blk = (self.q0, self.k0, self.g0, self.hs0, self.dhs0, self.v0, self.do0)
        else:
            blk = (self.q1, self.k1, self.g1, self.hs1, self.dhs1, self.v1, self.do1)
        return blk


@struct
class DqkTile:
    bh: object  # batch * H + head
    c: object  # chunk
    kb: object  # the pair's first key block (CHUNKS 2: 0, c the pair's first chunk)


@gluon.jit
def _add(a, b):
    return a + b



@struct
class GlaDqk:
    q_desc: object
    k_desc: object
    v_desc: object
    g_desc: object
    do_desc: object
    hs_desc: object
    dhs_desc: object
    DQ: object  # (B, N, H, Dk) contiguous, the inputs' dtype
    DK_OUT: object
    DG: object  # (B, N, H, Dk) float32
    FLAG: object  # int8 [(bh NT + c) KBLOCKS + key block]
    qe_smem: object  # [2, BT, BKB]: each consumer's q E (the B operand of a^T (q E)); k Ei goes through ctx.out
    tri_smem: object  # FORM 2: L [BT, BT] in the operand dtype (an A operand from shared memory); J_SMEM: [L, J]
    N: object
    H: object
    DKD: object  # Dk
    NT: object
    KBLOCKS: object
    scale: object
    BT: gl.constexpr
    BKB: gl.constexpr
    DV: gl.constexpr
    SPAN: gl.constexpr  # the widest span of G factored about its middle (kernels_tl._factor_span)
    FORM: gl.constexpr  # 2: every sum over tokens by dots (chain_dots); 0: by scans (chain_scan)
    CHUNKS: gl.constexpr  # 1: a tile is a pair of key blocks of one chunk; 2 (Dk = BKB, FORM 2): a pair of chunks
    L64: gl.constexpr  # [BT, BT] accumulators
    L32: gl.constexpr  # [BT, BKB] accumulators and the chain's tiles
    A32: gl.constexpr  # a [BT, BT] as the register A operand of a [BT, BKB] product
    SCAN: gl.constexpr  # [BT, BKB] with a warp's rows in its threads, a lane a channel: the scans over tokens (the
    # wgmma layouts have no scan)

    @gluon.jit
    def setup(self, tile_id):
        if self.CHUNKS == 2:  # (chunks 2 t and 2 t + 1 of a head)
            halves = self.NT // 2
            tile = DqkTile(tile_id // halves, (tile_id % halves) * 2, 0)
        else:
            pairs = self.KBLOCKS // 2
            kp = tile_id % pairs
            c = (tile_id // pairs) % self.NT
            tile = DqkTile(tile_id // (pairs * self.NT), c, kp * 2)
        return tile, 1

    @gluon.jit
    def load(self, stage, bar, tile, step):
        if self.CHUNKS == 2:
            self.load_chunks(stage, bar, tile)
        else:
            h = tile.bh % self.H
            row = (tile.bh // self.H) * self.N + tile.c * self.BT
            col = h * self.DKD + tile.kb * self.BKB
            srow = (tile.bh * self.NT + tile.c) * self.DKD + tile.kb * self.BKB
            tma.async_copy_global_to_shared(self.v_desc, [row, h * self.DV], bar, stage.v)
            tma.async_copy_global_to_shared(self.do_desc, [row, h * self.DV], bar, stage.do)
            tma.async_copy_global_to_shared(self.hs_desc, [srow, 0], bar, stage.hs0)
            tma.async_copy_global_to_shared(self.dhs_desc, [srow, 0], bar, stage.dhs0)
            tma.async_copy_global_to_shared(self.hs_desc, [srow + self.BKB, 0], bar, stage.hs1)
            tma.async_copy_global_to_shared(self.dhs_desc, [srow + self.BKB, 0], bar, stage.dhs1)
            tma.async_copy_global_to_shared(self.g_desc, [row, col], bar, stage.g0)
            tma.async_copy_global_to_shared(self.g_desc, [row, col + self.BKB], bar, stage.g1)
            tma.async_copy_global_to_shared(self.q_desc, [row, col], bar, stage.q0)
            tma.async_copy_global_to_shared(self.q_desc, [row, col + self.BKB], bar, stage.q1)
            tma.async_copy_global_to_shared(self.k_desc, [row, col], bar, stage.k0)
            tma.async_copy_global_to_shared(self.k_desc, [row, col + self.BKB], bar, stage.k1)

    @gluon.jit
    def load_chunks(self, stage, bar, tile):
        """CHUNKS 2: chunks c and c + 1 (rows BT apart; their states DKD rows apart) of the tile's head."""
        h = tile.bh % self.H
        row = (tile.bh // self.H) * self.N + tile.c * self.BT
        col = h * self.DKD
        srow = (tile.bh * self.NT + tile.c) * self.DKD
        tma.async_copy_global_to_shared(self.v_desc, [row, h * self.DV], bar, stage.v0)
        tma.async_copy_global_to_shared(self.do_desc, [row, h * self.DV], bar, stage.do0)
        tma.async_copy_global_to_shared(self.hs_desc, [srow, 0], bar, stage.hs0)
        tma.async_copy_global_to_shared(self.dhs_desc, [srow, 0], bar, stage.dhs0)
        tma.async_copy_global_to_shared(self.g_desc, [row, col], bar, stage.g0)
        tma.async_copy_global_to_shared(self.q_desc, [row, col], bar, stage.q0)
        tma.async_copy_global_to_shared(self.k_desc, [row, col], bar, stage.k0)
        tma.async_copy_global_to_shared(self.v_desc, [row + self.BT, h * self.DV], bar, stage.v1)
        tma.async_copy_global_to_shared(self.do_desc, [row + self.BT, h * self.DV], bar, stage.do1)
        tma.async_copy_global_to_shared(self.hs_desc, [srow + self.DKD, 0], bar, stage.hs1)
        tma.async_copy_global_to_shared(self.dhs_desc, [srow + self.DKD, 0], bar, stage.dhs1)
        tma.async_copy_global_to_shared(self.g_desc, [row + self.BT, col], bar, stage.g1)
        tma.async_copy_global_to_shared(self.q_desc, [row + self.BT, col], bar, stage.q1)
        tma.async_copy_global_to_shared(self.k_desc, [row + self.BT, col], bar, stage.k1)

    @gluon.jit
    def start(self, ctx, tile, prev):
        return 0

    @gluon.jit
    def compute(self, ctx, state, stage, tile, step):
        if self.FORM & 2:
            self.chain_dots(ctx, stage, tile)
        else:
            self.chain_scan(ctx, stage, tile)
        return state

    @gluon.jit
    def pieces(self, x, p0, p1, p2, TWO: gl.constexpr = False):
        """float32 x [BT, BKB] into shared memory as three pieces in the operand dtype, hi / mid / lo (24 bits of its
        mantissa in bf16: a sum over tokens by three dots with a 0/1 matrix is float32's to its rounding); TWO: hi in
        p0 and the rest rounded in p1 (16 bits)."""
        if TWO:
            if self.FORM & PIECES_RZ:
                hi = self.trunc16(x)
            else:
                hi = x.to(gl.bfloat16).to(gl.float32)
            p0.store(hi.to(gl.bfloat16))
            p1.store((x - hi).to(gl.bfloat16))
        elif self.FORM & PIECES_RZ:
            hi = self.trunc16(x)
            r1 = x - hi
            mid = self.trunc16(r1)
            p0.store(hi.to(gl.bfloat16))
            p1.store(mid.to(gl.bfloat16))
            p2.store((r1 - mid).to(gl.bfloat16))
        else:
            hi = x.to(gl.bfloat16)
            r1 = x - hi.to(gl.float32)
            mid = r1.to(gl.bfloat16)
            p0.store(hi)
            p1.store(mid)
            p2.store((r1 - mid.to(gl.float32)).to(gl.bfloat16))

    @gluon.jit
    def trunc16(self, x):
        """float32 x with the low 16 bits of its pattern cleared: its top 8 significant bits, exactly a bf16 (x - it
        is exact)."""
        return (x.to(gl.int32, bitcast=True) & -65536).to(gl.float32, bitcast=True)

    @gluon.jit
    def exp(self, x):
        """e^x by ex2.approx.ftz of x log2(e), two instructions an element (gl.exp's ex2 also scales subnormal
        results, four more): here a result below 2^-126 is 0, as e^G is wherever G_t - m nears -87."""
        return gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x * 1.4426950408889634],
                                         dtype=gl.float32, is_pure=True, pack=1)

    @gluon.jit
    def triangle(self, LOWER: gl.constexpr):
        """The A operand of a sum over tokens: L (LOWER: ones on and below the diagonal) [BT, BT] from shared memory
        (written once a program), else J (all ones) a constant register tile (a mask made where used cost ~600
        instructions a tile)."""
        if self.FORM & J_SMEM:
            x = self.tri_smem.index(0 if LOWER else 1)
        elif LOWER:
            x = self.tri_smem
        else:
            x = gl.full([self.BT, self.BT], 1.0, self.q_desc.dtype, self.A32)
        return x

    @gluon.jit
    def sum_dots(self, M, p0, p1, p2, acc, USE: gl.constexpr, TWO: gl.constexpr = False):
        """acc (+)= M (p0 + p1 + p2) (TWO: M (p0 + p1)): the smallest piece first."""
        if TWO:
            tok = warpgroup_mma(M, p1, acc, use_acc=USE, is_async=True)
        else:
            tok = warpgroup_mma(M, p2, acc, use_acc=USE, is_async=True)
            tok = warpgroup_mma(M, p1, tok, is_async=True)
        return warpgroup_mma(M, p0, tok, is_async=True)

    @gluon.jit
    def chain_dots(self, ctx, stage, tile):
        """FORM 2: chain_scan's math with every sum over tokens on the tensor cores (no cross-warp pass): G = L g and
        its last row broadcast to every row, J g (L the lower triangle of ones, J all ones: two bf16 pieces of g as
        the B operands: 16 bits, G's error 2^-17 |G|, far below the bf16 operands' of E and Ei), m = G_last / 2
        (each factor within e^(+-SPAN / 2) where every |G - m| <= SPAN / 2: else the block is
        flagged, by a store of 1 from any row that sees it, the flags starting at zero; a span past SPAN is always
        flagged, so the dv kernel's fallback sees every chunk it needs), dG's reverse sum U dG = J dG - L dG + dG and
        the later tokens' sum_t k (v dS_c^T) e^(G_last - G) by J with it (dG's pieces three). The value sums do v^T,
        do S_c^T, v dS_c^T are issued right behind G's, so <S_c, dS_c>, the flag, E, Ei and the k Ei / q E stores run
        under them; e^m and e^G_last = e^(2 m) are products of e^(m / 2) (three exp tiles a tile, ex2.approx.ftz);
        a^T is a's strictly-lower bf16 tile stored once to shared memory and read transposed (no product v do^T)."""
        cid: gl.constexpr = ctx.index
        BT: gl.constexpr = self.BT
        BKB: gl.constexpr = self.BKB
        L32: gl.constexpr = self.L32
        L64: gl.constexpr = self.L64
        dtype: gl.constexpr = self.q_desc.dtype
        q_s, k_s, g_s, hs_s, dhs_s, v_s, do_s = stage.of(cid)
        NB: gl.constexpr = BT // BKB  # qe_smem's [BT, BKB] buffers a consumer (its [BT, BT] bf16 view of a^T)
        p0 = ctx.out
        p1 = self.qe_smem.index(NB * cid)
        p2 = self.qe_smem.index(NB * cid + 1)
        z64 = gl.zeros([BT, BT], gl.float32, L64)
        z32 = gl.zeros([BT, BKB], gl.float32, L32)
        r64 = gl.arange(0, BT, layout=gl.SliceLayout(1, L64))
        c64 = gl.arange(0, BT, layout=gl.SliceLayout(0, L64))
        # G = L g, G_last on every row = J g
        g = g_s.load(L32).to(gl.float32)
        if self.FORM & DG_LATE:
            tma.store_wait(0)  # the previous tile's dg store has read p1, p2
        gl.thread_barrier()  # the previous tile's products have read the pieces' buffers
        gcl = gl.where(g < FLOOR, FLOOR, g)
        if self.FORM & PIECES_RZ:
            hi = self.trunc16(gcl)
            p0.store(hi.to(dtype))
            p1.store((gcl - hi).to(dtype))
        else:
            hi = gcl.to(dtype)
            p0.store(hi)
            p1.store((gcl - hi.to(gl.float32)).to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        SL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
        # the value sums do v^T, do S_c^T, v dS_c^T issued behind G's (they read only the stage), <S_c, dS_c> under
        # both, the flag, E, Ei and the B operands k Ei, q E under the value sums
        G_tok = self.sum_dots(self.triangle(True), p0, p1, p2, z32, False, True)
        Gl_tok = self.sum_dots(self.triangle(False), p0, p1, p2, z32, False, True)
        a_tok = warpgroup_mma(do_s, v_s.permute((1, 0)), z64, use_acc=False, is_async=True)
        dqs_tok = warpgroup_mma(do_s, hs_s.permute((1, 0)), z32, use_acc=False, is_async=True)
        dks_tok = warpgroup_mma(v_s, dhs_s.permute((1, 0)), z32, use_acc=False, is_async=True)
        sfx = gl.convert_layout(gl.sum(hs_s.load(SL).to(gl.float32) * dhs_s.load(SL).to(gl.float32), axis=1),
                                gl.SliceLayout(0, L32))
        Gc, Gl = warpgroup_mma_wait(3, deps=[G_tok, Gl_tok])
        m = 0.5 * Gl  # (exactly: G_last = 2 m below)
        wide = gl.max(gl.where(gl.abs(Gc - m) <= 0.5 * self.SPAN, 0, 1), axis=1)  # NaN counts as wide
        rows = gl.arange(0, BT, layout=gl.SliceLayout(1, L32))
        if self.CHUNKS == 2:  # (consumer cid: chunk c + cid, the head's one key block)
            flag_at = (tile.bh * self.NT + tile.c + cid) * self.KBLOCKS + tile.kb
        else:
            flag_at = (tile.bh * self.NT + tile.c) * self.KBLOCKS + tile.kb + cid
        gl.store(self.FLAG + flag_at.to(gl.int64) + rows * 0, gl.full([BT], 1, gl.int8, gl.SliceLayout(1, L32)),
                 mask=wide > 0)
        E = self.exp(Gc - m)
        Ei = self.exp(m - Gc)
        gl.thread_barrier()  # G's products have read the pieces
        # k Ei in p1, q E in p0 (p1, p2 take a once dq's product has read k Ei; q and k read from the stage where used:
        # fewer registers live through the products)
        p1.store((k_s.load(L32).to(gl.float32) * Ei).to(dtype))
        p0.store((q_s.load(L32).to(gl.float32) * E).to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        # the value sums do v^T, do S_c^T, v dS_c^T
        a, dqs, dks = warpgroup_mma_wait(0, deps=[a_tok, dqs_tok, dks_tok])
        r = gl.sum(gl.where(gl.expand_dims(r64, 1) == gl.expand_dims(c64, 0), a, 0.0), axis=1) * self.scale
        r = gl.expand_dims(gl.convert_layout(r, gl.SliceLayout(1, L32)), 1)
        am = gl.where(gl.expand_dims(r64, 1) > gl.expand_dims(c64, 0), a, 0.0).to(dtype)  # (strictly lower)
        a_op = gl.convert_layout(am, self.A32)
        DG_BY_TMA: gl.constexpr = (self.FORM & (DG_TMA | DG_LATE)) != 0
        gl.static_assert(not (self.FORM & DG_TMA and self.FORM & DG_LATE), "DG_TMA or DG_LATE")
        TMA_ANY: gl.constexpr = (self.FORM & STORE_TMA) != 0 or DG_BY_TMA
        if TMA_ANY:  # the block's place in the 2-D views (B N, H Dk): the producer's load coordinates
            if self.CHUNKS == 2:
                row = (tile.bh // self.H) * self.N + (tile.c + cid) * BT
                col = (tile.bh % self.H) * self.DKD + tile.kb * BKB
            else:
                row = (tile.bh // self.H) * self.N + tile.c * BT
                col = (tile.bh % self.H) * self.DKD + (tile.kb + cid) * BKB
        if not (self.FORM & STORE_TMA and DG_BY_TMA):
            h = tile.bh % self.H
            b = tile.bh // self.H
            cols = gl.arange(0, BKB, layout=gl.SliceLayout(0, L32))
            if self.CHUNKS == 2:
                base = ((b.to(gl.int64) * self.N + (tile.c + cid) * BT) * self.H + h) * self.DKD + tile.kb * BKB
            else:
                base = ((b.to(gl.int64) * self.N + tile.c * BT) * self.H + h) * self.DKD + (tile.kb + cid) * BKB
            offs = gl.expand_dims(rows * (self.H * self.DKD), 1) + gl.expand_dims(cols, 0)
        # dq (stored; E, e^(m / 2) and do S_c^T are dead after it), then a^T and dk
        dq_tok = warpgroup_mma(a_op, p1, z32, use_acc=False, is_async=True)
        dq_in = warpgroup_mma_wait(0, deps=[dq_tok])
        half = self.exp(0.5 * m)
        dq = (E * dq_in + dqs * ((E * half) * half)) * self.scale
        if self.FORM & STORE_TMA:  # through k's stage buffer (q E holds p0 through dk's product), k kept in registers
            kf = k_s.load(L32).to(gl.float32)  # (each thread writes the elements it read)
            k_s.store((dq + r * kf).to(dtype))
            fence_async_shared()
            gl.thread_barrier()
            tma.async_copy_shared_to_global(self.DQ, [row, col], k_s)
        else:
            gl.store(self.DQ + base + offs, (dq + r * k_s.load(L32).to(gl.float32)).to(self.DQ.dtype.element_ty))
        dG = q_s.load(L32).to(gl.float32) * dq
        # a^T: a's strictly-lower bf16 tile in p1, p2 (one [BT, BT] view of their 8 KB) read transposed as the A
        # operand from shared memory (no second product v do^T)
        at_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        at_s = self.qe_smem._reinterpret(dtype, [2, BT, BT], at_layout).index(cid)
        gl.thread_barrier()  # every warp's dq product has read k Ei (p1)
        at_s.store(am)
        fence_async_shared()
        gl.thread_barrier()
        at_op = at_s.permute((1, 0))
        dk_tok = warpgroup_mma(at_op, p0, z32, use_acc=False, is_async=True)
        dk_in = warpgroup_mma_wait(0, deps=[dk_tok])
        em = half * half
        dk_state = dks * (Ei * em)  # (G_last - m = m)
        dk = Ei * dk_in * self.scale + dk_state
        if self.FORM & STORE_TMA:  # through q's stage buffer (each thread writes the elements it read: no barrier
            # before), stored under dg's sums
            q_s.store((dk + r * q_s.load(L32).to(gl.float32)).to(dtype))
            fence_async_shared()
            gl.thread_barrier()
            tma.async_copy_shared_to_global(self.DK_OUT, [row, col], q_s)
        else:
            gl.store(self.DK_OUT + base + offs,
                     (dk + r * q_s.load(L32).to(gl.float32)).to(self.DK_OUT.dtype.element_ty))
        # dg = U dG + J (k dk_state) + e^G_last <S_c, dS_c> with dG = q dq - k dk and U = J - L + I:
        # J (dG + k dk_state) - L dG + dG
        if not self.FORM & STORE_TMA:
            kf = k_s.load(L32).to(gl.float32)
        dG = dG - kf * dk
        if self.FORM & STORE_TMA:
            tma.store_wait(1)  # (dq's store reads k's buffer, not these: a wait that costs nothing by now)
        gl.thread_barrier()  # dq's and dk's products have read the pieces' buffers
        TWO: gl.constexpr = (self.FORM & DG_TWO) != 0
        self.pieces(dG, p0, p1, p2, TWO)
        fence_async_shared()
        gl.thread_barrier()
        s_tok = self.sum_dots(self.triangle(True), p0, p1, p2, z32, False, TWO)
        lsum = warpgroup_mma_wait(0, deps=[s_tok])
        gl.thread_barrier()
        self.pieces(dG + kf * dk_state, p0, p1, p2, TWO)
        fence_async_shared()
        gl.thread_barrier()
        s_tok = self.sum_dots(self.triangle(False), p0, p1, p2, z32, False, TWO)
        jsum = warpgroup_mma_wait(0, deps=[s_tok])
        dg = (jsum - lsum) + dG + (em * em) * gl.expand_dims(sfx, 0)  # (G_last = 2 m)
        clamped = g_s.load(L32).to(gl.float32) < FLOOR
        if self.FORM & DG_TMA:  # through g's stage buffer (each thread writes the elements it read)
            g_s.store(gl.where(clamped, 0.0, dg))
            fence_async_shared()
            gl.thread_barrier()
            tma.async_copy_shared_to_global(self.DG, [row, col], g_s)
        elif self.FORM & DG_LATE:  # through p1, p2 as one float32 [BT, BKB] (the sums have read them)
            dg_s = self.qe_smem._reinterpret(gl.float32, [NB, BT, BKB], self.DG.layout).index(cid * NB // 2)
            gl.thread_barrier()
            dg_s.store(gl.where(clamped, 0.0, dg))
            fence_async_shared()
            gl.thread_barrier()
            tma.async_copy_shared_to_global(self.DG, [row, col], dg_s)
        else:
            gl.store(self.DG + base + offs, gl.where(clamped, 0.0, dg))
        if self.FORM & DG_LATE:
            if self.FORM & STORE_TMA:  # dk's store has read the stage's q buffer before the stage is released (dg's
                tma.store_wait(1)  # may go on)
                gl.thread_barrier()
        elif TMA_ANY:  # the stores have read the stage's buffers and p0 before the stage is released (every thread
            tma.store_wait(0)  # waits for the one that issued them)
            gl.thread_barrier()

    @gluon.jit
    def chain_scan(self, ctx, stage, tile):
        """Consumer ctx.index's key block of the tile: every product and store (the stage is released after, so q,
        k and g are read from it again where that keeps registers free). Between a wgmma's issue and its wait
        nothing else runs (an instruction touching a running wgmma's accumulators makes ptxas serialize every
        wgmma, C7514), and the accumulators live at once are at most 64 + 16 + 16 float32 a thread."""
        cid: gl.constexpr = ctx.index
        BT: gl.constexpr = self.BT
        BKB: gl.constexpr = self.BKB
        L32: gl.constexpr = self.L32
        L64: gl.constexpr = self.L64
        dtype: gl.constexpr = self.q_desc.dtype
        q_s, k_s, g_s, hs_s, dhs_s, v_s, do_s = stage.of(cid)
        gl.static_assert(self.CHUNKS == 1, "chain_scan: a pair of key blocks")
        # G, its span, middle and last row (a scan over tokens in SCAN, a warp's rows in its threads)
        rows = gl.arange(0, BT, layout=gl.SliceLayout(1, L32))
        g = g_s.load(self.SCAN).to(gl.float32)
        Gc = gl.convert_layout(gl.associative_scan(gl.where(g < FLOOR, FLOOR, g), 0, _add), L32)
        hi = gl.max(Gc, axis=0)
        lo = gl.min(Gc, axis=0)
        G_last = gl.sum(gl.where(gl.expand_dims(rows == BT - 1, 1), Gc, 0.0), axis=0)
        mid = 0.5 * (hi + lo)
        wide = gl.sum(gl.where(hi - lo <= self.SPAN, 0, 1), axis=0)  # NaN spans count as wide too
        flag_layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        one = gl.arange(0, 1, layout=flag_layout)
        flag_at = (tile.bh * self.NT + tile.c) * self.KBLOCKS + tile.kb + cid
        gl.store(self.FLAG + flag_at.to(gl.int64) + one, gl.full([1], 0, gl.int8, flag_layout) + (wide > 0).to(gl.int8))
        E = gl.exp(Gc - gl.expand_dims(mid, 0))
        Ei = gl.exp(gl.expand_dims(mid, 0) - Gc)
        # <S_c, dS_c> per channel
        SL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
        sfx = gl.sum(hs_s.load(SL).to(gl.float32) * dhs_s.load(SL).to(gl.float32), axis=1)
        sfx = gl.convert_layout(sfx, gl.SliceLayout(0, L32))
        # the B operands of the intra products: k Ei (this consumer's ctx.out) and q E
        kei_s = ctx.out
        qe_s = self.qe_smem.index(cid)
        gl.thread_barrier()  # the previous tile's products have read them
        kei_s.store((k_s.load(L32).to(gl.float32) * Ei).to(dtype))
        qe_s.store((q_s.load(L32).to(gl.float32) * E).to(dtype))
        fence_async_shared()
        gl.thread_barrier()

        # the value sums do v^T, do S_c^T, v dS_c^T
        z64 = gl.zeros([BT, BT], gl.float32, L64)
        z32 = gl.zeros([BT, BKB], gl.float32, L32)
        a_tok = warpgroup_mma(do_s, v_s.permute((1, 0)), z64, use_acc=False, is_async=True)
        dqs_tok = warpgroup_mma(do_s, hs_s.permute((1, 0)), z32, use_acc=False, is_async=True)
        dks_tok = warpgroup_mma(v_s, dhs_s.permute((1, 0)), z32, use_acc=False, is_async=True)
        a, dqs, dks = warpgroup_mma_wait(0, deps=[a_tok, dqs_tok, dks_tok])
        r64 = gl.arange(0, BT, layout=gl.SliceLayout(1, L64))
        c64 = gl.arange(0, BT, layout=gl.SliceLayout(0, L64))
        r = gl.sum(gl.where(gl.expand_dims(r64, 1) == gl.expand_dims(c64, 0), a, 0.0), axis=1) * self.scale
        r = gl.expand_dims(gl.convert_layout(r, gl.SliceLayout(1, L32)), 1)
        a_op = gl.convert_layout(gl.where(gl.expand_dims(r64, 1) > gl.expand_dims(c64, 0), a, 0.0).to(dtype), self.A32)
        # dq's intra product a (k Ei), and a^T = v do^T for dk's
        dq_tok = warpgroup_mma(a_op, kei_s, z32, use_acc=False, is_async=True)
        at_tok = warpgroup_mma(v_s, do_s.permute((1, 0)), z64, use_acc=False, is_async=True)
        dq_in, at = warpgroup_mma_wait(0, deps=[dq_tok, at_tok])
        at_op = gl.convert_layout(gl.where(gl.expand_dims(r64, 1) < gl.expand_dims(c64, 0), at, 0.0).to(dtype),
                                  self.A32)
        dk_tok = warpgroup_mma(at_op, qe_s, z32, use_acc=False, is_async=True)
        dk_in = warpgroup_mma_wait(0, deps=[dk_tok])

        half = gl.expand_dims(gl.exp(0.5 * mid), 0)
        dq = (E * dq_in + dqs * ((E * half) * half)) * self.scale
        dk_state = dks * (Ei * gl.expand_dims(gl.exp(G_last - mid), 0))
        dk = Ei * dk_in * self.scale + dk_state
        qf = q_s.load(L32).to(gl.float32)
        kf = k_s.load(L32).to(gl.float32)
        h = tile.bh % self.H
        b = tile.bh // self.H
        cols = gl.arange(0, BKB, layout=gl.SliceLayout(0, L32))
        # a 64-bit base at the block's first element, 32-bit offsets within the chunk (BT H Dk elements)
        base = ((b.to(gl.int64) * self.N + tile.c * BT) * self.H + h) * self.DKD + (tile.kb + cid) * BKB
        offs = gl.expand_dims(rows * (self.H * self.DKD), 1) + gl.expand_dims(cols, 0)
        gl.store(self.DQ + base + offs, (dq + r * kf).to(self.DQ.dtype.element_ty))
        gl.store(self.DK_OUT + base + offs, (dk + r * qf).to(self.DK_OUT.dtype.element_ty))
        later = gl.exp(G_last) * sfx + gl.sum(kf * dk_state, axis=0)
        dGs = gl.convert_layout(gl.associative_scan(gl.convert_layout(qf * dq - kf * dk, self.SCAN), 0, _add,
                                                    reverse=True), L32)
        clamped = g_s.load(L32).to(gl.float32) < FLOOR
        gl.store(self.DG + base + offs, gl.where(clamped, 0.0, dGs + gl.expand_dims(later, 0)))

    @gluon.jit
    def wait(self, ctx, state):
        return state

    @gluon.jit
    def finish(self, ctx, state, tile):
        pass


@gluon.jit
def gla_dqk_gluon_kernel(q_desc, k_desc, v_desc, g_desc, do_desc, hs_desc, dhs_desc, DQ, DK_OUT, DG, FLAG,
                         N, H, DKD, NT, KBLOCKS, scale, num_tiles, STAGES: gl.constexpr, SPAN: gl.constexpr,
                         CONSUMER_REGS: gl.constexpr = 232, PRODUCER_REGS: gl.constexpr = 40,
                         FORM: gl.constexpr = 0, CHUNKS: gl.constexpr = 1):
    """dq, dk, dg and the fallback's flags of every (batch * head, chunk, key block) (see the module docstring): a
    persistent grid, two consumer warpgroups (num_warps = 4) and a producer warp."""
    BT: gl.constexpr = q_desc.block_type.shape[0]
    BKB: gl.constexpr = q_desc.block_type.shape[1]
    DV: gl.constexpr = v_desc.block_type.shape[1]
    L64: gl.constexpr = wgmma_layout(BT, BT, gl.num_warps())
    L32: gl.constexpr = wgmma_layout(BT, BKB, gl.num_warps())
    A32: gl.constexpr = wgmma_lhs_layout(BT, BKB, gl.num_warps())
    SCAN: gl.constexpr = gl.BlockedLayout([BT // gl.num_warps(), 1], [1, 32], [gl.num_warps(), 1], [0, 1])
    # each consumer's q E (FORM 2: BT / BKB buffers a consumer, its [BT, BT] view of a^T; the first two its pieces p1,
    # p2; the third piece, and k Ei, its epilogue buffer)
    qe_smem = gl.allocate_shared_memory(q_desc.dtype, [2 * BT // BKB if FORM & 2 else 2, BT, BKB], q_desc.layout)
    if FORM & 2:  # L, written here (before the partitions fork) and read by both consumers' products
        TL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
        tr = gl.arange(0, BT, layout=gl.SliceLayout(1, TL))
        tc = gl.arange(0, BT, layout=gl.SliceLayout(0, TL))
        lower = gl.where(gl.expand_dims(tr, 1) >= gl.expand_dims(tc, 0), 1.0, 0.0).to(q_desc.dtype)
        if FORM & J_SMEM:
            tri_smem = gl.allocate_shared_memory(q_desc.dtype, [2, BT, BT], v_desc.layout)
            tri_smem.index(0).store(lower)
            tri_smem.index(1).store(gl.full([BT, BT], 1.0, q_desc.dtype, TL))
        else:
            tri_smem = gl.allocate_shared_memory(q_desc.dtype, [BT, BT], v_desc.layout)
            tri_smem.store(lower)
        fence_async_shared()
        gl.thread_barrier()
    else:
        tri_smem = qe_smem  # (unused)
    op = GlaDqk(q_desc, k_desc, v_desc, g_desc, do_desc, hs_desc, dhs_desc, DQ, DK_OUT, DG, FLAG, qe_smem, tri_smem,
                N, H, DKD, NT, KBLOCKS, scale, BT, BKB, DV, SPAN, FORM, CHUNKS, L64, L32, A32, SCAN)
    if CHUNKS == 2:
        stages = DqkTwoChunks(ring(v_desc, STAGES), ring(v_desc, STAGES), ring(do_desc, STAGES), ring(do_desc, STAGES),
                              ring(q_desc, STAGES), ring(q_desc, STAGES), ring(k_desc, STAGES), ring(k_desc, STAGES),
                              ring(g_desc, STAGES), ring(g_desc, STAGES), ring(hs_desc, STAGES), ring(hs_desc, STAGES),
                              ring(dhs_desc, STAGES), ring(dhs_desc, STAGES))
    else:
        stages = DqkChunk(ring(v_desc, STAGES), ring(do_desc, STAGES), ring(q_desc, STAGES), ring(q_desc, STAGES),
                          ring(k_desc, STAGES), ring(k_desc, STAGES), ring(g_desc, STAGES), ring(g_desc, STAGES),
                          ring(hs_desc, STAGES), ring(hs_desc, STAGES), ring(dhs_desc, STAGES), ring(dhs_desc, STAGES))
    num_tiles = gl.program_id(0) * 0 + num_tiles  # a tensor even where the launch specialized it to 1
    run(op, Layout(q_desc, STAGES, CONSUMERS=2, CONSUMER_REGS=CONSUMER_REGS, PRODUCER_REGS=PRODUCER_REGS,
                   LATE_RELEASE=0), stages, num_tiles)


def fits(q, k, v, g, do, hs, dhs, N: int, BT: int, BKB: int) -> str | None:
    """None where the Gluon dq / dk kernel takes these tensors, else why not (the caller has checked that TMA can read
    every view: kernels_backward_gla_chunked._tma_views)."""
    Dk, Dv = q.shape[3], v.shape[3]
    if BT != BT_GLUON or BKB != BKB_GLUON:
        return f"chunk {BT} / key block {BKB} (it takes {BT_GLUON} / {BKB_GLUON})"
    if N % BT:
        return f"N {N} not a multiple of the chunk {BT}"
    if Dv not in (32, 64, 128) or (Dk % (2 * BKB) and Dk != BKB):
        return f"head dims ({Dk}, {Dv}): Dv 32, 64 or 128, Dk {BKB} or a multiple of {2 * BKB}"
    if q.dtype not in (torch.bfloat16, torch.float16) or hs.dtype != q.dtype or k.dtype != q.dtype \
            or v.dtype != q.dtype or do.dtype != q.dtype:
        return "q, k, v, do and the states in one 16-bit dtype"
    if Dk == BKB and (N % (2 * BT) or q.dtype != torch.bfloat16):  # (a tile of two chunks, by chain_dots)
        return f"one key block a chunk: bf16 and N a multiple of {2 * BT} (a pair of chunks a tile)"
    return None


def launch_args(q, k, v, g, do, hs, dhs, dq, dk, dg, flag, scale: float, stages: int = 2, span: float = 64.0,
                form: int = 0, bkb: int = BKB_GLUON):
    """(grid, arguments by name, num_warps) of gla_dqk_gluon_kernel; hs, dhs (B, H, NT, Dk, Dv) contiguous; form:
    the kernel's FORM (absent where 0); bkb: a consumer's key block (Dk = bkb: a tile of two chunks, CHUNKS 2)."""
    from tilecore.tiles.launch import gluon_descriptor
    from tilecore.tiles.schedule import persistent_programs

    B, N, H, Dv = v.shape
    Dk = q.shape[3]
    BT, BKB = BT_GLUON, bkb
    NT = N // BT
    kblocks = Dk // BKB

    def flat(t, block):
        t2 = t.view(-1, t.shape[-1]) if t.dim() == 5 else t.view(t.shape[0] * t.shape[1], -1)
        return gluon_descriptor(t2, block)

    args = dict(q_desc=flat(q, [BT, BKB]), k_desc=flat(k, [BT, BKB]), v_desc=flat(v, [BT, Dv]),
                g_desc=flat(g, [BT, BKB]), do_desc=flat(do, [BT, Dv]), hs_desc=flat(hs, [BKB, Dv]),
                dhs_desc=flat(dhs, [BKB, Dv]), DQ=dq, DK_OUT=dk, DG=dg, FLAG=flag, N=N, H=H, DKD=Dk, NT=NT,
                KBLOCKS=kblocks, scale=scale, num_tiles=B * H * NT * (kblocks // 2), STAGES=stages, SPAN=span)
    if kblocks == 1:  # a pair of chunks a tile (chain_dots' FORM 2 only)
        if not form & 2 or NT % 2:
            raise ValueError(f"gla dqk gluon: Dk {Dk} = one key block needs FORM 2 and an even chunk count, got "
                             f"FORM {form}, {NT} chunks")
        args.update(CHUNKS=2, num_tiles=B * H * NT // 2)
    tma_bits = STORE_TMA.value | DG_TMA.value | DG_LATE.value
    if form & tma_bits:  # the stores by TMA where their buffers allow it
        aligned = all(t.data_ptr() % 16 == 0 for t in (dq, dk, dg))
        if not (form & 2 and aligned and dq.dtype == q.dtype and dk.dtype == q.dtype):
            form &= ~tma_bits
        elif g.dtype != torch.float32 and form & DG_TMA.value:  # (DG_TMA: dg through g's stage buffer, float32
            form = (form & ~DG_TMA.value) | DG_LATE.value  # [BT, BKB]: else through the pieces' buffers)
        if form & STORE_TMA.value:
            args.update(DQ=flat(dq, [BT, BKB]), DK_OUT=flat(dk, [BT, BKB]))
        if form & (DG_TMA.value | DG_LATE.value):
            args.update(DG=flat(dg, [BT, BKB]))
    if form:
        args["FORM"] = form
    return (persistent_programs(args["num_tiles"], v.device),), args, 4


def compile_report(D: int = 128, stages: int = 2, dtype=torch.bfloat16, g_dtype=torch.float32, form: int = 0,
                   bkb: int = BKB_GLUON) -> dict:
    """sm_90a resources of the kernel at B2 H4 N4096 Dk = Dv = D, key blocks of bkb (compiled on the CPU, nothing
    run)."""
    from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources

    B, N, H = 2, 4096, 4
    NT = N // BT_GLUON
    x = torch.empty(B, N, H, D, dtype=dtype)
    g = torch.empty(B, N, H, D, dtype=g_dtype)
    hs = torch.empty(B, H, NT, D, D, dtype=dtype)
    dg = torch.empty(B, N, H, D, dtype=torch.float32)
    flag = torch.empty(B * H * NT * (D // bkb), dtype=torch.int8)
    grid, args, warps = launch_args(x, x, x, g, x, hs, hs, x, x, dg, flag, 0.1, stages=stages, form=form, bkb=bkb)
    compiled = compile_kernel(gla_dqk_gluon_kernel, args, num_warps=warps)
    r = resources(compiled)
    ptx = compiled.asm["ptx"]
    return dict(D=D, stages=stages, spill_bytes=r.spill_stores, registers=r.registers, shared=r.shared,
                threads=r.threads, wgmma_serialized=r.wgmma_serialized, form=args.get("FORM", 0),
                tma_stores=ptx.count("cp.async.bulk.tensor.2d.global.shared"), wgmma_count=ptx.count("wgmma.mma_async"),
                **has_hopper_instructions(ptx))
