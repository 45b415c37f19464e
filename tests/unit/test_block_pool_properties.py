"""Random interleavings of admits, decode appends and frees under pool pressure; the pool's
invariants are checked after every operation."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omni.core import KVCacheManager, Request

BLOCK_SIZE = 2
NUM_BLOCKS = 12
PREFIXES = [[1, 2, 3, 4, 5], [1, 2, 7, 7], [9, 8, 7, 6, 5, 4]]

operation = st.one_of(
    st.tuples(st.just("admit"), st.integers(0, 2), st.lists(st.integers(0, 5), max_size=6)),
    st.tuples(st.just("decode"), st.integers(0, 50), st.integers(0, 5)),
    st.tuples(st.just("free"), st.integers(0, 50), st.just(0)),
)


def check_invariants(manager: KVCacheManager, running: dict[str, Request]) -> None:
    pool = manager.pool
    queued = [block.block_id for block in pool.free_queue]
    assert len(queued) == len(set(queued)) == manager.num_free_blocks
    num_referenced = 0
    for block in pool.blocks:
        if block.ref_cnt == 0:
            assert block.block_id in queued
        else:
            assert block.block_id not in queued
            num_referenced += 1
        in_map = block.block_hash is not None and block.block_id in pool.cached.get(
            block.block_hash, {}
        )
        assert (block.block_hash is not None) == in_map
    assert num_referenced + len(queued) == NUM_BLOCKS
    # Reference counts equal the number of running requests holding each block.
    holders = [0] * NUM_BLOCKS
    for request_id in running:
        for block_id in manager.get_block_ids(request_id):
            holders[block_id] += 1
    assert holders == [block.ref_cnt for block in pool.blocks]
    # Every cached block a running request holds stores exactly that request's tokens.
    for request_id, request in running.items():
        for index, block_id in enumerate(manager.get_block_ids(request_id)):
            block = pool.blocks[block_id]
            if block.block_hash is not None:
                start = index * BLOCK_SIZE
                assert block.token_ids == request.all_token_ids[start : start + BLOCK_SIZE]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operation, min_size=1, max_size=40))
def test_random_interleavings_keep_invariants(operations):
    manager = KVCacheManager(num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)
    running: dict[str, Request] = {}
    counter = 0
    for kind, a, b in operations:
        ids = sorted(running)
        if kind == "admit":
            counter += 1
            request = Request(f"r{counter}", PREFIXES[a] + b)
            hit_ids, num_hits = manager.get_computed_blocks(request)
            # Every hit holds exactly the request's tokens at that position.
            for index, block_id in enumerate(hit_ids):
                start = index * BLOCK_SIZE
                expected = request.all_token_ids[start : start + BLOCK_SIZE]
                assert manager.pool.blocks[block_id].token_ids == expected
            new = manager.allocate_slots(request, request.num_tokens - num_hits, num_hits, hit_ids)
            if new is not None:
                request.num_computed_tokens = request.num_tokens
                running[request.request_id] = request
        elif kind == "decode" and ids:
            request = running[ids[a % len(ids)]]
            request.append_output_token_ids(b)
            if manager.allocate_slots(request, 1) is None:
                manager.free(request)  # preempted by recompute
                del running[request.request_id]
            else:
                request.num_computed_tokens += 1
        elif kind == "free" and ids:
            manager.free(running.pop(ids[a % len(ids)]))
        check_invariants(manager, running)
