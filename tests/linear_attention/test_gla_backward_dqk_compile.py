"""The chunk-parallel GLA backward's dqk kernel with its value loop (configs_gla_bwd.CHUNKED dqk_VB, session 31)
compiles for sm_90a on this GPU-less machine with no spill at the blocks experiments/linear_attention/gpu_gla_bwd.py
--s31 times: chunk 32, key blocks 64, the fallback in a launch of its own, value blocks of 32 with 8 warps under a
128-register cap (4 warps uncapped: 244 registers); chunk 64, key blocks 32 (248; with dg_fused 254). The
whole-columns kernel at chunk 32: 255 registers, 140 B spilled. Its math: test_gla_backward_dqk.py (interpreter)."""
import json

import pytest
from compiled_run import compiled_json

CODE = """
import json, sys, torch
from tilecore.ops.linear_attention import kernels_backward_gla_chunked as kc
from tilecore.ops.linear_attention.plan import IDENTITY, tl_plan
from tilecore.tiles.compile import compile_kernel, resources
blocks = json.loads(sys.argv[1])
q = torch.empty(1, 256, 2, 128, dtype=torch.bfloat16)
g = torch.empty(1, 256, 2, 128)
s = torch.empty(1, 2, 128, 128)
steps = []
kc.backward(tl_plan(q, q, g, IDENTITY, 64, diag=5), q, q, q, q, g, s, s, s, 0.1, steps=steps, **blocks)
out = {}
for name, kernel, _, args, kw in steps:
    if name.startswith(("dqk", "dv")):
        kw = dict(kw)
        warps, stages = kw.pop("num_warps"), kw.pop("num_stages")
        extra = {"maxnreg": kw.pop("maxnreg")} if "maxnreg" in kw else {}
        c = compile_kernel(kernel, dict(zip(kernel.arg_names, args), **kw), num_warps=warps, num_stages=stages, **extra)
        out[name] = dict(vars(resources(c)), mma="mma.sync" in c.asm["ptx"] or "wgmma" in c.asm["ptx"])
print(json.dumps(out))
"""


S31 = dict(dqk_stages=None, dg_local=False, dqk_lean=False, dqk_dotscan=False, dqk_dyn=False)  # session 31's forms


@pytest.mark.parametrize("blocks, registers, spilled", [
    (dict(BT=32, BKB=64, dqk_VB=32, dqk_warps=8, dqk_maxnreg=128, dg_fused=False, wide_group=None, **S31), 128, 0),
    (dict(BT=32, BKB=64, dqk_VB=32, dg_fused=False, wide_group=None, **S31), 255, 0),
    # chunk 64, key blocks 32 (right on the H100 with the loop, session 31 run 2; the whole-columns 4-warp build of
    # these blocks is miscompiled there) and with dg from the dqk kernel (dg_fused) and grouped fallback flags: the
    # shipped CHUNKED of session 31
    (dict(BT=64, BKB=32, dqk_VB=32, dg_fused=False, wide_group=None, **S31), 255, 0),
    (dict(BT=64, BKB=32, dqk_VB=32, dg_fused=True, wide_group=8, **S31), 255, 0),
    # session 32's forms (3 stages, dg_local, dqk_lean, dqk_dotscan) at VB 64: 40 B spilled on sm_90a (VB 32: 76 B), 1.13x
    # faster than session 31's on the H100 all the same (call 3); the wgmma not serialized (G's forward sum as a dot
    # serialized them: it stays a scan)
    (dict(dqk_form=0, dqk_dyn=False), 255, 80),
    # configs' CHUNKED's common launch without the flat one (session 33: dqk_form 3, one reduction and no span branch;
    # session 34: dqk_dyn): 0 B
    ({}, 255, 0),
])
def test_value_loop_dqk_kernel_compiles_without_spills(blocks, registers, spilled):
    r = compiled_json(CODE, json.dumps(dict(wide_apart=True, dqk_flat=0, **blocks)), timeout=600)
    common = r["dqk0w"]  # the factored launch (the fallback's own, dqk0ww, runs only on flagged blocks, uncapped)
    assert common["mma"] and not common["wgmma_serialized"], common
    assert common["spill_stores"] <= spilled and common["registers"] <= registers, common
    assert {"dqk0w", "dqk0ww"} <= set(r), r


@pytest.mark.parametrize("blocks, spilled", [(dict(dv_form=0), 4), ({}, 0)])
def test_dv_kernel_compiles(blocks, spilled):
    """The dv kernel's common launch (dvw) on sm_90a: dv_form 0 (session 32's) 4 B spilled, configs' CHUNKED (dv_form 5
    since session 33: one reduction a key block, two exp tiles, no branch on the flags; 21 since session 39: the scores
    made transposed; 53 since session 42: each key block's dS_c rows loaded with its q, k, g) none; wgmma, not
    serialized."""
    dv = compiled_json(CODE, json.dumps(dict(wide_apart=True, **blocks)), timeout=600)["dvw"]
    assert dv["mma"] and not dv["wgmma_serialized"], dv
    assert dv["spill_stores"] <= spilled and dv["registers"] <= 255, dv


