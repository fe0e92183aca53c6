"""Nsight Compute for the device probes: one kernel launch of a probe's own target run, profiled.

    from experiments.common.nsight import profile      (with the repository root on sys.path)
"""
import glob
import shutil
import subprocess
import sys


def ncu_binary() -> str:
    """ncu on PATH, else the newest under /opt/nvidia/nsight-compute, else plain "ncu"."""
    return shutil.which("ncu") or (sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu")) or ["ncu"])[-1]


def profile(options: list[str], kernel_regex: str, script: str, script_args: list[str], *,
            timeout: int = 240) -> str:
    """Profile the third launch of kernels matching ``kernel_regex`` (the first two warm up and
    compile) in ``python script *script_args``, with ncu ``options`` (sections, metrics, -o) at the
    GPU's own clocks; ncu's stdout and stderr together."""
    cmd = [ncu_binary(), "--clock-control", "none", *options, "-k", f"regex:{kernel_regex}",
           "--launch-skip", "2", "--launch-count", "1", sys.executable, script, *script_args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return res.stdout + res.stderr
