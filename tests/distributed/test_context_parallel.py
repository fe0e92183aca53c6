"""context_parallel_attention on gloo, 2 and 3 processes (cp_pool.py; cp_jobs.py holds what each
rank runs): ring and all-to-all against one process's tilecore.attention on the whole sequence and
the float64 reference, forward, lse and gradients; causal zigzag, grouped-query heads, lengths that
do not divide, bf16 and fp16, Triton's interpreter, NaN and inf, torch.compile, and bad inputs."""
import pytest
import torch

from tilecore.distributed import context_parallel_attention, zigzag_shard

GRADS = ("dq", "dk", "dv")


def shapes(n_list, causal_list=(False, True)):
    # (b, hq, hkv): MHA, GQA, MQA (q heads divide by 2 and 3, for all-to-all); d = 8; n does not
    # divide by 2P for most, and n = 1 leaves some ranks an empty slice
    heads = ((2, 6, 6), (1, 6, 2), (1, 6, 1))
    return [dict(b=b, hq=hq, hkv=hkv, n=n, d=8, causal=c) for n in n_list for c in causal_list
            for b, hq, hkv in heads]


def check_float32(rows):
    """float32: the distributed results are one process's to float32's accumulation noise."""
    for rank, cases in rows.items():
        for row in cases or ():
            where = f"rank {rank} {row['case']}"
            assert row["finite"] and row["shapes_ok"], where
            assert row["out"]["vs_single"] < 2e-5, where
            assert row["lse"]["vs_single"] < 2e-5 and row["lse"]["vs_exact"] < 2e-5, where
            for g in GRADS:
                assert row[g]["vs_single"] < 5e-5, (where, g, row[g])


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("mode", ["ring", "all_to_all"])
def test_matches_one_process_float32(pool, world, mode):
    # every third case on session 29's host path (op.FAST_HOST off: the gather before the ring, the custom op)
    cases = [dict(c, mode=mode, early=i % 2 == 1, fast_host=i % 3 != 0) for i, c in enumerate(shapes([1, 7, 12, 17]))]
    check_float32(pool.run("compare", world=world, cases=cases))


@pytest.mark.parametrize("mode", ["ring", "all_to_all"])
def test_low_precision_near_the_rounding_floor(pool, mode):
    """bf16 and fp16 on torch's CPU kernels: error over the rounding floor against float64, next to
    one process's on the whole sequence. The ring rounds each step's O to the dtype before its
    float32 merge and each step's block gradients before their float32 sums, so it may exceed one
    process's error a little; all-to-all runs one attention per head, as one process does."""
    cases = [dict(b=1, hq=6, hkv=2, n=64, d=16, causal=c, mode=mode, dtype=dt)
             for c in (False, True) for dt in ("bfloat16", "float16")]
    rows = pool.run("compare", world=3, cases=cases)
    for rank, results in rows.items():
        for row in results:
            where = f"rank {rank} {row['case']}"
            assert row["finite"] and row["shapes_ok"], where
            assert row["lse"]["vs_exact"] < 2e-2, where
            for name in ("out",) + GRADS:
                mine, single = row[name]["floor_x"], row[name]["single_floor_x"]
                assert mine < 1.3 * single + 0.3, (where, name, row[name])


