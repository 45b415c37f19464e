"""POST /v1/chat/completions: text, or text + audio (`modalities: ["text", "audio"]`).

One choice. Non-streaming: `message.content` is the text stage's text, `message.audio` the
vocoder's waveform `{id, data (base64 wav or pcm16), expires_at, transcript}`, from the
whole-sequence path (the waveform transformers produces). Streaming: a role chunk, the text as
the text stage generates it, the audio as the vocoder decodes it, the finish reason, an optional
usage chunk, `[DONE]`. Streamed audio runs the streaming path (the talker starts before the
thinker has finished, the vocoder decodes in chunks) and must be pcm16, as with OpenAI: each new
piece of waveform is a `delta.audio` `{id, data: base64 pcm16 of the new samples only}`, each
text piece is both `delta.content` and `delta.audio.transcript`, and a last
`delta.audio` `{id, expires_at}` closes the audio. Without audio the request ends at the text
stage: the talker and vocoder never run.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import Request

from omni.entrypoints.openai import audio_encoding, sampling, streaming
from omni.entrypoints.openai.context import Context, new_id
from omni.entrypoints.openai.errors import bad_request, from_exception
from omni.entrypoints.openai.logprobs import LogprobCursor
from omni.entrypoints.openai.prompts import chat_prompt
from omni.entrypoints.openai.protocol import ChatCompletionRequest
from omni.entrypoints.snapshot_cursor import SnapshotCursor, SnapshotNews
from omni.messages import OmniOutput

ENDPOINT = "/v1/chat/completions"
AUDIO_FORMATS = ("wav", "pcm16")
STREAM_AUDIO_FORMAT = "pcm16"  # raw samples: any run of whole samples plays on its own
AUDIO_TTL_S = 3600


def _unsupported(body: ChatCompletionRequest) -> list[tuple[str, object, bool]]:
    """(field, value, served): OpenAI fields omni serves at their defaults only."""
    return [
        ("response_format", body.response_format, body.response_format in (None, {"type": "text"})),
        ("tools", body.tools, not body.tools),
        ("tool_choice", body.tool_choice, body.tool_choice in (None, "none")),
        ("store", body.store, not body.store),
    ]


async def create(ctx: Context, request: Request, body: ChatCompletionRequest) -> Response:
    ctx.check_model(body.model)
    if body.n not in (None, 1):
        raise bad_request(f"n: only n=1 is supported, got {body.n}", "n", "unsupported_value")
    for name, value, served in _unsupported(body):
        if not served:
            raise bad_request(f"{name}: {value!r} is not supported", name, "unsupported_value")
    if body.top_logprobs and not body.logprobs:
        raise bad_request("top_logprobs: needs logprobs set to true", "top_logprobs")
    text_stage = ctx.text_stage()
    modalities = body.modalities or ["text"]
    want_audio = "audio" in modalities
    speaker = None
    if want_audio:
        ctx.require_audio("modalities")
        if body.audio is None:
            raise bad_request(
                "audio output (modalities includes 'audio') needs the audio parameter "
                "{voice, format}",
                "audio",
                "missing_required_parameter",
            )
        if body.audio.format not in AUDIO_FORMATS:
            raise bad_request(
                f"audio.format {body.audio.format!r} is not supported; formats: "
                f"{list(AUDIO_FORMATS)}",
                "audio.format",
            )
        if body.stream and body.audio.format != STREAM_AUDIO_FORMAT:
            raise bad_request(
                f"audio.format {body.audio.format!r} cannot be streamed: streamed audio "
                f"(stream: true) is {STREAM_AUDIO_FORMAT!r} only",
                "audio.format",
                "unsupported_value",
            )
        speaker = ctx.voice(body.audio.voice, "audio.voice")
    plan = sampling.plan(
        ctx.async_omni,
        text_stage,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        logit_bias=body.logit_bias,
        seed=body.seed,
        stop=body.stop,
        stage_sampling=body.stage_sampling,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
        text_final=not want_audio,
    )
    prompt = await asyncio.to_thread(
        chat_prompt, ctx.async_omni.prompt_processor, body.messages, ctx.args
    )
    if body.cache_salt is not None:
        prompt["cache_salt"] = body.cache_salt
    if speaker is not None:
        prompt["speaker"] = speaker
    request_id = new_id("chatcmpl")
    prepared = await streaming.prepare(ctx.async_omni, prompt, request_id)
    limit_param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    sampling.check_context(
        ctx.async_omni,
        text_stage,
        prepared,
        body.max_completion_tokens or body.max_tokens,
        limit_param,
    )
    final_stage = None if want_audio else text_stage
    timer = ctx.metrics.timer(ENDPOINT)
    job = _Job(ctx, body, request_id, text_stage, plan, want_audio)
    # Streamed audio takes the streaming path; a non-streamed response keeps the exact one.
    outputs = ctx.async_omni.run(
        prepared,
        plan.params,
        final_stage=final_stage,
        step_snapshots=bool(body.stream),
        stream_audio=bool(body.stream) and want_audio,
    )
    if body.stream:
        return StreamingResponse(job.stream(outputs, timer), media_type="text/event-stream")
    try:
        out = await streaming.until_disconnected(request, streaming.collect(outputs, timer))
    except streaming.ClientGone:
        timer.done(ok=False)
        return Response(status_code=499)
    return JSONResponse(job.response(out))


class _Job:
    def __init__(
        self,
        ctx: Context,
        body: ChatCompletionRequest,
        request_id: str,
        text_stage: str,
        plan: sampling.Plan,
        want_audio: bool,
    ) -> None:
        self.ctx = ctx
        self.body = body
        self.id = request_id
        self.text_stage = text_stage
        self.want_audio = want_audio
        self.cursor = SnapshotCursor(text_stage, plan.stop_strings)
        self.logprobs = LogprobCursor(ctx.async_omni, text_stage, chat=True)
        self.created = int(time.time())
        self.audio_id = new_id("audio")

    def response(self, out: OmniOutput) -> dict[str, Any]:
        text = self.cursor.text(out)
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if self.want_audio:
            final = out.final
            assert self.body.audio is not None
            data = audio_encoding.encode(
                final.audio, self.ctx.sample_rate(final), self.body.audio.format
            )
            message["audio"] = {
                "id": self.audio_id,
                "data": base64.b64encode(data).decode(),
                "expires_at": int(time.time()) + AUDIO_TTL_S,
                "transcript": text,
            }
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.ctx.args.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": streaming.finish_reason(out, self.text_stage),
                    "logprobs": self.logprobs.new(out),
                }
            ],
            "usage": streaming.usage(self.ctx.async_omni, out, self.text_stage),
        }

    def _chunk(
        self,
        delta: dict[str, Any] | None,
        finish: str | None = None,
        logprobs: dict[str, Any] | None = None,
        **extra: Any,
    ) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        choices = [] if delta is None else [choice]
        return streaming.sse(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.ctx.args.model_name,
                "choices": choices,
                **extra,
            }
        )

    async def stream(self, outputs: Any, timer: Any) -> AsyncIterator[bytes]:
        last = None
        ok = False
        audio_sent = False
        try:
            yield self._chunk({"role": "assistant", "content": ""})
            async with contextlib.aclosing(outputs) as snapshots:
                async for last in snapshots:
                    timer.output()
                    news = self.cursor.advance(last)
                    if news.text:
                        timer.first_token()
                        yield self._chunk(
                            self._text_delta(news.text), None, self.logprobs.new(last)
                        )
                    audio = self._new_audio(last, news)
                    if audio is not None:
                        timer.first_audio()
                        for chunk in self._audio_chunks(audio):
                            yield chunk
                        audio_sent = True
            try:
                out = streaming.check(last)
            except Exception as e:  # noqa: BLE001 - reported in the stream, the status is sent
                yield streaming.sse(from_exception(e).body())
                yield streaming.DONE
                return
            ok = True
            rest = self.logprobs.new(out)  # tokens that added no text (e.g. part of a character)
            if rest is not None and rest["content"]:
                yield self._chunk(self._text_delta(""), None, rest)
            if audio_sent:
                expires_at = int(time.time()) + AUDIO_TTL_S
                yield self._chunk({"audio": {"id": self.audio_id, "expires_at": expires_at}})
            yield self._chunk({}, streaming.finish_reason(out, self.text_stage))
            options = self.body.stream_options
            if options is not None and options.include_usage:
                usage = streaming.usage(self.ctx.async_omni, out, self.text_stage)
                yield self._chunk(None, usage=usage)
            yield streaming.DONE
        finally:
            timer.done(ok=ok)

    def _text_delta(self, text: str) -> dict[str, Any]:
        """New text: `content` for text clients and, with audio, the transcript as OpenAI
        streams it."""
        if not self.want_audio:
            return {"content": text}
        return {"content": text, "audio": {"id": self.audio_id, "transcript": text}}

    def _new_audio(self, out: OmniOutput, news: SnapshotNews) -> Any:
        """The audio stage's samples new in `out`; None without audio (or new samples), and
        for a failed request (its error is what the client gets)."""
        if not self.want_audio or out.error is not None:
            return None
        return news.audio.get(self.ctx.async_omni.audio_stage)

    def _audio_chunks(self, new_samples: Any) -> list[bytes]:
        """`delta.audio` chunks of the new samples: pieces of at most CHUNK_SAMPLES, so that a
        waveform decoded all at once (a vocoder that does not stream) is still sent in pieces."""
        data = audio_encoding.pcm16_bytes(new_samples)
        return [
            self._chunk({"audio": {"id": self.audio_id, "data": base64.b64encode(piece).decode()}})
            for piece in audio_encoding.chunks(data)
        ]
