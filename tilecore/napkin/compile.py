"""napkin.compile(diagram): the fused plan of a diagram emitted as Triton source (text; pure Python).

Three families, matched from the diagram's ops (after the planner's rewrites, rewrite.py):

  chain      contraction stages X W_0, X W_1, ... sharing the row operand, an elementwise epilogue on
             the accumulators, stage after stage (gated MLP: G = silu(X W1) * (X W3), then Y = G W2):
             one kernel a stage, each intermediate written once in its own dtype
  attention  S = Q K^T, elementwise score modifiers (softcap, scale, sigmoid), then the streamed
             softmax . V (the online softmax) or a plain streamed contraction P V (sigmoid attention);
             leading batch / head axes shared by Q, K and V; a causal mask
  rownorm    a row reduction over the contracted axis (RMSNorm's mean of squares), maps on the row
             statistics, the normalized operand made in registers and contracted with a weight
             (RMSNorm then GEMM): two passes over the row, nothing written between them

compile() returns a Program: the source, and per kernel what run() needs to launch it (the arrays in
argument order, the family, its axes). Running it is tilecore.ops.napkin_compiled.run (it imports
triton); the float64 evaluation of a diagram is tilecore.ops.napkin_compiled.evaluate.

Elementwise maps need semantics: map_expression(fn) turns a map's `fn` into an expression over its
inputs a, b, c, ...: the names in ELEMENTWISE, softcap(C), scale(C), or an expression of a, b, c, ...
with exp, log, sqrt, rsqrt, sigmoid, tanh, abs, maximum, minimum and numbers.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from .diagram import Diagram
from .rewrite import fuse_epilogues, online_softmax

ELEMENTWISE = {
    "identity": "a", "add": "a + b", "mul": "a * b", "sub": "a - b", "div": "a / b",
    "silu": "a * sigmoid(a)", "sigmoid": "sigmoid(a)", "tanh": "tanh(a)", "exp": "exp(a)",
    "relu": "maximum(a, 0.0)", "square": "a * a", "rsqrt": "rsqrt(a)",
    "gelu": "0.5 * a * (1.0 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))",  # tanh form
    "x*inv*w": "a * b * c",
}
FUNCTIONS = ("exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "abs", "maximum", "minimum")
# how the emitted Triton source spells each function (tanh through sigmoid: libdevice does not run in
# the interpreter, and 2 sigmoid(2x) - 1 is accurate to fp32 rounding)
TRITON_FUNCTIONS = {"exp": "tl.exp", "log": "tl.log", "sqrt": "tl.sqrt", "rsqrt": "tl.rsqrt",
                    "sigmoid": "tl.sigmoid", "tanh": "_tanh", "abs": "tl.abs", "maximum": "tl.maximum",
                    "minimum": "tl.minimum"}
PLACEHOLDERS = "abcdefgh"
TL_DTYPES = {"fp16": "tl.float16", "bf16": "tl.bfloat16", "fp32": "tl.float32"}


class CompileError(ValueError):
    """The diagram is outside the families compile() emits; the message says which and why."""


def map_expression(fn: str) -> str:
    """A map's fn -> an expression over a, b, c, ... (raises CompileError naming what is accepted)."""
    fn = fn.strip()
    if fn in ELEMENTWISE:
        return ELEMENTWISE[fn]
    m = re.fullmatch(r"softcap\(\s*([0-9.eE+-]+)\s*\)", fn)
    if m:
        return f"{float(m.group(1))!r} * tanh(a / {float(m.group(1))!r})"
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
                           f"scale(C), or an expression of a, b, c, ... with {', '.join(FUNCTIONS)}")
    return fn


def triton_expression(fn: str, args: list) -> str:
    """The map as Triton source over the variables `args` (a -> args[0], ...)."""
    tree = ast.parse(map_expression(fn), mode="eval")

    class Sub(ast.NodeTransformer):
        def visit_Name(self, node):
            if node.id in PLACEHOLDERS:
                i = PLACEHOLDERS.index(node.id)
                if i >= len(args):
                    raise CompileError(f"map {fn!r} uses {node.id!r} but has {len(args)} input(s)")
                return ast.copy_location(ast.Name(args[i], ast.Load()), node)
            return ast.copy_location(ast.Name(TRITON_FUNCTIONS[node.id], ast.Load()), node)
    return "(" + ast.unparse(Sub().visit(tree)) + ")"


