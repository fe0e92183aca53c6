"""Hadamard transform: GB/s against the copy ceiling, and against peers when importable.

``hadamard``: 2^28 elements (rows x n) for every n, fp16 and bf16. ``hadamard-latency``: few rows
(1 to 256) of n = 4096 and 16384, next to torch's copy of the same bytes.
"""
from __future__ import annotations

import torch

from tilecore.bench.case import Case, Suite
from tilecore.bench.harness import rotating
from tilecore.bench.suites.copy import torch_copy

ELEMENTS = 2**28
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _inputs(rows: int, n: int, dtype: torch.dtype):
    bytes_per_set = 2 * rows * n * dtype.itemsize
    return rotating(lambda: (torch.randn(rows, n, dtype=dtype, device="cuda"),), bytes_per_set)


def _tilecore(rows, n, dtype):
    def build():
        from tilecore import hadamard_transform

        nxt = _inputs(rows, n, dtype)
        scale = n**-0.5
        return lambda: hadamard_transform(nxt()[0], scale)
    return build


def _dao(rows, n, dtype):
    def build():
        from fast_hadamard_transform import hadamard_transform as dao  # peer: Dao-AILab's kernel

        nxt = _inputs(rows, n, dtype)
        return lambda: dao(nxt()[0], n**-0.5)
    return build


def throughput_cases(quick: bool) -> list[Case]:
    ns = [2**k for k in (range(7, 16, 2) if quick else range(0, 16))]
    cases = []
    for name, dtype in DTYPES.items():
        for n in ns:
            rows = ELEMENTS // n
            cases.append(Case({"n": n, "dtype": name},
                              {"tilecore": _tilecore(rows, n, dtype), "dao": _dao(rows, n, dtype)},
                              bytes=2 * ELEMENTS * dtype.itemsize))
    return cases


def latency_cases(quick: bool) -> list[Case]:
    cases = []
    for n in (4096, 16384):
        for rows in ((1, 16, 256) if quick else (1, 2, 4, 8, 16, 32, 64, 128, 256)):
            cases.append(Case({"rows": rows, "n": n},
                              {"tilecore": _tilecore(rows, n, torch.bfloat16), "torch copy_": torch_copy(rows * n, torch.bfloat16),
                               "dao": _dao(rows, n, torch.bfloat16)},
                              bytes=2 * rows * n * 2))
    return cases


SUITE = Suite("hadamard", ceiling="copy", metric="GB/s", x="n", cases=throughput_cases,
              describe="hadamard_transform on 2^28 elements, GB/s (read + write) vs the copy ceiling")
LATENCY = Suite("hadamard-latency", ceiling="copy", metric="GB/s", x="rows", cases=latency_cases, timing="graph",
                describe="hadamard_transform on few rows (bf16) next to a copy of the same bytes (GPU time: CUDA "
                         "graph replays; eager calls here time the host)")
