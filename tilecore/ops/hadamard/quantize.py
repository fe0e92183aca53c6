"""``tilecore.hadamard_quantize``: rotate the last dimension by a Hadamard transform and quantize it in the
same pass (one read of x, one write of codes and scales), and ``dequantize``. Formats and byte layouts:
quantize_reference.py; the kernel: quantize_kernels.py.

Paths (``plan_quantize``):
* "cpu": CPU tensors without the interpreter: hadamard_transform's CPU path in float32, then the formats
  in float32 with torch's operations (quantize_reference.quantize_rotated); also the e4m3 formats (fp8_e4m3
  codes, nvfp4's block scales) on GPUs where Triton has no e4m3 (not dispatch.fp8_ok: sm_80, sm_86, ROCm), there
  with hadamard_transform's kernels (Triton refuses fp8e4nv below sm_89: issue 31); and int8 / int4 on
  ROCm, whose Triton drops the CUDA libdevice rounding their kernels call (__nv_float2int_rn);
* "fused": quantize_kernels.rotate_quantize_kernel, where a row's (or a tile's) rotated values fit one
  program's registers (configs.KRON_MAX_TILE_ELEMS float32 values);
* "wide": quantize_wide.wide_quantize_kernel, m x 2^k rows with m > 64 (11008, 18944), where configs.QUANT_WIDE
  or the plan tuning "wide" asks for it: the mixing in blocks of sub-rows that stop at m, not M_PAD;
* "wide_rows": quantize_wide_rows.wide_rows_quantize_kernel, the wide path with its mixing 128 columns wide (two
  rows at 11008, a row's two slices at 18944), where the wide path applies and configs.QUANT_WIDE_ROWS or the plan
  tuning "wide_rows" asks for it;
* "gluon_wide": gluon_quantize_wide.gluon_wide_quantize_kernel on Hopper, rows of m x 64 with 128 < m <= 192
  (11008), where configs.QUANT_GLUON_WIDE or the plan tuning "gluon" asks for it: H_m resident in shared memory,
  the rows by TMA, the products on wgmma;
* "gluon_kron": gluon_quantize_kron.gluon_kron_quantize_kernel on Hopper, rows of m x p with m <= 32 and p = 128..1024
  (14336 = 28 x 512, 28672 = 28 x 1024), where configs.QUANT_GLUON_KRON or the plan tuning "gluon_kron" asks for it:
  A = H_32 (x) H_2 resident, the rows by TMA, the products on wgmma;
* "gluon_rows": gluon_kernels.hadamard_gluon_quantize_kernel on Hopper, n = 16384 / 32768 (hadamard_transform's Gluon
  pipeline, a row a tile held by two consumer warpgroups, with the codes for its values; per token and int4), where
  configs.QUANT_GLUON_ROWS or the plan tuning "gluon_rows" asks for it;
* "unfused": longer rows (n = m 2^k with 2^k > 1024, or rows past that budget): hadamard_transform into a
  float32 buffer, then the kernel without rotation.
nvfp4 without a given global scale reads x twice: a first pass of the same kernel finds the rotated
tensor's largest |y| (each program writes its own, no atomics), then the quantizing pass.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import triton.language as tl

from tilecore import dispatch
from tilecore.ops.hadamard import configs, kron, orders
from tilecore.ops.hadamard import plan as pow2_plan_module
from tilecore.ops.hadamard.configs import gluon_kron_tuning  # noqa: F401  (quantize.gluon_kron_tuning: tests)
# the Gluon kernels' launch and the STORE transform (gluon_launch.py, beside the kernels: kron.py reaches it without
# this module); quantize.gluon_wide_transform: the probes' name
from tilecore.ops.hadamard.gluon_launch import gluon_wide_transform  # noqa: F401
from tilecore.ops.hadamard.gluon_launch import launch as _launch_gluon_wide
from tilecore.ops.hadamard.quantize_reference import (FORMATS, FP8_DTYPES, dequantize, nvfp4_global_scale,
                                                      quantize_rotated, rotated_rows, shape_outputs)
from tilecore.tiles import launch as tiles_launch
from tilecore.tiles import switches
from tilecore.tiles.launch import LRU, CachedLaunch, KeyedLaunch, SignatureMemo, cdiv, next_power_of_2
from tilecore.tiles.launch import signature  # noqa: F401 (_CALL_KEY builds its misses by this module's name)

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCKS = (16, 32, 64, 128)

__all__ = ["hadamard_quantize", "dequantize", "FORMATS", "plan_quantize", "kernel_plan", "run_plan"]


@dataclasses.dataclass(frozen=True)
class QuantizePlan:
    path: str  # "cpu" | "pow2" | "fused" | "wide" | "wide_rows" | "gluon_wide" | "gluon_kron" | "gluon_rows" | "unfused"
    config: dict = dataclasses.field(default_factory=dict)
    grid: tuple[int, ...] = ()
    rscale: float = 1.0


def _by_format(table: dict, fmt: str, n: int, default=False):
    """A configs table keyed by (format, n), else by the format."""
    return table.get((fmt, n), table.get(fmt, default))


def _qslices(p: int, group: int | None):
    """(Q, S) for sub-rows of p: kron.slices, with Q >= min(group, p) so that a group sits in one slice."""
    qs = kron.slices(p)
    if qs is None:
        return None
    q = qs[0]
    if group is not None and q < min(group, p):
        q = min(group, p)
    return max(q, 16), max(1, p // max(q, 16))


# formats whose kernels store e4m3 (codes, or nvfp4's block scales): Triton's fp8e4nv, which it compiles for NVIDIA
# sm_89 and later only ("fp8e4nv not supported in this architecture" on sm_80 / sm_86)
E4M3_FORMATS = ("fp8_e4m3", "nvfp4")
# formats whose kernels round by CUDA's libdevice (float2int_rn: one cvt.rni), which Triton's AMD backend drops
# ("Implicit conversion of CUDA __nv_float2int_rn device function has been dropped": a compile error on gfx90a)
LIBDEVICE_FORMATS = ("int8", "int4")


def plan_quantize(x: torch.Tensor, fmt: str, group: int | None, block: int | None, rotate: bool,
                  static: bool, signs: bool, **tuning) -> QuantizePlan:
    """The plan for 2-D ``x`` (rows, n) (arguments checked). ``tuning``: tile_elems, num_warps, waves."""
    rows, n = x.shape
    if dispatch.backend_for(x.device) == "reference":
        return QuantizePlan("cpu")
    interpret = dispatch.interpreted(x.device)
    if fmt in E4M3_FORMATS and not interpret and not dispatch.fp8_ok(x.device):
        return QuantizePlan("cpu")  # (torch's ops on the device: no e4m3 in Triton there)
    if fmt in LIBDEVICE_FORMATS and not interpret and dispatch.is_rocm(x.device):
        return QuantizePlan("cpu")  # (the same: no CUDA libdevice on ROCm)
    if dispatch.is_rocm(x.device):  # PAIRS' conversion is inline PTX (kernels._pairs_dot): LLVM aborts on it for AMD
        tuning = {**tuning, "pairs": False}
    sms = configs.INTERPRETER_SMS if interpret else dispatch.num_sms(x.device)
    if not pow2_plan_module.tma_fits(x) or not dispatch.tma_ok(x.device):
        tuning = {**tuning, "tma": "none", "kron_tma": False, "il_tma": False}
    if not interpret and x.device.type == "cuda" and dispatch.gluon_ok(x.device) and x.stride(0) % 8 == 0 \
            and x.data_ptr() % 16 == 0:
        tuning = {**tuning, "_gluon_ok": True}  # the Gluon kernels may run here (the plan decides whether)
    plan = kernel_plan(rows, n, x.dtype, fmt, group, block, rotate, static, signs, sms, interpret, **tuning)
    if plan.path == "pow2" and not interpret:
        return _fitted_pow2(plan, x.device, rows, n, x.dtype, fmt, group, block, rotate, static, signs, sms, tuning)
    return plan


def _fitted_pow2(plan: QuantizePlan, device, rows, n, dtype, fmt, group, block, rotate, static, signs, sms, tuning):
    """A pow2 plan as ``device`` fits it (issue 31): configs.QUANT_SHARED_FITS' smaller tiles where its blocks get less
    shared memory; on a GPU with tensor memory (configs.QUANT_TMEM_TILES) per-row scales at one row a tile by the
    kron-tiled kernel instead, and the table's smaller tiles. ``plan`` itself where nothing changes."""
    cfg = plan.config
    cap = (dispatch.shared_memory_fit(device, configs.QUANT_SHARED_FITS, "hadamard_quantize") or {}).get(cfg["N"])
    if dispatch.tensor_memory(device):
        if cfg["B"] == 1 and cfg["G"] == cfg["N"] and not cfg["STATIC"]:
            return kernel_plan(rows, n, dtype, fmt, group, block, rotate, static, signs, sms, False,
                               **{**tuning, "legacy": True})
        if cap is None and not cfg["TMA_LOAD"]:
            cap = configs.QUANT_TMEM_TILES.get((cfg["N"], fmt))
    if cap is None or "tile_elems" in tuning or cfg["B"] * cfg["N"] <= cap:
        return plan
    return kernel_plan(rows, n, dtype, fmt, group, block, rotate, static, signs, sms, False,
                       **{**tuning, "tile_elems": cap})


