"""Attention forward with rotary embeddings turned inside the Hopper kernel (issue 37).

``forward(q, k, v, cos, sin, ...)`` is attention(rotary(q), rotary(k), v) without a pass of its own
over Q or K. The attention forward of gluon_kernels.py runs on the tiles template with a transform
partition (``pipeline.Transform``, a warpgroup of its own): each K block, once its TMA has arrived in
a stage, is turned there in place by its keys' angles,

    a' = a cos - b sin,    b' = b cos + a sin       (pairs (i, i + R), fp32, rounded once)

(ld.shared, cos and sin rows by global loads: L2-resident, st.shared, fenced for wgmma), and the
consumers take the stage from it. Each consumer turns its Q block the same way once a tile, in its
own buffer, before the tile's first S. Every thread holds both elements of its pairs, so turning in
place is safe. The consumers give the transform its registers (CONSUMER_REGS 216 here, 232 without;
Q stays in shared memory).

Conventions (as ``tilecore.apply_rotary``): q (B, H, N, D), k and v (B, Hkv, Nk, D); cos, sin
(max_seqlen, rotary_dim / 2), any float dtype; key j is at position j, query i at i + Nk - N (so
N <= Nk, max_seqlen >= Nk); the pairs are (i, i + R) (half-split, NeoX / Llama) or (2i, 2i + 1)
(interleaved, GPT-J), R = rotary_dim / 2, features past 2R pass through. Taken: D 64 and 128,
rotary_dim any multiple of 32 up to D; bf16 and fp16; grouped heads; causal, windows and softcaps as
the shipped forward. Not taken (NotImplementedError): MLA's 192 / 128 and other head dims; per-token
positions (position_ids); three consumer warpgroups (D64 runs two).
"""

import torch
from triton.experimental import gluon

from tilecore import dispatch
from tilecore.ops.attention import configs
from tilecore.ops.attention.gluon_kernels import Attention, KV
from tilecore.tiles.gluon import Layout, TileOperand, ring, run, struct, wgmma_layout, wgmma_lhs_layout
from tilecore.tiles.gluon.compat import fence_async_shared, gl
from tilecore.tiles.gluon.pipeline import Transform
from tilecore.tiles.launch import CachedLaunch



@gluon.jit
def load_angles(cos_ptr, sin_ptr, cos_stride, sin_stride, n_max, first_pos, ROWS: gl.constexpr, R: gl.constexpr,
                layout: gl.constexpr):
    """cos and sin of rows first_pos .. first_pos + ROWS - 1, [ROWS, R] in ``layout``; rows outside [0, n_max)
    read nothing and are 0 (so their pairs turn to 0: rows TMA filled with zeros)."""
    pos = first_pos + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.expand_dims(gl.arange(0, R, layout=gl.SliceLayout(0, layout)), 0)
    ok = gl.expand_dims((pos >= 0) & (pos < n_max), 1)
    cos = gl.load(cos_ptr + gl.expand_dims(pos * cos_stride, 1) + cols, mask=ok, other=0.0)
    sin = gl.load(sin_ptr + gl.expand_dims(pos * sin_stride, 1) + cols, mask=ok, other=0.0)
    return cos, sin


