"""The fixed Gluon backward's WALK_DOWN (attention_backward.gluon_backward, off: no config routes it; the varlen
kernel's walk_down, session 34): its walk mirrored in Python (AttentionBackward.setup / step_rows with one q head
a kv head: every query block a key tile sees, once, from the last down starting key_block % s blocks up) and the
sm_90a compile of the fused-dQ causal D128 kernel with it (no serialized wgmma, spills within the shipped walk's).
The kernel runs only on a GPU (experiments/attention/gpu_varlen_walk.py --fixed-walk)."""
import json
import os
import subprocess
import sys

import pytest


def cdiv(a, b):
    return -(-a // b)


def blocks(key_block, n, nk, causal, window, walk_down, block_m=64, tile_n=128):
    """AttentionBackward.setup and step_rows (GROUP 1) in Python: the query blocks of one key tile, in walk order."""
    start_n = key_block * tile_n
    first_mb = max(start_n - (nk - n), 0) // block_m if causal else 0
    if window:
        left, right = window
        first_mb = max(start_n - (nk - n) - right, 0) // block_m
        last_key = min(start_n + tile_n, nk) - 1
        last_row = min(n - 1, last_key - (nk - n) + left)
        per_head = max(cdiv(max(last_row + 1, 0), block_m) - first_mb, 0)
    else:
        per_head = max(cdiv(n, block_m) - first_mb, 0)
    shift = ((key_block % walk_down) if walk_down else key_block) % max(per_head, 1)
    out = []
    for step in range(per_head):
        walked = step + shift
        block = first_mb + (walked - per_head if walked >= per_head else walked)
        if walk_down:
            block = 2 * first_mb + per_head - 1 - block
        out.append(block)
    return out, first_mb, per_head


@pytest.mark.parametrize("n, nk, causal, window", [(1000, 1000, True, None), (700, 1100, True, None),
                                                    (1100, 700, False, None), (1000, 1000, False, (300, 0)),
                                                    (900, 900, False, (100, 37))])
@pytest.mark.parametrize("walk_down", [1, 2, 4])
def test_walk_down_visits_every_block_of_the_staggered_walk_once_from_the_last(n, nk, causal, window, walk_down):
    for key_block in range(cdiv(nk, 128)):
        mine, first_mb, per_head = blocks(key_block, n, nk, causal, window, walk_down)
        shipped, _, _ = blocks(key_block, n, nk, causal, window, 0)
        assert sorted(mine) == sorted(shipped) == list(range(first_mb, first_mb + per_head))
        if per_head:
            shift = key_block % walk_down % per_head
            last = first_mb + per_head - 1
            # from shift blocks below the last down to the first, then the last down to where it started
            assert mine == list(range(last - shift, first_mb - 1, -1)) + list(range(last, last - shift, -1))


COMPILE = """
import json, torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from tilecore.ops.attention_backward.gluon_backward import attention_bwd_kernel
from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources

def desc(t, block):
    dtype = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float32
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, gl.NVMMASharedLayout.get_default_for(block, dtype))
rows = {}
t = torch.empty(2, 2, 256, 128, dtype=torch.bfloat16)
stats = torch.empty(4, 2, 256)
stats_desc = TensorDescriptor(stats, list(stats.shape), list(stats.stride()), [1, 2, 64],
                              gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3))
dq_sum = torch.empty(2, 2, 256, 128)
for walk in (0, 1):
    args = dict(q_desc=desc(t, [1, 1, 64, 128]), k_desc=desc(t, [1, 1, 128, 128]), v_desc=desc(t, [1, 1, 128, 128]),
                do_desc=desc(t, [1, 1, 64, 128]), dk_desc=desc(t, [1, 1, 64, 128]), dv_desc=desc(t, [1, 1, 64, 128]),
                stats_desc=stats_desc, dq_desc=desc(dq_sum, [1, 1, 64, 64]), H=16, N=4096, Nk=4096, GROUP=1,
                scale=0.1, scale_log2e=0.1, num_bhk=256, head_group=8, schedule=torch.empty(64, dtype=torch.int32),
                left=0, right=0, tanh_scale=0.0, CAUSAL=True, STAGES=2, DQ=1, KV_REGS=False, WINDOW=False,
                SOFTCAP=0, WALK_DOWN=walk)
    if "tile_counter" in attention_bwd_kernel.arg_names:
        args["tile_counter"] = None
    compiled = compile_kernel(attention_bwd_kernel, args, num_warps=4)
    rows[walk] = dict(vars(resources(compiled)), **has_hopper_instructions(compiled.asm["ptx"]))
print(json.dumps(rows))
"""


def test_walk_down_compiles_as_lean_as_the_staggered_walk():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    for walk, row in rows.items():
        assert row["wgmma"] and row["tma"] and not row["wgmma_serialized"] and row["shared"] <= 227 * 1024, row
    assert rows["1"]["spill_stores"] <= rows["0"]["spill_stores"], rows  # sm_90a: 160 against 192 bytes
