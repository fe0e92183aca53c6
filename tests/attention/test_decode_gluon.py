"""Hopper's Gluon split-key (decode) kernel (ops/attention_decode/gluon_decode.py): which inputs the plan gives it,
the arguments its launch passes, and the kernel compiled for sm_90a from those arguments (wgmma, TMA, no spill,
wgmma not serialized, within 227 KiB of shared memory). Its numbers are checked against float64 on the H100 by
experiments/attention/gpu_decode_gluon.py; the tl kernel (tests/attention/test_decode.py) is its interpreter twin."""
import dataclasses

import pytest
import torch

from tilecore import dispatch
from tilecore.ops.attention import plan as attention_plan
from tilecore.ops.attention_decode import configs, launch, plan
from tilecore.tiles import switches
from tilecore.tiles.launch import TmaOperand
from compiled_run import compiled_json


@pytest.fixture
def hopper(monkeypatch):
    """CPU tensors planned as on an H100 with a triton the Gluon kernels take (132 SMs)."""
    monkeypatch.setattr(dispatch, "gluon_ok", lambda device: True)
    return 132


def tensors(b=2, hq=32, hkv=8, n=1, nk=1000, d=128, dv=None, dtype=torch.bfloat16):
    return (torch.randn(b, hq, n, d, dtype=dtype), torch.randn(b, hkv, nk, d, dtype=dtype),
            torch.randn(b, hkv, nk, dv or d, dtype=dtype))


def test_the_table_takes_it_only_where_ruled_and_where_it_fits(hopper):
    q, k, v = tensors()
    tl_cfg = configs.decode_config(128, False)
    with switches.patched(configs, DECODE_GLUON_DEFAULT=()):  # no head dim ruled
        assert "kernel" not in plan.decode_plan(q, k, tl_cfg, None, v, hopper).config
    with switches.patched(configs, DECODE_GLUON_DEFAULT=(64, 128), DECODE_GLUON_ONE_WAVE=True):
        p = plan.decode_plan(q, k, tl_cfg, None, v, hopper)
        assert p.config["kernel"] == "gluon" and p.config["BLOCK_M"] == configs.DECODE_GLUON_SMALL_ROWS  # 4 rows
        tiles = p.grid[0] * p.grid[1] * p.grid[2]
        assert p.config["PROGRAMS"] == min(tiles, hopper) and p.keys_per_split % p.config["BLOCK_N"] == 0
        # another tl config, the tl kernel asked for, a head dim, dtype or K view it does not take: the tl kernel
        for cfg in (dict(tl_cfg, BLOCK_N=64), dict(tl_cfg, kernel="tl")):
            assert plan.decode_plan(q, k, cfg, None, v, hopper).config == dict(tl_cfg, BLOCK_N=cfg["BLOCK_N"],
                                                                                BLOCK_M=16)
        for args in (tensors(d=96), tensors(d=128, dv=64), tensors(dtype=torch.float32)):
            d = max(args[0].shape[-1], args[2].shape[-1])
            assert "kernel" not in plan.decode_plan(*args[:2], configs.decode_config(d, False), None, args[2],
                                                    hopper).config
        strided = torch.randn(2, 8, 1000, 128, dtype=torch.bfloat16)[..., ::2]  # a last stride of 2: no TMA view
        assert "kernel" not in plan.decode_plan(q[..., :64], strided, configs.decode_config(64, False), None,
                                                strided, hopper).config


