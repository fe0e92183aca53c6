"""Clock stamps of each tile's phases in FP8 attention's Hopper kernel (issue 34, session 43): where a three-consumer
tile's fixed cost goes. Not a GPU script: gpu_rotated.py's case ``stamps`` launches it; ``python
experiments/attention_fp8/stamps.py`` compiles it for sm_90a on the CPU (registers, spills, the stamps' count in SASS).

The library's kernel as it is (gluon_fp8.attention_fp8_fwd_kernel, the launch's own options), with its op wrapped
by ``Stamped`` through the kernel's WRAP parameter: every template callback goes to the op unchanged, and around
them each partition writes the SM's clock (%clock64, cycles; experiments/common/gpu_clocks) into a row of an int64
[tiles, SLOTS] buffer, the row of the tile's id. Per consumer c (slots CONSUMER + 6 c + ...):

    A  start's entry (the template has waited for this consumer's Q)     B  start's end (the rotation done)
    C  step 0's entry (the template has waited for the stage)            D  the end of this consumer's last own step
    F  finish's entry (every step of the tile walked, the last wait)     E  finish's end (O's TMA store issued)

and the producer: its Q load for each consumer (after the template's wait for that consumer's buffer), the tile's
first and last stage loads. Also the program, consumer 0's %globaltimer at A and E (the SM clock's rate), the
tile's key blocks and each consumer's own. The stamps are volatile asm and 64-bit stores: the stamped kernel is not
the shipped one's time (the case times both and checks their O is the same bits).
"""

import os
import statistics
import sys

from triton.experimental import gluon

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from experiments.common.gpu_clocks import global_ns, sm_cycles  # noqa: E402
from tilecore.tiles.gluon import struct  # noqa: E402
from tilecore.tiles.gluon.compat import gl  # noqa: E402

SLOTS = 40
PROGRAM, GLOBAL_A, GLOBAL_E = 0, 1, 2
CONSUMER = 4  # consumer c's A, B, C, D, F, E at CONSUMER + 6 c + 0..5
A, B, C, D, F, E = range(6)
PRODUCER_Q = 22  # + c: the producer's Q load for consumer c
PRODUCER_FIRST, PRODUCER_LAST = 25, 26  # the tile's first and last stage loads
BLOCKS = 27  # the tile's key blocks
OWN = 28  # + c: consumer c's own key blocks
SLOT_NAMES = {A: "A", B: "B", C: "C", D: "D", F: "F", E: "E"}
# the same as constexprs, for the kernel's code
K_SLOTS, K_PROGRAM, K_GLOBAL_A, K_GLOBAL_E = (gl.constexpr(x) for x in (SLOTS, PROGRAM, GLOBAL_A, GLOBAL_E))
K_CONSUMER, K_A, K_B, K_C, K_D, K_F, K_E = (gl.constexpr(x) for x in (CONSUMER, A, B, C, D, F, E))
K_PRODUCER_Q, K_PRODUCER_FIRST, K_PRODUCER_LAST, K_BLOCKS, K_OWN = (
    gl.constexpr(x) for x in (PRODUCER_Q, PRODUCER_FIRST, PRODUCER_LAST, BLOCKS, OWN))


@gluon.jit
def _one(value, layout: gl.constexpr):
    return gl.full([1], 0, gl.int64, layout) + value


