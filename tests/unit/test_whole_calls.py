"""WholeCalls: replies that are calls as a whole, in Llama's forms (`--tool-call-parser
llama3_json` and `pythonic`): a reply that reads whole as calls of the tools is those calls and
no content; any other reply is content as written; streamed pieces join to the whole reply's
message for every split, content streaming from the first character of a reply that does not
open as calls do."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omni.entrypoints.openai.whole_calls import WholeCalls

NAMES = ["weather", "now"]
OSLO = ("weather", '{"city": "Oslo"}')


def whole(form: str, text: str, max_calls: int | None = None):
    message = WholeCalls(form, NAMES, max_calls).message(text)
    calls = [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])
    ]
    return message["content"], calls


def streamed(form: str, pieces: list[str], max_calls: int | None = None):
    cursor = WholeCalls(form, NAMES, max_calls)
    deltas = [cursor.delta(p) for p in pieces] + [cursor.delta("", whole=True)]
    content = "".join(d.get("content", "") for d in deltas if d)
    calls = [c for d in deltas if d for c in d.get("tool_calls", [])]
    assert [c["index"] for c in calls] == list(range(len(calls)))
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    return content, [(c["function"]["name"], c["function"]["arguments"]) for c in calls], cursor


CASES = [
    ("llama3_json", '{"name": "weather", "parameters": {"city": "Oslo"}}', [OSLO]),
    ("llama3_json", ' \n<|python_tag|>{"name": "weather", "arguments": {"city": "Oslo"}}', [OSLO]),
    ("llama3_json", '{"name": "weather", "parameters": {"city": "Oslo"}}; {"name": "now", '
     '"parameters": {}}\n', [OSLO, ("now", "{}")]),
    ("llama3_json", '{"name": "now"};', [("now", "{}")]),  # no arguments, a trailing ";"
    ("llama3_json", '{"name": "weather", "parameters": "{\\"city\\": \\"Oslo\\"}"}',
     [("weather", '{"city": "Oslo"}')]),  # arguments as JSON text
    ("llama3_json", '{"name": "weather", "parameters": {"city": "Å"}}', [("weather", '{"city": "Å"}')]),
    ("llama3_json", "Hello there.", []),
    ("llama3_json", "", []),
    ("llama3_json", '{"answer": 42}', []),  # JSON, not a call
    ("llama3_json", '{"name": "later", "parameters": {}}', []),  # not a tool
    ("llama3_json", '{"name": "now", "parameters": [1]}', []),
    ("llama3_json", '{"name": "now", "parameters": {}} and more', []),
    ("llama3_json", '{"name": "now", "parameters": {', []),  # cut off
    ("llama3_json", 'I will call {"name": "now"}', []),  # calls are the whole reply
    ("pythonic", '[weather(city="Oslo")]', [OSLO]),
    ("pythonic", ' [weather(city="Oslo"), now()]\n', [OSLO, ("now", "{}")]),
    ("pythonic", "[weather(city='Oslo', days=[1, 2], when={'a': None, 'b': True}, t=-1.5)]",
     [("weather", '{"city": "Oslo", "days": [1, 2], "when": {"a": null, "b": true}, "t": -1.5}')]),
    ("pythonic", "[now]", []),  # not a call
    ("pythonic", "[weather('Oslo')]", []),  # positional
    ("pythonic", "[weather(**x)]", []),
    ("pythonic", "[weather(city=open('f'))]", []),  # never evaluated
    ("pythonic", "[weather(city={1, 2})]", []),  # a set: no JSON
    ("pythonic", "[later()]", []),
    ("pythonic", "[]", []),
    ("pythonic", "[1, 2]", []),
    ("pythonic", "[weather(city=", []),  # cut off
    ("pythonic", "Sure: [now()]", []),
    ("pythonic", "a list: [1]", []),
]  # fmt: skip


@pytest.mark.parametrize(("form", "text", "calls"), CASES)
def test_a_reply_read_whole_and_in_every_split(form, text, calls):
    content = None if calls else text
    assert whole(form, text) == (content, calls)
    for cut in range(len(text) + 1):  # every split into two pieces, then the end
        joined, streamed_calls, cursor = streamed(form, [text[:cut], text[cut:]])
        assert (joined or None if calls else joined) == content and streamed_calls == calls, cut
        assert cursor.finish_reason("stop") == ("tool_calls" if calls else "stop")
        assert cursor.finish_reason("length") == "length"


def test_parallel_tool_calls_false_keeps_the_first_call():
    text = '[weather(city="Oslo"), now()]'
    assert whole("pythonic", text, max_calls=1) == (None, [OSLO])
    assert streamed("pythonic", list(text), max_calls=1)[:2] == ("", [OSLO])


def test_text_streams_at_once_and_a_possible_call_waits_for_the_end():
    cursor = WholeCalls("llama3_json", NAMES)
    assert cursor.delta("  ") is None and not cursor.started  # may still open a call
    assert cursor.delta("Sure") == {"content": "  Sure"} and not cursor.started
    assert cursor.delta(", done.") == {"content": ", done."}
    cursor = WholeCalls("llama3_json", NAMES)
    assert cursor.delta("<|python") is None and not cursor.started
    assert cursor.delta('_tag|>{"name": "now"}') is None and cursor.started
    delta = cursor.delta("", whole=True)
    assert delta is not None and "content" not in delta
    assert json.loads(delta["tool_calls"][0]["function"]["arguments"]) == {}
    cursor = WholeCalls("pythonic", NAMES)
    assert cursor.delta("[1,") is None and cursor.started
    assert cursor.delta(" 2]", whole=True) == {"content": "[1, 2]"}


def test_an_unknown_form_is_refused():
    with pytest.raises(ValueError, match="form must be one of"):
        WholeCalls("mistral", NAMES)


FRAGMENTS = ['{"name": "now"}', '{"name": "weather", "parameters": {"city": "Oslo"}}', ";", " ",
             "\n", "<|python_tag|>", "<|py", "[", "]", "now()", 'weather(city="Oslo")', ", ",
             "{", "}", "Hi", "é"]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["llama3_json", "pythonic"]),
       st.lists(st.sampled_from(FRAGMENTS), max_size=10), st.data())  # fmt: skip
def test_any_reply_streams_to_its_whole_message(form, fragments, data):
    text = "".join(fragments)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=5)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    content, calls = whole(form, text)
    joined, streamed_calls, _ = streamed(form, pieces)
    assert streamed_calls == calls
    assert joined == "" and content is None if calls else joined == content == text
