"""Plan and launch of the transform for n = m x p, m in orders.ORDERS (kernels_kron.py), and its CPU path.

Paths (``kron_plan``):
* "cpu": CPU tensors without the interpreter: torch's matmul in float32, H_m times each row's m x p
  matrix, then the power-of-two CPU path (launch._cpu) along p, one rounding at the end;
* "fused": one pass, kernels_kron.kron_kernel, where a row fits one program: S <= 8 slices of Q <= 128
  columns and M_PAD x p <= configs.KRON_MAX_TILE_ELEMS float32 values in registers; for p > 1024 a factor
  f = p / 1024 of H_p joins the mixing (H_m (x) H_f over m f sub-rows of 1024) where that fits (12 x 2048);
* "gluon": Hopper, 16-bit contiguous rows, where configs.KRON_GLUON[(m, p)] or the tuning "gluon" asks for it: a
  Gluon kernel of hadamard_quantize storing the rotated values (gluon_launch.gluon_wide_transform:
  gluon_quantize_wide.py at m x 64 with 128 < m <= 192, gluon_quantize_kron.py at m <= 32 x 128..1024);
* "two-pass": longer rows: kron_kernel with CHUNKS column chunks computes H_m X in float32 (exact for
  16-bit inputs) into a workspace, then the power-of-two kernel transforms its rows of p (float32 in,
  three pieces a product: kernels.py) into the output. Three round trips instead of one.
"""
from __future__ import annotations

import dataclasses
import functools

import torch
import triton.language as tl

from tilecore import dispatch
from tilecore.ops.hadamard import configs, orders
from tilecore.tiles import switches
from tilecore.tiles.launch import CachedLaunch, cdiv, next_power_of_2


@dataclasses.dataclass(frozen=True)
class KronPlan:
    path: str  # "cpu" | "fused" | "two-pass" | "wide_rows" | "gluon"
    m: int
    p: int
    config: dict = dataclasses.field(default_factory=dict)
    grid: tuple[int, ...] = ()
    fold: int = 1  # the mixing matrix is H_m (x) H_fold over m fold sub-rows of p / fold (kernel_plan)


def _dtypes(dtype: torch.dtype, interpret: bool) -> dict:
    """The products' dtypes and piece counts (plan.plan's, for the same reasons)."""
    fp32 = dtype == torch.float32
    mma = {torch.float16: tl.float16, torch.bfloat16: tl.float32 if interpret else tl.bfloat16,
           torch.float32: tl.bfloat16}[dtype]
    return dict(IN_PIECES=3 if fp32 else 1, MID_PIECES=3 if fp32 else 2, MMA_DTYPE=mma, PIECE_DTYPE=tl.bfloat16)


