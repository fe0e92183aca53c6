"""GPU hardware for the napkin: a hierarchy of memory levels and compute units with rates per dtype.

Rates are whole-GPU figures (bytes/s, FLOP/s, ops/s) at the clock the datasheet quotes them for;
`per_sm_per_clock` turns one back into the paper's "per SM per clock" form.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .errors import UnknownGPUError, UnsupportedDtypeError

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16",
                  "bfloat16": "bf16", "e4m3": "fp8", "e5m2": "fp8", "fp8e4m3": "fp8", "fp8e5m2": "fp8",
                  "float8": "fp8"}


def canonical_dtype(name: str) -> str:
    """'bfloat16' -> 'bf16'; raises UnsupportedDtypeError naming the accepted dtypes."""
    key = str(name).lower().replace("_", "")
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise UnsupportedDtypeError(
            f"unsupported dtype {name!r}; accepted: {', '.join(DTYPE_BYTES)} "
            f"(aliases: {', '.join(sorted(_DTYPE_ALIASES))})")
    return key


def dtype_bytes(name: str) -> int:
    return DTYPE_BYTES[canonical_dtype(name)]


@dataclass(frozen=True)
class Level:
    """One memory level. `bandwidth` is bytes/s that all its children together can read from it."""
    name: str          # HBM, L2, SMEM, RF
    capacity: int      # bytes per instance
    bandwidth: float   # bytes/s, aggregate over the GPU
    instances: int     # how many of this level the GPU has
    children: int      # units of the next level down fed by one instance
    source: str


@dataclass(frozen=True)
class ComputeUnit:
    """A kind of execution unit and its whole-GPU rate per dtype (FLOP/s or ops/s)."""
    name: str          # tensor, sfu, alu
    rates: dict
    source: str

    def rate(self, dtype: str) -> float:
        dtype = canonical_dtype(dtype)
        if dtype not in self.rates:
            raise UnsupportedDtypeError(
                f"the {self.name} unit has no {dtype} rate on this GPU; accepted: {', '.join(self.rates)}")
        return self.rates[dtype]


@dataclass(frozen=True)
class GPU:
    key: str
    name: str
    sms: int
    clock_hz: float                    # the clock the datasheet's peak rates correspond to
    levels: tuple                      # HBM, L2, SMEM, RF: top to bottom
    units: dict                        # name -> ComputeUnit
    tc_tile: tuple                     # (m, n, k_bytes): one consumer unit's (warpgroup's) MMA granule
    max_smem_per_block: int
    max_rf_per_warpgroup: int          # 128 threads x 255 registers x 4 bytes
    coalesce_bytes: int = 128
    notes: tuple = field(default_factory=tuple)
    # fixed time of one kernel launched back to back (launch, first loads' latency, tail): a term every
    # kernel pays once. Source in `constants_source`.
    launch_s: float = 0.0
    graph_launch_s: float = 0.0   # the same for a kernel replayed from a CUDA graph (no host launch)
    tile_latency_s: float = 0.0   # one DRAM round trip: a tile's first load waits for it, once a wave
    # fraction of the tensor-core rate an Ampere-style warp-level MMA (mma.sync) reaches; 1 where it is
    # the GPU's native MMA
    mma_sync_fraction: float = 1.0
    # share of the exponentials (SFU) that cannot hide behind the tensor cores when exp sits between two
    # dependent MMAs of one step (softmax between Q K^T and P V): the paper's account of FA3
    exposed_sfu: float = 2 / 3
    constants_source: tuple = field(default_factory=tuple)
    # the L2 in two limits, counted apart by Nsight Compute: Level("L2").bandwidth is what the crossbar delivers into
    # the SMs together (the engine charges every relabelled kernel's L2 -> SM bytes at it); l2_unshared_bandwidth is
    # what the L2's slices serve, every request that reaches them a lookup (bulk copies and a load-only ring of a GEMM's
    # tiles run at it). A GEMM's SMs take in more than its slices serve: requests for a line from blocks that run
    # together merge before the slices (l2_slice_share). 0: the level's bandwidth
    l2_unshared_bandwidth: float = 0.0
    # share of the bytes the SMs take from L2 beyond their lines' first (HBM) read that reach the L2's slices: requests
    # for one line from blocks that run together merge before the slices, and the crossbar delivers the line to each
    # (0: the slices not modelled). The slices serve at l2_unshared_bandwidth.
    l2_slice_share: float = 0.0
    # a TMA multicast copy's time in the receiving block's ring, whatever its size (0: not modelled)
    multicast_chunk_s: float = 0.0

    def level(self, name: str) -> Level:
        for lv in self.levels:
            if lv.name == name:
                return lv
        raise KeyError(f"no level {name!r}; levels: {[lv.name for lv in self.levels]}")

    def rate(self, unit: str, dtype: str) -> float:
        return self.units[unit].rate(dtype)

    def per_sm_per_clock(self, rate: float) -> float:
        return rate / (self.sms * self.clock_hz)

    def with_constants(self, constants: dict, label: str = "measured") -> "GPU":
        """A copy with measured constants folded in (the JSON `experiments/napkin/gpu_constants.py`
        writes, or its `constants` dict): keys `hbm_bytes_per_s` (copy, bytes read + written per s),
        `l2_bytes_per_s` (reads of an L2-resident working set), `launch_s`, `graph_launch_s`, `sfu_exp2_per_s`,
        `matmul_flops` ({dtype: FLOP/s}). Missing keys keep the preset's value. The launches: the empty kernel's
        (`empty_launch_s`, `empty_graph_launch_s`) where the JSON has them, since the preset's launch is a kernel's
        fixed time beyond the engine's own (within 0.05 us of an empty kernel's on the H100; LAUNCH_S_H100), and
        gpu_constants.py's `launch_s` / `graph_launch_s` time a whole 64 KiB copy."""
        c = dict(constants.get("constants", constants))
        src = f"{label}: {constants.get('source', 'experiments/napkin/gpu_constants.py')}"
        levels = list(self.levels)
        for i, lv in enumerate(levels):
            key = {"HBM": "hbm_bytes_per_s", "L2": "l2_bytes_per_s"}.get(lv.name)
            if key and c.get(key):
                levels[i] = dataclasses.replace(lv, bandwidth=float(c[key]), source=src)
        units = dict(self.units)
        if c.get("sfu_exp2_per_s"):
            r = float(c["sfu_exp2_per_s"])
            units["sfu"] = ComputeUnit("sfu", {d: r for d in units["sfu"].rates}, src)
        out = dataclasses.replace(self, levels=tuple(levels), units=units,
                                  launch_s=float(c.get("empty_launch_s") or c.get("launch_s") or self.launch_s),
                                  graph_launch_s=float(c.get("empty_graph_launch_s") or c.get("graph_launch_s")
                                                       or self.graph_launch_s),
                                  tile_latency_s=float(c.get("tile_latency_s") or self.tile_latency_s),
                                  constants_source=self.constants_source + (src,))
        if c.get("matmul_flops"):
            out = out.calibrated(matmul_flops=c["matmul_flops"], label=label)
        return out

    def calibrated(self, copy_bytes_per_s: float | None = None, matmul_flops: dict | None = None,
                   label: str = "calibrated") -> "GPU":
        """A copy whose HBM bandwidth and tensor-core rates are measured ceilings.

        copy_bytes_per_s: a device-to-device copy's bytes read + written per second.
        matmul_flops: {dtype: FLOP/s of a large dense matmul}. Dtypes not given are scaled by the
        ratio of the first given one, so one bf16 measurement also informs fp8.
        """
        levels = list(self.levels)
        if copy_bytes_per_s:
            levels[0] = dataclasses.replace(levels[0], bandwidth=float(copy_bytes_per_s),
                                            source=f"measured copy ({label})")
        units = dict(self.units)
        if matmul_flops:
            tc = units["tensor"]
            given = {canonical_dtype(k): float(v) for k, v in matmul_flops.items()}
            first = next(iter(given))
            scale = given[first] / tc.rate(first)
            rates = {dt: given.get(dt, r * scale) for dt, r in tc.rates.items()}
            units["tensor"] = ComputeUnit("tensor", rates, f"measured matmul ({label})")
        key = self.key if self.key.endswith(f"-{label}") else f"{self.key}-{label}"
        name = self.name if self.name.endswith(f"({label})") else f"{self.name} ({label})"
        return dataclasses.replace(self, key=key, name=name, levels=tuple(levels), units=units)


