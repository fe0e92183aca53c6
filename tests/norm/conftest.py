"""Puts this folder on sys.path for its helper module (norm_testing), as pyproject's pythonpath does for
tests/attention (pytest's importlib mode adds no test folder)."""
import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
