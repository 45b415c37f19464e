"""Client events of OpenAI's Realtime API (the GA protocol), as strict pydantic models, and
`parse`: one WebSocket message -> a validated event, or the OpenAIError its `error` event carries.

Strict as the HTTP bodies are (protocol.py): unknown fields, wrong JSON types and out-of-range
values are errors naming the field. Fields of the GA session object that omni does not implement
(tracing, noise reduction, semantic VAD, ...) parse here and are refused,
when set to something other than "off", by the session (session_state.py), naming the field.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from omni.entrypoints.openai.errors import OpenAIError, bad_request, from_validation_error
from omni.entrypoints.openai.protocol import VoiceId

MAX_EVENT_BYTES = 8 * 1024 * 1024
"""The largest client event (one WebSocket message); larger ones are an `error` event. 30 s of
24 kHz pcm16, the most a buffer holds, is 1.9 MB as base64."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class AudioFormat(_Strict):
    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"] | None = None
    rate: int | None = None


class TurnDetection(_Strict):
    type: Literal["server_vad", "semantic_vad"]
    threshold: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    prefix_padding_ms: Annotated[int, Field(ge=0, le=10_000)] | None = None
    silence_duration_ms: Annotated[int, Field(ge=0, le=10_000)] | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: int | None = None
    eagerness: str | None = None


class Transcription(_Strict):
    """Input audio transcription: `model` is taken as given (the served model transcribes)."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None


class AudioInput(_Strict):
    format: AudioFormat | None = None
    turn_detection: TurnDetection | None = None
    transcription: Transcription | None = None
    noise_reduction: dict[str, Any] | None = None


class AudioOutput(_Strict):
    format: AudioFormat | None = None
    voice: str | VoiceId | None = None
    speed: float | None = None


class AudioConfig(_Strict):
    input: AudioInput | None = None
    output: AudioOutput | None = None


Modalities = list[Literal["text", "audio"]]
MaxTokens = Annotated[int, Field(ge=1, le=4096)] | Literal["inf"]


class SessionObject(_Strict):
    """The GA session object of `session.update` (only the fields set change the session)."""

    type: Literal["realtime"]
    model: str | None = None
    instructions: str | None = None
    output_modalities: Modalities | None = None
    audio: AudioConfig | None = None
    max_output_tokens: MaxTokens | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    tracing: Any = None
    truncation: Any = None
    include: list[str] | None = None
    prompt: Any = None
    reasoning: Any = None
    parallel_tool_calls: bool | None = None


class ContentPart(_Strict):
    type: Literal["input_text", "input_audio", "input_image", "output_text", "output_audio"]
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None
    image_url: str | None = None
    detail: Literal["auto", "low", "high"] | None = None


class Item(_Strict):
    """An item of `conversation.item.create`: a message (role, content), a function call the
    model made (call_id, name, arguments) or its output (call_id, output)."""

    type: Literal["message", "function_call", "function_call_output"]
    role: Literal["user", "assistant", "system"] | None = None
    content: list[ContentPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None
    id: str | None = None
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None


class ResponseAudio(_Strict):
    output: AudioOutput | None = None


class ResponseParams(_Strict):
    """`response.create`'s `response`: overrides of the session for this response only."""

    output_modalities: Modalities | None = None
    instructions: str | None = None
    max_output_tokens: MaxTokens | None = None
    audio: ResponseAudio | None = None
    metadata: dict[str, str] | None = None
    conversation: str | None = None
    input: list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    prompt: Any = None
    reasoning: Any = None
    parallel_tool_calls: bool | None = None


class _Event(_Strict):
    event_id: str | None = None


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: SessionObject


class InputAudioBufferAppend(_Event):
    type: Literal["input_audio_buffer.append"]
    audio: str


class InputAudioBufferCommit(_Event):
    type: Literal["input_audio_buffer.commit"]


class InputAudioBufferClear(_Event):
    type: Literal["input_audio_buffer.clear"]


class ConversationItemCreate(_Event):
    type: Literal["conversation.item.create"]
    item: Item
    previous_item_id: str | None = None


class ConversationItemRetrieve(_Event):
    type: Literal["conversation.item.retrieve"]
    item_id: str


class ConversationItemDelete(_Event):
    type: Literal["conversation.item.delete"]
    item_id: str


class ConversationItemTruncate(_Event):
    type: Literal["conversation.item.truncate"]
    item_id: str
    content_index: Annotated[int, Field(ge=0)]
    audio_end_ms: Annotated[int, Field(ge=0)]


class ResponseCreate(_Event):
    type: Literal["response.create"]
    response: ResponseParams | None = None


class ResponseCancel(_Event):
    type: Literal["response.cancel"]
    response_id: str | None = None


EVENTS: dict[str, type[_Event]] = {
    "session.update": SessionUpdate,
    "input_audio_buffer.append": InputAudioBufferAppend,
    "input_audio_buffer.commit": InputAudioBufferCommit,
    "input_audio_buffer.clear": InputAudioBufferClear,
    "conversation.item.create": ConversationItemCreate,
    "conversation.item.retrieve": ConversationItemRetrieve,
    "conversation.item.delete": ConversationItemDelete,
    "conversation.item.truncate": ConversationItemTruncate,
    "response.create": ResponseCreate,
    "response.cancel": ResponseCancel,
}
ClientEvent = (
    SessionUpdate
    | InputAudioBufferAppend
    | InputAudioBufferCommit
    | InputAudioBufferClear
    | ConversationItemCreate
    | ConversationItemRetrieve
    | ConversationItemDelete
    | ConversationItemTruncate
    | ResponseCreate
    | ResponseCancel
)


class BadEvent(Exception):
    """A client event that cannot be handled: the error and the event's own event_id."""

    def __init__(self, error: OpenAIError, event_id: str | None) -> None:
        super().__init__(error.message)
        self.error = error
        self.event_id = event_id


def parse(message: str | bytes, max_bytes: int = MAX_EVENT_BYTES) -> ClientEvent:
    """One WebSocket message as a client event; BadEvent naming what is wrong otherwise."""
    size = len(message.encode() if isinstance(message, str) else message)
    if size > max_bytes:
        raise BadEvent(
            bad_request(
                f"the event ({size} bytes) is over the limit of {max_bytes} bytes; send audio "
                "in smaller input_audio_buffer.append events",
                None,
                "event_too_large",
            ),
            None,
        )
    try:
        data = json.loads(message)
    except (ValueError, RecursionError) as e:
        invalid = bad_request(f"the event is not valid JSON: {e}", None, "invalid_json")
        raise BadEvent(invalid, None) from None
    if not isinstance(data, dict):
        raise BadEvent(bad_request("an event must be a JSON object", None, "invalid_event"), None)
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    kind = data.get("type")
    model = EVENTS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise BadEvent(
            bad_request(
                f"Invalid value: {kind!r}. Supported event types: {sorted(EVENTS)}",
                "type",
                "invalid_event_type",
            ),
            event_id,
        )
    try:
        return model.model_validate(data)  # type: ignore[return-value]
    except ValidationError as e:
        raise BadEvent(from_validation_error(list(e.errors())), event_id) from None
