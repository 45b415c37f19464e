"""A request without max_tokens: over the OpenAI API it generates until the end of the context, as
OpenAI's and vLLM's do (SamplingParams.max_tokens None), or up to `omni serve --max-tokens`; a
stage makes None the room its prompt leaves in max_model_len, or in its KV pool if that holds
fewer tokens. The tiny Qwen2 with ignore_eos, so only the context ends a reply."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from helpers import make_engine, run_engine

from omni import AsyncOmni
from omni.core.sampling_params import SamplingParams
from omni.engine.request_checks import until_end
from omni.entrypoints.openai import sampling
from omni.entrypoints.openai.app import build_app
from omni.entrypoints.openai.args import ServerArgs
from omni.messages import StageInput

CONTEXT = 40
PROMPT = [5, 9, 13, 17, 21, 25, 29, 33, 37, 41]


def test_none_becomes_the_room_the_prompt_leaves():
    params = SamplingParams(max_tokens=None, ignore_eos=True)
    assert until_end(StageInput("r", PROMPT, params), CONTEXT).max_tokens == CONTEXT - len(PROMPT)
    assert until_end(StageInput("r", PROMPT, params), len(PROMPT)).max_tokens == 1
    explicit = SamplingParams(max_tokens=7)
    assert until_end(StageInput("r", PROMPT, explicit), CONTEXT) is explicit


@pytest.mark.parametrize(
    ("pool", "room"),
    [({"num_blocks": 64}, CONTEXT - len(PROMPT)), ({"num_blocks": 6}, 6 * 4 - len(PROMPT))],
)
def test_an_engine_runs_to_the_end_of_its_context_or_pool(qwen2_dir, pool, room):
    engine = make_engine(qwen2_dir, block_size=4, max_model_len=CONTEXT, **pool)
    (until,) = run_engine(engine, [PROMPT], SamplingParams(max_tokens=None, ignore_eos=True))
    assert until.finish_reason == "length" and len(until.token_ids) == room
    (explicit,) = run_engine(engine, [PROMPT], SamplingParams(max_tokens=room, ignore_eos=True))
    assert explicit.token_ids == until.token_ids
    if pool["num_blocks"] == 6:  # an explicit max_tokens past the pool is refused, not capped
        with pytest.raises(ValueError, match="num_blocks=6"):
            engine.add_request(StageInput("x", PROMPT, SamplingParams(max_tokens=room + 4)))


@pytest.fixture(scope="module")
def async_omni(qwen2_dir):
    overrides = {"runtime": {"backend": "local"}, "stages.llm.engine.device": "cpu"}
    overrides["stages.llm.engine.max_model_len"] = CONTEXT
    engine = AsyncOmni(model=qwen2_dir, **overrides)
    yield engine
    engine.shutdown()


def test_the_text_stage_of_a_plan_runs_until_the_end(async_omni):
    config_max = async_omni.config.stage("llm").sampling.max_tokens
    assert config_max is not None  # the Python API's default
    assert sampling.plan(async_omni, "llm").params["llm"].max_tokens == config_max
    assert sampling.plan(async_omni, "llm", until_end=True).params["llm"].max_tokens is None
    given = sampling.plan(async_omni, "llm", max_tokens=3, until_end=True)
    assert given.params["llm"].max_tokens == 3
    served = sampling.plan(async_omni, "llm", until_end=True, default_max_tokens=6)
    assert served.params["llm"].max_tokens == 6  # omni serve --max-tokens 6
    staged = {"llm": {"max_tokens": 4}}
    plan = sampling.plan(
        async_omni, "llm", stage_sampling=staged, until_end=True, default_max_tokens=6
    )
    assert plan.params["llm"].max_tokens == 4


def _post(client, path: str, body: dict) -> dict:
    response = client.post(path, json={"model": "tiny", **body})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("server_default", [None, 5])
def test_requests_without_max_tokens(async_omni, server_default):
    extra = {"stage_sampling": {"llm": {"ignore_eos": True}}, "temperature": 0}
    args = ServerArgs(model_name="tiny", max_tokens=server_default)
    with TestClient(build_app(async_omni, args)) as client:
        chat = {"messages": [{"role": "user", "content": "hi"}], **extra}
        completion = {"prompt": PROMPT, **extra}
        for path, body in (("/v1/chat/completions", chat), ("/v1/completions", completion)):
            out = _post(client, path, body)
            usage = out["usage"]
            room = CONTEXT - usage["prompt_tokens"]
            assert usage["completion_tokens"] == (server_default or room), (path, usage)
            assert out["choices"][0]["finish_reason"] == "length"
            assert _post(client, path, {**body, "max_tokens": 2})["usage"]["completion_tokens"] == 2
        staged = {"stage_sampling": {"llm": {"ignore_eos": True, "max_tokens": 3}}}
        out = _post(client, "/v1/completions", {**completion, **staged})
        assert out["usage"]["completion_tokens"] == 3
