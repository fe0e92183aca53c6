"""SASS instruction counts of hadamard_quantize's kernels, compiled for sm_90a without a GPU (Triton's own
ptxas and cuobjdump): the persistent loop's instructions (the body of the largest backward branch: one tile),
split by kind, for the plans the GPU would run (quantize.kernel_plan at 2^28 elements, 132 SMs), each with the
exact epilogue and with FAST (configs.QUANT_FAST). Issue 32's compile report: a change's effect on the
instruction count before the GPU.

    python experiments/hadamard/sass_quantize.py [--quick | --check | --s27] [--json PATH]      (TRITON_INTERPRET unset)
    (--s27: the kron-tiled kernel at the model widths, shipped against interleaved slices (plan tuning
    interleave True / 2), FAST only, with the loop's barriers and the whole kernel's spills)
    (--check: the shipped FAST plans of fp8, mxfp4 and nvfp4 at 4096, with the PTX's conversions: what
    tests/hadamard/test_hadamard_quantize_compile.py asserts)
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.getcwd())
os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402

from tilecore.ops.hadamard import quantize  # noqa: E402
from tilecore.tiles.compile import compile_kernel, resources  # noqa: E402

SMS = 132
ELEMS = 1 << 28
KINDS = {  # opcode prefixes, by what they cost; the first match counts (SHFL before int's SHF: session 26's
    # counts had the shuffles under int)
    "mma": ("HGMMA", "HMMA"), "mufu": ("MUFU",), "fp32": ("FADD", "FMUL", "FFMA", "FMNMX", "FSETP", "FSEL", "FCHK"),
    "convert": ("F2F", "F2FP", "F2I", "I2F", "FRND"), "shuffle": ("SHFL",),
    "int": ("IADD", "IMAD", "LOP", "SHF", "ISETP", "SEL", "LEA", "PRMT", "IABS", "IMNMX"),
    "memory": ("LDG", "STG", "LDS", "STS", "UTMALDG", "UTMASTG", "LDSM", "STSM", "SYNCS", "UBLKCP"),
    "branch": ("BRA", "BSSY", "BSYNC", "WARPSYNC", "BAR"),
}


def _tool(name):
    from triton.backends.nvidia.compiler import get_ptxas

    return os.path.join(os.path.dirname(get_ptxas(90).path), name)


def sass_lines(cubin: bytes):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        out = subprocess.run([_tool("cuobjdump"), "-sass", path], check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            rows.append((int(m.group(1), 16), m.group(2).strip()))
    return rows


def loop_body(rows):
    """The instructions of the largest backward branch's body (the persistent loop over tiles)."""
    best = (0, 0)
    for i, (addr, ins) in enumerate(rows):
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?(?:0x)?([0-9a-f]+)", ins)
        if "BRA" in ins and m:
            target = int(m.group(1), 16)
            if target < addr:
                j = next(k for k, (a, _) in enumerate(rows) if a >= target)
                if i - j > best[1] - best[0]:
                    best = (j, i + 1)
    return [ins for _, ins in rows[best[0]:best[1]]]


def kinds(instructions):
    counts = {k: 0 for k in KINDS}
    counts["other"] = 0
    for ins in instructions:
        op = re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0]
        for k, prefixes in KINDS.items():
            if op.startswith(prefixes):
                counts[k] += 1
                break
        else:
            counts["other"] += 1
    return counts


