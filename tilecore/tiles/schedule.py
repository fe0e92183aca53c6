"""The persistent scheduler: one program per SM, looping over output tiles in a grouped order.

All of the tile-index math lives here, in one ``triton.jit`` function that both the ``tl`` kernels
and the Gluon kernels call (Gluon can call plain Triton functions that do scalar arithmetic).

Order. Tiles are numbered ``0 .. num_pid_m * num_pid_n - 1``. With ``GROUP_M = 1`` the order is
row-major: a wave of 132 programs sweeps one or two rows of tiles of C and so reads the whole of B
per wave. With ``GROUP_M = g`` the programs walk down ``g`` rows of tiles before moving right, so a
wave touches about ``sqrt(132)`` tiles of A-rows and of B-columns, which stay in L2 (ThunderKittens'
"L2-aware" block order; the paper reports 805 vs 392 TFLOP/s at 16384^3).

Stream-K tail. When the tiles do not fill the last wave (T tiles over P programs leave R = T mod P
of them), the whole-tile loop idles P - R programs for a tile's time: 3% of a 4096^3 GEMM on 132
SMs (512 tiles, 3.88 waves). With ``stream_k_work`` the first T - R tiles stay whole (an equal
number per program) and the K steps of the last R are spread evenly over all P programs (Osama et
al., "Stream-K"); on the H100 that pays only where whole tiles would leave most SMs idle, not for
4096^3's 88%-full last wave (``stream_k_units``, notes/gemm/README.md v5). A program's share then covers
the end of one tile and the start of the next: the start goes first and is written as a float32
partial (then a flag is raised); the end, which holds its tile's last K step, waits for the flags
of the tile's earlier shares, adds their partials and stores the tile. Every wait is for a share
its program does before any waiting of its own, so no program waits in a chain, and none waits on
a higher-numbered program (so the interpreter, which runs programs one after another, runs it too).

Balanced order. Where tiles differ in cost (causal attention: a query block sees as many key blocks
as its position), dealing them out round-robin can leave one program with far more work than the
mean: 11-40% more in the worst cases of attention's causal tiles, which a persistent grid pays in
full (the launch ends with its slowest program). ``balanced_schedule`` deals the same sequence in
rounds of one tile per program instead, each round's costliest tile to the program with the least
work so far under a cost model, so the programs still walk the sequence together (keeping its L2
grouping) and end within about one tile of each other. The kernel reads its tiles from the table it
returns (``program_tiles``, ``scheduled_tile``).
"""
from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict

import torch
import triton
import triton.language as tl

from tilecore import dispatch
from tilecore.tiles import launch


