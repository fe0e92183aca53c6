"""Where the Gluon attention kernels spend their time: Nsight Compute on one kernel launch, one device call.

Backward: the Gluon kernel alone (launch.launch_backward_gluon_kernel of plan.plan_backward's Gluon
plan) at the planned config at D = 64 and 128 (configs.gluon_backward_config at N = 4096), and
without dQ ("dk/dv only": dq_from="tl", the tl dq kernel skipped; at D = 64 also kv_regs=False,
since the plan refuses K and V in registers without a dQ added in the kernel: the deterministic
mode's dK/dV kernel), B4 H16 N4096 bf16, non-causal (causal where the name says). Forward: the
Gluon forward at the planned config (launch.forward_into with path="gluon", its config
configs.gluon_forward_config's). Per target: tensor-pipe utilization, shared-memory and L2
throughput, issue slots and warp stalls; --source: warp stall samples per SASS instruction. Also
(--gemm-floor) the output-write floor of the persistent small-K GEMM: a 4096 x 4096 bf16 memset
against cuBLAS and tilecore at K = 64 and 128, in CUDA-graph replays.

    PYTHONPATH=. python3 experiments/attention/attention_profile.py [--names "fwd d128,d128"] [--source]

(Until the tiles v2 port it also profiled unshipped variants: dQ "overlapped", lazy rescaling, three
consumers; git show bb6b420:scripts/device/attention_profile.py.)
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from experiments.common.nsight import ncu_binary, profile  # noqa: E402

# name: (pass, D, causal, dQ: None for the planned config's, "tl" for none in the kernel)
TARGETS = {"d64": ("bwd", 64, False, None), "d64 dk/dv only": ("bwd", 64, False, "tl"),
           "d128": ("bwd", 128, False, None), "d128 dk/dv only": ("bwd", 128, False, "tl"),
           "d128 causal": ("bwd", 128, True, None),
           "fwd d128": ("fwd", 128, False, None), "fwd d128 causal": ("fwd", 128, True, None),
           "fwd d64": ("fwd", 64, False, None), "fwd d64 causal": ("fwd", 64, True, None)}
KERNEL = {"fwd": "attention_fwd", "bwd": "attention_bwd"}
METRICS = ["sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
           "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active",
           "l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed",
           "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
           "smsp__issue_active.avg.pct_of_peak_sustained_active",
           "smsp__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
           "smsp__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
           "lts__t_sectors.avg.pct_of_peak_sustained_elapsed",
           "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "sm__cycles_elapsed.avg.per_second",
           "gpu__time_duration.sum",
           "launch__registers_per_thread"]


def target(name):
    import torch

    from tilecore.ops.attention import configs, launch, plan

    kind, d, causal, dq_from = TARGETS[name]
    b, h, n = 4, 16, 4096
    mk = lambda: torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
    q, k, v, do = mk(), mk(), mk(), mk()
    out, lse = torch.empty_like(q), torch.empty(b, h, n, device="cuda")
    if kind == "fwd":
        cfg = configs.gluon_forward_config(d, n, n, causal)
        for _ in range(3):
            launch.forward_into(q, k, v, out, lse, causal, d ** -0.5, path="gluon", config=cfg)
        torch.cuda.synchronize()
        return
    launch.forward_into(q, k, v, out, lse, causal, d ** -0.5)
    delta, dq_sum, stats = launch.backward_preprocess(out, do, lse, None, dq_sum=True, row_stats=True)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    cfg = configs.gluon_backward_config(d, n, causal)
    if dq_from:
        cfg["dq_from"] = dq_from
        if configs.DQ_MODES[dq_from] == 0:  # kv_regs takes a dQ added in the kernel (plan_backward)
            cfg["kv_regs"] = False
    p = plan.plan_backward(do, q, k, v, causal, d ** -0.5, path="gluon", config=cfg)
    for _ in range(3):
        launch.launch_backward_gluon_kernel(p, do, q, k, v, stats, dq_sum, dk, dv, causal, d ** -0.5)
    torch.cuda.synchronize()


def gemm_floor():
    import torch

    import tilecore

    from tilecore.bench.harness import graph_median_ms

    def graph_us(fn):
        return 1000 * graph_median_ms(fn)

    out = torch.empty(4096, 4096, dtype=torch.bfloat16, device="cuda")
    print(f"memset 4096x4096 bf16 (32 MiB): {graph_us(lambda: out.zero_()):.1f} us")
    big = torch.empty(8 * 4096, 4096, dtype=torch.bfloat16, device="cuda")
    print(f"memset 8x that (256 MiB): {graph_us(lambda: big.zero_()) / 8:.1f} us per 32 MiB")
    for kk in (64, 128):
        a = torch.randn(4096, kk, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(kk, 4096, dtype=torch.bfloat16, device="cuda")
        for rnd in range(2):
            t_cublas = graph_us(lambda: torch.matmul(a, b, out=out))
            t_ours = graph_us(lambda: tilecore.gemm(a, b))
            print(f"K={kk} round {rnd}: cuBLAS {t_cublas:.1f} us, tilecore {t_ours:.1f} us "
                  f"({t_cublas / t_ours:.3f}x)")


def source_stalls(out_dir, names, top=45):
    """Warp stall samples per SASS instruction (Nsight Compute's source page), the top ``top``
    instructions of each kernel with their stall reasons; the whole CSV is kept under ``out_dir``."""
    import csv
    import io

    for name in names:
        tag = name.replace(" ", "_").replace("/", "")
        rep = os.path.join(out_dir, f"prof_{tag}")
        profile(["--section", "SourceCounters", "--section", "WarpStateStats", "-f", "-o", rep], KERNEL[TARGETS[name][0]],
                __file__, ["--target", name])
        res = subprocess.run([ncu_binary(), "-i", rep + ".ncu-rep", "--page", "source", "--csv", "--print-source", "sass"],
                             capture_output=True, text=True, timeout=120)
        with open(os.path.join(out_dir, f"ncu_source_{tag}.csv"), "w") as f:
            f.write(res.stdout)
        rows = list(csv.reader(io.StringIO(res.stdout)))
        head = next((i for i, r in enumerate(rows) if "Source" in r), None)
        if head is None:
            print(f"--- {name}: no source table ---\n{res.stdout[:1500]}\n{res.stderr[:1500]}")
            continue
        cols = rows[head]
        print("columns:", cols)
        body = [r for r in rows[head + 1:] if len(r) == len(cols)]
        sample_col = next((i for i, c in enumerate(cols) if c.startswith("Warp Stall Sampling (All")),
                          next(i for i, c in enumerate(cols) if "Sampl" in c))
        num = lambda v: float(v.replace(",", "") or 0)
        total = sum(num(r[sample_col]) for r in body) or 1
        stall_cols = [i for i, c in enumerate(cols) if c.startswith("stall_") or "Stall" in c and i != sample_col]
        print(f"--- {name}: {len(body)} SASS lines, {total:.0f} samples; top {top} ---")
        for r in sorted(body, key=lambda r: -num(r[sample_col]))[:top]:
            reasons = sorted(((num(r[i]), cols[i]) for i in stall_cols), reverse=True)[:2]
            print(f"{100 * num(r[sample_col]) / total:5.1f}%  {r[cols.index('Source')][:70]:70s} "
                  + " ".join(f"{c}={v:.0f}" for v, c in reasons if v))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target", choices=list(TARGETS))
    p.add_argument("--gemm-floor", action="store_true")
    p.add_argument("--source", action="store_true", help="per-SASS-instruction warp stall samples instead")
    p.add_argument("--names", default="d64,d64 dk/dv only,d128,d128 dk/dv only",
                   help="comma-separated targets, of: " + ", ".join(TARGETS))
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    names = args.names.split(",")
    if args.target:
        return target(args.target)
    if args.gemm_floor:
        return gemm_floor()
    if args.source:
        return source_stalls(args.out, names)
    table = {}
    for name in names:
        text = profile(["--metrics", ",".join(METRICS), "--section", "WarpStateStats"], KERNEL[TARGETS[name][0]], __file__,
                       ["--target", name], timeout=200)
        with open(os.path.join(args.out, f"ncu_{name.replace(' ', '_').replace('/', '')}.txt"), "w") as f:
            f.write(text)
        keep = [ln.strip() for ln in text.splitlines()
                if any(m.split(".")[0] in ln for m in METRICS) or "Stall" in ln or "==ERR" in ln or "Warp Cycles" in ln]
        table[name] = keep
        print(f"--- {name} ---\n" + "\n".join(keep[:40]), flush=True)


if __name__ == "__main__":
    main()
