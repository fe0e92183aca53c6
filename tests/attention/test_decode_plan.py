"""The split-key (decode) path's Plan (issue 30: plan, then launch): decode_plan gives a named Plan,
and attention's plan_forward carries its fields as the "decode" path's config, grid and sizes.
Host only (no kernel runs: meta tensors)."""
import dataclasses

import pytest
import torch

from tilecore.ops.attention import plan as attention_plan
from tilecore.ops.attention_decode import configs, plan


def meta(*shape):
    return torch.empty(*shape, device="meta", dtype=torch.bfloat16)


@pytest.mark.parametrize("b,hq,hkv,n,nk,d,dv,splits,sms", [
    (2, 32, 8, 1, 8192, 128, 128, None, 132),   # GQA decode: splits fill the SMs
    (1, 16, 16, 1, 100, 64, 64, None, 132),     # short cache: one range, no merge
    (3, 8, 2, 4, 5000, 128, 128, 5, None),      # splits given
    (1, 16, 1, 1, 4096, 576, 512, None, 100),   # MLA decode's 576 / 512: fewer rows a tile
])
def test_decode_plan_is_a_named_plan(b, hq, hkv, n, nk, d, dv, splits, sms):
    q, k, v = meta(b, hq, n, d), meta(b, hkv, nk, d), meta(b, hkv, nk, dv)
    cfg = configs.decode_config(max(d, dv), False)
    p = plan.decode_plan(q, k, cfg, splits, v, sms)
    assert isinstance(p, plan.Plan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.grid = ()
    group = hq // hkv
    most = configs.DECODE_MAX_ROWS if dv <= configs.DECODE_WHOLE_HEAD_DIM else configs.DECODE_MAX_ROWS_LARGE_DV
    block_m = plan.tile_rows(n, group, most)
    assert p.config == dict(cfg, BLOCK_M=block_m)
    rows = -(-n * group // block_m)
    if splits is None:
        splits = plan.decode_splits(b * hkv * rows, nk, cfg["BLOCK_N"], configs.DECODE_PROGRAMS_PER_SM * sms,
                                    configs.DECODE_MIN_SPLIT_KEYS)
    ranges, keys = plan.key_ranges(nk, splits, cfg["BLOCK_N"])
    assert p.grid == (b * hkv, ranges, rows) and p.splits == ranges
    assert p.keys_per_split == keys and keys % cfg["BLOCK_N"] == 0
    assert (p.splits - 1) * p.keys_per_split < nk <= p.splits * p.keys_per_split  # every key, no empty range


def test_attention_plan_carries_the_decode_plan():
    """Through attention's plan (CPU tensors under the interpreter: its decode config)."""
    q, k, v = (torch.randn(*s, dtype=torch.float16) for s in ((2, 32, 1, 64), (2, 8, 1000, 64), (2, 8, 1000, 64)))
    for splits in (7, None):
        ours = attention_plan.plan_forward(q, k, v, False, 64 ** -0.5, path="decode", splits=splits)
        sms = None if splits is not None else attention_plan.grid_sms(q.device)
        theirs = plan.decode_plan(q, k, configs.decode_config(64, True), splits, v, sms)
        assert ours.path == "decode" and ours.grid == theirs.grid and ours.config == theirs.config
        assert ours.sizes == {"keys_per_split": theirs.keys_per_split}


def test_bad_split_count_refused():
    q, k = meta(1, 8, 1, 64), meta(1, 8, 256, 64)
    with pytest.raises(ValueError, match="splits must be"):
        plan.decode_plan(q, k, configs.decode_config(64, False), configs.DECODE_MAX_SPLITS + 1, k)