@triton.jit
def grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of tile ``tile_id`` in the grouped order (``GROUP_M = 1``: row-major)."""
    width = GROUP_M * num_pid_n
    group = tile_id // width
    first_m = group * GROUP_M
    size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    local = tile_id % width
    pid_m = first_m + local % size_m
    pid_n = local // size_m
    return pid_m, pid_n


@triton.jit
def tile_origin(tile_id, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Element offsets (off_m, off_n) of the C tile numbered ``tile_id``."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
    return pid_m * BLOCK_M, pid_n * BLOCK_N


# stream_k_work's roles for a unit of work
WHOLE: tl.constexpr = tl.constexpr(0)  # a whole tile: compute and store
PARTIAL: tl.constexpr = tl.constexpr(1)  # part of a tile, not its end: write a partial, raise its flag
FINAL: tl.constexpr = tl.constexpr(2)  # the end of a tile: add the earlier shares' partials, then store
NOTHING: tl.constexpr = tl.constexpr(3)  # an empty share
STREAM_K_MIN_STEPS: tl.constexpr = tl.constexpr(4)  # no share of fewer K steps (partials cost a tile's write and read)
STREAM_K_MIN_TILE_STEPS = 8  # tiles of fewer K steps stay whole
STREAM_K_MAX_BUSY = 0.8  # "auto": stream-K only where whole tiles keep fewer SMs busy on average
STREAM_K_MIN_SAVED = 16  # "auto": ... and a program's share is at least this many K steps below a tile's


@triton.jit
def stream_k_work(unit, num_tiles, k_iters, num_programs, STREAM_K: tl.constexpr):
    """The work of unit ``unit`` of a persistent loop (program p runs units p, p + P, ...):
    (tile_id, first K step, K steps, role, first program with a share of the tile).

    Without STREAM_K a unit is a tile. With it there are ``stream_k_units`` units: the T - R whole
    tiles, then two per program (its shares of the last R tiles, the later one first)."""
    tile = unit
    k_first = unit * 0
    steps = k_iters
    role = unit * 0 + WHOLE
    first_program = unit * 0
    if STREAM_K:
        rest = num_tiles % num_programs
        whole = num_tiles - rest
        if unit >= whole:
            total = rest * k_iters
            share = tl.maximum(tl.cdiv(total, num_programs), STREAM_K_MIN_STEPS)
            v = unit - whole
            program = v % num_programs
            begin = tl.minimum(program * share, total)
            end = tl.minimum(begin + share, total)
            split = tl.minimum((begin // k_iters + 1) * k_iters, end)  # where the first tile ends
            if v < num_programs:  # the start of the next tile (runs first: a partial, or nothing)
                local = begin // k_iters + 1
                lo = split
                hi = end
            else:  # the end of the first tile (or a middle part of it)
                local = begin // k_iters
                lo = begin
                hi = split
            tile = whole + local
            k_first = lo - local * k_iters
            steps = hi - lo
            first_program = (local * k_iters) // share
            if steps == 0:
                role = NOTHING
                tile = whole  # a real tile, so the tile-index math stays in range
            elif k_first + steps < k_iters:
                role = PARTIAL
            elif k_first > 0:
                role = FINAL
    return tile, k_first, steps, role, first_program


@triton.jit
def publish_partial(acc, workspace, flags, slot):
    """Stream-K: write a float32 partial tile to workspace slot ``slot`` and raise the slot's flag
    (release: the partial is visible to whoever sees the flag)."""
    BM: tl.constexpr = acc.shape[0]
    BN: tl.constexpr = acc.shape[1]
    offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    tl.store(workspace + slot * (BM * BN) + offs, acc)
    tl.debug_barrier()  # every thread's part is written before the flag goes up
    tl.atomic_xchg(flags + slot, 1, sem="release", scope="gpu")


@triton.jit
def add_partials(acc, workspace, flags, first_slot, end_slot, slot_step):
    """Stream-K: add the partials of slots first_slot, first_slot + slot_step, ... < end_slot to
    ``acc``, each once its flag is up (acquire); then lower the flags for the next launch."""
    BM: tl.constexpr = acc.shape[0]
    BN: tl.constexpr = acc.shape[1]
    offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    for slot in range(first_slot, end_slot, slot_step):
        while tl.atomic_add(flags + slot, 0, sem="acquire", scope="gpu") == 0:
            pass
        acc += tl.load(workspace + slot * (BM * BN) + offs, cache_modifier=".cg")
    tl.debug_barrier()  # every thread has seen every flag before one is lowered
    for slot in range(first_slot, end_slot, slot_step):
        tl.atomic_xchg(flags + slot, 0, sem="relaxed", scope="gpu")
    return acc


def stream_k_units(tiles: int, k_iters: int, programs: int, mode: str = "auto") -> int:
    """Units of work for ``stream_k_work`` with STREAM_K, or 0 for whole tiles.

    ``mode="always"``: stream-K wherever the last wave is partial (and tiles have at least
    STREAM_K_MIN_TILE_STEPS K steps). ``"auto"``: only where it pays on the H100 (notes/gemm/README.md,
    v5): the whole-tile waves keep less than STREAM_K_MAX_BUSY of the SMs busy and the last wave's
    share saves at least STREAM_K_MIN_SAVED K steps. A partial costs a tile's write and read at
    L2 speed (3-5 us), more than a tail wave of 88% full SMs loses, so 4096^3 and 8192^3 keep whole
    tiles; few tiles with long K (1024 x 1024 x 16384: 32 tiles) gain 1.6x. ``"off"``: never."""
    rest = tiles % programs
    if mode == "off" or rest == 0 or k_iters < STREAM_K_MIN_TILE_STEPS:
        return 0
    if mode == "auto":
        waves = -(-tiles // programs)
        share = max(-(-rest * k_iters // programs), STREAM_K_MIN_STEPS.value)
        if tiles / (waves * programs) >= STREAM_K_MAX_BUSY or k_iters - share < STREAM_K_MIN_SAVED:
            return 0
    elif mode != "always":
        raise ValueError(f"stream-K mode must be 'auto', 'always' or 'off'; got {mode!r}")
    return tiles - rest + 2 * programs


def stream_k_plan(tiles: int, k_iters: int, device: torch.device, mode: str = "auto", *,
                  cpu_programs: int = 3) -> tuple[int, int]:
    """(programs, stream-K units or 0) for a persistent launch: one program per SM, over units of
    ``stream_k_units`` (then every SM runs one), or over whole tiles (never more programs than tiles)."""
    sms = _programs_per_launch(device, cpu_programs)
    units = stream_k_units(tiles, k_iters, sms, mode)
    return (sms, units) if units else (persistent_programs(tiles, device, cpu_programs=cpu_programs), 0)


# float32 partial tiles and flags, one set per (device, stream) on a GPU and per (device, thread) in the
# interpreter (launch.stream_key): flags are all zero between launches (each finishing share lowers the
# flags it waited on), so the launches of one stream (or thread), which run one after another, reuse
# them; two streams running at once each get their own. A stream-K launch waits on its own flags, so
# two launches must never share a set at once: on a GPU a stream runs its launches in turn; the
# interpreter runs a launch in the calling thread, one launch at a time (launch.serialize_interpreter).
# The last STREAM_K_BUFFER_SETS sets are kept (a server that makes streams or threads as it goes);
# one dropped while a launch still runs stays alive in that launch (on a GPU, the caching allocator
# hands its memory out again only in that stream's order).
STREAM_K_BUFFER_SETS = 16
_STREAM_K_BUFFERS = launch.LRU(STREAM_K_BUFFER_SETS)
_PLACEHOLDERS: dict = {}  # per device: what whole-tile launches pass for the workspace and flags


def stream_k_buffers(device: torch.device, slots: int, slot_elems: int):
    """(workspace, flags) with room for ``slots`` partials of ``slot_elems`` float32 each.

    Eager launches reuse one set per (device, stream) on a GPU, per (device, thread) in the
    interpreter. A launch being captured into a CUDA graph gets a set of its own, zeroed by the graph
    itself (its memset is a node of the graph), so that replays, on whatever stream, never share flags
    with anything else."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return (torch.empty(slots * slot_elems, dtype=torch.float32, device=device),
                torch.zeros(slots, dtype=torch.int32, device=device))
    key = launch.stream_key(device)
    have = _STREAM_K_BUFFERS.get(key)
    if have is None or have[0].numel() < slots * slot_elems or have[1].numel() < slots:
        # no lock: two threads on one stream that fill at once each launch with the set they made
        # (zeroed in the stream's order, before their launches, which the stream runs in turn)
        size = max(slots * slot_elems, 0 if have is None else have[0].numel())
        have = (torch.empty(size, dtype=torch.float32, device=device),
                torch.zeros(max(slots, 0 if have is None else have[1].numel()), dtype=torch.int32, device=device))
        _STREAM_K_BUFFERS.put(key, have)
    return have


