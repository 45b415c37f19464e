"""HermesCalls: the calls a free reply makes (tool_choice "auto"), whole and streamed: a block
naming a tool is a call and leaves the content with the whitespace around it; anything else stays
as written; streamed pieces join to the whole reply's message for every split."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omni.entrypoints.openai.hermes_calls import HermesCalls

NAMES = ["weather", "now"]
WEATHER = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
NOW = '<tool_call>\n{"name": "now", "arguments": "{}"}\n</tool_call>'


def whole(text: str, max_calls: int | None = None) -> tuple[str | None, list[tuple[str, str]]]:
    message = HermesCalls(NAMES, max_calls).message(text)
    calls = [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])
    ]
    return message["content"], calls


def streamed(pieces: list[str], max_calls: int | None = None):
    cursor = HermesCalls(NAMES, max_calls)
    deltas = [cursor.delta(p) for p in pieces] + [cursor.delta("", whole=True)]
    content = "".join(d.get("content", "") for d in deltas if d)
    calls = [c for d in deltas if d for c in d.get("tool_calls", [])]
    assert [c["index"] for c in calls] == list(range(len(calls)))
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    return content, [(c["function"]["name"], c["function"]["arguments"]) for c in calls], cursor


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("Hello there.", "Hello there.", []),
        ("", "", []),
        ("Let me look.\n" + WEATHER, "Let me look.", [("weather", '{"city": "Oslo"}')]),
        (WEATHER + "\n" + NOW + "\n", None, [("weather", '{"city": "Oslo"}'), ("now", "{}")]),
        (WEATHER + "\n\nDone.", "Done.", [("weather", '{"city": "Oslo"}')]),
        ('<tool_call>{"name": "weather", "arguments": {"city": "Å"}}', None,
         [("weather", '{"city": "Å"}')]),  # the reply ended before the closing tag
        ("a <tool_call>not json</tool_call> b", "a <tool_call>not json</tool_call> b", []),
        ('<tool_call>{"name": "later", "arguments": {}}</tool_call>',
         '<tool_call>{"name": "later", "arguments": {}}</tool_call>', []),  # not a tool
        ('<tool_call>{"name": "now", "arguments": [1]}</tool_call>',
         '<tool_call>{"name": "now", "arguments": [1]}</tool_call>', []),
        ('x <tool_call>{"name": "now"', 'x <tool_call>{"name": "now"', []),  # cut off
        ('<tool_call>{"name": {"a": 1}}</tool_call>', '<tool_call>{"name": {"a": 1}}</tool_call>', []),
        ("use <tool> or </tool_call> <tool_cal", "use <tool> or </tool_call> <tool_cal", []),
        ("bad <tool_call>{}</tool_call> " + NOW + " end", "bad <tool_call>{}</tool_call>end",
         [("now", "{}")]),
    ],
)  # fmt: skip
def test_a_reply_read_whole_and_in_every_split(text, content, calls):
    assert whole(text) == (content, calls)
    for cut in range(len(text) + 1):  # every split into two pieces, then the end
        joined, streamed_calls, cursor = streamed([text[:cut], text[cut:]])
        assert (joined or None if calls else joined) == content and streamed_calls == calls, cut
        assert cursor.finish_reason("stop") == ("tool_calls" if calls else "stop")
        assert cursor.finish_reason("length") == "length"


def test_parallel_tool_calls_false_keeps_the_first_call():
    text = WEATHER + NOW + " ok"
    assert whole(text, max_calls=1) == ("ok", [("weather", '{"city": "Oslo"}')])
    assert streamed(list(text), max_calls=1)[:2] == ("ok", [("weather", '{"city": "Oslo"}')])


def test_content_is_sent_as_it_comes_and_only_a_possible_opening_waits():
    cursor = HermesCalls(NAMES)
    assert cursor.delta("Sure, ") == {"content": "Sure,"}  # the space may precede a block
    assert cursor.delta("one <tool") == {"content": " one"}
    assert cursor.delta("bar> x") == {"content": " <toolbar> x"}
    assert cursor.delta("\n" + WEATHER[:20]) is None
    delta = cursor.delta(WEATHER[20:])
    assert delta is not None and "content" not in delta
    assert json.loads(delta["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo"}
    assert cursor.delta("  \n") is None and cursor.delta("", whole=True) is None


FRAGMENTS = ["Hi", " ", "\n", "<", "<tool", "_call>", "</tool_call>", "<tool_call>", WEATHER,
             NOW, '{"name": "now", "arguments": {}}', "{", "}", "é", "x"]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=12), st.data())
def test_any_reply_streams_to_its_whole_message(fragments, data):
    text = "".join(fragments)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=5)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    content, calls = whole(text)
    joined, streamed_calls, _ = streamed(pieces)
    assert streamed_calls == calls
    assert (joined or None) == content if calls else joined == content == text
