"""The Hadamard transform's and hadamard_quantize's measured tables (``plan.plan``, ``kron.kron_plan`` and
``quantize.plan_quantize`` read them). One line a table says what it holds and why; the runs behind each figure and
the history of every table: notes/hadamard/README.md ("configs.py's tables: their history" and the session sections).

A row of n elements is split into S slices of N1 x N2 (kernels.py: two tensor-core products per slice,
a float32 butterfly over the slices). Tensor-core FLOP per element: 2 N1 + 4 N2 (2 N2 when N1 = 1).
Keys of the quantize tables: (format, n), else the format; plan tunings of the same name override them.

A plain module (napkin.validate reads a copy of it): a variant's tables are set through tilecore.tiles.switches.patched,
whose generation the plan memos (quantize.kernel_plan, kron.kernel_plan) key on.
"""
from __future__ import annotations

# n -> (S, N1, N2) of the tensor-core split (n < 16: the register butterfly): the fastest timed on the H100
SPLITS = {
    1: (1, 1, 16), 2: (1, 1, 16), 4: (1, 1, 16), 8: (1, 1, 16), 16: (1, 1, 16),
    32: (1, 1, 32), 64: (1, 1, 64), 128: (1, 1, 128),
    256: (4, 1, 64), 512: (1, 32, 16), 1024: (1, 32, 32), 2048: (2, 32, 32),
    4096: (1, 128, 32), 8192: (2, 128, 32), 16384: (4, 128, 32), 32768: (4, 128, 64),
}
MAX_N = max(SPLITS)

# n -> (tile elements, warps, load stages, programs an SM), pointer path: the H100's fastest that compile well
TUNING = {n: (4096, 8, 3, 4) for n in SPLITS} | {n: (16384, 8, 3, 1) for n in (16, 32, 64, 128)} | {
    256: (32768, 8, 3, 16), 512: (4096, 8, 3, 16), 1024: (8192, 8, 3, 16), 2048: (16384, 8, 3, 4),
    4096: (4096, 8, 5, 16), 8192: (8192, 8, 5, 4), 16384: (4096, 8, 3, 1), 32768: (4096, 8, 3, 1)}
FP32_TUNING = (4096, 8, 2, 4)  # float32's three pieces a stage fit shared memory only with smaller tiles and 2 stages

# (block bytes, (n, float32) -> overrides) where a GPU's blocks get less shared memory than TUNING asks (untimed)
SHARED_FITS = (
    (163 * 1024, None),
    (99 * 1024, {(64, False): dict(tile_elems=8192), (128, False): dict(tile_elems=8192),
                 (256, False): dict(tile_elems=16384), (32768, True): dict(num_stages=1)}),
    (64 * 1024, {**{(n, False): dict(num_stages=2) for n in (16, 32, 64, 128, 2048, 8192, 16384)},
                 (256, False): dict(tile_elems=16384, num_stages=2), (32768, False): dict(num_stages=1)}),
)

# 16-bit n -> (the side through TMA descriptors, tuning over TUNING's): where TMA measured faster than pointers
TMA_TUNING = {
    256: ("load", dict(tile_elems=16384, waves=32)),
    512: ("both", dict(split=(1, 16, 32), tile_elems=8192, waves=32)),
    1024: ("both", dict(waves=64)),
    2048: ("both", dict(waves=64)),
    4096: ("both", dict(num_stages=6, num_warps=4, waves=32)),
    8192: ("both", dict(waves=32)),
    16384: ("both", dict(split=(2, 128, 64), num_stages=4)),
    32768: ("both", dict(waves=2)),
}
TMA_MIN_ELEMENTS = 1 << 24  # below it the descriptors' host cost (50-830 us) outweighs TMA

# n on Hopper's Gluon kernel (gluon_kernels.py); n -> (ring stages, lookahead): the fastest timed
GLUON_SIZES = (16384, 32768)
GLUON_TUNING = {16384: (4, 0), 32768: (8, 4)}
GLUON_STAGES = 4  # the ring's depth for a GLUON_SIZES n without a GLUON_TUNING entry

INTERPRETER_SMS = 4  # the interpreter's "SMs": its persistent loops still run several tiles each

# CPU path (plan.cpu_plan): one float32 product up to this n, two above (timed on the CPU: one product loses from 128)
CPU_DENSE_MAX_N = 64
CPU_CHUNK_ELEMS = 1 << 22  # ... over chunks of rows of this many elements (16 MiB float32 temporaries)