def stream_k_launch(tiles: int, k_iters: int, device: torch.device, slot_elems: int, consumers: int = 1,
                    mode: str = "auto"):
    """(programs, units, workspace, flags) of a persistent launch over ``tiles`` tiles of ``k_iters``
    K steps (``mode`` as in ``stream_k_units``); units = 0 means whole tiles only (one unit per tile;
    workspace and flags are then placeholders of the right types). ``consumers``: partials per
    program (each consumer partition of a Gluon kernel writes its own)."""
    programs, units = stream_k_plan(tiles, k_iters, device, mode)
    if units:
        workspace, flags = stream_k_buffers(device, programs * consumers, slot_elems)
        return programs, units, workspace, flags
    placeholder = _PLACEHOLDERS.get(device)
    if placeholder is None:  # one per device; setdefault: two threads at once keep the same one
        placeholder = _PLACEHOLDERS.setdefault(device, (torch.empty(1, dtype=torch.float32, device=device),
                                                        torch.zeros(1, dtype=torch.int32, device=device)))
    return programs, 0, placeholder[0], placeholder[1]


def num_tiles(M: int, N: int, block_m: int, block_n: int) -> int:
    return triton.cdiv(M, block_m) * triton.cdiv(N, block_n)


def persistent_programs(tiles: int, device: torch.device, *, cpu_programs: int = 3) -> int:
    """Programs to launch: one per SM (never more than there are tiles).

    On the CPU (the interpreter) a few programs, so the loop over tiles is still exercised.
    """
    return max(1, min(tiles, _programs_per_launch(device, cpu_programs)))


