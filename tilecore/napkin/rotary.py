"""Rotary embeddings on the napkin (issue 37): the standalone pass and the cost of turning Q and K inside
the attention forward.

Standalone (`standalone_time`): `tilecore.apply_rotary` reads x and writes it once, and reads the cos and
sin rows of each token (models.rotary's diagram; the engine's HBM term: x twice plus the tables).

Fused (`fused_overhead`): the Hopper forward with rotary (tilecore/ops/attention_rotary/gluon_forward.py) turns
each K block in its shared-memory stage by a transform warpgroup of its own, between the block's TMA
arrival and the consumers, and each consumer turns its Q rows once a tile before the tile's first S.
A pair (a, b) turned is ld.shared of both, the conversions to fp32 (a, b, cos, sin), a' = a cos - b sin and
b' = b cos + a sin (a multiply and an FMA each), one packed conversion back and st.shared of both:
`TURN_OPS_PER_PAIR` thread instructions, plus the 16-byte vector loads and stores (an eighth a pair each).
Against a key block's step (the consumers' two MMAs, whose time comes from the attention without rotary:
the engine's, or a measured one), the terms are

- **Q**: a consumer's turn of its BM rows, once a tile, before its first MMA: exposed in full (its issue
  on its warpgroup's four schedulers or its shared-memory bytes, whichever is longer, plus one L2 round
  trip for its cos / sin rows);
- **K, shared memory**: the turn's ld/st.shared bytes beside the wgmma operand reads of the step (K for S
  by each consumer, Q where it is not in registers, V for O) at 128 B a clock an SM: the excess over the
  step, if any, is exposed;
- **K, the transform's pace**: the transform's issue or ld/st.shared a block, beyond the step;
- **K, latency**: a stage must be loaded and turned within the (stages - 1) steps it has before the
  consumers need it: the excess of (a DRAM round trip + the turn) over that;
- **L2**: K, V and the block's cos / sin rows read at the SM's even share of the L2 bandwidth: the excess
  over the step.

With ``k_in_kernel=False`` (gluon_forward.forward as shipped: K turned by apply_rotary's
pass before the kernel, Q still in it; the in-kernel K turn was removed, git keeps it at 73266153) the K terms give way to that pass (standalone_time on K's shape).

Measured (notes/napkin/README.md): K turned by the pass as predicted (+5.9 / +11.4% at D128, causal: 1.00 /
0.99 of the time); K turned in the kernel +56 to +64% whatever the angle loads in flight (AHEAD 1, 2, 3),
where these terms say +1 to +3%: a cost the model does not name yet (not the angles' latency, not the
turn's issue or shared-memory bytes by count).
Registers: the consumers give the transform warpgroup registers (200 a thread instead of 232); what that
costs is not modelled (a named cause where the measurement differs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import models
from .engine import derive, group, relabel, stream
from .hardware import get_gpu

# thread instructions to turn one pair (a, b), counted from turn_rows' source: 2 conversions of a and b
# to fp32, 2 of cos and sin, 2 multiplies and 2 FMAs, 1 packed conversion back (2 values), and the
# 16-byte ld.shared / st.shared / global cos-sin loads at 8 elements each (6 of them for 8 pairs)
TURN_OPS_PER_PAIR = 2 + 2 + 4 + 1 + 6 / 8
SCHEDULERS_PER_SM = 4          # an SM issues one warp instruction a clock on each of its four schedulers
SMEM_BYTES_PER_CLOCK = 128     # per SM (the preset's SMEM level)
# one L2 round trip (the cos / sin rows serve every head of a batch, so they stay in L2): an estimate,
# between the preset's DRAM round trip (tile_latency_s, 0.7 us) and a shared-memory access
L2_LATENCY_S = 0.3e-6
# the shipped forward's blocks with rotary (gluon_forward.rotary_config: configs.GLUON_FORWARD, two consumers)
FORWARD_BLOCKS = {64: dict(block_m=64, block_n=128, stages=3, consumers=2, q_regs=False),
                  128: dict(block_m=64, block_n=128, stages=2, consumers=2, q_regs=True)}


def standalone_time(batch, seq, heads, d, rotary_dim=None, dtype="bf16", gpu="h100") -> float:
    """Seconds of tilecore.apply_rotary on x (batch, seq, heads, d): the engine's time of models.rotary."""
    return derive(models.rotary(batch, seq, heads, d, rotary_dim, dtype), get_gpu(gpu)).time


