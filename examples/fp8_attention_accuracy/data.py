"""The corpus: the running interpreter's own standard library (``Lib/**/*.py``), as bytes.

Every machine with Python has it, so the example needs no download. Tokens are bytes (a vocabulary of
256): a byte-level model needs no tokenizer (nothing to download or train) and reads any file, UTF-8
or not.

Held-out split, by module: a file (``json/decoder.py``, a module) is held out when the SHA-256 of
its path relative to the stdlib folder, POSIX-style, read as a big-endian integer from its first
8 bytes, is below 5% of 2^64 (``is_held_out``). The rule depends on the path alone: the same files
are held out on every machine with the same Python version, whatever the order of the directory
listing, and a file never moves between the two sides as others are added.

Files under ``site-packages`` / ``dist-packages`` (installed packages, not the standard library)
are left out. Files are concatenated in sorted path order, each followed by one NUL byte (a
document boundary the model learns to see).
"""
from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import torch

VOCAB = 256  # bytes
HELD_OUT_FRACTION = 0.05
SEPARATOR = b"\0"
NOT_STDLIB = ("site-packages", "dist-packages")


def stdlib_root() -> Path:
    """The running interpreter's standard library folder (``Lib`` of a CPython checkout)."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_held_out(relative_path: str) -> bool:
    """The split rule: held out when the path's SHA-256, first 8 bytes big-endian, is below 5% of 2^64."""
    digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") < int(HELD_OUT_FRACTION * 2 ** 64)


def source_files(root: Path) -> list[str]:
    """The ``*.py`` files under ``root``, as sorted POSIX paths relative to it (installed packages left out)."""
    out = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [s for s in subfolders if s not in NOT_STDLIB and s != "__pycache__"]
        rel = Path(folder).relative_to(root)
        out += [(rel / name).as_posix() for name in names if name.endswith(".py")]
    return sorted(out)


@dataclass
class Corpus:
    """The two sides of the split as flat byte streams (uint8 tensors) and the files each holds."""
    root: str
    train: torch.Tensor  # (train_bytes,) uint8
    held_out: torch.Tensor  # (held_out_bytes,) uint8
    train_files: list[str] = field(repr=False)
    held_out_files: list[str] = field(repr=False)
    digest: str = ""  # SHA-256 of both streams: which corpus a result was measured on

    def describe(self) -> dict:
        return {"root": self.root, "python": sys.version.split()[0], "train_files": len(self.train_files),
                "held_out_files": len(self.held_out_files), "train_bytes": int(self.train.numel()),
                "held_out_bytes": int(self.held_out.numel()), "sha256": self.digest,
                "split_rule": "held out iff int.from_bytes(sha256(relative posix path)[:8], 'big') < 0.05 * 2**64"}


def _stream(root: Path, files: list[str]) -> torch.Tensor:
    data = bytearray()
    for rel in files:
        data += (root / rel).read_bytes()
        data += SEPARATOR
    return torch.frombuffer(data, dtype=torch.uint8).clone() if data else torch.empty(0, dtype=torch.uint8)


def load_corpus(root: Optional[Path] = None, max_files: Optional[int] = None) -> Corpus:
    """Read the corpus. ``max_files`` keeps the first files of each side (sorted order; smoke runs)."""
    root = Path(root) if root is not None else stdlib_root()
    files = source_files(root)
    if not files:
        raise FileNotFoundError(f"no *.py files under {root}: the example reads the Python standard library "
                                f"(sysconfig.get_paths()['stdlib'])")
    held = [f for f in files if is_held_out(f)]
    train = [f for f in files if not is_held_out(f)]
    if max_files is not None:
        held, train = held[:max_files], train[:max_files]
    if not held or not train:
        raise ValueError(f"the split of {len(files)} files under {root} left a side empty "
                         f"({len(train)} train, {len(held)} held out): the corpus is too small")
    train_stream, held_stream = _stream(root, train), _stream(root, held)
    digest = hashlib.sha256(train_stream.numpy().tobytes() + b"|" + held_stream.numpy().tobytes()).hexdigest()
    return Corpus(str(root), train_stream, held_stream, train, held, digest)


def train_batches(tokens: torch.Tensor, batch: int, context: int, seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (inputs, targets), each (batch, context) int64: windows of ``context + 1`` bytes at
    uniformly random offsets of ``tokens`` (a seeded generator: the same batches every run); targets
    are the inputs shifted by one."""
    if tokens.numel() < context + 1:
        raise ValueError(f"train_batches: {tokens.numel()} tokens cannot fill one window of {context + 1}")
    generator = torch.Generator().manual_seed(seed)
    offsets = torch.arange(context + 1)
    while True:
        starts = torch.randint(0, tokens.numel() - context, (batch, 1), generator=generator)
        window = tokens[starts + offsets].long()  # (batch, context + 1)
        yield window[:, :-1], window[:, 1:]


def eval_windows(tokens: torch.Tensor, context: int, max_windows: Optional[int] = None) -> torch.Tensor:
    """The held-out windows, (n, context + 1) int64: consecutive non-overlapping windows (window i
    starts at i * context; its last target is window i + 1's first input). With ``max_windows``
    fewer than all, that many evenly spaced over the stream, so every part of the held-out set is
    represented. Deterministic."""
    total = (tokens.numel() - 1) // context
    if total < 1:
        raise ValueError(f"eval_windows: {tokens.numel()} tokens cannot fill one window of {context + 1}")
    index = torch.arange(total)
    if max_windows is not None and max_windows < total:
        index = torch.linspace(0, total - 1, max_windows).round().long().unique()
    starts = index[:, None] * context + torch.arange(context + 1)
    return tokens[starts].long()