def test_triton_kernels_in_the_interpreter(pool):
    """The path a GPU runs: tilecore's Triton kernels (forward, and the backward given the merged O
    and lse) under Triton's interpreter, fp16 and float32; fp16 with an sm_margin of 3 of the
    interpreter's 4 SMs (the split-key kernel's splits follow it; transfers in the early order) and
    dQ summed by backward_adding_dq (ring.DQ_IN_KERNEL)."""
    cases = [dict(b=1, hq=2, hkv=1, n=20, d=16, causal=c, mode="ring", dtype=dt, interpret=True, early=early,
                  sm_margin=margin, dq_in_kernel=dq)
             for c, dt, early, margin, dq in ((True, "float16", None, 3, True), (False, "float32", False, 0, False))]
    rows = pool.run("compare", world=2, cases=cases, timeout=90)
    # three ranks, the sums past two in one pass each (ring.ONE_PASS_SUMS_ABOVE_TWO: own_sum's kernel)
    three = [dict(b=1, hq=2, hkv=1, n=23, d=16, causal=True, mode="ring", dtype="float16", interpret=True,
                  dq_in_kernel=True, one_pass=True)]
    rows = {(2, r): x for r, x in rows.items()} | {(3, r): x for r, x in
                                                   pool.run("compare", world=3, cases=three, timeout=90).items()}
    assert sum(len(x or ()) for (w, _), x in rows.items() if w == 3) == 3  # every rank ran the case
    for rank, results in rows.items():
        for row in results or ():
            where = f"rank {rank} {row['case']}"
            assert row["finite"] and row["shapes_ok"], where
            if row["case"]["dtype"] == "float32":
                assert row["out"]["vs_single"] < 2e-5 and row["lse"]["vs_single"] < 2e-5, where
                assert all(row[g]["vs_single"] < 5e-5 for g in GRADS), (where, row)
            else:
                assert all(row[x]["floor_x"] < 1.3 * row[x]["single_floor_x"] + 0.3 for x in ("out",) + GRADS), row


def test_gradient_of_lse_alone_and_of_out_alone(pool):
    cases = [dict(b=1, hq=3, hkv=3, n=9, d=8, causal=True, mode=m, dlse=dlse, out=not dlse)
             for m in ("ring", "all_to_all") for dlse in (False, True)]
    check_float32(pool.run("compare", world=3, cases=cases))


@pytest.mark.parametrize("mode", ["ring", "all_to_all"])
def test_nan_and_inf_propagate_as_one_process(pool, mode):
    for rank, result in pool.run("nonfinite", world=2, mode=mode, causal=True).items():
        if result is not None:
            assert result["same_nan"] and result["finite_diff"] < 2e-5, (rank, result)
    assert any(r and r["nan_rows"] for r in pool.run("nonfinite", world=3, mode=mode, causal=False).values())


def test_torch_compile_fullgraph(pool):
    for rank, result in pool.run("compiled", world=2, mode="ring", timeout=90).items():
        if result is not None:
            assert result["out"] < 1e-6 and result["grads"] < 1e-6, (rank, result)


