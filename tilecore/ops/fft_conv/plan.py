"""Which implementation convolves these sequences (every fit check in one place).

* "gluon": the one-pass kernel in Gluon (gluon_onepass.py: every DFT stage a wgmma, the DFT matrices
  resident in shared memory) for bf16 / fp16 u at N in configs.GLUON_ONEPASS on Hopper under a triton
  the Gluon kernels were checked under (dispatch.gluon_ok); empty until a GPU run checks it;
* "order3": the order-3 one-pass kernel in Gluon (gluon_order3.py) for bf16 / fp16 u at N in
  configs.GLUON_ORDER3 (8192; 16384 with two warpgroups a pair), on Hopper as "gluon";
* "mono": the one-pass three-factor kernel (kernels_mono.py) for bf16 / fp16 u at N in
  configs.MONO_CONFIGS (empty until a GPU run checks it: the switch);
* "pair": the fast kernel (kernels_pair.py: two sequences as one complex one, float16 DFT matrices on
  tensor cores) for bf16 / fp16 u at N in configs.PAIR_CONFIGS (256, 512, 1024, 4096);
* "long": the same method in three passes through a float16 scratch (kernels_long.py) for bf16 / fp16
  u at N in configs.LONG_CONFIGS (8192, 16384; and 2048, where the pair kernels failed on the GPU);
* "tl": the float32 Monarch kernel (kernels.py) for the other dtypes (float32) at N in
  configs.TL_FACTORS;
* "torch": torch.fft in float32 (rfft of length 2N, product, irfft): every other N, and CPU tensors
  without the interpreter.

The kernels run on CUDA tensors, and on CPU tensors through Triton's interpreter.
"""
from __future__ import annotations

import dataclasses

import torch

from tilecore import dispatch
from tilecore.ops.fft_conv import configs


@dataclasses.dataclass(frozen=True)
class Plan:
    path: str  # "gluon" | "mono" | "pair" | "long" | "tl" | "torch"
    n1: int = 0
    n2: int = 0
    num_warps: int = 4
    precision: str = "ieee"
    pairs: int = 1  # "pair": pairs of sequences per program (0: one, the transpose-free kernel)
    bn: int = 0  # "long": columns a program (passes 1 and 3)
    bk1: int = 0  # "long": rows a program (pass 2)
    kc: int = 0  # "long": the chunk of N1 a product takes (passes 1 and 3)
    rows_warps: int = 0  # "long": warps of pass 2
    gauss: bool = False  # "long": complex products as three real ones
    loop: int = 1  # "pair": groups of PAIRS pairs a program runs, its constants loaded once
    stages: int = 1  # "pair": software-pipelining stages of that loop
    hoist: bool = False  # "pair": the loop's constants loaded once before it
    n3: int = 1  # "mono": the third DFT factor (1: order 2)
    permute: bool = False  # "mono": stage 5 as a 2-D product after a permute (else batched)
    probe: int = 0  # "mono": timing probes (WRONG results: kernels_mono.py PROBE); never in configs
    kfull: bool = False  # "mono": the spectrum laid out as the tile on the host (kernels_mono.py KFULL); "order3": its
    # float16 bins laid out a call as the chunks read them (launch.laid_half_bins)
    per_sm: int = 0  # "gluon": persistent programs a multiprocessor (0: one program a pair)
    async_mma: bool = False  # "gluon": a complex product's four wgmmas issued at once, one wait
    tma: bool = False  # "gluon": u and y by TMA, the next pair's u loaded under this one's products
    chunk: int = 0  # "gluon": the chunked kernel's columns a step (0: the whole-tile kernel)
    rfft: bool = False  # "gluon": the kernel reads the rfft's bins itself (no host layout of the spectrum)
    warpgroups: int = 1  # "gluon", chunked: warpgroups a program, each walking its own pairs
    tw_sfu: bool = False  # "gluon": the twiddles computed (cos/sin.approx), not read from the (B, A) table
    contig: int = False  # "gluon": each walker takes a contiguous block of pairs (one channel's in a row); 2 (chunked,
    # two warpgroups): a program's block, its walkers interleaved on it
    kpre: int = 0  # "gluon": the spectrum requested before a block's stage 1 (1 registers, 2 cp.async, 3 kept a channel)
    yalias: bool = False  # "gluon", chunked with TMA: y's box is the ring slot its pair's u came in
    lean: int = 0  # "gluon": 1 fewer reductions (same values), 2 (whole tile, TMA) x read in the wgmma's layout
    maxnreg: int = 0  # "gluon": ptxas's register cap (168: 3 programs of 4 warps a multiprocessor); 0 none
    stack: bool = False  # "order3" (8192): 1a / 1'a four columns a2 a product against F2, in the wgmmas' layouts


