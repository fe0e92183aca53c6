"""Measure the napkin's hardware constants on the GPU, and test the issue's falsifiable tile claims
(issue 36, part 3). Under 2 minutes on an H100.

Measured (triton.testing.do_bench medians after warm-up):
  hbm_bytes_per_s   torch copy_ of 1 GiB: bytes read + written per second
  l2_bytes_per_s    a Triton kernel in which every thread block reads its slice of a 16 MiB working set
                    (fits the 50 MB L2) PASSES times: bytes read / time (the first pass comes from HBM)
  sfu_exp2_per_s    a Triton kernel of chained exp2 in registers (one MUFU op each), 132 x 8 blocks
  launch_s          a 64 KiB copy launched back to back (eager, as do_bench times a call); the empty
                    Triton kernel's time beside it (empty_launch_s: the launch alone)
  graph_launch_s    the same copy replayed 100 times from one CUDA graph, per call (and the empty kernel's);
                    from_constants_json folds the empty kernel's figures where present: the preset's launches
                    are a kernel's time beyond the engine's own (a small DRAM-cold copy less its modelled time),
                    within 0.05 us of an empty kernel's on the H100 (session 39)
  tile_latency_s    one DRAM round trip: a single-thread pointer chase over 64 MiB (random order)
  matmul_flops      torch.matmul bf16 8192^3 (the sustained tensor-core rate the presets calibrate to)
Tile claims at 8192^3 bf16 (a plain Triton tl GEMM, grouped tile order, 8 warps, 3 and 4 stages):
128x128x64 (the napkin: L2-bound near 635 TFLOP/s on the datasheet preset), 128x256x64 (tilecore's
shipped tile), 192x256x64 (the napkin: MMA padding and capacity lose), 256x128x64; each checked
against a float64 reference at 512^3 first (error as a multiple of bf16's rounding floor), each row
printed beside the napkin's predicted TFLOP/s for the same tile, on the preset and on the measured GPU.

Run from the repository root on the GPU machine:

    PYTHONPATH=. python3 experiments/napkin/gpu_constants.py

``--smoke`` runs every kernel once on the CPU through Triton's interpreter at tiny sizes (no timing):
a check of the script. Writes $OUT/napkin_gpu_constants.json ($OUT defaults to /tmp/out), the form
``tilecore.napkin.hardware.from_constants_json`` folds into the H100 preset:

    from tilecore.napkin.hardware import from_constants_json
    gpu = from_constants_json("notes/napkin/runs/napkin_gpu_constants_h100.json")
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

if "--smoke" in sys.argv:  # before triton is imported: the interpreter runs the kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tilecore.napkin import models  # noqa: E402
from tilecore.napkin.engine import group, relabel, stream  # noqa: E402
from tilecore.napkin.hardware import H100  # noqa: E402

# (tile, ring stages): 3 and 4 stages where they fit the napkin's shared-memory account, 3 elsewhere
TILES = [((128, 128, 64), 3), ((128, 128, 64), 4), ((128, 256, 64), 3), ((128, 256, 64), 4),
         ((192, 256, 64), 3), ((256, 128, 64), 3)]


# ------------------------------------------------------------------------------------------ kernels
@triton.jit
def l2_read_kernel(x_ptr, out_ptr, slice_elems, passes, BLOCK: tl.constexpr):
    # x: (programs * slice_elems,) fp32; each program sums its slice `passes` times
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * slice_elems
    acc = tl.zeros((BLOCK,), tl.float32)
    for _ in range(passes):
        for start in range(0, slice_elems, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + base + offs, mask=offs < slice_elems, other=0.0)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def exp2_kernel(x_ptr, out_ptr, iters, BLOCK: tl.constexpr):
    # x, out: (programs * BLOCK,) fp32; a chain of exp2 per element (each depends on the last)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs)
    for _ in range(iters):
        v = tl.math.exp2(v * -0.5)   # stays in (0, 1]: no overflow, no denormals
    tl.store(out_ptr + offs, v)


@triton.jit
def empty_kernel(out_ptr):
    pass


@triton.jit
def chase_kernel(next_ptr, out_ptr, steps):
    # one program, one lane: i = next[i], `steps` times (each load waits for the last)
    i = tl.load(next_ptr).to(tl.int64)
    for _ in range(steps):
        i = tl.load(next_ptr + i).to(tl.int64)
    tl.store(out_ptr, i)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # C (M, N) = A (M, K) B (K, N), fp32 accumulation, tiles in groups of GROUP_M rows (L2 reuse)
    pid = tl.program_id(0)
    n_m = tl.cdiv(M, BLOCK_M)
    n_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * n_n
    first_m = (pid // per_group) * GROUP_M
    rows = min(n_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows
    pid_n = (pid % per_group) // rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None].to(tl.int64) * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kmask = offs_k < K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & kmask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=kmask[:, None] & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def matmul(a, b, block, stages, num_warps=8):
    M, K = a.shape
    N = b.shape[1]
    c = torch.full((M, N), float("nan"), dtype=a.dtype, device=a.device)   # poisoned
    bm, bn, bk = block
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                        c.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=num_warps,
                        num_stages=stages)
    return c


# ------------------------------------------------------------------------------------------ timing
def bench(fn, smoke):
    if smoke:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def measure_copy(dev, smoke):
    n = 1 << (12 if smoke else 29)          # bf16 elements: 1 GiB on the GPU
    x = torch.randn(n, device=dev).to(torch.bfloat16)
    y = torch.full_like(x, float("nan"))
    ms = bench(lambda: y.copy_(x), smoke)
    assert torch.equal(y, x), "copy: output differs"
    return {"hbm_bytes_per_s": 2 * x.numel() * 2 / (ms * 1e-3), "copy_bytes": 2 * x.numel() * 2}


def measure_l2(dev, smoke, sms):
    programs = 8 if smoke else sms * 4
    total = (1 << 10) if smoke else (16 << 20) // 4                    # fp32 elements: 16 MiB
    slice_elems = total // programs
    passes = 2 if smoke else 64
    x = torch.rand(programs * slice_elems, device=dev)
    out = torch.full((programs,), float("nan"), device=dev)
    fn = lambda: l2_read_kernel[(programs,)](x, out, slice_elems, passes, BLOCK=128 if smoke else 1024)  # noqa: E731
    ms = bench(fn, smoke)
    ref = x.view(programs, slice_elems).double().sum(1) * passes
    err = ((out.double() - ref).abs() / ref.abs().clamp_min(1)).max().item()
    assert err < 1e-3, f"l2 read: relative error {err}"
    return {"l2_bytes_per_s": programs * slice_elems * 4 * passes / (ms * 1e-3), "l2_working_set": total * 4,
            "l2_passes": passes}


def measure_exp2(dev, smoke, sms):
    programs = 4 if smoke else sms * 8
    block, iters = (128, 4) if smoke else (1024, 4096)
    x = torch.rand(programs * block, device=dev)
    out = torch.full_like(x, float("nan"))
    ms = bench(lambda: exp2_kernel[(programs,)](x, out, iters, BLOCK=block), smoke)
    ref = x.double()
    for _ in range(iters):
        ref = torch.exp2(ref * -0.5)
    err = ((out.double() - ref).abs()).max().item()
    assert err < 1e-4, f"exp2 chain: max error {err}"
    return {"sfu_exp2_per_s": programs * block * iters / (ms * 1e-3)}


def _graph_per_call(fn, calls=100):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return triton.testing.do_bench(g.replay, warmup=25, rep=100, return_mode="median") * 1e-3 / calls


def measure_launch(dev, smoke):
    # launch_s / graph_launch_s as the napkin uses them: the fixed time of a small kernel that does a
    # little DRAM work (a 64 KiB copy), eager and replayed from a graph; the empty kernel's figures are
    # the launch alone (lower bounds)
    out = torch.zeros(1, device=dev)
    empty = lambda: empty_kernel[(1,)](out)  # noqa: E731
    x = torch.randn(1 << 15, device=dev).to(torch.float16)      # 64 KiB
    y = torch.empty_like(x)
    small_copy = lambda: y.copy_(x)  # noqa: E731
    res = {"launch_s": bench(small_copy, smoke) * 1e-3, "empty_launch_s": bench(empty, smoke) * 1e-3}
    if not smoke:
        res["graph_launch_s"] = _graph_per_call(small_copy)
        res["empty_graph_launch_s"] = _graph_per_call(empty)
    return res


def measure_latency(dev, smoke):
    n = (1 << 10) if smoke else (64 << 20) // 8      # int64 entries: 64 MiB, past the L2
    steps = 64 if smoke else 4096
    perm = torch.randperm(n, device=dev)
    nxt = torch.empty(n, dtype=torch.int64, device=dev)
    nxt[perm] = torch.roll(perm, -1)                 # one cycle through every entry, in random order
    out = torch.full((1,), -1, dtype=torch.int64, device=dev)
    ms = bench(lambda: chase_kernel[(1,)](nxt, out, steps), smoke)
    return {"tile_latency_s": ms * 1e-3 / (steps + 1)}


def check_matmul(dev, block, stages, smoke):
    m = n = k = 64 if smoke else 512
    bm, bn, bk = (32, 32, 32) if smoke else block
    dtype = torch.float16 if smoke else torch.bfloat16   # the interpreter's bf16 dot is wrong
    a = torch.randn(m, k, device=dev).to(dtype)
    b = torch.randn(k, n, device=dev).to(dtype)
    c = matmul(a, b, (bm, bn, bk), 2 if smoke else stages)
    assert not torch.isnan(c).any(), "matmul: an element was not written"
    ref = a.double() @ b.double()
    floor = (ref - ref.to(dtype).double()).pow(2).mean().sqrt().item()     # rounding the exact result
    err = (c.double() - ref).pow(2).mean().sqrt().item()
    return err / floor


def napkin_gemm_tflops(gpu, size, block, stages):
    bm, bn, bk = block
    try:
        # 8 warps: two warpgroups share the tile's rows, as the timed Triton kernel runs it
        r = relabel(models.matmul(size, size, size), gpu, {"m": group(bm), "n": group(bn), "k": stream(bk)},
                    warpgroups=2, stages=stages, split_axis="m")
        return r.tflops, r.bound
    except Exception as e:  # a tile the napkin says does not fit
        return None, f"does not fit: {e}"[:80]


def measure_tiles(dev, smoke, constants):
    size = 256 if smoke else 8192
    dtype = torch.float16 if smoke else torch.bfloat16
    a = torch.randn(size, size, device=dev).to(dtype)
    b = torch.randn(size, size, device=dev).to(dtype)
    flops = 2 * size ** 3
    rows = []
    ms = bench(lambda: a @ b, smoke)
    rows.append({"tile": "torch.matmul (cuBLAS)", "stages": None, "tflops": flops / (ms * 1e-3) / 1e12})
    constants["matmul_flops"] = {"bf16": flops / (ms * 1e-3)}
    measured_gpu = H100.with_constants({"constants": constants, "source": "this run"}, label="this run")
    for block, stages in TILES:
        row = {"tile": "x".join(map(str, block)), "stages": stages}
        if any(n & (n - 1) for n in block):  # tl.arange takes powers of two only: no tl kernel to time
            row["error"] = "not timed: tl.arange needs powers of two (a Gluon kernel would be needed)"
        else:
            try:
                row["err_over_floor"] = check_matmul(dev, block, stages, smoke)
                bm, bn, bk = (32, 32, 32) if smoke else block
                ms = bench(lambda: matmul(a, b, (bm, bn, bk), 2 if smoke else stages), smoke)
                row["tflops"] = flops / (ms * 1e-3) / 1e12
            except Exception as e:  # out of resources, compile error: recorded, the run goes on
                row["error"] = f"{type(e).__name__}: {e}"[:200]
                traceback.print_exc()
        row["napkin_preset"], row["bound_preset"] = napkin_gemm_tflops(H100, 8192, block, stages)
        row["napkin_measured"], row["bound_measured"] = napkin_gemm_tflops(measured_gpu, 8192, block, stages)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, tiny sizes, no timing")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    args = p.parse_args(argv)
    smoke = args.smoke
    dev = "cpu" if smoke else "cuda"
    sms = 132 if smoke else torch.cuda.get_device_properties(0).multi_processor_count
    device = "cpu (interpreter)" if smoke else torch.cuda.get_device_name(0)
    t_start = time.time()
    constants, errors = {}, {}
    for name, fn in (("copy", lambda: measure_copy(dev, smoke)), ("l2", lambda: measure_l2(dev, smoke, sms)),
                     ("exp2", lambda: measure_exp2(dev, smoke, sms)), ("launch", lambda: measure_launch(dev, smoke)),
                     ("latency", lambda: measure_latency(dev, smoke))):
        try:
            constants.update(fn())
        except Exception as e:  # each measurement on its own: print, record, go on
            errors[name] = f"{type(e).__name__}: {e}"[:300]
            traceback.print_exc()
    try:
        tiles = measure_tiles(dev, smoke, constants)
    except Exception as e:
        tiles = []
        errors["tiles"] = f"{type(e).__name__}: {e}"[:300]
        traceback.print_exc()
    result = {"device": device, "smoke": smoke, "torch": torch.__version__, "triton": triton.__version__,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "source": f"experiments/napkin/gpu_constants.py on {device}",
              "constants": constants, "tiles": tiles, "errors": errors, "seconds": time.time() - t_start,
              "preset": {"hbm_bytes_per_s": H100.level("HBM").bandwidth, "l2_bytes_per_s": H100.level("L2").bandwidth,
                         "sfu_exp2_per_s": H100.rate("sfu", "fp32"), "launch_s": H100.launch_s,
                         "graph_launch_s": H100.graph_launch_s, "tile_latency_s": H100.tile_latency_s}}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "napkin_gpu_constants.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"\n== napkin constants on {device}{' (smoke: not timings)' if smoke else ''}")
    print(f"{'constant':<18} {'measured':>14} {'preset':>14}")
    for key, val in constants.items():
        if key == "matmul_flops":
            print(f"{'matmul bf16':<18} {val['bf16'] / 1e12:>11.0f} TF {989.4:>11.0f} TF")
            continue
        pre = result["preset"].get(key)
        scale, unit = (1e-9, "GB/s") if "bytes_per_s" in key else (1e-9, "G/s") if "per_s" in key else \
            (1e6, "us") if key.endswith("_s") else (1, "")
        shown = f"{val * scale:,.2f} {unit}" if unit else f"{val}"
        print(f"{key:<18} {shown:>14} {('%.2f %s' % (pre * scale, unit)) if pre else '-':>14}")
    print(f"\n{'tile (8192^3 bf16)':<22} {'stages':>6} {'TFLOP/s':>8} {'err/floor':>9} {'napkin preset':>14} "
          f"{'napkin measured':>16}  bound (measured GPU)")
    for r in tiles:
        fmt = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
        print(f"{r['tile']:<22} {str(r.get('stages') or '-'):>6} {fmt(r.get('tflops')):>8} "
              f"{('%.2f' % r['err_over_floor']) if 'err_over_floor' in r else '-':>9} "
              f"{fmt(r.get('napkin_preset')):>14} {fmt(r.get('napkin_measured')):>16}  "
              f"{r.get('bound_measured', '')}{'  ERROR ' + r['error'] if 'error' in r else ''}")
    if errors:
        print("errors:", json.dumps(errors, indent=1))
    print(f"wrote {path} ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
