"""Context-parallel attention on 4 (or more) GPUs of one host (issue 38, past two GPUs): correctness
against one GPU and float64, then public fwd+bwd timing at B1 H32 D128 bf16 against one GPU at the
same total sequence, the ring's transfers by NCCL (margin 0, late order: the default past two ranks)
against the copy engines with ``copy_engine.ABOVE_TWO_RANKS`` on (double-buffered slots; never run on
GPUs before), the share of the communication hidden, peak memory per rank, and the napkin's step.

    torchrun --nproc_per_node 4 experiments/distributed/gpu_check4.py           (needs nvidia-h100-x4)
    torchrun --nproc_per_node 4 experiments/distributed/gpu_check4.py --dry     (gloo, CPU: the logic only)

Checks (worst rank; error over the rounding floor against float64, ours / one GPU's on the gathered
sequence): the copy engines' ring first (a failing protocol shows at once; its signal waits trap after
``--signal-timeout-s``), NCCL's ring, all-to-all (Hkv 2 on 4 ranks: K/V heads repeated), every
sequence uneven across the 2P zigzag chunks but one, causal and not, GQA and MQA, and a causal
32K case whose chunks (4096) are the timing's at 32K (the Gluon backward adding dQ in the kernel).
Each check reports the transport that actually ran (the copy engines may fall back to NCCL).

Timing per (N, causal), rank 0's lockstep medians (every rank's in the JSON): per transport the
ring's forward and backward with their transfers, the same steps with nothing sent (compute alone:
hidden = 1 - (with - compute) / the transfers' own time, and by the timeline's waits), the K/V hops
alone (GB/s a direction), the public call's fwd+bwd lockstep and "queued" (the GPU kept busy 5 ms
first, as in a training step) and its peak memory over the inputs; one GPU's fwd+bwd at N; all-to-all.
A wall-clock budget (``--budget-s``) skips the cases that would not fit (the JSON says which).
JSON: $OUT/distributed_gpu_check4.json, rewritten after every case; a short table printed last.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tilecore, experiments

from experiments.distributed import gpu_check as gc  # noqa: E402  (check_case, lockstep_ms, timeline_of, ...)
from tilecore.distributed import copy_engine  # noqa: E402
from tilecore.distributed import op as op_module  # noqa: E402
from tilecore.distributed import ring as ring_module  # noqa: E402
from tilecore.distributed import context_parallel_attention  # noqa: E402
from tilecore.distributed.ring import (poison_receive_buffers, ring_backward, ring_for, ring_forward,  # noqa: E402
                                       transfer_order)
from tilecore.ops.attention import attention  # noqa: E402

# name -> (ring.TRANSPORT, ring.ONE_PASS_SUMS_ABOVE_TWO); margin 0 all. "cef": the copy engines with the
# backward's sums past two ranks in one pass each (session 32, off by default)
VARIANTS = {"nccl": ("nccl", False), "ce": ("copy_engine", False), "cef": ("copy_engine", True)}


class variant:
    """Context: the ring's transport and one-pass sums as ``key`` (VARIANTS) names them."""

    def __init__(self, key: str):
        self.via, self.one_pass = VARIANTS[key]

    def __enter__(self):
        self.saved = (ring_module.set_transport(self.via), ring_module.set_one_pass_sums_above_two(self.one_pass))

    def __exit__(self, *exc):
        ring_module.set_transport(self.saved[0])
        ring_module.set_one_pass_sums_above_two(self.saved[1])

