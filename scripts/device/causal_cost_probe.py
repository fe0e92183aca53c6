"""Where the causal forward's extra cost is (session 12): D64 B16 H16 N = 4096, tilecore's forward and
cuDNN's on the same shapes, 5 interleaved rounds: full tiles (Nk = N), shorter tiles without a mask
(Nk = N / 2, N / 4: as many key blocks a tile as causal tiles have on average, and half that), and
causal. If Nk = N / 2 loses as much as causal does against Nk = N, a tile's fixed cost is the gap; if
not, the diagonal blocks are.

    PYTHONPATH=. python3 scripts/device/causal_cost_probe.py
"""
import sys

sys.path.insert(0, ".")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from tilecore.bench.harness import ratios_to  # noqa: E402
from tilecore.ops.attention import kernels  # noqa: E402

B, H, N, D = 16, 16, 4096, 64
for nk, causal in ((N, False), (N // 2, False), (N // 4, False), (N, True)):
    q = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, H, nk, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out, lse = torch.empty_like(q), torch.empty(B, H, N, device="cuda")
    cfg = kernels.gluon_forward_config(D, N, nk, causal)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    fns = {"tilecore": lambda: kernels.forward_gluon(q, k, v, out, lse, causal, D ** -0.5, **cfg),
           "2 consumers": lambda: kernels.forward_gluon(q, k, v, out, lse, causal, D ** -0.5,
                                                        **dict(cfg, consumers=2, q_buffers=2)),
           "cuDNN": cudnn}
    fl = 4 * B * H * N * nk * D / (2 if causal else 1)
    r = ratios_to("cuDNN", fns, fl, 5, warmup_ms=10, rep_ms=50)
    print(f"Nk={nk} causal={causal} {cfg}: " + ", ".join(f"{n} {x['tflops']:.0f} TFLOP/s ({x['ratio']:.3f}x)"
                                                        for n, x in r.items()), flush=True)
