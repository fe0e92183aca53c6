"""What an e4m3 wgmma with A in registers reads of a small B block in shared memory (issue 34, l_mma's bug).

    PYTHONPATH=. python3 experiments/attention_fp8/gpu_ones_probe.py [--compile-only]

One warpgroup, D [64, N] = A [64, 32] (registers, the layout of the attention kernel's P operand) times B^T, where B is
stored [rows, keys] (keys contiguous: K-major) in each of gluon_fp8.L_MMA's modes, and a guard block of 2.0 allocated
right after it (a read past B shows as 2s). Three tests a mode:
  random    A, B random e4m3: D against float64 (rel-RMS; exact products, float32 sums: ~1e-7 if right)
  identity  A[r, k] = 1 where k = r mod 32: D[r, n] = B[n, r mod 32], so D shows which B element each k reads
            (B[n, k] = k mod 16 + 1, negative for k >= 16, + 0 n: the expected column printed beside the seen)
  ones      B = ones written in the kernel (gl.full in float16 then e4m3, as the attention kernel did until session
            28), A random: D[:, n] against A's row sums. Run 5 (H100): WRONG in every mode (D / rowsum median -95 or
            0.43): ptxas 12.8 compiles the constant's conversion to an F2FP ... MERGE_C that takes the high 16 bits of
            each register from another register (sm_90a SASS)
  ones_bytes  the same with the ones written as their bytes (0x38, uint8 bitcast to e4m3: the kernel's fix)
A test passes where D's rel-RMS error is under 1e-3 (FP8 wgmma sums with a narrow accumulator: ~4e-5 on random B).
Prints a line a mode and test; JSON to $OUT/attention_fp8_ones_probe.json. ~15 s on an H100 (compiles).
"""
from __future__ import annotations

import argparse
import json
import os
import time
import traceback

import torch
from triton.experimental import gluon

from tilecore.tiles.gluon.compat import fence_async_shared, gl, warpgroup_mma

# mode: (rows, keys, N, first N rows only, first 32 keys only) as gluon_fp8.ones_shape and row_sum_mma
MODES = {1: (8, 32, 8, False, False), 2: (8, 128, 8, False, True), 3: (16, 32, 16, False, False),
         4: (16, 32, 8, True, False), 5: (16, 128, 8, True, True)}


@gluon.constexpr_function
def b_layout(rows, keys):
    return gl.NVMMASharedLayout.get_default_for([rows, keys], gl.float8e4nv)


