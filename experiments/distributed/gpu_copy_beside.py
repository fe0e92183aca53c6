"""What a K/V hop by the copy engines costs the attention it runs beside (issue 38, session 33).

On 4 H100s the ring's forward ran 1.07-1.26x its compute alone while the timeline's waits for arrivals
were 0.01 ms a step (cp4d_run3_session33_h100x4): the attention steps themselves ran longer, by about
the hop's own time, whenever a copy ran beside them. This measures it directly, per rank, in lockstep
(every rank at once, as the ring runs), for one foreign forward step of the ring (B1 H32 D128 bf16, n x n
keys, no mask: tilecore.attention):

* attn: the attention alone;
* hop: one K/V push alone (the ring's copy-engine exchange into the next rank's mailbox, waited, released);
* beside: the attention's own time (events around it on the compute stream) with the push started just
  before it (ring.py's early order), and the whole (to the arrival's wait);
* peer: the same with a plain cross-device copy (``dst.copy_`` into a tensor on the next GPU:
  cudaMemcpyPeerAsync) on a side stream instead of the mailbox push;
* copy_ends_before_attention: whether the push's end event precedes the attention's end (the copy ran
  concurrently, not queued behind the persistent kernel).

Interference = (beside - attn) / hop: 0 = the copy costs the attention nothing; 1 = as if serialized.
The SM clock (torch.cuda.clock_rate, NVML) is sampled after each case.

    torchrun --nproc_per_node 2 experiments/distributed/gpu_copy_beside.py          (nvidia-h100-x2)
    torchrun --nproc_per_node 2 experiments/distributed/gpu_copy_beside.py --dry    (gloo, CPU: the logic)

JSON: $OUT/distributed_copy_beside.json; a short table last.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.distributed import gpu_check as gc  # noqa: E402
from tilecore.distributed import copy_engine  # noqa: E402
from tilecore.distributed import ring as ring_module  # noqa: E402
from tilecore.distributed.ring import ring_for, transfer_order  # noqa: E402
from tilecore.ops.attention import attention  # noqa: E402


def event():
    return torch.cuda.Event(enable_timing=True) if gc.DEVICE == "cuda" else None


def case(n: int, heads: int, d: int, reps: int) -> dict:
    world, rank = dist.get_world_size(), dist.get_rank()
    group = dist.group.WORLD
    g = torch.Generator(device=gc.DEVICE).manual_seed(rank + 5)
    q, k, v = (torch.randn(1, heads, n, d, generator=g, device=gc.DEVICE, dtype=torch.bfloat16) for _ in range(3))
    lengths = [n] * world
    through = ring_for(group, q.device, 0, transfer_order(None, 0), k, lengths)
    kv_in = (torch.empty_like(k), torch.empty_like(v))
    row = {"n": n, "ring": type(through).__name__}
    peer_dst = None
    if gc.DEVICE == "cuda" and torch.cuda.device_count() >= world:
        nxt = torch.device("cuda", (q.device.index + 1) % world)
        if torch.cuda.can_device_access_peer(q.device.index, nxt.index):
            peer_dst = (torch.empty_like(k, device=nxt), torch.empty_like(v, device=nxt))
    side = torch.cuda.Stream(q.device) if gc.DEVICE == "cuda" else None

    def attn():
        attention(q, k, v)

    def hop():
        for w in through.exchange((k, v), kv_in, tag=0):
            w.wait()
        through.release(0)

    marks = {}

    def beside():
        a, b = event(), event()
        works = through.exchange((k, v), kv_in, tag=0)  # the copy queued first (early order)
        copy_end = event()
        if copy_end is not None and getattr(through, "boxes", None) is not None:
            copy_end.record(through.boxes.stream)  # after the push and its FULL signal on the copy stream
        if a is not None:
            a.record()
        attention(q, k, v)
        if b is not None:
            b.record()
        for w in works:
            w.wait()
        through.release(0)
        marks["beside"] = (a, b, copy_end)

    def peer():
        a, b, c = event(), event(), event()
        if side is not None and peer_dst is not None:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                peer_dst[0].copy_(k, non_blocking=True)
                peer_dst[1].copy_(v, non_blocking=True)
                c.record(side)
        if a is not None:
            a.record()
        attention(q, k, v)
        if b is not None:
            b.record()
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)
        marks["peer"] = (a, b, c)

    def own(fn, key):
        """fn's lockstep total, and the attention's own time inside it (its events), per rep."""
        totals, inner, ends_before = [], [], []
        fn()  # warm
        gc.sync()
        for _ in range(reps):
            totals += gc.lockstep_ms(fn, 1, warmup=0)
            a, b, c = marks[key]
            if a is not None:
                b.synchronize()
                inner.append(a.elapsed_time(b))
                if c is not None:
                    c.synchronize()
                    ends_before.append(a.elapsed_time(c) < a.elapsed_time(b))
        return totals, inner, ends_before

    def med(name, xs):
        every = gc.gathered([statistics.median(xs) if xs else float("nan")])
        row[name] = every[0][0]
        row[name + "_ranks"] = [e[0] for e in every]

    med("attn_ms", gc.lockstep_ms(attn, reps))
    med("hop_ms", gc.lockstep_ms(hop, reps))
    total, inner, before = own(beside, "beside")
    med("beside_total_ms", total)
    med("beside_attn_ms", inner)
    row["copy_ends_before_attention"] = (sum(before) / len(before)) if before else None
    if peer_dst is not None:
        total, inner, before = own(peer, "peer")
        med("peer_total_ms", total)
        med("peer_attn_ms", inner)
        row["peer_copy_ends_before_attention"] = (sum(before) / len(before)) if before else None
        t0 = time.perf_counter()
        for _ in range(3):
            with torch.cuda.stream(side):
                peer_dst[0].copy_(k, non_blocking=True)
                peer_dst[1].copy_(v, non_blocking=True)
        side.synchronize()
        row["peer_copy_alone_ms"] = (time.perf_counter() - t0) * 1e3 / 3
    if gc.DEVICE == "cuda":
        try:
            row["sm_clock_mhz"] = torch.cuda.clock_rate(q.device)
        except Exception as err:  # noqa: BLE001
            row["sm_clock_mhz"] = f"unavailable: {err}"
    for key in ("beside", "peer"):
        if row.get(f"{key}_attn_ms") is not None and row.get("hop_ms"):
            row[f"{key}_interference"] = (row[f"{key}_attn_ms"] - row["attn_ms"]) / row["hop_ms"]
    flops = 4 * heads * n * n * d
    row["attn_tflops"] = flops / (row["attn_ms"] * 1e-3) / 1e12
    row["kv_mb"] = 2 * k.numel() * k.element_size() / 1e6
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8192,16384")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--dry", action="store_true")
    args = parser.parse_args()
    began = time.time()
    if args.dry:
        gc.DEVICE = "cpu"
        args.sizes, args.heads, args.d, args.reps = "32,48", 2, 16, 2
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=90))
    copy_engine.set_above_two_ranks(True)
    ring_module.set_transport("copy_engine")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {"world": world, "heads": args.heads, "d": args.d, "rows": [],
               "gpu": torch.cuda.get_device_name() if gc.DEVICE == "cuda" else "cpu (dry run)",
               "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    out_dir = Path(os.environ.get("OUT", "/tmp/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "distributed_copy_beside.json"
    for n in (int(s) for s in args.sizes.split(",") if s):
        row = case(n, args.heads, args.d, args.reps)
        results["rows"].append(row)
        if rank == 0:
            results["wall_s"] = time.time() - began
            path.write_text(json.dumps(results, indent=1))
            print(f"n={n}: " + json.dumps({k: v for k, v in row.items() if not k.endswith("_ranks")}), flush=True)
        gc.empty_cache()
    if rank == 0:
        fmt = gc.fmt
        print(f"\nB1 H{args.heads} D{args.d} bf16, {world} ranks, rank 0 (ms; interference = (attention beside a hop "
              "- alone) / the hop alone):")
        print(f"{'n':>6} {'ring':<15}{'attn':>8}{'TFLOP/s':>8}{'hop':>7}{'beside':>8}{'total':>8}{'interf':>7}{'ends<':>6}"
              f"{'peer':>8}{'interf':>7}{'ends<':>6}{'clock':>7}")
        for r in results["rows"]:
            print(f"{r['n']:>6} {r['ring']:<15}{fmt(r['attn_ms']):>8}{fmt(r['attn_tflops'], '.0f'):>8}"
                  f"{fmt(r['hop_ms']):>7}{fmt(r.get('beside_attn_ms')):>8}{fmt(r.get('beside_total_ms')):>8}"
                  f"{fmt(r.get('beside_interference')):>7}{fmt(r.get('copy_ends_before_attention')):>6}"
                  f"{fmt(r.get('peer_attn_ms')):>8}{fmt(r.get('peer_interference')):>7}"
                  f"{fmt(r.get('peer_copy_ends_before_attention')):>6}{str(r.get('sm_clock_mhz', '-'))[:6]:>7}")
        print(f"\nJSON: {path} ({time.time() - began:.0f} s)")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
