"""``tilecore napkin``: placeholder until the napkin lands (issue 4)."""
from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    print("usage: tilecore napkin <model> ... (not available yet)", file=sys.stderr)
    return 2
