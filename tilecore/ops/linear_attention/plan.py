"""Which implementation runs a linear-attention pass, with which blocks: every fit check in one place.

Paths: "tl" (kernels_tl.py: CUDA tensors, and CPU tensors through Triton's interpreter) and "cpu"
(chunked.py on torch's CPU ops in float32, when the interpreter is off).
"""
from __future__ import annotations

import dataclasses

import torch
import triton.language as tl

from tilecore import dispatch
from tilecore.ops.linear_attention import configs
from tilecore.tiles.launch import cdiv, next_power_of_2

NO_DECAY, SCALAR_DECAY, CHANNEL_DECAY = 0, 1, 2
IDENTITY, BASED = 0, 1


@dataclasses.dataclass(frozen=True)
class Plan:
    path: str  # "tl" | "cpu"
    chunk: int
    config: dict = dataclasses.field(default_factory=dict)  # the kernels' block sizes and options


def decay_kind(g: torch.Tensor | None) -> int:
    return NO_DECAY if g is None else (SCALAR_DECAY if g.dim() == 3 else CHANNEL_DECAY)


def block(d: int) -> int:
    """A head dimension padded to a power of two >= 16 (tl.dot's smallest)."""
    return max(16, next_power_of_2(d))


def mma_dtype(dtype: torch.dtype, device: torch.device):
    """The dtype tl.dot's operands are cast to: the input's own (float32 with IEEE products), but float32
    for bfloat16 in the interpreter (whose bf16 tl.dot is wrong; the upcast is exact)."""
    if dtype == torch.float16:
        return tl.float16, False
    if dtype == torch.bfloat16 and not dispatch.interpreted(device):
        return tl.bfloat16, False
    return tl.float32, True


def channel_diag(kind: int) -> int:
    """The kernels' DIAG: configs.CHANNEL_FWD_DIAG (3, 4: the forward's one reference a chunk, which the
    backward kernels read as 0; + 2 with configs.CHANNEL_BWD_FACTORED: 5, 6, the backward's intra-chunk terms
    factored the same way) where it is on for per-channel decay, else configs.CHANNEL_DIAG."""
    if kind == CHANNEL_DECAY and configs.CHANNEL_FWD_DIAG and configs.CHANNEL_DIAG == 0:
        return configs.CHANNEL_FWD_DIAG + (2 if configs.CHANNEL_BWD_FACTORED else 0)
    return configs.CHANNEL_DIAG


def shared_fit(device: torch.device) -> dict:
    """configs.SHARED_FITS's caps for ``device`` (none where its blocks get enough shared memory, or no limit: the
    CPU, the interpreter); a GPU below every row gets dispatch's RuntimeError naming the op."""
    return dispatch.shared_memory_fit(device, configs.SHARED_FITS, "linear_attention")


def plan(q: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None, feature: int, chunk: int | None = None) -> Plan:
    """The blocks of the forward, backward and step kernels for these inputs (q (B, N, Hqk, Dk), v (B, N,
    H, Dv), log decay g or None); ``chunk`` overrides configs.CHUNK."""
    if dispatch.backend_for(q.device) == "reference":
        return Plan("cpu", chunk or configs.CHUNK[decay_kind(g)])
    return tl_plan(q, v, g, feature, chunk)


