"""Where n = 32768 loses its last percent: one device call.

1. Variants of the large-n kernel (plans with S = 4 or 8 slices, pipeline stages, waves), each checked
   (fp16 and bf16, poisoned, against float64) and timed at 2^28 elements, twice, interleaved.
2. The same persistent loop with the transform taken out ("memory twin": each slice is loaded and
   stored through the same TMA boxes): the ceiling of this access pattern, without the math.
3. Rows a multiple of the SM count (63 x 132 = 8316 rows of 32768) next to 2^28 elements (8192 rows:
   the last of 63 rounds has 8 rows for 132 SMs), to separate the tail from the steady state.
4. With --ncu: Nsight Compute's speed-of-light, memory and warp-stall sections of the default kernel
   and its memory twin (text under $OUT).

    PYTHONPATH=. python3 scripts/device/hadamard_large_probe.py [--ncu]
"""
import argparse
import json
import multiprocessing
import os
import time

import torch
import triton
import triton.language as tl

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma

from tilecore.ops.hadamard import gluon_kernels as gk
from tilecore.ops.hadamard.kernels import _load_slice, _store_slice
from tilecore.tiles.gluon import persistent_pipeline, wgmma_layout

from nsight import profile

E = 2**28
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# (n, name, launch tuning); "default" is the dispatch as shipped
VARIANTS = [
    (32768, "triton", dict(tma="both", waves=2)),
    (32768, "gluon", dict(gluon=dict(stages=8))),
    (32768, "gluon no-store", dict(gluon=dict(stages=8, twin=True, copy=False, stores=2))),
    (32768, "gtwin", dict(gluon=dict(stages=8, twin=True))),
    (32768, "gluon 6", dict(gluon=dict(stages=6))),
    (16384, "default", dict()),
    (16384, "gluon", dict(gluon=dict(stages=8))),
]


@triton.jit
def memory_twin_kernel(x, out, rows, stride_x, stride_out, scale, N: tl.constexpr, S: tl.constexpr,
                       N1: tl.constexpr, N2: tl.constexpr, B: tl.constexpr, GRID: tl.constexpr,
                       TMA_LOAD: tl.constexpr, TMA_STORE: tl.constexpr):
    """hadamard_kernel's loop and boxes with the transform taken out: out = scale * x."""
    tiles = tl.cdiv(rows, B)
    for tile in range(tl.program_id(0), tiles, GRID):
        for s in tl.static_range(S):
            z = tl.reshape(_load_slice(x, rows, stride_x, tile, s, N, N1, N2, B, TMA_LOAD).to(tl.float32), (B * N1, N2))
            _store_slice(out, rows, stride_out, tile, s, z, scale, N, N1, N2, B, TMA_STORE)


@gluon.jit
def _copy_compute(g, cfg: gl.constexpr, state, top, bottom, s, bufs):
    """The Gluon kernel's step without its products: +- the consumer's half of the slice (S = 4)."""
    layout: gl.constexpr = wgmma_layout(64, 64, gl.num_warps())
    if cfg[-1] == 0:
        t = top.load(layout).to(gl.float32)
    else:
        t = bottom.load(layout).to(gl.float32)
    return gk._accumulate(4, state[0], state[1:], t, s) + (state[-1],)


@gluon.jit
def _copy_drain(g, cfg: gl.constexpr, state):
    return state  # no wgmma (gk._drain's last second product belongs to the products left out)


@gluon.jit
def _finish_variant(g, cfg: gl.constexpr, state, row, staging):
    """gk._finish with the stores paced (cfg[2] == 1: each waits for the previous one's read) or left
    out (cfg[2] == 2: nothing is written)."""
    S: gl.constexpr = cfg[0]
    tma.store_wait(0)
    for j in gl.static_range(S):
        staging.slice(j * 64, 64).store((state[1 + j] * g[4]).to(g[1].dtype))
    fence_async_shared()
    gl.thread_barrier()
    line = row * g[5] + 64 * cfg[-1]
    if cfg[2] != 2:
        for j in gl.static_range(S):
            tma.async_copy_shared_to_global(g[1], [line + 128 * j, 0], staging.slice(j * 64, 64))
            if cfg[2] == 1:
                tma.store_wait(0)


