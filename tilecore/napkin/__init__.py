"""The napkin: model diagrams, GPU memory levels and an IO performance model. Pure Python.

    from tilecore.napkin import models, derive
    r = derive(models.attention(seq=4096, d=128), "h100")
    print(r.summary())

Modules: diagram (arrays, ops, weave, compose), models (built-in diagrams), hardware (levels, compute
units, GPU presets, calibration), engine (relabel a diagram with levels, cost it, search), backward (the attention backward's own time
model: its step chain per implementation), closed_forms
(the paper's formulas), render (pseudocode, cost table, pictures, explain), validate (predicted vs
measured), rewrite (the planner's rewrites: online softmax, epilogue fusion, split-K / flash-decoding),
compile (a diagram's fused plan as Triton source; tilecore.ops.napkin_compiled runs it), rotary
(apply_rotary's pass and rotary turned inside the attention forward).
"""
from . import backward, closed_forms, models, rewrite
from .backward import attention_backward_time
from .compile import CompileError, Program
from .compile import compile  # noqa: A004 (napkin.compile(diagram), as the issue names it)
from .engine import (NONE, Derivation, Part, derive, gemm_perf_model, group, rank_attention_configs,
                     rank_gemm_configs, relabel, stream)
from .diagram import Array, Combine, Diagram, Op, compose
from .errors import (CapacityError, ShapeMismatchError, UnknownAxisError, UnknownGPUError,
                     UnknownModelError, UnsupportedDtypeError)
from .hardware import A100, GPUS, H100, H200, GPU, ComputeUnit, Level, abstract_level, from_constants_json, get_gpu

__all__ = [
    "A100", "GPU", "GPUS", "H100", "H200", "NONE", "Array", "attention_backward_time", "backward", "CapacityError", "Combine", "CompileError",
    "ComputeUnit", "Derivation", "Program", "compile", "rewrite",
    "Diagram", "Level", "Op", "Part", "ShapeMismatchError", "UnknownAxisError", "UnknownGPUError",
    "UnknownModelError", "UnsupportedDtypeError", "abstract_level", "closed_forms", "compose", "derive",
    "get_gpu", "group", "models", "relabel", "stream", "gemm_perf_model", "rank_attention_configs",
    "rank_gemm_configs", "from_constants_json",
]
