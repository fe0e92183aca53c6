"""MLA prefill's 64-row dK/dV candidate (experiments.attention.mla_roles_kernel, session 31) without a
GPU: its tiles and walk mirrored in Python (every (key, q head, query row) a key sees visited exactly once, with
64-key tiles and 64-row steps: setup / step_rows as the kernel computes them), and the kernel compiled for sm_90a
(wgmma and TMA, not serialized, no spill, within 227 KiB of shared memory). Its numbers and its check against
float64 are experiments/attention/gpu_mla.py --roles (Gluon kernels cannot run in Triton's interpreter)."""

import pytest
from compiled_run import compiled_json


def cdiv(a, b):
    return -(-a // b)


def tile_steps(key_block, n, nk, group, causal, window, bm=64, bn=64):
    """AttentionBackwardRoles.setup then AttentionBackward.step_rows, in Python: the (q head offset, first
    query row) of each step of the tile (grouped heads walk the blocks down, no pairs: upward False)."""
    start_n = key_block * bn
    first_mb = 0
    if causal:
        first_mb = max(start_n - (nk - n), 0) // bm
    if window:
        left, right = window
        first_mb = max(start_n - (nk - n) - right, 0) // bm
        last_key = min(start_n + bn, nk) - 1
        last_row = min(n - 1, last_key - (nk - n) + left)
        per_head = max(cdiv(max(last_row + 1, 0), bm) - first_mb, 0)
    else:
        per_head = max(cdiv(n, bm) - first_mb, 0)
    shift = key_block % max(per_head, 1)
    head0 = key_block % group
    steps = []
    for step in range(per_head * group):
        if group == 1:
            walked = step + shift
            block = first_mb + (walked - per_head if walked >= per_head else walked)
            head = 0
        else:
            walked = step // group
            head = (step - walked * group + head0) % group
            block = first_mb + per_head - 1 - walked
        steps.append((head, block * bm))
    return steps


@pytest.mark.parametrize("n, nk", [(260, 260), (130, 300), (300, 130), (64, 64), (1, 200), (130, 1)])
@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (False, (100, 0)), (False, (3, 70))])
@pytest.mark.parametrize("group", [1, 3])
def test_tiles_visit_every_seen_score_once(n, nk, causal, window, group):
    seen = {}
    for key_block in range(cdiv(nk, 64)):
        for head, start_m in tile_steps(key_block, n, nk, group, causal, window):
            assert 0 <= start_m < n and start_m % 64 == 0
            for key in range(key_block * 64, min(key_block * 64 + 64, nk)):
                for row in range(start_m, min(start_m + 64, n)):
                    seen[key, head, row] = seen.get((key, head, row), 0) + 1
    for key in range(nk):
        for row in range(n):
            sees = key <= row + nk - n if causal else True
            if window:
                sees = row + nk - n - window[0] <= key <= row + nk - n + window[1]
            for head in range(group):
                # a score the query sees: in exactly one step; the others a step covers are masked there
                assert seen.get((key, head, row), 0) == (1 if sees else seen.get((key, head, row), 0))
                assert seen.get((key, head, row), 0) <= 1


_COMPILE = """
import json
from experiments.attention.mla_roles_kernel import compiled
from tilecore.tiles.compile import has_hopper_instructions, resources
rows = []
for causal, window, group in ((True, False, 1), (False, True, 4)):
    c = compiled(causal, window, group)
    rows.append(dict(causal=causal, window=window, **vars(resources(c)), **has_hopper_instructions(c.asm["ptx"])))
print(json.dumps(rows))
"""


def test_compiles_for_sm90a_without_spills():
    for row in compiled_json(_COMPILE, timeout=600):
        assert row["wgmma"] and row["tma"] and row["mbarrier"] and not row["wgmma_serialized"], row
        # each consumer holds half the step's accumulators (dV + S^T, or dK + dP^T): nothing spills
        assert row["spill_stores"] == 0 and row["spill_loads"] == 0, row
        assert row["shared"] <= 227 * 1024, row
