"""Realtime function calls in the conversation: `function_call` and `function_call_output` items
checked as the client sends them, and rendered into the next prompt as chat renders an
assistant's tool calls and the tool's answers; a response's audio stops where a call begins."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from omni.engine.prompt_processor import PromptProcessor
from omni.entrypoints.openai.errors import OpenAIError
from omni.entrypoints.openai.realtime import events
from omni.entrypoints.openai.realtime.conversation import Conversation, Item, Part, from_client
from omni.entrypoints.openai.realtime.function_calls import FunctionCalls
from omni.entrypoints.openai.tools import tool_call

TEMPLATE = (
    "{% for t in tools or [] %}[tool {{ t.function.name }}]{% endfor %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}[call {{ c.id }} {{ c.function.name }} "
    "{{ c.function.arguments.city }}]{% endfor %}"
    "{% if m.tool_call_id %}[answers {{ m.tool_call_id }}]{% endif %}{% endfor %}<assistant>"
)
TOOLS = [{"type": "function", "function": {"name": "weather"}}]


def item(**fields) -> events.Item:
    return events.Item.model_validate(fields)


def test_calls_and_outputs_render_as_chat_renders_tool_turns(qwen2_dir):
    processor = PromptProcessor(qwen2_dir)
    processor.tokenizer.chat_template = TEMPLATE
    ctx = SimpleNamespace(async_omni=SimpleNamespace(prompt_processor=processor))
    conversation = Conversation()
    user = item(type="message", role="user", content=[{"type": "input_text", "text": "Oslo?"}])
    for given in (
        user,
        item(type="function_call", call_id="c1", name="weather", arguments='{"city": "Oslo"}'),
        item(type="function_call", call_id="c2", name="weather", arguments='{"city": "Bergen"}'),
        item(type="function_call_output", call_id="c1", output="rain"),
    ):
        conversation.add(from_client(ctx, given))  # type: ignore[arg-type]
    reply = Item("assistant", [Part("output_text", text="Let me look.")])
    conversation.items.insert(1, reply)  # a reply and the calls of its response: one turn
    prompt = conversation.prompt(ctx, "Be brief.", None, TOOLS)["prompt"]  # type: ignore[arg-type]
    assert prompt == (
        "[tool weather]<system>Be brief.<user>Oslo?<assistant>Let me look.[call c1 weather Oslo]"
        "[call c2 weather Bergen]<tool>rain[answers c1]<assistant>"
    )
    call = conversation.items[2].to_dict()
    assert call == {"id": call["id"], "object": "realtime.item", "type": "function_call",
                    "status": "completed", "call_id": "c1", "name": "weather",
                    "arguments": '{"city": "Oslo"}'}  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"type": "function_call", "name": "weather", "arguments": "{}"}, "item.call_id"),
        (
            {"type": "function_call_output", "call_id": "c", "output": "x", "role": "user"},
            "item.role",
        ),
        ({"type": "message", "role": "user"}, "item.content"),
        ({"type": "function_call_output", "call_id": "c"}, "item.output"),
    ],
)
def test_items_with_fields_of_another_type_are_refused(fields, param):
    with pytest.raises(OpenAIError) as info:
        from_client(SimpleNamespace(), item(**fields))  # type: ignore[arg-type]
    assert info.value.param == param


def test_audio_stops_where_a_call_begins():
    call = tool_call(TOOLS, "auto")
    assert call is not None
    calls = FunctionCalls(call, "resp_1", Conversation())
    sent: list[dict] = []

    async def send(event: dict) -> None:
        sent.append(event)

    async def go() -> list[str]:
        texts = [await calls.text("Sure. ", send), await calls.text("<tool_call>\n{", send)]
        started = calls.started
        texts.append(await calls.text('"name": "weather", "arguments": {}}</tool_call>', send))
        await calls.finish(True, send)
        return [*texts, str(started)]

    assert asyncio.run(go()) == ["Sure.", "", "", "True"]
    kinds = [e["type"] for e in sent]
    assert kinds == ["response.output_item.added", "conversation.item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "conversation.item.done"]  # fmt: skip
    assert (
        json.loads(sent[-1]["item"]["arguments"]) == {}
        and sent[-1]["item"]["status"] == "completed"
    )
    fresh = FunctionCalls(call, "resp_2", Conversation())
    assert not fresh.started
