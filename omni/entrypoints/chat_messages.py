"""OpenAI-style chat messages -> the prompt dict AsyncOmni takes: `{"prompt": text, "images":
[...], "audio": [...]}`, for Omni.chat and the server's chat endpoints alike.

Messages are validated as `ChatMessage` (pydantic; the server's request bodies hold the same
models). The text is the model family's chat framing: its prompt processor's `chat_text` (the
tokenizer's chat template when it has one, else ChatML with each media part as the tokenizer's
media tokens: omni/engine/prompt_processor.py); given a bare tokenizer, the base framing with it.
Media parts are loaded under a MediaPolicy (omni/entrypoints/media_parts.py). `developer`
messages are framed as `system`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from omni.engine.prompt_processor import PromptProcessor, chat_text
from omni.entrypoints import media_parts
from omni.entrypoints.media_parts import MediaPolicy


class Strict(BaseModel):
    """Rejects what OpenAI rejects: unknown fields and wrong JSON types ("5" is no integer)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ImageURL(Strict):
    url: str = Field(min_length=1)
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(Strict):
    type: Literal["image_url"]
    image_url: ImageURL


class InputAudio(Strict):
    data: str
    format: str


class AudioPart(Strict):
    type: Literal["input_audio"]
    input_audio: InputAudio


ContentPart = Annotated[TextPart | ImagePart | AudioPart, Field(discriminator="type")]


class FunctionCall(Strict):
    name: str
    arguments: str


class ToolCall(Strict):
    id: str
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    """An assistant's function calls (an earlier reply), for the chat template."""
    tool_call_id: str | None = None
    """A tool message: the call it answers."""

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if (self.role == "tool") != (self.tool_call_id is not None):
            what = "a tool message needs" if self.role == "tool" else "only tool messages take"
            raise ValueError(f"tool_call_id: {what} one")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("tool_calls: only assistant messages make calls")
        return self


def chat_prompt(
    framing: PromptProcessor | Any,
    messages: Sequence[ChatMessage | dict[str, Any]],
    policy: MediaPolicy | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The prompt for `messages` (ChatMessage models or the equivalent dicts), framed by
    `framing`: the pipeline's prompt processor, or a tokenizer. `policy`: where media may come
    from (default: data: URLs only); `tools` (OpenAI's function tools) go to the chat template.
    Raises pydantic's ValidationError (a ValueError) for a malformed message and MediaError
    naming a bad part."""
    policy = policy or MediaPolicy()
    parsed = [m if isinstance(m, ChatMessage) else ChatMessage.model_validate(m) for m in messages]
    images: list[bytes] = []
    audio: list[bytes] = []
    turns: list[tuple[str, list[tuple[str, str]]]] = []  # role, [(kind, text)]
    for i, message in enumerate(parsed):
        role = "system" if message.role == "developer" else message.role
        pieces: list[tuple[str, str]] = []
        content = message.content
        if isinstance(content, str):
            pieces.append(("text", content))
        elif content is not None:
            for j, part in enumerate(content):
                param = f"messages[{i}].content[{j}]"
                if isinstance(part, TextPart):
                    pieces.append(("text", part.text))
                elif isinstance(part, ImagePart):
                    url = part.image_url.url
                    images.append(media_parts.load_image(url, f"{param}.image_url", policy))
                    pieces.append(("image", ""))
                elif isinstance(part, AudioPart):
                    data, fmt = part.input_audio.data, part.input_audio.format
                    audio.append(media_parts.load_audio(data, fmt, f"{param}.input_audio"))
                    pieces.append(("audio", ""))
        if message.tool_calls:
            pieces.append(("tool_calls", json.dumps([c.model_dump() for c in message.tool_calls])))
        if message.tool_call_id is not None:
            pieces.append(("tool_call_id", message.tool_call_id))
        turns.append((role, pieces))
    if isinstance(framing, PromptProcessor):
        text = framing.chat_text(turns, tools)
    else:
        text = chat_text(framing, turns, tools)
    prompt: dict[str, Any] = {"prompt": text}
    if images:
        prompt["images"] = images
    if audio:
        prompt["audio"] = audio
    return prompt
