"""The FFT convolution's tables (plan.py reads them). One line a reason here; the runs behind each entry and the
history of every table: notes/fft_conv/README.md (decision log, and "configs.py history")."""
from __future__ import annotations

# The pair kernel (kernels_pair.py): N -> (N1, N2, pairs a program, warps[, loop[, stages[, hoist]]]), 2N = N1 N2,
# N1 >= 32 (tl.dot's inner dimension N1/2 >= 16); pairs 0: the one-pair transpose-free kernel
PAIR_CONFIGS = {
    256: (32, 16, 2, 4),  # fastest of the H200 sweeps, in two runs (4 pairs: erratic)
    512: (32, 32, 2, 4),  # the H200 sweep's fastest
    1024: (32, 64, 1, 4),  # 64 x 32 slower; the hoisted loop 4 within noise on the H100
    4096: (128, 64, 1, 8),  # 108 B of spill (16 warps: 1.7 KB); 2048's 64 x 64 build faults (long)
}

# The one-pass three-factor kernel (kernels_mono.py): N -> (A, B, C, loop, warps[, permute[, kfull]]), 2N = A B C
MONO_CONFIGS: dict = {}  # off: correct on the H100 but slower than the shipped path at every N
MONO_CANDIDATES = {  # gpu_onepass.py's candidates (all slower than the shipped path in two runs)
    1024: [(32, 64, 1, 1, 4), (32, 64, 1, 1, 4, False, True)],
    2048: [(64, 64, 1, 1, 8, False, True)],
    4096: [(32, 16, 16, 1, 8, True, True), (32, 16, 16, 1, 16, True, True), (64, 128, 1, 1, 8, False, True)],
}

# The one-pass kernel in Gluon (gluon_onepass.py; Hopper): N -> plan.gluon_plan's arguments in order (A, B, programs
# a SM, ASYNC, TMA, CHUNK, RFFT, WARPGROUPS, warps, TW_SFU, CONTIG, KPRE, YALIAS, LEAN, maxnreg),
# 2N = A B, B = 64; the plan takes it on a Hopper under a checked triton
GLUON_ONEPASS: dict = {
    1024: (32, 64, 3, False, True, 0, 2, 1, 4, True, True, 3, False, 3, 168),  # 6.98x torch.fft
    2048: (64, 64, 2, True, True, 0, 2, 1, 4, True, False, 0, False, 3),  # 6.69-6.78x torch.fft
    4096: (128, 64, 1, True, True, 64, 2, 2, 4, True, 2, 0, True, 5),  # LEAN 4 (transposed): 6.14x, 1.32-1.36x
}
# The order-3 one-pass kernel in Gluon (gluon_order3.py; Hopper; each chunk transposed): N -> (programs a SM,
# warpgroups a pair, RFFT[, STACK[, KFULL]]); RFFT 4: a complex64 spectrum cast a call to float16 bins over each
# channel's largest part (launch.scaled_half_bins, one kernel), 3: a float16 spectrum read as it is; STACK (8192 only:
# F2 is F_16 four times on its diagonal there, and one warpgroup a pair): 1a / 1'a four columns a product in the wgmmas'
# layouts, u read once (without it, as at 16384, the same addressing a column a product); KFULL (8192): the bins laid
# out a call as the chunks read them (launch.laid_half_bins: 16-byte loads, no gather; at 16384 no faster in the kernel);
# checked and timed by experiments/fft_conv/gpu_order3.py (the runs: notes/fft_conv)
GLUON_ORDER3: dict = {
    8192: (2, 1, 4, True, True),  # RFFT 4, STACK, KFULL (its layout a half row a program: 1.041-1.046x; H200)
    16384: (1, 2, 4),  # RFFT 4 (the one-kernel cast): 1.039x / 1.036x the torch cast's launch (H200, s43 call 1)
}
GLUON_ONEPASS_CANDIDATES = {  # checked and timed by experiments/fft_conv/gpu_onepass.py
    1024: [GLUON_ONEPASS[1024]],  # settled: re-checked only
    2048: [GLUON_ONEPASS[2048]],
    4096: [GLUON_ONEPASS[4096]],  # (the chunks of 32 before it: removed, notes/fft_conv)
}
# A float16 spectrum (filter_spectrum(k, n, torch.float16): (H, N + 1, 2) float16 bins the caller keeps): N -> the tuple
# that reads its bins as they are (RFFT 3: one 32-bit load a bin, half the L2 bytes); every other plan reads complex64
# bins, so the op widens a float16 spectrum for it (a conversion a call). GLUON_ORDER3_HALF goes first where N has both
GLUON_ONEPASS_HALF: dict = {
    1024: (32, 64, 3, False, True, 0, 3, 1, 4, True, True, 3, False, 3, 168),  # the op 1.057x (graphs) the complex64 op
    2048: (64, 64, 2, True, True, 0, 3, 1, 4, True, True, 3, False, 3),  # + KPRE 3 (CONTIG): 1.079x the complex64 op
    4096: (128, 64, 1, True, True, 64, 3, 2, 4, True, 2, 0, True, 5),  # LEAN 4, RFFT 3: 1.024x the complex64 op
}
GLUON_ORDER3_HALF: dict = {
    8192: (2, 1, 3, True, True),  # RFFT 3, STACK, KFULL (its layout a half row a program: 1.029-1.034x; H200)
    16384: (1, 2, 3),  # RFFT 3: 3.548 / 3.520 ms = 2.35x / 2.45x (1.085-1.092x)
}
GLUON_ONEPASS_HALF_CANDIDATES = {  # experiments/fft_conv/gpu_s38.py (the shipped tuples at RFFT 3)
    1024: [(32, 64, 3, False, True, 0, 3, 1, 4, True, True, 3, False, 3, 168)],  # KPRE 3's tile: 32-bit copies
    2048: [(64, 64, 2, True, True, 0, 3, 1, 4, True, False, 2, False, 3),  # + KPRE 2 (int32 tile: two a SM fit)
           (64, 64, 2, True, True, 0, 3, 1, 4, True, True, 3, False, 3)],  # + KPRE 3 on a CONTIG walk (as 1024)
    4096: [GLUON_ONEPASS_HALF[4096]],
}
# the pair kernel's candidates for gpu_check.py (the loop variants: none faster than the plan)
PAIR_CANDIDATES = {
    256: [(32, 16, 2, 4)],
    512: [(32, 32, 2, 4)],
    1024: [(32, 64, 1, 4), (32, 64, 1, 4, 4, 1, True)],
    2048: [(64, 64, 1, 8), (64, 64, 2, 8), (128, 32, 1, 8)],  # which 2048 shapes fault (v8)
    4096: [(128, 64, 1, 8)],
}

