"""The public op's GLA (per-channel decay) backward on the GPU, end to end through autograd, after the lead turned
the chunk-parallel kernels on (configs_gla_bwd.GLA_BWD_PATH = "chunked", session 30): gradients of q, k, v, the log
decay and the initial state against the float64 recurrence (tilecore.ops.linear_attention.linear_attention_reference)
at a few shapes (a tail N, strong decays with a reset), then the op's forward + backward time at B16 H16 N4096 d128
(the kernels alone against the path before: gpu_gla_bwd.py's "shipped" row).

    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_op.py          # the GPU (< 60 s)
    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_op.py --s34    # d 64 (+ strong), d 32 (< 70 s), and
        the chunked backward at d 128 with CHUNKED dqk_dyn on / off in 2 interleaved rounds
    TRITON_INTERPRET=1 PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_op.py --smoke   # CPU, tiny shapes
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch

from tilecore import accuracy, linear_attention
from tilecore.ops.linear_attention import configs_gla_bwd, linear_attention_reference

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
DTYPE = torch.float16 if SMOKE else torch.bfloat16  # the interpreter's bf16 sums are wrong (triton #11604)


def inputs(B, N, H, D, strong=False, seed=0):
    torch.manual_seed(seed)
    q, k, v = (torch.randn(B, N, H, D, dtype=DTYPE, device=DEV) for _ in range(3))
    g = -torch.rand(B, N, H, D, device=DEV) * (2.0 if strong else 0.3)
    if strong:
        g[:, N // 2, :, : D // 4] = float("-inf")  # a reset of a quarter of the channels
    h0 = torch.randn(B, H, D, D, device=DEV)
    return q, k, v, g, h0


def check(B, N, H, D, strong):
    q, k, v, g, h0 = inputs(B, N, H, D, strong)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, g, h0)]
    o, ht = linear_attention(*leaves[:3], decay=leaves[3], initial_state=leaves[4], return_final_state=True)
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    got = torch.autograd.grad((o.float() * do.float()).sum() + (ht * dht).sum(), leaves)
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v, g, h0)]
    o_ref, ht_ref = linear_attention_reference(*ref_leaves[:3], decay=ref_leaves[3], scale=D ** -0.5,
                                               initial_state=ref_leaves[4])
    ref = torch.autograd.grad((o_ref * do.double()).sum() + (ht_ref * dht.double()).sum(), ref_leaves)
    row = dict(case=f"B{B} N{N} H{H} d{D} {'strong+reset' if strong else 'weak'}")
    row["o"] = round(accuracy.rel_rms(o, o_ref) / accuracy.rounding_floor(o_ref, DTYPE), 3)
    live = g > -100
    for name, a, r, x in zip(("dq", "dk", "dv", "dg", "dh0"), got, ref, (q, k, v, None, None)):
        row[f"{name}_finite"] = bool(torch.isfinite(a).all())
        if x is not None:
            row[name] = round(accuracy.rel_rms(a, r) / accuracy.rounding_floor(r, DTYPE), 3)
        else:
            row[name] = accuracy.rel_rms(a[live] if name == "dg" else a, r[live] if name == "dg" else r)
    row["pass"] = (all(row[f"{n}_finite"] for n in ("dq", "dk", "dv", "dg", "dh0")) and row["o"] <= 2.5
                   and all(row[n] <= 2.5 for n in ("dq", "dk", "dv")) and row["dg"] < 0.1 and row["dh0"] < 0.01)
    return row


def time_fwd_bwd():
    from triton.testing import do_bench
    q, k, v, g, h0 = inputs(16, 4096, 16, 128)
    leaves = [t.requires_grad_() for t in (q, k, v, g)]
    do = torch.randn_like(v)

    def step():
        o = linear_attention(*leaves[:3], decay=leaves[3])
        torch.autograd.grad(o, leaves, do)
    return do_bench(step, warmup=3, rep=200)


def time_dyn_rounds(rounds=2):
    """Session 34's confirmation: the composed chunked backward at B16 H16 N4096 d128 with CHUNKED dqk_dyn on and off,
    interleaved rounds (ms each)."""
    from triton.testing import do_bench

    from tilecore.ops.linear_attention import kernels_backward_gla_chunked
    from tilecore.ops.linear_attention.plan import IDENTITY, tl_plan
    q, k, v, g, h0 = inputs(16, 4096, 16, 128)
    do, dht, ht = torch.randn_like(v), torch.randn_like(h0), torch.randn_like(h0)
    p = tl_plan(q, v, g, IDENTITY, 64, diag=5)
    out = {"dyn on": [], "dyn off": []}
    for _ in range(rounds):
        for name, dyn in (("dyn on", True), ("dyn off", False)):
            out[name].append(round(do_bench(lambda: kernels_backward_gla_chunked.backward(
                p, do, q, k, v, g, h0, ht, dht, 128 ** -0.5, dqk_dyn=dyn), warmup=10, rep=40), 4))
            print(json.dumps(dict(bwd_d128=name, ms=out[name][-1])), flush=True)
    return out


def main():
    t0 = time.time()
    out = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out, exist_ok=True)
    shapes = [(1, 70, 2, 32, False), (1, 33, 2, 32, True)] if SMOKE else [
        (2, 1000, 4, 128, False), (1, 4097, 2, 128, True), (2, 517, 3, 64, False)]
    if "--s34" in sys.argv and not SMOKE:  # session 34: the widened dims (d 64 / d 32 with session 33's values and
        # dqk_dyn; d 128's kernels were checked by gpu_gla_bwd_s34.py in run 3, and the timing below runs them)
        shapes = [(2, 517, 3, 64, False), (1, 1000, 2, 64, True), (2, 517, 3, 32, False)]
    rows = []
    for shape in shapes:
        try:
            rows.append(check(*shape))
        except Exception as err:  # noqa: BLE001
            rows.append(dict(case=str(shape), error=f"{type(err).__name__}: {err}"[:300], **{"pass": False}))
        print(json.dumps(rows[-1]), flush=True)
    times = {}
    if not SMOKE:
        try:
            times[str(configs_gla_bwd.GLA_BWD_PATH)] = round(time_fwd_bwd(), 3)
            if "--s34" in sys.argv:
                times["bwd_d128_rounds"] = time_dyn_rounds()
        except Exception as err:  # noqa: BLE001
            times["error"] = f"{type(err).__name__}: {err}"[:300]
    res = dict(device=torch.cuda.get_device_name() if DEV == "cuda" else "cpu", torch=torch.__version__,
               checks=rows, fwd_bwd_ms=times, wall_s=round(time.time() - t0, 1))
    with open(os.path.join(out, "gla_op.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("\ncase | o | dq dk dv (x floor) | dg dh0 (rel) | pass")
    for r in rows:
        print(r.get("case"), "|", r.get("o"), "|", r.get("dq"), r.get("dk"), r.get("dv"), "|", r.get("dg"),
              r.get("dh0"), "|", r.get("pass"), r.get("error", ""))
    print("op fwd+bwd B16 H16 N4096 d128 bf16 (ms), GLA_BWD_PATH:", times)
    print(f"{res['wall_s']} s")


if __name__ == "__main__":
    main()
