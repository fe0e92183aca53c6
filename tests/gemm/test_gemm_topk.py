"""The GEMM's Gluon rows from the napkin's top-k, timed (issue 36 part 4; configs.NAPKIN_TOPK): the
candidates are the napkin's ranking of the rows the kernel takes plus the table's, the same list on
every machine; the plan times them once a (shape bucket, dtypes, operand form, device), picks the
fastest. Anywhere no CUDA device can time (a meta device in dispatch.pretend, CPU tensors planned as
a GPU's, a graph capture, launch.py not imported) it plans the table's row, so those plans are the same
with the switch on or off. The GPU run of the pick: experiments/napkin/gpu_topk_configs.py."""
import math

import pytest
import torch

from tilecore import dispatch
from tilecore.napkin.engine import rank_gemm_configs
from tilecore.ops.gemm import configs, launch, plan
from tilecore.tiles import timed as runners
from tilecore.tiles.switches import generation, patched

H100 = dispatch.TARGETS["sm_90a"]
BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn


def napkin_key(r):
    return (*r["block"], r["stages"], r["num_warps"] // 4)


@pytest.mark.parametrize("shape", [(8192, 8192, 8192), (64, 8192, 8192), (4096, 4096, 256), (8192, 4096, 14336)])
@pytest.mark.parametrize("dtype", [BF16, FP8])
def test_candidates_are_the_napkins_top_k_of_legal_rows_then_the_table(shape, dtype):
    rows = plan.napkin_configs(*shape, dtype, BF16, 4)
    table = plan.table_config(shape[2], dtype == FP8)
    assert rows == plan.napkin_configs(*shape, dtype, BF16, 4)  # deterministic
    assert all(plan.gluon_legal(r, dtype.itemsize, 2) is None for r in rows)
    assert rows[-1] == table or table in rows[:4]
    top = rows[:4] if len(rows) == 4 else rows[:-1]
    assert len(top) == 4
    # in the napkin's order: its predicted times do not decrease
    predicted = {(*c.block, c.stages, c.warpgroups): c.time
                 for c in rank_gemm_configs(*shape, "fp8" if dtype == FP8 else "bf16", "h100",
                                            candidates=[napkin_key(r) for r in top])}
    times = [predicted[napkin_key(r)] for r in top]
    assert times == sorted(times)
    # and they are its best of every legal row: none left out predicts faster than the k-th
    legal = [plan.gluon_row(*c) for c in configs.GLUON_CANDIDATES]
    legal = [r for r in legal if plan.gluon_legal(r, dtype.itemsize, 2) is None]
    every = rank_gemm_configs(*shape, "fp8" if dtype == FP8 else "bf16", "h100",
                              candidates=list(dict.fromkeys(map(napkin_key, legal))))
    assert min(c.time for c in every) == times[0] and times[-1] <= sorted(c.time for c in every)[len(top) - 1] * 1.0001


def test_no_candidates_leaves_the_table():
    assert plan.napkin_configs(4096, 4096, 4096, BF16, BF16, 0) == [configs.GLUON_BF16]
    assert plan.napkin_configs(4096, 4096, 128, BF16, BF16, 0) == [configs.GLUON_BF16_SMALL_K]
    assert plan.napkin_configs(4096, 4096, 4096, FP8, BF16, 0) == [configs.GLUON_FP8]


@pytest.mark.parametrize("row,operand,out,why", [
    ((128, 256, 128, 3, 2, 8), 2, 2, "swizzle"),         # bf16's K box: 256 bytes
    ((128, 256, 64, 4, 2, 8), 2, 2, "shared memory"),    # 4 stages + a 64 KiB epilogue: 257 KiB
    ((128, 256, 64, 3, 1, 4), 2, 2, "registers"),        # a 128 x 256 accumulator over 4 warps: 256 a thread
    ((512, 128, 64, 2, 2, 8), 2, 2, "TMA box"),
    ((64, 128, 64, 3, 1, 8), 2, 2, "warpgroups"),        # 8 warps need 128 rows
])
def test_gluon_legal_names_what_the_kernel_cannot_take(row, operand, out, why):
    assert why in plan.gluon_legal(plan.gluon_row(*row), operand, out)


def test_every_shipped_table_row_is_legal_and_a_candidate():
    cands = [plan.gluon_row(*c) for c in configs.GLUON_CANDIDATES]
    for row, operand in ((configs.GLUON_BF16, 2), (configs.GLUON_BF16_SMALL_K, 2), (configs.GLUON_FP8, 1)):
        assert plan.gluon_legal(row, operand, 2) is None and plan.gluon_legal(row, operand, 4) is None
        assert row in cands


@pytest.mark.parametrize("topk", [0, 4])
def test_a_meta_gpu_plans_the_table_with_the_switch_on_or_off(monkeypatch, topk):
    monkeypatch.setattr(launch, "time_plans", lambda *args, **kw: pytest.fail("a meta device is never timed"))
    monkeypatch.setattr(configs, "NAPKIN_TOPK", topk)
    a = torch.empty(8192, 8192, dtype=BF16, device="meta")
    skinny = torch.empty(64, 8192, dtype=BF16, device="meta")
    small_k = torch.empty(8192, 128, dtype=BF16, device="meta")
    a8 = torch.empty(256, 8192, dtype=FP8, device="meta")
    b8 = torch.empty(8192, 8192, dtype=FP8, device="meta").t().contiguous().t()
    ones = torch.ones(1, device="meta")
    with dispatch.pretend(H100):
        assert plan.plan(a, a, out_dtype=BF16).config is configs.GLUON_BF16
        p = plan.plan(skinny, a, out_dtype=BF16)  # the napkin's first row here is 64x128: never on meta
        assert p.path == "gluon" and p.config is configs.GLUON_BF16
        assert plan.plan(small_k, a[:128], out_dtype=BF16).config is configs.GLUON_BF16_SMALL_K
        assert plan.plan(a8, b8, out_dtype=BF16, scales=(ones, ones)).config is configs.GLUON_FP8
    assert p.grid[0] >= 1 and p.units >= math.ceil(64 / p.config["block"][0]) * math.ceil(8192 / p.config["block"][1])
    assert len(plan._PICKS) == 0  # nothing kept either


def test_interpreter_plans_ignore_the_switch(monkeypatch):
    monkeypatch.setattr(configs, "NAPKIN_TOPK", 4)
    monkeypatch.setattr(launch, "time_plans", lambda *args, **kw: pytest.fail("the interpreter is never timed"))
    a = torch.randn(48, 40, dtype=BF16)
    p = plan.plan(a, a.t().contiguous(), out_dtype=BF16)
    assert p.path == "tl" and p.config == configs.TL_CPU


class FakeTimer:
    """launch.time_plans standing in for the GPU: ms by a row's block, inf where listed as failing."""

    def __init__(self, ms: dict):
        self.ms = ms
        self.calls = []
        self.clocks = []

    def __call__(self, plans, a, b, bias=None, scales=None, rep_ms=20.0, clock="do_bench"):
        self.calls.append([p.config["block"] for p in plans])
        self.clocks.append(clock)
        return [self.ms.get(p.config["block"], 1.0) for p in plans]


def timed(monkeypatch, timer, M=256, N=512, K=1024, capturing=False, dtype=BF16, scales=None):
    """plan.timed_config on CPU tensors taken as a GPU's (plan._timeable; the timing is faked)."""
    a = torch.randn(M, K).to(dtype)
    b = torch.randn(K, N).to(dtype)
    monkeypatch.setattr(launch, "time_plans", timer)
    monkeypatch.setattr(plan, "_timeable", lambda device: True)
    monkeypatch.setattr(plan, "napkin_gpu", lambda device: "h100")
    monkeypatch.setattr(dispatch, "capturing", lambda device: capturing)
    monkeypatch.setattr(plan, "_schedule", lambda a, M, N, K, cfg: dict(grid=(1,), units=1, stream_k=False))
    form = (False, scales is not None, False)
    return plan.timed_config(a, b, BF16, None, scales, form, 4)


@pytest.fixture(autouse=True)
def fresh_picks(monkeypatch):
    monkeypatch.setattr(plan, "_PICKS", plan.LRU(256))


def test_timed_pick_takes_the_fastest_candidate_once_a_bucket(monkeypatch):
    rows = plan.napkin_configs(256, 512, 1024, BF16, BF16, 4)
    slow_first = {r["block"]: 2.0 for r in rows}
    fastest = rows[2]["block"]
    slow_first[fastest] = 0.5
    timer = FakeTimer(slow_first)
    cfg, times = timed(monkeypatch, timer)
    assert cfg["block"] == fastest and timer.calls == [[r["block"] for r in rows]]
    assert times[2] == 0.5 and len(times) == len(rows)
    # the same bucket (sizes rounded up to powers of two) reuses the pick; another bucket times again
    again, _ = timed(monkeypatch, timer, M=200, N=500, K=1000)
    assert again == cfg and len(timer.calls) == 1
    timed(monkeypatch, timer, M=4096)
    assert len(timer.calls) == 2


def test_failed_candidates_are_left_out_and_all_failed_leaves_the_table(monkeypatch):
    rows = plan.napkin_configs(256, 512, 1024, BF16, BF16, 4)
    cfg, _ = timed(monkeypatch, FakeTimer({rows[0]["block"]: math.inf, rows[1]["block"]: 0.1}))
    assert cfg["block"] == rows[1]["block"]
    monkeypatch.setattr(plan, "_PICKS", plan.LRU(256))
    cfg, _ = timed(monkeypatch, FakeTimer({r["block"]: math.inf for r in rows}))
    assert cfg == plan.table_config(1024, False)


def test_nothing_is_timed_or_kept_while_a_graph_captures(monkeypatch):
    timer = FakeTimer({})
    cfg, times = timed(monkeypatch, timer, capturing=True)
    assert cfg == configs.GLUON_BF16 and times == {} and timer.calls == [] and len(plan._PICKS) == 0


def test_the_pick_is_keyed_by_bucket_dtypes_form_and_device(monkeypatch):
    timer = FakeTimer({})
    timed(monkeypatch, timer)
    (key,) = [k for k in plan._PICKS._data]
    assert key == ((256, 512, 1024), BF16, BF16, False, 0, (False, False, False), torch.device("cpu"), generation())
    timed(monkeypatch, timer, dtype=torch.float16)  # another dtype: timed again
    assert len(timer.calls) == 2


def test_a_patched_block_times_its_own_pick(monkeypatch):
    """The pick reads configs (the candidates, NAPKIN_TIMED_MS, the clock): a probe's tiles.switches.patched block
    times its own (the memo keys on tiles.switches.generation), and the shipped pick is timed again after it."""
    timer = FakeTimer({})
    timed(monkeypatch, timer)
    timed(monkeypatch, timer)
    assert len(timer.calls) == 1
    with patched(configs, NAPKIN_TIMED_MS=configs.NAPKIN_TIMED_MS / 2):
        timed(monkeypatch, timer)
        timed(monkeypatch, timer)
        assert len(timer.calls) == 2
    timed(monkeypatch, timer)
    assert len(timer.calls) == 3


def test_launch_registers_the_timer_and_without_it_the_table_is_planned(monkeypatch):
    # plan.py never imports launch.py (no import loop): launch registers launch.time_plans in tiles.timed
    assert runners.runner(plan.TIMER) is not None
    monkeypatch.setattr(runners, "_RUNNERS", {})
    monkeypatch.setattr(plan, "_timeable", lambda device: True)
    monkeypatch.setattr(plan, "napkin_gpu", lambda device: "h100")
    monkeypatch.setattr(dispatch, "capturing", lambda device: False)
    a = torch.randn(256, 1024).to(BF16)
    assert plan.timed_config(a, a.t(), BF16, None, None, (False, False, False), 4) == (configs.GLUON_BF16, {})
    assert len(plan._PICKS) == 0  # not kept: a later call, once launch.py registers, times


@pytest.mark.parametrize("fp8_on", [False, True])
def test_fp8_takes_the_pick_only_where_its_own_switch_is_on(monkeypatch, fp8_on):
    # NAPKIN_TOPK_FP8 off: the fp8 table (session 30: the timer read host time on a 50 us fp8 GEMM)
    monkeypatch.setattr(configs, "NAPKIN_TOPK", 4)
    monkeypatch.setattr(configs, "NAPKIN_TOPK_FP8", fp8_on)
    monkeypatch.setattr(dispatch, "interpreted", lambda device: False)
    monkeypatch.setattr(dispatch, "is_hopper", lambda device: True)
    calls = []
    monkeypatch.setattr(plan, "timed_config", lambda *args: calls.append(args) or (configs.GLUON_BF16, {}))
    a8 = torch.randn(256, 512).to(FP8)
    b8 = torch.randn(384, 512).to(FP8).t()
    p = plan.plan(a8, b8, out_dtype=BF16, scales=(torch.ones(1), torch.ones(1)))
    assert len(calls) == int(fp8_on) and (p.config is configs.GLUON_BF16) == fp8_on
    if not fp8_on:
        assert p.config is configs.GLUON_FP8
    plan.plan(a8.to(BF16), b8.to(BF16), out_dtype=BF16)  # bf16 always asks the pick where NAPKIN_TOPK is on
    assert len(calls) == int(fp8_on) + 1



@pytest.mark.parametrize("fp8", [False, True])
def test_each_dtype_is_timed_by_its_own_clock(monkeypatch, fp8):
    # fp8 by the CUDA-graph clock (its do_bench read host time at M 256, session 30), bf16 by NAPKIN_CLOCK
    monkeypatch.setattr(configs, "NAPKIN_CLOCK", "do_bench")
    monkeypatch.setattr(configs, "NAPKIN_CLOCK_FP8", "graph")
    rows = plan.napkin_configs(256, 512, 1024, FP8 if fp8 else BF16, BF16, 4)
    clocks = []

    def timer(plans, a, b, bias, scales, rep_ms, clock):  # by position: the last candidate the fastest
        clocks.append(clock)
        assert [p.config for p in plans] == rows and rep_ms == configs.NAPKIN_TIMED_MS
        return [1.0 + i for i in range(len(plans) - 1)] + [0.25]

    scales = (torch.ones(1), torch.ones(1)) if fp8 else None
    cfg, times = timed(monkeypatch, timer, dtype=FP8 if fp8 else BF16, scales=scales)
    assert clocks == ["graph" if fp8 else "do_bench"]
    assert cfg == rows[-1] and times[len(rows) - 1] == 0.25


class FakeCuda:
    """torch.cuda's graph and event API on a fake GPU clock: a captured call adds a kernel to the graph, a
    replay advances the clock by its kernels' times (``kernel_ms`` gives one per call, in turn); the host's
    time never enters (as on a GPU, where events bound a replay)."""

    def __init__(self, kernel_ms):
        self.kernel_ms = kernel_ms  # () -> the next kernel's ms
        self.now = 0.0
        self.capturing = None
        self.replays = 0
        fake = self

        class CUDAGraph:
            def __init__(self):
                self.kernels = 0

            def replay(self):
                fake.replays += 1
                for _ in range(self.kernels):
                    fake.now += fake.kernel_ms()

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                self.t = None

            def record(self):
                self.t = fake.now

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return end.t - self.t

        self.CUDAGraph, self.Event = CUDAGraph, Event

    def graph(self, g, capture_error_mode="global"):
        import contextlib

        @contextlib.contextmanager
        def capture():
            self.capturing = g
            yield
            self.capturing = None
        return capture()

    def synchronize(self):
        pass

    def launch(self):  # what fn does: one kernel, captured into the graph being captured
        assert self.capturing is not None, "graph_ms ran fn outside its capture"
        self.capturing.kernels += 1


def test_graph_clock_is_the_median_replay_over_its_launches():
    import itertools

    # every 5th kernel slow (a replay of 8 then holds one or two): the median replay, over 8 launches
    cycle = itertools.cycle([0.10, 0.10, 0.10, 0.10, 0.50])
    cuda = FakeCuda(lambda: next(cycle))
    ms = launch.graph_ms(cuda.launch, rep_ms=5.0, launches=8, cuda=cuda)
    assert cuda.CUDAGraph is not None and cuda.capturing is None
    # the warm-up replay, the one that sizes the run, then rep_ms over a replay's ~1.1 ms: 4 timed replays
    assert cuda.replays == 2 + int(5.0 / (6 * 0.10 + 2 * 0.50))
    assert 0.10 < ms < 0.20 and ms * 8 in (pytest.approx(6 * 0.10 + 2 * 0.50), pytest.approx(7 * 0.10 + 0.50))
    # a long kernel still gets 3 timed replays; a tiny one at most 1000
    cuda = FakeCuda(lambda: 40.0)
    assert launch.graph_ms(cuda.launch, rep_ms=5.0, launches=2, cuda=cuda) == pytest.approx(40.0)
    assert cuda.replays == 2 + 3
    cuda = FakeCuda(lambda: 1e-4)
    launch.graph_ms(cuda.launch, rep_ms=5.0, launches=1, cuda=cuda)
    assert cuda.replays == 2 + 1000


def test_time_plans_graph_clock_reuses_one_output_and_fails_a_candidate_to_inf(monkeypatch):
    # CPU plans (the "cpu" or the interpreted "tl" path) through the graph clock, its graph_ms faked: each candidate is
    # launched once outside the capture, then timed on a C of its own preallocated once
    a, b = torch.randn(40, 24), torch.randn(24, 32)
    seen = []

    def fake_graph_ms(fn, rep_ms):
        outs = {id(fn()) for _ in range(3)}
        seen.append((outs, rep_ms))
        return 0.5

    monkeypatch.setattr(launch, "graph_ms", fake_graph_ms)
    good = plan.plan(a, b, out_dtype=torch.float32)
    assert good.path in ("cpu", "tl")  # tl where the tests run the interpreter
    bad = plan.Plan("gluon", torch.float32, config=dict(block=(1, 1, 1)))  # a Gluon plan cannot run on CPU
    times = launch.time_plans([good, bad, good], a, b, rep_ms=3.0, clock="graph")
    assert times == [0.5, math.inf, 0.5]
    assert [len(o) for o, _ in seen] == [1, 1] and all(r == 3.0 for _, r in seen)
    with pytest.raises(ValueError, match="clock"):
        launch.time_plans([good], a, b, clock="wall")


# ------------------------------------------------------------------ the clock "agree" (issue 36, session 34)
INF = math.inf


@pytest.mark.parametrize("by_clock, table, want", [
    ([[1.0, 0.8, 0.9], [1.0, 0.95, 0.7]], 0, 2),  # both faster by both: the least worst ratio (0.9 against 0.95)
    ([[1.0, 0.8, 0.9], [1.0, 0.85, 0.7]], 0, 1),  # ... (0.85 against 0.9)
    ([[1.0, 0.8, 0.9], [1.0, 1.05, 0.85]], 0, 2),  # 1 loses by the graph: 2 alone beats the table by both
    ([[1.0, 0.8], [1.0, 1.01]], 0, 0),  # the clocks disagree: the table
    ([[0.9, 1.0, 0.95], [0.95, 1.0, 0.9]], 1, 0),  # a tie in the worst ratio (0.95): the first
    ([[1.0, 0.5], [1.0, INF]], 0, 0),  # a candidate one clock did not time never beats the table
    ([[INF, 0.7, 0.6], [INF, 0.5, 0.9]], 0, 2),  # the table failed: the first clock's fastest
    ([[INF, INF], [INF, INF]], 0, None),  # every candidate failed
    ([[2.0, 2.0], [3.0, 3.0]], 1, 1),  # equal to the table: the table
])
def test_agreed_keeps_the_table_unless_every_clock_says_faster(by_clock, table, want):
    assert plan.agreed(by_clock, table) == want


class ClockTimer:
    """launch.time_plans standing in for the GPU with one ms table per clock (by a row: its tile, stages and
    partitions)."""

    def __init__(self, by_clock: dict):
        self.by_clock = by_clock
        self.calls = []

    def __call__(self, plans, a, b, bias=None, scales=None, rep_ms=20.0, clock="do_bench"):
        self.calls.append((clock, [row_key(p.config) for p in plans]))
        if self.by_clock[clock] is None:
            pytest.fail(f"no {clock} timing expected")
        return [self.by_clock[clock].get(row_key(p.config), 1.0) for p in plans]


def row_key(r: dict) -> tuple:
    return r["block"], r["stages"], r["consumers"], r["num_warps"]


def agree_case(monkeypatch, do_bench: dict, graph: dict):
    monkeypatch.setattr(configs, "NAPKIN_CLOCK", "agree")
    rows = plan.napkin_configs(256, 512, 1024, BF16, BF16, 4)
    table = plan.table_config(1024, False)
    keys = [row_key(r) for r in rows]
    timer = ClockTimer({"do_bench": do_bench(keys, row_key(table)), "graph": graph and graph(keys, row_key(table))})
    cfg, times = timed(monkeypatch, timer)
    return cfg, times, timer, rows, rows.index(table)


def test_agree_clock_takes_a_candidate_both_clocks_time_faster(monkeypatch):
    # candidate 0 wins by do_bench alone (operands in L2 by the graph: slower), candidate 1 by both
    def do_bench(blocks, t):
        return {blocks[0]: 0.5, blocks[1]: 0.8, t: 1.0}

    def graph(blocks, t):
        return {blocks[0]: 1.1, blocks[1]: 0.9, t: 1.0}

    cfg, times, timer, rows, table = agree_case(monkeypatch, do_bench, graph)
    assert table not in (0, 1)
    assert cfg == rows[1]
    # every candidate by do_bench, then by the graph the table first and do_bench's winners (0 and 1) only
    assert [c for c, _ in timer.calls] == ["do_bench", "graph"]
    assert timer.calls[0][1] == [row_key(r) for r in rows]
    assert timer.calls[1][1] == [row_key(rows[table]), row_key(rows[0]), row_key(rows[1])]
    assert times[0] == (0.5, 1.1) and times[1] == (0.8, 0.9) and times[table] == (1.0, 1.0)
    assert all(times[i][1] is None for i in range(len(rows)) if i not in (0, 1, table))


def test_agree_clock_keeps_the_table_where_the_clocks_disagree(monkeypatch):
    cfg, _, timer, rows, table = agree_case(monkeypatch, lambda blocks, t: {blocks[0]: 0.9, t: 1.0},
                                            lambda blocks, t: {blocks[0]: 1.02, t: 1.0})
    assert cfg == rows[table] and [c for c, _ in timer.calls] == ["do_bench", "graph"]


def test_agree_clock_times_no_graph_where_do_bench_finds_nothing_faster(monkeypatch):
    cfg, times, timer, rows, table = agree_case(monkeypatch, lambda blocks, t: {t: 0.5},
                                                None)
    assert cfg == rows[table] and [c for c, _ in timer.calls] == ["do_bench"]
    assert times[table] == (0.5, None)


def test_agree_clock_with_a_failed_table_takes_do_benchs_fastest(monkeypatch):
    cfg, _, timer, rows, table = agree_case(monkeypatch, lambda blocks, t: {t: INF, blocks[0]: 2.0, blocks[1]: 0.7},
                                            None)
    assert cfg == rows[1]
