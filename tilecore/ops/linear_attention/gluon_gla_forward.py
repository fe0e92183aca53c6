"""The GLA forward (per-channel log decay g (B, N, H, Dk)) for Hopper on the tiles template
(tilecore/tiles/gluon/pipeline.py), the per-channel sibling of gluon_forward.py's kernel.

* a tile is two units (head, BV = 64 value columns) of one head (Dv a multiple of 128): both read the same q, k
  and g; ``setup`` gives its cdiv(N, BT) steps, one chunk of BT = 64 tokens each;
* a stage is the chunk's q, k [BT, Dk], raw g [BT, Dk] (its dtype: float32 as GLA's gates come) and each unit's v
  [BT, BV], TMA-loaded by the 1-warp producer through 4-D descriptors of (B, H, N, D) views (tokens past N arrive
  as zeros: g 0 keeps G at the last token's, k 0 adds nothing to the state);
* consumer c (a warpgroup) owns unit c, its state transposed S^T [BV, Dk] float32 in wgmma registers.

Each step, with G the chunk's cumulative log decay (log2 units, counted from the chunk's start, each g clamped at
the floor as kernels_tl.py does) and m = G_last / 2 per channel (the middle of [G_last, 0], G's range for log
decays <= 0), so every factor lies within 2^(+-span / 2) (span = -G_last):

    Qx = q 2^(G - m),  Kx = k 2^(m - G)         consumer c makes rows [32 c, 32 c + 32) of both, in place of
                                                the stage's q and k (one copy for the two units; a barrier of
                                                the op's own hands them over)
    Sx^T = S^T diag(2^m)                        the register A operand (input dtype) and the update's accumulator
    P^T  = mask(Kx Qx^T) scale                  (= k_j q_i 2^(G_i - G_j) summed over channels; made once for the
                                                pair: consumer c its queries' columns [32 c, 32 c + 32), into one
                                                P^T a step's parity in shared memory, V^T P^T's B operand, handed
                                                over by a second barrier of the op's own)
    o^T  = scale Sx^T Qx^T + V^T P^T            (= scale q_i 2^(G_i) S + P V: V^T a register operand)
    S^T <- (Sx^T + V^T Kx) diag(2^m)            (= 2^(G_last) S + k_j 2^(G_last - G_j) v_j)

Two exps a (token, channel) a consumer (the SFU's ex2), none a (query, key) pair. A chunk whose span exceeds
``span_limit`` (strong decays, a reset: g floored at -100 spans >= 144 in log2 units; a NaN) would overflow the
factored operands: the kernel flags its head (``REDO``, an int32 a (batch, head)) and runs on; ``forward`` then
runs the tl kernel (kernels_tl.la_fwd_kernel's REDO) on the flagged heads alone, which rewrites their o and final
states in full (its sub-chunk form: factors <= 1). Rounding: Qx, Kx, Sx^T and P^T go to the tensor cores in the
input dtype, as the tl kernel's factored form (decision 39).
"""
import torch
from triton.experimental import gluon

from tilecore.ops.linear_attention.gluon_forward import (LOG2E, LOG_DECAY_FLOOR_HOST, _head_major, empty_state,
                                                        pair_setup, pair_unit)
from tilecore.tiles.gluon import Layout, run, ring, stage_struct, struct, wgmma_layout, wgmma_lhs_layout
from tilecore.tiles.gluon.compat import fence_async_shared, gl, tma, warpgroup_mma, warpgroup_mma_wait
from tilecore.tiles.gluon.compat import mbarrier

