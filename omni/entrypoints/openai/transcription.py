"""POST /v1/audio/transcriptions and /v1/audio/translations: the text of an audio file's speech
(WAV, MP3, FLAC, Ogg, M4A, MP4 or WebM), from a pipeline whose root stage hears audio
(Qwen2.5-Omni's and Qwen3-Omni's thinkers).

An omni model is not a speech recognizer with timestamps: the audio goes in a chat turn with an
instruction (`instruction`: transcribe word for word, in `language` when given, with `prompt` as
context; or translate into English), and the reply of the text stage is the transcript. The
request ends there (the talker and vocoder never run). The body is multipart/form-data as
OpenAI's client sends it (omni/entrypoints/openai/form_data.py).

Fields: `file`, `model`, `prompt`, `response_format` (json: `{"text", "usage"}`; text;
verbose_json, srt and vtt: timestamps of speech segments, below),
`temperature` (default 0, greedy); transcriptions also `language` (ISO-639-1) and `stream`
(server-sent `transcript.text.delta` events as the text comes, then `transcript.text.done` with
the whole text and the usage), `chunking_strategy` "auto". A file longer than the model hears at
once (Qwen2.5-Omni: 30 s) is cut at quiet points into pieces that fit (audio_chunks.py), each
its own request, all run together; their texts are joined in order (`Transcript`), streamed as
each piece's turn comes, and the usage is their sum. verbose_json, srt and vtt transcribe each
stretch of speech the VAD finds on its own (speech_segments.py), so their segments carry where
it is in the file (transcript_formats.py); `timestamp_granularities[]` "segment" with
verbose_json. Refused with a 400 naming the field: "word" timestamps (omni's models give none),
those formats streamed, `include[]`, any other field.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import wave
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.requests import Request

from omni.entrypoints import media_parts
from omni.entrypoints.openai import sampling, streaming
from omni.entrypoints.openai.audio_chunks import split_wav
from omni.entrypoints.openai.context import Context, new_id
from omni.entrypoints.openai.errors import bad_request, from_exception
from omni.entrypoints.openai.form_data import FormPart, parse_form
from omni.entrypoints.openai.language_codes import check_language, language_name
from omni.entrypoints.openai.prompts import chat_prompt
from omni.entrypoints.openai.speech_segments import speech_segments
from omni.entrypoints.openai.transcript_formats import segment_entries, srt, verbose_json, vtt
from omni.entrypoints.snapshot_cursor import SnapshotCursor
from omni.messages import OmniOutput

TRANSCRIBE, TRANSLATE = "/v1/audio/transcriptions", "/v1/audio/translations"
TIMESTAMPED = ("verbose_json", "srt", "vtt")
FORMATS = ("json", "text", *TIMESTAMPED)
FIELDS = {
    TRANSCRIBE: ("file", "model", "language", "prompt", "response_format", "temperature",
                 "stream", "chunking_strategy", "timestamp_granularities[]", "include[]"),
    TRANSLATE: ("file", "model", "prompt", "response_format", "temperature"),
}  # fmt: skip


def instruction(translate: bool, language: str | None, prompt: str | None) -> str:
    """What the model is asked to do with the audio."""
    if translate:
        text = "Translate the speech in this audio into English."
    else:
        text = "Transcribe the speech in this audio word for word"
        text += f" (language: {language})." if language else "."
    text += " Reply with that text only."
    if prompt:
        text += f" Earlier text, for context and spelling: {prompt}"
    return text


async def create(ctx: Context, request: Request, body: bytes, endpoint: str) -> Response:
    form = parse_form(body, request.headers.get("content-type"))
    unknown = sorted(set(form) - set(FIELDS[endpoint]))
    if unknown:
        raise bad_request(
            f"{unknown[0]}: not a field of {endpoint}; fields: {list(FIELDS[endpoint])}",
            unknown[0],
        )
    field = {name: parts[-1] for name, parts in form.items()}
    model = _value(field, "model")
    if model is None:
        raise bad_request("model: required", "model", "missing_required_parameter")
    ctx.check_model(model)
    text_stage = ctx.text_stage()
    processor = ctx.async_omni.prompt_processor
    if "audio" not in processor.input_media:
        raise bad_request(
            f"{ctx.args.model_name!r} does not take audio input (its root stage hears no audio)",
            "model",
            "unsupported_value",
        )
    if "file" not in field or field["file"].filename is None:
        raise bad_request("file: the audio file is required", "file", "missing_required_parameter")
    try:
        audio_file = media_parts.as_wav(field["file"].data, "file")
    except media_parts.MediaError as e:
        raise bad_request(e.message, e.param) from None
    response_format = _value(field, "response_format") or "json"
    if response_format not in FORMATS:
        raise bad_request(
            f"response_format: {response_format!r} is not supported; formats: {list(FORMATS)}",
            "response_format",
            "unsupported_value",
        )
    _check_granularities([part.text() for part in form.get("timestamp_granularities[]", [])],
                         response_format)  # fmt: skip
    if "include[]" in form:
        raise bad_request("include[]: not supported", "include[]", "unsupported_value")
    if _value(field, "chunking_strategy") not in (None, "auto"):
        raise bad_request("chunking_strategy: only 'auto' is supported", "chunking_strategy")
    language = _value(field, "language")
    check_language(language, "language")
    stream = _flag(field, "stream")
    timestamped = response_format in TIMESTAMPED
    if stream and timestamped:
        raise bad_request(
            f"stream: {response_format} is not streamed; stream json (or text) instead, or "
            "leave stream out",
            "stream",
            "unsupported_value",
        )
    ask = instruction(endpoint == TRANSLATE, language, _value(field, "prompt"))
    plan = sampling.plan(
        ctx.async_omni,
        text_stage,
        temperature=_temperature(field),
        until_end=True,
        default_max_tokens=ctx.args.max_tokens,
        text_final=True,
        logprobs=0 if response_format == "verbose_json" else None,  # segments' avg_logprob
    )
    request_id = new_id("transcription")
    max_seconds = getattr(processor, "max_audio_seconds", None)
    segments = []
    if timestamped:  # the VAD takes ~0.4 s a minute of audio (2-core CPU): off the event loop
        segments = await asyncio.to_thread(speech_segments, audio_file, max_seconds)
    pieces = [s.wav for s in segments] if timestamped else split_wav(audio_file, max_seconds)
    prepared = []
    for index, piece in enumerate(pieces):
        audio = base64.b64encode(piece).decode()
        messages = [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": audio, "format": "wav"}},
            {"type": "text", "text": ask}]}]  # fmt: skip
        prompt = chat_prompt(processor, messages, ctx.args)
        piece_id = request_id if len(pieces) == 1 else f"{request_id}-{index}"
        prepared.append(await streaming.prepare(ctx.async_omni, prompt, piece_id))
    timer = ctx.metrics.timer(endpoint)
    runs = [
        ctx.async_omni.run(p, plan.params, final_stage=text_stage, step_snapshots=stream)
        for p in prepared
    ]
    if stream:
        return StreamingResponse(_events(ctx, runs, timer), media_type="text/event-stream")
    try:
        outs = await streaming.until_disconnected(request, streaming.collect_all(runs, timer))
    except streaming.ClientGone:
        return Response(status_code=499)
    transcript = Transcript(text_stage, len(outs))
    for index, out in enumerate(outs):
        transcript.add(index, out)
    if response_format == "text":
        return PlainTextResponse(transcript.text)
    if not timestamped:
        return JSONResponse({"text": transcript.text, "usage": usage(ctx, outs)})
    results = [streaming.check(out).stages[text_stage] for out in outs]
    entries = segment_entries(segments, results, plan.params[text_stage].temperature)
    if response_format == "srt":
        return PlainTextResponse(srt(entries))
    if response_format == "vtt":
        return PlainTextResponse(vtt(entries), media_type="text/vtt")
    translate = endpoint == TRANSLATE
    seconds = _seconds(audio_file)
    verbose = verbose_json("translate" if translate else "transcribe",
                           "english" if translate else language_name(language or "unknown"),
                           seconds, transcript.text, entries)  # fmt: skip
    # verbose_json's usage is the audio's duration, as OpenAI's (json's counts tokens)
    return JSONResponse({**verbose, "usage": {"type": "duration", "seconds": round(seconds, 3)}})


class Transcript:
    """The pieces' texts in order, as one: a space between two pieces unless whitespace
    already separates them. Fed each piece's snapshots as they come, in any order."""

    def __init__(self, text_stage: str, num_pieces: int) -> None:
        self.cursors = [SnapshotCursor(text_stage) for _ in range(num_pieces)]
        self.lasts: list[OmniOutput | None] = [None] * num_pieces
        self.current = 0  # the first piece not yet finished
        self.text = ""  # let out so far

    def add(self, index: int, out: OmniOutput) -> str:
        """The text this snapshot lets out: the current piece's new text, and that of the
        pieces after it once it has finished (a failed piece raises)."""
        self.lasts[index] = out
        new = ""
        while self.current < len(self.lasts):
            last = self.lasts[self.current]
            if last is None:
                break
            cursor = self.cursors[self.current]
            piece = cursor.advance(streaming.check(last) if last.finished else last).text
            first = len(cursor.text_sent) == len(piece)
            joined = self.text + new
            if piece and first and joined and not joined[-1].isspace() and not piece[0].isspace():
                piece = " " + piece
            new += piece
            if not last.finished:
                break
            self.current += 1
        self.text += new
        return new


