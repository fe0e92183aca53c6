"""The napkin's mamba2_ssd with mamba_ssm's grouped B/C, the gate z and the skip D (session 31, issue 33): its
compulsory bytes are the kernel's (x, z, y a head, B and C once a batch row and group, the decays), the grouped
C B^T is made once a group (less tensor work than a B/C a head), and the form without groups is unchanged."""
import pytest

from tilecore.napkin import models
from tilecore.napkin.engine import derive
from tilecore.napkin.errors import ShapeMismatchError


def test_grouped_gated_bytes_are_the_kernels():
    b, h, n, p, s = 2, 12, 1024, 64, 128
    g = models.mamba2_ssd(batch=b, heads=h, seq=n, headdim=p, state=s, chunk=64, groups=1, gate=True, skip=True)
    per_head = 3 * b * n * h * p * 2  # x, z, y (bf16)
    shared = 2 * b * n * s * 2  # B, C once (one group)
    decays = 2 * b * n * h * 4  # the cumulative log decay, by query and by key position (float32)
    r = derive(g, "h100")
    assert r.compulsory_bytes == per_head + shared + decays
    ungrouped = derive(models.mamba2_ssd(batch=b, heads=h, seq=n, headdim=p, state=s, chunk=64), "h100")
    assert r.compulsory_bytes < ungrouped.compulsory_bytes
    assert r.work[("tensor", "bf16")] < ungrouped.work[("tensor", "bf16")]  # C B^T once a group, not a head
    assert r.flops < ungrouped.flops


def test_groups_split_the_heads_and_must_divide_them():
    g = models.mamba2_ssd(batch=1, heads=80, seq=256, headdim=64, state=128, chunk=64, groups=1)
    assert g.sizes["hg"] * g.sizes.get("hh", 1) == 80 and g.sizes["hg"] <= 64
    g8 = models.mamba2_ssd(batch=1, heads=16, seq=256, headdim=64, state=128, chunk=64, groups=8)
    assert g8.sizes["g"] == 8 and g8.sizes["hg"] == 2
    with pytest.raises(ShapeMismatchError, match="divide"):
        models.mamba2_ssd(heads=10, groups=3)
    assert {op.name for op in models.mamba2_ssd(batch=1, heads=2, seq=256, gate=True, skip=True).ops} >= {"Ylin", "Y"}
