"""KVCacheManager behaviour: eviction policy, extra keys, exactness, atomicity, inputs."""

import subprocess
import sys

import pytest

from omni.core import KVCacheManager, MultiModalInput, Request
from omni.core import block_hash as block_hash_module
from omni.core.block_pool import Block, FreeBlockQueue


def admit(manager: KVCacheManager, request: Request) -> list[int] | None:
    hit_ids, num_hits = manager.get_computed_blocks(request)
    new_ids = manager.allocate_slots(request, request.num_tokens - num_hits, num_hits, hit_ids)
    if new_ids is not None:
        request.num_computed_tokens = request.num_tokens
    return new_ids


# ---- eviction policy (shared/seeds/000_*.txt) ---------------------------------------------------
def test_only_unreferenced_blocks_are_evicted():
    manager = KVCacheManager(num_blocks=4, block_size=2)
    held = Request("held", [1, 2, 3, 4, 5])  # 3 blocks, 2 cached
    admit(manager, held)
    assert admit(manager, Request("other", [9, 9, 9])) is None  # needs 2, one free
    assert manager.get_block_ids("held") == [0, 1, 2]
    assert manager.get_computed_blocks(Request("again", [1, 2, 3, 4, 5]))[1] == 4


def test_least_recently_used_first():
    manager = KVCacheManager(num_blocks=4, block_size=2)
    old, new = Request("old", [1, 2, 3]), Request("new", [7, 8, 9])
    admit(manager, old)
    admit(manager, new)
    manager.free(old)
    manager.free(new)
    # Two fresh blocks: both of old's blocks go before any of new's.
    admit(manager, Request("x", [50, 51, 52]))
    assert manager.get_computed_blocks(Request("p", [1, 2, 3]))[1] == 0
    assert manager.get_computed_blocks(Request("q", [7, 8, 9]))[1] == 2


def test_equal_time_evicts_end_of_longest_prefix_first():
    manager = KVCacheManager(num_blocks=4, block_size=2)
    request = Request("r", [1, 2, 3, 4, 5, 6, 7])  # blocks [12][34][56][7]
    admit(manager, request)
    manager.free(request)
    assert manager.free_block_ids() == [3, 2, 1, 0]
    admit(manager, Request("x", [40]))  # takes block 3 (partial, uncached)
    admit(manager, Request("y", [41]))  # evicts block 2, the end of the longest prefix
    assert manager.get_computed_blocks(Request("p", [1, 2, 3, 4, 5, 6, 7]))[1] == 4


# ---- extra keys -----------------------------------------------------------------------------------
def _hits(manager, **kwargs):
    return manager.get_computed_blocks(Request("probe", list(range(9)), **kwargs))[1]


@pytest.mark.parametrize(
    ("first", "second", "shared"),
    [
        (
            {"mm_inputs": [MultiModalInput("img-a", 1, 3)]},
            {"mm_inputs": [MultiModalInput("img-a", 1, 3)]},
            8,
        ),
        (
            {"mm_inputs": [MultiModalInput("img-a", 1, 3)]},
            {"mm_inputs": [MultiModalInput("img-b", 1, 3)]},
            0,
        ),
        (
            {"mm_inputs": [MultiModalInput("img-a", 1, 3)]},
            {"mm_inputs": [MultiModalInput("img-a", 2, 3)]},
            0,
        ),
        (
            {"mm_inputs": [MultiModalInput("img-a", 5, 2)]},
            {"mm_inputs": [MultiModalInput("img-b", 5, 2)]},
            4,
        ),
        ({"lora_id": "a"}, {"lora_id": "a"}, 8),
        ({"lora_id": "a"}, {"lora_id": "b"}, 0),
        ({"lora_id": "a"}, {}, 0),
        ({"cache_salt": "s1"}, {"cache_salt": "s1"}, 8),
        ({"cache_salt": "s1"}, {"cache_salt": "s2"}, 0),
        ({}, {"cache_salt": "s2"}, 0),
        ({}, {}, 8),
    ],
)
def test_extra_keys_separate_blocks(first, second, shared):
    manager = KVCacheManager(num_blocks=8, block_size=4)
    admit(manager, Request("first", list(range(9)), **first))
    assert _hits(manager, **second) == shared