def _gpu(key, name, sms, clock_hz, hbm, hbm_src, l2_bytes, l2_bw, l2_src, smem_kb, smem_block_kb,
         tensor, tensor_src, alu, alu_src, tc_tile, notes=(), launch_s=0.0, mma_sync_fraction=1.0,
         constants_source=(), graph_launch_s=0.0, tile_latency_s=0.0, l2_unshared_bandwidth=0.0,
         multicast_chunk_s=0.0, l2_slice_share=0.0):
    sfu = 16 * sms * clock_hz  # 16 exp2/clk/SM: CUDA C Programming Guide, arithmetic throughput table
    return GPU(
        key=key, name=name, sms=sms, clock_hz=clock_hz,
        levels=(
            Level("HBM", int(hbm[0]), hbm[1], 1, 1, hbm_src),
            Level("L2", l2_bytes, l2_bw, 1, sms, l2_src),
            Level("SMEM", smem_kb * 1024, 128 * sms * clock_hz, sms, 4,
                  "128 bytes/clk/SM (32 banks x 4 bytes), CUDA C Programming Guide"),
            Level("RF", 256 * 1024, float("inf"), sms, 4,
                  "64K 32-bit registers per SM (datasheet/whitepaper); bandwidth not limiting here"),
        ),
        units={
            "tensor": ComputeUnit("tensor", tensor, tensor_src),
            "sfu": ComputeUnit("sfu", {"fp32": sfu, "fp16": sfu, "bf16": sfu},
                               "16 results/clk/SM for exp2 (MUFU), CUDA C Programming Guide"),
            "alu": ComputeUnit("alu", alu, alu_src),
        },
        tc_tile=tc_tile, max_smem_per_block=smem_block_kb * 1024,
        max_rf_per_warpgroup=128 * 255 * 4, notes=tuple(notes), launch_s=launch_s, graph_launch_s=graph_launch_s,
        tile_latency_s=tile_latency_s,
        mma_sync_fraction=mma_sync_fraction, constants_source=tuple(constants_source),
        l2_unshared_bandwidth=l2_unshared_bandwidth, multicast_chunk_s=multicast_chunk_s, l2_slice_share=l2_slice_share)