def _substituted(node, args) -> str:
    class Sub(ast.NodeTransformer):
        def visit_Name(self, nd):
            if nd.id in PLACEHOLDERS:
                return ast.copy_location(ast.Name(args[PLACEHOLDERS.index(nd.id)], ast.Load()), nd)
            return ast.copy_location(ast.Name(TRITON_FUNCTIONS[nd.id], ast.Load()), nd)
    import copy
    return "(" + ast.unparse(Sub().visit(copy.deepcopy(node))) + ")"


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


@dataclass
class KernelSpec:
    name: str              # the function in the source
    family: str            # chain | attention | rownorm
    args: list             # diagram array names in pointer-argument order (output last)
    info: dict = field(default_factory=dict)


@dataclass
class Program:
    diagram: Diagram       # the rewritten diagram compiled
    family: str
    source: str
    kernels: list
    intermediates: list    # arrays written between kernels (names)

    def __str__(self):
        return self.source


HEADER = '''# generated by tilecore.napkin.compile from diagram {name!r} ({family})
import triton
import triton.language as tl


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0
'''


def _var(name: str) -> str:
    return "v_" + re.sub(r"\W", "_", name)


def compile(diagram: Diagram) -> Program:
    """Emit Triton source for the diagram's fused plan (see the module docstring for the families)."""
    errors = []
    for family in (_attention, _rownorm, _chain):
        try:
            return family(diagram)
        except CompileError as e:
            errors.append(f"{family.__name__[1:]}: {e}")
    raise CompileError(f"diagram {diagram.name!r} matches no family compile() emits:\n  " + "\n  ".join(errors))


# ------------------------------------------------------------------------------------ chain
def _stages(d: Diagram) -> list:
    """(output, contractions [(name, [A, W])], maps [(fn, inputs, name)], dtype) a stage, in order."""
    out = []
    for op in d.ops:
        if op.kind != "contract" or len(op.reduced) != 1:
            raise CompileError(f"op {op.name!r} ({op.kind}) is not a contraction over one axis with an epilogue")
        entry = next((e for e in d.recipe if e[2].get("name") == op.name), None)
        if entry and entry[0] == "fuse_epilogue":
            cons = [(c["name"], list(c["inputs"])) for c in entry[2]["contractions"]]
            maps = [(m["fn"], list(m["inputs"]), m["name"]) for m in entry[2]["maps"]]
        else:
            cons, maps = [(op.name, list(op.inputs))], []
        out.append((op.name, cons, maps, d.arrays[op.output].dtype))
    return out


