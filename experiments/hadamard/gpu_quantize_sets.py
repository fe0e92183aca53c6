"""hadamard_quantize's power-of-two rows still under 90% of copy (issue 32, sessions 38-42, helper HE): candidate plans of
the pow2 kernel (quantize_kernels.pow2_quantize_kernel; plan tunings, no new kernel code) beside the shipped plan of
the same (format, n), in the same process.

Why these candidates (sm_90a compiles on the CPU, `experiments/hadamard/sass_quantize.py`'s compile_case): the rows
that meet 90% run two or more programs an SM (8192: 4 warps, 138 registers, 94 KB), the ones under it one: 16384's
shipped (2, 128, 64) on 8 warps takes 174 registers a thread and 147 KB of shared memory (4 stages of 32 KB), so one
program of 8 warps an SM, and a row's epilogue (its maximum across the 8 warps, then the codes) stalls the SM's only
program. (4, 64, 64) on 4 warps with 2 or 3 stages: 218 registers, 78 / 111 KB, no spills: two programs an SM (waves 2)
and the same loop instructions a value (12.4 against 12.6). 2048's shipped (2, 32, 32) with 8 rows a tile batches H_32
as a 3-D product (64 HMMA, mma.sync) and broadcasts each row's scale through shared memory (127 memory instructions a
tile); one row a tile as (1, 64, 32) is a 2-D wgmma pair with the row's scale a scalar (60 registers, 25-29 KB: up to 8
programs an SM), 17.0 instructions a value against 13.1; (2, 16, 64) is 1024's shipped tile (97% of copy there) twice
with the butterfly: 12.2 a value, 138-141 registers, 45 KB (4 rows on 4 warps) / 82 KB (8 rows on 8 warps).

Each (format, n): every plan checked against float64 (fresh bf16 rows of 2^28 elements with an outlier channel, a NaN
row and an inf row among the checked rows; the first and last 64 rows against quantize_reference: codes equal on
>= 99.9%, any more than one code apart only on values within 2^-13 of their row's largest (fp8's subnormal steps are
finer than the rotation's 16-bit pieces round: sessions 31-37's rule), scales exact (float32 per-token scales within
2^-15), every element written: two runs over different poison bytes give the same bytes), then timed in interleaved rounds from CUDA graphs
(gpu_script.time_rounds) with a copy of the same bytes (x read, codes and scales written) in the same run.

    PYTHONPATH=. python experiments/hadamard/gpu_quantize_sets.py [--set a | b | ... | u] [--deadline 58] [--smoke]

--set a (batch 1): the candidates above. --set b (batch 2): INT_BITS (int8 / int4 codes from the bits of
fma(y, 1 / s, 1.5 x 2^23): quantize_kernels._int_bits, one FFMA a value for FMUL + cvt.rni's F2I on the conversion pipe)
beside the shipped plans of int8 2048-32768 and int4 1024 / 4096, and run 1's flips against the plans before them.
--set c (batch 3): run 2-3's flips at 2048 / 8192 against the plans before and with INT_BITS; INT_BITS on the Gluon kernels
(gluon_epilogue._int_bits) at the model widths, int8 / int4. --set d (batch 4): the Gluon int4 INT_BITS after run 4's
inf-row fix, int8 INT_BITS at 14336 / 11008. --set e (session 39, batch 1): the 4-bit formats at 2048 on (2, 16, 64) with
4 rows a tile, at 8192 on 3 stages, int4 INT_BITS at 2048 / 8192. --set f (batch 2):
TRUNC_HI (the hi piece truncated, one conversion a pair fewer) beside the shipped plans under 90%. --set g (batch 3):
TRUNC_HI on the Gluon kernels at the model widths (fp8, int8, int4), int8 32768 / int4 16384 again. --set h (batch 4): fp8_e5m2
on fp8_e4m3's plans at 1024-32768, the 4-bit formats on 4 warps at 256 / 512 / 1024. --set i (batch 5): the other 4-bit
rows on 4 warps (128-1024), 4096 on 3 stages. --set j (last batch): session 39's flips against the plans before them. --set k: the shipped plans of rows
without a recent figure. --set l (session 40, batch 1): more warps an SM at 16384 / 32768 (8 warps capped at 128
registers, a third program on one stage, 16 warps at 32768). --set m (batch 2): 16384 as (4, 128, 32) on 8 warps, 32768 as
(4, 256, 32) on 16 (a warpgroup 64 lines of each product). --set n (batch 3): 16384 / 32768 on the Gluon kron kernel as
32 x (n / 32) (plan tuning gluon_pow2). --set o (batch 4): the kron kernel's ring at 3 / 4 stages (16384 as 32 x 512, 14336's
4-bit plans). --set p (batch 5): call 3's flips against the pow2 plans; 8192 / 4096 on the kron kernel (int4, mxfp4). --set q (batch 6): the kron kernel's epilogue switches at 16384 (4-bit). --set r (session 41): 16384 / 32768 on the
transform's Gluon pipeline with the codes (plan tuning gluon_rows, gluon_kernels.hadamard_gluon_quantize_kernel), every
format. --set s (batch 2): run 3's 32768 gains again (int4, int8, mxfp4), with the whole ring ahead. --set t (last batch):
the flips (int4 / int8 32768 on the pipeline) against the plans before them. --set u (session 42): 16384 on the transform's Gluon pipeline with a
consumer a row (OWN: fp8, e5m2, int8, int4); fp8 / e5m2 16384 / 32768 with PERM, fp8 16384 with the codes through TMA. --set v: 16384 / 32768 with the H_2 level after the products (SWAP: fp8,
e5m2, int8). --set w: 16384 with OWN for mxfp4 / nvfp4. --set x: 18944 with JOINT (the wide kernel's mixing as one
N = 128 product), every format. --set y: run 4's JOINT flips against the plans before them, fp8's JOINT again. --set z: fp8 18944's JOINT flip against the plan before. --set e5: fp8_e5m2 at the model
widths on fp8_e4m3's Gluon plans. --set ja (session 43): 11008 with JOINT (the tile's two rows' mixing as one N = 128
product), every format; int4 2048 with CLAMP_LO; 18944 with BALANCE on JOINT (three output blocks a consumer). --set jb: run 1's flips against the plans before them, and the
second attempts. --set jc: the session's flips against the plans before them; int4 NOZERO. --set ka (session 44): fp8 / e5m2 / int8 / int4 16384 with SOLO (a
consumer a program on its own ring, two programs an SM); int4 2048 with INT_BITS under 128 registers, codes by pointers,
a persistent grid. --set kb: run 1's int4 2048 flip against the plan before it; registers capped at 128 (four programs
an SM) at 2048 (mxfp4, nvfp4), 512 (int4, mxfp4, nvfp4), mxfp4 1024, 8192 on two stages. --set kc: run 2's flips against
the plans before the session; a persistent grid (four programs an SM) at the 4-bit rows of 512-8192. --set kd: run 3's
int4 8192 grid and nvfp4 512 against the plans before them.

Prints a table last (% of copy, ratio to shipped, check); JSON at $OUT/quantize_sets.json. --smoke: a few rows under the
interpreter (the script's logic on the CPU; the plans' tunings of TMA do not apply there).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

E = 2**28
NVFP4_SCALE = 0.002  # a given global scale: nvfp4 in one pass

# (format, n) -> [(name, plan tuning)], the shipped plan ("shipped", {}) timed first beside them
TWO_A_SM = dict(split=(4, 64, 64), num_warps=4, waves=2)
CL = dict(pairs=True, clamp_lo=True)  # PAIRS' lo by one max: bit-identical, one instruction a value fewer
ROW_A_TILE = dict(split=(1, 64, 32), tile_elems=2048)
SETS = {
    "a": {
        **{(f, 16384): [("4x64_s2", dict(TWO_A_SM, num_stages=2, **CL)),
                            ("4x64_s3", dict(TWO_A_SM, num_stages=3, **CL))]
           for f in ("fp8_e4m3", "int8")},
        **{(f, 2048): [("row_w8", dict(ROW_A_TILE, waves=8)), ("row_w4s4", dict(ROW_A_TILE, waves=4, num_stages=4)),
                       ("b4", dict(split=(2, 32, 32), tile_elems=8192)),
                       # 1024's shipped tile twice ((1, 16, 64), 8 rows on 8 warps: 97% there) with the butterfly
                       ("16x64_w8", dict(split=(2, 16, 64), tile_elems=16384, num_warps=8)),
                       ("16x64_b4", dict(split=(2, 16, 64), tile_elems=8192))]
           for f in ("fp8_e4m3", "int8")},
        **{(f, 16384): [("4x64_s2", dict(TWO_A_SM, num_stages=2, perm=True))] for f in ("nvfp4", "mxfp4")},
    },
}
# the plans before run 1's flips (configs.QUANT_POW2_FORMAT_TUNING at 16384 and 2048), timed beside them ("before":
# float64-checked in earlier sessions as shipped plans; here their bytes compared with the new plan's)
BEFORE = {("fp8_e4m3", 16384): dict(split=(2, 128, 64), num_warps=8, num_stages=4, waves=1, clamp_lo=False),
          ("int8", 16384): dict(split=(2, 128, 64), num_warps=8, num_stages=4, waves=1, clamp_lo=False),
          ("fp8_e4m3", 2048): dict(split=(2, 32, 32), tile_elems=16384),
          ("int8", 2048): dict(split=(2, 32, 32), tile_elems=16384, waves=64),
          ("nvfp4", 16384): dict(split=(2, 128, 64), num_warps=8, num_stages=4, waves=1),
          ("mxfp4", 16384): dict(split=(2, 128, 64), num_warps=8, num_stages=4, waves=1, perm=False)}
INT_BITS = ("int_bits", dict(int_bits=True))  # int8 / int4 codes from fma(y, 1 / s, 1.5 x 2^23)'s bits, no cvt.rni
SIXTEEN_BY_64 = dict(split=(2, 16, 64), tile_elems=16384, num_warps=8, waves=64)  # set a's, not run there (snapshot before it)
SETS["b"] = {  # session 38, batch 2 (priority order): INT_BITS beside the shipped plans; run 1's flips against the plans
    # before them
    ("int8", 16384): [INT_BITS, ("before", BEFORE[("int8", 16384)])],
    ("int8", 2048): [INT_BITS, ("before", BEFORE[("int8", 2048)]), ("16x64_w8", SIXTEEN_BY_64)],
    ("fp8_e4m3", 16384): [("before", BEFORE[("fp8_e4m3", 16384)])],
    ("fp8_e4m3", 2048): [("before", BEFORE[("fp8_e4m3", 2048)]), ("16x64_w8", SIXTEEN_BY_64)],
    ("int8", 8192): [INT_BITS, ("s3", dict(num_stages=3))],  # 3 stages: ~62 KB, three programs an SM
    ("int8", 32768): [INT_BITS],
    ("int4", 4096): [INT_BITS],
    ("int4", 1024): [INT_BITS],
    ("mxfp4", 16384): [("before", BEFORE[("mxfp4", 16384)])],
    ("nvfp4", 16384): [("before", BEFORE[("nvfp4", 16384)])],
}
SETS["c"] = {  # session 38, batch 3 (priority order): 2048 on run 2's (2, 16, 64) with 4 rows a tile and int8 8192 on 3
    # stages (flipped) against the plans before the session and with INT_BITS; INT_BITS on the Gluon kernels at the model
    # widths (gluon_epilogue._int_bits: int4 -5% SASS; int8 the same count, the conversion pipe free)
    ("int8", 2048): [INT_BITS, ("before", BEFORE[("int8", 2048)])],
    ("fp8_e4m3", 2048): [("before", BEFORE[("fp8_e4m3", 2048)])],
    ("int8", 8192): [INT_BITS, ("before", dict(num_stages=5))],
    **{(f, n): [INT_BITS] for f, n in (("int4", 14336), ("int4", 18944), ("int8", 28672), ("int8", 18944),
                                       ("int4", 28672), ("int4", 11008))},
}
SETS["d"] = {  # session 38, batch 4: the Gluon int4 INT_BITS again after run 4's inf-row fix (its keep mask now amax < inf:
    # run 4's int4 checks failed on the inf row only, 1.06-1.10x), int8 at the widths run 4 did not reach
    **{(f, n): [INT_BITS] for f, n in (("int4", 14336), ("int4", 28672), ("int4", 18944), ("int8", 14336),
                                       ("int8", 11008), ("int4", 11008))},
}

# session 39, batch 1 (helper HE): the 4-bit formats on the tiles that took fp8 / int8 past 90% (plan tunings, no new
# kernel code). 2048: (2, 16, 64) with 4 rows a tile (1024's tile twice) in place of (2, 32, 32) with 8 rows: sm_90a
# 255 -> 136-139 registers a thread, 102 -> 42 KB, loop SASS a value mxfp4 22.96 -> 21.75, nvfp4 25.13 -> 23.2, int4
# 18.97 -> 15.67 (15.25 with INT_BITS; its 12 B of spills gone); 8192 on 3 stages (58 KB: three programs an SM, as int8
# 8192's 1.16x); int4 8192 INT_BITS (F2I 64 -> 0 a tile); int4 256 (the table's 54.8% is session 26's) with 4 warps.
B4_16x64 = dict(split=(2, 16, 64), tile_elems=8192)
SETS["e"] = {
    ("mxfp4", 2048): [("16x64_b4", B4_16x64)],
    ("int4", 2048): [("16x64_b4", dict(B4_16x64, perm=True)), ("16x64_b4_ib", dict(B4_16x64, perm=True, int_bits=True))],
    ("nvfp4", 2048): [("16x64_b4", B4_16x64), ("16x64_b4_pairs", dict(B4_16x64, e2m1_pairs=True))],
    ("int4", 8192): [INT_BITS, ("s3_ib", dict(num_stages=3, int_bits=True))],
    ("mxfp4", 8192): [("s3", dict(num_stages=3))],
    ("nvfp4", 8192): [("s3", dict(num_stages=3))],
    ("int4", 256): [("w4", dict(num_warps=4))],
}

# session 39, batch 2: TRUNC_HI (the second product's hi piece truncated by one prmt a pair, not rounded by cvt.rn.bf16x2:
# kernels._pairs_dot's TRUNC, MID_PIECES -4, with PAIRS and CLAMP_LO): one conversion a pair instead of two, the loop as
# long (sm_90a: fp8 16384 convert 192 -> 128 a tile, mxfp4 4096 32 -> 16; INT_BITS' 1.03-1.08x came from the
# conversion pipe too), beside the shipped plans of the rows under 90%
TRUNC = ("trunc", dict(trunc_hi=True))
SETS["f"] = {(f, n): [TRUNC] for f, n in (
    ("fp8_e4m3", 16384), ("fp8_e4m3", 32768), ("int8", 32768), ("mxfp4", 16384), ("nvfp4", 16384), ("int4", 16384),
    ("mxfp4", 4096), ("nvfp4", 8192), ("int4", 4096), ("mxfp4", 32768))}

# session 39, batch 3: TRUNC_HI on the Gluon kernels (gluon_epilogue.pieces' CLAMP 3: sm_90a kron fp8 14336 convert 192 ->
# 128, wide int8 11008 384 -> 288, the same instruction count) at the model widths for the formats whose scales are
# float32 (fp8 / int8 per token, int4 per group: run 2's mxfp4 4096 moved an e8m0 scale at its boundary); run 2's
# near-threshold pow2 rows again (int8 32768 1.027x, int4 16384 1.024x)
SETS["g"] = {(f, n): [TRUNC] for f, n in (
    ("fp8_e4m3", 28672), ("fp8_e4m3", 18944), ("fp8_e4m3", 14336), ("fp8_e4m3", 11008), ("int8", 28672),
    ("int8", 18944), ("int8", 11008), ("int4", 28672), ("int8", 32768), ("int4", 16384))}

# session 39, batch 4: fp8_e5m2 on fp8_e4m3's measured plans (plan tuning tables_of, configs.QUANT_POW2_TABLES_OF: its
# tables have e5m2 at 128 only, so at 1024-32768 it runs the plans e4m3 left 1.07-1.20x behind; the same kernel but the
# conversion), and the 4-bit formats on 4 warps where they run
# 8 (run 1's int4 256: 1.738x): sm_90a loop SASS a value 256 nvfp4 17.8 -> 16.4; 512 mxfp4 23.0 -> 21.7; 1024 mxfp4 21.3
# -> 19.9, nvfp4 21.2 -> 19.6 (161-255 registers, no spills)
W4 = ("w4", dict(num_warps=4))


SETS["h"] = {  # (priority order: the deadline skips the last)
    **{("fp8_e5m2", n): [("e4m3_plan", dict(tables_of="fp8_e4m3"))] for n in (16384, 32768, 2048, 8192, 4096, 1024)},
    ("fp8_e4m3", 32768): [("no_trunc", dict(trunc_hi=False))],  # run 2's TRUNC_HI flip (1.059x) against the plan before
    **{(f, n): [W4] for f, n in (("nvfp4", 256), ("mxfp4", 1024), ("nvfp4", 1024), ("mxfp4", 512))},
}
# session 39, batch 5: run 4's 4-bit-on-4-warps gains (1.05-1.09x at 256 / 512 / 1024) at the other 4-bit rows that run 8
# warps (sm_90a loop SASS a value nvfp4 128 15.45 -> 14.77, mxfp4 256 21.2 -> 18.8, nvfp4 512 25.1 -> 23.8, int4 512 18.7
# -> 17.5, int4 1024 14.1 -> 12.8; no spills), and 4096 on 3 stages (50 -> 42 KB: five programs an SM)
SETS["i"] = {  # (priority order)
    **{(f, n): [W4] for f, n in (("nvfp4", 128), ("mxfp4", 256), ("nvfp4", 512), ("int4", 512), ("int4", 1024))},
    **{(f, 4096): [("s3", dict(num_stages=3))] for f in ("mxfp4", "nvfp4", "int4")},
}

# session 39, the last batch: this session's flips against the plans before them (final figures; "before": checked as
# shipped plans in earlier runs, here their bytes compared with the new plan's)
BEFORE39 = {("int4", 256): dict(num_warps=8), ("int4", 2048): dict(split=(2, 32, 32), tile_elems=16384, perm=False),
            ("fp8_e5m2", 2048): dict(tables_of=""), ("fp8_e5m2", 8192): dict(tables_of=""),
            ("nvfp4", 2048): dict(split=(2, 32, 32), tile_elems=16384, e2m1_pairs=False),
            ("mxfp4", 2048): dict(split=(2, 32, 32), tile_elems=16384),
            ("int4", 8192): dict(num_stages=5, int_bits=False), ("mxfp4", 1024): dict(num_warps=8),
            ("nvfp4", 8192): dict(num_stages=5)}
SETS["j"] = {key: [("before", tuning)] for key, tuning in BEFORE39.items()}

# session 39, final figures: the shipped plans of the rows whose latest figure is older than session 37 (fp8 / int8 256 and
# 512 from session 26), or never timed (fp8_e5m2 256 / 512), and the 4-bit rows at 32768 and the widths
SETS["k"] = {key: [] for key in (
    ("fp8_e4m3", 256), ("int8", 256), ("fp8_e4m3", 512), ("int8", 512), ("fp8_e5m2", 256), ("fp8_e5m2", 512),
    ("mxfp4", 32768), ("nvfp4", 32768), ("int4", 32768), ("nvfp4", 14336), ("mxfp4", 28672), ("nvfp4", 18944),
    ("int4", 11008))}

# session 40, batch 1 (helper HE): more warps an SM at 16384 / 32768, where the shipped plans run 8 (sm_90a, compiled on the
# CPU: fp8 16384's (4, 64, 64) on 4 warps takes 218 registers and 76 KB, two programs an SM; on 8 warps capped at 128
# registers (128 B spilled) two programs of 8 warps fit (16 warps an SM); a third 4-warp program (maxnreg 168, 164 B
# spilled) fits only on one stage (16 KB: three of 76 KB do not fit 228 KB). 32768's (4, 128, 64) on 8 warps takes 234
# registers (255 for the 4-bit formats), one program an SM; on 16 warps 128 registers, 232-276 B spilled: 16 warps an SM)
W8_R128 = ("w8_r128", dict(num_warps=8, maxnreg=128))
W16 = ("w16", dict(num_warps=16))
SETS["l"] = {  # (priority order: the deadline skips the last)
    ("fp8_e4m3", 16384): [W8_R128, ("w4_3p", dict(num_stages=1, waves=3, maxnreg=168))],
    ("fp8_e4m3", 32768): [W16],
    ("int8", 32768): [W16, ("w16_trunc", dict(num_warps=16, trunc_hi=True))],
    ("mxfp4", 16384): [W8_R128],
    ("nvfp4", 16384): [W8_R128],
    ("int4", 16384): [("4x64_w4", dict(split=(4, 64, 64), num_warps=4, num_stages=2, waves=2, perm=True)),
                      ("4x64_w8_r128", dict(split=(4, 64, 64), num_warps=8, num_stages=2, waves=2, maxnreg=128))],
    ("mxfp4", 32768): [W16],
    ("nvfp4", 32768): [W16],
    ("int4", 32768): [W16],
    ("fp8_e5m2", 16384): [W8_R128],
    ("fp8_e5m2", 32768): [W16],
}

# session 40, batch 2: run 1 (he_s40a) lost 0.37-0.70x with every candidate of set l: a 64-line product on 8 warps (or
# 128 on 16) runs on each warpgroup whole (sm_90a loop SASS a value 11.4 -> 23), so more warps need more lines: 16384 as
# (4, 128, 32) on 8 warps (a warpgroup a 64-line half; 142 registers, one program an SM; at maxnreg 128 40-68 B spilled,
# two programs of 8 warps: 15.9 SASS a value against 11.4, with 16 warps an SM in place of 8), 32768 as (4, 256, 32) on 16
# warps (128 registers, 244 B spilled: 16 warps an SM, 19.3 a value against 11.7); int4 16384 on the (4, 64, 64) tile
# again (run 1: 1.032x)
R128_32 = dict(split=(4, 128, 32), num_warps=8, num_stages=2, waves=2)
SETS["m"] = {  # (priority order)
    ("fp8_e4m3", 16384): [("128x32_w8_r128", dict(R128_32, maxnreg=128)), ("128x32_w8_1p", dict(R128_32, waves=1))],
    ("fp8_e4m3", 32768): [("256x32_w16", dict(split=(4, 256, 32), num_warps=16))],
    ("int4", 16384): [("4x64_w4", dict(split=(4, 64, 64), num_warps=4, num_stages=2, waves=2, perm=True)),
                      ("128x32_w8_r128", dict(R128_32, maxnreg=128))],
    ("int8", 32768): [("256x32_w16", dict(split=(4, 256, 32), num_warps=16))],
    ("mxfp4", 16384): [("128x32_w8_r128", dict(R128_32, maxnreg=128, perm=True))],
    ("nvfp4", 16384): [("128x32_w8_r128", dict(R128_32, maxnreg=128, perm=True))],
    ("mxfp4", 32768): [("256x32_w16", dict(split=(4, 256, 32), num_warps=16))],
    ("fp8_e5m2", 16384): [("128x32_w8_r128", dict(R128_32, maxnreg=128))],
}

# session 40, batch 3: the power-of-two rows on the Gluon kron kernel (plan tuning gluon_pow2 = m: n = m x (n / m), Sylvester's
# H_m resident; 14336 = 28 x 512 runs fp8 95.6%, int8 93.2%, int4 79.7% of copy on it), with the epilogue switches of the
# shipped 28-row plan of the same p (14336's at p = 512, 28672's at p = 1024; INSIDE off as there). sm_90a: 32 x 512 168
# registers, no spills, 96-105 KiB; 32 x 1024 228 B spilled (as 28 x 1024)
K512 = {"fp8_e4m3": dict(clamp_lo=2, perm=True), "int8": dict(int_bits=True, clamp_lo=2),
        "mxfp4": dict(fold=True, e2m1_pairs=True, nozero=True, clamp_lo=2, perm=True),
        "nvfp4": dict(scale_once=True, fold=True, nozero=True, clamp_lo=2, perm=True),
        "int4": dict(fold=True, int_bits=True, nozero=True, clamp_lo=2)}
K1024 = {"fp8_e4m3": dict(fold=True), "int8": dict(fold=True, int_bits=True),
         "mxfp4": dict(fold=True, e2m1_pairs=True, nozero=True, clamp_lo=2),
         "nvfp4": dict(scale_once=True, fold=True, perm=True), "int4": dict(fold=True, int_bits=True, nozero=True, clamp_lo=True)}
K512["fp8_e5m2"], K1024["fp8_e5m2"] = K512["fp8_e4m3"], K1024["fp8_e4m3"]


def kron_pow2(fmt, n, m=32):
    """The gluon_pow2 candidate of (format, n): m x (n / m) with the 28-row plan's switches at that p, INSIDE off."""
    return f"kron{m}", dict({512: K512, 1024: K1024}[n // m][fmt], gluon_pow2=m, inside=False)


SETS["n"] = {  # (priority order)
    ("fp8_e4m3", 16384): [kron_pow2("fp8_e4m3", 16384), kron_pow2("fp8_e4m3", 16384, 16)],
    ("fp8_e4m3", 32768): [kron_pow2("fp8_e4m3", 32768)],
    ("int8", 32768): [kron_pow2("int8", 32768)],
    ("int4", 16384): [kron_pow2("int4", 16384)],
    ("int4", 32768): [kron_pow2("int4", 32768)],
    ("mxfp4", 16384): [kron_pow2("mxfp4", 16384)],
    ("nvfp4", 16384): [kron_pow2("nvfp4", 16384)],
    ("mxfp4", 32768): [kron_pow2("mxfp4", 32768)],
    ("nvfp4", 32768): [kron_pow2("nvfp4", 32768)],
    ("fp8_e5m2", 16384): [kron_pow2("fp8_e5m2", 16384)],
    ("fp8_e5m2", 32768): [kron_pow2("fp8_e5m2", 32768)],
    ("int8", 16384): [kron_pow2("int8", 16384)],
}

# session 40, batch 4: the Gluon kron kernel's ring at 3 / 4 stages where a row of 32 x 512 (or 28 x 512) leaves room
# (sm_90a: 107 KB at 2 stages, 140 KB at 3, 173 KB at 4; one program an SM either way: 2 x 256 consumer threads at 240
# registers), at 16384 (gluon_pow2 32) and at 14336's shipped 4-bit plans
def staged(name, tuning, stages):
    return f"{name}_s{stages}", dict(tuning, stages=stages)


SETS["o"] = {  # (priority order)
    ("fp8_e4m3", 16384): [kron_pow2("fp8_e4m3", 16384), staged(*kron_pow2("fp8_e4m3", 16384), 3),
                          staged(*kron_pow2("fp8_e4m3", 16384), 4)],
    ("int4", 16384): [kron_pow2("int4", 16384), staged(*kron_pow2("int4", 16384), 3)],
    ("int4", 14336): [("s3", dict(stages=3))],
    ("mxfp4", 14336): [("s3", dict(stages=3))],
    ("nvfp4", 14336): [("s3", dict(stages=3))],
    ("int8", 16384): [kron_pow2("int8", 16384), staged(*kron_pow2("int8", 16384), 3)],
    ("mxfp4", 16384): [staged(*kron_pow2("mxfp4", 16384), 3)],
    ("nvfp4", 16384): [staged(*kron_pow2("nvfp4", 16384), 3)],
    ("fp8_e5m2", 16384): [staged(*kron_pow2("fp8_e5m2", 16384), 3)],
}

# session 40, batch 5: call 3's flips (int4 16384 / 32768, mxfp4 16384 on the kron kernel, 12a51ae) against the pow2 plans
# ("before": gluon_pow2 0), and the kron kernel at 8192 = 32 x 256 (one consumer a row, two blocks; or a row shared, one
# block each) and 4096 = 32 x 128 for int4 / mxfp4 with 14336's switches; int8 32768 with PAIRS (CLAMP_LO 2). sm_90a:
# 168 registers, no spills, 62-99 KB
POW2 = ("before", dict(gluon_pow2=0))


def kron_small(fmt, n, split):
    return f"kron32_sp{split}", dict(K512[fmt], gluon_pow2=32, split=split)


SETS["p"] = {  # (priority order)
    ("int4", 32768): [POW2],
    ("int4", 16384): [POW2],
    ("mxfp4", 16384): [POW2],
    ("int4", 8192): [kron_small("int4", 8192, 1), kron_small("int4", 8192, 2)],
    ("mxfp4", 8192): [kron_small("mxfp4", 8192, 1), kron_small("mxfp4", 8192, 2)],
    ("int4", 4096): [kron_small("int4", 4096, 1)],
    ("int8", 32768): [("kron32_pairs", dict(kron_pow2("int8", 32768)[1], clamp_lo=2))],
}

# session 40, batch 6: the kron kernel's epilogue switches at 16384 = 32 x 512 for the 4-bit formats (sm_90a: 168 registers,
# no spills): nvfp4 with E2M1_PAIRS, or with 28672's switches (no NOZERO / CLAMP_LO); int4 with PERM; mxfp4 with SCALE_ONCE
SETS["q"] = {  # (priority order)
    ("nvfp4", 16384): [("kron32_pairs", dict(kron_pow2("nvfp4", 16384)[1], e2m1_pairs=True)),
                       ("kron32_k1024", dict(K1024["nvfp4"], gluon_pow2=32, inside=False))],
    ("int4", 16384): [("kron32_perm", dict(kron_pow2("int4", 16384)[1], perm=True))],
    ("mxfp4", 16384): [("kron32_once", dict(kron_pow2("mxfp4", 16384)[1], scale_once=True))],
}


# session 41, batch 1: the power-of-two rows on hadamard_transform's own Gluon pipeline (gluon_kernels.
# hadamard_gluon_quantize_kernel, plan tuning gluon_rows: a row a tile of (S, 128, 64) slices, two consumer warpgroups
# sharing every slice, +-H_64 resident; the plain transform runs 98.6% of copy on it) with gluon_epilogue's codes: the
# two consumers hold the whole row when its last slice is added, so a per-token scale is one exchange of their maxima.
# sm_90a: 168 registers, no spills, 107 KB (16384, 4 stages) / 173 KB (32768, 8 stages loading one row ahead). CLAMP_LO 2:
# the second product's pieces by one asm block (PAIRS, bit-identical); INT_BITS: int codes from an FMA's bits
ROWS = dict(gluon_rows=True)
ROWS_CL = dict(gluon_rows=True, clamp_lo=2)
ROWS_4BIT = {"mxfp4": dict(e2m1_pairs=True), "nvfp4": dict(scale_once=True), "int4": dict(int_bits=True)}
SETS["r"] = {  # (priority order: the deadline skips the last); _s6 / _la0: a deeper ring (6 stages; the whole 8-stage ring
    # ahead, not one row)
    ("fp8_e4m3", 16384): [("rows", ROWS), ("rows_cl", ROWS_CL), ("rows_cl_s6", dict(ROWS_CL, stages=6))],
    ("fp8_e4m3", 32768): [("rows", ROWS), ("rows_cl", ROWS_CL), ("rows_cl_la0", dict(ROWS_CL, lookahead=0))],
    ("int8", 32768): [("rows_ib", dict(ROWS, int_bits=True)), ("rows_ib_cl", dict(ROWS_CL, int_bits=True))],
    ("int8", 16384): [("rows_ib", dict(ROWS, int_bits=True)), ("rows_ib_cl", dict(ROWS_CL, int_bits=True)),
                      ("rows_ib_cl_s6", dict(ROWS_CL, int_bits=True, stages=6))],
    **{(f, n): [("rows", dict(ROWS, **ROWS_4BIT[f])), ("rows_cl", dict(ROWS_CL, **ROWS_4BIT[f]))]
       for n in (16384, 32768) for f in ("nvfp4", "mxfp4", "int4")},
    ("fp8_e5m2", 16384): [("rows", ROWS), ("rows_cl", ROWS_CL)],
    ("fp8_e5m2", 32768): [("rows", ROWS), ("rows_cl", ROWS_CL)],
}


# session 41, batch 2: run 3 (he_rows_s41a, every plan checked) put the pipeline at 0.355-0.39 ms whatever the format (the
# plain transform's own time: its products, not the bytes, bound it), so only the 32768 rows whose pow2 / kron plans run
# slower gained: int4 1.057x (CLAMP_LO 2), int8 1.015x, mxfp4 1.011x. Again, with the whole 8-stage ring ahead (la0: fp8
# 32768 +0.9% in run 3) and mxfp4 without E2M1_PAIRS
SETS["s"] = {  # (priority order)
    ("int4", 32768): [("rows_cl", dict(ROWS_CL, int_bits=True)), ("rows_cl_la0", dict(ROWS_CL, int_bits=True, lookahead=0))],
    ("int8", 32768): [("rows_ib_cl", dict(ROWS_CL, int_bits=True)),
                      ("rows_ib_cl_la0", dict(ROWS_CL, int_bits=True, lookahead=0))],
    ("mxfp4", 32768): [("rows_cl", dict(ROWS_CL, e2m1_pairs=True)),
                       ("rows_cl_la0", dict(ROWS_CL, e2m1_pairs=True, lookahead=0)), ("rows_cl_np", ROWS_CL)],
}


# session 41, the last batch: the flips (QUANT_GLUON_ROWS: int4 / int8 32768 on the pipeline with PAIRS and INT_BITS; runs
# 3 and 5 1.057x / 1.072x and 1.015x / 1.050x) against the plans before them (int4: the kron plan 32 x 1024, int8: pow2)
SETS["t"] = {
    ("int8", 32768): [("before", dict(gluon_rows=False))],
    ("int4", 32768): [("before", dict(kron_pow2("int4", 32768)[1], gluon_rows=False))],
}


# session 42, batch 1 (issue 32's rows nearest 90%: fp8 / e5m2 16384 at 87-88% of copy need 1.026x, 32768 at 83-86% 1.05-1.08x).
# The pow2 kernel's (4, 64, 64) / (4, 128, 64) tiles store fp8 codes by pointers from the wgmma accumulator's layout (a
# thread's values in column pairs 8 apart), converted through shared memory to 16-byte stores. PERM (the last product's
# columns permuted: a thread's 16 values of a tile row are consecutive outputs) leaves the conversion (sm_90a: STS / LDS
# 10 / 10 either way) but drops the store addresses' integer work: loop SASS 1456 -> 1424 (16384), 1497 -> 1465 (32768).
# TMA_STORE (the codes through shared memory and one bulk copy a slice, as the 4-bit formats do): 1456 -> 1556, STG 9 -> 5
# OWN (gluon_kernels' OWN, plan tuning own): 16384 on the transform's Gluon pipeline with a consumer a row, as the pow2
# kernel's (4, 64, 64) split: 384 tensor FLOP an element against the shared row's 512 (run 5 of session 41: the pipeline's
# products alone 0.295 ms, 1.1x a 3-byte copy), the per-token scale with no exchange, the wgmma chain pipelined by one
# slice and the ring by TMA, one program an SM (the pow2 plan: two 4-warp programs, every product waited for). sm_90a:
# 40 wgmma, not serialized, 123 KB (4 stages), 16 B spilled
# Run 1 (he_s42a, float64-checked): OWN 0.985x (fp8), 0.981x (e5m2), 0.90x (int8), 0.92x (int4); PERM fp8 0.994x / 0.981x,
# e5m2 1.013x / 0.951x; TMA_STORE 0.97x. Run 2: SWAP 0.64-0.83x, OWN's groups 0.90-0.96x. OWN, SWAP and their groups left
# the library (the runs name the commits that had them: ffaf8546, 3e316659, 66ddd7b9, 626f3047)
OWN = dict(gluon_rows=True, own=True, clamp_lo=2)
SETS["u"] = {  # (priority order)
    ("fp8_e4m3", 16384): [("own", OWN), ("own_s8", dict(OWN, stages=8)), ("perm", dict(perm=True)),
                          ("tmaS", dict(tma_store=True))],
    ("int8", 16384): [("own_ib", dict(OWN, int_bits=True))],
    ("fp8_e5m2", 16384): [("own", OWN), ("perm", dict(perm=True))],
    ("int4", 16384): [("own_ib", dict(OWN, int_bits=True))],
    ("fp8_e4m3", 32768): [("perm", dict(perm=True))],
    ("fp8_e5m2", 32768): [("perm", dict(perm=True))],
}

# SWAP (gluon_kernels' SWAP, plan tuning swap): the row shared by the two consumers as the shipped pipeline, each
# multiplying only its 64-line half of a slice (384 tensor FLOP an element, not 512), the H_2 level after the products by
# an exchange of S / 2 float32 blocks through shared memory (32768: 64 KB, so six ring stages, not eight). rows_s6: the
# shipped pipeline on six stages, to tell the ring's depth from SWAP. sm_90a: 40 wgmma, 222 KB (32768), 140 KB (16384)
SWAP = dict(gluon_rows=True, swap=True, clamp_lo=2)
SETS["v"] = {  # (priority order)
    ("fp8_e4m3", 32768): [("swap", SWAP), ("rows_s6", dict(gluon_rows=True, clamp_lo=2, stages=6, lookahead=4))],
    ("int8", 32768): [("swap_ib", dict(SWAP, int_bits=True))],
    ("fp8_e5m2", 32768): [("swap", SWAP)],
    ("fp8_e4m3", 16384): [("swap", SWAP)],
    ("int8", 16384): [("swap_ib", dict(SWAP, int_bits=True))],
}

# OWN for the 4-bit group formats at 16384 (mxfp4 61%, nvfp4 53% of copy on the shipped kron / pow2 plans): a consumer's
# line of 64 holds whole groups (32 / 16); nvfp4 with SCALE_ONCE (and the bench's given global scale), mxfp4 with and
# without E2M1_PAIRS. sm_90a: no spills, 107-109 KB
# PERM (626f3047: H_64's columns permuted, blocks relabelled: an nvfp4 group one thread's; sm_90a SHFL 130 -> 2, SASS
# 6496 -> 5872 without SCALE_ONCE; mxfp4 with E2M1_PAIRS 5392 -> 5144)
SETS["w"] = {  # (priority order)
    ("nvfp4", 16384): [("own", OWN), ("own_perm", dict(OWN, perm=True, scale_once=False))],
    ("mxfp4", 16384): [("own", OWN), ("own_pairs", dict(OWN, e2m1_pairs=True)),
                       ("own_perm_pairs", dict(OWN, e2m1_pairs=True, perm=True))],
}


# session 42, batch 2: the model width 18944 = 148 x 128 (fp8 80%, int8 77%, int4 59%, nvfp4 43%, mxfp4 40% of copy) on the
# Gluon wide kernel with JOINT (9695bcb8: UNITS' two column halves' mixing as one N = 128 product: H_148's block read once
# for both halves, half the mixing's wgmma instructions; sm_90a fp8: wgmma 108 -> 78, SASS 3456 -> 3016, spills 84 -> 28 B),
# each format on its shipped switches
SETS["x"] = {(f, 18944): [("joint", dict(joint=True))] for f in ("fp8_e4m3", "int8", "int4", "mxfp4", "nvfp4")}


# session 42, batch 3: run 4's JOINT flips (64d5cb9f: int8 1.031x, int4 1.117x, mxfp4 1.062x, nvfp4 1.042x) against the
# plans before them (UNITS without JOINT), and fp8's JOINT (1.014x) again
SETS["y"] = {("fp8_e4m3", 18944): [("joint", dict(joint=True))],
             **{(f, 18944): [("before", dict(joint=False))] for f in ("int8", "int4", "mxfp4", "nvfp4")}}


# session 42, the last batch: fp8 18944's JOINT flip (1.014x then 1.022x, 83131319) against the plan before it
SETS["z"] = {("fp8_e4m3", 18944): [("before", dict(joint=False))]}


# fp8_e5m2 at the model widths runs the tl fused plan (no Gluon entries: e5m2 was checked on the Gluon kernels in
# sessions 30-31, never timed); on fp8_e4m3's Gluon plans (plan tuning tables_of, the same kernels but the conversion)
SETS["e5"] = {("fp8_e5m2", n): [("e4m3_gluon", dict(tables_of="fp8_e4m3"))] for n in (11008, 14336, 18944, 28672)}


# session 43, batch 1: 11008 = 172 x 64 (int8 89-91%, int4 72%, mxfp4 51%, nvfp4 44% of copy; fp8 95%) on the Gluon wide
# kernel with JOINT at HALVES 1: the tile's two rows' mixing as one N = 128 product (a chunk one [2, 64, 64] box: both rows'
# lines in a [64, 128] operand's atom order), the six output blocks split 3 : 3 (consumer c: block 2 c of both rows as one
# [64, 128] mixing, block 1 of row a + c), both rows' per-token maxima exchanged. sm_90a (each format's shipped switches):
# wgmma 114 -> 92 (fp8 / int8), 120 -> 96 (4-bit); SASS fp8 3392 -> 3128, int8 3584 -> 3320, int4 4104 -> 3600; no spills,
# 197-213 KB. joint_ib / joint_kt: with INT_BITS (int8: 0.997x without JOINT) / KTRIM (the 4-bit formats' last K chunk
# cut at 48). int4 2048 (88.0%) with CLAMP_LO (its lo piece by one max: 1.00-1.06x elsewhere; int4 2048 has PAIRS)
# Run 1 (he_s43a, H200): nvfp4 joint_kt 1.029x, mxfp4 1.015x, int4 0.96-0.98x, int8 0.91x (joint_ib 0.99x), fp8 0.93x;
# BALANCE mxfp4 1.072x, nvfp4 1.065x, fp8 0.914x, int8 0.937x. Per-token JOINT (m x 64) and BALANCE left the kernel in
# 307e42f3 (their plan gates now ignore the tuning, so this set's int8 / fp8 rows time the shipped plan under those names:
# rerun at cb7e71ac / 0887f924 for the variants)
JOINT11 = ("joint", dict(joint=True))
SETS["ja"] = {  # (priority order)
    ("int8", 11008): [JOINT11, ("joint_ib", dict(joint=True, int_bits=True))],
    ("int4", 11008): [JOINT11, ("joint_kt", dict(joint=True, ktrim=True))],
    ("mxfp4", 11008): [JOINT11, ("joint_kt", dict(joint=True, ktrim=True))],
    ("nvfp4", 11008): [JOINT11, ("joint_kt", dict(joint=True, ktrim=True))],
    # BALANCE on JOINT at 18944 (0887f924: consumer c the unit J = c and block 2's column half c, three blocks each, not
    # UNITS' 4 / 2; block 2's mixing made by both as one N = 128 product): wgmma 78 -> 88, spills nvfp4 52 -> 0 B, fp8 /
    # int8 28 -> 0 (session 34's BALANCE without JOINT: mxfp4 1.05x, nvfp4 1.07x, fp8 0.90x, int8 0.94x)
    ("nvfp4", 18944): [("balance", dict(balance=True))],
    ("mxfp4", 18944): [("balance", dict(balance=True))],
    ("fp8_e4m3", 11008): [JOINT11],
    ("int4", 2048): [("cl", dict(clamp_lo=True))],
    ("int8", 18944): [("balance", dict(balance=True))],
    ("fp8_e4m3", 18944): [("balance", dict(balance=True))],
}


# session 43, batch 2: run 1's flips (60110547, H200) against the plans before them: BALANCE at 18944 (mxfp4 1.072x, nvfp4
# 1.065x), nvfp4 11008's JOINT + KTRIM (1.029x; KTRIM alone beside it, to tell which gained); with BALANCE, the switches
# that lost by little before it (nvfp4 E2M1_PAIRS 0.96-1.02x, mxfp4 SCALE_ONCE 0.98-1.05x at the widths); the second
# attempt at 11008 mxfp4's JOINT (1.015x) and KTRIM alone for mxfp4 / int4 (on JOINT +0.7% / +1.5%). nvfp4 is the one
# 4-bit width plan without FOLD (1 / sqrt(n) into the maxima and reciprocals: one FMUL a value fewer; session 32 measured
# it under 1.02x there before JOINT / BALANCE): sm_90a 11008 SASS 5192 -> 5024 (with E2M1_PAIRS 4928), 18944 5408 -> 5240.
# int4 is the one group format at 11008 / 18944 without NOZERO (the padded sub-rows, whose codes and scales are never
# stored, left unzeroed): 11008 SASS 4104 -> 4008
SETS["jb"] = {  # (priority order)
    ("nvfp4", 18944): [("before", dict(balance=False)), ("bal_pairs", dict(e2m1_pairs=True)),
                       ("bal_fold", dict(fold=True))],
    ("mxfp4", 18944): [("before", dict(balance=False)), ("bal_once", dict(scale_once=True))],
    ("nvfp4", 11008): [("before", dict(joint=False, ktrim=False)), ("kt_only", dict(joint=False)),
                       ("fold", dict(fold=True)), ("fold_pairs", dict(fold=True, e2m1_pairs=True))],
    ("mxfp4", 11008): [JOINT11, ("kt_only", dict(ktrim=True)), ("joint_kt", dict(joint=True, ktrim=True))],
    ("int4", 11008): [("kt_only", dict(ktrim=True)), ("nz", dict(nozero=True)), ("nz_kt", dict(nozero=True, ktrim=True))],
    ("int4", 18944): [("nz", dict(nozero=True))],
}


# session 43, the last batch: run 2's flips (nvfp4 FOLD at 11008 with E2M1_PAIRS, 1.061x; at 18944 on BALANCE, 1.033x) and
# the session's plans against the session's start (before: every switch of the session off) and against run 2's; int4's
# NOZERO at 11008 / 18944 (run 2's snapshot predates it); nvfp4 14336's E2M1_PAIRS again (0.96-1.02x at the widths in
# session 35; at 11008 on FOLD +1.3%)
SETS["jc"] = {  # (priority order)
    ("nvfp4", 11008): [("before", dict(joint=False, ktrim=False, fold=False, e2m1_pairs=False)),
                       ("before_fold", dict(fold=False, e2m1_pairs=False))],
    ("nvfp4", 18944): [("before", dict(balance=False, fold=False)), ("before_fold", dict(fold=False))],
    ("int4", 11008): [("nz", dict(nozero=True)), ("nz_kt", dict(nozero=True, ktrim=True))],
    ("mxfp4", 18944): [("before", dict(balance=False))],
    ("int4", 18944): [("nz", dict(nozero=True))],
    ("nvfp4", 14336): [("pairs", dict(e2m1_pairs=True))],
}

# session 44, batch 1 (helper HE): fp8 / e5m2 16384 (86.8-88.4% of copy) and int8 16384 on the transform's Gluon pipeline
# with SOLO (gluon_kernels: one consumer warpgroup a program on its own ring, two programs an SM at 128 registers a thread,
# a row a tile, the (4, 64, 64) split: 384 tensor FLOP an element): session 42's OWN (a consumer a row, both consumers on
# one ring) ran fp8 16384 at 0.985x the pow2 plan, its consumers taking every stage together and so quantizing together;
# two programs with rings of their own drift apart, one multiplying while the other quantizes (sm_90a: 20 wgmma, 74 KB at
# 4 stages / 107 KB at 8, 28 B spilled, not serialized). int4 2048 (88.0%): its shipped plan has 128 registers (four
# programs an SM); INT_BITS took 129 (three programs: 0.92x in session 39), so INT_BITS capped at 128; codes by pointers
# (no TMA store); a persistent grid (4 programs an SM, not 64 drawn by the hardware).
SOLO = dict(gluon_rows=True, solo=True, clamp_lo=2)
SETS["ka"] = {  # (priority order)
    ("fp8_e4m3", 16384): [("solo", SOLO), ("solo_s8", dict(SOLO, stages=8))],
    ("int4", 2048): [("ib_r128", dict(int_bits=True, maxnreg=128)), ("w4", dict(waves=4)),
                     ("ptr_store", dict(tma_store=False))],
    ("fp8_e5m2", 16384): [("solo", SOLO), ("solo_s8", dict(SOLO, stages=8))],
    ("int8", 16384): [("solo_ib", dict(SOLO, int_bits=True)), ("solo_ib_s8", dict(SOLO, int_bits=True, stages=8))],
    # int4's groups of 128 (a block's line pair) on SOLO (8 B spilled), against the shipped kron plan (73-77%)
    ("int4", 16384): [("solo_ib", dict(SOLO, int_bits=True)), ("solo_ib_s8", dict(SOLO, int_bits=True, stages=8))],
}

# session 44, batch 2: run 1's int4 2048 flip (INT_BITS capped at 128 registers: 1.043x, b91e90e4) against the plan before
# it and with a persistent grid (1.017x in run 1); the same lever where the registers, not shared memory, cap the
# programs an SM (sm_90a on the CPU, the shipped plans: 2048 mxfp4 136 / nvfp4 168 registers, three programs, capped at 128:
# four, no spills, loop SASS +1.2-1.5%; 512 int4 / mxfp4 / nvfp4 and mxfp4 1024 161-167 -> 128, 4-16 B spilled, +3-4%; 8192
# on two stages (three programs by shared memory at three) capped at 128: four, 24-48 B spilled)
R128 = ("r128", dict(maxnreg=128))
S2_R128 = ("s2_r128", dict(num_stages=2, maxnreg=128))
SETS["kb"] = {  # (priority order)
    ("int4", 2048): [("before", dict(int_bits=False, maxnreg=None)), ("w4", dict(waves=4))],
    ("mxfp4", 2048): [R128],
    ("nvfp4", 2048): [R128],
    ("int4", 512): [R128, ("r128_ib", dict(maxnreg=128, int_bits=True))],
    ("mxfp4", 512): [R128],
    ("nvfp4", 512): [R128],
    ("mxfp4", 1024): [R128],
    ("mxfp4", 8192): [S2_R128],
    ("int4", 8192): [S2_R128],
    ("nvfp4", 8192): [S2_R128],
}

# session 44, the last batch: run 2's flips (e0d278bc: 128 registers at mxfp4 / nvfp4 2048, int4 512 with INT_BITS, nvfp4
# 512; int4 2048 INT_BITS under 128 registers on a persistent grid) against the plans before the session, and a persistent
# grid of as many programs an SM as fit (W4; int4 2048's 1.017x / 1.037x) at the other 4-bit rows that run TMA_TUNING's 32-64
# an SM
BEFORE44 = {("int4", 2048): dict(int_bits=False, maxnreg=None, waves=64), ("mxfp4", 2048): dict(maxnreg=None),
            ("nvfp4", 2048): dict(maxnreg=None), ("int4", 512): dict(int_bits=False, maxnreg=None),
            ("nvfp4", 512): dict(maxnreg=None)}
W4_GRID = ("w4", dict(waves=4))
SETS["kc"] = {  # (priority order)
    ("int4", 2048): [("before", BEFORE44[("int4", 2048)]), ("run1", dict(waves=64))],
    ("mxfp4", 2048): [("before", BEFORE44[("mxfp4", 2048)]), W4_GRID],
    ("nvfp4", 2048): [("before", BEFORE44[("nvfp4", 2048)]), W4_GRID],
    ("int4", 512): [("before", BEFORE44[("int4", 512)]), W4_GRID],
    ("nvfp4", 512): [("before", BEFORE44[("nvfp4", 512)]), W4_GRID],
    **{(f, 4096): [W4_GRID] for f in ("int4", "mxfp4", "nvfp4")},  # (four programs fit: 98-102 registers, 51 KB)
    # (three fit: 8192 by shared memory, 59 KB; mxfp4 / nvfp4 1024 by registers, 167-168)
    **{(f, n): [("w3", dict(waves=3))] for f, n in (("int4", 8192), ("mxfp4", 8192), ("nvfp4", 8192), ("mxfp4", 1024),
                                                    ("nvfp4", 1024))},
}

# session 44, a short confirmation (12:55 batch): run 3's int4 8192 grid flip (66feeedb) and nvfp4 512's 128 registers
# (1.021x, then 1.018x) against the plans before them
SETS["kd"] = {("int4", 8192): [("before", dict(waves=32))], ("nvfp4", 512): [("before", BEFORE44[("nvfp4", 512)])]}


def cases(name: str):
    """[(fmt, n, variant, tuning)] in the order they run: the shipped plan first in each (format, n)."""
    out = []
    for (fmt, n), variants in SETS[name].items():
        out.append((fmt, n, "shipped", {}))
        out += [(fmt, n, v, t) for v, t in variants]
    return out


def rows_for(n: int, smoke: bool) -> int:
    return 32 if smoke else E // n


def make_plan(x, fmt: str, tuning: dict):
    import torch

    from tilecore.ops.hadamard import quantize

    group = quantize.FORMATS[fmt].default_group
    scale = torch.tensor([NVFP4_SCALE], device=x.device) if fmt == "nvfp4" else None
    plan = quantize.plan_quantize(x, fmt, group, None, True, scale is not None, False, **tuning)
    return plan, group, scale


def runner(x, fmt, tuning, poison=False):
    from tilecore.ops.hadamard import quantize

    plan, group, scale = make_plan(x, fmt, tuning)
    return plan, (lambda p=poison: quantize.run_plan(plan, x, fmt, group, None, True, scale, poison=p))


def _warm(case_and_rows):
    """One case's kernel compiled and run once (a spawned process: Triton's disk cache then holds it)."""
    (fmt, n, name, tuning), rows = case_and_rows
    try:
        import torch

        x = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda").normal_()
        plan, run = runner(x, fmt, tuning)
        run()
        torch.cuda.synchronize()
        return name, fmt, n, None
    except Exception as err:  # noqa: BLE001 (reported, the main process retries it and records the error)
        return name, fmt, n, f"{type(err).__name__}: {str(err)[:200]}"


def config_of(plan) -> str:
    c = plan.config
    if plan.path == "gluon_kron":
        return f"gluon_kron {c['M']}x{64 * c['F']} s{c['SPLIT']}"
    if plan.path == "gluon_rows":
        return f"gluon_rows S{c['S']} st{c['STAGES']} la{c['LOOKAHEAD']}" + (f" cl{c['CLAMP_LO']}" if c.get("CLAMP_LO")
                                                                            else "") + (" own" if c.get("OWN") else "") \
            + (" swap" if c.get("SWAP") else "") + (" perm" if c.get("PERM") else "") + (" solo" if c.get("SOLO") else "")
    if plan.path == "gluon_wide":
        return "gluon_wide" + "".join(f" {k.lower()}" for k in ("UNITS", "JOINT", "PERM", "KTRIM") if c.get(k))
    if plan.path != "pow2":
        return plan.path
    return (f"({c['S']},{c['N1']},{c['N2']}) B{c['B']} w{c['num_warps']} s{c['num_stages']} g{plan.grid[0]}"
            + (" perm" if c.get("PERM") else "") + (" tmaS" if c.get("TMA_STORE") else "")
            + (f" r{c['maxnreg']}" if c.get("maxnreg") else ""))


def check_codes(x, fmt, tuning, rows_checked=64) -> dict:
    """The plan's outputs on ``x`` against the float64 reference on the first and last ``rows_checked`` rows."""
    import torch

    from experiments.common.gpu_script import same_bits
    from tilecore.ops.hadamard.quantize_reference import (code_order, dequantize, hadamard_quantize_reference,
                                                          shape_outputs)

    plan, run = runner(x, fmt, tuning)
    codes, scales, g = run(True)
    codes2, scales2, _ = run(0xA5)
    written = same_bits((codes, scales), (codes2, scales2))
    codes, scales = shape_outputs(codes, scales, x.shape[:-1], g)
    picked = torch.cat([torch.arange(rows_checked), torch.arange(x.shape[0] - rows_checked, x.shape[0])]).to(x.device)
    scale = torch.tensor([NVFP4_SCALE]) if fmt == "nvfp4" else None
    ref_codes, ref_scales = hadamard_quantize_reference(x[picked].cpu(), format=fmt, scale=scale)
    a, b = code_order(codes[picked].cpu(), fmt), code_order(ref_codes, fmt)
    match = float((a == b).double().mean())
    far_at = (a - b).abs() > 1
    far = int(far_at.sum())
    far_tiny = True
    if far:  # codes finer than the rotation's own rounding (fp8's subnormals): their values within 2^-13 of the row's max
        picked_scales = tuple(t if t.numel() == 1 else t[picked].cpu() for t in scales) if isinstance(scales, tuple) \
            else (scales if scales.numel() == 1 else scales[picked]).cpu()
        got = dequantize(codes[picked].cpu(), picked_scales, format=fmt).double()
        want = dequantize(ref_codes, ref_scales, format=fmt).double()
        bound = 2.0**-13 * want.abs().nan_to_num(0.0, 0.0, 0.0).amax(dim=-1, keepdim=True)
        far_tiny = bool(((got - want).abs() <= bound)[far_at.reshape(got.shape)].all())
    ours = scales[0] if isinstance(scales, tuple) else scales
    ref = ref_scales[0] if isinstance(ref_scales, tuple) else ref_scales
    ours = ours[picked].cpu()
    scales_boundary = 0
    if ours.dtype == torch.float32:
        r = ref.to(torch.float32)
        close = ((ours - r).abs() <= 2.0**-15 * r.abs()) | (ours == r) | (torch.isnan(ours) & torch.isnan(r))
        scales_differ = int((~close).sum())
    else:
        differ = ours.view(torch.uint8) != ref.view(torch.uint8)
        # (the float64 rotation again, only where a scale differs: the reference's own is not returned)
        at_boundary = differ & fp4_scale_boundary(x[picked].cpu(), fmt, scale) if differ.any() else differ
        if at_boundary.any():  # such a block's codes follow its scale: judged by the block's scale alone
            scales_boundary = int(at_boundary.sum())
            g = code_order(codes[picked].cpu(), fmt).shape[-1] // at_boundary.shape[-1]
            far_at = far_at.reshape(at_boundary.shape[0], -1, g) & ~at_boundary[..., None]
            far = int(far_at.sum())
            far_tiny = far_tiny or far == 0
        scales_differ = int((differ & ~at_boundary).sum())
    ok = match >= 0.999 and far_tiny and scales_differ == 0 and written and plan.path in ("pow2", "gluon_kron",
                                                                                          "gluon_wide", "gluon_rows")
    return {"match": round(match, 6), "far": far, "far_tiny": far_tiny, "scales_differ": scales_differ,
            "scales_boundary": scales_boundary, "written": written, "ok": ok}


def same_dynamic(x, tuning) -> bool:
    """nvfp4 without a given global scale (the plan's AMAX pass, then the codes) under ``tuning``: the same bytes
    (codes, block scales, global scale) as the shipped plan's, each poisoned first with other bytes (an element the
    variant skips differs)."""
    import torch

    from experiments.common.gpu_script import same_bits
    from tilecore.ops.hadamard import quantize

    outs = []
    for t, poison in (({}, True), (tuning, 0xA5)):
        plan = quantize.plan_quantize(x, "nvfp4", 16, None, True, False, False, **t)
        outs.append([o.contiguous().view(torch.uint8).clone() for o in
                     quantize.run_plan(plan, x, "nvfp4", 16, None, True, None, poison=poison) if o is not None])
    return same_bits(outs[0], outs[1])


BOUNDARY_REL = 2.0**-13  # the kernel's rotation (float32 sums of bf16 pieces, each within 2^-15) off float64's


def fp4_scale_boundary(x, fmt, scale):
    """Per block (rows, n / g): True where the float64 quantity a 4-bit format's scale rounds lies within
    BOUNDARY_REL of where that rounding flips (nvfp4: an e4m3 midpoint of (amax / 6) / G; mxfp4: a power of two
    of amax), so a kernel whose rotation is as exact as float32 may pick the neighbouring scale."""
    import torch

    from tilecore.ops.hadamard.quantize_reference import rotated_rows

    y = rotated_rows(x, None, True, None, torch.float64)
    g = 16 if fmt == "nvfp4" else 32
    amax = y.view(y.shape[0], -1, g).abs().amax(-1)
    if fmt == "mxfp4":
        nearest = torch.exp2(torch.round(torch.log2(amax)))
        return ((amax - nearest).abs() <= BOUNDARY_REL * amax) & torch.isfinite(amax)
    q = amax / 6 / scale.reshape(()).double()
    e = torch.floor(torch.log2(q)).clamp(min=-6)  # e4m3: 3 mantissa bits, so neighbours 2^(e-3) apart
    step = torch.exp2(e - 3)
    midpoint = (torch.floor(q / step) + 0.5) * step
    return ((q - midpoint).abs() <= BOUNDARY_REL * q) & torch.isfinite(q)


def fresh_rows(n: int, rows: int, seed: int):
    import torch

    torch.manual_seed(seed)
    x = torch.randn(rows, n, dtype=torch.bfloat16, device="cuda" if torch.cuda.is_available() else "cpu")
    x[:64, 7] *= 80  # an outlier channel in the checked rows
    x[1, 3] = float("nan")  # a NaN row
    x[2, 5] = float("inf")  # an inf row
    return x


def probe_rows(run, smoke: bool):
    """--probe (session 41): where the transform's Gluon pipeline spends a row, at 16384 / 32768 on fresh bf16 rows of 2^28
    elements, in interleaved rounds from CUDA graphs: the shipped transform (hadamard_transform), the same pipeline as
    quantize's kernel storing the values (gluon_launch.launch, format STORE) without and with CLAMP_LO 2 (bit-identical:
    compared), its AMAX pass (the products and each half row's largest |y|: no stores; run 5, removed since) and fp8 /
    int8 on it, beside copies of the transform's and the quantize's bytes."""
    import torch

    from experiments.common.gpu_script import same_bits, time_rounds
    from tilecore import hadamard_transform
    from tilecore.ops.hadamard import gluon_launch, quantize

    for n in (16384, 32768):
        if run.left() < 20:
            run.row(f"probe {n}", skipped="deadline")
            continue
        x = fresh_rows(n, rows_for(n, smoke), 7)
        x[:3] = torch.randn_like(x[:3])  # (no NaN / inf rows: the values are compared bit for bit)
        plans = {fmt: make_plan(x, fmt, dict(ROWS_CL, **({"int_bits": True} if fmt == "int8" else {})))[0]
                 for fmt in ("fp8_e4m3", "int8")}
        plain = quantize.kernel_plan(x.shape[0], n, x.dtype, "fp8_e4m3", None, None, True, False, False,
                                     torch.cuda.get_device_properties(0).multi_processor_count, False,
                                     gluon_rows=True, _gluon_ok=True)
        outs = {k: torch.empty_like(x) for k in ("store", "store_cl")}

        def store(key, plan):
            return lambda: gluon_launch.launch(plan, x, outs[key], x, x, x, fmt_id=gluon_launch.STORE_ID)

        fns = {"transform": lambda: hadamard_transform(x, n**-0.5), "store": store("store", plain),
               "store_cl": store("store_cl", plans["fp8_e4m3"])}
        for fmt, plan in plans.items():
            group = quantize.FORMATS[fmt].default_group
            fns[f"{fmt}_cl"] = (lambda p=plan, f=fmt, g=group: quantize.run_plan(p, x, f, g))
        ref = hadamard_transform(x, n**-0.5)
        for key in ("store", "store_cl"):
            outs[key].fill_(float("nan"))
            fns[key]()
        same = {key: same_bits(outs[key], ref) for key in ("store", "store_cl")}
        copies = {}
        for nb in (4, 3, 2):  # bytes an element: the transform's (2 + 2), the per-token quantize's (2 + 1), AMAX's reads
            half = x.numel() * nb // 2 // 16 * 16
            src = torch.empty(half, dtype=torch.uint8, device=x.device)
            dst = torch.empty_like(src)
            copies[nb] = time_rounds({"copy": lambda: dst.copy_(src)}, rounds=1, graph=True,
                                     eager=not torch.cuda.is_available())["copy_graph_ms"]
            del src, dst
        t = time_rounds(fns, rounds=1 if smoke else 3, graph=True, eager=False, deadline=run)
        for name in fns:
            ms = t.get(f"{name}_graph_ms")
            nb = 3 if name in ("fp8_e4m3_cl", "int8_cl") else 2 if name == "amax_cl" else 4
            run.row(f"probe {n} {name}", n=n, variant=name, ms=ms, copy_ms=copies[nb],
                    pct_copy=round(100 * copies[nb] / ms, 1) if ms else None, same_as_transform=same.get(name),
                    x_transform=round(t["transform_graph_ms"] / ms, 3) if ms and t.get("transform_graph_ms") else None,
                    rounds=t.get(f"{name}_rounds"))
        del x, outs, ref
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", default="a", choices=sorted(SETS))
    ap.add_argument("--deadline", type=float, default=58.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--only", default="", help="format:n[,format:n]: those (format, n) only")
    ap.add_argument("--probe", action="store_true", help="probe_rows (the pipeline's time taken apart), then the set")
    args = ap.parse_args()
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from experiments.common.gpu_script import Run, time_rounds

    run = Run("quantize_sets", deadline=args.deadline)
    if args.probe:
        run.attempt("probe", probe_rows, run, args.smoke)
    run.extra["set"] = args.set
    todo = cases(args.set)
    if args.only:
        keep = {(f, int(n)) for f, n in (item.split(":") for item in args.only.split(","))}
        todo = [c for c in todo if (c[0], c[1]) in keep]
    if torch.cuda.is_available():  # compile every plan in parallel first
        with mp.get_context("spawn").Pool(min(12, len(todo))) as pool:
            for name, fmt, n, err in pool.imap_unordered(_warm, [(c, rows_for(c[1], False)) for c in todo]):
                if err:
                    run.say("warm failed", fmt, n, name, err)
        run.say("warm done")
    groups: dict = {}
    for fmt, n, name, tuning in todo:
        groups.setdefault((fmt, n), []).append((name, tuning))
    copies: dict = {}
    x_n, x = None, None
    for seed, ((fmt, n), variants) in enumerate(groups.items()):
        if run.left() < 4:
            run.row(f"{fmt} {n}", skipped="deadline")
            continue
        if n != x_n:
            x, x_n = None, None
            torch.cuda.empty_cache() if torch.cuda.is_available() else None
            x, x_n = fresh_rows(n, rows_for(n, args.smoke), seed), n
        fns, rows, shipped_out = {}, {}, None
        for name, tuning in variants:
            if name.startswith("before"):
                res = {"ok": "before"}
            else:
                res = run.attempt(f"{fmt} {n} {name} check", check_codes, x, fmt, tuning, 16 if args.smoke else 64)
                if (tuning.get("own") or ((tuning.get("joint") or name == "shipped") and n == 11008)) and res:  # an odd
                    # row count: the last tile's second row lies past the end (11008's shipped plans: nvfp4's JOINT)
                    xo = x[:x.shape[0] // 16 + 1]
                    odd = run.attempt(f"{fmt} {n} {name} odd check", check_codes, xo, fmt, tuning,
                                      min(16 if args.smoke else 64, xo.shape[0] // 2))
                    res = {**res, "odd_ok": bool(odd and odd["ok"]), "ok": bool(res["ok"] and odd and odd["ok"])}
                before = dict(variants).get("before")
                if fmt == "nvfp4" and res and ((tuning.get("joint") and n == 11008) or (name == "shipped" and before)):
                    # its AMAX pass (no given scale): the same bytes as the shipped plan's, or the shipped plan's as the
                    # plan before it's (set jc: the session's nvfp4 plans against the session's start)
                    res = {**res, "dynamic_same": run.attempt(f"{fmt} {n} {name} dynamic", same_dynamic, x,
                                                              before if name == "shipped" else tuning)}
                    res["ok"] = bool(res["ok"] and res["dynamic_same"])
            plan, fn = runner(x, fmt, tuning)
            codes, scales, _ = fn()
            written = codes.numel() * codes.element_size() + (scales.numel() * scales.element_size()
                                                              if scales.numel() > 1 else 0)
            got = [t.contiguous().view(torch.uint8) for t in (codes, scales)]
            if name == "shipped":
                shipped_out = [t.clone() for t in got]
            elif shipped_out is not None:  # the codes' bytes equal to the shipped plan's (a fraction), scales equal
                res = {**(res or {"ok": False}), "same_codes": round(float((got[0] == shipped_out[0]).double().mean()), 7),
                       "same_scales": bool(torch.equal(got[1], shipped_out[1]))}
            del got
            rows[name] = {"config": config_of(plan), **(res or {"ok": False}),
                          "bytes": x.numel() * x.element_size() + written}
            fns[name] = fn
        nbytes = rows["shipped"]["bytes"]
        if nbytes not in copies:
            half = nbytes // 2 // 16 * 16
            src = torch.empty(half, dtype=torch.uint8, device=x.device)
            dst = torch.empty_like(src)
            copies[nbytes] = time_rounds({"copy": lambda: dst.copy_(src)}, rounds=1, graph=True,
                                         eager=not torch.cuda.is_available())
            del src, dst
        copy = copies[nbytes]
        t = time_rounds(fns, rounds=1 if args.smoke else args.rounds, graph=True,
                        eager=not torch.cuda.is_available(), deadline=run)
        key = "graph_ms" if torch.cuda.is_available() else "ms"
        copy_ms = copy[f"copy_{key}"]
        base = t.get(f"shipped_{key}")
        for name, _ in variants:
            ms = t.get(f"{name}_{key}")
            r = rows[name]
            run.row(f"{fmt} {n} {name}", fmt=fmt, n=n, variant=name, ms=ms, copy_ms=copy_ms,
                    pct_copy=round(100 * copy_ms / ms, 1) if ms else None,
                    x_shipped=round(base / ms, 3) if ms and base else None, rounds=t.get(f"{name}_rounds"), **r)
    run.finish(["name", "config", "ok", "match", "same_codes", "ms", "pct_copy", "x_shipped"])


if __name__ == "__main__":
    main()
