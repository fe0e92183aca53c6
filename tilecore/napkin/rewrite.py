"""The planner's rewrites: diagrams turned into the known fused algorithms, found by pattern, not named.

    online_softmax(d)     max / exp / sum / divide written out  ->  softmax_contract (streamed with the
                          running max and sum, FlashAttention's accumulator)
    fuse_epilogues(d)     contraction(s) followed by elementwise maps  ->  one contraction whose epilogue
                          applies the maps before the store (gated MLP: silu(X W1) * (X W3) is written
                          once, in the input dtype, never H1 / H3 in fp32)
    hoist_row_factors(d)  a contraction whose operand is X * (vectors over the contracted axis) * (row
                          statistics): the vectors scale the weight first, the statistics scale the
                          accumulator after (RMSNorm then GEMM in one pass over X: nothing normalized
                          is written, the statistic's reduction streams beside the contraction)
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

import ast
import re
from dataclasses import dataclass

from .diagram import Diagram
from .errors import CompileError

OP_METHODS = ("contract", "map", "reduce", "softmax_contract", "accumulate", "fuse_epilogue")
# An SM draws at most this many times its even share (bandwidth / SMs) of HBM bandwidth: a kernel of
# fewer thread blocks than SMs cannot reach the full bandwidth (too few loads in flight). An assumed
# figure (Little's law with an SM's ~64 KiB in flight at ~1 us latency gives 2-3x), not measured yet;
# it belongs in the engine's HBM term.
OCCUPANCY_SHARE = 2.0


def apply(diagram: Diagram) -> Diagram:
    """The always-profitable rewrites (they only remove HBM traffic)."""
    return fuse_epilogues(hoist_row_factors(online_softmax(diagram)))


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
            calls = insert[name] if isinstance(insert[name], list) else [insert[name]]
            for m, a, k in calls:
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


# ------------------------------------------------------------------------------------ map semantics
ELEMENTWISE = {
    "identity": "a", "add": "a + b", "mul": "a * b", "sub": "a - b", "div": "a / b",
    "silu": "a * sigmoid(a)", "sigmoid": "sigmoid(a)", "tanh": "tanh(a)", "exp": "exp(a)",
    "relu": "maximum(a, 0.0)", "square": "a * a", "rsqrt": "rsqrt(a)",
    "gelu": "0.5 * a * (1.0 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))",  # tanh form
    "x*inv*w": "a * b * c",
}
FUNCTIONS = ("exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "tanh_approx", "abs", "maximum", "minimum")
PLACEHOLDERS = "abcdefgh"


# special-function-unit (MUFU) instructions a function costs as napkin.compile emits it: exp, log,
# sqrt, rsqrt one each; sigmoid 1 / (1 + exp(-x)) two (ex2, rcp); tanh one ex2 (its reciprocal by
# Newton steps on the FMA pipe: compile._tanh); tanh_approx one (tanh.approx.f32 on the GPU). sm_90a
# SASS of the emitted attention loop, a score: MUFU.EX2 1 plain, EX2 + RCP 2 more with sigmoid, EX2
# 1 more with softcap, TANH 1 more with softcap_approx (test_compile)
SFU_COST = {"exp": 1, "log": 1, "sqrt": 1, "rsqrt": 1, "sigmoid": 2, "tanh": 1, "tanh_approx": 1}


def map_cost(fn: str) -> tuple:
    """(unit, ops per element) of a map as compiled: the SFU instructions where it has any (they bind
    first), else its ALU operations. What to give Diagram.map(unit=, ops=) so that the napkin costs the
    kernel napkin.compile emits."""
    tree = ast.parse(map_expression(fn), mode="eval")
    sfu = sum(SFU_COST.get(nd.func.id, 0) for nd in ast.walk(tree) if isinstance(nd, ast.Call))
    alu = sum(isinstance(nd, (ast.BinOp, ast.UnaryOp)) for nd in ast.walk(tree)) + \
        sum(1 for nd in ast.walk(tree) if isinstance(nd, ast.Call) and nd.func.id in ("abs", "maximum", "minimum"))
    return ("sfu", float(sfu)) if sfu else ("alu", float(max(alu, 1)))


def map_expression(fn: str) -> str:
    """A map's fn -> an expression over a, b, c, ... (raises CompileError naming what is accepted)."""
    fn = fn.strip()
    if fn in ELEMENTWISE:
        return ELEMENTWISE[fn]
    m = re.fullmatch(r"softcap(_approx)?\(\s*([0-9.eE+-]+)\s*\)", fn)
    if m:  # softcap_approx(C): tanh by the hardware's tanh.approx.f32 (compile.TANH_APPROX_ERROR)
        return f"{float(m.group(2))!r} * tanh{m.group(1) or ''}(a / {float(m.group(2))!r})"
    m = re.fullmatch(r"scale\(\s*([0-9.eE+-]+)\s*\)", fn)
    if m:
        return f"a * {float(m.group(1))!r}"
    try:
        tree = ast.parse(fn, mode="eval")
    except SyntaxError:
        tree = None
    ok = tree is not None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Name) and node.id not in PLACEHOLDERS and node.id not in FUNCTIONS:
            ok = False
        elif isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS):
            ok = False
        elif not isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Call, ast.Name, ast.Constant,
                                   ast.Load, ast.operator, ast.unaryop)):
            ok = False
    if not ok:
        raise CompileError(f"map {fn!r} has no known semantics; accepted: {', '.join(ELEMENTWISE)}, softcap(C), "
                           f"softcap_approx(C), scale(C), or an expression of a, b, c, ... with {', '.join(FUNCTIONS)}")
    return fn



