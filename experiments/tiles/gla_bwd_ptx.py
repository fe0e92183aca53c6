"""The chunk-parallel GLA backward's launches (kernels_backward_gla_chunked.backward) compiled for sm_90a on the
CPU with configs_gla_bwd.CHUNKED as the tree has it: each launch's PTX written to a folder, to compare two trees
with ptx_compare.py (a refactor of a shipped kernel must emit the same code; issue 30's duplicates, session 34).

    python experiments/tiles/gla_bwd_ptx.py --root TREE --ptx DIR [--dims 128,128] [--only dqk,dv]

--root: the tree whose tilecore is imported (default: this checkout). --only: launch-name prefixes (default:
the dqk and dv kernels, the ones the form bits change). Prints each launch's registers and spills.
"""
import argparse
import json
import os
import re
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.getcwd())
    ap.add_argument("--ptx", required=True)
    ap.add_argument("--dims", default="128,128", help="Dk,Dv (configs' forms apply at CHUNKED_CHECKED_DIMS)")
    ap.add_argument("--only", default="dqk,dv")
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.root))
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    from tilecore.ops.linear_attention import kernels_backward_gla_chunked as kc
    from tilecore.ops.linear_attention.plan import IDENTITY, tl_plan
    from tilecore.tiles.compile import compile_kernel, resources

    dk, dv = (int(x) for x in a.dims.split(","))
    q = torch.empty(1, 256, 2, dk, dtype=torch.bfloat16)
    v = torch.empty(1, 256, 2, dv, dtype=torch.bfloat16)
    g = torch.empty(1, 256, 2, dk)
    s = torch.empty(1, 2, dk, dv)
    steps = []
    kc.backward(tl_plan(q, q, g, IDENTITY, 64, diag=5), v, q, q, v, g, s, s, s, 0.1, steps=steps)
    os.makedirs(a.ptx, exist_ok=True)
    rows = []
    for name, kernel, _, args, kw in steps:
        if not name.startswith(tuple(a.only.split(","))):
            continue
        kw = dict(kw)
        warps, stages = kw.pop("num_warps"), kw.pop("num_stages")
        extra = {"maxnreg": kw.pop("maxnreg")} if "maxnreg" in kw else {}
        c = compile_kernel(kernel, dict(zip(kernel.arg_names, args), **kw), num_warps=warps, num_stages=stages,
                           **extra)
        r = resources(c)
        ptx = c.asm["ptx"]
        with open(os.path.join(a.ptx, re.sub(r"[^A-Za-z0-9]+", "_", f"gla_bwd_{dk}_{dv}_{name}") + ".ptx"), "w") as f:
            f.write(ptx.replace(os.path.abspath(a.root) + os.sep, ""))
        rows.append(dict(launch=name, registers=r.registers, spill_stores=r.spill_stores,
                         spill_loads=r.spill_loads, serialized=r.wgmma_serialized))
        print(json.dumps(rows[-1]), flush=True)
    print(f"{len(rows)} launches compiled", flush=True)


if __name__ == "__main__":
    main()
