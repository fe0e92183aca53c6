"""GPU check and timing of hadamard_quantize's Gluon kernels at the model widths (issue 32, session 31, helper HE):
the new kron kernel (gluon_quantize_kron.py, plan path "gluon_kron") at 14336 = 28 x 512 and 28672 = 28 x 1024, and
hadamard_transform's "gluon" kron plan (configs.KRON_GLUON: the Gluon kernels' STORE format) at 11008, 14336, 28672.

1. warm: a pool of processes runs every timed configuration once (Triton's disk cache then holds its kernels).
2. check (outputs poisoned; float64 reference on the first 64 rows, on the CPU; an outlier channel, a NaN row and
   an inf row): codes equal on >= 99.9% of elements, far codes only on values within 2^-13 of their row's largest,
   scales exact (e8m0 / e4m3; float32 within 2^-15), every element written (a second run over other poison bytes
   gives the same bytes); every format at both widths, e5m2, nvfp4 dynamic, fp16 in, the split / inside variants;
   the transform (STORE) within 1.25x the rounding floor against float64 (an inf row, an odd row count, in place,
   H_m^T for the backward).
3. time (bf16, 2^28 elements, do_bench medians): every format at each width on the shipped plan and on the Gluon
   kernel (and its variants), the transform on the shipped kron plan and the Gluon one; % of a torch copy of the
   same bytes (x read, codes and scales written) in the same run. Prints a table last; JSON to $OUT.

    PYTHONPATH=. python3 experiments/hadamard/gpu_gluon_widths.py [--set r3 | r2] [--budget 140] [--quick]

--set s34 (session 34): BALANCE and PERM under UNITS at 18944 against the shipped plans, ~66 s on an H100.
--set s35 (session 35): PAIRS on the pow2 kernel at 8192 / 16384, 4-bit n = 128 with more programs an SM and TMA,
E2M1_PAIRS at 28672, against the shipped plans; 4 float64 checks, bytes compared with the shipped plan's. --set s35b: the
call-3 flips against the plans before them, TMA at 128 for fp8 / int8, E2M1_PAIRS at 18944, PAIRS at 512 (4-bit).
--set s37 (session 37): the pow2 kernel's 4-bit rows on splits whose slices are 64 (nvfp4) or 64 / 128 (mxfp4) columns
wide, so that under PERM one thread holds a whole group (its scale once, no shuffle), against the shipped plans; float64
checks of the new splits (their sums run in another order: bytes not compared).
"""
import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import traceback

E = 2**28
WIDTHS = {14336: (28, 512), 28672: (28, 1024), 18944: (148, 128)}
FORMATS = ("fp8_e4m3", "int8", "mxfp4", "nvfp4", "int4")
GLUON = {"gluon_kron": True}
# the Gluon plan's tuning by width: the kron kernel (m <= 32), the wide kernel with HALVES 2 at 148 x 128 (its int4
# groups of 128 would span both consumers: not taken there)
GLUON_AT = {14336: GLUON, 28672: GLUON, 18944: {"gluon": True}}
FORMATS_AT = {14336: FORMATS, 28672: FORMATS, 18944: FORMATS[:4]}
VARIANTS = {  # n -> [(name, tuning, formats)]: the kernels' other tunings, timed beside the default (11008: the
    # shipped plan is the Gluon wide kernel already); scale_once: each group's scale computed once (SCALE_ONCE)
    11008: [("scale_once", {"gluon": True, "scale_once": True}, ("mxfp4", "nvfp4"))],
    14336: [("split1_inside", {"gluon_kron": True, "split": 1, "inside": True}, ("fp8_e4m3",)),
            ("stages3", {"gluon_kron": True, "stages": 3}, ("fp8_e4m3",)),
            ("scale_once", {"gluon_kron": True, "scale_once": True}, ("nvfp4",))],
    28672: [("no_inside", {"gluon_kron": True, "inside": False}, ("fp8_e4m3",)),
            ("scale_once", {"gluon_kron": True, "scale_once": True}, ("nvfp4",))],
    18944: [("scale_once", {"gluon": True, "scale_once": True}, ("nvfp4",))],
}
TRANSFORMS = ((172, 64), (28, 512), (28, 1024), (148, 128))


def _import():
    sys.path.insert(0, os.getcwd())
    import torch  # noqa: F401

    import tilecore  # noqa: F401


SET = "r3"  # --set: "r2" (run 2: the kernels against the plans shipped before), "r3" (after run 2's flips: variants)
GLUON_AT_R3 = {**GLUON_AT, 11008: {"gluon": True}}


def r3_timed():
    """Run 3: SCALE_ONCE (mxfp4, nvfp4) at the four widths against the Gluon default; INSIDE off at 28672 for every
    format but fp8 (run 2 timed fp8: 1.33x), with SCALE_ONCE too; the 28 x 1024 transform with INSIDE off."""
    cases = []
    for n in (14336, 28672, 18944, 11008):
        for fmt in ("nvfp4", "mxfp4"):
            cases.append(("q", fmt, n, "scale_once", {**GLUON_AT_R3[n], "scale_once": True}))
            cases.append(("q", fmt, n, "gluon", GLUON_AT_R3[n]))
            if fmt == "nvfp4" and n in (14336, 28672):  # the shipped plan there is the tl one (run 2: Gluon 1.00x / 0.95x)
                cases.append(("q", fmt, n, "shipped", {}))
    for fmt in ("int8", "mxfp4", "nvfp4", "int4"):
        cases.append(("q", fmt, 28672, "no_inside", {"gluon_kron": True, "inside": False}))
        if fmt in ("int8", "int4"):
            cases.append(("q", fmt, 28672, "gluon", GLUON))
    for fmt in ("mxfp4", "nvfp4"):
        cases.append(("q", fmt, 28672, "no_inside_once", {"gluon_kron": True, "inside": False, "scale_once": True}))
    cases.append(("t", 28, 1024, "no_inside", {"gluon": True, "inside": False}))
    cases.append(("t", 28, 1024, "gluon", {"gluon": True}))
    for n in (18944, 11008):  # KTRIM: the wide kernel's last K chunk cut at the 16-multiple past m
        for fmt in ("fp8_e4m3", "int8", "mxfp4", "nvfp4"):
            cases.append(("q", fmt, n, "ktrim", {"gluon": True, "ktrim": True}))
            if fmt in ("fp8_e4m3", "int8"):
                cases.append(("q", fmt, n, "gluon", {"gluon": True}))
        cases.append(("q", "nvfp4", n, "ktrim_once", {"gluon": True, "ktrim": True, "scale_once": True}))
    # FOLD: 1 / sqrt(n) into the maxima and reciprocals (one FMUL a value fewer), and all of a width's candidates
    bases = {14336: GLUON, 28672: {"gluon_kron": True, "inside": False}, 18944: {"gluon": True}, 11008: {"gluon": True}}
    for n, base in bases.items():
        for fmt in ("fp8_e4m3", "int8", "mxfp4", "int4"):
            if fmt == "int4" and n == 18944:
                continue
            cases.append(("q", fmt, n, "fold", {**base, "fold": True}))
            if (fmt, n) not in {("mxfp4", 14336), ("mxfp4", 18944), ("mxfp4", 11008), ("mxfp4", 28672), ("int8", 28672),
                                ("int8", 18944), ("int8", 11008), ("fp8_e4m3", 18944), ("fp8_e4m3", 11008),
                                ("int4", 28672)}:
                cases.append(("q", fmt, n, "gluon", base if n != 28672 else GLUON))
        extra = {"ktrim": True} if n in (18944, 11008) else {}
        for fmt in ("mxfp4", "nvfp4"):
            cases.append(("q", fmt, n, "all", {**base, **extra, "fold": True, "scale_once": True}))
    # int4 at 18944 on the wide kernel (its groups of 128 span both consumers' halves: the sub-rows' maxima exchanged)
    cases += [("q", "int4", 18944, "gluon", {"gluon": True}), ("q", "int4", 18944, "shipped", {}),
              ("q", "int4", 18944, "ktrim", {"gluon": True, "ktrim": True})]
    for m, p in ((148, 128), (172, 64)):
        cases.append(("t", m, p, "ktrim", {"gluon": True, "ktrim": True}))
        cases.append(("t", m, p, "gluon", {"gluon": True}))
    return cases


BEFORE = {14336: {"gluon_kron": False}, 28672: {"gluon_kron": False}, 18944: {"gluon": False},
          11008: {"ktrim": False, "scale_once": False}}  # the plans shipped at the session's start


def final_timed():
    """The final set: the shipped plans (after runs 2 and 4's flips) at the four widths, every format, against the
    session's start (BEFORE); FOLD on top of them; nvfp4 at 28672 with INSIDE off and SCALE_ONCE (run 4's one strict
    fail: 3 of 114688 scales) again; the transforms against their plans before."""
    cases = []
    for n in (14336, 28672, 18944, 11008):
        for fmt in FORMATS:
            cases += [("q", fmt, n, "shipped", {}), ("q", fmt, n, "before", BEFORE[n]),
                      ("q", fmt, n, "fold", {"fold": True})]
    cases += [("q", "nvfp4", 28672, "no_inside_once", {"inside": False, "scale_once": True}),
              ("q", "nvfp4", 28672, "no_inside_once_fold", {"inside": False, "scale_once": True, "fold": True})]
    for m, p in TRANSFORMS:
        cases += [("t", m, p, "shipped", {}), ("t", m, p, "before", {"gluon": False})]
    return cases


