"""One connection's conversation: its items in order, and the prompt of the next response.

Every response's prompt is the whole conversation so far: the instructions as the system
message, then every item (typed and spoken user turns, the model's own earlier replies as text,
its function calls as the assistant's tool calls, their outputs as tool messages), rendered as
/v1/chat/completions renders messages (the family's `PromptProcessor.chat_text`, with the
session's tools), then the generation prompt. So a turn's prompt starts with the previous turn's prompt and reply: every stage's
prefix cache holds it, and `usage.input_token_details.cached_tokens` reports the hit. Audio items
keep their samples (the same samples each turn give the same content hash, so the prefix stays
cached through them); a reply is kept as the text the client was sent (its transcript), also
when it was cancelled part-way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni.entrypoints.openai import prompts
from omni.entrypoints.openai.context import Context
from omni.entrypoints.openai.errors import bad_request
from omni.entrypoints.openai.realtime import events, input_audio
from omni.entrypoints.openai.realtime.server_events import make_id

ROLE_PARTS = {
    "user": ("input_text", "input_audio", "input_image"),
    "system": ("input_text",),
    "assistant": ("output_text", "output_audio"),
}


@dataclass
class Part:
    type: str
    """The GA content type: input_text, input_audio, input_image, output_text, output_audio."""
    text: str = ""
    """A text part's text, or an audio part's transcript."""
    audio: np.ndarray | None = None
    """A user audio part's int16 samples (24 kHz)."""
    num_samples_sent: int = 0
    """An assistant audio part's samples sent to the client (24 kHz), for truncation."""
    image: bytes | None = None
    """A user image part's encoded image."""

    def to_dict(self) -> dict[str, Any]:
        if self.type == "input_audio":  # its transcript, once transcribed
            return {"type": "input_audio", "transcript": self.text or None}
        if self.type == "output_audio":
            return {"type": "output_audio", "transcript": self.text}
        if self.type == "input_image":
            return {"type": "input_image"}
        return {"type": self.type, "text": self.text}


@dataclass
class Item:
    role: str
    parts: list[Part]
    id: str = field(default_factory=lambda: make_id("item"))
    status: str = "completed"
    type: str = "message"
    """message, function_call (the model's: call_id, name, arguments) or function_call_output
    (the client's: call_id, output)."""
    call_id: str = ""
    name: str = ""
    arguments: str = ""
    output: str = ""

    def to_dict(self) -> dict[str, Any]:
        head = {"id": self.id, "object": "realtime.item", "type": self.type}
        if self.type == "function_call":
            return head | {"status": self.status, "call_id": self.call_id, "name": self.name,
                           "arguments": self.arguments}  # fmt: skip
        if self.type == "function_call_output":
            return head | {"call_id": self.call_id, "output": self.output}
        return {
            "id": self.id,
            "object": "realtime.item",
            "type": "message",
            "status": self.status,
            "role": self.role,
            "content": [p.to_dict() for p in self.parts],
        }


