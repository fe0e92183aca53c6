"""The split-key (decode) path's plan: which inputs it serves (decode_fits: few queries a sequence,
any device), its tiles of packed (query, q head) rows, and the key ranges it splits the keys into
(decode_splits, key_ranges): decode_plan's Plan. attention's plan.py routes to it and carries the Plan's
fields in its own (path "decode", keys_per_split in its sizes), which launch.launch_decode runs."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tilecore import dispatch
from tilecore.ops.attention_decode import configs
from tilecore.tiles.launch import cdiv, next_power_of_2, tma_describable


def decode_fits(q, k) -> bool:
    """Whether the split-key path serves these inputs (few queries a sequence; any device)."""
    b, hq, n = q.shape[:3]
    group = hq // k.shape[1]
    few_query_tiles = n <= configs.DECODE_FEW_TILES_MAX_QUERIES and b * hq * cdiv(n, 128) <= configs.DECODE_FEW_QUERY_TILES
    return (n <= configs.DECODE_MAX_QUERIES or few_query_tiles
            or (n <= configs.DECODE_MAX_PACKED_QUERIES and n * group <= configs.DECODE_MAX_PACKED_ROWS))


def gluon_fits(q, k, v) -> str | None:
    """None where Hopper's Gluon split-key kernel (gluon_decode.py) takes these inputs; else why not."""
    d, dv = q.shape[-1], v.shape[-1]
    if d != dv or d not in configs.DECODE_GLUON_HEAD_DIMS:
        return f"head dims {configs.DECODE_GLUON_HEAD_DIMS} with v's as q's (got {d} and {dv})"
    if q.dtype not in (torch.bfloat16, torch.float16) or not q.dtype == k.dtype == v.dtype:
        return f"bfloat16 or float16 q, k and v of one dtype (got {q.dtype}, {k.dtype}, {v.dtype})"
    if k.shape[2] == 0 or q.numel() == 0:
        return f"at least one key and one query (got {k.shape[2]} keys, q of shape {tuple(q.shape)})"
    if not (tma_describable(k) and tma_describable(v)):
        return "k and v a TMA descriptor can describe (unit last stride, 16-byte aligned base and strides)"
    if not dispatch.gluon_ok(q.device):
        return f"a Hopper GPU under a triton the Gluon kernels were checked under (got {q.device})"
    return None


def gluon_rows(rows: int, cfg: dict) -> int:
    """The Gluon kernel's tile rows for a kv head's ``rows`` packed rows: the config's ROWS, else 16 (mma.sync) where
    they fit, else 64 (wgmma)."""
    if cfg.get("ROWS") is not None:
        if cfg["ROWS"] not in (configs.DECODE_GLUON_SMALL_ROWS, configs.DECODE_GLUON_ROWS):
            raise ValueError(f"attention decode: the Gluon kernel's ROWS is {configs.DECODE_GLUON_SMALL_ROWS} or "
                             f"{configs.DECODE_GLUON_ROWS}, got {cfg['ROWS']}")
        return cfg["ROWS"]
    return configs.DECODE_GLUON_SMALL_ROWS if rows <= configs.DECODE_GLUON_SMALL_ROWS else configs.DECODE_GLUON_ROWS


def split_kernel(q, k, v, cfg: dict) -> dict:
    """The config the split-key launch runs: ``cfg`` with kernel "gluon" (decode_gluon_config's: the Gluon kernel,
    refused with the reason where it does not fit) or "tl" (the tl kernel, the key dropped) as given; a tl config
    without a kernel as it is (decode_plan may replace the table's row by the Gluon kernel's)."""
    kernel = cfg.get("kernel")
    if kernel == "gluon":
        if (why := gluon_fits(q, k, v)) is not None:
            raise ValueError(f"attention decode: the Gluon split-key kernel takes {why}")
        return cfg
    if kernel == "tl":
        return {key: value for key, value in cfg.items() if key != "kernel"}
    if kernel is not None:
        raise ValueError(f"attention decode: kernel 'gluon' or 'tl', got {kernel!r}")
    return cfg


@dataclass(frozen=True)
class Plan:
    """One split-key launch: the kernel's ``config`` (tl: the table's BLOCK_N, warps and stages;
    Gluon: kernel "gluon", BLOCK_N, STAGES and PROGRAMS, its persistent grid; both: the tile's BLOCK_M
    packed (query, q head) rows), its tiles' ``grid`` (batch x kv head, key range, row block) and the
    keys of each range (``keys_per_split``, whole blocks of BLOCK_N)."""
    config: dict
    grid: tuple
    keys_per_split: int

    @property
    def splits(self) -> int:
        """The key ranges (the grid's second axis; 1: no merge)."""
        return self.grid[1]


