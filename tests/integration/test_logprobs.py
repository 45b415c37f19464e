"""SamplingParams.logprobs: each sampled token's log-probability and the most likely
alternatives, against transformers on the same weights. The oracle is teacher-forced: one
forward of prompt + our tokens, log_softmax of the raw logits at every sampled position (what
we return whatever the temperature, penalties or bias). Greedy and sampled rows, rows with and
without logprobs and with different k in one batch; eagerly, padded, launched ahead, under
preemption, and served from the prefix cache."""

from __future__ import annotations

import pytest
import torch
from helpers import make_engine, shared_prefix_prompts
from transformers import AutoModelForCausalLM

from omni.core.sampling_params import SamplingParams
from omni.messages import StageInput

MAX_NEW = 12
TOLERANCE = 1e-4  # float32, our paged batch against transformers' own forward
KINDS = {
    "greedy5": SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, logprobs=5),
    "greedy0": SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, logprobs=0),
    "sampled": SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, logprobs=3, temperature=1.3,
                              top_k=7, seed=11, presence_penalty=0.5, logit_bias={5: 4.0}),
    "none": SamplingParams(max_tokens=MAX_NEW, ignore_eos=True),
}  # fmt: skip


@pytest.fixture(scope="module")
def oracle(qwen2_dir):
    model = AutoModelForCausalLM.from_pretrained(
        qwen2_dir, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()

    def logprobs(prompt: list[int], output: list[int]) -> torch.Tensor:
        """[len(output), vocab]: log p(. | prompt + output[:i]) for each i."""
        with torch.inference_mode():
            logits = model(torch.tensor([prompt + output])).logits[0]
        return torch.log_softmax(logits[len(prompt) - 1 : -1].float(), dim=-1)

    return logprobs


@pytest.fixture(scope="module")
def prompt_oracle(qwen2_dir):
    model = AutoModelForCausalLM.from_pretrained(
        qwen2_dir, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()

    def logprobs(prompt: list[int]) -> torch.Tensor:
        """[len(prompt) - 1, vocab]: log p(. | prompt[:i]) for i = 1 .. len(prompt) - 1."""
        with torch.inference_mode():
            logits = model(torch.tensor([prompt])).logits[0]
        return torch.log_softmax(logits[:-1].float(), dim=-1)

    return logprobs


def check(result, prompt, params, oracle, tolerance: float = TOLERANCE) -> None:
    if params.logprobs is None:
        assert result.logprobs is None
        return
    assert len(result.logprobs) == len(result.token_ids) == MAX_NEW
    expected = oracle(prompt, result.token_ids)
    for i, (token, entry) in enumerate(zip(result.token_ids, result.logprobs, strict=True)):
        assert abs(entry.logprob - expected[i, token].item()) < tolerance, (i, token)
        values, ids = expected[i].topk(params.logprobs)
        assert [t for t, _ in entry.top] == ids.tolist(), i
        top_values = [v for _, v in entry.top]
        assert all(abs(v - e) < tolerance for v, e in zip(top_values, values.tolist(), strict=True))
        if params.greedy:  # the sampled token is the most likely one
            assert entry.top[:1] in ((), ((token, entry.logprob),))


CONFIGS = {
    "eager": {"block_size": 4},
    "padded": {"block_size": 4, "cuda_graphs": True, "max_num_seqs": 8},
    "ahead": {"block_size": 4, "cuda_graphs": True, "max_num_seqs": 8, "async_scheduling": True},
    "tiny-pool": {"block_size": 4, "num_blocks": 40, "max_model_len": 160},
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logprobs_equal_transformers(qwen2_dir, oracle, name):
    """Every kind of row in one batch gets the teacher-forced oracle's logprobs; the second
    round (prefix hits, and the same seeds) gives the same tokens and logprobs; each update
    carries its token's logprobs, and the updates join to the result's."""
    from transformers import AutoConfig

    prompts = shared_prefix_prompts(AutoConfig.from_pretrained(qwen2_dir).vocab_size, 3)
    engine = make_engine(qwen2_dir, **CONFIGS[name])
    rounds = []
    for round_index in range(2):
        for i, prompt in enumerate(prompts):
            for kind, params in KINDS.items():
                engine.add_request(StageInput(f"{kind}-{i}-{round_index}", prompt, params))
        updates: dict[str, list] = {}
        results = {}
        while engine.has_unfinished:
            out = engine.step()
            for update in out.updates:
                updates.setdefault(update.request_id, []).extend(update.new_logprobs)
            results.update({r.request_id: r for r in out.finished})
        rounds.append(results)
        for request_id, result in results.items():
            kind, i, _ = request_id.split("-")
            check(result, prompts[int(i)], KINDS[kind], oracle)
            assert updates.get(request_id, []) == (result.logprobs or []), request_id
    stats = engine.stats()
    if name != "tiny-pool":
        assert stats["kv_hit_tokens"] > 0
    else:
        assert stats["preemptions"] > 0
    assert (stats["steps_launched_ahead"] > 0) == (name == "ahead")
    for key, result in rounds[0].items():
        again = rounds[1][key[:-1] + "1"]
        assert again.token_ids == result.token_ids
        if result.logprobs is not None:
            assert again.logprobs is not None
            for a, b in zip(result.logprobs, again.logprobs, strict=True):
                assert abs(a.logprob - b.logprob) < TOLERANCE
                assert [t for t, _ in a.top] == [t for t, _ in b.top]


@pytest.mark.parametrize("value", [-1, 21, True, 2.0, "3"])
def test_logprobs_out_of_range_is_refused_naming_the_field(value):
    with pytest.raises(
        ValueError, match=r"SamplingParams\.logprobs must be an integer in \[0, 20\]"
    ):
        SamplingParams(logprobs=value)


PROMPT_CONFIGS = {
    "eager": {"block_size": 4},
    "chunked": {"block_size": 4, "max_num_batched_tokens": 16},
    "padded-ahead": {"block_size": 4, "cuda_graphs": True, "max_num_seqs": 8,
                     "async_scheduling": True},
    "tiny-pool": {"block_size": 4, "num_blocks": 40, "max_model_len": 160,
                  "max_num_batched_tokens": 24},
}  # fmt: skip


@pytest.mark.parametrize("name", list(PROMPT_CONFIGS))
def test_prompt_logprobs_equal_transformers(qwen2_dir, prompt_oracle, name):
    """Each prompt token's logprob (given the tokens before it) and top 3: every position
    computed even where the prefix cache holds the prompt (a second round of the same prompts),
    in chunks, beside requests that ask for none, under preemption."""
    from transformers import AutoConfig

    prompts = shared_prefix_prompts(AutoConfig.from_pretrained(qwen2_dir).vocab_size, 4)
    engine = make_engine(qwen2_dir, **PROMPT_CONFIGS[name])
    asking = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, prompt_logprobs=3, logprobs=1)
    plain = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    for round_index in range(2):
        for i, prompt in enumerate(prompts):
            engine.add_request(StageInput(f"plain-{i}-{round_index}", prompt, plain))
            engine.add_request(StageInput(f"ask-{i}-{round_index}", prompt, asking))
        results = {r.request_id: r for r in engine.run_until_done()}
        for i, prompt in enumerate(prompts):
            assert results[f"plain-{i}-{round_index}"].prompt_logprobs is None
            got = results[f"ask-{i}-{round_index}"]
            assert got.token_ids == results[f"plain-{i}-{round_index}"].token_ids
            assert got.num_cached_tokens == 0  # no hit taken: every position is computed
            assert got.prompt_logprobs is not None and got.prompt_logprobs[0] is None
            assert len(got.prompt_logprobs) == len(prompt)
            expected = prompt_oracle(prompt)
            for position, entry in enumerate(got.prompt_logprobs[1:], 1):
                assert entry is not None
                row = expected[position - 1]
                assert abs(entry.logprob - row[prompt[position]].item()) < TOLERANCE, position
                values, ids = row.topk(3)
                assert [t for t, _ in entry.top] == ids.tolist(), position
                assert all(
                    abs(v - e) < TOLERANCE
                    for (_, v), e in zip(entry.top, values.tolist(), strict=False)
                )
    stats = engine.stats()
    assert stats["kv_hit_tokens"] > 0  # the plain requests still hit
    if name == "tiny-pool":
        assert stats["preemptions"] > 0


def test_asking_for_logprobs_changes_nothing_else_in_the_omni_pipeline(omni_dir):
    """Qwen2.5-Omni (tiny, CPU): the thinker's logprobs and prompt logprobs, and the talker's,
    beside the same request without them: equal thinker tokens, talker codes and waveform; the
    greedy thinker's own token is its top alternative."""
    from helpers import OMNI_ON_CPU

    from omni import Omni

    def params(**asked: int) -> list[SamplingParams]:
        return [
            SamplingParams(max_tokens=6, ignore_eos=True, **asked),
            SamplingParams(max_tokens=8, logprobs=asked.get("logprobs")),
            SamplingParams(max_tokens=1, seed=0),
        ]

    with Omni(model=omni_dir, runtime={"backend": "local"}, **OMNI_ON_CPU) as omni:
        (plain,) = omni.generate(["hello there"], params(), use_tqdm=False)
        (asked,) = omni.generate(["hello there"], params(logprobs=2, prompt_logprobs=1),
                                 use_tqdm=False)  # fmt: skip
    thinker, talker = asked.stages["thinker"], asked.stages["talker"]
    assert thinker.token_ids == plain.stages["thinker"].token_ids
    assert talker.token_ids == plain.stages["talker"].token_ids
    assert torch.equal(asked.final.audio, plain.final.audio)
    assert thinker.logprobs is not None and talker.logprobs is not None
    assert [e.top[0][0] for e in thinker.logprobs] == thinker.token_ids
    assert len(talker.logprobs) == len(talker.token_ids)
    assert thinker.prompt_logprobs is not None and thinker.prompt_logprobs[0] is None
    assert len(thinker.prompt_logprobs) == len(thinker.prompt_token_ids)
    assert plain.stages["thinker"].logprobs is None