BT_GLA = 64  # tokens a chunk (a wgmma's M)
BV_GLA = 64  # value columns a consumer
# the widest span (-G_last, log2 units) of the factored form by input dtype: factors within 2^(+-span / 2).
# bf16: 2^48 keeps |q| 2^48 far inside bf16's float32 exponent range; fp16: 2^5.5 keeps |q| 2^5.5 below 65504 for
# |q| < 1400 and |k| 2^-5.5 a normal fp16 for |k| > 3e-3 (kernels_tl._factor_span's reasoning, in log2 units)
SPAN_LIMIT = {torch.bfloat16: 96.0, torch.float16: 11.0}
LOG_DECAY_FLOOR = gl.constexpr(LOG_DECAY_FLOOR_HOST)
LOG2E_K = gl.constexpr(LOG2E)


@stage_struct
class GlaChunk:
    q: object  # [1, 1, BT, BK]: q, then Qx (made in place)
    k: object  # [1, 1, BT, BK]: k, then Kx
    g: object  # [1, 1, BT, BK]: the raw log decays (g's dtype)
    va: object  # [1, 1, BT, BV]: unit 0's values
    vb: object  # unit 1's


@struct
class GlaWalk:
    S: object  # [BV, BK] float32: the unit's state transposed, a wgmma accumulator


