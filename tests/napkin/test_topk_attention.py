"""The attention forward's Gluon tiles from the napkin's top-k (issue 36 part 4; attention
plan.NAPKIN_FORWARD_TOPK): the candidates are the napkin's ranking of the tiles the kernel takes plus
the table's row; the plan times them once a bucket on a GPU; never in a graph capture, on a meta device
(dispatch.pretend), for CPU tensors or before launch.py registers its forward (tiles.timed): those plan the
table's row, with the switch on or off. experiments/napkin/gpu_topk_configs.py --attention times them on
the GPU."""
import math

import pytest
import torch

from tilecore import dispatch
from tilecore.napkin.engine import rank_attention_configs
from tilecore.ops.attention import configs, plan
from tilecore.tiles import timed as runners

H100 = dispatch.TARGETS["sm_90a"]
SHAPES = [(8, 16, 4096, 128, False), (8, 16, 4096, 128, True), (8, 16, 4096, 64, False), (32, 16, 1024, 128, True)]


def smem(cfg, d):
    return cfg.get("q_buffers", 1) * cfg["consumers"] * cfg["block_m"] * d * 2 + cfg["stages"] * cfg["block_n"] * d * 4


@pytest.mark.parametrize("b,h,n,d,causal", SHAPES)
def test_candidates_are_legal_tiles_in_the_napkins_order_then_the_table(b, h, n, d, causal):
    rows = plan.napkin_forward_configs(b, h, n, n, d, causal, 3)
    assert rows == plan.napkin_forward_configs(b, h, n, n, d, causal, 3)  # deterministic
    table = configs.gluon_forward_config(d, n, n, causal)
    assert table in rows and len(rows) in (3, 4) and (len(rows) == 4) == (table not in rows[:3])
    for r in rows:
        assert r["block_m"] == 64 and r["consumers"] in (2, 3) and r["block_n"] in (64, 128) and r["stages"] in (2, 3)
        assert smem(r, d) <= plan.FORWARD_SMEM
        assert not (r.get("carry") and r["consumers"] == 3)  # plan_forward refuses carried 3-consumer rows
        assert r["consumers"] == 2 or d <= 64  # D128 with three consumers ran out of shared memory (H100 run 3)
    predicted = {((c.block[0], c.block[1]), c.warpgroups, c.stages): c.time
                 for c in rank_attention_configs(b, h, n, d, causal)}
    times = [predicted[((64 * r["consumers"], r["block_n"]), r["consumers"], r["stages"])] for r in rows[:3]]
    assert times == sorted(times)


def meta_plan(n, d, causal, window=(-1, -1)):
    q = torch.empty(8, 16, n, d, dtype=torch.bfloat16, device="meta")
    with dispatch.pretend(H100):
        return plan.plan_forward(q, q, q, causal, d ** -0.5, window=window)


@pytest.mark.parametrize("topk", [0, 3])
def test_a_meta_gpu_plans_the_table_with_the_switch_on_or_off(monkeypatch, topk):
    monkeypatch.setattr(plan, "time_forward_configs", lambda *a, **k: pytest.fail("a meta device is never timed"))
    monkeypatch.setattr(plan, "NAPKIN_FORWARD_TOPK", topk)
    for n, d, causal in ((4096, 128, False), (4096, 128, True), (1024, 128, True), (4096, 64, False)):
        assert meta_plan(n, d, causal).config == configs.gluon_forward_config(d, n, n, causal)
    # a window keeps the table's row
    assert meta_plan(4096, 128, False, (256, 0)).config["block_n"] == configs.GLUON_FORWARD[128]["block_n"]
    assert len(plan._FORWARD_PICKS) == 0


def test_interpreter_plans_ignore_the_switch(monkeypatch):
    monkeypatch.setattr(plan, "NAPKIN_FORWARD_TOPK", 3)
    monkeypatch.setattr(plan, "time_forward_configs", lambda *a, **k: pytest.fail("the interpreter is never timed"))
    q = torch.randn(1, 2, 40, 64)
    assert plan.plan_forward(q, q, q, False, 0.125).path != "gluon"