def gluon_plan(a: int, b: int, per_sm: int, async_mma: bool = False, tma: bool = False, chunk: int = 0,
               rfft: bool = False, warpgroups: int = 1, warps: int = 4, tw_sfu: bool = False,
               contig: bool = False, kpre: int = 0, yalias: bool = False, lean: int = 0, maxnreg: int = 0) -> Plan:
    """The Gluon one-pass kernel (gluon_onepass.py): 2N = a b, b = 64; ``per_sm`` persistent programs a
    multiprocessor (0: one program a pair of sequences); ``async_mma``, ``tma``: its ASYNC and TMA (TMA
    where u and y are describable: else pointer loads); ``chunk`` > 0: the chunked kernel (always ASYNC),
    a's columns that many at a time (64 at a = 128, N = 4096, transposed: lean 4); ``rfft``: the kernel reads the rfft's
    bins (else the host lays the spectrum out as the tile, launch.mono_spectrum, every call); ``warpgroups``
    (chunked only): 2 runs two warpgroups a program, each on its own pairs; ``warps`` (the whole-tile
    kernel): 8 splits each product's columns between two warpgroups; ``tw_sfu``: the twiddles computed in
    the kernel (cos/sin.approx of the exactly reduced angle) instead of read from the table; ``contig``: each
    walker takes a contiguous block of pairs (a channel's pairs in a row: its spectrum from L1), not every
    programs-th; ``kpre``: a block's spectrum bins requested before its stage 1, their L2
    latency under stages 1-3: 1 into registers, 2 by cp.async into shared memory (``rfft`` 2), 3 as 2 but
    kept for a channel's next pairs (the whole-tile kernel on a ``contig`` walk); ``yalias`` (chunked, with TMA):
    y's box is the ring slot its pair's u came in (16 KiB a walker less: two walkers' chunks of 64 fit); ``lean``: 1
    u's four scale / flag reductions as one and the spectrum product's scale as one (the same values), 2 (the
    whole-tile kernel with TMA) x read from u's box in the wgmma's operand layout, 4 (with 1; the chunked kernel's, which requires it:
    chunks of 64, TMA, YALIAS) each chunk's tile transposed (rows k_a), so stages 3 and 3' take R and Y as register
    operands and a chunk stages one tile in shared memory, not three (gluon_onepass._transposed_walk); ``maxnreg``: ptxas's register
    cap (168 for 3 programs a multiprocessor at 1024: KPRE 2 with lean 3 fit it without spill). ``contig`` 2
    (chunked, two warpgroups): a program's contiguous block, its two walkers interleaved on it (both on one channel's
    pairs at once). ``rfft`` 3: the bins as float16 pairs (a float16 spectrum, filter_spectrum(..., torch.float16),
    read as it is: one 32-bit load a bin; with kpre 2, 3 (whole tile) 32-bit copies). (CSCALE, TWEARLY, LAG and
    PRESCALE were measured no faster or slower and removed, the untransposed chunks slower than LEAN 4's:
    notes/fft_conv.)"""
    if lean not in (0, 1, 2, 3, 5) or maxnreg not in (0, 128, 168, 255):
        raise ValueError(f"the Gluon one-pass kernel's lean is 0..3 or 5 and maxnreg 0, 128, 168 or 255; got {lean}, "
                         f"{maxnreg}")
    if yalias and not (chunk and tma):
        raise ValueError("the Gluon one-pass kernel's YALIAS (y's box in u's ring) is the chunked kernel's, with TMA")
    if rfft not in (0, 1, 2, 3):
        raise ValueError(f"the Gluon one-pass kernel's rfft is 0..3 (3: float16 bins); got {rfft}")
    if kpre not in (0, 1, 2, 3) or (kpre >= 2 and rfft not in (2, 3)) or (kpre >= 2 and chunk) or (
            kpre == 3 and not contig):
        raise ValueError(f"the Gluon one-pass kernel's spectrum prefetch is 0..3 (2, 3: the whole-tile kernel's, with "
                         f"rfft 2 or 3; 3 on a contiguous walk); got {kpre} (rfft {rfft}, chunk {chunk}, contig {contig})")
    if chunk and b != 64:
        raise ValueError(f"the chunked Gluon one-pass kernel takes 2N = 128 x 64 (N = 4096); got {a} x {b}")
    if contig not in (False, True, 2) or (contig == 2 and (not chunk or warpgroups != 2)):
        raise ValueError(f"the Gluon one-pass kernel's contig is False, True or 2 (the chunked kernel's two walkers "
                         f"interleaved on their program's block); got {contig} (chunk {chunk}, warpgroups {warpgroups})")
    if warpgroups not in (1, 2) or (warpgroups == 2 and not chunk):
        raise ValueError(f"the Gluon one-pass kernel runs 1 warpgroup a program, or 2 chunked; got {warpgroups}")
    if warps not in (4, 8) or (warps == 8 and chunk):
        raise ValueError(f"the Gluon one-pass kernel runs 4 warps, or 8 in the whole-tile kernel; got {warps}")
    if bool(chunk) != bool(lean & 4) or (chunk and not (a == 128 and chunk == 64 and tma and yalias and kpre < 2)):
        raise ValueError(f"the chunked Gluon one-pass kernel (N = 4096) takes chunks of 64 transposed: a 128, chunk 64, "
                         f"lean 4 (5 with 1), TMA with YALIAS, kpre 0 or 1 (lean 4 is that kernel's only); got a {a}, chunk "
                         f"{chunk}, lean {lean}, tma {tma}, yalias {yalias}, kpre {kpre}")
    if not chunk and (b != 64 or a not in (32, 64)):
        raise ValueError(f"the Gluon one-pass kernel takes 2N = a x 64 with a = 32 or 64 (N = 1024, 2048; the "
                         f"chunked one to 4096); got {a} x {b}")
    return Plan("gluon", n1=a, n2=b, n3=1, num_warps=warps, per_sm=per_sm, kfull=True, async_mma=async_mma or chunk > 0,
                tma=tma, chunk=chunk, rfft=rfft, warpgroups=warpgroups, tw_sfu=tw_sfu, contig=contig, kpre=kpre,
                yalias=yalias, lean=lean, maxnreg=maxnreg)


