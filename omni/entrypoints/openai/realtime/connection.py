"""One realtime WebSocket connection: the session loop.

It reads client events one at a time, in order, and answers each (a bad one with an `error`
event naming it; the connection stays open). Responses run as their own tasks (response.py), so
events keep being read while one runs: `response.cancel`, and audio whose detected speech cancels
the running response (barge-in, with server VAD's `interrupt_response`). One response at a time
per connection, as in OpenAI's API; many connections share the engine's batches. Every send goes
through one lock (events of the loop and of a response never interleave within a frame), and
after the client has gone sends are dropped. When the connection closes, a running response is
cancelled: its request is aborted in every stage.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from omni.entrypoints.openai.context import Context
from omni.entrypoints.openai.errors import OpenAIError, bad_request, from_exception
from omni.entrypoints.openai.realtime import conversation, events, input_audio
from omni.entrypoints.openai.realtime.input_audio import AudioBuffer, ms
from omni.entrypoints.openai.realtime.input_transcription import transcribe
from omni.entrypoints.openai.realtime.response import Response
from omni.entrypoints.openai.realtime.server_events import error, event, make_id
from omni.entrypoints.openai.realtime.session_state import SAMPLE_RATE, SessionState
from omni.entrypoints.openai.realtime.vad import TurnDetector, VadEvent, load_silero

log = logging.getLogger(__name__)


class Connection:
    def __init__(self, ws: WebSocket, ctx: Context, max_event_bytes: int) -> None:
        self.ws = ws
        self.ctx = ctx
        self.max_event_bytes = max_event_bytes
        speaks = ctx.async_omni.audio_stage is not None
        self.session = SessionState(make_id("sess"), ("audio",) if speaks else ("text",))
        self.conversation = conversation.Conversation()
        self.buffer = AudioBuffer(input_audio.max_seconds(ctx) or 0.0)
        self.detector: TurnDetector | None = None
        self._vad_model: Any = None
        self.response: Response | None = None
        self.speech_item_id: str | None = None
        """The id the speech now in the buffer will have as an item (set at speech start)."""
        self.closed = False
        self._send_lock = asyncio.Lock()
        self._transcriptions: set[asyncio.Task[None]] = set()  # of committed turns, running

    async def send(self, message: dict[str, Any]) -> None:
        if self.closed:
            return
        text = json.dumps(message, separators=(",", ":"))
        async with self._send_lock:
            try:
                await self.ws.send_text(text)
            except (WebSocketDisconnect, RuntimeError, OSError):
                self.closed = True  # the client is gone: the loop ends at its next receive

    async def serve(self) -> None:
        await self.send(event("session.created", session=self.session.to_dict(self.ctx)))
        try:
            while not self.closed:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                data = message.get("text")
                if data is None:
                    data = message.get("bytes") or b""
                await self._handle(data)
        except WebSocketDisconnect:
            pass
        finally:
            self.closed = True
            if self.response is not None:
                await self.response.cancel("client_cancelled")
            for task in list(self._transcriptions):
                task.cancel()  # aborts its request
            await asyncio.gather(*self._transcriptions, return_exceptions=True)

    async def _handle(self, data: str | bytes) -> None:
        try:
            ev = events.parse(data, self.max_event_bytes)
        except events.BadEvent as e:
            await self.send(error(e.error, e.event_id))
            return
        try:
            await getattr(self, "_on_" + ev.type.replace(".", "_"))(ev)
        except Exception as e:  # noqa: BLE001 - one event fails, the session goes on
            if not isinstance(e, OpenAIError):
                log.exception("realtime event %s failed", ev.type)
            await self.send(error(from_exception(e), ev.event_id))

    @property
    def responding(self) -> bool:
        return self.response is not None and not self.response.task.done()

    # ---- client events ------------------------------------------------------------------------
    async def _on_session_update(self, ev: events.SessionUpdate) -> None:
        before = self.session.turn_detection
        self.session = self.session.updated(self.ctx, ev.session)
        if self.session.turn_detection != before:
            self.detector = None  # made again, with the new settings, at the next append
        await self.send(event("session.updated", session=self.session.to_dict(self.ctx)))

    async def _on_input_audio_buffer_append(self, ev: events.InputAudioBufferAppend) -> None:
        input_audio.require_audio_input(self.ctx, "audio")
        samples = input_audio.decode(ev.audio, "audio")
        self.buffer.append(samples, "audio")
        settings = self.session.turn_detection
        if settings is None:
            return
        if self.detector is None:
            if self._vad_model is None:
                self._vad_model = await asyncio.to_thread(load_silero)
            self._vad_model.reset_states()
            start = self.buffer.end - samples.size
            self.detector = TurnDetector(settings, self._vad_model, start)
        for vad_event in self.detector.feed(samples):
            await self._on_vad(vad_event)
        if not self.detector.speaking:  # keep only the padding before speech can start
            padding = settings.prefix_padding_ms * SAMPLE_RATE // 1000
            self.buffer.drop_before(self.detector.position - padding)

    async def _on_vad(self, vad_event: VadEvent) -> None:
        detector, settings = self.detector, self.session.turn_detection
        assert detector is not None and settings is not None
        if vad_event.kind == "speech_started":
            self.speech_item_id = make_id("item")
            await self.send(
                event(
                    "input_audio_buffer.speech_started",
                    audio_start_ms=ms(detector.padded_start()),
                    item_id=self.speech_item_id,
                )
            )
            if self.responding and settings.interrupt_response:
                assert self.response is not None
                await self.response.cancel("turn_detected")  # barge-in
            return
        item_id = self.speech_item_id or make_id("item")
        await self.send(
            event(
                "input_audio_buffer.speech_stopped",
                audio_end_ms=ms(vad_event.position),
                item_id=item_id,
            )
        )
        await self._commit(detector.padded_start(), vad_event.position, item_id)
        if settings.create_response and not self.responding:
            self._respond(None, None)

    async def _on_input_audio_buffer_commit(self, ev: events.InputAudioBufferCommit) -> None:
        input_audio.require_audio_input(self.ctx, None)
        if self.buffer.num_samples < input_audio.MIN_COMMIT_MS * SAMPLE_RATE // 1000:
            raise bad_request(
                "Error committing input audio buffer: buffer too small. Expected at least "
                f"{input_audio.MIN_COMMIT_MS}ms of audio, but buffer only has "
                f"{self.buffer.num_samples * 1000 / SAMPLE_RATE:.2f}ms of audio.",
                None,
                "input_audio_buffer_commit_empty",
            )
        item_id = self.speech_item_id or make_id("item")
        await self._commit(self.buffer.start, self.buffer.end, item_id)
        if self.detector is not None:
            self.detector.reset(self.buffer.end)

    async def _commit(self, first: int, end: int, item_id: str) -> None:
        samples = self.buffer.take(first, end)
        self.speech_item_id = None
        item = conversation.Item("user", [conversation.Part("input_audio", audio=samples)], item_id)
        previous = self.conversation.add(item)
        await self.send(
            event("input_audio_buffer.committed", item_id=item.id, previous_item_id=previous)
        )
        await self._item_added(item, previous)
        if self.session.transcription is not None:
            task = asyncio.create_task(
                transcribe(self.ctx, item, self.session.transcription, self.send)
            )
            self._transcriptions.add(task)
            task.add_done_callback(self._transcriptions.discard)

    async def _on_input_audio_buffer_clear(self, ev: events.InputAudioBufferClear) -> None:
        self.buffer.clear()
        self.speech_item_id = None
        if self.detector is not None:
            self.detector.reset(self.buffer.end)
        await self.send(event("input_audio_buffer.cleared"))

    async def _on_conversation_item_create(self, ev: events.ConversationItemCreate) -> None:
        item = conversation.from_client(self.ctx, ev.item)
        previous = self.conversation.add(item, ev.previous_item_id)
        await self._item_added(item, previous)

    async def _on_conversation_item_retrieve(self, ev: events.ConversationItemRetrieve) -> None:
        item = self.conversation.find(ev.item_id)
        await self.send(event("conversation.item.retrieved", item=item.to_dict()))

    async def _on_conversation_item_delete(self, ev: events.ConversationItemDelete) -> None:
        self.conversation.items.remove(self.conversation.find(ev.item_id))
        await self.send(event("conversation.item.deleted", item_id=ev.item_id))

    async def _on_conversation_item_truncate(self, ev: events.ConversationItemTruncate) -> None:
        self.conversation.truncate(ev.item_id, ev.content_index, ev.audio_end_ms)
        fields = {"item_id": ev.item_id, "content_index": ev.content_index}
        await self.send(
            event("conversation.item.truncated", **fields, audio_end_ms=ev.audio_end_ms)
        )

    async def _item_added(self, item: conversation.Item, previous: str | None) -> None:
        for kind in ("conversation.item.added", "conversation.item.done"):
            await self.send(event(kind, item=item.to_dict(), previous_item_id=previous))

    async def _on_response_create(self, ev: events.ResponseCreate) -> None:
        if self.responding:
            raise bad_request(
                "Conversation already has an active response in progress; cancel it (or wait "
                "for its response.done) first",
                None,
                "conversation_already_has_active_response",
            )
        self._respond(ev.response, ev.event_id)

    def _respond(self, params: events.ResponseParams | None, client_event_id: str | None) -> None:
        settings = self.session.for_response(self.ctx, params)
        self.response = Response(self.ctx, settings, self.conversation, self.send, client_event_id)

    async def _on_response_cancel(self, ev: events.ResponseCancel) -> None:
        response = self.response
        if response is None or not self.responding or ev.response_id not in (None, response.id):
            raise bad_request(
                "Cancellation failed: no active response found"
                + (f" with id {ev.response_id!r}" if ev.response_id else ""),
                "response_id" if ev.response_id else None,
                "response_cancel_not_active",
            )
        await response.cancel("client_cancelled")