def test_attention_plan_hands_it_the_table_and_a_forced_config(hopper, monkeypatch):
    monkeypatch.setattr(dispatch, "interpreted", lambda device: False)  # (the table's GPU row, planned on 132 SMs)
    monkeypatch.setattr(attention_plan, "grid_sms", lambda device: hopper)
    q, k, v = tensors(b=64, nk=1024)
    with switches.patched(configs, DECODE_GLUON_DEFAULT=(128,)):
        p = attention_plan.plan_forward(q, k, v, False, 0.1, path="decode")
        assert p.config["kernel"] == "gluon" and p.grid == (512, 1, 1) and p.config["PROGRAMS"] == 132
    forced = attention_plan.plan_forward(q, k, v, False, 0.1, path="decode",
                                         config=configs.decode_gluon_config(128), splits=3)
    assert forced.config["kernel"] == "gluon" and forced.grid == (512, 3, 1)
    assert forced.config["PROGRAMS"] == 512 * 3  # splits given: no SM count planned, a program a tile
    with pytest.raises(ValueError, match="the Gluon split-key kernel takes head dims"):
        attention_plan.plan_forward(*tensors(d=96), False, 0.1, path="decode", config=configs.decode_gluon_config(128))
    with pytest.raises(ValueError, match="kernel 'gluon' or 'tl'"):
        attention_plan.plan_forward(q, k, v, False, 0.1, path="decode", config=dict(kernel="cuda", BLOCK_N=64))


@pytest.mark.parametrize("b, nk, one_wave, kernel", [
    (64, 1024, False, "gluon"),  # several tiles a program, 1024 keys each: the persistent ring (1.058-1.063x)
    (64, 4096, False, "tl"),  # several long tiles a program (0.984-0.994x)
    (64, 16384, True, "tl"),
    (1, 4096, False, "tl"), (16, 1024, False, "tl"),  # one wave: as DECODE_GLUON_ONE_WAVE says
    (1, 4096, True, "gluon"), (16, 16384, True, "gluon")])
def test_the_table_rule(hopper, b, nk, one_wave, kernel):
    q, k, v = tensors(b=b, nk=nk)
    with switches.patched(configs, DECODE_GLUON_DEFAULT=(128,), DECODE_GLUON_ONE_WAVE=one_wave):
        p = plan.decode_plan(q, k, configs.decode_config(128, False), None, v, hopper)
    assert p.config.get("kernel", "tl") == kernel
    with switches.patched(configs, DECODE_GLUON_DEFAULT=(64,), DECODE_GLUON_ONE_WAVE=one_wave):  # D128 not ruled
        assert "kernel" not in plan.decode_plan(q, k, configs.decode_config(128, False), None, v, hopper).config


@pytest.mark.parametrize("hq, n, cfg, rows", [(32, 1, {}, 16), (32, 4, {}, 16), (32, 5, {}, 64), (64, 8, {}, 64),
                                              (32, 1, {"ROWS": 64}, 64), (32, 16, {"ROWS": 16}, 16)])
