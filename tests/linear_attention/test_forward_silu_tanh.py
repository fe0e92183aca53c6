"""The Gluon forward's SILU_TANH (Mamba-2's gate sigmoid by one tanh.approx: configs.GLUON_SILU_TANH, on), on the
CPU: it reaches the kernel only where asked (or turned on in configs) and where its work is (z through the stage),
so other launches keep their arguments (and their compiled kernels). The kernel runs on the GPU only:
experiments/linear_attention/gpu_forward.py --set s30 checks it against float64 there."""
import inspect

import torch

from tilecore.ops.linear_attention import gluon_forward

BF = torch.bfloat16


def mamba_args(**kw):
    """launch_args of the Mamba-2 2.7B-like shape on CPU tensors (descriptors only: nothing launches)."""
    B, N, H, Dk, Dv = 1, 128, 4, 128, 64
    q = torch.empty(B, N, 1, Dk, dtype=BF)
    v = torch.empty(B, N, H, Dv, dtype=BF)
    z = torch.empty_like(v)
    G = torch.zeros(B, H, N, dtype=torch.float32)
    beta = torch.zeros(B, H, N, dtype=torch.float32)
    d_skip = torch.zeros(H, Dv, dtype=torch.float32)
    return gluon_forward.launch_args(q, q, v, G, beta, d_skip, z, None, torch.empty_like(v), None, 1.0, 2,
                                     z_stage=kw.pop("z_stage", True), g_stage=True, early_wv=True, **kw)[1]


def test_the_launches_pass_it_only_where_asked():
    assert "SILU_TANH" not in mamba_args()
    assert mamba_args(silu_tanh=True)["SILU_TANH"] is True
    assert "SILU_TANH" not in mamba_args(silu_tanh=True, z_stage=False)  # the gate's other form has no switch


def test_the_kernel_defaults_it_off():
    params = inspect.signature(gluon_forward.la_fwd_gluon_kernel.fn).parameters
    assert params["SILU_TANH"].default is False
