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


def arch(device: torch.device) -> str:
    """The GPU's architecture as the kernels are compiled for it: "sm_86", "sm_90a" (Hopper, where the Gluon kernels
    run), or ROCm's (torch reports an MI200's gfx90a as capability (9, 0): named by its target where described)."""
    target = dispatch.described(device)
    if target is not None:
        return target.name
    if dispatch.is_rocm(device):
        return f"ROCm {getattr(dispatch.properties(device), 'gcnArchName', 'GPU')}"
    major, minor = dispatch.capability(device)
    return f"sm_{major}{minor}{'a' if (major, minor) == (9, 0) else ''}"


def fast_paths(device: torch.device | None = None) -> dict[str, str]:
    """Which implementation each family of kernels gets, and why: on ``device`` (a CUDA device, or a meta device
    inside ``dispatch.pretend``: the GPU it describes), else this machine's GPU, else the CPU."""
    if device is None:
        if not torch.cuda.is_available():
            how = "Triton interpreter" if dispatch.interpreter_enabled() else "PyTorch reference"
            return {"Triton kernels": f"no GPU: CPU tensors use the {how}",
                    "Gluon (TMA, wgmma) kernels": "no GPU: not available (compile-only tests run)"}
        device = torch.device("cuda")
    name = arch(device)
    rocm = dispatch.is_rocm(device)
    major, minor = dispatch.capability(device)
    if not rocm and (major, minor) < dispatch.MIN_CAPABILITY:
        problem = dispatch.gpu_problem(device) or (
            f"tilecore's GPU kernels need compute capability {dispatch.MIN_CAPABILITY[0]}."
            f"{dispatch.MIN_CAPABILITY[1]} or newer; this is {major}.{minor}: move the tensors to the CPU")
        return {"Triton kernels": f"no: {problem}", "Gluon (TMA, wgmma) kernels": "no", "FP8 (e4m3) kernels": "no"}
    smem = dispatch.shared_memory_per_block(device)
    paths = {"Triton kernels": f"compiled for {name}" + (f" ({smem // 1024} KiB of shared memory a block)" if smem else "")}
    if dispatch.is_hopper(device):
        problem = dispatch.gluon_triton_problem()
        paths["Gluon (TMA, wgmma) kernels"] = "yes (sm_90a)" if problem is None else \
            f"no: {problem}: the portable Triton kernels run instead (slower)"
    elif rocm:
        paths["Gluon (TMA, wgmma) kernels"] = "no: NVIDIA Hopper only; ROCm runs the portable Triton kernels"
    else:
        paths["Gluon (TMA, wgmma) kernels"] = f"no: needs sm_90, this is {name}: the portable Triton kernels run"
    if dispatch.fp8_ok(device):
        gluon = dispatch.is_hopper(device) and dispatch.gluon_triton_problem() is None
        paths["FP8 (e4m3) kernels"] = "yes" + ("" if gluon else
                                             " (the portable Triton kernels: attention_fp8's tl forward)")
    else:
        paths["FP8 (e4m3) kernels"] = (f"no: Triton has no e4m3 for {name}: gemm_fp8 multiplies exact float16 "
                                       "upcasts, hadamard_quantize's e4m3 formats use torch's ops, attention_fp8 refuses")
    return paths


def triton_support() -> str:
    """The installed triton against the releases the Gluon kernels were compile-checked under and ran under, in a
    sentence that names it ("triton 3.6.0: ...", or the problem, which names it too)."""
    import triton

    problem = dispatch.gluon_triton_problem()
    try:
        from tilecore.tiles.gluon import compat
    except Exception:  # noqa: BLE001 (the problem above names it)
        return problem
    if problem is not None:
        return f"{problem}; a Hopper GPU would run the portable Triton kernels"
    ran = compat.release() in compat.RAN_ON_GPU
    return (f"triton {triton.__version__}: the Gluon kernels compile-checked under it (sm_90a)"
            + (" and ran on an H100" if ran else f", not run on a GPU (ran under {', '.join(compat.RAN_ON_GPU)})")
            + (f"; compatibility shims: {', '.join(compat.SHIMS)}" if compat.SHIMS else ""))


def launch_path() -> str:
    """How a kept (keyed) kernel launch reaches the GPU under the installed triton (tiles.launch.direct_launch):
    Triton's launcher called directly where it has 3.6's calling convention, else through Triton's runner."""
    from tilecore.tiles import launch

    try:
        import triton.backends.nvidia.driver as nvidia_driver
    except Exception as err:  # noqa: BLE001 (a triton without the NVIDIA backend)
        return f"kept launches: through Triton's runner (no NVIDIA driver module: {type(err).__name__})"
    problem = launch.tma_operand_problem()
    tma = "" if problem is None else f"; TMA kernels' kept launches off ({problem})"
    if launch.launcher_convention_36(nvidia_driver):
        return "kept launches: Triton's launcher called directly (3.6's convention)" + tma
    return ("kept launches: through Triton's runner (this triton's launcher convention is not 3.6's: "
            "~5 us more a launch on the H100's host)" + tma)


def target_report(target: dispatch.Target) -> str:
    """fast_paths for a GPU described by ``target`` (dispatch.pretend): what its tensors would get, with no GPU."""
    with dispatch.pretend(target):
        paths = fast_paths(torch.device("meta"))
    head = f"\n{target.name} ({target.example}):" if target.example else f"\n{target.name}:"
    return "\n".join([head] + [f"  {family}: {state}" for family, state in paths.items()])


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
    lines.append(triton_support())
    lines.append(launch_path())
    for family, state in fast_paths().items():
        lines.append(f"{family}: {state}")
    return "\n".join(lines)