@gluon.jit
def turn_rows(buf, first_pos, cos_ptr, sin_ptr, cos_stride, sin_stride, n_max, R: gl.constexpr,
              ROWS: gl.constexpr, INTERLEAVED: gl.constexpr = False, PROBE: gl.constexpr = 0,
              AHEAD: gl.constexpr = 1):
    """Turn the rows of ``buf`` ([rows, D] in shared memory, row r at position first_pos + r) in place:
    the pairs (i, i + R) (INTERLEAVED: (2i, 2i + 1)), i < R, by the angles of cos and sin's row of that
    position (load_angles). ROWS rows at a time, 16-byte vectors (8 features a thread: both halves'
    (i, i + R), or 4 whole pairs), the angles of the AHEAD chunks after this one (1-3) in flight under its
    turn. PROBE (timing
    only, wrong results): 1 turns nothing, 2 turns by constant angles (no cos / sin loads)."""
    if PROBE == 1:
        return
    BLOCK_ROWS: gl.constexpr = buf.shape[0]
    WIDTH: gl.constexpr = 2 * R if INTERLEAVED else R  # the features a thread row holds, 8 a thread
    COL_THREADS: gl.constexpr = WIDTH // 8 if WIDTH // 8 <= 32 else 32
    ROW_THREADS: gl.constexpr = 32 // COL_THREADS
    gl.static_assert(ROWS % (ROW_THREADS * gl.num_warps()) == 0 and BLOCK_ROWS % ROWS == 0,
                     "ROWS: a multiple of the rows the partition's threads cover, dividing the block's")
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [ROW_THREADS, COL_THREADS], [gl.num_warps(), 1], [1, 0])
    # interleaved: a thread's 8 features as 4 pairs, [rows, pairs, 2], split into a and b in registers
    pairs: gl.constexpr = gl.BlockedLayout([1, 4, 2], [ROW_THREADS, COL_THREADS, 1], [gl.num_warps(), 1, 1], [2, 1, 0])
    angle_layout: gl.constexpr = gl.SliceLayout(2, pairs) if INTERLEAVED else layout
    CHUNKS: gl.constexpr = BLOCK_ROWS // ROWS
    # the angles of chunks c .. c + AHEAD - 1 in flight (c0: this chunk's, c1, c2: the next ones')
    if PROBE == 2:
        cos = gl.full([ROWS, R], 0.8, gl.float32, angle_layout)
        sin = gl.full([ROWS, R], 0.6, gl.float32, angle_layout)
    else:
        cos, sin = load_angles(cos_ptr, sin_ptr, cos_stride, sin_stride, n_max, first_pos, ROWS, R, angle_layout)
        if AHEAD >= 2 and CHUNKS > 1:
            cos1, sin1 = load_angles(cos_ptr, sin_ptr, cos_stride, sin_stride, n_max, first_pos + ROWS, ROWS, R,
                                     angle_layout)
        if AHEAD >= 3 and CHUNKS > 2:
            cos2, sin2 = load_angles(cos_ptr, sin_ptr, cos_stride, sin_stride, n_max, first_pos + 2 * ROWS, ROWS, R,
                                     angle_layout)
    for c in gl.static_range(CHUNKS):
        if PROBE == 2:
            next_cos = cos
            next_sin = sin
        elif c + AHEAD < CHUNKS:  # chunk c + AHEAD's angles, in flight under this turn
            next_cos, next_sin = load_angles(cos_ptr, sin_ptr, cos_stride, sin_stride, n_max,
                                             first_pos + (c + AHEAD) * ROWS, ROWS, R, angle_layout)
        chunk = buf.slice(c * ROWS, ROWS, dim=0)
        cs = cos.to(gl.float32)
        sn = sin.to(gl.float32)
        if INTERLEAVED:
            rows = chunk.slice(0, 2 * R, dim=1)
            x = gl.convert_layout(rows.load(layout).to(gl.float32).reshape([ROWS, R, 2]), pairs)
            a, b = gl.split(x)
            turned = gl.join(a * cs - b * sn, b * cs + a * sn).reshape([ROWS, 2 * R])
            rows.store(gl.convert_layout(turned, layout).to(buf.dtype))
        else:
            lo = chunk.slice(0, R, dim=1)
            hi = chunk.slice(R, R, dim=1)
            a = lo.load(layout).to(gl.float32)
            b = hi.load(layout).to(gl.float32)
            lo.store((a * cs - b * sn).to(buf.dtype))
            hi.store((b * cs + a * sn).to(buf.dtype))
        if PROBE == 2:
            pass
        elif AHEAD == 1:
            if c + 1 < CHUNKS:
                cos = next_cos
                sin = next_sin
        elif AHEAD == 2:
            if c + 1 < CHUNKS:
                cos = cos1
                sin = sin1
            if c + 2 < CHUNKS:
                cos1 = next_cos
                sin1 = next_sin
        else:
            if c + 1 < CHUNKS:
                cos = cos1
                sin = sin1
            if c + 2 < CHUNKS:
                cos1 = cos2
                sin1 = sin2
            if c + 3 < CHUNKS:
                cos2 = next_cos
                sin2 = next_sin