def _programs_per_launch(device: torch.device, cpu_programs: int) -> int:
    """One program per SM; on the CPU (the interpreter) ``cpu_programs``."""
    return dispatch.num_sms(device) if device.type == "cuda" else cpu_programs


def balanced_schedule(costs: torch.Tensor, programs: int) -> torch.Tensor | None:
    """A static schedule of tiles 0 .. T - 1 (``costs``: a 1-D tensor, any unit) over ``programs``
    persistent programs, dealt in rounds of ``programs`` tiles in order: within a round the costliest
    tile goes to the program with the least work so far, the next to the next, and so on. Every
    program runs one tile of each round, so the programs walk the sequence together (keeping its L2
    grouping), and the programs end within about one tile's cost of each other. None where plain
    round-robin (tile t to program t mod P, the kernels' order without a table) is at least as
    balanced.

    Returned as one int32 table on the CPU: ``programs + 1`` offsets into the table itself, then the
    tile ids grouped by program, each program's in increasing order, then one unused entry (a
    program reads its next tile id a tile ahead); program p runs ``table[table[p]:table[p + 1]]``.
    No program is empty when there are at least as many tiles as programs."""
    if programs < 1:
        raise ValueError(f"programs must be >= 1, got {programs}")
    costs = costs.to(torch.float64).flatten()
    owner = torch.empty(costs.numel(), dtype=torch.int64)
    loads = torch.zeros(programs, dtype=torch.float64)
    for start in range(0, costs.numel(), programs):
        chunk = costs[start:start + programs]
        tiles = torch.argsort(chunk, descending=True, stable=True)
        takers = torch.argsort(loads, stable=True)[:chunk.numel()]
        owner[start + tiles] = takers
        loads[takers] += chunk[tiles]
    round_robin = torch.arange(costs.numel()) % programs
    if torch.zeros(programs, dtype=torch.float64).index_add_(0, round_robin, costs).max() <= loads.max():
        return None
    by_program = torch.argsort(owner, stable=True)  # tile ids grouped by program, each group increasing
    return _schedule_table(torch.bincount(owner, minlength=programs), by_program)


