"""The cluster / multicast level of the napkin, measured (issue 36, paper coverage).

``engine.relabel(..., cluster={axis: c})`` charges a tile that c blocks of a cluster share one L2 read (a multicast
copy writes it into the c blocks' shared memory). This probe measures what that assumes: the bytes a second that
reach the SMs' shared memory from an L2-resident working set (16 MiB, as hardware.py's L2 figure was measured), with
1 block an SM (a 4-stage ring of 32 KiB chunks), when

- ``plain``: each block loads its own chunks (bulk copies, no cluster);
- ``cluster2`` / ``cluster4``: the same in clusters of 2 / 4 (the launch's cost alone);
- ``mc2`` / ``mc4``: clusters of 2 / 4 where each chunk is read once for the cluster (multicast to all its blocks);
- ``mc2_cta`` / ``mc4_cta``: the same with the consumers' remote release and the issuer's wait at the instructions'
  default (CTA) scope, as CUTLASS's cluster barrier has them (``mc*`` use cluster scope): what a multicast chunk
  costs beyond the copy.

Phase ``gemmring``: a GEMM's operand traffic without its MMAs (kernel ``gemm_ring_probe``): one block an SM walks
8192 x 8192 output tiles in the grouped order and loads each k step's A and B boxes (128 bytes of k, bf16 K 8192) by
tensor TMA into a ring: the bytes the SMs take in from L2 where the running tiles share their panels, for 128 x 256,
128 x 128 and 64 x 256 tiles, and 128 x 256 in row-major order (group 1).

Phase ``shared``: plain bulk copies on every SM where ``g`` blocks in a row follow one chunk sequence, so up to g SMs
read the same lines at about the same time (a GEMM's concurrent tiles read one operand panel so): the L2's delivered
bandwidth when lines are shared against when every SM reads its own (g = 1).

Delivered TB/s is the bytes written into shared memory; L2 TB/s the bytes read from L2 (delivered / c under
multicast). The model's prediction: delivered = c x the preset's L2 bandwidth while no other level binds. Every
mode also runs in a check mode where each block sums every 32-bit word it receives, compared exactly with the sums
of the chunks it should have received (the sums poisoned first: a block that writes nothing fails).

The kernel is CUDA C (experiments/napkin/cluster_multicast.cu), built with nvcc for sm_90a and launched through the
driver API (cuLaunchKernelEx with a cluster dimension): triton 3.6's Gluon does not emit multicast copies (phase
``gluon``, which compiles on a CPU too, records the PTX of a TMA load with a broadcast cga_layout).

    python experiments/napkin/gpu_cluster_multicast.py [--smoke] [--deadline 100]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from experiments.common.gpu_script import Run, time_rounds  # noqa: E402

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "cluster_multicast.cu"
KB = 1024
MODES = {"plain": (1, 0), "cluster2": (2, 0), "mc2": (2, 1), "mc2_cta": (2, 2), "cluster4": (4, 0), "mc4": (4, 1),
         "mc4_cta": (4, 2)}
GROUPS = (1, 2, 4, 12, 33, 132)


def nvcc() -> str | None:
    for cand in (shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if cand and os.path.exists(cand):
            return cand
    return None


def build(out_dir: str) -> tuple[bytes, float]:
    """The probe's cubin for sm_90a and the seconds nvcc took."""
    path = os.path.join(out_dir, "cluster_multicast.cubin")
    t = time.time()
    subprocess.run([nvcc(), "-cubin", "-arch=sm_90a", "-O3", "-o", path, str(SOURCE)], check=True)
    return Path(path).read_bytes(), time.time() - t


