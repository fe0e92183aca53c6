"""The planner's rewrites: diagrams turned into the known fused algorithms, found by pattern, not named.

    online_softmax(d)     max / exp / sum / divide written out  ->  softmax_contract (streamed with the
                          running max and sum, FlashAttention's accumulator)
    fuse_epilogues(d)     contraction(s) followed by elementwise maps  ->  one contraction whose epilogue
                          applies the maps before the store (gated MLP: silu(X W1) * (X W3) is written
                          once, in the input dtype, never H1 / H3 in fp32)
    split_reduction(d, axis, chunks)   the final reduction over `axis` split into `chunks` partials
                          merged by a second pass (split-K for a GEMM, flash-decoding for attention)
    apply(d)              online_softmax then fuse_epilogues (always profitable: they only remove HBM
                          traffic). The engine's derive() runs online_softmax first; plans (the CLI,
                          choose()) run apply(), so that a kernel boundary can fall after an epilogue.
                          A fused op's SFU work is its own: the engine's exposed-SFU chain does not see
                          it between two MMAs, so derive() itself does not fuse epilogues.
    choose(d, gpu, plan, derive)  apply(d) and every split, costed by the engine, the fastest kept;
                          a kernel's HBM time counts only the SMs its thread blocks occupy (OCCUPANCY)

User-defined streaming accumulators are Diagram.accumulate(x, over, Combine(...)) (diagram.py): an
associative combine makes the axis streamable and splittable as sum and max are.

Rewrites rebuild the diagram from its recipe (so the result can still be woven or resized); a diagram
without one (an engine segment) is returned as it is. Pure Python: this module imports no engine.
"""
from __future__ import annotations

from dataclasses import dataclass

from .diagram import Diagram

OP_METHODS = ("contract", "map", "reduce", "softmax_contract", "accumulate", "fuse_epilogue")
# An SM draws at most this many times its even share (bandwidth / SMs) of HBM bandwidth: a kernel of
# fewer thread blocks than SMs cannot reach the full bandwidth (too few loads in flight). An assumed
# figure (Little's law with an SM's ~64 KiB in flight at ~1 us latency gives 2-3x), not measured yet;
# it belongs in the engine's HBM term.
OCCUPANCY_SHARE = 2.0


def apply(diagram: Diagram) -> Diagram:
    """The always-profitable rewrites (they only remove HBM traffic)."""
    return fuse_epilogues(online_softmax(diagram))


# ------------------------------------------------------------------------------------ rebuilding
def _op_name(method, args, kwargs):
    return kwargs.get("name") if method in OP_METHODS else None


def _has_recipe(d: Diagram) -> bool:
    named = {_op_name(m, a, k) for m, a, k in d.recipe}
    return bool(d.recipe) and all(op.name in named for op in d.ops)


def _rebuild(d: Diagram, drop=(), insert=None, override=None, sizes=None, woven=None, extra_axes=None,
             keep_outputs=True) -> Diagram:
    """Replay d's recipe without the ops in `drop`; insert[name] = (method, args, kwargs) is called in
    place of op `name`; override[name] updates that op's keyword arguments."""
    insert, override, extra_axes = insert or {}, override or {}, extra_axes or {}
    out = Diagram(d.name, **(sizes or d.sizes))
    out.woven = list(d.woven if woven is None else woven)
    out.rewrites = list(getattr(d, "rewrites", []))
    for method, args, kwargs in d.recipe:
        name = _op_name(method, args, kwargs)
        if name in insert:
            m, a, k = insert[name]
            getattr(out, m)(*a, **k)
        if name in drop:
            continue
        if method in ("input", "constant"):
            nm, axes, dtype = args
            getattr(out, method)(nm, tuple(extra_axes.get(nm, ())) + tuple(axes), dtype)
        elif method == "output":
            if keep_outputs:
                out.output(*args)
        else:
            getattr(out, method)(*args, **{**kwargs, **override.get(name, {})})
    if sizes is None and not extra_axes:
        # a diagram whose ops were edited after building (a causal mask set on them) does not replay
        # to itself: leave it as it is rather than lose the edit
        before = {op.name: op for op in d.ops}
        if any(before.get(op.name) not in (None, op) for op in out.ops if op.name not in drop and op.name not in insert):
            raise _Unreplayable(d.name)
    return out