# a kernel's fixed time (launch, the stores' completion, the tail: what a small copy takes beyond the engine's own
# time for it, its first loads' round trip and bytes), eager and replayed from a CUDA graph: both derived the same
# way from measured small copies (constants_source; validate.launch_from_copy; tests/napkin/test_validate_tilecore.py)
LAUNCH_S_H100 = 4.15e-6
# the share of a kernel's L2 re-reads (bytes into the SMs beyond their lines' first read from HBM) that reach the L2's
# slices, counted by Nsight Compute on tilecore's Gluon GEMM at 8192^3 (lts__t_sectors_srcunit_tex_op_read against
# l1tex__m_xbar2l1tex_read_bytes, less dram__bytes_read): 0.41 in 128 x 256 tiles, 0.33 in 64 x 256, 0.57 in
# 128 x 128 (notes/napkin/runs/hh_ncu_l2_s42a_run2_session42_h100.txt); the largest, so the slices bound no kernel
# below what was counted. The load-only ring of the same tiles merged nothing (its reads 0.98-1.01 of its tiles')
SLICE_SHARE = 0.57
GRAPH_LAUNCH_S_H100 = 0.89e-6

A100 = _gpu(
    "a100", "A100-SXM4-80GB", sms=108, clock_hz=1.41e9,
    hbm=(80e9, 2.039e12), hbm_src="NVIDIA A100 datasheet: HBM2e 2,039 GB/s (80GB SXM)",
    l2_bytes=40 * 2**20, l2_bw=5120 * 1.41e9,
    l2_src="A100 whitepaper: 40 MB L2, 5120 bytes/clk read bandwidth at 1410 MHz",
    smem_kb=164, smem_block_kb=163,
    tensor={"tf32": 156e12, "fp16": 312e12, "bf16": 312e12},
    tensor_src="NVIDIA A100 datasheet: dense TF32 156, FP16/BF16 312 TFLOP/s; no FP8 tensor cores",
    alu={"fp32": 19.5e12, "fp16": 78e12, "bf16": 39e12},
    alu_src="A100 datasheet/whitepaper: FP32 19.5, FP16 78, BF16 39 TFLOP/s (non-tensor)",
    tc_tile=(64, 8, 32),  # mma.sync m16n8k16 per warp; 4 warps stacked -> 64 rows per consumer unit
    launch_s=LAUNCH_S_H100,
    constants_source=("launch_s: not measured on an A100 here; the H100's figure (same launch path)",),
)

