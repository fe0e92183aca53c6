"""The shipped FP8 configurations never carry a timing probe (wrong results by design) and name only switches the
Gluon launch knows."""
from tilecore.ops.attention_fp8 import configs

KNOWN = {"block_m", "block_n", "stages", "consumers", "q_buffers", "pingpong", "exp2_fma_every", "cast_late",
         "rescale_tau", "p_shift", "l_mma", "max_tree", "k_block_scalar", "rescale_late", "block_n2",
         "pv_smem", "early_exp2"}


def test_gluon_configs_ship_no_probe():
    for d in configs.GLUON_FORWARD:
        for causal in (False, True):
            cfg = configs.gluon_config(d, causal)
            assert set(cfg) <= KNOWN, (d, causal, set(cfg) - KNOWN)
            assert not cfg.get("probe_no_softmax", 0), (d, causal)
            # exp2_split's -1 replaces 2^x by x (the no-exp2 probe); -2, -4, -8: the quadratic (session 30)
            assert cfg["exp2_fma_every"] in (0, 2, 4, 8, -2, -4, -8), (d, causal, cfg["exp2_fma_every"])
            # split steps (session 30); 128: the pipelined halves of pv_smem 2/3 only (session 31)
            assert cfg.get("block_n2", 0) in (0, 32, 64) or (cfg["block_n2"] == 128 and cfg.get("pv_smem", 0) >= 2), \
                (d, causal)
            assert cfg["l_mma"] in (0, 1), (d, causal, cfg["l_mma"])  # modes 2-5: session 28's diagnosis only
            assert cfg.get("pv_smem", 0) in (0, 1, 2, 3), (d, causal)  # P V from shared memory (session 31)
            assert cfg["consumers"] == 2 or not cfg["pingpong"], (d, causal)


def test_pipelined_halves_fall_back_without_split_steps():
    """pv_smem 2 (session 31's pipelined halves) needs the split stage (block_n2); per-block or per-key k descales take
    128-key steps, so the launch drops both there (the default path), and keeps them with per-head k descales."""
    import torch

    from tilecore.ops.attention_fp8 import launch

    q = torch.empty(1, 2, 256, 64, dtype=torch.float8_e4m3fn)
    cfg = dict(configs.gluon_config(64, False), pv_smem=2, block_n2=128)
    per_head = launch._GluonLayout(q, q, cfg, False, False, False, 1, 1)
    assert per_head.options["PV_SMEM"] == 2 and per_head.options["BN2"] == 128
    per_block = launch._GluonLayout(q, q, cfg, False, False, True, 2, 128)
    assert "PV_SMEM" not in per_block.options and "BN2" not in per_block.options and per_block.options["K_PER_BLOCK"]