def slices(p: int) -> tuple[int, int]:
    """(Q, S) for sub-rows of p: Q = p for p <= 64 (16 for p < 16, zero-padded), else the smallest
    Q >= 64 with S = p / Q <= 8 (fewer tensor-core FLOP per element: 2 M_PAD + 4 Q), None past 1024."""
    if p <= 64:
        return max(p, 16), 1
    q = max(64, p // 8)
    return (q, p // q) if q <= 128 else None


def kron_plan(x: torch.Tensor, m: int, p: int, **tuning) -> KronPlan:
    """The plan of out[r] = scale * (H_m (x) H_p) x[r] for 2-D ``x`` (rows, m p), unit stride along the
    row. ``tuning``: overrides of the fused kernel's num_warps, waves, tile_elems, or force="two-pass"."""
    rows = x.shape[0]
    if dispatch.backend_for(x.device) == "reference":
        return KronPlan("cpu", m, p, config=dict(rows=max(1, configs.CPU_CHUNK_ELEMS // (m * p))))
    interpret = dispatch.interpreted(x.device)
    sms = configs.INTERPRETER_SMS if interpret else dispatch.num_sms(x.device)
    from tilecore.ops.hadamard import plan as pow2_plan

    if not pow2_plan.tma_fits(x) or not dispatch.tma_ok(x.device):
        tuning = {**tuning, "tma": "none"}
    elif _gluon_fits(x, m, p, interpret, tuning):  # the Gluon kernel's tuning (split, inside, stages) carried
        return KronPlan("gluon", m, p, config=gluon_config(m, p, tuning))
    return kernel_plan(rows, m, p, x.dtype, sms, interpret, **tuning)


GLUON_KEYS = ("split", "inside", "stages", "ktrim", "units", "store2", "nozero", "clamp_lo", "perm", "stream")


def gluon_config(m: int, p: int, tuning: dict) -> dict:
    """The "gluon" plan's config (gluon_launch.gluon_wide_transform's keyword arguments): configs.KRON_GLUON_TUNING's
    by (m, p), the caller's tuning over it, GLUON_KEYS only."""
    return {k: v for k, v in {**configs.KRON_GLUON_TUNING.get((m, p), {}), **tuning}.items() if k in GLUON_KEYS}


def _gluon_fits(x: torch.Tensor, m: int, p: int, interpret: bool, tuning: dict) -> bool:
    """Whether the "gluon" path (a Gluon kernel's STORE format: gluon_launch.gluon_wide_transform) is asked for (the
    tuning "gluon", else configs.KRON_GLUON[(m, p)] from configs.TMA_MIN_ELEMENTS elements) and runs here: Hopper
    with Gluon, 16-bit contiguous rows that TMA can describe, and a Gluon kernel of that shape (gluon_quantize_wide:
    m x 64, 128 < m <= 192, and m x 128; gluon_quantize_kron: m <= 32 x p, p = 128..1024)."""
    asked = tuning.get("gluon")
    if asked is None:  # the table's shapes from TMA_MIN_ELEMENTS elements (below it the host cost of descriptors and
        # the Gluon JIT's launch outweighs it, as for the power-of-two Gluon plan: plan.plan)
        asked = configs.KRON_GLUON.get((m, p), False) and x.numel() >= configs.TMA_MIN_ELEMENTS
    if not asked or interpret or x.device.type != "cuda" \
            or x.dtype not in (torch.float16, torch.bfloat16) or not x.is_contiguous() or x.data_ptr() % 16 \
            or not dispatch.gluon_ok(x.device):
        return False
    from tilecore.ops.hadamard import gluon_quantize_kron, gluon_quantize_wide

    split = configs.gluon_kron_tuning(m, p, {})[0]
    return gluon_quantize_wide.fits(m * p, m, p) or gluon_quantize_kron.fits(m, p, split)


@switches.memo(256)  # a function of its arguments and configs' tables (set by switches.patched)
def kernel_plan(rows: int, m: int, p: int, dtype: torch.dtype, sms: int, interpret: bool = False, **tuning) -> KronPlan:
    """kron_plan's kernel paths for ``rows`` rows on a GPU of ``sms`` SMs (a function of its arguments
    alone: experiments/hadamard/compile_kernels.py compiles its configurations without a GPU)."""
    x_dtype = dtype
    if dtype != torch.float32:
        tuning = {**configs.KRON_TUNING.get((m, p), {}), **tuning}  # the measured shapes; the caller's first
        wide = _wide_rows_plan(rows, m, p, dtype, sms, interpret, tuning)
        if wide is not None:
            return wide
    m_pad = next_power_of_2(m)
    qs = slices(p)
    fused = qs is not None and m_pad * qs[0] * qs[1] <= configs.KRON_MAX_TILE_ELEMS and tuning.get("force") != "two-pass"
    common = dict(M=m, M_PAD=m_pad, P=p, MIX=1, **_dtypes(x_dtype, interpret))
    if fused:
        Q, S = qs
        # rows a tile: up to KRON_TILE_ELEMS elements (a batched product for the mixing); one where
        # M_PAD >= 64 (the power-of-two kernel measured batched products of 64+ rows 2-15x slower)
        B = 1 if m_pad >= 64 else max(1, min(tuning.get("tile_elems") or configs.KRON_TILE_ELEMS,
                                             configs.KRON_MAX_TILE_ELEMS) // (m_pad * Q * S))
        if not tuning.get("tile_elems"):
            B = min(B, configs.KRON_MAX_ROWS)
        # 4 warps measured fastest at every m < 64 timed, 32768-value rows included (they spill there, and
        # 16 warps ran 3-10% slower; notes/hadamard/README.md); M_PAD 256 as before (untimed)
        elems = B * m_pad * Q * S
        warps = tuning.get("num_warps") or (configs.KRON_WARPS if m_pad < 64 else
                                             16 if elems >= 32768 else 8 if elems >= 8192 else 4)
        grid = max(1, min(cdiv(rows, B), sms * (tuning.get("waves") or configs.KRON_WAVES)))
        # TMA boxes [B, M_PAD, Q] over the rows as (rows, m, p): slices as wide as the sub-rows, and not
        # the chunked mixing (M_PAD > K_CHUNK loads its sub-rows by pointers)
        tma = tuning.get("tma") or configs.KRON_TMA
        tma_ok = Q <= p and m_pad <= 64 and dtype != torch.float32
        return KronPlan("fused", m, p, grid=(grid,), config=dict(
            common, Q=Q, S=S, B=B, CHUNKS=1, TRANSFORM=p > 1, GRID=grid, num_warps=warps,
            TMA_LOAD=tma_ok and tma in ("load", "both"), TMA_STORE=tma_ok and tma == "both",
            # two stages multi-buffer the chunked mixing's loads: 338-434 KiB of shared memory at M_PAD 256
            num_stages=tuning.get("num_stages") or (1 if m_pad > 64 else 2)))
    # p > 1024: fold a factor f of H_p into the mixing (H_m (x) H_p = (H_m (x) H_f) (x) H_(p / f), the same
    # element order: sub-row i f + j1 of p / f), one pass where m f sub-rows of 1024 fit a program
    f = p // 1024
    if p > 1024 and next_power_of_2(m * f) * 1024 <= configs.KRON_MAX_TILE_ELEMS and tuning.get("force") != "two-pass":
        inner = kernel_plan(rows, m * f, 1024, dtype, sms, interpret, **tuning)
        return KronPlan("fused", m, p, config=inner.config, grid=inner.grid, fold=f)
    Q = min(p, configs.KRON_CHUNK_COLUMNS)
    chunks = p // Q
    grid = max(1, min(rows * chunks, sms * configs.KRON_WAVES))
    return KronPlan("two-pass", m, p, grid=(grid,), config=dict(
        common, Q=Q, S=1, B=1, CHUNKS=chunks, TRANSFORM=False, GRID=grid, num_warps=4, num_stages=2))


@functools.lru_cache(maxsize=None)
def mixing_matrix(m: int, transpose: bool, dtype: torch.dtype, device: torch.device, fold: int = 1) -> torch.Tensor:
    """H_m (H_m^T with ``transpose``) (x) H_fold (Sylvester, symmetric) zero-padded to the power of two
    >= m fold, in ``dtype`` (exact: +-1 and 0), on ``device``; cached (a few KiB each). Not to be modified."""
    from tilecore.ops.hadamard.reference import hadamard_matrix

    h = orders.hadamard_of_order(m)
    if transpose:
        h = h.T
    if fold > 1:
        h = torch.kron(h.to(torch.float64), hadamard_matrix(fold, torch.float64))
    m = h.shape[0]
    m_pad = next_power_of_2(m)
    padded = torch.zeros(m_pad, m_pad, dtype=torch.float64)
    padded[:m, :m] = h
    return padded.to(dtype).contiguous().to(device)


def descriptor(t: torch.Tensor, cfg: dict):
    """The rows of ``t`` (rows, M P) as a (rows, M, P) TMA descriptor with [B, M_PAD, Q] boxes (a slice of a
    tile: kernels_kron.load_slice_transform)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, P = cfg["M"], cfg["P"]
    if cfg.get("ILV"):  # interleaved slices loaded whole (quantize_kernels._load_il): (rows, M, Q, S), [1, M_PAD, Q, S]
        Q, S = cfg["Q"], cfg["S"]
        return TensorDescriptor(t, [t.shape[0], M, Q, S], [t.stride(0), P, S, 1], [1, cfg["M_PAD"], Q, S])
    return TensorDescriptor(t, [t.shape[0], M, P], [t.stride(0), P, 1], [cfg["B"], cfg["M_PAD"], cfg["Q"]])


def _wide_rows_plan(rows, m, p, dtype, sms, interpret, tuning):
    """The "wide_rows" path (quantize_wide_rows.wide_rows_quantize_kernel storing the rotated values, FORMAT STORE:
    output sub-rows in blocks of 64 and the mixing's K in chunks of 64, both stopping at m, the mixing 128 columns
    wide) where configs.KRON_WIDE_ROWS[(m, p)] or the tuning "wide_rows" asks for it ("pair" or True, as
    hadamard_quantize's) and it applies: m > 64, 64-wide slices, at most 2 of them; else None."""
    mode = tuning.get("wide_rows", configs.KRON_WIDE_ROWS.get((m, p), False))
    qs = slices(p)
    m_pad = next_power_of_2(m)
    if not mode or m_pad <= 64 or qs is None or qs[0] != 64 or qs[1] > 2:
        return None
    from tilecore.ops.hadamard.quantize_wide import STORE

    q, s = qs
    mb, kc = tuning.get("mb") or configs.QUANT_WIDE_MB, tuning.get("kc") or configs.QUANT_WIDE_KC
    if cdiv(m, mb) > 4 or mb > m_pad or kc > m_pad:
        return None
    r = 2 // s
    grid = max(1, min(cdiv(rows, r), sms * (tuning.get("waves") or configs.KRON_WAVES)))
    # GROUP 1: _row_out's per-group branch, where STORE writes the values (the per-token one would quantize)
    return KronPlan("wide_rows", m, p, grid=(grid,), config=dict(
        M=m, M_PAD=m_pad, P=p, Q=q, S=s, R=r, MB=mb, NB=cdiv(m, mb), KC=kc, NK=cdiv(m, kc), SIGNS=False,
        FORMAT=STORE.value, GROUP=1, G=32, SPG=1, STATIC=False, PACKED=False, QMAX=1.0, GRID=grid,
        SPLIT=mode != "pair", num_warps=tuning.get("num_warps") or 8,
        num_stages=tuning.get("num_stages") or configs.QUANT_WIDE_STAGES,
        **{k: v for k, v in _dtypes(dtype, interpret).items() if k != "IN_PIECES"}))


def _wide_rows_kernel():
    from tilecore.ops.hadamard.quantize_wide_rows import wide_rows_quantize_kernel
    return wide_rows_quantize_kernel


_launch_wide_rows = CachedLaunch(_wide_rows_kernel)


def _kernel():
    from tilecore.ops.hadamard.kernels_kron import kron_kernel
    return kron_kernel


_launch_kron = CachedLaunch(_kernel)


def launch(plan: KronPlan, x: torch.Tensor, out: torch.Tensor, scale: float, transpose: bool = False) -> None:
    """out = scale * (H_m (x) H_p) x (H_m^T with ``transpose``) for the 2-D rows ``plan`` was made for;
    ``out`` contiguous, possibly ``x`` itself (each row, or in two passes the whole input, is read
    before it is written)."""
    if plan.path == "cpu":
        _cpu(x, out, scale, plan.m, plan.p, transpose, plan.config["rows"])
        return
    if plan.path == "gluon":  # a Gluon kernel's STORE format; in place too (a tile's rows are loaded before stored)
        from tilecore.ops.hadamard.gluon_launch import gluon_wide_transform

        gluon_wide_transform(x, out, scale=scale, transpose=transpose, **plan.config)
        return
    cfg = plan.config
    h_dtype = {torch.float16: torch.float16, torch.bfloat16: torch.bfloat16, torch.float32: torch.bfloat16}[x.dtype]
    if dispatch.interpreted(x.device):
        h_dtype = torch.float32  # the interpreter multiplies bf16 as integers (kernels._INTERPRETED)
    h = mixing_matrix(plan.m, transpose, h_dtype, x.device, plan.fold)
    if plan.path == "wide_rows":  # each tile's rows are read whole before they are written: in place too
        with dispatch.on_device(x.device):
            _launch_wide_rows[plan.grid](x, out, x, h, x, x, x, x.shape[0], x.stride(0), out.stride(0), 0, scale, **cfg)
        return
    if plan.path == "fused":
        xa, oa = x, out
        if cfg.get("TMA_LOAD"):
            xa = descriptor(x, cfg)
        if cfg.get("TMA_STORE"):
            from tilecore.ops.hadamard import plan as pow2_plan

            if pow2_plan.tma_fits(out):
                oa = descriptor(out, cfg)
            else:
                cfg = {**cfg, "TMA_STORE": False}
        with dispatch.on_device(x.device):
            _launch_kron[plan.grid](xa, oa, h, x.shape[0], x.stride(0), out.stride(0), scale, **cfg)
        return
    # two passes: H_m X into a float32 workspace, then H_p along each sub-row
    from tilecore.ops.hadamard import launch as pow2_launch
    from tilecore.ops.hadamard import plan as pow2_plan

    rows, n = x.shape
    work = torch.empty(rows, n, dtype=torch.float32, device=x.device)
    _launch_kron[plan.grid](x, work, h, rows, x.stride(0), work.stride(0), 1.0, **cfg)
    w2, o2 = work.view(rows * plan.m, plan.p), out.view(rows * plan.m, plan.p)
    pow2_launch.launch(pow2_plan.plan(w2, o2), w2, o2, scale)


def _cpu(x, out, scale: float, m: int, p: int, transpose: bool, rows: int) -> None:
    """torch's CPU matmul: each row's m x p matrix times H_m on the left in float32 (exact for 16-bit
    inputs), then launch._cpu's power-of-two transform along p, rounded once into ``out``."""
    from tilecore.ops.hadamard import launch as pow2_launch
    from tilecore.ops.hadamard import plan as pow2_plan

    h = orders.hadamard_of_order(m).to(torch.float32)
    if transpose:
        h = h.T.contiguous()
    cfg = pow2_plan.cpu_plan(rows * m, p).config
    for i in range(0, x.shape[0], rows):
        xi, oi = x[i:i + rows], out[i:i + rows]
        # (X^T H_m^T)^T: a 3-D times 2-D matmul folds into one GEMM (H_m @ X broadcast ran as many small
        # products: 9 ms for 2 x 156 elements); xi is read whole before oi is written
        xt = xi.to(torch.float32).reshape(-1, m, p).transpose(1, 2)
        mixed = torch.matmul(xt, h.T).transpose(1, 2).contiguous().view(-1, p)
        if oi.dtype == torch.float32:
            pow2_launch._cpu(mixed, oi.view(-1, p), scale, **cfg)
        else:  # launch._cpu's float32 product writes an output of its input's dtype: in place, then round
            pow2_launch._cpu(mixed, mixed, scale, **cfg)
            oi.view(-1, p).copy_(mixed)
