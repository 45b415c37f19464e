"""ResponseOutput: a /v1/responses reply as the API's output items, built as its text comes.

Without tools the reply is one `message` item with one `output_text` part. With tools, the reply
is read for calls as chat's is (omni/entrypoints/openai/tools.py: a named or required call, or
Hermes calls in a free reply): each call is a `function_call` item, the rest of the text the
message's, and items come in the order they begin (a reply that is only calls has no message).
A whole response is the same reader fed the whole text at once, so both agree.

Streamed events, each with its `sequence_number`: a message item's `response.output_item.added`
and `response.content_part.added` at its first text, `response.output_text.delta` per piece; a
call's `response.output_item.added` once its name is out, `response.function_call_arguments.delta`
as its arguments come; at the end each item's `.done` events, in order.
"""

from __future__ import annotations

from typing import Any

from omni.entrypoints.openai import streaming
from omni.entrypoints.openai.context import new_id
from omni.entrypoints.openai.tools import ToolCall


def _id(prefix: str) -> str:
    return new_id(prefix).replace("-", "_")


class ResponseOutput:
    def __init__(self, call: ToolCall | None) -> None:
        self.cursor = None if call is None else call.cursor()
        self.items: list[dict[str, Any]] = []
        self.message: dict[str, Any] | None = None  # the message item, once it has text
        self.calls: list[dict[str, Any]] = []  # by the cursor's call index
        self.sequence_number = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        out = streaming.sse({"type": kind, "sequence_number": self.sequence_number, **fields})
        self.sequence_number += 1
        return out

    def add(self, piece: str, whole: bool = False) -> list[bytes]:
        """The events of a new piece of the reply's text (`whole`: it is the last)."""
        delta: dict[str, Any] = {"content": piece}
        if self.cursor is not None:
            delta = self.cursor.delta(piece, whole) or {}
        events = []
        for entry in delta.get("tool_calls", []):
            if "id" in entry:  # a new call
                item = {"type": "function_call", "id": _id("fc"), "call_id": entry["id"],
                        "name": entry["function"]["name"], "arguments": "",
                        "status": "in_progress"}  # fmt: skip
                self.calls.append(item)
                events.append(self._added(item))
            call, arguments = self.calls[entry["index"]], entry["function"].get("arguments") or ""
            if arguments:
                call["arguments"] += arguments
                events.append(self.event("response.function_call_arguments.delta",
                                         **self._where(call), delta=arguments))  # fmt: skip
        text = delta.get("content") or ""
        if self.message is None and (text or (whole and not self.items)):
            # the message item begins at its first text (a reply without calls always has one)
            part = {"type": "output_text", "text": "", "annotations": []}
            self.message = {"type": "message", "id": _id("msg"), "status": "in_progress",
                            "role": "assistant", "content": [part]}  # fmt: skip
            events.append(self._added(self.message))
            events.append(self.event("response.content_part.added", **self._where(self.message),
                                     content_index=0, part=dict(part)))  # fmt: skip
        if text and self.message is not None:
            self.message["content"][0]["text"] += text
            events.append(self.event("response.output_text.delta", **self._where(self.message),
                                     content_index=0, delta=text, logprobs=[]))  # fmt: skip
        return events

    def _added(self, item: dict[str, Any]) -> bytes:
        self.items.append(item)
        return self.event("response.output_item.added", output_index=len(self.items) - 1,
                          item=dict(item))  # fmt: skip

    def _where(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": item["id"], "output_index": self.items.index(item)}

    def finish(self, completed: bool) -> list[bytes]:
        """Each item's done events, in order; the items then hold their final status."""
        events = []
        for item in self.items:
            item["status"] = "completed" if completed else "incomplete"
            where = self._where(item)
            if item["type"] == "message":
                part = item["content"][0]
                events.append(self.event("response.output_text.done", **where, content_index=0,
                                         text=part["text"], logprobs=[]))  # fmt: skip
                events.append(self.event("response.content_part.done", **where,
                                         content_index=0, part=part))  # fmt: skip
            else:
                events.append(self.event("response.function_call_arguments.done", **where,
                                         arguments=item["arguments"]))  # fmt: skip
            events.append(self.event("response.output_item.done", output_index=where["output_index"],
                                     item=item))  # fmt: skip
        return events
