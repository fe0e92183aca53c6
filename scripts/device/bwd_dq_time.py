"""The backward with its dQ from the Gluon dq kernel (gluon_dq.py) against the launcher's key-split config,
B16 H16 N4096 bf16, next to cuDNN's backward, three interleaved repetitions (medians); then the dq
kernels alone (tl and Gluon). One GPU call: PYTHONPATH=. python3 scripts/device/bwd_dq_time.py"""
import sys, torch
sys.path.insert(0, ".")
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench
from tilecore.bench.harness import interleaved_ms
from tilecore.ops.attention import kernels
B, H, N = 16, 16, 4096
for d, causal in ((128, True), (128, False), (64, False)):
    q, k, v, do = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = torch.empty_like(q), torch.empty(B, H, N, device="cuda")
    kernels.forward_into(q, k, v, out, lse, causal, d ** -0.5)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    base = kernels.key_split_config(d, causal)
    variants = {"default": base, "gluon dq": dict(base, dq_from="gluon"),
                "gluon dq, dk/dv 3 stages": dict(base, dq_from="gluon", stages=3)}
    # (until session 14 also the dK/dV kernel with and without a prefetch of lse and delta, which
    # now come by TMA with each step)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
    fns = {n: (lambda c=c: kernels.backward_into(do, q, k, v, out, lse, None, dq, dk, dv, causal, d ** -0.5, gluon=c)) for n, c in variants.items()}
    fns["cuDNN"] = lambda: o.backward(do, retain_graph=True)
    fl = 2.5 * 4 * B * H * N * N * d / (2 if causal else 1)
    for n, f in list(fns.items()):  # a variant that cannot run is reported and left out
        try:
            f()
        except Exception as e:
            print(n, type(e).__name__, str(e)[:150])
            del fns[n]
    ms = interleaved_ms(fns, 3, warmup_ms=10, rep_ms=50, grad_to_none=[qg, kg, vg])
    res = {n: [fl / t / 1e9 for t in ts] for n, ts in ms.items()}
    med = {n: sorted(x)[1] for n, x in res.items()}
    print(f"bwd D={d} causal={causal}: " + ", ".join(f"{n} {m:.0f} ({m / med['cuDNN']:.3f}x)" for n, m in med.items()), flush=True)
    # the dq kernels alone
    delta, _ = kernels.backward_delta(out, do, lse, None)
    t_tl = do_bench(lambda: kernels._backward_dq(do, q, k, v, lse, delta, dq, causal, d ** -0.5, kernels.backward_config(d, interpret=False)), warmup=10, rep=50, return_mode="median")
    t_gl = do_bench(lambda: kernels.backward_dq_gluon(do, q, k, v, lse, delta, dq, causal, d ** -0.5, **kernels.GLUON_DQ[d]), warmup=10, rep=50, return_mode="median")
    fdq = 3 * 2 * B * H * N * N * d / (2 if causal else 1)
    print(f"  dq kernels alone: tl {t_tl:.3f} ms ({fdq / t_tl / 1e9:.0f} TFLOP/s), gluon {t_gl:.3f} ms ({fdq / t_gl / 1e9:.0f})", flush=True)
