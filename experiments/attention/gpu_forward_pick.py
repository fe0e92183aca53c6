"""Does the Gluon forward's timed top-k pick (plan.NAPKIN_FORWARD_TOPK) cost speed at the sizes of the tiles v2
port check? Session 34's `port_check.py --only attn` (old bb6b420, which planned the table's row, vs HEAD) read
D64 N4096 / N8192 and D128 N4096 non-causal forwards 4% slower in each of 3 rounds with the same bits: the pick
keeps block_n (same bits) but may change stages or consumers.

For each size: every candidate row (plan.napkin_forward_configs, the table's row among them) checked against a
float64 reference into a NaN-poisoned output, then timed in steady state (do_bench medians, 3 interleaved rounds,
GPU time); and the row the timed pick chooses (plan.timed_forward_config, its cache emptied) on 3 fresh picks.

    PYTHONPATH=. python3 experiments/attention/gpu_forward_pick.py     (H100, < 80 s; writes $OUT/forward_pick.json)
"""
import json
import math
import os
import statistics
import time

import torch
from triton.testing import do_bench

from tilecore.ops.attention import configs, launch, plan  # noqa: F401  (launch registers the timed runner)

# name, B, H, N, D, causal: port_check's forward sizes that read slower, and one that did not
SIZES = [("D64 N4096", 16, 16, 4096, 64, False), ("D64 N8192", 8, 16, 8192, 64, False),
         ("D128 N4096", 16, 16, 4096, 128, False), ("D64 N2048 causal", 32, 16, 2048, 64, True)]


def label(cfg: dict) -> str:
    return (f"m{cfg['block_m']}x{cfg.get('consumers', 2)} n{cfg['block_n']} s{cfg['stages']} q{cfg.get('q_buffers', 1)}"
            + (" qregs" if cfg.get("q_regs") else "") + (" carry" if cfg.get("carry") else ""))


def check(cfg, causal):
    """O of a small case with this row against float64: error over bf16's rounding floor."""
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(1, 2, 700, D_CHECK, device="cuda", generator=g).bfloat16() for _ in range(3))
    scale = D_CHECK ** -0.5
    out = torch.full((1, 2, 700, D_CHECK), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(1, 2, 700, device="cuda")
    p = plan.plan_forward(q, k, v, causal, scale, path="gluon", config=cfg)
    launch.forward(p, q, k, v, out, lse, causal, scale)
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(700, 700, device="cuda", dtype=torch.bool).triu(1), -math.inf)
    ref = torch.softmax(s, -1) @ v.double()
    floor = (ref - ref.bfloat16().double()).pow(2).mean().sqrt()
    err = (out.double() - ref).pow(2).mean().sqrt()
    return bool(torch.isfinite(out).all()), float(err / floor)


def main():
    global D_CHECK
    t0 = time.time()
    res = []
    for name, B, H, N, D, causal in SIZES:
        D_CHECK = D
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", generator=g).bfloat16() for _ in range(3))
        scale = D ** -0.5
        rows = plan.napkin_forward_configs(B, H, N, N, D, causal, plan.NAPKIN_FORWARD_TOPK)
        table = configs.gluon_forward_config(D, N, N, causal)
        out = torch.empty_like(q)
        lse = torch.empty(B, H, N, device="cuda")
        plans = [plan.plan_forward(q, k, v, causal, scale, path="gluon", config=c) for c in rows]
        checks = [check(c, causal) for c in rows]
        times = [[] for _ in rows]
        for _ in range(3):
            for i, p in enumerate(plans):
                fn = lambda p=p: launch.forward(p, q, k, v, out, lse, causal, scale)  # noqa: E731
                fn()
                times[i].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
        picks = []
        for _ in range(3):
            plan.forget_forward_picks()
            picks.append(label(plan.timed_forward_config(q, k, v, causal, scale, 0.0, plan.NAPKIN_FORWARD_TOPK)))
        med = [statistics.median(t) for t in times]
        ti = rows.index(table)
        r = dict(case=name, B=B, H=H, N=N, D=D, causal=causal, table=label(table), picks=picks,
                 rows=[dict(row=label(c), ms=m, rounds=t, over_table=med[ti] / m, finite=ck[0], err_floor=ck[1])
                       for c, m, t, ck in zip(rows, med, times, checks)])
        res.append(r)
        print(f"{name} ({time.time() - t0:.0f} s): table {label(table)}; timed picks {picks}", flush=True)
        for row in r["rows"]:
            print(f"   {row['row']:28s} {row['ms']:.4f} ms  table/row {row['over_table']:.3f}  "
                  f"finite {row['finite']} err {row['err_floor']:.2f}x floor  rounds "
                  + " ".join(f"{x:.4f}" for x in row["rounds"]), flush=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, date=time.strftime("%Y-%m-%d %H:%M"),
                timing="GPU time, do_bench median of 3 interleaved rounds (rep 100 ms)", topk=plan.NAPKIN_FORWARD_TOPK)
    path = os.path.join(os.environ.get("OUT", "."), "forward_pick.json")
    json.dump(dict(meta=meta, sizes=res), open(path, "w"), indent=1)
    print(f"wrote {path} ({time.time() - t0:.0f} s)")


D_CHECK = 64
if __name__ == "__main__":
    main()
