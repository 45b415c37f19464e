"""OpenAI's presence and frequency penalties (omni/runtime/output_penalties.py) and logit bias:
the counts and their arithmetic, and an engine's greedy tokens against transformers' `generate`
with a logits processor doing what OpenAI documents (logit + bias - presence * [count > 0] -
frequency * count over the tokens generated so far), eagerly, padded, launched ahead and under
preemption."""

from __future__ import annotations

import pytest
import torch
from helpers import make_engine, shared_prefix_prompts, transformers_greedy
from transformers import LogitsProcessor

from omni.core.sampling_params import SamplingParams
from omni.messages import StageInput
from omni.runtime.output_penalties import OutputPenalties
from omni.runtime.sampler import Sampler

MAX_NEW = 24
# (presence, frequency, logit_bias): on this tiny model each case's tokens change if any of its
# terms is dropped.
PENALTIES = {"presence": (1.8, 0.4, {}), "frequency": (0.3, 1.5, {}), "bias": (0.0, 0.0, {7: 9.0})}


class OpenAIPenalties(LogitsProcessor):
    """OpenAI's formula on the tokens generated after the prompt, plus a logit bias (the oracle)."""

    def __init__(
        self, prompt_len: int, presence: float, frequency: float, bias: dict[int, float]
    ) -> None:
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency
        self.bias = bias

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.Tensor:
        counts = torch.zeros_like(scores)
        generated = input_ids[:, self.prompt_len :]
        counts.scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        scores = scores.clone()
        for token, bias in self.bias.items():
            scores[:, token] += bias
        return scores - self.presence * (counts > 0) - self.frequency * counts


@pytest.fixture(scope="module")
def case(qwen2_dir):
    from transformers import AutoConfig

    prompts = shared_prefix_prompts(AutoConfig.from_pretrained(qwen2_dir).vocab_size, 3)
    plain = transformers_greedy(qwen2_dir, prompts, MAX_NEW)
    penalized = {
        kind: transformers_greedy(
            qwen2_dir, prompts, MAX_NEW, lambda prompt, v=values: OpenAIPenalties(len(prompt), *v)
        )
        for kind, values in PENALTIES.items()
    }
    return prompts, penalized, plain


CONFIGS = {
    "eager": {"block_size": 4},
    "padded": {"block_size": 4, "cuda_graphs": True, "max_num_seqs": 6},
    "ahead": {"block_size": 4, "cuda_graphs": True, "max_num_seqs": 6, "async_scheduling": True},
    "tiny-pool": {"block_size": 4, "num_blocks": 40, "max_model_len": 160},
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_tokens_equal_transformers_with_openai_penalties(qwen2_dir, case, name):
    """Penalized requests beside unpenalized ones in one engine: each gets its own oracle's
    tokens (the plain ones plain greedy), and every request's counts are released."""
    prompts, expected, plain_expected = case
    engine = make_engine(qwen2_dir, **CONFIGS[name])
    plain = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        for kind, (presence, frequency, bias) in PENALTIES.items():
            params = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, presence_penalty=presence,
                                    frequency_penalty=frequency, logit_bias=bias)  # fmt: skip
            engine.add_request(StageInput(f"{kind}{i}", prompt, params))
        engine.add_request(StageInput(f"plain{i}", prompt, plain))
    results = {r.request_id: r.token_ids for r in engine.run_until_done()}
    for kind in PENALTIES:
        assert [results[f"{kind}{i}"] for i in range(len(prompts))] == expected[kind], kind
        assert expected[kind] != plain_expected
    assert [results[f"plain{i}"] for i in range(len(prompts))] == plain_expected
    if name == "tiny-pool":
        assert engine.stats()["preemptions"] > 0
    assert not engine.runner.sampler.penalties._slots  # every request's counts released


def test_counts_and_arithmetic():
    penalties = OutputPenalties()
    logits = torch.zeros(3, 10)
    params = [
        SamplingParams(presence_penalty=1.0, frequency_penalty=0.5),
        SamplingParams(),
        SamplingParams(frequency_penalty=-2.0),
    ]
    ids = ["a", "b", "c"]
    for token in ([4, 1, 7], [4, 2, 7], [5, 3, 7]):  # as a step does: apply, choose, record
        penalties.apply(logits, ids, params)
        penalties.record(ids, params, torch.tensor(token))
    got = penalties.apply(logits, ids, params)
    expected = torch.zeros(3, 10)
    expected[0, 4] = -(1.0 + 0.5 * 2)  # "a" generated 4 twice, 5 once
    expected[0, 5] = -(1.0 + 0.5 * 1)
    expected[2, 7] = 2.0 * 3  # a negative frequency penalty raises; "b" is not penalized
    assert torch.equal(got, expected) and torch.equal(logits, torch.zeros(3, 10))  # a copy


def test_slots_grow_and_are_reused():
    penalties = OutputPenalties()
    params = [SamplingParams(presence_penalty=1.0)]
    for n in range(6):  # more requests than the first 4 slots
        penalties.apply(torch.zeros(1, 8), [f"r{n}"], params)
        penalties.record([f"r{n}"], params, torch.tensor([n]))
    assert penalties.counts is not None and penalties.counts.shape[0] == 8
    penalties.release(["r0"])
    got = penalties.apply(torch.zeros(1, 8), ["new"], params)  # r0's slot, zeroed
    assert torch.equal(got, torch.zeros(1, 8))
    assert torch.equal(penalties.apply(torch.zeros(1, 8), ["r5"], params)[0, 5], torch.tensor(-1.0))


def test_a_penalized_step_syncs_only_for_its_ids():
    from tests.sync_counter import SyncCounter

    logits = torch.randn(4, 50)
    penalized = SamplingParams(presence_penalty=1.0, frequency_penalty=0.5)
    params = [penalized, SamplingParams(), SamplingParams(temperature=1.0, top_k=5, seed=1)] + [
        SamplingParams(temperature=0.7, frequency_penalty=1.0)
    ]
    sampler = Sampler()
    ids = ["a", "b", "c", "d"]
    with SyncCounter({"sampler": Sampler.__call__}) as counter:
        for n in range(3):
            sampler(logits, params, [n] * 4, adjusted=ids)
    assert counter.of("sampler") == ["tolist"] * 3


def test_logit_bias_outside_the_vocabulary_is_refused_before_any_work(qwen2_dir):
    engine = make_engine(qwen2_dir, block_size=4)
    params = SamplingParams(max_tokens=2, logit_bias={10**6: 1.0})
    with pytest.raises(ValueError, match="logit_bias token id 1000000 is outside the vocabulary"):
        engine.add_request(StageInput("r", [1, 2, 3], params))
    assert engine.num_requests == 0
