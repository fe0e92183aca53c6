"""attention_varlen's backward route for long sequences (configs.VARLEN_GLUON_BACKWARD_LONG, issue 35): the
sequences of at least ``long_from`` rows go to the fixed-length backward on views of the packed tensors, one call
each, and the varlen kernels take the rest. Through Triton's interpreter with the tl kernels standing in for the
Gluon ones (the same route: backward_kernels' blocks skip the routed sequences as backward_gluon's work tables
leave their entries out), against float64 into NaN-poisoned gradients; the Gluon launch's sliced tables with
the kernels recorded; the default off until a GPU run times it (experiments/attention/gpu_varlen_long.py)."""
import pytest
import torch

from tilecore import accuracy
from tilecore.ops.attention_varlen import configs
from tilecore.ops.attention_varlen import op as varlen
from tilecore.ops.attention_varlen.reference import varlen_reference

F16 = torch.float16


def cu_of(lengths):
    return torch.tensor([0] + torch.tensor(lengths, dtype=torch.long).cumsum(0).tolist(), dtype=torch.int32)


def grads64(q, k, v, cu, dout, dlse, causal):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, lse = varlen_reference(q64, k64, v64, cu, cu, causal=causal)
    loss = (out * dout.double()).sum() + (torch.where(torch.isneginf(lse), 0.0, lse) * dlse.double()).sum()
    return torch.autograd.grad(loss, (q64, k64, v64))


def test_long_sequences_are_those_past_the_length_with_keys_as_queries():
    lengths = [40, 3, 0, 70, 17, 33]
    cu = cu_of(lengths)
    assert varlen.long_sequences(cu, cu, 33, True, -1, -1, 0.0) == [(0, 40), (43, 70), (130, 33)]
    assert varlen.long_sequences(cu, cu.clone(), 41, False, -1, -1, 0.0) == [(43, 70)]
    assert varlen.long_sequences(cu, cu, 33, True, -1, -1, 0.0, host_cu=cu.tolist()) == [(0, 40), (43, 70),
                                                                                          (130, 33)]
    # off, a window, a softcap, keys not the queries' lengths: nothing routed
    assert varlen.long_sequences(cu, cu, 0, True, -1, -1, 0.0) == []
    assert varlen.long_sequences(cu, cu, 33, True, 100, -1, 0.0) == []
    assert varlen.long_sequences(cu, cu, 33, False, -1, 5, 0.0) == []
    assert varlen.long_sequences(cu, cu, 33, True, -1, -1, 30.0) == []
    assert varlen.long_sequences(cu, cu_of([40, 3, 0, 71, 16, 33]), 33, True, -1, -1, 0.0) == []
    assert varlen.long_sequences(cu, cu, 1000, True, -1, -1, 0.0) == []


@pytest.mark.parametrize("lengths, long_from", [([40, 3, 0, 70, 17, 33, 1], 33), ([5, 90, 90, 2], 64),
                                                ([64, 64, 63], 64), ([7, 9], 8)])
@pytest.mark.parametrize("tile, heads", [(128, 2), (32, 3), (16, 1)])
def test_routed_sequences_lead_the_work_tables(lengths, long_from, tile, heads):
    """The entries routed_entries counts are exactly the routed sequences' (work_table's longest-first order),
    both for the torch table and for the tl table kernels."""
    cu = cu_of(lengths)
    routed = varlen.long_sequences(cu, cu, long_from, True, -1, -1, 0.0)
    routed_ids = {b for b, n in enumerate(lengths) if n >= long_from}
    assert [n for _, n in routed] == [n for n in lengths if n >= long_from]
    skip = varlen.routed_entries(routed, tile, heads)
    for table in (varlen.work_table_torch(cu, cu, sum(lengths), heads, tile),
                  varlen.work_table(cu, cu, sum(lengths), heads, tile, ranked=True),
                  varlen.work_table(cu, cu, sum(lengths), heads, tile, ranked=False)):
        seqs = table[:, 0].tolist()
        assert set(seqs[:skip]) == routed_ids or (skip == 0 and not routed_ids)
        assert not routed_ids & set(seqs[skip:])
        rest = [s for s in seqs if s >= 0 and s not in routed_ids]
        assert sorted(rest) == sorted(s for s in seqs[skip:] if s >= 0)  # every other entry kept


CASES = [([40, 3, 0, 70, 17, 33, 1], 2, 2, True), ([40, 3, 0, 70, 17, 33, 1], 4, 2, False),
         ([5, 48, 2], 2, 1, True)]


