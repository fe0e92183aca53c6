"""What this machine has: GPU, versions, and which tilecore fast paths can run here."""
from __future__ import annotations

import datetime
import hashlib
import os
import platform
import subprocess
from pathlib import Path

import torch

from tilecore import dispatch


def versions() -> dict:
    import numpy
    import triton

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "numpy": numpy.__version__,
        "cuda": torch.version.cuda,
    }


def gpu_info(device: torch.device | None = None) -> dict | None:
    """Name, capability, SM count, L2 and memory of a CUDA device; None without one."""
    if not torch.cuda.is_available():
        return None
    device = device or torch.device("cuda", torch.cuda.current_device())
    p = dispatch.properties(device)
    return {
        "name": p.name,
        "capability": f"{p.major}.{p.minor}",
        "sms": p.multi_processor_count,
        "l2_bytes": getattr(p, "L2_cache_size", 0),
        "memory_bytes": p.total_memory,
    }


def git_commit() -> str | None:
    """The checkout's commit; ``TILECORE_COMMIT`` overrides it (a copied tree, as on the lent GPU
    machine, can carry a stale .git)."""
    if os.environ.get("TILECORE_COMMIT"):
        return os.environ["TILECORE_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def source_digest(root: Path | None = None) -> str:
    """A digest of the package's Python sources (relative paths and contents, in order): names the
    code that ran even where the commit cannot (a copied tree whose .git is stale). Compare with
    ``python -c "import tilecore.env as e; print(e.source_digest())"`` in a checkout."""
    root = root or Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def metadata() -> dict:
    """Everything a benchmark result needs to say where and when it was measured."""
    return {
        "gpu": gpu_info(),
        "versions": versions(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "source": source_digest(),
    }


def fast_paths() -> dict[str, str]:
    """Which implementation each family of kernels gets on this machine, and why."""
    if not torch.cuda.is_available():
        how = "Triton interpreter" if dispatch.interpreter_enabled() else "PyTorch reference"
        return {"Triton kernels": f"no GPU: CPU tensors use the {how}",
                "Gluon (TMA, wgmma) kernels": "no GPU: not available (compile-only tests run)"}
    dev = torch.device("cuda")
    major, minor = dispatch.capability(dev)
    hopper = dispatch.is_hopper(dev)
    return {
        "Triton kernels": f"compiled for sm_{major}{minor}",
        "Gluon (TMA, wgmma) kernels": "yes (sm_90a)" if hopper else f"no: needs sm_90, this is sm_{major}{minor}",
    }


def report() -> str:
    lines = []
    gpu = gpu_info()
    if gpu is None:
        lines.append("GPU: none (CPU only)")
    else:
        lines.append(f"GPU: {gpu['name']} (compute capability {gpu['capability']}, {gpu['sms']} SMs, "
                     f"{gpu['l2_bytes'] / 2**20:.0f} MiB L2, {gpu['memory_bytes'] / 2**30:.0f} GiB)")
    lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()))
    lines.append(f"TRITON_INTERPRET: {'on' if dispatch.interpreter_enabled() else 'off'}")
    for family, state in fast_paths().items():
        lines.append(f"{family}: {state}")
    return "\n".join(lines)