@struct
class RotaryAttention:
    """The rotary forward's op: attention's (``attn``, whose callbacks it passes on) with Q and K
    turned: ``start`` turns a consumer's Q rows, ``turn`` (the transform partition) a stage's K block."""
    attn: object
    cos: object
    sin: object
    cos_stride: object
    sin_stride: object
    n_max: object  # cos's and sin's rows
    R: gl.constexpr  # pairs a row: rotary_dim / 2
    TURN_ROWS: gl.constexpr  # rows a thread group turns at a time
    AHEAD: gl.constexpr  # chunks of angles in flight ahead of the K turn (turn_rows)
    Q_ROWS: gl.constexpr  # ... of Q (a consumer's block at once where its registers allow: one round trip for its angles)
    Q_BY_TRANSFORM: gl.constexpr  # Q turned by the transform partition (turn_tile), else by each consumer (start)
    INTERLEAVED: gl.constexpr  # pairs (2i, 2i + 1) (GPT-J), else (i, i + R)
    PROBE: gl.constexpr  # timing probes (turn_rows): 0 shipped

    @gluon.jit
    def setup(self, tile_id):
        return self.attn.setup(tile_id)

    @gluon.jit
    def load(self, stage, bar, tile, step, prev=None):
        self.attn.load(stage, bar, tile, step, prev)

    @gluon.jit
    def load_tile(self, q_smem, bar, tile, consumer):
        self.attn.load_tile(q_smem, bar, tile, consumer)

    @gluon.jit
    def initial(self, ctx):
        return self.attn.initial(ctx)

    @gluon.jit
    def turn_q(self, buf, tile, consumer):
        """Consumer ``consumer``'s Q rows turned in its buffer (query i at position i + Nk - N)."""
        a = self.attn
        first = tile.first + consumer * a.BM
        turn_rows(buf.reshape([a.BM, a.D]), first + (a.Nk - a.N), self.cos, self.sin, self.cos_stride,
                  self.sin_stride, self.n_max, self.R, self.Q_ROWS, self.INTERLEAVED, self.PROBE)

    @gluon.jit
    def turn_tile(self, ctx, buf, tile, consumer):
        self.turn_q(buf, tile, consumer)

    @gluon.jit
    def start(self, ctx, tile, prev):
        """Attention's start, this consumer's Q turned first unless the transform turned it (then made
        visible to wgmma: every thread fences its own writes, then the warpgroup meets)."""
        if not self.Q_BY_TRANSFORM:
            self.turn_q(ctx.operand, tile, ctx.index)
            fence_async_shared()
            gl.thread_barrier()
        return self.attn.start(ctx, tile, prev)

    @gluon.jit
    def turn(self, ctx, stage, tile, step):
        """The stage's K block turned (key j at position j); a stage whose K goes unused (a tile's last
        P V step, the carried tail) is passed on as it is."""
        a = self.attn
        if step < tile.n_blocks:
            k_block = step
            if a.WINDOW:
                k_block += tile.first_block
            turn_rows(stage.k.reshape([a.BN, a.D]), k_block * a.BN, self.cos, self.sin, self.cos_stride,
                      self.sin_stride, self.n_max, self.R, self.TURN_ROWS, self.INTERLEAVED, self.PROBE, self.AHEAD)

    @gluon.jit
    def compute(self, ctx, st, stage, tile, step):
        return self.attn.compute(ctx, st, stage, tile, step)

    @gluon.jit
    def wait(self, ctx, st):
        return self.attn.wait(ctx, st)

    @gluon.jit
    def finish(self, ctx, st, tile):
        self.attn.finish(ctx, st, tile)