@gluon.jit
def gluon_twin_kernel(x_desc, out_desc, staging_desc, h_desc, rows, scale, row_counter, S: gl.constexpr,
                      STAGES: gl.constexpr, LOOKAHEAD: gl.constexpr, COPY: gl.constexpr = True,
                      STORES: gl.constexpr = 0):
    """The Gluon kernel with its products left out (COPY) and/or its stores paced or left out; its
    rows and ring as the kernel's (kernels.gluon_args)."""
    g = (x_desc, out_desc, h_desc, rows, scale, 128 * S)
    cfg: gl.constexpr = gl.constexpr((S, COPY, STORES))
    tiles = rows
    if COPY:
        persistent_pipeline(g, cfg, x_desc, x_desc, staging_desc, tiles, gk._setup, gk._load, gk._init, _copy_compute,
                            _copy_drain, _finish_variant, STAGES, CONSUMERS=2, IN_FLIGHT=0, tile_desc=h_desc,
                            load_tile=gk._load_h, TILE_OPERANDS=3, TILE_SHARED=True, TILE_RESIDENT=True,
                            LOOKAHEAD=LOOKAHEAD, tile_counter=row_counter)
    else:
        persistent_pipeline(g, cfg, x_desc, x_desc, staging_desc, tiles, gk._setup, gk._load, gk._init, gk._compute,
                            gk._drain, _finish_variant, STAGES, CONSUMERS=2, IN_FLIGHT=1, tile_desc=h_desc,
                            load_tile=gk._load_h, TILE_OPERANDS=3, TILE_SHARED=True, TILE_RESIDENT=True,
                            LOOKAHEAD=LOOKAHEAD, tile_counter=row_counter)


def gluon_twin_launch(x, out, scale, num_sms, stages=8, copy=True, stores=0):
    from tilecore.ops.hadamard import kernels

    gluon_twin_kernel[(min(x.shape[0], num_sms),)](**kernels.gluon_args(x, out, scale, stages), COPY=copy,
                                                   STORES=stores, num_warps=4)


def twin_launch(x, out, scale, num_sms, **tuning):
    from tilecore.ops.hadamard import kernels

    rows, n = x.shape
    tma_load, tma_store, tuning = kernels.choose_path(n, False, tuning.pop("tma", None), tuning, rows * n)
    cfg = kernels.config(n, **tuning)
    grid = max(1, min(triton.cdiv(rows, cfg["B"]), num_sms * cfg["waves"]))
    memory_twin_kernel[(grid,)](kernels._descriptor(x, cfg) if tma_load else x,
                                kernels._descriptor(out, cfg) if tma_store else out, rows, x.stride(0), out.stride(0),
                                scale, N=n, S=cfg["S"], N1=cfg["N1"], N2=cfg["N2"], B=cfg["B"], GRID=grid,
                                TMA_LOAD=tma_load, TMA_STORE=tma_store, num_warps=cfg["num_warps"],
                                num_stages=cfg["num_stages"])


def run_one(kind, n, rows, dtype, tuning, sms, x=None, out=None):
    from tilecore.ops.hadamard import kernels

    if x is None:
        x = torch.randn(rows, n, dtype=dtype, device="cuda")
        out = torch.empty_like(x)
    if kind == "kernel" and "gluon" in tuning:
        opts = dict(tuning["gluon"])
        if opts.pop("twin", False):
            gluon_twin_launch(x, out, n**-0.5, sms, **opts)
        else:
            kernels.launch_gluon(x, out, n**-0.5, num_sms=sms, **opts)
    elif kind == "kernel":
        kernels.launch(x, out, n**-0.5, interpret=False, num_sms=sms, **tuning)
    else:
        twin_launch(x, out, n**-0.5, sms, **tuning)
    return x, out


