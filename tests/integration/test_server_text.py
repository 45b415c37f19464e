"""Text options over HTTP with the official `openai` client, against the Python API in this
process for the same prompt: logprobs (chat's `logprobs` / `top_logprobs`, completions'
`logprobs`; their values are checked against transformers in tests/integration/test_logprobs.py)
and stop strings of any length, whole and streamed. A real `omni serve` of the tiny Qwen2 on the
CPU."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
import torch
from helpers import cli_sets, on_cpu
from prometheus_client.parser import text_string_to_metric_families

from omni import Omni
from omni.core.sampling_params import SamplingParams
from omni.entrypoints.openai.hermes_calls import HermesCalls
from omni.entrypoints.openai.prompts import chat_prompt
from tools.make_tiny_checkpoint import ensure_checkpoint
from tools.serve_process import ServeProcess

pytestmark = pytest.mark.slow
NAME, MAX_TOKENS, TOP = "tiny-lm", 8, 3
EXTRA = {"stage_sampling": {"llm": {"ignore_eos": True}}}
MESSAGES = [{"role": "user", "content": "Tell me about foxes."}]


@pytest.fixture(scope="module")
def lm_dir():
    return str(ensure_checkpoint("qwen2", "tiny", 0))


@pytest.fixture(scope="module")
def server(lm_dir):
    args = ["--model", lm_dir, "--served-model-name", NAME, "--set", "runtime.backend=local"]
    process = ServeProcess(args + cli_sets(on_cpu("llm"))).start()
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(lm_dir):
    """The Python API's results (token ids, logprobs, token texts) for both prompts."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=TOP)
    with Omni(model=lm_dir, runtime={"backend": "local"}, **on_cpu("llm")) as lm:
        tokenizer = lm.async_omni.prompt_processor.tokenizer
        prompts = {"completion": "The quick brown fox", "chat": chat_prompt(tokenizer, MESSAGES)}
        out = {}
        for kind, prompt in prompts.items():
            (result,) = lm.generate([prompt], params, use_tqdm=False)
            final = result.final
            ids = final.token_ids + [t for e in final.logprobs for t, _ in e.top]
            texts = dict(zip(ids, lm.async_omni.token_texts("llm", ids), strict=True))
            out[kind] = (final, texts)
    torch.set_num_threads(threads)
    return out


def close(a: float, b: float) -> bool:
    return abs(a - b) < 1e-5  # two processes, the same float32 CPU arithmetic


def test_completions_logprobs_equal_the_python_api(client, reference):
    final, texts = reference["completion"]
    kwargs = dict(model=NAME, prompt="The quick brown fox", max_tokens=MAX_TOKENS, temperature=0)
    whole = client.completions.create(**kwargs, logprobs=TOP, extra_body=EXTRA).choices[0]
    logprobs = whole.logprobs
    assert logprobs.tokens == [texts[t][0] for t in final.token_ids]
    assert all(map(close, logprobs.token_logprobs, [e.logprob for e in final.logprobs]))
    for top, entry in zip(logprobs.top_logprobs, final.logprobs, strict=True):
        expected = {texts[t][0]: v for t, v in entry.top}
        assert top.keys() == expected.keys() and all(close(top[k], expected[k]) for k in top)
    lengths = [len(t) for t in logprobs.tokens]
    assert logprobs.text_offset == [sum(lengths[:i]) for i in range(len(lengths))]
    streamed = client.completions.create(**kwargs, logprobs=TOP, extra_body=EXTRA, stream=True)
    tokens, values = [], []
    for chunk in streamed:
        if chunk.choices and chunk.choices[0].logprobs is not None:
            tokens += chunk.choices[0].logprobs.tokens
            values += chunk.choices[0].logprobs.token_logprobs
    assert tokens == logprobs.tokens and values == logprobs.token_logprobs
    plain = client.completions.create(**kwargs, extra_body=EXTRA).choices[0]
    assert plain.logprobs is None and plain.text == whole.text


