"""Which kernel serves an FP8 attention call (``plan``) and its launch (``forward``).

Paths, the first that fits: "emulate" for CPU tensors without Triton's interpreter (reference.py's
float32 emulation of the kernels' math, torch's CPU ops); "gluon", Hopper's kernel (gluon_fp8.py) at
head dim 64 or 128; else "tl" (kernels_tl.py: any GPU with e4m3 tensor cores, sm_89 on, and the
interpreter).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import torch

from tilecore import dispatch
from tilecore.ops.attention_fp8 import configs, kernels_tl
from tilecore.ops.attention_fp8.reference import (P_SHIFT, SCALE_BLOCK, attention_fp8_emulated, check_rescale,
                                                  keys_permuted, keys_unpermuted)
from tilecore.tiles.launch import (LRU, CachedLaunch, KeyedLaunch, TmaOperand, next_power_of_2, signature,
                                   tma_describable)
from tilecore.tiles.ops import LOG2E

TL_FWD = CachedLaunch(kernels_tl.attn_fp8_fwd)
GLUON_FWD = CachedLaunch(lambda: importlib.import_module("tilecore.ops.attention_fp8.gluon_fp8").attention_fp8_fwd_kernel)


@dataclass(frozen=True)
class Plan:
    path: str  # "gluon", "tl" or "emulate"
    config: dict = field(default_factory=dict)


def plan(q, k, causal: bool, *, path: str | None = None, config: dict | None = None) -> Plan:
    """The call's plan; ``path`` and ``config`` force them (tests, probes)."""
    D = q.shape[-1]
    if path is None:
        path = ("emulate" if dispatch.backend_for(q.device) == "reference" else
                "gluon" if D in configs.GLUON_FORWARD and dispatch.gluon_ok(q.device) else "tl")
    if path == "emulate":
        return Plan(path)
    if path == "gluon":
        return Plan(path, dict(config or configs.gluon_config(D, causal)))
    return Plan(path, dict(config or configs.tl_config(D, dispatch.interpreted(q.device))))


def scale_operand(scale: torch.Tensor, rows: int) -> tuple[torch.Tensor, bool, int, int]:
    """A descale as the kernels take it: (float32 contiguous values, per row?, scales a head,
    rows a scale): (B, H) -> one a head; (B, H, ceil(rows / SCALE_BLOCK)) -> a block of SCALE_BLOCK
    rows each; (B, H, rows) -> one a row."""
    values = scale.to(torch.float32).contiguous()
    if scale.dim() == 2:
        return values, False, 1, 1
    n = scale.shape[2]
    return values, True, n, 1 if n == rows else SCALE_BLOCK


