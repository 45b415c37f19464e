"""RowArena (omni/runtime/row_arena.py): every key's rows stay readable at start(key) through
appends that move segments and rebuilds that compact the buffer; row 0 stays zero; appending n
rows one at a time copies O(n) rows in all."""

import random

import torch

from omni.runtime.row_arena import RowArena


def _check(arena: RowArena, want: dict[str, torch.Tensor]) -> None:
    assert not arena.rows[0].any()
    for key, rows in want.items():
        start, length = arena.start(key), arena.length(key)
        assert length == rows.shape[0]
        assert torch.equal(arena.rows[start : start + length], rows), key


def test_random_adds_appends_and_releases_keep_every_key_intact():
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    arena = RowArena(3, torch.float32, torch.device("cpu"))
    want: dict[str, torch.Tensor] = {}
    num_moves = num_rebuilds = 0
    for step in range(400):
        buffer = arena.rows
        action = rng.random()
        if action < 0.2 or not want:
            key = f"k{step}"
            rows = torch.randn(rng.randrange(0, 30), 3, generator=gen, dtype=torch.float64)
            arena.add(key, rows, spare=rng.choice([0, 4]))
            want[key] = rows.float()  # converted to the arena's dtype
        elif action < 0.3:
            key = rng.choice(sorted(want))
            arena.release(key)
            del want[key]
            assert key not in arena
        else:
            key = rng.choice(sorted(want))
            rows = torch.randn(rng.randrange(0, 6), 3, generator=gen)
            before = arena.start(key)
            arena.append(key, rows)
            num_moves += arena.start(key) != before
            want[key] = torch.cat([want[key], rows])
        num_rebuilds += arena.rows is not buffer
        _check(arena, want)
    assert num_moves > 10 and num_rebuilds > 2  # segments did move and the buffer was rebuilt


def test_one_row_appends_copy_linear_rows():
    arena = RowArena(2, torch.float32, torch.device("cpu"))
    arena.add("a", torch.zeros(1, 2))
    copied = 0
    for i in range(2000):
        capacity_before = arena._segments["a"].capacity
        arena.append("a", torch.full((1, 2), float(i)))
        if arena._segments["a"].capacity != capacity_before:
            copied += capacity_before
    assert copied < 4 * 2000
    assert torch.equal(
        arena.rows[arena.start("a") + 1 : arena.start("a") + 2001, 0], torch.arange(2000.0)
    )
    # The buffer holds a bounded multiple of the live rows.
    assert arena.rows.shape[0] <= 8 * arena.num_live_rows
