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

Phase ``tiles`` (issue 36 gap 1: what a query tile costs beyond its key steps): not causal, 2^17 tokens of 16 heads at
N 128 .. 2048 (16,384 tiles of 128 rows at every N, N / block_n steps each), D128 and D64, 64 and 128 keys a step,
the pipeline carried across tiles or not (the table's other fields); each checked against float64 (batch 0) and
timed in interleaved rounds (do_bench, CUDA graphs). An SM's time a tile against its steps a tile, fitted by least
squares per config (GPU time): the slope is a step, the intercept a tile's fixed cost (its first step's S alone and
last P V alone where not carried, O's store, the hand-offs).

    python experiments/napkin/gpu_rerank_forward.py [--smoke] [--deadline 130] [--phases rerank,tiles]
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


TILE_NS = (128, 256, 512, 1024, 2048)
TILE_TOKENS = 2**17


def tile_configs(d: int) -> dict:
    """The sweep's rows at head dim d: the table's long-tile row with 64 / 128 keys a step, carried or not."""
    from tilecore.ops.attention import configs

    base = dict(configs.GLUON_FORWARD[d])
    out = {}
    for bn, stages in ((128, base["stages"]), (64, 3)):
        for carry in (False, True):
            cfg = dict(base, block_n=bn, stages=stages, carry=carry)
            out[label(cfg)] = cfg
    return out


def fit(xs: list, ys: list) -> tuple:
    """Least squares y = a + b x: (a, b)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def tiles_phase(run: Run, smoke: bool, dev: str, dtype) -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count if dev == "cuda" else 4
    per = {}  # label -> [(steps a tile, us an SM a tile, eager)]
    for d in ((64,) if smoke else (128, 64)):
        cfgs = tile_configs(d)
        for n in ((64,) if smoke else TILE_NS):
            b = 1 if smoke else TILE_TOKENS // n
            if run.left() < 15:
                run.errors.append(f"deadline: tiles D{d} N{n} and later not run")
                return
            g = torch.Generator(device=dev).manual_seed(1)
            q, k, v = (torch.randn(b, HEADS, n, d, device=dev, generator=g).to(dtype) for _ in range(3))
            ref = reference(q, k, v, False)
            fns = {}
            for name, cfg in cfgs.items():
                res = run.attempt(f"tiles D{d} N{n} {name}", runner, q, k, v, False, cfg, smoke)
                if res is None:
                    continue
                fn, out = res
                fn()
                c = check(out[:1], ref, tol=2.5)
                if not c["pass"]:
                    run.row(f"tiles D{d} N{n} {name}", **c)
                    continue
                fns[name] = fn
            if smoke:
                run.row(f"tiles D{d} N{n}", checked=len(fns))
                continue
            t = time_rounds(fns, rounds=3, graph=True, warmup=10, rep=50, deadline=run)
            tiles = b * HEADS * -(-n // 128)
            for name in fns:
                ms = t.get(f"{name}_graph_ms", t[f"{name}_ms"])
                steps = -(-n // cfgs[name]["block_n"])
                per.setdefault(f"D{d} {name}", []).append((steps, ms * 1e3 * sms / tiles, t[f"{name}_ms"] * 1e3 * sms / tiles))
                run.row(f"tiles D{d} N{n} {name}", **{"pass": True}, ms=t[f"{name}_ms"], graph_ms=t.get(f"{name}_graph_ms"),
                        steps=steps, us_a_tile=round(ms * 1e3 * sms / tiles, 4))
    for name, pts in per.items():
        if len(pts) >= 3:
            a, slope = fit([p[0] for p in pts], [p[1] for p in pts])
            run.row(f"fit {name}", tile_us=round(a, 4), step_us=round(slope, 4), points=len(pts),
                    residual_max_us=round(max(abs(a + slope * x - y) for x, y, _ in pts), 4))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="CPU, TRITON_INTERPRET=1: one tiny bucket, the tl path")
    ap.add_argument("--deadline", type=float, default=130.0)
    ap.add_argument("--phases", default="rerank", help="of: rerank, tiles")
    args = ap.parse_args(argv)
    from tilecore.ops.attention import configs, plan

    run = Run("napkin_rerank_forward", deadline=args.deadline)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if args.smoke else torch.bfloat16  # the interpreter's bf16 dot is wrong
    phases = set(args.phases.split(","))
    if "tiles" in phases:
        tiles_phase(run, args.smoke, dev, dtype)
    jobs = [(d, n, causal, tokens // n) for d, n, causal in BUCKETS for tokens in TOKENS] if "rerank" in phases else []
    if args.smoke and jobs:
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
                "graph_table_over_napkin", "napkin_err", "table_err", "steps", "us_a_tile", "tile_us", "step_us",
                "residual_max_us"])
    return 0 if not run.errors and all(r.get("pass", True) for r in run.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