# m x 2^k rows in one program up to this many M_PAD x p float32 values (the pow2 kernel's largest row), else two passes
KRON_MAX_TILE_ELEMS = 32768
KRON_TILE_ELEMS = 8192  # a tile's elements where several rows fit (M_PAD < 64), as TUNING's
KRON_MAX_ROWS = 4  # rows a batched tile at most: 4 ran 43-56% of copy where 2 or 8 ran 26-42% (H200)
KRON_WARPS = 4  # the fused kernel's warps: 1.1-2.5x faster than 8 or 16 at every 12/20/28 x 2^k timed
KRON_CHUNK_COLUMNS = 64  # the two-pass plan's column chunk
KRON_WAVES = 4  # programs an SM of the persistent grid: 8 and 16 within 1%
QUANT_TILE_ELEMS = 8192  # hadamard_quantize's kron-tiled tile where several rows fit

# hadamard_quantize's pow2 plan by n over TUNING / TMA_TUNING's: the H100's fastest
QUANT_POW2_TUNING = {4096: dict(num_stages=4), 1024: dict(waves=16), 2048: dict(num_warps=4)}
# the pow2 quantize with PAIRS (hi a column pair at a time, bit-identical): 1.03-1.13x where on (the rest 1.01x+)
QUANT_POW2_PAIRS = {**{(f, n): True for f in ("fp8_e4m3", "int8", "mxfp4", "nvfp4", "int4")
                       for n in (1024, 2048, 8192)}, ("int8", 4096): True, ("nvfp4", 4096): True, ("int4", 4096): True,
                    ("int8", 32768): True, ("nvfp4", 32768): True,
                    **{(f, 16384): True for f in ("fp8_e4m3", "int8", "nvfp4", "int4")},
                    **{(f, 512): True for f in ("mxfp4", "nvfp4", "int4")}, ("mxfp4", 4096): True}
# the pow2 quantize's PAIRS lo by one max (kernels._pairs_dot's CLAMP, bit-identical), on the splits below: 1.02-1.05x
QUANT_POW2_CLAMP_LO = {("nvfp4", 1024): True, ("nvfp4", 4096): True, ("mxfp4", 4096): True, ("int4", 4096): True,
                       ("int4", 1024): True, ("fp8_e4m3", 1024): True, ("int8", 1024): True, ("int8", 4096): True,
                       **{(f, 8192): True for f in ("fp8_e4m3", "int8", "mxfp4", "nvfp4", "int4")},
                       ("fp8_e4m3", 16384): True, ("int8", 16384): True}
# the pow2 quantize's hi piece truncated (kernels._pairs_dot's TRUNC: a prmt, not a conversion; pieces within 2^-15):
# fp8 32768 1.06-1.07x; int8 32768 0.99-1.03x, int4 16384 1.01-1.02x, fp8 16384, mxfp4 4096 1.00x: off; not where scales are
# discrete (e8m0 / e4m3: a rotation 4x less exact moves more of them at their rounding boundaries)
QUANT_POW2_TRUNC_HI = {("fp8_e4m3", 32768): True}
# the pow2 quantize's e2m1 codes a column pair at a time (quantize_kernels._e2m1_pair, the same bytes), where an nvfp4
# group is one thread's: 1.03-1.05x (2048 on (2, 16, 64) 1.03x; 4096 1.01x, 256 0.75x: off there)
QUANT_POW2_E2M1_PAIRS = {("nvfp4", 128): True, ("nvfp4", 1024): True, ("nvfp4", 2048): True}
# the pow2 quantize's int8 / int4 codes from the bits of fma(y, 1 / s, 1.5 x 2^23) (quantize_kernels._int_bits: one FFMA
# a value for FMUL + cvt.rni's F2I): on where >= 1.02x (int4 1024, int8 2048 / 16384 1.03x, int4 8192 1.10x; under 128
# registers int4 2048 1.043x / 1.009x, int4 512 1.039x (H200); int8 8192 0.99x, 32768 0.97x, int4 4096 1.00x)
QUANT_POW2_INT_BITS = {("int4", 1024): True, ("int8", 2048): True, ("int8", 16384): True, ("int4", 8192): True,
                       ("int4", 2048): True, ("int4", 512): True}
