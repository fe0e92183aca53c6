"""The Gluon attention kernels' launches without a GPU: through tiles.launch's fast path (a compiled
kernel called directly) each kernel gets every argument in its order, its TMA operands describing the
tensors as the checked descriptors of the launch that compiled it did."""
import pytest
import torch
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from tilecore import dispatch
from tilecore.ops.attention import configs, launch, plan
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
    monkeypatch.setattr(dispatch, "num_sms", lambda device: 132)
    q = torch.randn(2, 4, 200, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 300, 64, dtype=torch.bfloat16) for _ in range(2))
    out, lse = torch.empty_like(q), torch.empty(2, 4, 200)
    fake = fast_launch(launch.GLUON_FWD)
    cfg = configs.gluon_forward_config(64, 200, 300, causal)
    launch.forward_into(q, k, v, out, lse, causal, 0.125, path="gluon", config=cfg)
    bound = _bound(fake, launch.GLUON_FWD.kernel)
    bm, bn = cfg["block_m"], cfg["block_n"]
    for name, t, rows in (("q_desc", q, bm), ("k_desc", k, bn), ("v_desc", v, bn), ("o_desc", out, bm)):
        _same_descriptor(bound[name], t, [1, 1, rows, 64])
    assert bound["lse_ptr"] is lse and (bound["H"], bound["N"], bound["Nk"], bound["GROUP"]) == (4, 200, 300, 2)
    assert bound["CAUSAL"] is causal and bound["CONSUMERS"] == cfg.get("consumers", 2)


def test_backward_fast_launch_passes_every_argument(fast_launch, monkeypatch):
    monkeypatch.setattr(dispatch, "num_sms", lambda device: 132)
    q, do = (torch.randn(2, 4, 256, 128, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(2, 2, 256, 128, dtype=torch.bfloat16) for _ in range(2))
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    stats = torch.randn(8, 2, 256)
    dq_sum = torch.zeros(2, 4, 256, 128)
    cfg = dict(configs.gluon_backward_config(128, 256, True))
    fake = fast_launch(launch.GLUON_BWD)
    bwd_plan = plan.plan_backward(do, q, k, v, True, 0.1, path="gluon", config=cfg)
    launch.launch_backward_gluon_kernel(bwd_plan, do, q, k, v, stats, dq_sum, dk, dv, True, 0.1)
    bound = _bound(fake, launch.GLUON_BWD.kernel)
    bm, bn = cfg["block_m"], cfg["block_n"]
    for name, t, rows in (("q_desc", q, bm), ("k_desc", k, 2 * bn), ("v_desc", v, 2 * bn), ("do_desc", do, bm),
                          ("dk_desc", dk, bn), ("dv_desc", dv, bn)):
        _same_descriptor(bound[name], t, [1, 1, rows, 128])
    stats_desc = jit_arg(bound["stats_desc"])  # unswizzled boxes of (lse, delta)
    assert stats_desc.base is stats and stats_desc.block_shape == [1, 2, bm]
    assert stats_desc.layout.swizzle_byte_width == 0
    assert bound["dq_desc"].base is dq_sum and bound["dq_desc"].block_shape == launch.dq_box(bm, 128, dq_from=cfg["dq_from"])
    assert bound["GROUP"] == 2 and bound["DQ"] == configs.DQ_MODES[cfg["dq_from"]]


def test_tma_operand_keys_what_triton_specializes():
    x = torch.randn(2, 4, 64, 64, dtype=torch.float16)
    key = TmaOperand(x, [1, 1, 64, 64]).key
    assert key == TmaOperand(torch.randn(3, 1, 9, 64, dtype=torch.float16), [1, 1, 64, 64]).key  # sizes are runtime
    assert key != TmaOperand(x, [1, 1, 128, 64]).key
    assert key != TmaOperand(x.bfloat16(), [1, 1, 64, 64]).key
    assert key != launch.row_stats_operand(torch.randn(4, 2, 64), 64).key
