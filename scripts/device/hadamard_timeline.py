"""Where a call of the large-n Gluon Hadamard kernel (n = 32768, 2^28 elements) spends its time, per
program: the kernel of gluon_kernels.py with the GPU's global timer (%globaltimer, ns) read at each
program's start, after each row's stores are issued (consumer 0, with the row's program) and at its
end, for rows dealt round-robin or drawn as programs get to them, with the shipped ring and the
4-stage one. Prints, in us from the first program's start: when programs start, when their
first row's stores go out, the steady time a row, when their last row's stores go out and when they
end, next to the same kernel's do_bench time without the timer. The steady state's time a row
times the rows a program does, against the call's time, is the cost of the start and the end.

    PYTHONPATH=. python3 scripts/device/hadamard_timeline.py [--out DIR]
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, ".")
import torch  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from gpu_clocks import global_ns  # noqa: E402 (scripts/device)

from tilecore.ops.hadamard import gluon_kernels as gk  # noqa: E402
from tilecore.ops.hadamard import kernels  # noqa: E402
from tilecore.ops.hadamard.reference import hadamard_reference  # noqa: E402
from tilecore.accuracy import error_over_floor  # noqa: E402
from tilecore.tiles.gluon import persistent_pipeline  # noqa: E402
from tilecore.tiles.launch import tile_counter  # noqa: E402


@gluon.jit
def _finish_timed(g, cfg: gl.constexpr, state, row, staging):
    gk._finish(g, cfg, state, row, staging)
    if cfg[-1] == 0:  # consumer 0: the row's stores are issued
        gl.store(g[6] + row, global_ns(row))
        gl.store(g[7] + row, gl.program_id(0))


@gluon.jit
def timeline_kernel(x_desc, out_desc, staging_desc, h_desc, rows, scale, row_counter, row_times, row_programs,
                    program_times, S: gl.constexpr, STAGES: gl.constexpr, LOOKAHEAD: gl.constexpr):
    g = (x_desc, out_desc, h_desc, rows, scale, 128 * S, row_times, row_programs)
    cfg: gl.constexpr = gl.constexpr((S,))
    pid = gl.program_id(0)
    gl.store(program_times + 2 * pid, global_ns(pid))
    persistent_pipeline(g, cfg, x_desc, x_desc, staging_desc, rows, gk._setup, gk._load, gk._init, gk._compute,
                        gk._drain, _finish_timed, STAGES, CONSUMERS=2, CONSUMER_REGS=240, PRODUCER_REGS=24,
                        IN_FLIGHT=1, tile_desc=h_desc, load_tile=gk._load_h, TILE_OPERANDS=3, TILE_SHARED=True,
                        TILE_RESIDENT=True, LOOKAHEAD=LOOKAHEAD, tile_counter=row_counter)
    gl.store(program_times + 2 * pid + 1, global_ns(pid))


# name -> (stages, lookahead, dynamic rows)
RINGS = {"dynamic rows, 8 stages, lookahead 4 (shipped)": (8, 4, True),
         "static rows, 8 stages, lookahead 4 (session 18's first)": (8, 4, False),
         "static rows, 4 stages (session 17)": (4, 0, False),
         "dynamic rows, 4 stages": (4, 0, True)}


def summarize(row_times, row_programs, program_times, programs):
    """In us from the first program's start: starts, each program's first and last row's stores,
    its time a row in the steady state (the rows between its 9th and its 5th from last), its end."""
    t0 = program_times[:, 0].min()
    starts, ends = (program_times[:, 0] - t0) / 1e3, (program_times[:, 1] - t0) / 1e3
    firsts, lasts, steady, counts = [], [], [], []
    for p in range(programs):
        mine = ((row_times[row_programs == p] - t0) / 1e3).sort().values
        counts.append(len(mine))
        firsts.append(mine[0].item())
        lasts.append(mine[-1].item())
        steady += (mine[9:-4] - mine[8:-5]).tolist()
    steady, firsts, lasts = torch.tensor(steady), torch.tensor(firsts), torch.tensor(lasts)
    row_us = steady.median().item()
    return dict(start_max=starts.max().item(), first_median=firsts.median().item(), first_max=firsts.max().item(),
                row_us=row_us, row_us_p10=steady.quantile(0.1).item(), row_us_p90=steady.quantile(0.9).item(),
                rows_min=min(counts), rows_max=max(counts), last_min=lasts.min().item(),
                last_median=lasts.median().item(), last_max=lasts.max().item(), end_max=ends.max().item(),
                steady_share=sum(counts) / programs * row_us / ends.max().item())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    n, dtype = 32768, torch.float16
    rows = (1 << 28) // n
    programs = kernels.gluon_programs(rows, torch.cuda.get_device_properties(0).multi_processor_count)
    x = torch.randn(rows, n, device="cuda", dtype=dtype)
    out = torch.empty_like(x)
    sample = list(range(0, rows, 997)) + [rows - 1]
    ref = hadamard_reference(x[sample], n ** -0.5, out_dtype=torch.float64)
    res = {"meta": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "programs": programs,
                    "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}, "rings": {}}
    for name, (stages, lookahead, dynamic) in RINGS.items():
        row_times = torch.zeros(rows, device="cuda", dtype=torch.int64)
        row_programs = torch.full((rows,), -1, device="cuda", dtype=torch.int32)
        program_times = torch.zeros(programs, 2, device="cuda", dtype=torch.int64)
        launch = lambda: timeline_kernel[(programs,)](  # noqa: E731
            **kernels.gluon_args(x, out, n ** -0.5, stages, lookahead, dynamic), row_times=row_times,
            row_programs=row_programs, program_times=program_times, num_warps=4)
        out.fill_(float("nan"))
        launch()
        torch.cuda.synchronize()
        err = error_over_floor(out[sample], ref)
        written = not out.isnan().any().item() and bool((row_programs >= 0).all())
        plain_ms = do_bench(lambda: kernels.launch_gluon(x, out, n ** -0.5, num_sms=programs, stages=stages,
                                                         lookahead=lookahead, dynamic=dynamic), warmup=50, rep=300)
        timed_ms = do_bench(launch, warmup=50, rep=300)
        runs = []
        for _ in range(5):
            row_programs.fill_(-1)
            launch()
            torch.cuda.synchronize()
            runs.append(summarize(row_times.cpu(), row_programs.cpu(), program_times.cpu(), programs))
        # every row of every run was done (the counter was back at zero for each launch)
        written = written and bool((row_programs >= 0).all()) and tile_counter(x.device).item() == 0
        summary = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        res["rings"][name] = dict(err=err, written=written, plain_us=plain_ms * 1e3, timed_us=timed_ms * 1e3,
                                  summary=summary, runs=runs)
        print(f"{name}: all written (every run) {written}, error {err:.5f}x floor; do_bench {plain_ms * 1e3:.1f} us "
              f"(with the timer {timed_ms * 1e3:.1f} us)", flush=True)
        print("  " + ", ".join(f"{k} {v:.2f}" for k, v in summary.items()), flush=True)
    json.dump(res, open(os.path.join(args.out, "hadamard_timeline.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