class FakeTimer:
    """time_forward_configs standing in for the GPU: ms by (block_n, stages, consumers), else 1."""

    def __init__(self, ms: dict):
        self.ms, self.calls = ms, []

    def __call__(self, rows, q, k, v, causal, scale, softcap):
        self.calls.append([(r["block_n"], r["stages"], r["consumers"]) for r in rows])
        return [self.ms.get((r["block_n"], r["stages"], r["consumers"]), 1.0) for r in rows]


def timed(monkeypatch, timer, n=4096, d=128, causal=False, b=8, capturing=False):
    """plan.timed_forward_config on CPU tensors taken as a GPU's (plan._timeable; timing faked)."""
    monkeypatch.setattr(plan, "_timeable", lambda device: True)
    monkeypatch.setattr(runners, "_RUNNERS", {plan.FORWARD_RUNNER: lambda *a, **k: pytest.fail("timing is faked")})
    monkeypatch.setattr(plan, "time_forward_configs", timer)
    monkeypatch.setattr(dispatch, "capturing", lambda device: capturing)
    q = torch.empty(b, 16, n, d, dtype=torch.bfloat16)
    return plan.timed_forward_config(q, q, q, causal, d ** -0.5, 0.0, 3)


@pytest.fixture(autouse=True)
def fresh_picks(monkeypatch):
    monkeypatch.setattr(plan, "_FORWARD_PICKS", type(plan._FORWARD_PICKS)())


def test_timed_pick_takes_the_fastest_once_a_bucket(monkeypatch):
    rows = plan.napkin_forward_configs(8, 16, 4096, 4096, 128, False, 3)
    fast = (rows[1]["block_n"], rows[1]["stages"], rows[1]["consumers"])
    timer = FakeTimer({fast: 0.5})
    assert timed(monkeypatch, timer) == rows[1] and len(timer.calls) == 1
    assert timed(monkeypatch, timer, n=4000) == rows[1] and len(timer.calls) == 1  # same bucket
    timed(monkeypatch, timer, causal=True)
    assert len(timer.calls) == 2


def test_all_failed_leaves_the_table_and_a_capture_times_nothing(monkeypatch):
    rows = plan.napkin_forward_configs(8, 16, 4096, 4096, 128, False, 3)
    failing = FakeTimer({(r["block_n"], r["stages"], r["consumers"]): math.inf for r in rows})
    assert timed(monkeypatch, failing) == configs.gluon_forward_config(128, 4096, 4096, False)
    monkeypatch.setattr(plan, "_FORWARD_PICKS", type(plan._FORWARD_PICKS)())
    idle = FakeTimer({})
    assert timed(monkeypatch, idle, capturing=True) == configs.gluon_forward_config(128, 4096, 4096, False)
    assert idle.calls == [] and len(plan._FORWARD_PICKS) == 0


def test_without_a_registered_launch_the_switch_plans_the_table(monkeypatch):
    # attention launch.py registers its forward (plan.use_forward_launch -> tiles.timed); plan.py never imports it
    assert runners.runner(plan.FORWARD_RUNNER) is not None
    monkeypatch.setattr(plan, "_timeable", lambda device: True)
    monkeypatch.setattr(runners, "_RUNNERS", {})
    monkeypatch.setattr(dispatch, "capturing", lambda device: False)
    monkeypatch.setattr(plan, "time_forward_configs", lambda *a, **k: pytest.fail("nothing to time with"))
    q = torch.empty(8, 16, 4096, 128, dtype=torch.bfloat16)
    assert plan.timed_forward_config(q, q, q, False, 0.1, 0.0, 3) == configs.gluon_forward_config(128, 4096, 4096, False)
    assert len(plan._FORWARD_PICKS) == 0  # not kept: once launch.py registers, the bucket is timed


def test_timed_fastest_takes_the_first_smallest_finite_time():
    assert runners.fastest([2.0, 0.5, 0.5, math.inf]) == 1
    assert runners.fastest([math.inf, math.nan]) is None and runners.fastest([]) is None