def s32_timed():
    """Session 32: UNITS at 18944 = 148 x 128 (each output block's mixing once: consumer 0 blocks J 0-1, consumer 1 J 2,
    both halves each; 108 wgmma against 168) against the shipped HALVES 2, every format and the transform; nvfp4 at
    28672 with INSIDE off (+ FOLD) against the shipped INSIDE again; FOLD where run 1 of this session measured it."""
    nc = {"nozero": True, "clamp_lo": True}
    s2 = {"units": True, "store2": True, "stages": 2}  # UNITS STORE staged two blocks at a time: two ring stages
    cases = [("t", 148, 128, "shipped", {}), ("t", 148, 128, "units", {"units": True}),
             ("t", 148, 128, "units_store2", s2), ("t", 148, 128, "units_store2_nz_clamp", {**s2, **nc}),
             ("t", 148, 128, "units_store2_ktrim_nz_clamp", {**s2, **nc, "ktrim": True})]
    for fmt in FORMATS:
        cases += [("q", fmt, 18944, "shipped", {}), ("q", fmt, 18944, "units", {"units": True})]
    # after run 1's flips (nvfp4 28672 INSIDE off; FOLD where >= 1.02x): the shipped against the plans before them
    cases += [("q", "nvfp4", 28672, "shipped", {}), ("q", "nvfp4", 28672, "inside_nofold", {"inside": True, "fold": False}),
              ("q", "nvfp4", 28672, "nofold", {"fold": False})]
    for fmt, n in (("int8", 28672), ("fp8_e4m3", 28672), ("mxfp4", 14336), ("int8", 18944), ("fp8_e4m3", 11008)):
        cases += [("q", fmt, n, "shipped", {}), ("q", fmt, n, "nofold", {"fold": False})]
    # NOZERO (group formats: padded sub-rows not zeroed) + CLAMP_LO (the lo piece by one max): sm_90a SASS -4.5-5.5%
    for n in (14336, 28672, 11008):
        for fmt in ("mxfp4", "nvfp4", "int4"):
            cases += [("q", fmt, n, "shipped", {}), ("q", fmt, n, "nz_clamp", nc)]
    for fmt in ("mxfp4", "nvfp4"):
        cases += [("q", fmt, 18944, "nz_clamp", nc), ("q", fmt, 18944, "units_nz_clamp", {"units": True, **nc})]
    for fmt, n in (("fp8_e4m3", 14336), ("int8", 28672), ("fp8_e4m3", 18944)):
        cases += [("q", fmt, n, "shipped", {}), ("q", fmt, n, "clamp", {"clamp_lo": True})]
    for m, p in ((148, 128), (172, 64), (28, 1024)):
        cases += [("t", m, p, "shipped", {}), ("t", m, p, "nz_clamp", nc)]
    cases += [("t", 148, 128, "units_nz_clamp", {"units": True, **nc})]
    seen, out = set(), []
    for c in cases:  # each case once (the shipped plans recur)
        if repr(c) not in seen:
            seen.add(repr(c))
            out.append(c)
    return out


S2NC = {"units": True, "store2": True, "stages": 2, "ktrim": True, "nozero": True, "clamp_lo": True}


def s33_timed():
    """For the next session (session 32's device time ran out): what run 7 timed but could not check, and what it could
    not time. The 148 x 128 transform on UNITS + STORE2 + KTRIM + NOZERO + CLAMP_LO (run 7: 1.94x, unchecked) and the
    other transforms with NOZERO + CLAMP_LO; NOZERO + CLAMP_LO where untimed (11008, 18944, int4 28672); CLAMP_LO
    for fp8 / int8."""
    nc = {"nozero": True, "clamp_lo": True}
    cases = [("t", 148, 128, "shipped", {}), ("t", 148, 128, "units_store2_ktrim_nz_clamp", S2NC),
             ("t", 148, 128, "units_store2", {"units": True, "store2": True, "stages": 2})]
    for m, p in ((172, 64), (28, 1024)):
        cases += [("t", m, p, "shipped", {}), ("t", m, p, "nz_clamp", nc)]
    for fmt, n in (("mxfp4", 11008), ("nvfp4", 11008), ("int4", 11008), ("mxfp4", 18944), ("nvfp4", 18944),
                   ("int4", 28672)):
        cases += [("q", fmt, n, "shipped", {}), ("q", fmt, n, "nz_clamp", nc)]
    for fmt, n in (("fp8_e4m3", 14336), ("int8", 28672), ("fp8_e4m3", 18944), ("fp8_e4m3", 11008)):
        cases += [("q", fmt, n, "shipped", {}), ("q", fmt, n, "clamp", {"clamp_lo": True})]
    return cases


PAIRS = {"clamp_lo": 2}  # session 33: CLAMP_LO with hi's column pairs by one cvt.rn.bf16x2 (gluon_epilogue.pieces)
S33B_WIDTHS = (11008, 18944, 14336, 28672)


def s33b_timed():
    """Session 33, second job: PAIRS (CLAMP_LO 2: the second product's hi piece converted a column pair at a time, its
    float32 values by a shift and a mask; sm_90a SASS -4 to -10%, spills to 0; bit-identical to CLAMP_LO, and to the
    unclamped pieces for every finite value) against the shipped plan, every format at the four widths and the four
    transforms; each variant's bytes compared with the shipped plan's on the same input (phase_time)."""
    cases = []
    for n in S33B_WIDTHS:
        for fmt in FORMATS:
            cases += [("q", fmt, n, "shipped", {}), ("q", fmt, n, "pairs", PAIRS)]
    for m, p in TRANSFORMS:
        cases += [("t", m, p, "shipped", {}), ("t", m, p, "pairs", PAIRS)]
    # UNITS at 18944 for the formats it lost on (run 7: fp8 0.93x, int8 0.91x with 160-184 B spilled): with PAIRS
    # fp8 spills 84 B (sm_90a), 3456 SASS against the shipped 4632
    cases += [("q", f, 18944, "units_pairs", {"units": True, **PAIRS}) for f in ("fp8_e4m3", "int8", "mxfp4", "nvfp4")]
    # last (cut first by the budget): PAIRS + PERM where PERM applies (not 18944's HALVES 2), beside its shipped plan
    for n in (11008, 14336, 28672):
        cases += [c for f in FORMATS for c in (("q", f, n, "shipped", {}), ("q", f, n, "pairs_perm", PP))]
    for m, p in ((172, 64), (28, 512), (28, 1024)):
        cases += [("t", m, p, "shipped", {}), ("t", m, p, "pairs_perm", PP)]
    return cases


PP = {"clamp_lo": 2, "perm": True}  # PAIRS + PERM (H_64's columns permuted: a thread holds 16 consecutive outputs)


PERM = {"perm": True}


def s33c_timed():
    """Session 33, third job (after run 4's PAIRS flips): PERM over the shipped plan (with PAIRS where shipped), every
    format at 11008 / 14336 / 28672 (not 18944's HALVES 2) and the three transforms there, bytes compared with the
    shipped plan's; UNITS over mxfp4 18944's shipped plan (run 4: 1.09x with PAIRS, not float64-checked there)."""
    cases = []
    for n in (11008, 14336, 28672):
        for fmt in FORMATS:
            cases += [("q", fmt, n, "shipped", {}), ("q", fmt, n, "perm", PERM)]
    for m, p in ((172, 64), (28, 512), (28, 1024)):
        cases += [("t", m, p, "shipped", {}), ("t", m, p, "perm", PERM)]
    cases += [("q", "mxfp4", 18944, "shipped", {}), ("q", "mxfp4", 18944, "units", {"units": True})]
    # nvfp4 with PERM: a group of 16 is one thread's, so SCALE_ONCE's layout round trip is no longer needed (sm_90a:
    # 11008 5568 against PERM's 5696, 14336 3528 / 3608, 28672 7448 / 7584)
    for n in (11008, 14336, 28672):
        cases += [("q", "nvfp4", n, "shipped", {}), ("q", "nvfp4", n, "perm_noonce", {**PERM, "scale_once": False})]
    return cases


_S33_START_NZ = {("mxfp4", 14336), ("nvfp4", 14336), ("int4", 14336), ("mxfp4", 28672)}  # NOZERO / CLAMP_LO at s. 33's start


def s33_start(fmt, n):
    """The tuning that puts (fmt, n)'s plan back where it stood at session 33's start (2456b21): NOZERO and CLAMP_LO only
    at the four session-32 entries, CLAMP_LO as True, UNITS only for int4 at 18944, no PERM."""
    nz = (fmt, n) in _S33_START_NZ
    return {"nozero": nz, "clamp_lo": nz, "perm": False, "units": (fmt, n) == ("int4", 18944)}


S33_START_T = {(148, 128): {}, (172, 64): {}, (28, 512): {}, (28, 1024): {}}  # KRON_GLUON_TUNING was empty


def s33d_timed():
    """Session 33, fourth job: nvfp4 without SCALE_ONCE under PERM (a group of 16 is one thread's) at 11008 / 14336 /
    28672, bytes compared; then every format x width and the four transforms, the shipped plan against the session's
    start (s33_start: the plans before this session's flips), same run."""
    cases = []
    for n in (11008, 14336, 28672):
        cases += [("q", "nvfp4", n, "shipped", {}), ("q", "nvfp4", n, "noonce", {"scale_once": False})]
    for n in (11008, 14336, 18944, 28672):
        for fmt in FORMATS:
            cases += [("q", fmt, n, "shipped", {}), ("q", fmt, n, "start", s33_start(fmt, n))]
    for (m, p), tun in S33_START_T.items():
        cases += [("t", m, p, "shipped", {}), ("t", m, p, "start", {"units": False, "store2": False, "stages": None,
                                                                   "ktrim": False, "nozero": False, "clamp_lo": False})]
    # last: 28672 with INSIDE and PAIRS (sm_90a: 0 B spilled against INSIDE off's 212-244; PAIRS alone there spilled more
    # and lost 0.74-0.85x in run 4), the formats PAIRS is off for and the 28 x 1024 transform
    for fmt in ("fp8_e4m3", "int8", "nvfp4", "int4"):
        cases += [("q", fmt, 28672, "inside_pairs", {"inside": True, "clamp_lo": 2})]
    cases += [("t", 28, 1024, "inside_pairs", {"inside": True, "clamp_lo": 2})]
    return cases


def s33e_timed():
    """Session 33, fifth job: PAIRS on the tl pow2 quantize kernel (kernels._pairs_dot: MID_PIECES -2; sm_90a loop SASS
    -3 to -7% at 1024 / 4096) against the shipped plan, every format at n = 1024, 2048, 4096, 32768; bytes compared."""
    cases = []
    for n in (4096, 1024, 2048, 32768):
        for fmt in FORMATS:
            cases += [("q", fmt, n, "shipped", {}), ("q", fmt, n, "pairs", {"pairs": True})]
    return cases


