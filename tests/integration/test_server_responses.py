"""POST /v1/responses with the official `openai` client (`client.responses.create`, whole and
streamed) against the tiny Qwen2 served in-process: the reply equals /v1/chat/completions' on the
same messages (instructions as the system message; an input list of messages and parts), its
`text.format` json_schema equals chat's response_format, a named tool_choice's call equals
chat's, and what is not served is a 400 naming the field. A model that calls on its own:
tests/integration/test_real_model.py. Also vLLM's /tokenize and /detokenize."""

from __future__ import annotations

import json

import openai
import pytest
from fastapi.testclient import TestClient
from helpers import on_cpu

from omni import AsyncOmni
from omni.entrypoints.openai.app import build_app
from omni.entrypoints.openai.args import ServerArgs

pytestmark = pytest.mark.slow
NAME, MAX = "lm", 12
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.fixture(scope="module")
def http(qwen2_dir):
    engine = AsyncOmni(model=qwen2_dir, runtime={"backend": "local"}, **on_cpu("llm"))
    try:
        with TestClient(build_app(engine, ServerArgs(NAME))) as test_client:
            yield test_client
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def client(http):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="-", http_client=http)


def _chat(client, messages, **kwargs) -> tuple[str, object]:
    out = client.chat.completions.create(model=NAME, messages=messages, max_tokens=MAX,
                                         temperature=0, **kwargs)  # fmt: skip
    return out.choices[0].message.content, out.usage


def test_a_response_is_the_chat_reply_to_the_same_messages(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."}]
    want, usage = _chat(client, messages)
    got = client.responses.create(model=NAME, input="Hi.", instructions="Be brief.",
                                  max_output_tokens=MAX, temperature=0)  # fmt: skip
    assert got.output_text == want and got.status in ("completed", "incomplete")
    assert got.usage.input_tokens == usage.prompt_tokens
    assert got.usage.output_tokens == usage.completion_tokens
    (item,) = got.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].text == want
    if got.status == "incomplete":
        assert got.incomplete_details.reason == "max_output_tokens"
    listed = [
        {"role": "user", "content": [{"type": "input_text", "text": "Hi."}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": want}],
        },
        {"role": "user", "content": "And then?"},
    ]
    turns = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": want},
             {"role": "user", "content": "And then?"}]  # fmt: skip
    again = client.responses.create(model=NAME, input=listed, max_output_tokens=MAX, temperature=0)
    assert again.output_text == _chat(client, turns)[0]
    events = list(client.responses.create(model=NAME, input="Hi.", instructions="Be brief.",
                                          max_output_tokens=MAX, temperature=0, stream=True))  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]  # fmt: skip
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == want
    assert events[-1].response.output_text == want


def test_text_format_is_chats_structured_output(client):
    messages = [{"role": "user", "content": "A number as JSON."}]
    fmt = {"type": "json_schema", "name": "num", "schema": SCHEMA, "strict": True}
    got = client.responses.create(model=NAME, input="A number as JSON.", max_output_tokens=MAX,
                                  temperature=0, text={"format": fmt})  # fmt: skip
    want, _ = _chat(client, messages,
                    response_format={"type": "json_schema", "json_schema": {"name": "num", "schema": SCHEMA}})  # fmt: skip
    assert got.output_text == want and want.lstrip().startswith("{")
    if got.status == "completed":
        assert isinstance(json.loads(want)["n"], int)


def test_a_named_tool_choice_is_chats_named_call(client):
    parameters = {
        "type": "object",
        "properties": {"word": {"type": "string"}},
        "required": ["word"],
    }
    flat = {"type": "function", "name": "lookup", "parameters": parameters}
    got = client.responses.create(model=NAME, input="Look a word up.", max_output_tokens=MAX,
                                  temperature=0, tools=[flat],
                                  tool_choice={"type": "function", "name": "lookup"})  # fmt: skip
    want = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Look a word up."}], max_tokens=MAX,
        temperature=0, tools=[{"type": "function", "function": {k: v for k, v in flat.items()
                                                                  if k != "type"}}],
        tool_choice={"type": "function", "function": {"name": "lookup"}},
    ).choices[0].message.tool_calls[0]  # fmt: skip
    (call,) = got.output  # the reply is the call: no message
    assert (call.type, call.name, call.arguments) == (
        "function_call",
        "lookup",
        want.function.arguments,
    )
    events = list(client.responses.create(model=NAME, input="Look a word up.", stream=True,
                                          max_output_tokens=MAX, temperature=0, tools=[flat],
                                          tool_choice={"type": "function", "name": "lookup"}))  # fmt: skip
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas == done.arguments == call.arguments
    assert [i.type for i in events[-1].response.output] == ["function_call"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"tools": [{"type": "function", "name": "a b"}]}, "tools[0].name"),
        ({"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function",
          "name": "g"}}, "tool_choice.name"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"tool_choice": "required"}, "tool_choice"),  # no tools to call
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"oneOf": []}}}},
         "text.format.schema.oneOf"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "other"}, "model"),
    ],
)  # fmt: skip
def test_what_is_not_served_is_a_400_naming_the_field(client, extra, param):
    with pytest.raises(openai.APIStatusError) as info:
        client.responses.create(**({"model": NAME, "input": "Hi."} | extra))
    assert info.value.body["param"] == param, info.value.body


def test_tokenize_and_detokenize_as_vllm(http, client):
    """vLLM's /tokenize (a prompt, or messages framed as chat frames them) and /detokenize."""
    messages = [{"role": "user", "content": "Hi."}]
    chat = client.chat.completions.create(model=NAME, messages=messages, max_tokens=1)
    framed = http.post("/tokenize", json={"model": NAME, "messages": messages}).json()
    assert framed["count"] == len(framed["tokens"]) == chat.usage.prompt_tokens
    plain = http.post("/tokenize", json={"prompt": "Hi there.", "add_special_tokens": False}).json()
    back = http.post("/detokenize", json={"model": NAME, "tokens": plain["tokens"]}).json()
    assert back == {"prompt": "Hi there."} and plain["max_model_len"] > 0
    for path, body, param in [
        ("/tokenize", {"prompt": "a", "messages": messages}, "prompt"),
        ("/tokenize", {"model": "other", "prompt": "a"}, "model"),
        ("/detokenize", {"tokens": [10**9]}, "tokens[0]"),
        ("/detokenize", {"tokens": [-1]}, "tokens[0]"),
    ]:
        reply = http.post(path, json=body)
        assert reply.status_code in (400, 404) and reply.json()["error"]["param"] == param, (
            reply.text
        )
