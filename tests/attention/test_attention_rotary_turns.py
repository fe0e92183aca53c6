"""q and k turned by one launch (rotary.op.turn_pair, kernels.rotary_pair_kernel; attention's turned path with
configs.ROTARY_QK_ONE_LAUNCH): in the interpreter, bitwise the two apply_rotary launches' results (the same
math element by element: query i by row i + Nk - N, key j by row j), with grouped heads (different head
counts), N < Nk, partial rotary dims (the pass-through features copied), both layouts, the conjugate; and
attention(..., rotary=) on the turned path with the switch on: bitwise the same outputs and gradients as off."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import tilecore
from tilecore.ops.attention import configs, op_rotary
from tilecore.ops.rotary import launch
from tilecore.ops.rotary.op import turn, turn_pair


def tables(rows, pairs, dtype=torch.float32):
    angle = torch.rand(rows, pairs, dtype=torch.float64) * 2 * math.pi
    return angle.cos().to(dtype), angle.sin().to(dtype)


@pytest.mark.parametrize("pairs,interleaved,conjugate", [(16, False, False), (8, True, False), (8, False, True)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_one_launch_turns_q_and_k_as_two(pairs, interleaved, conjugate, dtype, monkeypatch):
    b, hq, hkv, n, nk, d = 2, 4, 2, 5, 9, 32
    q = torch.randn(b, hq, n, d, dtype=dtype)
    k = torch.randn(b, hkv, nk, d, dtype=dtype)
    cos, sin = tables(nk + 3, pairs, torch.bfloat16)
    x, y = q.transpose(1, 2), k.transpose(1, 2)  # (B, N, H, D) views, as attention passes them
    out_x, out_y = torch.full_like(x, float("nan")), torch.full_like(y, float("nan"))
    calls = []
    real = launch.launch_pair
    monkeypatch.setattr(launch, "launch_pair", lambda *a: (calls.append(1), real(*a)))
    turn_pair(x, y, cos, sin, shift_x=nk - n, out_x=out_x, out_y=out_y, interleaved=interleaved, conjugate=conjugate)
    want_x = turn(x, cos[nk - n:], sin[nk - n:], interleaved=interleaved, conjugate=conjugate)
    want_y = turn(y, cos, sin, interleaved=interleaved, conjugate=conjugate)
    assert calls == [1]  # one launch of the pair kernel (the interpreter's plan is the GPU's "tl")
    assert torch.equal(out_x, want_x) and torch.equal(out_y, want_y)


CODE = """
import json, re, torch
from tilecore.ops.rotary import kernels
from tilecore.ops.rotary.plan import tl_plan
from tilecore.tiles.compile import compile_kernel, resources
rows = []
for interleaved in (False, True):
    p = tl_plan(16, 4096, 32, 128, 64)
    t = torch.empty(64, dtype=torch.bfloat16)
    s = [4096 * 32 * 128, 128, 4096 * 128]
    args = dict(X=t, Y=t, COS=t, SIN=t, OX=t, OY=t, x_tokens=16 * 4096, seqlen_x=4096, seqlen_y=4096, heads_x=32,
                heads_y=8, shift_x=0, n_max=4096, stride_xb=s[0], stride_xn=s[1], stride_xh=s[2], stride_oxb=s[0],
                stride_oxn=s[1], stride_oxh=s[2], stride_yb=s[0], stride_yn=s[1], stride_yh=s[2], stride_oyb=s[0],
                stride_oyn=s[1], stride_oyh=s[2], stride_cos=64, stride_sin=64, R=64, BLOCK_R=p.block_r,
                BLOCK_H=p.block_h, PASS=0, BLOCK_PASS=p.block_pass, INTERLEAVED=interleaved, CONJUGATE=False)
    k = compile_kernel(kernels.rotary_pair_kernel, args, num_warps=p.num_warps)
    ptx = k.asm["ptx"]
    rows.append(dict(**vars(resources(k)), ld=len(re.findall(r"ld\\.global(?:\\.[a-z0-9]+)*\\.v4", ptx)),
                     st=len(re.findall(r"st\\.global(?:\\.[a-z0-9]+)*\\.v4", ptx)),
                     scalar_ld=len(re.findall(r"ld\\.global\\.b16", ptx))))
print(json.dumps(rows))
"""


def test_the_pair_kernel_compiles_to_16_byte_accesses():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled for sm_90a, not interpreted
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for row in json.loads(r.stdout):  # half-split, interleaved: x's rows by 16-byte vectors, as rotary_kernel's
        assert row["ld"] > 0 and row["st"] > 0 and row["scalar_ld"] == 0, row
        assert row["spill_stores"] == 0 and row["stack"] == 0, row


def test_attention_turned_path_with_one_launch(monkeypatch):
    b, hq, hkv, n, nk, d, pairs = 1, 2, 1, 12, 20, 32, 8
    q, k, v = (torch.randn(*s, dtype=torch.float16, requires_grad=True)
               for s in ((b, hq, n, d), (b, hkv, nk, d), (b, hkv, nk, d)))
    cos, sin = tables(nk, pairs)
    dout = torch.randn(b, hq, n, d, dtype=torch.float16)
    monkeypatch.setattr(op_rotary, "rotary_path", lambda *a: "turned")
    results = []
    for one in (False, True):
        monkeypatch.setattr(configs, "ROTARY_QK_ONE_LAUNCH", one)
        out = tilecore.attention(q, k, v, causal=True, rotary=(cos, sin), rotary_interleaved=True)
        results.append((out, *torch.autograd.grad(out, (q, k, v), dout)))
    for name, off, on in zip(("O", "dq", "dk", "dv"), *results):
        assert torch.equal(off, on), name
