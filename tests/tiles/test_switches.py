"""tiles.switches: patched (a variant's switches for a block, restored after: experiments' way to run one), and the
generation plan memos key on (memo)."""
import types

import pytest

from tilecore.tiles.switches import generation, memo, patched


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


def test_generation_moves_on_entry_and_exit_to_new_values():
    m = make_configs()
    seen = [generation()]
    with pytest.raises(RuntimeError):
        with patched(m, ON=True):
            seen.append(generation())
            with patched(m, TABLE={}):
                seen.append(generation())
            seen.append(generation())
            raise RuntimeError("the variant failed")
    seen.append(generation())
    assert len(set(seen)) == len(seen) == 5  # never a value twice: a memo key of one block never serves another


def test_memo_plans_again_under_each_block_and_after_it():
    m = make_configs()
    planned = []

    @memo(8)
    def plan(n):
        planned.append((n, m.TABLE[1]))
        return m.TABLE[1] * n

    assert plan(2) == "aa" and plan(2) == "aa" and planned == [(2, "a")]
    with patched(m, TABLE={1: "b"}):
        assert plan(2) == "bb" and plan(2) == "bb"
    assert plan(2) == "aa"  # the shipped table's plan again, not the variant's
    assert planned == [(2, "a"), (2, "b"), (2, "a")]
    assert plan.cache_info().currsize == 3
    plan.cache_clear()
    assert plan.cache_info().currsize == 0