CHECKS = [  # (mode, causal, n, hq, hkv, d, dtype, variant); n = 4099: chunks of 513 and 512
    ("ring", True, 4099, 8, 2, 128, torch.bfloat16, "ce"),
    ("ring", True, 4099, 8, 2, 128, torch.bfloat16, "cef"),
    ("ring", True, 4099, 8, 2, 128, torch.bfloat16, "nccl"),
    ("ring", False, 4099, 8, 2, 128, torch.bfloat16, "nccl"),
    ("all_to_all", True, 4099, 8, 2, 128, torch.bfloat16, "nccl"),
    ("all_to_all", False, 4101, 8, 4, 128, torch.bfloat16, "nccl"),
    ("ring", False, 8195, 8, 8, 128, torch.bfloat16, "ce"),
    ("ring", False, 8195, 8, 8, 128, torch.bfloat16, "cef"),
    ("ring", False, 2048, 4, 1, 128, torch.bfloat16, "ce"),  # MQA, even chunks
    ("ring", True, 32768, 1, 1, 128, torch.bfloat16, "cef"),  # the timing's chunks at 32K (4096)
    ("ring", True, 32768, 1, 1, 128, torch.bfloat16, "ce"),
]


def transport_ran(group, device) -> str:
    """Which transport the ring took for the last call (the copy engines where their mailboxes exist
    and this group's peers were found able)."""
    if ring_module.TRANSPORT != "copy_engine":
        return "nccl"
    ok = copy_engine.known_available(group, device) and copy_engine.mailbox_bytes(group, device) > 0
    return "copy_engine" if ok else "nccl (fallback)"


def topology() -> dict:
    """nvidia-smi's link matrix and torch's peer access between every pair (rank 0 only)."""
    out = {}
    try:
        out["topo"] = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                                     timeout=20).stdout
    except Exception as err:  # noqa: BLE001
        out["topo"] = f"unavailable: {err}"
    try:
        count = torch.cuda.device_count()
        out["peer_access"] = [[i == j or torch.cuda.can_device_access_peer(i, j) for j in range(count)]
                              for i in range(count)]
    except Exception as err:  # noqa: BLE001
        out["peer_access"] = f"unavailable: {err}"
    return out


