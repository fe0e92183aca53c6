"""Which path serves attention(..., rotary=(cos, sin)) (rotary_path), whether a training call takes the Gluon
forward's turned Q (rotary_train_in_kernel), and the schedule of that forward with K turned inside its launch
(rotary_overlap_schedule). Pure planning: shapes, dtypes, the device's answers and configs.py's cases.
"""
from __future__ import annotations

import importlib

import torch

from tilecore import dispatch
from tilecore.ops.attention import configs as attention_configs
from tilecore.ops.attention.plan import causal_schedule, gluon_forward_dims
from tilecore.ops.attention_decode import configs as decode_configs
from tilecore.ops.attention_rotary import configs
from tilecore.tiles.launch import cdiv, tma_describable
from tilecore.tiles.schedule import balanced_schedule, causal_steps, dealt_schedule, head_grouped_tiles


GLUON_ROTARY_MODULE = "tilecore.ops.attention_rotary.gluon_forward"


class RotaryNotTaken(NotImplementedError):
    """gluon_forward.forward does not take this case (a head dim or rotary_dim outside its limits): attention_rotary.op runs
    the turned path's math instead. Raised by gluon_forward.check alone, so that any other error of that forward (a
    ValueError of bad input that attention's checks should have caught, a launch's) propagates."""


def gluon_rotary_forward():
    """The Hopper forward that turns Q and K inside the Gluon kernel, ``forward(q, k, v, cos, sin, *,
    causal, scale, interleaved, window, softcap, sm_margin) -> (o, lse)``, or None where its module or
    entry point does not exist."""
    try:
        module = importlib.import_module(GLUON_ROTARY_MODULE)
    except ImportError:
        return None
    return getattr(module, "forward", None)


def rotary_train_in_kernel(q, k, v, scale: float, causal: bool) -> bool:
    """Whether a call recording a gradient on the "turned" path gets its turned forward (O, lse, turned q and k)
    from gluon_forward.forward (Q turned in the Gluon kernel and stored from there): the Gluon forward's calls
    whose (D, ``causal``) configs.ROTARY_TRAIN_IN_KERNEL_CASES names, where that forward exists, but where the
    forward's configuration carries the pipeline across tiles (short rows: untimed there, and that kernel's O
    other bits than the turned path's, right)."""
    D, Dv = q.shape[-1], v.shape[-1]
    return ((D, bool(causal)) in configs.ROTARY_TRAIN_IN_KERNEL_CASES and dispatch.backend_for(q.device) != "reference"
            and dispatch.gluon_ok(q.device) and gluon_forward_dims(D, Dv) and scale > 0
            and not attention_configs.gluon_forward_config(D, q.shape[2], k.shape[2], bool(causal)).get("carry")
            and gluon_rotary_forward() is not None)


def rotary_path(q, k, v, scale: float, grad: bool = False, causal: bool | None = None) -> str:
    """How attention(q, k, v, rotary=(cos, sin)) runs, from shapes, dtypes and the device alone (so
    torch.compile's fake tensors plan it as the real ones; attention_rotary.op's module docstring has each):

    * "composite": CPU tensors without the interpreter: apply_rotary on q and k, then attention (torch's
      CPU paths), autograd turning dQ and dK back through apply_rotary's backward;
    * "turned": GPU calls the Gluon forward serves (Hopper, D 64 / 128, a positive scale; its kernels
      read K from shared memory by TMA, where the tl kernels' in-register turn does not reach) but the
      "gluon" ones, and head dims past 256 (the split-key path): turned q and k kept for the backward
      (by apply_rotary's kernel, or where rotary_train_in_kernel says from gluon_forward.forward), the
      shipped kernels on them, dQ and dK turned back;
    * "gluon": the Gluon forward's calls whose (D, ``causal``) configs.ROTARY_IN_KERNEL_CASES names,
      gluon_rotary_forward() there and no gradient to record (``grad`` False: inference): that forward
      (a call recording a gradient needs the turned q and k kept: "turned");
    * "tl": the tl forward and backward with Q and K turned in the kernels (kernels_tl.rotary_turn):
      the interpreter and every other GPU."""
    if dispatch.backend_for(q.device) == "reference":
        return "composite"
    D, Dv = q.shape[-1], v.shape[-1]
    if dispatch.gluon_ok(q.device) and gluon_forward_dims(D, Dv) and scale > 0:
        in_kernel = causal is not None and (D, bool(causal)) in configs.ROTARY_IN_KERNEL_CASES
        return "gluon" if in_kernel and not grad and gluon_rotary_forward() is not None else "turned"
    if max(D, Dv) <= decode_configs.DECODE_WHOLE_HEAD_DIM:
        return "tl"
    return "turned"


