"""Timing cases shared by the attention probes (bwd_variants.py, power_probe.py)."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilecore.ops.attention import launch

TOKENS, HEADS = 16 * 4096, 16  # B * N tokens a head and heads, as the attention bench suite


def backward_case(n: int, d: int, causal: bool):
    """A backward timing case at B * N = TOKENS, HEADS heads, bf16: (run, cudnn, flops, grads).
    run(config=None) is launch.backward_into into fixed buffers: the planned path without a config,
    else the Gluon backward with that config (``path="gluon", config=``); cudnn() is cuDNN's autograd
    backward of the same inputs, grads the tensors whose .grad it fills; run.inputs = (q, k, v, do,
    out, lse) for calls of a kernel alone."""
    b = TOKENS // n
    q, k, v, do = (torch.randn(b, HEADS, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = torch.empty_like(q), torch.empty(b, HEADS, n, device="cuda")
    launch.forward_into(q, k, v, out, lse, causal, d ** -0.5)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    grads = [t.clone().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = F.scaled_dot_product_attention(*grads, is_causal=causal)

    def run(config=None):
        options = {} if config is None else dict(path="gluon", config=config)
        launch.backward_into(do, q, k, v, out, lse, None, dq, dk, dv, causal, d ** -0.5, **options)

    run.inputs = (q, k, v, do, out, lse)
    return run, lambda: o.backward(do, retain_graph=True), 2.5 * 4 * b * HEADS * n * n * d / (2 if causal else 1), grads
