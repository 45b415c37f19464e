"""One response of a realtime session: the conversation's prompt run through AsyncOmni, its
output streamed as GA server events, and its end (completed, cancelled, incomplete, failed).

Events, in order: `response.created`, `response.output_item.added`, `conversation.item.added`,
`response.content_part.added`, then per snapshot the new text (`response.output_text.delta`, or
`response.output_audio_transcript.delta` with audio) and the new samples as base64 pcm16 at
24 kHz (`response.output_audio.delta`, 0.2 s pieces at most), then `*.done` for the text or audio
and transcript, `response.content_part.done`, `response.output_item.done`,
`conversation.item.done`, `response.done` with the status and `usage`. Audio runs the streaming
path (the talker starts before the thinker finishes, the vocoder decodes in chunks), as streamed
chat completions do; a text response ends at the text stage. With the session's tools, the calls
the reply makes are output items of their own after the message (function_calls.py).

Cancelling (response.cancel, barge-in, a closed connection) cancels the task: leaving the
`async for` closes AsyncOmni.run, which aborts the request in every stage and frees its blocks.
The reply stays in the conversation as the text the client was sent (status "incomplete"). A
response cancelled while its prompt is prepared still gets `response.created` and a cancelled
`response.done` (no output, no usage counted).
A prompt the model cannot take (too long, bad audio) is an `error` event and no response.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from omni.entrypoints.openai import audio_encoding, sampling, streaming
from omni.entrypoints.openai.context import Context
from omni.entrypoints.openai.errors import OpenAIError, from_exception
from omni.entrypoints.openai.flat_tools import checked_call
from omni.entrypoints.openai.realtime.context_window import fit
from omni.entrypoints.openai.realtime.conversation import Conversation, Item, Part
from omni.entrypoints.openai.realtime.function_calls import FunctionCalls
from omni.entrypoints.openai.realtime.response_usage import usage
from omni.entrypoints.openai.realtime.server_events import error, event, make_id
from omni.entrypoints.openai.realtime.session_state import (
    AUDIO_FORMAT,
    SAMPLE_RATE,
    ResponseSettings,
)
from omni.entrypoints.snapshot_cursor import SnapshotCursor
from omni.messages import OmniOutput

ENDPOINT = "/v1/realtime"
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Response:
    def __init__(
        self,
        ctx: Context,
        settings: ResponseSettings,
        conversation: Conversation,
        send: Send,
        client_event_id: str | None,
    ) -> None:
        self.ctx = ctx
        self.settings = s = settings
        self.conversation = conversation
        self.send = send
        self.client_event_id = client_event_id
        self.id = make_id("resp")
        call = checked_call(ctx, list(settings.tools), settings.tool_choice, "session")
        self.calls = None if call is None else FunctionCalls(call, self.id, conversation)
        self.json_schema = None if call is None else call.json_schema  # a forced call's
        # A forced call is the whole reply: it ends at the text stage.
        self.want_audio = settings.output_modalities == ("audio",) and self.json_schema is None
        self.cancel_reason: str | None = None
        # Its items now, not when the task first runs: a later event may add items meanwhile.
        voice = settings.voice if self.want_audio else None
        tools = None if call is None else call.tools
        self.items = list(conversation.items)
        self.render = lambda items: conversation.prompt(ctx, s.instructions, voice, tools, items)
        self.item = Item("assistant", [Part("output_audio" if self.want_audio else "output_text")])
        self.item.status = "in_progress"
        self.previous_item_id: str | None = None
        self.task: asyncio.Task[None] = asyncio.create_task(self._run())

    async def cancel(self, reason: str) -> None:
        """Stop the response (its request aborted in every stage); returns once response.done
        has been sent."""
        if not self.task.done():
            self.cancel_reason = reason
            self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        if self.task.cancelled():  # cancelled before _run began: it could not report itself
            await self._cancelled_before_output()

    # ---- the run ------------------------------------------------------------------------------
    async def _run(self) -> None:
        ctx, s = self.ctx, self.settings
        async_omni = ctx.async_omni
        try:
            text_stage = ctx.text_stage("response.output_modalities")
            plan = sampling.plan(
                async_omni,
                text_stage,
                max_tokens=s.max_output_tokens,
                until_end=True,
                default_max_tokens=ctx.args.max_tokens,
                json_schema=self.json_schema,
            )
            room = s.max_output_tokens or 1  # the context's share left to the reply
            if s.truncation == "auto":
                prepared = await fit(ctx, self.conversation, self.items, self.render, self.id, room)
            else:
                prepared = await streaming.prepare(async_omni, self.render(self.items), self.id)
            sampling.check_context(
                async_omni, text_stage, prepared, s.max_output_tokens, "max_output_tokens"
            )
        except asyncio.CancelledError:
            # Cancelled while its prompt was prepared (or, in cancel(), before _run began): the
            # client already knows this response exists (a second response.create is refused
            # for it), so it still hears it end.
            await self._cancelled_before_output()
            return
        except Exception as e:  # noqa: BLE001 - an `error` event; the session goes on
            await self.send(error(from_exception(e), self.client_event_id))
            return
        self.previous_item_id = self.conversation.add(self.item)
        cursor = SnapshotCursor(text_stage, plan.stop_strings)
        timer = ctx.metrics.timer(ENDPOINT)
        last: OmniOutput | None = None
        status, details = "in_progress", None
        created = False
        try:
            await self.send(event("response.created", response=self._object("in_progress")))
            created = True
            await self.send(self._item_event("response.output_item.added"))
            await self.send(self._item_event("conversation.item.added"))
            await self.send(self._part_event("response.content_part.added", ""))
            outputs = async_omni.run(
                prepared,
                plan.params,
                final_stage=None if self.want_audio else text_stage,
                step_snapshots=True,
                stream_audio=self.want_audio,
            )
            async with contextlib.aclosing(outputs) as snapshots:
                async for last in snapshots:
                    timer.output()
                    news = cursor.advance(last)
                    if news.text:
                        timer.first_token()
                        await self._send_text(news.text)
                    samples = news.audio.get(async_omni.audio_stage or "")
                    spoken = self.calls is None or not self.calls.started  # calls are not
                    if self.want_audio and samples is not None and last.error is None and spoken:
                        timer.first_audio()
                        await self._send_audio(samples, last)
            await self._send_text("", whole=True)
            status, details = _outcome(last, text_stage)
        except asyncio.CancelledError:
            reason = self.cancel_reason or "client_cancelled"
            status, details = "cancelled", {"type": "cancelled", "reason": reason}
        except Exception as e:  # noqa: BLE001 - e.g. the engine shut down: a failed response
            status, details = (
                "failed",
                {"type": "failed", "error": from_exception(e).body()["error"]},
            )
        finally:
            timer.done(ok=status == "completed")
        if created:  # a response the client never saw created gets no done events either
            await self._finish(status, details, last, prepared.prompt_token_ids)

    async def _send_text(self, text: str, whole: bool = False) -> None:
        """The reply's new text: the message's, less its calls (sent as their own items)."""
        if self.calls is not None:
            text = await self.calls.text(text, self.send, whole)
        if not text:
            return
        kind = (
            "response.output_audio_transcript.delta"
            if self.want_audio
            else ("response.output_text.delta")
        )
        await self.send(event(kind, **self._where(), delta=text))
        self.item.parts[0].text += text  # what the client was sent: the reply kept

    async def _send_audio(self, samples: Any, out: OmniOutput) -> None:
        result = out.stages.get(self.ctx.async_omni.audio_stage)
        rate = (result.sample_rate if result is not None else None) or SAMPLE_RATE
        pcm = audio_encoding.pcm16(samples)
        if rate != SAMPLE_RATE:  # the API's one output rate
            times = np.arange(round(pcm.size * SAMPLE_RATE / rate)) * (rate / SAMPLE_RATE)
            pcm = np.interp(times, np.arange(pcm.size), pcm).astype("<i2")
        self.item.parts[0].num_samples_sent += pcm.size  # what a truncation may cut at
        for piece in audio_encoding.chunks(pcm.tobytes()):
            delta = base64.b64encode(piece).decode()
            await self.send(event("response.output_audio.delta", **self._where(), delta=delta))

    async def _cancelled_before_output(self) -> None:
        details = {"type": "cancelled", "reason": self.cancel_reason or "client_cancelled"}
        await self.send(event("response.created", response=self._object("in_progress")))
        done = self._object(
            "cancelled", details, usage(self.ctx, None, [], self.want_audio)
        )  # nothing tokenized
        await self.send(event("response.done", response={**done, "output": []}))

    async def _finish(
        self,
        status: str,
        details: dict[str, Any] | None,
        last: OmniOutput | None,
        prompt_token_ids: list[int],
    ) -> None:
        text = self.item.parts[0].text
        self.item.status = "completed" if status == "completed" else "incomplete"
        where = self._where()
        if self.want_audio:
            await self.send(event("response.output_audio.done", **where))
            await self.send(
                event("response.output_audio_transcript.done", **where, transcript=text)
            )
        else:
            await self.send(event("response.output_text.done", **where, text=text))
        await self.send(self._part_event("response.content_part.done", text))
        await self.send(self._item_event("response.output_item.done"))
        await self.send(self._item_event("conversation.item.done"))
        if self.calls is not None:
            await self.calls.finish(status == "completed", self.send)
        counts = usage(self.ctx, last, prompt_token_ids, self.want_audio)
        response = self._object(status, details, counts)
        await self.send(event("response.done", response=response))

    # ---- event bodies -------------------------------------------------------------------------
    def _where(self) -> dict[str, Any]:
        return {
            "response_id": self.id,
            "item_id": self.item.id,
            "output_index": 0,
            "content_index": 0,
        }

    def _item_event(self, kind: str) -> dict[str, Any]:
        if kind.startswith("conversation."):
            return event(kind, item=self.item.to_dict(), previous_item_id=self.previous_item_id)
        return event(kind, response_id=self.id, output_index=0, item=self.item.to_dict())

    def _part_event(self, kind: str, text: str) -> dict[str, Any]:
        part = (
            {"type": "audio", "transcript": text}
            if self.want_audio
            else {
                "type": "text",
                "text": text,
            }
        )
        where = self._where()
        return event(kind, **where, part=part)

    def _object(
        self,
        status: str,
        details: dict[str, Any] | None = None,
        usage: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        s = self.settings
        return {
            "id": self.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": []
            if status == "in_progress"
            else [self.item.to_dict()]
            + [item.to_dict() for item in (self.calls.items if self.calls else [])],
            "conversation_id": None,
            "output_modalities": list(s.output_modalities),
            "max_output_tokens": s.max_output_tokens or "inf",
            "audio": {
                "output": {
                    "format": AUDIO_FORMAT,
                    "voice": s.voice or self.ctx.async_omni.default_voice,
                }
            },
            "usage": usage,
            "metadata": s.metadata,
        }


def _outcome(last: OmniOutput | None, text_stage: str) -> tuple[str, dict[str, Any] | None]:
    """(status, status_details) of a response that ran to its end."""
    try:
        out = streaming.check(last)
    except OpenAIError as e:
        failure = from_exception(e).body()["error"]
        return "failed", {"type": "failed", "error": failure}
    if streaming.finish_reason(out, text_stage) == "length":
        return "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
    return "completed", None
