"""Input audio transcription in a realtime session (`session.audio.input.transcription`): each
committed turn of input audio is transcribed by the served model itself, as
/v1/audio/transcriptions does (its thinker asked to write the speech down word for word, in
`language` with `prompt` as context), as a request of its own beside the turn's response.

Events: `conversation.item.input_audio_transcription.delta` as the text comes, then
`...completed` with the transcript and its usage, or `...failed` with the error. The transcript
is the item's (its `input_audio` part's `transcript`); the prompt keeps the audio itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from omni.entrypoints.openai import sampling, streaming
from omni.entrypoints.openai.context import Context
from omni.entrypoints.openai.errors import from_exception
from omni.entrypoints.openai.realtime import events, input_audio
from omni.entrypoints.openai.realtime.conversation import Item
from omni.entrypoints.openai.realtime.server_events import event, make_id
from omni.entrypoints.openai.transcription import instruction, usage
from omni.entrypoints.snapshot_cursor import SnapshotCursor

MAX_TRANSCRIPT_TOKENS = 448
"""A transcript's length when the server sets no --max-tokens (a 30 s turn's is far shorter)."""
KIND = "conversation.item.input_audio_transcription"


async def transcribe(
    ctx: Context,
    item: Item,
    settings: events.Transcription,
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    """Transcribe a committed audio item; its events go out through `send` (never raises but
    when cancelled: a closed connection aborts the request)."""
    part = item.parts[0]
    assert part.audio is not None
    where = {"item_id": item.id, "content_index": 0}
    ask = instruction(False, settings.language, settings.prompt)
    processor = ctx.async_omni.prompt_processor
    prompt = {
        "prompt": processor.chat_text([("user", [("audio", ""), ("text", ask)])]),
        "audio": [input_audio.waveform(part.audio)],
    }
    try:
        text_stage = ctx.text_stage()
        plan = sampling.plan(
            ctx.async_omni,
            text_stage,
            max_tokens=ctx.args.max_tokens or MAX_TRANSCRIPT_TOKENS,
            temperature=0.0,
            text_final=True,
        )
        prepared = await streaming.prepare(ctx.async_omni, prompt, make_id("transcription"))
        cursor, last = SnapshotCursor(text_stage), None
        run = ctx.async_omni.run(prepared, plan.params, final_stage=text_stage)
        async with contextlib.aclosing(run) as snapshots:
            async for last in snapshots:
                piece = cursor.advance(streaming.check(last) if last.finished else last).text
                if piece:
                    await send(event(f"{KIND}.delta", **where, delta=piece))
        out = streaming.check(last)
        part.text = cursor.text(out)
        await send(event(f"{KIND}.completed", **where, transcript=part.text,
                         usage=usage(ctx, [out])))  # fmt: skip
    except Exception as e:  # noqa: BLE001 - the turn goes on without its transcript
        await send(event(f"{KIND}.failed", **where, error=from_exception(e).body()["error"]))
