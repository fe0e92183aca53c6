"""The Gluon backward's rotary dK epilogue (gluon_backward.RotaryBackward.finish; configs.ROTARY_DK_IN_KERNEL):

* its math, on the CPU: a tl twin of split_pairs, pair_angles, turn_back and join_pairs (the same reshape / permute / split / join steps, which tl and
  Gluon define alike) run by the interpreter on float32 tiles, against the float64 inverse rotation (rotary's
  reference turned by the opposite angle): half-split and interleaved pairs, full and partial rotary dims,
  rows past the keys (angle 0), tables of each float dtype;
* the turned path's plumbing (op_rotary.turned_backward_impl) with the switch on: a Gluon plan and a stand-in
  for the Gluon launch (the tl kernels on the turned q and k, then the twin on dK, where the rotary tables were
  passed), so dK is not turned again by the pass and the public gradients match float64;
* which tables the epilogue takes (plan.rotary_dk_in_kernel);
* the kernel itself, compiled for sm_90a (no GPU): the rotary variants keep the plain kernel's wgmma
  (not serialized), add the tables as their only parameters, and stay within the plain kernel's spill
  allowance and Hopper's shared memory. (The plain kernel's PTX with the epilogue's code present is
  the PTX before it: experiments/tiles/ptx_compare.py over port_resources.py's 10 backward variants,
  notes/rotary's decision log.)"""
import json
import math
import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

import tilecore
from tilecore import accuracy
from tilecore.ops.attention import configs, launch, op_rotary, plan
from tilecore.ops.rotary.reference import rotary_reference

F16 = torch.float16


@triton.jit
def turn_back_twin(X, COS, SIN, Y, first_row, rows, stride_cos, ROWS: tl.constexpr, D: tl.constexpr,
                   PAIRS: tl.constexpr, INTERLEAVED: tl.constexpr):
    """gluon_backward's epilogue steps (split_pairs, pair_angles, turn_back, join_pairs) in tl, on the [ROWS, D] float32 tile at X (row-major), into Y."""
    HALF: tl.constexpr = D // 2
    x = tl.load(X + tl.arange(0, ROWS)[:, None] * D + tl.arange(0, D)[None, :])
    if INTERLEAVED:
        a, b = tl.split(tl.reshape(x, [ROWS, HALF, 2]))
    else:
        G: tl.constexpr = D // (2 * PAIRS)
        a, b = tl.split(tl.permute(tl.reshape(x, [ROWS, G, 2, PAIRS]), (0, 1, 3, 2)))
        a = tl.reshape(a, [ROWS, HALF])
        b = tl.reshape(b, [ROWS, HALF])
    r = first_row + tl.arange(0, ROWS)
    j = tl.arange(0, HALF)
    offsets = (r * stride_cos)[:, None] + j[None, :]
    mask = (r < rows)[:, None] & (j < PAIRS)[None, :]
    c = tl.load(COS + offsets, mask=mask, other=1.0).to(tl.float32)
    s = tl.load(SIN + offsets, mask=mask, other=0.0).to(tl.float32)
    a_back = a * c + b * s
    b_back = b * c - a * s
    if INTERLEAVED:
        y = tl.reshape(tl.join(a_back, b_back), [ROWS, D])
    else:
        y = tl.join(tl.reshape(a_back, [ROWS, G, PAIRS]), tl.reshape(b_back, [ROWS, G, PAIRS]))
        y = tl.reshape(tl.permute(y, (0, 1, 3, 2)), [ROWS, D])
    tl.store(Y + tl.arange(0, ROWS)[:, None] * D + tl.arange(0, D)[None, :], y)


def twin(x, cos, sin, first_row, rows, interleaved):
    """turn_back_twin on a float32 [ROWS, D] tile: the tile turned back."""
    y = torch.full_like(x, float("nan"))
    turn_back_twin[(1,)](x, cos, sin, y, first_row, rows, cos.stride(0), ROWS=x.shape[0], D=x.shape[1],
                         PAIRS=cos.shape[1], INTERLEAVED=interleaved)
    return y


def tables(rows, pairs, dtype=torch.float32):
    angle = torch.rand(rows, pairs, dtype=torch.float64) * 2 * math.pi
    return angle.cos().to(dtype), angle.sin().to(dtype)


def inverse_turn64(x, cos, sin, first_row, rows, interleaved):
    """The float64 reference: rotary's reference turned by the opposite angle at rows first_row.. (angle 0 from
    ``rows`` on)."""
    n = x.shape[0]
    c = torch.ones(n, cos.shape[1], dtype=torch.float64)
    s = torch.zeros(n, cos.shape[1], dtype=torch.float64)
    live = torch.arange(first_row, first_row + n) < rows
    c[live] = cos[first_row:first_row + int(live.sum())].double()
    s[live] = sin[first_row:first_row + int(live.sum())].double()
    # rotary_reference's x is (batch, seqlen, heads, head_dim): the tile's rows are its positions
    return rotary_reference(x.double()[None, :, None, :], c, s, interleaved=interleaved, conjugate=True)[0, :, 0, :]


