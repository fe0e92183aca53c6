"""Where a layer_norm forward + backward step's time goes at 65536 x 1024 (bf16): GPU kernels (torch
profiler) against the step's wall time, tilecore's and torch's eager. Prints a short table."""
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from experiments.common.gpu_script import profiled  # noqa: E402
from tilecore.ops.norm.op import layer_norm  # noqa: E402

DEV = "cuda"
rows, n = 65536, 1024
x = torch.randn(rows, n, device=DEV, dtype=torch.bfloat16, requires_grad=True)
w = torch.randn(n, device=DEV, dtype=torch.bfloat16, requires_grad=True)
b = torch.randn(n, device=DEV, dtype=torch.bfloat16, requires_grad=True)
dy = torch.randn(rows, n, device=DEV, dtype=torch.bfloat16)
steps = {"tilecore": lambda: layer_norm(x, w, b), "torch": lambda: F.layer_norm(x, (n,), w, b)}
result = {}
for name, f in steps.items():
    def step():
        return torch.autograd.grad(f(), [x, w, b], dy)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / 50 * 1e3
    # (the GPU's kernels and the host's ops, each from its own record of 10 steps: gpu_script.profiled)
    prof = profiled(step, 10)
    kernels = {}
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.count:
            kernels[e.key[:70]] = (round(e.device_time_total / 10 / 1e3, 4), e.count // 10)
    prof = profiled(step, 10, cpu=True)
    cpu_top = sorted(((e.cpu_time_total / 10 / 1e3, e.key[:60]) for e in prof.key_averages()
                      if e.device_type == torch.autograd.DeviceType.CPU), reverse=True)[:8]
    result[name] = {"wall_ms": round(wall, 4), "kernels_ms": kernels,
                    "gpu_ms": round(sum(v[0] for v in kernels.values()), 4), "cpu_top": cpu_top}
out = os.environ.get("OUT", "/tmp/out")
os.makedirs(out, exist_ok=True)
json.dump(result, open(os.path.join(out, "norm_step_profile.json"), "w"), indent=1)
for name, r in result.items():
    print(f"{name}: wall {r['wall_ms']} ms/step, GPU kernels {r['gpu_ms']} ms/step")
    for k, v in sorted(r["kernels_ms"].items(), key=lambda kv: -kv[1][0]):
        print(f"   {v[0]:8.4f} ms x{v[1]}  {k}")
    for t, k in r["cpu_top"]:
        print(f"   cpu {t:8.4f} ms  {k}")