def test_chat_logprobs_equal_the_python_api(client, reference):
    final, texts = reference["chat"]
    kwargs = dict(model=NAME, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)
    asked = dict(logprobs=True, top_logprobs=TOP, extra_body=EXTRA)
    whole = client.chat.completions.create(**kwargs, **asked).choices[0]
    content = whole.logprobs.content
    assert [c.token for c in content] == [texts[t][0] for t in final.token_ids]
    assert [c.bytes for c in content] == [texts[t][1] for t in final.token_ids]
    for item, entry in zip(content, final.logprobs, strict=True):
        assert close(item.logprob, entry.logprob)
        assert [t.token for t in item.top_logprobs] == [texts[t][0] for t, _ in entry.top]
        values = [v for _, v in entry.top]
        assert all(map(close, [t.logprob for t in item.top_logprobs], values))
    streamed = client.chat.completions.create(**kwargs, **asked, stream=True)
    pieces = []
    for chunk in streamed:
        if chunk.choices and chunk.choices[0].logprobs is not None:
            pieces += chunk.choices[0].logprobs.content
    assert [(p.token, p.logprob) for p in pieces] == [(c.token, c.logprob) for c in content]
    plain = client.chat.completions.create(**kwargs, extra_body=EXTRA).choices[0]
    assert plain.logprobs is None and plain.message.content == whole.message.content
    zero = client.chat.completions.create(**kwargs, logprobs=True, extra_body=EXTRA).choices[0]
    assert [c.token for c in zero.logprobs.content] == [c.token for c in content]
    assert all(c.top_logprobs == [] for c in zero.logprobs.content)