@dataclass
class RotaryOverhead:
    base_s: float          # the attention forward without rotary (given, or the engine's)
    terms: dict            # exposed seconds by term
    per_block: dict        # clocks a key block: the step and each resource's time
    note: str

    @property
    def seconds(self) -> float:
        return sum(self.terms.values())

    @property
    def fraction(self) -> float:
        """The predicted overhead over the forward without rotary (the issue's target: <= 0.03)."""
        return self.seconds / self.base_s

    def breakdown(self) -> str:
        lines = [f"attention forward without rotary {self.base_s * 1e3:.3f} ms; rotary in the kernel "
                 f"+{self.seconds * 1e6:.1f} us = {100 * self.fraction:+.2f}%"]
        lines += [f"  {k:<28} {v * 1e6:9.1f} us" for k, v in self.terms.items()]
        lines += ["  a key block (SM clocks): " + ", ".join(f"{k} {v:.0f}" for k, v in self.per_block.items()),
                  f"  {self.note}"]
        return "\n".join(lines)


def _attention_forward_s(batch, heads, seq, d, causal, gpu, rows, bn, consumers) -> float:
    """The engine's forward without rotary at the rotary kernel's tiles (rows a tile, bn keys a step)."""
    diag = models.attention(batch=batch, heads=heads, kv_heads=heads, seq=seq, d=d, causal=causal)
    return relabel(diag, gpu, {"q": group(rows), "x": stream(bn)}, warpgroups=consumers).time


def fused_overhead(batch, heads, seq, d, causal, rotary_dim=None, gpu="h100", base_s=None, dtype_bytes=2,
                   table_bytes=2, blocks=None, k_in_kernel=True) -> RotaryOverhead:
    """The predicted time rotary adds to the attention forward when Q (and K, ``k_in_kernel``) are turned
    in the kernel (gluon_forward.py's structure; module docstring). ``base_s``: the forward's time without
    rotary (a measured one, so that the step time is the run's; default the engine's). ``table_bytes``:
    cos / sin's element size. ``blocks``: the kernel's blocks (default FORWARD_BLOCKS[d]; a run's
    rotary_cfg takes). ``k_in_kernel=False``: K turned by apply_rotary's pass before the kernel."""
    gpu = get_gpu(gpu)
    b = dict(blocks or FORWARD_BLOCKS.get(d) or FORWARD_BLOCKS[128])
    R = (rotary_dim or d) // 2
    bm, bn, cons, stages = b["block_m"], b["block_n"], b["consumers"], b["stages"]
    rows = bm * cons                                   # a tile's query rows
    base = base_s if base_s is not None else _attention_forward_s(batch, heads, seq, d, causal, gpu, rows, bn, cons)
    clock = gpu.clock_hz
    tiles = batch * heads * math.ceil(seq / rows)
    kblocks = math.ceil(seq / bn)
    # key blocks a tile visits: all, or (causal) those up to its diagonal
    visits = sum(min(kblocks, math.ceil((t + 1) * rows / bn)) if causal else kblocks
                 for t in range(math.ceil(seq / rows))) * batch * heads
    step = base * clock * gpu.sms / visits             # SM clocks a key block takes without rotary
    # K: the transform warpgroup's turn of a block
    pairs = bn * R
    k_issue = pairs * TURN_OPS_PER_PAIR / 32 / SCHEDULERS_PER_SM
    k_smem = 2 * pairs * 2 * dtype_bytes / SMEM_BYTES_PER_CLOCK           # ld + st of a and b
    turn = max(k_issue, k_smem)
    mma_smem = cons * (bn * d + (0 if b.get("q_regs") else bm * d) + bn * d) * dtype_bytes / SMEM_BYTES_PER_CLOCK
    l2_share = gpu.level("L2").bandwidth / gpu.sms / clock                # bytes a clock an SM
    kv_bytes = 2 * bn * d * dtype_bytes
    table = 2 * bn * R * table_bytes
    latency = gpu.tile_latency_s * clock
    per_block = {"step": step, "turn issue": k_issue, "turn smem": k_smem, "wgmma smem": mma_smem,
                 "L2 (K, V)": kv_bytes / l2_share, "L2 (cos, sin)": table / l2_share, "load + turn": latency + turn}
    per_sm = visits / gpu.sms                          # blocks an SM runs
    if k_in_kernel:
        pace = max(0.0, turn - step)
        terms = {
            "K: transform's pace": pace * per_sm / clock,
            "K: shared memory": max(0.0, k_smem + mma_smem - step) * per_sm / clock,
            "K: stage latency": (0.0 if pace else max(0.0, latency + turn - (stages - 1) * step)) * per_sm / clock,
            "L2: cos and sin rows": max(0.0, (kv_bytes + table) / l2_share - max(step, kv_bytes / l2_share))
            * per_sm / clock,
        }
    else:  # apply_rotary on K (batch, seq, heads, d) before the kernel
        terms = {"K: apply_rotary's pass": standalone_time(batch, seq, heads, d, rotary_dim, gpu=gpu)}
    q_pairs = bm * R                                   # a consumer's rows
    q_turn = max(q_pairs * TURN_OPS_PER_PAIR / 32 / SCHEDULERS_PER_SM, 2 * q_pairs * 2 * dtype_bytes / SMEM_BYTES_PER_CLOCK)
    terms["Q: turned once a tile"] = (q_turn + L2_LATENCY_S * clock) * (tiles / gpu.sms) / clock
    note = ("the consumers' registers given to the transform are not modelled; "
            f"blocks {bm} x {cons} rows, {bn} keys, {stages} stages" + ("" if k_in_kernel else "; K by a pass"))
    return RotaryOverhead(base, terms, per_block, note)


