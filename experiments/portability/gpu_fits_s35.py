"""GPU check of session 35's fitted configurations for smaller GPUs (issue 31's other GPUs), on the H100.

Each fit was chosen by compiling for its target on the CPU (notes/portability.md), never run. Here each runs on this
GPU through the public function under dispatch.limit_shared_memory (the plans see 99 or 64 KiB and pick their row; the
kernel is compiled for sm_90a: the configuration is what is checked): linear_attention's per-channel-decay forward in
one stage (99 KiB) and its split dQ in two (64 KiB), varlen's tl forward in two stages (64 KiB; the Gluon forward
switched off for the row with tiles.switches.patched), hadamard_quantize's smaller pow2 tiles (99 and 64 KiB).

Plans are kept per call signature, so a limited call and the H100's own are given different shapes holding the same
data: the limited call's batch (rows, sequences) is the first part of the unlimited call's. Checks: the limited
output equal bit for bit to the same part of the H100 configuration's (stage counts and rows a tile change no
arithmetic), and (LA, varlen) error over the float64 reference's rounding floor. Untimed: a limited call and the
H100's own on one shape would share one signature, so one plan (the H100's cost of a stage fewer is not the point).

    PYTHONPATH=. python3 experiments/portability/gpu_fits_s35.py [--dry]

``--dry``: CPU through Triton's interpreter at tiny sizes (limits reach CUDA devices only: a check of the script).
Writes $OUT/fits_s35.json; the table last.
"""
from __future__ import annotations

import json
import os
import sys
import time

DRY = "--dry" in sys.argv
if DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import tilecore  # noqa: E402
from tilecore import accuracy, dispatch  # noqa: E402
from tilecore.ops.attention_varlen import configs as varlen_configs  # noqa: E402
from tilecore.ops.attention_varlen import op as varlen_op  # noqa: E402
from tilecore.ops.hadamard import quantize as hq  # noqa: E402
from tilecore.ops.linear_attention import launch as la_launch  # noqa: E402
from tilecore.ops.linear_attention import plan as la_plan  # noqa: E402
from tilecore.ops.attention_varlen.reference import varlen_reference  # noqa: E402
from tilecore.ops.linear_attention.reference import linear_attention_reference  # noqa: E402
from tilecore.tiles.switches import patched  # noqa: E402

DEV = torch.device("cpu" if DRY else "cuda")
DT = torch.float16 if DRY else torch.bfloat16
KIB = 1024
START = time.time()
ROWS = []


