"""Predicted over measured: every row of every committed bench JSON (benchmarks/results/**/*.json,
tilecore's rows and the peers'), predicted by the napkin's engine.

Each row becomes a kernel (or two) the engine costs: the op's diagram, the relabelling the
implementation uses where it is known (tilecore's shipped GEMM tiles, flash-decoding splits) or the
engine's own search (the peers), its MMA kind (wgmma, or mma.sync for FlashAttention-2) and schedule.
Attention backward rows go through the backward's own model (backward.py: each implementation's step
chain, dQ, the passes around the kernel); so do the feature run's backwards (`feature_backwards`). The GPU is the H100 preset with two constants measured in the same run
where the file has them: its ceiling (a copy's bandwidth or cuBLAS's bf16 GEMM at 8192^3, which sets
the sustained tensor-core rate) and otherwise the committed runs' figures (`lab_gpu`).

`predict_all()` gives one `Prediction` per row; `table()` the markdown (summary by op, distribution,
every row, every miss over 15% with its named cause); `write_docs()` puts it between markers in
docs/napkin.md. tests/napkin/test_validation_table.py regenerates it and compares it with the file.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from . import models
from .backward import attention_backward_time
from .engine import attention_step_time, derive, group, relabel, stream
from .errors import CapacityError
from .hardware import H100, dtype_bytes

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs" / "napkin.md"
HOST_TIMES = ROOT / "notes" / "host" / "runs" / "host_time_session24_h100.json"
GEMM_CONFIGS = ROOT / "tilecore" / "ops" / "gemm" / "configs.py"

TOLERANCE = 0.15
# fp8 over bf16 tensor-core rate as cuBLAS sustains it on the lent H100: torch._scaled_mm 1,230 and
# torch.matmul 680 TFLOP/s at 8192^3 in one run (shared/anchors.md, 2026-11-22)
FP8_OVER_BF16 = 1230 / 680
# the copy's bandwidth where a file has no copy ceiling: torch copy_ of 1 GiB in copy.json
COPY_BYTES_PER_S = 3002e9
# shared/anchors.md's two ceilings (2026-11-22), for callers that calibrate to one fixed run (ring.py)
CALIBRATION = {"copy_bytes_per_s": 2997e9, "matmul_flops": {"bf16": 680e12}}


@dataclass
class Prediction:
    file: str
    op: str              # gemm, gemm_fp8, attention fwd/bwd, attention-gqa fwd/bwd, decode, hadamard, copy
    series: str
    params: dict
    metric: str
    measured: float      # the row's figure (TFLOP/s or GB/s)
    predicted: float     # the same figure from the predicted time
    measured_s: float
    predicted_s: float
    bound: str
    cause: str = ""      # named where |predicted / measured - 1| > TOLERANCE
    headline: bool = False
    graph: bool = False  # the file's calls were replayed from a CUDA graph (GPU time: no host path)

    @property
    def ratio(self) -> float:
        return self.predicted / self.measured

    @property
    def miss(self) -> float:
        return abs(self.ratio - 1)


# ------------------------------------------------------------------------------------------ inputs
def bench_files(root: Path = RESULTS) -> list:
    """Every committed JSON in the bench format (a list of rows), sorted by path."""
    out = []
    for path in sorted(Path(root).rglob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("rows"), list):
            out.append((path, data))
    return out


def _matmul_ceilings(files) -> list:
    return [d["ceiling"]["value"] for _, d in files
            if d.get("ceiling", {}).get("unit") == "TFLOP/s" and "matmul" in d["ceiling"].get("name", "")]


def lab_gpu(files=None):
    """The H100 preset with the lent H100's measured ceilings: HBM = the 1 GiB copy (copy.json), the
    bf16 tensor rate = the mean of the committed runs' cuBLAS 8192^3 ceilings, fp8 by FP8_OVER_BF16."""
    files = bench_files() if files is None else files
    ceilings = _matmul_ceilings(files) or [680.0]
    bf16 = statistics.fmean(ceilings) * 1e12
    return H100.calibrated(copy_bytes_per_s=COPY_BYTES_PER_S,
                           matmul_flops={"bf16": bf16, "fp16": bf16, "fp8": bf16 * FP8_OVER_BF16},
                           label="lab")


def session_gpu(data: dict, lab):
    """The lab GPU with this file's own ceiling (measured in the same run) where it has one."""
    c = data.get("ceiling") or {}
    if c.get("unit") == "GB/s" and "copy" in c.get("name", ""):
        return lab.calibrated(copy_bytes_per_s=c["value"] * 1e9, label="lab")
    if c.get("unit") == "TFLOP/s" and "matmul" in c.get("name", ""):
        bf16 = c["value"] * 1e12
        return lab.calibrated(matmul_flops={"bf16": bf16, "fp16": bf16, "fp8": bf16 * FP8_OVER_BF16}, label="lab")
    return lab


def host_times(path: Path = HOST_TIMES) -> dict:
    """tilecore's eager host time per call (us), measured on the lent H100's host (issue 31)."""
    if not Path(path).exists():
        return {}
    return {r["op"]: r["tilecore_us"] * 1e-6 for r in json.loads(Path(path).read_text())["host_us"]}


def gemm_configs(path: Path = GEMM_CONFIGS) -> dict:
    """tilecore's shipped GEMM tables, read from the op's configs.py (a plain module: no torch)."""
    spec = importlib.util.spec_from_file_location("_tilecore_gemm_configs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {"bf16": mod.GLUON_BF16, "bf16_small_k": mod.GLUON_BF16_SMALL_K, "small_k": mod.SMALL_K,
            "fp8": mod.GLUON_FP8}


# ------------------------------------------------------------------------------------------ kernels
_CACHE: dict = {}


def _memo(fn):
    """Rows share shapes (tilecore and its peers): cost each (shape, GPU constants) once."""
    def wrapper(*args):
        sig = tuple((a.key, a.levels[0].bandwidth, a.rate("tensor", "bf16")) if hasattr(a, "levels") else repr(a)
                    for a in args)
        key = (fn.__name__, sig)
        if key not in _CACHE:
            _CACHE[key] = fn(*args)
        return _CACHE[key]
    return wrapper


