"""BlockTables (omni/runtime/block_tables.py) and the runner's use of it: a request's table is
written once per block, never rebuilt, and always equals the KV cache manager's block ids."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import make_engine

from omni.core.sampling_params import SamplingParams
from omni.messages import StageInput
from omni.runtime.block_tables import BlockTables


def test_rows_append_release_and_reuse():
    tables = BlockTables(num_rows=2, num_columns=4)
    a = tables.add([7, 3])
    b = tables.add([])
    assert (a, b) == (0, 1)
    tables.append(b, [5])
    tables.append(a, [9])
    tables.append(a, [])
    assert tables.block_ids(a) == [7, 3, 9] and tables.block_ids(b) == [5]
    tables.release(a)
    c = tables.add([1])  # the released row, with a fresh table (no stale length)
    assert c == a and tables.block_ids(c) == [1] and tables.num_free_rows == 0


def test_grows_in_rows_and_columns_keeping_tables():
    tables = BlockTables(num_rows=1, num_columns=2)
    a = tables.add([1, 2])
    tables.append(a, [3, 4, 5])  # past the width
    b = tables.add([6])  # past the rows
    c = tables.add([7])
    assert tables.block_ids(a) == [1, 2, 3, 4, 5]
    assert tables.block_ids(b) == [6] and tables.block_ids(c) == [7]
    assert len({a, b, c}) == 3 and tables.table.shape[0] >= 3


def test_gather_in_order_into_a_static_buffer():
    tables = BlockTables(num_rows=4, num_columns=8)
    rows = [tables.add(ids) for ids in ([4, 5, 6], [8], [10, 11])]
    tables.release(rows[1])
    rows[1] = tables.add([12, 13])  # reuses the row whose old entries are stale
    order = np.array([rows[2], rows[0], rows[1]])
    gathered = tables.gather(order)
    assert gathered.shape == (3, 3)  # the longest table's width
    for got, want in zip(gathered, ([10, 11], [4, 5, 6], [12, 13]), strict=True):
        assert got[: len(want)].tolist() == want
    out = np.full((5, 8), -1, dtype=np.int64)
    view = tables.gather(order, out=out)
    assert np.array_equal(view, gathered) and view.base is out
    assert (out[3:] == -1).all() and (out[:, 3:] == -1).all()  # nothing else written
    assert tables.gather(np.array([], dtype=np.int64)).shape == (0, 1)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="num_rows=0"):
        BlockTables(num_rows=0, num_columns=4)


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_runner_tables_follow_the_kv_manager_under_preemption(qwen2_dir, cuda_graphs):
    """Every step, every request the runner tracks has the kv manager's blocks as its table
    (tiny pool: preemption and resumption with fresh tables), and the runner's count of
    non-greedy requests (its sampler's skip of the per-row check) is exact."""
    engine = make_engine(
        qwen2_dir,
        block_size=4,
        num_blocks=24,
        max_model_len=64,
        max_num_seqs=5,
        cuda_graphs=cuda_graphs,
        outputs=[],
    )
    greedy = SamplingParams(max_tokens=24, ignore_eos=True)
    seeded = SamplingParams(max_tokens=24, ignore_eos=True, temperature=1.0, seed=5)
    for i in range(5):
        params = seeded if i in (1, 3) else greedy
        engine.add_request(StageInput(f"r{i}", [3 + i, 9, 4, 11, 7 + i][: 2 + i], params))
    runner = engine.runner
    num_steps = 0
    while engine.has_unfinished:
        engine.step()
        num_steps += 1
        for request_id, state in runner.requests.states.items():
            want = engine.kv.get_block_ids(request_id)
            assert runner.block_tables.block_ids(state.row) == want, (num_steps, request_id)
        random = sum(not s.sampling_params.greedy for s in runner.requests.states.values())
        assert runner.requests.num_random == random
    stats = engine.stats()
    assert stats["preemptions"] > 0, stats
    assert runner.requests.states == {} and runner.requests.num_random == 0
    assert runner.block_tables.num_free_rows == runner.block_tables.table.shape[0]
