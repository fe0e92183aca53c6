"""Derivation: relabel a diagram with memory levels, cost the result, search for the fastest.

A relabelling gives every axis, at the shared-memory level (one thread block, "CTA"), a part:
  group(g)  - tile: the axis is split into n/g groups, one per thread block; inputs without the axis
              are re-sent to every group;
  stream(s) - loop in chunks of s with an accumulator; inputs without the axis stay resident;
  none      - the whole axis is resident.
Below it, the CTA's tile is split over `warpgroups` consumer units (register level) along one grouped
axis; above it, the CTAs running at once form an L2-level super-tile (grouped launch order).

Transfer into a level, for every HBM array X (inputs and outputs), with T the extent one unit of
that level covers over its lifetime:   H(X) = bytes(X) * prod_{a not in X} n_a / T_a
(X is re-sent once per unit along every axis it lacks). Tensor-core operands are re-read from shared
memory every step, so at the register level inputs use the per-step extent instead of T.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from .diagram import Diagram, Op
from .errors import CapacityError, UnknownAxisError
from .hardware import GPU, canonical_dtype, dtype_bytes, get_gpu

RESOURCES = ("HBM", "L2", "SMEM", "tensor", "sfu", "alu")


@dataclass(frozen=True)
class Part:
    kind: str      # group | stream | none
    size: int = 0

    def __str__(self):
        return self.kind if self.kind == "none" else f"{self.kind}({self.size})"


def group(size: int) -> Part:
    return Part("group", int(size))


def stream(size: int) -> Part:
    return Part("stream", int(size))


NONE = Part("none")


@dataclass
class Derivation:
    """One fused kernel: the relabelled diagram and its predicted cost."""
    diagram: Diagram
    gpu: GPU
    parts: dict                  # axis -> Part at the SMEM (thread block) level
    warpgroups: int
    split_axis: str | None       # axis split over warpgroups at the register level
    stages: int
    T: dict                      # level -> axis -> extent one unit covers (L2, SMEM, RF)
    S: dict                      # level -> axis -> extent resident per step
    H: dict                      # level -> bytes moved into it (HBM: HBM<->L2, L2: L2<->SMEM, SMEM: SMEM<->RF)
    M: dict                      # level -> bytes used by one unit (L2: the super-tile)
    capacity: dict               # level -> bytes one unit may use
    work: dict                   # (unit, dtype) -> operations executed (padding and mask included)
    times: dict                  # resource -> seconds if it alone were the limit
    time: float
    flops: float                 # useful FLOPs (what TFLOP/s counts)
    bound: str
    ctas: int
    ctas_per_sm: int
    waves: int
    causal_density: float
    supertile: dict
    time_model: str
    notes: list = field(default_factory=list)
    thread_clocks: dict = field(default_factory=dict)  # (op, unit, dtype) -> clocks per thread a step
    compute_time: float = 0.0    # the overlap schedule's compute time
    transfer_time: float = 0.0   # the slowest memory level
    fill_time: float = 0.0       # the first step's loads before any compute
    launch_time: float = 0.0     # the fixed time of one kernel (GPU.launch_s)
    mma: str = "wgmma"
    acc_dtype: str = "fp32"
    cluster: dict = field(default_factory=dict)   # axis -> blocks a cluster (TMA multicast of the others' tiles)
    l2_reads: float = 0.0        # bytes the L2 serves to the SMs (H["L2"] less what a cluster's multicast shares)

    @property
    def tflops(self) -> float:
        return self.flops / self.time / 1e12

    @property
    def compulsory_bytes(self) -> int:
        d = self.diagram
        return sum(d.nbytes(a) for a in d.inputs()) + sum(d.nbytes(o) for o in d.outputs)

    def summary(self) -> str:
        return (f"{self.diagram.name} on {self.gpu.name}: {self.time * 1e6:.1f} us, "
                f"{self.tflops:.0f} TFLOP/s, bound by {self.bound}")


# ------------------------------------------------------------------------------------------ helpers
def _io_arrays(d: Diagram):
    """HBM arrays: (name, axes, bytes per element, is_output)."""
    rows = [(a.name, a.axes, dtype_bytes(a.dtype), False) for a in d.inputs()]
    rows += [(o, d.arrays[o].axes, dtype_bytes(d.arrays[o].dtype), True) for o in d.outputs]
    return rows


def _main_tensor_op(d: Diagram) -> Op | None:
    best, most = None, 0.0
    for op in d.ops:
        for w in op.works:
            if w.unit == "tensor":
                n = math.prod(d.sizes[a] for a in w.axes)
                if n > most:
                    best, most = op, n
    return best


def _first_operand_axes(d: Diagram, op: Op) -> tuple:
    """The free axes of an op's first operand: the MMA's m (row) axes."""
    first = d.arrays[op.inputs[0]]
    return tuple(a for a in first.axes if a not in op.reduced)


def _causal_density(n_q: int, n_x: int, tq: int, sx: int) -> float:
    """Fraction of (query, key) points a causal kernel visits with q tiles tq and key chunks sx."""
    visited = 0
    for i in range(math.ceil(n_q / tq)):
        hi = min(n_q, (i + 1) * tq)
        visited += (hi - i * tq) * min(n_x, math.ceil(hi / sx) * sx)
    return visited / (n_q * n_x)


def _causal_work_density(n_q: int, n_x: int, tq: int, sx: int, rows: int) -> float:
    """Fraction of (query, key) points a causal forward computes with whole tiles of tq query rows counted from the
    last row (a last, short tile starts at row 0 and recomputes rows of the next: the Gluon forward's order), sx keys
    a chunk, and `rows` of a tile (a consumer's, or the tile's) stopping together at their last unmasked chunk."""
    visited = 0
    for i in range(math.ceil(n_q / tq)):
        start = max(n_q - (i + 1) * tq, 0)
        for j in range(math.ceil(min(tq, n_q) / rows)):
            hi = min(n_q, start + (j + 1) * rows)
            visited += (hi - start - j * rows) * min(n_x, math.ceil(hi / sx) * sx)
    return visited / (n_q * n_x)


def _layout_roundtrips(d: Diagram) -> list:
    """Intermediates that must pass through shared memory between two tensor-core ops because the
    consumer contracts an axis that is not the producer's innermost output axis (a register layout
    cannot be reused; attention's S -> P -> P V can, FlashAttention-3 style)."""
    names = []
    for op in d.ops:
        if not any(w.unit == "tensor" for w in op.works):
            continue
        for name in op.inputs:
            arr = d.arrays[name]
            if arr.role != "intermediate":
                continue
            prod = next(p for p in d.ops if p.output == name)
            if any(w.unit == "tensor" for w in prod.works) and tuple(op.reduced) != arr.axes[-len(op.reduced):]:
                names.append(name)
    return names


def _between_mmas(d: Diagram, op: Op) -> bool:
    """Does `op` sit between two dependent tensor-core ops (fed by one, feeding one or being one)?
    Its SFU work then waits for the first MMA and holds up the second within a warpgroup's step: the
    overlap schedule can hide only part of it behind other warpgroups' MMAs (softmax in attention)."""
    def tensor(o):
        return any(w.unit == "tensor" for w in o.works)

    def upstream(name, seen):
        prod = next((p for p in d.ops if p.output == name), None)
        if prod is None or prod.name in seen:
            return False
        seen.add(prod.name)
        return tensor(prod) or any(upstream(i, seen) for i in prod.inputs)

    fed = any(upstream(i, set()) for i in op.inputs)
    feeds = tensor(op) or any(tensor(c) for c in d._downstream(op.output))
    return fed and feeds


# ------------------------------------------------------------------------------------------ costing
TIME_MODELS = ("overlap", "ideal", "serial", "exposed-sfu")
MMAS = ("wgmma", "mma.sync")


# a thread-block cluster's most blocks (Hopper: 8 portable, 16 with the non-portable attribute)
MAX_CLUSTER = 16


def relabel(diagram: Diagram, gpu, parts: dict, warpgroups: int = 1, stages: int | None = None,
            time_model: str = "overlap", exposed_sfu: float | None = None, split_axis: str | None = None,
            check_alignment: bool = True, acc_dtype: str | None = None, mma: str = "wgmma",
            cluster: dict | None = None, stage_output: bool = True, causal_rows: int | None = None) -> Derivation:
    """Cost one relabelling. `parts`: axis -> Part at the thread-block level (missing axes: group(1)
    for axes every HBM array has, else none). Raises CapacityError when a level overflows.

    time_model: "overlap" (default), the overlap schedule: units run concurrently, except the
    exponentials that sit between two dependent tensor-core ops of one step (softmax between Q K^T and
    P V), of which `exposed_sfu` (default: the GPU's, the paper's 2/3) adds to the tensor time; "ideal":
    every unit overlaps (the paper's step 8 bound); "serial": units one after another (no warp
    specialization); "exposed-sfu": all SFU work exposed by `exposed_sfu`.
    acc_dtype: the register dtype of accumulated outputs (default fp32; the paper keeps O in fp16).
    mma: "wgmma" (Hopper's warpgroup MMA) or "mma.sync" (the warp-level MMA of Ampere kernels, at the
    GPU's `mma_sync_fraction` of the tensor rate).
    cluster: {axis: c}, thread-block clusters (Hopper): c neighbouring blocks along a grouped axis run at once
    on one GPC and a tile of an array that lacks the axis is read from L2 once for them, multicast by TMA into
    each block's shared memory: the L2's reads of it divide by c (`l2_reads`), the SMs' intake does not (every
    block still takes its bytes: H["L2"]), and each multicast tile holds a block's ring for the GPU's
    multicast_chunk_s (measured: 0.44 us, whatever its size): times["multicast"]. c a power of two, at most
    MAX_CLUSTER blocks in all.
    stage_output: the output tile is staged whole in shared memory for its store (a TMA epilogue: default);
    False: stored from registers (a tl kernel's tl.store), no shared memory for it.
    causal_rows: the query rows that stop together at their causal bound where the queries are grouped (a consumer
    warpgroup's, in a kernel whose consumers each skip the key blocks masked for all their rows: the Gluon forward
    without a carried pipeline); their density costs the tensor, SFU and ALU work, the tile's the loads (the producer
    loads every key block some row of the tile sees). Default: the tile's rows skip together."""
    if time_model not in TIME_MODELS:
        raise ValueError(f"time_model {time_model!r}; accepted: {', '.join(TIME_MODELS)}")
    if mma not in MMAS:
        raise ValueError(f"mma {mma!r}; accepted: {', '.join(MMAS)}")
    gpu = get_gpu(gpu)
    exposed_sfu = gpu.exposed_sfu if exposed_sfu is None else exposed_sfu
    acc_bytes = dtype_bytes(acc_dtype) if acc_dtype else 4
    d = diagram
    n = d.sizes
    for a in parts:
        if a not in n:
            raise UnknownAxisError(f"relabel: unknown axis {a!r}; axes: {', '.join(n)}")
    abstract = len(gpu.levels) == 2
    stages = (1 if abstract else 2) if stages is None else stages
    io = _io_arrays(d)
    everywhere = {a for a in n if all(a in axes for _, axes, _, _ in io)}
    P = {}
    for a in n:
        p = parts.get(a)
        if p is None:
            p = group(1) if (a in everywhere and a not in d.reduced_axes()) else NONE
        if p.kind != "none" and not (1 <= p.size):
            raise ValueError(f"axis {a!r}: tile size must be >= 1, got {p.size}")
        if p.kind != "none" and p.size > n[a]:
            p = NONE if p.kind == "stream" else group(n[a])
        P[a] = p
    streams = [a for a, p in P.items() if p.kind == "stream"]
    if len(streams) > 1:
        raise ValueError(f"one stream axis per level; got {streams}")
    for a, p in P.items():
        if a in d.reduced_axes() and p.kind in ("stream", "group") and p.size < n[a]:
            if not d.splittable(a):
                raise ValueError(f"axis {a!r} cannot be {p.kind}ed: a reduction over it has no "
                                 f"accumulator or its result is used along {a!r} again")
            if p.kind == "group" and any(a in op.reduced and op.output not in d.outputs for op in d.ops):
                raise ValueError(f"axis {a!r} can only be grouped (split) where its reduction writes "
                                 f"an output: partial results are combined in HBM")
    stream_axis = streams[0] if streams else None
    cluster = dict(cluster or {})
    for a, c in cluster.items():
        if a not in n or P[a].kind != "group":
            raise ValueError(f"cluster: axis {a!r} must be a grouped axis of the relabelling")
        if c < 1 or c & (c - 1):
            raise ValueError(f"cluster: {a!r} x {c}: a power of two blocks")
    if math.prod(cluster.values() or [1]) > MAX_CLUSTER:
        raise ValueError(f"cluster: {math.prod(cluster.values())} blocks, at most {MAX_CLUSTER}")

    # extents at the SMEM (thread-block) level
    T_s = {a: (p.size if p.kind == "group" else n[a]) for a, p in P.items()}
    S_s = {a: (p.size if p.kind in ("group", "stream") else n[a]) for a, p in P.items()}

    # register level: split one grouped axis over warpgroups
    main = _main_tensor_op(d)
    if split_axis is None:
        cands = _first_operand_axes(d, main) if main else tuple(n)
        cands = [a for a in cands if P[a].kind == "group"] or [a for a in n if P[a].kind == "group"]
        split_axis = max(cands, key=lambda a: T_s[a]) if cands else None
    T_r, S_r = dict(T_s), dict(S_s)
    if split_axis and warpgroups > 1 and T_s[split_axis] % warpgroups == 0:
        T_r[split_axis] = S_r[split_axis] = T_s[split_axis] // warpgroups

    # alignment: 128-byte coalescing of every HBM array's contiguous run, tensor-core granules
    m_gran, n_gran, k_bytes = gpu.tc_tile
    if mma == "mma.sync":
        m_gran = 16  # m16n8k16: one warp's 16 rows, not a warpgroup's 64
    if check_alignment and not abstract:
        for name, axes, q, _ in io:
            run, full = 1, 1
            for a in reversed(axes):
                run *= S_s[a]
                full *= n[a]
                if S_s[a] < n[a]:
                    break
            if run * q < gpu.coalesce_bytes and run < full:
                raise ValueError(f"{name}: contiguous run of {run * q} bytes is under the "
                                 f"{gpu.coalesce_bytes}-byte coalescing width")

    # padded work: MMA granules (m rows per warpgroup, n columns, k bytes), causal mask
    density = 1.0
    work_density = None
    mask = next((op.causal for op in d.ops if op.causal), None)
    if mask:  # every op over both masked axes skips the chunks above the diagonal (S = Q K^T too)
        qa, ka = mask
        if P[qa].kind == "stream" or (P[qa].kind == "none" and P[ka].kind == "group"):
            # key blocks stationary, queries streamed (the backward): the same triangle, transposed
            density = _causal_density(n[ka], n[qa], T_s[ka], S_s[qa])
        else:
            density = _causal_density(n[qa], n[ka], T_s[qa], S_s[ka])
            if P[qa].kind == "group":
                work_density = _causal_work_density(n[qa], n[ka], T_s[qa], S_s[ka],
                                                    min(causal_rows or T_s[qa], T_s[qa]))
    work = {}
    step = {}       # (op label, unit, dtype) -> operations in one warpgroup step (the paper's step 7)
    chain_sfu = {}  # SFU work between two dependent tensor-core ops of a step (exp in softmax . V)
    for op in d.ops:
        for w in op.works:
            pts = 1.0
            per_step = w.per_point
            for a in w.axes:
                # whole thread-block tiles along a grouped axis (a last, short tile computes all its rows: 1024
                # query rows in tiles of 192 are 1152 rows' work), whole chunks along a streamed one
                # (a masked work's query tiles are in work_density, the short tile's recomputed rows too)
                whole = P[a].kind == "group" and not (work_density is not None and a == mask[0]
                                                      and all(b in w.axes for b in mask))
                pts *= math.ceil(n[a] / T_s[a]) * T_s[a] if whole else math.ceil(n[a] / S_r[a]) * S_r[a]
                per_step *= S_r[a]
            if w.unit == "tensor" and not abstract:
                first = _first_operand_axes(d, op)
                rows = math.prod(S_r[a] for a in first if a in w.axes)
                cols = math.prod(S_r[a] for a in w.axes if a not in first and a not in op.reduced)
                kk = math.prod(S_r[a] for a in op.reduced if a in w.axes)
                k_gran = max(1, k_bytes // dtype_bytes(w.dtype))
                pad = (math.ceil(rows / m_gran) * m_gran / rows) * (math.ceil(cols / n_gran) * n_gran / cols) \
                    * (math.ceil(kk / k_gran) * k_gran / kk)
                pts *= pad
                per_step *= pad
            if mask and all(a in w.axes for a in mask):
                pts *= density if work_density is None else work_density
            work[(w.unit, w.dtype)] = work.get((w.unit, w.dtype), 0.0) + pts * w.per_point
            key = (op.label or op.name, w.unit, w.dtype)
            step[key] = step.get(key, 0.0) + per_step
            if w.unit == "sfu" and not abstract and _between_mmas(d, op):
                chain_sfu[(w.unit, w.dtype)] = chain_sfu.get((w.unit, w.dtype), 0.0) + pts * w.per_point
        if op.kind == "softmax_contract" and not abstract and P[op.reduced[0]].kind == "stream":
            # the running output is rescaled by exp(mu' - mu) once per streamed chunk: 2 ops a point
            acc_dt = canonical_dtype(acc_dtype) if acc_dtype else "fp32"
            out_pts = math.prod(math.ceil(n[a] / S_r[a]) * S_r[a] for a in d.arrays[op.output].axes)
            chunks = math.ceil(n[op.reduced[0]] / S_s[op.reduced[0]])
            dens = (density if work_density is None else work_density) if op.causal else 1.0
            work[("alu", acc_dt)] = work.get(("alu", acc_dt), 0.0) + 2 * out_pts * chunks * dens
            key = ("rescale " + op.output, "alu", acc_dt)
            step[key] = step.get(key, 0.0) + 2 * math.prod(S_r[a] for a in d.arrays[op.output].axes)
    causal_key = next((op.causal[1] for op in d.ops if op.causal), None)
    causal_q = next((op.causal[0] for op in d.ops if op.causal), None)

    if mask and (P[mask[0]].kind == "stream" or (P[mask[0]].kind == "none" and P[mask[1]].kind == "group")):
        causal_q, causal_key = causal_key, causal_q  # the streamed axis is the queries: they skip

    def masked(axes) -> float:  # arrays along the streamed masked axis but not the other skip chunks
        return density if (causal_key in axes and causal_q not in axes) else 1.0

    # memory per unit
    roundtrip = _layout_roundtrips(d) if not abstract else []
    m_smem = 0.0
    for name, axes, q, is_out in io:
        if is_out and not stage_output:  # stored from registers
            continue
        tile = math.prod(S_s[a] for a in axes) * q
        m_smem += tile * (stages if (stream_axis in axes and not is_out) else 1)
    # stages run one after another, so one buffer serves every layout change
    m_smem += max([math.prod(S_s[a] for a in d.arrays[r].axes) * dtype_bytes(d.arrays[r].dtype)
                   for r in roundtrip], default=0)
    m_rf = 0.0
    if not abstract:
        live = {}
        tensor_inputs = {i for op in d.ops if any(w.unit == "tensor" for w in op.works) for i in op.inputs}
        for k, op in enumerate(d.ops):
            for i in op.inputs:
                arr = d.arrays[i]
                if arr.role == "input" and i not in tensor_inputs:
                    live[i] = math.prod(S_s[a] for a in arr.axes) * dtype_bytes(arr.dtype)
            out = d.arrays[op.output]
            acc = acc_bytes if op.output in d.outputs and op.reduced else dtype_bytes(out.dtype)
            live[op.output] = math.prod(S_s[a] for a in out.axes) * acc
            if op.kind == "softmax_contract":  # P in the value dtype and three row statistics
                s_arr = d.arrays[op.inputs[0]]
                live[op.output + ".P"] = math.prod(S_s[a] for a in s_arr.axes) * dtype_bytes(d.arrays[op.inputs[1]].dtype)
                live[op.output + ".stats"] = 3 * 4 * math.prod(S_s[a] for a in out.axes if a in s_arr.axes)
            m_rf = max(m_rf, sum(live.values()))
            for i in op.inputs:  # free intermediates after their last use
                if d.arrays[i].role == "intermediate" and i not in d.outputs and \
                        all(d.ops.index(c) <= k for c in d.consumers(i)):
                    live.pop(i, None)
    smem = gpu.level("SMEM")
    cap_smem = min(smem.capacity, gpu.max_smem_per_block)
    if m_smem > cap_smem:
        raise CapacityError(f"shared memory: the tile needs {m_smem / 1024:.1f} KiB per thread block, "
                            f"{gpu.name} has {cap_smem / 1024:.0f} KiB")
    ctas_per_sm = max(1, int(smem.capacity // max(m_smem, 1)))
    if not abstract:
        rf = gpu.level("RF")
        per_wg = m_rf / warpgroups  # the thread block's register data spread over its warpgroups
        if per_wg > gpu.max_rf_per_warpgroup:
            raise CapacityError(f"registers: {per_wg / 1024:.1f} KiB per warpgroup, at most "
                                f"{gpu.max_rf_per_warpgroup / 1024:.1f} KiB (128 threads x 255 registers)")
        if m_rf > rf.capacity:
            raise CapacityError(f"registers: the tile needs {m_rf / 1024:.1f} KiB, the register file "
                                f"has {rf.capacity / 1024:.0f} KiB")
        ctas_per_sm = max(1, min(ctas_per_sm, int(rf.capacity // max(m_rf, 1)), 16 // warpgroups))
    ctas = math.prod(math.ceil(n[a] / T_s[a]) for a in n)
    slots = gpu.sms * ctas_per_sm if not abstract else 1
    waves = math.ceil(ctas / slots)
    wave_eff = ctas / (waves * slots)

    # L2 level: the CTAs running at once, arranged as a super-tile over the grouped axes that some
    # HBM array lacks (those are the ones whose sharing L2 can catch)
    T_l2 = dict(T_s)
    supertile = {}
    if not abstract:
        concurrent = min(ctas, slots)
        reuse_axes = [a for a in n if P[a].kind == "group" and T_s[a] < n[a]
                      and any(a not in axes for _, axes, _, _ in io)]
        reuse_axes = sorted(reuse_axes, key=lambda a: -n[a] / T_s[a])[:2]
        best = None
        # powers of two, and an axis's whole tile count (6 query tiles of 192 rows make one super-tile)
        for combo in itertools.product(*[sorted({2 ** i for i in range(0, 13) if 2 ** i <= math.ceil(n[a] / T_s[a])}
                                                | {math.ceil(n[a] / T_s[a])}) for a in reuse_axes]):
            if not concurrent / 2 < math.prod(combo) <= concurrent and math.prod(combo) != min(
                    concurrent, math.prod(math.ceil(n[a] / T_s[a]) for a in reuse_axes)):
                continue
            ext = {a: min(n[a], f * T_s[a]) for a, f in zip(reuse_axes, combo)}
            h = sum(math.prod(n[a] for a in axes) * q * math.prod(n[a] / ext.get(a, T_s[a]) for a in n if a not in axes)
                    for _, axes, q, _ in io)
            if best is None or h < best[0]:
                best = (h, ext, dict(zip(reuse_axes, combo)))
        if best:
            T_l2.update(best[1])
            supertile = best[2]

    def transfer(T, use_step_for_inputs=False, step=None) -> float:
        total = 0.0
        for _, axes, q, is_out in io:
            ext = step if (use_step_for_inputs and not is_out) else T
            total += math.prod(n[a] for a in axes) * q * masked(axes) * \
                math.prod(n[a] / ext[a] for a in n if a not in axes)
        return total

    H = {"HBM": transfer(T_l2)}
    l2_reads = 0.0
    m_l2 = sum(math.prod(min(n[a], T_l2[a] if a != stream_axis else S_s[a] * stages) for a in axes) * q
               for _, axes, q, _ in io)
    if abstract:
        H = {"HBM": transfer(T_s)}
    else:
        # every block takes its tiles into its own shared memory: H["L2"], the SMs' intake, whatever the cluster; a
        # cluster reads a tile of an array that lacks its axis from L2 once for its c blocks (TMA multicast): l2_reads
        H["L2"] = transfer(T_s)
        l2_reads = transfer({a: min(n[a], T_s[a] * cluster.get(a, 1)) for a in T_s}) if cluster else H["L2"]
        tensor_ops = [op for op in d.ops if any(w.unit == "tensor" for w in op.works)]
        H["SMEM"] = transfer(T_r, use_step_for_inputs=bool(tensor_ops), step=S_r) + sum(
            2 * math.prod(n[a] for a in d.arrays[r].axes) * dtype_bytes(d.arrays[r].dtype) for r in roundtrip)
        if m_l2 > gpu.level("L2").capacity / 2:
            H["HBM"] = transfer(T_s)  # the super-tile would not stay in L2: no reuse across CTAs
            supertile = {}

    # times
    times = {}
    hbm = gpu.levels[0]
    times["HBM"] = H["HBM"] / hbm.bandwidth
    if not abstract:
        # an SM's shared memory and its port to the L2 are its own: thread blocks on one SM share them and a lone
        # block has all of them, so shared memory's busy share is the SMs' (averaged over the waves), not the
        # thread-block slots' (a lone block of a small kernel is not a 1/16 slot of its SM). An SM draws at most
        # its share of the measured L2 bandwidth (~60 B/clk), so a few busy SMs cannot draw the whole L2 or HBM
        # bandwidth (backward.tile_clocks's rule for a lone tile, here for every kernel)
        sm_share = ctas / (gpu.sms * math.ceil(ctas / gpu.sms))
        ports = gpu.level("L2").bandwidth * min(ctas, gpu.sms) / gpu.sms   # the busy SMs' ports to the L2
        times["L2"] = H["L2"] / ports
        if gpu.l2_slice_share and gpu.l2_unshared_bandwidth:
            # the L2's slices: every line's first read (from HBM) and the share of the re-reads that is not merged
            # with a running block's request for the same line, at the slices' rate
            first = min(l2_reads, H["HBM"])
            slices = first + gpu.l2_slice_share * max(0.0, l2_reads - first)
            times["L2"] = max(times["L2"], slices / gpu.l2_unshared_bandwidth)
        times["HBM"] = H["HBM"] / min(hbm.bandwidth, ports)
        times["SMEM"] = H["SMEM"] / gpu.level("SMEM").bandwidth / sm_share
        if cluster and gpu.multicast_chunk_s:
            # each multicast tile holds a block's ring for multicast_chunk_s whatever its size: the tiles of the
            # arrays that lack a cluster axis, one a step, the SM's blocks one after another
            steps = math.ceil(n[stream_axis] / S_s[stream_axis]) * density if stream_axis else 1.0
            shared = sum(1 for _, axes, _, is_out in io if not is_out and any(a not in axes for a in cluster)
                         and (stream_axis in axes or not stream_axis))
            times["multicast"] = ctas / min(ctas, gpu.sms) * steps * shared * gpu.multicast_chunk_s
    mma_scale = gpu.mma_sync_fraction if mma == "mma.sync" else 1.0

    def rate(unit, dt):
        return gpu.rate(unit, dt) * (mma_scale if unit == "tensor" else 1.0)

    busy = wave_eff if not abstract else 1.0
    for unit in ("tensor", "sfu", "alu"):
        t = 0.0
        for (u, dt), ops in work.items():
            if u == unit:
                t += ops / rate(u, dt)
        times[unit] = t / busy
    chain_time = sum(ops / rate(u, dt) for (u, dt), ops in chain_sfu.items()) / busy
    transfer_time = max(times.get(k, 0.0) for k in ("HBM", "L2", "SMEM", "multicast"))
    if time_model == "ideal":
        compute_time = max(times["tensor"], times["sfu"], times["alu"])
    elif time_model == "overlap":
        compute_time = max(times["tensor"] + exposed_sfu * chain_time, times["sfu"], times["alu"])
    elif time_model == "serial":
        compute_time = times["tensor"] + times["sfu"] + times["alu"]
    else:  # exposed-sfu
        compute_time = max(times["tensor"] + exposed_sfu * times["sfu"], times["alu"])
    # the paper's step 7: clocks per thread of one warpgroup step, op by op, at one SM's rates
    thread_clocks = {}
    if not abstract:
        for (label, unit, dt), ops in step.items():
            thread_clocks[(label, unit, dt)] = ops / 128 / gpu.per_sm_per_clock(rate(unit, dt))
    # pipeline fill: the first step of the first wave is loaded before any compute starts, at the
    # bandwidth the busy SMs share; later waves overlap with the previous wave's tail, except for one
    # DRAM round trip a wave (a tile's first load waits for it: GPU.tile_latency_s)
    step_bytes = sum(math.prod(S_s[a] for a in axes) * q for _, axes, q, is_out in io if not is_out)
    busy_sms = min(gpu.sms, ctas) if not abstract else 1
    resident = min(ctas_per_sm, math.ceil(ctas / max(1, busy_sms))) if not abstract else 1
    fill = 0.0 if abstract else step_bytes * resident / (hbm.bandwidth / busy_sms) + waves * gpu.tile_latency_s
    # a transfer-bound kernel's bytes flow after its first loads' round trip (a copy of 2 MiB replayed from a
    # graph: 3.28 us, its bytes 1.40 at the copy rate: notes/napkin/runs/compile_s38a_run1_session38_h100.txt)
    first_trip = 0.0 if abstract else gpu.tile_latency_s
    # one buffer (stages = 1): a step's loads and its MMAs cannot overlap, they alternate
    # The first step's loads precede any compute (fill); a transfer-bound kernel's time already holds them
    overlapped = max(transfer_time + first_trip, compute_time + fill) if stages > 1 or abstract else \
        transfer_time + compute_time + fill
    time = overlapped + (0.0 if abstract else gpu.launch_s)
    contenders = {k: v for k, v in times.items()}
    if time_model != "ideal":
        contenders["tensor"] = compute_time if compute_time >= times["tensor"] else times["tensor"]
    bound = max(contenders, key=contenders.get)
    notes = []
    if bound in ("HBM", "L2", "SMEM") and H["HBM"] > 1.05 * sum(
            math.prod(n[a] for a in axes) * q for _, axes, q, _ in io):
        lvl = "SMEM" if m_smem > 0.5 * cap_smem else None
        if lvl:
            notes.append(f"transfer above compulsory with shared memory {100 * m_smem / cap_smem:.0f}% full: "
                         "capacity limits the tile")
            bound = f"{bound} (capacity: {lvl})"
    if wave_eff < 0.9:
        notes.append(f"wave quantization: {ctas} thread blocks in {waves} waves of {slots} ({100 * wave_eff:.0f}% busy)")
    return Derivation(
        diagram=d, gpu=gpu, parts=P, warpgroups=warpgroups, split_axis=split_axis, stages=stages,
        T={"L2": T_l2, "SMEM": T_s, "RF": T_r}, S={"SMEM": S_s, "RF": S_r},
        H=H, M={"L2": m_l2, "SMEM": m_smem, "RF": m_rf / warpgroups},
        capacity={"L2": gpu.level("L2").capacity if not abstract else None, "SMEM": cap_smem,
                  "RF": gpu.max_rf_per_warpgroup if not abstract else None},
        work=work, times=times, time=time, flops=d.flops(), bound=bound, ctas=ctas,
        ctas_per_sm=ctas_per_sm, waves=waves, causal_density=density, supertile=supertile,
        time_model=time_model, notes=notes, thread_clocks=thread_clocks, compute_time=compute_time,
        transfer_time=transfer_time, fill_time=fill, launch_time=0.0 if abstract else gpu.launch_s,
        mma=mma, acc_dtype=acc_dtype or "fp32", cluster=cluster, l2_reads=l2_reads)


# ------------------------------------------------------------------------------------------ search
def _sizes(n: int, granule: int, abstract: bool) -> list:
    if abstract:
        c = {max(1, round(2 ** (i / 4))) for i in range(0, 4 * max(1, math.ceil(math.log2(max(n, 2)))) + 1)}
    else:
        c = {granule * m * 2 ** i for m in (1, 3) for i in range(0, 14)}
    return sorted(x for x in c if x < n)


def candidate_parts(d: Diagram, gpu: GPU) -> dict:
    """Per axis, the parts the search tries at the thread-block level."""
    gpu = get_gpu(gpu)
    abstract = len(gpu.levels) == 2
    io = _io_arrays(d)
    reduced = d.reduced_axes()
    out = {}
    for a, size in d.sizes.items():
        every = all(a in axes for _, axes, _, _ in io) and a not in reduced
        if every:
            # tiling an axis every array has changes no transfer; only the tile's shape matters
            opts = [group(2 ** i) for i in range(0, 40) if 2 ** i < size] + [group(size)]
        elif not abstract and size <= 256 and (a in reduced or any(axes[-1] == a for _, axes, _, _ in io)):
            opts = [NONE]  # head dims and other short contiguous or contracted axes stay whole
        else:
            mma_rows = any(a in _first_operand_axes(d, op) for op in d.ops
                           if any(w.unit == "tensor" for w in op.works))
            gran = 1 if abstract else (64 if mma_rows else 1)
            opts = []
            if a not in reduced or d.splittable(a):
                # splitting a reduced axis over thread blocks (split-K, flash-decoding) needs a combine
                # pass this model does not cost, so the search leaves it to hand-made relabellings
                if a not in reduced:
                    sizes = _sizes(size, gran, abstract) if (gran > 1 and size > gran) or abstract else \
                        [2 ** i for i in range(0, 11) if 2 ** i < size]
                    opts += [group(g) for g in sizes if abstract or g <= 1024]
                if d.splittable(a):
                    opts += [stream(s) for s in (1, 2, 4, 8) if s < size] if abstract else \
                        [stream(s) for s in (16, 32, 64, 128, 256) if s < size]
            opts.append(NONE)
        out[a] = opts
    return out


def derive(diagram: Diagram, gpu="h100", time_model: str = "overlap", exposed_sfu: float | None = None,
           stages: int | None = None, max_warpgroups: int = 3, acc_dtype: str | None = None,
           mma: str = "wgmma") -> Derivation:
    """Search relabellings for the least predicted time. Raises CapacityError if none fits."""
    if time_model not in TIME_MODELS:  # checked here: the search below skips relabellings that raise
        raise ValueError(f"time_model {time_model!r}; accepted: {', '.join(TIME_MODELS)}")
    if mma not in MMAS:
        raise ValueError(f"mma {mma!r}; accepted: {', '.join(MMAS)}")
    from .rewrite import online_softmax; diagram = online_softmax(diagram)  # noqa: E702 (max/exp/sum written out)
    gpu = get_gpu(gpu)
    abstract = len(gpu.levels) == 2
    for op in diagram.ops:  # an op this GPU cannot run at all is a dtype error, not a capacity one
        for w in op.works:
            gpu.rate(w.unit, w.dtype) if w.unit != "tensor" else _tensor_rate(gpu, w.dtype, op)
    cands = candidate_parts(diagram, gpu)
    axes = list(cands)
    best, first_error = None, None
    wgs = [1] if abstract else list(range(1, max_warpgroups + 1))
    # batch-like axes (every array has them) are tried in a second pass, once the rest is fixed
    io = _io_arrays(diagram)
    batch = [a for a in axes if len(cands[a]) > 1 and all(a in ax for _, ax, _, _ in io)
             and a not in diagram.reduced_axes()]
    inner_batch = batch[-1:]  # the others stay group(1)
    search_axes = [a for a in axes if a not in batch]
    outer = {a: cands[a] for a in batch if a not in inner_batch}
    for a in outer:
        cands[a] = [group(1)]

    def try_all(fixed: dict, free: list):
        nonlocal best, first_error
        for combo in itertools.product(*[cands[a] for a in free]):
            if sum(p.kind == "stream" for p in combo) > 1:
                continue
            parts = dict(fixed)
            parts.update(zip(free, combo))
            for w in wgs:
                try:
                    r = relabel(diagram, gpu, parts, warpgroups=w, stages=stages, time_model=time_model,
                                exposed_sfu=exposed_sfu, acc_dtype=acc_dtype, mma=mma)
                except CapacityError as e:
                    first_error = first_error or e
                    continue
                except ValueError:
                    continue
                key = (r.time, r.H["HBM"], -r.M["SMEM"])
                if best is None or key < (best.time, best.H["HBM"], -best.M["SMEM"]):
                    best = r

    fixed = {a: cands[a][0] for a in batch if a not in inner_batch}
    inner_defaults = [{}]
    if inner_batch:
        opts = cands[inner_batch[0]]
        inner_defaults = [{inner_batch[0]: opts[i]} for i in sorted({0, len(opts) // 2, len(opts) - 1})]
    for default in inner_defaults:
        try_all({**fixed, **default}, search_axes)
    if best is None and inner_batch:  # none of the three sample tiles fits: try every one
        try_all(fixed, search_axes + inner_batch)
    if best is None and outer:  # nor with the outer batch axes at one: their tiles too (rotary at D64: a 64-byte
        cands.update(outer)       # cos row coalesces only with two positions a tile)
        try_all({}, search_axes + batch)
    if best is not None and inner_batch:
        fixed = {a: p for a, p in best.parts.items() if a not in inner_batch}
        try_all(fixed, inner_batch)
    if best is None:
        smallest = ", ".join(f"{a}: {cands[a][0]}" for a in axes)
        raise CapacityError(f"no legal tiling of {diagram.name!r} fits {gpu.name}"
                            + (f" ({first_error})" if first_error else "")
                            + f"; smallest tiles tried: {smallest}")
    return best


def _tensor_rate(gpu: GPU, dtype: str, op) -> float:
    try:
        return gpu.rate("tensor", dtype)
    except Exception as e:
        raise type(e)(f"{op.name}: {gpu.name} has no {dtype} tensor cores; "
                      f"accepted: {', '.join(gpu.units['tensor'].rates)}") from None


@dataclass
class Schedule:
    """The diagram as one or more kernels; intermediates between kernels go through HBM."""
    diagram: Diagram
    kernels: list

    @property
    def time(self) -> float:
        return sum(k.time for k in self.kernels)

    @property
    def flops(self) -> float:
        return self.diagram.flops()

    @property
    def tflops(self) -> float:
        return self.flops / self.time / 1e12

    @property
    def bound(self) -> str:
        return max(self.kernels, key=lambda k: k.time).bound

    @property
    def fused(self) -> bool:
        return len(self.kernels) == 1


def plan(diagram: Diagram, gpu="h100", **kwargs) -> Schedule:
    """Fuse or not: the cheapest split of the diagram's ops into consecutive kernels (cuts only after
    contractions and reductions; elementwise maps always fuse with a neighbour)."""
    from .diagram import segment

    gpu = get_gpu(gpu)
    ops = diagram.ops
    cuts = [i + 1 for i, op in enumerate(ops[:-1]) if op.kind != "map"]
    bounds = [0] + cuts + [len(ops)]
    best = {0: (0.0, [])}
    errors = []
    for j in range(1, len(bounds)):
        for i in range(j):
            if i not in best:
                continue
            try:
                k = derive(segment(diagram, bounds[i], bounds[j]) if (i, j) != (0, len(bounds) - 1)
                           else diagram, gpu, **kwargs)
            except CapacityError as e:
                errors.append(e)
                continue
            cost = best[i][0] + k.time
            if j not in best or cost < best[j][0]:
                best[j] = (cost, best[i][1] + [k])
    if len(bounds) - 1 not in best:
        raise errors[-1] if errors else CapacityError(f"no kernel split of {diagram.name!r} fits {gpu.name}")
    return Schedule(diagram, best[len(bounds) - 1][1])


# ------------------------------------------------------------------------------------------ configs
# Hopper GEMM tiles worth timing (M x N x K elements a thread block, ring stages, consumer warpgroups):
# the shapes wgmma and TMA take (M a multiple of 64 a warpgroup), the ones the issue's claims name
# (128x128, 128x256, 192x256, 256x128) and the napkin's own 384x128
GEMM_CANDIDATES = tuple(
    (bm, bn, bk, stages, wgs)
    for bm, bn, wgs in ((64, 128, 1), (64, 256, 1), (128, 64, 2), (128, 128, 2), (128, 256, 2), (256, 128, 2),
                        (192, 256, 3), (256, 256, 4), (384, 128, 3), (192, 128, 3))
    for bk in (64, 128) for stages in (3, 4))


@dataclass
class RankedConfig:
    block: tuple         # (M, N, K) a thread block
    stages: int
    warpgroups: int
    time: float          # predicted seconds
    derivation: Derivation

    @property
    def tflops(self) -> float:
        return self.derivation.tflops


def rank_gemm_configs(m: int, n: int, k: int, dtype: str = "bf16", gpu="h100", top_k: int | None = None,
                      candidates=GEMM_CANDIDATES) -> list:
    """GEMM tile configurations ranked by the napkin's predicted time (fastest first); those that do not
    fit the GPU's shared memory or registers are left out. `top_k`: keep the first k."""
    from . import models

    gpu = get_gpu(gpu)
    diag = models.matmul(m, n, k, dtype=dtype)
    ranked = []
    for bm, bn, bk, stages, wgs in candidates:
        if bk * dtype_bytes(dtype) < 64:  # a TMA box's inner extent below 64 bytes wastes the swizzle
            continue
        try:
            r = relabel(diag, gpu, {"m": group(bm), "n": group(bn), "k": stream(bk)}, warpgroups=wgs,
                        stages=stages, split_axis="m")
        except (CapacityError, ValueError):
            continue
        ranked.append(RankedConfig((bm, bn, bk), stages, wgs, r.time, r))
    ranked.sort(key=lambda c: (c.time, -c.block[0] * c.block[1]))
    return ranked[:top_k] if top_k else ranked


def gemm_perf_model(gpu="h100", dtype: str = "bf16"):
    """A `perf_model` for Triton's autotuner (`prune_configs_by={"perf_model": f, "top_k": k}`): called
    with the kernel's named arguments and the config's (M, N, K; BLOCK_M / BLOCK_SIZE_M, BLOCK_N, BLOCK_K;
    num_stages, num_warps), it returns the predicted time in ms (inf where the tile does not fit)."""
    gpu = get_gpu(gpu)

    def pick(kw, *names, default=None):
        for name in names:
            if name in kw:
                return kw[name]
        return default

    def perf_model(**kw) -> float:
        from . import models

        m, n, k = pick(kw, "M", "m"), pick(kw, "N", "n"), pick(kw, "K", "k")
        bm = pick(kw, "BLOCK_M", "BLOCK_SIZE_M", "block_m")
        bn = pick(kw, "BLOCK_N", "BLOCK_SIZE_N", "block_n")
        bk = pick(kw, "BLOCK_K", "BLOCK_SIZE_K", "block_k")
        if None in (m, n, k, bm, bn, bk):
            raise ValueError("gemm_perf_model needs M, N, K and BLOCK_M, BLOCK_N, BLOCK_K "
                             f"(or BLOCK_SIZE_*); got {sorted(kw)}")
        stages = int(pick(kw, "num_stages", default=3))
        wgs = max(1, int(pick(kw, "num_warps", default=4)) // 4)
        try:
            r = relabel(models.matmul(int(m), int(n), int(k), dtype=dtype), gpu,
                        {"m": group(int(bm)), "n": group(int(bn)), "k": stream(int(bk))},
                        warpgroups=wgs, stages=stages, split_axis="m", check_alignment=False)
        except (CapacityError, ValueError):
            return float("inf")
        return r.time * 1e3

    return perf_model


# (query rows a thread block, keys a step, consumer warpgroups, ring stages): Hopper forward tiles
ATTENTION_CANDIDATES = tuple(
    (bm, bn, wgs, stages)
    for bm, wgs in ((64, 1), (128, 1), (128, 2), (192, 3), (256, 2), (256, 4))
    for bn in (64, 128, 176, 256) for stages in (2, 3))


# A key step's fixed time in a thread block of the Gluon forward (its consumers' row max and sum, the O correction,
# the barrier hand-offs and wgmma waits a step, which the overlap schedule's MMA and exponential counts do not see):
# the committed candidate timings of the same shape, consumers and stages that differ only in 64 against 128 keys a
# step (notes/napkin/runs/napkin_topk_configs_attention_run{3,4}_session29_h100.json, ..._run1_session30_h100.json:
# 36 pairs) put the extra steps' time at 0.07-0.35 us a step, median 0.15. A thread block's steps cost it whatever
# its rows (two or three consumers run theirs side by side), so taller tiles take fewer. The overlap schedule's
# time is calibrated on the shipped 128 x 128-key tiles: the term is charged for the steps beyond that tiling's
ATTENTION_STEP_S = 0.15e-6
STEP_REFERENCE = (128, 128)  # (query rows, keys a step) of the tiling the term is counted from


def attention_steps_per_sm(batch: int, heads: int, seq: int, bm: int, bn: int, density: float, sms: int) -> float:
    """Key steps a thread block of the persistent forward takes on one SM: query tiles of bm rows, bn keys a step,
    ``density`` of the (tile, step) pairs visited (causal), spread over ``sms``."""
    return batch * heads * math.ceil(seq / bm) * math.ceil(seq / bn) * density / sms


def attention_step_time(batch: int, heads: int, seq: int, bm: int, bn: int, causal: bool, sms: int,
                        step_s: float = ATTENTION_STEP_S) -> float:
    """``step_s`` x (an SM's key steps with bm-row tiles of bn keys a step - with STEP_REFERENCE's tiles), seconds:
    what the forward's overlap-schedule time lacks for that tiling (negative for fewer steps)."""
    def steps(rows, keys):
        density = _causal_density(seq, seq, rows, keys) if causal else 1.0
        return attention_steps_per_sm(batch, heads, seq, rows, keys, density, sms)
    return step_s * (steps(bm, bn) - steps(*STEP_REFERENCE)) if step_s else 0.0


def rank_attention_configs(batch: int, heads: int, seq: int, d: int, causal: bool = False, dtype: str = "bf16",
                           gpu="h100", kv_heads: int | None = None, top_k: int | None = None,
                           candidates=ATTENTION_CANDIDATES, step_s: float = ATTENTION_STEP_S,
                           consumer_skip: bool = True) -> list:
    """Attention forward tiles ranked by predicted time (the overlap schedule, plus ``step_s`` a key step beyond a
    128 x 128-key tiling's: attention_step_time), fastest first; those that do not fit left out. ``step_s=0`` ranks
    by the overlap schedule alone (its tiles at 64 and 128 keys a step then lie within 1%). ``consumer_skip``: each
    consumer warpgroup stops at its own last unmasked key block (the Gluon forward without a carried pipeline;
    relabel's causal_rows), else the tile's rows stop together. Ties go to the taller tile, then the deeper ring.
    `RankedConfig.block` is (query rows, keys a step, d)."""
    from . import models

    gpu = get_gpu(gpu)
    diag = models.attention(batch=batch, heads=heads, seq=seq, d=d, causal=causal, dtype=dtype, kv_heads=kv_heads)
    ranked = []
    for bm, bn, wgs, stages in candidates:
        try:
            r = relabel(diag, gpu, {"q": group(bm), "x": stream(bn)}, warpgroups=wgs, stages=stages,
                        causal_rows=bm // wgs if consumer_skip else None)
        except (CapacityError, ValueError):
            continue
        t = r.time + attention_step_time(batch, heads, seq, bm, bn, causal, gpu.sms, step_s)
        ranked.append(RankedConfig((bm, bn, d), stages, wgs, t, r))
    ranked.sort(key=lambda c: (c.time, -c.block[0], -c.stages))
    return ranked[:top_k] if top_k else ranked
