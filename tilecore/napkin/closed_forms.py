"""The paper's closed forms, derived again here, and its Hopper attention account.

All sizes are in elements; M is fast-memory capacity in elements; bandwidths in elements per second.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .hardware import dtype_bytes, get_gpu


def matmul_io(a: float, b: float, c: float, g_a: float, g_c: float) -> float:
    """(a x b)(b x c): A is re-sent to each of c/g_c column groups, B to each of a/g_a row groups,
    C written once: H = abc (1/g_a + 1/g_c) + ac."""
    return a * b * c * (1 / g_a + 1 / g_c) + a * c


def matmul_io_optimal(a: float, b: float, c: float, M: float) -> float:
    """Square tiles g_a = g_c = sqrt(M) (the g_a g_c term dominates M for a thin stream s_b):
    H = 2abc / sqrt(M) + ac."""
    return 2 * a * b * c / math.sqrt(M) + a * c


def matmul_lower_bound(m: float, n: float, k: float, M: float) -> float:
    """Leading term of the red-blue pebbling bound (Hong-Kung; tight constant by Smith et al. 2017)."""
    return 2 * m * n * k / math.sqrt(M)


def attention_io(q: float, x: float, d: float, g_q: float) -> float:
    """Q and O move once; K and V are re-sent to each of q/g_q query groups: H = 2qd + 2xdq/g_q."""
    return 2 * q * d + 2 * x * d * q / g_q


def attention_io_optimal(q: float, x: float, d: float, M: float) -> float:
    """M >= 2 g_q d + 2 s_x d; with s_x << g_q, g_q = M / 2d: H = 2qd + 4xqd^2 / M."""
    return 2 * q * d + 4 * x * q * d * d / M


def attention_lower_bound(N: float, d: float, M: float) -> float:
    """Theta(N^2 d^2 / M) HBM accesses (FlashAttention's lower bound), with constant 1."""
    return N * N * d * d / M


def quantized_io_time_ratio(beta: float, q_from: float, q_to: float) -> float:
    """H = alpha M^-beta in values; capacity is bytes/q values and bandwidth bytes/s / q values/s,
    so the IO time scales as q^(1 + beta). Ratio of time at q_from bytes to time at q_to bytes."""
    return (q_from / q_to) ** (1 + beta)


def ridge(gpu, level: str = "HBM", dtype: str = "fp16", bandwidth_values: float | None = None) -> float:
    """Values per FLOP the level can deliver at the tensor-core peak (1.69e-3 for H100 HBM, fp16)."""
    gpu = get_gpu(gpu)
    bw = bandwidth_values or gpu.level(level).bandwidth / dtype_bytes(dtype)
    return bw / gpu.rate("tensor", dtype)


def min_query_group(gpu, level: str = "HBM", dtype: str = "fp16", bandwidth_values: float | None = None) -> float:
    """Attention streams 2 s_x d values for 4 g_q s_x d FLOPs: compute-bound iff g_q >= 1/(2 ridge)."""
    return 1 / (2 * ridge(gpu, level, dtype, bandwidth_values))


def min_l2_memory_bytes(gpu, dtype: str = "fp16") -> float:
    """Square matmul tiles stream 2 g s values for 2 g^2 s FLOPs: compute-bound iff g >= 1/ridge,
    so the level above HBM must hold a g x g tile: (1/ridge)^2 values."""
    return ridge(gpu, "HBM", dtype) ** -2 * dtype_bytes(dtype)


@dataclass
class HopperAttention:
    """The paper's warpgroup-level account for one H100 SM (its steps 5-8)."""
    smem_per_block: int        # K_j, V_j chunks, double-buffered, shared by the warpgroups
    smem_per_warpgroup: int    # Q tile and O staging tile
    rf_per_warpgroup: int      # S (fp32), P, O accumulator, row statistics mu, z, delta
    warpgroups: int
    limits: dict               # how many warpgroups shared memory / registers allow (fractional)
    g_q: int
    clocks: dict               # per warpgroup-step on one SM: tensor QK^T, tensor PV, SFU exp, ALU
    step_compute_s: float      # tensor and SFU overlap across warpgroups: max of the two
    step_transfer_s: float     # K_j and V_j from HBM at this SM's share of the bandwidth
    ideal_flops: float         # whole GPU, compute-bound


def hopper_attention(gpu="h100", d: int = 128, w_q: int = 128, s_x: int = 64, qk: str = "fp8",
                     pv: str = "fp16", acc: str = "fp16", stages: int = 2) -> HopperAttention:
    gpu = get_gpu(gpu)
    b = dtype_bytes
    smem_block = stages * s_x * d * (b(qk) + b(pv))
    smem_wg = w_q * d * b(qk) + w_q * d * b(pv)
    rf_wg = w_q * s_x * 4 + w_q * s_x * b(pv) + w_q * d * b(acc) + 4 * w_q * 4
    smem_cap = gpu.max_smem_per_block
    limits = {"SMEM": (smem_cap - smem_block) / smem_wg, "RF": gpu.level("RF").capacity / rf_wg}
    n_wg = int(min(limits.values()))
    per_clk = gpu.per_sm_per_clock
    qk_clk = n_wg * 2 * w_q * s_x * d / per_clk(gpu.rate("tensor", qk))
    pv_clk = n_wg * 2 * w_q * s_x * d / per_clk(gpu.rate("tensor", pv))
    exp_clk = n_wg * (w_q * s_x + w_q) / per_clk(gpu.rate("sfu", "fp32"))   # P and delta = exp(mu' - mu)
    alu_clk = n_wg * w_q * d / per_clk(gpu.rate("alu", acc))                 # O = delta O + ...
    clocks = {"tensor QK^T": qk_clk, "tensor PV": pv_clk, "SFU exp": exp_clk, "ALU rescale": alu_clk}
    step_clk = max(qk_clk + pv_clk, exp_clk, alu_clk)
    step_bytes = s_x * d * (b(qk) + b(pv))
    step_transfer = step_bytes / (gpu.level("HBM").bandwidth / gpu.sms)
    flops_per_step = n_wg * 4 * w_q * s_x * d
    ideal = flops_per_step / step_clk * gpu.sms * gpu.clock_hz
    return HopperAttention(smem_block, smem_wg, rf_wg, n_wg, limits, n_wg * w_q, clocks,
                           step_clk / gpu.clock_hz, step_transfer, ideal)


def softmax_overhead_efficiency(gpu="h100", dtype: str = "fp16", d: int = 128, exposed: float = 2 / 3) -> float:
    """Fraction of tensor-core peak when `exposed` of the exp time cannot hide behind the matmuls
    (the paper's account of FlashAttention-3: 2/3 exposed gives 75% in fp16 and 60% in fp8)."""
    gpu = get_gpu(gpu)
    tensor = 4 * d / gpu.rate("tensor", dtype)     # per (query, key) pair
    sfu = 1 / gpu.rate("sfu", "fp32")
    return tensor / (tensor + exposed * sfu)