@gluon.jit
def attention_rotary_fwd_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, cos_ptr, sin_ptr, cos_stride, sin_stride,
                                n_max, H, N, Nk, GROUP, scale_log2e, num_bh, head_group, schedule, left, right,
                                tanh_scale, CAUSAL: gl.constexpr, STAGES: gl.constexpr, R: gl.constexpr,
                                Q_BUFFERS: gl.constexpr = 1, CARRY: gl.constexpr = False,
                                Q_REGS: gl.constexpr = False, WINDOW: gl.constexpr = False,
                                SOFTCAP: gl.constexpr = False, TURN_ROWS: gl.constexpr = 16,
                                TURN_WARPS: gl.constexpr = 4, CONSUMER_REGS: gl.constexpr = 216,
                                TURN_REGS: gl.constexpr = 56, Q_BY_TRANSFORM: gl.constexpr = False,
                                INTERLEAVED: gl.constexpr = False, PROBE: gl.constexpr = 0,
                                K_IN_KERNEL: gl.constexpr = True, CONSUMERS: gl.constexpr = 2,
                                AHEAD: gl.constexpr = 1):
    """attention_fwd_kernel's O and lse (two consumers) of rotary(Q), rotary(K), V: Q and K as loaded,
    turned in the kernel (the module docstring); K_IN_KERNEL False: K comes turned (a pass before), only
    Q is turned here (by each consumer), no transform partition (the shipped forward's registers)."""
    gl.static_assert(CONSUMERS == 2 or (CONSUMERS == 3 and not K_IN_KERNEL), "two consumers (three with K turned before)")
    gl.static_assert(not (CARRY and Q_REGS), "Q_REGS takes a pipeline that restarts at each tile")
    gl.static_assert(not (WINDOW and (CARRY or CAUSAL)), "a window restarts the pipeline at each tile, causal folded in")
    BM: gl.constexpr = o_desc.block_type.shape[2]
    BN: gl.constexpr = k_desc.block_type.shape[2]
    D: gl.constexpr = k_desc.block_type.shape[3]
    DV: gl.constexpr = v_desc.block_type.shape[3]
    gl.static_assert(q_desc.block_type.shape[2] == BM and DV == D, "a consumer's Q rows; v's head dim q's")
    gl.static_assert(2 * R <= D and R % 16 == 0, "rotary_dim: a multiple of 32 up to D")
    attn = Attention(q_desc, k_desc, v_desc, o_desc, lse_ptr, H, N, Nk, GROUP, scale_log2e, num_bh, head_group, left,
                     right, tanh_scale, CAUSAL, BM, BN, D, DV, CONSUMERS, CARRY, Q_REGS,
                     wgmma_layout(BM, BN, gl.num_warps()), wgmma_layout(BM, DV, gl.num_warps()),
                     wgmma_lhs_layout(BM, DV, gl.num_warps()), WINDOW, SOFTCAP, 1)
    # Q turned whole by a consumer at the shipped registers (no tile carried over), else TURN_ROWS at a time
    Q_ROWS: gl.constexpr = BM if not (K_IN_KERNEL or CARRY) else TURN_ROWS
    op = RotaryAttention(attn, cos_ptr, sin_ptr, cos_stride, sin_stride, n_max, R, TURN_ROWS, AHEAD, Q_ROWS,
                         Q_BY_TRANSFORM, INTERLEAVED, PROBE)
    gl.static_assert(K_IN_KERNEL or not Q_BY_TRANSFORM, "Q by the transform: K turned in the kernel")
    if K_IN_KERNEL:
        # registers a thread, in warpgroups of 128 threads: 2 consumers + the transform + the producer = 512
        PRODUCER_REGS: gl.constexpr = 512 - 2 * CONSUMER_REGS - TURN_REGS
        gl.static_assert(PRODUCER_REGS >= 24, "the producer keeps 24 registers")
        layout = Layout(o_desc, STAGES, CONSUMERS=CONSUMERS, CONSUMER_REGS=CONSUMER_REGS, PRODUCER_REGS=PRODUCER_REGS,
                        LATE_RELEASE=0, CARRY=CARRY, tile_operand=TileOperand(q_desc, BUFFERS=Q_BUFFERS),
                        schedule=schedule, transform=Transform(TURN_WARPS, TURN_REGS, TILE_OPERAND=Q_BY_TRANSFORM))
    else:  # the shipped forward's layout
        layout = Layout(o_desc, STAGES, CONSUMERS=CONSUMERS, CONSUMER_REGS=160 if CONSUMERS == 3 else 232,
                        PRODUCER_REGS=24 if CONSUMERS == 3 else 40, LATE_RELEASE=0, CARRY=CARRY,
                        tile_operand=TileOperand(q_desc, BUFFERS=Q_BUFFERS), schedule=schedule)
    run(op, layout, KV(ring(k_desc, STAGES), ring(v_desc, STAGES)), gl.cdiv(N, BM * CONSUMERS) * num_bh)


