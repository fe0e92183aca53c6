"""The napkin's rotary model: memory-bound, x's bytes in and out (the tables are small beside them), so
its predicted time is a copy's of x; a partial rotary dimension moves the same bytes."""
import pytest

from tilecore.napkin import engine, models
from tilecore.napkin.errors import ShapeMismatchError


def test_rotary_predicts_a_copy_of_x():
    copy = engine.derive(models.copy(16 * 4096 * 32 * 128), "h100")
    for rotary_dim in (128, 64):
        d = engine.derive(models.rotary(16, 4096, 32, 128, rotary_dim=rotary_dim), "h100")
        assert d.bound == "HBM"
        assert d.time == pytest.approx(copy.time, rel=0.01)
    assert models.build("rotary", seq=1024, heads=8).sizes["p"] == 64
    with pytest.raises(ShapeMismatchError, match="rotary_dim"):
        models.rotary(rotary_dim=130)