# the order-3 kernel's programs a multiprocessor by N (sm_90a: 8192 109.5 KiB a program, two fit; 16384 219 KiB with
# two warpgroups a pair: one)
ORDER3_PER_SM = {8192: (1, 2), 16384: (1,)}


def order3_plan(n: int, per_sm: int = 2, warpgroups: int = 1, rfft: int = 3, stack: bool = False,
                kfull: bool = False) -> Plan:
    """The order-3 one-pass Gluon kernel (gluon_order3.py): 2N = A x 64, A = 16 A2 (N = 8192: A = 256, 16384: 512),
    each chunk's tile transposed (64 rows k_a); ``per_sm`` persistent programs a multiprocessor (ORDER3_PER_SM);
    ``warpgroups`` 2: two warpgroups share each pair and its T (one program a SM); ``rfft`` 3: the spectrum's bins as
    float16 pairs (a float16 spectrum read as it is), 4: a complex64 one cast to float16 pairs a call over each
    channel's largest part (launch.scaled_half_bins: one kernel); ``stack`` (8192, one warpgroup a pair: F2 is F_16 four
    times on its diagonal there): 1a and 1'a four columns a2 a product, [64, 64] @ F2, read and written in the wgmmas' layouts
    (no layout conversion), u read once a pair (without it the same addressing a column a product); ``kfull``: the
    bins laid out a call as the kernel's chunks read them (launch.laid_half_bins: a chunk's bins by 16-byte
    loads, a warp's 512 contiguous bytes, instead of a 4-byte gather a bin; 8192 only). (The untransposed
    chunks, KMID, KPRE, XT, VIEWS, G1 1 and 4, complex64 bins in the kernel, the 4096 build, DIRECT, WARPIO, STACK's
    other forms, 1a / 1'a's layout conversions and PREFETCH (the next pair's u into L2) were measured slower or no
    faster and removed: notes/fft_conv.)"""
    fits = ORDER3_PER_SM.get(n)
    if (fits is None or per_sm not in fits or warpgroups not in (1, 2) or (warpgroups == 2 and per_sm != 1)
            or rfft not in (3, 4) or stack not in (False, True) or (stack and (n != 8192 or warpgroups != 1))
            or kfull not in (False, True) or (kfull and n != 8192)):
        raise ValueError(f"the order-3 Gluon kernel takes N and programs a multiprocessor as {ORDER3_PER_SM}, "
                         f"warpgroups 1 or 2 (2: one program a multiprocessor), rfft 3 (float16 bins) or 4 "
                         f"(complex64 cast a call), stack only at N = 8192 with one warpgroup, kfull only at N = "
                         f"8192; "
                         f"got N = {n}, per_sm {per_sm}, warpgroups {warpgroups}, rfft {rfft}, stack {stack}, "
                         f"kfull {kfull}")
    return Plan("order3", n1=2 * n // 64, n2=64, per_sm=per_sm, warpgroups=warpgroups, rfft=rfft, stack=bool(stack),
                kfull=bool(kfull))