class _Unreplayable(Exception):
    pass


def _producer(d: Diagram, name: str):
    return next((op for op in d.ops if op.output == name), None)


def _only_used_by(d: Diagram, name: str, users) -> bool:
    return name not in d.outputs and all(op.name in users for op in d.consumers(name))


def _recipe_of(d: Diagram, name: str):
    return next((m, a, k) for m, a, k in d.recipe if _op_name(m, a, k) == name)


# ------------------------------------------------------------------------------------ online softmax
@dataclass
class SoftmaxMatch:
    scores: str
    values: str
    over: str
    ops: tuple        # the ops the pattern replaces, in order
    final: str        # the op whose output is softmax(scores) . values


def find_softmax(d: Diagram) -> list:
    """max over x of S; exp(S - max); sum over x; contract with V over x; divide by the sum (before or
    after the contraction). Each intermediate used only inside the pattern."""
    found = []
    for rmax in d.ops:
        if rmax.kind != "reduce" or rmax.accumulator != "max" or len(rmax.reduced) != 1:
            continue
        x, S = rmax.reduced[0], rmax.inputs[0]
        for e in d.consumers(rmax.output):
            if e.kind != "map" or "exp" not in e.label or S not in e.inputs:
                continue
            rsum = next((o for o in d.consumers(e.output) if o.kind == "reduce" and o.accumulator == "sum"
                         and o.reduced == (x,)), None)
            if rsum is None:
                continue
            others = [o for o in d.consumers(e.output) if o is not rsum]
            if len(others) != 1:
                continue
            nxt = others[0]
            if nxt.kind == "contract" and nxt.reduced == (x,):      # (exp . V) / sum
                V = next(i for i in nxt.inputs if i != e.output)
                div = d.consumers(nxt.output)
                if len(div) != 1 or div[0].kind != "map" or set(div[0].inputs) != {nxt.output, rsum.output}:
                    continue
                ops = (rmax, e, rsum, nxt, div[0])
            elif nxt.kind == "map" and set(nxt.inputs) == {e.output, rsum.output}:   # (exp / sum) . V
                con = d.consumers(nxt.output)
                if len(con) != 1 or con[0].kind != "contract" or con[0].reduced != (x,):
                    continue
                V = next(i for i in con[0].inputs if i != nxt.output)
                ops = (rmax, e, rsum, nxt, con[0])
            else:
                continue
            names = {o.name for o in ops}
            if all(_only_used_by(d, o.output, names) for o in ops[:-1]):
                found.append(SoftmaxMatch(S, V, x, tuple(o.name for o in ops), ops[-1].name))
    return found


def online_softmax(d: Diagram) -> Diagram:
    """Every softmax written out as max / exp / sum / divide becomes softmax_contract: the key axis
    can then be streamed with the running max and sum (FlashAttention) instead of S living whole."""
    matches = find_softmax(d)
    if not matches or not _has_recipe(d):
        return d
    drop, insert = set(), {}
    for m in matches:
        final = d.arrays[m.final]
        drop |= set(m.ops)
        insert[m.final] = ("softmax_contract", (m.scores, m.values),
                           {"over": m.over, "name": m.final, "dtype": final.dtype})
    try:
        out = _rebuild(d, drop, insert)
    except _Unreplayable:
        return d
    out.rewrites.append("online softmax: " + ", ".join(f"{m.final} = softmax_{m.over}({m.scores}) . {m.values}"
                                                       for m in matches))
    return out


# ------------------------------------------------------------------------------------ epilogue fusion
@dataclass
class EpilogueMatch:
    contractions: tuple   # op names
    maps: tuple           # op names, in order; the last one's output is the fused op's
    final: str


