"""One connection's session settings: defaults, `session.update` (all of it checked before any of
it applies, so a refused update changes nothing), `response.create` overrides, and the GA session
object that `session.created` / `session.updated` carry.

Audio is pcm16 at 24 kHz mono both ways, the one PCM format of OpenAI's API. Sampling is the
stage configs' (the GA protocol has no temperature); `max_output_tokens` caps the text stage, and
"inf" (the default) runs it to the end of its context (or to `omni serve --max-tokens`). Fields omni does not implement are accepted only when
they ask for nothing (null, [] or OpenAI's default), and refused naming the field otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omni.entrypoints.openai.context import Context
from omni.entrypoints.openai.errors import bad_request
from omni.entrypoints.openai.flat_tools import checked_call
from omni.entrypoints.openai.language_codes import check_language
from omni.entrypoints.openai.realtime import events

SAMPLE_RATE = 24000
"""Input and output audio: pcm16, 24 kHz, mono."""
AUDIO_FORMAT = {"type": "audio/pcm", "rate": SAMPLE_RATE}


@dataclass(frozen=True)
class TurnDetection:
    """server_vad settings, with OpenAI's defaults."""

    threshold: float = 0.5
    """Speech probability (Silero VAD) at which speech starts."""
    prefix_padding_ms: int = 300
    """Audio before the detected start kept in the committed item."""
    silence_duration_ms: int = 500
    """Silence after speech that ends the turn."""
    create_response: bool = True
    """A detected end of speech starts a response."""
    interrupt_response: bool = True
    """A detected start of speech cancels the running response (barge-in)."""


@dataclass(frozen=True)
class ResponseSettings:
    """What one response is asked for (the session's settings, with response.create's)."""

    output_modalities: tuple[str, ...]
    """("text",) or ("audio",): audio always comes with its transcript."""
    instructions: str
    """The system message ("" for none)."""
    voice: str | None
    """The speaker (None: the model's default voice)."""
    max_output_tokens: int | None
    """The text stage's max_tokens (None: "inf", until the end of the context)."""
    metadata: dict[str, str] | None = None
    """Echoed in the response object."""
    tools: tuple[Any, ...] = ()
    """Functions the model may call (the Realtime API's form: {type, name, parameters})."""
    tool_choice: Any = "auto"
    """"auto", "none", "required" or {"type": "function", "name": ...}."""
    truncation: str = "auto"
    """"auto": the oldest items leave the context when it overflows (context_window.py)."""


@dataclass(frozen=True)
class SessionState:
    id: str
    """The session's id ("sess_...")."""
    output_modalities: tuple[str, ...]
    """The default for responses: ("audio",) where the pipeline speaks, else ("text",)."""
    instructions: str = ""
    """The system message every response's prompt starts with ("" for none)."""
    voice: str | None = None
    """The speaker (None: the model's default voice)."""
    turn_detection: TurnDetection | None = TurnDetection()
    """Server VAD settings; None: turns end only at input_audio_buffer.commit."""
    max_output_tokens: int | None = None
    """The text stage's max_tokens per response (None: "inf", until the end of the context)."""
    tools: tuple[Any, ...] = ()
    """Functions the model may call (function_calls.py)."""
    tool_choice: Any = "auto"
    """How it may call them."""
    transcription: events.Transcription | None = None
    """Transcribe each committed turn of input audio (input_transcription.py); None: do not."""
    truncation: str = "auto"
    """"auto" (the oldest items leave a context that overflows) or "disabled" (an error)."""

    def updated(self, ctx: Context, update: events.SessionObject) -> SessionState:
        """This session with `update` applied; OpenAIError (the session unchanged) if refused."""
        _refuse_unsupported(update, "session")
        if update.model is not None:
            ctx.check_model(update.model)
        changes: dict[str, Any] = {}
        if update.instructions is not None:
            changes["instructions"] = update.instructions
        if update.output_modalities is not None:
            changes["output_modalities"] = modalities(ctx, update.output_modalities, "session")
        if update.max_output_tokens is not None:
            changes["max_output_tokens"] = _max_tokens(update.max_output_tokens)
        changes |= _tools(ctx, update, self.tools, self.tool_choice, "session")
        if update.truncation is not None:
            if update.truncation not in ("auto", "disabled"):
                raise _unsupported("session.truncation", '"auto" or "disabled"')
            changes["truncation"] = update.truncation
        audio = update.audio
        if audio is not None and audio.input is not None:
            inp = audio.input
            _check_format(inp.format, "session.audio.input.format")
            if inp.noise_reduction is not None:
                raise _unsupported("session.audio.input.noise_reduction", "null")
            if inp.transcription is not None:
                _check_transcription(ctx, inp.transcription)
            if "transcription" in inp.model_fields_set:
                changes["transcription"] = inp.transcription
            if "turn_detection" in inp.model_fields_set:
                changes["turn_detection"] = _turn_detection(inp.turn_detection)
        if audio is not None and audio.output is not None:
            out = audio.output
            _check_format(out.format, "session.audio.output.format")
            if out.speed not in (None, 1.0):
                raise _unsupported("session.audio.output.speed", "1.0")
            if out.voice is not None:
                changes["voice"] = ctx.voice(out.voice, "session.audio.output.voice")
        return dataclasses.replace(self, **changes)

    def for_response(self, ctx: Context, params: events.ResponseParams | None) -> ResponseSettings:
        """The settings of one response: the session's, overridden by response.create's."""
        settings = ResponseSettings(
            self.output_modalities, self.instructions, self.voice, self.max_output_tokens,
            tools=self.tools, tool_choice=self.tool_choice, truncation=self.truncation,
        )  # fmt: skip
        if params is None:
            return settings
        _refuse_unsupported(params, "response")
        if params.conversation not in (None, "auto"):
            raise _unsupported("response.conversation", '"auto"')
        if params.input is not None:
            raise _unsupported("response.input", "null (the conversation is the input)")
        changes: dict[str, Any] = {"metadata": params.metadata}
        if params.output_modalities is not None:
            changes["output_modalities"] = modalities(ctx, params.output_modalities, "response")
        if params.instructions is not None:
            changes["instructions"] = params.instructions
        if params.max_output_tokens is not None:
            changes["max_output_tokens"] = _max_tokens(params.max_output_tokens)
        changes |= _tools(ctx, params, self.tools, self.tool_choice, "response")
        out = params.audio.output if params.audio is not None else None
        if out is not None:
            _check_format(out.format, "response.audio.output.format")
            if out.voice is not None:
                changes["voice"] = ctx.voice(out.voice, "response.audio.output.voice")
        return dataclasses.replace(settings, **changes)

    def to_dict(self, ctx: Context) -> dict[str, Any]:
        """The GA session object."""
        td = self.turn_detection
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": self.id,
            "model": ctx.args.model_name,
            "output_modalities": list(self.output_modalities),
            "instructions": self.instructions,
            "audio": {
                "input": {
                    "format": AUDIO_FORMAT,
                    "transcription": None
                    if self.transcription is None
                    else self.transcription.model_dump(),
                    "noise_reduction": None,
                    "turn_detection": None
                    if td is None
                    else {"type": "server_vad", "idle_timeout_ms": None, **dataclasses.asdict(td)},
                },
                "output": {
                    "format": AUDIO_FORMAT,
                    "voice": self.voice or ctx.async_omni.default_voice,  # unset: the default's
                    "speed": 1.0,
                },
            },
            "max_output_tokens": self.max_output_tokens or "inf",
            "tools": list(self.tools),
            "tool_choice": self.tool_choice,
            "tracing": None,
            "truncation": self.truncation,
            "include": None,
            "prompt": None,
        }