@pytest.mark.parametrize("lengths, hq, hkv, causal", CASES, ids=["causal", "gqa-full", "one-long-causal"])
def test_routed_backward_matches_float64(lengths, hq, hkv, causal):
    """The routed backward (long sequences by the fixed path, the rest by the varlen kernels) against the float64
    reference, every row written (NaN-poisoned gradients), dlse through both parts."""
    d = 16
    cu = cu_of(lengths)
    total = sum(lengths)
    q = torch.randn(total, hq, d, dtype=F16)
    k, v = (torch.randn(total, hkv, d, dtype=F16) for _ in range(2))
    scale = d ** -0.5
    out, lse = varlen.forward_kernels(q, k, v, cu, cu, causal, scale, -1, -1, 0.0)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    assert varlen.long_sequences(cu, cu, 33, causal, -1, -1, 0.0)  # something is routed
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    varlen.backward_kernels(dout, q, k, v, out, lse, dlse, cu, cu, causal, scale, -1, -1, 0.0, grads=grads,
                            long_from=33)
    for name, g, r in zip("qkv", grads, grads64(q, k, v, cu, dout, dlse, causal)):
        assert not g.isnan().any(), f"d{name} not fully written"
        assert accuracy.error_over_floor(g, r) <= 3.0, name


def test_varlen_kernels_leave_the_routed_rows_to_the_fixed_path(monkeypatch):
    """With the fixed-length calls taken out, the routed sequences' rows stay poisoned and every other row is
    right: the varlen kernels neither write nor need them."""
    lengths, hq, d = [40, 3, 0, 70, 17, 33, 1], 2, 16
    cu = cu_of(lengths)
    total = sum(lengths)
    q, k, v = (torch.randn(total, hq, d, dtype=F16) for _ in range(3))
    out, lse = varlen.forward_kernels(q, k, v, cu, cu, True, d ** -0.5, -1, -1, 0.0)
    dout = torch.randn_like(out)
    called = []
    monkeypatch.setattr(varlen, "backward_fixed_rows", lambda routed, *args: called.append(routed))
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    varlen.backward_kernels(dout, q, k, v, out, lse, None, cu, cu, True, d ** -0.5, -1, -1, 0.0, grads=grads,
                            long_from=33)
    assert called == [[(0, 40), (43, 70), (130, 33)]]
    routed_rows = torch.zeros(total, dtype=torch.bool)
    for start, n in called[0]:
        routed_rows[start:start + n] = True
    refs = grads64(q, k, v, cu, dout, torch.zeros_like(lse), True)
    for name, g, r in zip("qkv", grads, refs):
        assert g[routed_rows].isnan().all(), f"d{name}: a routed row was written by the varlen kernels"
        assert not g[~routed_rows].isnan().any(), f"d{name}: a row of the rest was not written"
        assert accuracy.error_over_floor(g[~routed_rows], r[~routed_rows]) <= 3.0, name


def test_gluon_launch_slices_both_tables_and_calls_the_fixed_path_after(monkeypatch):
    """backward_gluon with the route: the dK/dV kernel and the dq kernel get their tables past the routed
    sequences' entries, and backward_fixed_rows runs last with the routed (start, rows)."""
    from tilecore.ops.attention import configs as fixed_configs

    order = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: order.append((self.name, grid, args, kwargs))

    monkeypatch.setattr(varlen, "GLUON_VARLEN_BWD", Recorder("dkdv"))
    monkeypatch.setattr(varlen, "GLUON_VARLEN_DQ", Recorder("dq"))
    monkeypatch.setattr(varlen.dispatch, "num_sms", lambda device: 132)
    monkeypatch.setattr(varlen, "backward_fixed_rows", lambda routed, *args: order.append(("fixed", routed)))
    lengths = [300, 20, 0, 140, 7]
    cu = cu_of(lengths)
    total = sum(lengths)
    q, dout, out = (torch.randn(total, 4, 128, dtype=torch.bfloat16) for _ in range(3))
    k = torch.randn(total, 2, 128, dtype=torch.bfloat16)
    lse = torch.randn(4, total)
    cfg = dict(configs.varlen_gluon_backward_config(128, True), dq_from="gluon")
    varlen.backward_gluon(dout, q, k, k, out, lse, None, cu, cu, True, 0.1, -1, -1, 0.0, config=cfg, long_from=128)
    assert [o[0] for o in order] == ["dkdv", "dq", "fixed"]
    assert order[2][1] == [(0, 300), (320, 140)]
    bn, dq_m = cfg["block_n"], fixed_configs.GLUON_DQ[128]["block_m"]
    from tilecore.ops.attention_varlen import gluon_backward as gb

    dkdv = dict(zip(gb.attention_varlen_bwd_kernel.arg_names, order[0][2]))
    dq = dict(zip(gb.attention_varlen_dq_kernel.arg_names, order[1][2]))
    skip_k = (3 + 2) * 2  # cdiv(300, 128) + cdiv(140, 128) key tiles, 2 kv heads
    skip_q = (3 + 2) * 4  # cdiv(300, 128) + cdiv(140, 128) query tiles, 4 q heads
    assert 2 * bn == 128 and 2 * dq_m == 128
    assert torch.equal(dkdv["work"], varlen.work_table_torch(cu, cu, total, 2, 2 * bn)[skip_k:])
    assert torch.equal(dq["work"], varlen.work_table_torch(cu, cu, total, 4, 2 * dq_m)[skip_q:])
    assert dkdv["num_tiles"] == len(dkdv["work"]) and dq["num_tiles"] == len(dq["work"])
    assert order[0][1] == (min(132, len(dkdv["work"])),)
    # long_stream (the fixed calls first on a stream of their own) is CUDA's: CPU tensors keep the order above
    order.clear()
    varlen.backward_gluon(dout, q, k, k, out, lse, None, cu, cu, True, 0.1, -1, -1, 0.0, config=cfg, long_from=128,
                          long_stream=True)
    assert [o[0] for o in order] == ["dkdv", "dq", "fixed"]


