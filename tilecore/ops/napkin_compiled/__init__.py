"""Diagrams compiled into Triton kernels (issue 36, part 5): the execution side of tilecore.napkin.compile.

* ``run``: ``compile_diagram(diagram)`` -> a callable (tensors by input name -> outputs by name); the
  emitted source written to a cache file and imported (Triton's JIT reads a function's source file);
* ``evaluate``: a diagram's own float64 evaluation with torch's CPU ops (the reference compiled
  kernels are checked against).
"""
from tilecore.ops.napkin_compiled.evaluate import evaluate
from tilecore.ops.napkin_compiled.run import CompiledDiagram, compile_diagram

__all__ = ["CompiledDiagram", "compile_diagram", "evaluate"]