def s33f_timed():
    """Session 33, confirmation: the pow2 plans run 7 flipped to PAIRS (configs.QUANT_POW2_PAIRS) against the same plans
    without it, bytes compared; then the model widths' 4-bit formats shipped against the session's start once more."""
    from tilecore.ops.hadamard import configs

    cases = []
    for (fmt, n) in sorted(configs.QUANT_POW2_PAIRS, key=lambda k: k[1]):  # by n: one input tensor a width
        cases += [("q", fmt, n, "shipped", {}), ("q", fmt, n, "nopairs", {"pairs": False})]
    for n in (11008, 14336, 18944, 28672):
        for fmt in ("mxfp4", "nvfp4"):
            cases += [("q", fmt, n, "shipped", {}), ("q", fmt, n, "start", s33_start(fmt, n))]
    return cases


BAL = {"units": True, "balance": True}  # BALANCE: consumer c the unit J = c and J = 2's column half c (three blocks each)
BALP = {**BAL, "perm": True}  # ... and PERM (H_64's columns permuted; the codes made from relabelled blocks)


def s34_timed():
    """Session 34 (run 3; BALANCE was removed after it: df274c9 holds it): the 148 x 128 wide kernel's UNITS with BALANCE (each consumer three output blocks, J = 2's mixing on
    both: sm_90a 128 wgmma against 108, no spills; int4 144, its other half's second product for the sub-row maxima) and PERM under UNITS (mxfp4 SASS 5144 -> 4936, SHFL 50 -> 14) against
    the shipped plans at 18944 (mxfp4, fp8, int8: UNITS; nvfp4: HALVES 2), bytes compared where UNITS ships."""
    cases = []
    for fmt in ("mxfp4", "nvfp4", "fp8_e4m3", "transform", "int8", "int4"):
        if fmt == "transform":
            # the 172 x 64 transform (75.7% of copy, one ring stage: four staging slots a consumer leave no room for
            # two) with STREAM: each block stored from compute through two slots, two ring stages (sm_90a 213 KiB, 0 B
            # spilled)
            cases += [("t", 172, 64, "shipped", {}), ("t", 172, 64, "stream", STREAM),
                      ("t", 172, 64, "stream_kn", {**STREAM, "ktrim": True, "nozero": True})]
            continue
        cases.append(("q", fmt, 18944, "shipped", {}))
        if fmt in ("mxfp4", "nvfp4"):
            cases.append(("q", fmt, 18944, "balance_perm", BALP))
        cases.append(("q", fmt, 18944, "balance", BAL))
        if fmt == "mxfp4":
            cases.append(("q", fmt, 18944, "perm", PERM))
        if fmt == "nvfp4":
            cases.append(("q", fmt, 18944, "units_perm", {"units": True, "perm": True}))
    return cases


STREAM = {"stream": True, "stages": 2}


def s34b_timed():
    """Session 34, confirmation of run 3's flips: mxfp4 at 18944 with PERM against PERM off, nvfp4 at 18944 on UNITS +
    PERM against HALVES 2, the 172 x 64 transform on STREAM (two stages) against one stage without it; the kron kernel's
    STREAM for the 28 x 1024 transform (with and without PAIRS) against the shipped plan; then PAIRS on
    the tl pow2 kernel where session 33 left it untimed (8192, 16384 every format; 512 the 4-bit ones). Bytes compared
    (PERM, STREAM, PAIRS: identical by construction; UNITS sums the halves apart: not)."""
    from tilecore.ops.hadamard import configs

    cases = [("q", "mxfp4", 18944, "shipped", {}), ("q", "mxfp4", 18944, "noperm", {"perm": False}),
             ("q", "nvfp4", 18944, "shipped", {}), ("q", "nvfp4", 18944, "halves2", {"units": False, "perm": False}),
             ("t", 172, 64, "shipped", {}), ("t", 172, 64, "nostream", {"stream": False, "stages": None}),
             # the kron kernel's STREAM at 28 x 1024 (the butterfly's top level by the mixing's signs, two blocks live,
             # stored from compute: sm_90a 0 B spilled against 244, 192 wgmma against 128), with PAIRS too
             ("t", 28, 1024, "shipped", {}), ("t", 28, 1024, "stream", {"stream": True}),
             ("t", 28, 1024, "stream_pairs", {"stream": True, "clamp_lo": 2})]
    # ... and for the group formats at 28672 (codes made and stored from compute; sm_90a spills mxfp4 92 -> 0 B, nvfp4
    # 172 -> 28, int4 244 -> 32)
    for fmt in ("mxfp4", "nvfp4", "int4"):
        cases += [("q", fmt, 28672, "shipped", {}), ("q", fmt, 28672, "stream", {"stream": True})]
    for n, fmts in ((8192, FORMATS), (16384, FORMATS), (512, ("mxfp4", "nvfp4", "int4"))):
        for fmt in fmts:
            if (fmt, n) not in configs.QUANT_POW2_PAIRS:
                cases += [("q", fmt, n, "shipped", {}), ("q", fmt, n, "pairs", {"pairs": True})]
    return cases


def s34c_timed():
    """Session 34, what run 4 left (its budget): the 28 x 1024 transform's STREAM + PAIRS and STREAM at 28672 for the
    group formats against the shipped plans."""
    cases = [("t", 28, 1024, "shipped", {}), ("t", 28, 1024, "stream_pairs", {"stream": True, "clamp_lo": 2})]
    for fmt in ("mxfp4", "nvfp4", "int4"):
        cases += [("q", fmt, 28672, "shipped", {}), ("q", fmt, 28672, "stream", {"stream": True})]
    return cases


def s35_timed():
    """Session 35, batch 1, by priority: PAIRS on the tl pow2 kernel where session 33 left it untimed (8192, 16384 every
    format; checked against float64 in run 4 of session 34; bit-identical by construction); the pow2 kernel's 4-bit rows
    at n = 128 (one program an SM, codes stored by pointer, shipped) with 2 and 4 programs an SM, a quarter tile on 4
    warps ("small4"), and TMA loads and code stores with each; E2M1_PAIRS (mxfp4 / nvfp4 codes a column pair at a time,
    the same bytes) at 28672. Against the shipped plans, bytes compared."""
    from tilecore.ops.hadamard import configs

    cases = []
    for n in (8192, 16384):
        for fmt in FORMATS:
            if (fmt, n) not in configs.QUANT_POW2_PAIRS:
                cases += [("q", fmt, n, "shipped", {}), ("q", fmt, n, "pairs", {"pairs": True})]
    for fmt in ("mxfp4", "nvfp4", "int4"):
        cases += [("q", fmt, 128, "shipped", {}), ("q", fmt, 128, "waves2", {"waves": 2}),
                  ("q", fmt, 128, "waves4", {"waves": 4}),
                  ("q", fmt, 128, "small4", {"tile_elems": 4096, "num_warps": 4, "waves": 4}),
                  # TMA loads and code stores (the shipped 128 stores each code byte by pointer)
                  ("q", fmt, 128, "tma", {"tma": "load"}), ("q", fmt, 128, "tma_waves2", {"tma": "load", "waves": 2}),
                  ("q", fmt, 128, "tma_small4", {"tma": "load", "tile_elems": 4096, "num_warps": 4, "waves": 4})]
    for n in (28672,):
        for fmt in ("mxfp4", "nvfp4"):
            cases += [("q", fmt, n, "shipped", {}), ("q", fmt, n, "e2m1_pairs", {"e2m1_pairs": True})]
    return cases


def s35b_timed():
    """Session 35, batch 2: the call-3 flips against the plans before them (n = 128's 4-bit TMA plans against the
    pointer plans at one program an SM; E2M1_PAIRS at 28672 against it off); TMA at 128 for fp8 / int8 (pointers
    shipped); E2M1_PAIRS at 18944; PAIRS on the tl pow2 kernel at 512 for the 4-bit formats. Bytes compared with the
    shipped plan's (every variant but split2: identical by construction); 256 for mxfp4 / nvfp4 as two slices of 128
    (split2: the sums in another order, checked against float64)."""
    from tilecore.ops.hadamard import configs

    cases = []
    for fmt in ("mxfp4", "nvfp4"):
        for n in (28672, 18944):
            on = (fmt, n) in configs.QUANT_GLUON_E2M1_PAIRS
            cases += [("q", fmt, n, "shipped", {}), ("q", fmt, n, "e2m1_off" if on else "e2m1_pairs",
                                                      {"e2m1_pairs": not on})]
    for fmt in ("mxfp4", "nvfp4", "int4"):
        cases += [("q", fmt, 128, "shipped", {}), ("q", fmt, 128, "before", {"tma": "none", "waves": 1})]
    for fmt in ("fp8_e4m3", "int8"):
        cases += [("q", fmt, 128, "shipped", {}), ("q", fmt, 128, "tma", {"tma": "load"}),
                  ("q", fmt, 128, "tma_waves2", {"tma": "load", "waves": 2})]
    for fmt in ("mxfp4", "nvfp4", "int4"):
        if (fmt, 512) not in configs.QUANT_POW2_PAIRS:
            cases += [("q", fmt, 512, "shipped", {}), ("q", fmt, 512, "pairs", {"pairs": True})]
    for fmt in ("mxfp4", "nvfp4"):  # 256 as two slices of 128 (sm_90a: 21.2 -> 18.2 / 28.6 -> 26.1 SASS a value)
        cases += [("q", fmt, 256, "shipped", {}), ("q", fmt, 256, "split2", {"split": (2, 1, 128)})]
    return cases


# session 37: (format, n) -> the split of the pow2 kernel's tile to time (with PERM for the group formats: a thread holds
# N2 / 4 consecutive outputs of a tile row, so nvfp4's 16 at N2 = 64 and mxfp4's 32 at N2 = 128 are one thread's: the
# group's scale once, no shuffle; int4's 128 a quad's); fp8 / int8 (per token): one slice of 64 columns, no butterfly
S37_SPLITS = {("nvfp4", 1024): (1, 16, 64), ("nvfp4", 2048): (1, 32, 64), ("nvfp4", 4096): (1, 64, 64),
              ("nvfp4", 8192): (1, 128, 64), ("mxfp4", 1024): (1, 16, 64), ("mxfp4", 2048): (1, 16, 128),
              ("mxfp4", 4096): (1, 64, 64), ("mxfp4", 8192): (1, 128, 64), ("mxfp4", 16384): (1, 128, 128),
              ("int4", 4096): (1, 64, 64), ("int4", 8192): (1, 128, 64), ("int4", 16384): (1, 128, 128),
              ("fp8_e4m3", 4096): (1, 64, 64), ("fp8_e4m3", 8192): (1, 128, 64), ("int8", 8192): (1, 128, 64)}
