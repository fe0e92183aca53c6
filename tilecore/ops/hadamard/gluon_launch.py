"""The launches of hadamard_quantize's Gluon kernels (gluon_quantize_wide.py, gluon_quantize_kron.py, and the power-of-two
rows on the transform's pipeline: gluon_kernels.hadamard_gluon_quantize_kernel) and the plain transform on their STORE
format (issue 32).

Here, beside the kernels and below both callers, so that neither reaches the other: quantize.py imports kron.py for
its m x 2^k plans and launches the kernels through ``launch``; kron.py's "gluon" transform plan runs
``gluon_wide_transform``. This module imports neither (nor quantize_reference): the STORE plan (``store_plan``) is
the one quantize.plan_quantize made for it (fp8 e4m3's format id and QMAX, which STORE does not read, kept so that
the kernel's specialization is the same; tests/hadamard/test_hadamard_quantize_gluon_kron.py compares the two).
"""
from __future__ import annotations

import dataclasses

import torch

from tilecore import dispatch
from tilecore.ops.hadamard import configs, orders
from tilecore.tiles.launch import cdiv

STORE_ID = 7  # gluon_quantize_wide.STORE: the rotated values themselves
_FP8_ID, _FP8_QMAX = 0, 448.0  # fp8 e4m3's kernel id and QMAX (quantize_reference.FORMATS): the plan's key format


@dataclasses.dataclass(frozen=True)
class GluonPlan:
    """A Gluon kernel's launch: path "gluon_wide", "gluon_kron" or "gluon_rows", its constexprs, grid and rotation scale (the
    fields quantize.QuantizePlan has; ``launch`` takes either)."""
    path: str
    config: dict = dataclasses.field(default_factory=dict)
    grid: tuple[int, ...] = ()
    rscale: float = 1.0


def launch(plan, x2, out, scales, gs, amax, fmt_id=None, stages=None, rscale=None, transpose=False):
    """gluon_quantize_wide.gluon_wide_quantize_kernel (or, for a "gluon_kron" plan, gluon_quantize_kron's kernel)
    over the rows x2 into ``out`` (codes as bytes, or values). ``rscale``: the rotation's scale (default the plan's);
    ``transpose``: H_m^T (the transform's backward)."""
    from tilecore.ops.hadamard import gluon_quantize_wide as gw
    from tilecore.tiles.launch import gluon_descriptor, tile_counter

    cfg = dict(plan.config)
    packed = cfg.pop("PACKED")
    if fmt_id is not None:
        cfg["FORMAT"] = fmt_id
        packed = False
    if stages is not None:
        cfg["STAGES"] = stages
    rows = x2.shape[0]
    rs = plan.rscale if rscale is None else rscale
    if plan.path == "gluon_rows":
        from tilecore.ops.hadamard.gluon_kernels import hadamard_gluon_quantize_kernel
        from tilecore.ops.hadamard.launch import h64_operand

        x_desc, codes_desc, staging_desc = rows_descriptors(x2, out, plan.config["PACKED"] and fmt_id != STORE_ID)
        h_desc = gluon_descriptor(h64_operand(x2.device, x2.dtype), [64, 64])
        with dispatch.on_device(x2.device):
            hadamard_gluon_quantize_kernel[plan.grid](x_desc, codes_desc, staging_desc, h_desc, scales, gs, rows,
                                                      scales.stride(0) if scales.dim() == 2 else 1, rs,
                                                      tile_counter(x2.device), **cfg)
        return
    if plan.path == "gluon_kron":
        from tilecore.ops.hadamard import gluon_quantize_kron as gk

        m, p = cfg["M"], 64 * cfg["F"]
        x_desc, codes_desc, staging_desc = gk.descriptors(x2, out, m, p, cfg["SPLIT"], packed)
        h_desc = gluon_descriptor(gk.gluon_operand(m, x2.dtype, x2.device, transpose, bool(cfg.get("PERM"))), [64, 64])
        with dispatch.on_device(x2.device):
            gk.gluon_kron_quantize_kernel[plan.grid](x_desc, codes_desc, staging_desc, h_desc, scales, gs, amax, rows,
                                                     scales.stride(0) if scales.dim() == 2 else 1, rs,
                                                     tile_counter(x2.device), **cfg)
        return
    x_desc, codes_desc, staging_desc = gw.descriptors(x2, out, cfg["M"], packed, cfg.get("HALVES", 1),
                                                      2 if cfg.get("STORE2") or cfg.get("STREAM") else 4,
                                                      bool(cfg.get("JOINT")))
    h_desc = gluon_descriptor(gw.gluon_operand(cfg["M"], x2.dtype, x2.device, transpose, bool(cfg.get("PERM"))),
                              [64, 64])
    with dispatch.on_device(x2.device):
        gw.gluon_wide_quantize_kernel[plan.grid](x_desc, codes_desc, staging_desc, h_desc, scales, gs, amax, rows,
                                                 scales.stride(0) if scales.dim() == 2 else 1, rs,
                                                 tile_counter(x2.device), **cfg)