def forward(p: Plan, q, k, v, q_scale, k_scale, v_scale, causal: bool, softmax_scale: float,
            out_dtype: torch.dtype, v_permuted: bool = False, out: torch.Tensor | None = None,
            lse: torch.Tensor | None = None, key=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(O (B, Hq, N, D) in out_dtype, lse (B, Hq, N) float32), both contiguous (into ``out`` and ``lse``
    where given: the kernel paths), by plan ``p``. ``v``: (B, Hkv, Nk, D), or with ``v_permuted`` the
    Hopper kernel's layout (reference.keys_permuted). ``key``: the call's launch key (op.py: its signature,
    with fresh ``out`` and ``lse`` and ``p`` its plan), or None."""
    Nk = k.shape[2]
    if p.path == "emulate":
        if v_permuted:
            v = keys_unpermuted(v, Nk)
        return attention_fp8_emulated(q, k, v, q_scale, k_scale, v_scale, causal=causal, softmax_scale=softmax_scale,
                                      out_dtype=out_dtype)
    B, H, N, D = q.shape
    Hkv = k.shape[1]
    out = torch.empty((B, H, N, D), dtype=out_dtype, device=q.device) if out is None else out
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device) if lse is None else lse
    qs, q_per_row, q_n, q_rows = scale_operand(q_scale, N)
    ks, k_per_row, k_n, k_rows = scale_operand(k_scale, Nk)
    vs = v_scale.to(torch.float32).contiguous()
    v_n = v_scale.shape[2] if v_scale.dim() == 3 else 1  # v's descales per block of SCALE_BLOCK keys
    cfg = dict(p.config)  # (the tl path pops UPCAST)
    if p.path == "tl":
        check_rescale(cfg.get("RESCALE_TAU", 0.0), cfg.get("P_SHIFT", P_SHIFT))
        D_PAD = max(32, next_power_of_2(D))  # e4m3 dots take K >= 32
        # v's strides in (B, H, keys, D) order (the permuted layout is (B, H, D, keys))
        v_strides = (v.stride(0), v.stride(1), v.stride(3), v.stride(2)) if v_permuted else v.stride()
        TL_FWD.run(key, kernels_tl.grid(B * H, N, cfg["BLOCK_M"]), (
            q, k, v, out, lse, qs, ks, vs, *q.stride(), *k.stride(), *v_strides, *out.stride(),
            H, N, Nk, D, H // Hkv, softmax_scale * LOG2E, q_n, q_rows, k_n, k_rows), dict(
            v_n_scales=v_n, CAUSAL=causal, Q_PER_ROW=q_per_row, K_PER_ROW=k_per_row, UPCAST=cfg.pop("UPCAST", False),
            PERMUTED_V=v_permuted, BLOCK_D=D_PAD, V_PER_BLOCK=v_scale.dim() == 3, **cfg))
        return out, lse
    layout = _GLUON_LAYOUTS.memo(key, lambda: _GluonLayout(q, k, cfg, causal, q_per_row, k_per_row, k_n, k_rows,
                                                           v_scale.dim() == 3))
    q = q if layout.q_describable else q.contiguous()
    k = k if layout.k_describable else k.contiguous()
    vt = v if v_permuted else keys_permuted(v)  # (B, Hkv, D, keys padded to 32), keys permuted in 32s
    block_m, block_n = layout.block_m, layout.block_n
    grid, head_group, schedule = _TILINGS.memo(key, lambda: _tiling(q, k, block_m * layout.consumers, block_n, causal))
    args = (TmaOperand(q, [1, 1, block_m, D]), TmaOperand(k, [1, 1, block_n, D]), TmaOperand(vt, [1, 1, D, block_n]),
            TmaOperand(out, [1, 1, block_m, D]), lse, qs, ks, vs, H, N, Nk, H // Hkv, softmax_scale * LOG2E, q_n, q_rows,
            k_n, k_rows, B * H, head_group, schedule, v_n)
    options = layout.options
    # launched by the call's signature (its inputs' shapes, strides, dtypes, alignment and the options
    # determine every argument's specialization; vt, out and lse are fresh or the inputs): ~10 us a call
    if key is None:  # (the op's key: its inputs' signature, whose plan is p)
        key = signature("attention_fp8", q, k, vt, out, q_scale, k_scale, v_scale, causal, tuple(sorted(cfg.items())))
    GLUON_FWD.run(key, grid, args, options)  # on the device of q's descriptor; by key unless signature gave none
    return out, lse


class _Fp8Launch:
    """forward's Gluon path for one launch key (issue 31's host time): the kernel's KeyedLaunch with its
    four descriptors as tensors (their views and boxes are the key's: KeyedLaunch's operands, encoded once per
    address), the launch's other arguments the key fixes, and which descales are float32 and contiguous already;
    a call then allocates O and lse and launches. ``of`` gives False where there is no Gluon plan."""

    __slots__ = ("launch", "tail", "ready", "describable", "permuted", "out_shape", "out_dtype", "device")

    @classmethod
    def of(cls, p: Plan, q, k, v, q_scale, k_scale, v_scale, causal: bool, softmax_scale: float, out_dtype,
           v_permuted: bool, key):
        if p.path != "gluon":
            return False
        layout = _GLUON_LAYOUTS.get(key)
        tiling = _TILINGS.get(key)
        if layout is None or tiling is None:
            return False
        self = cls()
        B, H, N, D = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        _, q_per_row, q_n, q_rows = scale_operand(q_scale, N)
        _, k_per_row, k_n, k_rows = scale_operand(k_scale, Nk)
        grid, head_group, schedule = tiling
        bm, bn = layout.block_m, layout.block_n
        v_n = v_scale.shape[2] if v_scale.dim() == 3 else 1
        self.tail = (H, N, Nk, H // Hkv, softmax_scale * LOG2E, q_n, q_rows, k_n, k_rows, B * H, head_group, schedule,
                     v_n)
        self.launch = KeyedLaunch(GLUON_FWD, key, grid, layout.options, operands={
            0: lambda t: TmaOperand(t, [1, 1, bm, D]), 1: lambda t: TmaOperand(t, [1, 1, bn, D]),
            2: lambda t: TmaOperand(t, [1, 1, D, bn]), 3: lambda t: TmaOperand(t, [1, 1, bm, D])})
        # scale_operand's float32 contiguous copy is the descale itself where it is so already (the key's dtype
        # and strides)
        self.ready = tuple(s.dtype == torch.float32 and s.is_contiguous() for s in (q_scale, k_scale, v_scale))
        self.describable = (layout.q_describable, layout.k_describable)
        self.permuted = v_permuted
        self.out_shape, self.out_dtype, self.device = (B, H, N, D), out_dtype, q.device
        return self

    def __call__(self, q, k, v, q_scale, k_scale, v_scale) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.empty(self.out_shape, dtype=self.out_dtype, device=self.device)
        lse = torch.empty(self.out_shape[:3], dtype=torch.float32, device=self.device)
        ready = self.ready
        qs = q_scale if ready[0] else q_scale.to(torch.float32).contiguous()
        ks = k_scale if ready[1] else k_scale.to(torch.float32).contiguous()
        vs = v_scale if ready[2] else v_scale.to(torch.float32).contiguous()
        q = q if self.describable[0] else q.contiguous()
        k = k if self.describable[1] else k.contiguous()
        vt = v if self.permuted else keys_permuted(v)
        self.launch((q, k, vt, out, lse, qs, ks, vs, *self.tail))
        return out, lse


_FP8_LAUNCHES = LRU(256)  # an op call's launch key -> its _Fp8Launch (False: forward's general path)


def prepared(key, p: Plan, q, k, v, q_scale, k_scale, v_scale, causal: bool, softmax_scale: float, out_dtype,
             v_permuted: bool):
    """The key's _Fp8Launch, made after its first call (forward's general path made its layout and tiling), or
    None / False where there is none yet or none at all."""
    recipe = _FP8_LAUNCHES.get(key)
    if recipe is None and key in _GLUON_LAYOUTS:
        recipe = _Fp8Launch.of(p, q, k, v, q_scale, k_scale, v_scale, causal, softmax_scale, out_dtype, v_permuted,
                               key)
        _FP8_LAUNCHES.put(key, recipe)
    return recipe


_TILINGS = LRU(256)  # an op call's launch key -> _tiling's (a function of its shapes and device)
_GLUON_LAYOUTS = LRU(256)  # an op call's launch key -> its _GluonLayout


class _GluonLayout:
    """The Gluon path's settings that a call's launch key fixes (whether q and k are TMA-describable as
    they are, the tiles and the kernel's options): made once per key, each call where there is none."""

    __slots__ = ("q_describable", "k_describable", "block_m", "block_n", "consumers", "options")

    def __init__(self, q, k, cfg, causal, q_per_row, k_per_row, k_n, k_rows, v_per_block=False, q_rotate=False,
                 q_reg=False):
        unknown = set(cfg) - configs.GLUON_KEYS
        if unknown:  # a variant's key: the kernel has only what the shipped configs use (issue 30)
            raise ValueError(f"attention_fp8: config keys {sorted(unknown)} are not the Gluon kernel's (the variants "
                             "that were tried and left off live at commit 741bc3b: notes/attention_fp8/README.md)")
        self.q_describable, self.k_describable = tma_describable(q), tma_describable(k)
        self.block_m, self.block_n, self.consumers = cfg["block_m"], cfg["block_n"], cfg["consumers"]
        # k's descales per block of block_n keys: one scalar a step (k_block_scalar; else the per-key path)
        k_per_block = k_per_row and k_rows == self.block_n and k_n == -(-k.shape[2] // self.block_n) \
            and cfg.get("k_block_scalar", True)
        self.options = dict(
            CAUSAL=causal, Q_PER_ROW=q_per_row, K_PER_ROW=k_per_row and not k_per_block, STAGES=cfg["stages"],
            CONSUMERS=self.consumers, Q_BUFFERS=cfg.get("q_buffers", 1), K_PER_BLOCK=k_per_block,
            P_SHIFT=float(cfg.get("p_shift", P_SHIFT)), P_LINEAR=int(cfg.get("p_linear", 0)), num_warps=4)
        if causal and cfg.get("hide_first_key", False):  # a tile's first key offset hidden from LLVM (gluon_fp8)
            self.options["HIDE_FIRST_KEY"] = True
        if causal and cfg.get("mask32", False):  # the causal mask as one 32-bit comparison an element (gluon_fp8)
            self.options["MASK32"] = True
        if cfg.get("serial", False):  # a step's P V in that step (gluon_fp8's SERIAL; three consumers need it)
            if cfg["serial"] not in (1, 2):
                raise ValueError(f"attention_fp8: serial must be 0, 1 or 2; got {cfg['serial']!r}")
            self.options["SERIAL"] = int(cfg["serial"])
        if cfg.get("q_last_buffers"):  # the last consumer's Q buffers, where not q_buffers (gluon_fp8)
            self.options["Q_LAST_BUFFERS"] = int(cfg["q_last_buffers"])
        if v_per_block:  # v's descales per block of 128 keys: one a step (the kernel's steps are those blocks)
            if self.block_n != SCALE_BLOCK:
                raise ValueError(f"attention_fp8: v's descales per block of {SCALE_BLOCK} keys need the Gluon "
                                 f"kernel's block_n = {SCALE_BLOCK}; got {self.block_n}")
            self.options["V_PER_BLOCK"] = True
        if q_rotate:  # q in bf16/fp16, rotated and quantized per row in the kernel (forward_q_rotated)
            self.options["Q_ROTATE"] = True
            self.options["Q_PER_ROW"] = True
        if q_reg:  # q's codes kept in registers as S's operand (the rotation's columns permuted)
            if not q_rotate:
                raise ValueError("attention_fp8: q's codes in registers need q rotated in the kernel")
            self.options["Q_REG"] = True
        check_rescale(0.0, self.options["P_SHIFT"])
        if self.options["P_LINEAR"] not in (0, 1):
            raise ValueError(f"attention_fp8: p_linear must be 0 (exp2) or 1 (the codes); got {cfg['p_linear']!r}")


def gluon_options(q, k, config: dict, causal: bool, q_per_row: bool = False, k_per_row: bool = False, k_n: int = 1,
                  k_rows: int = 1, v_per_block: bool = False, q_rotate: bool = False, q_reg: bool = False) -> dict:
    """The Gluon kernel's compile-time options (num_warps among them) that ``forward`` launches a call with: q and k
    the call's (or tensors of their shapes), ``config`` a plan's (configs.gluon_config), the descales' forms as
    scale_operand gives them. For compile probes (experiments/attention_fp8/sass_fp8.py, ptx_shipped.py)."""
    return dict(_GluonLayout(q, k, config, causal, q_per_row, k_per_row, k_n, k_rows, v_per_block, q_rotate,
                             q_reg).options)


def forward_q_rotated(q, signs, k, v, k_scale, v_scale, causal: bool, softmax_scale: float, out_dtype,
                      config: dict | None = None, q_reg: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, lse) of the convenience path with q's rotation and quantization inside Hopper's kernel (the kernel's
    Q_ROTATE): q (B, Hq, N, D) bf16/fp16 as the caller gave it, rotated there by diag(signs) H / sqrt(D) and quantized
    per row (gluon_fp8.AttentionFp8.rotate_q; quantize.rotate_quantize_rows is its twin); k e4m3 (B, Hkv, Nk, D) with
    k_scale's descales (per head, per 128-key block or per key), v e4m3 in the kernel's layout (keys_permuted) with
    v_scale's (per head or per 128-key block). The caller checked the shapes (quantize.attention_fp8_rotated); the
    Gluon path only (D 64 or 128 on Hopper). ``config``: the Gluon config (default rotated_q_config); ``q_reg`` (None:
    the head dims of configs.ROTATED["q_reg"]): q's codes kept in registers as S's operand (the kernel's Q_REG) instead
    of written over its bf16 buffer."""
    if q.numel() == 0 or k.shape[2] == 0:
        out = torch.zeros(q.shape, dtype=out_dtype, device=q.device)
        return out, torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
    return q_rotated_launch(q, signs, k, v, k_scale, v_scale, causal, softmax_scale, out_dtype, config,
                            q_reg)(q, k, v, k_scale, v_scale)


def q_rotated_launch(q, signs, k, v, k_scale, v_scale, causal: bool, softmax_scale: float, out_dtype,
                     config: dict | None = None, q_reg: bool | None = None) -> "QRotatedLaunch":
    """forward_q_rotated's launch for a call of these arguments (q and k non-empty): its key, layout, tiling and the
    arguments the key fixes, made once; calling it with the call's tensors launches (the convenience path's recipe
    keeps it for later calls of its key)."""
    B, H, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    cfg = dict(config or rotated_q_config(D, causal))
    q_reg = D in configs.ROTATED.get("q_reg", ()) if q_reg is None else q_reg
    _, k_per_row, k_n, k_rows = scale_operand(k_scale, Nk)
    # (O and lse: fresh contiguous tensors of q's shape, O in out_dtype: the key names out_dtype; the config's items
    # flattened: signature keys scalars, and gives None, no key, for a tuple)
    key = signature("attention_fp8_q_rotated", q, k, v, out_dtype, k_scale, v_scale, causal,
                    *(x for item in sorted(cfg.items()) for x in item), q_reg)
    layout = _GLUON_LAYOUTS.memo(key, lambda: _GluonLayout(q, k, cfg, causal, True, k_per_row, k_n, k_rows,
                                                           v_scale.dim() == 3, q_rotate=True, q_reg=q_reg))
    q = q if layout.q_describable else q.contiguous()
    k = k if layout.k_describable else k.contiguous()
    tiling = _TILINGS.memo(key, lambda: _tiling(q, k, layout.block_m * layout.consumers, layout.block_n, causal))
    signs = signs.to(device=q.device, dtype=torch.float32).contiguous()
    return QRotatedLaunch(key, layout, tiling, signs, (B, H, N, D), out_dtype, q.device,
                          (H, N, Nk, H // Hkv, softmax_scale * LOG2E, N, 1, k_n, k_rows, B * H))


class QRotatedLaunch:
    """The Gluon kernel's launch with q rotated in it (forward_q_rotated) for one launch key: the key, the kernel's
    options and grid, the rotation's signs and the launch's arguments the key fixes. Called with a call's (q, k, v,
    k_scale, v_scale) it allocates O and lse and launches by the key: (O, lse)."""

    __slots__ = ("key", "layout", "grid", "tail", "signs", "options", "out_shape", "out_dtype", "device")

    def __init__(self, key, layout, tiling, signs, out_shape, out_dtype, device, head):
        grid, head_group, schedule = tiling
        self.key, self.layout, self.grid, self.signs = key, layout, grid, signs
        self.tail = (*head, head_group, schedule)
        self.options = dict(layout.options, signs=signs)  # (signs: a keyword parameter of the kernel)
        self.out_shape, self.out_dtype, self.device = out_shape, out_dtype, device

    def __call__(self, q, k, v, k_scale, v_scale) -> tuple[torch.Tensor, torch.Tensor]:
        B, H, N, D = self.out_shape
        out = torch.empty(self.out_shape, dtype=self.out_dtype, device=self.device)
        lse = torch.empty((B, H, N), dtype=torch.float32, device=self.device)
        layout = self.layout
        q = q if layout.q_describable else q.contiguous()
        k = k if layout.k_describable else k.contiguous()
        ks = k_scale.to(torch.float32).contiguous()
        vs = v_scale.to(torch.float32).contiguous()
        v_n = v_scale.shape[2] if v_scale.dim() == 3 else 1
        block_m, block_n = layout.block_m, layout.block_n
        args = (TmaOperand(q, [1, 1, block_m, D]), TmaOperand(k, [1, 1, block_n, D]), TmaOperand(v, [1, 1, D, block_n]),
                TmaOperand(out, [1, 1, block_m, D]), lse, self.signs, ks, vs, *self.tail, v_n)
        GLUON_FWD.run(self.key, self.grid, args, self.options)
        return out, lse


def rotated_q_config(D: int, causal: bool) -> dict:
    """The Gluon config of the convenience path with q rotated in the kernel: configs.gluon_config with
    configs.ROTATED's ``q_buffers`` (bf16 Q buffers a consumer), ``q_last_buffers`` (the last consumer's, causal) and
    ``stages`` where they name the head dim,
    ``hide_first_key`` and ``mask32`` at ROTATED's head dims where gluon_config does not name them, and three consumers
    with serial steps (ROTATED's ``serial_c3``: head dim -> serial mode) where gluon_config does not name ``serial``."""
    cfg = configs.gluon_config(D, causal)
    cfg["q_buffers"] = configs.ROTATED.get("q_buffers", {}).get(D, cfg["q_buffers"])
    cfg["stages"] = configs.ROTATED.get("stages", {}).get(D, cfg["stages"])
    if causal and D in configs.ROTATED.get("q_last_buffers", {}):  # (full: every consumer has the same keys)
        cfg["q_last_buffers"] = configs.ROTATED["q_last_buffers"][D]
    cfg.setdefault("hide_first_key", D in configs.ROTATED.get("hide_first_key", ()))
    cfg.setdefault("mask32", D in configs.ROTATED.get("mask32", ()))
    c3 = configs.ROTATED.get("serial_c3", {})
    if "serial" not in cfg and D in c3:
        cfg.update(consumers=3, serial=c3[D] if isinstance(c3, dict) else 1)
    return cfg


def _tiling(q, k, tile_rows: int, block_n: int, causal: bool):
    """(grid, head_group, schedule): the bf16 forward's persistent tiling (its plan-level function;
    its K and V counted at one byte an element)."""
    from tilecore.ops.attention.plan import query_tiling

    return query_tiling(q, k, tile_rows, block_n, causal, True)
