"""vLLM's sampling extras: repetition_penalty and min_tokens against transformers' own logits
processors in `generate` (RepetitionPenaltyLogitsProcessor over the prompt and the generated
tokens; MinNewTokensLengthLogitsProcessor), greedy, beside plain requests in one engine: eagerly,
padded, launched ahead, under preemption and from the prefix cache (a second round). min_p against
transformers' MinPLogitsWarper is in tests/unit/test_sampler.py."""

from __future__ import annotations

import pytest
from helpers import make_engine, shared_prefix_prompts, transformers_greedy
from transformers import MinNewTokensLengthLogitsProcessor, RepetitionPenaltyLogitsProcessor

from omni.core.sampling_params import SamplingParams
from omni.messages import StageInput

MAX_NEW, MIN_TOKENS, PENALTY = 20, 12, 1.8
CONFIGS = {
    "eager": {"block_size": 4},
    "padded": {"block_size": 4, "cuda_graphs": True, "max_num_seqs": 8},
    "ahead": {"block_size": 4, "cuda_graphs": True, "max_num_seqs": 8, "async_scheduling": True},
    "tiny-pool": {"block_size": 4, "num_blocks": 40, "max_model_len": 160},
}


@pytest.fixture(scope="module")
def case(qwen2_dir):
    from transformers import AutoConfig

    prompts = shared_prefix_prompts(AutoConfig.from_pretrained(qwen2_dir).vocab_size, 4)
    plain = transformers_greedy(qwen2_dir, prompts, MAX_NEW)
    stop = plain[0][2]  # prompt 0's third token: without min_tokens it stops there
    repeated = transformers_greedy(
        qwen2_dir, prompts, MAX_NEW, lambda prompt: RepetitionPenaltyLogitsProcessor(PENALTY)
    )
    held = transformers_greedy(
        qwen2_dir, prompts, MAX_NEW,
        lambda prompt: MinNewTokensLengthLogitsProcessor(len(prompt), MIN_TOKENS, [stop]),
    )  # fmt: skip
    # transformers runs on (its eos unset); the engine stops at the first stop from MIN_TOKENS on
    held = [_until_stop(tokens, stop) for tokens in held]
    assert repeated != plain and held[0] != _until_stop(plain[0], stop)  # both change tokens
    assert len(held[0]) > MIN_TOKENS > 3  # prompt 0 would have stopped at 3
    return prompts, stop, {"repeated": repeated, "held": held, "plain": plain}


def _until_stop(tokens: list[int], stop: int) -> list[int]:
    return tokens[: tokens.index(stop) + 1] if stop in tokens else tokens


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_tokens_equal_transformers_processors(qwen2_dir, case, name):
    prompts, stop, expected = case
    engine = make_engine(qwen2_dir, **CONFIGS[name])
    kinds = {
        "repeated": SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, repetition_penalty=PENALTY),
        "held": SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, stop_token_ids=[stop],
                               min_tokens=MIN_TOKENS),
        "plain": SamplingParams(max_tokens=MAX_NEW, ignore_eos=True),
    }  # fmt: skip
    for round_ in range(2):  # the second round's prompts are in the prefix cache
        for i, prompt in enumerate(prompts):
            for kind, params in kinds.items():
                engine.add_request(StageInput(f"{round_}-{kind}{i}", prompt, params))
        results = {r.request_id: r.token_ids for r in engine.run_until_done()}
        for kind in kinds:
            got = [results[f"{round_}-{kind}{i}"] for i in range(len(prompts))]
            assert got == expected[kind], (round_, kind)
    stats = engine.stats()
    assert stats["kv_hit_tokens"] > 0
    if name == "tiny-pool":
        assert stats["preemptions"] > 0
    if name == "ahead":
        assert stats["steps_launched_ahead"] > 0
    assert not engine.runner.sampler.penalties._slots  # every request's rows released
    assert not engine.runner.sampler.penalties._prompts


def test_min_tokens_past_max_tokens_is_refused():
    with pytest.raises(ValueError, match="min_tokens must be at most max_tokens \\(4\\), got 5"):
        SamplingParams(max_tokens=4, min_tokens=5)
    with pytest.raises(ValueError, match="repetition_penalty must be a finite number > 0"):
        SamplingParams(repetition_penalty=0)
    with pytest.raises(ValueError, match="min_p must be a finite number in \\[0, 1\\]"):
        SamplingParams(min_p=1.5)


