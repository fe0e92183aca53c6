"""FP8 (e4m3) attention forward (FlashAttention-3's FP8 path) and its convenience path with Hadamard
incoherent processing.

* ``op``: ``attention_fp8`` (e4m3 q, k, v with descales), checks, the custom op;
* ``quantize``: ``quantize_fp8`` (per head / block / token; V in the Hopper kernel's layout), ``quantize_v_permuted``,
  ``rotate_quantize`` (one kernel: rotate and quantize q or k) and ``attention_fp8_rotated`` (bf16/fp16 in: rotate q
  and k, quantize, attend);
* ``launch``: which kernel serves a call, and its launch; ``configs``: the tables;
* ``kernels_tl``: the portable Triton kernel (the twin of the math); ``gluon_fp8``: Hopper's kernel on
  the tiles' Gluon pipeline;
* ``reference``: float64 exact attention, and the float32 emulation of the kernels' math (the CPU path).
"""
from tilecore.ops.attention_fp8.op import attention_fp8
from tilecore.ops.attention_fp8.quantize import attention_fp8_rotated, quantize_fp8, rotate_quantize
from tilecore.ops.attention_fp8.reference import attention_fp8_emulated, attention_fp8_exact

__all__ = ["attention_fp8", "attention_fp8_rotated", "quantize_fp8", "rotate_quantize", "attention_fp8_emulated",
           "attention_fp8_exact"]