# --------------------------------------------------------------------------------------------
# the launch

ROTARY_FWD = CachedLaunch(attention_rotary_fwd_kernel)
# registers a thread: two consumers, the transform (the producer gets the rest of 512, at least 24)
CONSUMER_REGS = 216
TURN_REGS = 56
Q_BY_TRANSFORM = False  # Q turned by the transform partition as it arrives (else by each consumer, a tile's start)
TABLES_DTYPE = None  # cos and sin as given (None), or cast to q's dtype ("input") before the launch
PROBE = 0  # timing probes, wrong results (turn_rows): 1 no turn (the partition's hand-on only), 2 no cos / sin loads
K_IN_KERNEL = True  # K turned by the transform partition; False: by apply_rotary's pass before the kernel (Q in it)
AHEAD = 1  # the transform's chunks of cos / sin rows in flight ahead of the one it turns (1-3)


def rotary_config(d: int, n: int, nk: int, causal: bool, k_in_kernel: bool = True) -> dict:
    """The shipped forward's configuration (configs.gluon_forward_config) with two consumers, Q in shared
    memory and at D128 no carried pipeline: the transform takes the registers of a third consumer, of
    Q's and of the carry's (at 216 a thread Q in registers spills ~860 bytes, D128's carry ~600)."""
    cfg = configs.gluon_forward_config(d, n, nk, causal)
    if not k_in_kernel:  # K turned by a pass: the shipped forward's registers, and its configuration
        return cfg
    if cfg.get("consumers", 2) != 2:
        cfg.update(consumers=2, q_buffers=2)
    cfg["q_regs"] = False
    if d == 128:  # the carried pipeline at 216 registers spills ~600 bytes (232 without the transform: none)
        cfg["carry"] = False
    return cfg


def rows_at_a_time(r: int, interleaved: bool = False) -> int:
    """Rows 4 warps turn at a time: as many as they cover with 8 features (16 bytes) a thread, of each
    half of the pairs (1024 / R rows) or of the 2R interleaved features (512 / R)."""
    return (512 if interleaved else 1024) // r