def find_epilogues(d: Diagram) -> list:
    """Elementwise maps over contraction outputs (same output and reduced axes), each intermediate used
    only by the maps: the maps run on the accumulators before the one store."""
    groups = {}
    for op in d.ops:
        if op.kind != "map":
            continue
        roots, maps, ok = [], [], True
        for i in op.inputs:
            prod = _producer(d, i)
            if prod is None:
                ok &= all(a in op.axes for a in d.arrays[i].axes)    # an input broadcast over the tile
            elif prod.kind == "contract" and prod.name not in roots:
                roots.append(prod.name)
            elif prod.name in groups:
                r, m = groups[prod.name]
                roots += [x for x in r if x not in roots]
                maps += [x for x in m if x not in maps]
            else:
                ok = False
        if not ok or not roots:
            continue
        cons = [next(o for o in d.ops if o.name == r) for r in roots]
        if op.causal or any(c.causal for c in cons):  # a masked product keeps its own op (the mask's cost)
            continue
        if any(c.reduced != cons[0].reduced or d.arrays[c.output].axes != tuple(op.axes) for c in cons):
            continue
        groups[op.name] = (roots, maps + [op.name])
    found, covered = [], set()
    for name in reversed([op.name for op in d.ops if op.name in groups]):
        roots, maps = groups[name]
        members = set(roots) | set(maps)
        if members & covered:
            continue
        if all(_only_used_by(d, m, members) for m in members - {name}):
            found.append(EpilogueMatch(tuple(roots), tuple(maps), name))
            covered |= members
    return found[::-1]


def fuse_epilogues(d: Diagram) -> Diagram:
    matches = find_epilogues(d)
    if not matches or not _has_recipe(d):
        return d
    drop, insert = set(), {}
    for m in matches:
        cons = []
        for c in m.contractions:
            _, args, kw = _recipe_of(d, c)
            cons.append({"name": c, "inputs": list(args), "out": kw["out"], "ops_per_point": kw["ops_per_point"]})
        maps = []
        for mp in m.maps:
            _, args, kw = _recipe_of(d, mp)
            maps.append({"fn": args[0], "inputs": list(args[1:]), "name": mp, "unit": kw["unit"], "ops": kw["ops"]})
        drop |= set(m.contractions) | set(m.maps)
        insert[m.final] = ("fuse_epilogue", (), {"contractions": cons, "maps": maps, "name": m.final,
                                                 "dtype": d.arrays[m.final].dtype})
    try:
        out = _rebuild(d, drop, insert)
    except _Unreplayable:
        return d
    out.rewrites.append("epilogue fusion: " + ", ".join(
        f"{m.final} = {' -> '.join(m.maps)} on the accumulators of {', '.join(m.contractions)}" for m in matches))
    return out


# ------------------------------------------------------------------------------------ split-K / flash-decoding
def split_candidates(d: Diagram) -> list:
    """Axes the final reductions may be split along: reduced by an op that writes an output, with an
    accumulator, streamable (nothing uses the axis again after the reduction)."""
    out = []
    for op in d.ops:
        if op.output in d.outputs and op.accumulator and op.reduced:
            out += [a for a in op.reduced if d.splittable(a) and a not in out]
    return out


