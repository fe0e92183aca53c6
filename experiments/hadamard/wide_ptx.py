"""The wide quantize kernels (quantize_wide.wide_quantize_kernel, quantize_wide_rows.wide_rows_quantize_kernel)
compiled for sm_90a on the CPU at the plans the GPU runs (quantize.kernel_plan, 132 SMs, 2^28 elements), one PTX
file a variant, to check that a change of their source left the emitted code alone (issue 32, session 30's D1:
one row epilogue shared by both kernels):

    python experiments/hadamard/wide_ptx.py --root OLD --ptx /tmp/wide_old     (TRITON_INTERPRET unset)
    python experiments/hadamard/wide_ptx.py --ptx /tmp/wide_new
    python experiments/tiles/ptx_compare.py /tmp/wide_old /tmp/wide_new

Variants: every shipped format (fp8_e4m3, int8, int4, nvfp4 static and its dynamic amax pass, mxfp4) at 11008
and 18944 on the wide plan (the shipped tunings), the same at 11008 on wide_rows pairs and splits, and the
transform's STORE on both kernels (hadamard_transform's 172 x 64 plan).
"""
import argparse
import os
import re
import sys

ELEMS = 1 << 28
SMS = 132


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.getcwd())
    ap.add_argument("--ptx", required=True)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.root))
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    from tilecore.ops.hadamard import quantize
    from tilecore.ops.hadamard.quantize_wide import wide_quantize_kernel
    from tilecore.ops.hadamard.quantize_wide_rows import wide_rows_quantize_kernel
    from tilecore.tiles.compile import compile_kernel

    os.makedirs(a.ptx, exist_ok=True)
    STORE, AMAX = 7, 6

    def write(name, fmt, n, fmt_id=None, static=False, **tuning):
        if a.only and a.only not in name:
            return
        f = quantize.FORMATS[fmt]
        group = f.default_group
        plan = quantize.kernel_plan(ELEMS // n, n, torch.bfloat16, fmt, group, None, True, static, False, SMS,
                                    **tuning)
        if plan.path not in ("wide", "wide_rows"):
            print(name, "-> plan", plan.path, "(skipped)", flush=True)
            return
        cfg = dict(plan.config)
        if fmt_id is not None:
            cfg["FORMAT"] = fmt_id
            if fmt_id == STORE:
                cfg["PACKED"] = False
        warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
        options = {"maxnreg": cfg.pop("maxnreg")} if "maxnreg" in cfg else {}
        x = torch.empty(64, n, dtype=torch.bfloat16)
        codes = x if fmt_id == STORE else torch.empty(64, n // 2 if f.packed else n, dtype=torch.uint8)
        scales = torch.empty(64, n // (group or n), dtype=torch.uint8 if fmt in ("mxfp4", "nvfp4") else torch.float32)
        h = torch.empty(cfg["M_PAD"], cfg["M_PAD"], dtype=torch.bfloat16)
        g = torch.empty(1, dtype=torch.float32)
        kernel = wide_rows_quantize_kernel if plan.path == "wide_rows" else wide_quantize_kernel
        args = dict(x=x, codes=codes, scales=scales, h=h, signs=x, gscale=g, amax_out=g, rows=ELEMS // n,
                    stride_x=n, stride_codes=codes.shape[1], stride_scales=scales.shape[1], rscale=0.5, **cfg)
        k = compile_kernel(kernel, args, num_warps=warps, num_stages=stages, **options)
        path = os.path.join(a.ptx, re.sub(r"[^A-Za-z0-9]+", "_", name) + ".ptx")
        with open(path, "w") as fh:
            fh.write(k.asm["ptx"].replace(os.path.abspath(a.root) + os.sep, ""))
        print(name, plan.path, "->", path, flush=True)

    for n in (11008, 18944):
        for fmt in ("fp8_e4m3", "int8", "int4", "mxfp4"):
            write(f"wide {fmt} {n}", fmt, n, wide=True)
        write(f"wide nvfp4 static {n}", "nvfp4", n, static=True, wide=True)
        write(f"wide nvfp4 amax {n}", "nvfp4", n, fmt_id=AMAX, wide=True)
    for mode in ("pair", True):
        tag = "pair" if mode == "pair" else "split"
        for fmt in ("fp8_e4m3", "int8", "int4", "mxfp4"):
            write(f"rows {tag} {fmt} 11008", fmt, 11008, wide=True, wide_rows=mode, mb=64, kc=64, num_warps=8)
        write(f"rows {tag} nvfp4 static 11008", "nvfp4", 11008, static=True, wide=True, wide_rows=mode, mb=64,
              kc=64, num_warps=8)
        write(f"rows {tag} nvfp4 amax 11008", "nvfp4", 11008, fmt_id=AMAX, wide=True, wide_rows=mode, mb=64, kc=64,
              num_warps=8)
    write("rows pair store 11008", "mxfp4", 11008, fmt_id=STORE, wide=True, wide_rows="pair", mb=64, kc=64,
          num_warps=8)
    write("wide store 11008", "mxfp4", 11008, fmt_id=STORE, wide=True)


if __name__ == "__main__":
    main()