def rotary_overlap_items(Nk: int, block_n: int, item_steps: int) -> int:
    """K items of one kv head in gluon_forward.forward with K turned inside the launch: ``item_steps`` ring steps
    of 2 ``block_n`` rows each."""
    return cdiv(Nk, 2 * block_n * item_steps)


def rotary_overlap_table(N: int, Nk: int, B: int, H: int, Hkv: int, tile_rows: int, block_n: int, causal: bool,
                         head_group: int, programs: int, item_steps: int, lead: int, item_cost: float,
                         overhead_steps: int) -> torch.Tensor:
    """The schedule table (schedule.balanced_schedule's) of gluon_forward.forward with K turned inside the launch:
    the forward's tiles (ids 0 .. T - 1, head-grouped as the kernel numbers them) and the K items (id T + u I +
    part: kv head u = b Hkv + kv head, I = rotary_overlap_items) in one sequence, a head's items placed before
    the tile ``lead`` tiles ahead of its first (the heads of the first ``lead`` tiles' items first), dealt as the
    balanced schedule deals (rounds of ``programs``, each round's costliest to the least loaded; round-robin where
    that is as even) by cost: a tile's steps + ``overhead_steps`` (attention_configs.TILE_OVERHEAD_STEPS), an item's steps x
    ``item_cost``. Every switch it reads is an argument (the device tables' cache keeps it across patched blocks). Each
    program's items in the sequence's order, and every item waits only on items before it (the kernel's
    deadlock argument: gluon_forward.KTurn)."""
    m_blocks = cdiv(N, tile_rows)
    tiles = m_blocks * B * H
    bh = head_grouped_tiles(tiles, m_blocks, B * H, head_group)[0]
    if causal:  # gluon_kernels.query_tile: blocks count from the last row
        steps = causal_steps(True, N, Nk, tile_rows, block_n, B * H, head_group) + 1
    else:
        steps = torch.full((tiles,), cdiv(Nk, block_n) + 1)
    tile_cost = (steps + overhead_steps).tolist()
    kv = ((bh // H) * Hkv + (bh % H) // (H // Hkv)).tolist()
    per_head = rotary_overlap_items(Nk, block_n, item_steps)
    last_steps = cdiv(Nk, 2 * block_n) - (per_head - 1) * item_steps
    first_use: dict = {}
    for x, u in enumerate(kv):
        first_use.setdefault(u, x)
    heads = sorted(first_use, key=first_use.get)
    ids, costs, h = [], [], 0
    for x in range(tiles):
        while h < len(heads) and first_use[heads[h]] <= x + lead:
            for part in range(per_head):
                ids.append(tiles + heads[h] * per_head + part)
                costs.append(item_cost * (item_steps if part < per_head - 1 else last_steps))
            h += 1
        ids.append(x)
        costs.append(tile_cost[x])
    table = balanced_schedule(torch.tensor(costs), programs)
    if table is None:
        table = dealt_schedule([[x] for x in range(len(ids))], programs)
    table = table.clone()
    table[programs + 1:-1] = torch.tensor(ids, dtype=torch.int32)[table[programs + 1:-1].long()]
    return table


def rotary_overlap_schedule(q, k, cfg: dict, causal: bool, head_group: int, programs: int):
    """(table on q's device, K items a kv head) for gluon_forward.forward with K turned inside the launch, or None
    where it is not taken: (D, causal) not in configs.ROTARY_K_OVERLAP_CASES, a carried configuration, a k (not yet
    turned) that no TMA descriptor describes, or no table (a CUDA graph captured before the shape ran once:
    causal_schedule)."""
    B, H, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if (D, bool(causal)) not in configs.ROTARY_K_OVERLAP_CASES or cfg.get("carry") or not tma_describable(k):
        return None
    steps, block_n = configs.ROTARY_K_OVERLAP_ITEM_STEPS, cfg["block_n"]
    lead = int(configs.ROTARY_K_OVERLAP_LEAD * programs)
    table = causal_schedule(q.device, N, Nk, B, H, Hkv, cfg["block_m"] * cfg.get("consumers", 2), block_n,
                            bool(causal), head_group, programs, steps, lead, float(configs.ROTARY_K_OVERLAP_ITEM_COST),
                            attention_configs.TILE_OVERHEAD_STEPS, build=rotary_overlap_table, whole_key=True)
    return None if table is None else (table, rotary_overlap_items(Nk, block_n, steps))