LOOP_CODE = """
import hashlib, json, re, sys, torch
from tilecore.ops.linear_attention import kernels_backward_gla_chunked as kc
from tilecore.ops.linear_attention.plan import IDENTITY, tl_plan
from tilecore.tiles.compile import compile_kernel, resources
D, blocks = int(sys.argv[1]), json.loads(sys.argv[2])
q = torch.empty(1, 256, 2, D, dtype=torch.bfloat16)
g = torch.empty(1, 256, 2, D)
s = torch.empty(1, 2, D, D)
steps = []
kc.backward(tl_plan(q, q, g, IDENTITY, 64, diag=5), q, q, q, q, g, s, s, s, 0.1, steps=steps, **blocks)
name, kernel, _, args, kw = next(st for st in steps if st[0] == "dqk0w")
kw = dict(kw)
warps, stages = kw.pop("num_warps"), kw.pop("num_stages")
c = compile_kernel(kernel, dict(zip(kernel.arg_names, args), **kw), num_warps=warps, num_stages=stages)
code, debug = [], False
for line in c.asm["ptx"].splitlines():  # the PTX without debug information (line numbers move with any edit)
    t = line.strip()
    debug = debug or (t.startswith(".section") and ".debug" in t)
    if debug:
        debug = t != "}"
        continue
    if t.startswith((".loc", ".file")) or re.fullmatch(r"[$]L__tmp[0-9]+:", t):
        continue
    code.append(line.split("//")[0].rstrip())
ttgir = c.asm["ttgir"]
copies = ttgir.count("async_copy_global_to_local")
print(json.dumps(dict(vars(resources(c)), loop="scf.for" in ttgir, async_copies=copies,
                      ptx=hashlib.sha1("\\n".join(x for x in code if x).encode()).hexdigest())))
"""


def _dqk_loop_facts(D: int, blocks: dict) -> dict:
    return compiled_json(LOOP_CODE, str(D), json.dumps(blocks), timeout=600)


def test_one_value_block_is_folded_and_dqk_dyn_keeps_the_loop():
    """Decision 84's root cause on sm_90a (session 34): with session 33's dqk_VB 64 at d 64 the value loop has one
    block, and Triton folds it into straight-line code (no scf.for, no cp.async: plain loads stored to shared memory,
    synchronous wgmma; 12 B spilled) - the build the H100 got wrong (dq / dk 6321x / 103432x the floor, or an illegal
    address). dqk_dyn (one block, the bound Dv at run time) keeps a pipelined loop with cp.async and no spill; with dqk_dyn the d 64 kernel's PTX is the d 128 kernel's, byte for byte (the build checked
    on the H100 since session 33)."""
    s33 = dict(dqk_VB=64, dqk_form=3, dv_form=5, dqk_dyn=False, dqk_flat=0)
    folded = _dqk_loop_facts(64, s33)
    assert not folded["loop"] and folded["async_copies"] == 0, folded
    dyn = _dqk_loop_facts(64, dict(s33, dqk_dyn=True))
    assert dyn["loop"] and dyn["async_copies"] > 0 and dyn["spill_stores"] == 0 and not dyn["wgmma_serialized"], dyn
    assert dyn["ptx"] == _dqk_loop_facts(128, dict(dqk_dyn=True, dqk_flat=0))["ptx"]



FLAT_CODE = """
import json, sys, torch
from tilecore import dispatch
from tilecore.ops.linear_attention import kernels_backward_gla_chunked as kc
from tilecore.ops.linear_attention.plan import IDENTITY, tl_plan
from tilecore.tiles.compile import compile_kernel, resources
D = int(sys.argv[1])
meta = torch.device("meta")  # described as an H100 (the flat launch is Hopper's)
q = torch.empty(1, 256, 2, D, dtype=torch.bfloat16, device=meta)
g = torch.empty(1, 256, 2, D, device=meta)
s = torch.empty(1, 2, D, D, device=meta)
steps = []
with dispatch.pretend(dispatch.TARGETS["sm_90a"]):
    kc.backward(tl_plan(q, q, g, IDENTITY, 64, diag=5), q, q, q, q, g, s, s, s, 0.1, steps=steps,
                dqk_gluon=0)  # (the flat kernel, where the Gluon one would run at d 128)
name, kernel, _, args, kw = next(st for st in steps if st[0] == "dqk0w")
kw = dict(kw)
warps, stages = kw.pop("num_warps"), kw.pop("num_stages")
c = compile_kernel(kernel, dict(zip(kernel.arg_names, args), **kw), num_warps=warps, num_stages=stages)
ttgir = c.asm["ttgir"]
print(json.dumps(dict(vars(resources(c)), kernel=kernel.fn.__name__, stages=stages, cpp=kw["CPP"],
                      tma_copies=ttgir.count("async_tma_copy_global_to_local"))))
"""


@pytest.mark.parametrize("D, cpp, stages, spilled", [(128, 2, 2, 200), (64, 3, 3, 150)])
def test_flat_dqk_kernel_compiles(D, cpp, stages, spilled):
    """configs' flat dqk launch (CHUNKED_FLAT_DIMS: gla_dqk_flat_kernel, chunks a program, loads by TMA) on sm_90a at
    d 128 (2 chunks, 2 stages) and d 64 (3 chunks, 3 stages: a chunk's copies in flight): TMA copies, wgmma not
    serialized, 255 registers and 144-188 B spilled (the pointer-load form of the same loop: 250-450 B, slower on the
    H100), <= 113 KB of shared memory (2 programs an SM)."""
    r = compiled_json(FLAT_CODE, str(D), timeout=600)
    assert r["kernel"] == "gla_dqk_flat_kernel" and (r["cpp"], r["stages"]) == (cpp, stages), r
    assert r["tma_copies"] > 0 and not r["wgmma_serialized"], r
    assert r["spill_stores"] <= spilled and r["registers"] <= 255 and r["shared"] <= 113 * 1024, r