def check(q, k, v, cos, sin, interleaved: bool) -> None:
    """What forward takes, or a clear error."""
    B, H, N, D = q.shape
    Nk = k.shape[2]
    if D not in (64, 128) or k.shape[3] != D or v.shape[3] != D:
        raise NotImplementedError(f"the in-kernel rotary forward takes q, k and v of head dim 64 or 128; got "
                                  f"{D}, {k.shape[3]}, {v.shape[3]}")
    if cos.dim() != 2 or cos.shape != sin.shape:
        raise ValueError(f"cos and sin: (max_seqlen, rotary_dim / 2) each; got {tuple(cos.shape)} and "
                         f"{tuple(sin.shape)}")
    R = cos.shape[1]
    if 2 * R > D or R % 16:
        raise ValueError(f"rotary_dim (2 x cos.shape[1] = {2 * R}): a multiple of 32 up to the head dim {D}")
    if N > Nk:
        raise ValueError(f"rotary in the kernel puts query i at position i + Nk - N: N ({N}) must not exceed Nk ({Nk})")
    if cos.shape[0] < Nk:
        raise ValueError(f"cos and sin have {cos.shape[0]} rows, fewer than the {Nk} positions of the keys")
    if cos.stride(1) != 1 or sin.stride(1) != 1:
        raise ValueError("cos and sin: unit stride along rotary_dim / 2")


def forward(q, k, v, cos, sin, *, causal: bool, scale: float, interleaved: bool = False, window=(-1, -1),
            softcap: float = 0.0, sm_margin: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of attention(rotary(q), rotary(k), v): out (B, H, N, D) contiguous in q's dtype, lse
    (B, H, N) float32, as the shipped forward's launch (launch.outputs) gives them. Hopper with Gluon
    only (the caller routes other devices to apply_rotary and the shipped forward)."""
    from tilecore.ops.attention.kernels_tl import mask_options, score_options
    from tilecore.ops.attention.launch import gluon_softcap, head_operand, run as run_plan
    from tilecore.ops.attention.plan import plan_forward

    check(q, k, v, cos, sin, interleaved)
    if TABLES_DTYPE == "input":
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
    k_in_kernel = K_IN_KERNEL
    if not k_in_kernel:  # K turned by a pass (its (B, Nk, Hkv, D) view, as apply_rotary takes it)
        from tilecore.ops.rotary import apply_rotary

        k = apply_rotary(k.transpose(1, 2), cos, sin, interleaved=interleaved).transpose(1, 2)
    B, H, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    windowed = tuple(window) != (-1, -1)
    cfg = rotary_config(D, N, Nk, causal and not windowed, K_IN_KERNEL)
    plan = plan_forward(q, k, v, causal, scale, path="gluon", config=cfg, window=window, softcap=softcap,
                        sm_margin=sm_margin)
    cfg = plan.config
    out = torch.empty((B, H, N, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    block_m, block_n = cfg["block_m"], cfg["block_n"]
    masks, left, right = mask_options(causal, window, N, Nk)
    _, scale_log2e, tanh_scale = score_options(scale, softcap)
    with dispatch.on_device(q.device):
        run_plan(ROTARY_FWD, plan, plan.grid,
                 (head_operand(q, block_m), head_operand(k, block_n), head_operand(v, block_n),
                  head_operand(out, block_m), lse, cos, sin, cos.stride(0), sin.stride(0), cos.shape[0], H, N, Nk,
                  H // Hkv, scale_log2e, B * H, plan.sizes["head_group"], plan.schedule, left, right, tanh_scale),
                 dict(**masks, SOFTCAP=gluon_softcap(softcap, cfg), STAGES=cfg["stages"], R=cos.shape[1],
                      Q_BUFFERS=cfg.get("q_buffers", 1), CARRY=cfg.get("carry", False),
                      Q_REGS=cfg.get("q_regs", False), TURN_ROWS=rows_at_a_time(cos.shape[1], interleaved),
                      INTERLEAVED=bool(interleaved),
                      CONSUMER_REGS=CONSUMER_REGS, TURN_REGS=TURN_REGS, Q_BY_TRANSFORM=Q_BY_TRANSFORM and k_in_kernel,
                      PROBE=PROBE, K_IN_KERNEL=k_in_kernel, CONSUMERS=cfg.get("consumers", 2), AHEAD=AHEAD,
                      num_warps=4))
    return out, lse
