"""``tilecore tour``: run each op once on the GPU (else the CPU) and print what ran, its accuracy
against the float64 reference and, on a GPU, its speed against the ceiling measured in the same run."""
from __future__ import annotations

import time

import torch

from tilecore import accuracy, dispatch, env
from tilecore.tour_case import TourCase  # noqa: F401 (its old home: attention's tour.py still imports it from here)


def _cases(device: torch.device) -> list[TourCase]:
    """Every op's tour cases, in the order the ops landed (each op's ``tour.py``)."""
    from tilecore.ops.attention.tour import tour_cases as attention_cases
    from tilecore.ops.gemm.tour import cases as gemm_cases
    from tilecore.ops.hadamard.tour import tour_cases as hadamard_cases
    from tilecore.ops.norm.tour import tour_cases as norm_cases
    from tilecore.ops.rotary.tour import tour_cases as rotary_cases

    return (hadamard_cases(device) + gemm_cases(device) + attention_cases(device) + norm_cases(device)
            + rotary_cases(device))


def main(device_name: str | None = None) -> int:
    if device_name == "cuda" and not torch.cuda.is_available():
        print("tilecore tour: --device cuda asked for, and this machine has no CUDA GPU.")
        return 1
    device = torch.device(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
    gpu = device.type == "cuda"
    print(env.report())
    where = "compiled kernels" if dispatch.backend_for(device) == "kernel" else "PyTorch reference"
    if device.type == "cpu" and dispatch.interpreter_enabled():
        where = "Triton interpreter"
    print(f"\ntour on {device.type} ({where})")

    ceilings = {}
    if gpu:
        from tilecore.bench import harness

        ceilings["memory"] = harness.copy_ceiling(2**28)
        ceilings["compute"] = harness.matmul_ceiling(4096)
        ceilings["compute-fp8"] = harness.scaled_mm_ceiling(4096)
        for c in ceilings.values():
            print(f"ceiling: {c.name} = {c.value:,.0f} {c.unit}")

    head = ["op", "shape", "dtype", "error", "time", "speed", "% of ceiling"]
    rows = []
    for case in _cases(device):
        start = time.perf_counter()
        out = case.run()
        ref = case.reference()
        wall = time.perf_counter() - start
        if case.dtype == torch.float32:
            err = f"{accuracy.rel_rms(out, ref):.1e} rel"
        else:
            err = f"{accuracy.error_over_floor(out, ref):.2f}x floor"
        dtype = str(case.dtype).removeprefix("torch.")
        if gpu:
            from tilecore.bench.harness import median_ms

            ms = median_ms(case.run)
            ceiling = ceilings[case.bound]
            value = case.bytes / ms / 1e6 if case.bound == "memory" else case.flops / ms / 1e9
            rows.append([case.op, case.shape, dtype, err, f"{ms * 1e3:.1f} us", f"{value:,.0f} {ceiling.unit}",
                         f"{100 * value / ceiling.value:.0f}%"])
        else:
            rows.append([case.op, case.shape, dtype, err, f"{wall:.2f} s (CPU)", "-", "-"])
    if not rows:
        print("no ops yet")
        return 0
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))
    print(line(head))
    print(line(["-" * w for w in widths]))
    for r in rows:
        print(line(r))
    return 0
