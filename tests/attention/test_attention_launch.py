"""The Gluon attention kernels' launches without a GPU: through tiles.launch's fast path (a compiled
kernel called directly) each kernel gets every argument in its order, its TMA operands describing the
tensors as the checked descriptors of the launch that compiled it did."""
import pytest
import torch
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from tilecore.ops.attention import kernels
from tilecore.tiles.launch import TmaOperand, jit_arg


def _bound(fake, kernel):
    (grid, args), = fake.calls
    assert len(grid) == 3 and grid[0] >= 1 and grid[1:] == (1, 1)
    names = kernel.arg_names
    assert len(args) == len(names)
    return dict(zip(names, args))


def _same_descriptor(operand, t, block):
    """The operand reads ``t`` with ``block`` boxes, and the JIT gets the descriptor it stands for."""
    assert type(operand) is TmaOperand and operand.base is t and operand.block_shape == block
    assert operand.shape == list(t.shape) and operand.strides == list(t.stride()) and operand.padding == "zero"
    desc = jit_arg(operand)
    assert isinstance(desc, TensorDescriptor)
    assert (desc.base, desc.shape, desc.strides, desc.block_shape) == (t, list(t.shape), list(t.stride()), block)


@pytest.mark.parametrize("causal", [False, True])
def test_forward_fast_launch_passes_every_argument(fast_launch, monkeypatch, causal):
    monkeypatch.setattr(kernels.dispatch, "num_sms", lambda device: 132)
    q = torch.randn(2, 4, 200, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 300, 64, dtype=torch.bfloat16) for _ in range(2))
    out, lse = torch.empty_like(q), torch.empty(2, 4, 200)
    fake = fast_launch(kernels._GLUON_FWD)
    cfg = kernels.gluon_forward_config(64, 200, 300, causal)
    kernels.forward_gluon(q, k, v, out, lse, causal, 0.125, **cfg)
    bound = _bound(fake, kernels._GLUON_FWD.kernel)
    bm, bn = cfg["block_m"], cfg["block_n"]
    for name, t, rows in (("q_desc", q, bm), ("k_desc", k, bn), ("v_desc", v, bn), ("o_desc", out, bm)):
        _same_descriptor(bound[name], t, [1, 1, rows, 64])
    assert bound["lse_ptr"] is lse and (bound["H"], bound["N"], bound["Nk"], bound["GROUP"]) == (4, 200, 300, 2)
    assert bound["CAUSAL"] is causal and bound["CONSUMERS"] == cfg.get("consumers", 2)


def test_backward_fast_launch_passes_every_argument(fast_launch, monkeypatch):
    monkeypatch.setattr(kernels.dispatch, "num_sms", lambda device: 132)
    q, do = (torch.randn(2, 4, 256, 128, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(2, 2, 256, 128, dtype=torch.bfloat16) for _ in range(2))
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    stats = torch.randn(8, 2, 256)
    dq_sum = torch.zeros(2, 4, 256, 128)
    cfg = dict(kernels.gluon_backward_config(128, 256, True))
    fake = fast_launch(kernels._GLUON_BWD)
    kernels.backward_gluon_kernel(do, q, k, v, stats, dq_sum, dk, dv, True, 0.1, **cfg)
    bound = _bound(fake, kernels._GLUON_BWD.kernel)
    bm, bn = cfg["block_m"], cfg["block_n"]
    for name, t, rows in (("q_desc", q, bm), ("k_desc", k, 2 * bn), ("v_desc", v, 2 * bn), ("do_desc", do, bm),
                          ("dk_desc", dk, bn), ("dv_desc", dv, bn)):
        _same_descriptor(bound[name], t, [1, 1, rows, 128])
    stats_desc = jit_arg(bound["stats_desc"])  # unswizzled boxes of (lse, delta)
    assert stats_desc.base is stats and stats_desc.block_shape == [1, 2, bm]
    assert stats_desc.layout.swizzle_byte_width == 0
    assert bound["dq_desc"].base is dq_sum and bound["dq_desc"].block_shape == kernels.dq_box(bm, 128, dq_from=cfg["dq_from"])
    assert bound["GROUP"] == 2 and bound["DQ"] == kernels.DQ_MODES[cfg["dq_from"]]


def test_tma_operand_keys_what_triton_specializes():
    x = torch.randn(2, 4, 64, 64, dtype=torch.float16)
    key = TmaOperand(x, [1, 1, 64, 64]).key
    assert key == TmaOperand(torch.randn(3, 1, 9, 64, dtype=torch.float16), [1, 1, 64, 64]).key  # sizes are runtime
    assert key != TmaOperand(x, [1, 1, 128, 64]).key
    assert key != TmaOperand(x.bfloat16(), [1, 1, 64, 64]).key
    assert key != kernels.row_stats_operand(torch.randn(4, 2, 64), 64).key
