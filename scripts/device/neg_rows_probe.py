"""One-off (session 12): causal query tiles counted from the last row, on shapes whose first tile is
short, forward configs and the Gluon dq kernel: outputs poisoned, all written, error against float64.
Each case in its own process (its first version, with tiles starting before row 0, trapped: an
illegal instruction poisons the CUDA context)."""
import subprocess
import sys

CASE = r'''
import sys, torch
sys.path.insert(0, ".")
from tilecore.ops.attention import kernels
from tilecore.accuracy import error_over_floor
from tilecore.ops.attention.reference import attention_reference
d, n, cfg_name = {d}, {n}, "{cfg}"
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(1, 2, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
out = torch.full_like(q, float("nan")); lse = torch.full((1, 2, n), float("nan"), device="cuda")
base = kernels.gluon_forward_config(d, n, n, True)
cfgs = dict(default=base, nocarry=dict(base, carry=False), c3=dict(base, consumers=3, q_buffers=1),
            c3nocarry=dict(base, consumers=3, q_buffers=1, carry=False))
if cfg_name == "dq":
    kernels.forward_into(q, k, v, out, lse, True, d ** -0.5)
    do = torch.randn_like(q)
    delta, _ = kernels.backward_delta(out, do, lse, None)
    dq = torch.full_like(q, float("nan"))
    kernels.backward_dq_gluon(do, q, k, v, lse, delta, dq, True, d ** -0.5, **kernels.GLUON_DQ[d])
    torch.cuda.synchronize()
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    ro, _ = attention_reference(q64, k64, v64, causal=True)
    rdq, = torch.autograd.grad(ro, (q64,), do.double())
    print("dq written", not dq.isnan().any().item(), "err", error_over_floor(dq, rdq))
else:
    kernels.forward_gluon(q, k, v, out, lse, True, d ** -0.5, **cfgs[cfg_name])
    torch.cuda.synchronize()
    ro, rl = attention_reference(q.double(), k.double(), v.double(), causal=True)
    print(cfg_name, cfgs[cfg_name], "written", not out.isnan().any().item(), "err", error_over_floor(out, ro))
'''
for d, n, cfg in [(64, 1000, "default"), (64, 1000, "nocarry"), (64, 1000, "c3"), (64, 1000, "c3nocarry"),
                  (64, 4096, "c3"), (64, 2048, "c3"), (128, 4097, "default"), (128, 1000, "default"), (128, 4097, "dq"),
                  (64, 1000, "dq"), (128, 100, "default"), (64, 100, "c3")]:
    r = subprocess.run([sys.executable, "-c", CASE.format(d=d, n=n, cfg=cfg)], capture_output=True, text=True)
    tail = (r.stdout.strip() or r.stderr.strip().splitlines()[-1])[-300:]
    print(f"D{d} N{n} {cfg}: rc={r.returncode} {tail}", flush=True)
