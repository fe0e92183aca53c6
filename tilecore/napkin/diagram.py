"""Diagrams: arrays with named, sized axes and a dtype, and the operations between them.

A Diagram is built op by op; each op records which axes it iterates over, which it reduces (and with
which accumulator, if the reduction can be streamed), and its work per point on each compute unit.
Weaving (vmap) adds an axis to some inputs; everything computed from them gains it, and inputs that
do not get it are broadcast. Every Diagram keeps the recipe that built it, so weaving and composing
replay it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .errors import ShapeMismatchError, UnknownAxisError
from .hardware import canonical_dtype

TENSOR_DTYPES = ("fp8", "fp16", "bf16", "tf32")


def _axes(spec) -> tuple:
    if isinstance(spec, str):
        spec = spec.replace(",", " ").split()
    return tuple(spec)


@dataclass(frozen=True)
class Array:
    name: str
    axes: tuple
    dtype: str
    role: str = "intermediate"    # input | constant | intermediate
    producer: str | None = None   # name of the op that makes it


@dataclass(frozen=True)
class Work:
    """`per_point` operations on `unit` (tensor/sfu/alu) in `dtype` for each point of `axes`."""
    unit: str
    dtype: str
    axes: tuple
    per_point: float


@dataclass(frozen=True)
class Op:
    name: str
    kind: str                     # contract | map | reduce | softmax_contract
    inputs: tuple                 # array names
    output: str
    axes: tuple                   # iteration space (all axes the op touches)
    reduced: tuple                # axes summed or maxed away
    accumulator: str | None       # sum | max | softmax (running max and sum) | None: needs the whole axis
    works: tuple
    causal: tuple | None = None   # (query axis, key axis) of a causal mask
    label: str = ""               # how to draw and print it, e.g. "exp" or "S @ V"


@dataclass(frozen=True)
class Combine:
    """A user-defined streaming accumulator: `combine` is associative (state, state) -> state, so the
    reduced axis can be streamed (a running state per output point) and split (partial states merged).
    `lift(x)` makes the state of one element; `finish(state)` the result. Each is a Python callable
    over numpy arrays (the float64 evaluator and `check()` use them); `state` is the number of floats
    a state holds and `ops` the combine's ALU operations per element (the cost model's work)."""
    name: str
    lift: object
    combine: object
    finish: object = None
    state: int = 1
    ops: float = 1.0

    def check(self, values, rtol: float = 1e-9) -> bool:
        """Associativity on a sample: folding left and folding as a balanced tree agree."""
        states = [self.lift(v) for v in values]
        left = states[0]
        for st in states[1:]:
            left = self.combine(left, st)

        def tree(xs):
            return xs[0] if len(xs) == 1 else self.combine(tree(xs[:len(xs) // 2]), tree(xs[len(xs) // 2:]))
        right = tree(states)
        flat = lambda st: [float(v) for v in (st if isinstance(st, (tuple, list)) else (st,))]  # noqa: E731
        return all(abs(a - b) <= rtol * max(1.0, abs(a), abs(b)) for a, b in zip(flat(left), flat(right)))


@dataclass
class Diagram:
    name: str
    sizes: dict = field(default_factory=dict)
    arrays: dict = field(default_factory=dict)
    ops: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    woven: list = field(default_factory=list)
    recipe: list = field(default_factory=list)

    def __init__(self, name: str, **sizes):
        self.name, self.sizes, self.arrays, self.ops, self.outputs = name, {}, {}, [], []
        self.woven, self.recipe = [], []
        self.rewrites = []            # what rewrite.py did to get here, one line each
        for axis, size in sizes.items():
            self.axis(axis, size)

    # ---------------------------------------------------------------- building
    def axis(self, name: str, size: int) -> str:
        size = int(size)
        if size < 1:
            raise ShapeMismatchError(f"axis {name!r} must have a positive size, got {size}")
        if name in self.sizes and self.sizes[name] != size:
            raise ShapeMismatchError(f"axis {name!r} already has size {self.sizes[name]}, not {size}")
        self.sizes[name] = size
        return name

    def _check_axes(self, axes, what: str):
        for a in axes:
            if a not in self.sizes:
                raise UnknownAxisError(f"{what}: unknown axis {a!r}; this diagram's axes are "
                                       f"{', '.join(f'{k}={v}' for k, v in self.sizes.items())}")
        if len(set(axes)) != len(axes):
            raise ShapeMismatchError(f"{what}: repeated axis in {axes}")

    def _get(self, x) -> Array:
        name = x.name if isinstance(x, Array) else x
        if name not in self.arrays:
            raise KeyError(f"no array {name!r} in diagram {self.name!r}; arrays: {', '.join(self.arrays)}")
        return self.arrays[name]

    def _new(self, name, axes, dtype, role="intermediate", producer=None) -> Array:
        if name in self.arrays:
            raise ValueError(f"array name {name!r} is already used in diagram {self.name!r}")
        arr = Array(name, tuple(axes), canonical_dtype(dtype), role, producer)
        self.arrays[name] = arr
        return arr

    def input(self, name: str, axes, dtype: str = "bf16") -> Array:
        axes = _axes(axes)
        self.recipe.append(("input", (name, axes, dtype), {}))
        self._check_axes(axes, f"input {name!r}")
        return self._new(name, axes, dtype, "input")

    def constant(self, name: str, axes, dtype: str = "bf16") -> Array:
        """An array made on chip (e.g. the H16 matrix): never loaded from HBM."""
        axes = _axes(axes)
        self.recipe.append(("constant", (name, axes, dtype), {}))
        self._check_axes(axes, f"constant {name!r}")
        return self._new(name, axes, dtype, "constant")

    def _woven_of(self, arrays) -> list:
        return [w for w in self.woven if any(w in a.axes for a in arrays)]

    def _union(self, arrays) -> tuple:
        seen = []
        for a in arrays:
            seen += [ax for ax in a.axes if ax not in seen]
        return tuple(seen)

    def _add_op(self, op: Op, out_axes, dtype) -> Array:
        self.ops.append(op)
        return self._new(op.output, out_axes, dtype, producer=op.name)

    def contract(self, *arrays, out, name: str, dtype: str | None = None, ops_per_point: float = 2.0) -> Array:
        """Einsum: multiply the inputs and sum over every axis not in `out` (a dot product woven over
        the output axes). On tensor cores when the inputs' dtype has them; 2 FLOP per point."""
        self.recipe.append(("contract", tuple(a.name if isinstance(a, Array) else a for a in arrays),
                            {"out": out, "name": name, "dtype": dtype, "ops_per_point": ops_per_point}))
        ins = [self._get(a) for a in arrays]
        every = self._union(ins)
        out = _axes(out)
        for a in out:
            if a not in every:
                raise UnknownAxisError(f"contract {name!r}: output axis {a!r} is in no input; "
                                       f"inputs have {', '.join(every)}")
        out = tuple(self._woven_of(ins)) + tuple(a for a in out if a not in self.woven)
        reduced = tuple(a for a in every if a not in out)
        in_dtype = max((a.dtype for a in ins), key=lambda d: ("fp8", "fp16", "bf16", "tf32", "fp32").index(d))
        unit = "tensor" if in_dtype in TENSOR_DTYPES else "alu"
        op = Op(name, "contract", tuple(a.name for a in ins), name, every, reduced, "sum",
                (Work(unit, in_dtype, every, ops_per_point),), label=" . ".join(a.name for a in ins))
        return self._add_op(op, out, dtype or ("fp32" if in_dtype == "fp32" else in_dtype))

    def einsum(self, spec: str, *arrays, name: str, dtype: str | None = None) -> Array:
        """contract() with one-letter axes: einsum("qd,xd->qx", Q, K, name="S")."""
        ins, out = spec.replace(" ", "").split("->")
        for letters, arr in zip(ins.split(","), arrays):
            if tuple(letters) != self._get(arr).axes[-len(letters):]:
                raise ShapeMismatchError(f"einsum {spec!r}: {self._get(arr).name} has axes "
                                         f"{self._get(arr).axes}, not {tuple(letters)}")
        return self.contract(*arrays, out=tuple(out), name=name, dtype=dtype)

    def map(self, fn: str, *arrays, name: str, unit: str = "alu", ops: float = 1.0,
            dtype: str | None = None) -> Array:
        """Elementwise function woven over every axis of its inputs; inputs lacking an axis are
        broadcast along it. `unit`/`ops`: where it runs and how many operations per element."""
        self.recipe.append(("map", (fn,) + tuple(a.name if isinstance(a, Array) else a for a in arrays),
                            {"name": name, "unit": unit, "ops": ops, "dtype": dtype}))
        ins = [self._get(a) for a in arrays]
        axes = self._union(ins)
        dt = dtype or ins[0].dtype
        work_dt = "fp32" if unit != "tensor" else dt
        op = Op(name, "map", tuple(a.name for a in ins), name, axes, (), None,
                (Work(unit, work_dt, axes, float(ops)),), label=fn)
        return self._add_op(op, axes, dt)

    def reduce(self, x, over, kind: str = "sum", name: str = "", dtype: str = "fp32",
               streamable: bool = True) -> Array:
        """Sum or max over axes. With streamable=False the reduction needs the whole axis at once."""
        self.recipe.append(("reduce", (x.name if isinstance(x, Array) else x,),
                            {"over": over, "kind": kind, "name": name, "dtype": dtype,
                             "streamable": streamable}))
        if kind not in ("sum", "max", "mean"):
            raise ValueError(f"reduce kind {kind!r}; accepted: sum, max, mean")
        arr = self._get(x)
        over = _axes(over)
        self._check_axes(over, f"reduce {name!r}")
        for a in over:
            if a not in arr.axes:
                raise UnknownAxisError(f"reduce {name!r}: {arr.name} has no axis {a!r}; it has {arr.axes}")
        acc = ("max" if kind == "max" else "sum") if streamable else None
        op = Op(name, "reduce", (arr.name,), name, arr.axes, over, acc,
                (Work("alu", "fp32", arr.axes, 1.0),), label=f"{kind} over {','.join(over)}")
        return self._add_op(op, tuple(a for a in arr.axes if a not in over), dtype)

    def accumulate(self, x, over, combine: Combine, name: str, dtype: str = "fp32") -> Array:
        """Reduce `over` with a user-defined associative accumulator (a Combine): streamable and
        splittable as sum and max are. Examples: logsumexp, Welford's mean and variance, argmax."""
        if not isinstance(combine, Combine):
            raise TypeError(f"accumulate {name!r}: combine must be a napkin.Combine, got {type(combine).__name__}")
        self.recipe.append(("accumulate", (x.name if isinstance(x, Array) else x,),
                            {"over": over, "combine": combine, "name": name, "dtype": dtype}))
        arr = self._get(x)
        over = _axes(over)
        self._check_axes(over, f"accumulate {name!r}")
        for a in over:
            if a not in arr.axes:
                raise UnknownAxisError(f"accumulate {name!r}: {arr.name} has no axis {a!r}; it has {arr.axes}")
        op = Op(name, "reduce", (arr.name,), name, arr.axes, over, combine.name,
                (Work("alu", "fp32", arr.axes, float(combine.ops)),), label=f"{combine.name} over {','.join(over)}")
        return self._add_op(op, tuple(a for a in arr.axes if a not in over), dtype)

    def fuse_epilogue(self, contractions, maps, name: str, dtype: str | None = None) -> Array:
        """One contraction op that computes several contractions sharing their output and reduced axes
        (a dual GEMM: X W1 and X W3) and applies elementwise maps to the accumulators before the one
        store (the epilogue). `contractions`: dicts (name, inputs, out, ops_per_point); `maps`: dicts
        (fn, inputs, name, unit, ops), the last one's result is the op's output `name`. What
        rewrite.fuse_epilogues makes of a contraction followed by maps; the intermediates never exist."""
        self.recipe.append(("fuse_epilogue", (), {"contractions": contractions, "maps": maps, "name": name,
                                                  "dtype": dtype}))
        made, ins, every, reduced, out_axes, flop, in_dtype = {}, [], (), None, None, 0.0, None
        for c in contractions:
            arrs = [self._get(a) for a in c["inputs"]]
            ins += [a.name for a in arrs if a.name not in ins]
            every = self._union(arrs)
            out = tuple(self._woven_of(arrs)) + tuple(a for a in _axes(c["out"]) if a not in self.woven)
            red = tuple(a for a in every if a not in out)
            if reduced is not None and (red != reduced or out != out_axes):
                raise ShapeMismatchError(f"fuse_epilogue {name!r}: {c['name']} reduces {red} into {out}, "
                                         f"the first contraction {reduced} into {out_axes}")
            reduced, out_axes = red, out
            flop += float(c.get("ops_per_point", 2.0))
            in_dtype = max((a.dtype for a in arrs), key=lambda d: ("fp8", "fp16", "bf16", "tf32", "fp32").index(d))
            made[c["name"]] = out
        works = [Work("tensor" if in_dtype in TENSOR_DTYPES else "alu", in_dtype, every, flop)]
        labels = []
        for m in maps:
            for i in m["inputs"]:
                if i not in made:
                    arr = self._get(i)
                    if any(a not in out_axes for a in arr.axes):
                        raise ShapeMismatchError(f"fuse_epilogue {name!r}: {i}{arr.axes} is not broadcast "
                                                 f"over the contraction's output {out_axes}")
                    if i not in ins:
                        ins.append(i)
            made[m["name"]] = out_axes
            works.append(Work(m.get("unit", "alu"), "fp32", out_axes, float(m.get("ops", 1.0))))
            labels.append(f"{m['fn']}({', '.join(m['inputs'])})")
        label = "; ".join(f"{c['name']} = {' . '.join(c['inputs'])}" for c in contractions) + \
            " -> " + "; ".join(labels)
        op = Op(name, "contract", tuple(ins), name, every, reduced, "sum", tuple(works), label=label)
        return self._add_op(op, out_axes, dtype or ("fp32" if in_dtype == "fp32" else in_dtype))

    def softmax_contract(self, scores, values, over: str, name: str, causal: str | None = None,
                         dtype: str | None = None) -> Array:
        """softmax(scores) along `over`, then contract with `values` over it: streamable with the
        running max mu, running sum z and rescale exp(mu' - mu) (the FlashAttention accumulator).
        causal: the query axis of a causal mask between it and `over`."""
        self.recipe.append(("softmax_contract", (scores.name if isinstance(scores, Array) else scores,
                                                 values.name if isinstance(values, Array) else values),
                            {"over": over, "name": name, "causal": causal, "dtype": dtype}))
        s, v = self._get(scores), self._get(values)
        if over not in s.axes or over not in v.axes:
            raise UnknownAxisError(f"softmax_contract {name!r}: axis {over!r} must be in both "
                                   f"{s.name}{s.axes} and {v.name}{v.axes}")
        every = self._union([s, v])
        out = tuple(a for a in every if a != over)
        pv_dtype = v.dtype if v.dtype in TENSOR_DTYPES else "fp32"
        s_axes = s.axes
        works = (Work("tensor" if pv_dtype != "fp32" else "alu", pv_dtype, every, 2.0),  # P @ V
                 Work("sfu", "fp32", s_axes, 1.0),      # exp(S - mu)
                 Work("alu", "fp32", s_axes, 4.0))      # scale, row max, subtract, row sum
        if causal is not None:
            self._check_axes((causal,), f"softmax_contract {name!r} causal")
        op = Op(name, "softmax_contract", (s.name, v.name), name, every, (over,), "softmax", works,
                causal=(causal, over) if causal else None, label=f"softmax_{over}({s.name}) . {v.name}")
        return self._add_op(op, out, dtype or v.dtype)

    def output(self, *arrays) -> "Diagram":
        self.recipe.append(("output", tuple(a.name if isinstance(a, Array) else a for a in arrays), {}))
        for a in arrays:
            arr = self._get(a)
            if arr.name not in self.outputs:
                self.outputs.append(arr.name)
        return self

    # ---------------------------------------------------------------- transforming
    def replay(self, target: "Diagram", rename: dict | None = None, extra_axes: dict | None = None):
        """Re-run this diagram's recipe on `target`; `rename` maps array names, `extra_axes` maps an
        input name to axes prepended to it (weaving)."""
        rename = dict(rename or {})
        extra_axes = extra_axes or {}
        for method, args, kwargs in self.recipe:
            if method in ("input", "constant"):
                name, axes, dtype = args
                if name in rename:  # an input fed by another diagram's output
                    continue
                getattr(target, method)(name, tuple(extra_axes.get(name, ())) + tuple(axes), dtype)
            elif method == "output":
                target.output(*[rename.get(a, a) for a in args])
            elif method == "map":
                getattr(target, method)(args[0], *[rename.get(a, a) for a in args[1:]], **kwargs)
            elif method == "fuse_epilogue":
                kw = dict(kwargs)
                kw["contractions"] = [{**c, "inputs": [rename.get(a, a) for a in c["inputs"]]}
                                      for c in kwargs["contractions"]]
                kw["maps"] = [{**m, "inputs": [rename.get(a, a) for a in m["inputs"]]} for m in kwargs["maps"]]
                target.fuse_epilogue(**kw)
            else:
                getattr(target, method)(*[rename.get(a, a) for a in args], **kwargs)

    def weave(self, axis: str, size: int, inputs) -> "Diagram":
        """Map the whole diagram over a new axis (vmap). The listed inputs get the axis; the others
        are broadcast (shared by every index along it)."""
        inputs = [inputs] if isinstance(inputs, str) else list(inputs)
        for name in inputs:
            if name not in self.arrays or self.arrays[name].role != "input":
                raise KeyError(f"weave: {name!r} is not an input of {self.name!r}; inputs: "
                               f"{', '.join(a.name for a in self.inputs())}")
        out = Diagram(self.name, **self.sizes)
        out.axis(axis, size)
        out.woven = [axis] + list(self.woven)
        self.replay(out, extra_axes={n: (axis,) for n in inputs})
        return out

    def with_sizes(self, **sizes) -> "Diagram":
        unknown = [a for a in sizes if a not in self.sizes]
        if unknown:
            raise UnknownAxisError(f"unknown axis {unknown[0]!r} for {self.name!r}; axes: {', '.join(self.sizes)}")
        out = Diagram(self.name, **{**self.sizes, **sizes})
        out.woven = list(self.woven)
        self.replay(out)
        return out

    # ---------------------------------------------------------------- reading
    def inputs(self) -> list:
        return [a for a in self.arrays.values() if a.role == "input"]

    def nbytes(self, arr) -> int:
        from .hardware import dtype_bytes
        arr = self._get(arr)
        return math.prod(self.sizes[a] for a in arr.axes) * dtype_bytes(arr.dtype)

    def consumers(self, name: str) -> list:
        return [op for op in self.ops if name in op.inputs]

    def work(self, causal_density: float = 0.5) -> dict:
        """Total operations per (unit, dtype); a causal mask keeps `causal_density` of the points."""
        total = {}
        for op in self.ops:
            for w in op.works:
                n = w.per_point * math.prod(self.sizes[a] for a in w.axes)
                mask = next((o.causal for o in self.ops if o.causal), None)
                if mask and all(a in w.axes for a in mask):
                    n *= causal_density
                total[(w.unit, w.dtype)] = total.get((w.unit, w.dtype), 0.0) + n
        return total

    def flops(self) -> float:
        """Useful contraction FLOPs (what TFLOP/s figures count); a causal mask counts half."""
        total = 0.0
        mask = next((op.causal for op in self.ops if op.causal), None)
        for op in self.ops:
            if op.kind in ("contract", "softmax_contract"):
                w = op.works[0]
                n = w.per_point * math.prod(self.sizes[a] for a in w.axes)
                total += n * (0.5 if mask and all(a in w.axes for a in mask) else 1.0)
        return total

    def splittable(self, axis: str) -> bool:
        """Can `axis` be streamed (or split across units) in one pass? Every reduction over it must
        have an accumulator, and nothing computed from a reduced result may use the axis again
        (layernorm's normalize step does: it needs the whole row's statistics first)."""
        for op in self.ops:
            if axis in op.reduced:
                if op.accumulator is None:
                    return False
                if any(axis in later.axes for later in self._downstream(op.output)):
                    return False
        return True

    def _downstream(self, name: str) -> list:
        seen, frontier, found = set(), [name], []
        while frontier:
            n = frontier.pop()
            for op in self.consumers(n):
                if op.name not in seen:
                    seen.add(op.name)
                    found.append(op)
                    frontier.append(op.output)
        return found

    def reduced_axes(self) -> set:
        return {a for op in self.ops for a in op.reduced}

    def describe(self) -> str:
        lines = [f"diagram {self.name}: " + ", ".join(f"{a}={n}" for a, n in self.sizes.items())]
        for arr in self.inputs():
            lines.append(f"  input  {arr.name}[{','.join(arr.axes)}] {arr.dtype}")
        for op in self.ops:
            out = self.arrays[op.output]
            red = f"  reduce {','.join(op.reduced)} ({op.accumulator or 'whole axis'})" if op.reduced else ""
            lines.append(f"  {op.kind:<16} {out.name}[{','.join(out.axes)}] = {op.label}{red}")
        lines.append(f"  output {', '.join(self.outputs)}")
        lines += [f"  rewrite: {r}" for r in self.rewrites]
        return "\n".join(lines)


