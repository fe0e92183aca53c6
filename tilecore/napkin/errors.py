"""Errors the napkin raises on bad input. Each names the problem and what is accepted."""
from __future__ import annotations


class NapkinKeyError(KeyError):
    """KeyError whose str() is the message itself (KeyError would print it quoted)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownAxisError(NapkinKeyError):
    pass


class UnknownGPUError(NapkinKeyError):
    pass


class UnknownModelError(NapkinKeyError):
    pass


class UnsupportedDtypeError(ValueError):
    pass


class ShapeMismatchError(ValueError):
    pass


class CapacityError(ValueError):
    """No legal tiling fits: even the smallest tile overflows a memory level."""


class CompileError(ValueError):
    """A diagram or map outside what napkin.compile emits (or a map with no known semantics); the
    message says which and why."""