def compile_case(fmt, n, fast, dtype=torch.bfloat16, block=None, group=None, static=False, **tuning):
    from triton.tools.tensor_descriptor import TensorDescriptor

    from tilecore.ops.hadamard.quantize_kernels import pow2_quantize_kernel, rotate_quantize_kernel

    f = quantize.FORMATS[fmt]
    group = f.default_group if group is None else group
    rows = ELEMS // n
    plan = quantize.kernel_plan(rows, n, dtype, fmt, group, block, True, static, False, SMS, fast=fast, **tuning)
    cfg = dict(plan.config)
    warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
    options = {"maxnreg": cfg.pop("maxnreg")} if "maxnreg" in cfg else {}
    x = torch.empty(64, n, dtype=dtype)
    codes = torch.empty(64, n // 2 if f.packed else n, dtype=torch.uint8)
    scales = torch.empty(64, n // (group or n), dtype=torch.uint8 if fmt in ("mxfp4", "nvfp4") else torch.float32)
    g = torch.empty(1, dtype=torch.float32)
    common = dict(signs=x, gscale=g, amax_out=g, rows=rows, stride_codes=codes.shape[1], stride_scales=scales.shape[1],
                  rscale=0.5, **cfg)
    if plan.path == "pow2":
        nn = cfg["N"]
        xv = torch.empty(64, nn, dtype=dtype)
        xa = xv
        if cfg["TMA_LOAD"]:
            xa = TensorDescriptor(xv, [64, nn // cfg["N2"], cfg["N2"]], [nn, cfg["N2"], 1], [cfg["B"], cfg["N1"], cfg["N2"]])
        ca = codes
        if cfg["TMA_STORE"]:
            w = cfg["N2"] // (2 if cfg["PACKED"] else 1)
            ca = TensorDescriptor(codes, [64, codes.shape[1] // w, w], [codes.shape[1], w, 1], [cfg["B"], cfg["N1"], w])
        k = compile_kernel(pow2_quantize_kernel, dict(x=xa, codes=ca, scales=scales, stride_x=nn, **common),
                           num_warps=warps, num_stages=stages, **options)
    elif plan.path == "fused":
        h = torch.empty(cfg["M_PAD"], cfg["M_PAD"], dtype=dtype)
        k = compile_kernel(rotate_quantize_kernel, dict(x=x, codes=codes, scales=scales, h=h, stride_x=n, **common),
                           num_warps=warps, num_stages=stages, **options)
    else:
        return plan, None
    return plan, k


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--s27", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cases = [("fp8_e4m3", 4096, {}), ("int8", 4096, {}), ("mxfp4", 4096, {}), ("nvfp4", 4096, {"static": True}),
             ("int4", 4096, {}), ("fp8_e4m3", 1024, {}), ("mxfp4", 2048, {}), ("fp8_e4m3", 4096, {"group": 128}),
             ("fp8_e4m3", 14336, {}), ("mxfp4", 14336, {})]
    if args.quick:
        cases = cases[:2]
    modes = (False, True)
    if args.check:
        cases = [("fp8_e4m3", 4096, {}), ("mxfp4", 4096, {}), ("nvfp4", 4096, {"static": True})]
        modes = (True,)
    if args.s27:
        cases = [(f, 14336, {**kw, **il}) for f, kw in (("mxfp4", {}), ("nvfp4", {"static": True}), ("int4", {}),
                                                        ("fp8_e4m3", {}))
                 for il in ({}, {"interleave": True}, {"interleave": 2})]
        cases += [("mxfp4", 28672, il) for il in ({}, {"interleave": 2})]
        cases += [("mxfp4", 14336, {"interleave": 2, "num_warps": 8, "maxnreg": 128})]
        modes = (True,)
    out = []
    for fmt, n, kw in cases:
        for fast in modes:
            t = time.time()
            row = {"format": fmt, "n": n, **kw, "fast": fast}
            try:
                plan, k = compile_case(fmt, n, fast, **kw)
                row["path"] = plan.path
                if k is not None:
                    body = loop_body(sass_lines(k.asm["cubin"]))
                    r = resources(k)
                    ptx = k.asm["ptx"]
                    row.update(ptx_e4m3_satfinite="cvt.rn.satfinite.e4m3x2.f32" in ptx, ptx_div_rn="div.rn.f32" in ptx,
                               ptx_wgmma="wgmma.mma_async" in ptx, ptx_tma="cp.async.bulk.tensor" in ptx)
                    row.update(loop=len(body), **kinds(body), registers=r.registers, spills=r.spill_stores,
                               barriers=sum(ins.startswith("BAR") for ins in body),
                               values_a_thread=(plan.config.get("B", 1) * plan.config.get("N", n)) // (32 * plan.config["num_warps"]))
            except Exception as err:  # noqa: BLE001
                row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            row["s"] = round(time.time() - t, 1)
            out.append(row)
            print(row, flush=True, file=sys.stderr if args.check else sys.stdout)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.check:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