@gluon.jit
def wgmma_b_probe(a_ptr, b_ptr, d_ptr, ROWS: gl.constexpr, KEYS: gl.constexpr, N: gl.constexpr,
                  FIRST_ROWS: gl.constexpr, FIRST_KEYS: gl.constexpr, ONES: gl.constexpr, ONES_BYTES: gl.constexpr = False):
    """d [64, N] float32 = a [64, 32] @ B[:N, :32]^T, B [ROWS, KEYS] e4m3 from b_ptr (or ones: ONES) in shared
    memory."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 32])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=4)
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, a_layout))
    cols = gl.arange(0, 32, layout=gl.SliceLayout(0, a_layout))
    a = gl.load(a_ptr + gl.expand_dims(rows, 1) * 32 + gl.expand_dims(cols, 0))
    blocked: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [4, 1], [1, 0])
    br = gl.arange(0, ROWS, layout=gl.SliceLayout(1, blocked))
    bc = gl.arange(0, KEYS, layout=gl.SliceLayout(0, blocked))
    if ONES_BYTES:
        b = gl.full([ROWS, KEYS], 0x38, gl.uint8, blocked).to(gl.float8e4nv, bitcast=True)
    elif ONES:
        b = gl.full([ROWS, KEYS], 1.0, gl.float16, blocked).to(gl.float8e4nv)
    else:
        b = gl.load(b_ptr + gl.expand_dims(br, 1) * KEYS + gl.expand_dims(bc, 0))
    b_smem = gl.allocate_shared_memory(gl.float8e4nv, [ROWS, KEYS], b_layout(ROWS, KEYS), b)
    guard = gl.allocate_shared_memory(gl.float8e4nv, [ROWS, KEYS], b_layout(ROWS, KEYS),
                                      gl.full([ROWS, KEYS], 2.0, gl.float16, blocked).to(gl.float8e4nv))
    fence_async_shared()
    gl.thread_barrier()
    sub = b_smem
    if FIRST_KEYS:
        sub = sub.slice(0, 32, dim=1)
    if FIRST_ROWS:
        sub = sub.slice(0, N, dim=0)
    d = warpgroup_mma(a, sub.permute((1, 0)), gl.zeros([64, N], gl.float32, acc_layout), use_acc=False)
    dr = gl.arange(0, 64, layout=gl.SliceLayout(1, acc_layout))
    dc = gl.arange(0, N, layout=gl.SliceLayout(0, acc_layout))
    # the guard read after the wgmma (0 times its sum), so that it stays allocated through it
    d = d + gl.sum(gl.sum(guard.load(blocked).to(gl.float32), axis=1), axis=0) * 0.0
    gl.store(d_ptr + gl.expand_dims(dr, 1) * N + gl.expand_dims(dc, 0), d)


def compile_only():
    """Compile every mode for sm_90a (no GPU): the descriptors in the PTX."""
    from tilecore.tiles.compile import compile_kernel

    a = torch.empty(64, 32, dtype=torch.float8_e4m3fn)
    b = torch.empty(16, 128, dtype=torch.float8_e4m3fn)
    d = torch.empty(64, 16)
    for mode, (rows, keys, n, first_rows, first_keys) in MODES.items():
        for ones in (False, True):
            c = compile_kernel(wgmma_b_probe, dict(a_ptr=a, b_ptr=b, d_ptr=d, ROWS=rows, KEYS=keys, N=n,
                                                   FIRST_ROWS=first_rows, FIRST_KEYS=first_keys, ONES=ones,
                                                   ONES_BYTES=ones))
            ptx = c.asm["ptx"]
            line = next(x for x in ptx.splitlines() if "wgmma.mma_async" in x)
            print(mode, ones, line.strip()[:90])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args()
    if args.compile_only:
        return compile_only()
    t0 = time.time()
    dev = "cuda"
    f8 = torch.float8_e4m3fn
    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(), "probe": []}
    g = torch.Generator(device=dev).manual_seed(0)
    a_rand = (torch.randn(64, 32, device=dev, generator=g) * 2).to(f8)
    a_id = torch.zeros(64, 32, device=dev)
    a_id[torch.arange(64), torch.arange(64) % 32] = 1.0
    a_id = a_id.to(f8)
    k = torch.arange(128, device=dev)
    pattern = ((k % 16) + 1).float() * torch.where((k % 32) < 16, 1.0, -1.0)
    for mode, (rows, keys, n, first_rows, first_keys) in MODES.items():
        b_rand = torch.randn(rows, keys, device=dev, generator=g).to(f8)
        b_pat = pattern[:keys].expand(rows, keys).contiguous().to(f8)
        for test, a, b, ones in (("random", a_rand, b_rand, False), ("identity", a_id, b_pat, False),
                                 ("ones", a_rand, b_rand, True), ("ones_bytes", a_rand, b_rand, True)):
            rec = dict(mode=mode, test=test)
            try:
                d = torch.full((64, n), float("nan"), device=dev)
                wgmma_b_probe[(1,)](a, b, d, ROWS=rows, KEYS=keys, N=n, FIRST_ROWS=first_rows, FIRST_KEYS=first_keys,
                                    ONES=ones, ONES_BYTES=test == "ones_bytes", num_warps=4)
                torch.cuda.synchronize()
                b_used = torch.ones(n, 32, device=dev, dtype=torch.float64) if ones else b[:n, :32].double()
                ref = a.double() @ b_used.T
                rec["rel_rms"] = ((d.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
                rec["ok"] = rec["rel_rms"] < 1e-3
                if test == "identity":
                    rec["seen_col0"] = d[:32, 0].tolist()
                    rec["expected_col0"] = ref[:32, 0].tolist()
                if test.startswith("ones"):
                    rec["ratio_rowsum_median"] = (d[:, 0].double() / ref[:, 0]).median().item()
            except Exception as e:  # noqa: BLE001 -- report and go on
                rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                traceback.print_exc()
            print("probe", json.dumps(rec), flush=True)
            result["probe"].append(rec)
    with open(os.path.join(out_dir, "attention_fp8_ones_probe.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"\n{result['device']} ({time.time() - t0:.0f} s): e4m3 wgmma, A registers [64, 32], B [rows, keys] K-major")
    for r in result["probe"]:
        rows, keys, n, fr, fk = MODES[r["mode"]]
        head = f"mode {r['mode']} B [{rows}, {keys}] N {n} {r['test']:8s}"
        if "error" in r:
            print(f"{head} ERROR {r['error'][:150]}")
            continue
        extra = ""
        if "seen_col0" in r:
            extra = " seen " + " ".join(f"{x:g}" for x in r["seen_col0"])
        if "ratio_rowsum_median" in r:
            extra = f" D / rowsum median {r['ratio_rowsum_median']:.4f}"
        print(f"{head} {'OK   ' if r['ok'] else 'WRONG'} rel-RMS {r['rel_rms']:.1e}{extra}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
