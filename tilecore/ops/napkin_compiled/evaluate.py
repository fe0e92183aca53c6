"""A diagram's float64 evaluation (torch CPU ops): every op as its definition says, nothing fused.

contract: an einsum over the op's axes; map: the map's expression (napkin.compile.map_expression) on
its inputs broadcast over its axes; reduce: sum, mean or max; softmax_contract: softmax along the
streamed axis (a causal mask drops keys after the query) then the contraction; fuse_epilogue ops: their
contractions, then their maps. Accepts the arrays by name with their axes' sizes, on any one device.
"""
from __future__ import annotations

import ast

import torch

from tilecore.napkin.compile import CompileError, map_expression
from tilecore.napkin.diagram import Diagram

FUNCTIONS = {"exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
             "sigmoid": torch.sigmoid, "tanh": torch.tanh, "abs": torch.abs, "maximum": torch.maximum,
             "minimum": torch.minimum,
             # the exact tanh: the kernel's tanh.approx.f32 differs by up to compile.TANH_APPROX_ERROR relative
             "tanh_approx": torch.tanh}


def _letters(axes_lists):
    names = list(dict.fromkeys(a for axes in axes_lists for a in axes))
    if len(names) > 52:
        raise CompileError("more than 52 axes")
    return {a: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[i] for i, a in enumerate(names)}


def _broadcast(t: torch.Tensor, axes: tuple, target: tuple) -> torch.Tensor:
    """t over `axes` viewed over `target` (axes it lacks become size-1 dims)."""
    perm = [axes.index(a) for a in target if a in axes]
    t = t.permute(perm) if perm else t
    shape = []
    it = iter(t.shape)
    for a in target:
        shape.append(next(it) if a in axes else 1)
    return t.reshape(shape)


def _map(fn, values, target):
    expr = map_expression(fn)
    env = dict(FUNCTIONS)
    env.update({"abcdefgh"[i]: v for i, v in enumerate(values)})

    def maximum(x, y):  # numbers allowed as either argument
        x = x if torch.is_tensor(x) else torch.tensor(x, dtype=torch.float64)
        y = y if torch.is_tensor(y) else torch.tensor(y, dtype=torch.float64)
        return torch.maximum(x, y)
    env["maximum"], env["minimum"] = maximum, lambda x, y: -maximum(-x, -y)
    out = eval(compile(ast.parse(expr, mode="eval"), "<map>", "eval"), {"__builtins__": {}}, env)
    if not torch.is_tensor(out):
        out = torch.tensor(out, dtype=torch.float64)
    return out.expand(list(target))


def _contract(vals, axes_of, ins, out_axes):
    letters = _letters([axes_of[i] for i in ins] + [out_axes])
    spec = ",".join("".join(letters[a] for a in axes_of[i]) for i in ins) + "->" + "".join(letters[a] for a in out_axes)
    return torch.einsum(spec, *[vals[i] for i in ins])


def evaluate(d: Diagram, inputs: dict) -> dict:
    """float64 outputs by name. `inputs`: every input array by name, shaped as its axes."""
    vals, axes_of = {}, {}
    for arr in d.arrays.values():
        if arr.role in ("input", "constant"):
            if arr.name not in inputs:
                raise KeyError(f"evaluate: input {arr.name!r} missing; inputs: {', '.join(a.name for a in d.inputs())}")
            t = inputs[arr.name].detach().to(torch.float64)  # on its device (a GPU's float64 is fast enough)
            want = tuple(d.sizes[a] for a in arr.axes)
            if tuple(t.shape) != want:
                raise ValueError(f"evaluate: {arr.name} has shape {tuple(t.shape)}, its axes {arr.axes} say {want}")
            vals[arr.name], axes_of[arr.name] = t, arr.axes
    recipe = {k.get("name"): (m, k) for m, _, k in d.recipe}
    for op in d.ops:
        out_axes = d.arrays[op.output].axes
        sizes = tuple(d.sizes[a] for a in op.axes)
        if op.kind == "contract" and recipe.get(op.name, ("",))[0] == "fuse_epilogue":
            _, kw = recipe[op.name]
            local_vals, local_axes = dict(vals), dict(axes_of)
            for c in kw["contractions"]:
                local_vals[c["name"]] = _contract(local_vals, local_axes, c["inputs"], out_axes)
                local_axes[c["name"]] = out_axes
            for m in kw["maps"]:
                target = tuple(d.sizes[a] for a in out_axes)
                local_vals[m["name"]] = _map(m["fn"], [_broadcast(local_vals[i], local_axes[i], out_axes)
                                                      for i in m["inputs"]], target)
                local_axes[m["name"]] = out_axes
            vals[op.output] = local_vals[op.name]
        elif op.kind == "contract":
            vals[op.output] = _contract(vals, axes_of, op.inputs, out_axes)
        elif op.kind == "map":
            vals[op.output] = _map(op.label, [_broadcast(vals[i], axes_of[i], op.axes) for i in op.inputs], sizes)
        elif op.kind == "reduce":
            x = _broadcast(vals[op.inputs[0]], axes_of[op.inputs[0]], op.axes)
            dims = [op.axes.index(a) for a in op.reduced]
            kind = op.label.split()[0]
            if kind == "sum":
                r = x.sum(dims)
            elif kind == "mean":
                r = x.mean(dims)
            elif kind == "max":
                r = x.amax(dims)
            else:
                raise CompileError(f"evaluate: reduce {op.name!r} ({op.label}): sum, mean or max")
            kept = tuple(a for a in op.axes if a not in op.reduced)
            vals[op.output] = _broadcast(r, kept, out_axes).reshape([d.sizes[a] for a in out_axes])
        elif op.kind == "softmax_contract":
            s_name, v_name = op.inputs
            over = op.reduced[0]
            s = vals[s_name]
            s_axes = axes_of[s_name]
            if op.causal:
                qa, xa = op.causal
                qi = torch.arange(d.sizes[qa], device=s.device).reshape([-1 if a == qa else 1 for a in s_axes])
                xi = torch.arange(d.sizes[xa], device=s.device).reshape([-1 if a == xa else 1 for a in s_axes])
                s = s.masked_fill(xi > qi, float("-inf"))
            p = torch.softmax(s, dim=s_axes.index(over))
            tmp = dict(vals)
            tmp["__p"] = p
            ax = dict(axes_of)
            ax["__p"] = s_axes
            vals[op.output] = _contract(tmp, ax, ["__p", v_name], out_axes)
        else:
            raise CompileError(f"evaluate: op kind {op.kind!r}")
        axes_of[op.output] = out_axes
    return {o: vals[o] for o in d.outputs}
