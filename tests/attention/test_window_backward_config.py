"""The sliding-window backward's dQ mode switch (configs.GLUON_BACKWARD_WINDOW_DQ, issue 35; D128 fused since
session 29's H100 run 5 checked it and timed it 1.06x lagged): empty,
a window keeps the non-causal config (the kernels fold causal into the window); a mode named for a
head dim takes over from N >= FUSED_DQ_MIN_N[False] for windows only (plans on meta tensors for an
H100: dispatch.pretend). gpu_window_bwd.py checks and times the modes on the GPU."""
import pytest
import torch

from tilecore import dispatch
from tilecore.ops.attention import configs, plan

H100 = dispatch.TARGETS["sm_90a"]


def meta(*shape):
    return torch.empty(*shape, dtype=torch.bfloat16, device="meta")


def backward_plan(n, causal, window, d=128, softcap=0.0):
    q = meta(1, 4, n, d)
    with dispatch.pretend(H100):
        return plan.plan_backward(q, q, q, q, causal, d ** -0.5, window=window, softcap=softcap)


def test_window_takes_the_non_causal_config_while_the_switch_is_empty(monkeypatch):
    monkeypatch.setattr(configs, "GLUON_BACKWARD_WINDOW_DQ", {})
    window = backward_plan(4096, True, (1024, 0))
    assert window.path == "gluon"
    assert window.config["dq_from"] == configs.GLUON_BACKWARD[128, False]["dq_from"] == "lagged"
    assert backward_plan(4096, True, (-1, -1)).config["dq_from"] == configs.GLUON_BACKWARD[128, True]["dq_from"]


def test_the_shipped_window_backward_fuses_dq_at_d128():
    assert configs.GLUON_BACKWARD_WINDOW_DQ == {128: "fused"}
    assert backward_plan(32768, True, (4096, 0)).config["dq_from"] == "fused"
    assert backward_plan(4096, True, (-1, -1)).config["dq_from"] == configs.GLUON_BACKWARD[128, True]["dq_from"]
    # with a softcap too: the non-causal config's until a GPU run checks the two together
    assert backward_plan(32768, True, (4096, 0), softcap=30.0).config["dq_from"] == "lagged"


@pytest.mark.parametrize("mode", ["fused", "gluon"])
def test_the_switch_names_the_window_dq_mode(monkeypatch, mode):
    monkeypatch.setattr(configs, "GLUON_BACKWARD_WINDOW_DQ", {128: mode})
    window = backward_plan(4096, True, (1024, 0))
    assert window.config["dq_from"] == mode and not window.config.get("kv_regs")
    assert (window.dq is not None) == (mode == "gluon")  # the dq kernel's plan where dQ comes after
    assert backward_plan(4096, False, (300, 200)).config["dq_from"] == mode  # a two-sided window too
    # not a window: the shipped configs; short N: the dq kernel as before
    assert backward_plan(4096, False, (-1, -1)).config["dq_from"] == configs.GLUON_BACKWARD[128, False]["dq_from"]
    assert backward_plan(4096, True, (-1, -1)).config["dq_from"] == configs.GLUON_BACKWARD[128, True]["dq_from"]
    assert backward_plan(512, True, (256, 0)).config["dq_from"] == "gluon"
    # D64 is not named: its own non-causal config
    assert backward_plan(4096, True, (1024, 0), d=64).config["dq_from"] == configs.GLUON_BACKWARD[64, False]["dq_from"]
