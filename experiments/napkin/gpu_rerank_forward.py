"""The napkin's first Gluon forward tile (engine.rank_attention_configs with its key-step term) against the table's
row, in steady state, where the two differ (issue 36 gap 1: a napkin-derived plan at parity with the table?).

The napkin's first is whatever engine.rank_attention_configs ranks first at the commit run (a bucket where it is
the table's row is recorded as `same` and not timed). With the key-step term alone (notes/napkin/runs/
hh_rerank_s40a_run2_session40_h100.txt) the napkin's first was the table's row (or its stage twin, a tie in the
model) at every bucket with N >= 2048; it differed at short tiles: D128 causal N512 / N1024 (the table: 64 keys a step in 3 stages,
the napkin: 128 in 2), D64 causal N1024 (table: three consumers, 64 keys; napkin: two, 128), D64 N1024 (table: two
consumers carrying the pipeline across tiles; napkin: three) and D64 causal N512 (stages only). Each bucket at two
batch sizes (32K and 128K tokens, H 16): both rows (plan.napkin_forward_configs(..., 1): the napkin's first, then
the table's) checked against a float64 reference of batch 0 into a NaN-poisoned output, then timed in 3
interleaved rounds (do_bench medians over 100 ms, and CUDA-graph replays: GPU time).

    python experiments/napkin/gpu_rerank_forward.py [--smoke] [--deadline 130]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from experiments.common.gpu_script import Run, check, poisoned, time_rounds  # noqa: E402

# (D, N, causal): the buckets where the napkin's first differs from the table's row
BUCKETS = [(128, 1024, True), (128, 512, True), (64, 1024, True), (64, 1024, False), (64, 512, True)]
TOKENS = (2**15, 2**17)
HEADS = 16


def label(cfg: dict) -> str:
    return (f"m{cfg['block_m']}x{cfg.get('consumers', 2)} n{cfg['block_n']} s{cfg['stages']} q{cfg.get('q_buffers', 1)}"
            + (" qregs" if cfg.get("q_regs") else "") + (" carry" if cfg.get("carry") else ""))


def reference(q, k, v, causal):
    """float64 attention of batch 0 (B 1, H, N, D)."""
    q, k, v = (t[:1].double() for t in (q, k, v))
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def runner(q, k, v, causal, cfg, smoke):
    """One planned forward into fixed outputs: a call that repeats it (the launch alone), and the output."""
    from tilecore.ops.attention import launch, plan

    scale = q.shape[-1] ** -0.5
    out = poisoned(q)
    lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    p = plan.plan_forward(q, k, v, causal, scale, path="tl" if smoke else "gluon", config=None if smoke else cfg)
    return (lambda: launch.forward(p, q, k, v, out, lse, causal, scale)), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="CPU, TRITON_INTERPRET=1: one tiny bucket, the tl path")
    ap.add_argument("--deadline", type=float, default=130.0)
    args = ap.parse_args(argv)
    from tilecore.ops.attention import configs, plan

    run = Run("napkin_rerank_forward", deadline=args.deadline)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if args.smoke else torch.bfloat16  # the interpreter's bf16 dot is wrong
    jobs = [(d, n, causal, tokens // n) for d, n, causal in BUCKETS for tokens in TOKENS]
    if args.smoke:
        jobs = [(64, 64, True, 1)]
    for d, n, causal, b in jobs:
        name = f"D{d} N{n}{' causal' if causal else ''} B{b}"
        if run.left() < 12:
            run.errors.append(f"deadline: {name} and later not run")
            break
        rows = plan.napkin_forward_configs(b, HEADS, n, n, d, causal, 1)
        table = configs.gluon_forward_config(d, n, n, causal)
        napkin = rows[0]
        if napkin == table:
            run.row(name, napkin=label(napkin), table=label(table), same=True)
            continue
        g = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(b, HEADS, n, d, device=dev, generator=g).to(dtype) for _ in range(3))
        ref = reference(q, k, v, causal)
        fns, checks = {}, {}
        for who, cfg in (("napkin", napkin), ("table", table)):
            res = run.attempt(f"{name} {who}", runner, q, k, v, causal, cfg, args.smoke)
            if res is None:
                continue
            fn, out = res
            fn()
            checks[who] = check(out[:1], ref, tol=2.5)
            if checks[who]["pass"]:
                fns[who] = fn
        fields = dict(napkin=label(napkin), table=label(table), same=False,
                      **{f"{w}_err": c["err_over_floor"] for w, c in checks.items()},
                      **{"pass": all(c["pass"] for c in checks.values()) and len(checks) == 2})
        if not args.smoke and len(fns) == 2:
            t = time_rounds(fns, rounds=3, graph=True, warmup=25, rep=100, deadline=run)
            fields.update({k: v for k, v in t.items() if not k.endswith("_rounds")},
                          rounds={w: t[f"{w}_rounds"] for w in fns})
            fields["table_over_napkin"] = round(t["table_ms"] / t["napkin_ms"], 4)
            if "table_graph_ms" in t:
                fields["graph_table_over_napkin"] = round(t["table_graph_ms"] / t["napkin_graph_ms"], 4)
        run.row(name, **fields)
    run.finish(["name", "pass", "napkin", "table", "napkin_ms", "table_ms", "table_over_napkin",
                "graph_table_over_napkin", "napkin_err", "table_err"])
    return 0 if not run.errors and all(r.get("pass", True) for r in run.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
