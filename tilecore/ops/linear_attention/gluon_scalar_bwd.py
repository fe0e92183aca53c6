"""The chunked linear-attention backward for Hopper on the tiles template (tilecore/tiles/gluon/pipeline.py): phi(x) = x
with no decay or a scalar log decay (simple GLA; Mamba-2's SSD form: beta = dt, grouped q/k heads).

Each of dq, dk and dv is the gluon forward's walk (gluon_forward.py, ``compute``) with other tensors in its roles:
two [BT, Din] operands A and B (the scores A B^T), a [BT, U] operand X per unit (P X and the state update's values) and
a state [Din, U] float32 kept in wgmma registers for the whole walk,

    P    = mask(A B^T * decay * colw) * scale                           wgmma, A and B from shared memory
    out  = P X + rowf (A S_old)                                        S_old as bf16 in shared memory
    S   <- 2^(G_last) S + B^T (w X)                                    B^T from shared memory (transposed)

role  time     A        B        X          state [Din, U]         mask     decay(r, c)     colw    rowf             w
dq    forward  do [Dv]  v [Dv]   k[:, u]    S^T = sum w v k^T      c <  r   2^(G_r - G_c)   beta_c  scale 2^G_r      2^(G_last - G_r) beta_r
dk    reverse  v [Dv]   do [Dv]  q[:, u]    dS^T (dS of the state)  c >  r   2^(G_c - G_r)   1       2^(G_last - G_r) scale 2^G_r
dv    reverse  k [Dk]   q [Dk]   do[:, u]   dS                     c >= r   2^(G_c - G_r)   1       2^(G_last - G_r) scale 2^G_r

(r, c: the chunk's tokens as the scores' rows and columns; G the cumulative log2 decay from the chunk's start, every
exponent <= 0; "reverse": the walk takes the chunks from the last, and dS starts at the final state's gradient). With a
decay dq and dk leave the diagonal out (strict masks) so that the decay's gradient never carries the diagonal's
rounding (launch.decay_grad); each adds it back in float32 from the scores' diagonal, r_t = scale s_tt (do_t . v_t):
dq_t += beta_t r_t k_t, dk_t = beta_t (dk_t + r_t q_t), and writes the decay gradient's per-token part over its columns
from a fifth operand E (q for dq: q_t . dq_t; k for dk: k_t . beta_t dk_t), as kernels_tl's EPILOGUE does; dv with beta
writes d beta_t's part v_t . dv_t (E = v) and stores beta_t dv_t. A tile is one (batch, head): consumer c (a warpgroup)
takes the output's columns [c U, (c + 1) U), U = half the output's width, and both read the stage's A and B.

Bytes a chunk and head (d 128, bf16): A, B 16 KB each, X 16 KB, E 16 KB (dq, dk; dv with beta), the output 16 KB:
the forward's 64 KB plus E's. dq reads do, v, k, q; dk v, do, q, k; dv k, q, do (v with beta). The tl split kernels
(kernels_tl la_bwd_dq_kernel, la_bwd_dkv_kernel PART 1 / 2) are this kernel's twins on other GPUs and in the
interpreter.
"""
import torch
from triton.experimental import gluon

from tilecore.tiles.gluon import Layout, ring, run, stage_struct, store_block, struct, wgmma_layout, wgmma_lhs_layout
from tilecore.tiles.gluon.compat import fence_async_shared, gl, mbarrier, tma, warpgroup_mma

from tilecore.ops.linear_attention.gluon_forward import BT_GLUON, chunk_heads_prep, tma_ok

DQ, DK, DV = gl.constexpr(0), gl.constexpr(1), gl.constexpr(2)  # the roles (the kernel's ROLE)
ROLES = {"dq": 0, "dk": 1, "dv": 2}


@stage_struct
class Chunk:
    a: object  # [1, 1, BT, Din]
    b: object  # [1, 1, BT, Din]
    x0: object  # [1, 1, BT, U]: unit 0's X
    x1: object  # unit 1's


@stage_struct
class ChunkG:
    """With a decay: G and beta by token (head-major) beside A, B, X."""
    a: object
    b: object
    x0: object
    x1: object
    g: object  # [1, 1, BT] float32: G in log2 units (chunk_heads_prep)
    beta: object  # [1, 1, BT] float32 (without beta: G's again, unread)


@stage_struct
class ChunkE:
    """With a decay and E (dq, dk; dv with beta): each unit's E too."""
    a: object
    b: object
    x0: object
    x1: object
    g: object
    beta: object
    e0: object  # [1, 1, BT, U]
    e1: object


@struct
class Head:
    b: object  # batch row
    h: object  # v head


@struct
class Walk:
    S: object  # [Din, U] float32, a wgmma accumulator


@gluon.jit
def operand_store(smem, x):
    """x into a wgmma operand buffer: once every thread of the warpgroup is past the wgmmas that read it (they are
    synchronous), then fenced for the async proxy and the warpgroup's stores all done."""
    gl.thread_barrier()
    smem.store(x)
    fence_async_shared()
    gl.thread_barrier()