def rows_descriptors(x2, out, packed: bool):
    """(x_desc, codes_desc, staging_desc) of gluon_kernels.hadamard_gluon_quantize_kernel for contiguous (rows, n) rows
    ``x2`` and their codes ``out`` (bytes): lines of 64 values and of W code bytes (64, or 32 packed), [64, 64] / [64, W]
    boxes, the staging buffer [64 S, W] (S = n / 8192)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from tilecore.ops.hadamard.gluon_quantize_kron import _layout
    from tilecore.tiles.launch import gluon_descriptor

    rows, n = x2.shape
    lines, w = rows * n // 64, 32 if packed else 64
    bits = out.element_size() * 8

    def codes(block):
        return TensorDescriptor(out, [lines, w], [w, 1], block, _layout(block, bits))

    return (gluon_descriptor(x2, [64, 64], shape=[lines, 64], strides=[64, 1]), codes([64, w]),
            codes([64 * (n // 8192), w]))


def store_plan(rows: int, n: int, dtype: torch.dtype, sms: int, **tuning) -> GluonPlan | None:
    """The Gluon plan of the plain transform of ``rows`` rows of n = m x p (a function of its arguments: the tests
    compare it with quantize.kernel_plan's), or None where neither kernel takes the shape: the wide kernel (m x 64,
    128 < m <= 192, and m x 128: HALVES 2) first, then the kron one (m <= 32 x p = 128..1024). Tuning: stages, waves,
    ktrim, units, store2 (the wide kernel's: STORE2 stages two blocks at a time, so that two ring stages fit), split,
    inside (the kron one's; defaults configs.gluon_kron_tuning's), nozero, clamp_lo, perm (the wide kernel at m x 64:
    H_64's columns permuted), stream (the wide kernel at m x 64: each block stored from compute through two
    staging slots, so that two ring stages fit; the kron one with four blocks a consumer: the butterfly's top level by
    the mixing's signs, two blocks live, each stored from compute)."""
    from tilecore.ops.hadamard import gluon_quantize_kron as gk
    from tilecore.ops.hadamard import gluon_quantize_wide as gw

    m, p = orders.split(n)
    if m == 1 or dtype not in (torch.float16, torch.bfloat16):
        return None
    rscale = n**-0.5
    if gw.fits(n, m, p):
        tuning = {**configs.QUANT_GLUON_WIDE_TUNING.get(("fp8_e4m3", n), configs.QUANT_GLUON_WIDE_TUNING.get(
            "fp8_e4m3", {})), **tuning}
        halves = p // 64
        grid = max(1, min(cdiv(rows, 3 - halves), sms * (tuning.get("waves") or 1)))
        return GluonPlan("gluon_wide", grid=(grid,), rscale=rscale, config=dict(
            M=m, FORMAT=_FP8_ID, **({"HALVES": 2} if halves == 2 else {}), G=0, STATIC=False, QMAX=_FP8_QMAX,
            STAGES=tuning.get("stages") or configs.QUANT_GLUON_WIDE_STAGES, PACKED=False, num_warps=4,
            **({"KTRIM": True} if tuning.get("ktrim") else {}),
            **({"UNITS": True} if halves == 2 and tuning.get("units") else {}), **_switches(tuning),
            **({"STORE2": True} if halves == 2 and tuning.get("units") and tuning.get("store2") else {}),
            **({"PERM": True} if halves == 1 and tuning.get("perm") else {}),
            **({"STREAM": True} if halves == 1 and tuning.get("stream") else {})))
    split, inside = configs.gluon_kron_tuning(m, p, tuning)
    if not gk.fits(m, p, split):
        return None
    grid = max(1, min(cdiv(rows, 3 - split), sms * (tuning.get("waves") or 1)))
    return GluonPlan("gluon_kron", grid=(grid,), rscale=rscale, config=dict(
        M=m, F=p // 64, SPLIT=split, INSIDE=inside, FORMAT=_FP8_ID, G=0, STATIC=False, QMAX=_FP8_QMAX,
        STAGES=tuning.get("stages") or configs.QUANT_GLUON_KRON_STAGES, PACKED=False, num_warps=4,
        **_switches(tuning), **({"PERM": True} if tuning.get("perm") else {}),
        **({"STREAM": True} if tuning.get("stream") and not inside and (p // 64) // (2 * split) == 4 else {})))


def _switches(tuning) -> dict:
    """The STORE plan's NOZERO / CLAMP_LO (tunings "nozero", "clamp_lo": True, or 2 for PAIRS; as quantize's, keyed by
    the caller)."""
    return {**({"NOZERO": True} if tuning.get("nozero") else {}),
            **({"CLAMP_LO": 2 if tuning["clamp_lo"] == 2 and tuning["clamp_lo"] is not True else True}
               if tuning.get("clamp_lo") else {})}


def gluon_wide_transform(x2: torch.Tensor, out: torch.Tensor, stages: int | None = None, scale: float | None = None,
                         transpose: bool = False, **tuning) -> GluonPlan:
    """out = scale (H_m (x) H_p) x2 (scale default 1 / sqrt(n)) on a Gluon kernel's STORE format: the wide one
    (m x 64, 128 < m <= 192, and m x 128; ``stages`` default 1) or the kron one (m <= 32 x p = 128..1024; ``tuning``:
    split, inside; ``stages`` default configs.QUANT_GLUON_KRON_STAGES; the (m, p) defaults of QUANT_GLUON_KRON_TUNING,
    not a format's). x2, out: (rows, n) contiguous, 16-bit, CUDA on Hopper; out may be x2 (a tile's rows are loaded
    whole before its stores). hadamard_transform's "gluon" kron plan (kron.py, configs.KRON_GLUON) and the probes call
    it (also as quantize.gluon_wide_transform)."""
    rows, n = x2.shape
    plan = None
    if not dispatch.interpreted(x2.device) and x2.device.type == "cuda" and dispatch.gluon_ok(x2.device) \
            and x2.stride(0) % 8 == 0 and x2.data_ptr() % 16 == 0:
        plan = store_plan(rows, n, x2.dtype, dispatch.num_sms(x2.device), **tuning)
    if plan is None:
        raise ValueError(f"gluon_wide_transform: n = {n} ({x2.dtype}, {x2.device}) has no Gluon plan")
    if plan.path == "gluon_kron":
        stages = stages or plan.config["STAGES"]
    launch(plan, x2, out, x2, x2, x2, fmt_id=STORE_ID, stages=stages or 1, rscale=scale, transpose=transpose)
    return plan