H100 = _gpu(
    "h100", "H100-SXM5-80GB", sms=132, clock_hz=1.83e9,  # 989.4e12 / (132 SMs x 4096 FLOP/clk)
    hbm=(80e9, 3.35e12), hbm_src="NVIDIA H100 datasheet: HBM3 3.35 TB/s (SXM)",
    l2_bytes=50 * 2**20, l2_bw=13.96e12,
    l2_src="H100 whitepaper: 50 MB L2. Bandwidth into the SMs (the crossbar's delivery): 13.96 TB/s (105.8 GB/s an "
           "SM), the most a committed kernel drew: tilecore's Gluon GEMM at 8192^3 in 64 x 256 "
           "tiles, 4 stages, 5 MiB of operands a tile through TMA, 1.538 ms (notes/napkin/runs/"
           "napkin_topk_configs_run8_session29_h100.json; 13.0-13.96 TB/s over six committed runs of it), a lower "
           "bound. Counted by Nsight Compute (notes/napkin/runs/hh_ncu_l2_s42a_run2_session42_h100.txt): the SMs "
           "receive exactly the tiling's bytes (l1tex__m_xbar2l1tex_read_bytes), 13.68 TB/s over that launch, while "
           "the slices serve 0.41 of them (l2_slice_share). Was 14.49 TB/s, gpu_constants.py's blocks re-reading "
           "slices their SM's L1 held (notes/napkin/runs/hh_l2_s40b_run3_session40_h100.txt); before that a 10 TB/s "
           "estimate",
    smem_kb=228, smem_block_kb=227,
    tensor={"tf32": 494.7e12, "fp16": 989.4e12, "bf16": 989.4e12, "fp8": 1978.9e12},
    tensor_src="NVIDIA H100 datasheet (SXM), dense = half the sparse figures: TF32 494.7, "
               "FP16/BF16 989.4, FP8 1,978.9 TFLOP/s",
    alu={"fp32": 66.9e12, "fp16": 133.8e12, "bf16": 133.8e12},
    alu_src="NVIDIA H100 datasheet (SXM): FP32 67 TFLOP/s; FP16/BF16 non-tensor 2x FP32 (whitepaper)",
    tc_tile=(64, 8, 32),  # wgmma m64nNk16 (fp16) / k32 (fp8): 32 bytes of k per instruction
    launch_s=LAUNCH_S_H100, graph_launch_s=GRAPH_LAUNCH_S_H100, tile_latency_s=0.7e-6, mma_sync_fraction=2 / 3,
    l2_unshared_bandwidth=8.1e12, multicast_chunk_s=0.44e-6, l2_slice_share=SLICE_SHARE,
    constants_source=(
        "l2_unshared_bandwidth 8.1 TB/s, the L2's slices: Nsight Compute's peak for the SMs' reads is 8.73 TB/s "
        "(lts__t_sectors_srcunit_tex_op_read.sum.peak_sustained x the L2 clock), which a load-only ring of a GEMM's "
        "tiles reaches at 8.0-8.25 (its counted reads = its tiles' bytes) and the Gluon GEMM's slices at 4.4-6.9 "
        "(notes/napkin/runs/hh_ncu_l2_s42a_run2_session42_h100.txt). "
        "Bulk copies (cp.async.bulk) from a 16 MiB L2-resident set, each SM its own "
        "lines: 7.85-8.10 TB/s (59-61 GB/s an SM), two blocks an SM no more; the same lines read by 12-132 SMs at once "
        "9.9 (75 GB/s an SM); ld.global.cg 5.8 (notes/napkin/runs/hh_l2share_s41a_run1_session41_h100.txt, "
        "hh_l2_s40c_run6_session40_h100.txt); a GEMM's operand boxes in its grouped tile order by tensor TMA without "
        "MMAs 7.91-8.25 TB/s for 128x256, 128x128, 64x256 tiles and row-major order alike (hh_l2ports_s41c_run5_"
        "session41_h100.txt), where the Gluon GEMM's timings imply the same 64x256 bytes at up to 13.96; nor do its "
        "descriptors' 128-byte swizzle and 256-byte promotion or stages held a k step's MMA time lift the ring "
        "(7.95-8.14 TB/s, hh_l2ports_s41d_run7_session41_h100.txt). Reconciled by counting (session 42): the GEMM's "
        "SMs receive 2-3x what its slices serve (l2_slice_share), the ring's receive what its slices serve",
        "multicast_chunk_s 0.44 us: a multicast bulk copy of 24 or 32 KiB to 2 or 4 blocks of a cluster takes "
        "0.425-0.453 us (median 0.44) of each receiving block's ring whatever its size, the consumers' release of a buffer "
        "at CTA scope (CUTLASS's ClusterBarrier form); 0.75 us at cluster scope (hh_l2share_s41a_run1_session41_h100."
        "txt, hh_cluster_s40a_run2_session40_h100.txt)",
        "launch_s 4.15 us: benchmarks/results/h100-80gb-hbm3/copy.json's 64 KiB-1 MiB copies (torch copy_ and a "
        "Triton copy, eager do_bench medians, 4.61-5.89 us) less the engine's own time for each (their first "
        "loads' round trip and bytes: 1.00-1.40 us): 3.61-4.49 us, median 4.15 (was 4.6, the copies' time taken "
        "whole). An empty kernel measured 4.18 us eager on the lent H100 (notes/napkin/runs/"
        "napkin_gpu_constants_session26_h100.json)",
        "graph_launch_s 0.89 us: the same derivation for a kernel replayed from a CUDA graph: the graph-timed 8 KiB "
        "copy of benchmarks/results/h100-80gb-hbm3/hadamard-latency.json (1.74 us, inputs rotated past L2; notes/"
        "napkin/runs/compile_s38a_run1_session38_h100.txt) less the engine's 0.85 us for it. An empty kernel "
        "measured 0.81 us from a graph on the lent H100 (session 26's run). Was an estimate, 2.5 us, that the "
        "decode rows had carried (their merge kernel was costed without its loads' round trip)",
        "tile_latency_s 0.7 us: an estimate of a DRAM round trip under load; unloaded, a pointer chase "
        "over 64 MiB takes 0.34 us a step on the lent H200 (napkin_gpu_constants_session25_h200.json), a "
        "lower bound (queueing behind a full wave's loads comes on top)",
        "mma_sync_fraction 2/3: FlashAttention-3 (Shah et al. 2024, arXiv 2407.08608, sec. 2): Hopper's "
        "mma.sync reaches about 2/3 of the tensor cores' peak; wgmma is needed for the rest",
        "exposed_sfu 2/3: the napkin paper's account of FA3 (shared/napkin.md: softmax overhead costs 4/3 "
        "of the time in fp16, 5/3 in fp8). Not derivable for tilecore's forward from its counts ("
        "experiments/tiles/wgmma_overlap.py, notes/distributed/README.md): a consumer's step is 16 HGMMA "
        "m64n128k16 (1024 clocks of the SM's tensor cores at peak) and 66 MUFU.EX2 a thread (528 clocks of its "
        "SFU), and ptxas waits for P V before the softmax, so the two consumers' phases decide: alternating, "
        "0 exposed; in lockstep, one consumer's softmax (~780 clocks) a step, 0.74; measured at 16K 0.37-0.41",
    ),
)

