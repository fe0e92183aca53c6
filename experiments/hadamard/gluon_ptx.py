"""hadamard_quantize's Gluon kernels (gluon_quantize_wide.py, gluon_quantize_kron.py) compiled for sm_90a on the CPU
at the plans the GPU runs (quantize.kernel_plan with the Gluon kernels allowed, 132 SMs, 2^28 elements), one PTX file
a variant, to check that a change of their source left the emitted code alone (issue 32, session 32's D4: one
epilogue for both kernels):

    python experiments/hadamard/gluon_ptx.py --root OLD --ptx /tmp/gluon_old     (TRITON_INTERPRET unset)
    python experiments/hadamard/gluon_ptx.py --ptx /tmp/gluon_new
    python experiments/tiles/ptx_compare.py /tmp/gluon_old /tmp/gluon_new

Variants: every format at 14336, 28672 (kron kernel), 18944, 11008 (wide kernel) as shipped; nvfp4's AMAX pass;
e5m2, fp8 static; the switches off and on (SCALE_ONCE, FOLD, INSIDE, SPLIT 1, KTRIM, UNITS); STORE on both kernels.
"""
import argparse
import os
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

    from tilecore.ops.hadamard import configs
    from tilecore.ops.hadamard import gluon_quantize_kron as gk
    from tilecore.ops.hadamard import gluon_quantize_wide as gw
    from tilecore.ops.hadamard import quantize
    from tilecore.tiles.compile import compile_kernel
    from tilecore.tiles.launch import gluon_descriptor

    os.makedirs(a.ptx, exist_ok=True)
    STORE, AMAX = 7, 6

    def write(name, fmt, n, fmt_id=None, static=False, **tuning):
        if a.only and a.only not in name:
            return
        f = quantize.FORMATS[fmt]
        group = f.default_group
        plan = quantize.kernel_plan(ELEMS // n, n, torch.bfloat16, fmt, group, None, True, static, False, SMS,
                                    _gluon_ok=True, **tuning)
        if plan.path not in ("gluon_wide", "gluon_kron"):
            print(name, "-> plan", plan.path, "(skipped)", flush=True)
            return
        cfg = dict(plan.config)
        packed = cfg.pop("PACKED")
        if fmt_id is not None:
            cfg["FORMAT"] = fmt_id
            packed = False if fmt_id == STORE else packed
        warps = cfg.pop("num_warps")
        rows = 64
        x = torch.empty(rows, n, dtype=torch.bfloat16)
        out = x if fmt_id == STORE else torch.empty(rows, n // 2 if packed else n, dtype=torch.uint8)
        scales = torch.empty(rows, n // (group or n), dtype=torch.uint8 if fmt in ("mxfp4", "nvfp4") else torch.float32)
        gs = torch.empty(1, dtype=torch.float32)
        m = cfg["M"]
        if plan.path == "gluon_kron":
            p = 64 * cfg["F"]
            xd, cd, sd = gk.descriptors(x, out, m, p, cfg["SPLIT"], packed)
            hd = gluon_descriptor(gk.gluon_operand(m, torch.bfloat16, "cpu"), [64, 64])
            kernel = gk.gluon_kron_quantize_kernel
        else:
            xd, cd, sd = gw.descriptors(x, out, m, packed, cfg.get("HALVES", 1))
            hd = gluon_descriptor(gw.gluon_operand(m, torch.bfloat16, "cpu"), [64, 64])
            kernel = gw.gluon_wide_quantize_kernel
        k = compile_kernel(kernel, dict(x_desc=xd, codes_desc=cd, staging_desc=sd, h_desc=hd, scales=scales, gscale=gs,
                                        amax_out=gs, rows=rows, stride_scales=scales.stride(0), rscale=n**-0.5,
                                        row_counter=torch.zeros(1, dtype=torch.int32), **cfg), num_warps=warps)
        with open(os.path.join(a.ptx, name + ".ptx"), "w") as fh:
            fh.write(k.asm["ptx"])
        print(name, plan.path, {key: v for key, v in cfg.items() if key not in ("M", "QMAX")}, flush=True)

    formats = ("fp8_e4m3", "int8", "mxfp4", "nvfp4", "int4")
    for n in (14336, 28672, 18944, 11008):
        for fmt in formats:
            write(f"{fmt}_{n}", fmt, n, static=fmt == "nvfp4")
        write(f"nvfp4_amax_{n}", "nvfp4", n, fmt_id=AMAX)
        write(f"store_{n}", "fp8_e4m3", n, fmt_id=STORE, ktrim=False, fold=False)
        write(f"e5m2_{n}", "fp8_e5m2", n, gluon=True, gluon_kron=True)
        write(f"fp8_static_{n}", "fp8_e4m3", n, static=True)
        for fmt in ("mxfp4", "nvfp4", "int4", "int8"):
            write(f"{fmt}_{n}_swapped", fmt, n, static=fmt == "nvfp4", scale_once=fmt != "nvfp4",
                  fold=not configs.QUANT_GLUON_FOLD.get((fmt, n), configs.QUANT_GLUON_FOLD.get(fmt, False)))
    for fmt in formats:
        write(f"{fmt}_28672_inside", fmt, 28672, static=fmt == "nvfp4", inside=True)
        write(f"{fmt}_14336_split1", fmt, 14336, static=fmt == "nvfp4", split=1)
        write(f"{fmt}_18944_units", fmt, 18944, static=fmt == "nvfp4", units=True)
        write(f"{fmt}_18944_noktrim", fmt, 18944, static=fmt == "nvfp4", ktrim=False)
    write("store_18944_units", "fp8_e4m3", 18944, fmt_id=STORE, ktrim=False, fold=False, units=True)


if __name__ == "__main__":
    main()
