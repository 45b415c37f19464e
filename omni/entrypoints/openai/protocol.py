"""Request bodies, as pydantic models that reject what OpenAI rejects: unknown fields
(`extra="forbid"`), wrong JSON types (strict: "5" is not an integer) and out-of-range values.
omni's extensions (vLLM's `top_k`, `min_p`, `min_tokens`, `repetition_penalty`, `ignore_eos`,
`stop_token_ids`, `include_stop_str_in_output`, `structured_outputs`; `cache_salt`,
`stage_sampling`) are ordinary top-level fields, which is where the openai client's
`extra_body` puts them. Checks that need the engine (the model name, voices,
formats, n) are done by the endpoints, so that their messages can list the valid values."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

# Chat messages are shared with Omni.chat (omni/entrypoints/chat_messages.py).
from omni.entrypoints.chat_messages import AudioPart as AudioPart
from omni.entrypoints.chat_messages import ChatMessage as ChatMessage
from omni.entrypoints.chat_messages import ContentPart as ContentPart
from omni.entrypoints.chat_messages import ImagePart as ImagePart
from omni.entrypoints.chat_messages import ImageURL as ImageURL
from omni.entrypoints.chat_messages import InputAudio as InputAudio
from omni.entrypoints.chat_messages import Strict as _Strict
from omni.entrypoints.chat_messages import TextPart as TextPart


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # sent by some clients; there is nothing to obfuscate


class VoiceId(_Strict):
    id: str


class AudioOutput(_Strict):
    voice: str | VoiceId
    format: str


class _Sampling(_Strict):
    """Fields shared by chat and completions; they apply to the last text stage."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # omni extensions (openai client: extra_body={...}); top_k as vLLM takes it (-1 or 0: off),
    # and vLLM's min_p, min_tokens, repetition_penalty
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    min_tokens: int | None = Field(default=None, ge=0)
    repetition_penalty: float | None = Field(default=None, gt=0)
    ignore_eos: bool | None = None  # vLLM's benchmarks send it to fix the reply's length
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    include_stop_str_in_output: bool | None = None
    # vLLM's structured outputs (structured_outputs.py), and their older spellings
    structured_outputs: dict[str, Any] | None = None
    guided_choice: list[str] | None = None
    guided_json: dict[str, Any] | str | None = None
    cache_salt: str | None = Field(default=None, min_length=1)
    stage_sampling: dict[str, dict[str, Any]] | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioOutput | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # text, json_object or json_schema (sampling.json_schema_of: a 400 naming what is not served)
    response_format: dict[str, Any] | None = None
    # OpenAI fields omni serves only at their defaults (clients send them so): anything else is
    # a 400 naming the field (chat.py, `_unsupported`), not "extra inputs are not permitted".
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool | None = False
    suffix: str | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)


class SpeechRequest(_Strict):
    model: str
    input: str = Field(min_length=1, max_length=4096)
    voice: str | VoiceId | None = None
    response_format: str = "wav"
    stream_format: Literal["audio", "sse"] = "audio"
    speed: float | None = Field(default=None, ge=0.25, le=4.0)
    instructions: str | None = None


class ResponsesInputPart(_Strict):
    """A content part of a Responses API input message."""

    type: Literal["input_text", "output_text", "input_image"]
    text: str | None = None
    image_url: str | None = None
    detail: Literal["auto", "low", "high"] | None = None
    annotations: list[Any] | None = None  # an earlier output's, sent back: ignored


class ResponsesInputMessage(_Strict):
    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ResponsesInputPart]
    id: str | None = None
    status: str | None = None


class ResponsesFunctionCall(_Strict):
    """An earlier reply's function call, sent back as input."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class ResponsesFunctionCallOutput(_Strict):
    """The output of a function call, for the model to read."""

    type: Literal["function_call_output"]
    call_id: str
    output: str
    id: str | None = None
    status: str | None = None


class ResponsesRequest(_Strict):
    """POST /v1/responses (OpenAI's Responses API), text in and out (responses.py)."""

    model: str
    input: str | list[ResponsesInputMessage | ResponsesFunctionCall | ResponsesFunctionCallOutput]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stream: bool | None = False
    text: dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    # Served at their defaults only (a 400 naming the field otherwise, responses.py):
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    background: bool | None = None
    # omni extensions, as on chat
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = None
    cache_salt: str | None = Field(default=None, min_length=1)


class TokenizeRequest(_Strict):
    """POST /tokenize (vLLM's): a text prompt, or chat messages framed as chat frames them."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None


class DetokenizeRequest(_Strict):
    """POST /detokenize (vLLM's): token ids back to text."""

    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]