def tl_plan(q: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None, feature: int, chunk: int | None = None,
            **overrides) -> Plan:
    """The tl kernels' plan (also for a compile report on a machine without a GPU). ``overrides``: the
    config's BT_BWD, BV, BVB, BKQ, BKB, KB, num_warps, num_stages, step_warps, step_bv (experiments/linear_attention
    sweeps them; fwd_warps, fwd_stages: the forward's alone; fwd_gluon, gluon_stages: the Gluon forward's;
    fwd_gluon_based, gluon_based_stages: Based's Gluon forward's; fwd_gluon_gla, gluon_gla_stages: the GLA
    forward's)."""
    kind = decay_kind(g)
    chunk_given = bool(chunk)
    dk, dv = q.shape[-1], v.shape[-1]
    if not chunk and kind == CHANNEL_DECAY and max(dk, dv) > configs.CHANNEL_WIDE:
        chunk = configs.CHANNEL_WIDE_CHUNK
    chunk = chunk or configs.CHUNK[kind]
    BK, BVF = block(dk), block(dv)
    mma, ieee = mma_dtype(q.dtype, q.device)
    state_rows = BK * BK if feature == BASED else BK
    BV = min(BVF, max(16, next_power_of_2(configs.STATE_ELEMS // state_rows + 1) // 2))
    KB = min(BK, max(1, configs.CHANNEL_SLICE_ELEMS // (chunk * configs.CHANNEL_SUB)))
    if feature == BASED:
        BKQ = BKB = BK
    else:
        BKQ = min(BK, max(16, next_power_of_2(configs.STATE_ELEMS // BVF + 1) // 2))
        BKB = BK
        if kind == CHANNEL_DECAY:  # their [BT, BT, block] products are elementwise
            BKQ = BKB = configs.CHANNEL_BWD_KEY_BLOCK
    # the interpreter's bf16 tl.dot and its float32 -> bf16 conversion are wrong: bf16 inputs run on their
    # exact float32 upcast there, the results rounded once by torch (launch.py)
    upcast = q.dtype == torch.bfloat16 and dispatch.interpreted(q.device)
    # the dK/dV kernel holds more than the forward (dS, dk and dv, Based's expanded q and k): without
    # spilling (sm_90a, 8 warps) Based's took chunks of 16 and 32 value columns, Dk = 256 key blocks of
    # 128 and 32 value columns (configs.py)
    BT_BWD, BVB = chunk, BV
    if feature == BASED:
        BT_BWD, BVB = min(chunk, configs.BASED_BWD_CHUNK), min(BVF, configs.BASED_BWD_BV)
    elif kind != CHANNEL_DECAY and BK > configs.BWD_KEY_BLOCK:
        BKB, BVB = configs.BWD_KEY_BLOCK, min(BVF, configs.WIDE_BWD_BV)
    # the backward's blocks from the sweep (H100, B16 H16 N4096, Dk = Dv = 128): chunks of 64
    # and a head's every key channel a dQ program, every value column a dK/dV one (configs.BWD_*)
    bwd_warps = configs.NUM_WARPS
    if feature == BASED:
        bwd_warps = configs.BASED_BWD_WARPS
    elif kind in configs.BWD_BLOCK_KINDS and BK <= configs.BWD_KEY_BLOCK and BK * BVF <= configs.BWD_STATE_ELEMS:
        BT_BWD = chunk if chunk_given else configs.BWD_CHUNK
        BKQ, BVB = BK, BVF
        bwd_warps = configs.BWD_WARPS[kind]
    # the forward's own value block, warps and stages (configs.FWD_*: swept on the GPU); per-channel decay
    # keeps the backward's
    fwd_warps, fwd_stages = configs.NUM_WARPS, configs.NUM_STAGES
    if kind != CHANNEL_DECAY:
        fwd_warps = configs.FWD_WARPS
        if feature == BASED:
            BV, fwd_stages = min(BVF, configs.BASED_FWD_BV), configs.BASED_FWD_STAGES
        else:
            BV, fwd_stages = min(BVF, max(16, configs.FWD_STATE_ELEMS // BK)), configs.FWD_STAGES[kind]
    # per-channel decay's factored forward (diag 3, 4) at its own blocks where configs say (its chunk is the
    # forward's alone: the backward keeps BT_BWD), unless the caller chose the chunk
    fwd_chunk = chunk
    fwd_blocks = configs.CHANNEL_FWD_BLOCKS
    if kind == CHANNEL_DECAY and channel_diag(kind) >= 3 and fwd_blocks and not chunk_given and BK <= 128:
        fwd_chunk, fwd_warps, fwd_stages = fwd_blocks["BT"], fwd_blocks["warps"], fwd_blocks["stages"]
        BV = min(BVF, fwd_blocks["BV"])
        # a GPU whose blocks get less shared memory (configs.SHARED_FITS): fewer stages
        fwd_stages = min(fwd_stages, shared_fit(q.device).get("channel_fwd_stages", fwd_stages))
    # the Gluon forward on Hopper (launch.forward runs it where gluon_forward.fits takes the tensors)
    fwd_gluon = (configs.GLUON_FORWARD and (kind, BK) in configs.GLUON_CHECKED and feature != BASED
                 and not dispatch.interpreted(q.device) and dispatch.gluon_ok(q.device))
    # the GLA forward's Gluon kernel (gluon_gla_forward.py; launch.forward runs it where its fits takes the tensors)
    fwd_gluon_gla = (configs.GLUON_GLA and kind == CHANNEL_DECAY and feature != BASED and BK in (64, 128)
                     and not dispatch.interpreted(q.device) and dispatch.gluon_ok(q.device))
    # Based's Gluon forward (gluon_based.py; launch.forward runs it where gluon_based.fits takes the tensors)
    fwd_gluon_based = (configs.GLUON_BASED and feature == BASED and kind == NO_DECAY
                       and not dispatch.interpreted(q.device) and dispatch.gluon_ok(q.device))
    cfg = dict(BT=fwd_chunk, BT_BWD=BT_BWD, BK=BK, BV=BV, BVB=BVB, BVF=BVF, KB=KB, BKQ=BKQ, BKB=BKB, MMA=mma,
               IEEE=ieee, upcast=upcast, num_warps=bwd_warps, num_stages=configs.NUM_STAGES,
               fwd_warps=fwd_warps, fwd_stages=fwd_stages, fwd_gluon=fwd_gluon, gluon_stages=configs.GLUON_STAGES,
               fwd_gluon_based=fwd_gluon_based, fwd_gluon_gla=fwd_gluon_gla, gluon_gla_stages=configs.GLUON_GLA_STAGES,
               gluon_based_stages=configs.GLUON_BASED_STAGES,
               step_warps=configs.STEP_WARPS, step_bv=configs.STEP_BV, diag=channel_diag(kind),
               based_sym=feature == BASED and configs.BASED_BWD_SYM)
    unknown = set(overrides) - {"BT_BWD", "BV", "BVB", "BKQ", "BKB", "KB", "num_warps", "num_stages",
                                "fwd_warps", "fwd_stages", "fwd_gluon", "gluon_stages", "fwd_gluon_based",
                                "gluon_based_stages", "fwd_gluon_gla", "gluon_gla_stages", "step_warps", "step_bv",
                                "diag", "combine", "based_sym"}
    if unknown:
        raise ValueError(f"tl_plan: unknown overrides {sorted(unknown)}")
    # num_warps and num_stages set every pass's (the forward's too, unless fwd_* say otherwise)
    cfg.update({f"fwd_{key.removeprefix('num_')}": val for key, val in overrides.items()
                if key in ("num_warps", "num_stages")})
    cfg.update(overrides)
    if feature == BASED and (cfg["BKQ"] != BK or cfg["BKB"] != BK):
        raise ValueError("tl_plan: Based's kernels take its 16 channels in one block (BKQ = BKB = 16)")
    cfg.update(value_blocks=cdiv(dv, cfg["BV"]), key_blocks=cdiv(dk, cfg["BKQ"]), dkv_key_blocks=cdiv(dk, cfg["BKB"]),
               dkv_value_blocks=cdiv(dv, cfg["BVB"]))
    return Plan("tl", chunk, cfg)