def compose(first: Diagram, second: Diagram, connect: dict, name: str | None = None) -> Diagram:
    """Feed outputs of `first` into inputs of `second`: connect = {second_input: first_output}.
    Shared axis names must have equal sizes."""
    for a, n in second.sizes.items():
        if a in first.sizes and first.sizes[a] != n:
            raise ShapeMismatchError(f"compose: axis {a!r} is {first.sizes[a]} in {first.name!r} "
                                     f"but {n} in {second.name!r}")
    for dst, src in connect.items():
        if dst not in second.arrays or second.arrays[dst].role != "input":
            raise KeyError(f"compose: {dst!r} is not an input of {second.name!r}")
        if src not in first.arrays:
            raise KeyError(f"compose: {src!r} is not an array of {first.name!r}")
        if tuple(second.arrays[dst].axes) != tuple(first.arrays[src].axes):
            raise ShapeMismatchError(f"compose: {src}{first.arrays[src].axes} cannot feed "
                                     f"{dst}{second.arrays[dst].axes}")
    out = Diagram(name or f"{first.name}+{second.name}", **{**first.sizes, **second.sizes})
    out.woven = list(dict.fromkeys(first.woven + second.woven))
    first.replay(out)
    out.outputs = [o for o in out.outputs if o not in connect.values()]
    # the recipe too, so that replaying the composed diagram (with_sizes, weave, rewrites) keeps them internal
    out.recipe = [(m, tuple(a for a in args if a not in connect.values()), k) if m == "output" else (m, args, k)
                  for m, args, k in out.recipe]
    second.replay(out, rename=dict(connect))
    return out


def segment(d: Diagram, start: int, stop: int) -> Diagram:
    """The ops d.ops[start:stop] as their own kernel: arrays made earlier are read from HBM, arrays
    used later (or outputs) are written to it."""
    ops = d.ops[start:stop]
    made = {op.output for op in ops}
    later = {i for op in d.ops[stop:] for i in op.inputs}
    sub = Diagram(f"{d.name}[{ops[0].name}..{ops[-1].name}]" if len(ops) > 1 else f"{d.name}[{ops[0].name}]",
                  **d.sizes)
    sub.woven = list(d.woven)
    for op in ops:
        for i in op.inputs:
            if i not in made and i not in sub.arrays:
                arr = d.arrays[i]
                sub.arrays[i] = Array(arr.name, arr.axes, arr.dtype,
                                      "constant" if arr.role == "constant" else "input")
        sub.arrays[op.output] = d.arrays[op.output]
        sub.ops.append(op)
    sub.outputs = [o for o in made if o in d.outputs or o in later]
    sub.outputs.sort(key=lambda o: [op.output for op in ops].index(o))
    return sub