def test_stop_strings_of_several_tokens_cut_the_text(client, reference):
    final, texts = reference["completion"]
    pieces = [texts[t][0] for t in final.token_ids]
    start = len("".join(pieces[:3])) + 1  # inside token 4, ending inside token 6
    end = len("".join(pieces[:5])) + 1
    full = "".join(pieces)
    stop = full[start:end]
    assert full.find(stop) == start and len(stop) > 2
    kwargs = dict(model=NAME, prompt="The quick brown fox", max_tokens=MAX_TOKENS, temperature=0)
    cut = client.completions.create(**kwargs, stop=[stop], logprobs=0, extra_body=EXTRA)
    choice = cut.choices[0]
    assert choice.text == full[:start] and choice.finish_reason == "stop"
    assert cut.usage.completion_tokens == 6  # through the token that completed the string
    assert choice.logprobs.tokens == pieces[:5]  # the one that completed it is not listed
    streamed = client.completions.create(**kwargs, stop=stop, extra_body=EXTRA, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == full[:start]
    chat_final, chat_texts = reference["chat"]
    chat_full = "".join(chat_texts[t][0] for t in chat_final.token_ids)
    chat_stop = chat_full[4:9]
    expected = chat_full[: chat_full.find(chat_stop)]
    chat = dict(model=NAME, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stop=chat_stop)
    assert client.chat.completions.create(**chat, extra_body=EXTRA).choices[0].message.content == (
        expected
    )
    chunks = client.chat.completions.create(**chat, extra_body=EXTRA, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected


def test_echo_with_logprobs_scores_the_prompt(client, lm_dir):
    """A scoring request as lm-evaluation-harness sends it (echo, logprobs 1, one new token):
    the prompt's tokens first, the first with null logprobs, the values the Python API's
    prompt_logprobs (checked against transformers in tests/integration/test_logprobs.py)."""
    prompt = "The quick brown fox jumps"
    kwargs = dict(model=NAME, prompt=prompt, max_tokens=1, temperature=0, echo=True)
    scored = client.completions.create(**kwargs, logprobs=1, extra_body=EXTRA).choices[0]
    params = SamplingParams(max_tokens=1, ignore_eos=True, logprobs=1, prompt_logprobs=1)
    with Omni(model=lm_dir, runtime={"backend": "local"}, **on_cpu("llm")) as lm:
        (result,) = lm.generate([prompt], params, use_tqdm=False)
        final = result.final
        texts = lm.async_omni.token_texts("llm", final.prompt_token_ids + final.token_ids)
    assert scored.text == prompt + final.text
    logprobs = scored.logprobs
    assert logprobs.tokens == [text for text, _ in texts]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    expected = [e.logprob for e in final.prompt_logprobs[1:]] + [final.logprobs[0].logprob]
    assert all(map(close, logprobs.token_logprobs[1:], expected))
    assert all(len(top) == 1 for top in logprobs.top_logprobs[1:])
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset[-1] == len(prompt)
    plain = client.completions.create(**kwargs, extra_body=EXTRA).choices[0]
    assert plain.text == scored.text and plain.logprobs is None
    streamed = client.completions.create(**kwargs, extra_body=EXTRA, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == scored.text
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(**kwargs, logprobs=1, stream=True)
    assert refused.value.body["param"] == "echo"


def test_completions_with_several_prompts_and_n(client):
    """A list of prompts and `n` samples each: one choice per (prompt, sample), each the same as
    that prompt alone (sample j: the request's seed + j), whole and streamed; the usage counts
    each prompt once and every choice's tokens."""
    prompts = ["The quick brown fox", "Tell me"]
    kwargs = dict(model=NAME, max_tokens=MAX_TOKENS, temperature=1.0, extra_body=EXTRA)
    both = client.completions.create(prompt=prompts, n=3, seed=5, **kwargs)
    assert [c.index for c in both.choices] == list(range(6))
    alone = {
        (i, j): client.completions.create(prompt=p, seed=5 + j, **kwargs)
        for i, p in enumerate(prompts)
        for j in range(3)
    }
    for (i, j), single in alone.items():
        assert both.choices[i * 3 + j].text == single.choices[0].text, (i, j)
    assert len({c.text for c in both.choices[:3]}) > 1  # the samples differ
    prompt_tokens = sum(alone[(i, 0)].usage.prompt_tokens for i in range(2))
    assert both.usage.prompt_tokens == prompt_tokens
    assert both.usage.completion_tokens == 6 * MAX_TOKENS
    streamed = client.completions.create(prompt=prompts, n=3, seed=5, stream=True, **kwargs)
    texts = [""] * 6
    finishes = [None] * 6
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            finishes[choice.index] = choice.finish_reason or finishes[choice.index]
    assert texts == [c.text for c in both.choices] and finishes == ["length"] * 6
    for n in (0, 65):
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(prompt=prompts, n=n, **kwargs)
        assert refused.value.body["param"] == "n"


def test_chat_with_n_choices(client):
    """n choices of one chat: choice j the same as the request alone with seed + j, with its
    own logprobs, whole and streamed; the prompt counted once in the usage."""
    kwargs = dict(model=NAME, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=1.0)
    asked = dict(logprobs=True, extra_body=EXTRA)
    many = client.chat.completions.create(n=3, seed=11, **kwargs, **asked)
    alone = [client.chat.completions.create(seed=11 + j, **kwargs, **asked) for j in range(3)]
    assert [c.index for c in many.choices] == [0, 1, 2]
    for choice, single in zip(many.choices, alone, strict=True):
        assert choice.message.content == single.choices[0].message.content
        assert [t.token for t in choice.logprobs.content] == [
            t.token for t in single.choices[0].logprobs.content
        ]
    assert len({c.message.content for c in many.choices}) > 1
    assert many.usage.prompt_tokens == alone[0].usage.prompt_tokens
    assert many.usage.completion_tokens == 3 * MAX_TOKENS
    streamed = client.chat.completions.create(n=3, seed=11, stream=True, **kwargs, **asked)
    texts, roles = [""] * 3, [None] * 3
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            roles[choice.index] = choice.delta.role or roles[choice.index]
    assert texts == [c.message.content for c in many.choices] and roles == ["assistant"] * 3


def _running(server) -> tuple[float, float]:
    """(requests running, KV blocks in use) from the server's /metrics."""
    running = blocks = 0.0
    for family in text_string_to_metric_families(httpx.get(server.base_url + "/metrics").text):
        for sample in family.samples:
            if sample.name == "omni_requests_running":
                running += sample.value
            elif sample.name.startswith("omni_stage_kv_blocks_in_use"):
                blocks += sample.value
    return running, blocks


def test_leaving_a_stream_of_n_choices_aborts_them_all(server):
    """A client that leaves a streamed chat of 3 long choices: all three requests end in the
    engine and free their blocks (the merged stream closes each of them)."""
    body = {"model": NAME, "messages": MESSAGES, "n": 3, "max_tokens": 4000, "stream": True,
            "temperature": 1.0, **EXTRA}  # fmt: skip
    seen = 0.0
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", server.base_url + "/v1/chat/completions", json=body) as response,
    ):
        for n, _ in enumerate(response.iter_lines()):
            if n >= 12:  # every choice is decoding
                seen = _running(server)[0]
                break
    assert seen == 3
    # 3 s: the abort took 0.02 s here, the three 4,000-token replies take 5.6 s in-process.
    left = time.monotonic()
    deadline = left + 3
    while _running(server) != (0.0, 0.0):
        assert time.monotonic() < deadline, _running(server)
        time.sleep(0.05)
    print(f"\n3 choices aborted {time.monotonic() - left:.2f} s after the client left")


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["n"],
}


def test_response_format_constrains_the_reply_as_the_python_api_does(client, lm_dir):
    formats = {
        "json_object": ({"type": "json_object"}, {"type": "object"}),
        "json_schema": ({"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}, SCHEMA),
    }  # fmt: skip
    kwargs = dict(model=NAME, messages=MESSAGES, max_tokens=40, temperature=0)
    with Omni(model=lm_dir, runtime={"backend": "local"}, **on_cpu("llm")) as lm:
        for response_format, schema in formats.values():
            params = SamplingParams(max_tokens=40, json_schema=schema)
            (expected,) = lm.chat(MESSAGES, params, use_tqdm=False)
            text = lm.async_omni.prompt_processor.tokenizer.decode(
                expected.final.token_ids, skip_special_tokens=True
            )
            whole = client.chat.completions.create(**kwargs, response_format=response_format)
            assert whole.choices[0].message.content == text
            streamed = client.chat.completions.create(
                **kwargs, response_format=response_format, stream=True
            )
            assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text
            if expected.final.finish_reason == "stopped":
                assert isinstance(json.loads(text), dict)
            assert text.lstrip().startswith("{")  # whitespace may lead, as JSON allows
    bad = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"oneOf": []}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**kwargs, response_format=bad)
    assert info.value.body["param"] == "response_format.json_schema.schema.oneOf"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**kwargs, response_format={"type": "json_schema"})
    assert info.value.body["param"] == "response_format.json_schema.schema"


