"""apply_rotary's head-major tiles (configs.HEAD_MAJOR_TILES: x and out with each head's tokens side by side, as
attention's (B, H, N, D) q and k, tiled BLOCK_T tokens of one head): in the interpreter the token-major tiles' bits
and the float64 reference (both layouts, a partial rotary_dim, a sequence not a multiple of BLOCK_T, position_ids,
the backward's conjugate turn, NaN for bad positions); the plan takes them only where both tensors are head-major;
the kernel compiles for sm_90a without spilling and moves x in 16-byte vectors."""
import math

import pytest
import torch

from tilecore.ops.rotary import configs, rotary_reference
from tilecore.ops.rotary.op import head_major, turn
from tilecore.ops.rotary.plan import plan, tl_plan
from compiled_run import compiled_json


def tables(n_max, pairs, dtype=torch.float32):
    angle = torch.rand(n_max, pairs) * 2 * math.pi
    return angle.cos().to(dtype), angle.sin().to(dtype)


@pytest.fixture
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim, conjugate", [(32, False), (20, True)])
def test_head_major_tiles_give_the_token_major_bits(interpreter, monkeypatch, interleaved, rotary_dim, conjugate):
    B, H, N, D = 2, 3, 37, 32  # 37 tokens: tiles of 32 (TILE_ELEMS 1024 over 32 features) and a short one
    monkeypatch.setattr(configs, "TILE_ELEMS", 1024)
    cos, sin = tables(40, rotary_dim // 2, torch.bfloat16)
    k = torch.randn(B, H, N, D, dtype=torch.float16)
    x = k.transpose(1, 2)  # (B, N, H, D), head-major
    assert head_major(x)
    want = turn(x, cos, sin, interleaved=interleaved, conjugate=conjugate)  # token-major out: token-major tiles
    out = torch.full_like(k, math.nan)
    monkeypatch.setattr(configs, "HEAD_MAJOR_TILES", True)
    turn(x, cos, sin, interleaved=interleaved, conjugate=conjugate, out=out.transpose(1, 2))
    assert torch.equal(out.transpose(1, 2), want)
    ref = rotary_reference(x, cos, sin, interleaved=interleaved, conjugate=conjugate)
    assert torch.allclose(out.transpose(1, 2).double(), ref, rtol=2e-3, atol=2e-3)


def test_head_major_tiles_with_positions(interpreter, monkeypatch):
    """position_ids per token (each row of a tile its own cos and sin); a position past the tables: NaN there."""
    from tilecore.ops.rotary import launch, op

    B, H, N, D = 2, 2, 12, 16
    monkeypatch.setattr(configs, "TILE_ELEMS", 128)  # 8 tokens a tile
    monkeypatch.setattr(configs, "HEAD_MAJOR_TILES", True)
    cos, sin = tables(20, 8)
    x = torch.randn(B, H, N, D).transpose(1, 2)
    pos = torch.randint(0, 20, (B, N))
    pos[1, 10] = 25  # outside the tables
    out = torch.full((B, H, N, D), math.nan).transpose(1, 2)
    p = plan(B, N, H, D, 8, x.device, head_major=True)
    assert p.block_t == 8 and p.grid == (B * 2, H)
    launch.launch(p, x, cos, sin, pos.clamp(max=19), out, False, False)
    ref = rotary_reference(x, cos, sin, position_ids=pos.clamp(max=19))
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-5)
    launch.launch(p, x, cos, sin, pos, out, False, False)
    assert torch.isnan(out[1, 10]).all() and not torch.isnan(out[1, :10]).any() and not torch.isnan(out[0]).any()
    assert op.head_major(out)