async def _events(ctx: Context, runs: list[Any], timer: Any) -> AsyncIterator[bytes]:
    """`transcript.text.delta` per new piece of text, then `transcript.text.done`; a failure
    after the status was sent is an `error` event."""
    transcript = Transcript(ctx.text_stage(), len(runs))
    ok = False
    try:
        async with contextlib.aclosing(streaming.merged(runs)) as snapshots:
            async for index, out in snapshots:
                timer.output()
                new = transcript.add(index, out)
                if new:
                    timer.first_token()
                    yield streaming.sse({"type": "transcript.text.delta", "delta": new})
        outs = [streaming.check(last) for last in transcript.lasts]
        done = {"type": "transcript.text.done", "text": transcript.text, "usage": usage(ctx, outs)}
        ok = True
        yield streaming.sse(done)
    except Exception as e:  # noqa: BLE001 - the status is sent: report in the stream
        yield streaming.sse({"type": "error", **from_exception(e).body()})
    finally:
        timer.done(ok=ok)


def usage(ctx: Context, outs: list[OmniOutput]) -> dict[str, Any]:
    """The token usage of a transcription's requests (its pieces), as OpenAI's `tokens` usage."""
    each = [streaming.usage(ctx.async_omni, out, ctx.text_stage()) for out in outs]
    inputs, outputs = (sum(c[key] for c in each) for key in ("prompt_tokens", "completion_tokens"))
    return {"type": "tokens", "input_tokens": inputs, "output_tokens": outputs,
            "total_tokens": inputs + outputs}  # fmt: skip


