"""The stream-K schedule (tiles.schedule.stream_k_work) run through the interpreter for every unit of
a launch: every K step of every tile is computed exactly once, each tile is stored by exactly one
unit (the one holding its last step), and each finishing unit waits only for the partials of
lower-numbered programs, each of which writes at most one."""
import pytest
import torch
import triton
import triton.language as tl

from tilecore.tiles import schedule


@triton.jit
def _enumerate_units(out, units, tiles, k_iters, programs, STREAM_K: tl.constexpr):
    for u in range(0, units):
        tile, k_first, steps, role, first = schedule.stream_k_work(u, tiles, k_iters, programs, STREAM_K)
        tl.store(out + u * 5 + 0, tile)
        tl.store(out + u * 5 + 1, k_first)
        tl.store(out + u * 5 + 2, steps)
        tl.store(out + u * 5 + 3, role)
        tl.store(out + u * 5 + 4, first)


def _units(tiles, k_iters, programs):
    units = schedule.stream_k_units(tiles, k_iters, programs, "always") or tiles
    out = torch.full((units, 5), -7, dtype=torch.int32)
    _enumerate_units[(1,)](out, units, tiles, k_iters, programs, STREAM_K=units != tiles)
    return out.tolist()


# (tiles, K steps, programs): a 4096^3 and an 8192^3 GEMM on 132 SMs (128 x 256 x 64 tiles), fewer
# tiles than programs, shares shorter than the minimum, one tile over, the interpreter's 3 programs
CASES = [(512, 64, 132), (2048, 128, 132), (30, 9, 132), (133, 8, 132), (7, 100, 5), (4, 8, 3), (5, 10, 3),
         (1, 200, 3), (264, 64, 132)]


@pytest.mark.parametrize("tiles,k_iters,programs", CASES)
def test_every_step_once_and_one_store_per_tile(tiles, k_iters, programs):
    units = _units(tiles, k_iters, programs)
    covered = torch.zeros(tiles, k_iters, dtype=torch.int32)
    stores = torch.zeros(tiles, dtype=torch.int32)
    partials_of_program = {}
    for u, (tile, k_first, steps, role, first) in enumerate(units):
        program = u % programs
        if role == schedule.NOTHING.value:
            assert steps == 0
            continue
        assert 0 <= tile < tiles and steps > 0 and 0 <= k_first and k_first + steps <= k_iters
        covered[tile, k_first:k_first + steps] += 1
        if role == schedule.PARTIAL.value:
            assert k_first + steps < k_iters
            assert program not in partials_of_program, "a program writes at most one partial"
            partials_of_program[program] = (tile, u)
        else:
            assert k_first + steps == k_iters  # WHOLE or FINAL hold the tile's last step
            assert (role == schedule.WHOLE.value) == (k_first == 0)
            stores[tile] += 1
    assert (covered == 1).all() and (stores == 1).all()
    # a finishing unit's partials: exactly those of programs first .. program - 1, all for its tile,
    # each written by a unit its program runs before any wait of its own
    for u, (tile, k_first, steps, role, first) in enumerate(units):
        if role != schedule.FINAL.value:
            continue
        program = u % programs
        expected = [p for p, (t, _) in partials_of_program.items() if t == tile]
        assert sorted(expected) == list(range(first, program))
        for p in expected:
            earlier_finals = [v for v in range(p, partials_of_program[p][1], programs)
                              if units[v][3] == schedule.FINAL.value]
            assert not earlier_finals


def test_when_stream_k_runs():
    cpu = torch.device("cpu")
    for mode in ("always", "auto"):
        assert schedule.stream_k_units(264, 64, 132, mode) == 0  # two full waves
        assert schedule.stream_k_units(512, 4, 132, mode) == 0  # 4 K steps: not worth splitting
    assert schedule.stream_k_units(512, 64, 132, "always") == 396 + 264
    # auto: 4096^3 (3.88 waves: 97% busy) and 3000 x 2056 (82%) keep whole tiles on the H100;
    # 1024 x 1024 x 16384 (32 tiles of 256 K steps) and 1000 x 1096 x 4096 (40 of 64) split them
    assert schedule.stream_k_units(512, 64, 132) == 0
    assert schedule.stream_k_units(216, 64, 132) == 0
    assert schedule.stream_k_plan(32, 256, cpu, cpu_programs=132) == (132, 264)
    assert schedule.stream_k_plan(40, 64, cpu, cpu_programs=132) == (132, 264)
    assert schedule.stream_k_plan(40, 16, cpu, cpu_programs=132) == (40, 0)  # saves < 16 K steps
    assert schedule.stream_k_plan(30, 2, cpu, "always", cpu_programs=132) == (30, 0)
    assert schedule.stream_k_units(512, 64, 132, "off") == 0
    with pytest.raises(ValueError, match="auto"):
        schedule.stream_k_units(512, 64, 132, "on")


def test_stream_k_buffers_per_thread_in_the_interpreter_and_bounded():
    """Off the GPU a launch runs in its calling thread: each thread has its own workspace and flags
    (reused by its later launches), and only the last STREAM_K_BUFFER_SETS sets are kept."""
    import threading

    cpu = torch.device("cpu")
    mine = schedule.stream_k_buffers(cpu, 4, 16)
    assert schedule.stream_k_buffers(cpu, 2, 16) is mine  # room enough: the same set
    bigger = schedule.stream_k_buffers(cpu, 8, 16)
    assert bigger[0].numel() >= 8 * 16 and bigger[1].numel() >= 8 and (bigger[1] == 0).all()
    count = schedule.STREAM_K_BUFFER_SETS + 4
    sets = [None] * count
    barrier = threading.Barrier(count)

    def fetch(i):
        sets[i] = schedule.stream_k_buffers(cpu, 4, 16)
        barrier.wait()  # every thread alive at once: no thread id is reused

    threads = [threading.Thread(target=fetch, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len({id(s[1]) for s in sets}) == count and all((s[1] == 0).all() for s in sets)
    assert len(schedule._STREAM_K_BUFFERS) <= schedule.STREAM_K_BUFFER_SETS
