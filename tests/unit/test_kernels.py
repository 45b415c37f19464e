"""reshape_and_cache and paged_attention against two oracles: the per-sequence reference that
reads the same paged cache, and a dense causal attention over the un-paged K/V."""

import random

import pytest
import torch
import torch.nn.functional as F

from kernels import paged_attention as pa
from kernels.cache_ops import reshape_and_cache
from kernels.paged_attention import (
    STRATEGIES,
    make_plan,
    paged_attention,
    paged_attention_reference,
)

HEAD_DIM = 16
ATOL = 1e-5


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_reshape_and_cache_writes_exactly_the_slots():
    torch.manual_seed(0)
    key_cache, value_cache = torch.randn(6, 3, 2, 4), torch.randn(6, 3, 2, 4)
    before_keys, before_values = key_cache.clone(), value_cache.clone()
    slots = torch.tensor([17, 0, 5, 9, 10])  # block 5 offset 2, block 0 offset 0, ...
    key, value = torch.randn(5, 2, 4), torch.randn(5, 2, 4)
    reshape_and_cache(key, value, key_cache, value_cache, slots)
    written = torch.zeros(18, dtype=torch.bool)
    written[slots] = True
    for i, slot in enumerate(slots.tolist()):
        block_id, offset = divmod(slot, 3)
        assert torch.equal(key_cache[block_id, offset], key[i])
        assert torch.equal(value_cache[block_id, offset], value[i])
    assert torch.equal(key_cache.view(18, 2, 4)[~written], before_keys.view(18, 2, 4)[~written])
    assert torch.equal(value_cache.view(18, 2, 4)[~written], before_values.view(18, 2, 4)[~written])


def test_reshape_and_cache_rejects_bad_shapes():
    key_cache = torch.zeros(2, 2, 1, 4)
    with pytest.raises(ValueError, match="slot_mapping"):
        reshape_and_cache(
            torch.zeros(3, 1, 4), torch.zeros(3, 1, 4), key_cache, key_cache, torch.tensor([0, 1])
        )
    with pytest.raises(RuntimeError, match="contiguous"):
        strided = torch.zeros(2, 2, 4, 2).transpose(2, 3)  # [2, 2, 2, 4], not contiguous
        reshape_and_cache(
            torch.zeros(1, 2, 4), torch.zeros(1, 2, 4), strided, strided, torch.tensor([0])
        )


class PagedBatch:
    """Random dense per-sequence K/V and queries, paged into shuffled, non-contiguous blocks.

    specs: (q_len, seq_len) per sequence; queries are the last q_len positions of the context.
    """

    def __init__(self, specs, block_size, num_heads, num_kv_heads, seed=0):
        generator = torch.Generator().manual_seed(seed)
        blocks_per_seq = [-(-seq_len // block_size) for _, seq_len in specs]
        num_blocks = sum(blocks_per_seq) + 2  # spare blocks stay random garbage
        free = list(range(num_blocks))
        random.Random(seed).shuffle(free)
        cache_shape = (num_blocks, block_size, num_kv_heads, HEAD_DIM)
        self.key_cache = torch.randn(cache_shape, generator=generator)
        self.value_cache = torch.randn(cache_shape, generator=generator)
        self.block_tables = torch.zeros(len(specs), max(blocks_per_seq) + 1, dtype=torch.int64)
        self.dense, queries = [], []
        for i, (q_len, seq_len) in enumerate(specs):
            blocks = [free.pop() for _ in range(blocks_per_seq[i])]
            # Padding entries name an unrelated block on purpose: it must be masked out.
            width = self.block_tables.shape[1]
            self.block_tables[i] = torch.tensor(blocks + [free[0]] * (width - len(blocks)))
            keys = torch.randn(seq_len, num_kv_heads, HEAD_DIM, generator=generator)
            values = torch.randn(seq_len, num_kv_heads, HEAD_DIM, generator=generator)
            dense_queries = torch.randn(seq_len, num_heads, HEAD_DIM, generator=generator)
            slots = torch.tensor(
                [blocks[p // block_size] * block_size + p % block_size for p in range(seq_len)]
            )
            reshape_and_cache(keys, values, self.key_cache, self.value_cache, slots)
            self.dense.append((dense_queries, keys, values, q_len))
            queries.append(dense_queries[seq_len - q_len :])
        self.query = torch.cat(queries)
        q_lens = torch.tensor([q_len for q_len, _ in specs])
        self.seq_lens = torch.tensor([seq_len for _, seq_len in specs])
        self.query_start_loc = torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)])
        self.block_size = block_size

    def args(self, query=None):
        query = self.query if query is None else query
        return (
            query,
            self.key_cache,
            self.value_cache,
            self.block_tables,
            self.seq_lens,
            self.query_start_loc,
            HEAD_DIM**-0.5,
        )

    def dense_oracle(self) -> torch.Tensor:
        """Full square causal SDPA over all positions of each un-paged sequence, last rows kept."""
        outs = []
        for queries, keys, values, q_len in self.dense:
            group = queries.shape[1] // keys.shape[1]
            full = F.scaled_dot_product_attention(
                queries.double().transpose(0, 1),
                keys.double().repeat_interleave(group, dim=1).transpose(0, 1),
                values.double().repeat_interleave(group, dim=1).transpose(0, 1),
                is_causal=True,
            )
            outs.append(full.transpose(0, 1)[len(queries) - q_len :])
        return torch.cat(outs).float()


def random_specs(kind: str, rng: random.Random) -> list[tuple[int, int]]:
    if kind == "prefill_no_cache":
        return [(n, n) for n in (rng.randint(2, 40), rng.randint(2, 40))]
    if kind == "cached_prefix":
        return [(rng.randint(2, 30), rng.randint(31, 90)), (rng.randint(2, 9), rng.randint(10, 30))]
    if kind == "decode":
        return [(1, rng.randint(1, 70)) for _ in range(rng.randint(2, 6))]
    if kind == "decode_equal":  # one padded group, no padding: the mask-free path
        return [(1, 37)] * 3
    if kind == "short_chunks":  # several q_len <= PADDED_MAX_Q: one padded group in "auto"
        return [(q, q + rng.randint(0, 50)) for q in (rng.randint(2, 16) for _ in range(4))]
    # mixed: a fresh prompt, a cached-prefix chunk, decodes, a single-token context
    return [(13, 13), (1, 40), (7, 29), (1, 1), (1, rng.randint(2, 60)), (20, 71)]


KINDS = ["prefill_no_cache", "cached_prefix", "decode", "decode_equal", "short_chunks", "mixed"]


@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (8, 2)], ids=["gqa1", "gqa2", "gqa4"])
@pytest.mark.parametrize("kind", KINDS)
def test_paged_attention_matches_both_oracles(block_size, heads, kind):
    seed = 1000 * KINDS.index(kind) + 10 * block_size + heads[0] // heads[1]
    batch = PagedBatch(random_specs(kind, random.Random(seed)), block_size, *heads, seed=seed)
    reference = paged_attention_reference(*batch.args())
    torch.testing.assert_close(reference, batch.dense_oracle(), atol=ATOL, rtol=0)
    meta = (batch.block_tables, batch.seq_lens, batch.query_start_loc, block_size)
    for strategy in STRATEGIES:
        out = paged_attention(*batch.args(), plan=make_plan(*meta, strategy=strategy))
        assert out.shape == batch.query.shape and out.dtype == batch.query.dtype
        torch.testing.assert_close(out, reference, atol=ATOL, rtol=0, msg=strategy)