def _check_granularities(values: list[str], response_format: str) -> None:
    """timestamp_granularities[]: "segment" only, and with verbose_json (as OpenAI's)."""
    name = "timestamp_granularities[]"
    for value in values:
        if value not in ("segment", "word"):
            raise bad_request(f"{name}: 'segment' or 'word', got {value!r}", name)
        if value == "word":
            raise bad_request(f"{name}: 'word' timestamps are not supported: omni's models "
                              "give none; 'segment' are, with verbose_json", name,
                              "unsupported_value")  # fmt: skip
    if values and response_format != "verbose_json":
        raise bad_request(f"{name}: needs response_format 'verbose_json'", name)


def _seconds(data: bytes) -> float:
    with wave.open(io.BytesIO(data)) as w:
        return w.getnframes() / w.getframerate()


def _value(field: dict[str, FormPart], name: str) -> str | None:
    return field[name].text() if name in field else None


def _flag(field: dict[str, FormPart], name: str) -> bool:
    value = (_value(field, name) or "false").lower()
    if value not in ("true", "false"):
        raise bad_request(f"{name}: true or false, got {value!r}", name)
    return value == "true"


def _temperature(field: dict[str, FormPart]) -> float:
    value = _value(field, "temperature") or "0"
    try:
        temperature = float(value)
    except ValueError:
        temperature = -1.0
    if not 0.0 <= temperature <= 2.0:
        raise bad_request(f"temperature: a number in [0, 2], got {value!r}", "temperature")
    return temperature
