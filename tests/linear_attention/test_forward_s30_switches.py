"""Session 30's switches of the Gluon forwards (issue 33), on the CPU: Mamba-2's SILU_TANH (the gate's sigmoid by
one tanh.approx) and Based's PAIRED (paired selection wgmmas) and CHAIN (the chunk's wgmmas async) reach the kernels only where asked (or turned on in
configs), so the shipped launches keep their arguments (and their compiled kernels); the timing probes (PROBE)
likewise. The kernels themselves run on the GPU only: experiments/linear_attention/gpu_forward.py --set s30
checks the candidates against float64 there."""
import inspect

import pytest
import torch

from tilecore.ops.linear_attention import configs, gluon_based, gluon_forward

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


def based_args(**kw):
    q = torch.empty(1, 128, 2, gluon_based.DK, dtype=BF)
    v = torch.empty(1, 128, 2, 64, dtype=BF)
    return gluon_based.launch_args(q, q, v, None, torch.empty_like(v), None, 0.25, 2, **kw)[1]


def test_the_shipped_launches_pass_no_new_constexpr():
    for args in (mamba_args(), based_args()):
        assert not {"SILU_TANH", "PAIRED", "CHAIN", "SEL_ASYNC", "PROBE"} & set(args)


def test_silu_tanh_only_with_z_through_the_stage():
    assert mamba_args(silu_tanh=True)["SILU_TANH"] is True
    assert "SILU_TANH" not in mamba_args(silu_tanh=True, z_stage=False)  # the gate's other form has no switch


def test_paired_only_without_overlap_and_probes_by_their_bits():
    assert based_args(paired=True)["PAIRED"] is True and based_args(chain=True)["CHAIN"] is True
    assert not {"PAIRED", "CHAIN"} & set(based_args(paired=True, chain=True, overlap=True))  # OVERLAP does both
    assert based_args(sel_async=2)["SEL_ASYNC"] == 2 and "SEL_ASYNC" not in based_args(sel_async=2, paired=True)
    assert based_args(sel_async=3)["SEL_ASYNC"] == 3
    assert based_args(probe=gluon_based.PROBE_NO_FEATURES.value)["PROBE"] == 32
    assert mamba_args(probe=gluon_forward.PROBE_NO_EPILOGUE.value)["PROBE"] == 32


@pytest.mark.parametrize("kernel,names", [(gluon_forward.la_fwd_gluon_kernel, ("SILU_TANH", "PROBE")),
                                          (gluon_based.based_fwd_gluon_kernel, ("PAIRED", "CHAIN", "SEL_ASYNC", "PROBE"))])
def test_the_kernels_default_every_new_constexpr_off(kernel, names):
    params = inspect.signature(kernel.fn).parameters
    for name in names:
        assert params[name].default in (False, 0)


def test_probe_bits_are_distinct():
    for module in (gluon_forward, gluon_based):
        bits = [getattr(module, n).value for n in dir(module) if n.startswith("PROBE_")]
        assert len(bits) == len(set(bits)) and all(b & (b - 1) == 0 for b in bits)
