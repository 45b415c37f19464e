"""The worked example of shared/seeds/001_*.txt, block for block, on the real KVCacheManager."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from prefix_cache_walkthrough import replay  # noqa: E402

from omni.core import KVCacheManager, Request  # noqa: E402


def test_worked_example_times_1_to_7():
    snaps = replay()
    by_time = {}
    for s in snaps:
        by_time.setdefault(s.time, []).append(s)
    t1, t2, t3, t4, t5, t6 = (by_time[t][0] for t in range(1, 7))
    lookup7, alloc7 = by_time[7]

    # Time 1: 4 blocks, 3 full and cached, block 3 half full.
    assert t1.block_tables == {"req0": [0, 1, 2, 3]}
    assert t1.cached_block_ids == [0, 1, 2]
    # Time 3: block 3 became full and cached; block 4 allocated for decoding.
    assert t2.cached_block_ids == [0, 1, 2, 3]
    assert t3.block_tables == {"req0": [0, 1, 2, 3, 4]}
    assert t3.cached_block_ids == [0, 1, 2, 3]
    # Time 4: request 1 shares 11 tokens: only 2 blocks hit; it gets two new blocks 5, 6.
    assert t4.block_tables["req1"] == [0, 1, 5, 6]
    assert t4.free_queue == [7, 8, 9]
    # Time 5: request 0 freed: 4, 3, 2 to the tail in reverse order; 0, 1 still held.
    assert t5.free_queue == [7, 8, 9, 4, 3, 2]
    assert {2, 3}.issubset(t5.cached_block_ids)
    # Time 6: request 1 freed.
    assert t6.free_queue == [7, 8, 9, 4, 3, 2, 6, 5, 1, 0]
    # Time 7: hits 0, 1, 2; the queue minus the touched hits is 7-8-9-4-3-6-5; the allocation
    # pops its head: 0, 1, 2 (cached), 7, 8, 9, 4, 3 (evicted).
    assert lookup7.free_queue == [7, 8, 9, 4, 3, 2, 6, 5, 1, 0]
    assert lookup7.event.endswith("[0, 1, 2]")
    touched = [b for b in lookup7.free_queue if b not in (0, 1, 2)]
    assert touched == [7, 8, 9, 4, 3, 6, 5]
    assert alloc7.block_tables["req2"] == [0, 1, 2, 7, 8, 9, 4, 3]
    assert alloc7.free_queue == [6, 5]


def test_block_3_is_evicted_at_time_7():
    # Block 3 cached request 0's tokens 12..15 (two prompt, two generated) until time 6; at time 7
    # it is evicted and reused for request 2's tokens 28..31, which it now caches instead.
    snaps = replay()
    time6, time7 = snaps[5], snaps[-1]
    assert time6.block_contents[3] == [112, 113, 114, 115]
    assert time7.block_contents[3] == list(range(314, 318))
    assert 3 in time7.cached_block_ids


def test_duplicated_blocks_example():
    """ABCDEF + decode GHI, sent twice (block size 4): request 2 caches a duplicate of block 1."""
    manager = KVCacheManager(num_blocks=10, block_size=4)
    A, B, C, D, E, F, G, H, I = range(1, 10)  # noqa: E741 - the seed's letters

    def run(request_id: str) -> list[list[int]]:
        request = Request(request_id, [A, B, C, D, E, F])
        hit_ids, num_hits = manager.get_computed_blocks(request)
        tables = []
        # Prefill (samples G), then feed G (samples H), feed H (samples I), feed I.
        num_new = request.num_tokens - num_hits
        assert manager.allocate_slots(request, num_new, num_hits, hit_ids) is not None
        request.num_computed_tokens = request.num_tokens
        for token in (G, H, I):
            request.append_output_token_ids(token)
            assert manager.allocate_slots(request, 1) is not None
            request.num_computed_tokens += 1
            tables.append(manager.get_block_ids(request_id))
        return tables, request

    tables1, req1 = run("r1")
    assert tables1 == [[0, 1], [0, 1], [0, 1, 2]]
    assert manager.cached_block_ids() == [0, 1]
    tables2, req2 = run("r2")
    # Block 0 hits; E F G H land in a new block 3 that duplicates block 1 (append-only tables).
    assert tables2[0] == [0, 3] and tables2[1] == [0, 3]
    assert manager.cached_block_ids() == [0, 1, 3]
    assert manager.block_hash(1) == manager.block_hash(3)
    # Lookup returns the first inserted copy.
    probe = Request("probe", [A, B, C, D, E, F, G, H, I])
    assert manager.get_computed_blocks(probe) == ([0, 1], 8)
    manager.free(req1)
    manager.free(req2)
    assert manager.get_computed_blocks(probe) == ([0, 1], 8)
