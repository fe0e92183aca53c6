"""Where the GEMM's stream-K tail spends its time: the Gluon kernel with parts of its fix-up taken
out (each variant in its own process, so that the kernel is compiled afresh), against whole tiles.

    PYTHONPATH=. python3 scripts/device/stream_k_diag.py [--out DIR]

Variants (results of the no-* variants are wrong: they time, they do not compute):
  whole    the kernel without the stream-K tail;
  sk       the stream-K tail as shipped;
  nowait   partials written and read, but nobody waits for a flag;
  noload   flags raised and awaited, partials written, never read;
  noflag   partials written and read, no flags at all (no waits, no atomics).
"""
import argparse
import json
import os
import subprocess
import sys

CASES = [(4096, 4096, 4096), (4096, 4096, 1024), (1024, 1024, 16384), (8192, 8192, 8192)]
VARIANTS = ["whole", "sk", "nowait", "noload", "noflag"]


def patch(variant):
    """Swap the kernel's fix-up functions for the variant's (before its first compile)."""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from tilecore.ops.gemm import gluon_kernels
    from tilecore.tiles import gluon as tg

    @gluon.jit
    def add_nowait(acc, workspace, flags, first_slot, end_slot, slot_step):
        SLOT: gl.constexpr = acc.shape[0] * acc.shape[1]
        layout: gl.constexpr = acc.type.layout
        for slot in range(first_slot, end_slot, slot_step):
            acc = gl.convert_layout(tg._add_partial(acc, workspace + slot * SLOT, acc.shape[1], 0), layout)
        return acc

    @gluon.jit
    def add_noload(acc, workspace, flags, first_slot, end_slot, slot_step):
        for slot in range(first_slot, end_slot, slot_step):
            while gl.atomic_add(flags + slot, 0, sem="acquire", scope="gpu") == 0:
                pass
        gl.thread_barrier()
        for slot in range(first_slot, end_slot, slot_step):
            gl.atomic_xchg(flags + slot, 0, sem="relaxed", scope="gpu")
        return acc

    @gluon.jit
    def publish_noflag(acc, workspace, flags, slot):
        SLOT: gl.constexpr = acc.shape[0] * acc.shape[1]
        tg._store_partial(acc, workspace + slot * SLOT, acc.shape[1], 0)

    if variant == "nowait":
        gluon_kernels.add_partials = add_nowait
    elif variant == "noload":
        gluon_kernels.add_partials = add_noload
    elif variant == "noflag":
        gluon_kernels.add_partials = add_nowait
        gluon_kernels.publish_partial = publish_noflag


def child(variant, out_dir):
    import torch

    from tilecore import env
    from tilecore.bench.harness import median_ms
    from tilecore.ops.gemm import launch

    patch(variant)
    dev = torch.device("cuda")
    rows = []
    for M, N, K in CASES:
        a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        b = torch.randn(K, N, device=dev, dtype=torch.bfloat16)
        c = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
        plan = launch.gluon_plan(a, b, torch.bfloat16)
        fn = lambda: launch.launch_gluon(a, b, c, plan=plan, stream_k="off" if variant == "whole" else "always", **launch.GLUON_BF16)
        fn()
        torch.cuda.synchronize()
        eager = [median_ms(fn, warmup_ms=25, rep_ms=100) for _ in range(3)]
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        graph = [median_ms(g.replay, warmup_ms=25, rep_ms=100) for _ in range(3)]
        tf = lambda ms: 2 * M * N * K / ms / 1e9
        row = dict(variant=variant, M=M, N=N, K=K, eager_us=[x * 1e3 for x in eager], graph_us=[x * 1e3 for x in graph],
                   eager_tflops=max(map(tf, eager)), graph_tflops=max(map(tf, graph)))
        rows.append(row)
        print(f"{variant:7s} {M:>5}x{N:>5}x{K:>5}  eager us " + " ".join(f"{x * 1e3:7.1f}" for x in eager)
              + "  graph us " + " ".join(f"{x * 1e3:7.1f}" for x in graph), flush=True)
        del a, b, c
    with open(os.path.join(out_dir, f"stream_k_diag_{variant}.json"), "w") as f:
        json.dump({"meta": env.metadata(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--child")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    if args.child:
        child(args.child, args.out)
    else:
        for v in args.variants.split(","):
            try:
                r = subprocess.run([sys.executable, __file__, "--child", v, "--out", args.out], timeout=100,
                                   capture_output=True, text=True)
                print(r.stdout.strip(), flush=True)
                if r.returncode:
                    print(f"{v}: rc={r.returncode}", r.stderr[-1500:], flush=True)
            except subprocess.TimeoutExpired:
                print(f"{v}: TIMEOUT", flush=True)