def sass_ops(cubin: bytes) -> dict:
    """Counts of the copy and barrier instructions in the cubin's SASS (cuobjdump from triton's own bin)."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True).stdout
    keys = ["UBLKCP.S.G.MULTICAST", "UBLKCP.S.G ", "UCGABAR_ARV", "SYNCS.ARRIVE.TRANS64.RED", "UTMALDG.2D"]
    return {k.strip(): sass.count(k) for k in keys}


@triton.jit
def l2_read_kernel(x_ptr, out_ptr, slice_elems, passes, programs, ROTATE: tl.constexpr, CG: tl.constexpr,
                   BLOCK: tl.constexpr, SAME: tl.constexpr = False):
    # each program sums a slice `passes` times: its own (as gpu_constants.py measured the preset's L2 figure: the
    # slices of an SM's programs fit its L1), or with ROTATE another program's slice each pass (no L1 reuse);
    # CG: loads that bypass L1 (ld.global.cg); SAME: every program reads the same slice each pass (shared lines)
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), tl.float32)
    for p in range(passes):
        if SAME:
            owner = (p * 7) % programs
        elif ROTATE:
            owner = (pid + p * 7) % programs
        else:
            owner = pid
        base = owner.to(tl.int64) * slice_elems
        for start in range(0, slice_elems, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            if CG:
                acc += tl.load(x_ptr + base + offs, mask=offs < slice_elems, other=0.0, cache_modifier=".cg")
            else:
                acc += tl.load(x_ptr + base + offs, mask=offs < slice_elems, other=0.0)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def ldg_phase(run: Run, sms: int, smoke: bool) -> None:
    """The L2 read the preset's 14.49 TB/s comes from (528 programs each re-reading its own 32 KB slice of a 16 MiB
    set 64 times), beside the same reads bypassing L1 (.cg) and reading another program's slice each pass."""
    programs = 8 if smoke else sms * 4
    total = (1 << 12) if smoke else (16 << 20) // 4
    slice_elems = total // programs
    passes = 2 if smoke else 64
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.rand(programs * slice_elems, device=dev)
    sums = x.view(programs, slice_elems).double().sum(1)
    fns = {}
    for name, rotate, cg, same in (("own", False, False, False), ("own_cg", False, True, False),
                                   ("rotate", True, False, False), ("rotate_cg", True, True, False),
                                   ("same_cg", False, True, True)):
        out = torch.full((programs,), float("nan"), device=dev)
        fn = (lambda out=out, r=rotate, c=cg, sm=same: l2_read_kernel[(programs,)](
            x, out, slice_elems, passes, programs, ROTATE=r, CG=c, BLOCK=1024, SAME=sm))
        fn()
        owners = [[(q * 7) % programs if same else (p + q * 7) % programs if rotate else p for q in range(passes)]
                  for p in range(programs)]
        ref = torch.stack([sums[o].sum() for o in owners]) if rotate or same else sums * passes
        err = ((out.double().cpu() - ref.cpu()).abs() / ref.cpu().abs().clamp_min(1)).max().item()
        run.row(f"check ldg {name}", **{"pass": err < 1e-3}, rel_err=err)
        fns[name] = fn
    if smoke:
        return
    t = time_rounds(fns, rounds=3, warmup=5, rep=40, deadline=run)
    for name in fns:
        ms = t[f"{name}_ms"]
        bw = programs * slice_elems * 4 * passes / (ms * 1e-3)
        run.row(f"time ldg {name}", ms=ms, read_tbs=round(bw / 1e12, 3), per_sm_gbs=round(bw / sms / 1e9, 1),
                rounds=t[f"{name}_rounds"])


class LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: id, pad, a 64-byte value union (clusterDim first)
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("x", ctypes.c_uint), ("y", ctypes.c_uint),
                ("z", ctypes.c_uint), ("rest", ctypes.c_char * 52)]


class LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


CLUSTER_DIMENSION = 4          # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
MAX_DYNAMIC_SHARED = 8         # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


