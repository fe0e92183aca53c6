"""Compile (sm_90a, no GPU) the varlen tl kernels with a softcap as a GPU launch gives them (SOFTCAP 2:
tanh.approx.f32) and the interpreter's form (SOFTCAP 1): registers, spills, tanh/ex2/div counts in
the PTX. CPU only.

  PYTHONPATH=. python experiments/attention/probe_varlen_softcap_compile.py
"""
from __future__ import annotations

import re
import sys

import torch

from tilecore import dispatch
from tilecore.ops.attention_varlen import op as varlen
from tilecore.portability import named_arguments, recording
from tilecore.tiles.compile import compile_kernel, resources


def main() -> int:
    target = dispatch.TARGETS["sm_90a"]
    cu = torch.tensor([0, 700, 829, 2829], dtype=torch.int32, device="meta")
    q = torch.empty(2829, 16, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(2829, 4, 128, dtype=torch.bfloat16, device="meta")
    bad = 0
    for mode in (2, 1):
        launches = []
        with dispatch.pretend(target), recording(launches):
            out, lse = varlen.forward_kernels(q, k, k, cu, cu, True, 0.1, 100, 0, 30.0, tanh_approx=mode == 2)
            varlen.backward_kernels(out, q, k, k, out, lse, None, cu, cu, True, 0.1, 100, 0, 30.0,
                                    tanh_approx=mode == 2)
        for kernel, args, kwargs in launches:
            named, options = named_arguments(kernel, args, kwargs)
            if "SOFTCAP" not in named:
                continue
            c = compile_kernel(kernel, named, target=target.gpu_target(), **{"num_warps": 4, **options})
            r = resources(c)
            ptx = c.asm["ptx"]
            counts = {n: len(re.findall(p, ptx)) for n, p in (("tanh", r"tanh\.approx"), ("ex2", r"ex2\.approx"),
                                                              ("div", r"div\.(rn|full|approx)"), ("rcp", r"rcp\."))}
            spills = r.spill_stores + r.spill_loads
            print(f"SOFTCAP {mode} {kernel.fn.__name__:18s} regs {r.registers} spills {spills} {counts}", flush=True)
            bad += mode == 2 and counts["tanh"] == 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
