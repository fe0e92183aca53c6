"""gluon_forward's forward with K turned inside its launch (issue 37; KTurn, plan.rotary_overlap_table): the schedule
table's order and deadlock freedom, simulated on the CPU; its plan keyed on the switches it reads; the kernel
compiled for sm_90a (the K items' TMA loads and stores, the stores' write wait, the release and acquire); on a GPU, O
against float64 and the route's bits (experiments/attention/gpu_rotary_train.py --overlap times it)."""
import json

import pytest
import torch

from tilecore.ops.attention import configs as attention_configs
from tilecore.ops.attention.plan import heads_in_l2
from tilecore.ops.attention_rotary import configs
from tilecore.ops.attention_rotary.plan import rotary_overlap_items, rotary_overlap_schedule, rotary_overlap_table
from tilecore.tiles.schedule import head_grouped_tiles
from tilecore.tiles.switches import patched
from compiled_run import compiled_json


def programs_of(table, programs):
    t = table.tolist()
    return [t[t[p]:t[p + 1]] for p in range(programs)]


def run_in_order(table, programs, tiles, per_head, kv_of_tile, stall=None):
    """Each program runs its items in the table's order, one an instant, a tile once every item of its kv head has
    run (a K item waits on nothing); ``stall``: a program that runs nothing until every other program has run all
    it can (a late one). Returns the instants taken; fails where no program can go on (a deadlock)."""
    lists = programs_of(table, programs)
    done, at, left, instants = {}, [0] * programs, sum(map(len, lists)), 0
    while left:
        moved = False
        for p in range(programs):
            if p == stall and any(at[o] < len(lists[o]) for o in range(programs) if o != stall) and moved:
                continue
            while at[p] < len(lists[p]):
                x = lists[p][at[p]]
                if x < tiles and done.get(kv_of_tile[x], 0) < per_head:
                    break
                if x >= tiles:
                    u = (x - tiles) // per_head
                    done[u] = done.get(u, 0) + 1
                at[p] += 1
                left -= 1
                moved = True
                break
        instants += 1
        assert moved, f"deadlock: programs at {at}"
    return instants


CASES = [  # (N, Nk, B, H, Hkv, causal, programs, tile rows, block_n, item steps, lead)
    (4096, 4096, 16, 16, 16, False, 132, 128, 128, 8, 264),  # the timed shape, D128 full
    (4096, 4096, 16, 16, 16, True, 132, 128, 128, 8, 264),  # causal: the balanced deal
    (4096, 4096, 16, 16, 16, True, 132, 192, 128, 4, 0),  # D64's three consumers, no lead
    (300, 700, 2, 8, 2, True, 3, 128, 128, 1, 3),  # GQA 8/2, N < Nk, a short last item
    (1000, 1000, 3, 4, 1, False, 5, 128, 64, 16, 10_000),  # MQA, every item before any tile
]


