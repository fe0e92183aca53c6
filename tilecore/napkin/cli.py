"""``tilecore napkin``: derive the IO-optimal algorithm for a model on GPUs and print it.

    tilecore napkin attention --gpu h100 --dtype bf16 seq=4096 d=128 causal=1
    tilecore napkin matmul --gpu a100,h100,h200 --dtype bf16,fp8 m=8192 n=8192 k=8192
    tilecore napkin --validate            # predicted / measured on H100, rewrites docs/napkin.md's table
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import CapacityError, UnknownGPUError, UnknownModelError, UnsupportedDtypeError
from .models import MODELS


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # exit 2 with usage, as argparse does, but say what is accepted
        self.print_usage(sys.stderr)
        print(f"tilecore napkin: error: {message}", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tilecore napkin", description="Diagram-based IO model: derive the algorithm, "
                "its cost and its predicted speed.",
                epilog="models: " + "; ".join(f"{k} ({', '.join(v[1])})" for k, v in MODELS.items()))
    p.add_argument("model", nargs="?", help="one of: " + ", ".join(MODELS))
    p.add_argument("sizes", nargs="*", help="size=value pairs, e.g. seq=4096 d=128 (causal=1)")
    p.add_argument("--gpu", default="h100", help="comma-separated: a100, h100, h200 (default h100)")
    p.add_argument("--dtype", default="bf16", help="comma-separated: fp32, tf32, bf16, fp16, fp8 (default bf16)")
    p.add_argument("--time-model", default="overlap", choices=["overlap", "serial", "exposed-sfu"],
                   help="how compute units overlap (default: overlap)")
    p.add_argument("--picture", type=Path, default=None,
                   help="where to write the picture (.svg and .png; default napkin-<model>-<gpu>-<dtype>)")
    p.add_argument("--no-picture", action="store_true", help="do not draw")
    p.add_argument("--quiet", action="store_true", help="only the side-by-side summary")
    p.add_argument("--validate", action="store_true",
                   help="predict the measured H100 figures and rewrite the table in docs/napkin.md")
    p.add_argument("--docs", type=Path, default=Path("docs/napkin.md"), help="file --validate rewrites")
    return p


def _sizes(pairs, parser) -> dict:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            parser.error(f"size {pair!r} is not name=value")
        k, v = pair.split("=", 1)
        try:
            out[k] = int(v)
        except ValueError:
            parser.error(f"size {k} must be an integer, got {v!r}")
    return out


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_intermixed_args(argv)
    if args.validate:
        from .validate import write_docs, table

        rows = table()
        print(rows)
        if args.docs:
            write_docs(args.docs, rows)
            print(f"wrote {args.docs}")
        return 0
    if not args.model:
        parser.error("a model is required; models: " + ", ".join(MODELS))
    if args.model not in MODELS:
        parser.error(f"unknown model {args.model!r}; models: " + ", ".join(MODELS))
    sizes = _sizes(args.sizes, parser)
    from . import models, render
    from .engine import plan
    from .hardware import canonical_dtype, get_gpu

    try:
        gpus = [get_gpu(g) for g in args.gpu.split(",")]
        dtypes = [canonical_dtype(d) for d in args.dtype.split(",")]
    except (UnknownGPUError, UnsupportedDtypeError) as e:
        parser.error(str(e))
    summary = []
    for gpu in gpus:
        for dtype in dtypes:
            try:
                diagram = models.build(args.model, dtype=dtype, **sizes)
                sched = plan(diagram, gpu, time_model=args.time_model)
            except UnknownModelError as e:
                parser.error(str(e))
            except (CapacityError, UnsupportedDtypeError) as e:
                summary.append((gpu.key, dtype, None, None, f"error: {e}"))
                print(f"== {args.model} on {gpu.name}, {dtype}: {e}", file=sys.stderr)
                continue
            summary.append((gpu.key, dtype, sched.time, sched.tflops, sched.bound))
            if not args.quiet:
                print(f"== {args.model} on {gpu.name}, {dtype}")
                print(render.report(sched))
            if not args.no_picture:
                base = args.picture if (args.picture and len(gpus) * len(dtypes) == 1) else \
                    (args.picture or Path(".")) / f"napkin-{args.model}-{gpu.key}-{dtype}" \
                    if args.picture and args.picture.is_dir() else Path(f"napkin-{args.model}-{gpu.key}-{dtype}")
                for i, k in enumerate(sched.kernels):
                    stem = base if len(sched.kernels) == 1 else base.with_name(f"{base.name}-k{i}")
                    for p in render.draw(k, stem):
                        print(f"wrote {p}")
            print()
    if len(summary) > 1 or args.quiet:
        print(f"{'gpu':<6} {'dtype':<6} {'time (us)':>10} {'TFLOP/s':>8}  bound")
        for g, dt, t, tf, b in summary:
            print(f"{g:<6} {dt:<6} {('%.1f' % (t * 1e6)) if t else '-':>10} {('%.0f' % tf) if tf else '-':>8}  {b}")
    return 0 if any(t for _, _, t, _, _ in summary) else 1