def warm(specs):
    from tilecore import dispatch

    sms = dispatch.num_sms(torch.device("cuda"))
    failed = []
    for kind, n, dt, tuning in specs:
        try:
            run_one(kind, n, E // n, DTYPES[dt], dict(tuning), sms)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - reported by the measured run
            failed.append((kind, n, dt, tuning, f"{type(e).__name__}: {str(e)[:120]}"))
    return failed


def ncu_target(which):
    """Run the 32768 default kernel (or its memory twin) three times at 2^28 elements, for ncu."""
    from tilecore import dispatch

    sms = dispatch.num_sms(torch.device("cuda"))
    x = torch.randn(E // 32768, 32768, dtype=torch.float16, device="cuda")
    out = torch.empty_like(x)
    for _ in range(3):
        run_one(which, 32768, 0, None, {}, sms, x, out)
    torch.cuda.synchronize()


def main():
    from tilecore import accuracy, dispatch, env
    from tilecore.bench.harness import copy_ceiling, median_ms
    from tilecore.ops.hadamard import hadamard_reference

    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--ncu", action="store_true")
    p.add_argument("--edges", action="store_true", help="also: tail rows, non-finite rows, > 2^31 elements, n < 16")
    p.add_argument("--ncu-target", choices=("kernel", "twin"))
    args = p.parse_args()
    if args.ncu_target:
        return ncu_target(args.ncu_target)
    t0 = time.time()
    stamp = lambda: f"[{time.time() - t0:.0f}s]"
    print(env.report(), flush=True)
    sms = dispatch.num_sms(torch.device("cuda"))
    report = {"meta": env.metadata(), "variants": [], "rows_effect": []}

    def save():
        with open(os.path.join(args.out, "hadamard_large_probe.json"), "w") as f:
            json.dump(report, f, indent=1)

    specs = [(kind, n, dt, tuning) for n, _, tuning in VARIANTS for dt in DTYPES for kind in ("kernel", "twin")
             if kind == "kernel" or "gluon" not in tuning]
    with multiprocessing.get_context("spawn").Pool(8) as pool:
        failed = [f for part in pool.map(warm, [specs[i::8] for i in range(8)]) for f in part]
    print(f"warm-up: {len(specs)} compiled, failed: {failed} {stamp()}", flush=True)

    ceil = copy_ceiling()
    _src = torch.empty(E, dtype=torch.float16, device="cuda").normal_()
    _dst = torch.empty_like(_src)
    report["copy_ms_2^28_fp16"] = median_ms(lambda: _dst.copy_(_src))
    report["read_only_sum_ms"] = median_ms(lambda: torch.sum(_src, dtype=torch.float32))
    print("copy 2^28 fp16 ms", report["copy_ms_2^28_fp16"], "sum (read only) ms", report["read_only_sum_ms"], flush=True)
    _src = _dst = None
    report["copy_GBps"] = ceil.value
    print(f"copy ceiling {ceil.value:.0f} GB/s", flush=True)

    def pct(kind, n, rows, dtype, tuning):
        x = torch.randn(rows, n, dtype=dtype, device="cuda")
        out = torch.empty_like(x)
        ms = median_ms(lambda: run_one(kind, n, rows, dtype, dict(tuning), sms, x, out))
        return 100 * (2 * x.numel() * x.element_size() / ms / 1e6) / ceil.value

    table = []
    for n, name, tuning in VARIANTS:
        rec = {"n": n, "variant": name, "tuning": repr(tuning)}
        try:
            for dt, dtype in DTYPES.items():
                x = torch.randn(max(2 * sms, 2**24 // n) + 3, n, dtype=dtype, device="cuda")  # >= 2^24: the TMA dispatch
                for kind in ("kernel", "twin") if "gluon" not in tuning else ("kernel",):
                    out = torch.full_like(x, float("nan"))
                    run_one(kind, n, 0, dtype, dict(tuning), sms, x, out)
                    written = bool(torch.isfinite(out).all())
                    if "gluon" in tuning and (tuning["gluon"].get("twin") or tuning["gluon"].get("stores")):
                        rec[f"{kind}_{dt}_over_floor"] = 1.0 if written else float("inf")  # only "written"
                        continue
                    ref = x.double() * n**-0.5 if kind == "twin" else hadamard_reference(x, n**-0.5, out_dtype=torch.float64)
                    rec[f"{kind}_{dt}_over_floor"] = accuracy.error_over_floor(out, ref) if written else float("inf")
            for kind in ("kernel", "twin") if "gluon" not in tuning else ("kernel",):
                rec[kind] = [pct(kind, n, E // n, torch.float16, tuning) for _ in range(2)]
            rec["kernel_bf16"] = pct("kernel", n, E // n, torch.bfloat16, tuning)
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        report["variants"].append(rec)
        table.append(rec)
        print(rec, stamp(), flush=True)
        save()

    # the tail: 2^28 elements against whole rounds of rows over the SMs (the Gluon kernel)
    for n, tuning in ((32768, {"gluon": {}}),) if args.edges else ():
        rows_e = E // n
        whole = -(-rows_e // sms) * sms
        for rows in (rows_e, whole, rows_e, whole):
            r = {"n": n, "kind": "gluon", "rows": rows, "pct": pct("kernel", n, rows, torch.float16, tuning)}
            report["rows_effect"].append(r)
            print(r, flush=True)
    save()

    # the default dispatch (Gluon at 32768): non-finite values stay in their rows; > 2^31 elements
    n = 32768
    for dt, dtype in DTYPES.items() if args.edges else ():
        x = torch.randn(2**24 // n + 77, n, dtype=dtype, device="cuda")
        x[5, 7] = float("inf")
        x[9, 1000] = float("nan")
        out = torch.full_like(x, 7.0)
        run_one("kernel", n, 0, dtype, {}, sms, x, out)
        ref = hadamard_reference(x.double(), n**-0.5, out_dtype=torch.float64)
        finite = [r for r in range(x.shape[0]) if r not in (5, 9)]
        rec = {"dtype": dt, "rows": x.shape[0],
               "finite_rows_over_floor": accuracy.error_over_floor(out[finite], ref[finite]),
               "inf_row_same": bool(torch.equal(out[5].isinf(), ref[5].isinf()) and torch.equal(out[5].isnan(), ref[5].isnan())),
               "nan_row_same": bool(torch.equal(out[9].isnan(), ref[9].isnan()))}
        report.setdefault("nonfinite", []).append(rec)
        print("non-finite:", rec, stamp(), flush=True)
    x = out = ref = None
    rows = 2**31 // n + 13 if args.edges else 13
    x = torch.randn(rows, n, dtype=torch.bfloat16, device="cuda")
    out = torch.full_like(x, float("nan"))
    run_one("kernel", n, 0, torch.bfloat16, {}, sms, x, out)
    tail = slice(rows - 40, rows)
    big = {"elements": rows * n, "all_written": bool(torch.isfinite(out).all()),
           "tail_over_floor": accuracy.error_over_floor(out[tail], hadamard_reference(x[tail], n**-0.5, out_dtype=torch.float64))}
    report["over_2^31"] = big
    print("over 2^31 elements:", big, stamp(), flush=True)
    x = out = None
    torch.cuda.empty_cache()
    save()

    # n < 16: the register butterfly (butterfly.py), checked and timed through the default dispatch
    for n in (1, 2, 4, 8, 16) if args.edges else ():
        for dt, dtype in DTYPES.items():
            x = torch.randn(1000, n, dtype=dtype, device="cuda")
            out = torch.full_like(x, float("nan"))
            run_one("kernel", n, 0, dtype, {}, sms, x, out)
            ok = bool(torch.isfinite(out).all())
            ratio = accuracy.error_over_floor(out, hadamard_reference(x, n**-0.5, out_dtype=torch.float64))
            r = {"n": n, "dtype": dt, "written": ok, "over_floor": ratio,
                 "pct": [pct("kernel", n, E // n, dtype, {}) for _ in range(2)]}
            report.setdefault("small_n", []).append(r)
            print(r, stamp(), flush=True)
    save()

    if args.ncu:
        for which in ("kernel",):
            text = profile(["--section", "SpeedOfLight", "--section", "MemoryWorkloadAnalysis", "--section",
                            "WarpStateStats", "--section", "SchedulerStats", "--section", "Occupancy"], "hadamard",
                           __file__, ["--ncu-target", which])
            with open(os.path.join(args.out, f"ncu_32768_{which}.txt"), "w") as f:
                f.write(text)
            keep = [ln for ln in text.splitlines() if any(k in ln for k in (
                "DRAM Throughput", "Memory Throughput", "Duration", "Compute (SM)", "Stall", "Issued Warp",
                "No Eligible", "Active Warps", "L2 Hit", "Registers", "Achieved Occupancy", "==ERROR", "==WARNING"))]
            print(f"--- ncu {which} ---\n" + "\n".join(keep[:40]), stamp(), flush=True)

    print(f"\nSUMMARY (% of copy {ceil.value:.0f} GB/s, fp16, 2^28 elements, two medians; twin = no math)")
    for r in table:
        if "error" in r:
            print(f"{r['n']:6d} {r['variant']:16s} ERROR {r['error'][:100]}")
            continue
        print(f"{r['n']:6d} {r['variant']:16s} kernel {'/'.join(f'{v:.1f}' for v in r['kernel'])} "
              f"bf16 {r['kernel_bf16']:.1f} twin {'/'.join(f'{v:.1f}' for v in r.get('twin', []))} "
              f"err fp16 {r['kernel_fp16_over_floor']:.5f} bf16 {r['kernel_bf16_over_floor']:.5f} "
              f"twin ok {r.get('twin_fp16_over_floor', 0) < 1.01}")
    print(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