def test_salt_only_in_first_block_but_chain_carries_it():
    request = Request("r", list(range(12)), cache_salt="s")
    assert block_hash_module.block_extra_keys(request, 0, 4) == (("salt", "s"),)
    assert block_hash_module.block_extra_keys(request, 1, 4) == ()
    plain = Request("p", list(range(12)))
    salted = block_hash_module.hash_request_blocks(request, 4, "xxhash")
    unsalted = block_hash_module.hash_request_blocks(plain, 4, "xxhash")
    assert all(a != b for a, b in zip(salted, unsalted, strict=True))


def test_hashes_are_stable_across_processes():
    code = (
        "from omni.core import Request, hash_request_blocks;"
        "r = Request('r', list(range(40)), cache_salt='s', lora_id='l');"
        "print([h.hex() for h in hash_request_blocks(r, 16, '{}')])"
    )
    for algo in ("xxhash", "sha256"):
        outs = {
            subprocess.run(
                [sys.executable, "-c", code.format(algo)],
                capture_output=True,
                text=True,
                env={"PYTHONHASHSEED": seed},
                check=True,
            ).stdout
            for seed in ("1", "2")
        }
        assert len(outs) == 1


# ---- exact matching under a colliding hash function ----------------------------------------------
def test_full_hash_collision_only_misses(monkeypatch):
    monkeypatch.setitem(block_hash_module.HASH_FUNCTIONS, "sha256", lambda data: b"same")
    manager = KVCacheManager(num_blocks=16, block_size=4, hash_algo="sha256")
    admit(manager, Request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    # Every block hashes to b"same", yet only exactly equal content and parent chains hit.
    assert manager.get_computed_blocks(Request("b", [1, 2, 3, 4, 0, 0, 0, 0, 9]))[0] == [0]
    assert manager.get_computed_blocks(Request("c", [5, 6, 7, 8, 1, 2, 3, 4, 9]))[0] == []
    assert manager.get_computed_blocks(Request("d", [1, 2, 3, 4, 5, 6, 7, 8, 9]))[0] == [0, 1]
    assert _hits_with(manager, [1, 2, 3, 4, 5, 6, 7, 8, 9], lora_id="x") == 0


def _hits_with(manager, tokens, **kwargs):
    return manager.get_computed_blocks(Request("probe", tokens, **kwargs))[1]


def test_child_of_reused_parent_never_hits_under_collision(monkeypatch):
    monkeypatch.setitem(block_hash_module.HASH_FUNCTIONS, "sha256", lambda data: b"same")
    manager = KVCacheManager(num_blocks=3, block_size=2, hash_algo="sha256")
    first = Request("first", [1, 2, 3, 4, 5])  # blocks 0 [1 2], 1 [3 4], 2 [5]
    admit(manager, first)
    manager.free(first)  # queue: 2, 1, 0
    # Reuse block 2 and 1 then block 0 with other content [9 9]; block 1's old child link must die.
    second = Request("second", [9, 9, 3, 4, 7])
    admit(manager, second)
    assert manager.get_block_ids("second") == [2, 1, 0]
    manager.free(second)
    # [9 9][3 4] was cached by `second` as blocks 2 and 1: a hit there is legitimate.
    assert manager.get_computed_blocks(Request("p", [9, 9, 3, 4, 7]))[0] == [2, 1]
    # The old chain [1 2][3 4] is gone: block 0 no longer holds [1 2].
    assert manager.get_computed_blocks(Request("q", [1, 2, 3, 4, 7]))[0] == []


# ---- lookup limits, atomicity, reset ----------------------------------------------------------
def test_lookup_never_covers_the_whole_prompt_and_is_pure():
    manager = KVCacheManager(num_blocks=8, block_size=4)
    admit(manager, Request("a", list(range(8))))
    probe = Request("b", list(range(8)))
    before = (manager.free_block_ids(), [manager.block_ref_cnt(i) for i in range(8)])
    assert manager.get_computed_blocks(probe) == ([0], 4)  # (8 - 1) // 4 = 1 block at most
    assert (manager.free_block_ids(), [manager.block_ref_cnt(i) for i in range(8)]) == before
    assert manager.stats.requests == 1


def test_disabled_caching_never_hits():
    manager = KVCacheManager(num_blocks=8, block_size=4, enable_caching=False)
    admit(manager, Request("a", list(range(9))))
    assert manager.get_computed_blocks(Request("b", list(range(9)))) == ([], 0)
    assert manager.cached_block_ids() == []


def test_failed_allocation_changes_nothing():
    manager = KVCacheManager(num_blocks=5, block_size=2)
    first = Request("first", [1, 2, 3, 4, 5])
    admit(manager, first)
    manager.free(first)  # blocks 0, 1 cached with ref 0, in the free queue
    big = Request("big", [1, 2, 3, 4] + list(range(10, 17)))  # hits 2 blocks, needs 6 blocks
    hit_ids, num_hits = manager.get_computed_blocks(big)
    assert hit_ids == [0, 1]
    before = (
        manager.free_block_ids(),
        [manager.block_ref_cnt(i) for i in range(5)],
        [manager.block_hash(i) for i in range(5)],
        manager.stats.requests,
    )
    # Free hits count as consumed capacity: 5 free - 2 hits = 3 < 4 new blocks needed.
    assert manager.allocate_slots(big, big.num_tokens - num_hits, num_hits, hit_ids) is None
    after = (
        manager.free_block_ids(),
        [manager.block_ref_cnt(i) for i in range(5)],
        [manager.block_hash(i) for i in range(5)],
        manager.stats.requests,
    )
    assert after == before
    assert manager.get_block_ids("big") == []


def test_free_queue_operations():
    blocks = [Block(i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    assert [b.block_id for b in queue] == [0, 1, 2, 3, 4]
    queue.remove(blocks[2])
    assert queue.popleft() is blocks[0]
    queue.append(blocks[0])
    queue.remove(blocks[4])
    assert [b.block_id for b in queue] == [1, 3, 0] and len(queue) == 3
    for _ in range(3):
        queue.popleft()
    with pytest.raises(RuntimeError):
        queue.popleft()


def test_reset_prefix_cache():
    manager = KVCacheManager(num_blocks=4, block_size=2)
    request = Request("r", [1, 2, 3, 4, 5])
    admit(manager, request)
    assert manager.reset_prefix_cache() is False
    manager.free(request)
    assert manager.reset_prefix_cache() is True
    assert manager.cached_block_ids() == [] and manager.num_free_blocks == 4
    assert manager.get_computed_blocks(Request("p", [1, 2, 3, 4, 5])) == ([], 0)


def test_stats():
    manager = KVCacheManager(num_blocks=16, block_size=4)
    admit(manager, Request("a", list(range(12))))
    admit(manager, Request("b", list(range(12))))
    assert (manager.stats.requests, manager.stats.queries, manager.stats.hits) == (2, 24, 8)
    assert manager.stats.hit_rate == pytest.approx(8 / 24)
    assert manager.stats.recent_hit_rate == pytest.approx(8 / 24)


@pytest.mark.parametrize("enable_caching", [True, False])
def test_decode_allocations_cache_each_block_as_it_fills(enable_caching):
    """A running request decoding one token per step (allocate_slots' fast path while its blocks
    hold the next token): a new block exactly at each boundary, and each block cached (a later
    request hits it) as soon as its last token is known, as when allocated in one go."""
    manager = KVCacheManager(num_blocks=8, block_size=2, enable_caching=enable_caching)
    request = Request("r", [1, 2, 3])
    admit(manager, request)  # blocks [12][3.], the first cached
    for token_id in (4, 5, 6, 7):
        request.append_output_token_ids(token_id)
        num_blocks = len(manager.get_block_ids("r"))
        new_ids = manager.allocate_slots(request, 1)
        request.num_computed_tokens += 1
        crossed = request.num_computed_tokens > num_blocks * 2
        assert new_ids is not None and len(new_ids) == int(crossed), token_id
        num_full = request.num_tokens // 2
        probe = Request("probe", list(request.all_token_ids) + [99])
        want = num_full * 2 if enable_caching else 0
        assert manager.get_computed_blocks(probe)[1] == want, token_id
    assert manager.get_block_ids("r") == [0, 1, 2, 3]
    assert manager.num_free_blocks == 4


# ---- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_blocks": 0, "block_size": 4}, "num_blocks"),
        ({"num_blocks": 4, "block_size": 0}, "block_size"),
        ({"num_blocks": 4, "block_size": 2.5}, "block_size"),
        ({"num_blocks": 4, "block_size": 4, "hash_algo": "md5"}, r"\['sha256', 'xxhash'\].*'md5'"),
    ],
)
def test_bad_manager_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KVCacheManager(**kwargs)


@pytest.mark.parametrize(
    ("tokens", "mm", "match"),
    [
        ([], (), "empty"),
        ([1, -2], (), r"prompt_token_ids\[1\] = -2 is negative"),
        ([1, 2.5], (), r"prompt_token_ids\[1\] = 2.5 is not an integer"),
        ([1, "a"], (), "not an integer"),
        ([1, 2, 3], [MultiModalInput("i", 2, 2)], r"\[2, 4\) is outside the prompt of 3 tokens"),
        ([1, 2, 3], [MultiModalInput("i", -1, 1)], "outside"),
        ([1] * 8, [MultiModalInput("i", 0, 4), MultiModalInput("j", 3, 2)], "overlaps"),
    ],
)
def test_bad_request_input(tokens, mm, match):
    with pytest.raises(ValueError, match=match):
        Request("bad", tokens, mm_inputs=mm)


def test_core_imports_no_torch():
    code = "import sys, omni.core, omni.core.kv_cache_manager; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_parent_identity_includes_its_version():
    """A child cached under a parent whose block was since reused must not hit, even if the
    parent's block id, the child's hash and tokens all match (full collision)."""
    from omni.core.block_pool import BlockPool

    pool = BlockPool(4)
    parent, child = pool.get_new_blocks(2)
    pool.cache_block(parent, b"h", b"AB", (), None)
    pool.cache_block(child, b"h", b"CD", (), parent)
    assert pool.longest_prefix([b"h", b"h"], [b"AB", b"CD"], None, 2) == [parent, child]
    pool.free_blocks([parent])
    pool.get_new_blocks(3)  # pops 2, 3, then evicts the parent's block 0 (free queue order)
    assert parent.block_hash is None
    pool.cache_block(parent, b"h", b"XY", (), None)  # same block, new content and version
    assert pool.longest_prefix([b"h", b"h"], [b"XY", b"CD"], None, 2) == [parent]


def test_generation_key_separates_generated_blocks_only():
    manager = KVCacheManager(num_blocks=16, block_size=4)
    first = Request("a", list(range(8)), generation_key="reply-1")
    admit(manager, first)
    for token in (50, 51, 52, 53, 54):
        first.append_output_token_ids(token)
        manager.allocate_slots(first, 1)
        first.num_computed_tokens += 1
    # Same prompt and same generated tokens: a resumed request with the same key hits all three
    # full blocks; with another key only the two prompt blocks.
    same = Request("b", list(range(8)), generation_key="reply-1")
    same.append_output_token_ids([50, 51, 52, 53, 54])
    other = Request("c", list(range(8)), generation_key="reply-2")
    other.append_output_token_ids([50, 51, 52, 53, 54])
    assert manager.get_computed_blocks(same)[1] == 12
    assert manager.get_computed_blocks(other)[1] == 8
