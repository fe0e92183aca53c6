"""The balanced tile schedule (tiles.schedule.balanced_schedule): its table holds every tile once,
each program's tiles in order, and evens out programs that round-robin leaves unequal (attention's
causal tiles); the kernels' reading of the table (program_tiles, scheduled_tile, the next id read a
tile ahead) run through the interpreter, one program after another."""
import pytest
import torch
import triton
import triton.language as tl

from tilecore.ops.attention import configs, plan
from tilecore.tiles import schedule


def _owners(table, programs, tiles):
    """Each tile's program under ``table``, checking its layout on the way."""
    table = table.tolist()
    assert table[0] == programs + 1 and table[programs] == programs + 1 + tiles
    assert len(table) == programs + 1 + tiles + 1  # the trailing entry a read-ahead may touch
    owner = [-1] * tiles
    for p in range(programs):
        mine = table[table[p]:table[p + 1]]
        assert mine == sorted(mine)  # a program walks the sequence forward
        for t in mine:
            assert owner[t] == -1, f"tile {t} twice"
            owner[t] = p
    assert -1 not in owner
    return owner


def _round_robin_loads(costs, programs):
    return torch.zeros(programs, dtype=torch.float64).index_add_(0, torch.arange(len(costs)) % programs, costs.double())


@pytest.mark.parametrize("tiles,programs", [(1000, 132), (133, 132), (5, 3), (7, 7)])
def test_every_tile_once_in_order_and_no_program_idle(tiles, programs):
    costs = torch.rand(tiles, dtype=torch.float64) * 30 + 1
    table = schedule.balanced_schedule(costs, programs)
    if table is None:  # round-robin was at least as even
        return
    owner = _owners(table, programs, tiles)
    assert len(set(owner)) == programs
    loads = schedule.schedule_loads(table, costs, programs)
    assert loads.max() - loads.min() <= costs.max()  # within about a tile of each other


def test_uniform_costs_keep_round_robin():
    assert schedule.balanced_schedule(torch.full((1000,), 3.0), 132) is None


# causal attention's forward on 132 SMs (B = 16, H = 16, groups of 16 heads), where round-robin is
# uneven under the cost model: 128-row tiles at N = 1024, three consumers' 192-row tiles at N = 2048, 4096
@pytest.mark.parametrize("n,block_m,heads", [(1024, 128, 256), (2048, 192, 256), (4096, 192, 256)])
def test_causal_attention_tiles_even_out(n, block_m, heads):
    key = ("forward", n, n, block_m, 128, heads, 16, 1, 132)
    table = plan.balanced_table(*key)
    m_blocks = triton.cdiv(n, block_m)
    blocks = schedule.head_grouped_tiles(m_blocks * heads, m_blocks, heads, 16)[1]
    # causal blocks count from the last row: block i ends at row n - i * block_m, the short one (first)
    # is a whole block from row 0
    steps = torch.clamp(triton.cdiv(torch.clamp(n - blocks * block_m, min=block_m), 128), min=1)
    assert int(steps.sum()) == heads * sum(triton.cdiv(max(n - i * block_m, block_m), 128) for i in range(m_blocks))
    costs = (steps + configs.TILE_OVERHEAD_STEPS).double()
    _owners(table, 132, len(costs))
    mean = costs.sum() / 132
    assert _round_robin_loads(costs, 132).max() / mean > 1.10  # what the launch paid before
    assert schedule.schedule_loads(table, costs, 132).max() / mean < 1.025


def test_causal_backward_tiles_cost_their_query_blocks():
    # key block j of 128 keys is seen by query blocks (of 64 rows) 2j .. 63, for each of 2 q heads
    table = plan.balanced_table("backward", 4096, 4096, 64, 128, 256, 4, 2, 132)
    assert table is not None
    _owners(table, 132, 32 * 256)


@triton.jit
def _walk(table, seen, num_tiles, SCHEDULED: tl.constexpr):
    """Every program's tiles as the Gluon template walks them (the next id read a tile ahead)."""
    first, end, step = schedule.program_tiles(num_tiles, table, SCHEDULED)
    next_id = schedule.scheduled_tile(first, table, SCHEDULED)
    for n in range(first, end, step):
        tile_id, next_id = schedule.next_tile(n, step, next_id, table, SCHEDULED)
        tl.atomic_add(seen + 2 * tile_id, 1)
        tl.store(seen + 2 * tile_id + 1, tl.program_id(0))