@pytest.mark.parametrize("N,Nk,B,H,Hkv,causal,P,rows,bn,steps,lead", CASES)
def test_table_runs_every_item_once_in_an_order_without_deadlock(N, Nk, B, H, Hkv, causal, P, rows, bn, steps, lead):
    group = heads_in_l2(2 * Nk * 128 * 2)
    table = rotary_overlap_table(N, Nk, B, H, Hkv, rows, bn, causal, group, P, steps, lead, 1.0, 2)
    blocks = -(-N // rows)
    tiles = blocks * B * H
    per_head = rotary_overlap_items(Nk, bn, steps)
    assert per_head == -(-Nk // (2 * bn * steps))
    assert sorted(table[P + 1:-1].tolist()) == list(range(tiles + B * Hkv * per_head))  # each once
    bh = head_grouped_tiles(tiles, blocks, B * H, group)[0]
    kv = ((bh // H) * Hkv + (bh % H) // (H // Hkv)).tolist()
    lists = programs_of(table, P)
    assert all(lists), "no program without work"
    # a program's tiles in the kernel's order (ids increasing), as the balanced deal keeps them
    assert all(t == sorted(t) for t in ([x for x in ids if x < tiles] for ids in lists))
    run_in_order(table, P, tiles, per_head, kv)
    run_in_order(table, P, tiles, per_head, kv, stall=P - 1)  # a program that starts last


def test_items_lead_their_heads_tiles():
    """With lead L, every kv head's items are dealt before the tile L tiles ahead of its first: in the round (a
    program's position in its list) no later than that of its first tile, the first heads' in the first round."""
    N, Nk, B, H, P = 4096, 4096, 4, 16, 16
    group = heads_in_l2(2 * Nk * 128 * 2)
    tiles = 32 * B * H
    bh = head_grouped_tiles(tiles, 32, B * H, group)[0].tolist()
    for lead in (0, 2 * P):
        table = rotary_overlap_table(N, Nk, B, H, H, 128, 128, False, group, P, 8, lead, 1.0, 2)
        where = {x: r for ids in programs_of(table, P) for r, x in enumerate(ids)}
        for u in range(B * H):
            first_tile = bh.index(u)
            items_round = max(where[tiles + 2 * u + part] for part in range(2))
            reached = min(where[x] for x in range(tiles) if bh[x] == u)
            assert items_round <= reached, (u, lead)
            if lead:
                ahead = [x for x in range(tiles) if x <= first_tile - lead]
                assert not ahead or items_round <= max(where[x] for x in ahead) + 1, (u, lead)


def test_plan_reads_its_switches_each_call():
    """rotary_overlap_schedule: None unless configs.ROTARY_K_OVERLAP_CASES names the case (and not for a carried
    configuration); a table keyed on every switch it reads, so a patched lead or item size is planned anew."""
    q = torch.empty(2, 4, 1024, 128, dtype=torch.bfloat16)
    k = torch.empty(2, 2, 1024, 128, dtype=torch.bfloat16)
    cfg = dict(attention_configs.GLUON_FORWARD[128])
    assert rotary_overlap_schedule(q, k, cfg, False, 4, 3) is None  # as shipped: no case
    with patched(configs, ROTARY_K_OVERLAP_CASES=frozenset({(128, False)})):
        assert rotary_overlap_schedule(q, k, dict(cfg, carry=True), False, 4, 3) is None
        assert rotary_overlap_schedule(q, k, cfg, True, 4, 3) is None  # causal not named
        assert rotary_overlap_schedule(q, k.transpose(2, 3), cfg, False, 4, 3) is None  # no TMA view of k
        table, per_head = rotary_overlap_schedule(q, k, cfg, False, 4, 3)
        assert per_head == rotary_overlap_items(1024, 128, configs.ROTARY_K_OVERLAP_ITEM_STEPS)
        with patched(configs, ROTARY_K_OVERLAP_ITEM_STEPS=1):
            table1, per_head1 = rotary_overlap_schedule(q, k, cfg, False, 4, 3)
        assert per_head1 == 4 and table1.numel() > table.numel()
        with patched(configs, ROTARY_K_OVERLAP_LEAD=0.0):
            table0, _ = rotary_overlap_schedule(q, k, cfg, False, 4, 3)
        assert table0.numel() == table.numel() and not torch.equal(table0, table)
        again, _ = rotary_overlap_schedule(q, k, cfg, False, 4, 3)
        assert torch.equal(again, table)


def test_host_path_launches_k_items(monkeypatch):
    """gluon_forward.forward where K is turned inside (the launch stubbed): k itself as the items' source, an empty
    (B, Hkv, Nk, D) buffer as the tiles' K (the kernel writes it), zeroed counters a kv head, the overlap table as the
    schedule, the items' steps as a constexpr; the training forward returns that buffer as its turned K."""
    from tilecore import dispatch
    from tilecore.ops.attention_rotary import gluon_forward

    launches = []

    class Stub:
        def run(self, key, grid, args, options):
            launches.append((key, grid, args, options))

    monkeypatch.setattr(gluon_forward, "ROTARY_FWD", Stub())
    monkeypatch.setattr(dispatch, "num_sms", lambda device: 8)
    q = torch.randn(2, 4, 300, 128, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 700, 128, dtype=torch.bfloat16) for _ in range(2))
    cos, sin = torch.randn(700, 64).cos(), torch.randn(700, 64).sin()
    with patched(configs, ROTARY_K_OVERLAP_CASES=frozenset({(128, True)})):
        gluon_forward.forward(q, k, v, cos, sin, causal=True, scale=0.1)
        *_, kr = gluon_forward.forward(q, k, v, cos, sin, causal=True, scale=0.1, keep_turned=True)
        gluon_forward.forward(q, k, v, cos, sin, causal=False, scale=0.1)  # not named: K by the pass
    (_, grid, args, options), (_, _, targs, _), (_, _, pargs, poptions) = launches
    per_head = rotary_overlap_items(700, 128, configs.ROTARY_K_OVERLAP_ITEM_STEPS)
    assert options["K_ITEM_STEPS"] == configs.ROTARY_K_OVERLAP_ITEM_STEPS and options["k_items_per_head"] == per_head
    assert options["kraw_desc"].base is k and args[1].base.shape == k.shape and args[1].base.is_contiguous()
    assert options["k_out"] is args[1].base  # the items store the turned K where the tiles' descriptor reads it
    assert torch.equal(options["k_counters"], torch.zeros(4, dtype=torch.int32))
    table = args[17]
    tiles = -(-300 // 128) * 8
    assert sorted(table[grid[0] + 1:-1].tolist()) == list(range(tiles + 4 * per_head))
    assert targs[1].base is kr  # the training forward's turned K: the buffer the items write
    assert poptions["K_ITEM_STEPS"] == 0 and poptions["kraw_desc"] is None and pargs[1].base is not k
    assert poptions["k_out"] is None


CODE = """
import json, re, sys
import torch
from tilecore.ops.attention_rotary.gluon_forward import attention_rotary_fwd_kernel, rows_at_a_time
from tilecore.tiles.compile import compile_kernel, resources
from tilecore.tiles.launch import gluon_descriptor as desc
out = []
for d, causal, cfg, r, steps in json.loads(sys.argv[1]):
    t = torch.empty(2, 4, 256, d, dtype=torch.bfloat16)
    head = lambda rows: desc(t, [1, 1, rows, d])
    cs = torch.empty(256, r, dtype=torch.bfloat16)
    args = dict(q_desc=head(cfg["block_m"]), k_desc=head(cfg["block_n"]), v_desc=head(cfg["block_n"]),
                o_desc=head(cfg["block_m"]), lse_ptr=torch.empty(8, dtype=torch.float32), cos_ptr=cs, sin_ptr=cs,
                cos_stride=r, sin_stride=r, n_max=4096, H=4, N=256, Nk=256, GROUP=1, scale_log2e=0.1, num_bh=8,
                head_group=4, schedule=torch.empty(8, dtype=torch.int32), left=0, right=0, tanh_scale=0.0,
                qr_desc=None, CAUSAL=causal, STAGES=cfg["stages"], R=r, Q_BUFFERS=cfg["q_buffers"],
                Q_REGS=cfg.get("q_regs", False), CONSUMERS=cfg.get("consumers", 2), TURN_ROWS=rows_at_a_time(r),
                K_ITEM_STEPS=steps, kraw_desc=head(cfg["block_n"]), k_counters=torch.empty(8, dtype=torch.int32),
                k_items_per_head=2, k_out=t)
    k = compile_kernel(attention_rotary_fwd_kernel, args, num_warps=4)
    ptx = k.asm["ptx"]
    out.append(dict(d=d, causal=causal, **vars(resources(k)), wgmma=len(re.findall(r"wgmma\\.mma_async", ptx)),
                    tma_stores=len(re.findall(r"cp\\.async\\.bulk\\.tensor\\.\\dd\\.global\\.shared", ptx)),
                    global_stores=len(re.findall(r"st\\.global\\.v4", ptx)), fences=ptx.count("fence.acq_rel.gpu"),
                    release=len(re.findall(r"atom\\.global\\.gpu\\.release\\.add", ptx)),
                    acquire=len(re.findall(r"ld\\.global\\.gpu\\.acquire|atom\\.global\\.gpu\\.acquire", ptx)),
                    proxy_global=ptx.count("fence.proxy.async.global")))
print(json.dumps(out))
"""


def test_compiles_with_k_items_for_sm_90a():
    """D128 full (Q in registers), the shipped forward's registers and no spill; the K items' 16-byte stores from
    registers (no TMA store but O's), each consumer's fences and release, the producer's acquire and fence."""
    variants = [(128, False, dict(block_m=64, block_n=128, stages=2, q_buffers=2, q_regs=True), 64, 8)]
    for row in compiled_json(CODE, json.dumps(variants), timeout=900):
        assert row["wgmma"] > 0 and not row["wgmma_serialized"], row
        assert row["spill_stores"] == 0 and row["spill_loads"] == 0 and row["shared"] <= 227 * 1024, row
        assert row["tma_stores"] == 2 and row["global_stores"] >= 16, row  # O's by TMA, K's by st.global.v4
        assert row["fences"] >= 2 and row["release"] >= 2, row  # each consumer's item end
        assert row["acquire"] >= 1 and row["proxy_global"] >= 3, row


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a Hopper GPU")
@pytest.mark.parametrize("causal,interleaved,hkv", [(False, False, 2), (True, True, 1)])
def test_overlapped_forward_against_float64(causal, interleaved, hkv):
    import tilecore
    from tilecore.ops.attention_rotary.reference import rotary_attention_reference

    q = torch.randn(1, 2, 1000, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, hkv, 1500, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    angle = torch.rand(1500, 64, device="cuda", dtype=torch.float64) * 6.28
    cos, sin = angle.cos().to(torch.bfloat16), angle.sin().to(torch.bfloat16)
    everything = frozenset({(128, False), (128, True)})
    with torch.no_grad(), patched(configs, ROTARY_K_OVERLAP_CASES=everything, ROTARY_IN_KERNEL_CASES=everything,
                                  ROTARY_K_OVERLAP_ITEM_STEPS=1):
        out = tilecore.attention(q, k, v, causal=causal, rotary=(cos, sin), rotary_interleaved=interleaved)
    ref, _ = rotary_attention_reference(q.double(), k.double(), v.double(), cos, sin, interleaved=interleaved,
                                        causal=causal)
    from tilecore import accuracy
    assert accuracy.rel_rms(out.double(), ref) <= 2.5 * accuracy.rounding_floor(ref, torch.bfloat16)
