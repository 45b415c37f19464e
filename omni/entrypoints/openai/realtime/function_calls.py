"""Function calling in a realtime session: the calls of one response as `function_call` output
items (the session's `tools` and `tool_choice` are checked as chat's, in session_state.py).

With tool_choice "auto" the reply is free and read for calls as chat's is (the server's
--tool-call-parser): what is not a call is the message's text (or its audio's transcript), each
call an item of its own. The audio of a reply stops at its first call: the talker speaks what
the thinker wrote, the call's text too, and a call is not spoken. With "required" or a named
function the reply is the call (the text stage constrained to it, as chat's): such a response
ends at the text stage, audio or not.

Events of a call item, after the response's message item (output_index 0): the item's
`response.output_item.added` and `conversation.item.added` when its name is known,
`response.function_call_arguments.delta` as its arguments come, and at the response's end
`response.function_call_arguments.done`, `response.output_item.done`, `conversation.item.done`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from omni.entrypoints.openai.realtime.conversation import Conversation, Item
from omni.entrypoints.openai.realtime.server_events import event
from omni.entrypoints.openai.tools import ToolCall

Send = Callable[[dict[str, Any]], Awaitable[None]]


class FunctionCalls:
    """One response's reply read for calls: `text` per new piece, `finish` at its end."""

    def __init__(self, call: ToolCall, response_id: str, conversation: Conversation) -> None:
        self.cursor = call.cursor()
        self.response_id = response_id
        self.conversation = conversation
        self.items: list[Item] = []

    @property
    def started(self) -> bool:
        """Whether a call has begun (the reply's audio stops there)."""
        return self.cursor.started

    async def text(self, piece: str, send: Send, whole: bool = False) -> str:
        """The message text in `piece` (the rest: calls, sent as their items' events)."""
        delta = self.cursor.delta(piece, whole) or {}
        for entry in delta.get("tool_calls", []):
            index = entry["index"]
            if "id" in entry:  # a new call
                function = entry["function"]
                item = Item("assistant", [], type="function_call", status="in_progress",
                            call_id=entry["id"], name=function["name"])  # fmt: skip
                self.items.append(item)
                previous = self.conversation.add(item)
                await send(self._item_event("response.output_item.added", index))
                await send(event("conversation.item.added", item=item.to_dict(),
                                 previous_item_id=previous))  # fmt: skip
            arguments = entry["function"].get("arguments") or ""
            if arguments:
                self.items[index].arguments += arguments
                await send(event("response.function_call_arguments.delta", **self._where(index),
                                 delta=arguments))  # fmt: skip
        return str(delta.get("content") or "")

    async def finish(self, completed: bool, send: Send) -> None:
        for index, item in enumerate(self.items):
            item.status = "completed" if completed else "incomplete"
            await send(event("response.function_call_arguments.done", **self._where(index),
                             name=item.name, arguments=item.arguments))  # fmt: skip
            await send(self._item_event("response.output_item.done", index))
            await send(event("conversation.item.done", item=item.to_dict()))

    def _where(self, index: int) -> dict[str, Any]:
        item = self.items[index]
        return {"response_id": self.response_id, "item_id": item.id, "output_index": index + 1,
                "call_id": item.call_id}  # fmt: skip

    def _item_event(self, kind: str, index: int) -> dict[str, Any]:
        return event(kind, response_id=self.response_id, output_index=index + 1,
                     item=self.items[index].to_dict())  # fmt: skip
