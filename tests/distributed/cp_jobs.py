"""What the pool's processes run (cp_pool.py): each job is called on every rank as job(rank, **kwargs)
and returns plain data (numbers, strings) for the test to assert on. A job for a 2-rank group
returns None on rank 2, which is not in it."""
from __future__ import annotations

import datetime
import os
import traceback

GROUPS = {}  # world size -> the group of ranks 0..world-1 (None on ranks outside it)


def serve(rank, world, port, jobs, results):
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # three processes share two cores
        dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                                timeout=datetime.timedelta(seconds=60))
        GROUPS[world] = dist.group.WORLD
        pair = dist.new_group([0, 1])
        GROUPS[2] = pair if rank < 2 else None
        from tilecore.distributed import ring

        ring.poison_receive_buffers()  # NaN in each receive buffer: a transfer that did not fill one shows
        from tilecore.distributed import op

        op.set_fast_host(True)  # session 30's host path (the default; a case may turn it off)
        results.put((rank, True, "ready"))
    except BaseException:  # noqa: BLE001 (reported to the parent)
        results.put((rank, False, traceback.format_exc()))
        return
    while True:
        item = jobs.get()
        if item is None:
            break
        name, kwargs = item
        try:
            results.put((rank, True, globals()[name](rank, **kwargs)))
        except BaseException:  # noqa: BLE001
            results.put((rank, False, traceback.format_exc()))
    os._exit(0)  # no teardown: a test may have left a collective pending on a group it abandoned


def _interpret(on: bool) -> None:
    # the workers start under TRITON_INTERPRET=1; turning it off sends CPU tensors to torch's kernels
    os.environ["TRITON_INTERPRET"] = "1" if on else "0"


def _full_inputs(case, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, case.get("dtype", "float32"))
    b, hq, hkv, n, d = case["b"], case["hq"], case["hkv"], case["n"], case["d"]
    q = torch.randn(b, hq, n, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, n, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, n, d, generator=g).to(dtype)
    dout = torch.randn(b, hq, n, d, generator=g)
    dlse = torch.randn(b, hq, n, generator=g)
    return q, k, v, dout, dlse


def _max_abs(t) -> float:
    return t.abs().max().item() if t.numel() else 0.0


def _grad(loss, inputs):
    """d loss / d inputs, zeros where an input does not reach the loss (v, when only lse is used)."""
    import torch

    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(grads, inputs)]


def _loss(out, lse, dout, dlse, with_dlse, with_out=True):
    """sum(out dout) + sum(lse dlse), either term left out (autograd then hands the op no gradient
    for that output)."""
    terms = ([(out.float() * dout).sum()] if with_out else []) + ([(lse * dlse).sum()] if with_dlse else [])
    return sum(terms[1:], terms[0])