def _gemm_tile(m, n, k, dtype, block, stages, consumers, gpu):
    bm, bn, bk = block
    d = models.matmul(m, n, k, dtype=dtype)
    return relabel(d, gpu, {"m": group(bm), "n": group(bn), "k": stream(bk)}, warpgroups=consumers,
                   stages=stages, split_axis="m")


@_memo
def gemm_time(m, n, k, dtype, gpu, impl="peer", variant=None, cfg=None):
    """One GEMM kernel with tilecore's shipped tile (or a probe's variant of it). The peers (cuBLAS,
    torch._scaled_mm) are costed with the same tile: their kernels' tiles are not published per shape
    (rank_gemm_configs is the engine's own choice)."""
    cfg = cfg or gemm_configs()
    row = dict(cfg["fp8"] if dtype == "fp8" else cfg["bf16_small_k"] if k <= cfg["small_k"] else cfg["bf16"])
    if variant:
        row.update(variant)
    wgs = max(1, row.get("num_warps", 4) // 4)
    try:
        r = _gemm_tile(m, n, k, dtype, row["block"], row["stages"], wgs, gpu)
    except CapacityError:  # a sliced epilogue stages a part of C: the model stages it whole
        r = _gemm_tile(m, n, k, dtype, row["block"], min(row["stages"], 3), wgs, gpu)
    return r.time, r.bound


# FlashAttention-2's forward tiles on sm80+ at head dim 64 / 128 (its kernel traits: 128 query rows,
# 128 / 64 keys a step, 4 warps) and the Gluon forward's (tilecore/ops/attention/configs.py GLUON_FORWARD:
# 64 rows a consumer warpgroup, 2 consumers, 128 keys a step; cuDNN's Hopper kernel is costed the same)
FA2_FORWARD = {64: (128, 128), 128: (128, 64)}


def flash2_forward_tile_s(d: int, gpu) -> float:
    """Seconds a FlashAttention-2 forward query tile costs outside its steps (issue 36): its
    grid is one query tile a thread block (flash_fwd_kernel: a block per (query block, batch, head), no
    persistent scheduler), so each tile's prologue (Q and the first K and V blocks in, after a DRAM
    round trip) and epilogue (O and the log-sum-exp out, the stores completed before the block exits:
    a round trip) are the block's own. The backward's tile term (backward.tile_clocks) on the forward's
    tile: bytes at the SM's even share of the measured L2 bandwidth, plus two of the preset's round trips
    (tile_latency_s). No fitted constant."""
    bm, bn = FA2_FORWARD.get(d, (128, 64))
    loads = bm * d * 2 + 2 * bn * d * 2        # Q's tile, the first K and V blocks (bf16)
    stores = bm * d * 2 + bm * 4               # O (bf16), the log-sum-exp (fp32)
    return (loads + stores) / (gpu.level("L2").bandwidth / gpu.sms) + 2 * gpu.tile_latency_s


@_memo
def attention_time(batch, heads, kv_heads, seq, d, causal, backward, gpu, impl, dtype="bf16"):
    """impl: tilecore, cudnn or flash. Forward: tilecore and cuDNN wgmma with the overlap schedule (the
    engine's default); flash (SDPA) is FlashAttention-2: mma.sync, no warp specialization, so its units
    run one after another. Backward: backward.attention_backward_time, each implementation's structure."""
    if backward:  # the backward's own model (backward.py): its step chain, dQ, the passes around it
        b = attention_backward_time(batch, heads, kv_heads, seq, d, causal, gpu, impl)
        return b.time, b.bound
    kw = dict(mma="mma.sync", time_model="serial") if impl == "flash" else {}
    diag = models.attention(batch=batch, heads=heads, kv_heads=kv_heads, seq=seq, d=d, causal=causal, dtype=dtype)
    if impl == "flash":
        bm, bn = FA2_FORWARD.get(d, (128, 64))
        parts, wgs = {"q": group(bm), "x": stream(bn)}, 1
    else:
        three = d <= 64 and seq >= (1024 if causal else 2048)  # configs.THREE_CONSUMERS_MIN_N
        parts, wgs = {"q": group(192 if three else 128), "x": stream(128)}, 3 if three else 2
    if kv_heads != heads:  # a kv head's q heads are walked one after another
        parts["r"] = group(1)
    try:
        r = relabel(diag, gpu, parts, warpgroups=wgs, **kw)
    except CapacityError:  # the peer's tile spread over one more warpgroup (8 warps)
        r = relabel(diag, gpu, parts, warpgroups=wgs + 1, **kw)
    t = r.time
    if impl == "tilecore" and dtype == "bf16":  # the table's keys a step (64 for short causal rows): their steps
        t += tilecore_forward_step_s(batch, heads, seq, d, causal, gpu)
    if impl == "flash":  # one query tile a thread block: each tile's prologue and epilogue, spread over the SMs
        tiles = batch * heads * math.ceil(seq / parts["q"].size)
        t += tiles * flash2_forward_tile_s(d, gpu) / gpu.sms
    return t, r.bound


ATTENTION_CONFIGS = ROOT / "tilecore" / "ops" / "attention" / "configs.py"
_ATTENTION_TABLES: list = []


def attention_configs(path: Path = ATTENTION_CONFIGS):
    """tilecore's attention tables (GLUON_FORWARD, gluon_forward_config), read from the op's configs.py (a plain
    module) as hadamard_configs reads the Hadamard's; loaded once."""
    if not _ATTENTION_TABLES:
        spec = importlib.util.spec_from_file_location("_tilecore_attention_configs", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _ATTENTION_TABLES.append(mod)
    return _ATTENTION_TABLES[0]


def tilecore_forward_step_s(batch, heads, seq, d, causal, gpu) -> float:
    """The key-step term (engine.attention_step_time) of tilecore's bf16 Gluon forward at its table's row
    (configs.gluon_forward_config: two consumers of 64 rows, three at D64 from N 2048 (causal 1024); 64 keys a step
    where causal rows see at most 512 keys)."""
    tables = attention_configs()
    if d not in tables.GLUON_FORWARD:
        return 0.0
    cfg = tables.gluon_forward_config(d, seq, seq, causal)
    return attention_step_time(batch, heads, seq, 64 * cfg.get("consumers", 2), cfg["block_n"], causal, gpu.sms)


@_memo
def copy_time(nbytes, gpu):
    n = max(1, nbytes // 2)
    r = relabel(models.copy(n=n, dtype="bf16"), gpu, {"i": group(min(n, 8192))})
    return r.time, r.bound


HADAMARD_CONFIGS = ROOT / "tilecore" / "ops" / "hadamard" / "configs.py"


def hadamard_configs(path: Path = HADAMARD_CONFIGS):
    """tilecore's Hadamard tables (SPLITS, TUNING, TMA_TUNING, GLUON_SIZES, TMA_MIN_ELEMENTS), read from the op's
    configs.py (a plain module) as gemm_configs reads the GEMM's."""
    spec = importlib.util.spec_from_file_location("_tilecore_hadamard_configs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# The tl Hadamard kernel's chain (tilecore/ops/hadamard/kernels.hadamard_kernel): two constants fitted to the two
# one-row rows of the graph-timed hadamard-latency run (notes/napkin/runs/compile_s38a_run1_session38_h100.txt, the
# bench's benchmarks/results/h100-80gb-hbm3/hadamard-latency.json): n 4096 (one slice a row) 4.11 us and n 16384
# (four slices) 6.09 us, less the graph launch and the engine's fill (0.89 + 0.70 us; tests/napkin/
# test_validate_tilecore.py re-derives both). A slice waits on three wgmma groups in turn (its sm_90a PTX: H_N1 X
# as 8 m64n32k16, then X H_N2 for each of the first product's two bf16 pieces, 2 each, a wgmma.wait_group after
# each): 1.98 us for three slices more, less their MMAs at one SM's share of the run's tensor rate, is 0.126 us a
# wait. What a one-slice row takes beyond that, 1.86 us, is once a program: its prologue builds H_N1 and H_N2 in
# shared memory (the PTX's 64-68 st.shared before the tile loop), its epilogue converts the layout for the stores.
# Programs resident on one SM run their chains in turn (hadamard_chain_s; notes/napkin/runs/
# small_kernels_programs_run3_session39_h100.txt).
WGMMA_WAIT_S = 0.126e-6
HADAMARD_PROLOGUE_S = 1.86e-6


def launch_from_copy(measured_s: float, nbytes: int, gpu) -> float:
    """A kernel's fixed time as the H100 preset's launch_s and graph_launch_s are derived: a small copy's
    measured time (``nbytes`` read and as many written) less the engine's own time for it without a launch."""
    return measured_s - copy_time(nbytes, dataclasses.replace(gpu, launch_s=0.0, key=gpu.key + "-nolaunch"))[0]


def hadamard_chain_s(rows: int, n: int, gpu, cfg=None) -> float:
    """Seconds the busiest SM spends on tilecore's tl Hadamard kernel's chains: each of its programs' prologue,
    then each of its tiles' slices (their MMAs at one SM's tensor rate and the wgmma groups' waits), one after
    another: programs resident on one SM run their chains in turn, each with its prologue (run 3, 264 / 396 rows
    of 4096 at two / three programs an SM: 7.07 / 9.49 us, 1.07 / 0.96 of this sum). For ``rows`` rows of ``n`` as
    its plan launches them (hadamard/plan.py: the split, rows a tile, programs an SM, TMA_TUNING from
    TMA_MIN_ELEMENTS); 0 for the Gluon kernel (n in GLUON_SIZES from TMA_MIN_ELEMENTS elements: a warp-specialized
    pipeline, not this chain) and the register butterfly (n < 16)."""
    cfg = cfg or hadamard_configs()
    if n < 16 or n not in cfg.SPLITS or (n in cfg.GLUON_SIZES and rows * n >= cfg.TMA_MIN_ELEMENTS):
        return 0.0
    tuned = dict(zip(("tile_elems", "num_warps", "num_stages", "waves"), cfg.TUNING[n]))
    split = cfg.SPLITS[n]
    if rows * n >= cfg.TMA_MIN_ELEMENTS and n in cfg.TMA_TUNING:
        over = dict(cfg.TMA_TUNING[n][1])
        split = over.pop("split", split)
        tuned.update(over)
    S, N1, N2 = split
    B = 1 if N1 >= 64 else max(16 if N1 == 1 else 1, tuned["tile_elems"] // (S * N1 * N2))
    tiles = math.ceil(rows / B)
    programs = min(tiles, gpu.sms * tuned["waves"])
    flops = B * n * (2 * N2 if N1 == 1 else 2 * N1 + 4 * N2)       # configs.py: tensor-core FLOP an element
    waits = S * (1 if N1 == 1 else 3)                               # H_N1 X, then X H_N2 a piece (two)
    tile = flops / (gpu.rate("tensor", "bf16") / gpu.sms) + waits * WGMMA_WAIT_S
    return math.ceil(programs / gpu.sms) * HADAMARD_PROLOGUE_S + math.ceil(tiles / gpu.sms) * tile


# An SM starts (and retires) thread blocks one every 80 ns at most, whatever they do: grids of 2^19-2^21 blocks that
# do nothing took 79.7-80.6 ns a block an SM, 1 or 4 warps alike, on the H100 (notes/napkin/runs/
# hh_geom_s40a_run2_session40_h100.txt); a copy of 2^28 bf16 elements one 128-element row a block took as long as
# the empty grid (1.272 against 1.266 ms: 0.285 of torch's copy), one 256-element row a block 0.569.
BLOCK_TURNOVER_S = 80e-9


def one_block_a_row_time(rows, n, dtype, gpu):
    """A kernel of one thread block a row, as Dao's fast-hadamard-transform launches (grid = rows): its bytes at the
    copy rate, or the SMs' block turnover (BLOCK_TURNOVER_S a block an SM), the longer. Its butterflies and shared
    memory exchanges are not modelled: they bind from n = 1024 (70-79% of copy in shared/anchors.md)."""
    t_copy, bound = copy_time(rows * n * dtype_bytes(dtype), gpu)
    t_blocks = math.ceil(rows / gpu.sms) * BLOCK_TURNOVER_S + gpu.launch_s
    return (t_blocks, "block turnover") if t_blocks > t_copy else (t_copy, bound)


@_memo
def hadamard_time(rows, n, dtype, gpu):
    """The engine's Hadamard (H16 stages over a group of rows), or, where they take longer, tilecore's tl kernel's
    chains on its busiest SM (hadamard_chain_s), after the first wave's loads (the engine's fill) and the launch:
    a few rows on an idle GPU wait on their prologue and their MMA groups in turn, not on a bandwidth."""
    if n == 1:  # a scale: one read and one write
        return copy_time(rows * 2, gpu)
    r = relabel(models.hadamard(rows=rows, n=n, dtype=dtype, radix=16), gpu,
                {"r": group(min(rows, max(1, 2048 // n)))}, warpgroups=2)
    first = r.fill_time - (r.waves - 1) * gpu.tile_latency_s     # the first wave's loads: the chains run on
    chain = first + hadamard_chain_s(rows, n, gpu) + r.launch_time  # from there, later tiles' loads under them
    return (chain, "latency") if chain > r.time else (r.time, r.bound)


# The split-key kernel's own chain beyond a copy of its bytes (tilecore's attn_fwd_split_keys, one query of 32 q
# heads against 8 kv heads, D 128: notes/napkin/runs/small_kernels_run1_session39_h100.txt, device time by the
# profiler): at Nk 1024 (64 programs, one 128-key step each) the kernel takes 5.19 us, its 4 MiB of K and V 1.40 us
# at the copy rate and a small copy's kernel 0.99 us (the same run): 2.79 us more, a step's Q K^T, softmax and P V
# and the partials' epilogue in series after the loads. Checked on the same run's Nk 4096 (two steps, 128
# programs) and 16384 (eight): 9.15 and 25.95 us measured, 9.38 and 26.16 by this sum (0.98, 0.99).
DECODE_SPLIT_CHAIN_S = 2.79e-6


# FlashAttention-2's split-KV decode through SDPA at B1 (the bench's Hq32 Hkv8 D128): its main kernel runs as
# tilecore's split kernel (5.9 / 10.2 / 26.8 us against 5.3 / 9.2 / 26.0 at Nk 1024 / 4096 / 16384), but its combine
# takes 4.58 us at 8 splits and 9.73 / 9.54 at 32 (notes/napkin/runs/small_kernels_peers_run7_session39_h100.txt,
# device time by the profiler; cuDNN's reduction 1.98-2.85, tilecore's merge 1.66-1.95): beyond a small copy's
# kernel (0.99 us, run 1) 1.91 us and 0.210 us a split, two constants from its two split counts. Its splits are
# PyTorch's num_splits_heuristic's at B1 (8, 32, 32: notes/napkin/README.md, its FA2 decode row); at
# B >= 16 the batch's heads fill the SMs and it does not split.
FLASH_DECODE_SPLITS_B1 = {1024: 8, 4096: 32, 16384: 32}
FLASH_COMBINE_S = 1.91e-6
FLASH_COMBINE_PER_SPLIT_S = 0.210e-6


def flash_decode_combine_s(batch: int, kv_seq: int) -> float:
    """FlashAttention-2's split-KV combine beyond a copy-like merge (what decode_time charges), at B1."""
    splits = FLASH_DECODE_SPLITS_B1.get(kv_seq, 0) if batch == 1 else 0
    return FLASH_COMBINE_S + splits * FLASH_COMBINE_PER_SPLIT_S if splits else 0.0


@_memo
def decode_time(batch, heads, kv_heads, kv_seq, d, gpu):
    """Split keys (flash-decoding): ranges of >= 128 keys so that one wave fills the SMs, the queries of
    a kv head packed into one tile, plus the split kernel's chain beyond its bytes (DECODE_SPLIT_CHAIN_S); the
    merge of the partials is a second, small kernel."""
    ranges = max(1, min(64, kv_seq // 128, math.ceil(gpu.sms / (batch * kv_heads))))
    keys = math.ceil(kv_seq / ranges)
    # the key axis split in two: ranges (a new axis K and V have, Q is broadcast along) x keys a range
    diag = models.decode(batch=batch, heads=heads, kv_heads=kv_heads, kv_seq=keys, d=d).weave("s", ranges, ["K", "V"])
    r = derive(diag, gpu, mma="mma.sync")
    t = r.time + DECODE_SPLIT_CHAIN_S
    if ranges > 1:  # partials: fp32 O and lse per (range, row), read once by the merge: a small kernel whose
        partial = batch * heads * ranges * (d + 1) * 4  # loads wait a round trip, costed as a copy of their bytes
        t += copy_time(partial, gpu)[0]  # the merge kernel
    return t, r.bound


# PyTorch's generic (TensorIterator / indexing) kernels on strided views run at about half the copy
# ceiling: SDPA's flash backward's two transposing copies of Q's size took 0.37 ms (D64) and 0.74 ms
# (D128) a backward (notes/napkin/runs/napkin_gpu_backward_tiles_run5_session28_h100.txt),
# 2.07x the copy-ceiling time of their bytes (0.179 / 0.358 ms at 3,002 GB/s)
GENERIC_COPY_SLOWDOWN = 2.07


def kv_repeated_time(batch, hq, hkv, seq, d, backward, gpu, impl):
    """The bench's "K/V repeated" peer (tilecore/bench/suites/attention_gqa.py): K and V repeated to
    every q head by ``repeat_interleave(group, dim=1)`` (PyTorch: an index tensor, then ``index_select``,
    a generic gather kernel, one a tensor) inside the timed forward, then multi-head attention. The
    timed backward is ``autograd.grad`` of one forward: the attention backward, then index_select's
    backward (zeros, then ``index_add_`` of the q heads' dK and dV into the kv heads), one a tensor;
    the forward's repeats are not in it. The gathers and scatters move the q heads' bytes in and out
    (the kv heads' share is small) at GENERIC_COPY_SLOWDOWN x the copy ceiling's time."""
    kv = 2 * batch * seq * d * 2                                  # one kv head's K (or V): in + out, bf16
    per_tensor = copy_time(kv * (hkv + hq) // 2 // 2, gpu)[0] * GENERIC_COPY_SLOWDOWN
    t, bound = attention_time(batch, hq, hq, seq, d, True, backward, gpu, impl)
    return t + 2 * per_tensor, bound


# ------------------------------------------------------------------------------------------ rows
_GQA = re.compile(r"Hq(\d+)/Hkv(\d+) D(\d+)")


def _attention_impl(series: str) -> str:
    return "flash" if series.startswith("flash") else "tilecore" if series.startswith("tilecore") else "cudnn"


def _row_value(row):
    if "value" in row:
        return row["value"]
    return statistics.median(row["tflops"])


def _predict_row(path: Path, data: dict, row: dict, gpu, cfg, host) -> Prediction | None:
    suite = data.get("suite") or path.stem
    metric = data.get("metric") or "TFLOP/s"
    eager = (data.get("meta") or {}).get("timing") == "eager"
    series = row["series"]
    params = dict(row.get("params") or {k: row[k] for k in ("phase", "case", "M", "N", "K") if k in row})
    measured = _row_value(row)
    measured_s = row["ms"] * 1e-3 if row.get("ms") else None
    tilecore = series.startswith("tilecore")
    host_s = 0.0
    if suite == "copy":
        op = "copy"
        t, bound = copy_time(params["bytes"], gpu)
    elif suite in ("hadamard", "hadamard-latency"):
        op = "hadamard"
        rows, n = (params["rows"], params["n"]) if "rows" in params else (2 ** 28 // params["n"], params["n"])
        if series == "torch copy_":
            op = "copy"
            t, bound = copy_time(rows * n * 2, gpu)
        elif series == "dao":  # the bench's peer where fast_hadamard_transform is importable: one block a row
            t, bound = one_block_a_row_time(rows, n, params.get("dtype", "bf16"), gpu)
        else:
            t, bound = hadamard_time(rows, n, params.get("dtype", "bf16"), gpu)
            host_s = host.get("hadamard", 0.0)
            # that suite's files before the bench recorded its timing were eager
            eager = eager or (suite == "hadamard-latency" and "timing" not in (data.get("meta") or {}))
    elif suite == "gemm" or path.stem.startswith("gemm_probe"):
        if suite == "gemm":
            k = params["K"]
            m = n = k if "M=N=K" in params["case"] else 4096
            dtype = "fp8" if params["case"].startswith("fp8") else "bf16"
        else:
            m, n, k = params["M"], params["N"], params["K"]
            dtype = "fp8" if params["case"].startswith("fp8") else "bf16"
            eager = series.endswith("(call)")
        op = "gemm_fp8" if dtype == "fp8" else "gemm"
        variant = None
        if series.startswith("stages="):
            variant = {"stages": int(series.split("=")[1])}
        elif series.startswith("4 stages"):
            variant = {"stages": 4}
        elif re.fullmatch(r"\d+x\d+x\d+", series):
            variant = {"block": tuple(int(v) for v in series.split("x"))}
        impl = "tilecore" if (tilecore or variant or series.startswith("GROUP_M")) else "peer"
        t, bound = gemm_time(m, n, k, dtype, gpu, impl, variant, cfg)
        if measured_s is None:
            measured_s = 2 * m * n * k / (measured * 1e12)
        if tilecore:
            host_s = host.get("gemm_fp8" if dtype == "fp8" else "gemm", 0.0)
    elif suite == "attention":
        bwd = params["pass"] == "bwd"
        op = "attention " + params["pass"]
        n_ = params["N"]
        impl = _attention_impl(series)
        t, bound = attention_time(65536 // n_, 16, 16, n_, params["D"], params["causal"], bwd, gpu, impl)
    elif suite == "attention-gqa":
        bwd = params["pass"] == "bwd"
        op = "attention-gqa " + params["pass"]
        hq, hkv, d = (int(v) for v in _GQA.search(params["model"]).groups())
        n_ = params["N"]
        batch = max(1, 2 ** 20 // (hq * n_))
        impl = _attention_impl(series)
        if "K/V repeated" in series:
            t, bound = kv_repeated_time(batch, hq, hkv, n_, d, bwd, gpu, impl)
        else:
            t, bound = attention_time(batch, hq, hkv, n_, d, True, bwd, gpu, impl)
    elif suite == "attention-fp8":  # the forward at B N = 65536, H 16 (tilecore.bench.suites.attention_fp8)
        op = "attention-fp8"
        n_, d = params["N"], params["D"]
        fp8 = series.startswith("tilecore fp8")
        t, bound = attention_time(65536 // n_, 16, 16, n_, d, params["causal"], False, gpu, _attention_impl(series),
                                  "fp8" if fp8 else "bf16")
        if series == "tilecore fp8 end to end":  # q, k rotated and quantized, v quantized: bf16 in, e4m3 out
            t += copy_time(3 * 65536 * 16 * d * 3 // 2, gpu)[0]
    elif suite == "attention-decode":
        op = "decode"
        t, bound = decode_time(params["B"], 32, 8, params["Nk"], 128, gpu)
        if series.startswith("flash"):  # its combine kernel (FLASH_COMBINE_S)
            t += flash_decode_combine_s(params["B"], params["Nk"])
    else:
        return None
    if eager and tilecore and host_s > t:
        t, bound = host_s, "host"
    predicted = measured * measured_s / t
    try:
        shown = str(path.resolve().relative_to(ROOT))
    except ValueError:
        shown = str(path)
    return Prediction(shown, op, series,
                      params, metric, measured, predicted, measured_s, t, bound)


def predict_file(path: Path, data: dict, lab, cfg: dict, host: dict) -> list:
    """Every row of one bench JSON (``data``, read from ``path``) predicted on ``lab`` with the file's own ceiling;
    a graph-timed file's kernels take the graph launch."""
    gpu = session_gpu(data, lab)
    if (data.get("meta") or {}).get("timing") == "graph":  # replayed from a CUDA graph: no host launch
        gpu = dataclasses.replace(gpu, launch_s=gpu.graph_launch_s, key=gpu.key + "-graph")
    out = []
    for row in data["rows"]:
        p = _predict_row(path, data, row, gpu, cfg, host)
        if p is None:
            raise ValueError(f"{path}: no prediction for a row of suite {data.get('suite')!r}: {row}")
        p.graph = (data.get("meta") or {}).get("timing") == "graph"
        out.append(p)
    return out


def predict_all(root: Path = RESULTS) -> list:
    files = bench_files(root)
    lab = lab_gpu(files)
    cfg = gemm_configs()
    host = host_times()
    out = []
    for path, data in files:
        out += predict_file(path, data, lab, cfg, host)
    for p in out:
        p.headline = _is_headline(p)
        if p.miss > TOLERANCE:
            p.cause = name_cause(p)
    return out


def _is_headline(p: Prediction) -> bool:
    """The README's headline rows (H100): gemm 8192^3, gemm_fp8 8192^3, attention fwd/bwd D128 at
    N = 4096, GQA 8B fwd/bwd at N = 4096, decode B16 Nk4096, Hadamard n = 4096, copy 1 GiB."""
    q = p.params
    if not p.series.startswith(("tilecore", "torch copy_")):
        return False
    if p.op in ("gemm", "gemm_fp8"):
        return "case" in q and "M=N=K" in q.get("case", "") and q.get("K") == 8192
    if p.op.startswith("attention "):
        return q.get("D") == 128 and q.get("N") == 4096 and not q.get("causal")
    if p.op.startswith("attention-gqa"):
        return q.get("N") == 4096 and q.get("model", "").startswith("8B")
    if p.op == "decode":
        return q == {"B": 16, "Nk": 4096}
    if p.op == "hadamard":
        return q.get("n") == 4096 and q.get("dtype") == "bf16" and "rows" not in q
    if p.op == "copy":
        return q.get("bytes") == 2 ** 30
    return False


def name_cause(p: Prediction) -> str:
    """Why a row misses by more than 15%: the regime it is in, in the terms the model has or lacks."""
    q, fast = p.params, p.ratio > 1
    if p.graph and p.op == "hadamard":
        return ("latency at small sizes (GPU time, from a CUDA graph): the tl kernel's chains on an SM (hadamard_chain_s: "
                "each program's prologue, its slices' wgmma waits; two constants from the run's one-row rows) do not "
                "hold here")
    if p.graph and p.op == "copy":
        return ("latency at small sizes (GPU time, from a CUDA graph): the graph launch (0.89 us, from the run's "
                "8 KiB copy) and the first loads' round trip; a real copy's ramp differs by size")
    if p.bound == "host" or (p.series.startswith("tilecore") and p.measured_s < 100e-6 and fast and
                             (p.op in ("gemm", "gemm_fp8", "hadamard"))):
        return ("host time: an eager call on the host path the bench ran with (before issue 31's host work); "
                "the model's host floor is today's (notes/host/runs/host_time_session24_h100.json)")
    if p.op.endswith("bwd") and fast and q.get("N", 1 << 30) <= 1024:
        return ("short causal tiles (backward): at N = 512 a key tile walks 2-8 query steps; the warp-specialized "
                "kernels' main kernels run 1.12-1.27x the model's time there (cuDNN, tilecore; "
                "notes/napkin/runs/napkin_gpu_backward_tiles_run5_session28_h100) while FlashAttention-2's causal "
                "rows carry no excess over its non-causal ones; non-causal N 128 / 256 tiles (2-4 steps) run as far "
                "over (notes/napkin/runs/napkin_gpu_backward_tiles_short_run8_session28_h100.txt): the tiles' length, not the mask; not modelled beyond the one-tile blocks' "
                "prologue and epilogue and the passes")
    if p.op.endswith("bwd") and p.series.startswith("flash") and fast:
        return ("peer's kernel (FlashAttention-2's backward on Hopper): beyond mma.sync's 2/3 rate, its warps' "
                "operand reads, its own clock and the serial schedule (modelled): dQ's fp32 atomics in L2")
    if p.op.startswith(("attention", "attention-gqa")) and p.series.startswith("flash") and fast:
        return "missing algorithm (peer): FlashAttention-2 on Hopper, mma.sync rate and issue beyond the 2/3 account"
    if p.op.endswith("fwd") and p.series.startswith("flash") and not fast:
        return ("FlashAttention-2's forward at D64 predicted slow: its blocks (128 x 128 tiles, 48 KiB of shared "
                "memory) run several a SM, so one block's prologue and epilogue run partly under another's steps; "
                "the one-tile term (flash2_forward_tile_s) charges them in full")
    if "K/V repeated" in p.series:
        return ("peer's extra passes: K and V repeated to every q head by eager PyTorch (index_select, its "
                "backward index_add_), costed at PyTorch's generic copy rate (half the copy ceiling: GENERIC_COPY_SLOWDOWN)")
    if p.op.endswith("bwd") and fast and q.get("N", 1 << 30) <= 2048:
        return ("short tiles (backward): the causal tail over few query steps and a persistent schedule's last "
                "tiles, not modelled per tile; the prologue and epilogue of one-tile thread blocks are")
    if p.op.endswith("bwd") and not fast:
        return ("backward predicted slow: tilecore's separate dQ kernel (short D128 tiles, grouped heads), costed "
                "by the forward's rule; its overlap of the key tiles' kernel with it is not modelled")
    if p.op.endswith("bwd") and fast:
        return ("backward at long N, predicted fast: this run below the model's clock (1545 MHz, the power probe's "
                "at 700 W) or a per-step cost the step chain does not name")
    if p.op == "attention-fp8" and p.series.endswith("end to end") and fast:
        return ("the convenience path's passes before the attention (rotate and quantize q and k, quantize v, its "
                "layout copy: separate eager kernels, each with its launch and tail), costed as their bytes only")
    if p.op.startswith("attention") and q.get("N", 1 << 30) <= 1024 and fast:
        return "short rows: prologue/epilogue per tile and the causal tail (latency), not modelled per tile"
    if p.op == "decode" and p.series.startswith("flash") and fast:
        return ("peer's kernel (FlashAttention-2's decode through SDPA at B >= 16: one kernel, no split): it runs "
                "slower than the bandwidth-bound model at B64 (1.09-1.17), not modelled; its B1 combine is "
                "(FLASH_COMBINE_S)")
    if p.op == "decode":
        return ("latency at small sizes: a decode step's split kernel (its chain: DECODE_SPLIT_CHAIN_S, tilecore's) "
                "and merge; the peer's kernels differ")
    if p.op in ("gemm", "gemm_fp8") and q.get("K", 1 << 30) <= 512:
        return "skinny K: prologue/epilogue per tile (C store not hidden under few K steps)"
    if p.op in ("gemm", "gemm_fp8") and "GROUP_M=1" in p.series:
        return "L2 tile order: row-major launch, the model assumes the grouped super-tile"
    if p.op in ("gemm", "gemm_fp8") and p.series.startswith("stages="):
        return "latency: a shallow ring cannot cover the load latency (Little's law), not modelled"
    if p.op in ("gemm", "gemm_fp8") and not p.series.startswith("tilecore"):
        return "peer's kernel choice at this shape (cuBLAS heuristics), not modelled"
    if p.op == "hadamard" and p.series == "dao" and q.get("n", 0) >= 1024:
        return ("Dao's butterflies and shared-memory exchanges (one block a row: modelled as its bytes or the SMs' "
                "block turnover, the longer)")
    if p.op == "hadamard":
        return "latency at small sizes: few rows leave most SMs idle and the host path dominates"
    if p.op == "copy":
        return "latency at small sizes: the launch floor is one figure; real ramps differ by size"
    return "unexplained"


# ------------------------------------------------------------------------------------------ table
def distribution(preds) -> dict:
    misses = sorted(p.miss for p in preds)
    if not misses:
        return {"rows": 0, "median": 0.0, "p90": 0.0, "within": 0.0}
    p90 = misses[min(len(misses) - 1, math.ceil(0.9 * len(misses)) - 1)]
    return {"rows": len(misses), "median": statistics.median(misses), "p90": p90,
            "within": sum(m <= TOLERANCE for m in misses) / len(misses)}


def _fmt_params(q: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in q.items())


# Attention backward rows of the feature runs (no bench format): (case in the run's "timing", impl,
# batch, heads, seq, d, window, softcap). B H N D as the run's script made them (gpu_features_s26.py).
FEATURE_RUN = ROOT / "notes" / "attention" / "runs" / "gpu_features_s26_round2_h100.json"
FEATURE_BACKWARDS = (
    ("full causal N32768", "tilecore", 2, 16, 32768, 128, None, False),
    ("window (4096, 0) gluon bwd", "tilecore", 2, 16, 32768, 128, (4096, 0), False),
    ("flex window (4096, 0)", "flex", 2, 16, 32768, 128, (4096, 0), False),
    ("no softcap causal N4096", "tilecore", 16, 16, 4096, 128, None, False),
    ("softcap 30 gluon bwd tanh.approx", "tilecore", 16, 16, 4096, 128, None, True),
    ("flex softcap 30", "flex", 16, 16, 4096, 128, None, True),
)


def feature_backwards(path: Path = FEATURE_RUN) -> list:
    """(case, impl, measured ms, predicted ms, cause) for the feature run's causal backwards (window,
    softcap; tilecore's Gluon and FlexAttention), on the lab GPU (that run measured no ceiling)."""
    if not Path(path).exists():
        return []
    measured = {r["case"]: r.get("bwd_ms") for r in json.loads(Path(path).read_text())["timing"]}
    gpu = lab_gpu()
    out = []
    for case, impl, b, h, n, d, window, softcap in FEATURE_BACKWARDS:
        if measured.get(case) is None:
            continue
        t = attention_backward_time(b, h, h, n, d, True, gpu, impl, window=window, softcap=softcap).time * 1e3
        ratio = measured[case] / t
        cause = ""
        if abs(ratio - 1) > TOLERANCE:
            cause = ("FlexAttention's score_mod tanh (libdevice) costs more than its two SFU instructions, "
                     "in the forward recompute of both backward programs; not modelled" if impl == "flex" and softcap
                     else "window: the band's edge tiles (masked steps at both ends of a key tile's walk), "
                          "not modelled beyond the visited steps")
        out.append((case, impl, measured[case], t, cause))
    return out


# issue 37's rotary: the standalone pass's timed rows (H100: B16 N4096 H32 D128 bf16), and the
# in-kernel rotary forward's run (gpu_rotary_kernel.py's JSON) once one is committed (None: predictions only)
ROTARY_RUN = ROOT / "notes" / "norm" / "runs" / "norm_rotary_gpu_check_session24_h100.json"
FUSED_ROTARY_RUNS = [ROOT / "notes" / "rotary" / "runs" / f for f in (
    "rotary_kernel1_run1_session36_h100_attention_rotary_kernel.json",      # AHEAD 1 (its own four cases)
    "rotary_kernel3_run4_session36_h100_attention_rotary_kernel.json")]     # AHEAD 3, 2; K by a pass


def rotary_section() -> list:
    """Markdown lines: apply_rotary's rows of ROTARY_RUN beside models.rotary's time on the H100 calibrated
    with that run's copy of the same bytes; the fused forward's predicted overhead (rotary.fused_table),
    beside FUSED_ROTARY_RUNS' measured ones."""
    from .rotary import fused_table, standalone_time
    lines = []
    if Path(ROTARY_RUN).exists():
        run = json.loads(Path(ROTARY_RUN).read_text())
        lines += ["", f"### Rotary (issue 37): apply_rotary, {Path(ROTARY_RUN).relative_to(ROOT)}", "",
                  "| case | measured ms | % of copy | predicted ms | predicted % of copy | pred/meas (speed) |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in run["time"]:
            m = re.match(r"rotary (\w+) B(\d+) N(\d+) H(\d+) D(\d+)", r["case"])
            if not m:
                continue
            b, n, h, d = (int(v) for v in m.groups()[1:])
            nbytes = 2 * b * n * h * d * 2  # x read and written, bf16
            gpu = H100.calibrated(copy_bytes_per_s=nbytes / (r["copy_ms"] * 1e-3), label="this run's copy")
            t = standalone_time(b, n, h, d, gpu=gpu) * 1e3
            lines.append(f"| {r['case']} | {r['ms']:.3f} | {r['pct_of_copy']:.1f}% | {t:.3f} | "
                         f"{100 * r['copy_ms'] / t:.1f}% | {r['ms'] / t:.2f} |")
    runs = [json.loads(Path(f).read_text()) for f in FUSED_ROTARY_RUNS if Path(f).exists()]
    lines += ["", "### Rotary turned inside the attention forward (attention_rotary/gluon_forward.py), B16 H16 N4096 bf16, rotary_dim D: "
              "the predicted overhead over the forward without rotary (tilecore.napkin.rotary.fused_overhead; "
              "target <= 3%); measured: " + (", ".join(str(Path(f).relative_to(ROOT)) for f in FUSED_ROTARY_RUNS
                                                          if Path(f).exists()) or "no run committed yet"),
              "", fused_table(runs)]
    return lines


def table(root: Path = RESULTS) -> str:
    preds = predict_all(root)
    ops = sorted({p.op for p in preds})
    lines = ["### Distribution of |predicted / measured - 1|, by op", "",
             "| op | rows | median | p90 | within 15% | headline rows within 15% |", "| --- | --- | --- | --- | --- | --- |"]
    for op in ops + ["all"]:
        sel = [p for p in preds if op == "all" or p.op == op]
        dist = distribution(sel)
        heads = [p for p in sel if p.headline]
        hl = f"{sum(p.miss <= TOLERANCE for p in heads)} of {len(heads)}" if heads else "-"
        lines.append(f"| {op} | {dist['rows']} | {100 * dist['median']:.1f}% | {100 * dist['p90']:.1f}% | "
                     f"{100 * dist['within']:.0f}% | {hl} |")
    causes = {}
    for p in preds:
        if p.cause:
            causes.setdefault(p.cause, []).append(p)
    lines += ["", "### Misses over 15%, by named cause", "", "| cause | rows | ops |", "| --- | --- | --- |"]
    for cause, ps in sorted(causes.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"| {cause} | {len(ps)} | {', '.join(sorted({p.op for p in ps}))} |")
    feats = feature_backwards() if Path(root) == RESULTS else []
    if feats:
        lines += ["", f"### Attention backward rows of {FEATURE_RUN.relative_to(ROOT)} (causal, B H N D as its script; "
                  "no ceiling in that run: the lab GPU)", "",
                  "| case | implementation | measured ms | predicted ms | pred/meas (speed) | cause |",
                  "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {c} | {i} | {m:.3f} | {t:.3f} | {m / t:.2f} | {cause} |" for c, i, m, t, cause in feats]
    if Path(root) == RESULTS:
        lines += rotary_section()
    lines += ["", "### Every row", "",
              "| file | op | series | params | metric | measured | predicted | pred/meas | bound | cause |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in preds:
        mark = " **headline**" if p.headline else ""
        lines.append(f"| {Path(p.file).name} | {p.op} | {p.series}{mark} | {_fmt_params(p.params)} | {p.metric} | "
                     f"{p.measured:,.1f} | {p.predicted:,.1f} | {p.ratio:.2f} | {p.bound} | {p.cause} |")
    lines += ["", "Generated by `tilecore napkin --validate` (tilecore.napkin.validate.table) from every JSON under "
              "benchmarks/results/; tests/napkin/test_validation_table.py checks that this section is current. "
              "GPU: the H100 preset; HBM = the copy ceiling of the same run (else copy.json's 1 GiB copy, "
              "3,002 GB/s); tensor cores = the same run's cuBLAS bf16 8192^3 ceiling (else the mean of the "
              "committed ceilings), fp8 x 1230/680 (shared/anchors.md); a kernel's launch 4.15 us eager, 0.89 us from a "
              "CUDA graph (each a small copy's measured time less the engine's own: copy.json, hadamard-latency.json); "
              "tilecore's eager host floor from notes/host/runs/host_time_session24_h100.json. The attention "
              "backward: tilecore.napkin.backward (each implementation's step chain, dQ, the passes around "
              "it, a one-tile thread block's prologue and epilogue, FlashAttention-2's per-warp operand reads "
              "at its measured clock, its grouped heads' dK, dV sums and SDPA's two layout copies; one step latency derived from "
              "shared/anchors.md's cuDNN row). tilecore's bf16 forward: its table's keys a step, each step beyond "
              "a 128 x 128-key tiling's 0.15 us (engine.attention_step_time; short causal rows take 64 keys). "
              "FlashAttention-2's forward: one query tile a thread block, each "
              "tile's prologue and epilogue (flash2_forward_tile_s). The K/V-repeated peer: index_select in the "
              "timed forward, index_add_ in the timed backward, at PyTorch's generic copy rate (kv_repeated_time)."]
    return "\n".join(lines)


BEGIN, END = "<!-- napkin-validate:begin -->", "<!-- napkin-validate:end -->"


def write_docs(path, text: str) -> None:
    path = Path(path)
    doc = path.read_text() if path.exists() else f"# The napkin\n\n{BEGIN}\n{END}\n"
    if BEGIN not in doc:
        doc += f"\n{BEGIN}\n{END}\n"
    doc = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: f"{BEGIN}\n{text}\n{END}", doc, flags=re.S)
    path.write_text(doc)


def docs_section(path=DOCS) -> str:
    """The generated section of docs/napkin.md as committed."""
    doc = Path(path).read_text()
    m = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), doc, flags=re.S)
    return m.group(1) if m else ""
