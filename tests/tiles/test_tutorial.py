"""docs/gemm_tutorial.md's code blocks, joined, are a module whose kernel compiles for sm_90a with
wgmma and TMA in its PTX (compile-only: Gluon does not run in the interpreter)."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = r'''
import sys, torch
sys.path.insert(0, sys.argv[1])
import tutorial_gemm_module as t
from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources
x = torch.empty(512, 512, dtype=torch.bfloat16)
a_desc, b_desc, c_desc = t.descriptors(x, x, x)
k = compile_kernel(t.tutorial_gemm, dict(a_desc=a_desc, b_desc=b_desc, c_desc=c_desc, M=512, N=512, K=512,
                                         GROUP_M=8, STAGES=3), num_warps=8)
found = has_hopper_instructions(k.asm["ptx"])
r = resources(k)
assert found["wgmma"] and found["tma"], found
assert r.spill_stores == 0 and r.shared <= 227 * 1024, r
print("ok", r)
'''


def test_tutorial_code_compiles_for_hopper(tmp_path):
    text = (ROOT / "docs" / "gemm_tutorial.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    code = "\n\n".join(blocks)
    assert 40 <= len([line for line in code.splitlines() if line.strip()]) <= 130
    (tmp_path / "tutorial_gemm_module.py").write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", CHECK, str(tmp_path)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("ok")
