"""``tilecore napkin``: derive the IO-optimal algorithm for a model on GPUs and print it.

    tilecore napkin attention --gpu h100 --dtype bf16 seq=4096 d=128 causal=1
    tilecore napkin matmul --gpu a100,h100,h200 --dtype bf16,fp8 m=8192 n=8192 k=8192
    tilecore napkin my_block.py t=4096            # a Python file defining `diagram` or `make(**sizes)`
    tilecore napkin --explain attention seq=4096 d=128 --measured-us 812
    tilecore napkin attention_backward seq=4096 d=128 --impl tilecore,cudnn,flash   # the backward's own model
    tilecore napkin --validate                    # print predicted / measured on H100
    tilecore napkin --validate --docs docs/napkin.md   # and rewrite that file's table

Every bad input exits 2 with a usage line and a message that names what is accepted.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

from .errors import (CapacityError, ShapeMismatchError, UnknownAxisError, UnknownGPUError, UnknownModelError,
                     UnsupportedDtypeError)
from .models import MODELS
from .engine import TIME_MODELS

# Each axis is indexed with 32-bit integers by the kernels the napkin describes, and a size past that
# is a typo, not a model: bound it and say so.
MAX_SIZE = 2 ** 31 - 1
# The Hadamard search grows with the number of 16-wide digits of n (n = 2^20 takes 11 s on one core,
# 2^24 110 s) and from n = 2^20 no single-kernel tile fits an H100's shared memory anyway.
MAX_HADAMARD_N = 2 ** 16
# sizes that are flags or small enumerations: name -> accepted values
CHOICES = {"causal": (0, 1), "radix": (2, 16)}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # exit 2 with usage, as argparse does, but say what is accepted
        self.print_usage(sys.stderr)
        print(f"tilecore napkin: error: {message}", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tilecore napkin", description="Diagram-based IO model: derive the algorithm, "
                "its cost and its predicted speed.",
                epilog="models: " + "; ".join(f"{k} ({', '.join(v[1])})" for k, v in MODELS.items())
                + ". Or a Python file defining `diagram` (a napkin.Diagram) or `make(**sizes)`.")
    p.add_argument("model", nargs="?", help="one of: " + ", ".join(MODELS) + "; or a .py file")
    p.add_argument("sizes", nargs="*", help="size=value pairs, e.g. seq=4096 d=128 (causal=1); "
                   "integers 1..2^31-1 (2^k and 1e6 forms accepted)")
    p.add_argument("--gpu", default="h100", help="comma-separated: a100, h100, h200 (default h100)")
    p.add_argument("--dtype", default="bf16", help="comma-separated: fp32, tf32, bf16, fp16, fp8 (default bf16)")
    p.add_argument("--time-model", default="overlap", choices=list(TIME_MODELS),
                   help="how compute units overlap (default: overlap)")
    p.add_argument("--picture", type=Path, default=None,
                   help="where to write the picture (.svg, and .png with matplotlib; "
                        "default napkin-<model>-<gpu>-<dtype>)")
    p.add_argument("--no-picture", action="store_true", help="do not draw")
    p.add_argument("--quiet", action="store_true", help="only the side-by-side summary")
    p.add_argument("--explain", action="store_true",
                   help="compare --measured-us with the prediction: the binding level and the gap's likely cause")
    p.add_argument("--measured-us", type=float, default=None, help="measured time in microseconds (--explain)")
    p.add_argument("--impl", default="tilecore,cudnn,flash",
                   help="attention_backward only: comma-separated implementations the backward's own model "
                        "(tilecore.napkin.backward) costs: tilecore, cudnn, flash, flex (default: the first three)")
    p.add_argument("--validate", action="store_true",
                   help="predict the measured H100 figures and print the table (--docs FILE: rewrite its table)")
    p.add_argument("--docs", type=Path, default=None,
                   help="markdown file whose napkin-validate table --validate rewrites (must exist)")
    return p


def _int(text: str) -> int:
    """'4096', '2^12', '2**12', '1e6' -> int; ValueError otherwise."""
    t = text.strip().replace("_", "")
    m = re.fullmatch(r"(\d+)\s*(?:\^|\*\*)\s*(\d+)", t)
    if m:
        base, exp = int(m.group(1)), int(m.group(2))
        if exp > 64:
            return MAX_SIZE + 1
        return base ** exp
    try:
        return int(t)
    except ValueError:
        v = float(t)  # 1e6; raises ValueError on anything else
        if not math.isfinite(v) or v != int(v):
            raise ValueError(text) from None
        return int(v)


def parse_sizes(pairs, model: str | None = None) -> dict:
    """size=value pairs -> {name: int}, each checked: 1 <= size <= 2^31-1, flags in their choices.
    Raises ValueError naming the pair and what is accepted."""
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"size {pair!r} is not name=value (e.g. seq=4096)")
        k, v = pair.split("=", 1)
        try:
            n = _int(v)
        except ValueError:
            raise ValueError(f"size {k} must be an integer (4096, 2^12 or 1e6 forms), got {v!r}") from None
        if k in CHOICES:
            if n not in CHOICES[k]:
                raise ValueError(f"{k} must be one of {', '.join(map(str, CHOICES[k]))}, got {v}")
        elif n < 1:
            raise ValueError(f"size {k} must be a positive integer, got {v}")
        elif n > MAX_SIZE:
            raise ValueError(f"size {k}={v} is past the bound 2^31-1 = {MAX_SIZE} (32-bit indices per axis)")
        out[k] = n
    if model == "hadamard" and "n" in out:
        n = out["n"]
        if n < 2 or n & (n - 1):
            raise ValueError(f"hadamard: n must be a power of two in [2, 2^16], got {n}")
        if n > MAX_HADAMARD_N:
            raise ValueError(f"hadamard: n = {n} is past the bound 2^16 = {MAX_HADAMARD_N} (the search "
                             "grows with n's 16-wide digits, and past 2^16 no single-kernel tile fits)")
    if model in ("attention", "gqa"):
        heads, kv = out.get("heads", 16), out.get("kv_heads", 2 if model == "gqa" else out.get("heads", 16))
        if heads % kv:
            raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv})")
    return out


def load_diagram_file(path: Path, sizes: dict, dtype: str):
    """A user's diagram from a Python file: `make(**sizes)` (dtype passed when it takes one) or a
    module-level `diagram` (resized with with_sizes). Raises ValueError with the file's own error."""
    import inspect
    import runpy

    from .diagram import Diagram

    if not path.is_file():
        raise ValueError(f"diagram file {str(path)!r} does not exist")
    try:
        ns = runpy.run_path(str(path), run_name="__napkin_diagram__")
    except Exception as e:  # the user's file: report its error, not ours
        raise ValueError(f"{path}: {type(e).__name__}: {e}") from None
    try:
        if callable(ns.get("make")):
            make = ns["make"]
            params = inspect.signature(make).parameters
            kw = dict(sizes)
            if "dtype" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
                kw["dtype"] = dtype
            d = make(**kw)
        elif isinstance(ns.get("diagram"), Diagram):
            d = ns["diagram"].with_sizes(**sizes) if sizes else ns["diagram"]
        else:
            raise ValueError(f"{path} defines neither `diagram` (a tilecore.napkin.Diagram) nor `make(**sizes)`")
    except (TypeError, UnknownAxisError) as e:
        raise ValueError(f"{path}: {e}") from None
    if not isinstance(d, Diagram):
        raise ValueError(f"{path}: make() returned {type(d).__name__}, not a tilecore.napkin.Diagram")
    if not d.outputs:
        raise ValueError(f"{path}: the diagram has no output (call diagram.output(...))")
    return d


