"""Attention's causal schedules on the device (plan.causal_schedule, in tiles.schedule.DeviceTables): the last
configs.DEVICE_TABLES_MAX used are kept, so a server seeing many lengths does not grow without
bound; a table a CUDA graph captured is never evicted (the graph reads it at every replay); a capture
finds the table an eager call made in another patched block with the same switches, and raises where no
call made it (never round-robin in its place); threads share the cache; a probe's patched block gets its
own tables."""
import pytest
import torch

from tilecore import dispatch
from tilecore.ops.attention import configs, plan
from tilecore.tiles.schedule import DeviceTables
from tilecore.tiles.switches import patched


def test_causal_schedules_keep_the_last_used(monkeypatch):
    monkeypatch.setattr(plan, "DEVICE_TABLES", DeviceTables())
    monkeypatch.setattr(configs, "DEVICE_TABLES_MAX", 4)
    built = []

    def build(n):
        built.append(n)
        return torch.full((n,), n, dtype=torch.int32)
    cpu = torch.device("cpu")
    tables = [plan.causal_schedule(cpu, n, build=build) for n in range(1, 7)]
    assert len(plan.DEVICE_TABLES.used) == 4 and built == [1, 2, 3, 4, 5, 6]
    assert plan.causal_schedule(cpu, 6, build=build) is tables[5]  # kept: not built again
    assert plan.causal_schedule(cpu, 3, build=build) is tables[2]
    plan.causal_schedule(cpu, 1, build=build)  # evicted long ago: built again, evicting 4 (least recent)
    assert built[-1] == 1 and len(plan.DEVICE_TABLES.used) == 4
    assert [key[2] for key in plan.DEVICE_TABLES.used] == [(5,), (6,), (3,), (1,)]
    for n in range(100, 300):  # a server seeing many lengths: the cache stays at its bound
        plan.causal_schedule(cpu, n, build=build)
    assert len(plan.DEVICE_TABLES.used) == 4


def test_a_table_a_cuda_graph_captured_is_never_evicted(monkeypatch):
    monkeypatch.setattr(plan, "DEVICE_TABLES", DeviceTables())
    monkeypatch.setattr(configs, "DEVICE_TABLES_MAX", 2)
    build = lambda n: torch.full((n,), n, dtype=torch.int32)
    cpu = torch.device("cpu")
    first = plan.causal_schedule(cpu, 7, build=build)  # made before capture
    monkeypatch.setattr(dispatch, "capturing", lambda device: True)
    assert plan.causal_schedule(cpu, 7, build=build) is first  # the graph reads this table
    with pytest.raises(plan.ScheduleNotOnDevice, match="run this call once"):
        plan.causal_schedule(cpu, 8, build=build)  # never made: no copy under capture, and no silent round-robin
    monkeypatch.setattr(dispatch, "capturing", lambda device: False)
    for n in range(20, 40):
        plan.causal_schedule(cpu, n, build=build)
    assert plan.causal_schedule(cpu, 7, build=build) is first and len(plan.DEVICE_TABLES.used) == 2


def test_threads_share_the_cache(monkeypatch):
    import threading

    monkeypatch.setattr(plan, "DEVICE_TABLES", DeviceTables())
    monkeypatch.setattr(configs, "DEVICE_TABLES_MAX", 3)
    build = lambda n: torch.full((n,), n, dtype=torch.int32)
    errors = []

    def work(offset):
        try:
            for i in range(300):
                n = 1 + (i * 7 + offset) % 11
                assert plan.causal_schedule(torch.device("cpu"), n, build=build)[0] == n
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(plan.DEVICE_TABLES.used) == 3


def test_a_patched_block_gets_its_own_tables(monkeypatch):
    """A table built from configs (balanced_table reads TILE_OVERHEAD_STEPS) under a tiles.switches.patched block (a
    probe's variant) is that block's: made once in it, and the shipped table again after it (the device cache keys on
    tiles.switches.generation, balanced_table's memo too)."""
    monkeypatch.setattr(plan, "DEVICE_TABLES", DeviceTables())
    built = []

    def build(n):
        built.append(configs.TILE_OVERHEAD_STEPS)
        return torch.full((n,), configs.TILE_OVERHEAD_STEPS, dtype=torch.int32)
    cpu = torch.device("cpu")
    shipped = plan.causal_schedule(cpu, 3, build=build)
    assert plan.causal_schedule(cpu, 3, build=build) is shipped
    with patched(configs, TILE_OVERHEAD_STEPS=configs.TILE_OVERHEAD_STEPS + 5):
        variant = plan.causal_schedule(cpu, 3, build=build)
        assert plan.causal_schedule(cpu, 3, build=build) is variant
    after = plan.causal_schedule(cpu, 3, build=build)
    assert variant[0] == shipped[0] + 5 and after is shipped  # the same contents: the same copy
    assert built == [shipped[0], shipped[0] + 5, shipped[0]]
    assert plan.balanced_table.cache_info().maxsize == 64  # (the memo of tiles.switches, keyed on its generation)


def test_a_capture_in_a_patched_block_finds_its_warm_up_table(monkeypatch):
    """The timing artefact of session 42: a probe that enters switches.patched on each call (a new generation each
    time) warms up eagerly and then captures a CUDA graph; the capture must launch the balanced table its warm-up
    uploaded (same contents), not round-robin; a capture whose table no call made raises."""
    monkeypatch.setattr(plan, "DEVICE_TABLES", DeviceTables())
    cpu = torch.device("cpu")
    key = ("backward", 4096, 4096, 64, 128, 256, 8, 1, 132)  # D128 causal B16 H16: 8,192 key tiles over 132
    steps = configs.TILE_OVERHEAD_STEPS + 1

    def call():
        with patched(configs, TILE_OVERHEAD_STEPS=steps):
            return plan.causal_schedule(cpu, *key)
    warm = call()  # eager: built and uploaded
    with patched(configs, TILE_OVERHEAD_STEPS=steps):
        assert warm is not None and torch.equal(warm, plan.balanced_table(*key))
    monkeypatch.setattr(dispatch, "capturing", lambda device: True)
    captured = call()  # another generation, the same switches
    assert captured is warm
    assert call() is warm  # and every capture after it
    with pytest.raises(plan.ScheduleNotOnDevice):  # a shape no eager call ran (N 8192)
        plan.causal_schedule(cpu, "backward", 8192, 8192, 64, 128, 256, 8, 1, 132)