def time_case(n_total: int, causal: bool, heads: int, d: int, reps: int, variants, single: bool) -> dict:
    """One (N, causal) case, every rank n = N / P of the zigzag split (equal here)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    group = dist.group.WORLD
    n = n_total // world
    lengths = [n] * world
    scale = d ** -0.5
    g = torch.Generator(device=gc.DEVICE).manual_seed(rank + 17)
    q, k, v = (torch.randn(1, heads, n, d, generator=g, device=gc.DEVICE, dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn_like(q)
    row = {"N": n_total, "causal": causal, "n_per_rank": n, "variants": {}}
    kv_bytes = 2 * k.numel() * k.element_size()

    def record(name, times, into=None):
        every = gc.gathered([statistics.median(times)])
        into = row if into is None else into
        into[name] = every[0][0]
        into[name + "_ranks"] = [e[0] for e in every]

    with torch.no_grad():
        with variant("nccl"):
            out, lse = ring_forward(q, k, v, group, lengths, causal, scale)
        # the compute alone: the same steps, nothing sent (margin 0: the same grids either transport)
        fwd_c = lambda: ring_forward(q, k, v, group, lengths, causal, scale, ring=gc.ComputeOnlyRing(group))  # noqa: E731
        bwd_c = lambda: ring_backward(dout, None, q, k, v, out, lse, group, lengths, causal, scale,  # noqa: E731
                                      ring=gc.ComputeOnlyRing(group))
        record("fwd_compute_ms", gc.lockstep_ms(fwd_c, reps))
        record("bwd_compute_ms", gc.lockstep_ms(bwd_c, reps))
        for key in variants:
            cell = row["variants"][key] = {}
            with variant(key):
                through = ring_for(group, q.device, 0, transfer_order(None, 0), k, lengths)
                cell["ring"] = type(through).__name__
                cell["early"] = transfer_order(None, 0, through)
                kv_in = (torch.empty_like(k), torch.empty_like(v))
                sums, sums_in = (k.float(), v.float()), (torch.empty_like(k, dtype=torch.float32),
                                                         torch.empty_like(v, dtype=torch.float32))

                def hops(count, with_sums):  # as ring.py's tags: 2t the block used at t, 2t + 1 a sum
                    for step in range(count):
                        for work in through.exchange((k, v), kv_in, tag=2 * step):
                            work.wait()
                        through.release(2 * step)
                        if with_sums:
                            for work in through.exchange(sums, sums_in, tag=2 * step + 1):
                                work.wait()
                            through.release(2 * step + 1)

                record("fwd_transfer_ms", gc.lockstep_ms(lambda: hops(world - 1, False), reps), cell)
                record("bwd_transfer_ms", gc.lockstep_ms(lambda: hops(world - 1, True), reps), cell)
                hop_s = cell["fwd_transfer_ms"] / max(world - 1, 1) / 1e3
                cell["hop_gb_s"] = kv_bytes / hop_s / 1e9 if hop_s > 0 else None
                del kv_in, sums, sums_in
                fwd = lambda: ring_forward(q, k, v, group, lengths, causal, scale)  # noqa: E731
                bwd = lambda: ring_backward(dout, None, q, k, v, out, lse, group, lengths, causal, scale)  # noqa: E731
                record("fwd_ms", gc.lockstep_ms(fwd, reps), cell)
                record("bwd_ms", gc.lockstep_ms(bwd, reps), cell)
                cell["timeline"] = {"fwd": gc.timeline_of(fwd), "bwd": gc.timeline_of(bwd)}
        del out, lse

    local = [t.clone().requires_grad_() for t in (q, k, v)]

    def fwd_bwd(mode, key="nccl"):
        def run():
            with variant(key):
                o = context_parallel_attention(*local, causal=causal, mode=mode)
                torch.autograd.grad(o, local, dout)
        return run

    for key in variants:
        cell = row["variants"][key]
        gc.sync()
        base = gc.memory_allocated()
        gc.reset_peak()
        record("fwd_bwd_ms", gc.lockstep_ms(fwd_bwd("ring", key), reps), cell)
        cell["peak_extra_gb"] = (gc.peak() - base) / 1e9  # over the inputs: activations, buffers (not the mailboxes)
        if gc.DEVICE == "cuda":
            record("fwd_bwd_queued_ms", gc.lockstep_ms(fwd_bwd("ring", key), reps, ahead_ms=gc.AHEAD_MS),
                   cell)
    row["mailbox_gb"] = copy_engine.mailbox_bytes(group, q.device) / 1e9
    row["inputs_gb"] = 4 * q.numel() * q.element_size() / 1e9
    if heads % world == 0:
        record("a2a_fwd_bwd_ms", gc.lockstep_ms(fwd_bwd("all_to_all", "nccl"), reps))
    del local

    if single:  # one GPU, the whole sequence (every rank its own, at once)
        gq, gk, gv = (torch.randn(1, heads, n_total, d, generator=g, device=gc.DEVICE, dtype=torch.bfloat16)
                      for _ in range(3))
        gdout = torch.randn_like(gq)
        with torch.no_grad():
            record("single_fwd_ms", gc.lockstep_ms(lambda: attention(gq, gk, gv, causal=causal), reps))
        whole = [t.requires_grad_() for t in (gq, gk, gv)]

        def single_fwd_bwd():
            o = attention(*whole, causal=causal)
            torch.autograd.grad(o, whole, gdout)

        gc.sync()
        base = gc.memory_allocated()
        gc.reset_peak()
        record("single_fwd_bwd_ms", gc.lockstep_ms(single_fwd_bwd, reps))
        row["single_peak_extra_gb"] = (gc.peak() - base) / 1e9
        if gc.DEVICE == "cuda":
            record("single_fwd_bwd_queued_ms", gc.lockstep_ms(single_fwd_bwd, reps, ahead_ms=gc.AHEAD_MS))
        del whole, gq, gk, gv, gdout

    for key, cell in row["variants"].items():
        for p in ("fwd", "bwd"):
            transfer = cell[f"{p}_transfer_ms"]
            exposed = max(cell[f"{p}_ms"] - row[f"{p}_compute_ms"], 0.0)
            cell[f"{p}_hidden"] = 1 - min(exposed / transfer, 1.0) if transfer > 0 else 1.0
            # the slowest rank's with transfers against the slowest rank's compute alone
            exposed = max(max(cell[f"{p}_ms_ranks"]) - max(row[f"{p}_compute_ms_ranks"]), 0.0)
            cell[f"{p}_hidden_slowest"] = 1 - min(exposed / transfer, 1.0) if transfer > 0 else 1.0
            parts = cell["timeline"][p].get("parts") or []
            waits = sum(x[3] for x in parts if x[1] == "compute" and " wait" in " " + x[0])
            cell[f"{p}_waits_ms"] = waits
            cell[f"{p}_hidden_by_waits"] = 1 - min(waits / transfer, 1.0) if parts and transfer > 0 else None
        if single:
            cell["speedup_fwd_bwd"] = row["single_fwd_bwd_ms"] / cell["fwd_bwd_ms"]
            if "fwd_bwd_queued_ms" in cell:
                cell["speedup_fwd_bwd_queued"] = row["single_fwd_bwd_queued_ms"] / cell["fwd_bwd_queued_ms"]
    if single:
        flops = 4 * heads * n_total * n_total * d * (0.5 if causal else 1.0)
        row["single_fwd_tflops"] = flops / (row["single_fwd_ms"] * 1e-3) / 1e12
    return row


def napkin(row: dict, heads: int, d: int, world: int) -> dict:
    """The napkin's ring for the row (this checkout's calibration where benchmarks/ is beside it),
    per transport, with the lent pair's link (h100-x2) and with a link at the hop rate measured here;
    its step (one foreign forward step's attention) and hop against the measured."""
    import dataclasses

    from tilecore.napkin import ring as napkin_ring
    from tilecore.napkin import validate
    from tilecore.napkin.interconnect import H100_X2

    results_dir = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    gpu = validate.lab_gpu(validate.bench_files(results_dir)) if results_dir.is_dir() else "h100"
    out = {"calibration": str(results_dir) if results_dir.is_dir() else "none found (680 TFLOP/s)"}
    for key, cell in row["variants"].items():
        ce = VARIANTS[key][0] == "copy_engine" and cell.get("ring") == "CopyEngineRing"
        links = {"h100-x2": H100_X2}
        if cell.get("hop_gb_s"):
            bw = cell["hop_gb_s"] * 1e9
            links["measured"] = dataclasses.replace(H100_X2, name="measured here", bandwidth=bw, copy_bandwidth=bw)
        out[key] = {}
        for label, link in links.items():
            p = napkin_ring.predict(seq=row["N"], heads=heads, d=d, world=world, causal=row["causal"], gpu=gpu,
                                    link=link, one_gpu=False, sm_margin=0, dq_in_kernel=ring_module.DQ_IN_KERNEL,
                                    copy_engine=ce, one_pass_own_sums=VARIANTS[key][1])
            out[key][label] = {
                "fwd_ms": p.forward_s * 1e3, "bwd_ms": p.backward_s * 1e3, "hidden": p.hidden,
                "step_ms": p.step_compute_s * 1e3, "hop_ms": p.step_transfer_s * 1e3,
                "fwd_over_measured": p.forward_s * 1e3 / cell["fwd_ms"],
                "bwd_over_measured": p.backward_s * 1e3 / cell["bwd_ms"],
                # a step against the measured compute-only forward's mean step
                "step_over_measured": p.step_compute_s * 1e3 / (row["fwd_compute_ms"] / world),
                "hop_over_measured": p.step_transfer_s * 1e3 / (cell["fwd_transfer_ms"] / max(world - 1, 1))}
    return out


def tables(results) -> str:
    fmt = gc.fmt
    lines = ["", f"correctness on {results['world']} ranks (worst rank; error over the rounding floor against "
             "float64: ours / one GPU's; variant, and the transport that ran):",
             f"{'mode':<11}{'causal':<7}{'shape':<26}{'variant/ran':<20}{'out':>11}{'dq':>11}{'dk':>11}{'dv':>11}"
             f"{'lse':>9}"]
    for c in results["checks"]:
        if "error" in c:
            lines.append(f"{c['case']}: FAILED {c['error'].strip().splitlines()[-1][:90]}")
            continue
        r = c["result"]
        cells = "".join(f"{fmt(r[f'{x}_floor_x'])}/{fmt(r[f'{x}_single_floor_x'])}".rjust(11)
                        for x in ("out", "dq", "dk", "dv"))
        ran = f"{c.get('variant', '')}/{c['ran']}"[:19]
        lines.append(f"{c['mode']:<11}{str(c['causal']):<7}{c['shape']:<26}{ran:<20}{cells}"
                     f"{r['lse_abs_err']:>9.1e}" + ("" if r["finite"] == 1.0 else "  NOT FINITE"))
    lines += ["", f"public fwd+bwd, B1 H{results['heads']} D{results['d']} bf16, {results['world']} ranks (rank 0, ms); "
              "x1 = one GPU at N over it (q: GPU kept busy first); hid = transfers hidden (fwd/bwd, by compute-only; "
              "w: by the timeline's waits); hop GB/s a direction; GB a rank's peak over inputs; napkin p/m fwd/bwd, "
              "step p/m:",
              f"{'N':>7} {'c':<2}{'tr':<5}{'f+b':>8}{'x1':>6}{'f+b q':>8}{'x1 q':>6}{'fwd':>8}{'comp':>8}{'bwd':>8}"
              f"{'comp':>8}{'hid':>9}{'hid w':>9}{'hop':>6}{'GB':>6}{'napkin':>11}{'step':>6}"]
    for t in results["timing"]:
        if "error" in t or "skipped" in t:
            lines.append(f"{t['N']:>7} {'c' if t['causal'] else 'f':<2}"
                         f"{t.get('skipped') or t['error'].strip().splitlines()[-1][:100]}")
            continue
        for key, c in t["variants"].items():
            nap = (t.get("napkin") or {}).get(key, {}) if isinstance(t.get("napkin"), dict) else {}
            p = nap.get("h100-x2")
            lines.append(
                f"{t['N']:>7} {'c' if t['causal'] else 'f':<2}{key + ('' if c['ring'] != 'Ring' or key == 'nccl' else '!'):<5}"
                f"{fmt(c['fwd_bwd_ms']):>8}{fmt(c.get('speedup_fwd_bwd')):>6}{fmt(c.get('fwd_bwd_queued_ms')):>8}"
                f"{fmt(c.get('speedup_fwd_bwd_queued')):>6}{fmt(c['fwd_ms']):>8}{fmt(t['fwd_compute_ms']):>8}"
                f"{fmt(c['bwd_ms']):>8}{fmt(t['bwd_compute_ms']):>8}"
                f"{fmt(c['fwd_hidden'], '.0%') + '/' + fmt(c['bwd_hidden'], '.0%'):>9}"
                f"{fmt(c.get('fwd_hidden_by_waits'), '.0%') + '/' + fmt(c.get('bwd_hidden_by_waits'), '.0%'):>9}"
                f"{fmt(c.get('hop_gb_s'), '.0f'):>6}{fmt(c['peak_extra_gb']):>6}"
                f"{(fmt(p['fwd_over_measured']) + '/' + fmt(p['bwd_over_measured'])) if p else '-':>11}"
                f"{fmt(p['step_over_measured']) if p else '-':>6}")
        lines.append(f"{'':>10}one GPU f+b {fmt(t.get('single_fwd_bwd_ms'))} (q {fmt(t.get('single_fwd_bwd_queued_ms'))}), "
                     f"{fmt(t.get('single_peak_extra_gb'))} GB; all-to-all f+b {fmt(t.get('a2a_fwd_bwd_ms'))}; "
                     f"mailboxes {fmt(t.get('mailbox_gb'))} GB")
    lines.append("tr: ce! = asked for the copy engines, ran NCCL's ring")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="32768,65536,131072")
    parser.add_argument("--causal-only-from", type=int, default=10 ** 9,
                        help="time only the causal mask from this total length up")
    parser.add_argument("--cases", default="",
                        help="timing cases in this order, e.g. 32768c,131072c,65536f (c causal, f full); "
                             "overrides --sizes")
    parser.add_argument("--check-n-max", type=int, default=10 ** 9,
                        help="only the checks of at most this many positions")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--variants", default="nccl,ce", help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--skip-check", action="store_true", help="no checks (as --checks none)")
    parser.add_argument("--checks", default="all",
                        help="all, none, or the variants whose checks run (e.g. cef,nccl; all-to-all's are nccl)")
    parser.add_argument("--no-single", action="store_true")
    parser.add_argument("--budget-s", type=float, default=195.0,
                        help="skip a timing case whose estimate would end past this many seconds of wall")
    parser.add_argument("--nccl-timeout", type=float, default=90.0)
    parser.add_argument("--signal-timeout-s", type=float, default=45.0,
                        help="the copy engines' signal waits trap after this (copy_engine.TIMEOUT_MS)")
    parser.add_argument("--dry", action="store_true", help="CPU tensors on gloo, small sizes (the logic only)")
    args = parser.parse_args()
    variants = [x for x in args.variants.split(",") if x]
    if args.skip_check:
        args.checks = "none"
    began = time.time()

    checks = CHECKS
    if args.dry:
        gc.DEVICE = "cpu"
        checks = [(m, c, min(n, 37 if n < 30000 else 45), min(hq, 4), min(hkv, 2), 16, dt, via)
                  for m, c, n, hq, hkv, d, dt, via in CHECKS]
        args.sizes, args.heads, args.d = "64,96", 4, 16
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=args.nccl_timeout))
    copy_engine.set_above_two_ranks(True)  # the copy engines past two ranks: what this run measures
    copy_engine.set_signal_timeout_ms(int(args.signal_timeout_s * 1e3))
    op_module.set_fast_host(True)
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    device = torch.device(gc.DEVICE, torch.cuda.current_device()) if gc.DEVICE == "cuda" else torch.device("cpu")
    out_dir = Path(os.environ.get("OUT", "/tmp/out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "distributed_gpu_check4.json"
    results = {"world": world, "heads": args.heads, "d": args.d, "checks": [], "timing": [],
               "gpu": torch.cuda.get_device_name() if gc.DEVICE == "cuda" else "cpu (dry run)",
               "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
               "defaults": {"transport": ring_module.TRANSPORT, "above_two_ranks": "on in this run",
                            "dq_in_kernel": ring_module.DQ_IN_KERNEL, "fast_host": True}}
    if rank == 0 and gc.DEVICE == "cuda":
        results["topology"] = topology()
        print(results["topology"].get("topo", ""), flush=True)
        try:
            from experiments.common.meta import meta
            results["meta"] = meta()
        except Exception as err:  # noqa: BLE001
            results["meta"] = f"unavailable: {err}"

    def save():
        if rank == 0:
            results["wall_s"] = time.time() - began
            path.write_text(json.dumps(results, indent=1))

    failed = set()  # variants whose check failed (for another reason than memory): not timed
    if args.checks != "none":
        poison_receive_buffers()
        for mode, causal, n, hq, hkv, d, dtype, key in checks:
            entry = {"mode": mode, "causal": causal, "shape": f"n{n} h{hq}/{hkv} d{d} {str(dtype)[6:]}",
                     "case": f"{mode} causal={causal} n={n} h{hq}/{hkv} d{d} {key}", "variant": key}
            if args.checks != "all" and key not in args.checks.split(","):
                continue
            if n > args.check_n_max:
                continue
            if key in failed:
                entry["error"] = f"skipped: an earlier {key} check failed"
                results["checks"].append(entry)
                continue
            t0 = time.time()
            oom = False
            try:
                with variant(key if mode == "ring" else "nccl"):  # (check_case sets the transport again)
                    entry["result"] = gc.check_case(mode, causal, n, hq, hkv, d, dtype, None,
                                                    VARIANTS[key][0] if mode == "ring" else "nccl", True)
                    entry["ran"] = transport_ran(group, device) if mode == "ring" else "all_to_all"
                ok = True
            except Exception as err:  # noqa: BLE001
                entry["error"] = traceback.format_exc()
                ok = False
                oom = isinstance(err, torch.OutOfMemoryError)  # the float64 reference's, not the ring's
                print(f"rank {rank}: check {entry['case']} failed:\n{entry['error']}", flush=True)
            if not gc.all_ok(ok) and not gc.all_ok(ok or oom):
                failed.add(key)  # failed for another reason than memory: not timed
            entry["s"] = time.time() - t0
            results["checks"].append(entry)
            if rank == 0:
                print(f"check {entry['case']} ({entry['s']:.1f} s): {entry.get('result', 'failed')}", flush=True)
            gc.empty_cache()
            save()
        poison_receive_buffers(False)
    if failed & set(variants):
        variants = [v for v in variants if v not in failed]
        results["dropped"] = f"checks failed: {sorted(failed)}; timed {variants}"

    cases = [(int(s), c) for s in args.sizes.split(",") if s
             for c in ((True,) if int(s) >= args.causal_only_from else (True, False))]
    if args.cases:
        cases = [(int(x[:-1]), x[-1] == "c") for x in args.cases.split(",") if x]
        if any(x[-1] not in "cf" for x in args.cases.split(",") if x):
            parser.error("--cases: each a length followed by c (causal) or f (full)")
        if args.dry:  # the dry run's small sizes, the cases' masks and order
            cases = [(64 + 32 * i, c) for i, (_, c) in enumerate(cases)]
    # wall seconds per unit of work ((N / 32K)^2, half the pairs causal), by mask: a mask's first case
    # compiles its kernels, so only its later cases say what a case costs (either mask's figure serves)
    unit, seen = {}, set()
    for n_total, causal in cases:
        work = (n_total / 32768) ** 2 * (0.55 if causal else 1.0)
        per = unit.get(causal, unit.get(not causal))
        estimate = 1.2 * per * work if per is not None else 0.0
        if time.time() - began + estimate > args.budget_s:
            results["timing"].append({"N": n_total, "causal": causal,
                                      "skipped": f"skipped: estimated {estimate:.0f} s past the {args.budget_s:.0f} s budget"})
            save()
            continue
        reps = 5 if n_total <= 65536 else 3
        t0 = time.time()
        try:
            row = time_case(n_total, causal, args.heads, args.d, reps, variants, single=not args.no_single)
            ok = True
        except Exception:  # noqa: BLE001
            row = {"N": n_total, "causal": causal, "error": traceback.format_exc()}
            ok = False
            print(f"rank {rank}: timing N={n_total} causal={causal} failed:\n{row['error']}", flush=True)
        gc.all_ok(ok)
        row["s"] = time.time() - t0
        spent = max(x[0] for x in gc.gathered([row["s"]]))  # the slowest rank's
        if causal in seen:
            unit[causal] = spent / work
        seen.add(causal)
        if rank == 0 and ok:  # the napkin now (pure Python, seconds): a run cut short keeps it
            try:
                row["napkin"] = napkin(row, args.heads, args.d, world)
            except Exception:  # noqa: BLE001
                row["napkin"] = {"error": traceback.format_exc()}
        results["timing"].append(row)
        if rank == 0:
            print(f"timing N={n_total} causal={causal} ({row['s']:.1f} s): "
                  + json.dumps({k: v for k, v in gc.compact(row).items() if k not in ("variants", "napkin")}),
                  flush=True)
        gc.empty_cache()
        save()

    if rank == 0:
        save()
        print(tables(results))
        print(f"\nJSON: {path} ({time.time() - began:.0f} s)")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
