"""ChatChoice: one choice of a chat completion (omni/entrypoints/openai/chat.py): its cursors over
the request's snapshots, its response message, and its streamed chunks (the text as it comes,
audio as the vocoder decodes it, with the logprobs of the tokens each piece carries). With a named
or required tool_choice (omni/entrypoints/openai/tools.py) the text is a function call, in
`tool_calls` instead of `content`; with "auto" the calls the text makes are taken out of it."""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from omni.entrypoints.openai import audio_encoding, sampling, streaming
from omni.entrypoints.openai.context import Context, new_id
from omni.entrypoints.openai.logprobs import LogprobCursor
from omni.entrypoints.openai.protocol import ChatCompletionRequest
from omni.entrypoints.openai.tools import CallCursor, ToolCall
from omni.entrypoints.snapshot_cursor import SnapshotCursor, SnapshotNews
from omni.messages import OmniOutput

AUDIO_TTL_S = 3600


class ChatChoice:
    def __init__(
        self,
        ctx: Context,
        body: ChatCompletionRequest,
        request_id: str,
        text_stage: str,
        plan: sampling.Plan,
        want_audio: bool,
        index: int = 0,
        call: ToolCall | None = None,
    ) -> None:
        self.ctx = ctx
        self.index = index
        self.body = body
        self.id = request_id
        self.text_stage = text_stage
        self.want_audio = want_audio
        self.cursor = SnapshotCursor(text_stage, plan.stop_strings)
        self.logprobs = LogprobCursor(ctx.async_omni, text_stage, chat=True)
        self.created = int(time.time())
        self.audio_id = new_id("audio")
        self.audio_sent = False
        self.call = None if call is None else call.cursor()  # the text is, or makes, calls

    def message(self, out: OmniOutput) -> dict[str, Any]:
        """This choice in a whole response: its message, finish reason and logprobs."""
        text = self.cursor.text(out)
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if self.call is not None:
            message |= self.call.message(text)
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
            "index": self.index,
            "message": message,
            "finish_reason": self._finish_reason(out),
            "logprobs": self.logprobs.new(out),
        }

    def _finish_reason(self, out: OmniOutput) -> str:
        reason = streaming.finish_reason(out, self.text_stage)
        return reason if self.call is None else self.call.finish_reason(reason)

    def chunk(
        self,
        delta: dict[str, Any] | None,
        finish: str | None = None,
        logprobs: dict[str, Any] | None = None,
        **extra: Any,
    ) -> bytes:
        """A `chat.completion.chunk` of this choice's delta (none: no choice, e.g. the usage)."""
        choice = {"index": self.index, "delta": delta, "finish_reason": finish,
                  "logprobs": logprobs}  # fmt: skip
        return streaming.sse(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.ctx.args.model_name,
                "choices": [] if delta is None else [choice],
                **extra,
            }
        )

    def on_snapshot(self, out: OmniOutput, timer: Any) -> list[bytes]:
        """The chunks a snapshot of this choice's request adds: its new text (with the
        logprobs of its tokens), its new audio."""
        timer.output()
        chunks = []
        news = self.cursor.advance(out)
        if news.text:
            timer.first_token()
            delta = self._text_delta(news.text)
            if delta is not None:  # a call's text may wait for more (its name, a last brace)
                chunks.append(self.chunk(delta, None, self.logprobs.new(out)))
        audio = self._new_audio(out, news)
        if audio is not None:
            timer.first_audio()
            chunks += self._audio_chunks(audio)
            self.audio_sent = True
        return chunks

    def on_finished(self, out: OmniOutput) -> list[bytes]:
        """The chunks that close this choice: logprobs of tokens that added no text (e.g. part
        of a character), the audio's end, the finish reason."""
        chunks = []
        rest = self.logprobs.new(out)
        last = None if self.call is None else self.call.delta("", whole=True)  # its end
        if rest is not None and rest["content"]:  # tokens that added no text carry logprobs
            last = last or self._text_delta("") or {}
        if last is not None:
            chunks.append(self.chunk(last, None, rest))
        if self.audio_sent:
            expires_at = int(time.time()) + AUDIO_TTL_S
            chunks.append(self.chunk({"audio": {"id": self.audio_id, "expires_at": expires_at}}))
        return chunks + [self.chunk({}, self._finish_reason(out))]

    def role_delta(self) -> dict[str, Any]:
        return {"role": "assistant", "content": None if isinstance(self.call, CallCursor) else ""}

    def _text_delta(self, text: str) -> dict[str, Any] | None:
        """New text: `content` for text clients and, with audio, the transcript as OpenAI
        streams it; a function call's (omni/entrypoints/openai/tools.py: CallCursor)."""
        if self.call is not None:
            return self.call.delta(text)
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
            self.chunk({"audio": {"id": self.audio_id, "data": base64.b64encode(piece).decode()}})
            for piece in audio_encoding.chunks(data)
        ]


def response(choices: list[ChatChoice], outs: list[OmniOutput]) -> dict[str, Any]:
    """The whole `chat.completion` of every choice, with the usage of all (the prompt once)."""
    first = choices[0]
    return {
        "id": first.id,
        "object": "chat.completion",
        "created": first.created,
        "model": first.ctx.args.model_name,
        "choices": [c.message(out) for c, out in zip(choices, outs, strict=True)],
        "usage": usage(choices, outs),
    }


def usage(choices: list[ChatChoice], outs: list[OmniOutput]) -> dict[str, Any]:
    first = choices[0]
    each = [streaming.usage(first.ctx.async_omni, out, first.text_stage) for out in outs]
    return streaming.total_usage(each, [c.index == 0 for c in choices])


async def stream(choices: list[ChatChoice], runs: list[Any], timer: Any) -> AsyncIterator[bytes]:
    """The SSE stream of every choice (runs: their requests' snapshots, in order): a role chunk
    each, then each choice's pieces as its snapshots come, its closing chunks, the usage when
    asked, [DONE]."""
    lasts: list[OmniOutput | None] = [None] * len(choices)
    ok = False
    try:
        for choice in choices:
            yield choice.chunk(choice.role_delta())
        async with contextlib.aclosing(streaming.merged(runs)) as snapshots:
            async for index, out in snapshots:
                lasts[index] = out
                for piece in choices[index].on_snapshot(out, timer):
                    yield piece
        outs, failure = streaming.checked_or_error(lasts)
        if failure:
            for piece in failure:
                yield piece
            return
        ok = True
        for choice, out in zip(choices, outs, strict=True):
            for piece in choice.on_finished(out):
                yield piece
        options = choices[0].body.stream_options
        if options is not None and options.include_usage:
            yield choices[0].chunk(None, usage=usage(choices, outs))
        yield streaming.DONE
    finally:
        timer.done(ok=ok)
