"""Issue 36's L2 contradiction, counted: what tilecore's Gluon GEMM and the load-only ring probe move through the L2.

The preset's two L2 numbers disagree on a GEMM (notes/napkin/issue36_audit.md, gap 5): the Gluon GEMM at 8192^3 in
64 x 256 tiles (4 stages) implies 13.96 TB/s into the SMs from its timing and its tiling's bytes, while the GEMM's own
tile order loaded by tensor TMA without MMAs (``gemm_ring_probe``, experiments/napkin/cluster_multicast.cu) draws
7.9-8.3 TB/s. This script runs both in one process and counts with Nsight Compute (one launch of each kernel):

- ``time``: each kernel checked (the GEMM against the float64 product, the probe's per-block word sums exact) and
  timed in interleaved rounds (do_bench medians); "tiling" bytes: tiles x k steps x (BM + BN) x BK x 2.
- ``ncu``: L2 sectors by source unit and op (read, hit / miss), their spread over the L2 slices (.max / .avg), the
  L2 fabric between the two partitions, DRAM bytes, the SMs' crossbar intake, TMA / DSMEM counters where the GPU's
  metric list has them (names found by ``ncu --query-metrics``; an unknown name would end the profile), each a
  launch; per kernel: counted L2 -> SM bytes over the tiling's, and those bytes a second over the launch's duration.

The probe's variants: K-major B (bn rows of 128 bytes a k step, as before) and N-major B (64 rows of 2 bn contiguous
bytes a k step in bn / 64 boxes of 128 bytes: how the GEMM's row-major [K, N] B is loaded).

    python experiments/napkin/gpu_l2_count.py [--smoke] [--deadline 270] [--phases time,ncu]
    python experiments/napkin/gpu_l2_count.py --target       (what ncu runs: one launch of each kernel)

JSON: $OUT/napkin_l2_count.json.
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from experiments.common.gpu_script import Run, check, poisoned, time_rounds  # noqa: E402

M = N = K = 8192
# the Gluon GEMM's rows (configs.GLUON_CANDIDATES' form: BM, BN, BK, stages, consumers, warps): the table's for bf16
# 8192^3 and the two the L2 figures came from
GEMMS = {"gemm 128x256 s3 c2": (128, 256, 64, 3, 2, 8), "gemm 64x256 s4 c1": (64, 256, 64, 4, 1, 4),
         "gemm 128x128 s4 c2": (128, 128, 64, 4, 2, 8)}
# the probe's rings (gpu_cluster_multicast.GEMM_RINGS' form), each the GEMM's tile and stages
RINGS = (("ring 128x256 K-major", 128, 256, 3, 8, 3, 3, 0, 0), ("ring 128x256 N-major", 128, 256, 3, 8, 3, 3, 0, 1),
         ("ring 64x256 K-major", 64, 256, 4, 8, 3, 3, 0, 0), ("ring 64x256 N-major", 64, 256, 4, 8, 3, 3, 0, 1),
         ("ring 128x128 N-major", 128, 128, 4, 8, 3, 3, 0, 1),
         # each stage held about a k step's MMA time (as the GEMM's consumers hold it): do paced blocks' requests merge?
         ("ring 128x256 N-major paced", 128, 256, 3, 8, 3, 3, 1300, 1),
         ("ring 64x256 N-major paced", 64, 256, 4, 8, 3, 3, 650, 1))
KERNELS = "regex:gemm_kernel|gemm_ring_probe"
# counters (rollup .sum unless named); each kept only where the GPU's metric list has its base name
CORE = ["gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second", "lts__t_sectors.sum", "lts__t_sectors_op_read.sum",
        "lts__t_sectors_op_write.sum", "lts__t_sectors_srcunit_tex.sum", "lts__t_sectors_srcunit_tex_op_read.sum",
        "lts__t_sectors_srcunit_tex_op_read.max", "lts__t_sectors_srcunit_tex_op_read.avg",
        "lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum", "lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum",
        "lts__t_requests_srcunit_tex_op_read.sum", "lts__t_sectors_srcunit_ltcfabric.sum",
        "lts__t_sectors_srcnode_gpc.sum", "lts__cycles_active.avg", "lts__cycles_active.max", "dram__bytes_read.sum",
        "l1tex__m_xbar2l1tex_read_bytes.sum", "l1tex__t_sectors.sum",
        # the L2's own peak: sectors a cycle it can serve the SMs, its clock, how busy it was
        "lts__t_sectors_srcunit_tex_op_read.sum.peak_sustained", "lts__cycles_elapsed.avg.per_second",
        "lts__t_sectors.avg.pct_of_peak_sustained_elapsed"]
EXPLORE = re.compile(r"tma|dshared|dsmem|multicast|ltcfabric|xbar2l1tex|srcunit|srcnode|l1tex2xbar")


def gemm_operands(seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(K, N, device="cuda", generator=g).to(torch.bfloat16)
    return a, b


def gemm_fn(a, b, row, out):
    """The public plan of one Gluon row (plan.plan's ``config``, as gpu_topk_configs.py runs its candidates) into
    ``out``."""
    from tilecore.ops.gemm import launch, plan

    p = plan.plan(a, b, out_dtype=torch.bfloat16, config=plan.gluon_row(*row))
    assert p.path == "gluon", p.path
    return lambda: launch.launch(p, a, b, None, None, out=out)


def tiling_bytes(bm: int, bn: int, bk: int = 64) -> int:
    return (M // bm) * (N // bn) * (K // bk) * (bm + bn) * bk * 2


def kernels(sms: int):
    """[(name, fn, tiling bytes, check)] in launch order: the GEMMs, then the probe's rings."""
    from experiments.napkin.gpu_cluster_multicast import Probe, build, gemm_rings

    a, b = gemm_operands()
    out = []
    for name, row in GEMMS.items():
        c = poisoned(torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
        out.append((name, gemm_fn(a, b, row, c), tiling_bytes(row[0], row[1], row[2]), ("gemm", a, b, c)))
    with tempfile.TemporaryDirectory() as tmp:
        cubin, _ = build(tmp)
    probe = Probe(cubin)
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    for name, (launch, nbytes, expected) in gemm_rings(probe, flag, sms, RINGS).items():
        res = torch.empty(sms, dtype=torch.int64, device="cuda")
        out.append((name, (lambda launch=launch, res=res: launch(0, res)), nbytes, ("ring", launch, expected, flag)))
    return out, probe


def check_kernel(spec, sms: int) -> dict:
    if spec[0] == "gemm":
        _, a, b, c = spec
        return check(c, a.double() @ b.double(), tol=1.6)
    _, launch, expected, flag = spec
    sums = torch.full((sms,), -1, dtype=torch.int64, device="cuda")
    launch(1, sums)
    torch.cuda.synchronize()
    return {"pass": bool(torch.equal(sums, expected)) and int(flag.item()) == 0}


def target() -> None:
    """One launch of each kernel, in KERNELS' order (what ncu profiles)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ks, _probe = kernels(sms)
    for name, fn, _, _ in ks:
        fn()
        torch.cuda.synchronize()
        print("launched", name, flush=True)


def ncu_binary() -> str:
    from experiments.common.nsight import ncu_binary as find

    return find()


def available_metrics() -> tuple[set, str]:
    """The base metric names ncu lists for this GPU (empty where the query fails) and the query's error tail."""
    res = subprocess.run([ncu_binary(), "--query-metrics"], capture_output=True, text=True, timeout=120)
    names = {line.split()[0] for line in res.stdout.splitlines()
             if line.strip() and re.match(r"^[a-z0-9]+__[a-z0-9_]+", line.strip())}
    return names, (res.stderr or "")[-300:]


def base(metric: str) -> str:
    return metric.split(".")[0]


def profile(metrics: list[str], label: str, timeout: float) -> tuple[list[dict], str]:
    """ncu over ``python this --target`` (every matching launch), the raw page as rows of {metric: value} in base
    units, and ncu's output tail."""
    rep = os.path.join(tempfile.gettempdir(), f"l2_count_{label}")
    cmd = [ncu_binary(), "--clock-control", "none", "-f", "-o", rep, "-k", KERNELS, "--metrics", ",".join(metrics),
           sys.executable, __file__, "--target"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        text = proc.communicate(timeout=timeout)[0][-2500:]
    except subprocess.TimeoutExpired:  # ncu and its target both: the target must not hold the GPU after
        os.killpg(proc.pid, signal.SIGKILL)
        text = (proc.communicate()[0] or "")[-1500:]
        return [], f"timed out after {timeout:.0f} s: {text}"
    if not os.path.exists(rep + ".ncu-rep"):
        return [], text
    raw = subprocess.run([ncu_binary(), "-i", rep + ".ncu-rep", "--csv", "--page", "raw", "--print-units", "base"],
                         capture_output=True, text=True, timeout=120)
    table = list(csv.reader(io.StringIO(raw.stdout)))
    head = next((i for i, r in enumerate(table) if "Kernel Name" in r), None)
    if head is None:
        return [], text + raw.stderr[-500:]
    cols = table[head]
    rows = []
    for r in table[head + 2:]:  # (the units row after the header)
        if len(r) != len(cols):
            continue
        row = {}
        for c, v in zip(cols, r):
            try:
                row[c] = float(v.replace(",", ""))
            except ValueError:
                row[c] = v
        rows.append(row)
    return rows, text


def ncu_phase(run: Run, names: list[str], tiling: dict, timeout: float) -> None:
    listed, err = available_metrics()
    core = [m for m in CORE if not listed or base(m) in listed]
    run.extra["ncu_listed"] = len(listed)
    run.extra["ncu_core"] = core
    run.extra["ncu_missing"] = [m for m in CORE if listed and base(m) not in listed]
    explore = sorted(m for m in listed if EXPLORE.search(m))[:24]
    run.extra["ncu_explore_names"] = explore
    if not listed:
        run.errors.append(f"ncu --query-metrics listed nothing: {err}")
    rows, text = profile(core, "core", timeout)
    run.say("ncu core:", len(rows), "launches")
    if not rows and run.left() > 60:  # a name the GPU's ncu refuses: the few the figures need
        run.errors.append(f"ncu core failed, retried with four metrics: {text[-600:]}")
        core = ["gpu__time_duration.sum", "lts__t_sectors.sum", "lts__t_sectors_srcunit_tex_op_read.sum",
                "dram__bytes_read.sum"]
        rows, text = profile(core, "min", min(timeout, run.left() - 20))
    if len(rows) != len(names):
        run.errors.append(f"ncu core: {len(rows)} launches for {len(names)} kernels: {text[-1200:]}")
    for name, r in zip(names, rows):
        sec = r.get("gpu__time_duration.sum", 0.0) * 1e-9  # ns in base units
        tex = r.get("lts__t_sectors_srcunit_tex_op_read.sum", 0.0) * 32
        fields = dict(kernel=str(r.get("Kernel Name", ""))[:40], dur_ms=round(sec * 1e3, 4),
                      clock_mhz=round(r.get("sm__cycles_elapsed.avg.per_second", 0.0) / 1e6, 0),
                      tex_read_gb=round(tex / 1e9, 3), tiling_gb=round(tiling[name] / 1e9, 3),
                      counted_over_tiling=round(tex / tiling[name], 4) if tiling[name] else None,
                      counted_tbs=round(tex / sec / 1e12, 3) if sec else None,
                      tiling_tbs=round(tiling[name] / sec / 1e12, 3) if sec else None)
        mx, av = r.get("lts__t_sectors_srcunit_tex_op_read.max"), r.get("lts__t_sectors_srcunit_tex_op_read.avg")
        if mx and av:
            fields["slice_max_over_avg"] = round(mx / av, 3)
        hit, miss = (r.get(f"lts__t_sectors_srcunit_tex_op_read_lookup_{x}.sum") for x in ("hit", "miss"))
        if hit is not None and miss is not None and hit + miss:
            fields["hit_rate"] = round(hit / (hit + miss), 4)
        for key, metric, scale in (("fabric_gb", "lts__t_sectors_srcunit_ltcfabric.sum", 32),
                                   ("l2_all_gb", "lts__t_sectors.sum", 32), ("gpc_gb", "lts__t_sectors_srcnode_gpc.sum", 32),
                                   ("xbar2l1_gb", "l1tex__m_xbar2l1tex_read_bytes.sum", 1),
                                   ("dram_read_gb", "dram__bytes_read.sum", 1),
                                   ("l1tex_sectors_gb", "l1tex__t_sectors.sum", 32)):
            if metric in r:
                fields[key] = round(r[metric] * scale / 1e9, 3)
        peak, lclk = r.get("lts__t_sectors_srcunit_tex_op_read.sum.peak_sustained"), r.get(
            "lts__cycles_elapsed.avg.per_second")
        if peak and lclk:  # sectors a cycle at the L2's clock: its own figure for the SMs' reads, TB/s
            fields["l2_peak_tbs"] = round(peak * 32 * lclk / 1e12, 3)
            fields["l2_mhz"] = round(lclk / 1e6, 0)
        if "lts__t_sectors.avg.pct_of_peak_sustained_elapsed" in r:
            fields["l2_busy_pct"] = round(r["lts__t_sectors.avg.pct_of_peak_sustained_elapsed"], 1)
        if "lts__cycles_active.max" in r and r.get("lts__cycles_active.avg"):
            fields["lts_active_max_over_avg"] = round(r["lts__cycles_active.max"] / r["lts__cycles_active.avg"], 3)
        fields["raw"] = {k: v for k, v in r.items() if "__" in k}
        run.row(f"ncu {name}", **fields)
    if explore and run.left() > 60:
        rows, text = profile([m + ".sum" for m in explore], "explore", min(timeout, run.left() - 25))
        if len(rows) != len(names):
            run.errors.append(f"ncu explore: {len(rows)} launches: {text[-800:]}")
        for name, r in zip(names, rows):
            run.row(f"ncu+ {name}", raw={k: v for k, v in r.items() if "__" in k and v not in (0, 0.0)})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="no GPU: the probe's cubin and the tiling arithmetic")
    ap.add_argument("--deadline", type=float, default=270.0)
    ap.add_argument("--phases", default="time,ncu")
    args = ap.parse_args(argv)
    if args.target:
        target()
        return 0
    run = Run("napkin_l2_count", deadline=args.deadline)
    if args.smoke or not torch.cuda.is_available():
        from experiments.napkin.gpu_cluster_multicast import build

        with tempfile.TemporaryDirectory() as tmp:
            _, seconds = build(tmp)
        assert tiling_bytes(64, 256) == 4096 * 128 * 320 * 128  # 40 KiB a k step, 4096 tiles, 128 steps
        run.row("smoke", nvcc_s=round(seconds, 1), tiling_64x256_gb=tiling_bytes(64, 256) / 1e9,
                implied_tbs_at_715tflops=round(tiling_bytes(64, 256) / (2 * M * N * K / 715e12) / 1e12, 2))
        run.finish(["name", "nvcc_s", "tiling_64x256_gb", "implied_tbs_at_715tflops"])
        return 0
    phases = set(args.phases.split(","))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ks, _probe = kernels(sms)
    tiling = {name: nbytes for name, _, nbytes, _ in ks}
    if "time" in phases:
        for name, fn, _, spec in ks:
            fn()
            torch.cuda.synchronize()
            run.row(f"check {name}", **check_kernel(spec, sms))
        t = time_rounds({name: fn for name, fn, _, _ in ks}, rounds=3, warmup=5, rep=25, deadline=run)
        for name, fn, nbytes, spec in ks:
            ms = t[f"{name}_ms"]
            run.row(f"time {name}", ms=ms, tflops=round(2 * M * N * K / (ms * 1e-3) / 1e12, 1) if spec[0] == "gemm"
                    else None, tiling_tbs=round(nbytes / (ms * 1e-3) / 1e12, 3), rounds=t[f"{name}_rounds"])
    del ks
    torch.cuda.empty_cache()
    if "ncu" in phases and run.left() > 60:
        run.attempt("ncu", ncu_phase, run, list(tiling), tiling, max(60.0, run.left() - 90))
    run.finish(["name", "pass", "err_over_floor", "ms", "tflops", "tiling_tbs", "dur_ms", "counted_over_tiling",
                "counted_tbs", "slice_max_over_avg", "hit_rate", "fabric_gb", "dram_read_gb", "clock_mhz", "l2_peak_tbs",
                "l2_busy_pct"])
    return 0 if not run.errors and all(r.get("pass", True) for r in run.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