def rnd(*shape, g, dtype=None, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(dtype or DT).to(DEV)


def same(a, b) -> bool:
    a, b = a.contiguous(), b.contiguous()
    if a.element_size() == 1:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return a.shape == b.shape and bool(torch.equal(a, b) or (torch.isnan(a) == torch.isnan(b)).all()
                                        and torch.equal(a.nan_to_num(), b.nan_to_num()))


def record(name, limit, ok_bits, err=None, picked=None):
    """``picked``: the row's configuration as the op's own plan function gives it under the limit (and without)."""
    row = dict(name=name, limit_kib=limit // KIB, same_bits=ok_bits, err_over_floor=err, picked=picked,
               t=round(time.time() - START, 1))
    ROWS.append(row)
    print(json.dumps(row), flush=True)


def la_forward_channel(limit=99 * KIB):
    """linear_attention with GLA's per-channel decay at D128: the tl forward (one stage under 99 KiB)."""
    g = torch.Generator().manual_seed(1)
    B, N, H, D = 2, (64 if DRY else 512), 4, (16 if DRY else 128)
    q, k, v = (rnd(B, N, H, D, g=g, scale=0.5) for _ in range(3))
    decay = (-torch.rand(B, N, H, D, generator=g) * 0.1).to(DEV)
    with dispatch.limit_shared_memory(limit):
        o_fit = tilecore.linear_attention(q[:1], k[:1], v[:1], decay=decay[:1])
    o_own = tilecore.linear_attention(q, k, v, decay=decay)
    ref, _ = linear_attention_reference(q[:1], k[:1], v[:1], decay=decay[:1])
    err = accuracy.error_over_floor(o_fit, ref)
    with dispatch.limit_shared_memory(limit):
        fit_stages = la_plan.tl_plan(q, v, decay, la_plan.IDENTITY).config["fwd_stages"]
    own_stages = la_plan.tl_plan(q, v, decay, la_plan.IDENTITY).config["fwd_stages"]
    record("LA fwd per-channel decay D128 (1 stage)", limit, same(o_fit, o_own[:1]), err,
           dict(fwd_stages=(fit_stages, own_stages)))


def la_backward_dq(limit=64 * KIB):
    """linear_attention without decay at D128, forward and backward: the split dQ kernel (two stages under 64 KiB)."""
    g = torch.Generator().manual_seed(2)
    B, N, H, D = 2, (64 if DRY else 512), 4, (16 if DRY else 128)
    q, k, v, do = (rnd(B, N, H, D, g=g, scale=0.5) for _ in range(4))

    def grads(batch, under):
        leaves = [t[:batch].clone().requires_grad_() for t in (q, k, v)]
        if under:
            with dispatch.limit_shared_memory(limit):
                o = tilecore.linear_attention(*leaves)
                o.backward(do[:batch])
        else:
            o = tilecore.linear_attention(*leaves)
            o.backward(do[:batch])
        return [o.detach()] + [t.grad for t in leaves]

    fit, own = grads(1, True), grads(2, False)
    leaves = [t[:1].double().requires_grad_() for t in (q, k, v)]
    o_ref, _ = linear_attention_reference(*leaves)
    o_ref.backward(do[:1].double())
    err = max(accuracy.error_over_floor(a, r) for a, r in zip(fit[1:], [t.grad for t in leaves]))

    def dq_stages():
        p = la_plan.tl_plan(q, v, None, la_plan.IDENTITY)
        return la_launch.backward_plan(p, q, v, None, la_plan.IDENTITY).config["dq_stages"]
    with dispatch.limit_shared_memory(limit):
        fit_stages = dq_stages()
    record("LA bwd dq D128 no decay (2 stages)", limit, all(same(a, b[:1]) for a, b in zip(fit, own)), err,
           dict(dq_stages=(fit_stages, dq_stages())))


def varlen_forward(limit=64 * KIB):
    """attention_varlen's tl forward at D128 causal (two stages under 64 KiB); the Gluon forward off for the row."""
    g = torch.Generator().manual_seed(3)
    lens = [37, 120, 64] if DRY else [300, 1000, 517]
    extra = 50 if DRY else 400
    H, D = 4, (16 if DRY else 128)
    total = sum(lens) + extra
    q, k, v = (rnd(total, H, D, g=g) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    cu_all = torch.cat([cu, cu.new_tensor([total])])
    n = int(cu[-1])
    with patched(varlen_configs, VARLEN_GLUON_FORWARD=False):
        with dispatch.limit_shared_memory(limit):
            o_fit = tilecore.attention_varlen(q[:n], k[:n], v[:n], cu, cu, max(lens), max(lens), causal=True)
        o_own = tilecore.attention_varlen(q, k, v, cu_all, cu_all, max(max(lens), extra), max(max(lens), extra),
                                          causal=True)
    ref, _ = varlen_reference(q[:n], k[:n], v[:n], cu, cu, causal=True)
    with dispatch.limit_shared_memory(limit):
        fit_stages = varlen_op.block_config(D, DRY, "forward", DEV).get("num_stages")
    record("varlen tl fwd D128 causal (2 stages)", limit, same(o_fit, o_own[:n]),
           accuracy.error_over_floor(o_fit, ref),
           dict(num_stages=(fit_stages, varlen_op.block_config(D, DRY, "forward", DEV).get("num_stages"))))


def hadamard_quantize_tiles():
    """hadamard_quantize's pow2 tile at the rows' n (QUANT_SHARED_FITS): codes and scales as the H100's tile's."""
    cases = [(99 * KIB, 128, "int8"), (99 * KIB, 256, "int4"), (99 * KIB, 256, "mxfp4"), (99 * KIB, 256, "fp8_e4m3"),
             (64 * KIB, 16, "fp8_e5m2"), (64 * KIB, 64, "mxfp4"), (64 * KIB, 256, "fp8_e5m2")]
    for i, (limit, n, fmt) in enumerate(cases):
        g = torch.Generator().manual_seed(10 + i)
        rows = 300 + i  # (a signature of its own each case: plans are kept per signature)
        x = rnd(rows + 64, n, g=g, scale=3.0)
        with dispatch.limit_shared_memory(limit):
            c_fit, s_fit = tilecore.hadamard_quantize(x[:rows], format=fmt)
        c_own, s_own = tilecore.hadamard_quantize(x, format=fmt)
        group = hq.FORMATS[fmt].default_group

        def tile():
            p = hq.plan_quantize(x[:rows], fmt, group, None, True, False, False)
            return p.path, p.config.get("B", 0) * p.config.get("N", 0)
        with dispatch.limit_shared_memory(limit):
            fit_tile = tile()
        record(f"hadamard_quantize n={n} {fmt} (smaller tile)", limit,
               same(c_fit, c_own[:rows]) and same(s_fit, s_own[:rows]), picked=dict(tile=(fit_tile, tile())))


def main():
    out_dir = os.environ.get("OUT", ".")
    os.makedirs(out_dir, exist_ok=True)
    print(f"device {torch.cuda.get_device_name() if not DRY else 'cpu (dry)'}; torch {torch.__version__}", flush=True)
    for check in (la_forward_channel, la_backward_dq, varlen_forward, hadamard_quantize_tiles):
        try:
            check()
        except Exception as err:  # noqa: BLE001 (a check's failure is its row; the rest go on)
            ROWS.append(dict(name=check.__name__, error=f"{type(err).__name__}: {err}"[:300]))
            print(json.dumps(ROWS[-1]), flush=True)
        with open(os.path.join(out_dir, "fits_s35.json"), "w") as f:
            json.dump(dict(rows=ROWS, seconds=round(time.time() - START, 1)), f, indent=1)
    print(f"\n{'row':48s} {'KiB':>4s} {'bits':>5s} {'err/floor':>9s}  picked (under the limit, without)")
    for r in ROWS:
        if "error" in r:
            print(f"{r['name']:48s} ERROR {r['error'][:90]}")
            continue
        err = "-" if r["err_over_floor"] is None else f"{r['err_over_floor']:.2f}"
        print(f"{r['name']:48s} {r['limit_kib']:4d} {str(r['same_bits']):>5s} {err:>9s}  {r['picked']}")
    print(f"{time.time() - START:.1f} s")


if __name__ == "__main__":
    main()
