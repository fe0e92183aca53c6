"""Where a call of the Gluon attention backward kernel spends its time, per program: the shipped
kernel (gluon_backward.attention_bwd_kernel's allocations and template call) with the GPU's global
timer (%globaltimer, ns) read at each program's start and end and when each consumer has issued a
tile's dK and dV stores, for tiles dealt (round-robin, or causal by the balanced table) and drawn
(the template's tile_counter). Prints, in us from the first program's start: when the programs'
first and last tiles end and when the programs end, the spread of those ends, and the share of
the SMs' time idle while the slowest program finishes, and the SM clock (%clock64 over
%globaltimer), for a launch on its own and for the last of 20 back to back (the clocks under
load), next to do_bench of the kernel alone (without the timer). bf16, N = Nk = --n, --heads q / kv
heads (16/16; B * Hq * N held at 16 * 16 * 4096), the launcher's config at each D.

    PYTHONPATH=. python3 scripts/device/attention_timeline.py [--d 128] [--causal 0,1] [--n 4096] [--out DIR]
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, ".")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import mbarrier  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from gpu_clocks import global_ns, sm_cycles  # noqa: E402 (scripts/device)

from attention_knobs import meta  # noqa: E402 (scripts/device)
from tilecore import dispatch  # noqa: E402
from tilecore.ops.attention import gluon_backward as gb  # noqa: E402
from tilecore.ops.attention import kernels  # noqa: E402
from tilecore.tiles.gluon import persistent_pipeline  # noqa: E402
from tilecore.tiles.launch import jit_arg, tile_counter  # noqa: E402


@gluon.jit
def _finish_timed(g, cfg: gl.constexpr, state, tile, out_smem):
    """The shipped epilogue, then this consumer's time and program for the tile (its index: batch *
    kv head, key block)."""
    gb._finish(g, cfg, state, tile, out_smem)
    n_blocks = gl.cdiv(g[10], 2 * cfg[2])
    index = tile[1] * n_blocks + tile[0] // (2 * cfg[2])
    gl.store(g[20] + 2 * index + cfg[-1], global_ns(index))
    gl.store(g[21] + index, gl.program_id(0))


@gluon.jit
def timed_bwd_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, stats_desc, dq_desc, H, N, Nk, GROUP, scale,
                     scale_log2e, num_bhk, head_group, schedule, tile_counter, tile_times, tile_programs,
                     program_times, CAUSAL: gl.constexpr, STAGES: gl.constexpr, DQ: gl.constexpr,
                     KV_REGS: gl.constexpr):
    """attention_bwd_kernel with the timer (its allocations and template call, as shipped)."""
    pid = gl.program_id(0)
    gl.store(program_times + 4 * pid, global_ns(pid))
    gl.store(program_times + 4 * pid + 2, sm_cycles(pid))
    BM: gl.constexpr = q_desc.block_type.shape[2]
    BN: gl.constexpr = dk_desc.block_type.shape[2]
    D: gl.constexpr = q_desc.block_type.shape[3]
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [2, 2 * BN, BM], gb._ds_layout(q_desc.dtype))
    ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(2):
        mbarrier.init(ds_full.index(j), count=2)
        mbarrier.init(ds_free.index(j), count=1 if DQ == 4 else 2)
    if DQ == 4:
        dq_staging = gl.allocate_shared_memory(dq_desc.dtype, [D // dq_desc.block_type.shape[3]] +
                                               dq_desc.block_type.shape, dq_desc.layout)
    else:
        dq_staging = gl.allocate_shared_memory(dq_desc.dtype, [2] + dq_desc.block_type.shape, dq_desc.layout)
    g = (q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, stats_desc, dq_desc, H, N, Nk, GROUP, scale, scale_log2e,
         num_bhk, head_group, ds_smem, ds_full, ds_free, dq_staging, tile_times, tile_programs)
    cfg: gl.constexpr = gl.constexpr((CAUSAL, BM, BN, D, DQ, KV_REGS))
    num_tiles = gl.cdiv(Nk, 2 * BN) * num_bhk
    persistent_pipeline(g, cfg, q_desc, do_desc, dk_desc, num_tiles, gb._setup, gb._load, gb._init, gb._compute,
                        gb._drain, _finish_timed, STAGES, PRODUCER_REGS=24, CONSUMERS=2,
                        CONSUMER_REGS=200 if DQ == 4 else 240, IN_FLIGHT=0, tile_desc=k_desc, load_tile=gb._load_kv,
                        TILE_OPERANDS=2, TILE_SHARED=True, STEP_INDEX=True, schedule=schedule, z_desc=stats_desc,
                        helper=(gb._dq_issue, gb._dq_finish) if DQ == 4 else None, HELPER_REGS=88,
                        tile_counter=tile_counter)
    gl.store(program_times + 4 * pid + 1, global_ns(pid))
    gl.store(program_times + 4 * pid + 3, sm_cycles(pid))


def timed_launch(case, cfg, drawn, tile_times, tile_programs, program_times):
    """A launch of timed_bwd_kernel with the shipped kernel's arguments (kernels.backward_kernel_args)."""
    q, k, v, do, stats, dq_sum, dk, dv, causal, scale = case
    grid, args = kernels.backward_kernel_args(do, q, k, v, stats, dq_sum, dk, dv, causal, scale,
                                              block_m=cfg["block_m"], block_n=cfg["block_n"],
                                              dq_from=cfg["dq_from"], drawn=drawn)
    args = [jit_arg(a) for a in args]  # TMA operands as the JIT takes them
    return lambda: timed_bwd_kernel[grid](*args, tile_times, tile_programs, program_times, CAUSAL=causal,
                                          STAGES=cfg["stages"], DQ=kernels.DQ_MODES[cfg["dq_from"]],
                                          KV_REGS=cfg.get("kv_regs", False), num_warps=4)