@pytest.mark.parametrize("d,pairs,interleaved", [(128, 64, False), (128, 64, True), (64, 32, False), (64, 32, True),
                                                 (128, 16, False), (128, 8, False), (64, 1, False), (128, 24, True)])
@pytest.mark.parametrize("table_dtype", [torch.float32, torch.bfloat16])
def test_the_epilogue_math_turns_back(d, pairs, interleaved, table_dtype):
    rows_in_tile, first_row, keys = 64, 40, 77  # rows 40..103 of 77 keys: the last 27 past the keys
    cos, sin = tables(keys, pairs, table_dtype)
    x = torch.randn(rows_in_tile, d, dtype=torch.float32)
    got = twin(x, cos, sin, first_row, keys, interleaved)
    ref = inverse_turn64(x, cos, sin, first_row, keys, interleaved)
    assert torch.isfinite(got).all()
    assert accuracy.rel_rms(got, ref) <= 3e-7, accuracy.rel_rms(got, ref)  # float32 math: a few ulps
    assert torch.equal(got[keys - first_row:], x[keys - first_row:])  # past the keys: angle 0
    if 2 * pairs < d:  # features past rotary_dim pass through
        assert torch.equal(got[:, 2 * pairs:], x[:, 2 * pairs:])


def test_the_epilogue_takes_the_tables_gl_split_can():
    assert all(plan.rotary_dk_in_kernel(p, True) for p in (1, 2, 3, 4, 24, 64))
    assert all(plan.rotary_dk_in_kernel(p, False) for p in (1, 8, 16, 32, 64))
    assert not any(plan.rotary_dk_in_kernel(p, False) for p in (2, 4, 12, 24, 48))


class FakeGluonPlan:
    path, dq, operand_dtype, launch_key = "gluon", None, None, None


class FakeGluonPlanWithDQKernel(FakeGluonPlan):
    dq = "a dQ kernel's plan"


@pytest.mark.parametrize("dq_kernel,interleaved", [(False, False), (True, True)],
                         ids=["dq-summed-half", "dq-kernel-interleaved"])
def test_the_turned_backward_with_dk_in_the_kernel(dq_kernel, interleaved, monkeypatch):
    """ROTARY_DK_IN_KERNEL on: the Gluon launch gets the tables (contiguous) and writes dK turned back, no pass
    turns it again; the public gradients against float64; dQ added by the kernel into a float32 sum, or by a dQ
    kernel of its own (launch_backward_gluon). The Gluon kernel is not interpreted: a stand-in runs the tl
    backward on the turned q and k and the epilogue's twin on dK (float32)."""
    b, hq, hkv, n, nk, d, pairs = 1, 2, 1, 16, 32, 32, 8  # nk: the twin's tile, a power of two; rotary_dim 16 of 32
    shapes = ((b, hq, n, d), (b, hkv, nk, d), (b, hkv, nk, d))
    q, k, v = (torch.randn(*s, dtype=F16, requires_grad=True) for s in shapes)
    cos, sin = tables(nk + 2, 2 * pairs)
    cos, sin = cos[:, ::2], sin[:, ::2]  # tables with a row stride of their own: the launch makes them contiguous
    seen = []

    def gluon_kernel(plan_, dout, qr, kr, v_, stats, dq_sum, dk, dv, causal, scale, window, softcap, rotary=None):
        tl_plan = plan.plan_backward(dout, qr, kr, v_, causal, scale, path="tl")
        out, lse = launch.outputs(plan.plan_forward(qr, kr, v_, causal, scale, path="tl"), qr, kr, v_, causal, scale)
        dq_, dk_, dv_ = launch.gradients(tl_plan, dout, qr, kr, v_, out, lse, None, causal, scale)
        dq_sum += dq_.float()
        dv.copy_(dv_)
        seen.append(rotary)
        if rotary is None:
            dk.copy_(dk_)
            return
        tcos, tsin, inter = rotary
        assert tcos.is_contiguous() and tsin.is_contiguous() and inter == interleaved
        for bb in range(dk.shape[0]):
            for h in range(dk.shape[1]):
                dk[bb, h] = twin(dk_[bb, h].float().contiguous(), tcos, tsin, 0, nk, inter).to(dk.dtype)

    def gluon_backward(plan_, dout, qr, kr, v_, out, lse, dlse, dq, dk, dv, causal, scale, window, softcap,
                       rotary=None):
        dq_sum = torch.zeros(qr.shape, dtype=torch.float32)
        gluon_kernel(plan_, dout, qr, kr, v_, None, dq_sum, dk, dv, causal, scale, window, softcap, rotary)
        dq.copy_(dq_sum)

    monkeypatch.setattr(op_rotary, "rotary_path", lambda *a: "turned")
    fake = FakeGluonPlanWithDQKernel() if dq_kernel else FakeGluonPlan()
    monkeypatch.setattr(op_rotary, "plan_backward", lambda *a, **kw: fake)
    monkeypatch.setattr(launch, "launch_backward_gluon_kernel", gluon_kernel)
    monkeypatch.setattr(launch, "launch_backward_gluon", gluon_backward)
    monkeypatch.setattr(configs, "ROTARY_DK_IN_KERNEL", True)
    out = tilecore.attention(q, k, v, causal=True, rotary=(cos, sin), rotary_interleaved=interleaved)
    dout = torch.randn(out.shape, dtype=F16)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert seen and seen[0] is not None and seen[0][0].shape == (nk + 2, pairs)
    from tilecore.ops.attention.reference import rotary_attention_reference

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o64, _ = rotary_attention_reference(q64, k64, v64, cos, sin, interleaved=interleaved, causal=True)
    ref = torch.autograd.grad(o64, (q64, k64, v64), dout.double())
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
        assert torch.isfinite(g).all(), name
        assert accuracy.error_over_floor(g, r) <= 3.0, (name, accuracy.error_over_floor(g, r))
    if dq_kernel:
        return
    # the switch off: the same stand-in without tables, dK turned back by the pass: the same gradients' accuracy
    monkeypatch.setattr(configs, "ROTARY_DK_IN_KERNEL", False)
    seen.clear()
    out = tilecore.attention(q, k, v, causal=True, rotary=(cos, sin), rotary_interleaved=interleaved)
    grads_off = torch.autograd.grad(out, (q, k, v), dout)
    assert seen == [None]
    assert accuracy.error_over_floor(grads_off[1], ref[1]) <= 3.0