BAD = {  # case -> (error type on every rank, words in it); rank-specific ones below
    "length": ("ValueError", "not the zigzag split of 13 positions"),
    "dtype": ("ValueError", "same dtype"),
    "causal": ("ValueError", "same causal"),
    "margin_differs": ("ValueError", "same sm_margin; the ranks' are [0, 1, 0]"),
    "heads": ("ValueError", "must divide by the group's size (3)"),
    "unshard": ("ValueError", "not a zigzag split"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_mismatched_inputs_raise_on_every_rank(pool, case):
    results = pool.run("bad_input", world=3, case=case)
    for rank, result in results.items():
        assert result is not None, rank
        kind, message = result
        assert kind == BAD[case][0] and BAD[case][1] in message, (rank, result)


@pytest.mark.parametrize("case, culprit, culprit_error", [
    ("rank_refuses", 1, ("ValueError", "must be 4-D")),
    ("not_a_tensor", 0, ("TypeError", "must be torch.Tensors")),
    ("scale", 0, ("TypeError", "scale must be None or a finite real number")),
    ("head_dim", 0, ("ValueError", "head_dim")),
    ("sm_margin", 2, ("ValueError", "sm_margin (SMs the persistent kernels leave free) must be >= 0")),
    ("sm_margin_type", 0, ("TypeError", "sm_margin must be None (the ring's default) or an int")),
])
def test_one_ranks_refusal_raises_on_every_rank(pool, case, culprit, culprit_error):
    results = pool.run("bad_input", world=3, case=case)
    for rank, (kind, message) in results.items():
        if rank == culprit:
            assert (kind, culprit_error[1] in message) == (culprit_error[0], True), (rank, message)
            assert "context_parallel_attention" in message
        else:
            assert kind == "ValueError" and f"rank(s) [{culprit}] of the group refused" in message, (rank, message)


def test_a_rank_that_never_calls_gives_a_timeout_not_a_hang(pool):
    results = pool.run("bad_input", world=3, case="timeout")
    assert results[1] == "did not call"
    for rank in (0, 2):
        kind, message = results[rank]
        assert kind == "TimeoutError" and "waited 1 s" in message, (rank, message)


def test_zigzag_unshard_roundtrip_and_gradient(pool):
    for world in (2, 3):
        for rank, result in pool.run("unshard", world=world).items():
            if result is not None:
                assert all(r["roundtrip"] and r["grad"] for r in result.values()), (world, rank, result)


def test_default_sm_margin_and_transfer_order(monkeypatch):
    """sm_margin=None: the ring's RING_SM_MARGIN on CUDA with more than one rank, else 0; transfers
    start early where the attention leaves SMs; the CPU's ring is the group's own (no capped group)."""
    from tilecore import dispatch
    from tilecore.distributed import ring

    monkeypatch.setattr(dispatch, "num_sms", lambda device: 132)
    cuda = torch.device("cuda", 0)
    assert ring.default_sm_margin(cuda, 2) == ring.RING_SM_MARGIN == 0  # the session 26 run's best
    monkeypatch.setattr(ring, "RING_SM_MARGIN", 8)
    assert ring.default_sm_margin(cuda, 2) == 8
    assert ring.default_sm_margin(cuda, 1) == ring.default_sm_margin(cuda, 4, "all_to_all") == 0
    assert ring.default_sm_margin(torch.device("cpu"), 3) == 0
    monkeypatch.setattr(dispatch, "num_sms", lambda device: 6)
    assert ring.default_sm_margin(cuda, 2) == 5
    assert ring.transfer_order(None, 8) and not ring.transfer_order(None, 0) and not ring.transfer_order(False, 8)
    assert ring.transfer_order(True, 0)
    assert ring.step_margin(8, True, False) == 0 and ring.step_margin(8, True, True) == 8
    assert ring.step_margin(8, False, False) == 8


def test_uninitialized_group_is_a_clear_error():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        context_parallel_attention(q, q, q)
    with pytest.raises(RuntimeError, match="not initialized"):
        zigzag_shard(q, 2)


def test_transfer_group_caps_nccl_ctas(monkeypatch):
    """With a margin the ring's transfers go through a group of the same ranks, in their order, whose
    NCCL kernels take at most that many CTAs; made once per ranks and cap (stand-ins for NCCL here)."""
    from types import SimpleNamespace

    from tilecore.distributed import groups

    made = []

    class Options:
        def __init__(self):
            self.config = SimpleNamespace(min_ctas=None, max_ctas=None)
            self.is_high_priority_stream = False

    def new_group(ranks, sort_ranks=True, **kwargs):
        made.append((ranks, dict(kwargs, sort_ranks=sort_ranks)))
        return f"group{len(made)}"

    monkeypatch.setattr(groups.dist, "ProcessGroupNCCL", SimpleNamespace(Options=Options), raising=False)
    monkeypatch.setattr(groups.dist, "new_group", new_group)
    monkeypatch.setattr(groups.dist, "get_process_group_ranks", lambda group: [3, 1, 2])
    monkeypatch.setattr(groups, "_transfer_groups", {})
    first = groups.transfer_group("parent", 8)
    assert groups.transfer_group("parent", 8) == first and len(made) == 1  # kept
    ranks, kwargs = made[0]
    assert ranks == [3, 1, 2] and not kwargs["sort_ranks"] and kwargs["backend"] == "nccl"
    options = kwargs["pg_options"]
    assert options.config.max_ctas == 8 and options.config.min_ctas == 1 and options.is_high_priority_stream
    groups.transfer_group("parent", 100)
    assert made[1][1]["pg_options"].config.max_ctas == groups.MAX_TRANSFER_CTAS
    monkeypatch.setattr(groups.dist, "new_group", lambda ranks, **kwargs: made.append(ranks))  # no sort_ranks
    assert groups.transfer_group("parent", 4) == "parent" and len(made) == 2  # unsorted ranks: left as they are
