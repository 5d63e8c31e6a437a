"""The engine's preallocated KV cache: writes land in place at each row's own columns, growth
keeps what was written, and rows move down when one before them leaves."""

from types import SimpleNamespace

import torch

from agents.serving.embedded.batchcache import FIRST_CAPACITY, BatchCache

CONFIG = SimpleNamespace(
    num_hidden_layers=2, num_key_value_heads=1, num_attention_heads=2, hidden_size=8, head_dim=4
)


def states(rows: int, positions: int, start: float) -> torch.Tensor:
    """[rows, heads, positions, dim] of distinct values."""
    return (
        torch.arange(rows * positions * 4, dtype=torch.float32).view(rows, 1, positions, 4) + start
    )


def test_each_row_writes_at_its_own_columns_and_reads_up_to_the_width():
    cache = BatchCache(CONFIG, max_slots=4)
    cache.select(0, torch.tensor([[0, 1, 2], [5, 6, 7]]), width=8)
    keys, values = cache.update(states(2, 3, 0), states(2, 3, 100), layer_idx=1)
    assert keys.shape == (2, 1, 8, 4) and cache.slots == 2
    assert torch.equal(keys[0, :, :3], states(2, 3, 0)[0]) and not keys[0, :, 3:].any()
    assert torch.equal(values[1, :, 5:8], states(2, 3, 100)[1]) and not values[1, :, :5].any()
    assert not cache.keys[0].any()  # another layer is untouched


def test_growth_keeps_the_rows_and_move_and_read_copy_them():
    cache = BatchCache(CONFIG, max_slots=4)
    cache.select(0, torch.tensor([[0, 1]]), width=2)
    cache.update(states(1, 2, 1), states(1, 2, 1), layer_idx=0)
    cache.select(2, torch.tensor([[FIRST_CAPACITY]]), width=FIRST_CAPACITY + 1)  # grows both
    assert (cache.slots, cache.capacity) == (4, 2 * FIRST_CAPACITY)
    assert torch.equal(cache.keys[0][0, :, :2], states(1, 2, 1)[0])
    cache.move(0, 3, length=2)
    saved = cache.read(3, 2)
    assert torch.equal(saved[0][0], states(1, 2, 1)[0])
    cache.write(1, saved, 2)
    assert torch.equal(cache.values[0][1, :, :2], states(1, 2, 1)[0])


def test_longer_columns_go_to_the_rows_in_use_not_to_every_preallocated_slot():
    """An engine allocates all its slots at start; one long context must not then give every
    slot its columns (32 slots at a tau2 prompt's 8,192 columns: 12 GB, which the suite's
    engine once reached before the kernel killed it)."""
    cache = BatchCache(CONFIG, max_slots=8)
    cache.reserve(8, FIRST_CAPACITY)
    cache.select(0, torch.tensor([[0, 1]]), width=2)
    cache.update(states(1, 2, 1), states(1, 2, 1), layer_idx=0)
    long = 4 * FIRST_CAPACITY
    cache.select(0, torch.tensor([[long]]), width=long + 1)  # the one running row grows
    assert (cache.slots, cache.capacity) == (1, 8 * FIRST_CAPACITY)
    assert torch.equal(cache.keys[0][0, :, :2], states(1, 2, 1)[0])  # its row is kept
    cache.select(1, torch.tensor([[0], [0]]), width=1)  # arrivals: slots come back as asked
    assert cache.slots == 4 and torch.equal(cache.keys[0][0, :, :2], states(1, 2, 1)[0])
