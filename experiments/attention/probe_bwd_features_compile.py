"""Compile (sm_90a, no GPU) the Gluon backward and dq kernels with the window / softcap variants
(issue 35) at the shipped configurations: registers, spills, wgmma serialization, against the plain
kernels. CPU only.

  PYTHONPATH=. python experiments/attention/probe_bwd_features_compile.py
"""
from __future__ import annotations

import functools
import sys

import torch

from tilecore.ops.attention import configs, launch
from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources
from tilecore.tiles.launch import gluon_descriptor


def compile_bwd(d, causal, dq_from, window=False, softcap=0, group=1, kv_regs=False):
    from tilecore.ops.attention_backward.gluon_backward import attention_bwd_kernel

    bm, bn = 64, 64
    x = torch.empty(2, 2, 256, d, dtype=torch.bfloat16)
    desc = lambda rows: launch.head_operand(x, rows).descriptor()
    stats = torch.empty(4, 2, 256, dtype=torch.float32)
    dq_sum = torch.empty(2, 2, 256, d, dtype=torch.float32)
    args = dict(q_desc=desc(bm), k_desc=desc(2 * bn), v_desc=desc(2 * bn), do_desc=desc(bm), dk_desc=desc(bn),
                dv_desc=desc(bn), stats_desc=launch.row_stats_operand(stats, bm).descriptor(),
                dq_desc=gluon_descriptor(dq_sum, launch.dq_box(bm, d, dq_from)), H=16, N=4096, Nk=4096, GROUP=group,
                scale=0.1, scale_log2e=0.1, num_bhk=256, head_group=8,
                schedule=torch.empty(64, dtype=torch.int32) if causal else None, tile_counter=None, left=1000, right=0, tanh_scale=0.03, CAUSAL=causal,
                STAGES=2, DQ=configs.DQ_MODES[dq_from], KV_REGS=kv_regs,
                WINDOW=window, SOFTCAP=softcap)
    return compile_kernel(attention_bwd_kernel, args, num_warps=4)


def main() -> int:
    rows = []
    cases = [(d, causal, dq, kv, w, sc, g)
             for d, dq, kv in ((128, "fused", False), (128, "lagged", False), (64, "warpgroup", True),
                               (128, "gluon", False), (64, "gluon", False))
             for causal, w, sc, g in ((True, False, 0, 1), (False, True, 0, 1), (True, False, 2, 1),
                                      (True, False, 1, 1), (False, True, 2, 1), (False, True, 2, 4))]
    if "--quick" in sys.argv:
        cases = cases[:6]
    if "--only" in sys.argv:
        keep = sys.argv[sys.argv.index("--only") + 1].split(",")
        cases = [cases[int(i)] for i in keep]
    bad = 0
    for d, causal, dq, kv, w, sc, g in cases:
        name = f"bwd d{d} {dq}{' causal' if causal else ''}{' window' if w else ''}{f' softcap{sc}' if sc else ''} g{g}"
        try:
            c = compile_bwd(d, causal, dq, w, sc, g, kv)
            r = resources(c)
            h = has_hopper_instructions(c.asm["ptx"])
            spills = r.spill_stores + r.spill_loads
            print(f"{name:50s} regs {r.registers} spills {spills} stack {r.stack} shared {r.shared} "
                  f"wgmma {h['wgmma']} tma {h['tma']} serialized {r.wgmma_serialized}", flush=True)
            bad += bool(spills) or r.wgmma_serialized
        except Exception as e:  # noqa: BLE001
            print(f"{name:50s} FAILED {type(e).__name__}: {str(e)[:1500]}")
            bad += 1
    return 1 if bad else 0




def compile_dq(d, causal, window=False, softcap=0):
    from tilecore.ops.attention_backward.gluon_dq import attention_dq_kernel

    cfg = configs.GLUON_DQ[d]
    bm, bn = cfg["block_m"], cfg["block_n"]
    x = torch.empty(2, 2, 256, d, dtype=torch.bfloat16)
    desc = lambda rows: launch.head_operand(x, rows).descriptor()
    f32 = torch.empty(64, dtype=torch.float32)
    args = dict(q_desc=desc(2 * bm), k_desc=desc(bn), v_desc=desc(bn), do_desc=desc(2 * bm), dq_desc=desc(bm),
                qdo_desc=desc(2 * bm), lse_ptr=f32, delta_ptr=f32, H=16, N=4096, Nk=4096, GROUP=1, scale=0.1,
                scale_log2e=0.1, num_bh=256, head_group=12,
                schedule=torch.empty(64, dtype=torch.int32) if causal else None, left=1000, right=0, tanh_scale=0.03,
                CAUSAL=causal, STAGES=cfg["stages"], WINDOW=window, SOFTCAP=softcap)
    return compile_kernel(attention_dq_kernel, args, num_warps=4)


def main_dq() -> int:
    bad = 0
    for d in (64, 128):
        for causal, w, sc in ((True, False, 0), (False, True, 0), (True, False, 2), (False, True, 2)):
            name = f"dq d{d}{' causal' if causal else ''}{' window' if w else ''}{f' softcap{sc}' if sc else ''}"
            try:
                r = resources(compile_dq(d, causal, w, sc))
                spills = r.spill_stores + r.spill_loads
                print(f"{name:50s} regs {r.registers} spills {spills} shared {r.shared} serialized "
                      f"{r.wgmma_serialized}", flush=True)
                bad += bool(spills) or r.wgmma_serialized
            except Exception as e:  # noqa: BLE001
                print(f"{name:50s} FAILED {type(e).__name__}: {str(e)[:1500]}")
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main_dq() if "--dq" in sys.argv else main())
