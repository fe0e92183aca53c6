"""The shipped FP8 configurations name only keys the Gluon kernel knows, and the launch refuses a removed variant's
key (issue 30: the kernel holds only what a shipped config uses; the variants live at commit 741bc3b)."""
import pytest
import torch

from tilecore.ops.attention_fp8 import configs, launch


def test_gluon_configs_name_only_known_keys():
    for d in configs.GLUON_FORWARD:
        for causal in (False, True):
            cfg = configs.gluon_config(d, causal)
            assert set(cfg) <= configs.GLUON_KEYS, (d, causal, set(cfg) - configs.GLUON_KEYS)
            assert cfg["consumers"] == 2 and cfg["block_n"] == 128, (d, causal)  # the kernel's static asserts


@pytest.mark.parametrize("removed", ["pingpong", "pv_smem", "block_n2", "rescale_tau", "early_exp2", "trace"])
def test_a_removed_variant_is_refused(removed):
    q = torch.empty(1, 2, 256, 64, dtype=torch.float8_e4m3fn)
    cfg = dict(configs.gluon_config(64, False), **{removed: 1})
    with pytest.raises(ValueError, match="741bc3b"):
        launch._GluonLayout(q, q, cfg, False, False, False, 1, 1)


def test_k_per_block_only_where_the_blocks_align():
    q = torch.empty(1, 2, 256, 64, dtype=torch.float8_e4m3fn)
    cfg = configs.gluon_config(64, False)
    assert launch._GluonLayout(q, q, cfg, False, False, True, 2, 128).options["K_PER_BLOCK"]
    per_key = launch._GluonLayout(q, q, cfg, False, False, True, 256, 1).options
    assert per_key["K_PER_ROW"] and not per_key["K_PER_BLOCK"]
    per_head = launch._GluonLayout(q, q, cfg, False, False, False, 1, 1).options
    assert not per_head["K_PER_ROW"] and not per_head["K_PER_BLOCK"]
