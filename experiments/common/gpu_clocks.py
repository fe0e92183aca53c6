"""The GPU's clocks read inside a Gluon kernel, for timelines of a kernel's programs (inline PTX: not
for the interpreter). ``dep`` is any int32: the asm needs an operand. (The v1 template's timeline
probes that used them, attention_timeline.py and hadamard_timeline.py: git show
bb6b420:scripts/device/attention_timeline.py.)"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def global_ns(dep):
    """The global timer (%globaltimer), in ns: comparable across SMs."""
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dep], dtype=gl.int64, is_pure=False,
                                     pack=1)


@gluon.jit
def sm_cycles(dep):
    """The SM's cycle counter (%clock64): over global_ns, the SM clock."""
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [dep], dtype=gl.int64, is_pure=False,
                                     pack=1)
