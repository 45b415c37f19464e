"""POST /v1/chat/completions: text, or text + audio (`modalities: ["text", "audio"]`).

One choice. Non-streaming: `message.content` is the text stage's text, `message.audio` the
vocoder's waveform `{id, data (base64 wav or pcm16), expires_at, transcript}`. Streaming: a role
chunk, `delta.content` pieces as the text stage generates, then the audio as `delta.audio`
`{id, data: base64 pcm16 piece, transcript}` chunks once the vocoder is done (streaming is
pcm16 whatever `audio.format` says, as with OpenAI), the finish reason, an optional usage chunk,
`[DONE]`. Without audio the request ends at the text stage: the talker and vocoder never run.
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
from omni.entrypoints.openai.prompts import chat_prompt
from omni.entrypoints.openai.protocol import ChatCompletionRequest
from omni.messages import OmniOutput

ENDPOINT = "/v1/chat/completions"
AUDIO_FORMATS = ("wav", "pcm16")
AUDIO_TTL_S = 3600


async def create(ctx: Context, request: Request, body: ChatCompletionRequest) -> Response:
    ctx.check_model(body.model)
    if body.n not in (None, 1):
        raise bad_request(f"n: only n=1 is supported, got {body.n}", "n", "unsupported_value")
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
        speaker = ctx.voice(body.audio.voice, "audio.voice")
    plan = sampling.plan(
        ctx.engine,
        text_stage,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=body.stop,
        stage_sampling=body.stage_sampling,
    )
    prompt = await asyncio.to_thread(
        chat_prompt, ctx.engine.prompt_processor.tokenizer, body.messages, ctx.args
    )
    if body.cache_salt is not None:
        prompt["cache_salt"] = body.cache_salt
    if speaker is not None:
        prompt["speaker"] = speaker
    request_id = new_id("chatcmpl")
    prepared = await streaming.prepare(ctx.engine, prompt, request_id)
    final_stage = None if want_audio else text_stage
    timer = ctx.metrics.timer(ENDPOINT)
    job = _Job(ctx, body, request_id, text_stage, plan, want_audio)
    outputs = ctx.engine.run(
        prepared, plan.params, final_stage=final_stage, stream_steps=bool(body.stream)
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
        self.view = streaming.TextView(text_stage, plan.stop_strings)
        self.created = int(time.time())
        self.audio_id = new_id("audio")

    def response(self, out: OmniOutput) -> dict[str, Any]:
        text = self.view.text(out)
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if self.want_audio:
            final = out.final
            assert self.body.audio is not None
            data = audio_encoding.encode(
                final.audio, final.sample_rate or 24000, self.body.audio.format
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
                    "logprobs": None,
                }
            ],
            "usage": streaming.usage(self.ctx.engine, out, self.text_stage),
        }

    def _chunk(
        self, delta: dict[str, Any] | None, finish: str | None = None, **extra: Any
    ) -> bytes:
        choices = (
            []
            if delta is None
            else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        )
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
        try:
            yield self._chunk({"role": "assistant", "content": ""})
            async with contextlib.aclosing(outputs) as snapshots:
                async for last in snapshots:
                    timer.output()
                    delta = self.view.delta(last)
                    if delta:
                        timer.first_token()
                        yield self._chunk({"content": delta})
                    if self.want_audio and last.finished and last.final.audio is not None:
                        timer.first_audio()
                        for chunk in self._audio_chunks(last):
                            yield chunk
            try:
                out = streaming.check(last)
            except Exception as e:  # noqa: BLE001 - reported in the stream, the status is sent
                yield streaming.sse(from_exception(e).body())
                yield streaming.DONE
                return
            ok = True
            yield self._chunk({}, streaming.finish_reason(out, self.text_stage))
            options = self.body.stream_options
            if options is not None and options.include_usage:
                usage = streaming.usage(self.ctx.engine, out, self.text_stage)
                yield self._chunk(None, usage=usage)
            yield streaming.DONE
        finally:
            timer.done(ok=ok)

    def _audio_chunks(self, out: OmniOutput) -> list[bytes]:
        data = audio_encoding.pcm16_bytes(out.final.audio)
        transcript = self.view.text(out)
        pieces = []
        for i, piece in enumerate(audio_encoding.chunks(data)):
            audio: dict[str, Any] = {"id": self.audio_id, "data": base64.b64encode(piece).decode()}
            if i == 0:
                audio["transcript"] = transcript
            pieces.append(self._chunk({"audio": audio}))
        pieces.append(
            self._chunk(
                {"audio": {"id": self.audio_id, "expires_at": int(time.time()) + AUDIO_TTL_S}}
            )
        )
        return pieces