# (format, n) -> the pow2 plan's tuning under the caller's: n = 128's codes by TMA, not a byte a store by pointer:
# mxfp4 3.36x, nvfp4 2.33x, int4 3.48x (25-27 -> 55-94% of copy), fp8 1.20x (96.6%), int8 1.44x (95.1%); 1024 / 4096
# as one slice 64 columns wide (a thread's N2 / 4 = 16 outputs under PERM: an nvfp4 group whole): 1.12-1.39x (16-bit);
# PERM with one product a slice (x by the column-permuted H_128): nvfp4 128 1.34x, mxfp4 128 1.06x, nvfp4 256 1.61x
QUANT_POW2_FORMAT_TUNING = {("mxfp4", 128): dict(tma="load", waves=2, perm=True), ("nvfp4", 128): dict(tma="load", perm=True),
                            ("nvfp4", 256): dict(split=(2, 1, 128), perm=True, num_warps=4),
                            **{(f, n): dict(num_warps=4) for f, n in (("mxfp4", 256), ("mxfp4", 512))},
                            # (under 128 registers: four programs an SM, not three; int4 with INT_BITS 1.039x, nvfp4
                            # 1.021x; mxfp4 512 / 1024 0.96x)
                            **{(f, 512): dict(num_warps=4, maxnreg=128) for f in ("nvfp4", "int4")},
                            ("int4", 128): dict(tma="load", waves=2), ("fp8_e4m3", 128): dict(tma="load"),
                            ("int8", 128): dict(tma="load"),
                            ("fp8_e5m2", 128): dict(tma="load"),
                            # (the 4-bit formats at 256-1024 on 4 warps: 1.05-1.09x; nvfp4 128 0.91x)
                            ("nvfp4", 1024): dict(split=(1, 16, 64), num_warps=4),
                            ("mxfp4", 1024): dict(split=(1, 16, 64), perm=True, num_warps=4),
                            ("int4", 1024): dict(split=(1, 16, 64), perm=True, num_warps=4),
                            **{(f, 1024): dict(split=(1, 16, 64)) for f in ("fp8_e4m3", "int8")},
                            **{(f, 4096): dict(split=(1, 64, 64)) for f in ("nvfp4", "fp8_e4m3", "int8")},
                            **{(f, 4096): dict(split=(1, 64, 64), perm=True) for f in ("mxfp4", "int4")},
                            # 8192 as two 64 x 64 slices on 4 warps: 1.10-1.30x
                            ("fp8_e4m3", 8192): dict(split=(2, 64, 64), num_warps=4),
                            # (4-bit: on 3 stages, three programs an SM: 1.10-1.19x)
                            ("nvfp4", 8192): dict(split=(2, 64, 64), num_warps=4, num_stages=3),
                            ("mxfp4", 8192): dict(split=(2, 64, 64), num_warps=4, num_stages=3, perm=True),
                            # (int4 on a persistent grid of the three programs that fit an SM: 1.048x)
                            ("int4", 8192): dict(split=(2, 64, 64), num_warps=4, num_stages=3, perm=True, waves=3),
                            # 16384 as four 64 x 64 slices on 4 warps, two programs an SM: 1.03-1.26x
                            ("fp8_e4m3", 16384): dict(split=(4, 64, 64), num_warps=4, num_stages=2, waves=2),
                            ("int8", 16384): dict(split=(4, 64, 64), num_warps=4, num_stages=3, waves=2),
                            **{(f, 16384): dict(split=(4, 64, 64), num_warps=4, num_stages=2, waves=2, perm=True)
                               for f in ("nvfp4", "mxfp4", "int4")},  # (int4 1.03-1.06x)
                            # 8192 int8 with 3 stages (three programs an SM): 1.16x
                            ("int8", 8192): dict(split=(2, 64, 64), num_warps=4, num_stages=3),
                            # 2048 as (2, 16, 64) with 4 rows a tile (1024's slice twice): fp8 1.11x, int8 1.19x, mxfp4
                            # 1.25x, nvfp4 1.24x, int4 1.58x
                            **{(f, 2048): dict(split=(2, 16, 64), tile_elems=8192) for f in ("fp8_e4m3", "int8")},
                            # (the 4-bit formats under 128 registers, four programs an SM: mxfp4 1.048x, nvfp4 1.027x,
                            # int4 with INT_BITS 1.043x / 1.009x, and a persistent grid of four programs an SM 1.037x)
                            **{(f, 2048): dict(split=(2, 16, 64), tile_elems=8192, maxnreg=128)
                               for f in ("mxfp4", "nvfp4")},
                            ("int4", 2048): dict(split=(2, 16, 64), tile_elems=8192, perm=True, maxnreg=128, waves=4),
                            # int4 256 on 4 warps: 1.74x
                            ("int4", 256): dict(num_warps=4)}
