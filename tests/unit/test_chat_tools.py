"""Chat tools: `tool_call` checks `tools` / `tool_choice` (a named call served, the rest refused
naming the field), and the conversation's tool turns (an assistant's calls, a tool's answer) reach
the chat template as transformers' templates take them, or ChatML in Qwen's Hermes form."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from transformers import AutoTokenizer

from omni.core.json_grammar import initial, is_complete, step
from omni.core.json_schema import compile_schema
from omni.entrypoints.chat_messages import ChatMessage, chat_prompt
from omni.entrypoints.openai.errors import OpenAIError
from omni.entrypoints.openai.hermes_calls import HermesCalls
from omni.entrypoints.openai.tools import NO_PARAMETERS, CallCursor, tool_call

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": PARAMETERS}},
    {"type": "function", "function": {"name": "now"}},
]
NAMED = {"type": "function", "function": {"name": "weather"}}


def accepts(node, text: str) -> bool:
    state = initial(node)
    for byte in text.encode():
        if (state := step(state, byte)) is None:
            return False
    return is_complete(state)


def test_a_named_choice_is_served():
    assert tool_call(None, None) is None and tool_call(TOOLS, "none") is None
    call = tool_call(TOOLS, NAMED)
    assert call is not None and call.name == "weather" and call.tools == TOOLS
    assert json.loads(call.json_schema) == PARAMETERS
    bare = tool_call(TOOLS, {"type": "function", "function": {"name": "now"}})
    assert bare is not None and json.loads(bare.json_schema) == NO_PARAMETERS
    cursor = CallCursor(call)
    assert cursor.message('{"city": "Oslo"}') == {"content": None, "tool_calls": [{"id": cursor.id,
        "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]}  # fmt: skip
    assert cursor.id.startswith("call_") and len(cursor.id) == 29
    assert call.finish_reason("stop") == "stop"  # as OpenAI answers a named choice


def test_required_is_one_call_of_any_tool_spelled_as_hermes_calls_are():
    call = tool_call(TOOLS, "required")
    assert call is not None and call.name is None and call.finish_reason("stop") == "tool_calls"
    assert call.finish_reason("length") == "length"
    node = compile_schema(json.loads(call.json_schema))
    for text, ok in [
        ('{"name": "weather", "arguments": {"city": "Oslo"}}', True),
        ('{"name": "now", "arguments": {}}', True),
        ('{"name": "now", "arguments": { } }', True),
        ('{"name": "weather", "arguments": {}}', False),  # its schema: city is required
        ('{"name": "later", "arguments": {}}', False),
        ('{"name":"now","arguments":{}}', False),  # spelled as Hermes calls are
        ('[{"name": "now", "arguments": {}}]', False),  # one call
    ]:
        assert accepts(node, text) is ok, text


def test_a_streamed_call_joins_to_the_whole_one():
    text = '{"name": "weather", "arguments": {"city": "O}slo", "x": {"y": 1} } }'
    whole = CallCursor(tool_call(TOOLS, "required")).message(text)["tool_calls"][0]["function"]
    assert whole == {"name": "weather", "arguments": '{"city": "O}slo", "x": {"y": 1} }'}
    for cut in range(1, len(text)):  # every split into two pieces, then the end
        cursor = CallCursor(tool_call(TOOLS, "required"))
        deltas = [cursor.delta(text[:cut]), cursor.delta(text[cut:]), cursor.delta("", whole=True)]
        pieces = [d["tool_calls"][0] for d in deltas if d is not None]
        assert pieces[0]["id"] == cursor.id and pieces[0]["function"]["name"] == "weather"
        assert all("id" not in p and "name" not in p["function"] for p in pieces[1:])
        assert "".join(p["function"]["arguments"] for p in pieces) == whole["arguments"], cut


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        ([], "required", "tool_choice"),
        (TOOLS, "sometimes", "tool_choice"),
        (TOOLS, {"type": "function", "function": {"name": "x"}}, "tool_choice.function.name"),
        ([{"type": "retrieval"}], NAMED, "tools[0].type"),
        ([{"type": "function", "function": {"name": "a b"}}], NAMED, "tools[0].function.name"),
        ([{"type": "function", "function": {"name": "weather", "parameters": []}}], NAMED,
         "tools[0].function.parameters"),
        ([{"type": "function", "function": {"name": "weather", "parameters": {"not": {}}}}],
         NAMED, "tools[0].function.parameters.not"),
    ],
)  # fmt: skip
def test_what_is_not_served_is_refused_naming_the_field(tools, choice, param):
    with pytest.raises(OpenAIError) as info:
        tool_call(tools, choice)
    assert info.value.body()["error"]["param"] == param


def test_auto_is_a_free_reply_read_for_calls_unless_the_server_has_no_parser():
    for choice in (None, "auto"):  # OpenAI's default with tools is auto
        call = tool_call(TOOLS, choice)
        assert call is not None and call.json_schema is None and call.max_calls is None
        assert isinstance(call.cursor(), HermesCalls) and call.cursor().tool_names == {
            "weather",
            "now",
        }
        with pytest.raises(OpenAIError) as info:
            tool_call(TOOLS, choice, parser="none")
        assert info.value.body()["error"]["param"] == "tool_choice"
    single = tool_call(TOOLS, "auto", parallel_tool_calls=False)
    assert single is not None and single.max_calls == 1
    assert tool_call([], "auto") is None  # nothing to call: a plain reply


CALLS = [{"id": "call_1", "type": "function",
          "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]  # fmt: skip
CONVERSATION = [
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": CALLS},
    {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
]
TEMPLATE = (
    "{% for t in tools or [] %}[tool {{ t.function.name }}]{% endfor %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}[call {{ c.function.name }} {{ c.function.arguments.city }}]"
    "{% endfor %}{% if m.tool_call_id %}[answers {{ m.tool_call_id }}]{% endif %}{% endfor %}"
    "<assistant>"
)


def test_tool_turns_reach_the_chat_template(qwen2_dir):
    tokenizer = AutoTokenizer.from_pretrained(qwen2_dir)
    tokenizer.chat_template = TEMPLATE
    text = chat_prompt(tokenizer, CONVERSATION, tools=TOOLS)["prompt"]
    assert text == (
        "[tool weather][tool now]<user>Weather in Oslo?<assistant>[call weather Oslo]"
        "<tool>rain[answers call_1]<assistant>"
    )  # the arguments reach the template parsed, as transformers' templates take them


def test_tool_turns_without_a_template_are_chatml_in_hermes_form(qwen2_dir):
    tokenizer = AutoTokenizer.from_pretrained(qwen2_dir)
    assert not tokenizer.chat_template
    text = chat_prompt(tokenizer, CONVERSATION)["prompt"]
    assert text == (
        "<|im_start|>user\nWeather in Oslo?<|im_end|>\n"
        '<|im_start|>assistant\n\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}'
        "\n</tool_call><|im_end|>\n<|im_start|>tool\nrain<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ({"role": "tool", "content": "x"}, "tool_call_id: a tool message needs one"),
        ({"role": "user", "content": "x", "tool_call_id": "c"}, "only tool messages take one"),
        ({"role": "user", "content": "x", "tool_calls": CALLS}, "only assistant messages make"),
    ],
)
def test_tool_fields_on_the_wrong_messages_are_refused(message, error):
    with pytest.raises(ValidationError, match=error):
        ChatMessage.model_validate(message)


def test_tools_without_a_template_are_listed_in_the_system_turn(qwen2_dir):
    tokenizer = AutoTokenizer.from_pretrained(qwen2_dir)
    listed = "\n".join(json.dumps(tool) for tool in TOOLS)
    for system in ([], [{"role": "system", "content": "Be brief."}]):
        text = chat_prompt(tokenizer, system + CONVERSATION[:1], tools=TOOLS)["prompt"]
        head, rest = text.split("# Tools\n\n", 1)
        assert head == "<|im_start|>system\n" + ("Be brief.\n\n" if system else ""), text
        assert f"<tools>\n{listed}\n</tools>" in rest and "<tool_call>\n{" in rest, rest
        assert rest.endswith(
            "<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n"
        )
