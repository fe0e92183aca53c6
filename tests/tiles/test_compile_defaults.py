"""tiles.compile.compile_kernel: arguments with a default may be left out (as the JIT takes them; the
linear-attention report's forward kernel has GL=None), a missing required one names itself."""
import pytest
import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

from tilecore.tiles.compile import compile_kernel

def _scaled_copy(X, Y, n, SCALE=None, BLOCK: tl.constexpr = 64):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n)
    if SCALE is not None:
        x = x * tl.load(SCALE)
    tl.store(Y + offs, x, mask=offs < n)

def test_defaults_fill_in_and_a_missing_argument_is_named():
    kernel = JITFunction(_scaled_copy)
    x = torch.empty(64, dtype=torch.float32)
    compiled = compile_kernel(kernel, {"X": x, "Y": x, "n": 64})
    assert "ld.global" in compiled.asm["ptx"] and "mul.f32" not in compiled.asm["ptx"]
    with pytest.raises(KeyError, match="'n'"):
        compile_kernel(kernel, {"X": x, "Y": x})