def row_factor_split(fn: str, inputs: list, row_names: set):
    """Split a map's expression, a product, into (tile factors, row factors): row factors read only
    arrays in `row_names` (per-row statistics), tile factors none of them. None when some factor
    mixes both or the expression is not a product. (RMSNorm's x * inv * w: tile x * w, row inv.)"""
    tree = ast.parse(map_expression(fn), mode="eval").body

    def factors(nd):
        if isinstance(nd, ast.BinOp) and isinstance(nd.op, ast.Mult):
            return factors(nd.left) + factors(nd.right)
        return [nd]
    tile, row = [], []
    for f in factors(tree):
        used = {inputs[PLACEHOLDERS.index(n.id)] for n in ast.walk(f) if isinstance(n, ast.Name) and n.id in PLACEHOLDERS}
        if used and used <= row_names:
            row.append(f)
        elif not used & row_names:
            tile.append(f)
        else:
            return None
    return (tile, row) if row and tile else None




# ------------------------------------------------------------------------------------ row factors
def _renumbered(node, old_inputs, new_inputs) -> str:
    """A factor's expression with its placeholders renumbered from old_inputs to new_inputs."""
    import copy

    class Sub(ast.NodeTransformer):
        def visit_Name(self, nd):
            if nd.id in PLACEHOLDERS:
                name = old_inputs[PLACEHOLDERS.index(nd.id)]
                return ast.copy_location(ast.Name(PLACEHOLDERS[new_inputs.index(name)], ast.Load()), nd)
            return nd
    return ast.unparse(Sub().visit(copy.deepcopy(node)))


@dataclass
class RowFactorMatch:
    contraction: str
    operand_map: str
    x: str
    vec_factors: list
    row_factors: list


def find_row_factors(d: Diagram) -> list:
    found = []
    for c in d.ops:
        if c.kind != "contract" or len(c.reduced) != 1 or len(c.inputs) != 2:
            continue
        Y = c.inputs[0]
        y = _producer(d, Y)
        if y is None or y.kind != "map" or not _only_used_by(d, Y, {c.name}):
            continue
        n = c.reduced[0]
        rows = {i for i in y.inputs if n not in d.arrays[i].axes}
        try:
            split = row_factor_split(y.label, list(y.inputs), rows)
        except CompileError:
            continue
        if split is None:
            continue

        def names(f):
            return {y.inputs[PLACEHOLDERS.index(nd.id)] for nd in ast.walk(f)
                    if isinstance(nd, ast.Name) and nd.id in PLACEHOLDERS}
        xs = [f for f in split[0] if any(len(d.arrays[m].axes) > 1 for m in names(f))]
        vec = [f for f in split[0] if not any(f is x for x in xs)]
        if len(xs) != 1 or not isinstance(xs[0], ast.Name) or any(
                any(d.arrays[m].axes != (n,) for m in names(f)) for f in vec):
            continue
        found.append(RowFactorMatch(c.name, y.name, y.inputs[PLACEHOLDERS.index(xs[0].id)], vec, split[1]))
    return found


def hoist_row_factors(d: Diagram) -> Diagram:
    """RMSNorm then GEMM as one pass: Z = rowfactor * (X . (vecfactor * P)). The contraction reads X as
    it is; the normalized operand is never made."""
    matches = find_row_factors(d)
    if not matches or not _has_recipe(d):
        return d
    drop, insert = set(), {}
    for m in matches:
        c, y = (next(o for o in d.ops if o.name == n) for n in (m.contraction, m.operand_map))
        _, c_args, c_kw = _recipe_of(d, c.name)
        P = c.inputs[1]
        calls, weight = [], P
        if m.vec_factors:
            vec_in = [P] + sorted({i for i in y.inputs if d.arrays[i].axes == (c.reduced[0],)})
            fn = "a * " + " * ".join(f"({_renumbered(f, list(y.inputs), vec_in)})" for f in m.vec_factors)
            weight = f"{P}_scaled"
            calls.append(("map", (fn, *vec_in), {"name": weight, "unit": "alu", "ops": len(m.vec_factors),
                                                 "dtype": d.arrays[P].dtype}))
        calls.append(("contract", (m.x, weight), {"out": c_kw["out"], "name": f"{c.name}_acc", "dtype": "fp32",
                                                   "ops_per_point": c_kw.get("ops_per_point", 2.0)}))
        row_in = [f"{c.name}_acc"] + sorted({i for i in y.inputs if c.reduced[0] not in d.arrays[i].axes})
        fn = "a * " + " * ".join(f"({_renumbered(f, list(y.inputs), row_in)})" for f in m.row_factors)
        calls.append(("map", (fn, *row_in), {"name": c.name, "unit": "alu", "ops": len(m.row_factors),
                                             "dtype": d.arrays[c.output].dtype}))
        drop |= {c.name, y.name}
        insert[c.name] = calls
    try:
        out = _rebuild(d, drop, insert)
    except _Unreplayable:
        return d
    out.rewrites.append("row factors hoisted: " + ", ".join(
        f"{m.contraction} = row factor * ({m.x} . " + ("scaled weight" if m.vec_factors else "weight") + ")"
        for m in matches))
    return out