@struct
class ScalarBackward:
    a_desc: object
    b_desc: object
    x_desc: object
    e_desc: object
    o_desc: object
    g_desc: object
    beta_desc: object
    S0: object  # the state's start (dq: h0; dk, dv: the final state's gradient), any strides
    s0b: object
    s0h: object
    s0r: object  # the stride of the state's rows (Din) in S0's memory
    s0c: object  # of its columns (the output's channels)
    ST: object  # dv: dh0 (B, H, Dk, Dv), the walk's last state
    stb: object
    sth: object
    str_: object
    stc: object
    DG: object  # (2, B, N, H) float32: the per-token parts (decay gradient's or d beta's), one a unit
    s_dgp: object
    N: object
    H: object
    AB_GROUP: object  # A's and B's head: h // AB_GROUP (dv: the q/k group; dq, dk: 1)
    X_GROUP: object  # X's and E's head: h // X_GROUP
    scale: object
    state_smem: object  # [2, Din, U]: each consumer's S in the input dtype (the B operand of A S)
    wx_smem: object  # [2, BT, U]: each consumer's weighted X (the B operand of the update)
    BT: gl.constexpr
    DIN: gl.constexpr
    U: gl.constexpr
    ROLE: gl.constexpr
    DECAY: gl.constexpr
    HAS_BETA: gl.constexpr
    HAS_E: gl.constexpr
    HAS_S0: gl.constexpr
    STORE_ST: gl.constexpr
    SL: gl.constexpr  # [BT, BT] scores
    OL: gl.constexpr  # [BT, U] outputs
    STL: gl.constexpr  # [Din, U] state
    PL: gl.constexpr  # P as the register operand of P X

    @gluon.jit
    def setup(self, tile_id):
        return Head(tile_id // self.H, tile_id % self.H), gl.cdiv(self.N, self.BT)

    @gluon.jit
    def wait(self, ctx, walk):
        """Nothing of a tile is in flight at its end: every wgmma of a step is waited in the step."""
        return walk

    @gluon.jit
    def finish(self, ctx, walk, tile):
        if self.STORE_ST:  # dv's walk ends at the start: its state is dh0
            ptrs = self.state_ptrs(self.ST, tile.b, tile.h, ctx.index, self.stb, self.sth, self.str_, self.stc)
            gl.store(ptrs, walk.S)

    @gluon.jit
    def chunk(self, step):
        """The step's chunk: dq walks forward, dk and dv from the last chunk."""
        if self.ROLE == DQ:
            c = step
        else:
            c = gl.cdiv(self.N, self.BT) - 1 - step
        return c

    @gluon.jit
    def load(self, stage, bar, tile, step):
        t0 = self.chunk(step) * self.BT
        hab = tile.h // self.AB_GROUP
        hx = tile.h // self.X_GROUP
        tma.async_copy_global_to_shared(self.a_desc, [tile.b, hab, t0, 0], bar, stage.a)
        tma.async_copy_global_to_shared(self.b_desc, [tile.b, hab, t0, 0], bar, stage.b)
        tma.async_copy_global_to_shared(self.x_desc, [tile.b, hx, t0, 0], bar, stage.x0)
        tma.async_copy_global_to_shared(self.x_desc, [tile.b, hx, t0, self.U], bar, stage.x1)
        if self.HAS_E:
            tma.async_copy_global_to_shared(self.e_desc, [tile.b, hx, t0, 0], bar, stage.e0)
            tma.async_copy_global_to_shared(self.e_desc, [tile.b, hx, t0, self.U], bar, stage.e1)
        if self.DECAY:
            tma.async_copy_global_to_shared(self.g_desc, [tile.b, tile.h, t0], bar, stage.g)
            tma.async_copy_global_to_shared(self.beta_desc, [tile.b, tile.h, t0], bar, stage.beta)

    @gluon.jit
    def state_ptrs(self, base, b, h, c: gl.constexpr, sb, sh, sr, sc):
        rows = gl.arange(0, self.DIN, layout=gl.SliceLayout(1, self.STL))
        cols = c * self.U + gl.arange(0, self.U, layout=gl.SliceLayout(0, self.STL))
        return (base + b.to(gl.int64) * sb + h.to(gl.int64) * sh + gl.expand_dims(rows.to(gl.int64) * sr, 1)
                + gl.expand_dims(cols.to(gl.int64) * sc, 0))

    @gluon.jit
    def start(self, ctx, tile, prev):
        S = gl.zeros([self.DIN, self.U], gl.float32, self.STL)
        if self.HAS_S0:
            S = gl.load(self.state_ptrs(self.S0, tile.b, tile.h, ctx.index, self.s0b, self.s0h, self.s0r, self.s0c))
        return Walk(S)

    @gluon.jit
    def compute(self, ctx, walk, stage, tile, step):
        """One chunk (the table above). Ordered as the forward's: the old state to shared memory first (the update
        then overwrites the registers), the scores, the output, the update."""
        c: gl.constexpr = ctx.index
        a = stage.a.reshape([self.BT, self.DIN])
        b = stage.b.reshape([self.BT, self.DIN])
        if c == 0:
            x = stage.x0.reshape([self.BT, self.U])
        else:
            x = stage.x1.reshape([self.BT, self.U])
        dtype: gl.constexpr = self.a_desc.dtype
        t0 = self.chunk(step) * self.BT
        offs_r = gl.arange(0, self.BT, layout=gl.SliceLayout(1, self.SL))
        offs_c = gl.arange(0, self.BT, layout=gl.SliceLayout(0, self.SL))
        offs_o = gl.arange(0, self.BT, layout=gl.SliceLayout(1, self.OL))
        row_ok = t0 + offs_o < self.N
        if self.ROLE == DQ:
            keep = gl.expand_dims(offs_r, 1) >= gl.expand_dims(offs_c, 0)
            if self.DECAY:  # strict: the diagonal comes back in float32 below
                keep = gl.expand_dims(offs_r, 1) > gl.expand_dims(offs_c, 0)
        else:
            keep = gl.expand_dims(offs_c, 0) >= gl.expand_dims(offs_r, 1)
            if self.ROLE == DK and self.DECAY:
                keep = gl.expand_dims(offs_c, 0) > gl.expand_dims(offs_r, 1)

        # the per-token factors: rowf on the output's rows, w on the update's (X's rows), the state's decay
        rowf = gl.zeros([self.BT], gl.float32, gl.SliceLayout(1, self.OL)) + 1.0
        w = gl.where(row_ok, 1.0, 0.0)
        S_decay = 1.0
        if self.ROLE == DQ:
            rowf = rowf * self.scale
        else:
            w = w * self.scale
        if self.DECAY:
            g_smem = stage.g.reshape([self.BT])
            G_r = g_smem.load(gl.SliceLayout(1, self.SL))
            G_c = g_smem.load(gl.SliceLayout(0, self.SL))
            G_o = g_smem.load(gl.SliceLayout(1, self.OL))
            # the chunk's last token's G (the host pads G past N with the last token's)
            G_last = gl.sum(gl.where(offs_c == self.BT - 1, G_c, 0.0), axis=0)
            S_decay = gl.exp2(G_last)
            if self.ROLE == DQ:
                rowf = rowf * gl.exp2(G_o)
                w = w * gl.exp2(G_last - G_o)
            else:
                rowf = rowf * gl.exp2(G_last - G_o)
                w = w * gl.exp2(G_o)
        if self.HAS_BETA:
            beta_o = stage.beta.reshape([self.BT]).load(gl.SliceLayout(1, self.OL))
            if self.ROLE == DQ:
                w = w * beta_o

        S_smem = self.state_smem.index(c)
        wx = self.wx_smem.index(c)
        operand_store(S_smem, walk.S.to(dtype))  # (the previous step's wgmmas have read both buffers)

        # the scores A B^T, their decay and mask
        s = warpgroup_mma(a, b.permute((1, 0)), gl.zeros([self.BT, self.BT], gl.float32, self.SL), use_acc=False)
        if self.HAS_E and self.ROLE != DV:  # the diagonal's r_t = scale s_tt (do_t . v_t), taken now: s dies below
            diag = gl.sum(gl.where(gl.expand_dims(offs_r, 1) == gl.expand_dims(offs_c, 0), s, 0.0), axis=1)
            r = gl.convert_layout(diag, gl.SliceLayout(1, self.OL)) * self.scale
        p = s * self.scale
        if self.DECAY:
            if self.ROLE == DQ:
                diff = gl.expand_dims(G_r, 1) - gl.expand_dims(G_c, 0)
            else:
                diff = gl.expand_dims(G_c, 0) - gl.expand_dims(G_r, 1)
            p = p * gl.exp2(gl.where(keep, diff, float("-inf")))
        if self.HAS_BETA and self.ROLE == DQ:
            beta_c = stage.beta.reshape([self.BT]).load(gl.SliceLayout(0, self.SL))
            p = p * gl.expand_dims(beta_c, 0)
        p = gl.convert_layout(gl.where(keep, p, 0.0).to(dtype), self.PL)

        # out = rowf (A S_old) + P X
        o = warpgroup_mma(a, S_smem, gl.zeros([self.BT, self.U], gl.float32, self.OL), use_acc=False)
        o = warpgroup_mma(p, x, o * gl.expand_dims(rowf, 1))

        # S <- 2^(G_last) S + B^T (w X)
        operand_store(wx, (x.load(self.OL).to(gl.float32) * gl.expand_dims(w, 1)).to(dtype))
        S = warpgroup_mma(b.permute((1, 0)), wx, walk.S * S_decay)

        # the epilogue: the diagonal, beta, the per-token parts
        if self.HAS_E:
            if c == 0:
                e = stage.e0.reshape([self.BT, self.U]).load(self.OL).to(gl.float32)
            else:
                e = stage.e1.reshape([self.BT, self.U]).load(self.OL).to(gl.float32)
            if self.HAS_BETA:
                beta_r = beta_o
            else:
                beta_r = gl.zeros([self.BT], gl.float32, gl.SliceLayout(1, self.OL)) + 1.0
            if self.ROLE == DV:
                part = gl.sum(e * o, axis=1)  # d beta_t's part: v_t . dv_t over the unit's columns
                o = o * gl.expand_dims(beta_r, 1)
            else:
                xf = x.load(self.OL).to(gl.float32)
                if self.ROLE == DQ:
                    part = gl.sum(e * o, axis=1)  # q_t . dq_t without the diagonal
                    o = o + gl.expand_dims(beta_r * r, 1) * xf
                else:
                    o = o * gl.expand_dims(beta_r, 1)
                    part = gl.sum(e * o, axis=1)  # k_t . dk_t without the diagonal
                    o = o + gl.expand_dims(beta_r * r, 1) * xf
            rows = (tile.b.to(gl.int64) * self.N + t0 + offs_o) * self.H + tile.h
            gl.store(self.DG + c * self.s_dgp + rows, part, mask=row_ok)
        store_block(o, self.o_desc, ctx.out, [tile.b, tile.h, t0, c * self.U])  # (rows past N clipped by TMA)
        return Walk(S)


@gluon.jit
def la_bwd_gluon_kernel(a_desc, b_desc, x_desc, e_desc, o_desc, g_desc, beta_desc, S0, s0b, s0h, s0r, s0c,
                        ST, stb, sth, str_, stc, DG, s_dgp, N, H, AB_GROUP, X_GROUP, scale, num_tiles,
                        ROLE: gl.constexpr, STAGES: gl.constexpr, DECAY: gl.constexpr, HAS_BETA: gl.constexpr,
                        HAS_S0: gl.constexpr, STORE_ST: gl.constexpr):
    """dq, dk or dv (ROLE) of every (batch, head); a persistent grid, two consumer warpgroups (num_warps = 4), each
    half of the output's columns, and a producer warp."""
    gl.static_assert(DECAY or not HAS_BETA, "beta comes with a decay (Mamba-2's dt)")
    BT: gl.constexpr = a_desc.block_type.shape[2]
    DIN: gl.constexpr = a_desc.block_type.shape[3]
    U: gl.constexpr = x_desc.block_type.shape[3]
    HAS_E: gl.constexpr = DECAY if ROLE != DV else HAS_BETA
    SL: gl.constexpr = wgmma_layout(BT, BT, gl.num_warps())
    OL: gl.constexpr = wgmma_layout(BT, U, gl.num_warps())
    state_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=min(128, 2 * U), element_bitwidth=16,
                                                       rank=2)
    state_smem = gl.allocate_shared_memory(a_desc.dtype, [2, DIN, U], state_layout)
    wx_smem = gl.allocate_shared_memory(a_desc.dtype, [2, BT, U], state_layout)
    op = ScalarBackward(a_desc, b_desc, x_desc, e_desc, o_desc, g_desc, beta_desc, S0, s0b, s0h, s0r, s0c, ST, stb,
                        sth, str_, stc, DG, s_dgp, N, H, AB_GROUP, X_GROUP, scale, state_smem, wx_smem, BT, DIN, U,
                        ROLE, DECAY, HAS_BETA, HAS_E, HAS_S0, STORE_ST, SL, OL, wgmma_layout(DIN, U, gl.num_warps()),
                        wgmma_lhs_layout(BT, U, gl.num_warps()))
    if HAS_E:
        stages = ChunkE(ring(a_desc, STAGES), ring(b_desc, STAGES), ring(x_desc, STAGES), ring(x_desc, STAGES),
                        ring(g_desc, STAGES), ring(beta_desc, STAGES), ring(e_desc, STAGES), ring(e_desc, STAGES))
    elif DECAY:
        stages = ChunkG(ring(a_desc, STAGES), ring(b_desc, STAGES), ring(x_desc, STAGES), ring(x_desc, STAGES),
                        ring(g_desc, STAGES), ring(beta_desc, STAGES))
    else:
        stages = Chunk(ring(a_desc, STAGES), ring(b_desc, STAGES), ring(x_desc, STAGES), ring(x_desc, STAGES))
    num_tiles = gl.program_id(0) * 0 + num_tiles  # (a tensor where the launch specialized it to 1)
    run(op, Layout(o_desc, STAGES, CONSUMERS=2, LATE_RELEASE=0), stages, num_tiles)