def test_tile_rows_16_by_mma_sync_where_a_kv_head_packs_16(hopper, hq, n, cfg, rows):
    q, k, v = tensors(hq=hq, n=n)
    p = plan.decode_plan(q, k, dict(configs.decode_gluon_config(128), **cfg), None, v, hopper)
    assert p.config["BLOCK_M"] == rows and p.grid[2] == -(-n * hq // 8 // rows)
    with pytest.raises(ValueError, match="ROWS is 16 or 64"):
        plan.decode_plan(q, k, dict(configs.decode_gluon_config(128), ROWS=32), None, v, hopper)


@pytest.mark.parametrize("splits", [1, 4])
def test_the_launch_passes_views_of_consecutive_rows(fast_launch, hopper, monkeypatch, splits):
    q, k, v = tensors(b=2, hq=32, hkv=8, n=3, nk=1000, d=64)
    p = attention_plan.plan_forward(q, k, v, True, 0.1, path="decode", config=configs.decode_gluon_config(64),
                                    splits=splits)
    split_keys, merges = fast_launch(launch.GLUON_SPLIT_KEYS), []
    monkeypatch.setattr(launch.MERGE, "run", lambda key, grid, args, options: merges.append(args))  # (a tl kernel)
    out, lse = torch.empty(2, 32, 3, 64, dtype=torch.bfloat16), torch.empty(2, 32, 3)
    launch.launch_decode(p, q, k, v, out, lse, True, 0.1)
    (grid, args), = split_keys.calls
    bound = dict(zip(launch.GLUON_SPLIT_KEYS.kernel.arg_names, args))
    assert grid == (p.config["PROGRAMS"], 1, 1) and bound["MERGED"] is (splits == 1) and bound["CAUSAL"] is True
    assert bound["q_ptr"] is q and bound["scale_log2e"] > 0 and bound["GROUP"] == 4 and bound["num_bhk"] == 16 and bound["splits"] == splits
    o_rows = bound["o_desc"]
    assert isinstance(o_rows, TmaOperand) and o_rows.block_shape == [1, 16, 64]  # 12 rows: mma.sync's 16
    assert o_rows.shape == [splits * 16, 12, 64]  # (split x batch x kv head, 4 q heads x 3 queries, Dv)
    if splits == 1:  # O and lse themselves
        assert o_rows.base.data_ptr() == out.data_ptr() and bound["lse_ptr"] is lse and not merges
    else:  # the float32 parts, merged by the tl merge
        assert o_rows.base.dtype == torch.float32 and bound["lse_ptr"].shape == (splits, 2 * 32 * 3)
        merge_args, = merges
        assert merge_args[0] is out and merge_args[1] is lse and merge_args[2] is o_rows.base


_COMPILE = """
import json
import torch
from tilecore.ops.attention.plan import Plan
from tilecore.ops.attention_decode import configs, launch
from tilecore.ops.attention_decode.gluon_decode import attention_decode_kernel
from tilecore.tiles.compile import compile_kernel, has_hopper_instructions, resources
from tilecore.tiles.launch import jit_arg

calls = []
launch.GLUON_SPLIT_KEYS.run = lambda key, grid, args, options: calls.append((args, options))
launch.MERGE.run = lambda *a: None
out = {}
# (head dim, dtype, causal, window, softcap, splits, tile rows, config): the table's configs and the timed variants
for d, dtype, causal, window, softcap, splits, rows, cfg in [
        (128, torch.bfloat16, False, (-1, -1), 0.0, 4, 16, None), (128, torch.float16, True, (-1, -1), 0.0, 1, 16, None),
        (64, torch.bfloat16, False, (200, 0), 0.0, 4, 16, None), (128, torch.bfloat16, False, (-1, -1), 30.0, 2, 16, None),
        (128, torch.bfloat16, False, (-1, -1), 0.0, 4, 64, None), (64, torch.float16, True, (-1, -1), 0.0, 1, 64, None),
        (128, torch.bfloat16, False, (-1, -1), 0.0, 1, 16, dict(kernel="gluon", BLOCK_N=64, STAGES=6))]:
    q, k = torch.empty(2, 32, 4, d, dtype=dtype), torch.empty(2, 8, 1000, d, dtype=dtype)
    cfg = dict(cfg or configs.decode_gluon_config(d), BLOCK_M=rows, PROGRAMS=132)
    plan = Plan("decode", cfg, (16, splits, 1), sizes=dict(keys_per_split=256))
    launch.launch_decode_gluon(plan, q, k, k, torch.empty_like(q), torch.empty(2, 32, 4), causal, 0.1, window, softcap)
    args, options = calls.pop()
    names = [p.name for p in attention_decode_kernel.params]
    bound = dict(zip(names, [jit_arg(a) for a in args]), **options)
    num_warps = bound.pop("num_warps")
    compiled = compile_kernel(attention_decode_kernel, bound, num_warps=num_warps)
    name = f"D{d} {str(dtype)[6:]} rows{rows} BN{cfg['BLOCK_N']} S{cfg['STAGES']} splits{splits}" + (" causal" if causal else "") + (
        " window" if window != (-1, -1) else "") + (" softcap" if softcap else "")
    ptx = compiled.asm["ptx"]
    out[name] = dict(**vars(resources(compiled)), **has_hopper_instructions(ptx), mma_sync="mma.sync" in ptx)
print(json.dumps(out))
"""


def test_the_kernel_compiles_for_sm90a_from_the_launch_arguments():
    rows = compiled_json(_COMPILE)
    assert len(rows) == 7
    for name, row in rows.items():
        assert row["tma"] and row["mbarrier"] and not row["wgmma_serialized"], (name, row)
        # 64 rows: S = Q K^T and P V by wgmma; 16: by mma.sync (the operands loaded from the ring's stage)
        assert (row["wgmma"], row["mma_sync"]) == ((True, False) if "rows64" in name else (False, True)), (name, row)
        assert row["spill_stores"] == row["spill_loads"] == 0 and row["stack"] == 0, (name, row)
        assert row["shared"] <= 227 * 1024, (name, row)  # Hopper's most for a block


def test_a_negative_scale_goes_into_q(fast_launch, hopper, monkeypatch):
    q, k, v = tensors(b=1, nk=300)
    p = attention_plan.plan_forward(q, k, v, False, -0.1, path="decode", config=configs.decode_gluon_config(128))
    split_keys = fast_launch(launch.GLUON_SPLIT_KEYS)
    monkeypatch.setattr(launch.MERGE, "run", lambda *args: None)
    launch.launch_decode(p, q, k, v, torch.empty_like(q), torch.empty(q.shape[:3]), False, -0.1)
    (_, args), = split_keys.calls
    bound = dict(zip(launch.GLUON_SPLIT_KEYS.kernel.arg_names, args))
    assert torch.equal(bound["q_ptr"], -q) and bound["scale_log2e"] == pytest.approx(0.1 * 1.4426950408889634)


@pytest.mark.parametrize("splits", [1, 3])
def test_the_keyed_recipe_launches_as_the_general_path(fast_launch, hopper, monkeypatch, splits):
    """The op's eager call of a keyed Gluon plan (issue 31's recipe) passes what launch_decode_gluon passes."""
    q, k, v = tensors(b=2, hq=32, hkv=8, n=1, nk=900, d=128)
    p = attention_plan.plan_forward(q, k, v, False, 0.1, path="decode", config=configs.decode_gluon_config(128),
                                    splits=splits)
    launches = {}
    for name in ("general", "recipe"):
        p = dataclasses.replace(p, launch_key=("test_decode_gluon", splits, name))  # (each its own launches)
        split_keys, merges = fast_launch(launch.GLUON_SPLIT_KEYS), []
        monkeypatch.setattr(launch.MERGE, "run", lambda key, grid, args, options: merges.append(args))
        out, lse = torch.empty(2, 32, 1, 128, dtype=torch.bfloat16), torch.empty(2, 32, 1)
        if name == "general":
            launch.launch_decode_gluon(p, q, k, v, out, lse, False, 0.1)
        else:
            recipe = launch.prepared(p, q, k, v, False, (-1, -1), 0.0)
            assert type(recipe).__name__ == "_GluonDecodeLaunch"
            recipe(q, k, v, out, lse, 0.1, 0.0)
        (grid, args), = split_keys.calls
        launches[name] = (grid, args, out, lse, merges)
    (g1, a1, out1, lse1, m1), (g2, a2, out2, lse2, m2) = launches["general"], launches["recipe"]
    assert g1 == g2 and len(a1) == len(a2) and len(m1) == len(m2) == (splits > 1)
    for x, y in zip(a1, a2):
        if isinstance(x, TmaOperand):  # the same view (of this call's own buffer)
            assert (x.block_shape, x.shape, x.strides, x.base.dtype) == (y.block_shape, y.shape, y.strides, y.base.dtype)
        elif isinstance(x, torch.Tensor):
            assert x.shape == y.shape or x.numel() == y.numel()
        else:
            assert x == y