@pytest.mark.parametrize("strategy", ["auto", "loop", "padded"])
def test_long_chunk_on_cached_prefix(strategy):
    """q_len >= SPLIT_MIN_Q takes the prefix/new-tokens split path in loop mode."""
    specs = [(pa.SPLIT_MIN_Q + 5, pa.SPLIT_MIN_Q + 40), (1, 33), (pa.SPLIT_MIN_Q, pa.SPLIT_MIN_Q)]
    batch = PagedBatch(specs, 16, 8, 2, seed=3)
    plan = make_plan(
        batch.block_tables, batch.seq_lens, batch.query_start_loc, 16, strategy=strategy
    )
    out = paged_attention(*batch.args(), plan=plan)
    torch.testing.assert_close(out, batch.dense_oracle(), atol=ATOL, rtol=0)


def test_plan_is_reused_across_layers_and_optional():
    batch = PagedBatch(random_specs("mixed", random.Random(5)), 4, 4, 2, seed=5)
    plan = make_plan(batch.block_tables, batch.seq_lens, batch.query_start_loc, 4)
    for _ in range(2):  # a second "layer": new queries and caches, the same plan
        query = torch.randn_like(batch.query)
        batch.key_cache.normal_()
        expected = paged_attention_reference(*batch.args(query))
        torch.testing.assert_close(
            paged_attention(*batch.args(query), plan=plan), expected, atol=ATOL, rtol=0
        )
        torch.testing.assert_close(paged_attention(*batch.args(query)), expected, atol=ATOL, rtol=0)


def test_bfloat16_keeps_dtype():
    batch = PagedBatch(random_specs("mixed", random.Random(6)), 4, 4, 2, seed=6)
    batch.key_cache, batch.value_cache = batch.key_cache.bfloat16(), batch.value_cache.bfloat16()
    query = batch.query.bfloat16()
    out = paged_attention(*batch.args(query))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(
        out.float(), paged_attention_reference(*batch.args(query)).float(), atol=3e-2, rtol=0
    )


def test_make_plan_rejects_inconsistent_metadata():
    tables = torch.zeros(1, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="q_len=5, seq_len=4"):
        make_plan(tables, torch.tensor([4]), torch.tensor([0, 5]), 4)
    with pytest.raises(ValueError, match="block table width=2"):
        make_plan(tables, torch.tensor([9]), torch.tensor([0, 1]), 4)
    with pytest.raises(ValueError, match="strategy"):
        make_plan(tables, torch.tensor([4]), torch.tensor([0, 1]), 4, strategy="fast")