# the issue's fused-rotary shapes (experiments/attention/gpu_rotary_kernel.py: B16 H16 N4096 bf16, rotary_dim D)
FUSED_CASES = {"d128": (128, False), "d128c": (128, True), "d64": (64, False), "d64c": (64, True)}


IN_KERNEL_MISS = ("not modelled: K turned in the kernel, +35 to +64% measured, the same whatever the angles in "
                  "flight (AHEAD 1, 2, 3 at D128: +63.2, +64.1, +62.0%); its issue, shared-memory bytes, stage "
                  "latency and L2 traffic hide under the step by count")


def fused_table(runs: list | None = None, gpu="h100", batch=16, heads=16, seq=4096) -> str:
    """Markdown rows: each fused case's predicted overhead; beside it the measured one for each timing row
    of ``runs`` (gpu_rotary_kernel.py's JSONs: case, variant, base_ms, rotary_ms, rotary_cfg), the
    prediction then at the run's own forward time (its step) and blocks; K by a pass for the k_pass
    variant. Without runs, the engine's forward."""
    rows = ["| case | variant | forward without rotary ms | predicted overhead | measured overhead | "
            "predicted / measured time | cause of a miss over 15% |", "| --- | --- | --- | --- | --- | --- | --- |"]
    measured = [r for run in runs or () for r in run["timing"]]
    cfg = {r["case"]: r["rotary_cfg"] for r in measured if r.get("rotary_cfg")}
    for case, (d, causal) in FUSED_CASES.items():
        mine = [r for r in measured if r["case"] == case] or [None]
        for m in mine:
            variant = (m or {}).get("variant", "K in the kernel" if m else "-")
            k_pass = variant == "k_pass"
            p = fused_overhead(batch, heads, seq, d, causal, gpu=gpu, base_s=m["base_ms"] * 1e-3 if m else None,
                               blocks=cfg.get(case), k_in_kernel=not k_pass)
            if m:
                ratio = (p.base_s + p.seconds) * 1e3 / m["rotary_ms"]
                meas, shown = f"{100 * (m['rotary_ms'] / m['base_ms'] - 1):+.1f}%", f"{ratio:.2f}"
                cause = IN_KERNEL_MISS if abs(ratio - 1) > 0.15 and not k_pass else ""
            else:
                meas = shown = cause = "-"
            rows.append(f"| {case} | {variant} | {p.base_s * 1e3:.3f}{'' if m else ' (engine)'} | "
                        f"{100 * p.fraction:+.1f}% | {meas} | {shown} | {cause} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m tilecore.napkin.rotary: every fused case's terms, then the table
    for name, (hd, cz) in FUSED_CASES.items():
        print(f"{name}:", fused_overhead(16, 16, 4096, hd, cz).breakdown(), sep="\n")
    print(fused_table())