def test_the_plan_takes_head_major_tiles_where_both_are(interpreter, monkeypatch):
    from tilecore.ops.rotary import op

    x = torch.randn(2, 4, 8, 32).transpose(1, 2)
    token_major = torch.randn(2, 8, 4, 32)
    assert head_major(x) and not head_major(token_major) and not head_major(torch.randn(2, 8, 1, 32))
    seen = []
    monkeypatch.setattr(op, "plan", lambda *a: seen.append(a[-1]) or tl_plan(*a[:5]))
    cos, sin = tables(8, 16)
    turn(x, cos, sin, out=torch.empty(2, 4, 8, 32).transpose(1, 2))
    turn(x, cos, sin)  # into a new token-major tensor
    turn(token_major, cos, sin, out=torch.empty(2, 4, 8, 32).transpose(1, 2))
    assert seen == [True, False, False]
    monkeypatch.undo()
    cpu = torch.device("cpu")
    with pytest.MonkeyPatch.context() as m:
        m.setenv("TRITON_INTERPRET", "1")
        m.setattr(configs, "HEAD_MAJOR_TILES", False)
        assert plan(2, 8, 4, 32, 16, cpu, head_major=True).block_t == 1
        m.setattr(configs, "HEAD_MAJOR_TILES", True)
        assert plan(2, 8, 4, 32, 16, cpu, head_major=True).block_t == 8
        assert plan(2, 8, 4, 32, 16, cpu, head_major=False).block_t == 1
    p = tl_plan(16, 4096, 16, 128, 64, head_major=True)
    assert (p.block_t, p.block_h, p.grid) == (configs.TILE_ELEMS // 128, 1, (16 * 4096 // p.block_t, 16))


CODE = """
import json
import torch
from tilecore.ops.rotary import kernels
from tilecore.ops.rotary.plan import tl_plan
from tilecore.tiles.compile import compile_kernel, resources
t = torch.empty(64, dtype=torch.bfloat16)
out = []
for interleaved in (False, True):
    for pairs in (64, 32):
        p = tl_plan(16, 4096, 16, 128, pairs, head_major=True)
        args = dict(X=t, COS=t, SIN=t, POS=None, OUT=t, seqlen=4096, heads=16, n_max=4096,
                    stride_xb=4096 * 16 * 128, stride_xn=128, stride_xh=4096 * 128, stride_ob=4096 * 16 * 128,
                    stride_on=128, stride_oh=4096 * 128, stride_cos=pairs, stride_sin=pairs, stride_pb=0,
                    stride_pn=0, R=pairs, BLOCK_R=p.block_r, BLOCK_H=1, PASS=128 - 2 * pairs,
                    BLOCK_PASS=p.block_pass, INTERLEAVED=interleaved, CONJUGATE=False, HAS_POS=False,
                    BLOCK_T=p.block_t)
        compiled = compile_kernel(kernels.rotary_kernel, args, num_warps=p.num_warps)
        ptx = compiled.asm["ptx"]
        out.append(dict(interleaved=interleaved, pairs=pairs, **vars(resources(compiled)),
                        v4_loads=ptx.count("ld.global.v4"), loads=ptx.count("ld.global"),
                        v4_stores=ptx.count("st.global.v4"), stores=ptx.count("st.global")))
print(json.dumps(out))
"""


def test_head_major_tiles_compile_for_hopper_with_vector_accesses():
    for row in compiled_json(CODE, timeout=600):
        assert row["spill_stores"] == 0 and row["stack"] == 0, row
        assert row["v4_stores"] == row["stores"] > 0 and row["v4_loads"] == row["loads"], row  # all 16-byte


def test_a_keyed_plan_follows_patched_switches(monkeypatch):
    """A keyed (CUDA) call's plan and launch key change with the switches the plan reads (configs.HEAD_MAJOR_TILES,
    TILE_ELEMS) inside a switches.patched block, and a call after the block plans as before it: the memo keys on
    switches.generation (a stale plan would launch the kernel compiled for the first one)."""
    from tilecore.ops.rotary import configs as rotary_configs, op as rotary_op
    from tilecore.tiles.switches import patched

    seen = []
    monkeypatch.setattr(rotary_op.launch, "launch", lambda p, *args, key=None: seen.append((p, key)))
    x = torch.randn(1, 4, 64, 64).transpose(1, 2)  # head-major: (B, N, H, D) with each head's tokens side by side
    out = torch.empty(1, 4, 64, 64).transpose(1, 2)
    cos = sin = torch.randn(64, 32)
    call = lambda: rotary_op._rotate_into(x, cos, sin, None, out, False, False, key=("a call's key",))
    call()
    with patched(rotary_configs, HEAD_MAJOR_TILES=not rotary_configs.HEAD_MAJOR_TILES):
        call()
    with patched(rotary_configs, TILE_ELEMS=rotary_configs.TILE_ELEMS // 2):
        call()
    call()
    (first, k0), (flipped, k1), (halved, k2), (after, k3) = seen
    assert (flipped.block_t > 1) != (first.block_t > 1)  # the other tiling: head-major against token-major
    assert halved != first and after == first
    assert len({k0, k1, k2, k3}) == 4  # each its own keyed launch (the kernel compiled for its plan)
