"""Which kernels serve an attention call, with what configuration, grid and tile order: a Plan, made
in one place from the inputs, configs.py's tables and tilecore.dispatch's answers about the device
(launch.py runs it).

The forward's paths, the first that fits: for CPU tensors without Triton's interpreter "sdpa"
(torch's own CPU flash-attention kernel, SDPA's, with its lse) where every score is sure to be
finite (scores_finite), else "reference" (reference.py's math in float32, a block of query rows at a
time: NaN and inf propagate as SDPA's math has them, which the CPU kernel does not do: it drops a
NaN score); "decode", the split-key kernels, for few queries a sequence (decode_fits; any device);
"gluon", Hopper's persistent kernel (gluon_kernels.py) at head dim 64 or 128 with a positive scale
and operands TMA can describe; else "tl", the portable kernels (kernels_tl.py). The backward's:
"sdpa" or "reference" as the forward's; "gluon" (gluon_backward.py, then dQ by its own pass where
the kernel does not add it) where the Gluon forward fits, dO is TMA-describable and a tile's steps
stay below 2^24; else "tl". In the interpreter, bfloat16 inputs run the tl kernels on their exact
float32 upcasts (the interpreter's bf16 tl.dot is wrong), rounded once at the end.

Issue 35's features (``features``): a sliding window, a softcap, v's head size Dv != D, or a head
dim past 256 (MLA decode's 576 / 512) are served by the tl kernels (forward, decode and backward)
and on the CPU by "sdpa" (a window alone, as its float mask, D = Dv <= 256) or "reference"; the
Gluon forward and backward take a window and a softcap (configs.GLUON_FORWARD_FEATURES and
GLUON_BACKWARD_FEATURES; causal folded into a window), not Dv != D. Head dims past 256 take the split-key kernel whatever N (Q K^T by
column chunks; the query-block forward would hold a 1024-wide tile).

``sm_margin`` (FlashAttention-3's): SMs the persistent launches leave free for kernels running beside
them (NCCL's transfers in tilecore.distributed's ring): the Gluon forward, backward and dQ kernels
launch on (SMs - sm_margin) programs, their causal schedules built for that many; the split-key
kernel sizes its splits for that many SMs. The tl kernels launch a program per tile (no persistent
grid) and the CPU's torch paths have no grid: they ignore it. 0 <= sm_margin < the SMs plans size
grids by (the device's; the interpreter's configs.INTERPRETER_SMS).
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from tilecore import dispatch
from tilecore.ops.attention import configs
from tilecore.ops.attention.kernels_tl import row_block_grid
from tilecore.ops.attention.reference import effective_window
from tilecore.ops.attention_cpu import plan as cpu_plan
from tilecore.ops.attention_decode import configs as decode_configs, plan as decode_plan
from tilecore.tiles.launch import cdiv, next_power_of_2, tma_describable
from tilecore.tiles import timed
from tilecore.tiles.schedule import DeviceTables, balanced_schedule, causal_steps, paired_table
from tilecore.tiles.schedule import ScheduleNotOnDevice  # noqa: F401 (raised by causal_schedule: callers catch it here)
from tilecore.tiles.switches import generation, memo


@dataclass(frozen=True)
class Plan:
    """One pass: ``path`` ("gluon", "tl", "decode", "sdpa" or "reference"), the kernel's ``config``
    (configs.py's keys), its ``grid``, the tile ``schedule`` of a causal persistent launch (None:
    round-robin), the ``sizes`` planning derived (head_group: heads whose shared operands stay in
    L2 together; keys_per_split: the split-key kernel's; max_scores: the reference's scores held at
    once), ``dq``, the backward's dQ pass where its first kernel does not add dQ, and
    ``operand_dtype``: the dtype the inputs are converted to first (exactly: bf16 to float32 in the
    interpreter), the results computed in it and rounded once to the inputs' dtype. ``launch_key``:
    the signature of the call it was planned for (op.py's plan cache), by which its launches are
    looked up (tiles.launch.CachedLaunch.launch_keyed); None: each launch keyed by Triton's rules."""
    path: str
    config: dict = field(default_factory=dict)
    grid: tuple = ()
    schedule: torch.Tensor | None = None
    sizes: dict = field(default_factory=dict)
    dq: Plan | None = None
    operand_dtype: torch.dtype | None = None
    launch_key: tuple | None = None


def features(q, v, causal: bool, window=(-1, -1), softcap: float = 0.0) -> set[str]:
    """Which of issue 35's features a call uses: "window" (a window other than none or causal's),
    "softcap", "dv" (v's head size differs from q's), "large_d" (a head dim past 256)."""
    left, right = effective_window(causal, window)
    used = set()
    if (left, right) not in ((-1, -1), (-1, 0)):
        used.add("window")
    if softcap:
        used.add("softcap")
    if v.shape[-1] != q.shape[-1]:
        used.add("dv")
    if max(q.shape[-1], v.shape[-1]) > decode_configs.DECODE_WHOLE_HEAD_DIM:
        used.add("large_d")
    return used


def plan_forward(q, k, v, causal: bool, scale: float, *, path: str | None = None, config: dict | None = None,
                 splits: int | None = None, window=(-1, -1), softcap: float = 0.0, sm_margin: int = 0,
                 recording: bool = False) -> Plan:
    """The forward's plan. ``path`` forces a path (no fit check: tests, probes and reports),
    ``config`` replaces its configuration, ``splits`` (decode) the number of key ranges; ``window``
    and ``softcap`` as attention's window_size and softcap; ``sm_margin``: SMs the persistent grid
    leaves free (sm_margin_value); ``recording``: an eager call recording a gradient
    (configs.ONE_LAUNCH_WHEN_RECORDING)."""
    sm_margin = sm_margin_value(sm_margin, q.device)
    B, H, N, D = q.shape
    Nk, Dv = k.shape[2], v.shape[3]
    interpret = dispatch.interpreted(q.device)
    used = features(q, v, causal, window, softcap)
    if path is None:
        # (CPU calls are planned every call, uncached: the kernels' fit checks stay off their path)
        reference = dispatch.backend_for(q.device) == "reference"
        gluon_fits = (not reference and used - {"dv"} <= configs.GLUON_FORWARD_FEATURES and gluon_forward_dims(D, Dv)
                      and scale > 0 and dispatch.gluon_ok(q.device) and tma_describable(q) and tma_describable(k)
                      and tma_describable(v))
        one_launch = recording and configs.ONE_LAUNCH_WHEN_RECORDING and gluon_fits
        path = (cpu_plan.torch_path(q, k, scale, v, used) if reference else
                "decode" if (decode_plan.decode_fits(q, k) and not one_launch) or "large_d" in used else
                "gluon" if gluon_fits else
                "tl")
    if path in ("sdpa", "reference"):
        return Plan(path, sizes=dict(max_scores=cpu_plan.REFERENCE_MAX_SCORES))
    if path == "gluon" and (used - {"window", "softcap", "dv"} or ("dv" in used and (D, Dv) not in configs.GLUON_FORWARD_DV)):
        raise ValueError(f"the Gluon forward takes head dims 64 and 128 with v's as q's, or (q's, v's) in "
                         f"{sorted(configs.GLUON_FORWARD_DV)}; got {D} and {Dv}")
    if path == "gluon" and "window" in used:  # no causal schedule, no carried pipeline (gluon_kernels.py)
        cfg = dict(config or configs.gluon_forward_config(D, N, Nk, False, Dv))
        cfg["carry"] = False
        grid, head_group, schedule = query_tiling(q, k, cfg["block_m"] * cfg.get("consumers", 2), cfg["block_n"],
                                                  False, False, sm_margin)
        return Plan("gluon", cfg, grid, schedule, dict(head_group=head_group))
    if path == "decode":  # tilecore.ops.attention_decode: its tiles and key ranges
        cfg = config or fitted("decode", max(D, Dv), decode_configs.decode_config(max(D, Dv), interpret), q.device)
        sms = grid_sms(q.device) - sm_margin if splits is None else None
        split_keys = decode_plan.decode_plan(q, k, cfg, splits, v, sms)
        return _with_operands(Plan("decode", split_keys.config, split_keys.grid,
                                   sizes=dict(keys_per_split=split_keys.keys_per_split)), q)
    if path == "gluon":
        if config is None and NAPKIN_FORWARD_TOPK and D == Dv:
            config = timed_forward_config(q, k, v, causal, scale, softcap, NAPKIN_FORWARD_TOPK)
        cfg = dict(config or configs.gluon_forward_config(D, N, Nk, causal, Dv))
        if cfg.get("qk_pieces", 1) != 1 and (cfg.get("carry") or cfg.get("q_regs") or D != 64 * cfg["qk_pieces"]):
            raise ValueError(f"Q and K in column pieces take D = 64 x qk_pieces, no carry and Q in shared memory; "
                             f"got D {D} and {cfg}")
        if cfg.get("carry") and (cfg.get("q_regs") or cfg.get("consumers") == 3):
            # three carried consumers hit an illegal memory access on the H100 (N = 1, Nk = 17, causal)
            raise ValueError(f"the carried pipeline takes one or two consumers and Q in shared memory; got {cfg}")
        grid, head_group, schedule = query_tiling(q, k, cfg["block_m"] * cfg.get("consumers", 2), cfg["block_n"],
                                                  causal, cfg.get("balanced", True), sm_margin)
        return Plan("gluon", cfg, grid, schedule, dict(head_group=head_group))
    cfg = config or fitted("forward", max(D, Dv), configs.forward_config(max(D, Dv), interpret), q.device)
    return _with_operands(Plan("tl", cfg, row_block_grid(B * H, N, cfg["BLOCK_M"])), q)


# issue 36 part 4: the Gluon forward's tiles the napkin ranks (engine.rank_attention_configs) that the
# kernel takes: 64-row consumers, two (three at D <= 64) of them, 64 or 128 keys a step, 2 or 3 stages, within
# Hopper's 227 KiB a block (Q buffers + K and V stages + 4 KiB). NAPKIN_FORWARD_TOPK > 0: the plan
# times the napkin's top k and the table's row once a (size bucket, dtype, device) and keeps the
# fastest (timed_forward_config; window calls and Dv != D keep the table; only CUDA tensors are
# timed: meta and CPU plans keep the table either way). 0: off: a pick timed over ~20 ms a candidate is not
# stable across processes (it chose 64-key blocks at D128 N4096 once, 0.89x the table, other bits), and the
# table's row was the fastest or within 0.7% in steady state where the pick differed (notes/napkin).
FORWARD_SMEM = 227 * 1024 - 4096
NAPKIN_FORWARD_TOPK = 0
NAPKIN_TIMED_MS = 20.0  # a candidate's timing: do_bench's median over about this many ms (L2 flushed)
_FORWARD_PICKS: OrderedDict = OrderedDict()  # the timed picks, least recently made first
_FORWARD_PICKS_MAX = 256


def timed_forward_config(q, k, v, causal: bool, scale: float, softcap: float, top_k: int) -> dict:
    """The Gluon forward's row for these inputs: napkin_forward_configs' candidates each launched once
    (it compiles) and then timed on these inputs into scratch outputs (time_forward_configs), the
    fastest kept for the bucket (B H, N, Nk rounded up to powers of two; D, causal, softcap, dtype,
    device). Only a CUDA device is timed: a meta device (dispatch.pretend), CPU tensors planned as a
    GPU's, a CUDA graph capture (not kept) and a process where launch.py has not registered its
    forward (tiles.timed, FORWARD_RUNNER) plan the table's row, as with the switch off; a candidate
    that raises is left out (the table's row if all do)."""
    B, H, N, D = q.shape
    Nk = k.shape[2]
    table = configs.gluon_forward_config(D, N, Nk, causal)
    if not _timeable(q.device):
        return table
    key = (next_power_of_2(B * H), next_power_of_2(N), next_power_of_2(Nk), D, causal, bool(softcap), q.dtype,
           q.device, generation())  # (the candidates read configs: a pick under a patched block is its own)
    hit = _FORWARD_PICKS.get(key)
    if hit is not None:
        return hit
    if dispatch.capturing(q.device) or timed.runner(FORWARD_RUNNER) is None:
        return table
    rows = napkin_forward_configs(B, H, N, Nk, D, causal, top_k, kv_heads=k.shape[1])
    times = time_forward_configs(rows, q, k, v, causal, scale, softcap)
    best = timed.fastest(times)
    best = rows[best] if best is not None else table
    _FORWARD_PICKS[key] = best
    if len(_FORWARD_PICKS) > _FORWARD_PICKS_MAX:
        _FORWARD_PICKS.popitem(last=False)
    return best


def forget_forward_picks() -> None:
    """Empty timed_forward_config's kept picks (a probe making the pick again in one process)."""
    _FORWARD_PICKS.clear()


def _timeable(device) -> bool:
    return device.type == "cuda"


FORWARD_RUNNER = "attention.forward"  # launch.forward's name in tiles.timed (plan.py never imports launch.py)


def use_forward_launch(forward) -> None:
    """Register ``forward(plan, q, k, v, out, lse, causal, scale, softcap=...)`` (attention launch.forward,
    at its import) as what timed_forward_config runs its candidates with; until then the switch plans
    the table's row."""
    timed.register(FORWARD_RUNNER, forward)


def time_forward_configs(rows: list[dict], q, k, v, causal: bool, scale: float, softcap: float) -> list[float]:
    """Each Gluon forward row's GPU time in ms on these inputs (CUDA), into scratch outputs: one launch
    (the registered launch.forward) that compiles it, then triton.testing.do_bench's median over about
    NAPKIN_TIMED_MS; inf where it raises."""
    from triton.testing import do_bench

    forward = timed.runner(FORWARD_RUNNER)
    B, H, N, D = q.shape
    out = torch.empty(B, H, N, v.shape[3], dtype=q.dtype, device=q.device)
    lse = torch.empty(B, H, N, dtype=torch.float32, device=q.device)
    times = []
    for cfg in rows:
        try:
            p = plan_forward(q, k, v, causal, scale, path="gluon", config=cfg, softcap=softcap)
            forward(p, q, k, v, out, lse, causal, scale, softcap=softcap)
            times.append(do_bench(lambda: forward(p, q, k, v, out, lse, causal, scale, softcap=softcap),
                                  warmup=max(NAPKIN_TIMED_MS / 4, 1), rep=NAPKIN_TIMED_MS, return_mode="median"))
        except Exception as e:  # a candidate the compiler or the GPU refuses: the others still compete
            dispatch.notice_once(f"attention: the forward candidate {cfg} failed ({type(e).__name__}); left out")
            times.append(math.inf)
    return times


def napkin_forward_configs(batch: int, heads: int, n: int, nk: int, d: int, causal: bool, top_k: int,
                           kv_heads: int | None = None, gpu: str = "h100") -> list[dict]:
    """The Gluon forward's rows to time for D = Dv = ``d``: the napkin's ``top_k`` fastest that the
    kernel takes, as configs.gluon_forward_config's row with the tile replaced (a change of consumers
    drops the carried pipeline and Q in registers), then the table's row where it is not among them.
    Pure Python, deterministic."""
    from tilecore.napkin.engine import rank_attention_configs

    table = configs.gluon_forward_config(d, n, nk, causal)
    rows = []
    for c in rank_attention_configs(batch, heads, n, d, causal, kv_heads=kv_heads):
        rows_m, block_n, _ = c.block
        consumers = c.warpgroups
        if rows_m != 64 * consumers or consumers not in (2, 3) or block_n not in (64, 128) or c.stages not in (2, 3):
            continue
        if consumers == 3 and d > 64:  # on the H100, D128, 3 consumers, 64 keys x 3 stages asked 246,196
            continue                   # bytes of shared memory (O's staging beside Q, K and V), past 232,448
        cfg = dict(table, block_m=64, block_n=block_n, stages=c.stages, consumers=consumers)
        if consumers != table.get("consumers", 2):
            cfg.pop("carry", None)
            cfg.pop("q_regs", None)
            cfg["q_buffers"] = 2 if consumers == 2 or n <= configs.THREE_CONSUMERS_Q2_MAX_N else 1
        smem = cfg.get("q_buffers", 1) * consumers * 64 * d * 2 + cfg["stages"] * block_n * d * 2 * 2
        if smem <= FORWARD_SMEM and cfg not in rows:
            rows.append(cfg)
    rows = rows[:max(top_k, 0)]
    if table not in rows:
        rows.append(table)
    return rows


def gluon_forward_dims(d: int, dv: int) -> bool:
    """Whether the Gluon forward serves q/k head dim ``d`` and v's ``dv`` by default: 64 and 128 with
    dv = d; MLA's (192, 128) once configs.GLUON_FORWARD_DV_ROUTED (issue 35; off until GPU-checked)."""
    if d == dv:
        return d in configs.GLUON_FORWARD
    return (d, dv) in configs.GLUON_FORWARD_DV and configs.GLUON_FORWARD_DV_ROUTED


def gluon_backward_dims(d: int, dv: int, group: int = 1) -> bool:
    """Whether the Gluon backward serves q/k head dim ``d`` and v's ``dv`` (``group`` q heads a kv
    head) by default: 64 and 128 with dv = d; MLA's (192, 128) where configs.GLUON_BACKWARD_DV_ROUTED
    (issue 35; checked on the H100 with one q head a kv head: grouped heads where
    GLUON_BACKWARD_DV_GROUPED)."""
    if d == dv:
        return (d, False) in configs.GLUON_BACKWARD
    return ((d, dv) in configs.GLUON_BACKWARD_DV and configs.GLUON_BACKWARD_DV_ROUTED
            and (group == 1 or configs.GLUON_BACKWARD_DV_GROUPED))


def plan_backward(dout, q, k, v, causal: bool, scale: float, *, path: str | None = None,
                  config: dict | None = None, window=(-1, -1), softcap: float = 0.0, sm_margin: int = 0) -> Plan:
    """The backward's plan (dout: the output's gradient). ``path`` forces a path (no fit check),
    ``config`` replaces its configuration, ``sm_margin`` as plan_forward's. A dQ added in the Gluon
    kernel sums float32 TMA reductions in no fixed order, so with torch.use_deterministic_algorithms(True) dQ comes from the Gluon dq
    kernel instead (each row summed in registers in a fixed order: bitwise reproducible)."""
    sm_margin = sm_margin_value(sm_margin, q.device)
    B, H, N, D = q.shape
    Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[3]
    interpret = dispatch.interpreted(q.device)
    used = features(q, v, causal, window, softcap)
    if path is None:
        path = (cpu_plan.torch_path(q, k, scale, v, used) if dispatch.backend_for(q.device) == "reference" else
                "gluon" if (used - {"dv"} <= configs.GLUON_BACKWARD_FEATURES and gluon_backward_dims(D, Dv, H // Hkv)
                            and scale > 0
                            and dispatch.gluon_ok(q.device)
                            and steps_exact(H // Hkv, N, 64)  # 64: the least block_m
                            and tma_describable(q) and tma_describable(k) and tma_describable(v)
                            and tma_describable(dout)) else
                "tl")
    if path in ("sdpa", "reference"):
        return Plan(path, sizes=dict(max_scores=cpu_plan.REFERENCE_MAX_SCORES))
    if path == "tl":
        cfg = config or fitted("backward", max(D, Dv), configs.backward_config(max(D, Dv), interpret), q.device)
        return _with_operands(Plan("tl", cfg, (B * Hkv, cdiv(Nk, cfg["BLOCK_N"])),
                                   dq=Plan("tl", cfg, row_block_grid(B * H, N, cfg["BLOCK_M"]))), q)
    if used - {"window", "softcap", "dv"} or ("dv" in used and (D, Dv) not in configs.GLUON_BACKWARD_DV):
        raise ValueError(f"the Gluon backward takes head dims 64 and 128 with v's as q's, or (q's, v's) in "
                         f"{sorted(configs.GLUON_BACKWARD_DV)}; got {D} and {Dv}")
    if "window" in used:  # the kernels fold causal into the window: no causal schedule or config
        causal = False
    # a window's own dQ mode (GLUON_BACKWARD_WINDOW_DQ) without a softcap until a GPU run checks the two together
    cfg = dict(config or configs.gluon_backward_config(D, N, causal, Dv,
                                                       window="window" in used and "softcap" not in used))
    if cfg.get("qk_pieces", 1) != 1 and (cfg["dq_from"] not in ("gluon", "tl") or cfg.get("kv_regs")
                                         or D != 64 * cfg["qk_pieces"] or Dv != 128):
        raise ValueError(f"the backward by column pieces takes D = 64 x qk_pieces, Dv = 128, dq_from 'gluon' or "
                         f"'tl' and K and V in shared memory; got D {D}, Dv {Dv} and {cfg}")
    if cfg["dq_from"] not in configs.DQ_MODES:
        raise ValueError(f"dq_from is one of {', '.join(configs.DQ_MODES)}; got {cfg['dq_from']!r}")
    if torch.are_deterministic_algorithms_enabled() and configs.DQ_MODES[cfg["dq_from"]] > 0:
        cfg.update(dq_from="gluon", kv_regs=False)
    block_m, block_n, dq_from = cfg["block_m"], cfg["block_n"], cfg["dq_from"]
    if dq_from == "warpgroup" and D != 64:
        raise ValueError(f"dq_from 'warpgroup' fits head dim 64 (registers); got {D}")
    if cfg.get("kv_regs") and configs.DQ_MODES[dq_from] == 0:
        # alone, with K and V in registers, the kernel gave wrong dK and dV on the H100: ptxas reused
        # some of V's registers in its loop (notes/attention's decision log, b14; report's register_operands_clobbered)
        raise ValueError("kv_regs takes a dQ added in the kernel: dq_from 'fused', 'lagged' or 'warpgroup'")
    if not steps_exact(H // Hkv, N, block_m):
        raise ValueError(f"the Gluon backward takes (Hq / Hkv) * N / {block_m} < 2^24 steps a tile; got "
                         f"{H // Hkv} q heads a kv head and N = {N}")
    grid = (min(cdiv(Nk, 2 * block_n) * B * Hkv, persistent_sms(q.device, sm_margin)),)
    # kv heads kept together in L2 as if each had one q head: a kv head's tiles walk the query
    # blocks together, so they share a few blocks of the group's rows at a time
    head_group = heads_in_l2(2 * N * D * q.element_size())
    schedule = None
    if causal and cfg.get("balanced", True):
        if H == Hkv:
            schedule = causal_schedule(q.device, "backward", N, Nk, block_m, 2 * block_n, B * Hkv, head_group, 1,
                                       grid[0])
        else:  # grouped heads: key blocks in pairs
            schedule = causal_schedule(q.device, cdiv(Nk, 2 * block_n), B * Hkv, head_group, grid[0],
                                       build=paired_table)
    dq = None
    if dq_from == "gluon":
        dq_cfg = configs.GLUON_DQ[D] if D == Dv else configs.GLUON_DQ_DV[D, Dv]
        dq_grid, dq_group, dq_schedule = query_tiling(q, k, 2 * dq_cfg["block_m"], dq_cfg["block_n"], causal,
                                                      cfg.get("balanced", True), sm_margin)
        dq = Plan("gluon", dq_cfg, dq_grid, dq_schedule, dict(head_group=dq_group))
    elif dq_from == "tl":
        tl_cfg = fitted("backward", D, configs.backward_config(D, interpret), q.device)
        dq = Plan("tl", tl_cfg, row_block_grid(B * H, N, tl_cfg["BLOCK_M"]))
    return Plan("gluon", cfg, grid, schedule, dict(head_group=head_group), dq=dq)


def grid_sms(device) -> int | None:
    """The SMs plans size grids by on ``device``: the GPU's (or the GPU a meta device stands for),
    configs.INTERPRETER_SMS in the interpreter, None where torch's CPU kernels run (no grid)."""
    if dispatch.interpreted(device):
        return configs.INTERPRETER_SMS
    if dispatch.backend_for(device) != "kernel":
        return None
    return dispatch.num_sms(device)


def sm_margin_value(sm_margin, device) -> int:
    """``sm_margin`` as an int: from 0 to the grid's SMs (grid_sms) less one; any int >= 0 where
    there is no grid (torch's CPU kernels, which ignore it). TypeError/ValueError otherwise."""
    if isinstance(sm_margin, bool) or not isinstance(sm_margin, numbers.Integral):
        raise TypeError(f"attention: sm_margin must be an int (SMs the persistent kernels leave free, 0 to the "
                        f"GPU's SMs - 1), got {sm_margin!r}")
    sm_margin = int(sm_margin)
    sms = grid_sms(device)
    if sm_margin < 0 or (sms is not None and sm_margin >= sms):
        what = "interpreter stands for" if dispatch.interpreted(device) else "GPU has"
        where = "" if sms is None else f"; this {what} {sms} SMs, so 0 to {sms - 1}"
        raise ValueError(f"attention: sm_margin (SMs the persistent kernels leave free) must be >= 0 and below the "
                         f"GPU's SMs{where}; got {sm_margin}")
    return sm_margin


def persistent_sms(device, sm_margin: int = 0) -> int:
    """Programs of a persistent Gluon launch at most: one per SM of the GPU (dispatch.num_sms) less
    ``sm_margin`` (validated by the plans)."""
    return dispatch.num_sms(device) - sm_margin


def fitted(kind: str, d: int, cfg: dict, device) -> dict:
    """``cfg``, a tl kernel's configuration for head dim ``d`` (``kind``: "forward", "decode" or
    "backward"), with configs.SHARED_FITS's overrides where the GPU's blocks get less shared memory
    than it asks for there."""
    fit = dispatch.shared_memory_fit(device, configs.SHARED_FITS, "attention")
    rows = fit.get(kind, {}) if fit else {}
    largest = next((b for b in sorted(rows) if d <= b), None)  # the row of the head dims up to b
    return {**cfg, **rows[largest]} if largest is not None else cfg


def _with_operands(plan: Plan, q) -> Plan:
    """``plan`` with bfloat16 inputs converted to float32 first in the interpreter, whose bf16
    tl.dot is wrong (values ~1e9, no error): the conversion is exact, and the result is rounded once
    to bfloat16 at the end (as the GEMM does; the GPU runs bf16 itself)."""
    if q.dtype == torch.bfloat16 and dispatch.interpreted(q.device):
        return dataclasses.replace(plan, operand_dtype=torch.float32)
    return plan


def steps_exact(group: int, n: int, block_m: int) -> bool:
    """Whether the Gluon backward's tile steps (group * n / block_m of them) stay below 2^24, where
    the kernel's float32 division of a step's index by the group size is exact (_step_rows)."""
    return group * cdiv(n, block_m) < 2**24


# --------------------------------------------------------------------------------------------
# the persistent Gluon kernels' tile order


def heads_in_l2(bytes_per_head: int) -> int:
    """How many heads' shared operands (``bytes_per_head`` each) the persistent tile order keeps
    together: within configs.L2_GROUP_BYTES, 1 to 16."""
    return max(1, min(16, configs.L2_GROUP_BYTES // bytes_per_head))


def query_tiling(q, k, tile_rows: int, block_n: int, causal: bool, balanced: bool, sm_margin: int = 0):
    """(grid, head_group, schedule) of a persistent launch over tiles of ``tile_rows`` query rows of
    one (batch, head) in the forward's order (its K and V blocks of ``block_n`` keys streamed): the
    Gluon forward's and the Gluon dq kernel's; ``sm_margin`` SMs left free (the schedule is built
    for the grid, so keyed by it)."""
    B, H, N, D = q.shape
    Nk = k.shape[2]
    grid = (min(cdiv(N, tile_rows) * B * H, persistent_sms(q.device, sm_margin)),)
    head_group = heads_in_l2(2 * Nk * D * q.element_size())  # their K and V stay in L2 together
    schedule = None
    if causal and balanced:
        schedule = causal_schedule(q.device, "forward", N, Nk, tile_rows, block_n, B * H, head_group, 1, grid[0])
    return grid, head_group, schedule


@memo(64)  # (configs.TILE_OVERHEAD_STEPS: a patched block's tables are its own)
def balanced_table(kind: str, N: int, Nk: int, block_m: int, block_n: int, num_bh: int, head_group: int,
                   steps_per_block: int, programs: int) -> torch.Tensor | None:
    """The balanced schedule of a causal Gluon launch (cost: its steps + TILE_OVERHEAD_STEPS, tiles.schedule's
    causal_steps). ``kind`` "forward": tiles of ``block_m`` query rows (query blocks from the last:
    gluon_kernels' setup); "backward": tiles of ``block_n`` keys, ``steps_per_block`` times a query block (the q
    heads of a kv head)."""
    steps = causal_steps(kind == "forward", N, Nk, block_m, block_n, num_bh, head_group, steps_per_block)
    return balanced_schedule(steps + configs.TILE_OVERHEAD_STEPS, programs)


# (device, builder, table's key[, generation]) -> the table on the device, or None for round-robin (4 bytes a tile:
# 33 KB at N = 4096): the configs.DEVICE_TABLES_MAX used last, those a CUDA graph captured, one copy per contents
DEVICE_TABLES = DeviceTables()


def causal_schedule(device: torch.device, *key, build=balanced_table, whole_key: bool = False) -> torch.Tensor | None:
    """``build(*key)`` (a balanced table by default, or tiles.schedule.paired_table's) on ``device``, or None
    (round-robin) where round-robin is as even, kept in DEVICE_TABLES. While a CUDA graph is captured a table whose
    contents are not on the device yet raises ScheduleNotOnDevice (run the call once before capturing: a warm-up in
    another patched block with the same switches made the same table). ``whole_key``: ``key`` holds every switch
    ``build`` reads, so the table is kept across switches.patched blocks (a graph captured in a block of its own
    finds the table its warm-up call made); else the key takes tiles.switches.generation (balanced_table reads
    configs)."""
    cache_key = (device, build, key) if whole_key else (device, build, key, generation())
    return DEVICE_TABLES.get(device, cache_key, build, key, configs.DEVICE_TABLES_MAX)
