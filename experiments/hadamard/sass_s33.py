"""SASS of hadamard_quantize's Gluon kernels at the plans the H100 runs (quantize.kernel_plan with the Gluon kernels
allowed, 132 SMs, 2^28 bf16 elements) and of the transform's STORE plans (gluon_launch.store_plan with kron.gluon_config),
shipped against a tuning laid over them, compiled for sm_90a on the CPU (issue 32, session 33, helper HE): instructions
in the whole kernel (both consumers' code), per value a consumer (/ 2 / the values a consumer's thread holds a tile),
registers and spilled bytes.

    python experiments/hadamard/sass_s33.py --variant '{"clamp_lo": 2}' [--only mxfp4] [--json out.json]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.getcwd())
os.environ.pop("TRITON_INTERPRET", None)
ELEMS = 1 << 28
ROWS = 64  # the rows the compiled kernels are given (1: a one-row call's constant)
SMS = 132
FORMATS = ("fp8_e4m3", "int8", "mxfp4", "nvfp4", "int4")
WIDTHS = (11008, 14336, 18944, 28672)
TRANSFORMS = ((172, 64), (148, 128), (28, 512), (28, 1024))


def _compile(plan, fmt, n, store=False, stages=None):
    import torch

    from experiments.hadamard.wide_gluon_compile import sass_count
    from tilecore.ops.hadamard import gluon_quantize_kron as gk
    from tilecore.ops.hadamard import gluon_quantize_wide as gw
    from tilecore.ops.hadamard import quantize
    from tilecore.tiles.compile import compile_kernel, resources
    from tilecore.tiles.launch import gluon_descriptor

    cfg = dict(plan.config)
    packed = cfg.pop("PACKED")
    warps = cfg.pop("num_warps")
    if store:  # the transform: STORE's format id, and the stages gluon_wide_transform launches (the wide kernel's 1)
        cfg["FORMAT"] = 7
        packed = False
        if plan.path == "gluon_wide":
            cfg["STAGES"] = stages or 1
    group = 0 if store else quantize.FORMATS[fmt].default_group
    rows = ROWS
    x = torch.empty(rows, n, dtype=torch.bfloat16)
    out = x if store else torch.empty(rows, n // 2 if packed else n, dtype=torch.uint8)
    scales = torch.empty(rows, n // (group or n), dtype=torch.uint8 if fmt in ("mxfp4", "nvfp4") else torch.float32)
    gs = torch.empty(1, dtype=torch.float32)
    m = cfg["M"]
    if plan.path == "gluon_kron":
        p = 64 * cfg["F"]
        xd, cd, sd = gk.descriptors(x, out, m, p, cfg["SPLIT"], packed)
        hd = gluon_descriptor(gk.gluon_operand(m, torch.bfloat16, "cpu"), [64, 64])
        kernel = gk.gluon_kron_quantize_kernel
    else:
        args = (x, out, m, packed, cfg.get("HALVES", 1)) + ((2,) if cfg.get("STORE2") else ())
        xd, cd, sd = gw.descriptors(*args)
        hd = gluon_descriptor(gw.gluon_operand(m, torch.bfloat16, "cpu"), [64, 64])
        kernel = gw.gluon_wide_quantize_kernel
    k = compile_kernel(kernel, dict(x_desc=xd, codes_desc=cd, staging_desc=sd, h_desc=hd, scales=scales, gscale=gs,
                                    amax_out=gs, rows=rows, stride_scales=scales.stride(0), rscale=n**-0.5,
                                    row_counter=torch.zeros(1, dtype=torch.int32), **cfg), num_warps=warps)
    r = resources(k)
    s = sass_count(k)
    if plan.path == "gluon_kron":  # a consumer's thread: its share of a tile (two rows at SPLIT 1, one at SPLIT 2)
        per_thread = n // 128 if cfg["SPLIT"] == 1 else n // 256
    else:
        per_thread = n // 128 if cfg.get("HALVES", 1) == 1 else n // 256
    return dict(sass=s["sass"], per_value=round(s["sass"] / 2 / per_thread, 2), registers=r.registers,
                spills=r.spill_stores, path=plan.path, wgmma=k.asm["ptx"].count("wgmma.mma_async"),
                config={k2: v for k2, v in cfg.items() if k2 not in ("M", "QMAX", "FORMAT", "G", "STATIC")})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", default='{"clamp_lo": 2}')
    ap.add_argument("--only", default="")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    import torch

    from tilecore.ops.hadamard import gluon_launch, kron, quantize

    variant = json.loads(a.variant)
    res = []
    cases = [("q", f, n) for n in WIDTHS for f in FORMATS] + [("t", m, p) for m, p in TRANSFORMS]
    for kind, f, n in cases:
        name = f"{kind} {f} {n}"
        if a.only and a.only not in name:
            continue
        row = {"case": name}
        for key, tun in (("shipped", {}), ("variant", variant)):
            try:
                if kind == "q":
                    group = quantize.FORMATS[f].default_group
                    plan = quantize.kernel_plan(ELEMS // n, n, torch.bfloat16, f, group, None, True, False, False, SMS,
                                                _gluon_ok=True, **tun)
                    if plan.path not in ("gluon_wide", "gluon_kron"):
                        row[key] = {"path": plan.path}
                        continue
                    row[key] = _compile(plan, f, n)
                else:
                    m, p = f, n
                    cfg = kron.gluon_config(m, p, tun)
                    stages = cfg.pop("stages", None)
                    plan = gluon_launch.store_plan(ELEMS // (m * p), m * p, torch.bfloat16, SMS, stages=stages, **cfg)
                    row[key] = _compile(plan, "fp8_e4m3", m * p, store=True, stages=stages)
            except Exception as err:  # noqa: BLE001
                row[key] = {"error": f"{type(err).__name__}: {str(err)[:200]}"}
        s, v = row.get("shipped", {}), row.get("variant", {})
        if "sass" in s and "sass" in v:
            row["ratio"] = round(v["sass"] / s["sass"], 4)
        print(json.dumps({"case": name, "shipped": [s.get(k) for k in ("sass", "per_value", "spills")],
                          "variant": [v.get(k) for k in ("sass", "per_value", "spills")], "ratio": row.get("ratio"),
                          **({"error": s.get("error") or v.get("error")} if "error" in s or "error" in v else {})}),
              flush=True)
        res.append(row)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"variant": variant, "rows": res}, fh, indent=1)


if __name__ == "__main__":
    main()