CODE = """
import functools, json, re, sys
import torch
from tilecore.bench.reports import attention as report
from tilecore.ops.attention import configs, launch
from tilecore.ops.attention_backward.gluon_backward import attention_bwd_kernel
from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources
from tilecore.tiles.launch import gluon_descriptor

def compiled(d, causal, pairs, interleaved):
    cfg = dict(configs.GLUON_BACKWARD[d, causal])
    x = torch.empty(2, 2, 256, d, dtype=torch.bfloat16)
    desc = functools.partial(report._descriptor, x)
    bm, bn = cfg["block_m"], cfg["block_n"]
    stats = torch.empty(4, 2, 256, dtype=torch.float32)
    dq_sum = torch.empty(2, 2, 256, d, dtype=torch.float32)
    args = dict(q_desc=desc(bm), k_desc=desc(2 * bn), v_desc=desc(2 * bn), do_desc=desc(bm), dk_desc=desc(bn),
                dv_desc=desc(bn), stats_desc=launch.row_stats_operand(stats, bm).descriptor(),
                dq_desc=gluon_descriptor(dq_sum, launch.dq_box(bm, d, cfg["dq_from"])), H=16, N=4096, Nk=4096,
                GROUP=1, scale=0.1, scale_log2e=0.1, num_bhk=256, head_group=8, schedule=report._schedule(causal, cfg),
                left=0, right=0, tanh_scale=0.0, CAUSAL=causal, STAGES=cfg["stages"],
                DQ=configs.DQ_MODES[cfg["dq_from"]], KV_REGS=cfg.get("kv_regs", False), WINDOW=False, SOFTCAP=0)
    table = torch.empty(4096, pairs, dtype=torch.bfloat16)
    args.update(cos=table, sin=table, stride_cos=pairs, ROTARY_PAIRS=pairs, ROTARY_INTERLEAVED=interleaved)
    k = compile_kernel(attention_bwd_kernel, args, num_warps=4)
    ptx = k.asm["ptx"]
    return dict(d=d, causal=causal, pairs=pairs, interleaved=interleaved, dq_from=cfg["dq_from"],
                **vars(resources(k)), **has_hopper_instructions(ptx), params=len(re.findall(r"\\.param \\.", ptx)),
                wgmma_count=len(re.findall(r"wgmma\\.mma_async", ptx)), tma_reduce="cp.reduce.async.bulk.tensor" in ptx)

print(json.dumps([compiled(128, False, 64, False), compiled(64, True, 32, True)]))
"""


def test_the_rotary_backward_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout)
    # the plain kernels' figures (port_resources.py, this tree and the one before the epilogue): wgmma
    # instructions 80 (D128 lagged) and 48 (D64 warpgroup), 16 + 3 .param entries with a schedule table
    wgmma = {128: 80, 64: 48}
    for row in rows:
        assert row["wgmma"] and row["tma"] and row["mbarrier"] and row["tma_reduce"], row
        assert not row["wgmma_serialized"], row
        assert row["wgmma_count"] == wgmma[row["d"]], row  # the epilogue adds no matrix product
        assert row["shared"] <= 227 * 1024, row
        # the plain kernel's allowance (test_attention_hopper_compile's SPILL_BYTES_ALLOWED: 256 / 64 B); the
        # epilogue measured D128 lagged 44 -> 96 B (the tables in flight while dV is stored), D64 warpgroup causal
        # interleaved 52 -> 52 (loads 56 -> 60)
        allowed = 256 if row["d"] == 128 else 64
        assert row["spill_stores"] <= allowed and row["spill_loads"] <= allowed, row