TOOLS = [
    {"type": "function", "function": {"name": "lookup", "description": "Look a word up",
     "parameters": {"type": "object", "properties": {"word": {"type": "string"},
                    "limit": {"type": "integer"}}, "required": ["word"]}}},
    {"type": "function", "function": {"name": "noop"}},
]  # fmt: skip


def test_a_named_tool_call_is_the_constrained_reply_of_the_python_api(client, lm_dir):
    choice = {"type": "function", "function": {"name": "lookup"}}
    kwargs = dict(model=NAME, messages=MESSAGES, max_tokens=40, temperature=0, tools=TOOLS)
    with Omni(model=lm_dir, runtime={"backend": "local"}, **on_cpu("llm")) as lm:
        schema = TOOLS[0]["function"]["parameters"]
        (expected,) = lm.chat(
            MESSAGES, SamplingParams(max_tokens=40, json_schema=schema), tools=TOOLS, use_tqdm=False
        )
        tokenizer = lm.async_omni.prompt_processor.tokenizer
        arguments = tokenizer.decode(expected.final.token_ids, skip_special_tokens=True)
    whole = client.chat.completions.create(**kwargs, tool_choice=choice).choices[0]
    assert whole.message.content is None
    (call,) = whole.message.tool_calls
    assert call.type == "function" and call.function.name == "lookup"
    assert call.function.arguments == arguments and call.id.startswith("call_")
    assert whole.finish_reason == (
        "stop" if expected.final.finish_reason == "stopped" else "length"
    )
    pieces = []
    for chunk in client.chat.completions.create(**kwargs, tool_choice=choice, stream=True):
        for delta_call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            pieces.append(delta_call)
    assert pieces[0].id.startswith("call_") and pieces[0].function.name == "lookup"
    assert all(p.index == 0 and (p is pieces[0] or p.id is None) for p in pieces)
    assert "".join(p.function.arguments for p in pieces) == arguments
    # A function without parameters takes an empty object (whitespace aside; cut by max_tokens).
    noop = client.chat.completions.create(
        **kwargs, tool_choice={"type": "function", "function": {"name": "noop"}}
    ).choices[0]
    assert "".join(noop.message.tool_calls[0].function.arguments.split()) in ("{}", "{")
    # "required": one call of any tool, whole and streamed alike.
    required = client.chat.completions.create(**kwargs, tool_choice="required").choices[0]
    (call,) = required.message.tool_calls
    assert required.message.content is None and required.finish_reason in ("tool_calls", "length")
    cut = required.finish_reason == "length"  # random weights: maybe before the name is out
    assert call.function.name in ("lookup", "noop") or (cut and call.function.name == "")
    pieces = []
    for chunk in client.chat.completions.create(**kwargs, tool_choice="required", stream=True):
        pieces += (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []
    if pieces:
        assert pieces[0].function.name == call.function.name
    assert "".join(p.function.arguments for p in pieces) == call.function.arguments
    plain = client.chat.completions.create(**kwargs, tool_choice="none").choices[0]
    assert plain.message.tool_calls is None and plain.message.content is not None
    refused = {
        "tool_choice.function.name": dict(tool_choice={"type": "function", "function": {"name": "x"}}),
        "tools[0].function.parameters.properties.word.pattern": dict(tools=[{"type": "function",
            "function": {"name": "lookup", "parameters": {"type": "object",
            "properties": {"word": {"type": "string", "pattern": "a+"}}}}}], tool_choice=choice),
        "response_format": dict(tool_choice=choice, response_format={"type": "json_object"}),
    }  # fmt: skip
    for param, extra in refused.items():
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(**(kwargs | extra))
        assert info.value.body["param"] == param, info.value.body


def test_auto_reads_the_python_apis_free_reply_for_calls(client, lm_dir):
    """tool_choice "auto" (the default with tools): the reply of the Python API given the same
    tools, whole and streamed, read for Hermes calls (random weights make none: the content is
    the reply; tests/integration/test_real_model.py has a model that calls)."""
    kwargs = dict(model=NAME, messages=MESSAGES, max_tokens=24, temperature=0, tools=TOOLS)
    with Omni(model=lm_dir, runtime={"backend": "local"}, **on_cpu("llm")) as lm:
        (expected,) = lm.chat(MESSAGES, SamplingParams(max_tokens=24), tools=TOOLS, use_tqdm=False)
        (bare,) = lm.chat(MESSAGES, SamplingParams(max_tokens=24), use_tqdm=False)
        tokenizer = lm.async_omni.prompt_processor.tokenizer
        text = tokenizer.decode(expected.final.token_ids, skip_special_tokens=True)
    assert bare.final.token_ids != expected.final.token_ids  # the tools are in the prompt
    message = HermesCalls(["lookup", "noop"]).message(text)
    for choice in (None, "auto"):
        whole = client.chat.completions.create(**kwargs, tool_choice=choice).choices[0]
        assert whole.message.content == message["content"]
        assert whole.message.tool_calls is None and "tool_calls" not in message
        chunks = client.chat.completions.create(**kwargs, tool_choice=choice, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
