"""tilecore's own host time a call, measured on a CPU-only machine: CPU tensors are dressed up as a
Hopper GPU's (dispatch answers "Hopper, compiled kernels"), and the compiled kernel a launch would call
is a no-op. What remains is every line of tilecore between the public function and Triton's launcher
(checks, plan, argument building, the launch cache): the part a plan cache can remove. Triton's
launcher (and the driver's TMA descriptor encoding) are not in it; measure those on the GPU
(host_profile.py).

    python experiments/common/host_emulate.py [--calls 5000] [--profile]
"""
import argparse
import contextlib
import cProfile
import pstats
import time

import torch

from tilecore import dispatch
from tilecore.tiles import launch as tl_launch


class _NoKernel:
    """What the emulation's "compiled kernel" is: calling it does nothing."""

    def __getitem__(self, grid):
        return lambda *args: None


def dress_cpu_as_hopper():
    dispatch.backend_for = lambda device: "kernel"
    dispatch.interpreted = lambda device: False
    dispatch.interpreter_enabled = lambda: False
    dispatch.gluon_ok = lambda device: True
    dispatch.is_hopper = lambda device: True
    dispatch.capability = lambda device: (9, 0)
    dispatch.num_sms = lambda device: 132
    dispatch.on_device = lambda device: contextlib.nullcontext()
    dispatch.capturing = lambda device: False
    torch.cuda.current_device = lambda: 0

    def first_launch(self, key, grid, args, kwargs, ordered):
        compiled = _NoKernel()
        self.compiled.put(key, compiled)
        return compiled

    tl_launch.CachedLaunch._first_launch = first_launch

    def signature(*items):  # tiles.launch.signature, with CPU tensors taken for CUDA ones
        return tuple((t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)
                     if isinstance(t, torch.Tensor) else t for t in items)

    import importlib
    for name in ("gemm", "hadamard", "attention"):
        module = importlib.import_module(f"tilecore.ops.{name}.op")
        if hasattr(module, "signature"):
            module.signature = signature
    tl_launch.tile_counter = lambda device: torch.zeros(1, dtype=torch.int32)


def cases():
    import tilecore
    # outputs of tens of KiB: a CPU allocation that large costs what the CUDA caching allocator's does
    # (a few us); megabytes would time the CPU's page faults
    a = torch.randn(128, 128, dtype=torch.bfloat16)
    b = torch.randn(128, 128, dtype=torch.bfloat16)
    x = torch.randn(4, 4096, dtype=torch.bfloat16)
    q = torch.randn(1, 32, 1, 128, dtype=torch.bfloat16)
    k = torch.randn(1, 8, 4096, 128, dtype=torch.bfloat16)
    return {"gemm": lambda: tilecore.gemm(a, b), "hadamard": lambda: tilecore.hadamard_transform(x),
            "decode": lambda: tilecore.attention(q, k, k), "empty (torch.empty of the output)":
            lambda: torch.empty(128, 128, dtype=torch.bfloat16)}


def per_call_us(fn, calls):
    for _ in range(20):
        fn()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    dress_cpu_as_hopper()
    for name, fn in cases().items():
        try:
            print(f"{name:40s} {per_call_us(fn, a.calls):7.1f} us a call")
        except Exception as err:  # noqa: BLE001
            print(f"{name:40s} failed: {type(err).__name__}: {err}")
            continue
        if a.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(a.calls):
                fn()
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