def mono_plan(a: int, b: int, c: int, loop: int, num_warps: int, permute: bool = False, kfull: bool = False) -> Plan:
    """The one-pass three-factor kernel (kernels_mono.py): 2N = a b c, LOOP pairs a program."""
    return Plan("mono", n1=a, n2=b, n3=c, loop=loop, num_warps=num_warps, permute=permute, kfull=kfull)


def pair_plan(n1: int, n2: int, pairs: int, num_warps: int, loop: int = 1, stages: int = 1,
              hoist: bool = False) -> Plan:
    return Plan("pair", n1=n1, n2=n2, num_warps=num_warps, pairs=pairs, loop=loop, stages=stages, hoist=hoist)


def long_plan(n1: int, n2: int, bn: int, bk1: int, kc: int, num_warps: int, rows_warps: int,
              gauss: bool = False) -> Plan:
    return Plan("long", n1=n1, n2=n2, num_warps=num_warps, bn=bn, bk1=bk1, kc=kc, rows_warps=rows_warps,
                gauss=gauss)


def plan_of_config(config: tuple) -> Plan:
    """A configs.py tuple as a plan: the pair kernel's (N1, N2, pairs, warps[, loop[, stages[, hoist]]])
    (a 7th entry a bool), else the long form's 7 numbers (an 8th, True: Gauss's products)."""
    if len(config) <= 6 or (len(config) == 7 and isinstance(config[6], bool)):
        return pair_plan(*config)
    return long_plan(*config)


