"""Host time of layer_norm's calls at 65536 x 1024 (bf16): no gradient, gradient recorded, the
implementation directly; then cProfile's top functions of the recording call. Prints a table."""
import cProfile
import pstats
import time

import torch

from tilecore.ops.norm import launch, op
from tilecore.ops.norm.plan import plan

DEV = "cuda"
rows, n = 65536, 1024
x = torch.randn(rows, n, device=DEV, dtype=torch.bfloat16)
xg = x.clone().requires_grad_()
w = torch.randn(n, device=DEV, dtype=torch.bfloat16, requires_grad=True)
b = torch.randn(n, device=DEV, dtype=torch.bfloat16, requires_grad=True)
wn, bn = w.detach(), b.detach()
dy = torch.randn(rows, n, device=DEV, dtype=torch.bfloat16)


def per_call_us(f, reps=200):
    for _ in range(10):
        f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        f()
    t = time.perf_counter() - t0  # (queued work may lag: a host-bound loop's time is the host's)
    torch.cuda.synchronize()
    return t / reps * 1e6


y_graph = op.layer_norm(xg, w, b)


def forward_launch():  # the implementation under the custom op: plan, then the kernels
    return launch.forward(plan(rows, n, x.device), x, None, wn, bn, None, 0.0, 1e-5, False, False, x.dtype)


_, _, mean, rstd = forward_launch()
rows_out = {
    "backward launch (impl)": per_call_us(lambda: launch.backward(plan(rows, n, x.device), dy, x, None, None, wn, bn,
                                                                  mean, rstd, None, None, 0.0, False, x.dtype, x.dtype,
                                                                  False)),
    "backward through the engine": per_call_us(lambda: torch.autograd.grad(y_graph, [xg, w, b], dy,
                                                                           retain_graph=True)),
    "torch.empty (1056, 1024) f32": per_call_us(lambda: torch.empty((1056, 1024), device=DEV)),
    "sum(0) of (1056, 1024) f32": per_call_us(lambda: mean.new_empty((1056, 1024)).sum(0)),
    "forward, no grad": per_call_us(lambda: op.layer_norm(x, wn, bn)),
    "forward, grad recorded": per_call_us(lambda: op.layer_norm(xg, w, b)),
    "forward launch (impl)": per_call_us(forward_launch),
    "fwd+bwd step": per_call_us(lambda: torch.autograd.grad(op.layer_norm(xg, w, b), [xg, w, b], dy), 100),
}
for k, v in rows_out.items():
    print(f"{k:28s} {v:9.1f} us/call (host)")
prof = cProfile.Profile()
prof.enable()
for _ in range(50):
    torch.autograd.grad(op.layer_norm(xg, w, b), [xg, w, b], dy)
prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(18)