# (format, n) or format -> the format whose pow2 tables (FORMAT_TUNING, PAIRS, CLAMP_LO, TRUNC_HI, PERM) it reads under
# its own entries: fp8_e5m2 on fp8_e4m3's plans (the same kernel but the conversion): 1.07-1.21x at 1024-32768
QUANT_POW2_TABLES_OF = {("fp8_e5m2", n): "fp8_e4m3" for n in (1024, 2048, 4096, 8192, 16384, 32768)}
QUANT_FAST = True  # codes by y x RN(1 / s) (one FMUL a value, within a step of the exact quotient): 1.08x fp8
KRON_TMA = "none"  # the m x 2^k kernels' TMA ("none", "load", "both"): untimed, so pointers
# the transform at m x 2^k, m > 64, on the wide_rows kernel ("pair"): 1.12x the kron-tiled plan at 172 x 64
KRON_WIDE_ROWS = {(172, 64): "pair"}
# the m x 2^k transform's plan by (m, p), 16-bit: the H100's fastest at those shapes
KRON_TUNING = {(28, 512): dict(num_stages=3), (12, 64): dict(num_stages=1), (20, 1024): dict(num_warps=8)}
QUANT_KRON_TUNING = {14336: dict(num_warps=4)}  # the kron-tiled quantize at 14336: 4 warps 1.33x 8
# the kron-tiled quantize's interleaved slices (2: one vector load a column): 2.2-3.7x where checked
QUANT_INTERLEAVE = {("mxfp4", 14336): 2, ("mxfp4", 28672): 2, ("mxfp4", 18944): 2, ("nvfp4", 14336): 2,
                    ("int4", 14336): 2, ("nvfp4", 28672): 2, ("int4", 28672): 2, ("nvfp4", 18944): 2}
# the pow2 quantize's permuted last-product columns: 1.03-1.26x where on; int4 1.00-1.02x at 32-column slices, off
# (with the 64-column slices: QUANT_POW2_FORMAT_TUNING's perm)
QUANT_PERM_COLUMNS = {"nvfp4": True, ("mxfp4", 2048): True, ("mxfp4", 32768): True}
QUANT_INTERLEAVE_TMA = {("mxfp4", 14336): True}  # the interleaved vector load by TMA: 1.10x there
# the tl "wide" quantize kernel for m > 64 (blocks of 64 sub-rows, K stopping at m): 1.16-1.66x the kron-tiled
QUANT_WIDE = {("fp8_e4m3", 11008): True, ("fp8_e4m3", 18944): True, ("int4", 11008): True, ("int8", 11008): True,
              ("mxfp4", 11008): True, ("mxfp4", 18944): True, ("nvfp4", 11008): True}
QUANT_WIDE_ROWS = {}  # the wide plan's mixing 128 columns wide: untimed, off
QUANT_WIDE_MB = 64  # the wide plan's output block of sub-rows
QUANT_WIDE_KC = 64  # ... its mixing's K chunk: 16 ran 0.50x, 32 0.66x
QUANT_WIDE_STAGES = 2
QUANT_WIDE_J_OUTER = False  # block-scaled formats' blocks one at a time: untimed, off
QUANT_K_STOP = {}  # the kron-tiled mixing stopping at m: untimed, off
# (format, n) -> the wide plan's tuning: the one-warpgroup plan 1.30-1.61x at 11008
QUANT_WIDE_TUNING = {
    ("fp8_e4m3", 11008): dict(kc=64, num_stages=2, num_warps=4),
    ("fp8_e4m3", 18944): dict(kc=64, num_stages=2, mb=128),
    ("int4", 11008): dict(mb=64, kc=64, num_warps=4, num_stages=2),
    ("int8", 11008): dict(mb=64, kc=64, num_warps=4, num_stages=2),
    ("mxfp4", 11008): dict(mb=64, kc=64, num_warps=4, num_stages=2),
    ("mxfp4", 18944): dict(kc=64, num_stages=2, mb=128),
    ("nvfp4", 11008): dict(mb=64, kc=64, num_warps=4, num_stages=2)}