def _chain(d: Diagram) -> Program:
    d = fuse_epilogues(d)
    if d.woven:
        raise CompileError(f"woven axes {d.woven} (batch): the chain family takes 2-D operands")
    stages = _stages(d)
    src, kernels, inter = [HEADER.format(name=d.name, family="chain")], [], []
    for i, (name, cons, maps, dtype) in enumerate(stages):
        A = cons[0][1][0]
        a_axes = d.arrays[A].axes
        if len(a_axes) != 2 or any(c[1][0] != A or len(c[1]) != 2 for c in cons):
            raise CompileError(f"stage {name!r}: every contraction must be A[t, k] . W[k, n] with one shared A")
        t, k = a_axes
        f = None
        for _, (_, W) in cons:
            w_axes = d.arrays[W].axes
            if len(w_axes) != 2 or w_axes[0] != k:
                raise CompileError(f"stage {name!r}: weight {W}{w_axes} must be [{k}, n]")
            if f not in (None, w_axes[1]):
                raise CompileError(f"stage {name!r}: weights with different output axes")
            f = w_axes[1]
        made = {c[0] for c in cons} | {m[2] for m in maps}
        extras = []
        for _, ins, _ in maps:
            for x in ins:
                if x not in made and x not in extras:
                    if not set(d.arrays[x].axes) <= {t, f}:
                        raise CompileError(f"stage {name!r}: epilogue input {x}{d.arrays[x].axes} is not over ({t}, {f})")
                    extras.append(x)
        ws = [W for _, (_, W) in cons]
        kname = f"stage_{i}{_var(name)[1:]}"
        params = ["A"] + [f"W{j}" for j in range(len(ws))] + [f"E{j}" for j in range(len(extras))] + ["OUT", "M", "N", "K",
                  "stride_am", "stride_ak"] + [f"stride_w{j}k, stride_w{j}n" for j in range(len(ws))] + \
            [f"stride_e{j}m, stride_e{j}n" for j in range(len(extras))] + ["stride_om", "stride_on",
                                                                            "BM: tl.constexpr", "BN: tl.constexpr",
                                                                            "BK: tl.constexpr", "GROUP: tl.constexpr"]
        for tma in (False, True):
            src.append("\n".join(_chain_kernel(d, kname + ("_tma" if tma else ""), params, A, ws, cons, maps, extras,
                                                name, dtype, t, k, f, tma)))
        kernels.append(KernelSpec(kname, "chain", [A] + ws + extras + [name],
                                  {"axes": (t, k, f), "extras": {x: d.arrays[x].axes for x in extras}}))
        if name not in d.outputs:
            inter.append(name)
    return Program(d, "chain", "\n".join(src) + "\n", kernels, inter)


def _chain_kernel(d, kname, params, A, ws, cons, maps, extras, name, dtype, t, k, f, tma):
    """One chain stage's kernel; tma: A and W are host tensor descriptors (TMA loads, bounds zero-filled
    by the hardware), else pointers with masks."""
    L = ["", "", "@triton.jit", f"def {kname}({', '.join(params)}):",
         f"    # A: [{t}={'M'}, {k}=K] {d.arrays[A].dtype}; W_j: [K, {f}=N]; OUT: [M, N] {dtype} = "
         f"epilogue(A W_0, A W_1, ...) ({name})",
         "    pid = tl.program_id(0)",
         "    num_m = tl.cdiv(M, BM)",
         "    num_n = tl.cdiv(N, BN)",
         "    group = GROUP * num_n  # GROUP row tiles share their W columns in L2",
         "    first_m = (pid // group) * GROUP",
         "    size_m = tl.minimum(num_m - first_m, GROUP)",
         "    pid_m = first_m + (pid % group) % size_m",
         "    pid_n = (pid % group) // size_m",
         "    rm = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)",
         "    rn = (pid_n * BN + tl.arange(0, BN)).to(tl.int64)",
         "    rk = tl.arange(0, BK).to(tl.int64)"]
    L += [f"    acc{j} = tl.zeros((BM, BN), dtype=tl.float32)" for j in range(len(ws))]
    L += ["    for k0 in range(0, K, BK):"]
    if tma:
        L += ["        a = A.load([pid_m * BM, k0])"]
        for j in range(len(ws)):
            L += [f"        w{j} = W{j}.load([k0, pid_n * BN])", f"        acc{j} = tl.dot(a, w{j}, acc{j})"]
    else:
        L += ["        kk = k0 + rk",
              "        a = tl.load(A + rm[:, None] * stride_am + kk[None, :] * stride_ak, "
              "mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)"]
        for j in range(len(ws)):
            L += [f"        w{j} = tl.load(W{j} + kk[:, None] * stride_w{j}k + rn[None, :] * stride_w{j}n, "
                  "mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)",
                  f"        acc{j} = tl.dot(a, w{j}, acc{j})"]
    L += [f"    {_var(c[0])} = acc{j}" for j, c in enumerate(cons)]
    for j, x in enumerate(extras):
        ax = d.arrays[x].axes
        off = " + ".join(([f"rm[:, None] * stride_e{j}m"] if t in ax else []) +
                         ([f"rn[None, :] * stride_e{j}n"] if f in ax else []))
        msk = " & ".join(([f"(rm[:, None] < M)"] if t in ax else []) + ([f"(rn[None, :] < N)"] if f in ax else []))
        L.append(f"    {_var(x)} = tl.load(E{j} + {off}, mask={msk}, other=0.0).to(tl.float32)")
    for fn, ins, out in maps:
        L.append(f"    {_var(out)} = {triton_expression(fn, [_var(x) for x in ins])}")
    L.append(f"    tl.store(OUT + rm[:, None] * stride_om + rn[None, :] * stride_on, "
             f"{_var(name)}.to(OUT.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))")
    return L