def plan(n: int, device: torch.device, dtype: torch.dtype = torch.bfloat16, half_spectrum: bool = False) -> Plan:
    """The path of a convolution of ``dtype`` sequences of length ``n`` on ``device``; ``half_spectrum``: the filter's
    spectrum is float16 (filter_spectrum(..., torch.float16)): the Gluon tuples that read it as it is
    (configs.GLUON_ORDER3_HALF, GLUON_ONEPASS_HALF) where they have n; every other plan reads complex64 bins (the op
    widens a float16 spectrum for it)."""
    if dispatch.backend_for(device) == "reference":
        return Plan("torch")
    gluon = (str(dtype).removeprefix("torch.") in configs.PAIR_DTYPES and device.type != "cpu"
             and not dispatch.interpreter_enabled() and dispatch.gluon_ok(device))
    # (Gluon cannot run under TRITON_INTERPRET, which interprets every kernel); the order-3 kernel first where an N
    # has both
    if gluon and half_spectrum and n in configs.GLUON_ORDER3_HALF:
        return order3_plan(n, *configs.GLUON_ORDER3_HALF[n])
    if gluon and half_spectrum and n in configs.GLUON_ONEPASS_HALF:
        return gluon_plan(*configs.GLUON_ONEPASS_HALF[n])
    if gluon and n in configs.GLUON_ORDER3:
        return order3_plan(n, *configs.GLUON_ORDER3[n])
    if gluon and n in configs.GLUON_ONEPASS:
        return gluon_plan(*configs.GLUON_ONEPASS[n])
    if str(dtype).removeprefix("torch.") in configs.PAIR_DTYPES and n in configs.MONO_CONFIGS:
        return mono_plan(*configs.MONO_CONFIGS[n])
    if str(dtype).removeprefix("torch.") in configs.PAIR_DTYPES and n in configs.PAIR_CONFIGS:
        return pair_plan(*configs.PAIR_CONFIGS[n])
    if str(dtype).removeprefix("torch.") in configs.PAIR_DTYPES and n in configs.LONG_CONFIGS:
        return long_plan(*configs.LONG_CONFIGS[n])
    if n not in configs.TL_FACTORS:
        return Plan("torch")
    n1, n2 = configs.TL_FACTORS[n]
    # ieee in the interpreter, and on ROCm, whose Triton takes ieee, bf16x3 and bf16x6 but not tf32x3 (a compile
    # error on gfx90a): float32 products there, float32's accuracy
    precision = "ieee" if dispatch.interpreted(device) or dispatch.is_rocm(device) else configs.TL_PRECISION
    return Plan("tl", n1=n1, n2=n2, num_warps=configs.TL_WARPS[n], precision=precision)


def dk_gluon_config(n: int, device: torch.device, u_dtype: torch.dtype, k_dtype: torch.dtype) -> tuple | None:
    """(A, B, pair groups a program) of the Gluon filter-gradient kernel (launch.dk_gluon) for this call, or None:
    16-bit u and filter, N in configs.DK_GLUON, a Hopper under a checked triton (dispatch.gluon_ok), not interpreted."""
    names = {str(t).removeprefix("torch.") for t in (u_dtype, k_dtype)}
    if (n not in configs.DK_GLUON or not names <= set(configs.PAIR_DTYPES) or device.type == "cpu"
            or dispatch.interpreter_enabled() or dispatch.backend_for(device) == "reference"
            or not dispatch.gluon_ok(device)):
        return None
    return configs.DK_GLUON[n]


def dk_config(n: int, device: torch.device, u_dtype: torch.dtype, k_dtype: torch.dtype) -> tuple | None:
    """(N1, N2, pair groups a program, warps) of the filter-gradient kernel for this call, or None
    (torch.fft): 16-bit u and filter (its float16 products are at a 16-bit output's floor, not at
    float32's), N in configs.DK_CONFIGS, a GPU or the interpreter."""
    if dispatch.backend_for(device) == "reference":
        return None
    names = {str(t).removeprefix("torch.") for t in (u_dtype, k_dtype)}
    if not names <= set(configs.PAIR_DTYPES):
        return None
    return configs.DK_CONFIGS.get(n)


def dk_plan(n: int, device: torch.device, u_dtype: torch.dtype, k_dtype: torch.dtype) -> tuple[str, tuple] | None:
    """The filter-gradient launch of this call, chosen once (op.py's backward hands it down to the launch): ("gluon",
    dk_gluon_config's) where the Gluon kernel takes it, else ("pair", dk_config's), else None (torch.fft)."""
    config = dk_gluon_config(n, device, u_dtype, k_dtype)
    if config is not None:
        return "gluon", config
    config = dk_config(n, device, u_dtype, k_dtype)
    return None if config is None else ("pair", config)
