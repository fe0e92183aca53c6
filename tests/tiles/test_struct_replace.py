"""tiles.gluon's ``struct.replace`` (a copy with some fields replaced) and ``@stage_struct`` (a struct of
rings whose ``index(s)`` is written for it), compiled for sm_90a on this GPU-less machine: a toy
kernel uses both and compiles, and replacing a field the struct lacks fails naming its fields."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

COMPILE = r'''
import sys
import torch
from triton.experimental import gluon
from tilecore.tiles.compile import compile_kernel
from tilecore.tiles.gluon import stage_struct, struct
from tilecore.tiles.gluon.compat import gl


@stage_struct
class Pair:
    a: object
    b: object


@struct
class Running:
    x: object
    n: object
    K: gl.constexpr


@gluon.jit
def kernel(out_ptr, BAD: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    smem: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    rings = Pair(gl.allocate_shared_memory(gl.float32, [2, 128], smem),
                 gl.allocate_shared_memory(gl.float32, [2, 128], smem))
    one = rings.index(1)  # each ring's buffer 1
    st = Running(gl.zeros([128], gl.float32, layout), gl.program_id(0), 3)
    st = st.replace(x=st.x + 2.0, n=st.n + 1)
    if BAD:
        st = st.replace(y=st.x)
    one.a.store(st.x)
    one.b.store(st.x * st.K)
    gl.store(out_ptr + gl.arange(0, 128, layout), one.a.load(layout) + one.b.load(layout) + st.n)


out = torch.empty(128)
ptx = compile_kernel(kernel, dict(out_ptr=out, BAD=False), num_warps=4).asm["ptx"]
print("compiled", "st.global" in ptx)
try:
    compile_kernel(kernel, dict(out_ptr=out, BAD=True), num_warps=4)
    print("bad compiled")
except Exception as e:
    while e.__cause__ is not None:
        e = e.__cause__
    print("bad", " ".join(str(e).split()))
'''


def test_replace_and_stage_index_compile_and_an_unknown_field_is_named(tmp_path):
    script = tmp_path / "toy_struct_kernel.py"  # jit functions must come from a file
    script.write_text(COMPILE)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "compiled True", lines
    assert lines[1].startswith("bad ") and "Running has no field y (fields: x, n, K)" in lines[1], lines