@stage_struct
class ChunkKV:
    """The fused dk / dv walk's stage (Dk = 128): q and k by key halves, v and do by value halves, G and beta."""
    q0: object  # [1, 1, BT, KH]
    q1: object
    k0: object
    k1: object
    v0: object  # [1, 1, BT, U]
    v1: object
    do0: object
    do1: object
    g: object
    beta: object


@struct
class WalkKV:
    S0: object  # [KH, U] float32: dS's rows of key half 0, this consumer's value columns
    S1: object  # key half 1


@struct
class ScalarBackwardKV:
    """dk and dv by one reverse walk (ROLE DKV): consumer c holds dS's value columns [c U, (c + 1) U) as two key halves
    (two wgmma accumulators [KH, U]) and writes dv's columns of its values and dk's key half c. dk's half c sums over
    both consumers' value columns, v_0 dS_0[c]^T + v_1 dS_1[c]^T: each consumer puts its dS halves in shared memory as
    bf16 every step (the B operands of its own k dS), the half the other reads in a buffer of the step's parity, and the
    two meet on an mbarrier of that parity (count 2) before the cross product; the other reads the parity's buffer two
    steps later only after it has met this step's barrier, which it reaches after its reads of the step before. Both
    make the full scores v do^T and k q^T (two wgmmas each over the halves): dk's diagonal r_t is then whole in each."""
    qh_desc: object
    kh_desc: object
    v_desc: object
    do_desc: object
    dk_desc: object
    dv_desc: object
    g_desc: object
    beta_desc: object
    S0: object  # the final state's gradient (B, H, Dk, Dv), any strides
    s0b: object
    s0h: object
    s0r: object
    s0c: object
    ST: object  # dh0 (B, H, Dk, Dv)
    stb: object
    sth: object
    str_: object
    stc: object
    DG: object  # (2, B, N, H) float32: the decay gradient's key-side parts, one a key half
    DB: object  # (2, B, N, H) float32: d beta's parts, one a value half
    s_dgp: object
    N: object
    H: object
    GROUP: object
    scale: object
    own_smem: object  # [2, KH, U]: consumer c's dS half c (read by itself)
    give_smem: object  # [4, KH, U]: consumer c's dS half 1 - c at parity p: index 2 p + c (read by the other)
    wx_smem: object  # [2, BT, U]: each consumer's weighted do
    met: object  # [2, 1] mbarriers (count 2): both consumers' dS halves of the step's parity are in shared memory
    BT: gl.constexpr
    KH: gl.constexpr
    U: gl.constexpr
    DECAY: gl.constexpr
    HAS_BETA: gl.constexpr
    HAS_S0: gl.constexpr
    STORE_ST: gl.constexpr
    SL: gl.constexpr
    OL: gl.constexpr  # [BT, U] (= [BT, KH]: U == KH) outputs
    STL: gl.constexpr  # [KH, U] state halves
    PL: gl.constexpr

    @gluon.jit
    def setup(self, tile_id):
        return Head(tile_id // self.H, tile_id % self.H), gl.cdiv(self.N, self.BT)

    @gluon.jit
    def load(self, stage, bar, tile, step):
        t0 = (gl.cdiv(self.N, self.BT) - 1 - step) * self.BT
        hk = tile.h // self.GROUP
        tma.async_copy_global_to_shared(self.qh_desc, [tile.b, hk, t0, 0], bar, stage.q0)
        tma.async_copy_global_to_shared(self.qh_desc, [tile.b, hk, t0, self.KH], bar, stage.q1)
        tma.async_copy_global_to_shared(self.kh_desc, [tile.b, hk, t0, 0], bar, stage.k0)
        tma.async_copy_global_to_shared(self.kh_desc, [tile.b, hk, t0, self.KH], bar, stage.k1)
        tma.async_copy_global_to_shared(self.v_desc, [tile.b, tile.h, t0, 0], bar, stage.v0)
        tma.async_copy_global_to_shared(self.v_desc, [tile.b, tile.h, t0, self.U], bar, stage.v1)
        tma.async_copy_global_to_shared(self.do_desc, [tile.b, tile.h, t0, 0], bar, stage.do0)
        tma.async_copy_global_to_shared(self.do_desc, [tile.b, tile.h, t0, self.U], bar, stage.do1)
        tma.async_copy_global_to_shared(self.g_desc, [tile.b, tile.h, t0], bar, stage.g)
        tma.async_copy_global_to_shared(self.beta_desc, [tile.b, tile.h, t0], bar, stage.beta)

    @gluon.jit
    def half_ptrs(self, base, b, h, c: gl.constexpr, half: gl.constexpr, sb, sh, sr, sc):
        rows = half * self.KH + gl.arange(0, self.KH, layout=gl.SliceLayout(1, self.STL))
        cols = c * self.U + gl.arange(0, self.U, layout=gl.SliceLayout(0, self.STL))
        return (base + b.to(gl.int64) * sb + h.to(gl.int64) * sh + gl.expand_dims(rows.to(gl.int64) * sr, 1)
                + gl.expand_dims(cols.to(gl.int64) * sc, 0))

    @gluon.jit
    def start(self, ctx, tile, prev):
        S0 = gl.zeros([self.KH, self.U], gl.float32, self.STL)
        S1 = gl.zeros([self.KH, self.U], gl.float32, self.STL)
        if self.HAS_S0:
            c: gl.constexpr = ctx.index
            S0 = gl.load(self.half_ptrs(self.S0, tile.b, tile.h, c, 0, self.s0b, self.s0h, self.s0r, self.s0c))
            S1 = gl.load(self.half_ptrs(self.S0, tile.b, tile.h, c, 1, self.s0b, self.s0h, self.s0r, self.s0c))
        return WalkKV(S0, S1)

    @gluon.jit
    def wait(self, ctx, walk):
        """Every wgmma of a step is waited in the step."""
        return walk

    @gluon.jit
    def finish(self, ctx, walk, tile):
        if self.STORE_ST:  # the walk ends at the start: dh0
            c: gl.constexpr = ctx.index
            gl.store(self.half_ptrs(self.ST, tile.b, tile.h, c, 0, self.stb, self.sth, self.str_, self.stc), walk.S0)
            gl.store(self.half_ptrs(self.ST, tile.b, tile.h, c, 1, self.stb, self.sth, self.str_, self.stc), walk.S1)

    @gluon.jit
    def compute(self, ctx, walk, stage, tile, step):
        c: gl.constexpr = ctx.index
        dtype: gl.constexpr = self.qh_desc.dtype
        BT: gl.constexpr = self.BT
        q0 = stage.q0.reshape([BT, self.KH])
        q1 = stage.q1.reshape([BT, self.KH])
        k0 = stage.k0.reshape([BT, self.KH])
        k1 = stage.k1.reshape([BT, self.KH])
        v0 = stage.v0.reshape([BT, self.U])
        v1 = stage.v1.reshape([BT, self.U])
        do0 = stage.do0.reshape([BT, self.U])
        do1 = stage.do1.reshape([BT, self.U])
        if c == 0:
            q_c, k_c, v_c, do_c, v_o = q0, k0, v0, do0, v1
        else:
            q_c, k_c, v_c, do_c, v_o = q1, k1, v1, do1, v0
        t0 = (gl.cdiv(self.N, BT) - 1 - step) * BT
        offs_r = gl.arange(0, BT, layout=gl.SliceLayout(1, self.SL))
        offs_c = gl.arange(0, BT, layout=gl.SliceLayout(0, self.SL))
        offs_o = gl.arange(0, BT, layout=gl.SliceLayout(1, self.OL))
        row_ok = t0 + offs_o < self.N
        rowf = gl.zeros([BT], gl.float32, gl.SliceLayout(1, self.OL)) + 1.0
        w = gl.where(row_ok, self.scale, 0.0)
        S_decay = 1.0
        if self.DECAY:
            g_smem = stage.g.reshape([BT])
            G_r = g_smem.load(gl.SliceLayout(1, self.SL))
            G_c = g_smem.load(gl.SliceLayout(0, self.SL))
            G_o = g_smem.load(gl.SliceLayout(1, self.OL))
            G_last = gl.sum(gl.where(offs_c == BT - 1, G_c, 0.0), axis=0)  # (the host pads G past N with it)
            S_decay = gl.exp2(G_last)
            rowf = gl.exp2(G_last - G_o)
            w = w * gl.exp2(G_o)
            f = gl.exp2(gl.where(gl.expand_dims(offs_c, 0) >= gl.expand_dims(offs_r, 1),
                                 gl.expand_dims(G_c, 0) - gl.expand_dims(G_r, 1), float("-inf")))

        # dS's halves to shared memory: the own half, and the half the other consumer reads at this parity
        par = ctx.ring_step % 2
        own = self.own_smem.index(c)
        give = self.give_smem.index(2 * par + c)
        got = self.give_smem.index(2 * par + 1 - c)
        if c == 0:
            S_own, S_give = walk.S0, walk.S1
        else:
            S_own, S_give = walk.S1, walk.S0
        gl.thread_barrier()  # (this warpgroup's wgmmas of the step before have read ``own``)
        own.store(S_own.to(dtype))
        give.store(S_give.to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(self.met.index(par))

        # dk's half c: the scores v do^T over every value column (the diagonal's r whole), strictly above the diagonal
        zero_s = gl.zeros([BT, BT], gl.float32, self.SL)
        s = warpgroup_mma(v0, do0.permute((1, 0)), zero_s, use_acc=False)
        s = warpgroup_mma(v1, do1.permute((1, 0)), s)
        keep = gl.expand_dims(offs_c, 0) >= gl.expand_dims(offs_r, 1)
        if self.DECAY:
            keep = gl.expand_dims(offs_c, 0) > gl.expand_dims(offs_r, 1)
            diag = gl.sum(gl.where(gl.expand_dims(offs_r, 1) == gl.expand_dims(offs_c, 0), s, 0.0), axis=1)
            r = gl.convert_layout(diag, gl.SliceLayout(1, self.OL)) * self.scale
            s = s * f
        p = gl.convert_layout(gl.where(keep, s * self.scale, 0.0).to(dtype), self.PL)
        mbarrier.wait(self.met.index(par), (ctx.ring_step // 2) & 1)  # the other's half c is in ``got``
        zero_o = gl.zeros([BT, self.KH], gl.float32, self.OL)
        o = warpgroup_mma(v_c, own.permute((1, 0)), zero_o, use_acc=False)
        o = warpgroup_mma(v_o, got.permute((1, 0)), o)
        o = warpgroup_mma(p, q_c, o * gl.expand_dims(rowf, 1))
        if self.DECAY:
            if self.HAS_BETA:
                beta_o = stage.beta.reshape([BT]).load(gl.SliceLayout(1, self.OL))
                o = o * gl.expand_dims(beta_o, 1)
                rb = beta_o * r
            else:
                rb = r
            part = gl.sum(k_c.load(self.OL).to(gl.float32) * o, axis=1)  # k_t . dk_t without the diagonal
            o = o + gl.expand_dims(rb, 1) * q_c.load(self.OL).to(gl.float32)
            rows = (tile.b.to(gl.int64) * self.N + t0 + offs_o) * self.H + tile.h
            gl.store(self.DG + c * self.s_dgp + rows, part, mask=row_ok)
        store_block(o, self.dk_desc, ctx.out, [tile.b, tile.h, t0, c * self.KH])

        # dv's columns c: the scores k q^T, on and above the diagonal; k dS from this consumer's halves
        s = warpgroup_mma(k0, q0.permute((1, 0)), zero_s, use_acc=False)
        s = warpgroup_mma(k1, q1.permute((1, 0)), s)
        if self.DECAY:
            s = s * f
        keep = gl.expand_dims(offs_c, 0) >= gl.expand_dims(offs_r, 1)
        p = gl.convert_layout(gl.where(keep, s * self.scale, 0.0).to(dtype), self.PL)
        zero_v = gl.zeros([BT, self.U], gl.float32, self.OL)
        if c == 0:
            o = warpgroup_mma(k0, own, zero_v, use_acc=False)
            o = warpgroup_mma(k1, give, o)
        else:
            o = warpgroup_mma(k0, give, zero_v, use_acc=False)
            o = warpgroup_mma(k1, own, o)
        o = warpgroup_mma(p, do_c, o * gl.expand_dims(rowf, 1))
        if self.HAS_BETA:
            rows = (tile.b.to(gl.int64) * self.N + t0 + offs_o) * self.H + tile.h
            gl.store(self.DB + c * self.s_dgp + rows, gl.sum(v_c.load(self.OL).to(gl.float32) * o, axis=1),
                     mask=row_ok)
            o = o * gl.expand_dims(stage.beta.reshape([BT]).load(gl.SliceLayout(1, self.OL)), 1)
        store_block(o, self.dv_desc, ctx.out, [tile.b, tile.h, t0, c * self.U])

        # dS <- 2^(G_last) dS + q^T (w do_c), by key halves
        wx = self.wx_smem.index(c)
        operand_store(wx, (do_c.load(self.OL).to(gl.float32) * gl.expand_dims(w, 1)).to(dtype))
        S0 = warpgroup_mma(q0.permute((1, 0)), wx, walk.S0 * S_decay)
        S1 = warpgroup_mma(q1.permute((1, 0)), wx, walk.S1 * S_decay)
        return WalkKV(S0, S1)


@gluon.jit
def la_bwd_dkv_gluon_kernel(qh_desc, kh_desc, v_desc, do_desc, dk_desc, dv_desc, g_desc, beta_desc, S0, s0b, s0h,
                            s0r, s0c, ST, stb, sth, str_, stc, DG, DB, s_dgp, N, H, GROUP, scale, num_tiles,
                            STAGES: gl.constexpr, DECAY: gl.constexpr, HAS_BETA: gl.constexpr, HAS_S0: gl.constexpr,
                            STORE_ST: gl.constexpr):
    """dk and dv of every (batch, head) by one reverse walk (ScalarBackwardKV), Dk = Dv = 128; a persistent grid, two
    consumer warpgroups (num_warps = 4) and a producer warp."""
    gl.static_assert(DECAY or not HAS_BETA, "beta comes with a decay (Mamba-2's dt)")
    BT: gl.constexpr = v_desc.block_type.shape[2]
    U: gl.constexpr = v_desc.block_type.shape[3]
    KH: gl.constexpr = qh_desc.block_type.shape[3]
    gl.static_assert(U == KH, "dk's and dv's blocks share the consumer's output buffer")
    SL: gl.constexpr = wgmma_layout(BT, BT, gl.num_warps())
    OL: gl.constexpr = wgmma_layout(BT, U, gl.num_warps())
    state_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=min(128, 2 * U), element_bitwidth=16, rank=2)
    own_smem = gl.allocate_shared_memory(v_desc.dtype, [2, KH, U], state_layout)
    give_smem = gl.allocate_shared_memory(v_desc.dtype, [4, KH, U], state_layout)
    wx_smem = gl.allocate_shared_memory(v_desc.dtype, [2, BT, U], state_layout)
    met = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(met.index(i), count=2)
    op = ScalarBackwardKV(qh_desc, kh_desc, v_desc, do_desc, dk_desc, dv_desc, g_desc, beta_desc, S0, s0b, s0h, s0r,
                          s0c, ST, stb, sth, str_, stc, DG, DB, s_dgp, N, H, GROUP, scale, own_smem, give_smem, wx_smem,
                          met, BT, KH, U, DECAY, HAS_BETA, HAS_S0, STORE_ST, SL, OL, wgmma_layout(KH, U, gl.num_warps()),
                          wgmma_lhs_layout(BT, U, gl.num_warps()))
    stages = ChunkKV(ring(qh_desc, STAGES), ring(qh_desc, STAGES), ring(kh_desc, STAGES), ring(kh_desc, STAGES),
                     ring(v_desc, STAGES), ring(v_desc, STAGES), ring(do_desc, STAGES), ring(do_desc, STAGES),
                     ring(g_desc, STAGES), ring(beta_desc, STAGES))
    num_tiles = gl.program_id(0) * 0 + num_tiles  # (a tensor where the launch specialized it to 1)
    run(op, Layout(dk_desc, STAGES, CONSUMERS=2, LATE_RELEASE=0), stages, num_tiles)
    for i in gl.static_range(2):
        mbarrier.invalidate(met.index(i))


# --------------------------------------------------------------------------------------------
# host side


def fits(q, k, v, g, beta, feature: int) -> str | None:
    """None where these kernels take the backward's inputs, else why not (the tl split kernels run them)."""
    if feature != 0:
        return "a feature map"
    if g is not None and g.dim() != 3:
        return "a per-channel decay"
    if beta is not None and g is None:
        return "beta without a decay"
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return "not bf16/fp16"
    if q.shape[-1] not in (64, 128) or v.shape[-1] not in (64, 128):
        return f"Dk {q.shape[-1]} or Dv {v.shape[-1]} (takes 64, 128)"
    if q.device.type != "cuda" or v.numel() == 0:
        return "not a CUDA tensor, or empty"
    if not all(tma_ok(t) for t in (q, k, v)):
        return "strides or alignment TMA does not take"
    return None


def launch_args(role: str, q, k, v, do, G, beta_h, state0, out, dg_parts, dh0, scale: float, stages: int = 2, *,
                operand=None):
    """(grid, arguments by name, num_warps) of la_bwd_gluon_kernel for ``role`` ("dq", "dk", "dv"): q, k (B, N, Hqk,
    Dk), v and do (B, N, H, Dv) TMA-able in one 16-bit dtype; G and beta_h chunk_heads_prep's (or None); state0 h0
    (dq) or the final state's gradient (dk, dv), (B, H, Dk, Dv) any strides, or None; out the role's contiguous
    (B, N, H, D) output; dg_parts (2, B, N, H) float32 contiguous where the role writes parts (dq, dk with a decay,
    dv with beta); dh0 (dv) (B, H, Dk, Dv) or None."""
    from tilecore.tiles.launch import gluon_descriptor
    from tilecore.tiles.schedule import persistent_programs

    make = operand or gluon_descriptor
    B, N, H, Dv = v.shape
    Dk = q.shape[-1]
    group = H // q.shape[2]
    BT = BT_GLUON
    a_t, b_t, x_t, e_t = {"dq": (do, v, k, q), "dk": (v, do, q, k), "dv": (k, q, do, v)}[role]
    din, dout = a_t.shape[-1], x_t.shape[-1]
    U = dout // 2
    # (B, N, H, D) tensors as the (B, H, N, D) views the descriptors walk
    descs = dict(a_desc=make(a_t.transpose(1, 2), [1, 1, BT, din]), b_desc=make(b_t.transpose(1, 2), [1, 1, BT, din]),
                 x_desc=make(x_t.transpose(1, 2), [1, 1, BT, U]), o_desc=make(out.transpose(1, 2), [1, 1, BT, U]))
    decay = G is not None
    has_beta = beta_h is not None
    has_e = decay if role != "dv" else has_beta
    descs["e_desc"] = make(e_t.transpose(1, 2), [1, 1, BT, U]) if has_e else descs["x_desc"]
    g_desc = descs["x_desc"]
    if decay:
        if G.dim() != 3 or tuple(G.shape[:2]) != (B, H) or G.shape[2] % BT or not G.is_contiguous():
            raise ValueError(f"launch_args takes chunk_heads_prep's (B, H, N_pad) G, got {tuple(G.shape)}")
        g_desc = make(G, [1, 1, BT])
    beta_desc = make(beta_h, [1, 1, BT]) if has_beta else g_desc
    # the state's (rows, columns) = (Din, the output's channels): dq's and dk's are transposed (Dv, Dk)
    dummy = torch.empty(1, dtype=torch.float32, device=v.device)
    s0 = tuple(state0.stride()) if state0 is not None else (0, 0, 0, 0)
    s0r, s0c = (s0[3], s0[2]) if role != "dv" else (s0[2], s0[3])
    sh = tuple(dh0.stride()) if dh0 is not None else (0, 0, 0, 0)
    num_tiles = B * H
    args = dict(descs, g_desc=g_desc, beta_desc=beta_desc, S0=state0 if state0 is not None else dummy, s0b=s0[0],
                s0h=s0[1], s0r=s0r, s0c=s0c, ST=dh0 if dh0 is not None else dummy, stb=sh[0], sth=sh[1], str_=sh[2],
                stc=sh[3], DG=dg_parts if dg_parts is not None else dummy,
                s_dgp=dg_parts.stride(0) if dg_parts is not None else 0, N=N, H=H,
                AB_GROUP=group if role == "dv" else 1, X_GROUP=1 if role == "dv" else group, scale=scale,
                num_tiles=num_tiles, ROLE=ROLES[role], STAGES=stages, DECAY=decay, HAS_BETA=has_beta,
                HAS_S0=state0 is not None, STORE_ST=dh0 is not None)
    return (persistent_programs(num_tiles, v.device),), args, 4


def fused_dkv(q, v) -> bool:
    """Whether dk and dv can come from one walk (la_bwd_dkv_gluon_kernel): Dk = Dv = 128 (and, ``grads`` checks, dk
    and dv in one 16-bit dtype: no q/k head group summed after in float32, no D's term added after)."""
    return q.shape[-1] == 128 and v.shape[-1] == 128


def launch_args_dkv(q, k, v, do, G, beta_h, dht, dk, dv, dg_parts, dbeta_parts, dh0, scale: float, stages: int = 2, *,
                    operand=None):
    """(grid, arguments by name, num_warps) of la_bwd_dkv_gluon_kernel (``fused_dkv``); tensors as launch_args
    takes them, dk (per v head) and dv contiguous (B, N, H, 128), the parts (2, B, N, H) float32 or None."""
    from tilecore.tiles.launch import gluon_descriptor
    from tilecore.tiles.schedule import persistent_programs

    make = operand or gluon_descriptor
    B, N, H, Dv = v.shape
    BT, KH, U = BT_GLUON, q.shape[-1] // 2, Dv // 2
    decay = G is not None
    if not decay:  # (the stage's G and beta boxes: loaded, unread)
        G = torch.empty(B, H, -(-N // BT) * BT, dtype=torch.float32, device=v.device)
    g_desc = make(G, [1, 1, BT])
    descs = dict(qh_desc=make(q.transpose(1, 2), [1, 1, BT, KH]), kh_desc=make(k.transpose(1, 2), [1, 1, BT, KH]),
                 v_desc=make(v.transpose(1, 2), [1, 1, BT, U]), do_desc=make(do.transpose(1, 2), [1, 1, BT, U]),
                 dk_desc=make(dk.transpose(1, 2), [1, 1, BT, KH]), dv_desc=make(dv.transpose(1, 2), [1, 1, BT, U]),
                 g_desc=g_desc, beta_desc=make(beta_h, [1, 1, BT]) if beta_h is not None else g_desc)
    dummy = torch.empty(1, dtype=torch.float32, device=v.device)
    s0 = tuple(dht.stride()) if dht is not None else (0, 0, 0, 0)
    sh = tuple(dh0.stride()) if dh0 is not None else (0, 0, 0, 0)
    parts = dg_parts if dg_parts is not None else dbeta_parts
    args = dict(descs, S0=dht if dht is not None else dummy, s0b=s0[0], s0h=s0[1], s0r=s0[2], s0c=s0[3],
                ST=dh0 if dh0 is not None else dummy, stb=sh[0], sth=sh[1], str_=sh[2], stc=sh[3],
                DG=dg_parts if dg_parts is not None else dummy, DB=dbeta_parts if dbeta_parts is not None else dummy,
                s_dgp=parts.stride(0) if parts is not None else 0, N=N, H=H, GROUP=H // q.shape[2], scale=scale,
                num_tiles=B * H, STAGES=stages, DECAY=decay, HAS_BETA=beta_h is not None, HAS_S0=dht is not None,
                STORE_ST=dh0 is not None)
    return (persistent_programs(B * H, v.device),), args, 4


def grads(q, k, v, do, g, beta, h0, dht, scale: float, out_dtypes: dict, stages: int = 2, *, dkv: bool = False,
          launch=None, operand=None):
    """The three kernels: (dq per v head, dk per v head, dv, dG's query side parts, its key side parts, d beta's parts,
    dh0): dq, dk, dv in ``out_dtypes`` ({"dq", "dk", "dv"}), the parts (2, B, N, H) float32 (None where not made),
    dh0 float32 (None without h0). ``fits`` must have said None; do is cast to q's dtype where it differs, and made
    contiguous where TMA does not take it. ``dkv``: dk and dv by one walk (la_bwd_dkv_gluon_kernel, where ``fused_dkv``).
    ``launch(role, grid, args, num_warps)``: the launch (default plain)."""
    B, N, H, Dv = v.shape
    Dk = q.shape[-1]
    dev, f32 = v.device, torch.float32
    if do.dtype != q.dtype:
        do = do.to(q.dtype)
    if not tma_ok(do):
        do = do.contiguous()
    G, beta_h = chunk_heads_prep(g, beta, BT_GLUON) if g is not None else (None, None)
    dq = torch.empty(B, N, H, Dk, dtype=out_dtypes["dq"], device=dev)
    dk = torch.empty(B, N, H, Dk, dtype=out_dtypes["dk"], device=dev)
    dv = torch.empty(B, N, H, Dv, dtype=out_dtypes["dv"], device=dev)
    parts = lambda: torch.empty(2, B, N, H, dtype=f32, device=dev)  # noqa: E731
    dg_q = parts() if g is not None else None
    dg_k = parts() if g is not None else None
    dbeta = parts() if beta is not None else None
    dh0 = torch.empty(B, H, Dk, Dv, dtype=f32, device=dev) if h0 is not None else None
    calls = (("dq", h0, dq, dg_q, None), ("dk", dht, dk, dg_k, None), ("dv", dht, dv, dbeta, dh0))
    # (dk and dv go through one 16-bit output buffer a consumer: float32 ones do not fit beside the stages)
    if dkv and fused_dkv(q, v) and dk.dtype == dv.dtype != torch.float32:
        calls = calls[:1]
        grid, args, warps = launch_args_dkv(q, k, v, do, G, beta_h, dht, dk, dv, dg_k, dbeta, dh0, scale, stages,
                                            operand=operand)
        if launch is None:
            la_bwd_dkv_gluon_kernel[grid](**args, num_warps=warps)
        else:
            launch("dkv", grid, args, warps)
    for role, state0, out, dg, st in calls:
        grid, args, warps = launch_args(role, q, k, v, do, G, beta_h, state0, out, dg, st, scale, stages,
                                        operand=operand)
        if launch is None:
            la_bwd_gluon_kernel[grid](**args, num_warps=warps)
        else:
            launch(role, grid, args, warps)
    return dq, dk, dv, dg_q, dg_k, dbeta, dh0


# --------------------------------------------------------------------------------------------
# compile report (no GPU): compile_report(role, case) compiles the kernel for sm_90a as ``grads`` launches it and returns
# its resources and Hopper instructions. Cases: (Hqk, H, Dk, Dv, decay, beta, states); TRITON_INTERPRET must be unset
# (tests/linear_attention/test_scalar_bwd_gluon_compile.py runs it in a fresh process).

COMPILE_CASES = {
    "linear": (16, 16, 128, 128, False, False, False),
    "decay": (16, 16, 128, 128, True, False, True),
    "decay64": (16, 16, 64, 64, True, False, True),
    "mamba2": (1, 8, 128, 64, True, True, True),
}


def compile_report(role: str, case: str, stages: int = 2, compiled_out: list | None = None) -> dict:
    from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources

    Hqk, H, Dk, Dv, decay, has_beta, states = COMPILE_CASES[case]
    B, N, bf, f32 = 2, 4096, torch.bfloat16, torch.float32
    q = torch.empty(B, N, Hqk, Dk, dtype=bf)
    v = torch.empty(B, N, H, Dv, dtype=bf)
    G = torch.empty(B, H, N, dtype=f32) if decay else None
    beta_h = torch.empty(B, H, N, dtype=f32) if has_beta else None
    state = torch.empty(B, H, Dk, Dv, dtype=f32) if states else None
    out = torch.empty(B, N, H, Dk if role != "dv" else Dv, dtype=bf if Hqk == H or role == "dv" else f32)
    writes_parts = decay if role != "dv" else has_beta
    dg = torch.empty(2, B, N, H, dtype=f32) if writes_parts else None
    dh0 = state if role == "dv" and states else None
    if role == "dkv":
        parts = lambda: torch.empty(2, B, N, H, dtype=f32)  # noqa: E731
        grid, args, warps = launch_args_dkv(q, q, v, v, G, beta_h, state, out, torch.empty_like(v),
                                            parts() if decay else None, parts() if has_beta else None, state, 1.0,
                                            stages)
        compiled = compile_kernel(la_bwd_dkv_gluon_kernel, args, num_warps=warps)
    else:
        grid, args, warps = launch_args(role, q, q, v, v, G, beta_h, state, out, dg, dh0, 1.0, stages)
        compiled = compile_kernel(la_bwd_gluon_kernel, args, num_warps=warps)
    if compiled_out is not None:
        compiled_out.append(compiled)
    r = resources(compiled)
    return dict(role=role, case=case, spill_bytes=r.spill_stores, registers=r.registers, shared=r.shared,
                threads=r.threads, wgmma_serialized=r.wgmma_serialized, **has_hopper_instructions(compiled.asm["ptx"]))