def compare(rank, world, cases):
    """For each case: context_parallel_attention's out, lse and gradients on this rank's slice against
    (a) one process's tilecore.attention on the whole sequence (same dtype) and (b) the float64
    reference; returns the errors."""
    import torch

    from tilecore import accuracy
    from tilecore.distributed import context_parallel_attention, op, ring, zigzag_shard
    from tilecore.ops.attention import attention, attention_reference

    group = GROUPS[world]
    if group is None:
        return None
    rows = []
    dq_in_kernel, one_pass = ring.DQ_IN_KERNEL, ring.ONE_PASS_SUMS_ABOVE_TWO  # the shipped settings
    for case in cases:
        _interpret(case.get("interpret", False))
        ring.TRANSFERS_EARLY = case.get("early", False)  # the ring's two transfer orders
        ring.DQ_IN_KERNEL = case.get("dq_in_kernel", False)  # dQ summed by backward_adding_dq
        op.set_fast_host(case.get("fast_host", True))  # the public call's host path, session 30's or 29's
        ring.set_one_pass_sums_above_two(case.get("one_pass", one_pass))  # past two ranks: the sums in one pass
        q, k, v, dout, dlse = _full_inputs(case)
        causal, mode, with_dlse = case["causal"], case["mode"], case.get("dlse", True)
        with_out = case.get("out", True)
        shard = lambda t: zigzag_shard(t, 2, group)  # noqa: E731

        # one process, the whole sequence
        whole = [t.clone().requires_grad_() for t in (q, k, v)]
        o1, l1 = attention(*whole, causal=causal, return_lse=True)
        g1 = _grad(_loss(o1, l1, dout, dlse, with_dlse, with_out), whole)
        # float64
        ref = [t.double().requires_grad_() for t in (q, k, v)]
        o64, l64 = attention_reference(*ref, causal=causal, scale=q.shape[-1] ** -0.5)
        g64 = _grad(_loss(o64, l64, dout.double(), dlse.double(), with_dlse, with_out), ref)
        # distributed
        local = [shard(t).requires_grad_() for t in (q, k, v)]
        out, lse = context_parallel_attention(*local, group=group, causal=causal, mode=mode, return_lse=True,
                                              sm_margin=case.get("sm_margin"))
        grads = _grad(_loss(out, lse, shard(dout), shard(dlse), with_dlse, with_out), local)

        row = {"case": case, "local_n": local[0].shape[2], "finite": bool(
            all(torch.isfinite(t).all() for t in (out, lse, *grads)))}
        row["shapes_ok"] = (out.shape == local[0].shape and out.dtype == q.dtype and lse.dtype == torch.float32
                            and all(g.shape == t.shape and g.dtype == t.dtype for g, t in zip(grads, local)))
        for name, mine, single, exact in (("out", out, o1, o64), ("dq", grads[0], g1[0], g64[0]),
                                          ("dk", grads[1], g1[1], g64[1]), ("dv", grads[2], g1[2], g64[2])):
            mine, single, exact_local = mine.detach(), single.detach(), shard(exact.detach())
            row[name] = {"vs_single": _max_abs(mine.double() - shard(single).double()),
                         "floor_x": accuracy.error_over_floor(mine, exact_local),
                         "single_floor_x": accuracy.error_over_floor(shard(single), exact_local)}
        lse, l1 = lse.detach(), l1.detach()
        row["lse"] = {"vs_single": _max_abs(lse.double() - shard(l1).double()),
                      "vs_exact": _max_abs(lse.double() - shard(l64))}
        rows.append(row)
    _interpret(True)
    ring.TRANSFERS_EARLY = False
    ring.DQ_IN_KERNEL = dq_in_kernel
    ring.set_one_pass_sums_above_two(one_pass)
    op.set_fast_host(True)
    return rows


def nonfinite(rank, world, mode, causal):
    """A NaN query row and an inf key on some rank: the NaN and inf masks of out and lse must be the
    single-process attention's; the other values its values."""
    import torch

    from tilecore.distributed import context_parallel_attention, zigzag_shard
    from tilecore.ops.attention import attention

    group = GROUPS[world]
    if group is None:
        return None
    _interpret(False)
    q, k, v, _, _ = _full_inputs(dict(b=1, hq=6, hkv=1, n=11, d=8))
    q[0, 1, 7] = float("nan")  # one query row
    k[0, 0, 4, 3] = float("inf")  # one key: every row that sees it gets NaN
    o1, l1 = attention(q, k, v, causal=causal, return_lse=True)
    out, lse = context_parallel_attention(*(zigzag_shard(t, 2, group) for t in (q, k, v)), group=group,
                                          causal=causal, mode=mode, return_lse=True)
    o1, l1 = zigzag_shard(o1, 2, group), zigzag_shard(l1, 2, group)
    same_nan = torch.equal(torch.isnan(out), torch.isnan(o1)) and torch.equal(torch.isnan(lse), torch.isnan(l1))
    ok = torch.isfinite(o1)
    _interpret(True)
    return {"same_nan": same_nan, "nan_rows": int(torch.isnan(l1).sum()),
            "finite_diff": (out[ok] - o1[ok]).abs().max().item() if ok.any() else 0.0}