# the Gluon wide kernel (m x 64, 128 < m <= 192; 148 x 128 by HALVES 2): checked, 1.4-3.5x the tl plans
QUANT_GLUON_WIDE = {("fp8_e4m3", 11008): True, ("int8", 11008): True, ("mxfp4", 11008): True, ("nvfp4", 11008): True,
                    ("int4", 11008): True,
                    ("fp8_e4m3", 18944): True, ("int8", 18944): True, ("mxfp4", 18944): True, ("nvfp4", 18944): True,
                    ("int4", 18944): True}
QUANT_GLUON_WIDE_STAGES = 2  # its ring's stages: one stage ran 0.86-0.97x
QUANT_GLUON_WIDE_TUNING = {}  # its stages by (format, n): none faster (AHEAD, PINGPONG lost and were removed)
# the Gluon kron kernel (m <= 32 x 128..1024): checked, 1.19-2.53x the tl plans
QUANT_GLUON_KRON = {(f, n): True for f in ("fp8_e4m3", "int8", "mxfp4", "int4") for n in (14336, 28672)}
QUANT_GLUON_KRON.update({("nvfp4", 14336): True, ("nvfp4", 28672): True})  # with SCALE_ONCE: 1.19x / 1.55x
QUANT_GLUON_KRON_STAGES = 2  # its ring's stages
# (m, p), then (format, n) -> split / inside: the butterfly in registers beat INSIDE at 28 x 1024 (1.2-1.4x)
QUANT_GLUON_KRON_TUNING = {(28, 512): dict(split=2, inside=False), (28, 1024): dict(split=2, inside=False)}
# (format, n) -> the plan tuning of a power-of-two row n on the Gluon kron kernel (gluon_pow2 = m: m x (n / m), Sylvester's
# H_m; with the kron plan's switches, those of 14336 / 28672 at the same p): int4 16384 1.19x, mxfp4 16384 1.10x the pow2
# plans (int4 32768 1.26x: now QUANT_GLUON_ROWS'); fp8 / e5m2 16384 1.01x, nvfp4 0.94-0.95x, int8 0.88-0.91x, 32768's
# others 0.82-0.97x: off
QUANT_GLUON_POW2 = {("int4", 16384): dict(gluon_pow2=32, fold=True, int_bits=True, nozero=True, clamp_lo=2, inside=False),
                    ("mxfp4", 16384): dict(gluon_pow2=32, fold=True, e2m1_pairs=True, nozero=True, clamp_lo=2, perm=True,
                                           inside=False)}
# (format, n) -> the plan tuning of n = 16384 / 32768 on the transform's Gluon pipeline ("gluon_rows": True and its
# switches): int4 32768 1.057x / 1.072x the kron plan, int8 32768 1.015x / 1.050x the pow2 plan (with PAIRS, INT_BITS);
# products-bound at the transform's own time (0.355 ms), so fp8 / e5m2 0.82-0.90x, 16384 0.81-0.86x: off
QUANT_GLUON_ROWS = {(f, 32768): dict(gluon_rows=True, clamp_lo=2, int_bits=True) for f in ("int4", "int8")}
# the transform on the Gluon kernels' STORE at (m, p): checked, 1.16-2.05x the tl plans
KRON_GLUON = {(172, 64): True, (28, 512): True, (28, 1024): True, (148, 128): True}
QUANT_GLUON_SCALE_ONCE = {"nvfp4": True}  # each group's scale once: nvfp4 1.17-1.65x; mxfp4 0.98-1.05x, off
# the wide kernel's last mixing K chunk cut at the 16-multiple past m: 1.03-1.16x where on (int4 11008 with NOZERO 1.026x,
# H200; alone 1.003x)
QUANT_GLUON_KTRIM = {**{(f, 18944): True for f in ("fp8_e4m3", "int8", "mxfp4", "nvfp4", "int4")},
                     ("fp8_e4m3", 11008): True, ("int8", 11008): True, ("nvfp4", 11008): True, ("int4", 11008): True}