H200 = dataclasses.replace(
    H100, key="h200", name="H200-SXM-141GB",
    levels=(Level("HBM", int(141e9), 4.8e12, 1, 1, "NVIDIA H200 datasheet: HBM3e 141 GB, 4.8 TB/s"),)
    + H100.levels[1:],
    notes=("H200 datasheet: same compute as H100 SXM (989 dense BF16, 1,979 dense FP8 TFLOP/s)",))

GPUS = {g.key: g for g in (A100, H100, H200)}


def get_gpu(key) -> GPU:
    if isinstance(key, GPU):
        return key
    k = str(key).lower().replace("-", "").replace("_", "")
    for name, gpu in GPUS.items():
        if k == name or k == gpu.name.lower().replace("-", "").replace("_", ""):
            return gpu
    raise UnknownGPUError(f"unknown GPU {key!r}; accepted: {', '.join(GPUS)}")


def abstract_level(capacity_values: float, dtype: str = "fp16", bandwidth: float = 1.0) -> GPU:
    """A one-level machine for the paper's closed forms: fast memory of `capacity_values` elements,
    no alignment, no pipelining, intermediates free. Used to check H against formulas."""
    q = dtype_bytes(dtype)
    big = float("inf")
    return GPU(
        key="abstract", name=f"abstract (M={capacity_values:g} values)", sms=1, clock_hz=1.0,
        levels=(Level("HBM", 2**62, bandwidth, 1, 1, "abstract"),
                Level("SMEM", int(capacity_values * q), bandwidth * 1e9, 1, 1, "abstract")),
        units={"tensor": ComputeUnit("tensor", {d: big for d in DTYPE_BYTES}, "abstract"),
               "sfu": ComputeUnit("sfu", {d: big for d in DTYPE_BYTES}, "abstract"),
               "alu": ComputeUnit("alu", {d: big for d in DTYPE_BYTES}, "abstract")},
        tc_tile=(1, 1, 1), max_smem_per_block=int(capacity_values * q), max_rf_per_warpgroup=2**62,
        coalesce_bytes=1)


def from_constants_json(path, base="h100", label: str = "measured") -> GPU:
    """The preset `base` with the constants that experiments/napkin/gpu_constants.py wrote to `path`
    (its JSON: {"constants": {...}, "source": ...}) folded in, each with that run as its source."""
    import json
    from pathlib import Path

    data = json.loads(Path(path).read_text())
    data.setdefault("source", str(path))
    return get_gpu(base).with_constants(data, label=label)