@pytest.mark.parametrize("scheduled", [True, False])
def test_kernels_walk_the_table(scheduled):
    tiles, programs = 40, 6
    costs = torch.arange(tiles, 0, -1, dtype=torch.float64)  # heaviest first, as causal tiles run
    table = schedule.balanced_schedule(costs, programs)
    assert table is not None
    seen = torch.zeros(tiles, 2, dtype=torch.int32)
    _walk[(programs,)](table if scheduled else None, seen, tiles, SCHEDULED=scheduled)
    assert seen[:, 0].tolist() == [1] * tiles  # every tile once
    expected = _owners(table, programs, tiles) if scheduled else [t % programs for t in range(tiles)]
    assert seen[:, 1].tolist() == expected


def test_attention_keeps_one_table_per_device_and_shape():
    key = ("forward", 1024, 1024, 128, 128, 256, 16, 1, 132)
    table = plan.causal_schedule(torch.device("cpu"), *key)
    assert table is not None and table.dtype == torch.int32
    assert plan.causal_schedule(torch.device("cpu"), *key) is table  # made once: a captured graph reads it
    # D = 128 at N = 4096 (groups of 12 heads): round-robin is already as even, so no table
    assert plan.causal_schedule(torch.device("cpu"), "forward", 4096, 4096, 128, 128, 256, 12, 1, 132) is None


@triton.jit
def _grouped_blocks(out, tiles, blocks, num_heads, head_group):
    for t in range(0, tiles):
        head, block = schedule.head_grouped_tile(t, blocks, num_heads, head_group)
        tl.store(out + 2 * t, head)
        tl.store(out + 2 * t + 1, block)


@pytest.mark.parametrize("blocks,num_heads,head_group", [(8, 256, 16), (22, 256, 12), (5, 7, 3), (32, 12, 12)])
def test_host_twin_of_the_kernels_tile_order(blocks, num_heads, head_group):
    tiles = blocks * num_heads
    out = torch.full((tiles, 2), -1, dtype=torch.int32)
    _grouped_blocks[(1,)](out, tiles, blocks, num_heads, head_group)
    assert sorted(map(tuple, out.tolist())) == [(h, b) for h in range(num_heads) for b in range(blocks)]
    # the host twin gives each tile the head and block the kernels give it
    heads, blocks_of = schedule.head_grouped_tiles(tiles, blocks, num_heads, head_group)
    assert out[:, 0].tolist() == heads.tolist() and out[:, 1].tolist() == blocks_of.tolist()


def test_dealt_schedule_deals_units_round_robin_in_order():
    table = schedule.dealt_schedule([[0, 7], [1, 6], [2, 5], [3], [4]], 2)
    offsets, ids = table[:3].tolist(), table[3:-1].tolist()
    assert ids[offsets[0] - 3:offsets[1] - 3] == [0, 7, 2, 5, 4]
    assert ids[offsets[1] - 3:offsets[2] - 3] == [1, 6, 3]
    assert len(table) == 3 + 8 + 1 and table[-1] == 0


@pytest.mark.parametrize("n_blocks,num_bhk,head_group", [(32, 64, 4), (33, 16, 4), (1, 5, 2), (6, 7, 3)])
def test_grouped_heads_backward_pairs_heavy_and_light_key_blocks(n_blocks, num_bhk, head_group):
    """Causal backward with grouped heads: every tile once; a program runs key block j of a kv head
    right before its key block n_blocks - 1 - j, so every pair sees the same number of query
    blocks (the middle block of an odd count alone)."""
    programs = 132
    table = schedule.paired_table(n_blocks, num_bhk, head_group, programs)
    heads, blocks = schedule.head_grouped_tiles(n_blocks * num_bhk, n_blocks, num_bhk, head_group)
    ids = table[programs + 1:-1].tolist()
    assert sorted(ids) == list(range(n_blocks * num_bhk))
    for p in range(programs):
        mine = table[table[p]:table[p + 1]].tolist()
        i = 0
        while i < len(mine):
            b = blocks[mine[i]].item()
            if 2 * b == n_blocks - 1:
                i += 1
                continue
            partner = mine[i + 1]
            assert heads[partner] == heads[mine[i]] and blocks[partner].item() == n_blocks - 1 - b
            i += 2