def _schedule_table(counts: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The schedule table (see balanced_schedule) of ``ids``, the tile ids grouped by program in
    running order, program p's ``counts[p]`` of them."""
    programs = counts.numel()
    offsets = programs + 1 + torch.cumsum(counts, 0)
    head = torch.cat([torch.tensor([programs + 1]), offsets])
    return torch.cat([head, ids.to(torch.int64), torch.zeros(1, dtype=torch.int64)]).to(torch.int32)


def dealt_schedule(units: list[list[int]], programs: int) -> torch.Tensor:
    """A static schedule (balanced_schedule's table) that deals ``units``, short sequences of tile
    ids that one program runs one after another, round-robin: unit u to program u mod ``programs``,
    each program running its units in order. For units of equal cost built so that programs running
    them side by side stay in step (attention's backward with grouped heads pairs a heavy causal key
    block with a light one)."""
    if programs < 1:
        raise ValueError(f"programs must be >= 1, got {programs}")
    by_program = [[] for _ in range(programs)]
    for u, unit in enumerate(units):
        by_program[u % programs].extend(unit)
    return _schedule_table(torch.tensor([len(ids) for ids in by_program], dtype=torch.int64),
                           torch.tensor([t for ids in by_program for t in ids], dtype=torch.int64))


@triton.jit
def head_grouped_tile(tile_id, blocks, num_heads, head_group):
    """(head, block) of a persistent program's tile_id when tiles run head group by head group
    (``head_group`` heads whose shared operands stay in L2 together) and, within a group, block by
    block across its heads (attention's forward: query blocks; backward: key blocks)."""
    per_group = head_group * blocks
    first = (tile_id // per_group) * head_group
    heads = tl.minimum(head_group, num_heads - first)
    local = tile_id % per_group
    return first + local % heads, local // heads


@triton.jit
def program_tiles(num_tiles, schedule, SCHEDULED: tl.constexpr):
    """This program's tiles, as range(first, end, step) over n with tile id ``scheduled_tile(n)``:
    round-robin (tiles pid, pid + P, ... below ``num_tiles``), or, SCHEDULED, its share of a
    ``balanced_schedule`` table made for this grid."""
    if SCHEDULED:
        first = tl.load(schedule + tl.program_id(0))
        end = tl.load(schedule + tl.program_id(0) + 1)
        step = end * 0 + 1
    else:
        first = tl.program_id(0)
        end = num_tiles
        step = tl.num_programs(0)
    return first, end, step


@triton.jit
def scheduled_tile(n, schedule, SCHEDULED: tl.constexpr):
    """The tile id of a program's entry n (see ``program_tiles``); n may be one past the program's
    last (the table's trailing entry), so that a loop can read the next tile id a tile ahead."""
    if SCHEDULED:
        tile_id = tl.load(schedule + n)
    else:
        tile_id = n
    return tile_id


@triton.jit
def next_tile(n, step, next_id, schedule, SCHEDULED: tl.constexpr):
    """(tile id of entry n, the tile id to pass back for entry n + step): the loop over
    ``program_tiles`` starts with ``next_id = scheduled_tile(first, ...)``; with a table, each entry's
    successor is read a tile ahead (its latency off the critical path), round-robin it is n itself."""
    if SCHEDULED:
        tile_id = next_id
        next_id = scheduled_tile(n + step, schedule, SCHEDULED)
    else:
        tile_id = n
    return tile_id, next_id


def schedule_loads(table: torch.Tensor, costs: torch.Tensor, programs: int) -> torch.Tensor:
    """Each program's total cost under a ``balanced_schedule`` table (for tests and the notes)."""
    table = table.tolist()
    return torch.stack([costs[table[table[p]:table[p + 1]]].sum() for p in range(programs)])


def head_grouped_tiles(tiles: int, blocks: int, num_heads: int, head_group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(head, block) of every tile id in ``head_grouped_tile``'s order (its host twin)."""
    tile_id = torch.arange(tiles)
    per_group = head_group * blocks
    first = (tile_id // per_group) * head_group
    heads = torch.clamp(num_heads - first, max=head_group)
    local = tile_id % per_group
    return first + local % heads, local // heads


def causal_steps(query_tiles: bool, N: int, Nk: int, block_m: int, block_n: int, num_heads: int, head_group: int,
                 steps_per_block: int = 1) -> torch.Tensor:
    """The steps of every tile of a causal persistent launch over ``num_heads`` heads, in head_grouped_tile's order
    (query i sees keys up to i + Nk - N). ``query_tiles``: tiles of ``block_m`` query rows, query blocks counted from
    the last (the costliest first), a step per ``block_n`` keys up to the tile's diagonal (at least one); else tiles
    of ``block_n`` keys, a step per ``block_m`` query rows that see them, ``steps_per_block`` times."""
    if query_tiles:
        m_blocks = triton.cdiv(N, block_m)
        mb = head_grouped_tiles(m_blocks * num_heads, m_blocks, num_heads, head_group)[1]
        start = torch.clamp(N - (mb + 1) * block_m, min=0)
        last_key = torch.clamp(start + block_m + Nk - N, min=0, max=Nk)
        return torch.clamp(triton.cdiv(last_key, block_n), min=1)
    n_blocks = triton.cdiv(Nk, block_n)
    kb = head_grouped_tiles(n_blocks * num_heads, n_blocks, num_heads, head_group)[1]
    first_mb = torch.clamp(kb * block_n - (Nk - N), min=0) // block_m
    return torch.clamp(triton.cdiv(N, block_m) - first_mb, min=0) * steps_per_block


@functools.lru_cache(maxsize=64)
def paired_table(n_blocks: int, num_heads: int, head_group: int, programs: int) -> torch.Tensor:
    """A causal schedule over key blocks with grouped heads: each program runs key block j of a head and then its key
    block n_blocks - 1 - j (the tile ids of head_grouped_tile's order), pairs dealt round-robin in that order. A pair
    sees as many query blocks as any other, so the programs stay in step, and a kernel that walks the first key block
    of a pair from the last query block down and the second from its first up keeps every tile of a head at the same
    query block: between them they use a few blocks of the group's rows, which L2 keeps."""
    tiles = n_blocks * num_heads
    head, block = (x.tolist() for x in head_grouped_tiles(tiles, n_blocks, num_heads, head_group))
    tile_of = {(h, b): t for t, (h, b) in enumerate(zip(head, block))}
    units = []
    for t in range(tiles):  # in tile order; a pair starts at its first key block
        h, b = head[t], block[t]
        if 2 * b < n_blocks - 1:
            units.append([t, tile_of[h, n_blocks - 1 - b]])
        elif 2 * b == n_blocks - 1:
            units.append([t])
    return dealt_schedule(units, programs)


class ScheduleNotOnDevice(RuntimeError):
    """A launch captured into a CUDA graph needs a schedule table that is not on the device (a copy from the host
    cannot be captured): the call must run once before its capture. Raised rather than launching round-robin in the
    table's place, which would run (and time) another schedule than the plan's."""


class DeviceTables:
    """Schedule tables (built on the host) on their devices, by key: the ``kept`` used last, so a server seeing many
    shapes does not grow without bound. A table handed out while a CUDA graph is captured is kept for good (the graph
    reads it at every replay). One copy per contents on a device while anything holds it: a key made under other
    switches with the same contents takes that copy, which a capture, unable to copy a table, depends on."""

    def __init__(self):
        self.used: OrderedDict = OrderedDict()  # key -> table on the device, least recently used first
        self.captured: dict = {}
        self.uploaded: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # (device, int32 bytes) -> copy
        self.lock = threading.Lock()  # threads share the tables: a lookup and its eviction are one step

    def get(self, device: torch.device, key, build, args: tuple, kept: int) -> torch.Tensor | None:
        """``build(*args)`` on ``device`` (None: round-robin), made once while ``key`` is among the ``kept`` used
        last and uploaded once per contents; ScheduleNotOnDevice while a CUDA graph is captured and the contents are
        not on the device yet."""
        capturing = dispatch.capturing(device)
        with self.lock:
            if key in self.captured:
                return self.captured[key]
            if key in self.used:
                self.used.move_to_end(key)
                table = self.used[key]
            else:
                table = build(*args)
                if table is not None:
                    contents = (device, table.numpy().tobytes())
                    on_device = self.uploaded.get(contents)
                    if on_device is None:
                        if capturing:
                            raise ScheduleNotOnDevice(
                                f"the schedule table {getattr(build, '__name__', build)}{args} is not on {device} and "
                                f"a copy to the device cannot be captured into a CUDA graph: run this call once (same "
                                f"shapes and switches) before capturing it")
                        on_device = self.uploaded[contents] = table.to(device)
                    table = on_device
                self.used[key] = table
                while len(self.used) > kept:
                    self.used.popitem(last=False)
            if capturing and table is not None:  # kept for good: the graph reads it at every replay
                self.captured[key] = self.used.pop(key)
            return table
