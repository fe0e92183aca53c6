"""The Gluon varlen backward's dQ mode by the batch's mean length (configs.VARLEN_GLUON_BACKWARD_FUSED_MEAN_N,
issue 35): off (None), dQ is split off whatever the batch; set, causal D128 batches whose mean query length
reaches it fuse dQ in the dK/dV kernel (as the fixed path does from FUSED_DQ_MIN_N), windows, no mask and D64
keep their configs; the launch takes the mode from total_q / sequences (host ints, no sync)."""
import pytest
import torch

from tilecore.ops.attention import configs, varlen


def cu_of(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


def test_off_by_default_the_dq_is_split_off():
    assert configs.VARLEN_GLUON_BACKWARD_FUSED_MEAN_N is None
    assert configs.varlen_gluon_backward_config(128, True, 8192.0)["dq_from"] == "gluon"


def test_the_rule_fuses_long_causal_batches_only(monkeypatch):
    monkeypatch.setattr(configs, "VARLEN_GLUON_BACKWARD_FUSED_MEAN_N", 4096)
    assert configs.varlen_gluon_backward_config(128, True, 4096.0)["dq_from"] == "fused"
    assert configs.varlen_gluon_backward_config(128, True, 1213.6)["dq_from"] == "gluon"
    assert configs.varlen_gluon_backward_config(128, True)["dq_from"] == "gluon"  # a window: no mean given
    assert configs.varlen_gluon_backward_config(64, True, 8192.0) == dict(configs.VARLEN_GLUON_BACKWARD_CONFIG[64, True],
                                                                         zero_tail=False)


@pytest.mark.parametrize("lengths, left, fused", [([300, 300], -1, True), ([300, 1, 2], -1, False),
                                                  ([300, 300], 100, False)])
def test_launch_takes_the_mode_from_the_mean_length(monkeypatch, lengths, left, fused):
    monkeypatch.setattr(configs, "VARLEN_GLUON_BACKWARD_FUSED_MEAN_N", 256)
    calls = {}

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.setdefault(self.name, kwargs)

    monkeypatch.setattr(varlen, "GLUON_VARLEN_BWD", Recorder("dkdv"))
    monkeypatch.setattr(varlen, "GLUON_VARLEN_DQ", Recorder("dq"))
    monkeypatch.setattr(varlen.dispatch, "num_sms", lambda device: 132)
    cu = cu_of(lengths)
    total = sum(lengths)
    q, dout, out = (torch.randn(total, 2, 128, dtype=torch.bfloat16) for _ in range(3))
    lse = torch.randn(2, total)
    varlen.backward_gluon(dout, q, q, q, out, lse, None, cu, cu, True, 0.1, left, -1, 0.0)
    assert calls["dkdv"]["DQ"] == (configs.DQ_MODES["fused"] if fused else 0)
    assert ("dq" in calls) == (not fused)  # the dq kernel runs only where dQ is split off
