"""Seed 002's worked example on the real KVCacheManager + OutputCache (no model): num_blocks 8,
block_size 4, hidden size 2, and a discovered per-token output `mm_feature` of dimension 16."""

import torch

from omni.core import KVCacheManager, Request
from omni.runtime.output_cache import OutputCache

WORDS = "The quick brown fox was tired and slept beneath the shady tree jumped over dog".split()
VOCAB = {w: i for i, w in enumerate(dict.fromkeys(WORDS))}


def ids(text: str) -> list[int]:
    return [VOCAB[w] for w in text.split()]


def fake_stage(token_ids: list[int], start: int, stop: int) -> dict[str, torch.Tensor]:
    """Per-token outputs of a causal 'model': row i depends on tokens 0..i only."""
    rows_h, rows_f = [], []
    for i in range(start, stop):
        g = torch.Generator().manual_seed(hash(tuple(token_ids[: i + 1])) % (2**31))
        rows_h.append(torch.randn(2, generator=g))
        rows_f.append(torch.randn(16, generator=g))
    return {"hidden_states": torch.stack(rows_h), "mm_feature": torch.stack(rows_f)}


def run(kv: KVCacheManager, cache: OutputCache, request: Request):
    hit_ids, num_hits = kv.get_computed_blocks(request)
    versions = [kv.block_version(b) for b in hit_ids]
    assert cache.num_valid_prefix(hit_ids, versions, set()) == len(hit_ids)
    kv.allocate_slots(request, request.num_tokens - num_hits, num_hits, hit_ids)
    block_ids = kv.get_block_ids(request.request_id)
    fresh = fake_stage(request.all_token_ids, num_hits, request.num_tokens)
    slots = torch.tensor(
        [block_ids[p // 4] * 4 + p % 4 for p in range(num_hits, request.num_tokens)]
    )
    cache.discover(fresh, len(slots))
    cache.write(slots, fresh)
    full = request.num_tokens // 4
    cache.mark_complete(block_ids[:full], [kv.block_version(b) for b in block_ids[:full]])
    request.num_computed_tokens = request.num_tokens
    return hit_ids, block_ids, slots, fresh


def test_seed_002_example():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    cache = OutputCache(num_blocks=8, block_size=4, dtype=torch.float32)
    cache.allocate("hidden_states", (2,))  # from the model config, at stage start
    first = Request("first", ids("The quick brown fox was tired and slept beneath the shady tree"))
    hits, blocks, slots, fresh = run(kv, cache, first)
    assert first.num_tokens == 12 and hits == [] and blocks == [0, 1, 2]
    # mm_feature was discovered on first sight: (12, 16) -> a (8, 4, 16) cache.
    assert cache.caches["mm_feature"].shape == (8, 4, 16)
    assert cache.caches["hidden_states"].shape == (8, 4, 2)
    assert slots.tolist() == list(range(12))  # rows 0..11: 'The' .. 'tree'
    assert torch.equal(cache.caches["hidden_states"].view(32, 2)[:12], fresh["hidden_states"])
    kv.free(first)

    second = Request("second", ids("The quick brown fox jumped over the dog"))
    hits, blocks, slots, fresh = run(kv, cache, second)
    assert hits == [0]  # 'The quick brown fox' hit: num_computed_tokens = 4
    assert blocks == [0, 3]  # the 4 new tokens land in block 3, rows 12..15
    assert slots.tolist() == [12, 13, 14, 15]
    assert fresh["mm_feature"].shape == (4, 16)
    out = cache.gather(blocks, num_rows=8, admitted_step=1, num_hit_rows=4)
    uncached = fake_stage(second.all_token_ids, 0, 8)
    for name in ("hidden_states", "mm_feature"):
        flat = cache.caches[name].view(32, -1)
        assert torch.equal(out[name], torch.cat([flat[0:4], fresh[name]]))
        assert torch.equal(out[name], uncached[name])


def test_non_token_outputs_pass_through():
    cache = OutputCache(num_blocks=4, block_size=4, dtype=torch.float32)
    passthrough = cache.discover(
        {"per_token": torch.zeros(5, 3), "pooled": torch.zeros(1, 8), "scalar": torch.tensor(1.0)},
        5,
    )
    assert set(cache.caches) == {"per_token"}
    assert set(passthrough) == {"pooled", "scalar"}


def test_reused_block_does_not_serve_old_rows():
    cache = OutputCache(num_blocks=2, block_size=2, dtype=torch.float32)
    cache.allocate("hidden_states", (1,))
    cache.mark_complete([0], [0])
    assert cache.num_valid_prefix([0], [0], set()) == 1
    # The pool evicted and reused block 0 (version 1): rows of version 0 are stale.
    assert cache.num_valid_prefix([0], [1], set()) == 0
    # ...unless the reuser completes them in this very step.
    assert cache.num_valid_prefix([0], [1], {0}) == 1


def test_output_discovered_mid_block_is_not_marked_valid_for_it():
    cache = OutputCache(num_blocks=2, block_size=4, dtype=torch.float32)
    cache.allocate("hidden_states", (1,))  # step 0: known from the start
    cache.step = 1
    cache.write(torch.tensor([0, 1]), {"hidden_states": torch.ones(2, 1)})  # block 0's first rows
    cache.step = 2
    outputs = {"hidden_states": torch.ones(2, 1), "late": torch.ones(2, 3)}
    cache.discover(outputs, 2)  # "late" appears only now: it has no rows 0 and 1
    cache.write(torch.tensor([2, 3]), outputs)
    cache.mark_complete([0], [5])
    assert cache.valid_version["hidden_states"][0] == 5
    assert cache.valid_version["late"][0] == -1
    assert cache.num_valid_prefix([0], [5], set()) == 0  # a hit would lack "late" rows
