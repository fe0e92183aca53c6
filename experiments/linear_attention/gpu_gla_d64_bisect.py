"""Which of session 33's GLA changes breaks the public op at B2 N517 H3 d64 (call 7's ha_gla_op33: an illegal memory
access there, where call 1's ha_gla_op32 passed the same case). Each variant runs in a process of its own (an illegal
access ends the CUDA context): the public forward with the kept forward recipes on / off, and the chunk-parallel
backward kernels with configs_gla_bwd.CHUNKED as shipped and with one session-33 key at a time set back, each checked
against the float64 recurrence (gradients as multiples of the bf16 rounding floor).

    PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_d64_bisect.py [--d 32] [--only "bwd shipped,op fwd+bwd"]
    TRITON_INTERPRET=1 PYTHONPATH=. python3 experiments/linear_attention/gpu_gla_d64_bisect.py --smoke
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
DTYPE = torch.float16 if SMOKE else torch.bfloat16
D = int(sys.argv[sys.argv.index("--d") + 1]) if "--d" in sys.argv else 64  # the head dim (Dk = Dv)
SHAPE = (2, 77, 2, D) if SMOKE else (2, 517, 3, D)  # B, N, H, D
# the backward's variants: configs_gla_bwd.CHUNKED keys set back to session 32's values, one at a time, then together
BACKWARD = {"bwd shipped": {}, "bwd dqk_VB 32": dict(dqk_VB=32), "bwd dqk_form 0": dict(dqk_form=0),
            "bwd dv_form 0": dict(dv_form=0), "bwd session 32": dict(dqk_VB=32, dqk_form=0, dv_form=0),
            "bwd dqk_VB 16": dict(dqk_VB=16)}  # --d 32: the value loop in two blocks
VARIANTS = (["fwd recipes on", "fwd recipes off", *BACKWARD, "op fwd+bwd"] if "--only" not in sys.argv else
            sys.argv[sys.argv.index("--only") + 1].split(","))


def tensors():
    B, N, H, D = SHAPE
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, N, H, D, dtype=DTYPE, device=DEV) for _ in range(3))
    g = -torch.rand(B, N, H, D, device=DEV) * 0.3
    h0 = torch.randn(B, H, D, D, device=DEV)
    do = torch.randn(B, N, H, D, dtype=DTYPE, device=DEV)
    dht = torch.randn(B, H, D, D, device=DEV)
    return q, k, v, g, h0, do, dht


def reference(q, k, v, g, h0, do, dht):
    from tilecore.ops.linear_attention import linear_attention_reference

    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, g, h0)]
    o, ht = linear_attention_reference(*leaves[:3], decay=leaves[3], scale=q.shape[-1] ** -0.5,
                                       initial_state=leaves[4])
    grads = torch.autograd.grad((o * do.double()).sum() + (ht * dht.double()).sum(), leaves)
    return o.detach(), ht.detach(), grads


def over_floor(got, ref) -> float:
    from tilecore import accuracy

    return round(accuracy.rel_rms(got, ref) / accuracy.rounding_floor(ref, DTYPE), 3)


def one(name: str) -> dict:
    from tilecore import linear_attention
    from tilecore.tiles import launch as tiles_launch

    q, k, v, g, h0, do, dht = tensors()
    o_ref, ht_ref, grads = reference(q, k, v, g, h0, do, dht)
    row = dict(variant=name)
    if name.startswith("fwd"):
        tiles_launch.keep_forward_recipes(name.endswith("on"))
        for call in range(3):  # the key's first call goes the checked way; later ones take its kept recipe
            o = linear_attention(q, k, v, decay=g, initial_state=h0)
            if DEV == "cuda":
                torch.cuda.synchronize()
            row[f"o_call{call}"] = over_floor(o, o_ref)
        return row
    if name == "op fwd+bwd":
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, g, h0)]
        o, ht = linear_attention(*leaves[:3], decay=leaves[3], initial_state=leaves[4], return_final_state=True)
        got = torch.autograd.grad((o.float() * do.float()).sum() + (ht * dht).sum(), leaves)
    else:
        from tilecore.ops.linear_attention import kernels_backward_gla_chunked, launch
        from tilecore.ops.linear_attention.plan import IDENTITY, plan

        p = launch.backward_plan(plan(q, v, g, IDENTITY), q, v, g, IDENTITY, None)
        dq, dk, dv, dg, _, dh0 = kernels_backward_gla_chunked.backward(
            p, do, q, k, v, g, h0, ht_ref.float(), dht, q.shape[-1] ** -0.5, **BACKWARD[name])
        got = (dq, dk, dv, dg, dh0)
    if DEV == "cuda":
        torch.cuda.synchronize()
    for nm, a, r in zip(("dq", "dk", "dv"), got[:3], grads[:3]):
        row[nm] = over_floor(a, r)
    row["finite"] = bool(all(torch.isfinite(a).all() for a in got))
    return row


def main():
    if "--one" in sys.argv:
        print("ROW " + json.dumps(one(sys.argv[sys.argv.index("--one") + 1])), flush=True)
        return
    t0, rows = time.time(), []
    for name in VARIANTS:
        res = subprocess.run([sys.executable, __file__, "--one", name, "--d", str(D)] + (["--smoke"] if SMOKE else []),
                             capture_output=True, text=True, timeout=300)
        got = [ln[4:] for ln in res.stdout.splitlines() if ln.startswith("ROW ")]
        row = json.loads(got[0]) if got else dict(variant=name, error=(res.stderr.strip().splitlines() or ["?"])[-1][:200])
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = os.environ.get("OUT", "/tmp")
    with open(os.path.join(out, f"gla_d{D}_bisect.json"), "w") as fh:
        json.dump(dict(shape=SHAPE, dtype=str(DTYPE), rows=rows, device=torch.cuda.get_device_name() if DEV == "cuda"
                       else "cpu"), fh, indent=1)
    print(f"\nGLA B{SHAPE[0]} N{SHAPE[1]} H{SHAPE[2]} d{SHAPE[3]} {DTYPE}: variant | result ({time.time() - t0:.0f} s)")
    for r in rows:
        print(f"{r['variant']:18s} | " + ("ERROR " + r["error"] if "error" in r else
                                          " ".join(f"{k} {v}" for k, v in r.items() if k != "variant")))


if __name__ == "__main__":
    main()