# ------------------------------------------------------------------------------------ attention
def _attention(d: Diagram) -> Program:
    d = online_softmax(d)
    ops = d.ops
    if len(ops) < 2 or ops[0].kind != "contract":
        raise CompileError("not S = Q . K, modifiers, then softmax . V or P . V")
    S = ops[0]
    last = ops[-1]
    mods = ops[1:-1]
    if last.kind == "softmax_contract":
        softmax = True
        x = last.reduced[0]
    elif last.kind == "contract" and len(last.reduced) == 1:
        softmax = False
        x = last.reduced[0]
    else:
        raise CompileError(f"last op {last.name!r} is {last.kind}, not softmax_contract or a contraction over keys")
    chain = [S.output]
    for op in mods:
        if op.kind != "map" or list(op.inputs) != [chain[-1]]:
            raise CompileError(f"op {op.name!r}: score modifiers must be one-input maps of the scores in a chain")
        chain.append(op.output)
    if len(S.inputs) != 2 or chain[-1] not in last.inputs:
        raise CompileError("the last op must consume the (modified) scores")
    Q, K = S.inputs
    V = next(i for i in last.inputs if i != chain[-1])
    qa, ka, va, oa = (d.arrays[n].axes for n in (Q, K, V, last.output))
    lead = qa[:-2]
    if len(lead) > 2 or ka[:-2] != lead or va[:-2] != lead or oa[:-2] != lead:
        raise CompileError(f"Q{qa}, K{ka}, V{va} must share their leading (batch, head) axes, at most two; "
                           "grouped-query broadcast is not emitted")
    q, dd = qa[-2:]
    if ka[-2:] != (x, dd) or va[-2] != x or S.reduced != (dd,) or d.arrays[S.output].axes[-2:] != (q, x):
        raise CompileError(f"expected Q[..., q, d], K[..., {x}, d], V[..., {x}, e]; got Q{qa}, K{ka}, V{va}")
    e = va[-1]
    for ax, what in ((dd, "d"), (e, "e")):
        n = d.sizes[ax]
        if n < 16 or n & (n - 1):
            raise CompileError(f"head dim {what} = {n}: the emitted kernel takes powers of two >= 16")
    causal = bool(last.causal) if softmax else False
    # a trailing positive scale(c) folds into the softmax's exp2: p = exp2(s c log2(e) - m), one FMA an
    # element instead of a multiply, a subtract and exp's own multiply
    qk_scale = 1.4426950408889634
    emitted = list(mods)
    if softmax and mods:
        m = re.fullmatch(r"scale\(\s*([0-9.eE+-]+)\s*\)", mods[-1].label.strip())
        if m and float(m.group(1)) > 0:
            qk_scale *= float(m.group(1))
            emitted = mods[:-1]
    s_in = _var(emitted[-1].output) if emitted else _var(S.output)

    def emit(tma: bool) -> list:
      lines = ["", "",
               "@triton.jit",
               "def attention_fwd" + ("_tma" if tma else "") + "(Q, K, V, O, H, NQ, NX, sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, sve,",
               "                  sob, soh, som, soe, D: tl.constexpr, E: tl.constexpr, BM: tl.constexpr,",
               "                  BN: tl.constexpr, CAUSAL: tl.constexpr, EVEN_Q: tl.constexpr, EVEN_X: tl.constexpr):",
               f"    # Q: [B, H, NQ, D], K: [B, H, NX, D], V: [B, H, NX, E] -> O: [B, H, NQ, E]; "
               f"{'softmax' if softmax else 'plain sum'} over the keys, streamed. EVEN_*: no bounds masks",
               "    pid_m = tl.program_id(0)",
               "    bh = tl.program_id(1)",
               "    b = (bh // H).to(tl.int64)",
               "    h = (bh % H).to(tl.int64)",
               "    rm = pid_m * BM + tl.arange(0, BM)",
               "    rd = tl.arange(0, D)",
               "    re_ = tl.arange(0, E)",
               ] + (["    q = Q.load([bh, pid_m * BM, 0]).reshape(BM, D)  # TMA: [B*H, NQ, D], zero past NQ"] if tma else [
               "    q_ptr = Q + b * sqb + h * sqh + rm[:, None].to(tl.int64) * sqm + rd[None, :] * sqd",
               "    if EVEN_Q:",
               "        q = tl.load(q_ptr)",
               "    else:",
               "        q = tl.load(q_ptr, mask=rm[:, None] < NQ, other=0.0)"]) + [
               ] + ([] if tma else ["    k_base = K + b * skb + h * skh", "    v_base = V + b * svb + h * svh"]) + [
               "    acc = tl.zeros((BM, E), dtype=tl.float32)",
               "    m_i = tl.full((BM,), float('-inf'), dtype=tl.float32)",
               "    l_i = tl.zeros((BM,), dtype=tl.float32)"]

      def body(masked: bool, causal_tile: bool) -> list:
          """One key tile: scores, modifiers, masks, the accumulator update (8 spaces in)."""
          out = ["        rn = n0 + tl.arange(0, BN)",
                 "        k_ptr = k_base + rn[:, None].to(tl.int64) * skn + rd[None, :] * skd",
                 "        v_ptr = v_base + rn[:, None].to(tl.int64) * svn + re_[None, :] * sve"]
          if tma:  # the descriptors are [B*H, NX, D]: zero past NX, never the next head's keys
              out = ["        rn = n0 + tl.arange(0, BN)",
                     "        k = K.load([bh, n0, 0]).reshape(BN, D)",
                     "        v = V.load([bh, n0, 0]).reshape(BN, E)"]
          elif masked:
              out += ["        k = tl.load(k_ptr, mask=rn[:, None] < NX, other=0.0)",
                      "        v = tl.load(v_ptr, mask=rn[:, None] < NX, other=0.0)"]
          else:
              out += ["        k = tl.load(k_ptr)", "        v = tl.load(v_ptr)"]
          out.append(f"        {_var(S.output)} = tl.dot(q, tl.trans(k))  # [BM, BN] fp32")
          out += [f"        {_var(op.output)} = {triton_expression(op.label, [_var(op.inputs[0])])}" for op in emitted]
          s = s_in if softmax else _var(chain[-1])
          conds = (["(rn[None, :] < NX)"] if masked else []) + (["(rn[None, :] <= rm[:, None])"] if causal_tile else [])
          fill = "float('-inf')" if softmax else "0.0"
          if conds:
              out.append(f"        s = tl.where({' & '.join(conds)}, {s}, {fill})")
          else:
              out.append(f"        s = {s}")
          if softmax:
              out += [f"        m_new = tl.maximum(m_i, tl.max(s, 1) * {qk_scale!r})  # the running max, log2 units",
                      "        # a row with no key yet keeps m = -inf: shift by 0 there, not by -inf (no NaN)",
                      "        shift = tl.where(m_new == float('-inf'), 0.0, m_new)",
                      f"        p = tl.exp2(s * {qk_scale!r} - shift[:, None])",
                      "        alpha = tl.exp2(m_i - shift)",
                      "        l_i = l_i * alpha + tl.sum(p, 1)",
                      "        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])",
                      "        m_i = m_new"]
          else:
              out += ["        acc = tl.dot(s.to(v.dtype), v, acc)"]
          return out
      lines += ["    if CAUSAL:",
                "        # keys before the tile's first query are seen by every row: no mask there; the diagonal",
                "        # tiles (and a ragged last tile) take the masks",
                "        lo = tl.minimum((pid_m * BM) // BN * BN, NX // BN * BN)",
                "        hi = tl.minimum(NX, (pid_m + 1) * BM)",
                "        for n0 in range(0, lo, BN):"]
      lines += ["    " + ln for ln in body(False, False)]
      lines += ["        for n0 in range(lo, hi, BN):"]
      lines += ["    " + ln for ln in body(True, True)]
      lines += ["    else:",
                "        if EVEN_X:",
                "            for n0 in range(0, NX, BN):"]
      lines += ["        " + ln for ln in body(False, False)]
      lines += ["        else:",
                "            for n0 in range(0, NX, BN):"]
      lines += ["        " + ln for ln in body(True, False)]
      lines += ["    out = acc / l_i[:, None]" if softmax else "    out = acc",
                "    o_ptr = O + b * sob + h * soh + rm[:, None].to(tl.int64) * som + re_[None, :] * soe",
                "    if EVEN_Q:",
                "        tl.store(o_ptr, out.to(O.dtype.element_ty))",
                "    else:",
                "        tl.store(o_ptr, out.to(O.dtype.element_ty), mask=rm[:, None] < NQ)"]
      return lines

    lines = [HEADER.format(name=d.name, family="attention")] + emit(False) + emit(True)
    spec = KernelSpec("attention_fwd", "attention", [Q, K, V, last.output],
                      {"lead": lead, "q": q, "x": x, "d": dd, "e": e, "causal": causal, "softmax": softmax})
    return Program(d, "attention", "\n".join(lines) + "\n", [spec], [])


