"""tiles.switches.patched: a variant's switches for a block, restored after (experiments' way to run one)."""
import types

import pytest

from tilecore.tiles.switches import patched


def make_configs():
    m = types.ModuleType("fake_configs")
    m.ON = False
    m.TABLE = {1: "a"}
    return m


def test_values_hold_inside_and_come_back_after():
    m = make_configs()
    table = m.TABLE
    with patched(m, ON=True, TABLE={1: "b"}) as got:
        assert got is m and m.ON is True and m.TABLE == {1: "b"}
    assert m.ON is False and m.TABLE is table


def test_restored_on_an_exception():
    m = make_configs()
    with pytest.raises(RuntimeError):
        with patched(m, ON=True):
            raise RuntimeError("the variant failed")
    assert m.ON is False


def test_a_misspelt_switch_is_an_error_and_nothing_changes():
    m = make_configs()
    with pytest.raises(AttributeError, match="OFF"):
        with patched(m, ON=True, OFF=1):
            pass
    assert m.ON is False and not hasattr(m, "OFF")
