"""The zigzag split (no processes): chunk lengths, each rank's slice, and the natural order back."""
import pytest
import torch

from tilecore.distributed import sharding, zigzag_shard


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("n", [0, 1, 5, 16, 17, 31])
def test_slices_cover_the_sequence_once_in_zigzag_order(world, n):
    x = torch.arange(n)[None, :]
    slices = [zigzag_shard(x, 1, rank=r, world_size=world) for r in range(world)]
    assert sorted(torch.cat(slices, 1)[0].tolist()) == list(range(n))
    assert [s.shape[1] for s in slices] == sharding.local_lengths(n, world)
    sizes = sharding.chunk_sizes(n, world)
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n
    starts = sharding.chunk_starts(n, world)
    for r, s in enumerate(slices):  # chunk r, then its mirror 2P-1-r
        late = 2 * world - 1 - r
        assert s[0].tolist() == list(range(starts[r], starts[r] + sizes[r])) + \
            list(range(starts[late], starts[late] + sizes[late]))
    assert torch.equal(sharding.zigzag_order(slices, 1), x)


def test_causal_work_is_balanced():
    """Under a causal mask every rank's queries see the same number of keys (to within one chunk's
    rounding): the point of the zigzag split."""
    n, world = 64, 4
    pos = torch.arange(n)
    work = [int((zigzag_shard(pos, 0, rank=r, world_size=world) + 1).sum()) for r in range(world)]
    assert len(set(work)) == 1


def test_bad_arguments_name_what_is_accepted():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="dim must be an int"):
        zigzag_shard(x, 2, rank=0, world_size=2)
    with pytest.raises(ValueError, match="both rank and world_size"):
        zigzag_shard(x, 1, rank=0)
    with pytest.raises(ValueError, match="0 <= rank < world_size"):
        zigzag_shard(x, 1, rank=2, world_size=2)
    with pytest.raises(TypeError, match="torch.Tensor"):
        zigzag_shard([1, 2], 0, rank=0, world_size=1)