# one product a slice (N1 == 1): PERM multiplies x by the column-permuted H_N2 (loop SASS a value: nvfp4 128 24.0 -> 16.0,
# mxfp4 128 16.2 -> 13.8; 256 on (2, 1, 128) + PERM: nvfp4 28.6 -> 17.8, mxfp4 21.2 -> 16.9)
S37_ONE = {("nvfp4", 128): (1, 1, 128), ("mxfp4", 128): (1, 1, 128), ("nvfp4", 256): (2, 1, 128),
           ("mxfp4", 256): (2, 1, 128)}


def s37_tuning(fmt, n):
    return {"split": S37_SPLITS[(fmt, n)], **({"perm": True} if fmt in ("mxfp4", "nvfp4", "int4") else {})}


def s37_timed():
    """Session 37, batch 1: the pow2 kernel on S37_SPLITS (sm_90a loop SASS a value, shipped -> split: nvfp4 1024
    26.1 -> 22.7, 2048 25.1 -> 21.2, 4096 26.0 -> 22.9, 8192 29.7 -> 23.3; mxfp4 1024 24.0 -> 21.3, 2048 23.0 -> 18.9,
    4096 25.0 -> 22.5, 8192 27.0 -> 21.9, 16384 24.9 -> 20.3; int4 4096 19.7 -> 15.7, 8192 22.6 -> 16.1, 16384 16.5 ->
    12.7; fp8 4096 15.0 -> 13.9, 8192 15.8 -> 13.3; int8 8192 17.1 -> 14.5), each beside the shipped plan, and the split
    with PAIRS + CLAMP_LO ("split_clamp": one instruction a value fewer, its bytes compared with the split's)."""
    cases = []
    for fmt, n in S37_SPLITS:
        cases += [("q", fmt, n, "shipped", {}), ("q", fmt, n, "split", s37_tuning(fmt, n)),
                  ("q", fmt, n, "split_clamp", {**s37_tuning(fmt, n), "pairs": True, "clamp_lo": True})]
        if (fmt, n) == ("mxfp4", 1024):  # the one-product tiles after the 4-bit rows' first half
            for (f1, n1), split in S37_ONE.items():
                cases += [("q", f1, n1, "shipped", {}), ("q", f1, n1, "split", {"split": split, "perm": True})]
    return cases


# session 37, batch 2: the plans before run 1's flips (configs.QUANT_POW2_FORMAT_TUNING's 1024 / 4096 splits, PERM,
# PAIRS, CLAMP_LO there), and the next candidates, each (format, n) -> [(name, tuning)] beside the shipped plan
S37B_BEFORE = {("nvfp4", 1024): dict(split=(1, 32, 32), clamp_lo=False),
               ("nvfp4", 4096): dict(split=(1, 128, 32), clamp_lo=False),
               ("mxfp4", 1024): dict(split=(1, 32, 32), perm=False),
               ("mxfp4", 4096): dict(split=(1, 128, 32), perm=False, pairs=False),
               ("int4", 4096): dict(split=(1, 128, 32), perm=False, clamp_lo=False),
               ("fp8_e4m3", 4096): dict(split=(1, 128, 32)),
               # run 2's flips: PERM on the one-product tiles
               ("nvfp4", 128): dict(perm=False), ("mxfp4", 128): dict(perm=False),
               ("nvfp4", 256): dict(split=(4, 1, 64), perm=False)}
CL = {"pairs": True, "clamp_lo": True}
S37B_NEW = {
    # 512 as (4, 1, 128), 64 rows a tile (loop SASS a value nvfp4 25.1 -> 18.5, mxfp4 23.0 -> 17.7, int4 18.7 -> 12.0)
    **{(f, 512): [("split", {"split": (4, 1, 128), "tile_elems": 32768, "perm": True})] for f in ("nvfp4", "mxfp4", "int4")},
    # 8192 as (2, 64, 64) on 4 warps (nvfp4 29.7 -> 23.5, int4 22.6 -> 16.2, fp8 15.8 -> 12.4)
    **{(f, 8192): [("split", {"split": (2, 64, 64), "num_warps": 4, **({"perm": True} if f in ("mxfp4", "int4") else {}),
                              **CL})] for f in ("nvfp4", "mxfp4", "int4", "fp8_e4m3", "int8")},
    # 2048 as (2, 16, 64), 8 rows a tile, on 8 warps (as 1024's (1, 16, 64))
    **{(f, 2048): [("split_w8", {"split": (2, 16, 64), "num_warps": 8, **({"perm": True} if f != "nvfp4" else {}), **CL})]
       for f in ("nvfp4", "mxfp4", "int4")},
    # the other formats at 1024 (fp8 15.6 -> 12.8 a value) and int8 4096 (15.2 -> 14.0)
    ("int4", 1024): [("split", {"split": (1, 16, 64), "perm": True, **CL})],
    ("fp8_e4m3", 1024): [("split", {"split": (1, 16, 64), **CL})], ("int8", 1024): [("split", {"split": (1, 16, 64), **CL})],
    ("int8", 4096): [("split", {"split": (1, 64, 64), **CL})],
    ("fp8_e5m2", 128): [("tma", {"tma": "load"})],  # e4m3's 1.20x by TMA, the same kernel but the conversion
}


# E2M1_PAIRS (da22448: a column pair's e2m1 byte at once) where an nvfp4 group is one thread's (loop SASS -2%): bytes
# compared with the shipped plan's
S37B_EXTRA = {(f, n): [("e2m1_pairs", {"e2m1_pairs": True})] for f, n in (("nvfp4", 1024), ("nvfp4", 4096),
                                                                          ("nvfp4", 128), ("nvfp4", 256))}


def s37b_timed():
    """Session 37, batch 2: runs 1 and 2's flips against the plans before them (S37B_BEFORE), then S37B_NEW's candidates
    beside the shipped plans."""
    cases = []
    for (fmt, n), before in S37B_BEFORE.items():
        cases += [("q", fmt, n, "shipped", {}), ("q", fmt, n, "before", before)]
        cases += [("q", fmt, n, name, t) for name, t in S37B_EXTRA.get((fmt, n), [])]
    for (fmt, n), variants in S37B_NEW.items():
        cases += [("q", fmt, n, "shipped", {})] + [("q", fmt, n, name, t) for name, t in variants]
    return cases


# session 37, batch 3: the shipped pow2 plans of every format at every n (the final table), the Gluon kernels' E2M1_PAIRS
# at 11008 / 14336 (untimed since session 35), and batch 2's candidates again (S37C_VARIANTS, beside the shipped plan)
S37C_POW2 = (128, 256, 1024, 4096, 8192)  # the n whose plans changed this session
S37C_VARIANTS = {**{(f, n): [("e2m1_pairs", {"e2m1_pairs": True})] for f in ("mxfp4", "nvfp4") for n in (11008, 14336)}}


def s37c_timed():
    """Session 37, batch 3: S37C_VARIANTS beside their shipped plans first, then every format's shipped pow2 plan at
    S37C_POW2 (% of copy for the notes' table and the README row)."""
    cases = []
    for (fmt, n), variants in S37C_VARIANTS.items():
        cases += [("q", fmt, n, "shipped", {})] + [("q", fmt, n, name, t) for name, t in variants]
    done = {(c[1], c[2]) for c in cases}
    for fmt in ("fp8_e4m3", "int8", "mxfp4", "nvfp4", "int4"):
        cases += [("q", fmt, n, "shipped", {}) for n in S37C_POW2 if (fmt, n) not in done]
    return cases


def timed_cases(quick=False):
    """("q", fmt, n, name, tuning) and ("t", m, p, name, tuning), priority order."""
    if SET == "s37":
        return s37_timed()
    if SET == "s37b":
        return s37b_timed()
    if SET == "s37c":
        return s37c_timed()
    if SET == "s35b":
        return s35b_timed()
    if SET == "s35":
        return s35_timed()
    if SET == "s34c":
        return s34c_timed()
    if SET == "s34b":
        return s34b_timed()
    if SET == "s34":
        return s34_timed()
    if SET == "s33f":
        return s33f_timed()
    if SET == "s33e":
        return s33e_timed()
    if SET == "s33d":
        return s33d_timed()
    if SET == "s33c":
        return s33c_timed()
    if SET == "s33b":
        return s33b_timed()
    if SET == "s33":
        return s33_timed()
    if SET == "s32":
        return s32_timed()
    if SET == "final":
        return final_timed()
    if SET == "r3":
        return r3_timed()
    cases = []
    for n in WIDTHS:
        for fmt in FORMATS_AT[n]:
            cases.append(("q", fmt, n, "gluon", GLUON_AT[n]))
            cases.append(("q", fmt, n, "shipped", {}))
    for m, p in TRANSFORMS:
        cases.append(("t", m, p, "gluon", {"gluon": True}))
        cases.append(("t", m, p, "shipped", {}))
    if not quick:
        for n, vs in VARIANTS.items():
            for name, tuning, fmts in vs:
                cases += [("q", fmt, n, name, tuning) for fmt in fmts]
                if n not in WIDTHS:  # its shipped plan beside it
                    cases += [("q", fmt, n, "shipped", {}) for fmt in fmts]
    return cases


def _runner(case, x, y=None):
    """(run, plan, bytes written) for a timed case on the rows x (bf16, 2^28 elements)."""
    import torch

    from tilecore.ops.hadamard import kron, quantize

    if case[0] == "t":
        _, m, p, _, tuning = case
        plan = kron.kron_plan(x, m, p, **tuning)
        n = m * p
        return (lambda: kron.launch(plan, x, y, n**-0.5)), plan, y.numel() * y.element_size()
    _, fmt, n, _, tuning = case
    f = quantize.FORMATS[fmt]
    group = f.default_group
    scale = torch.tensor([0.002], device=x.device) if fmt == "nvfp4" else None  # a given global scale: one pass
    plan = quantize.plan_quantize(x, fmt, group, None, True, scale is not None, False, **tuning)
    codes, scales, _ = quantize.run_plan(plan, x, fmt, group, None, True, scale)
    written = codes.numel() * codes.element_size() + (scales.numel() * scales.element_size() if scales.numel() > 1 else 0)
    return (lambda: quantize.run_plan(plan, x, fmt, group, None, True, scale)), plan, written