def _build(args, sizes, dtype):
    from . import models

    if args.model.endswith(".py"):
        return load_diagram_file(Path(args.model), sizes, dtype)
    return models.build(args.model, dtype=dtype, **sizes)


def _backward_rows(sizes: dict, gpu, dtype: str, impls: list) -> list:
    """(impl, BackwardTime) for the attention_backward model's sizes (its defaults where not given)."""
    import inspect

    from . import models
    from .backward import attention_backward_time

    if dtype not in ("bf16", "fp16"):
        raise ValueError(f"the backward model costs bf16 / fp16 kernels; got {dtype}")
    kw = {k: v.default for k, v in inspect.signature(models.attention_backward).parameters.items()
          if k not in ("dtype",)}
    kw.update(sizes)
    return [(impl, attention_backward_time(kw["batch"], kw["heads"], kw["kv_heads"] or kw["heads"], kw["seq"],
                                           kw["d"], bool(kw["causal"]), gpu, impl)) for impl in impls]


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_intermixed_args(argv)
    if args.validate:
        from .validate import table, write_docs

        if args.docs is not None and not args.docs.is_file():
            parser.error(f"--docs {args.docs}: no such file (give the markdown file whose table to rewrite)")
        rows = table()
        print(rows)
        if args.docs is not None:
            write_docs(args.docs, rows)
            print(f"wrote {args.docs}")
        return 0
    if not args.model:
        parser.error("a model is required; models: " + ", ".join(MODELS) + "; or a .py diagram file")
    is_file = args.model.endswith(".py")
    if not is_file and args.model not in MODELS:
        parser.error(f"unknown model {args.model!r}; models: " + ", ".join(MODELS) + "; or a .py diagram file")
    if args.explain and args.measured_us is None:
        parser.error("--explain needs --measured-us T (the measured time in microseconds)")
    if args.measured_us is not None and not (math.isfinite(args.measured_us) and args.measured_us > 0):
        parser.error(f"--measured-us must be a positive number of microseconds, got {args.measured_us}")
    try:
        sizes = parse_sizes(args.sizes, None if is_file else args.model)
    except ValueError as e:
        parser.error(str(e))
    if not is_file:
        accepted = MODELS[args.model][1]
        bad = [k for k in sizes if k not in accepted]
        if bad:
            parser.error(f"model {args.model!r} has no size {bad[0]!r}; accepted: {', '.join(accepted)}")
    from . import render
    from .engine import plan
    from .hardware import canonical_dtype, get_gpu
    from .rewrite import apply as rewrite

    try:
        gpus = [get_gpu(g) for g in args.gpu.split(",")]
        dtypes = [canonical_dtype(d) for d in args.dtype.split(",")]
    except (UnknownGPUError, UnsupportedDtypeError) as e:
        parser.error(str(e))
    if args.explain and len(gpus) * len(dtypes) > 1:
        parser.error("--explain compares one measurement: give one --gpu and one --dtype")
    impls = [i.strip().lower() for i in args.impl.split(",") if i.strip()]
    from .backward import IMPLS as BACKWARD_IMPLS
    bad_impl = [i for i in impls if i not in BACKWARD_IMPLS]
    if bad_impl or not impls:
        parser.error(f"--impl {args.impl!r}: accepted: {', '.join(BACKWARD_IMPLS)} (comma-separated)")
    name = Path(args.model).stem if is_file else args.model
    summary = []
    backward_model = args.model == "attention_backward" and not is_file
    for gpu in gpus:
        for dtype in dtypes:
            if backward_model:  # the backward's own model first: it does not need the engine's plan
                try:
                    diagram = _build(args, sizes, dtype)
                    rows = _backward_rows(sizes, gpu, dtype, impls)
                except (UnknownModelError, ShapeMismatchError, UnknownAxisError) as e:
                    parser.error(str(e))
                except ValueError as e:
                    summary.append((gpu.key, dtype, None, None, f"error: {e}"))
                    print(f"== {name} on {gpu.name}, {dtype}: {e}", file=sys.stderr)
                    continue
                for impl, b in rows:
                    summary.append((gpu.key, f"{dtype} {impl}", b.time, diagram.flops() / b.time / 1e12,
                                    f"{b.bound} (backward model)"))
                if not args.quiet:
                    print(f"== {name} on {gpu.name}, {dtype}: the backward's own model (tilecore.napkin.backward)")
                    for _, b in rows:
                        print(b.breakdown())
                    print("(the engine's forward-like plan, for comparison:)")
            try:
                diagram = _build(args, sizes, dtype)
                diagram = rewrite(diagram)
                sched = plan(diagram, gpu, time_model=args.time_model)
            except (UnknownModelError, ShapeMismatchError, UnknownAxisError) as e:
                parser.error(str(e))
            except ValueError as e:
                if isinstance(e, (CapacityError, UnsupportedDtypeError)):
                    if not backward_model:
                        summary.append((gpu.key, dtype, None, None, f"error: {e}"))
                    print(f"== {name} on {gpu.name}, {dtype}: {e}", file=sys.stderr)
                    continue
                parser.error(str(e))
            if not backward_model:
                summary.append((gpu.key, dtype, sched.time, sched.tflops, sched.bound))
            if args.explain:
                print(render.explain(diagram, gpu, args.measured_us * 1e-6, sched))
                return 0
            if not args.quiet:
                print(f"== {name} on {gpu.name}, {dtype}")
                print(render.report(sched))
            if not args.no_picture:
                if args.picture and len(gpus) * len(dtypes) == 1 and not args.picture.is_dir():
                    base = args.picture
                else:
                    folder = args.picture if (args.picture and args.picture.is_dir()) else Path(".")
                    base = folder / f"napkin-{name}-{gpu.key}-{dtype}"
                for i, k in enumerate(sched.kernels):
                    stem = base if len(sched.kernels) == 1 else base.with_name(f"{base.name}-k{i}")
                    written, note = render.draw_files(k, stem)
                    for p in written:
                        print(f"wrote {p}")
                    if note:
                        print(note, file=sys.stderr)
            print()
    if len(summary) > 1 or args.quiet:
        print(f"{'gpu':<6} {'dtype':<6} {'time (us)':>10} {'TFLOP/s':>8}  bound")
        for g, dt, t, tf, b in summary:
            print(f"{g:<6} {dt:<6} {('%.1f' % (t * 1e6)) if t else '-':>10} {('%.0f' % tf) if tf else '-':>8}  {b}")
    return 0 if any(t for _, _, t, _, _ in summary) else 1