def test_the_fields_over_http(qwen2_dir, case):
    """vLLM's fields at the top level of a request (the openai client's extra_body) reach the
    text stage: the penalized completion of prompt 0 is transformers' tokens (ignore_eos); with
    stop_token_ids its plain completion stops at that token, and with include_stop_str_in_output
    its text ends with the stop string (whole and streamed); bad values are 400s naming the
    field."""
    import openai
    from fastapi.testclient import TestClient
    from helpers import on_cpu
    from transformers import AutoTokenizer

    from omni import AsyncOmni
    from omni.entrypoints.openai.app import build_app
    from omni.entrypoints.openai.args import ServerArgs

    prompts, stop, expected = case
    tokenizer = AutoTokenizer.from_pretrained(qwen2_dir)
    engine = AsyncOmni(model=qwen2_dir, runtime={"backend": "local"}, **on_cpu("llm"))
    kwargs = dict(model="lm", prompt=prompts[0], max_tokens=MAX_NEW, temperature=0)
    try:
        with TestClient(build_app(engine, ServerArgs("lm"))) as http:
            client = openai.OpenAI(base_url="http://testserver/v1", api_key="-", http_client=http)
            extra = {"ignore_eos": True, "repetition_penalty": PENALTY, "min_p": 0.5,
                     "min_tokens": 2}  # fmt: skip
            penalized = client.completions.create(**kwargs, extra_body=extra)
            by_token = {"ignore_eos": True, "stop_token_ids": [stop, 10**9]}
            stopped = [
                client.completions.create(**kwargs, extra_body=by_token),
                _joined(client.completions.create(**kwargs, extra_body=by_token, stream=True)),
                client.completions.create(
                    **kwargs, extra_body=by_token | {"include_stop_str_in_output": True}
                ),
            ]
            token_text = tokenizer.decode(expected["plain"][0][:3])[len(
                tokenizer.decode(expected["plain"][0][:2])):]  # fmt: skip
            text = tokenizer.decode(expected["plain"][0], skip_special_tokens=True)
            cut = text[len(text) // 2 : len(text) // 2 + 4]  # a stop string of its second half
            kept = {"ignore_eos": True, "include_stop_str_in_output": True}
            through = [
                client.completions.create(**kwargs, stop=[cut], extra_body=kept).choices[0].text,
                "".join(c.choices[0].text for c in client.completions.create(
                    **kwargs, stop=[cut], extra_body=kept, stream=True) if c.choices),
                client.completions.create(**kwargs, stop=[cut], extra_body=kept | {
                    "include_stop_str_in_output": False}).choices[0].text,
            ]  # fmt: skip
            errors = {}
            for field, value in [
                ("min_p", 1.5),
                ("min_tokens", MAX_NEW + 1),
                ("repetition_penalty", 0),
                ("stop_token_ids", [3, -1]),
                ("ignore_eos", "yes"),
            ]:
                with pytest.raises(openai.BadRequestError) as info:
                    client.completions.create(**kwargs, extra_body={field: value})
                errors[field] = info.value.body["param"]
    finally:
        engine.shutdown()
    want = tokenizer.decode(expected["repeated"][0], skip_special_tokens=True)
    assert penalized.choices[0].text == want
    assert penalized.usage.completion_tokens == MAX_NEW  # EOS ignored
    # as vLLM: the stop token's own text is left out, unless include_stop_str_in_output
    want = tokenizer.decode(expected["plain"][0][:2], skip_special_tokens=True)
    assert [s.choices[0].text for s in stopped] == [want, want, want + token_text]
    assert stopped[0].choices[0].finish_reason == "stop" and stopped[0].usage.completion_tokens == 3
    end = text.index(cut) + len(cut)
    assert through == [text[:end], text[:end], text[: text.index(cut)]] and cut.strip()
    assert errors == {
        "min_p": "min_p",
        "min_tokens": "min_tokens",
        "repetition_penalty": "repetition_penalty",
        "stop_token_ids": "stop_token_ids[1]",
        "ignore_eos": "ignore_eos",
    }


def _joined(chunks):
    """A streamed completion as one: its text joined, its last finish_reason and usage."""
    from types import SimpleNamespace

    chunks = list(chunks)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    choice = SimpleNamespace(text=text, finish_reason=reason)
    return SimpleNamespace(choices=[choice], usage=None)


def test_repetition_arithmetic_over_prompt_and_output():
    import torch

    from omni.runtime.output_penalties import OutputPenalties

    penalties = OutputPenalties()
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0]] * 2)
    params = [SamplingParams(repetition_penalty=2.0, presence_penalty=0.5), SamplingParams()]
    penalties.note_prompt("a", [0, 1, 99])  # an id past the vocabulary is ignored
    penalties.apply(logits, ["a", "b"], params)
    penalties.record(["a", "b"], params, torch.tensor([2, 3]))
    penalties.note_prompt("a", [3])  # resumed after preemption: the row it holds stays
    got = penalties.apply(logits, ["a", "b"], params)
    # Repetition first (prompt 0, 1 and generated 2), then presence (generated 2 only).
    assert got[0].tolist() == [1.0, -4.0, 1.0 - 0.5, -2.0, 1.0] and torch.equal(got[1], logits[1])
    penalties.release(["a", "b"])
    assert not penalties._slots and not penalties._prompts


def test_min_tokens_passes_over_stop_strings_before_it(qwen2_dir, case):
    """A stop string the greedy text meets early ends the request there; with min_tokens past
    it, as vLLM, the text of those steps is not searched and the request runs on."""
    from helpers import on_cpu
    from transformers import AutoTokenizer

    from omni import Omni

    prompts, stop, expected = case
    tokenizer = AutoTokenizer.from_pretrained(qwen2_dir)
    plain = expected["plain"][0]
    stop = tokenizer.decode(plain[1:2])  # met at the second token
    assert stop.strip() and stop not in tokenizer.decode(plain[:1])
    base = dict(max_tokens=MAX_NEW, ignore_eos=True, stop=[stop])
    with Omni(model=qwen2_dir, runtime={"backend": "local"}, **on_cpu("llm")) as lm:
        early, held = (
            lm.generate([prompts[0]], SamplingParams(**base, min_tokens=m), use_tqdm=False)[0].final
            for m in (0, MIN_TOKENS)
        )
    assert early.token_ids == plain[:2] and early.finish_reason == "stopped"
    assert held.token_ids[:MIN_TOKENS] == plain[:MIN_TOKENS] and len(held.token_ids) > MIN_TOKENS
    later = tokenizer.decode(plain[MIN_TOKENS - 1 :])  # stops again only if met later on
    assert (held.finish_reason == "stopped") == (stop in later), (held.finish_reason, later)