def _warm_one(case):
    try:
        _import()
        import torch

        if case[0] == "c":  # a check case's kernel (the Gluon kernels' constexprs do not depend on the rows)
            from tilecore.ops.hadamard import quantize

            _, (fmt, n, kw, dtn, tuning) = case
            x = torch.randn(2049, n, dtype=getattr(torch, dtn), device="cuda")
            scale = torch.tensor([kw["scale"]], device="cuda") if "scale" in kw else None
            group = quantize.FORMATS[fmt].default_group
            plan = quantize.plan_quantize(x, fmt, group, None, True, scale is not None, False, **tuning)
            quantize.run_plan(plan, x, fmt, group, None, True, scale)
            torch.cuda.synchronize()
            return repr(case), plan.path, None
        n = case[2] if case[0] == "q" else case[1] * case[2]
        x = torch.randn(E // n, n, dtype=torch.bfloat16, device="cuda")
        y = torch.empty_like(x) if case[0] == "t" else None
        run, plan, _ = _runner(case, x, y)
        run()
        torch.cuda.synchronize()
        return repr(case), plan.path, None
    except Exception as err:  # noqa: BLE001
        return repr(case), None, f"{type(err).__name__}: {str(err)[:300]}"


def _set(value):
    global SET
    SET = value


def phase_warm(result, deadline, quick):
    cases = timed_cases(quick)
    timed = {(c[1], c[2], c[4].get("split"), c[4].get("inside"), c[4].get("stages")) for c in cases if c[0] == "q"}
    if SET in ("s34", "s34b"):  # every check case (the nvfp4 dynamic one's AMAX pass, the variants' fp16 kernels)
        cases += [("c", c) for c in check_cases(quick)]
    else:
        cases += [("c", c) for c in check_cases(quick) if c[3] != "bfloat16" or c[2] or (c[0], c[1], c[4].get("split"),
                  c[4].get("inside"), c[4].get("stages")) not in timed]  # the check-only kernels (fp16, e5m2, ...)
    if SET in ("s37", "s37b", "s37c"):  # the timed kernels, then the checks' (GRID is a constexpr: 2049 rows compile their own)
        cases = timed_cases(quick) + [("c", c) for c in check_cases(quick)]
    if SET == "s35b":  # the checks' kernels are the timed ones; the tma_waves2 cases reuse the tma kernels; Gluon first
        cases = [c for c in timed_cases(quick) if c[3] != "tma_waves2"]
        cases = [c for c in cases if c[2] in (18944, 28672)] + [c for c in cases if c[2] not in (18944, 28672)]
    if SET == "s35":  # the waves cases run the shipped kernels; the checks' kernels are the timed ones; the Gluon
        # kernels (slowest to compile) first
        cases = [c for c in timed_cases(quick) if c[3] not in ("waves2", "waves4", "tma_waves2")]
        cases = [c for c in cases if c[2] in (18944, 28672)] + [c for c in cases if c[2] not in (18944, 28672)]
    ctx = mp.get_context("spawn")
    out = result.setdefault("warm", [])
    with ctx.Pool(min(14 if SET in ("s35", "s35b", "s37", "s37b", "s37c") else 12 if SET in ("s32", "s33", "s33b", "s33c", "s33d", "s33e", "s33f", "s34", "s34b", "s34c", "s35", "s35b") else 8, len(cases)), initializer=_set, initargs=(SET,)) as pool:
        pending = pool.imap_unordered(_warm_one, cases)
        for _ in cases:
            try:
                out.append(pending.next(timeout=max(1.0, deadline - time.time())))
            except Exception as err:  # noqa: BLE001
                out.append(("?", None, f"{type(err).__name__}: {str(err)[:200]}"))
                break
        pool.terminate()


def check_cases(quick=False):
    """(fmt, n, kwargs, dtype name, tuning) of the check phase."""
    if SET == "s34c":  # run 4 checked STREAM at 28672 (every group format): the transform checks only
        return []
    if SET == "s37c":  # none: E2M1_PAIRS' bytes are compared with the shipped plan's (the pow2 plans: batches 1-2)
        return []
    if SET == "s37b":  # run 1's flips as shipped (their format tuning applies at any size; TMA asked) and candidates
        tma = {"tma": "load"}
        return [("nvfp4", 1024, {"scale": 0.002}, "bfloat16", tma), ("mxfp4", 1024, {}, "float16", tma),
                ("nvfp4", 4096, {}, "bfloat16", tma), ("mxfp4", 4096, {}, "bfloat16", tma),
                ("int4", 4096, {}, "float16", tma), ("fp8_e4m3", 4096, {}, "bfloat16", tma),
                ("nvfp4", 128, {"scale": 0.002}, "float16", tma), ("mxfp4", 128, {}, "bfloat16", tma),
                ("nvfp4", 256, {}, "bfloat16", tma),
                ("nvfp4", 512, {"scale": 0.002}, "float16", {**S37B_NEW[("nvfp4", 512)][0][1], **tma}),
                ("int4", 8192, {}, "bfloat16", {**S37B_NEW[("int4", 8192)][0][1], **tma}),
                ("fp8_e4m3", 8192, {}, "float16", {**S37B_NEW[("fp8_e4m3", 8192)][0][1], **tma}),
                ("mxfp4", 2048, {}, "bfloat16", {**S37B_NEW[("mxfp4", 2048)][0][1], **tma}),
                ("int8", 1024, {}, "bfloat16", {**S37B_NEW[("int8", 1024)][0][1], **tma})]
    if SET == "s37":  # the new splits against float64 (TMA asked: 2049 rows are below TMA_MIN_ELEMENTS)
        def sp(fmt, n):
            return {**s37_tuning(fmt, n), "tma": "load"}
        cl = {"pairs": True, "clamp_lo": True}
        return [("nvfp4", 4096, {"scale": 0.002}, "bfloat16", {**sp("nvfp4", 4096), **cl}),
                ("mxfp4", 16384, {}, "bfloat16", sp("mxfp4", 16384)),
                ("int4", 8192, {}, "bfloat16", {**sp("int4", 8192), **cl}),
                ("fp8_e4m3", 8192, {}, "bfloat16", {**sp("fp8_e4m3", 8192), **cl}),
                ("nvfp4", 1024, {}, "bfloat16", sp("nvfp4", 1024)),
                ("mxfp4", 2048, {}, "float16", {**sp("mxfp4", 2048), **cl}),
                ("int8", 8192, {}, "float16", sp("int8", 8192)),
                ("nvfp4", 128, {"scale": 0.002}, "bfloat16", {"split": (1, 1, 128), "perm": True, "tma": "load"}),
                ("mxfp4", 256, {}, "bfloat16", {"split": (2, 1, 128), "perm": True, "tma": "load"})]
    if SET == "s35b":  # E2M1_PAIRS at 18944, the shipped 128 TMA plans, fp8 at 128 by TMA, PAIRS at 512
        ep = {"e2m1_pairs": True}
        return [("mxfp4", 18944, {}, "bfloat16", ep), ("nvfp4", 18944, {"scale": 0.002}, "bfloat16", ep),
                ("int4", 128, {}, "bfloat16", {"tma": "load", "waves": 2}),  # (2049 rows: TMA asked, as shipped at 2^28)
                ("fp8_e4m3", 128, {}, "bfloat16", {"tma": "load"}),
                # (2049 rows take the pointer path unless TMA is asked: asked, with the timed kernels' tiles)
                ("nvfp4", 512, {"scale": 0.002}, "bfloat16", {"pairs": True, "tma": "load", "split": (1, 16, 32),
                                                               "tile_elems": 8192}),
                ("mxfp4", 256, {}, "bfloat16", {"split": (2, 1, 128), "tma": "load", "tile_elems": 16384})]
    if SET == "s35":  # E2M1_PAIRS and PAIRS at 8192 (int8: not checked there before) against float64 (the timed cases'
        # bytes are compared with the shipped plan's too)
        ep = {"e2m1_pairs": True}
        return [("mxfp4", 28672, {}, "bfloat16", ep), ("nvfp4", 28672, {"scale": 0.002}, "bfloat16", ep),
                ("int8", 8192, {}, "bfloat16", {"pairs": True}), ("mxfp4", 128, {}, "bfloat16", {"tma": "load"})]
    if SET == "s34b":  # the flipped 18944 plans (shipped) and PAIRS at the pow2 n it is new at, against float64
        return [("mxfp4", 18944, {}, "bfloat16", {}), ("nvfp4", 18944, {"scale": 0.002}, "bfloat16", {}),
                ("nvfp4", 18944, {}, "bfloat16", {}), ("nvfp4", 18944, {}, "float16", {}),
                ("mxfp4", 18944, {}, "float16", {})] + [
            ("mxfp4", 8192, {}, "bfloat16", {"pairs": True}), ("nvfp4", 16384, {"scale": 0.002}, "bfloat16", {"pairs": True}),
            ("int4", 512, {}, "float16", {"pairs": True}), ("fp8_e4m3", 16384, {}, "bfloat16", {"pairs": True}),
            ("mxfp4", 28672, {}, "bfloat16", {"stream": True}), ("nvfp4", 28672, {"scale": 0.002}, "bfloat16", {"stream": True}),
            ("nvfp4", 28672, {}, "bfloat16", {"stream": True}), ("int4", 28672, {}, "float16", {"stream": True})]
    if SET == "s34":  # BALANCE / PERM at 18944 against float64 (bf16 and fp16, nvfp4 given and dynamic, fp8 static)
        return [("mxfp4", 18944, {}, "bfloat16", BALP), ("nvfp4", 18944, {"scale": 0.002}, "bfloat16", BALP),
                ("fp8_e4m3", 18944, {}, "bfloat16", BAL), ("int8", 18944, {}, "float16", BAL),
                ("nvfp4", 18944, {}, "bfloat16", BALP), ("mxfp4", 18944, {}, "float16", BALP),
                ("fp8_e4m3", 18944, {"scale": 0.01}, "float16", BAL), ("nvfp4", 18944, {"scale": 0.002}, "bfloat16", BAL),
                ("mxfp4", 18944, {}, "bfloat16", PERM), ("nvfp4", 18944, {"scale": 0.002}, "float16",
                                                         {"units": True, "perm": True}),
                ("int4", 18944, {}, "bfloat16", BAL)]
    if SET == "s33f":  # the shipped pow2 plans with PAIRS against float64
        return [("mxfp4", 2048, {}, "bfloat16", {}), ("nvfp4", 32768, {"scale": 0.002}, "bfloat16", {}),
                ("int4", 4096, {}, "float16", {}), ("fp8_e4m3", 1024, {}, "bfloat16", {})]
    if SET == "s33e":  # the pow2 kernel with PAIRS against float64
        pr = {"pairs": True}
        return [("mxfp4", 4096, {}, "bfloat16", pr), ("nvfp4", 1024, {"scale": 0.002}, "bfloat16", pr),
                ("fp8_e4m3", 2048, {}, "float16", pr), ("int4", 32768, {}, "bfloat16", pr),
                ("int8", 4096, {}, "bfloat16", pr), ("nvfp4", 4096, {}, "bfloat16", pr)]
    if SET == "s33d":  # the shipped plans after this session's flips, and nvfp4 without SCALE_ONCE
        return [("nvfp4", 11008, {}, "bfloat16", {"scale_once": False}),
                ("nvfp4", 14336, {"scale": 0.002}, "bfloat16", {"scale_once": False}),
                ("nvfp4", 28672, {"scale": 0.002}, "float16", {"scale_once": False}),
                ("mxfp4", 11008, {}, "float16", {}), ("fp8_e4m3", 14336, {}, "bfloat16", {}),
                ("mxfp4", 14336, {}, "bfloat16", {}), ("nvfp4", 28672, {}, "bfloat16", {}),
                ("fp8_e4m3", 18944, {}, "float16", {}), ("int8", 18944, {}, "bfloat16", {}),
                ("mxfp4", 18944, {}, "bfloat16", {}), ("int4", 11008, {}, "bfloat16", {}),
                ("nvfp4", 18944, {"scale": 0.002}, "bfloat16", {}), ("fp8_e5m2", 14336, {}, "bfloat16", {"gluon_kron": True}),
                ("fp8_e4m3", 28672, {}, "bfloat16", {"inside": True, "clamp_lo": 2}),
                ("int4", 28672, {}, "float16", {"inside": True, "clamp_lo": 2})]
    if SET == "s33c":  # PERM against float64 on a spread (the rest: bytes against the shipped plan's); UNITS mxfp4
        return [("mxfp4", 11008, {}, "bfloat16", PERM), ("nvfp4", 14336, {"scale": 0.002}, "bfloat16", PERM),
                ("int4", 28672, {}, "bfloat16", PERM), ("fp8_e4m3", 14336, {}, "bfloat16", PERM),
                ("int8", 28672, {}, "float16", PERM), ("nvfp4", 11008, {}, "bfloat16", PERM),
                ("mxfp4", 28672, {}, "float16", PERM), ("int4", 14336, {}, "bfloat16", PERM),
                ("fp8_e4m3", 11008, {"scale": 0.01}, "bfloat16", PERM), ("nvfp4", 28672, {"scale": 0.002}, "bfloat16", PERM),
                ("int4", 11008, {}, "float16", PERM), ("fp8_e5m2", 14336, {}, "bfloat16", PERM),
                ("mxfp4", 18944, {}, "bfloat16", {"units": True}), ("mxfp4", 18944, {}, "float16", {"units": True}),
                ("nvfp4", 14336, {"scale": 0.002}, "bfloat16", {**PERM, "scale_once": False}),
                ("nvfp4", 11008, {}, "bfloat16", {**PERM, "scale_once": False})]
    if SET == "s33b":  # PAIRS against float64 on a spread (the rest: bytes against the shipped plan's, phase_time)
        return [("mxfp4", 11008, {}, "bfloat16", PAIRS), ("nvfp4", 18944, {"scale": 0.002}, "bfloat16", PAIRS),
                ("int4", 28672, {}, "bfloat16", PAIRS), ("fp8_e4m3", 14336, {}, "bfloat16", PAIRS),
                ("int8", 18944, {}, "float16", PAIRS), ("nvfp4", 14336, {}, "bfloat16", PAIRS),
                ("mxfp4", 28672, {}, "float16", PAIRS), ("fp8_e4m3", 11008, {"scale": 0.01}, "bfloat16", PAIRS),
                ("fp8_e4m3", 18944, {}, "bfloat16", {"units": True, **PAIRS}),
                ("int8", 18944, {}, "bfloat16", {"units": True, **PAIRS}),
                ("nvfp4", 18944, {"scale": 0.002}, "bfloat16", {"units": True, **PAIRS}),
                ("mxfp4", 11008, {}, "bfloat16", PP), ("nvfp4", 14336, {"scale": 0.002}, "bfloat16", PP),
                ("int4", 28672, {}, "float16", PP), ("fp8_e4m3", 28672, {}, "bfloat16", PP)]
    if SET == "s33":  # the transforms first (check_transforms runs first in this set), then the quantize variants
        return [(c[1], c[2], {"scale": 0.002} if c[1] == "nvfp4" else {}, "bfloat16", c[4]) for c in s33_timed()
                if c[0] == "q" and c[3] != "shipped"] + [("fp8_e4m3", 28672, {}, "bfloat16", {"clamp_lo": True})]
    if SET == "s32":  # UNITS at 18944 (every format, nvfp4 given and dynamic, fp16), nvfp4 28672 INSIDE off
        cases = [(c[1], c[2], {"scale": 0.002} if c[1] == "nvfp4" else {}, "bfloat16", c[4]) for c in s32_timed()
                 if c[0] == "q" and c[3] in ("units", "nz_clamp", "units_nz_clamp", "clamp")]
        cases += [("nvfp4", 14336, {}, "bfloat16", {"nozero": True, "clamp_lo": True}),
                  ("mxfp4", 11008, {}, "float16", {"nozero": True, "clamp_lo": True}),
                  ("fp8_e4m3", 28672, {}, "bfloat16", {"clamp_lo": True})]
        return cases + [("nvfp4", 18944, {}, "bfloat16", {"units": True}), ("fp8_e4m3", 18944, {}, "float16", {"units": True}),
                        ("int4", 18944, {}, "float16", {"units": True}), ("mxfp4", 18944, {}, "float16", {"units": True}),
                        ("nvfp4", 28672, {"scale": 0.002}, "bfloat16", {}), ("nvfp4", 28672, {}, "bfloat16", {}),
                        ("nvfp4", 28672, {}, "float16", {}), ("int8", 28672, {}, "bfloat16", {})]
    if SET == "final":  # the shipped plans and every variant timed, nvfp4 with its given global scale; a few others
        cases = [(c[1], c[2], {"scale": 0.002} if c[1] == "nvfp4" else {}, "bfloat16", c[4]) for c in final_timed()
                 if c[0] == "q" and c[3] != "before"]
        return cases + [("nvfp4", 28672, {}, "bfloat16", {}), ("nvfp4", 18944, {}, "bfloat16", {}),
                        ("fp8_e4m3", 18944, {}, "float16", {}), ("int4", 28672, {}, "float16", {}),
                        ("nvfp4", 28672, {}, "bfloat16", {"inside": False, "scale_once": True})]
    if SET == "r3":  # every timed variant (the defaults were checked in run 2), nvfp4 with its given global scale
        return [(c[1], c[2], {"scale": 0.002} if c[1] == "nvfp4" else {}, "bfloat16", c[4]) for c in r3_timed()
                if c[0] == "q" and c[3] not in ("gluon", "shipped")] + [("nvfp4", 28672, {}, "bfloat16",
                                                                          {"gluon_kron": True, "inside": False,
                                                                           "scale_once": True}),
                                                                         ("int4", 18944, {}, "bfloat16", {"gluon": True}),
                                                                         ("int4", 18944, {}, "float16", {"gluon": True})]
    cases = [(f, n, {"scale": 0.002} if f == "nvfp4" else {}, "bfloat16", GLUON_AT[n]) for n in WIDTHS
             for f in FORMATS_AT[n]]
    cases += [("fp8_e5m2", 14336, {}, "bfloat16", GLUON), ("nvfp4", 14336, {}, "bfloat16", GLUON),
              ("fp8_e4m3", 28672, {}, "float16", GLUON), ("mxfp4", 14336, {}, "float16", GLUON),
              ("fp8_e4m3", 14336, {"scale": 0.01}, "bfloat16", GLUON), ("nvfp4", 18944, {}, "bfloat16", GLUON_AT[18944]),
              ("int8", 18944, {}, "float16", GLUON_AT[18944])]
    if not quick:
        for n, vs in VARIANTS.items():
            for name, tuning, fmts in vs:
                cases += [(f, n, {"scale": 0.002} if f == "nvfp4" else {}, "bfloat16", tuning) for f in fmts]
    return cases


def phase_check(result, save, deadline, quick):
    import torch

    from tilecore.ops.hadamard import quantize
    from tilecore.ops.hadamard.quantize_reference import (code_order, dequantize, hadamard_quantize_reference,
                                                          shape_outputs)

    out = result.setdefault("check", {"quantize": [], "transform": []})
    torch.manual_seed(0)
    if SET in ("s33", "s33b", "s33c", "s33d"):  # the transforms first (s33e: none)
        check_transforms(out["transform"], save, deadline)
    for fmt, n, kw, dtn, tuning in check_cases(quick):
        if time.time() > deadline:
            out["quantize"].append({"format": fmt, "n": n, "skipped": "time"})
            continue
        case = {"format": fmt, "n": n, "dtype": dtn, **kw, "tuning": {k: v for k, v in tuning.items() if k != "gluon_kron"}}
        try:
            dtype = getattr(torch, dtn)
            rows = 2049  # odd: a last tile of one row at split 1
            x = torch.randn(rows, n, dtype=dtype, device="cuda")
            x[:, 7] *= 80  # an outlier channel
            x[1, 3] = float("nan")  # a NaN row
            x[2, 5] = float("inf")  # an inf row
            kw = dict(kw)
            if "scale" in kw:
                kw["scale"] = torch.tensor([kw["scale"]], device="cuda")
            group = quantize.FORMATS[fmt].default_group
            plan = quantize.plan_quantize(x, fmt, group, None, True, "scale" in kw, False, **tuning)
            case["path"] = plan.path
            case["config"] = {k: plan.config.get(k) for k in ("SPLIT", "INSIDE", "STAGES", "F") + (("S", "N1", "N2") if SET in ("s37", "s37b", "s37c") else ())
                              if k in plan.config}
            codes, scales, g = quantize.run_plan(plan, x, fmt, group, None, True, kw.get("scale"), poison=True)
            codes2, scales2, _ = quantize.run_plan(plan, x, fmt, group, None, True, kw.get("scale"), poison=0xA5)
            case["written"] = all(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
                                  for a, b in ((codes, codes2), (scales, scales2)))
            codes, scales = shape_outputs(codes, scales, x.shape[:-1], g)
            xs, codes = x[:64], codes[:64]
            scales = tuple(s if s.numel() == 1 else s[:64] for s in scales) if isinstance(scales, tuple) else \
                scales if scales.numel() == 1 else scales[:64]
            cpu_kw = {k: v.cpu() for k, v in kw.items()}
            ref_codes, ref_scales = hadamard_quantize_reference(xs.cpu(), format=fmt, **cpu_kw)
            ref_codes = ref_codes.cuda()
            ref_scales = tuple(r.cuda() for r in ref_scales) if isinstance(ref_scales, tuple) else ref_scales.cuda()
            a, b = code_order(codes, fmt), code_order(ref_codes, fmt)
            case["match"] = float((a == b).double().mean())
            far = ((a - b).abs() > 1).reshape(xs.shape[0], -1)
            case["far_codes"] = int(far.sum())
            case["far_codes_tiny"] = True
            if case["far_codes"]:
                ours = dequantize(codes, scales, format=fmt).double()
                ref = dequantize(ref_codes, ref_scales, format=fmt).double()
                bound = 2.0**-13 * ref.abs().nan_to_num(0.0, 0.0, 0.0).amax(dim=-1, keepdim=True)
                case["far_codes_tiny"] = bool(((ours - ref).abs() <= bound)[far.reshape(ours.shape)].all())
            exact, differ_n = True, 0
            pairs = zip(scales, ref_scales) if isinstance(scales, tuple) else [(scales, ref_scales)]
            for s, r in pairs:
                if s.dtype == torch.float32:
                    r = r.to(torch.float32)
                    close = ((s - r).abs() <= 2.0**-15 * r.abs()) | (s == r) | torch.isnan(r)
                    exact = exact and bool(torch.equal(torch.isnan(s), torch.isnan(r))) and bool(close.all())
                else:
                    differ = s.view(torch.uint8) != r.view(torch.uint8)
                    differ_n += int(differ.sum())
                    exact = exact and int(differ.sum()) <= max(2, differ.numel() // 10**6)
            case["scales_differ"] = differ_n
            case["scales_ok"] = exact
            case["ok"] = case["match"] >= 0.999 and case["far_codes_tiny"] and exact and case["written"] \
                and case["path"] in (("gluon_kron", "gluon_wide") + (("pow2",) if SET in ("s33e", "s33f", "s34b", "s35", "s35b", "s37", "s37b", "s37c") else ())) and (not tuning.get("scale_once") or "SCALE_ONCE" in plan.config)
            case["config"].update({k: True for k in ("SCALE_ONCE", "KTRIM", "FOLD", "UNITS") if plan.config.get(k)})
            if "units" in tuning and not plan.config.get("UNITS"):
                case["ok"] = False
            for key in ("balance", "perm", "stream", "e2m1_pairs"):  # a variant asked for must be the one run
                if tuning.get(key) and not plan.config.get(key.upper()):
                    case["ok"] = False
            case["config"].update({k: True for k in ("BALANCE", "PERM", "STREAM") if plan.config.get(k)})
        except Exception as err:  # noqa: BLE001
            case["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            case["ok"] = False
        out["quantize"].append(case)
        save()
    if SET not in ("s33", "s33b", "s33c", "s33d", "s33e", "s33f"):
        check_transforms(out["transform"], save, deadline)


def check_transforms(out, save, deadline):
    """hadamard_transform's "gluon" kron plan (the Gluon kernels' STORE): error over the rounding floor against
    float64 on the first 64 rows, every element written (NaN poison), an inf row non-finite as the reference's;
    rows 2049 and 2; in place; transpose (H_m^T, the backward)."""
    import torch

    from tilecore import accuracy
    from tilecore.ops.hadamard import hadamard_reference, kron, orders
    from tilecore.ops.hadamard.reference import hadamard_matrix

    cases = [((m, p), 2049, "out", {}) for m, p in TRANSFORMS] + [((28, 512), 2, "out", {}),
                                                                      ((28, 1024), 3, "out", {}),
                                                                      ((28, 512), 2049, "inplace", {}),
                                                                      ((28, 1024), 2049, "transpose", {}),
                                                                      ((148, 128), 2049, "out", {}),
                                                                      ((172, 64), 2049, "transpose", {})]
    if SET == "final":  # the shipped transform plans (Gluon at the four shapes, 28 x 1024 with INSIDE off)
        cases = [((m, p), 2049, "out", {}) for m, p in TRANSFORMS] + [((28, 1024), 2049, "transpose", {})]
    if SET == "s33":  # the STORE2 transform as run 7 timed it; the other transforms with NOZERO + CLAMP_LO
        t = {**S2NC, "gluon": True}
        nc = {"nozero": True, "clamp_lo": True, "gluon": True}
        cases = [((148, 128), 2049, "out", t), ((148, 128), 3, "out", t), ((148, 128), 2049, "inplace", t),
                 ((148, 128), 2049, "transpose", t), ((148, 128), 2049, "out", {"units": True, "store2": True,
                                                                               "stages": 2, "gluon": True}),
                 ((172, 64), 2049, "out", nc), ((172, 64), 2049, "transpose", nc), ((28, 1024), 2049, "out", nc),
                 ((28, 1024), 3, "inplace", nc)]
    if SET == "s33d":  # the shipped transform plans after this session's flips
        cases = [((148, 128), 2049, "out", {}), ((148, 128), 3, "transpose", {"gluon": True}),
                 ((172, 64), 2049, "out", {}), ((172, 64), 2049, "inplace", {}), ((28, 512), 2049, "transpose", {}),
                 ((28, 1024), 2049, "out", {}), ((28, 1024), 2049, "out", {"inside": True, "clamp_lo": 2})]
    if SET in ("s35", "s35b", "s37", "s37b", "s37c"):  # no transform changed (28 x 1024's shipped plan is what s34c checked)
        cases = []
    if SET == "s34c":  # the kron kernel's STREAM + PAIRS at 28 x 1024: odd rows, in place, H_m^T
        ks = {"stream": True, "clamp_lo": 2}
        cases = [((28, 1024), 2049, "out", ks), ((28, 1024), 3, "out", ks), ((28, 1024), 2049, "inplace", ks),
                 ((28, 1024), 2049, "transpose", ks)]
    if SET == "s34b":  # the shipped 172 x 64 transform (STREAM since run 3): odd rows, in place, H_m^T; the kron STREAM
        ks = {"stream": True}
        cases = [((172, 64), 2049, "out", {}), ((172, 64), 3, "transpose", {}), ((172, 64), 2049, "inplace", {}),
                 ((28, 1024), 2049, "out", ks), ((28, 1024), 3, "out", ks), ((28, 1024), 2049, "inplace", ks),
                 ((28, 1024), 2049, "transpose", {**ks, "clamp_lo": 2})]
    if SET == "s34":  # STREAM at 172 x 64 (two ring stages): odd rows, in place (a row stored while the next loads), H_m^T
        g = STREAM  # (kron_plan gets gluon=True in this set)
        cases = [((172, 64), 2049, "out", g), ((172, 64), 3, "out", g), ((172, 64), 2049, "inplace", g),
                 ((172, 64), 2049, "transpose", {**g, "ktrim": True, "nozero": True})]
    if SET == "s33c":  # PERM on the shipped transform plans (m x 64 and the kron kernel's)
        g = {**PERM, "gluon": True}
        cases = [((172, 64), 2049, "out", g), ((172, 64), 3, "transpose", g), ((172, 64), 2049, "inplace", g),
                 ((28, 512), 2049, "out", g), ((28, 512), 2049, "transpose", g), ((28, 1024), 3, "out", g),
                 ((28, 1024), 2049, "inplace", g)]
    if SET == "s33b":  # PAIRS on the shipped transform plans; PAIRS + PERM at m x 64 and on the kron kernel
        g = {**PAIRS, "gluon": True}
        gp = {**PP, "gluon": True}
        cases = [((148, 128), 2049, "out", g), ((148, 128), 3, "transpose", g), ((172, 64), 2049, "out", g),
                 ((172, 64), 2049, "inplace", g), ((28, 512), 2049, "transpose", g), ((28, 1024), 3, "out", g),
                 ((28, 1024), 2049, "out", g), ((172, 64), 2049, "transpose", gp), ((28, 512), 2049, "out", gp),
                 ((28, 1024), 3, "inplace", gp)]
    if SET == "s32":  # UNITS at 148 x 128: odd row counts, in place, H_m^T
        u = {"units": True, "gluon": True}  # (gluon: the 3-row case is below the plan's TMA_MIN_ELEMENTS)
        nc = {"nozero": True, "clamp_lo": True, "gluon": True}
        cases = [((148, 128), 2049, "out", u), ((148, 128), 3, "out", u), ((148, 128), 2049, "inplace", u),
                 ((148, 128), 2049, "transpose", u), ((148, 128), 2049, "out", {}),
                 ((148, 128), 2049, "out", nc), ((172, 64), 2049, "out", nc), ((28, 1024), 2049, "out", nc),
                 ((28, 512), 3, "transpose", nc), ((148, 128), 2049, "out", {**u, **nc})]
        s2 = {**u, "store2": True, "stages": 2}
        cases += [((148, 128), 2049, "out", s2), ((148, 128), 3, "out", s2), ((148, 128), 2049, "inplace", s2),
                  ((148, 128), 2049, "transpose", {**s2, **nc, "ktrim": True})]
    if SET == "r3":  # INSIDE off at 28 x 1024; KTRIM on the wide kernel
        cases = [((28, 1024), 2049, "out", {"inside": False}), ((28, 1024), 3, "transpose", {"inside": False}),
                 ((28, 1024), 2049, "inplace", {"inside": False}), ((148, 128), 2049, "out", {"ktrim": True}),
                 ((172, 64), 2049, "transpose", {"ktrim": True})]
    for (m, p), rows, mode, tuning in cases:
        if time.time() > deadline:
            out.append({"m": m, "p": p, "skipped": "time"})
            continue
        n = m * p
        case = {"m": m, "p": p, "rows": rows, "mode": mode, **tuning}
        try:
            x = torch.randn(rows, n, dtype=torch.bfloat16, device="cuda")
            if rows > 2:
                x[1, 5] = float("inf")
            plan = kron.kron_plan(x, m, p, **({} if SET in ("final", "s32", "s33", "s33b", "s33c", "s33d") else {"gluon": True}),
                                  **tuning)
            case["path"] = plan.path
            case["config"] = {k: v for k, v in plan.config.items() if isinstance(v, (bool, int, float, str))}
            transpose = mode == "transpose"
            if mode == "inplace":
                y = x.clone()
                kron.launch(plan, y, y, n**-0.5)
            else:
                y = torch.full_like(x, float("nan"))
                kron.launch(plan, x, y, n**-0.5, transpose)
            xs = x[:64].cpu().double()
            if transpose:  # (H_m^T (x) H_p) x: H_m^T on the sub-rows, H_p along them
                hm = orders.hadamard_of_order(m).double()
                t = torch.einsum("ji,rjc->ric", hm, xs.reshape(-1, m, p))
                ref = ((t @ hadamard_matrix(p, torch.float64)).reshape(-1, n) * n**-0.5).cuda()
            else:
                ref = hadamard_reference(x[:64].cpu(), n**-0.5, out_dtype=torch.float64).to(x.device)
            finite = torch.ones(rows, dtype=torch.bool, device="cuda")
            if rows > 2:
                finite[1] = False
            keep = finite[:64]
            case["err_over_floor"] = round(accuracy.error_over_floor(y[:64][keep], ref[keep]), 4)
            case["all_written"] = bool(torch.isfinite(y[finite]).all())
            if rows > 2:
                case["inf_row_nonfinite"] = bool((~torch.isfinite(y[1])).any())
            case["ok"] = case["all_written"] and case["err_over_floor"] <= 1.25 and case["path"] == "gluon"
        except Exception as err:  # noqa: BLE001
            case["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            case["ok"] = False
        out.append(case)
        save()


def _tensors(obj):
    """The tensors in obj (a tensor, or nested tuples / lists of them), in order."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    return [t for o in obj for t in _tensors(o)] if isinstance(obj, (tuple, list)) else []


def _bench(fn):
    import triton

    fn()
    return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def phase_time(result, save, deadline, quick):
    import torch

    out = result.setdefault("time", [])
    copies = {}

    def copy_ms(nbytes):
        half = int(nbytes // 2) // 16 * 16
        if half not in copies:
            src = torch.empty(half, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
            copies[half] = _bench(lambda: dst.copy_(src))
            del src, dst
        return copies[half]

    xs = {}
    shipped_out = {}
    for case in timed_cases(quick):
        row = {"case": list(case[:4])}
        if time.time() > deadline:
            row["skipped"] = "time"
            out.append(row)
            continue
        try:
            n = case[2] if case[0] == "q" else case[1] * case[2]
            if n not in xs:
                xs.clear()
                shipped_out.clear()
                torch.cuda.empty_cache()
                xs[n] = torch.randn(E // n, n, dtype=torch.bfloat16, device="cuda")
            x = xs[n]
            y = torch.empty_like(x) if case[0] == "t" else None
            run, plan, written = _runner(case, x, y)
            row["path"] = plan.path
            if SET in ("s33b", "s33c", "s33d", "s33e", "s33f", "s34", "s34b", "s34c", "s35", "s35b", "s37", "s37b", "s37c"):  # the bytes against the shipped plan's on the same rows (the values kept)
                got = run()
                got = [y.clone()] if case[0] == "t" else [t.clone() for t in _tensors(got[:2])]
                key = case[:3]
                if SET == "s37" and case[3] in ("split", "split_clamp"):  # split_clamp's bytes against the split's
                    if case[3] == "split":
                        shipped_out[key + ("split",)] = got
                    elif key + ("split",) in shipped_out:
                        row["identical"] = all(a.contiguous().view(torch.uint8).equal(b.contiguous().view(torch.uint8))
                                               for a, b in zip(got, shipped_out[key + ("split",)]))
                elif case[3] == "shipped":
                    shipped_out[key] = got
                elif key in shipped_out and case[3] in ("pairs", "pairs_perm", "perm", "perm_noonce", "noonce", "nopairs",
                                                               "balance", "balance_perm", "units_perm", "stream",
                                                               "noperm", "nostream", "e2m1_pairs", "waves2",
                                                               "waves4", "small4", "tma", "tma_waves2",
                                                               "tma_small4", "e2m1_off", "before"):
                    row["identical"] = all(a.contiguous().view(torch.uint8).equal(b.contiguous().view(torch.uint8))
                                           for a, b in zip(got, shipped_out[key]))
                del got
            ms = _bench(run)
            nbytes = x.numel() * x.element_size() + written
            row["ms"] = round(ms, 4)
            row["copy_ms"] = round(copy_ms(nbytes), 4)
            row["pct_copy"] = round(100 * row["copy_ms"] / ms, 1)
            del y
        except Exception as err:  # noqa: BLE001
            row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        out.append(row)
        save()


def table(result):
    lines = []
    chk = result.get("check", {})
    bad = [c for c in chk.get("quantize", []) + chk.get("transform", []) if not c.get("ok") and "skipped" not in c]
    nq = len(chk.get("quantize", []))
    lines.append(f"checks: quantize {nq}, transform {len(chk.get('transform', []))}, failing {len(bad)}")
    for c in bad[:8]:
        lines.append("  FAIL " + json.dumps({k: v for k, v in c.items() if k != "config"})[:230])
    ms = [c["match"] for c in chk.get("quantize", []) if "match" in c]
    if ms:
        lines.append(f"  codes equal: {100 * min(ms):.4f}-{100 * max(ms):.4f}%")
    errs = [c["err_over_floor"] for c in chk.get("transform", []) if "err_over_floor" in c]
    if errs:
        lines.append(f"  transform error / floor: {min(errs)}-{max(errs)}")
    times = {tuple(r["case"]): r for r in result.get("time", []) if "ms" in r}
    groups = {}
    for r in result.get("time", []):
        key = tuple(r["case"])
        groups.setdefault(key[:3], []).append(r)
    lines.append("kind fmt/m n/p: reference ms (% copy); variant x reference (ms) ...  [reference: gluon, else shipped]")
    if SET == "s37c":  # the shipped-only groups as one line a format: n:% of copy
        alone = {g: rows for g, rows in groups.items() if len(rows) == 1 and rows[0]["case"][3] == "shipped"}
        for fmt in FORMATS:
            cells = [f"{g[2]}:{r[0].get('pct_copy', r[0].get('error', r[0].get('skipped', '?')))}"
                     for g, r in alone.items() if g[1] == fmt]
            if cells:
                lines.append(f"shipped {fmt} % of copy: " + " ".join(str(c)[:24] for c in cells))
        groups = {g: rows for g, rows in groups.items() if g not in alone}
    for g, rows in groups.items():
        ref = "gluon" if g + ("gluon",) in times else "shipped"  # (final: before / fold as x the shipped plan's speed)
        base = times.get(g + (ref,))
        parts = []
        if base:
            parts.append(f"{ref} {base['ms']:.4f} ({base['pct_copy']}%) [{base['path']}]")
        for r in rows:
            name = r["case"][3]
            if name == ref:
                continue
            if "ms" not in r:
                parts.append(f"{name} {r.get('error', r.get('skipped', ''))[:40]}")
            elif base:
                same = {True: " =", False: " DIFF"}.get(r.get("identical"), "")
                parts.append(f"{name} {base['ms'] / r['ms']:.2f}x ({r['ms']:.4f}, {r['pct_copy']}%){same}")
            else:
                parts.append(f"{name} {r['ms']:.4f} ({r['pct_copy']}%)")
        lines.append(f"{g[0]} {g[1]} {g[2]}: " + "; ".join(parts))
    return "\n".join(lines[:44])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=150.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--phases", default="warm,check,time")
    ap.add_argument("--set", default="final", choices=("r2", "r3", "final", "s32", "s33", "s33b", "s33c", "s33d", "s33e", "s33f", "s34", "s34b", "s34c", "s35", "s35b", "s37", "s37b", "s37c"))
    a = ap.parse_args()
    global SET
    SET = a.set
    t0 = time.time()
    _import()
    import torch

    outdir = os.environ.get("OUT", ".")
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, "gpu_gluon_widths.json")
    result = {"args": vars(a), "device": torch.cuda.get_device_name(0), "git": os.popen("git rev-parse HEAD 2>/dev/null").read().strip()}

    def save():
        with open(path, "w") as fh:
            json.dump(result, fh, indent=1, default=str)  # (a plan config may hold a dtype)

    phases = a.phases.split(",")
    try:
        if "warm" in phases:
            phase_warm(result, t0 + (0.5 if SET in ("s35", "s35b", "s37", "s37b", "s37c") else 0.45) * a.budget, a.quick)
            result["warm_s"] = round(time.time() - t0, 1)
            save()
        if "check" in phases:
            phase_check(result, save, t0 + 0.70 * a.budget, a.quick)
            result["check_s"] = round(time.time() - t0, 1)
        if "time" in phases:
            phase_time(result, save, t0 + a.budget - 5, a.quick)
    except Exception:  # noqa: BLE001
        result["fatal"] = traceback.format_exc()[-2000:]
    result["wall_s"] = round(time.time() - t0, 1)
    save()
    print(json.dumps({k: result.get(k) for k in ("warm_s", "check_s", "wall_s", "device")}))
    warm_err = [w for w in result.get("warm", []) if w[2]]
    for w in warm_err[:4]:
        print("warm error:", w[0][:80], w[2][:200])
    if "fatal" in result:
        print(result["fatal"][-1500:])
    print(table(result))


if __name__ == "__main__":
    main()
