"""An LRU model of the causal D128 backward's L2 traffic (CPU, no GPU): which tile order and query-block walk
keeps a head's Q, dO and float32 dQ rows in L2 (session 34; notes/attention/README.md, "Session 34").

Each dK/dV tile (128 keys of one head) starts when a program takes it: drawn from the work table's order (the
varlen kernels: a sequence's tiles head by head, heaviest first) or from the fixed kernel's balanced schedule
(plan.balanced_table over head_grouped_tile's order); a step takes one time unit, a tile 3 more. Step k of
tile j touches its (head, query block) Q + dO (32 KB) and, with the fused dQ, its float32 dQ rows (32 KB);
a tile's K and V (64 KB) once. Those touches, in time order, go through an LRU cache of ``--cache`` MB: the
misses (GB) stand for DRAM traffic. Walks: "staggered" (shipped: tile j starts at block 3j, wrapping), "down"
(every tile from the last block down) and "downS" (from the last down, starting j % S blocks up).

    PYTHONPATH=. python3 experiments/attention/varlen_l2_model.py [--cache 16]

At 16 MB (uniform 16 x 4096, fused dQ): fixed balanced staggered 4.97 GB, varlen staggered 7.15, varlen down 1.61
(Nsight Compute measured DRAM reads 2.99 / 4.67 GB for the first two: the model's ratio 1.44x, measured 1.56x).
"""
import argparse
import collections
import heapq
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

PROGRAMS = 132
OVERHEAD = 3.0  # a tile's steps of setup and epilogue
KB = 1024


def tile_blocks(n, j, walk):
    """The query blocks (64 rows) causal key tile j (128 keys) of a sequence of n visits, in walk order."""
    first = (j * 128) // 64
    per = math.ceil(n / 64) - first
    if walk == "staggered":
        shift = j % max(per, 1)
        return [first + (k + shift) % per for k in range(per)]
    s = int(walk[4:] or 1)
    shift = (j % s) % max(per, 1)
    return [first + per - 1 - (k + shift) % per for k in range(per)]


def drawn_starts(items):
    """(start time, item) for items (head, n, j) drawn in order by PROGRAMS programs."""
    free = [(0.0, p) for p in range(PROGRAMS)]
    out = []
    for head, n, j in items:
        t, p = heapq.heappop(free)
        out.append((t, (head, n, j)))
        heapq.heappush(free, (t + OVERHEAD + math.ceil(n / 64) - (j * 128) // 64, p))
    return out


def varlen_items(lengths, heads):
    """The varlen work table's order over the keys: sequences longest first, head by head, key tiles from the first."""
    return [((s, h), n, j) for s, n in sorted(enumerate(lengths), key=lambda x: -x[1])
            for h in range(heads) for j in range(math.ceil(n / 128))]


def fixed_starts(n, batch_heads):
    """(start time, item) of the fixed kernel's balanced causal schedule (plan.balanced_table's table)."""
    from tilecore.ops.attention import plan
    from tilecore.tiles import schedule

    group = plan.heads_in_l2(2 * n * 128 * 2)
    blocks = math.ceil(n / 128)
    table = plan.balanced_table("backward", n, n, 64, 128, batch_heads, group, 1, PROGRAMS).tolist()
    heads, kb = schedule.head_grouped_tiles(blocks * batch_heads, blocks, batch_heads, group)
    out = []
    for p in range(PROGRAMS):
        t = 0.0
        for tile in table[table[p]:table[p + 1]]:
            j = kb[tile].item()
            out.append((t, (heads[tile].item(), n, j)))
            t += OVERHEAD + math.ceil(n / 64) - (j * 128) // 64
    return out


def misses(starts, walk, cache_mb, fused=True):
    """GB missed by an LRU cache of cache_mb over the tiles' touches in time order."""
    events = []
    for t0, (head, n, j) in starts:
        events.append((t0, 0, ("kv", head, j), 64 * KB))
        for k, m in enumerate(tile_blocks(n, j, walk)):
            events.append((t0 + OVERHEAD + k, 1, ("q", head, m), 32 * KB))
            if fused:
                events.append((t0 + OVERHEAD + k + 0.5, 2, ("dq", head, m), 32 * KB))
    events.sort(key=lambda e: (e[0], e[1]))
    cache, used, missed = collections.OrderedDict(), 0, 0
    for _, _, key, size in events:
        if key in cache:
            cache.move_to_end(key)
            continue
        missed += size
        cache[key] = size
        used += size
        while used > cache_mb * KB * KB:
            used -= cache.popitem(last=False)[1]
    return missed / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=float, default=16.0, help="effective L2 MB")
    args = ap.parse_args()
    from experiments.attention.gpu_varlen_bwd import long_tailed_lengths

    uniform, tail = [4096] * 16, long_tailed_lengths(65536)
    print(f"LRU of {args.cache:.0f} MB, H16 D128 causal backward, GB missed (fused dQ / dK-dV alone)")
    rows = [("fixed balanced 16 x 4096", lambda: fixed_starts(4096, 256), ("staggered", "down"))]
    rows += [(f"varlen {name}", lambda lengths=lengths: drawn_starts(varlen_items(lengths, 16)),
              ("staggered", "down", "down4")) for name, lengths in (("16 x 4096", uniform), ("long tail", tail))]
    for name, starts_of, walks in rows:
        starts = starts_of()
        for walk in walks:
            print(f"  {name:26s} {walk:10s} {misses(starts, walk, args.cache):6.2f} / "
                  f"{misses(starts, walk, args.cache, fused=False):6.2f}", flush=True)


if __name__ == "__main__":
    main()