def split_reduction(d: Diagram, axis: str, chunks: int) -> Diagram:
    """Split `axis` into `chunks` x (n / chunks): every input with the axis gets a chunk axis c (woven,
    so thread blocks run over it), the reduction writes fp32 partials per chunk, and a merge pass
    reduces c (a sum; for a softmax, partials weighted by their log-sum-exp: flash-decoding)."""
    n = d.sizes[axis]
    if axis not in split_candidates(d):
        raise ValueError(f"split_reduction: {axis!r} is not a streamable axis of a reduction that writes an "
                         f"output; accepted: {', '.join(split_candidates(d)) or 'none'}")
    if chunks < 2 or n % chunks:
        raise ValueError(f"split_reduction: chunks must be >= 2 and divide {axis} = {n}, got {chunks}")
    if not _has_recipe(d):
        raise ValueError("split_reduction: the diagram has no recipe (an engine segment)")
    final = [op for op in d.ops if op.output in d.outputs and axis in op.reduced]
    c = "c" if "c" not in d.sizes else next(f"c{i}" for i in range(2, 99) if f"c{i}" not in d.sizes)
    sizes = {c: chunks, **d.sizes, axis: n // chunks}
    extra = {a.name: (c,) for a in d.inputs() if axis in a.axes}
    out = _rebuild(d, sizes=sizes, woven=[c] + list(d.woven), extra_axes=extra, keep_outputs=False,
                   override={op.name: {"name": op.name + "_part", "dtype": "fp32"} for op in final})
    rename = {op.name + "_part": op.name for op in final}
    for method, args, _ in d.recipe:  # outputs: partials merged; the others as they were
        if method != "output":
            continue
        for o in args:
            if o in [op.name for op in final]:
                op = next(p for p in final if p.name == o)
                label = "lse-weighted merge" if op.accumulator == "softmax" else "sum"
                out.reduce(o + "_part", c, kind="sum", name=o, dtype=d.arrays[o].dtype)
                out.ops[-1] = _relabel(out.ops[-1], f"{label} of {chunks} partials over {c}")
                out.output(o)
            else:
                out.output(rename.get(o, o))
    what = "flash-decoding" if any(op.accumulator == "softmax" for op in final) else "split-K"
    out.rewrites.append(f"{what}: {axis} = {n} split into {chunks} chunks of {n // chunks}, partials merged")
    return out


def _relabel(op, label):
    import dataclasses
    return dataclasses.replace(op, label=label)


# ------------------------------------------------------------------------------------ choosing
@dataclass
class Choice:
    diagram: Diagram        # the rewritten diagram chosen
    schedule: object        # what `cost` returned for it (an engine Schedule)
    time: float             # its time with the occupancy term
    rewrites: list
    tried: list             # (description, time) of every candidate


def occupancy_time(schedule, share: float = OCCUPANCY_SHARE) -> float:
    """Each kernel's time, its HBM traffic drawn only by the SMs its thread blocks occupy (at most
    `share` times an SM's even share of the bandwidth each)."""
    total = 0.0
    for k in schedule.kernels:
        gpu = k.gpu
        busy = min(1.0, k.ctas * share / gpu.sms) if len(gpu.levels) > 2 else 1.0
        total += max(k.time, k.H["HBM"] / (gpu.levels[0].bandwidth * busy))
    return total


@dataclass
class MergePass:
    """The merge of split partials: one streaming pass over them (read the partials, write the result)
    on every SM, at the HBM bandwidth, plus the GPU's fixed launch time."""
    gpu: object
    H: dict
    time: float
    ctas: int
    bound: str = "HBM"

    @classmethod
    def of(cls, d: Diagram, gpu) -> "MergePass":
        moved = sum(d.nbytes(a) for a in d.inputs()) + sum(d.nbytes(o) for o in d.outputs)
        return cls(gpu, {"HBM": moved}, moved / gpu.levels[0].bandwidth + getattr(gpu, "launch_s", 0.0), gpu.sms)


@dataclass
class Kernels:
    """A schedule of kernels run one after another (what engine.plan returns, for a forced split)."""
    diagram: Diagram
    kernels: list

    @property
    def time(self) -> float:
        return sum(k.time for k in self.kernels)


def choose(diagram: Diagram, gpu, plan, derive, chunks=(2, 4, 8, 16, 32, 64), min_chunk: int = 128,
           **kwargs) -> Choice:
    """apply(diagram) costed by plan(d, gpu, **kwargs), and each split of its final reductions as two
    kernels (the partials, then the merge) costed by derive(segment, gpu, **kwargs); the fastest by
    occupancy_time. `plan` and `derive` are the engine's (passed in: this module imports no engine)."""
    from .diagram import segment

    base = apply(diagram)
    cands = [("as written" if not base.rewrites else "; ".join(base.rewrites), base, None)]
    for axis in split_candidates(base):
        for c in chunks:
            if base.sizes[axis] % c == 0 and base.sizes[axis] // c >= min_chunk:
                try:
                    cands.append((f"split {axis} in {c}", split_reduction(base, axis, c), c))
                except ValueError:
                    continue
    best, tried, errors = None, [], []
    for what, d, c in cands:
        try:
            if c is None:
                s = plan(d, gpu, **kwargs)
            else:
                k = len(d.ops) - 1  # the merge is the last op
                partials = derive(segment(d, 0, k), gpu, **kwargs)
                s = Kernels(d, [partials, MergePass.of(segment(d, k, k + 1), partials.gpu)])
        except ValueError as e:  # CapacityError included: that candidate does not fit
            errors.append(e)
            continue
        t = occupancy_time(s)
        tried.append((what, t))
        if best is None or t < best.time:
            best = Choice(d, s, t, list(d.rewrites), tried)
    if best is None:
        raise errors[-1]
    best.tried = tried
    return best