def summarize(tile_times, tile_programs, program_times):
    """In us from the first program's start: the ends of each program's first and last tiles (the
    later of its two consumers'), of the programs, their spread, and the idle share: the SMs' time
    between each program's end and the last one's, over all of it."""
    t0 = program_times[:, 0].min()
    ends = (program_times[:, 1] - t0) / 1e3
    tile_end = (tile_times.max(dim=1).values - t0) / 1e3
    programs = program_times.shape[0]
    counts, firsts, lasts = [], [], []
    for p in range(programs):
        mine = tile_end[tile_programs == p].sort().values
        counts.append(len(mine))
        firsts.append(mine[0].item() if len(mine) else float("nan"))
        lasts.append(mine[-1].item() if len(mine) else float("nan"))
    lasts_t = torch.tensor(lasts)
    call = ends.max().item()
    return dict(start_max=((program_times[:, 0] - t0) / 1e3).max().item(),
                first_tile_median=statistics.median(firsts), tiles_min=min(counts), tiles_max=max(counts),
                last_tile_min=lasts_t.min().item(), last_tile_median=lasts_t.median().item(),
                last_tile_max=lasts_t.max().item(), end_min=ends.min().item(), end_max=call,
                idle_share=((call - ends).sum() / (programs * call)).item(),
                sm_mhz=((program_times[:, 3] - program_times[:, 2]) * 1e3 /
                        (program_times[:, 1] - program_times[:, 0])).median().item())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--d", default="128")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--heads", default="16/16", help="q heads / kv heads (B * Hq * N stays 16 * 16 * 4096)")
    args = ap.parse_args()
    res = {"meta": meta(), "n": args.n, "heads": args.heads, "cases": {}}
    h, hkv = (int(x) for x in args.heads.split("/"))
    n = args.n
    b = max(1, 16 * 16 * 4096 // (h * n))
    for d in [int(x) for x in args.d.split(",")]:
        for causal in [bool(int(x)) for x in args.causal.split(",")]:
            cfg = kernels.gluon_backward_config(d, n, causal)
            gen = torch.Generator(device="cuda").manual_seed(d + n)
            q, k, v, do = (torch.randn(b, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                           for heads in (h, hkv, hkv, h))
            scale = d ** -0.5
            out, lse = torch.empty_like(q), torch.empty(b, h, n, device="cuda")
            kernels.forward_into(q, k, v, out, lse, causal, scale)
            _, dq_sum, stats = kernels.backward_preprocess(out, do, lse, None, dq_sum=True, row_stats=True)
            dk, dv = torch.empty_like(k), torch.empty_like(v)
            case = (q, k, v, do, stats, dq_sum, dk, dv, causal, scale)
            tiles = triton.cdiv(n, 2 * cfg["block_n"]) * b * hkv
            programs = min(tiles, dispatch.num_sms(q.device))
            ref_dk = None
            for drawn in (False, True):
                name = (f"D{d}{' causal' if causal else ''} {'drawn' if drawn else 'dealt'}"
                        + (f" H{h}/{hkv}" if h != hkv else ""))
                tile_times = torch.zeros(tiles, 2, device="cuda", dtype=torch.int64)
                tile_programs = torch.full((tiles,), -1, device="cuda", dtype=torch.int32)
                program_times = torch.zeros(programs, 4, device="cuda", dtype=torch.int64)
                launch = timed_launch(case, cfg, drawn, tile_times, tile_programs, program_times)
                plain = lambda: kernels.backward_gluon_kernel(  # noqa: E731
                    do, q, k, v, stats, dq_sum, dk, dv, causal, scale, drawn=drawn,
                    **{key: val for key, val in cfg.items() if key not in ("drawn",)})
                dk.fill_(float("nan"))
                launch()
                torch.cuda.synchronize()
                # dK must not depend on the order of the tiles (dQ's sums do, in their last bits)
                same = ref_dk is None or torch.equal(dk, ref_dk)
                ref_dk = dk.clone() if ref_dk is None else ref_dk
                written = not dk.isnan().any().item() and bool((tile_programs >= 0).all())
                plain_ms = do_bench(plain, warmup=25, rep=200)
                timed_ms = do_bench(launch, warmup=25, rep=200)
                runs, runs_sustained = [], []
                for _ in range(args.runs):
                    tile_programs.fill_(-1)
                    launch()
                    torch.cuda.synchronize()
                    written = written and bool((tile_programs >= 0).all())
                    runs.append(summarize(tile_times.cpu(), tile_programs.cpu(), program_times.cpu()))
                for _ in range(args.runs):  # the last of 20 launches back to back (the clocks under load)
                    for _ in range(20):
                        launch()
                    torch.cuda.synchronize()
                    runs_sustained.append(summarize(tile_times.cpu(), tile_programs.cpu(), program_times.cpu()))
                if drawn:
                    written = written and tile_counter(q.device).item() == 0
                summary = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
                sustained = {key: statistics.median(r[key] for r in runs_sustained) for key in runs[0]}
                res["cases"][name] = dict(cfg=cfg, programs=programs, tiles=tiles, written=written, dk_equal=same,
                                          plain_us=plain_ms * 1e3, timed_us=timed_ms * 1e3, summary=summary,
                                          sustained=sustained, runs=runs, runs_sustained=runs_sustained)
                print(f"{name}: all written {written}, dK equal to dealt {same}; do_bench {plain_ms * 1e3:.0f} us "
                      f"(with the timer {timed_ms * 1e3:.0f} us)", flush=True)
                print("  single: " + ", ".join(f"{key} {val:.3f}" for key, val in summary.items()), flush=True)
                print("  sustained: " + ", ".join(f"{key} {val:.3f}" for key, val in sustained.items()), flush=True)
            json.dump(res, open(os.path.join(args.out, "attention_timeline.json"), "w"), indent=1)
            del q, k, v, do, out, lse, dq_sum, stats, dk, dv, case
            torch.cuda.empty_cache()
    print("\nsummary (us): case, do_bench; then single launch and the last of 20 back to back: last tiles' end "
          "min/median/max, programs' end min/max, idle share, SM clock")
    for name, c in res["cases"].items():
        line = f"{name}: {c['plain_us']:.0f}"
        for s in (c["summary"], c["sustained"]):
            line += (f"; {s['last_tile_min']:.0f}/{s['last_tile_median']:.0f}/{s['last_tile_max']:.0f}, "
                     f"{s['end_min']:.0f}/{s['end_max']:.0f}, {100 * s['idle_share']:.1f}%, {s['sm_mhz']:.0f} MHz")
        print(line)


if __name__ == "__main__":
    main()
