"""Structured output (SamplingParams.json_schema) against transformers on the same weights: the
oracle is `model.generate` with a logits processor that masks, at every step, each token whose
bytes the grammar refuses after the tokens so far (brute force over the vocabulary: none of the
engine's cached masks or shortcuts), EOS allowed only once the JSON is whole. Greedy tokens must
be equal, with unconstrained and sampled rows in the same batch: eagerly, padded, with steps
launched ahead for the others, under preemption, and from the prefix cache. Finished replies
parse and follow their schema; a choice (vLLM's) is one of its texts."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import make_engine, shared_prefix_prompts
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LogitsProcessor

from omni.core.json_grammar import initial, is_complete, step
from omni.core.json_schema import CHOICE, compile_schema
from omni.core.sampling_params import SamplingParams
from omni.engine.json_outputs import token_bytes
from omni.messages import StageInput

MAX_NEW = 24
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
    },
    "required": ["age", "ok"],
}
CHOICES = ["yes", "yes, gladly", "no", "Ünclear"]  # vLLM's `choice`: texts, one a prefix
SCHEMAS = {"schema": SCHEMA, "object": {"type": "object"}, "enum": {"enum": [1, 22, "x"]},
           "choice": {CHOICE: CHOICES}}  # fmt: skip


class GrammarMask(LogitsProcessor):
    def __init__(self, schema, tokens: list[bytes | None], eos: int, num_prompt: int) -> None:
        self.root, self.tokens, self.eos, self.num_prompt = (
            compile_schema(schema),
            tokens,
            eos,
            num_prompt,
        )

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        state = initial(self.root)
        for token_id in input_ids[0, self.num_prompt :].tolist():
            for byte in self.tokens[token_id] or b"":
                state = step(state, byte)
        allowed = torch.zeros(scores.shape[1], dtype=torch.bool)
        for token_id, data in enumerate(self.tokens):
            current = state
            for byte in data or b"":
                current = current and step(current, byte)
            allowed[token_id] = bool(data) and current is not None
        allowed[self.eos] = is_complete(state)
        return scores.masked_fill(~allowed, float("-inf"))


@pytest.fixture(scope="module")
def case(qwen2_dir):
    model = AutoModelForCausalLM.from_pretrained(qwen2_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(qwen2_dir)
    tokens, eos = token_bytes(tokenizer), model.config.eos_token_id
    prompts = shared_prefix_prompts(model.config.vocab_size, num_prompts=6)
    config = GenerationConfig(
        max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0, eos_token_id=eos
    )
    expected = {}
    with torch.inference_mode():
        for name, schema in SCHEMAS.items():
            for i, prompt in enumerate(prompts):
                ids = torch.tensor([prompt])
                processor = GrammarMask(schema, tokens, eos, len(prompt))
                out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                                     logits_processor=[processor])  # fmt: skip
                expected[name, i] = out[0, len(prompt) :].tolist()
    return qwen2_dir, prompts, expected, tokenizer


ENGINES = {
    "eager": {},
    "padded": {"cuda_graphs": True},
    "ahead": {"cuda_graphs": True, "async_scheduling": True},
    "tiny-pool": {"num_blocks": 40, "max_model_len": 160},
}


def run_mixed(engine, prompts, prefix: str) -> dict:
    """Every prompt under each schema, beside unconstrained greedy and seeded sampled rows."""
    for name, schema in SCHEMAS.items():
        params = SamplingParams(max_tokens=MAX_NEW, json_schema=schema)
        for i, prompt in enumerate(prompts):
            engine.add_request(StageInput(f"{prefix}{name}-{i}", prompt, params))
    plain = SamplingParams(max_tokens=2 * MAX_NEW, ignore_eos=True)  # alone after the others
    sampled = SamplingParams(max_tokens=MAX_NEW, temperature=1.0, seed=5, json_schema=SCHEMA)
    for i, prompt in enumerate(prompts[:3]):
        engine.add_request(StageInput(f"{prefix}plain-{i}", prompt, plain))
        engine.add_request(StageInput(f"{prefix}sampled-{i}", prompt, sampled))
    return {r.request_id: r for r in engine.run_until_done()}


def check_reply(tokenizer, result, schema) -> None:
    """A finished reply is whole JSON of its schema; one cut by max_tokens is a live prefix."""
    text = tokenizer.decode(result.token_ids, skip_special_tokens=True)
    state = initial(compile_schema(schema))
    for byte in text.encode():
        state = step(state, byte)
        assert state is not None, text
    if result.finish_reason == "stopped":
        assert is_complete(state), text
        if CHOICE in schema:
            assert text in CHOICES, text
            return
        value = json.loads(text)
        if schema is SCHEMA:
            assert set(value) >= {"age", "ok"} and isinstance(value["age"], int), value


@pytest.mark.parametrize("name", list(ENGINES))
def test_constrained_greedy_tokens_equal_transformers(case, name):
    model_dir, prompts, expected, tokenizer = case
    engine = make_engine(model_dir, block_size=4, max_num_seqs=8, **ENGINES[name])
    rounds = 2 if name == "eager" else 1  # the second round from the prefix cache
    for round_ in range(rounds):
        results = run_mixed(engine, prompts, f"r{round_}-")
        for (schema_name, i), want in expected.items():
            result = results[f"r{round_}-{schema_name}-{i}"]
            assert result.token_ids == want, (name, schema_name, i)
            check_reply(tokenizer, result, SCHEMAS[schema_name])
        for i in range(3):
            assert len(results[f"r{round_}-plain-{i}"].token_ids) == 2 * MAX_NEW
            check_reply(tokenizer, results[f"r{round_}-sampled-{i}"], SCHEMA)
    stats = engine.stats()
    assert stats["json_schemas"] == len(SCHEMAS) and stats["json_masks_computed"] > 0
    if name == "eager":
        assert stats["kv_hit_tokens"] > 0
    if name == "tiny-pool":
        assert stats["preemptions"] > 0
    if name == "ahead":
        assert stats["steps_launched_ahead"] > 0  # only while no constrained request ran
    assert any(r.finish_reason == "stopped" for r in results.values())


def test_token_bytes_spell_each_token(case):
    _, _, _, tokenizer = case
    tokens = token_bytes(tokenizer)
    special = set(tokenizer.all_special_ids)
    assert all(tokens[i] is None for i in special)
    for token_id, data in enumerate(tokens):
        if data is not None and token_id not in special:
            assert data.decode("utf-8", "replace") == tokenizer.decode([token_id]), token_id


def test_schemas_kept_are_bounded_and_an_evicted_one_still_serves_its_cursors(qwen2_dir):
    from omni.engine.json_outputs import MAX_SCHEMAS, JsonOutputs

    outputs = JsonOutputs(qwen2_dir, 512, eos_token_id=2)
    first = outputs.cursor(SamplingParams(json_schema={"enum": [0]}))
    assert first is not None
    for value in range(1, MAX_SCHEMAS + 5):  # a schema of its own per request
        outputs.cursor(SamplingParams(json_schema={"enum": [value]}))
    assert outputs.stats()["json_schemas"] == MAX_SCHEMAS  # the first ones are out
    mask = first.allowed()
    zero = [t for t, data in enumerate(outputs._vocab.tokens) if data == b"0"]
    assert zero and mask[zero[0]] and mask.sum() == len(zero)  # its own schema's mask