def test_route_is_off_until_a_gpu_run_times_it():
    assert configs.VARLEN_GLUON_BACKWARD_LONG == 0


def test_the_config_routes_backward_gluon_and_a_zero_turns_it_off(monkeypatch):
    """backward_gluon without long_from takes configs.VARLEN_GLUON_BACKWARD_LONG; long_from=0 routes nothing."""
    routed = []
    monkeypatch.setattr(varlen, "GLUON_VARLEN_BWD", type("R", (), {"__getitem__": lambda self, g: lambda *a, **k: 0})())
    monkeypatch.setattr(varlen, "GLUON_VARLEN_DQ", type("R", (), {"__getitem__": lambda self, g: lambda *a, **k: 0})())
    monkeypatch.setattr(varlen.dispatch, "num_sms", lambda device: 132)
    monkeypatch.setattr(varlen, "backward_fixed_rows", lambda r, *args: routed.append(r))
    monkeypatch.setattr(configs, "VARLEN_GLUON_BACKWARD_LONG", 100)
    cu = cu_of([300, 20, 99, 100])
    q = torch.randn(519, 2, 128, dtype=torch.bfloat16)
    lse = torch.randn(2, 519)
    varlen.backward_gluon(q, q, q, q, q, lse, None, cu, cu, True, 0.1, -1, -1, 0.0)
    varlen.backward_gluon(q, q, q, q, q, lse, None, cu, cu, True, 0.1, -1, -1, 0.0, long_from=0)
    assert routed == [[(0, 300), (419, 100)], []]


def test_the_backward_takes_the_forwards_copy_of_cu_seqlens(monkeypatch):
    """The autograd backward hands backward_gluon the offsets the forward copied to the host (HostOffsets: no
    sync in the backward); without a copy, none (the route then reads them itself)."""
    seen = []
    monkeypatch.setattr(varlen, "gluon_backward_fits", lambda *args: True)
    monkeypatch.setattr(varlen, "backward_gluon", lambda *args, host_cu=None: seen.append(host_cu) or (0, 0, 0))
    cu = cu_of([3, 5])
    q = torch.randn(8, 2, 16)
    lse = torch.randn(2, 8)

    class Host:
        def values(self):
            return [0, 3, 8]

    class Ctx:
        saved_tensors = (q, q, q, q, lse, cu, cu)
        options = (True, 0.25, -1, -1, 0.0)

    for host in (Host(), None):
        ctx = Ctx()
        ctx.host_cu = host
        varlen._backward(ctx, torch.randn_like(q), None)
    assert seen == [[0, 3, 8], None]


def test_the_forward_copies_cu_seqlens_only_for_the_route_on_cuda(monkeypatch):
    cu = cu_of([3, 5])
    assert not varlen.HostOffsets.wanted(cu, cu)  # a CPU tensor
    monkeypatch.setattr(configs, "VARLEN_GLUON_BACKWARD_LONG", 4096)
    assert not varlen.HostOffsets.wanted(cu, cu)
    meta = torch.empty(3, dtype=torch.int32, device="meta")
    assert not varlen.HostOffsets.wanted(meta, meta)
