"""Puts this folder on sys.path for its helper module (la_testing), as pyproject's pythonpath does for
tests/attention (under --import-mode=importlib no test folder is on it)."""
import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
