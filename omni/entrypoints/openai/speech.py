"""POST /v1/audio/speech: `input` spoken by a pipeline that ends in a vocoder.

Approximation: an omni model's talker speaks the thinker's reply, not arbitrary text, so the
input goes in the chat of the family's prompt processor (`PromptProcessor.speech_messages`: a
system message that asks the model to repeat the user's text verbatim, `instructions` appended). A trained model
then says the input; a random-weight test model says something else, in the right format.
The thinker may generate up to max(its default, 2 x the input's tokens + 16) tokens.

Responses: `response_format` wav (audio/wav) or pcm (raw 16-bit little-endian mono,
audio/pcm). `stream_format` audio: the same bytes, chunked; sse: `speech.audio.delta` events
(base64 pieces of those bytes, in order) and a final `speech.audio.done` with usage. A streamed
pcm response takes the streaming path (docs/streaming.md): its bytes leave as the vocoder decodes
them. wav needs the whole length in its header, so streamed wav (and every non-streamed response)
comes from the exact whole-sequence path once it is complete.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import Response, StreamingResponse
from starlette.requests import Request

from omni.entrypoints.openai import audio_encoding, sampling, streaming
from omni.entrypoints.openai.context import Context, new_id
from omni.entrypoints.openai.errors import bad_request, from_exception
from omni.entrypoints.openai.prompts import chat_prompt
from omni.entrypoints.openai.protocol import SpeechRequest
from omni.entrypoints.snapshot_cursor import SnapshotCursor
from omni.messages import OmniOutput

ENDPOINT = "/v1/audio/speech"
FORMATS = {"wav": "audio/wav", "pcm": "audio/pcm"}


async def create(ctx: Context, request: Request, body: SpeechRequest) -> Response:
    ctx.check_model(body.model)
    ctx.require_audio("model")
    if body.response_format not in FORMATS:
        raise bad_request(
            f"response_format {body.response_format!r} is not supported; formats: {list(FORMATS)}",
            "response_format",
        )
    if body.speed not in (None, 1.0):
        raise bad_request(
            f"speed: only 1.0 is supported, got {body.speed}", "speed", "unsupported_value"
        )
    speaker = ctx.voice(body.voice, "voice")
    text_stage = ctx.text_stage()
    processor = ctx.async_omni.prompt_processor
    messages = processor.speech_messages(body.input, body.instructions)
    prompt = chat_prompt(processor, messages, ctx.args)
    if speaker is not None:
        prompt["speaker"] = speaker
    plan = sampling.plan(
        ctx.async_omni,
        text_stage,
        min_text_tokens=2 * len(ctx.async_omni.tokenize(body.input)) + 16,
    )
    prepared = await streaming.prepare(ctx.async_omni, prompt, new_id("speech"))
    timer = ctx.metrics.timer(ENDPOINT)
    live = body.response_format == "pcm" and body.stream_format in ("sse", "audio")
    outputs = ctx.async_omni.run(prepared, plan.params, step_snapshots=live, stream_audio=live)
    media_type = FORMATS[body.response_format]
    if live:
        return StreamingResponse(
            _live(ctx, outputs, timer, sse=body.stream_format == "sse"),
            media_type="text/event-stream" if body.stream_format == "sse" else media_type,
        )

    def encoded(out: OmniOutput) -> bytes:
        final = out.final
        if final.audio is None:
            raise bad_request("the pipeline returned no audio", "model")
        return audio_encoding.encode(final.audio, ctx.sample_rate(final), body.response_format)

    if body.stream_format == "sse":

        async def events() -> AsyncIterator[bytes]:
            try:
                out = await streaming.collect(outputs, timer)
                data = encoded(out)
            except Exception as e:  # noqa: BLE001 - reported in the stream, the status is sent
                yield streaming.sse({"type": "error", **from_exception(e).body()})
                return
            for piece in audio_encoding.chunks(data):
                yield streaming.sse(
                    {"type": "speech.audio.delta", "audio": base64.b64encode(piece).decode()}
                )
            yield streaming.sse({"type": "speech.audio.done", "usage": _usage(ctx, out)})

        return StreamingResponse(events(), media_type="text/event-stream")
    try:
        out = await streaming.until_disconnected(request, streaming.collect(outputs, timer))
    except streaming.ClientGone:
        return Response(status_code=499)
    data = encoded(out)
    if body.stream_format == "audio" and len(data) > 2 * audio_encoding.CHUNK_SAMPLES:

        async def pieces() -> AsyncIterator[bytes]:
            for piece in audio_encoding.chunks(data):
                yield piece

        return StreamingResponse(pieces(), media_type=media_type)
    return Response(data, media_type=media_type)


async def _live(ctx: Context, outputs: Any, timer: Any, *, sse: bool) -> AsyncIterator[bytes]:
    """pcm bytes of each new piece of the waveform as the vocoder decodes it (as sse events, or
    raw). A failure after the status was sent ends the stream (an sse `error` event)."""
    audio_stage = ctx.async_omni.audio_stage
    cursor = SnapshotCursor()
    last = None
    try:
        async with contextlib.aclosing(outputs) as snapshots:
            async for last in snapshots:
                timer.output()
                if last.finished:  # its tail is sent below, once it is known not to be an error
                    continue
                audio = cursor.advance(last).audio.get(audio_stage)
                if audio is None:
                    continue
                timer.first_audio()
                for piece in audio_encoding.chunks(audio_encoding.pcm16_bytes(audio)):
                    if sse:
                        data = base64.b64encode(piece).decode()
                        yield streaming.sse({"type": "speech.audio.delta", "audio": data})
                    else:
                        yield piece
        out = streaming.check(last)
        audio = cursor.advance(out).audio.get(audio_stage)
        if audio is not None:  # the tail of the last step
            rest = audio_encoding.pcm16_bytes(audio)
            if sse:
                data = base64.b64encode(rest).decode()
                yield streaming.sse({"type": "speech.audio.delta", "audio": data})
            else:
                yield rest
        if sse:
            yield streaming.sse({"type": "speech.audio.done", "usage": _usage(ctx, out)})
    except Exception as e:  # noqa: BLE001 - the status is sent: report in the stream, if sse
        if sse:
            yield streaming.sse({"type": "error", **from_exception(e).body()})
    finally:
        timer.done(ok=last is not None and last.error is None)


def _usage(ctx: Context, out: OmniOutput) -> dict[str, Any]:
    root = out.stages.get(ctx.async_omni.config.root_stages[0].name)
    inputs = root.num_prompt_tokens if root is not None else 0
    outputs = sum(len(r.token_ids) for r in out.stages.values() if r.stage != root_name(ctx))
    return {"input_tokens": inputs, "output_tokens": outputs, "total_tokens": inputs + outputs}


def root_name(ctx: Context) -> str:
    return str(ctx.async_omni.config.root_stages[0].name)
