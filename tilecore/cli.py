"""The ``tilecore`` command: tour, bench, env, napkin."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    from tilecore.bench.suites import SUITES

    p = argparse.ArgumentParser(prog="tilecore", description="Tensor-core kernels for AI, as PyTorch ops.")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", metavar="{tour,bench,env,napkin}")
    sub.required = True

    tour = sub.add_parser("tour", help="run every op once (GPU if there is one, else CPU) and print a table")
    tour.add_argument("--device", choices=["cuda", "cpu"], default=None,
                      help="where to run (default: cuda if available, else cpu)")

    bench = sub.add_parser("bench", help="benchmark an op against its ceiling and peers (needs a GPU)")
    bench.add_argument("suite", choices=sorted(SUITES), help="what to measure")
    bench.add_argument("--quick", action="store_true", help="a shorter sweep")
    bench.add_argument("--out", type=Path, default=Path("benchmarks/results"),
                       help="results folder (default: benchmarks/results); a subfolder per device")
    bench.add_argument("--no-save", action="store_true", help="print the table only")

    env = sub.add_parser("env", help="GPU, versions and which fast paths run here")
    env.add_argument("--target", metavar="GPU", help="also which paths another GPU would get (no GPU needed): "
                     "sm_80, sm_86, sm_89, sm_90a, sm_100a, sm_120a, gfx90a, gfx942, or 'all'")
    sub.add_parser("napkin", help="diagram-based IO model of a network on a GPU (tilecore napkin --help)",
                   add_help=False)
    return p


def _version() -> str:
    from tilecore import __version__

    return f"tilecore {__version__}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--version"]:  # without building the parser, which imports torch for the suites
        print(_version())
        return 0
    if argv[:2] == ["napkin", "ring"]:  # ring attention across GPUs (tilecore.napkin.ring)
        from tilecore.napkin.ring import main as ring_main

        return ring_main(argv[2:])
    if argv[:1] == ["napkin"]:
        from tilecore.napkin.cli import main as napkin_main

        return napkin_main(argv[1:])
    args = _parser().parse_args(argv)  # exits 2 with a usage message on anything unknown

    if args.command == "env":
        from tilecore import env

        print(env.report())
        if args.target:
            from tilecore import dispatch

            names = list(dispatch.TARGETS) if args.target == "all" else args.target.split(",")
            unknown = [n for n in names if n not in dispatch.TARGETS]
            if unknown:
                print(f"tilecore env: unknown --target {', '.join(unknown)}; known: {', '.join(dispatch.TARGETS)}, all",
                      file=sys.stderr)
                return 2
            for name in names:
                print(env.target_report(dispatch.TARGETS[name]))
        return 0

    if args.command == "tour":
        from tilecore import tour

        return tour.main(args.device)

    if args.command == "bench":
        import torch

        if not torch.cuda.is_available():
            print("tilecore bench needs a CUDA GPU and this machine has none "
                  "('tilecore tour' runs every op on the CPU).", file=sys.stderr)
            return 1
        from tilecore.bench import harness
        from tilecore.bench.suites import SUITES

        result = harness.run_suite(SUITES[args.suite], quick=args.quick)
        print(harness.table(result))
        if not args.no_save:
            for path in harness.save(result, args.out):
                print(f"wrote {path}")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
