"""The Gluon kron kernel (gluon_quantize_kron.py: m <= 32 x p = 128..1024; 14336, 28672) compiled for sm_90a on the
CPU at every format and both splits: registers, spills, shared memory, wgmma count, TMA (issue 32, session 31).

    python experiments/hadamard/kron_gluon_compile.py [--only 14336] [--json out.json]   (TRITON_INTERPRET unset)

compile_rows: the power-of-two rows on the transform's pipeline (gluon_kernels.hadamard_gluon_quantize_kernel, session 41).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.getcwd())
os.environ.pop("TRITON_INTERPRET", None)

FORMATS = {"fp8_e4m3": (0, 0, 448.0, False), "int8": (2, 0, 127.0, False), "mxfp4": (3, 32, 6.0, True),
           "nvfp4": (4, 16, 6.0, True), "int4": (5, 128, 7.0, True), "amax": (6, 0, 1.0, False),
           "store": (7, 0, 1.0, False)}


def sass_count(k):
    from experiments.hadamard.wide_gluon_compile import sass_count as count

    return count(k)


def compile_one(m, p, split, fmt, stages=2, rows=1 << 14, inside=False, scale_once=False, fold=False, nozero=False,
                clamp_lo=False, perm=False, stream=False, extra=None):
    """``extra``: further constexprs of the kernel (e.g. {"INT_BITS": True})."""
    import torch

    from tilecore.ops.hadamard import gluon_quantize_kron as g
    from tilecore.tiles.compile import compile_kernel, resources
    from tilecore.tiles.launch import gluon_descriptor

    fid, G, qmax, packed = FORMATS[fmt]
    n = m * p
    x = torch.empty(rows, n, dtype=torch.bfloat16)
    out = x if fid == 7 else torch.empty(rows, n // (2 if packed else 1), dtype=torch.uint8)
    xd, cd, sd = g.descriptors(x, out, m, p, split, packed)
    hd = gluon_descriptor(g.gluon_operand(m, torch.bfloat16, "cpu"), [64, 64])
    scales = torch.empty(rows, n // G if G else 1, dtype=torch.uint8 if fid in (3, 4) else torch.float32)
    gs = torch.empty(1, dtype=torch.float32)
    k = compile_kernel(g.gluon_kron_quantize_kernel, dict(
        x_desc=xd, codes_desc=cd, staging_desc=sd, h_desc=hd, scales=scales, gscale=gs, amax_out=gs, rows=rows,
        stride_scales=scales.stride(0), rscale=0.01, row_counter=torch.zeros(1, dtype=torch.int32), M=m, F=p // 64,
        SPLIT=split, FORMAT=fid, G=G, STATIC=False, QMAX=qmax, STAGES=stages, INSIDE=inside, SCALE_ONCE=scale_once, FOLD=fold,
        **({"NOZERO": True} if nozero else {}), **({"CLAMP_LO": clamp_lo} if clamp_lo else {}),
        **({"PERM": True} if perm else {}), **({"STREAM": True} if stream else {}), **(extra or {})), num_warps=4)
    r = resources(k)
    ptx = k.asm["ptx"]
    return dict(vars(r), **sass_count(k), m=m, p=p, split=split, format=fmt, stages=stages, inside=inside,
                scale_once=scale_once, fold=fold, nozero=nozero, clamp_lo=clamp_lo, perm=perm, wgmma=ptx.count("wgmma.mma_async"),
                tma="cp.async.bulk.tensor" in ptx, shared_meta=k.metadata.shared, cvt_rni=ptx.count("cvt.rni.s32.f32"))


def compile_rows(n, fmt, stages=4, lookahead=0, rows=1 << 12, extra=None):
    """gluon_kernels.hadamard_gluon_quantize_kernel (the transform's pipeline with the codes; quantize's "gluon_rows"
    plan) for sm_90a at n = 16384 / 32768 (fp8, int8, int4, store). ``extra``: further constexprs (CLAMP_LO, INT_BITS)."""
    import torch

    from tilecore.ops.hadamard.gluon_kernels import hadamard_gluon_quantize_kernel
    from tilecore.ops.hadamard.gluon_launch import rows_descriptors
    from tilecore.ops.hadamard.launch import h64_operand
    from tilecore.tiles.compile import compile_kernel, resources
    from tilecore.tiles.launch import gluon_descriptor

    fid, G, qmax, packed = FORMATS[fmt]
    x = torch.empty(rows, n, dtype=torch.bfloat16)
    out = x if fid == 7 else torch.empty(rows, n // (2 if packed else 1), dtype=torch.uint8)
    xd, cd, sd = rows_descriptors(x, out, packed)
    hd = gluon_descriptor(h64_operand("cpu", torch.bfloat16), [64, 64])
    scales = torch.empty(rows, n // G if G else 1, dtype=torch.uint8 if fid in (3, 4) else torch.float32)
    gs = torch.empty(1, dtype=torch.float32)
    k = compile_kernel(hadamard_gluon_quantize_kernel, dict(
        x_desc=xd, codes_desc=cd, staging_desc=sd, h_desc=hd, scales=scales, gscale=gs, rows=rows,
        stride_scales=scales.stride(0), rscale=n**-0.5, row_counter=torch.zeros(1, dtype=torch.int32), S=n // 8192,
        STAGES=stages, FORMAT=fid, G=G, STATIC=False, QMAX=qmax, LOOKAHEAD=lookahead, **(extra or {})), num_warps=4)
    r = resources(k)
    ptx = k.asm["ptx"]
    return dict(vars(r), **sass_count(k), n=n, format=fmt, stages=stages, lookahead=lookahead, extra=extra or {},
                wgmma=ptx.count("wgmma.mma_async"), tma="cp.async.bulk.tensor" in ptx, shared_meta=k.metadata.shared)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--json", default="")
    ap.add_argument("--scale-once", default="0", help="comma list of 0/1")
    ap.add_argument("--fold", default="0", help="comma list of 0/1")
    ap.add_argument("--inside", default="0", help="comma list of 0/1")
    a = ap.parse_args()
    res = []
    for m, p, split in ((28, 512, 1), (28, 512, 2), (28, 1024, 2)):
        if a.only and a.only not in (str(m * p), f"{m * p}/{split}"):
            continue
        for fmt, inside in [(f, i == "1") for f in a.formats.split(",") for i in a.inside.split(",")]:
            for so, fo in [(so, fo) for so in a.scale_once.split(",") for fo in a.fold.split(",")]:
                r = compile_one(m, p, split, fmt, inside=inside, scale_once=so == "1", fold=fo == "1")
                print(json.dumps(r), flush=True)
                res.append(r)
            continue
            print(json.dumps(r), flush=True)
            res.append(r)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