# 1 / sqrt(n) folded into the group maxima and reciprocals: on where >= 1.02x, checked (nvfp4 11008 / 18944 on JOINT /
# BALANCE: 1.047x / 1.033x, H200)
QUANT_GLUON_FOLD = {**{(f, 14336): True for f in ("mxfp4", "nvfp4", "int4")},
                    **{(f, 28672): True for f in ("fp8_e4m3", "int8", "mxfp4", "nvfp4", "int4")},
                    **{(f, n): True for f in ("fp8_e4m3", "int8", "mxfp4", "nvfp4", "int4") for n in (18944, 11008)}}
# UNITS (each block's mixing once) at 148 x 128: int4 1.08x; with PAIRS fp8 1.40x, int8 1.37x, mxfp4 1.06x
QUANT_GLUON_UNITS = {("int4", 18944): True, ("fp8_e4m3", 18944): True, ("int8", 18944): True, ("mxfp4", 18944): True,
                     ("nvfp4", 18944): True}  # nvfp4: with PERM (1.13x)
# (format, n) or format -> the format whose Gluon tables (QUANT_GLUON_WIDE / KRON and their switches) it reads: fp8_e5m2 on
# fp8_e4m3's at the model widths (the same kernels but the conversion; the tl fused plan before): 11008 3.20x (30.1 -> 96.4% of copy), 14336 1.43x (66.8 -> 95.6), 18944 3.19x (26.7 -> 85.2), 28672 2.63x (31.3 -> 82.3)
QUANT_GLUON_TABLES_OF = {("fp8_e5m2", n): "fp8_e4m3" for n in (11008, 14336, 18944, 28672)}
# JOINT (UNITS' two column halves' mixing as one N = 128 product, the same bytes) at 148 x 128: int8 1.031x / 1.063x, int4
# 1.117x / 1.113x, mxfp4 1.062x / 1.061x, nvfp4 1.042x / 1.042x, fp8 1.014x / 1.022x; at 172 x 64 (a tile's two rows; the
# group formats) nvfp4 with KTRIM 1.029x / 1.028x (KTRIM alone 1.00x), mxfp4 1.015x / 1.017x, int4 0.96-0.98x (H200)
QUANT_GLUON_JOINT = {**{(f, 18944): True for f in ("fp8_e4m3", "int8", "int4", "mxfp4", "nvfp4")}, ("nvfp4", 11008): True}
# BALANCE (UNITS: consumer c the unit J = c and block 2's column half c, three blocks each) on JOINT at 148 x 128, the same
# bytes: mxfp4 1.072x / 1.068x, nvfp4 1.065x / 1.062x; fp8 0.914x, int8 0.937x (H200)
QUANT_GLUON_BALANCE = {("mxfp4", 18944): True, ("nvfp4", 18944): True}
# the transform's Gluon tuning by (m, p), checked: 148 x 128 1.99x then PAIRS 1.09x, 172 x 64 STREAM 1.32x, 28 x 1024
# STREAM + PAIRS 1.07x (96-99% of copy)
KRON_GLUON_TUNING = {(148, 128): dict(units=True, store2=True, stages=2, ktrim=True, nozero=True, clamp_lo=2),
                     (172, 64): dict(clamp_lo=2, stream=True, stages=2),
                     (28, 1024): dict(nozero=True, clamp_lo=2, stream=True)}
# NOZERO (padded sub-rows unzeroed) and CLAMP_LO (the lo piece by one max): on where >= 1.03x, checked
_NZ_CL = {("mxfp4", 14336): True, ("nvfp4", 14336): True, ("int4", 14336): True, ("mxfp4", 28672): True,
          ("mxfp4", 11008): True, ("nvfp4", 11008): True, ("mxfp4", 18944): True, ("nvfp4", 18944): True,
          ("int4", 28672): True}
QUANT_GLUON_NOZERO = {**_NZ_CL, ("int4", 11008): True}  # (int4 11008 with KTRIM 1.026x; 18944 1.013x, off: H200)
# CLAMP_LO 2 (PAIRS, bit-identical): 1.04-1.24x where on; 28672's other formats 0.74-0.83x (more spilled)
QUANT_GLUON_CLAMP_LO = {**_NZ_CL, **{(f, n): 2 for f in ("fp8_e4m3", "int8", "mxfp4", "nvfp4", "int4")
                                     for n in (11008, 14336, 18944)}, ("mxfp4", 28672): 2}
