"""Rotary embeddings on the napkin (issue 37): the standalone pass and the cost of turning Q and K inside
the attention forward.

Standalone (`standalone_time`): `tilecore.apply_rotary` reads x and writes it once, and reads the cos and
sin rows of each token (models.rotary's diagram; the engine's HBM term: x twice plus the tables).

Fused (`fused_overhead`): the Hopper forward with rotary (tilecore/ops/attention/gluon_rotary.py) turns
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
- **K, the transform's pace**: the transform turns a block in chunks of `1024 / R` rows (16-byte vectors
  of each half a thread, four warps), the next chunk's cos / sin rows loaded under the current chunk's
  turn (`ahead` chunks in flight, gluon_rotary.AHEAD). A chunk's turn is short, so a chunk waits one L2
  round trip for its angles: a block takes max(issue, ld/st.shared, chunks x L2_LATENCY_S / ahead). A
  block slower than the step holds the consumers back by the difference, every block;
- **K, latency** (where the transform keeps pace): a stage must be loaded and turned within the (stages
  - 1) steps it has before the consumers need it: the excess of (a DRAM round trip + the turn) over that;
- **L2**: K, V and the block's cos / sin rows read at the SM's even share of the L2 bandwidth: the excess
  over the step.

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
# one L2 round trip under the kernel's own traffic (the cos / sin rows serve every head of a batch, so they
# stay in L2): fitted to one row, the D128 row of notes/rotary/runs/rotary_kernel1_run1_session36_h100.txt (
# +63.2% = 2,170 clocks a block over a 3,437-clock step, 8 chunks a block, one round trip each); the other
# three rows are its check (notes/napkin/README.md)
L2_LATENCY_S = 0.38e-6
# the shipped forward's blocks with rotary (gluon_rotary.rotary_config: configs.GLUON_FORWARD, two consumers)
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
                   table_bytes=2, blocks=None, ahead=1) -> RotaryOverhead:
    """The predicted time rotary adds to the attention forward when Q and K are turned in the kernel
    (gluon_rotary.py's structure; module docstring). ``base_s``: the forward's time without rotary (a
    measured one, so that the step time is the run's; default the engine's). ``table_bytes``: cos / sin's
    element size. ``blocks``: the kernel's blocks (default FORWARD_BLOCKS[d]; a run's rotary_cfg takes).
    ``ahead``: chunks of angles in flight ahead of the turned one (gluon_rotary.AHEAD)."""
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
    l2_latency = L2_LATENCY_S * clock
    # K: the transform warpgroup's turn of a block
    pairs = bn * R
    chunks = math.ceil(bn / max(1, 1024 // R))         # gluon_rotary.rows_at_a_time: 1024 / R rows a chunk
    k_issue = pairs * TURN_OPS_PER_PAIR / 32 / SCHEDULERS_PER_SM
    k_smem = 2 * pairs * 2 * dtype_bytes / SMEM_BYTES_PER_CLOCK           # ld + st of a and b
    k_chain = chunks * l2_latency / max(1, ahead)
    turn = max(k_issue, k_smem, k_chain)
    mma_smem = cons * (bn * d + (0 if b.get("q_regs") else bm * d) + bn * d) * dtype_bytes / SMEM_BYTES_PER_CLOCK
    l2_share = gpu.level("L2").bandwidth / gpu.sms / clock                # bytes a clock an SM
    kv_bytes = 2 * bn * d * dtype_bytes
    table = 2 * bn * R * table_bytes
    latency = gpu.tile_latency_s * clock
    per_block = {"step": step, "turn issue": k_issue, "turn smem": k_smem, "turn's angle chain": k_chain,
                 "wgmma smem": mma_smem, "L2 (K, V)": kv_bytes / l2_share, "L2 (cos, sin)": table / l2_share,
                 "load + turn": latency + turn}
    per_sm = visits / gpu.sms                          # blocks an SM runs
    pace = max(0.0, turn - step)
    terms = {
        "K: transform's pace": pace * per_sm / clock,
        "K: shared memory": max(0.0, k_smem + mma_smem - step) * per_sm / clock,
        "K: stage latency": (0.0 if pace else max(0.0, latency + turn - (stages - 1) * step)) * per_sm / clock,
        "L2: cos and sin rows": max(0.0, (kv_bytes + table) / l2_share - max(step, kv_bytes / l2_share))
        * per_sm / clock,
    }
    q_pairs = bm * R                                   # a consumer's rows
    q_turn = max(q_pairs * TURN_OPS_PER_PAIR / 32 / SCHEDULERS_PER_SM, 2 * q_pairs * 2 * dtype_bytes / SMEM_BYTES_PER_CLOCK)
    terms["Q: turned once a tile"] = (q_turn + l2_latency) * (tiles / gpu.sms) / clock
    note = ("the consumers' registers given to the transform are not modelled; "
            f"blocks {bm} x {cons} rows, {bn} keys, {stages} stages, {chunks} chunks of angles a block, {ahead} ahead")
    return RotaryOverhead(base, terms, per_block, note)


# the issue's fused-rotary shapes (experiments/attention/gpu_rotary_kernel.py: B16 H16 N4096 bf16, rotary_dim D)
FUSED_CASES = {"d128": (128, False), "d128c": (128, True), "d64": (64, False), "d64c": (64, True)}


def fused_table(measured: dict | None = None, gpu="h100", batch=16, heads=16, seq=4096) -> str:
    """Markdown rows: each fused case's predicted overhead; beside it the measured one where ``measured``
    holds the run's timing rows (gpu_rotary_kernel.py's JSON: case, base_ms, rotary_ms, rotary_cfg); the
    prediction then takes the run's own forward time as its step time and its blocks."""
    rows = ["| case | forward without rotary ms | predicted overhead | measured overhead | predicted / measured time "
            "| largest term |", "| --- | --- | --- | --- | --- | --- |"]
    for case, (d, causal) in FUSED_CASES.items():
        m = (measured or {}).get(case)
        base = m["base_ms"] * 1e-3 if m else None
        p = fused_overhead(batch, heads, seq, d, causal, gpu=gpu, base_s=base, blocks=(m or {}).get("rotary_cfg"))
        meas = f"{100 * (m['rotary_ms'] / m['base_ms'] - 1):+.1f}%" if m else "-"
        ratio = f"{(p.base_s + p.seconds) * 1e3 / m['rotary_ms']:.2f}" if m else "-"
        top = max(p.terms, key=p.terms.get)
        rows.append(f"| {case} | {p.base_s * 1e3:.3f}{'' if m else ' (engine)'} | {100 * p.fraction:+.1f}% | {meas} | "
                    f"{ratio} | {top} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m tilecore.napkin.rotary: every fused case's terms, then the table
    for name, (hd, cz) in FUSED_CASES.items():
        print(f"{name}:", fused_overhead(16, 16, 4096, hd, cz).breakdown(), sep="\n")
    print(fused_table())