def decode_plan(q, k, cfg: dict, splits: int | None, v=None, sms: int | None = None) -> Plan:
    """The split-key launch's Plan for these inputs with the config ``cfg`` (the kernel: split_kernel): BLOCK_M
    rows of packed (query, q head) rows a tile, the keys cut into ``splits`` ranges (None: as many as fill
    DECODE_PROGRAMS_PER_SM programs on ``sms`` SMs, decode_splits), the grid (batch x kv head, range, row
    block); the Gluon kernel's persistent grid (PROGRAMS) one program a tile up to ``sms`` (every tile where
    ``sms`` is None). The table's tl row (attention's plan passes it where no config was given) becomes the Gluon
    kernel's where configs.decode_gluon_default rules so for the tl plan's tiles and the inputs fit. attention's
    plan_forward carries it in its Plan."""
    B, Hq, N, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    Dv = D if v is None else v.shape[3]
    given_cfg, given_splits = cfg, splits
    cfg = split_kernel(q, k, k if v is None else v, cfg)
    gluon = cfg.get("kernel") == "gluon"
    block_n = cfg["BLOCK_N"]
    # a 64 x 512 float32 accumulator would spill: fewer rows a tile past head dim 256
    most_rows = configs.DECODE_MAX_ROWS if Dv <= configs.DECODE_WHOLE_HEAD_DIM else configs.DECODE_MAX_ROWS_LARGE_DV
    block_m = gluon_rows(N * (Hq // Hkv), cfg) if gluon else tile_rows(N, Hq // Hkv, most_rows)
    row_blocks = cdiv(N * (Hq // Hkv), block_m)
    if splits is None:
        programs = configs.DECODE_PROGRAMS_PER_SM * sms
        splits = decode_splits(B * Hkv * row_blocks, Nk, block_n, programs, configs.DECODE_MIN_SPLIT_KEYS)
    elif not 1 <= splits <= configs.DECODE_MAX_SPLITS:
        raise ValueError(f"attention decode: splits must be from 1 to {configs.DECODE_MAX_SPLITS}, got {splits}")
    splits, keys_per_split = key_ranges(Nk, splits, block_n)
    config = dict(cfg, BLOCK_M=block_m)
    tiles = B * Hkv * splits * row_blocks
    if gluon:  # a persistent grid: at most one program an SM (a ring of 128-192 KiB)
        config["PROGRAMS"] = max(1, min(tiles, sms or tiles))
    elif (sms and "kernel" not in given_cfg and given_cfg == configs.decode_config(max(D, Dv), False)
          and configs.decode_gluon_default(max(D, Dv), tiles, configs.DECODE_PROGRAMS_PER_SM * sms, keys_per_split)
          and gluon_fits(q, k, k if v is None else v) is None):
        return decode_plan(q, k, configs.decode_gluon_config(max(D, Dv)), given_splits, v, sms)
    return Plan(config, (B * Hkv, splits, row_blocks), keys_per_split)


def tile_rows(queries: int, group: int, most: int = configs.DECODE_MAX_ROWS) -> int:
    """BLOCK_M of the split-key kernel: a kv head's packed rows (queries x group), as a power of
    two from 16 (tl.dot's smallest) to ``most`` (DECODE_MAX_ROWS)."""
    return max(16, min(most, next_power_of_2(queries * group)))


def key_ranges(nk: int, splits: int, block_n: int) -> tuple[int, int]:
    """(ranges, keys in each) of ``nk`` keys cut into at most ``splits`` ranges of whole blocks of
    ``block_n`` keys (at least one range, if empty: no key at all)."""
    keys_per_split = cdiv(cdiv(max(nk, 1), max(splits, 1)), block_n) * block_n
    return max(1, cdiv(nk, keys_per_split)), keys_per_split


def decode_splits(tiles: int, nk: int, block_n: int, programs: int, min_keys: int) -> int:
    """How many key ranges to split ``nk`` keys into, for ``tiles`` tiles (batch x kv head x row
    blocks): as many as keep the launch within ``programs`` programs (at least one), none with fewer
    than ``min_keys`` keys (or one block of ``block_n``), at most DECODE_MAX_SPLITS."""
    most = min(configs.DECODE_MAX_SPLITS, cdiv(max(nk, 1), max(min_keys, block_n)))
    return key_ranges(nk, min(most, max(1, programs // tiles)), block_n)[0]