def compiled(rank, world, mode):
    """torch.compile(fullgraph=True) of a function calling context_parallel_attention, forward and
    backward, against eager."""
    import torch

    from tilecore.distributed import context_parallel_attention, zigzag_shard

    group = GROUPS[world]
    if group is None:
        return None
    _interpret(False)
    q, k, v, dout, _ = _full_inputs(dict(b=1, hq=4, hkv=2, n=10, d=8))

    def step(q, k, v):
        return (context_parallel_attention(q, k, v, group=group, causal=True, mode=mode) * 2).sum(-1)

    local = [zigzag_shard(t, 2, group).requires_grad_() for t in (q, k, v)]
    eager = step(*local)
    g_eager = torch.autograd.grad(eager.sum(), local)
    fn = torch.compile(step, fullgraph=True, backend="aot_eager")
    got = fn(*local)
    g_got = torch.autograd.grad(got.sum(), local)
    _interpret(True)
    return {"out": (got - eager).abs().max().item(),
            "grads": max((a - b).abs().max().item() for a, b in zip(g_got, g_eager))}


def _caught(fn):
    try:
        fn()
    except Exception as err:  # noqa: BLE001 (the test reads the type and message)
        return type(err).__name__, str(err)
    return None


def bad_input(rank, world, case):
    """One rank's inputs (or settings) differ, as ``case`` says; returns (error type, message) on each
    rank, or None where it raised nothing."""
    import torch
    import torch.distributed as dist

    from tilecore.distributed import context_parallel_attention, zigzag_shard, zigzag_unshard

    group = GROUPS[world]
    if group is None:
        return None
    _interpret(False)
    hq = 4 if case == "heads" else 6
    q, k, v, _, _ = _full_inputs(dict(b=1, hq=hq, hkv=2, n=12, d=8))
    q, k, v = (zigzag_shard(t, 2, group) for t in (q, k, v))
    kwargs = dict(group=group, causal=False, mode="ring")
    if case == "length" and rank == 1:  # one position too many: (4, 5, 4) is not 13's (5, 4, 4)
        q, k, v = (torch.cat([t, t[:, :, :1]], 2) for t in (q, k, v))
    elif case == "dtype" and rank == 1:
        q, k, v = q.half(), k.half(), v.half()
    elif case == "causal" and rank == 1:
        kwargs["causal"] = True
    elif case == "heads":
        kwargs["mode"] = "all_to_all"
    elif case == "rank_refuses" and rank == 1:
        q = q[0]  # 3-D
    elif case == "not_a_tensor" and rank == 0:
        q = None
    elif case == "scale" and rank == 0:
        kwargs["scale"] = "big"
    elif case == "margin_differs" and rank == 1:
        kwargs["sm_margin"] = 1
    elif case == "sm_margin" and rank == 2:
        kwargs["sm_margin"] = -1
    elif case == "sm_margin_type" and rank == 0:
        kwargs["sm_margin"] = 1.5
    elif case == "head_dim" and rank == 0:
        q = torch.randn(1, 6, q.shape[2], 300)
    elif case == "unshard":
        x = q if rank else torch.cat([q, q], 2)
        return _caught(lambda: zigzag_unshard(x, 2, group))
    elif case == "timeout":  # rank 1 never calls: the others time out
        fresh = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=5))
        if rank == 1:
            return "did not call"
        kwargs.update(group=fresh, timeout=1.0)
    result = _caught(lambda: context_parallel_attention(q, k, v, **kwargs))
    _interpret(True)
    return result


def unshard(rank, world):
    """zigzag_unshard(zigzag_shard(x)) is x on every rank, and its gradient sums every rank's."""
    import torch

    from tilecore.distributed import zigzag_shard, zigzag_unshard

    group = GROUPS[world]
    if group is None:
        return None
    results = {}
    for n in (1, 7, 12):
        x = torch.randn(2, n, 3, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
        weights = [torch.randn(2, n, 3, generator=torch.Generator().manual_seed(100 + r), dtype=torch.float64)
                   for r in range(world)]
        local = zigzag_shard(x, 1, group).requires_grad_()
        whole = zigzag_unshard(local, 1, group)
        (grad,) = torch.autograd.grad((whole * weights[rank]).sum(), local)
        expected = zigzag_shard(sum(weights), 1, group)
        results[n] = {"roundtrip": torch.equal(whole, x), "grad": torch.allclose(grad, expected)}
    return results
