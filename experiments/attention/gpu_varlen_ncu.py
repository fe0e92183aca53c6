"""Why the varlen backward's fused-dQ kernel takes ~1.2x the fixed fused kernel's time on the same tiles (session 33
call 4, uniform 16 x 4096 causal H16 D128 bf16: attention_varlen_bwd_kernel fused 7.02 ms a call against the fixed
attention_bwd_kernel's 5.85; split, the two paths are at parity): Nsight Compute on one launch of each, the same
metrics (tensor pipe, shared-memory wavefronts, issue, L2 sectors and hit rate, the TMA reductions' sectors, DRAM
bytes) and the warp-state stall breakdown, side by side. Compile-level facts (sm_90a, CPU): the fused kernels'
consumer step 602 against 566 SASS instructions, 21 against 9 spill instructions in it (276 / 348 B spilled against
192 / 204): ~8% at most, not 20%.

    PYTHONPATH=. python3 experiments/attention/gpu_varlen_ncu.py            (the GPU; <= 120 s)
    PYTHONPATH=. python3 experiments/attention/gpu_varlen_ncu.py --target "varlen fused"   (what ncu runs)

Session 41 (issue 35's softcap backward, 0.84-0.86x the speed without it): ``--names "fixed fused,fixed fused
softcap"`` profiles the fixed fused kernel without a softcap and with softcap 30, with the SFU (xu) and FMA pipes'
activity, local-memory (spill) traffic and the warp-state stalls beside the metrics above (call 1: spills, not the
SFU; call 5 profiled the form shipped after it, dP from -delta, at 7604ad14: 11.1 -> 5.6 GB of spills).

Prints the kept metric lines of each target, then a table of the metrics both have; writes
$OUT/gpu_varlen_ncu.json.
"""
import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from experiments.common.nsight import profile  # noqa: E402

TARGETS = {"fixed fused": "attention_bwd_kernel", "varlen fused": "attention_varlen_bwd_kernel",
           "varlen split dkdv": "attention_varlen_bwd_kernel", "fixed fused softcap": "attention_bwd_kernel"}
CAP = 30.0
METRICS = ["gpu__time_duration.sum",
           "sm__cycles_elapsed.avg.per_second",
           "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
           "l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed",
           "smsp__issue_active.avg.pct_of_peak_sustained_active",
           "lts__t_sectors.avg.pct_of_peak_sustained_elapsed",
           "lts__t_sector_hit_rate.pct",
           "lts__t_sectors_op_red.sum",
           "lts__t_sectors_op_read.sum",
           "dram__bytes_read.sum",
           "dram__bytes_write.sum",
           "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
           "smsp__inst_executed.sum",
           "launch__registers_per_thread",
           "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
           "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
           "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
           "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
           "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
           "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
           "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
           "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
           "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
           "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
           "smsp__average_warps_issue_stalled_membar_per_issue_active.ratio",
           "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
           "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio",
           "smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio",
           "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio",
           "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio",
           "smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio"]


def target(name: str) -> None:
    """Three launches (the first two warm up and compile; ncu profiles the third) of the target's kernel on the
    uniform 16 x 4096 causal batch (varlen: the packed copy of the fixed tensors)."""
    import torch

    from tilecore.ops.attention import launch, plan
    from tilecore.ops.attention_varlen import configs as vconfigs
    from tilecore.ops.attention_varlen import op as varlen

    b, h, n, d = 16, 16, 4096, 128
    scale = d ** -0.5
    torch.manual_seed(0)
    mk = lambda: torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    q, k, v, do = mk(), mk(), mk(), mk()
    if name.startswith("fixed fused"):
        cap = CAP if "softcap" in name else 0.0
        out, lse = torch.empty_like(q), torch.empty(b, h, n, device="cuda")
        launch.forward(plan.plan_forward(q, k, v, True, scale, softcap=cap), q, k, v, out, lse, True, scale,
                       softcap=cap)
        p = plan.plan_backward(do, q, k, v, True, scale, path="gluon", softcap=cap)
        assert p.config["dq_from"] == "fused", p.config
        _, dq_sum, stats = launch.backward_preprocess(out, do, lse, None, dq_sum=True, row_stats=True)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        for _ in range(3):
            launch.launch_backward_gluon_kernel(p, do, q, k, v, stats, dq_sum, dk, dv, True, scale, softcap=cap)
    else:
        packed = lambda t: t.transpose(1, 2).reshape(b * n, h, d).contiguous()  # noqa: E731
        qv, kv, vv, dov = (packed(t) for t in (q, k, v, do))
        cu = torch.arange(0, b * n + 1, n, device="cuda", dtype=torch.int32)
        out, lse = varlen.forward_gluon(qv, kv, vv, cu, cu, True, scale, 0.0, -1, -1)
        cfg = dict(vconfigs.varlen_gluon_backward_config(d, True),
                   dq_from="fused" if name == "varlen fused" else "gluon")
        for _ in range(3):
            varlen.backward_gluon(dov, qv, kv, vv, out, lse, None, cu, cu, True, scale, -1, -1, 0.0, config=cfg)
    torch.cuda.synchronize()


def numbers(text: str) -> dict:
    """{metric: value} from ncu's --metrics print (the metric name, its unit, its value on one line)."""
    found = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        try:
            value = float(parts[-1].replace(",", ""))
        except ValueError:
            continue
        name = parts[0] if parts[0] in METRICS else " ".join(parts[:-2] if len(parts) >= 3 else parts[:-1])
        found[name] = value
    return found


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target", choices=list(TARGETS))
    p.add_argument("--names", default="fixed fused,varlen fused")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    if args.target:
        return target(args.target)
    t0 = time.time()
    results = {}
    for name in args.names.split(","):
        text = profile(["--print-units", "base", "--metrics", ",".join(METRICS), "--section", "WarpStateStats"],
                       TARGETS[name], __file__,
                       ["--target", name], timeout=150)
        keep = [ln.strip() for ln in text.splitlines()
                if any(m in ln for m in METRICS) or "Stall" in ln or "==ERR" in ln or "Warp Cycles" in ln
                or "Error" in ln]
        results[name] = dict(lines=keep, values=numbers("\n".join(keep)), tail=text[-1500:] if not keep else "")
        print(f"--- {name} ({time.time() - t0:.0f} s) ---\n" + "\n".join(keep[:45]), flush=True)
        if not keep:
            print(text[-1500:])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu_varlen_ncu.json"), "w") as f:
        json.dump(results, f, indent=1)
    names = list(results)
    common = [m for m in results[names[0]]["values"] if all(m in results[x]["values"] for x in names)]
    print(f"\n== ncu, uniform 16 x 4096 causal H16 D128 bf16, one launch each ({time.time() - t0:.0f} s) ==")
    print(f"{'metric':70s} " + " ".join(f"{x:>16s}" for x in names))
    for m in common:
        print(f"{re.sub(r'^smsp__', '', m)[:70]:70s} " + " ".join(f"{results[x]['values'][m]:16.4g}" for x in names))
    if not common:
        print("no metric common to the targets: see the lines above")


if __name__ == "__main__":
    main()
