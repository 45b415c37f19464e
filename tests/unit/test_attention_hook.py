"""The registered paged attention hook inside real transformers models (tiny, random weights).

Oracle: the same weights with attn_implementation="sdpa" over the full, unpacked sequence.
"""

import copy
import dataclasses
import random
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from omni.runtime.attention import (
    ATTENTION_NAME,
    AttentionMetadata,
    allocate_kv_caches,
    paged_attention_forward,
    register_paged_attention,
)

BLOCK_SIZE = 4  # small and not dividing the lengths below, so partial blocks are exercised
NUM_BLOCKS = 64
ATOL = 1e-5


pytestmark = pytest.mark.usefixtures("one_torch_thread")


TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=256,
)


def make_models(family: str):
    torch.manual_seed(0)
    if family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**TINY))
    else:
        model = LlamaForCausalLM(LlamaConfig(**TINY))
    model = model.eval()
    model.set_attn_implementation("sdpa")
    paged = copy.deepcopy(model)
    paged.set_attn_implementation(register_paged_attention())
    return model, paged


class PagedSequences:
    """Minimal stand-in for the scheduler + runner: blocks from a shuffled free list."""

    def __init__(self, model):
        config = model.config
        head_dim = config.hidden_size // config.num_attention_heads
        self.model = model
        self.kv_caches = allocate_kv_caches(
            config.num_hidden_layers,
            NUM_BLOCKS,
            BLOCK_SIZE,
            config.num_key_value_heads,
            head_dim,
            torch.float32,
        )
        self.free_blocks = list(range(NUM_BLOCKS))
        random.Random(0).shuffle(self.free_blocks)
        self.blocks: dict[str, list[int]] = {}
        self.lens: dict[str, int] = {}

    def step(self, feeds: dict[str, list[int]], lazy_plan=False) -> dict[str, torch.Tensor]:
        """Feed new tokens for several sequences packed in one row; logits per sequence."""
        input_ids, positions, slots, starts, seq_lens = [], [], [], [0], []
        for name, token_ids in feeds.items():
            start = self.lens.get(name, 0)
            blocks = self.blocks.setdefault(name, [])
            end = start + len(token_ids)
            while len(blocks) * BLOCK_SIZE < end:
                blocks.append(self.free_blocks.pop())
            for pos in range(start, end):
                slots.append(blocks[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
            input_ids += token_ids
            positions += range(start, end)
            starts.append(starts[-1] + len(token_ids))
            seq_lens.append(end)
            self.lens[name] = end
        width = max(len(self.blocks[name]) for name in feeds)
        tables = [self.blocks[name] + [0] * (width - len(self.blocks[name])) for name in feeds]
        meta = AttentionMetadata.build(
            slot_mapping=torch.tensor(slots),
            query_start_loc=torch.tensor(starts),
            seq_lens=torch.tensor(seq_lens),
            block_tables=torch.tensor(tables),
            kv_caches=self.kv_caches,
            block_size=BLOCK_SIZE,
        )
        if lazy_plan:  # metadata made without build(): the hook plans on first use
            meta = dataclasses.replace(meta, plan=None)
        with torch.no_grad():
            logits = self.model(
                input_ids=torch.tensor([input_ids]),
                position_ids=torch.tensor([positions]),
                use_cache=False,
                omni_attn=meta,
            ).logits[0]
        return {name: logits[starts[i] : starts[i + 1]] for i, name in enumerate(feeds)}


def dense_logits(model, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([token_ids])).logits[0]


def random_tokens(n: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["vocab_size"], (n,), generator=generator).tolist()


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def models(request):
    return make_models(request.param)


def test_register_is_idempotent():
    assert register_paged_attention() == ATTENTION_NAME
    assert register_paged_attention() == ATTENTION_NAME


def test_cached_prefix_then_suffix_matches_full_forward(models):
    model, paged = models
    token_ids = random_tokens(23, seed=1)
    expected = dense_logits(model, token_ids)
    runner = PagedSequences(paged)
    prefix = runner.step({"a": token_ids[:10]})["a"]
    suffix = runner.step({"a": token_ids[10:]})["a"]  # only the suffix is fed
    torch.testing.assert_close(prefix, expected[:10], atol=ATOL, rtol=0)
    torch.testing.assert_close(suffix, expected[10:], atol=ATOL, rtol=0)


def test_packed_ragged_batch_matches_each_alone(models):
    model, paged = models
    prompts = {"a": random_tokens(7, 2), "b": random_tokens(13, 3), "c": random_tokens(5, 4)}
    logits = PagedSequences(paged).step(prompts, lazy_plan=True)
    for name, token_ids in prompts.items():
        torch.testing.assert_close(logits[name], dense_logits(model, token_ids), atol=ATOL, rtol=0)


def test_packed_decode_steps_match_full_forward(models):
    model, paged = models
    sequences = {
        name: random_tokens(n, 10 + n) for name, n in zip("abcd", (3, 9, 14, 6), strict=True)
    }
    runner = PagedSequences(paged)
    runner.step(sequences)
    for step in range(3):
        # One new token per sequence, all packed in one row.
        feeds = {name: [(7 * step + i) % TINY["vocab_size"]] for i, name in enumerate(sequences)}
        for name, token_ids in feeds.items():
            sequences[name] = sequences[name] + token_ids
        if step == 1:  # a new prompt rides along with the decodes (mixed batch)
            sequences["e"] = feeds["e"] = random_tokens(6, 99)
        logits = runner.step(feeds)
        for name, token_ids in sequences.items():
            expected = dense_logits(model, token_ids)[-len(feeds[name]) :]
            torch.testing.assert_close(logits[name], expected, atol=ATOL, rtol=0)


def test_missing_metadata_is_a_clear_error(models):
    _, paged = models
    with pytest.raises(RuntimeError, match="omni_attn"), torch.no_grad():
        paged(input_ids=torch.tensor([[1, 2, 3]]), position_ids=torch.tensor([[0, 1, 2]]))


def test_allocate_kv_caches_shapes():
    caches = allocate_kv_caches(3, 5, 4, 2, 8, torch.float32)
    assert len(caches) == 3
    for key_cache, value_cache in caches:
        assert key_cache.shape == value_cache.shape == (5, 4, 2, 8)
        assert key_cache.data_ptr() != value_cache.data_ptr()
        assert not key_cache.any() and not value_cache.any()


def test_forward_writes_cache_and_returns_hf_layout():
    """Direct call, no model: two sequences (3 new tokens on 2 cached, 1 fresh token)."""
    torch.manual_seed(0)
    caches = allocate_kv_caches(2, 4, 2, 1, 8, torch.float32)
    meta = AttentionMetadata.build(
        slot_mapping=torch.tensor([2, 3, 4, 6]),
        query_start_loc=torch.tensor([0, 3, 4]),
        seq_lens=torch.tensor([5, 1]),
        block_tables=torch.tensor([[0, 1, 2], [3, 0, 0]]),
        kv_caches=caches,
        block_size=2,
    )
    query, key, value = torch.randn(1, 2, 4, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    module = SimpleNamespace(layer_idx=1)
    out, weights = paged_attention_forward(module, query, key, value, None, omni_attn=meta)
    assert out.shape == (1, 4, 2, 8) and weights is None
    key_cache = caches[1][0].view(-1, 1, 8)
    assert torch.equal(key_cache[[2, 3, 4, 6]], key[0].transpose(0, 1))
    assert not caches[0][0].any()  # other layers untouched
    # The fresh sequence sees only itself: its output is its own value vector.
    torch.testing.assert_close(out[0, 3], value[0, :, 3].expand(2, 8))
    with pytest.raises(NotImplementedError, match="sliding window"):
        paged_attention_forward(module, query, key, value, None, omni_attn=meta, sliding_window=4)