def modalities(ctx: Context, requested: Sequence[str], where: str) -> tuple[str, ...]:
    param = f"{where}.output_modalities"
    if list(requested) not in (["text"], ["audio"]):
        raise bad_request(
            f"{param} must be ['text'] or ['audio'] (audio comes with its transcript), got "
            f"{requested}",
            param,
            "unsupported_value",
        )
    if list(requested) == ["audio"]:
        ctx.require_audio(param)
    return tuple(requested)


def _max_tokens(value: int | str) -> int | None:
    return None if value == "inf" else int(value)


def _check_format(fmt: events.AudioFormat | None, param: str) -> None:
    if fmt is None:
        return
    if fmt.type not in (None, "audio/pcm") or fmt.rate not in (None, SAMPLE_RATE):
        raise bad_request(
            f"{param}: only {{type: 'audio/pcm', rate: {SAMPLE_RATE}}} (pcm16, 24 kHz, mono) is "
            f"supported, got {fmt.model_dump(exclude_none=True)}",
            param,
            "unsupported_value",
        )


def _turn_detection(td: events.TurnDetection | None) -> TurnDetection | None:
    if td is None:
        return None
    param = "session.audio.input.turn_detection"
    if td.type != "server_vad":
        raise _unsupported(f"{param}.type", '"server_vad" (or a null turn_detection)')
    if td.idle_timeout_ms is not None:
        raise _unsupported(f"{param}.idle_timeout_ms", "null")
    if td.eagerness is not None:
        raise _unsupported(f"{param}.eagerness", "null (it is a semantic_vad setting)")
    fields = {
        f.name: getattr(td, f.name)
        for f in dataclasses.fields(TurnDetection)
        if getattr(td, f.name) is not None
    }
    return TurnDetection(**fields)


_OFF: dict[str, tuple[Any, ...]] = {
    "tracing": (None,),
    "include": (None, []),
    "prompt": (None,),
    "reasoning": (None,),
    "parallel_tool_calls": (None, False, True),
}


def _check_transcription(ctx: Context, transcription: events.Transcription) -> None:
    param = "session.audio.input.transcription"
    if getattr(ctx.async_omni.prompt_processor, "max_audio_seconds", None) is None:
        raise bad_request(
            f"{param}: {ctx.args.model_name!r} takes no audio input", param, "unsupported_value"
        )
    check_language(transcription.language, f"{param}.language")


def _tools(
    ctx: Context, given: Any, tools: tuple[Any, ...], tool_choice: Any, where: str
) -> dict[str, Any]:
    """The tools and tool_choice `given` sets (checked together with the ones it leaves)."""
    changes: dict[str, Any] = {}
    if given.tools is not None:
        changes["tools"] = tuple(given.tools)
    if given.tool_choice is not None:
        changes["tool_choice"] = given.tool_choice
    if changes:
        new_tools = changes.get("tools", tools)
        checked_call(ctx, list(new_tools), changes.get("tool_choice", tool_choice), where)
    return changes


def _refuse_unsupported(obj: Any, where: str) -> None:
    for name, off in _OFF.items():
        if name in type(obj).model_fields and getattr(obj, name) not in off:
            raise _unsupported(f"{where}.{name}", " or ".join(repr(v) for v in off))


def _unsupported(param: str, accepted: str) -> Exception:
    return bad_request(
        f"{param} is not supported by omni's realtime endpoint; accepted: {accepted}",
        param,
        "unsupported_value",
    )
