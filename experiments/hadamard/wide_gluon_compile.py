"""The Gluon wide kernel (gluon_quantize_wide.py) compiled for sm_90a on the CPU: 11008 (172 x 64, HALVES 1, shipped)
and 18944 (148 x 128, HALVES 2: a row a tile, consumer c its 64-column half, both halves' mixing, the per-token amax
exchanged), every format: registers, spills, shared memory, wgmma count (issue 32, session 31).

    python experiments/hadamard/wide_gluon_compile.py [--only 18944] [--formats fp8_e4m3,mxfp4] [--json out.json]
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
    """The kernel's SASS instructions (cuobjdump -sass of its cubin): all, and the conversions / shuffles among them."""
    import re
    import subprocess
    import tempfile


    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as fh:
            fh.write(k.asm["cubin"])
        tool = os.path.join(os.path.dirname(__import__("triton").__file__), "backends", "nvidia", "bin", "cuobjdump")
        out = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", out)
    return {"sass": len(ops), "sass_shfl": sum(o.startswith("SHFL") for o in ops),
            "sass_sync": sum(o.startswith(("BAR", "SYNCS")) for o in ops)}


def compile_one(m, p, fmt, stages=2, rows=1 << 14, scale_once=False, ktrim=False, fold=False, units=False,
                nozero=False, clamp_lo=False, store2=False, perm=False, slots=None, stream=False, extra=None):
    """``extra``: further constexprs of the kernel (e.g. {"INT_BITS": True})."""
    import torch

    from tilecore.ops.hadamard import gluon_quantize_wide as g
    from tilecore.tiles.compile import compile_kernel, resources
    from tilecore.tiles.launch import gluon_descriptor

    fid, G, qmax, packed = FORMATS[fmt]
    n, halves = m * p, p // 64
    x = torch.empty(rows, n, dtype=torch.bfloat16)
    out = x if fid == 7 else torch.empty(rows, n // (2 if packed else 1), dtype=torch.uint8)
    xd, cd, sd = g.descriptors(x, out, m, packed, halves, slots or (2 if store2 or stream else 4),
                               bool((extra or {}).get("JOINT")))
    hd = gluon_descriptor(g.gluon_operand(m, torch.bfloat16, "cpu"), [64, 64])
    scales = torch.empty(rows, n // G if G else 1, dtype=torch.uint8 if fid in (3, 4) else torch.float32)
    gs = torch.empty(1, dtype=torch.float32)
    k = compile_kernel(g.gluon_wide_quantize_kernel, dict(
        x_desc=xd, codes_desc=cd, staging_desc=sd, h_desc=hd, scales=scales, gscale=gs, amax_out=gs, rows=rows,
        stride_scales=scales.stride(0), rscale=0.01, row_counter=torch.zeros(1, dtype=torch.int32), M=m, FORMAT=fid,
        G=G, STATIC=False, QMAX=qmax, STAGES=stages, HALVES=halves, SCALE_ONCE=scale_once, KTRIM=ktrim, FOLD=fold,
        **({"UNITS": True} if units else {}), **({"NOZERO": True} if nozero else {}),
        **({"CLAMP_LO": clamp_lo} if clamp_lo else {}), **({"STORE2": True} if store2 else {}),
        **({"PERM": True} if perm else {}), **({"STREAM": True} if stream else {}), **(extra or {})), num_warps=4)
    r = resources(k)
    ptx = k.asm["ptx"]
    return dict(vars(r), **sass_count(k), m=m, p=p, format=fmt, stages=stages, scale_once=scale_once, ktrim=ktrim, fold=fold, units=units, store2=store2, wgmma=ptx.count("wgmma.mma_async"),
                tma="cp.async.bulk.tensor" in ptx, satfinite="cvt.rn.satfinite" in ptx, shared_meta=k.metadata.shared,
                cvt_rni=ptx.count("cvt.rni.s32.f32"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--formats", default="fp8_e4m3,int8,mxfp4,nvfp4,int4,amax,store")
    ap.add_argument("--json", default="")
    ap.add_argument("--scale-once", default="0", help="comma list of 0/1")
    ap.add_argument("--ktrim", default="0", help="comma list of 0/1")
    ap.add_argument("--fold", default="0", help="comma list of 0/1")
    ap.add_argument("--units", default="0", help="comma list of 0/1 (HALVES 2 only)")
    ap.add_argument("--stages", type=int, default=2)
    a = ap.parse_args()
    res = []
    for m, p in ((148, 128), (172, 64)):
        if a.only and a.only != str(m * p):
            continue
        for fmt in a.formats.split(","):
            for so, kt, fo, un in [(so, kt, fo, un) for so in a.scale_once.split(",") for kt in a.ktrim.split(",")
                                   for fo in a.fold.split(",") for un in a.units.split(",") if p == 128 or un == "0"]:
                r = compile_one(m, p, fmt, stages=a.stages, scale_once=so == "1", ktrim=kt == "1", fold=fo == "1",
                                units=un == "1")
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