# mxfp4 / nvfp4 codes a column pair at a time (the same bytes, 2% fewer instructions): mxfp4 1.02-1.06x at the four widths;
# nvfp4 11008 (JOINT + FOLD) 1.061x with FOLD against 1.047x without, 14336 1.022x (H200); 18944 0.998x, 28672 off
QUANT_GLUON_E2M1_PAIRS = {("mxfp4", 28672): True, ("mxfp4", 18944): True, ("mxfp4", 11008): True, ("mxfp4", 14336): True,
                          ("nvfp4", 11008): True, ("nvfp4", 14336): True}
# the Gluon kernels' int8 / int4 codes from the bits of q + 1.5 x 2^23 (gluon_epilogue._int_bits, no cvt.rni): int8
# 1.07-1.08x, int4 1.06-1.11x where on; int8 11008 1.00x, off
QUANT_GLUON_INT_BITS = {("int8", 28672): True, ("int8", 18944): True, ("int8", 14336): True,
                        **{("int4", n): True for n in (11008, 14336, 18944, 28672)}}
# PERM (a thread's 16 values consecutive outputs, bit-identical): 1.03-1.13x where on; elsewhere 0.73-1.02x
QUANT_GLUON_PERM = {("mxfp4", 11008): True, ("nvfp4", 11008): True, ("fp8_e4m3", 14336): True, ("mxfp4", 14336): True,
                    ("nvfp4", 14336): True, ("nvfp4", 28672): True, ("mxfp4", 18944): True, ("nvfp4", 18944): True}


# here, not in quantize.py: kron.py's transform plan asks it too, and quantize.py imports kron
def gluon_kron_tuning(m: int, p: int, tuning: dict, fmt: str | None = None) -> tuple[int, bool]:
    """(split, inside) of the "gluon_kron" kernel at m x p (gluon_quantize_kron's SPLIT and INSIDE): the tuning's,
    else QUANT_GLUON_KRON_TUNING's by (m, p), else a consumer a row up to two blocks of 64 sub-rows (p <= 256),
    a row shared by the two consumers past that, and the butterfly across blocks by the mixing's signs (INSIDE) where
    a consumer holds four blocks (sm_90a: 92-220 B spilled with the butterfly in registers, none INSIDE)."""
    table = {**QUANT_GLUON_KRON_TUNING.get((m, p), {}), **QUANT_GLUON_KRON_TUNING.get((fmt, m * p), {})}
    f = p // 64
    split = tuning.get("split") or table.get("split") or (1 if f <= 4 else 2)
    inside = tuning.get("inside", table.get("inside", f // (2 * split) == 4))
    return split, bool(inside)

# GPUs with tensor memory (dispatch.tensor_memory: sm_100, B200), compiled on the CPU (issue 31; untimed
# there): pow2_quantize_kernel with per-row scales at one row a tile (n >= 4096) does not compile under triton 3.6
# (TritonNvidiaGPUOptimizeTMemLayouts: "parent layout must have at least rank >= 2"; sm_90a compiles it), so those
# calls take the kron-tiled kernel (8-72 KiB there); and tiles whose shared memory tcgen05's lowering raises past the
# block's 227 KiB get a smaller one: (n, format) -> tile_elems (n = 256 int4 on pointers: 232 KiB -> 132)
QUANT_TMEM_TILES = {(256, "int4"): 16384}
# GPUs whose blocks get less shared memory than the pow2 quantize tiles ask (issue 31; compiled on the CPU,
# untimed there): rows of (least bytes a block gets, {n: the most elements a tile}), read through
# dispatch.shared_memory_fit. The H100 and the A100 take the first row (n = 256 136 KiB of sm_80's 163)
QUANT_SHARED_FITS = (
    (163 * 1024, {}),
    # sm_86, sm_89, sm_120 (99 KiB): n = 128 asked 104-112 KiB (sm_86) -> 68-72 at 8192 elements; 256: 132-136 -> 66-68
    (99 * 1024, {128: 8192, 256: 16384}),
    # ROCm's MI200 / MI300 (64 KiB): n = 16..128 asked 66-72 KiB (gfx90a) -> 32-36 at 8192; 256: 129-132 -> 32-33
    (64 * 1024, {16: 8192, 32: 8192, 64: 8192, 128: 8192, 256: 8192}),
)
