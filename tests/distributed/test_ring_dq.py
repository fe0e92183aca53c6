"""The ring's dQ sums without a pass of their own (attention.launch.gradients_adding_dq, which
ring_backward calls for every block): where the Gluon backward adds dQ in the kernel, its float32
reductions go into the ring's accumulator rows directly (no zeroing, no copy, no add); elsewhere
dQ is computed and added. The Gluon launch is checked without a GPU (tiles.launch's fast path with a
recording stand-in); the other path in the interpreter against gradients()."""
import pytest
import torch

from tilecore import dispatch
from tilecore.ops.attention import configs, launch, plan
from tilecore.ops.attention.op import backward_adding_dq


def _bound(fake, kernel):
    (grid, args), = fake.calls
    return dict(zip(kernel.arg_names, args))


def test_gluon_kernel_adds_into_the_accumulator_rows(fast_launch, monkeypatch):
    monkeypatch.setattr(dispatch, "num_sms", lambda device: 132)
    B, H, Hkv, N, D = 1, 4, 2, 256, 128
    q, do, out = (torch.randn(B, H, N, D, dtype=torch.bfloat16) for _ in range(3))
    k, v = (torch.randn(B, Hkv, N, D, dtype=torch.bfloat16) for _ in range(2))
    lse = torch.randn(B, H, N)
    accumulator = torch.randn(B, H, 3 * N, D)  # the ring's float32 dQ; this block's rows in the middle
    rows = accumulator[:, :, N:2 * N]
    before = accumulator.clone()
    cfg = dict(configs.gluon_backward_config(D, N, True), dq_from="fused")
    p = plan.plan_backward(do, q, k, v, True, 0.1, path="gluon", config=cfg)
    bwd = fast_launch(launch.GLUON_BWD)
    preprocess = []

    def recorded_preprocess(out, dout, lse, dlse, **options):  # the tl preprocess: the interpreter's here
        preprocess.append(options)
        return torch.empty(B, H, N), torch.empty(1, 1, 1, D), torch.zeros(B * H, 2, N)
    monkeypatch.setattr(launch, "backward_preprocess", recorded_preprocess)
    dk, dv = launch.gradients_adding_dq(p, do, q, k, v, out, lse, None, rows, True, 0.1)
    assert dk.shape == k.shape and dv.shape == v.shape
    dq_desc = _bound(bwd, launch.GLUON_BWD.kernel)["dq_desc"]
    assert dq_desc.base is rows and dq_desc.strides == list(rows.stride())  # the accumulator's rows, as they are
    assert dq_desc.block_shape == launch.dq_box(cfg["block_m"], D, "fused")
    (options,) = preprocess
    assert not options.get("dq_sum") and options["row_stats"]  # no zeroed dQ buffer
    assert torch.equal(accumulator, before)  # nothing zeroed, copied or added on the host side


def test_other_paths_add_the_computed_dq():
    """The tl kernels in the interpreter: dK, dV as gradients() gives them, dQ added (float32) to
    the accumulator's rows, the rest untouched."""
    q, do = (torch.randn(1, 2, 12, 16, dtype=torch.float16) for _ in range(2))
    k, v = (torch.randn(1, 1, 12, 16, dtype=torch.float16) for _ in range(2))
    out, lse = launch.outputs(plan.plan_forward(q, k, v, True, 0.25), q, k, v, True, 0.25)
    p = plan.plan_backward(do, q, k, v, True, 0.25)
    dq, dk, dv = launch.gradients(p, do, q, k, v, out, lse, None, True, 0.25)
    accumulator = torch.randn(1, 2, 20, 16)
    before = accumulator.clone()
    gk, gv = backward_adding_dq(do, q, k, v, out, lse, None, accumulator[:, :, 4:16], True, 0.25, sm_margin=1)
    assert torch.equal(gk, dk) and torch.equal(gv, dv)
    assert torch.equal(accumulator[:, :, 4:16], before[:, :, 4:16] + dq.float())
    assert torch.equal(accumulator[:, :, :4], before[:, :, :4])
    assert torch.equal(accumulator[:, :, 16:], before[:, :, 16:])
    with pytest.raises(ValueError, match="dq_sum must be float32"):
        launch.gradients_adding_dq(p, do, q, k, v, out, lse, None, accumulator[:, :, 4:16].half(), True, 0.25)
