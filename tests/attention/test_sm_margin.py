"""attention's ``sm_margin`` (SMs the persistent kernels leave free, FlashAttention-3's): the Gluon
plans' grids shrink by it and their causal schedules are built for the smaller grid (planned for an
H100 with meta tensors: dispatch.pretend); the split-key kernel's splits follow it; the math does
not change (the interpreter: results against float64 and against margin 0); bad margins are
refused naming what is accepted."""
import pytest
import torch

from tilecore import accuracy, dispatch
from tilecore.ops.attention import attention, attention_reference, configs, plan

H100 = dispatch.TARGETS["sm_90a"]  # 132 SMs


def meta(*shape):
    return torch.empty(*shape, dtype=torch.bfloat16, device="meta")


def schedule_programs(table: torch.Tensor, tiles: int) -> int:
    """Programs a balanced schedule table was built for (programs + 1 offsets, the ids, one spare)."""
    return table.numel() - tiles - 2


@pytest.mark.parametrize("causal", [False, True])
def test_gluon_grids_shrink_by_the_margin(causal):
    B, H, N, D = 1, 32, 8192, 128  # thousands of tiles: the grid is the SMs' count
    q, k, v = meta(B, H, N, D), meta(B, H, N, D), meta(B, H, N, D)
    with dispatch.pretend(H100):
        for margin in (0, 8, 131):
            fwd = plan.plan_forward(q, k, v, causal, D**-0.5, sm_margin=margin)
            bwd = plan.plan_backward(q, q, k, v, causal, D**-0.5, sm_margin=margin,
                                     config=dict(configs.gluon_backward_config(D, N, causal), dq_from="gluon"))
            assert fwd.path == bwd.path == bwd.dq.path == "gluon"
            assert fwd.grid == bwd.grid == bwd.dq.grid == (132 - margin,)
            if causal and margin < 131:  # the balanced schedules are the smaller grid's
                tile_rows = fwd.config["block_m"] * fwd.config.get("consumers", 2)
                assert schedule_programs(fwd.schedule, N // tile_rows * B * H) == 132 - margin
                dq_rows = 2 * bwd.dq.config["block_m"]
                assert schedule_programs(bwd.dq.schedule, N // dq_rows * B * H) == 132 - margin
                assert schedule_programs(bwd.schedule, N // (2 * bwd.config["block_n"]) * B * H) == 132 - margin
        small = plan.plan_forward(meta(1, 2, 256, D), meta(1, 2, 256, D), meta(1, 2, 256, D), causal, 0.1,
                                  sm_margin=8)
        assert small.grid[0] < 124  # fewer tiles than programs: one program a tile, as without a margin


def test_balanced_schedule_of_a_smaller_grid_runs_every_tile_once():
    tiles = 64 * 32
    for programs in (132, 124, 116):
        table = plan.balanced_table("forward", 16384, 16384, 256, 128, 32, 4, 1, programs)
        assert table is not None and int(table[0]) == programs + 1 and int(table[programs]) == table.numel() - 1
        ids = table[programs + 1:-1]
        assert sorted(ids.tolist()) == list(range(tiles))
        counts = table[1:programs + 1] - table[:programs]
        assert int(counts.min()) >= 1


def test_decode_splits_follow_the_margin_and_results_do_not():
    """The split-key kernel (one query against 512 keys) splits the keys for the interpreter's 4 SMs
    less the margin: 4, 2 and 1 ranges; O and lse match float64 at each, and each other."""
    q = torch.randn(1, 1, 1, 32, dtype=torch.float16)
    k, v = (torch.randn(1, 1, 512, 32, dtype=torch.float16) for _ in range(2))
    ref, ref_lse = attention_reference(q, k, v, scale=0.17)
    outs = []
    for margin, splits in ((0, 4), (2, 2), (3, 1)):
        p = plan.plan_forward(q, k, v, False, 0.17, sm_margin=margin)
        assert p.path == "decode" and p.grid[1] == splits
        out, lse = attention(q, k, v, scale=0.17, return_lse=True, sm_margin=margin)
        assert torch.isfinite(out).all()
        assert accuracy.error_over_floor(out, ref) <= 1.3
        assert torch.allclose(lse.double(), ref_lse, atol=1e-5)
        outs.append(out)
    assert all(torch.allclose(o.float(), outs[0].float(), atol=2e-3) for o in outs)


def test_forward_and_backward_identical_with_a_margin():
    """The tl kernels (a program a tile) ignore the margin: bitwise the same O, lse and gradients
    through attention's autograd at margin 0 and through the custom ops at margin 3."""
    q = torch.randn(1, 2, 17, 16, dtype=torch.float16, requires_grad=True)
    k, v = (torch.randn(1, 1, 17, 16, dtype=torch.float16, requires_grad=True) for _ in range(2))
    dout = torch.randn(1, 2, 17, 16, dtype=torch.float16)
    out, lse = attention(q, k, v, causal=True, return_lse=True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ops = torch.ops.tilecore
    out3, lse3 = ops.attention_forward(q.detach(), k.detach(), v.detach(), True, 0.25, -1, -1, 0.0, 3)
    grads3 = ops.attention_backward(dout, q.detach(), k.detach(), v.detach(), out3, lse3, None, True, 0.25,
                                    -1, -1, 0.0, 3)
    for a, b in zip((out, lse, *grads), (out3, lse3, *grads3)):
        assert torch.isfinite(a).all() and torch.equal(a, b)
    ref = attention_reference(*(t.detach().double() for t in (q, k, v)), causal=True)[0]
    assert accuracy.error_over_floor(out3, ref) <= 1.3


def test_bad_margins_are_refused():
    q = torch.randn(1, 2, 8, 16, dtype=torch.float16)
    for bad, err in ((True, TypeError), (1.0, TypeError), ("2", TypeError), (-1, ValueError), (4, ValueError)):
        with pytest.raises(err, match="sm_margin"):
            attention(q, q, q, sm_margin=bad)
    with pytest.raises(ValueError, match="interpreter stands for 4 SMs, so 0 to 3"):
        attention(q, q, q, sm_margin=4)
    with pytest.raises(ValueError, match="sm_margin"):
        attention(q, q, q, precision="fp8", sm_margin=2)
    with dispatch.pretend(H100):
        x = meta(1, 2, 512, 64)
        plan.plan_forward(x, x, x, False, 0.1, sm_margin=131)
        with pytest.raises(ValueError, match="GPU has 132 SMs, so 0 to 131"):
            plan.plan_forward(x, x, x, False, 0.1, sm_margin=132)
        with pytest.raises(ValueError, match="sm_margin"):
            plan.plan_backward(x, x, x, x, True, 0.1, sm_margin=-2)


def test_compiled_with_a_margin():
    """torch.compile(fullgraph=True) traces the custom ops with the margin, forward and backward."""
    q = torch.randn(1, 1, 16, 16, dtype=torch.float16, requires_grad=True)

    def f(x):
        return attention(x, x, x, causal=True, sm_margin=2)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out = compiled(q)
    (g,) = torch.autograd.grad(out.float().sum(), q)
    eager = f(q)
    (g_eager,) = torch.autograd.grad(eager.float().sum(), q)
    assert torch.equal(out, eager) and torch.equal(g, g_eager)
