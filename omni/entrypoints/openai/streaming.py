"""What the endpoints share: preparing a prompt off the event loop, running it while watching for
the client to leave, finish reasons, usage, and SSE framing. What each snapshot adds (text and
audio deltas) comes from a SnapshotCursor (omni/entrypoints/snapshot_cursor.py).

Aborts: a request runs inside `async_omni.run(...)`, always closed by `contextlib.aclosing`;
closing it early (the client left: the streaming response is cancelled, or `until_disconnected`
cancels a non-streaming one) aborts the request in every stage and frees its blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import Any, TypeVar

from starlette.requests import Request

from omni.entrypoints.openai.errors import OpenAIError, from_exception
from omni.messages import OmniOutput, PromptInput

T = TypeVar("T")
DONE = b"data: [DONE]\n\n"
FINISH_REASONS = {"stopped": "stop", "length": "length"}
MAX_CHOICES = 128
"""The most choices (prompts x n) one request may ask for."""


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class ClientGone(Exception):
    """The client disconnected before the response was ready."""


async def prepare(async_omni: Any, prompt: Any, request_id: str) -> PromptInput:
    """Validate and tokenize (and preprocess media) on a worker thread: ValueError -> 400."""
    try:
        return await asyncio.to_thread(async_omni.prepare, prompt, request_id)
    except ValueError as e:
        raise from_exception(e) from None


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result; if the client disconnects first, `work` is cancelled (which aborts its
    request) and ClientGone is raised."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise ClientGone
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def collect(outputs: Any, timer: Any) -> OmniOutput:
    """A non-streamed request: run `outputs` (snapshots) to the end, timing it, and return the
    finished output (`check`). Closing early (a client that left) aborts the request."""
    (out,) = await collect_all([outputs], timer)
    return out


async def collect_all(runs: list[Any], timer: Any) -> list[OmniOutput]:
    """Several non-streamed requests (a response's choices) run to the end together, timed as
    one; their finished outputs (`check`). Closing early aborts them all."""
    outs: list[OmniOutput | None] = [None] * len(runs)
    ok = False
    try:
        async with contextlib.aclosing(merged(runs)) as items:
            async for index, out in items:
                timer.output()
                outs[index] = out
                if out.finished and out.final.audio is not None:
                    timer.first_audio()
        checked = [check(out) for out in outs]
        ok = True
        return checked
    finally:
        timer.done(ok=ok)


def checked_or_error(lasts: list[OmniOutput | None]) -> tuple[list[OmniOutput], list[bytes]]:
    """A stream's end: every choice's finished output (`check`), or none and the events that
    end the stream with the first failure (its status was sent already)."""
    try:
        return [check(last) for last in lasts], []
    except Exception as e:  # noqa: BLE001 - reported in the stream
        return [], [sse(from_exception(e).body()), DONE]


def check(out: OmniOutput | None) -> OmniOutput:
    """The finished output, or the error a failed request maps to (503: a stage is down)."""
    if out is None:
        raise OpenAIError(500, "the request ended without output", code="internal_error")
    if out.error is not None:
        down = "died" in out.error or "dead" in out.error or "shut down" in out.error
        raise OpenAIError(
            503 if down else 500,
            f"request failed: {out.error}",
            code="stage_unavailable" if down else "generation_failed",
        )
    return out


def finish_reason(out: OmniOutput, stage: str) -> str:
    r = out.stages.get(stage)
    return FINISH_REASONS.get(r.finish_reason or "", "stop") if r is not None else "stop"


def usage(async_omni: Any, out: OmniOutput, text_stage: str) -> dict[str, Any]:
    root = out.stages.get(async_omni.config.root_stages[0].name)
    text = out.stages.get(text_stage)
    prompt = root.num_prompt_tokens if root is not None else 0
    completion = len(text.token_ids) if text is not None else 0
    cached = root.num_cached_tokens if root is not None else 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def total_usage(usages: list[dict[str, Any]], prompt_counted: list[bool]) -> dict[str, Any]:
    """One usage of several choices: every choice's completion tokens, and the prompt tokens
    (and their cache hits) of those marked, each prompt once whatever `n` is (as OpenAI counts)."""
    prompt = sum(u["prompt_tokens"] for u, c in zip(usages, prompt_counted, strict=True) if c)
    cached = sum(
        u["prompt_tokens_details"]["cached_tokens"]
        for u, c in zip(usages, prompt_counted, strict=True)
        if c
    )
    completion = sum(u["completion_tokens"] for u in usages)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


async def merged(streams: list[AsyncIterator[T]]) -> AsyncGenerator[tuple[int, T], None]:
    """(index, item) of several async iterators as their items come. Closing it early (or an
    error in one) closes them all, which aborts their requests."""
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    end = object()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async with contextlib.aclosing(stream) as items:  # type: ignore[type-var]
                async for item in items:
                    await queue.put((index, item))
        except Exception as e:  # noqa: BLE001 - raised where the items are read
            await queue.put((index, e))
        await queue.put((index, end))

    tasks = [asyncio.ensure_future(pump(i, stream)) for i, stream in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is end:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