class Probe:
    """The cubin loaded into torch's context; ``launch`` enqueues one run on torch's current stream."""

    def __init__(self, cubin: bytes):
        assert ctypes.sizeof(LaunchAttribute) == 72 and ctypes.sizeof(LaunchConfig) == 56
        torch.zeros(1, device="cuda")  # torch's primary context, current on this thread
        self.cu = ctypes.CDLL("libcuda.so.1")
        self._ok(self.cu.cuInit(0), "cuInit")
        self.module, self.fn = ctypes.c_void_p(), ctypes.c_void_p()
        self._image = ctypes.create_string_buffer(cubin, len(cubin))
        self._ok(self.cu.cuModuleLoadData(ctypes.byref(self.module), self._image), "cuModuleLoadData")
        self._ok(self.cu.cuModuleGetFunction(ctypes.byref(self.fn), self.module, b"cluster_multicast_probe"),
                 "cuModuleGetFunction")
        # the function's dynamic shared memory bound once, at Hopper's most a block (227 KiB): a launch of any
        # ring size fits under it (set per configuration, the last one set would bound the others' launches)
        self._ok(self.cu.cuFuncSetAttribute(self.fn, MAX_DYNAMIC_SHARED, 227 * 1024), "cuFuncSetAttribute")
        self.gemm_fn = ctypes.c_void_p()
        self._ok(self.cu.cuModuleGetFunction(ctypes.byref(self.gemm_fn), self.module, b"gemm_ring_probe"),
                 "cuModuleGetFunction")
        self._ok(self.cu.cuFuncSetAttribute(self.gemm_fn, MAX_DYNAMIC_SHARED, 227 * 1024), "cuFuncSetAttribute")
        self._maps = []  # tensor maps stay alive while a launch may read them

    def _ok(self, code: int, what: str):
        if code != 0:
            name = ctypes.c_char_p()
            self.cu.cuGetErrorName(code, ctypes.byref(name))
            raise RuntimeError(f"{what}: CUDA driver error {code} ({name.value})")

    def config(self, grid: int, c: int, smem: int):
        attr = LaunchAttribute(id=CLUSTER_DIMENSION, x=c, y=1, z=1)
        cfg = LaunchConfig(grid, 1, 1, 64, 1, 1, smem, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream),
                           ctypes.pointer(attr), 1)
        cfg._attr = attr  # keep it alive
        return cfg

    def max_clusters(self, c: int, smem: int) -> int:
        n = ctypes.c_int()
        self._ok(self.cu.cuOccupancyMaxActiveClusters(ctypes.byref(n), self.fn, ctypes.byref(self.config(c, c, smem))),
                 "cuOccupancyMaxActiveClusters")
        return n.value

    def launch(self, cfg, src, src_chunks, chunk, nchunks, stages, multicast, check, sums, flag, group=1):
        args = [ctypes.c_uint64(src.data_ptr()), ctypes.c_uint64(src_chunks), ctypes.c_uint(chunk),
                ctypes.c_uint(nchunks), ctypes.c_uint(stages), ctypes.c_uint(multicast), ctypes.c_uint(check),
                ctypes.c_uint64(sums.data_ptr()), ctypes.c_uint64(flag.data_ptr()), ctypes.c_uint(group)]
        params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
        self._ok(self.cu.cuLaunchKernelEx(ctypes.byref(cfg), self.fn, params, None), "cuLaunchKernelEx")


def tensor_map(probe: "Probe", t: torch.Tensor, box_rows: int, swizzle: int = 0, promotion: int = 2):
    """A CUtensorMap (128 bytes, 64-byte aligned) over a 2-D uint8 tensor, boxes of box_rows x 128 bytes; swizzle 0
    (none) or 3 (128 B, as the Gluon GEMM's descriptors), L2 promotion 2 (128 B) or 3 (256 B)."""
    raw = ctypes.create_string_buffer(128 + 64)
    addr = (ctypes.addressof(raw) + 63) // 64 * 64
    rows, cols = t.shape
    dims = (ctypes.c_uint64 * 2)(cols, rows)
    strides = (ctypes.c_uint64 * 1)(t.stride(0))
    box = (ctypes.c_uint32 * 2)(128, box_rows)
    estr = (ctypes.c_uint32 * 2)(1, 1)
    # CU_TENSOR_MAP_DATA_TYPE_UINT8 0, rank 2, interleave none 0, OOB fill none 0
    probe._ok(probe.cu.cuTensorMapEncodeTiled(ctypes.c_void_p(addr), 0, 2, ctypes.c_void_p(t.data_ptr()), dims, strides,
                                              box, estr, 0, swizzle, promotion, 0), "cuTensorMapEncodeTiled")
    probe._maps.append(raw)
    return ctypes.c_void_p(addr)