# The filter's gradient by the pair kernel's transforms (kernels_pair.fft_conv_dk_pair_kernel; launch.dk_pair):
# N -> (N1, N2, pair groups a program, warps); elsewhere torch.fft's dk
DK_CONFIGS: dict = {4096: (128, 64, 8, 8)}  # dk 1.41x torch.fft's, the step 1.26x
# The same on the Gluon kernel's forward stages (fft_conv_gluon_dk_kernel; launch.dk_gluon; Hopper; before DK_CONFIGS):
# N -> (A, B, pair groups a program[, XSMEM]), 2N = A B, B = 64
DK_GLUON: dict = {
    1024: (32, 64, 8),  # dk 3.43x torch.fft's
    2048: (64, 64, 8, True),  # XSMEM: dk 2.67x torch.fft's, the step 1.17-1.34x
}
DK_GLUON_CANDIDATES = {1024: [DK_GLUON[1024]], 2048: [DK_GLUON[2048]]}
DK_CANDIDATES = {  # the tl dk kernel's (gpu_onepass.py times them only where no Gluon dk ships)
    256: [(32, 16, 8, 4)],
    512: [(32, 32, 8, 4)],
    1024: [(32, 64, 8, 4), (32, 64, 4, 4)],
    4096: [(128, 64, 8, 8)],
}

# The three-pass form (kernels_long.py): N -> (N1, N2, BN columns a program in passes 1 and 3, BK1 rows in pass 2, KC
# the chunk of N1 a product takes, warps of passes 1 and 3, warps of pass 2[, GAUSS: three-product complex products])
LONG_CONFIGS = {
    2048: (64, 64, 32, 16, 32, 4, 4),  # the fallback off Hopper (the pair kernel's 64 x 64 build faults)
    8192: (128, 128, 32, 32, 64, 4, 8),  # the H200 sweep's fastest (1.77x torch.fft)
    16384: (256, 128, 32, 32, 64, 4, 8),  # the H200 sweep's fastest (1.50x torch.fft)
}
LONG_CANDIDATES = {
    2048: [(64, 64, 32, 16, 32, 4, 4)],
    8192: [(128, 128, 32, 32, 64, 4, 8), (128, 128, 32, 64, 64, 4, 8), (128, 128, 16, 32, 64, 4, 8),
           (128, 128, 32, 32, 64, 4, 8, True)],
    16384: [(256, 128, 32, 32, 64, 4, 8), (256, 128, 32, 64, 64, 4, 8), (256, 128, 16, 32, 64, 4, 8),
            (256, 128, 32, 32, 64, 4, 8, True)],
}

PAIR_DTYPES = ("bfloat16", "float16")  # float16 products: bf16 at ~1.04x its floor, fp16 ~2.5x; float32 below

# The float32 kernel (kernels.py): N -> (N1, N2), 2N = N1 N2
TL_FACTORS = {256: (32, 16), 512: (32, 32), 1024: (32, 64)}  # the whole sequence in registers: 2048 spilled 1.7 KB
TL_WARPS = {256: 4, 512: 4, 1024: 8}  # 1024: 170-255 registers, 0-8 B of spill
TL_PRECISION = "tf32x3"  # about float32's accuracy on the tensor cores