# ------------------------------------------------------------------------------------ rownorm
def _rownorm(d: Diagram) -> Program:
    ops = d.ops
    if not ops or ops[-1].kind != "contract" or len(ops[-1].reduced) != 1:
        raise CompileError("the last op must be a contraction over one axis")
    last = ops[-1]
    n = last.reduced[0]
    red = [op for op in ops[:-1] if op.kind == "reduce"]
    if len(red) != 1 or red[0].reduced != (n,):
        raise CompileError(f"expected one row reduction over {n!r} before the contraction")
    R = red[0]
    kind = R.label.split()[0]
    if kind not in ("sum", "mean", "max"):
        raise CompileError(f"reduction {R.name!r} ({R.label}): sum, mean or max")
    Y, P = last.inputs
    X = next((a for a in d.inputs() if len(a.axes) == 2 and a.axes[1] == n), None)
    if X is None or d.arrays[P].axes != (n, d.arrays[last.output].axes[-1]) or d.woven:
        raise CompileError(f"expected X[t, {n}] and a weight [{n}, o]")
    t = X.axes[0]
    o = d.arrays[P].axes[1]
    tile_ops, row_ops = [], []
    for op in ops[:-1]:
        if op is R:
            continue
        if op.kind != "map":
            raise CompileError(f"op {op.name!r} ({op.kind}): only maps around the one reduction")
        axes = set(d.arrays[op.output].axes)
        if axes == {t, n}:
            tile_ops.append(op)
        elif axes == {t}:
            row_ops.append(op)
        else:
            raise CompileError(f"map {op.name!r} over {tuple(axes)}: maps are over ({t}, {n}) or ({t},)")
    vecs = [a.name for a in d.inputs() if a.axes == (n,)]
    rows = [a.name for a in d.inputs() if a.axes == (t,)]
    others = [a.name for a in d.inputs() if a.name not in vecs + rows + [X.name, P]]
    if others:
        raise CompileError(f"inputs {others}: rownorm takes X[t, n], vectors [n], [t] and the weight")
    after_stats = set()  # tile ops that need the row statistics (pass 2 only)
    stat_names = {R.output} | {op.output for op in row_ops}
    for op in tile_ops:
        if any(i in stat_names or i in after_stats for i in op.inputs):
            after_stats.add(op.output)
    if R.inputs[0] in after_stats:
        raise CompileError("the reduction's input needs its own statistics")
    # one pass where the statistics enter the contraction's operand only as a row factor (RMSNorm):
    # Z = rowfactor[t] * (tile part . P), the factor applied to the accumulator after the loop
    y_op = next((op for op in tile_ops if op.output == Y), None)
    split = None
    if y_op is not None and all(op is y_op or op.output not in after_stats for op in tile_ops):
        split = row_factor_split(y_op.label, list(y_op.inputs), stat_names | set(rows))
    # where the tile part is X itself times vector factors (RMSNorm's x * w), the factors go into the
    # weight first (P' = w[:, None] * P, one pass over P): both MMA operands then come straight from
    # memory. An operand made by ALU instructions in the loop makes ptxas serialize the wgmma (C7515).
    prescale = None
    if split:
        def names(f):
            return {y_op.inputs[PLACEHOLDERS.index(nd.id)] for nd in ast.walk(f)
                    if isinstance(nd, ast.Name) and nd.id in PLACEHOLDERS}
        x_f = [f for f in split[0] if names(f) == {X.name}]
        v_f = [f for f in split[0] if names(f) <= set(vecs)]
        if len(x_f) == 1 and isinstance(x_f[0], ast.Name) and len(x_f) + len(v_f) == len(split[0]) and v_f:
            prescale = v_f
    params = ["X"] + [f"VN{j}" for j in range(len(vecs))] + [f"VT{j}" for j in range(len(rows))] + \
        ["P", "OUT", "M", "N", "NO", "stride_xm", "stride_xn", "stride_pn", "stride_po", "stride_om", "stride_oo",
         "BM: tl.constexpr", "BO: tl.constexpr", "BK: tl.constexpr", "GROUP: tl.constexpr"]

    def emit(tma: bool) -> list:
      L = ["", "", "@triton.jit",
           f"def rownorm_gemm{'_tma' if tma else ''}({', '.join(params)}):",
           f"    # X: [{t}=M, {n}=N] -> row statistic over N ({R.label}) -> operand [M, N] -> OUT = operand . P[N, {o}=NO]"
           + ("; one pass: the statistic is a row factor of the operand, applied to the accumulator" if split else
              "; two passes over the row"),
           "    pid = tl.program_id(0)",
           "    num_m = tl.cdiv(M, BM)",
           "    num_o = tl.cdiv(NO, BO)",
           "    group = GROUP * num_o  # GROUP row tiles run together: their X rows and P's columns stay in L2",
           "    first_m = (pid // group) * GROUP",
           "    size_m = tl.minimum(num_m - first_m, GROUP)",
           "    pid_m = first_m + (pid % group) % size_m",
           "    pid_o = (pid % group) // size_m",
           "    rm = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)",
           "    ro = (pid_o * BO + tl.arange(0, BO)).to(tl.int64)",
           "    rk = tl.arange(0, BK).to(tl.int64)"]
      for j, v in enumerate(rows):
          L.append(f"    {_var(v)} = tl.load(VT{j} + rm, mask=rm < M, other=0.0).to(tl.float32)[:, None]")
      init = "float('-inf')" if kind == "max" else "0.0"
      src = _var(R.inputs[0])

      def loads():
          out = ["        kk = k0 + rk",
                 "        inb = (rm[:, None] < M) & (kk[None, :] < N)",
                 ("        x_raw = X.load([pid_m * BM, k0])  # TMA: zero past the bounds" if tma else
                  "        x_raw = tl.load(X + rm[:, None] * stride_xm + kk[None, :] * stride_xn, mask=inb, other=0.0)"),
                 f"        {_var(X.name)} = x_raw.to(tl.float32)"]
          out += [f"        {_var(v)} = tl.load(VN{j} + kk, mask=kk < N, other=0.0).to(tl.float32)[None, :]"
                  for j, v in enumerate(vecs)]
          return out

      def accumulate_stat():
          if kind == "max":
              return [f"        stat = tl.maximum(stat, tl.max(tl.where(inb, {src}, float('-inf')), 1)[:, None])"]
          return [f"        stat += tl.sum(tl.where(inb, {src}, 0.0), 1)[:, None]"]

      def finish_stat():
          out = ["    stat = tl.where(rm[:, None] < M, stat, 1.0)  # rows past M: a finite statistic (masked at the store)",
                 f"    {_var(R.output)} = stat" + (" / N" if kind == "mean" else "")]
          out += [f"    {_var(op.output)} = {triton_expression(op.label, [_var(i) for i in op.inputs])}" for op in row_ops]
          return out
      w_load = ("        w = P.load([k0, pid_o * BO])" if tma else
                "        w = tl.load(P + kk[:, None] * stride_pn + ro[None, :] * stride_po, "
                "mask=(kk[:, None] < N) & (ro[None, :] < NO), other=0.0)")
      L += [f"    stat = tl.full((BM, 1), {init}, dtype=tl.float32)", "    acc = tl.zeros((BM, BO), dtype=tl.float32)"]
      if split:
          tile_f, row_f = split
          args = [_var(i) for i in y_op.inputs]
          L += ["    for k0 in range(0, N, BK):  # one pass: the statistic and the contraction of the tile part"]
          L += loads()
          L += [f"        {_var(op.output)} = {triton_expression(op.label, [_var(i) for i in op.inputs])}"
                for op in tile_ops if op is not y_op]
          L += accumulate_stat()
          if prescale:  # the weight was scaled by the vector factors: x straight into the MMA
              L += [w_load, "        acc = tl.dot(x_raw, w, acc)"]
          else:
              L += [f"        part = {' * '.join(_substituted(f, args) for f in tile_f)}", w_load,
                    "        acc = tl.dot(tl.where(inb, part, 0.0).to(w.dtype), w, acc)"]
          L += finish_stat()
          L += [f"    acc = acc * ({' * '.join(_substituted(f, args) for f in row_f)})"]
      else:
          L += ["    for k0 in range(0, N, BK):  # pass 1: the row statistic"]
          L += loads()
          L += [f"        {_var(op.output)} = {triton_expression(op.label, [_var(i) for i in op.inputs])}"
                for op in tile_ops if op.output not in after_stats]
          L += accumulate_stat()
          L += finish_stat()
          L += ["    for k0 in range(0, N, BK):  # pass 2: the operand made in registers, contracted"]
          L += loads()
          L += [f"        {_var(op.output)} = {triton_expression(op.label, [_var(i) for i in op.inputs])}" for op in tile_ops]
          L += [w_load, f"        acc = tl.dot(tl.where(inb, {_var(Y)}, 0.0).to(w.dtype), w, acc)"]
      L += ["    tl.store(OUT + rm[:, None] * stride_om + ro[None, :] * stride_oo, acc.to(OUT.dtype.element_ty),",
            "             mask=(rm[:, None] < M) & (ro[None, :] < NO))"]
      return L

    L = [HEADER.format(name=d.name, family="rownorm")] + emit(False) + emit(True)
    if prescale:
        vargs = [_var(i) for i in y_op.inputs]
        L += ["", "", "@triton.jit",
              "def prescale_weight(P, " + "".join(f"VN{j}, " for j in range(len(vecs))) +
              "P2, N, NO, stride_pn, stride_po, BK: tl.constexpr, BO: tl.constexpr):",
              f"    # P2[N, NO] = P * ({' * '.join(ast.unparse(f) for f in prescale)}) along N (the operand's vector factors)",
              "    rk = (tl.program_id(0) * BK + tl.arange(0, BK)).to(tl.int64)",
              "    ro = (tl.program_id(1) * BO + tl.arange(0, BO)).to(tl.int64)",
              "    inb = (rk[:, None] < N) & (ro[None, :] < NO)",
              "    w = tl.load(P + rk[:, None] * stride_pn + ro[None, :] * stride_po, mask=inb, other=0.0).to(tl.float32)"]
        L += [f"    {_var(v)} = tl.load(VN{j} + rk, mask=rk < N, other=0.0).to(tl.float32)[:, None]"
              for j, v in enumerate(vecs)]
        L += [f"    tl.store(P2 + rk[:, None] * NO + ro[None, :], (w * {' * '.join(_substituted(f, vargs) for f in prescale)})"
              ".to(P2.dtype.element_ty), mask=inb)"]
    spec = KernelSpec("rownorm_gemm", "rownorm", [X.name] + vecs + rows + [P, last.output],
                      {"t": t, "n": n, "o": o, "vecs": vecs, "rows": rows, "one_pass": bool(split),
                       "prescale": bool(prescale)})
    return Program(d, "rownorm", "\n".join(L) + "\n", [spec], [])