class Conversation:
    def __init__(self) -> None:
        self.items: list[Item] = []
        self.out_of_context: set[str] = set()
        """Items truncation left out of every later prompt (context_window.py)."""

    def add(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Insert `item` after `previous_item_id` ("root": first; None: last); returns the id of
        the item before it (None at the start)."""
        if any(i.id == item.id for i in self.items):
            raise bad_request(f"item.id {item.id!r} is already in the conversation", "item.id")
        if previous_item_id is None:
            index = len(self.items)
        elif previous_item_id == "root":
            index = 0
        else:
            ids = [i.id for i in self.items]
            if previous_item_id not in ids:
                raise bad_request(
                    f"previous_item_id {previous_item_id!r} is not in the conversation",
                    "previous_item_id",
                    "item_not_found",
                )
            index = ids.index(previous_item_id) + 1
        self.items.insert(index, item)
        return self.items[index - 1].id if index else None

    def find(self, item_id: str) -> Item:
        """The item with this id (OpenAIError naming item_id when there is none)."""
        for item in self.items:
            if item.id == item_id:
                return item
        raise bad_request(
            f"item_id {item_id!r} is not in the conversation", "item_id", "item_not_found"
        )

    def truncate(self, item_id: str, content_index: int, audio_end_ms: int) -> None:
        """Cut an assistant audio part at what the client played: its transcript goes (text the
        user did not hear stays out of later prompts), as OpenAI's API does."""
        item = self.find(item_id)
        if item.status == "in_progress":
            raise bad_request(
                f"item_id {item_id!r} is still being generated: cancel its response first",
                "item_id",
            )
        parts = item.parts
        if content_index >= len(parts) or parts[content_index].type != "output_audio":
            raise bad_request(
                f"content_index {content_index}: item {item_id!r} has no assistant audio part "
                "there",
                "content_index",
            )
        part = parts[content_index]
        played_ms = part.num_samples_sent * 1000 // input_audio.SAMPLE_RATE
        if audio_end_ms > played_ms:
            raise bad_request(
                f"audio_end_ms {audio_end_ms} is past the audio sent ({played_ms} ms)",
                "audio_end_ms",
            )
        part.text = ""

    def prompt(
        self,
        ctx: Context,
        instructions: str,
        speaker: str | None,
        tools: list[dict[str, Any]] | None = None,
        items: list[Item] | None = None,
    ) -> dict[str, Any]:
        """The prompt dict of the next response (AsyncOmni's prompt format) of `items` (default:
        the conversation's), less those out of context; `tools` in chat's form (tools.py)."""
        turns: list[tuple[str, list[tuple[str, str]]]] = []
        if instructions:
            turns.append(("system", [("text", instructions)]))
        audio: list[tuple[np.ndarray, int]] = []
        images: list[bytes] = []
        for item in self.items if items is None else items:
            if item.id in self.out_of_context:
                continue
            if item.type == "function_call_output":
                turns.append(("tool", [("text", item.output), ("tool_call_id", item.call_id)]))
                continue
            if item.type == "function_call":  # with the assistant's turn before it, if any
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
                if not turns or turns[-1][0] != "assistant":
                    turns.append(("assistant", []))
                calls = [json.loads(t) for k, t in turns[-1][1] if k == "tool_calls"]
                parts = [(k, t) for k, t in turns[-1][1] if k != "tool_calls"]
                merged = [c for group in calls for c in group] + [call]
                turns[-1] = ("assistant", [*parts, ("tool_calls", json.dumps(merged))])
                continue
            pieces: list[tuple[str, str]] = []
            for part in item.parts:
                if part.audio is not None:
                    audio.append(input_audio.waveform(part.audio))
                    pieces.append(("audio", ""))
                elif part.image is not None:
                    images.append(part.image)
                    pieces.append(("image", ""))
                else:
                    pieces.append(("text", part.text))
            turns.append((item.role, pieces))
        # The family's chat framing, as /v1/chat/completions frames messages.
        text = ctx.async_omni.prompt_processor.chat_text(turns, tools)
        prompt: dict[str, Any] = {"prompt": text}
        if audio:
            prompt["audio"] = audio
        if images:
            prompt["images"] = images
        if speaker is not None:
            prompt["speaker"] = speaker
        return prompt


def from_client(ctx: Context, item: events.Item) -> Item:
    """A conversation.item.create item, checked and decoded (OpenAIError naming the field)."""
    fields = {"message": ("role", "content"), "function_call": ("call_id", "name", "arguments"),
              "function_call_output": ("call_id", "output")}  # fmt: skip
    for name in ("role", "content", "call_id", "name", "arguments", "output"):
        given = getattr(item, name) is not None
        if given != (name in fields[item.type]):
            what = "needs" if not given else "does not take"
            raise bad_request(f"item.{name}: a {item.type} item {what} it", f"item.{name}")
    if item.type != "message":
        assert item.call_id is not None
        return Item("assistant" if item.type == "function_call" else "tool", [],
                    id=item.id or make_id("item"), type=item.type, call_id=item.call_id,
                    name=item.name or "", arguments=item.arguments or "",
                    output=item.output or "")  # fmt: skip
    assert item.role is not None and item.content is not None
    if not item.content:
        raise bad_request("item.content is empty", "item.content")
    parts = []
    for j, c in enumerate(item.content):
        param = f"item.content[{j}]"
        if c.type not in ROLE_PARTS[item.role]:
            raise bad_request(
                f"{param}.type {c.type!r} is not allowed in a {item.role} message; allowed: "
                f"{list(ROLE_PARTS[item.role])}",
                f"{param}.type",
            )
        if c.type == "input_audio":
            if c.audio is None:
                raise bad_request(f"{param}.audio is missing", f"{param}.audio")
            limit = input_audio.require_audio_input(ctx, f"{param}.audio")
            samples = input_audio.decode(c.audio, f"{param}.audio")
            if samples.size > limit * input_audio.SAMPLE_RATE:
                raise bad_request(
                    f"{param}.audio is {samples.size / input_audio.SAMPLE_RATE:.2f} s, over the "
                    f"model's audio limit of {limit:g} s",
                    f"{param}.audio",
                )
            parts.append(Part(c.type, audio=samples))
        elif c.type == "input_image":
            if c.image_url is None:
                raise bad_request(f"{param}.image_url is missing", f"{param}.image_url")
            parts.append(Part(c.type, image=prompts.load_image(c.image_url, param, ctx.args)))
        else:
            text = c.transcript if c.type == "output_audio" else c.text
            if text is None:
                name = "transcript" if c.type == "output_audio" else "text"
                raise bad_request(f"{param}.{name} is missing", f"{param}.{name}")
            parts.append(Part(c.type, text=text))
    return Item(item.role, parts, id=item.id or make_id("item"))