@struct
class GlaForward:
    q_desc: object
    k_desc: object
    g_desc: object
    v_desc: object
    o_desc: object
    N: object
    H: object
    VB: object
    GROUP: object
    scale: object
    REDO: object  # int32 [B * H]: 1 where a chunk of the head was too wide for the factored form
    H0: object  # the initial states and their strides (s0f, s0v: constants)
    s0b: object
    s0h: object
    s0f: object
    s0v: object
    HT: object  # the final states'
    stb: object
    sth: object
    stf: object
    stv: object
    p_smem: object  # [2, BT, BT]: the pair's P^T by the step's parity (the B operand of V^T P^T)
    built: object  # [STAGES, 1] mbarriers (count 2): both consumers' halves of Qx and Kx are in the stage
    pready: object  # [2, 1] mbarriers (count 2): both halves of the step's P^T are in p_smem
    span_limit: gl.constexpr
    BT: gl.constexpr
    BK: gl.constexpr
    BV: gl.constexpr
    STAGES: gl.constexpr
    HAS_H0: gl.constexpr
    STORE_HT: gl.constexpr
    SLH: gl.constexpr  # [BT, BT / 2]: a consumer's half of P^T
    SL: gl.constexpr  # [BT, BT] scores and [BV, BT] outputs (BT == BV): one wgmma layout
    STL: gl.constexpr  # [BV, BK] the state S^T
    SPL: gl.constexpr  # S^T as the register operand of Sx^T Qx^T
    PL: gl.constexpr  # V^T [BV, BT] as the register operand of V^T P^T and of the update
    GLY: gl.constexpr  # [BT / 2, BK] a consumer's half of the chunk's rows: a channel's tokens in one thread

    @gluon.jit
    def load(self, stage, bar, tile, step):
        """The chunk's q, k and g (one head: the tile's units are its value blocks u0, u0 + 1) and both units' v."""
        h, col = pair_unit(tile, 0, self.VB, self.BV)
        at = [tile.b, h, step * self.BT, 0]
        hk = [tile.b, h // self.GROUP, step * self.BT, 0]
        tma.async_copy_global_to_shared(self.q_desc, hk, bar, stage.q)
        tma.async_copy_global_to_shared(self.k_desc, hk, bar, stage.k)
        tma.async_copy_global_to_shared(self.g_desc, at, bar, stage.g)
        tma.async_copy_global_to_shared(self.v_desc, [tile.b, h, step * self.BT, col], bar, stage.va)
        tma.async_copy_global_to_shared(self.v_desc, [tile.b, h, step * self.BT, col + self.BV], bar, stage.vb)

    @gluon.jit
    def setup(self, tile_id):
        return pair_setup(tile_id, self.H, self.VB, self.N, self.BT)

    @gluon.jit
    def start(self, ctx, tile, prev):
        S = gl.zeros([self.BV, self.BK], gl.float32, self.STL)
        if self.HAS_H0:
            h, col = pair_unit(tile, ctx.index, self.VB, self.BV)
            S = gl.load(self.state_ptrs(self.H0, tile.b, h, col, self.s0b, self.s0h, self.s0f, self.s0v))
        return GlaWalk(S)

    @gluon.jit
    def state_ptrs(self, base, b, h, col, sb, sh, sf, sv):
        """S^T's elements: a row a value column, a column a feature."""
        vals = col + gl.arange(0, self.BV, layout=gl.SliceLayout(1, self.STL))
        feats = gl.arange(0, self.BK, layout=gl.SliceLayout(0, self.STL))
        return (base + b.to(gl.int64) * sb + h.to(gl.int64) * sh + gl.expand_dims(vals.to(gl.int64) * sv, 1)
                + gl.expand_dims(feats.to(gl.int64) * sf, 0))

    @gluon.jit
    def wait(self, ctx, walk):  # (compute waits on every wgmma it issues)
        return walk

    @gluon.jit
    def compute(self, ctx, walk, stage, tile, step):
        c: gl.constexpr = ctx.index
        HALF: gl.constexpr = self.BT // 2
        h, col = pair_unit(tile, c, self.VB, self.BV)
        dtype: gl.constexpr = self.q_desc.dtype
        t0 = step * self.BT
        q_s = stage.q.reshape([self.BT, self.BK])
        k_s = stage.k.reshape([self.BT, self.BK])
        g_s = stage.g.reshape([self.BT, self.BK])
        v_s = ctx.own(stage.va, stage.vb).reshape([self.BT, self.BV])

        # G on this consumer's half of the rows, G_last, m = G_last / 2 (log2 units; g floored, NaN kept)
        g_lo = g_s.slice(0, HALF, dim=0).load(self.GLY).to(gl.float32)
        g_lo = gl.where(g_lo < LOG_DECAY_FLOOR, LOG_DECAY_FLOOR, g_lo) * LOG2E_K
        g_hi = g_s.slice(HALF, HALF, dim=0).load(self.GLY).to(gl.float32)
        g_hi = gl.where(g_hi < LOG_DECAY_FLOOR, LOG_DECAY_FLOOR, g_hi) * LOG2E_K
        sum_lo = gl.sum(g_lo, axis=0)
        m = 0.5 * (sum_lo + gl.sum(g_hi, axis=0))
        if c == 0:
            G = gl.associative_scan(g_lo, 0, _add)
        else:
            G = gl.associative_scan(g_hi, 0, _add) + gl.expand_dims(sum_lo, 0)
        # a factor of this half too wide for the operands (NaN too): the head's o and states are the tl kernel's
        D = G - gl.expand_dims(m, 0)
        wide = gl.sum(gl.sum(gl.where(gl.abs(D) <= 0.5 * self.span_limit, 0, 1), axis=0), axis=0)
        flag_layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        one = gl.arange(0, 1, layout=flag_layout)
        gl.store(self.REDO + (tile.b * self.H + h).to(gl.int64) + one, gl.full([1], 1, gl.int32, flag_layout),
                 mask=(one * 0 + wide) > 0)

        # this consumer's half of Qx and Kx, in place of the stage's q and k (each thread writes what it read)
        q_h = q_s.slice(c * HALF, HALF, dim=0)
        k_h = k_s.slice(c * HALF, HALF, dim=0)
        qx = (q_h.load(self.GLY).to(gl.float32) * gl.exp2(D)).to(dtype)
        kx = (k_h.load(self.GLY).to(gl.float32) * gl.exp2(-D)).to(dtype)
        q_h.store(qx)
        k_h.store(kx)
        fence_async_shared()
        gl.thread_barrier()
        s = ctx.ring_step % self.STAGES
        mbarrier.arrive(self.built.index(s))

        # Sx^T = S^T diag(2^m): the register operand and the update's accumulator
        em = gl.convert_layout(gl.exp2(m), gl.SliceLayout(0, self.STL))
        Sx = walk.S * gl.expand_dims(em, 0)
        S_op = gl.convert_layout(Sx.to(dtype), self.SPL)
        vT = gl.convert_layout(v_s.permute((1, 0)).load(self.SL).to(dtype), self.PL)
        mbarrier.wait(self.built.index(s), (ctx.ring_step // self.STAGES) & 1)

        qT = q_s.permute((1, 0))
        o_tok = warpgroup_mma(S_op, qT, gl.zeros([self.BV, self.BT], gl.float32, self.SL), use_acc=False,
                              is_async=True)
        # this consumer's queries: its half of P^T's columns (the pair's P^T made once, not by both in full)
        p_tok = warpgroup_mma(k_s, q_s.slice(c * HALF, HALF, dim=0).permute((1, 0)),
                              gl.zeros([self.BT, HALF], gl.float32, self.SLH), use_acc=False, is_async=True)
        o, pT = warpgroup_mma_wait(0, deps=(o_tok, p_tok))
        offs_j = gl.arange(0, self.BT, layout=gl.SliceLayout(1, self.SLH))
        offs_i = c * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(0, self.SLH))
        causal = gl.expand_dims(offs_j, 1) <= gl.expand_dims(offs_i, 0)
        # by the step's parity: the other consumer may still read the previous step's P^T; the one before that it
        # has read, since it arrived on this step's built barrier after that step's wgmmas
        p_smem = self.p_smem.index(ctx.ring_step % 2)
        p_smem.slice(c * HALF, HALF, dim=1).store(gl.where(causal, pT * self.scale, 0.0).to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(self.pready.index(ctx.ring_step % 2))
        mbarrier.wait(self.pready.index(ctx.ring_step % 2), (ctx.ring_step // 2) & 1)
        o = o * self.scale
        o_tok = warpgroup_mma(vT, p_smem, o, is_async=True)
        S_tok = warpgroup_mma(vT, k_s, Sx, is_async=True)
        o = warpgroup_mma_wait(1, deps=(o_tok,))
        # o^T to the output's block through shared memory (a transposed view), one TMA store (rows past N clipped)
        tma.store_wait(0)
        ctx.out.reshape([self.BT, self.BV]).permute((1, 0)).store(o.to(self.o_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(self.o_desc, [tile.b, h, t0, col], ctx.out)
        S = warpgroup_mma_wait(0, deps=(S_tok,))
        return GlaWalk(S * gl.expand_dims(em, 0))

    @gluon.jit
    def finish(self, ctx, walk, tile):
        if self.STORE_HT:
            h, col = pair_unit(tile, ctx.index, self.VB, self.BV)
            gl.store(self.state_ptrs(self.HT, tile.b, h, col, self.stb, self.sth, self.stf, self.stv), walk.S)


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def gla_fwd_gluon_kernel(q_desc, k_desc, g_desc, v_desc, o_desc, H0, HT, REDO, s0b, s0h, s0f: gl.constexpr,
                         s0v: gl.constexpr, stb, sth, stf: gl.constexpr, stv: gl.constexpr, N, H, VB, GROUP, scale,
                         num_tiles, span_limit: gl.constexpr, STAGES: gl.constexpr, HAS_H0: gl.constexpr,
                         STORE_HT: gl.constexpr):
    """o (and the final states) of every unit of (batch, head, 64 value columns) under a per-channel decay; a
    persistent grid, two consumer warpgroups (num_warps = 4) and a producer warp. The states' feature and value
    strides are constants (S^T's offsets then immediates: read at run time they are loop-invariant, hoisted out of
    the tile loop and spilled, 1.3 KB a thread at Dk 128, as gluon_forward's were: its decision 170)."""
    BT: gl.constexpr = q_desc.block_type.shape[2]
    BK: gl.constexpr = q_desc.block_type.shape[3]
    BV: gl.constexpr = v_desc.block_type.shape[3]
    gl.static_assert(BT == BV, "the scores' and the outputs' layouts are one: BT == BV")
    gl.static_assert(BT == 64, "a consumer's half of the chunk is 32 rows")
    NW: gl.constexpr = gl.num_warps()
    SL: gl.constexpr = wgmma_layout(BT, BV, NW)
    if BK == 128:  # a channel's 32 tokens in one thread (the scan in registers)
        GLY: gl.constexpr = gl.BlockedLayout([BT // 2, 1], [1, 32], [1, NW], [0, 1])
    else:
        GLY: gl.constexpr = gl.BlockedLayout([BT // 4, 1], [2, 16], [1, NW], [0, 1])
    # one P^T a step's parity, each consumer writing its half of the columns (64-byte swizzle atoms)
    operand_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
    p_smem = gl.allocate_shared_memory(q_desc.dtype, [2, BT, BT], operand_layout)
    built = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    pready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(built.index(s), count=2)
    for s in gl.static_range(2):
        mbarrier.init(pready.index(s), count=2)
    op = GlaForward(q_desc, k_desc, g_desc, v_desc, o_desc, N, H, VB, GROUP, scale, REDO, H0, s0b, s0h, s0f, s0v, HT,
                    stb, sth, stf, stv, p_smem, built, pready, span_limit, BT, BK, BV, STAGES, HAS_H0, STORE_HT,
                    wgmma_layout(BT, BT // 2, NW), SL,
                    wgmma_layout(BV, BK, NW), wgmma_lhs_layout(BV, BK, NW), wgmma_lhs_layout(BV, BT, NW), GLY)
    stages = GlaChunk(ring(q_desc, STAGES), ring(k_desc, STAGES), ring(g_desc, STAGES), ring(v_desc, STAGES),
                      ring(v_desc, STAGES))
    num_tiles = gl.program_id(0) * 0 + num_tiles  # (a tensor where the launch specialized it to 1)
    run(op, Layout(o_desc, STAGES, CONSUMERS=2, CONSUMER_REGS=240, PRODUCER_REGS=24, LATE_RELEASE=0), stages,
        num_tiles)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(built.index(s))
    for s in gl.static_range(2):
        mbarrier.invalidate(pready.index(s))


# --------------------------------------------------------------------------------------------
# host side


def fits(q, k, v, g, feature: int, beta=None, z=None, d_skip=None) -> str | None:
    """None where this kernel takes these inputs, else why not (the tl kernel runs them)."""
    if feature != 0:
        return "a feature map"
    if g is None or g.dim() != 4:
        return "not a per-channel decay"
    if beta is not None or z is not None or d_skip is not None:
        return "beta, D or z (Mamba-2's terms)"
    if q.dtype not in SPAN_LIMIT or k.dtype != q.dtype or v.dtype != q.dtype:
        return "not bf16/fp16"
    if g.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return "g not float32/bf16/fp16"
    Dk, Dv = q.shape[-1], v.shape[-1]
    if Dk not in (64, 128) or Dv % (2 * BV_GLA) or tuple(g.shape) != tuple(v.shape[:3]) + (Dk,):
        return f"Dk {Dk} (takes 64, 128), Dv {Dv} (a multiple of {2 * BV_GLA}) or g's shape {tuple(g.shape)}"
    if q.device.type != "cuda" or v.numel() == 0:
        return "not a CUDA tensor, or empty"
    for t in (q, k, v, g):
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any((s * t.element_size()) % 16 for s in t.stride()[:-1]):
            return "strides or alignment TMA does not take"
    return None


def launch_args(q, k, v, g, h0, o, ht, redo, scale: float, stages: int = 2, *, operand=None):
    """(grid, arguments by name, num_warps) of gla_fwd_gluon_kernel; o a contiguous (B, N, H, Dv) output, redo a
    zeroed int32 (B * H)."""
    from tilecore.tiles.launch import gluon_descriptor
    from tilecore.tiles.schedule import persistent_programs

    gluon_descriptor = operand or gluon_descriptor
    B, N, H, Dv = v.shape
    Dk = q.shape[-1]
    BT, BV = BT_GLA, BV_GLA
    VB = Dv // BV
    descs = [gluon_descriptor(t, [1, 1, BT, blk], *_head_major(t))
             for t, blk in ((q, Dk), (k, Dk), (g, Dk), (v, BV), (o, BV))]
    dummy = torch.empty(1, dtype=torch.float32, device=v.device)
    st = lambda t: tuple(t.stride()) if t is not None else (0,) * 4  # noqa: E731
    s0, sht = st(h0), st(ht)
    num_tiles = B * H * VB // 2
    args = dict(q_desc=descs[0], k_desc=descs[1], g_desc=descs[2], v_desc=descs[3], o_desc=descs[4],
                H0=h0 if h0 is not None else dummy, HT=ht if ht is not None else dummy, REDO=redo,
                s0b=s0[0], s0h=s0[1], s0f=s0[2], s0v=s0[3], stb=sht[0], sth=sht[1], stf=sht[2], stv=sht[3],
                N=N, H=H, VB=VB, GROUP=H // q.shape[2], scale=scale, num_tiles=num_tiles,
                span_limit=SPAN_LIMIT[q.dtype], STAGES=stages, HAS_H0=h0 is not None, STORE_HT=ht is not None)
    return (persistent_programs(num_tiles, v.device),), args, 4


def forward(q, k, v, g, h0, scale: float, final_state: bool, stages: int = 2, *, redo_tl=None):
    """(o, final state or None, redo flags) by the Gluon kernel (``fits`` must have said None). ``redo_tl(o, ht,
    redo)``: the tl kernel over the flagged heads (launch.forward passes it; None: the flags are returned unread)."""
    B, N, H, Dv = v.shape
    o = torch.empty(B, N, H, Dv, dtype=v.dtype, device=v.device)
    ht = empty_state(B, H, q.shape[-1], Dv, v.device, False) if final_state else None
    redo = torch.zeros(B * H, dtype=torch.int32, device=v.device)
    grid, args, warps = launch_args(q, k, v, g, h0, o, ht, redo, scale, stages)
    gla_fwd_gluon_kernel[grid](**args, num_warps=warps)
    if redo_tl is not None:
        redo_tl(o, ht, redo)
    return o, ht, redo


def compile_report(Dk: int = 128, dtype=torch.bfloat16, states: bool = True, stages: int = 2,
                   compiled_out: list | None = None) -> dict:
    """Compile the kernel for sm_90a as ``forward`` launches it (B2 H16 N4096, Dv 128, float32 g) and return its
    resources and Hopper instructions. TRITON_INTERPRET must be unset."""
    from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources

    B, N, H, Dv = 2, 4096, 16, 128
    q = torch.empty(B, N, H, Dk, dtype=dtype)
    v = torch.empty(B, N, H, Dv, dtype=dtype)
    g = torch.empty(B, N, H, Dk, dtype=torch.float32)
    h0, ht = ((empty_state(B, H, Dk, Dv, "cpu", False), empty_state(B, H, Dk, Dv, "cpu", False)) if states
              else (None, None))
    redo = torch.zeros(B * H, dtype=torch.int32)
    grid, args, warps = launch_args(q, q, v, g, h0, torch.empty_like(v), ht, redo, 1.0, stages)
    compiled = compile_kernel(gla_fwd_gluon_kernel, args, num_warps=warps)
    if compiled_out is not None:
        compiled_out.append(compiled)
    r = resources(compiled)
    return dict(spill_bytes=r.spill_stores, registers=r.registers, shared=r.shared, threads=r.threads,
                wgmma_serialized=r.wgmma_serialized, **has_hopper_instructions(compiled.asm["ptx"]))