def gemm_tile_order(tiles_m: int, tiles_n: int, group_m: int):
    """(pm, pn) of each tile in the kernel's grouped order."""
    out = []
    for t in range(tiles_m * tiles_n):
        first = t // (group_m * tiles_n) * group_m
        rows = min(tiles_m - first, group_m)
        out.append((first + t % rows, (t % (group_m * tiles_n)) // rows))
    return out


# (name, bm, bn, stages, group, swizzle, promotion, pace clocks, B N-major): pace ~ a k step's MMAs at 750 TFLOP/s
# (64 x 256: 0.37 us, 128 x 256: 0.74 us at 1.755 GHz); B N-major: as the GEMM's row-major [K, N] B (bn / 64 boxes of 64
# rows x 128 bytes a k step), else K-major (bn rows of 128 bytes)
GEMM_RINGS = (
    ("128x256", 128, 256, 4, 8, 0, 2, 0, 0), ("64x256", 64, 256, 5, 8, 0, 2, 0, 0),
    ("64x256 sw128", 64, 256, 5, 8, 3, 3, 0, 0), ("128x256 sw128", 128, 256, 4, 8, 3, 3, 0, 0),
    ("64x256 paced", 64, 256, 5, 8, 0, 2, 650, 0), ("64x256 sw128 paced", 64, 256, 5, 8, 3, 3, 650, 0),
    ("128x256 sw128 paced", 128, 256, 4, 8, 3, 3, 1300, 0), ("128x128", 128, 128, 6, 8, 0, 2, 0, 0),
    ("128x256 row-major", 128, 256, 4, 1, 0, 2, 0, 0))


def gemm_rings(probe: Probe, flag, sms: int, specs=GEMM_RINGS, m: int = 8192, n: int = 8192, kbytes: int = 16384):
    """gemm_ring_probe's launchers at m x n output, kbytes of k a row (bf16 K 8192: 16384): {name: (launch(check, out),
    bytes into the SMs, each block's expected word sum)}; A [m, kbytes] K-major, B [n, kbytes] K-major or [kbytes / 2,
    2 n] N-major, random bytes."""
    k_steps = kbytes // 128
    a = torch.randint(0, 256, (m, kbytes), dtype=torch.uint8, device="cuda")
    b = torch.randint(0, 256, (n, kbytes), dtype=torch.uint8, device="cuda")
    b_nm = torch.randint(0, 256, (kbytes // 2, 2 * n), dtype=torch.uint8, device="cuda")
    words = {name: (x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF) for name, x in (("a", a), ("b", b), ("nm", b_nm))}
    probe._maps += [a, b, b_nm]  # the tensor maps read them: alive as long as the maps
    out = {}
    for name, bm, bn, stages, group_m, swz, promo, pace, nmajor in specs:
        tiles_m, tiles_n = m // bm, n // bn
        smem = stages * (bm + bn) * 128 + 2 * 8 * stages
        maps = (tensor_map(probe, a, bm, swz, promo), tensor_map(probe, b_nm, 64, swz, promo) if nmajor
                else tensor_map(probe, b, bn, swz, promo))
        cfg = probe.config(sms, 1, smem)

        def launch(check, res, bm=bm, bn=bn, stages=stages, group_m=group_m, maps=maps, cfg=cfg, tm=tiles_m, tn=tiles_n,
                   pace=pace, nmajor=nmajor):
            args = [ctypes.c_uint(v) for v in (tm, tn, k_steps, group_m, bm, bn, stages, check)]
            args += [ctypes.c_uint64(res.data_ptr()), ctypes.c_uint64(flag.data_ptr()), ctypes.c_uint(pace),
                     ctypes.c_uint(nmajor)]
            ptrs = [maps[0], maps[1]] + [ctypes.cast(ctypes.pointer(x), ctypes.c_void_p) for x in args]
            params = (ctypes.c_void_p * len(ptrs))(*ptrs)
            probe._ok(probe.cu.cuLaunchKernelEx(ctypes.byref(cfg), probe.gemm_fn, params, None), "cuLaunchKernelEx")

        a_tile = words["a"].view(tiles_m, bm * kbytes // 4).sum(1)
        if nmajor:  # tile pn's B: every row's columns pn * 2 bn .. (pn + 1) * 2 bn - 1 (bytes)
            b_tile = words["nm"].view(kbytes // 2, tiles_n, bn * 2 // 4).sum((0, 2))
        else:
            b_tile = words["b"].view(tiles_n, bn * kbytes // 4).sum(1)
        order = torch.tensor(gemm_tile_order(tiles_m, tiles_n, group_m), device="cuda")
        per_tile = a_tile[order[:, 0]] + b_tile[order[:, 1]]
        block = torch.arange(order.shape[0], device="cuda") % sms
        expected = torch.zeros(sms, dtype=torch.int64, device="cuda").index_add_(0, block, per_tile)
        out[name] = (launch, tiles_m * tiles_n * k_steps * (bm + bn) * 128, expected)
    return out


def gemm_phase(run: Run, probe: Probe, flag, sms: int, specs=GEMM_RINGS) -> None:
    """gemm_ring_probe at 8192 x 8192, 16 KiB of k a row (bf16 K 8192): each tile shape checked (every block's word sums
    against the host's), then timed in interleaved rounds; delivered = bytes into the SMs' shared memory a second."""
    fns, plans = {}, {}
    for name, (launch, nbytes, expected) in gemm_rings(probe, flag, sms, specs).items():
        sums = torch.full((sms,), -1, dtype=torch.int64, device="cuda")
        launch(1, sums)
        torch.cuda.synchronize()
        ok = bool(torch.equal(sums, expected)) and int(flag.item()) == 0
        spec = next(s for s in specs if s[0] == name)
        run.row(f"check gemmring {name}", stages=spec[3], group_m=spec[4], swizzle=spec[5], promotion=spec[6],
                pace=spec[7], b_nmajor=spec[8], **{"pass": ok})
        out = torch.empty(sms, dtype=torch.int64, device="cuda")
        fns[name] = (lambda launch=launch, out=out: launch(0, out))
        plans[name] = nbytes
    t = time_rounds(fns, rounds=3, warmup=5, rep=20, deadline=run)
    for name, nbytes in plans.items():
        ms = t[f"{name}_ms"]
        bw = nbytes / (ms * 1e-3)
        run.row(f"time gemmring {name}", ms=ms, delivered_tbs=round(bw / 1e12, 3), per_sm_gbs=round(bw / sms / 1e9, 1),
                rounds=t[f"{name}_rounds"])


def expected_sums(src: torch.Tensor, chunk: int, nchunks: int, grid: int, c: int, multicast: int,
                  group: int = 1) -> torch.Tensor:
    """Each block's sum of the 32-bit words (unsigned) of the chunks it should receive: block b's chunk j is chunk
    (stream * 97 + j) mod src_chunks, stream = b // c under multicast (its cluster), else b // group."""
    words = src.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    chunk_sums = words.view(-1, chunk // 4).sum(1)
    src_chunks = chunk_sums.numel()
    block = torch.arange(grid, device=src.device, dtype=torch.int64)
    stream = block // c if multicast else block // group
    idx = (stream[:, None] * 97 + torch.arange(nchunks, device=src.device)[None, :]) % src_chunks
    return chunk_sums[idx].sum(1)


def ring_source(ring: str, mib_per_block: int):
    """A ring's (chunk bytes, stages, shared memory a block, chunks in the 16 MiB L2-resident set, the set, chunks a
    block copies)."""
    kb, stages = (int(v) for v in ring.split("x"))
    chunk = kb * KB
    src_chunks = 16 * 2**20 // chunk
    src = torch.randint(0, 256, (src_chunks * chunk,), dtype=torch.uint8, device="cuda")
    return chunk, stages, stages * chunk + 3 * 8 * stages, src_chunks, src, mib_per_block * 2**20 // chunk


def ring_phase(run: Run, probe: Probe, flag, sms: int, l2: float, ring: str, mib_per_block: int) -> None:
    """Every mode on one ring (chunk KiB x stages): the checks, then the timing in interleaved rounds."""
    chunk, stages, smem, src_chunks, src, nchunks = ring_source(ring, mib_per_block)
    plans = {}
    for name, (c, mc) in MODES.items():
        clusters = probe.max_clusters(c, smem)
        grid = min(clusters, sms // c) * c
        plans[name] = (c, mc, grid, probe.config(grid, c, smem))
        # check mode: every word of every chunk summed, a few laps of the ring
        sums = torch.full((grid,), -1, dtype=torch.int64, device="cuda")
        check_chunks = 8 * stages + 3
        probe.launch(plans[name][3], src, src_chunks, chunk, check_chunks, stages, mc, 1, sums, flag)
        torch.cuda.synchronize()
        ok = bool(torch.equal(sums, expected_sums(src, chunk, check_chunks, grid, c, mc))) and int(flag.item()) == 0
        run.row(f"check {ring} {name}", cluster=c, multicast=mc, grid=grid, max_active_clusters=clusters,
                **{"pass": ok})
    fns = {}
    for name, (c, mc, grid, cfg) in plans.items():
        sums = torch.empty(grid, dtype=torch.int64, device="cuda")
        fns[name] = (lambda cfg=cfg, mc=mc, sums=sums:
                     probe.launch(cfg, src, src_chunks, chunk, nchunks, stages, mc, 0, sums, flag))
    t = time_rounds(fns, rounds=3, warmup=5, rep=40, deadline=run)
    for name, (c, mc, grid, cfg) in plans.items():
        ms = t[f"{name}_ms"]
        delivered = grid * nchunks * chunk / (ms * 1e-3)
        predicted = min(grid / sms, 1.0) * l2 * (c if mc else 1)
        run.row(f"time {ring} {name}", cluster=c, multicast=mc, grid=grid, ms=ms,
                delivered_tbs=round(delivered / 1e12, 3), l2_tbs=round(delivered / (c if mc else 1) / 1e12, 3),
                per_sm_gbs=round(delivered / grid / 1e9, 1), napkin_delivered_tbs=round(predicted / 1e12, 3),
                measured_over_napkin=round(delivered / predicted, 3), rounds=t[f"{name}_rounds"])


def share_phase(run: Run, probe: Probe, flag, sms: int) -> None:
    """Plain bulk copies (no cluster) from the L2-resident set on a half and a quarter of the SMs (1 block an SM:
    a 32 KiB x 4 ring), and 2 blocks an SM (16 KiB x 6 rings): is ~60 GB/s an SM the SM's intake or the whole
    L2's rate shared out?"""
    fns, plans = {}, {}
    for name, chunk, stages, grid in (("all SMs 1/SM", 32 * KB, 4, sms), ("half 1/SM", 32 * KB, 4, sms // 2),
                                      ("quarter 1/SM", 32 * KB, 4, sms // 4), ("all SMs 2/SM", 16 * KB, 6, 2 * sms)):
        smem = stages * chunk + 3 * 8 * stages
        src_chunks = 16 * 2**20 // chunk
        src = torch.randint(0, 256, (src_chunks * chunk,), dtype=torch.uint8, device="cuda")
        cfg = probe.config(grid, 1, smem)
        sums = torch.full((grid,), -1, dtype=torch.int64, device="cuda")
        probe.launch(cfg, src, src_chunks, chunk, 8 * stages + 3, stages, 0, 1, sums, flag)
        torch.cuda.synchronize()
        ok = bool(torch.equal(sums, expected_sums(src, chunk, 8 * stages + 3, grid, 1, 0))) and int(flag.item()) == 0
        run.row(f"check share {name}", grid=grid, **{"pass": ok})
        nchunks = 32 * 2**20 // chunk  # 32 MiB a block
        plans[name] = (grid, nchunks * chunk)
        fns[name] = (lambda cfg=cfg, src=src, sc=src_chunks, ch=chunk, n=nchunks, st=stages, sums=sums:
                     probe.launch(cfg, src, sc, ch, n, st, 0, 0, sums, flag))
    t = time_rounds(fns, rounds=3, warmup=5, rep=40, deadline=run)
    for name, (grid, per_block) in plans.items():
        ms = t[f"{name}_ms"]
        bw = grid * per_block / (ms * 1e-3)
        sms_used = min(grid, sms)
        run.row(f"time share {name}", grid=grid, ms=ms, delivered_tbs=round(bw / 1e12, 3),
                per_sm_gbs=round(bw / sms_used / 1e9, 1), rounds=t[f"{name}_rounds"])


def shared_phase(run: Run, probe: Probe, flag, sms: int, ring: str, mib_per_block: int) -> None:
    """Plain bulk copies on every SM (one block an SM, no cluster) where `g` blocks in a row follow one chunk sequence:
    the delivered bandwidth when up to g SMs read the same lines at about the same time (g = 1: each its own)."""
    chunk, stages, smem, src_chunks, src, nchunks = ring_source(ring, mib_per_block)
    cfg = probe.config(sms, 1, smem)
    fns = {}
    for g in GROUPS:
        sums = torch.full((sms,), -1, dtype=torch.int64, device="cuda")
        check_chunks = 8 * stages + 3
        probe.launch(cfg, src, src_chunks, chunk, check_chunks, stages, 0, 1, sums, flag, g)
        torch.cuda.synchronize()
        ok = bool(torch.equal(sums, expected_sums(src, chunk, check_chunks, sms, 1, 0, g))) and int(flag.item()) == 0
        run.row(f"check shared {ring} g{g}", grid=sms, group=g, **{"pass": ok})
        out = torch.empty(sms, dtype=torch.int64, device="cuda")
        fns[f"g{g}"] = (lambda g=g, out=out: probe.launch(cfg, src, src_chunks, chunk, nchunks, stages, 0, 0, out,
                                                            flag, g))
    t = time_rounds(fns, rounds=3, warmup=5, rep=40, deadline=run)
    for g in GROUPS:
        ms = t[f"g{g}_ms"]
        delivered = sms * nchunks * chunk / (ms * 1e-3)
        run.row(f"time shared {ring} g{g}", grid=sms, group=g, ms=ms, delivered_tbs=round(delivered / 1e12, 3),
                l2_tbs=round(delivered / g / 1e12, 3), per_sm_gbs=round(delivered / sms / 1e9, 1),
                rounds=t[f"g{g}_rounds"])


def gluon_phase(run: Run) -> None:
    """Triton 3.6's Gluon with num_ctas=2 and a broadcast cga_layout on a TMA load: the PTX's bulk-tensor copies and
    whether any is a multicast (the reason this probe is CUDA C)."""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from tilecore.tiles.compile import compile_kernel

    @gluon.jit
    def broadcast_load(desc, out_ptr, BM: gl.constexpr, BK: gl.constexpr):
        smem = gl.allocate_shared_memory(desc.dtype, [BM, BK], desc.layout)
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout(cga_layout=[[0]]))
        mbarrier.init(bar, count=1)
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0], cga_layout=[[0, 0]])
        mbarrier.expect(bar, BM * BK * 2)
        tma.async_copy_global_to_shared(desc, [0, 0], bar, smem)
        mbarrier.wait(bar, 0)
        mbarrier.invalidate(bar)
        s = gl.sum(gl.sum(smem.load(layout).to(gl.float32), axis=1), axis=0)
        gl.store(out_ptr + gl.program_id(0), s)

    x = torch.empty(256, 64, dtype=torch.bfloat16)
    layout = gl.NVMMASharedLayout.get_default_for([128, 64], gl.bfloat16, cga_layout=[[0, 0]])
    desc = TensorDescriptor.from_tensor(x, [128, 64], layout)
    k = compile_kernel(broadcast_load, dict(desc=desc, out_ptr=torch.empty(2), BM=128, BK=64), num_warps=4, num_ctas=2)
    lines = [ln.strip() for ln in k.asm["ptx"].splitlines()]
    copies = [ln for ln in lines if "cp.async.bulk.tensor" in ln]
    run.row("gluon broadcast cga_layout", num_ctas=2, cluster_in_ptx=any(".reqnctapercluster 2" in ln for ln in lines),
            bulk_tensor_copies=len(copies), multicast_copies=sum(".multicast::cluster" in ln for ln in copies),
            copy=copies[0][:160] if copies else None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="no GPU: build the cubin, read its SASS, the Gluon phase")
    ap.add_argument("--deadline", type=float, default=100.0)
    ap.add_argument("--rings", default="32x4,24x8", help="chunk KiB x stages, comma-separated")
    ap.add_argument("--mib-per-block", type=int, default=64)
    ap.add_argument("--phases", default="rings", help="of: rings, share, shared, gemmring, ldg")
    ap.add_argument("--shared-ring", default="24x8", help="the shared phase's ring (chunk KiB x stages)")
    args = ap.parse_args(argv)
    run = Run("napkin_cluster_multicast", deadline=args.deadline)
    phases = set(args.phases.split(","))
    if "ldg" in phases:
        run.attempt("ldg", ldg_phase, run, torch.cuda.get_device_properties(0).multi_processor_count
                    if torch.cuda.is_available() else 132, args.smoke or not torch.cuda.is_available())
    run.attempt("gluon", gluon_phase, run)
    if nvcc() is None:
        run.errors.append("no nvcc")
        run.finish(["name"])
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        cubin, seconds = build(tmp)
    run.row("build", nvcc_s=round(seconds, 1), **(run.attempt("sass", sass_ops, cubin) or {}))
    if args.smoke or not torch.cuda.is_available():
        src = torch.randint(0, 256, (64 * KB,), dtype=torch.uint8)
        ref = expected_sums(src, 4 * KB, 5, 4, 2, 1)
        assert torch.equal(ref[0], ref[1]) and not torch.equal(ref[1], ref[2])  # a cluster's blocks share a stream
        ref = expected_sums(src, 4 * KB, 5, 8, 1, 0, 4)
        assert torch.equal(ref[0], ref[3]) and not torch.equal(ref[3], ref[4])  # so do a group's
        for tm, tn, g in ((64, 32, 8), (64, 64, 8), (128, 32, 8), (64, 32, 1)):  # each tile once, in any order
            assert sorted(gemm_tile_order(tm, tn, g)) == [(i, j) for i in range(tm) for j in range(tn)]
        assert ctypes.sizeof(LaunchAttribute) == 72 and ctypes.sizeof(LaunchConfig) == 56  # cuda.h's, CUDA 12-13
        run.finish(["name", "nvcc_s", "UBLKCP.S.G.MULTICAST", "UTMALDG.2D", "multicast_copies"])
        return 0

    from tilecore.napkin import H100

    l2 = next(lv for lv in H100.levels if lv.name == "L2").bandwidth
    probe = Probe(cubin)
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    run.extra["settings"] = {"working_set": 16 * 2**20, "mib_per_block": args.mib_per_block,
                             "napkin_l2_bytes_per_s": l2, "sms": sms, "rings": args.rings}
    if "share" in phases:
        run.attempt("share", share_phase, run, probe, flag, sms)
    if "shared" in phases:
        run.attempt("shared", shared_phase, run, probe, flag, sms, args.shared_ring, args.mib_per_block)
    if "gemmring" in phases:
        run.attempt("gemmring", gemm_phase, run, probe, flag, sms)
    for ring in (args.rings.split(",") if "rings" in phases else []):
        if run.left() < 15:
            run.errors.append(f"deadline: ring {ring} not run")
            break
        run.attempt(f"ring {ring}", ring_phase, run, probe, flag, sms, l2, ring, args.mib_per_block)
    run.finish(["name", "pass", "grid", "group", "ms", "delivered_tbs", "l2_tbs", "read_tbs", "per_sm_gbs",
                "napkin_delivered_tbs", "measured_over_napkin", "multicast_copies"])
    return 0 if not run.errors and all(r.get("pass", True) for r in run.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