@gluon.jit
def stamp(stamps, tile_id, slot: gl.constexpr, dep=0, GLOBAL: gl.constexpr = False):
    """The SM's clock (or the global timer) into stamps[tile_id, slot]; ``dep`` (an int) orders it after what made
    it."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    d = gl.full([1], 0, gl.int32, layout) + dep
    if GLOBAL:
        t = global_ns(d)
    else:
        t = sm_cycles(d)
    gl.store(stamps + tile_id.to(gl.int64) * K_SLOTS + slot + gl.arange(0, 1, layout), t)


@gluon.jit
def put(stamps, tile_id, slot: gl.constexpr, value):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    gl.store(stamps + tile_id.to(gl.int64) * K_SLOTS + slot + gl.arange(0, 1, layout), _one(value, layout))


@struct
class StampTile:
    """The op's tile, its id (the stamps' row) and its ring steps."""
    rows: object
    id: object
    steps: object


@struct
class Stamped:
    """The op (gluon_fp8.AttentionFp8) with stamps around its callbacks (the module's docstring)."""
    op: object
    stamps: object

    @gluon.jit
    def setup(self, tile_id):
        rows, steps = self.op.setup(tile_id)
        return StampTile(rows, tile_id, steps), steps

    @gluon.jit
    def load(self, stage, bar, tile, step):
        self.op.load(stage, bar, tile.rows, step)
        if step == 0:
            stamp(self.stamps, tile.id, K_PRODUCER_FIRST)
        if step == tile.steps - 1:
            stamp(self.stamps, tile.id, K_PRODUCER_LAST)

    @gluon.jit
    def load_tile(self, q_smem, bar, tile, consumer: gl.constexpr):
        stamp(self.stamps, tile.id, K_PRODUCER_Q + consumer)
        self.op.load_tile(q_smem, bar, tile.rows, consumer)

    @gluon.jit
    def start(self, ctx, tile, prev):
        base: gl.constexpr = K_CONSUMER + 6 * ctx.index
        stamp(self.stamps, tile.id, base + K_A)
        if ctx.index == 0:
            stamp(self.stamps, tile.id, K_GLOBAL_A, GLOBAL=True)
            put(self.stamps, tile.id, K_PROGRAM, gl.program_id(0))
            put(self.stamps, tile.id, K_BLOCKS, tile.rows.n_blocks)
        st = self.op.start(ctx, tile.rows, prev)
        stamp(self.stamps, tile.id, base + K_B, st.rows.n_blocks)
        put(self.stamps, tile.id, K_OWN + ctx.index, st.rows.n_blocks)
        return st

    @gluon.jit
    def compute(self, ctx, st, stage, tile, step):
        base: gl.constexpr = K_CONSUMER + 6 * ctx.index
        if step == 0:
            stamp(self.stamps, tile.id, base + K_C, step)
        st = self.op.compute(ctx, st, stage, tile.rows, step)
        if step == st.rows.n_blocks - 1:
            stamp(self.stamps, tile.id, base + K_D, step)
        return st

    @gluon.jit
    def wait(self, ctx, st):
        return self.op.wait(ctx, st)

    @gluon.jit
    def finish(self, ctx, st, tile):
        base: gl.constexpr = K_CONSUMER + 6 * ctx.index
        stamp(self.stamps, tile.id, base + K_F)
        self.op.finish(ctx, st, tile.rows)
        stamp(self.stamps, tile.id, base + K_E)
        if ctx.index == 0:
            stamp(self.stamps, tile.id, K_GLOBAL_E, GLOBAL=True)


@gluon.jit
def stamped(op, stamps):
    """gluon_fp8.attention_fp8_fwd_kernel's WRAP: the op with stamps into ``stamps`` (int64 [tiles, SLOTS], zeroed)."""
    return Stamped(op, stamps)


def analyse(rows, consumers: int = 3) -> dict:
    """Per-tile phases from the stamps (a list of SLOTS-long int lists, one a tile, every tile stamped), each
    program's tiles in the order it ran them (its first tile left out: no previous tile); medians over tiles in
    SM cycles and us (the clock's rate from consumer 0's global timer against its clock over each program)."""
    by_prog: dict[int, list] = {}
    for r in rows:
        if r[CONSUMER + A] == 0:
            continue  # not stamped
        by_prog.setdefault(int(r[PROGRAM]), []).append(r)
    rates = []
    for prog in by_prog.values():
        prog.sort(key=lambda r: r[CONSUMER + A])
        if len(prog) > 2:
            dc = prog[-1][CONSUMER + A] - prog[0][CONSUMER + A]
            dn = prog[-1][GLOBAL_A] - prog[0][GLOBAL_A]
            if dn > 0:
                rates.append(dc / dn)
    ghz = statistics.median(rates) if rates else 1.755
    ph: dict[str, list] = {}

    def add(name, value):
        ph.setdefault(name, []).append(value)

    causal_like = []
    for prog in by_prog.values():
        for prev, r in zip(prog, prog[1:]):
            cs = [CONSUMER + 6 * c for c in range(consumers)]
            period = r[cs[0] + E] - prev[cs[0] + E]
            add("period", period)
            own = [r[OWN + c] for c in range(consumers)]
            blocks = r[BLOCKS]
            add("blocks", blocks)
            slowest = max(range(consumers), key=lambda c: own[c])
            for c, b in enumerate(cs):
                add(f"c{c} prev E -> A (Q wait)", r[b + A] - prev[b + E])
                add(f"c{c} A -> B (start: rotation)", r[b + B] - r[b + A])
                add(f"c{c} B -> C (stage 0 wait)", r[b + C] - r[b + B])
                add(f"c{c} C -> D (own steps)", r[b + D] - r[b + C])
                add(f"c{c} own steps", own[c])
                if own[c] > 0:
                    add(f"c{c} per own step", (r[b + D] - r[b + C]) / own[c])
                add(f"c{c} D -> F (rest of the ring)", r[b + F] - r[b + D])
                add(f"c{c} F -> E (finish)", r[b + E] - r[b + F])
                add(f"c{c} prev D -> C (between own steps)", r[b + C] - prev[b + D])
            s = cs[slowest]
            steps_time = r[s + D] - r[s + C]
            add("fixed = period - slowest's own steps", period - steps_time)
            add("slowest prev D -> C", r[s + C] - prev[s + D])
            # the producer: its Q loads against the consumers' release of the last tile (D of their last step), its
            # first stage load against the last Q load, and the consumers' step 0 against that load
            for c in range(consumers):
                add(f"producer Q{c} - c{c} prev D", r[PRODUCER_Q + c] - prev[cs[c] + D])
            add(f"producer first stage - Q{consumers - 1}", r[PRODUCER_FIRST] - r[PRODUCER_Q + consumers - 1])
            add("producer first stage - prev last stage", r[PRODUCER_FIRST] - prev[PRODUCER_LAST])
            add("slowest C - producer first stage", r[s + C] - r[PRODUCER_FIRST])
            add("slowest B - producer Q (its)", r[s + B] - r[PRODUCER_Q + slowest])
            add("slowest A - producer Q (its)", r[s + A] - r[PRODUCER_Q + slowest])
            causal_like.append(own[slowest] != own[0])
    out = {"sm_ghz": round(ghz, 4), "tiles": sum(len(p) for p in by_prog.values()), "programs": len(by_prog)}
    # the programs' ends by the global timer (consumer 0's E of each program's last tile) from the first start: the
    # tail the schedule leaves, and the share of a program's time that its tiles' periods beyond their steps take
    if by_prog:
        t0 = min(p[0][GLOBAL_A] for p in by_prog.values())
        ends = sorted((p[-1][GLOBAL_E] - t0) / 1e3 for p in by_prog.values())
        out["program_end_us"] = {"min": round(ends[0], 1), "median": round(statistics.median(ends), 1),
                                 "max": round(ends[-1], 1)}
    for name, xs in ph.items():
        m = statistics.median(xs)
        q1, q3 = (statistics.quantiles(xs, n=4)[0], statistics.quantiles(xs, n=4)[2]) if len(xs) > 3 else (m, m)
        unit = name in ("blocks",) or "own steps" == name.split(" ", 1)[-1]
        out[name] = ({"median": m} if unit else
                     {"cycles": round(m, 1), "us": round(m / ghz / 1e3, 3), "q1_us": round(q1 / ghz / 1e3, 3),
                      "q3_us": round(q3 / ghz / 1e3, 3)})
    return out


def timeline(rows, program: int, count: int = 6, consumers: int = 3, ghz: float = 1.755) -> list:
    """Program ``program``'s first ``count`` tiles: each stamp in us from the program's first A (for reading)."""
    prog = sorted((r for r in rows if int(r[PROGRAM]) == program and r[CONSUMER + A]), key=lambda r: r[CONSUMER + A])
    if not prog:
        return []
    t0 = prog[0][CONSUMER + A]
    out = []
    for r in prog[:count]:
        rec = {"blocks": int(r[BLOCKS]), "own": [int(r[OWN + c]) for c in range(consumers)]}
        for c in range(consumers):
            b = CONSUMER + 6 * c
            rec[f"c{c}"] = {SLOT_NAMES[k]: round((r[b + k] - t0) / (ghz * 1e3), 2) for k in SLOT_NAMES}
        rec["producer"] = {"Q": [round((r[PRODUCER_Q + c] - t0) / (ghz * 1e3), 2) for c in range(consumers)],
                           "first": round((r[PRODUCER_FIRST] - t0) / (ghz * 1e3), 2),
                           "last": round((r[PRODUCER_LAST] - t0) / (ghz * 1e3), 2)}
        out.append(rec)
    return out


def compile_check(causal: bool = True, scheduled: bool = True) -> dict:
    """The stamped convenience-path kernel at D128 compiled for sm_90a (no GPU): registers, spills, the stamps'
    CS2R reads of the clock in its SASS."""
    import torch

    os.environ.pop("TRITON_INTERPRET", None)
    from tilecore.ops.attention_fp8 import gluon_fp8, launch
    from tilecore.tiles.compile import compile_kernel, resources
    from tilecore.tiles.launch import gluon_descriptor

    D = 128
    cfg = launch.rotated_q_config(D, causal)
    f8 = torch.float8_e4m3fn
    q = torch.empty(16, 16, 4096, D, dtype=torch.bfloat16)
    k = torch.empty(16, 16, 4096, D, dtype=f8)
    vt = torch.empty(16, 16, D, 4096, dtype=f8)
    o = torch.empty(16, 16, 4096, D, dtype=torch.bfloat16)
    f32 = torch.empty(8192)
    opts = launch.gluon_options(q, k, cfg, causal, True, True, 32, 128, True, q_rotate=True,
                                q_reg=D in launch.configs.ROTATED["q_reg"])
    bm, bn = cfg["block_m"], cfg["block_n"]
    args = dict(q_desc=gluon_descriptor(q, [1, 1, bm, D]), k_desc=gluon_descriptor(k, [1, 1, bn, D]),
                vt_desc=gluon_descriptor(vt, [1, 1, D, bn]), o_desc=gluon_descriptor(o, [1, 1, bm, D]), lse_ptr=f32,
                q_scales=f32, k_scales=f32, v_scales=f32, H=16, N=4096, Nk=4096, GROUP=1, scale_log2e=0.1,
                q_n_scales=4096, q_rows_per_scale=1, k_n_scales=32, k_rows_per_scale=128, num_bh=256, head_group=16,
                schedule=torch.empty(64, dtype=torch.int32) if causal and scheduled else None, v_n_scales=32,
                signs=f32)
    num_warps = opts.pop("num_warps")
    out = {}
    for name, extra in (("shipped", {}), ("stamped", dict(WRAP=stamped, wrap_arg=torch.empty(8, dtype=torch.int64)))):
        kern = compile_kernel(gluon_fp8.attention_fp8_fwd_kernel, dict(args, **opts, **extra), num_warps=num_warps)
        r = resources(kern)
        out[name] = dict(registers=r.registers, spill_stores=r.spill_stores, spill_loads=r.spill_loads,
                         shared=r.shared, wgmma_serialized=r.wgmma_serialized,
                         clock_reads=kern.asm["ptx"].count("%clock64"), globaltimer=kern.asm["ptx"].count("%globaltimer"))
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(compile_check("--full" not in sys.argv, "--round-robin" not in sys.argv)))
