"""HermesCalls: function calls in a free reply (tool_choice "auto"), in the form Qwen's models
write them (`--tool-call-parser hermes`):

    some text<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A block whose body is a JSON object naming one of the request's tools (with `arguments` an
object, or the JSON text of one) is a call: it leaves the message's content, with the
whitespace around it. Any other block (bad JSON, an unknown name) stays in the content as it
was written, and so does all of a reply without calls. A block the reply ends in without its
closing tag is a call if its body is one. With `parallel_tool_calls: false` calls after the
first are dropped.

The reply is read as it streams: content goes out as it comes, except a tail that may still
become a block (whitespace, then a beginning of `<tool_call>`), and each call goes out whole,
in one `delta.tool_calls`, once its block is closed. Streamed pieces join to exactly the whole
reply's message, for every split of its text (one cursor reads both ways).
"""

from __future__ import annotations

import json
from typing import Any

from omni.entrypoints.openai.context import new_id

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesCalls:
    """One choice's reply read for calls: `delta` per new piece of text, `message` whole."""

    def __init__(self, tool_names: list[str], max_calls: int | None = None) -> None:
        self.tool_names = set(tool_names)
        self.max_calls = max_calls  # None: any number (parallel_tool_calls)
        self.pending = ""  # text read but not yet sent: a possible block, or in one
        self.in_block = False  # pending starts with whitespace and an opening tag
        self.after_call = False  # whitespace that follows a call is the call's
        self.calls: list[dict[str, Any]] = []

    def delta(self, new_text: str, whole: bool = False) -> dict[str, Any] | None:
        """What `new_text` adds: {"content": ..., "tool_calls": [...]}, either left out when it
        adds none (None: nothing to send yet); `whole`: the reply ends here."""
        self.pending += new_text
        content, num_calls = [], len(self.calls)
        while self.pending:
            if self.after_call:
                stripped = self.pending.lstrip()
                self.after_call = stripped == ""  # more whitespace may still come
                self.pending = stripped
                continue
            if not self.in_block:
                start = self.pending.find(OPEN)
                if start < 0:
                    keep = 0 if whole else _possible_opening(self.pending)
                    content.append(self.pending[: len(self.pending) - keep])
                    self.pending = self.pending[len(self.pending) - keep :]
                    break
                begin = len(self.pending[:start].rstrip())
                content.append(self.pending[:begin])
                self.pending, self.in_block = self.pending[begin:], True
            end = self.pending.find(CLOSE)
            if end < 0 and not whole:
                break
            block = self.pending if end < 0 else self.pending[: end + len(CLOSE)]
            body = block.lstrip()[len(OPEN) :].removesuffix(CLOSE)
            self.pending, self.in_block = self.pending[len(block) :], False
            call = self._call(body)
            if call is None:
                content.append(block)
            else:
                self.after_call = True
                if self.max_calls is None or len(self.calls) < self.max_calls:
                    self.calls.append(call)
        delta: dict[str, Any] = {}
        if "".join(content):
            delta["content"] = "".join(content)
        if len(self.calls) > num_calls:
            delta["tool_calls"] = [
                {"index": i, **c} for i, c in enumerate(self.calls) if i >= num_calls
            ]
        return delta or None

    def message(self, text: str) -> dict[str, Any]:
        """The whole reply's `content` and `tool_calls` (read afresh)."""
        reader = HermesCalls(sorted(self.tool_names), self.max_calls)
        content = (reader.delta(text, whole=True) or {}).get("content", "")
        if not reader.calls:
            return {"content": text}
        self.calls = reader.calls
        return {"content": content or None, "tool_calls": reader.calls}

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.calls and reason == "stop" else reason

    @property
    def started(self) -> bool:
        """Whether a call has begun (a block is open, or one was read)."""
        return bool(self.calls) or self.in_block

    def _call(self, body: str) -> dict[str, Any] | None:
        """The call a block's body makes (None: not a call of one of the tools)."""
        try:
            value = json.loads(body)
        except ValueError:
            return None
        return call_entry(value, self.tool_names)


def call_entry(
    value: Any, tool_names: set[str], keys: tuple[str, ...] = ("arguments",)
) -> dict[str, Any] | None:
    """A `tool_calls` entry of a parsed call `{"name": ..., <key>: {...}}` (the first of `keys`
    present; absent: no arguments), its arguments an object or the JSON text of one; None when
    `value` is no call of one of the tools."""
    name = value.get("name") if isinstance(value, dict) else None
    if not isinstance(name, str) or name not in tool_names:
        return None
    arguments: Any = next((value[key] for key in keys if key in value), {})
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return None
        if not isinstance(parsed, dict):
            return None
    elif isinstance(arguments, dict):
        arguments = json.dumps(arguments, ensure_ascii=False)
    else:
        return None
    return {"id": "call_" + new_id("")[1:25], "type": "function",
            "function": {"name": name, "arguments": arguments}}  # fmt: skip


def _possible_opening(text: str) -> int:
    """The length of `text`'s tail that may still become a block's start: whitespace, then a
    beginning of the opening tag (possibly empty)."""
    for size in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-size:]):
            head = text[:-size]
            return len(text) - len(head.rstrip())
    return len(text) - len(text.rstrip())