@switches.memo(256)  # a function of its arguments and configs' tables (set by switches.patched)
def kernel_plan(rows: int, n: int, dtype: torch.dtype, fmt: str, group: int | None, block: int | None,
                rotate: bool, static: bool, signs: bool, sms: int, interpret: bool = False, **tuning) -> QuantizePlan:
    """plan_quantize's kernel paths on a GPU of ``sms`` SMs (a function of its arguments alone:
    experiments/hadamard/compile_kernels.py compiles its configurations without a GPU)."""
    f = FORMATS[fmt]
    gluon = _gluon_rows_plan(rows, n, dtype, fmt, group, block, rotate, static, signs, sms, tuning)
    if gluon is None:
        gluon = _gluon_pow2_plan(rows, n, dtype, fmt, group, block, rotate, static, signs, sms, tuning)
    if gluon is not None:
        return gluon
    pow2 = pow2_plan(rows, n, dtype, fmt, group, block, rotate, static, signs, sms, interpret, **tuning)
    if pow2 is not None:
        return pow2
    if rotate and block is None:
        if dtype != torch.float32:
            tuning = {**configs.QUANT_KRON_TUNING.get(n, {}), **tuning}  # the measured widths; the caller's first
        m, p = orders.split(n)
        if m == 1 and n <= 1024:
            M, mix, P = 1, 0, n
        elif m == 1:
            M = max(16, n // 1024)
            mix, P = 2, n // M
        else:
            M, mix, P = m, 1, p
        qs = _qslices(P, group)
        butterfly, transform = True, P > 1
        rscale = n**-0.5
    else:
        # sub-rows of the rotation block (or, unrotated, of a power of two dividing n), no mixing
        P = block if rotate else min(128, n & -n)
        M, mix, qs, butterfly, transform = n // P, 0, (max(P, 16), 1), False, rotate
        rscale = P**-0.5 if rotate else 1.0
    m_pad = next_power_of_2(M)
    if qs is None or m_pad * qs[0] * qs[1] > configs.KRON_MAX_TILE_ELEMS:
        return QuantizePlan("unfused", rscale=rscale)
    Q, S = qs
    if group is None:
        mode, spg = 0, m_pad
    elif group <= Q and P >= group:
        mode, spg = 1, 1
    else:  # groups of several sub-rows (P < group, one slice)
        assert S == 1 and group % P == 0, (n, P, Q, group)
        mode, spg = 0, group // P
    gluon = _gluon_wide_plan(rows, n, dtype, fmt, group, M, P, mix, signs, static, rscale, sms, tuning)
    if gluon is None:
        gluon = _gluon_kron_plan(rows, n, dtype, fmt, group, M, P, mix, signs, static, rscale, sms, tuning)
    if gluon is not None:
        return gluon
    wide = _wide_plan(rows, n, dtype, fmt, group, M, m_pad, P, Q, S, mix, mode, spg, signs, static, rscale, sms,
                      interpret, tuning)
    if wide is not None:
        return wide
    tile_elems = min(tuning.get("tile_elems") or configs.QUANT_TILE_ELEMS, configs.KRON_MAX_TILE_ELEMS)
    B = 1 if (mix and m_pad >= 64) else max(1, tile_elems // (m_pad * Q * S))
    if (mix or transform) and B * m_pad < 16:
        B = 16 // m_pad  # a tensor-core tile needs 16 rows
    B = next_power_of_2(B) if B & (B - 1) else B
    grid = max(1, min(cdiv(rows, B), sms * (tuning.get("waves") or configs.KRON_WAVES)))
    elems = B * m_pad * Q * S  # float32 values a program holds: 16 warps at 32768 (8 spilled there)
    warps = tuning.get("num_warps") or (16 if elems >= 32768 else 8 if elems >= 8192 else 4)
    # interleaved slices (quantize_kernels._epilogue_interleaved): one row a tile, S >= 2 slices filling the
    # sub-row, groups a multiple of S or the whole row, pointer loads; interleave=2: loaded as one vector a
    # column (quantize_kernels._load_il) where the mixing is one product (not K-chunked past 64 sub-rows)
    shipped = _by_format(configs.QUANT_INTERLEAVE, fmt, n, 0)
    interleave = tuning.get("interleave", shipped if dtype != torch.float32 else 0)
    il = S if (interleave and B == 1 and S >= 2 and Q * S == P
               and (mode == 1 and group % S == 0 or mode == 0 and spg == m_pad)
               and not tuning.get("kron_tma", configs.KRON_TMA != "none")) else 0
    # ... and (il_tma) that vector load by TMA: boxes [1, M_PAD, Q, S] of the rows seen as (rows, M, Q, S)
    ilv = bool(il) and interleave == 2 and not (mix == 1 and m_pad > 64)
    return QuantizePlan("fused", grid=(grid,), rscale=rscale, config=dict(
        M=M, M_PAD=m_pad, P=P, Q=Q, S=S, B=B, MIX=mix, TRANSFORM=transform, BUTTERFLY=butterfly, SIGNS=signs,
        FORMAT=f.kernel_id, GROUP=mode, G=group or 1, SPG=spg, STATIC=static and fmt in FP8_DTYPES,
        PACKED=f.packed, QMAX=f.qmax, GRID=grid, num_warps=warps, **kron._dtypes(dtype, interpret),
        FAST=bool(tuning.get("fast", configs.QUANT_FAST)),
        # the input through TMA boxes [B, M_PAD, Q] (kernels_kron.load_slice_transform) where asked and the
        # slices fit the sub-rows (not the chunked mixing past 64 sub-rows, not float32)
        TMA_LOAD=(bool(tuning.get("kron_tma", configs.KRON_TMA != "none")) and Q <= P and dtype != torch.float32
                  and not (mix == 1 and m_pad > 64)) or (ilv and bool(tuning.get("il_tma", _by_format(configs.QUANT_INTERLEAVE_TMA, fmt, n)))
                                                          and dtype != torch.float32 and S == 8),  # 16-byte lines
        num_stages=tuning.get("num_stages") or (1 if m_pad > 64 and mix else 2),  # as kron.kernel_plan
        # interleaved slices (quantize_kernels._epilogue_interleaved): one row a tile, S >= 2 slices filling
        # the sub-row, groups a multiple of S or the whole row; pointer loads
        IL=il, ILV=ilv,
        # the K-chunked mixing (m > 64) stopping at the last chunk holding sub-rows < m (kernels_kron._chunked_mix)
        K_STOP=bool(tuning.get("k_stop", _by_format(configs.QUANT_K_STOP, fmt, n))) and mix == 1 and m_pad > 64,
        **_maxnreg(tuning, {})))


def _gluon_wide_plan(rows, n, dtype, fmt, group, M, P, mix, signs, static, rscale, sms, tuning):
    """The "gluon_wide" path (gluon_quantize_wide.py: Hopper, H_m resident in shared memory, rows by TMA, wgmma)
    where it applies and is asked for (plan tuning "gluon", or configs.QUANT_GLUON_WIDE by (format, n); off until
    a GPU run checks it), else None: rows of m x 64 with 128 < m <= 192, 16-bit, no random signs, groups of 16 or
    32 inside a sub-row, 128 (int4: a sub-row pair) or the whole row; plan_quantize's device may run Gluon.
    Tuning: stages (the ring's), waves (programs an SM), scale_once (SCALE_ONCE), ktrim (KTRIM: the last K chunk of the mixing cut at the 16-multiple past m)."""
    from tilecore.ops.hadamard.gluon_quantize_wide import fits

    tf = _gluon_tables_of(fmt, n, tuning)
    on = tuning.get("gluon", _by_format(configs.QUANT_GLUON_WIDE, tf, n, False))
    if not on or not tuning.get("_gluon_ok") or mix != 1 or dtype == torch.float32 or signs or not fits(n, M, P) \
            or group not in (None, 16, 32, 128) or (group == 128 and fmt != "int4"):
        return None
    f = FORMATS[fmt]
    tuning = {**_by_format(configs.QUANT_GLUON_WIDE_TUNING, tf, n, {}), **tuning}  # the measured; the caller's first
    halves = P // 64  # 2: m x 128, a row a tile, consumer c its column half
    units = halves == 2 and bool(tuning.get("units", _by_format(configs.QUANT_GLUON_UNITS, tf, n, False)))
    grid = max(1, min(cdiv(rows, 3 - halves), sms * (tuning.get("waves") or 1)))
    return QuantizePlan("gluon_wide", grid=(grid,), rscale=rscale, config=dict(
        M=M, FORMAT=f.kernel_id, **({"HALVES": 2} if halves == 2 else {}), G=group or 0, STATIC=static and fmt in FP8_DTYPES, QMAX=f.qmax,
        STAGES=tuning.get("stages") or configs.QUANT_GLUON_WIDE_STAGES, PACKED=f.packed, num_warps=4,
        **({"PROBE": tuning["probe"]} if tuning.get("probe") else {}), **_scale_once(tf, n, group, tuning),
        **({"KTRIM": True} if tuning.get("ktrim", _by_format(configs.QUANT_GLUON_KTRIM, tf, n, False)) else {}),
        **_fold(tf, n, tuning), **_e2m1_pairs(fmt, n, tuning), **_gluon_int_bits(fmt, n, tuning),
        # UNITS (HALVES 2): each output block's mixing once, consumer 0 blocks J 0-1, consumer 1 J 2
        **({"UNITS": True} if units else {}), **_epilogue_switches(tf, n, tuning),
        # JOINT (UNITS): both column halves' mixing as one N = 128 product; at m x 64 the tile's two rows' (the group
        # formats) (tuning "joint", configs.QUANT_GLUON_JOINT)
        **({"JOINT": True} if (units or (halves == 1 and group is not None))
           and tuning.get("joint", _by_format(configs.QUANT_GLUON_JOINT, tf, n, False)) else {}),
        # BALANCE (UNITS, groups of 16 / 32): consumer c the unit J = c and block 2's column half c (tuning
        # "balance", configs.QUANT_GLUON_BALANCE)
        **({"BALANCE": True} if units and group in (16, 32)
           and tuning.get("balance", _by_format(configs.QUANT_GLUON_BALANCE, tf, n, False)) else {}),
        # PERM: H_64's columns permuted so that a thread holds 16 consecutive outputs (HALVES 1; HALVES 2 with UNITS
        # for groups of 16 / 32)
        **({"PERM": True} if (halves == 1 or (units and group in (16, 32)))
           and tuning.get("perm", _by_format(configs.QUANT_GLUON_PERM, tf, n, False)) else {})))


def _gluon_tables_of(fmt, n, tuning) -> str:
    """The format whose Gluon tables (QUANT_GLUON_WIDE / KRON and their switches) a (format, n) reads: the tuning's
    "tables_of", else configs.QUANT_GLUON_TABLES_OF's (fp8_e5m2 on fp8_e4m3's: the same kernels but the conversion),
    else its own."""
    return tuning.get("tables_of", _by_format(configs.QUANT_GLUON_TABLES_OF, fmt, n, None)) or fmt


def _epilogue_switches(fmt, n, tuning) -> dict:
    """The epilogue switches of both Gluon kernels: NOZERO (sub-rows past m left unzeroed: the group formats, whose
    padded sub-rows' scales and codes are never stored; the kernel ignores it for per-token formats and AMAX) and
    CLAMP_LO (the lo piece by one max; 2: and hi's column pairs converted by one instruction, PAIRS):
    tunings "nozero", "clamp_lo", else configs.QUANT_GLUON_NOZERO /
    QUANT_GLUON_CLAMP_LO by (format, n) or format."""
    out = {}
    if tuning.get("nozero", _by_format(configs.QUANT_GLUON_NOZERO, fmt, n, False)):
        out["NOZERO"] = True
    clamp = tuning.get("clamp_lo", _by_format(configs.QUANT_GLUON_CLAMP_LO, fmt, n, False))
    if clamp:
        out["CLAMP_LO"] = 2 if clamp == 2 and clamp is not True else True  # 2: PAIRS (gluon_epilogue.pieces)
    return out


def _e2m1_pairs(fmt, n, tuning) -> dict:
    """The Gluon kernels' E2M1_PAIRS (mxfp4 / nvfp4: a column pair's two e2m1 codes made into one byte, the same
    bytes: gluon_epilogue._e2m1_pair): tuning "e2m1_pairs", else configs.QUANT_GLUON_E2M1_PAIRS by (format, n) or
    format."""
    on = fmt in ("mxfp4", "nvfp4") and tuning.get("e2m1_pairs", _by_format(configs.QUANT_GLUON_E2M1_PAIRS, fmt, n, False))
    return {"E2M1_PAIRS": True} if on else {}


def _gluon_int_bits(fmt, n, tuning) -> dict:
    """The Gluon kernels' INT_BITS (int8 / int4 codes from the bits of q + 1.5 x 2^23, no cvt.rni: gluon_epilogue.
    _int_bits): tuning "int_bits", else configs.QUANT_GLUON_INT_BITS by (format, n) or format."""
    on = fmt in ("int8", "int4") and tuning.get("int_bits", _by_format(configs.QUANT_GLUON_INT_BITS, fmt, n, False))
    return {"INT_BITS": True} if on else {}


def _fold(fmt, n, tuning) -> dict:
    """The Gluon kernels' FOLD (1 / sqrt(n) folded into the maxima and the reciprocals, as quantize_kernels' FAST
    epilogue does, not multiplied into every value; the STORE format multiplies regardless): tuning "fold", else
    configs.QUANT_GLUON_FOLD by (format, n) or format."""
    return {"FOLD": True} if tuning.get("fold", _by_format(configs.QUANT_GLUON_FOLD, fmt, n, False)) else {}


def _scale_once(fmt, n, group, tuning) -> dict:
    """The Gluon kernels' SCALE_ONCE (each group's scale computed once, not on the four threads of its quad:
    gluon_quantize_wide._scales_once) where the tuning "scale_once" or configs.QUANT_GLUON_SCALE_ONCE asks for it and
    the groups lie inside a sub-row (16, 32)."""
    on = tuning.get("scale_once", _by_format(configs.QUANT_GLUON_SCALE_ONCE, fmt, n, False))
    return {"SCALE_ONCE": True} if on and group in (16, 32) else {}


def _gluon_kron_plan(rows, n, dtype, fmt, group, M, P, mix, signs, static, rscale, sms, tuning):
    """The "gluon_kron" path (gluon_quantize_kron.py: Hopper, m <= 32 x p = 128..1024, A = H_32 (x) H_2 resident,
    rows by TMA, wgmma) where it applies and is asked for (plan tuning "gluon_kron", or configs.QUANT_GLUON_KRON by
    (format, n); off until a GPU run checks it), else None: 16-bit, no random signs, groups of 16 or 32 inside a
    sub-row of 64, 128 (int4: a sub-row pair) or the whole row; plan_quantize's device may run Gluon. Tuning: split,
    inside (gluon_kron_tuning), stages, waves."""
    from tilecore.ops.hadamard.gluon_quantize_kron import fits

    tf = _gluon_tables_of(fmt, n, tuning)
    on = tuning.get("gluon_kron", _by_format(configs.QUANT_GLUON_KRON, tf, n, False))
    if not on or not tuning.get("_gluon_ok") or mix != 1 or dtype == torch.float32 or signs \
            or group not in (None, 16, 32, 128) or (group == 128 and fmt != "int4"):
        return None
    split, inside = gluon_kron_tuning(M, P, tuning, tf)
    if not fits(M, P, split):
        return None
    f = FORMATS[fmt]
    grid = max(1, min(cdiv(rows, 3 - split), sms * (tuning.get("waves") or 1)))
    return QuantizePlan("gluon_kron", grid=(grid,), rscale=rscale, config=dict(
        M=M, F=P // 64, SPLIT=split, INSIDE=inside, FORMAT=f.kernel_id, G=group or 0,
        STATIC=static and fmt in FP8_DTYPES, QMAX=f.qmax, STAGES=tuning.get("stages") or configs.QUANT_GLUON_KRON_STAGES,
        PACKED=f.packed, num_warps=4, **_scale_once(tf, n, group, tuning), **_fold(tf, n, tuning),
        **_e2m1_pairs(fmt, n, tuning), **_gluon_int_bits(fmt, n, tuning), **_epilogue_switches(tf, n, tuning),
        **({"PERM": True} if tuning.get("perm", _by_format(configs.QUANT_GLUON_PERM, tf, n, False)) else {})))


def _gluon_pow2_plan(rows, n, dtype, fmt, group, block, rotate, static, signs, sms, tuning):
    """A power-of-two row n = m p on the "gluon_kron" kernel (H_m (x) H_p with Sylvester's H_m is H_n): m from the tuning
    "gluon_pow2", else configs.QUANT_GLUON_POW2's entry by (format, n) (its "gluon_pow2" and the kron plan's tuning, under
    the caller's: read only here, not by the pow2 plan); None where not asked for or the kernel does not take (m, n / m)
    (_gluon_kron_plan's conditions)."""
    if not rotate or block is not None or n & (n - 1):
        return None
    tuning = {**_by_format(configs.QUANT_GLUON_POW2, fmt, n, {}), **tuning}
    m = tuning.get("gluon_pow2")
    if not m or m & (m - 1) or n % m:
        return None
    return _gluon_kron_plan(rows, n, dtype, fmt, group, m, n // m, 1, signs, static, n**-0.5, sms,
                            {**tuning, "gluon_kron": True})


def _gluon_rows_plan(rows, n, dtype, fmt, group, block, rotate, static, signs, sms, tuning):
    """The "gluon_rows" path (gluon_kernels.hadamard_gluon_quantize_kernel: hadamard_transform's Gluon pipeline, a row a
    tile, with the codes for its values) where asked (tuning "gluon_rows", else configs.QUANT_GLUON_ROWS' entry by
    (format, n): its tuning, under the caller's; not where the caller asks for the kron kernel by "gluon_pow2") and able:
    n in configs.GLUON_SIZES, the whole row rotated, 16-bit, no random signs, one scale a row (fp8, int8) or int4's groups
    of 128, >= configs.TMA_MIN_ELEMENTS elements (the transform's rule), plan_quantize's device may run Gluon; else None.
    Tuning: stages, lookahead (the transform's ring, configs.GLUON_TUNING, by default), clamp_lo, int_bits."""
    if tuning.get("gluon_pow2") and "gluon_rows" not in tuning:
        return None
    tuning = {**_by_format(configs.QUANT_GLUON_ROWS, fmt, n, {}), **tuning}
    if not tuning.get("gluon_rows") or not tuning.get("_gluon_ok") or not rotate or block is not None or signs \
            or dtype == torch.float32 or n not in configs.GLUON_SIZES or rows * n < configs.TMA_MIN_ELEMENTS \
            or not (group is None and fmt in ("fp8_e4m3", "fp8_e5m2", "int8") or group == 128 and fmt == "int4"):
        return None
    f = FORMATS[fmt]
    stages, lookahead = configs.GLUON_TUNING.get(n, (configs.GLUON_STAGES, 0))
    clamp = tuning.get("clamp_lo")
    return QuantizePlan("gluon_rows", grid=(min(rows, sms),), rscale=n**-0.5, config=dict(
        S=n // 8192, STAGES=tuning.get("stages") or stages, LOOKAHEAD=tuning.get("lookahead", lookahead),
        FORMAT=f.kernel_id, G=group or 0, STATIC=static and fmt in FP8_DTYPES, QMAX=f.qmax, PACKED=f.packed,
        num_warps=4, **_gluon_int_bits(fmt, n, tuning),
        **({"CLAMP_LO": 2 if clamp == 2 and clamp is not True else True} if clamp else {})))


def _wide_plan(rows, n, dtype, fmt, group, M, m_pad, P, Q, S, mix, mode, spg, signs, static, rscale, sms, interpret,
               tuning):
    """The "wide" path (quantize_wide.wide_quantize_kernel: output sub-rows in blocks of MB, the mixing's K in
    chunks of KC, both stopping at m instead of M_PAD) where it applies and is asked for (plan tuning "wide", or
    configs.QUANT_WIDE by (format, n)), else None: m > 64 from memory, S <= 2 slices, 16-bit inputs, groups
    inside a block or the whole row. Tuning: mb, kc, j_outer, num_warps, num_stages, waves; probe (experiments:
    quantize_wide's PROBE)."""
    on = tuning.get("wide", _by_format(configs.QUANT_WIDE, fmt, n, False))
    if not on or mix != 1 or m_pad <= 64 or S > 2 or dtype == torch.float32:
        return None
    tuning = {**_by_format(configs.QUANT_WIDE_TUNING, fmt, n, {}), **tuning}  # the measured shapes; the caller's first
    mb = tuning.get("mb") or configs.QUANT_WIDE_MB
    kc = tuning.get("kc") or configs.QUANT_WIDE_KC
    nb = cdiv(M, mb)
    if nb > 4 or mb > m_pad or kc > m_pad or (mode == 0 and spg != m_pad and (spg >= mb or mb % spg)):
        return None
    f = FORMATS[fmt]
    dt = kron._dtypes(dtype, interpret)
    j_outer = bool(tuning.get("j_outer", configs.QUANT_WIDE_J_OUTER)) and not (mode == 0 and spg == m_pad)
    # "wide_rows" (quantize_wide_rows.py): the mixing's columns two slices of 64 wide (two rows' at S = 1)
    wide_rows = tuning.get("wide_rows", _by_format(configs.QUANT_WIDE_ROWS, fmt, n, False))
    if wide_rows and Q == 64 and S <= 2 and not j_outer:
        r = 2 // S
        grid = max(1, min(cdiv(rows, r), sms * (tuning.get("waves") or configs.KRON_WAVES)))
        return QuantizePlan("wide_rows", grid=(grid,), rscale=rscale, config=dict(
            M=M, M_PAD=m_pad, P=P, Q=Q, S=S, R=r, MB=mb, NB=nb, KC=kc, NK=cdiv(M, kc), SIGNS=signs,
            FORMAT=f.kernel_id, GROUP=mode, G=group or 1, SPG=spg, STATIC=static and fmt in FP8_DTYPES,
            PACKED=f.packed, QMAX=f.qmax, MMA_DTYPE=dt["MMA_DTYPE"], MID_PIECES=dt["MID_PIECES"],
            PIECE_DTYPE=dt["PIECE_DTYPE"], GRID=grid, FAST=bool(tuning.get("fast", configs.QUANT_FAST)),
            SPLIT=wide_rows != "pair",  # "pair": two [MB, 64] products sharing each H chunk
            num_warps=tuning.get("num_warps") or 8,
            num_stages=tuning.get("num_stages") or configs.QUANT_WIDE_STAGES, **_maxnreg(tuning, {})))
    grid = max(1, min(rows, sms * (tuning.get("waves") or configs.KRON_WAVES)))
    return QuantizePlan("wide", grid=(grid,), rscale=rscale, config=dict(
        M=M, M_PAD=m_pad, P=P, Q=Q, S=S, MB=mb, NB=nb, KC=kc, NK=cdiv(M, kc), SIGNS=signs, FORMAT=f.kernel_id,
        GROUP=mode, G=group or 1, SPG=spg, STATIC=static and fmt in FP8_DTYPES, PACKED=f.packed, QMAX=f.qmax,
        MMA_DTYPE=dt["MMA_DTYPE"], MID_PIECES=dt["MID_PIECES"], PIECE_DTYPE=dt["PIECE_DTYPE"], GRID=grid,
        FAST=bool(tuning.get("fast", configs.QUANT_FAST)),
        J_OUTER=j_outer,
        # experiments/hadamard/gpu_quantize_probe.py's probes of where a row's time goes (quantize_wide's PROBE)
        **({"PROBE": tuning["probe"]} if tuning.get("probe") and not j_outer else {}),
        num_warps=tuning.get("num_warps") or 8,
        num_stages=tuning.get("num_stages") or configs.QUANT_WIDE_STAGES, **_maxnreg(tuning, {})))


def wide_transform(x2: torch.Tensor, out: torch.Tensor, **tuning) -> QuantizePlan:
    """out = (H_m (x) H_p) x2 / sqrt(n) on the wide kernel's tiling (quantize_wide's FORMAT STORE): the plain
    transform there, for probes to time and check against hadamard_transform (not wired into it). x2, out:
    (rows, n) contiguous, 16-bit, n = m p with m > 64 and at most 2 slices; ``tuning`` as the "wide" plan's.
    Returns the plan it ran."""
    from tilecore.ops.hadamard.quantize_wide import STORE

    rows, n = x2.shape
    plan = plan_quantize(x2, "mxfp4", 32, None, True, False, False, **{**tuning, "wide": True})
    if plan.path not in ("wide", "wide_rows"):
        raise ValueError(f"wide_transform: n = {n} ({x2.dtype}) has no wide plan (m > 64, <= 2 slices, 16-bit)")
    cfg = {**plan.config, "FORMAT": STORE.value, "PACKED": False}
    h_dtype = torch.float32 if dispatch.interpreted(x2.device) else x2.dtype
    h = kron.mixing_matrix(cfg["M"], False, h_dtype, x2.device)
    with dispatch.on_device(x2.device):
        launch = _launch_wide_rows if plan.path == "wide_rows" else _launch_wide
        launch[plan.grid](x2, out, x2, h, x2, x2, x2, rows, x2.stride(0), out.stride(0), 0, plan.rscale, **cfg)
    return plan


def _maxnreg(tuning: dict, table: dict) -> dict:
    """The launch option maxnreg (registers a thread: fewer registers, more programs an SM) where the tuning
    or the table gives it, else nothing (Triton's default)."""
    value = tuning.get("maxnreg") or table.get("maxnreg")
    return {"maxnreg": value} if value else {}


def pow2_plan(rows: int, n: int, dtype: torch.dtype, fmt: str, group: int | None, block: int | None,
              rotate: bool, static: bool, signs: bool, sms: int, interpret: bool = False, **tuning):
    """The "pow2" path (quantize_kernels.pow2_quantize_kernel: hadamard_transform's tile and pipeline with
    the quantizing epilogue) where it applies, else None: a rotation of a whole power-of-two row of 16 to
    configs.MAX_N, or of blocks whose groups lie inside a block (then the rows are the blocks: a
    (rows n / block, block) view). ``tuning``: tma ("none" / "load"), split, tile_elems, num_warps,
    num_stages, waves (plan.tl_config's), fast (the epilogue's multiply by a reciprocal: configs.QUANT_FAST); under
    it configs.QUANT_POW2_FORMAT_TUNING's by (format, n)."""
    if not rotate or tuning.get("legacy"):
        return None
    if block is not None:
        if signs or (group or n) > block or (group is None and not (static and fmt in FP8_DTYPES)):
            return None  # groups spanning blocks (or per-token scales): the kron-tiled kernel
        rows, n = rows * (n // block), block
    elif n < 16 or n > configs.MAX_N or n & (n - 1):
        return None
    static_fp8 = static and fmt in FP8_DTYPES
    g = n if group is None or static_fp8 else group
    fp32 = dtype == torch.float32
    # the measured tuning by (format, n) (the caller's first), its TMA only where the input is large enough for it
    # the measured tables by (format, n): fp8_e5m2 reads fp8_e4m3's where configs.QUANT_POW2_TABLES_OF says so (the same
    # kernel but the conversion), its own entries first
    tf = tuning.get("tables_of", _by_format(configs.QUANT_POW2_TABLES_OF, fmt, n, None)) or fmt
    measured = configs.QUANT_POW2_FORMAT_TUNING.get((fmt, n), configs.QUANT_POW2_FORMAT_TUNING.get((tf, n), {}))
    if fp32:  # (measured on 16-bit inputs: float32's three pieces keep their split, warps, stages, tile, pointers,
        # columns and registers)
        measured = {k: v for k, v in measured.items()
                    if k not in ("tma", "split", "perm", "num_warps", "num_stages", "tile_elems", "maxnreg")}
    elif rows * n < configs.TMA_MIN_ELEMENTS:
        measured = {k: v for k, v in measured.items() if k != "tma"}
    tuning = {**measured, **tuning}
    # the input through TMA where hadamard_transform's table loads it so (with that table's tile), else
    # pointers with TUNING's tile; the codes always through pointers
    load, _, preset = pow2_plan_module.tma_sides(n, fp32, tuning.get("tma"), {}, rows * n)
    over = {k: tuning[k] for k in ("split", "tile_elems", "num_warps", "num_stages", "waves") if tuning.get(k)}
    merged = {**(preset if load else {}), **(configs.QUANT_POW2_TUNING.get(n, {}) if load else {}), **over}
    merged.pop("maxnreg", None)  # a launch option (_maxnreg), not the tile's
    cfg = pow2_plan_module.tl_config(n, fp32=fp32, **merged)
    if g < n and cfg["N1"] * cfg["N2"] < g:  # a group must sit inside a slice (n = 256: (4, 1, 64))
        cfg = pow2_plan_module.tl_config(n, fp32=fp32, **{**merged, "split": (n // 128, 1, 128)})
    if g < n and g > cfg["N2"] and cfg["N1"] % (g // cfg["N2"]):
        return None
    grid = max(1, min(cdiv(rows, cfg["B"]), sms * cfg["waves"]))
    mma = {torch.float16: tl.float16, torch.bfloat16: tl.float32 if interpret else tl.bfloat16,
           torch.float32: tl.bfloat16}[dtype]
    f = FORMATS[fmt]
    return QuantizePlan("pow2", grid=(grid,), rscale=n**-0.5, config=dict(
        N=n, S=cfg["S"], N1=cfg["N1"], N2=cfg["N2"], B=cfg["B"], IN_PIECES=3 if fp32 else 1,
        # -2: two pieces, hi a column pair at a time (PAIRS: kernels._pairs_dot; configs.QUANT_POW2_PAIRS); -3: with
        # lo by one max (its CLAMP; configs.QUANT_POW2_CLAMP_LO); -4: hi truncated (its TRUNC; QUANT_POW2_TRUNC_HI)
        MID_PIECES=3 if fp32 else _pow2_pieces(tf, n, tuning),
        MMA_DTYPE=mma, PIECE_DTYPE=tl.bfloat16, GRID=grid, TMA_LOAD=bool(load),
        TMA_STORE=bool(load) and tuning.get("tma_store", f.packed or n <= 256) and (cfg["N2"] // (2 if f.packed else 1)) >= 16,
        SIGNS=signs, FORMAT=f.kernel_id, G=g, STATIC=static_fp8, PACKED=f.packed, QMAX=f.qmax,
        FAST=bool(tuning.get("fast", configs.QUANT_FAST)), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        # the last product's columns permuted so that a thread holds N2 / 4 consecutive outputs (quantize_kernels.
        # _sylvester_cols_permuted; configs.QUANT_PERM_COLUMNS: with one product, N1 == 1, only by (format, n))
        PERM=_pow2_perm(tf, n, cfg, tuning), **_pow2_e2m1_pairs(fmt, n, g, cfg, tuning),
        **_pow2_int_bits(fmt, n, tuning),
        **_maxnreg(tuning, configs.QUANT_POW2_TUNING.get(n, {}) if load else {})))


def _pow2_perm(fmt, n, cfg, tuning) -> bool:
    """The pow2 kernel's PERM: the tuning's "perm", else configs.QUANT_PERM_COLUMNS (by format where the tile has two
    products, N1 > 1; by (format, n) alone where it has one); N2 a multiple of 8, >= 16."""
    table = configs.QUANT_PERM_COLUMNS.get((fmt, n), False) if cfg["N1"] == 1 else \
        _by_format(configs.QUANT_PERM_COLUMNS, fmt, n)
    return bool(tuning.get("perm", table)) and cfg["N2"] % 8 == 0 and cfg["N2"] >= 16


def _pow2_e2m1_pairs(fmt, n, g, cfg, tuning) -> dict:
    """The pow2 kernel's E2M1_PAIRS (a column pair's byte at once: quantize_kernels._e2m1_pair) where the tuning's
    "e2m1_pairs" or configs.QUANT_POW2_E2M1_PAIRS asks: mxfp4 / nvfp4 with FAST, groups inside a tile row."""
    on = tuning.get("e2m1_pairs", _by_format(configs.QUANT_POW2_E2M1_PAIRS, fmt, n, False))
    fast = bool(tuning.get("fast", configs.QUANT_FAST))
    return {"E2M1_PAIRS": True} if on and fast and fmt in ("mxfp4", "nvfp4") and g < cfg["N2"] else {}


def _pow2_int_bits(fmt, n, tuning) -> dict:
    """The pow2 kernel's INT_BITS (int8 / int4 codes from the bits of fma(y, 1 / s, 1.5 x 2^23), not cvt.rni:
    quantize_kernels._int_bits) where the tuning's "int_bits" or configs.QUANT_POW2_INT_BITS asks, with FAST."""
    on = tuning.get("int_bits", _by_format(configs.QUANT_POW2_INT_BITS, fmt, n, False))
    fast = bool(tuning.get("fast", configs.QUANT_FAST))
    return {"INT_BITS": True} if on and fast and fmt in ("int8", "int4") else {}


def _pow2_pieces(fmt, n, tuning) -> int:
    """The pow2 kernel's MID_PIECES for 16-bit inputs: 2, -2 with PAIRS, -3 with PAIRS and the clamped lo, -4 with
    those and hi truncated (TRUNC_HI: tuning "trunc_hi" or configs.QUANT_POW2_TRUNC_HI; kernels._pairs_dot)."""
    if tuning.get("trunc_hi", _by_format(configs.QUANT_POW2_TRUNC_HI, fmt, n, False)):
        return -4
    if not tuning.get("pairs", _by_format(configs.QUANT_POW2_PAIRS, fmt, n, False)):
        return 2
    return -3 if tuning.get("clamp_lo", _by_format(configs.QUANT_POW2_CLAMP_LO, fmt, n, False)) else -2


def _kernel():
    from tilecore.ops.hadamard.quantize_kernels import rotate_quantize_kernel
    return rotate_quantize_kernel


def _wide_kernel():
    from tilecore.ops.hadamard.quantize_wide import wide_quantize_kernel
    return wide_quantize_kernel


def _wide_rows_kernel():
    from tilecore.ops.hadamard.quantize_wide_rows import wide_rows_quantize_kernel
    return wide_rows_quantize_kernel


def _pow2_kernel():
    from tilecore.ops.hadamard.quantize_kernels import pow2_quantize_kernel
    return pow2_quantize_kernel


_launch = CachedLaunch(_kernel)
_launch_pow2 = CachedLaunch(_pow2_kernel)
_launch_wide = CachedLaunch(_wide_kernel)
_launch_wide_rows = CachedLaunch(_wide_rows_kernel)


def _launch_pow2_plan(plan, x2, codes, scales, sign_t, gs, amax, fmt_id=None, key=None):
    """pow2_quantize_kernel over the (rows, N) rows ``x2`` (a block view where the plan rotates blocks);
    ``key``: the call's launch key (hadamard_quantize's signature), or None."""
    cfg = plan.config if fmt_id is None else {**plan.config, "FORMAT": fmt_id}
    n = cfg["N"]  # (the block where the plan rotates blocks)
    xv = x2.reshape(-1, n)
    rows = xv.shape[0]
    cv = codes.view(rows, -1)
    sv = scales if cfg["STATIC"] else scales.view(rows, -1)
    xa, ca = xv, cv
    if cfg["TMA_LOAD"] or cfg["TMA_STORE"]:
        from tilecore.ops.hadamard.launch import _descriptor
        from triton.tools.tensor_descriptor import TensorDescriptor

        if cfg["TMA_LOAD"]:
            xa = _descriptor(xv, cfg)
        if cfg["TMA_STORE"]:
            w = cfg["N2"] // (2 if cfg["PACKED"] else 1)  # bytes a box's line
            ca = TensorDescriptor(cv, [rows, cv.shape[1] // w, w], [cv.stride(0), w, 1], [cfg["B"], cfg["N1"], w])
    _launch_pow2.run(key if fmt_id is None or key is None else (key, fmt_id), plan.grid,
                     (xa, ca, sv, sign_t, gs, amax, rows, xv.stride(0), cv.stride(0),
                      sv.stride(0) if sv.dim() == 2 else 1, plan.rscale), cfg)


def _outputs(rows: int, n: int, fmt: str, group: int | None, device):
    """Empty codes and scales (the kernel's views: bytes) for rows of n."""
    f = FORMATS[fmt]
    if f.packed:
        codes = torch.empty(rows, n // 2, dtype=torch.uint8, device=device)
    elif fmt == "int8":
        codes = torch.empty(rows, n, dtype=torch.int8, device=device)
    else:
        codes = torch.empty(rows, n, dtype=FP8_DTYPES[fmt], device=device)
    per_row = n // group if group else 1
    scale_dtype = torch.uint8 if fmt in ("mxfp4", "nvfp4") else torch.float32
    return codes, torch.empty(rows, per_row, dtype=scale_dtype, device=device)


def run_plan(plan: QuantizePlan, x2: torch.Tensor, fmt: str, group: int | None, block: int | None = None,
             rotate: bool = True, scale: torch.Tensor | None = None, signs: torch.Tensor | None = None, *,
             poison: bool | int = False):
    """Run ``plan`` (from plan_quantize or kernel_plan, with any tuning) on the 2-D rows ``x2`` (rows, n),
    contiguous: (codes, scales, global scale or None), as hadamard_quantize's 2-D result before shaping
    (quantize_reference.shape_outputs). For checks and probes: arguments are not checked; ``poison`` (True or
    a byte value other than 0x5A: two runs with different bytes show an element neither wrote) fills
    the outputs with 0x5A bytes / NaN before the launch, so an element the kernel never writes shows."""
    return _run(x2, fmt, group, block, rotate, scale, signs, plan=plan, poison=poison)


# the "cpu" path (torch's ops: CPU tensors, and the e4m3 formats where Triton has no e4m3) a chunk of rows of about
# this many values at a time: float32 temporaries of one chunk (8 MiB), not of the tensor (issue 31's CPU memory:
# 5.3x the peak of torch's (x @ H).to(float8) at 4096 x 4096 bf16 before, experiments/common/host_cpu_path.py)
TORCH_CHUNK_ELEMS = 1 << 21


def _torch_path_in_chunks(x2, fmt, group, block, rotate, scale, signs, step):
    """The "cpu" path ``step`` rows at a time, for every format but nvfp4 with a dynamic global scale (whose amax
    spans the tensor): a row's codes and scales depend on that row (and a given scale) alone, so the chunks give
    the bits of the whole tensor at once."""
    rows = x2.shape[0]
    codes = scales = None
    per_row = not (scale is not None and fmt in FP8_DTYPES)  # (a static fp8 scale comes back as the scale)
    for i in range(0, rows, step):
        c, s = quantize_rotated(rotated_rows(x2[i:i + step], block, rotate, signs, torch.float32), fmt, group, scale)
        if codes is None:
            codes = c.new_empty((rows, *c.shape[1:]))
            scales = s.new_empty((rows, *s.shape[1:])) if per_row else s
        codes[i:i + step] = c
        if per_row:
            scales[i:i + step] = s
    return codes, scales, (scale.reshape(1).to(torch.float32) if fmt == "nvfp4" else None)


def _run(x2, fmt, group, block, rotate, scale, signs, plan=None, poison=False, key=None):
    """(codes, scales, global scale or None) for 2-D x2 (rows, n), contiguous rows; arguments checked.
    ``key``: the call's launch key (hadamard_quantize: no scale, no signs), or None."""
    rows, n = x2.shape
    static = scale is not None
    if plan is None:
        plan = _PLANS.memo(key, lambda: plan_quantize(x2, fmt, group, block, rotate, static, signs is not None))
    if plan.path == "cpu" or rows == 0:
        step = max(1, TORCH_CHUNK_ELEMS // max(1, n))
        if rows > step and not (fmt == "nvfp4" and scale is None):
            return _torch_path_in_chunks(x2, fmt, group, block, rotate, scale, signs, step)
        y = rotated_rows(x2, block, rotate, signs, torch.float32)
        gscale = scale if fmt != "nvfp4" or scale is not None else nvfp4_global_scale(y)
        codes, scales = quantize_rotated(y, fmt, group, gscale)
        if fmt == "nvfp4":
            return codes, scales, gscale.reshape(1).to(torch.float32)
        return codes, scales, None
    if plan.path == "unfused":
        y = rotated_rows(x2, block, rotate, signs, torch.float32)  # hadamard_transform's kernels
        return _run(y, fmt, group, None, False, scale, None, poison=poison)
    codes, scales = _outputs(rows, n, fmt, group if not static or fmt == "nvfp4" else None, x2.device)
    if poison:
        codes.view(torch.uint8).fill_(0x5A if poison is True else int(poison))
        scales.fill_(float("nan")) if scales.dtype == torch.float32 else scales.fill_(0x5A if poison is True else int(poison))
    if static and fmt in FP8_DTYPES:
        scales = scale.reshape(1).to(torch.float32)
    if plan.path == "pow2":
        return _run_pow2(plan, x2, codes, scales, fmt, scale, signs, static, key=key)
    if plan.path in ("gluon_wide", "gluon_kron", "gluon_rows"):
        return _run_gluon_wide(plan, x2, codes, scales, fmt, scale, static)
    cfg = plan.config
    xa = x2
    if cfg.get("TMA_LOAD"):
        xa = kron.descriptor(x2, cfg)
    h = x2
    launch = {"wide": _launch_wide, "wide_rows": _launch_wide_rows}.get(plan.path, _launch)
    if cfg.get("MIX", 1) == 1:
        h_dtype = torch.float32 if dispatch.interpreted(x2.device) else \
            {torch.float16: torch.float16, torch.bfloat16: torch.bfloat16, torch.float32: torch.bfloat16}[x2.dtype]
        h = kron.mixing_matrix(cfg["M"], False, h_dtype, x2.device)
    sign_t = signs.to(x2.dtype).contiguous() if signs is not None else x2
    gscale = scale if static else None
    if fmt == "nvfp4" and gscale is None:
        amax = torch.empty(plan.grid[0], dtype=torch.float32, device=x2.device)
        launch.run(key and (key, 6), plan.grid, (xa, codes, scales, h, sign_t, x2, amax, rows, x2.stride(0),
                                                 codes.stride(0), scales.stride(0), plan.rscale), {**cfg, "FORMAT": 6})
        a = amax.max()  # NaN if any program saw one (torch's max propagates NaN); no host sync
        gscale = torch.where(a == 0, torch.ones_like(a), a / (448.0 * 6.0)).reshape(1)
    gs = gscale.reshape(1).to(torch.float32).contiguous() if gscale is not None else x2
    byte_codes = codes.view(torch.uint8) if codes.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else codes
    launch.run(key, plan.grid, (xa, byte_codes, scales, h, sign_t, gs, x2, rows, x2.stride(0), codes.stride(0),
                                scales.stride(0), plan.rscale), cfg)
    if fmt == "mxfp4":
        scales = scales.view(torch.float8_e8m0fnu)
    elif fmt == "nvfp4":
        return codes, scales.view(torch.float8_e4m3fn), gs
    return codes, scales, None


def _run_gluon_wide(plan, x2, codes, scales, fmt, scale, static):
    """_run's "gluon_wide" path: codes and scales (made empty) filled by the Gluon kernel; nvfp4 without a given
    global scale: its AMAX pass first (each row's largest |y|)."""
    byte_codes = codes.view(torch.uint8) if codes.dtype != torch.uint8 else codes
    gscale = scale if static else None
    if fmt == "nvfp4" and gscale is None:
        # each row's largest |y| (the kron kernel with a row shared: each consumer's half, two a row)
        amax = torch.empty(x2.shape[0] * plan.config.get("SPLIT", plan.config.get("HALVES", 1)), dtype=torch.float32,
                           device=x2.device)
        _launch_gluon_wide(plan, x2, byte_codes, scales, amax, amax, fmt_id=6)
        a = amax.max()  # NaN if any row had one (torch's max propagates NaN); no host sync
        gscale = torch.where(a == 0, torch.ones_like(a), a / (448.0 * 6.0)).reshape(1)
    gs = gscale.reshape(1).to(torch.float32).contiguous() if gscale is not None else scales
    sc = scales if not (static and fmt in FP8_DTYPES) else gs
    _launch_gluon_wide(plan, x2, byte_codes, sc, gs, gs)
    if fmt == "mxfp4":
        scales = scales.view(torch.float8_e8m0fnu)
    elif fmt == "nvfp4":
        return codes, scales.view(torch.float8_e4m3fn), gs
    elif static and fmt in FP8_DTYPES:
        scales = gs
    return codes, scales, None


def amax_pass(plan: QuantizePlan, x2: torch.Tensor) -> torch.Tensor:
    """Run a "wide" plan's kernel as its AMAX pass (nvfp4's first pass: loads and the whole transform, then each
    program's largest |y| into its own float32; no codes, no stores) on the rows ``x2``; returns those maxima. For
    experiments/hadamard/gpu_quantize_probe.py's probe of what a row costs without its epilogue."""
    if plan.path != "wide":
        raise ValueError(f"amax_pass: a 'wide' plan, not {plan.path!r}")
    from tilecore.ops.hadamard.quantize_kernels import AMAX

    rows, n = x2.shape
    h_dtype = torch.float32 if dispatch.interpreted(x2.device) else x2.dtype
    h = kron.mixing_matrix(plan.config["M"], False, h_dtype, x2.device)
    amax = torch.empty(plan.grid[0], dtype=torch.float32, device=x2.device)
    with dispatch.on_device(x2.device):
        _launch_wide[plan.grid](x2, x2, amax, h, x2, amax, amax, rows, x2.stride(0), n, 1, plan.rscale,
                                **{**plan.config, "FORMAT": AMAX.value})
    return amax


def gluon_amax_pass(plan: QuantizePlan, x2: torch.Tensor) -> torch.Tensor:
    """Run a "gluon_wide" plan's kernel as its AMAX pass (the products, then each row's largest |y|: no codes, no
    stores but one float a row) on the rows ``x2``; returns those maxima. For the probe of what its epilogue costs."""
    if plan.path not in ("gluon_wide", "gluon_kron"):
        raise ValueError(f"gluon_amax_pass: a 'gluon_wide' or 'gluon_kron' plan, not {plan.path!r}")
    amax = torch.empty(x2.shape[0] * plan.config.get("SPLIT", plan.config.get("HALVES", 1)), dtype=torch.float32,
                       device=x2.device)
    # x2's bytes as the codes (never written by AMAX; bytes keep the staging buffer at 8 bits)
    _launch_gluon_wide(plan, x2, x2.view(torch.uint8), amax, amax, amax, fmt_id=6)
    return amax


def _run_pow2(plan, x2, codes, scales, fmt, scale, signs, static, key=None):
    """_run's "pow2" path: codes and scales (made empty) filled by pow2_quantize_kernel."""
    if static and fmt in FP8_DTYPES:
        scales = scale.reshape(1).to(torch.float32)
    sign_t = signs.to(x2.dtype).contiguous() if signs is not None else x2
    byte_codes = codes.view(torch.uint8) if codes.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else codes
    gscale = scale if static else None
    if fmt == "nvfp4" and gscale is None:
        amax = torch.empty(plan.grid[0], dtype=torch.float32, device=x2.device)
        _launch_pow2_plan(plan, x2, byte_codes, scales, sign_t, x2, amax, fmt_id=6, key=key)
        a = amax.max()  # NaN if any program saw one (torch's max propagates NaN); no host sync
        gscale = torch.where(a == 0, torch.ones_like(a), a / (448.0 * 6.0)).reshape(1)
    gs = gscale.reshape(1).to(torch.float32).contiguous() if gscale is not None else x2
    _launch_pow2_plan(plan, x2, byte_codes, scales, sign_t, gs, x2, key=key)
    if fmt == "mxfp4":
        scales = scales.view(torch.float8_e8m0fnu)
    elif fmt == "nvfp4":
        return codes, scales.view(torch.float8_e4m3fn), gs
    return codes, scales, None


class _Pow2Quantize:
    """hadamard_quantize's keyed call on the "pow2" path for one launch key (issue 31's host time): the kernel's
    KeyedLaunch and every argument the key fixes (rows, row strides, the scale factor, the constexprs), made from the
    key's plan after its first call. A call allocates codes and scales in their returned shapes and launches what
    _run_pow2 launches for x's (rows, N) view (the same memory: made only where _impl's x2 is a view of x, not a
    copy): no checks, plan, reshapes or launch-key lookup. ``of``: False where the general path serves the key (another
    path, nvfp4's two launches, TMA descriptors, a copy)."""

    __slots__ = ("launch", "codes_shape", "codes_dtype", "byte_codes", "scales_shape", "scales_dtype", "scales_view",
                 "device", "tail")

    @classmethod
    def of(cls, plan: QuantizePlan, x, fmt: str, group, key):
        cfg = plan.config
        n = x.shape[-1]
        if plan.path != "pow2" or fmt == "nvfp4" or cfg.get("STATIC") or cfg.get("SIGNS") or cfg.get("TMA_LOAD") \
                or cfg.get("TMA_STORE") or x.numel() == 0:
            return False
        x2 = x.reshape(-1, n)  # (as _impl: a view of x, or the general path copies each call)
        if x2.data_ptr() != x.data_ptr() or x2.stride(-1) != 1 or (x2.shape[0] > 1 and x2.stride(0) != n):
            return False
        self = cls()
        lead, rows = tuple(x.shape[:-1]), x2.shape[0]
        codes, scales = _outputs(rows, n, fmt, group, x.device)  # (the general path's: their shapes and dtypes)
        xv = x2.reshape(-1, cfg["N"])  # (_launch_pow2_plan's rows: N is the block where the plan rotates blocks)
        kernel_rows = xv.shape[0]
        self.codes_shape, self.codes_dtype = (*lead, codes.shape[1]), codes.dtype
        self.byte_codes = codes.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)  # (the kernel stores bytes)
        self.scales_shape, self.scales_dtype = (*lead, scales.shape[1]), scales.dtype
        self.scales_view = torch.float8_e8m0fnu if fmt == "mxfp4" else None
        self.device = x.device
        cv, sv = codes.view(kernel_rows, -1), scales.view(kernel_rows, -1)
        self.tail = (kernel_rows, xv.stride(0), cv.stride(0), sv.stride(0), plan.rscale)
        self.launch = KeyedLaunch(_launch_pow2, key, plan.grid, cfg)
        return self

    def __call__(self, x):
        """(codes, scales) as hadamard_quantize returns them for ``x``."""
        codes = torch.empty(self.codes_shape, dtype=self.codes_dtype, device=self.device)
        scales = torch.empty(self.scales_shape, dtype=self.scales_dtype, device=self.device)
        rows, x_stride, c_stride, s_stride, rscale = self.tail
        # (x, codes' bytes, scales, then x for the unread signs, global scale and maxima: as _run_pow2 passes them)
        self.launch((x, codes.view(torch.uint8) if self.byte_codes else codes, scales, x, x, x, rows, x_stride,
                     c_stride, s_stride, rscale))
        return codes, (scales.view(self.scales_view) if self.scales_view is not None else scales)


def _check(x, fmt, block, scale, rotate, signs, group):
    """Raise naming what is accepted; return (group, scale as a float32 tensor or None)."""
    name = "hadamard_quantize"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} expects a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        raise TypeError(f"{name} accepts float16, bfloat16 and float32 tensors, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError(f"{name} quantizes the last dimension; got a 0-d tensor")
    if fmt not in FORMATS:
        raise ValueError(f"{name}: unknown format {fmt!r}; formats: {', '.join(FORMATS)}")
    f = FORMATS[fmt]
    n = x.shape[-1]
    group = f.default_group if group is None else group
    if group not in f.groups:
        raise ValueError(f"{name}: {fmt} takes group in {f.groups} (None: per token), got {group!r}")
    if group and n % group:
        raise ValueError(f"{name}: {fmt} groups of {group} must divide the last dimension, got {n}")
    if f.packed and n % 2:
        raise ValueError(f"{name}: {fmt} packs two codes a byte: the last dimension must be even, got {n}")
    if block is not None:
        if not rotate:
            raise ValueError(f"{name}: block={block} rotates blocks; it needs rotate=True")
        if block not in BLOCKS or n % block:
            raise ValueError(f"{name}: block must be one of {BLOCKS} and divide the last dimension ({n}), got {block!r}")
    elif rotate:
        parts = orders.split(n)
        if parts is None or parts[1] > configs.MAX_N:
            raise ValueError(f"{name}: no Hadamard matrix of order {n} (the last dimension) to rotate by: "
                             f"{orders.supported_text()}, 2^k <= {configs.MAX_N}; or pass block= to rotate blocks")
    if scale is not None:
        if not f.static:
            raise ValueError(f"{name}: {fmt} takes no scale (its scales are dynamic); scale is for fp8_e4m3, "
                             "fp8_e5m2 (static) and nvfp4 (the global scale)")
        if fmt in FP8_DTYPES and group is not None:
            raise ValueError(f"{name}: a static fp8 scale is per tensor: pass group=None")
        if not isinstance(scale, torch.Tensor):
            if isinstance(scale, bool) or not isinstance(scale, (int, float)):
                raise TypeError(f"{name}: scale must be a positive float or a 1-element tensor, got {type(scale).__name__}")
            scale = torch.tensor([float(scale)], dtype=torch.float32, device=x.device)
        if scale.numel() != 1:
            raise ValueError(f"{name}: scale must hold one element (per tensor), got shape {tuple(scale.shape)}")
        if scale.device != x.device:
            raise ValueError(f"{name}: scale is on {scale.device} and x on {x.device}")
        if not dispatch.capturing(x.device):  # reading the value syncs, which a CUDA graph's capture refuses
            value = float(scale.reshape(()))
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: scale must be finite and > 0, got {value}")
        scale = scale.reshape(1).to(torch.float32)
    if signs is not None:
        if not isinstance(signs, torch.Tensor) or signs.shape != (n,):
            got = tuple(signs.shape) if isinstance(signs, torch.Tensor) else type(signs).__name__
            raise ValueError(f"{name}: randomized_signs must be a tensor of {n} elements +-1 (the last dimension), "
                             f"got {got}")
        if signs.device != x.device:
            raise ValueError(f"{name}: randomized_signs is on {signs.device} and x on {x.device}")
        if not dispatch.capturing(x.device) and not bool(((signs == 1) | (signs == -1)).all()):
            raise ValueError(f"{name}: randomized_signs must hold only +1 and -1")
    return group, scale


@torch.library.custom_op("tilecore::hadamard_quantize", mutates_args=())
def _quantize_op(x: torch.Tensor, format: str, block: int, group: int, scale: torch.Tensor | None, rotate: bool,
                 signs: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    codes, scales, gscale = _impl(x, format, block or None, group or None, scale, rotate, signs)
    if gscale is None:
        gscale = torch.empty(0, dtype=torch.float32, device=x.device)
    if format in FP8_DTYPES and scale is not None:
        scales = scales.clone()  # a custom op returns no alias of an input
    return codes, scales, gscale


@_quantize_op.register_fake
def _(x, format, block, group, scale, rotate, signs):
    n = x.shape[-1]
    rows = x.numel() // n if n else 0
    codes, scales = _outputs(0, n, format, group or None, x.device)
    codes = x.new_empty((rows, codes.shape[1]), dtype=codes.dtype)
    if format in FP8_DTYPES and scale is not None:
        scales = x.new_empty((1,), dtype=torch.float32)
    else:
        scales = x.new_empty((rows, scales.shape[1]), dtype={"mxfp4": torch.float8_e8m0fnu,
                                                          "nvfp4": torch.float8_e4m3fn}.get(format, torch.float32))
    gscale = x.new_empty((1 if format == "nvfp4" else 0,), dtype=torch.float32)
    return codes, scales, gscale


def _impl(x, fmt, block, group, scale, rotate, signs, key=None):
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1 or (x2.shape[0] > 1 and x2.stride(0) != n):
        x2 = x2.contiguous()
    return _run(x2, fmt, group, block, rotate, scale, signs, key=key)


# The eager host path (issue 31): a CUDA call without a scale or signs (whose checks read their values) is
# keyed by its signature: its checks' result (_CHECKED), its plan (_PLANS) and its kernels (launched by key)
_CHECKED = LRU(256)  # a call's key -> the group its checks returned
_PLANS = LRU(256)  # a launch key -> its QuantizePlan
_CALL_KEY = SignatureMemo(globals())  # the keyed call's signature, checked against the last repeated one
_RECIPES = LRU(256)  # a plain eager keyed call's key -> its _Pow2Quantize (False: the general path), after its first call


def hadamard_quantize(x: torch.Tensor, *, format: str, block: int | None = None, scale=None, rotate: bool = True,
                      randomized_signs: torch.Tensor | None = None, group: int | None = None):
    """Rotate the last dimension of ``x`` and quantize it, in one pass: returns ``(codes, scales)``.

    y = H (s * x) / sqrt(size): H the Hadamard transform of the whole last dimension (n a power of two up
    to 32768, or m x 2^k as hadamard_transform takes), or of each block of ``block`` elements (16, 32, 64,
    128; any n they divide); s the ``randomized_signs`` (n values +-1) or 1; no rotation with
    ``rotate=False``. Then y is quantized to ``format``:

    * "fp8_e4m3", "fp8_e5m2": a dynamic scale per token (``group=None``) or per 1 x ``group`` block
      (16..128; DeepSeek-V3: 128), or the static per-tensor ``scale`` given;
    * "int8": per token, symmetric (-127..127);
    * "mxfp4": OCP MX, blocks of 32, e8m0 scales (torchao's "floor" scale), two e2m1 codes a byte;
    * "nvfp4": blocks of 16, e4m3 block scales and a float32 global scale (``scale``, or computed from
      the rotated tensor: then x is read twice); ``scales`` is the pair (block scales, global scale);
    * "int4": per ``group`` of 128 (or 32, 64), symmetric, two's-complement nibbles, two a byte.

    Byte layouts, scale formulas and NaN/inf behaviour: tilecore/ops/hadamard/quantize_reference.py.
    ``dequantize(codes, scales, format=...)`` inverts each. Not differentiable.
    """
    key = _CALL_KEY(x, format, block, rotate, group) if scale is None and randomized_signs is None else None
    if key is not None and tiles_launch.OP_RECIPES:  # the key's kept launch (its second call on): no checks or plan
        recipe = _RECIPES.get(key)
        if recipe and dispatch.eager_mode(x) == "direct":
            return recipe(x)
    if key is None:
        group, scale = _check(x, format, block, scale, rotate, randomized_signs, group)
    else:
        group = _CHECKED.memo(key, lambda: _check(x, format, block, None, rotate, None, group)[0])
    lead = x.shape[:-1]
    if dispatch.plain_eager(x, scale, randomized_signs):
        codes, scales, gscale = _impl(x, format, block, group, scale, rotate, randomized_signs, key=key)
        if key is not None and tiles_launch.OP_RECIPES and key not in _RECIPES:  # (after its launch)
            plan = _PLANS.get(key)
            _RECIPES.put(key, plan is not None and _Pow2Quantize.of(plan, x, format, group, key))
    else:
        codes, scales, gscale = _quantize_op(x, format, block or 0, group or 0, scale, rotate, randomized_signs)
        gscale = gscale if format == "nvfp4" else None
    return shape_outputs(codes, scales, lead, gscale)
