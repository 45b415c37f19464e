"""The soak's requests that do not run to a good end (tools/soak_requests.py has the others):
clients that leave mid-request, and malformed requests that must get their 4xx naming the field.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import openai

from tools.soak_requests import MODEL, TIMEOUT_S, VOICES, Job, Reply, Sender


async def disconnect(sender: Sender, job: Job) -> Reply:
    """The client leaves: after the first audio piece (way 0) or the first text piece (1) of a
    streamed audio chat, at a 50 ms client timeout of an unstreamed audio chat (2), or after the
    first bytes of streamed speech (3). A request that ends before that is not an error (it is
    not `left_early`)."""
    way = job.variant % 4
    if way in (0, 1):
        stream = await sender.audio_chat(job)
        async with stream:  # leaving the block closes the connection
            async for chunk in stream:
                delta = chunk.choices[0].delta if chunk.choices else None
                audio = getattr(delta, "audio", None)
                if way == 0 and audio is not None and audio.data:
                    return Reply(left_early=True)
                if way == 1 and delta is not None and delta.content:
                    return Reply(left_early=True)
        return Reply()
    if way == 2:
        with contextlib.suppress(openai.APITimeoutError):
            audio = {"voice": VOICES[0], "format": "wav"}
            await sender.chat(job, modalities=["text", "audio"], audio=audio, timeout=0.05)
            return Reply()
        return Reply(left_early=True)
    async with sender.speech(job) as response:
        async for piece in response.iter_bytes():
            if piece:
                return Reply(left_early=True)
    return Reply()


async def bad(sender: Sender, job: Job) -> Reply:
    """One of BAD_REQUESTS; any answer but its status naming its field is an error."""
    name, status, param, call = BAD_REQUESTS[job.variant % len(BAD_REQUESTS)]
    try:
        await call(sender, job)
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        if e.status_code == status and body.get("param") == param:
            return Reply()
        message = f"{name}: {e.status_code} {body}, expected {status} naming {param}"
        raise AssertionError(message) from None
    raise AssertionError(f"{name}: accepted, expected {status} naming {param}")


BadCall = Callable[[Sender, Job], Awaitable[Any]]
BAD_REQUESTS: tuple[tuple[str, int, str, BadCall], ...] = (
    # (name, status, the param the error names, call)
    ("negative max_tokens", 400, "max_tokens", lambda s, j: s.chat(j, max_tokens=-1)),
    ("unknown model", 404, "model", lambda s, j: s.chat(j, model="gpt-9")),
    ("temperature 7", 400, "temperature", lambda s, j: s.chat(j, temperature=7)),
    (
        "cache_salt not a string",
        400,
        "cache_salt",
        lambda s, j: s.chat(j, extra_body={"cache_salt": 3}),
    ),
    (
        "unknown stage",
        400,
        "stage_sampling.nope",
        lambda s, j: s.chat(j, extra_body={"stage_sampling": {"nope": {}}}),
    ),
    (
        "streamed wav audio",
        400,
        "audio.format",
        lambda s, j: s.chat(
            j,
            modalities=["text", "audio"],
            audio={"voice": VOICES[0], "format": "wav"},
            stream=True,
        ),
    ),
    (
        "speech as mp3",
        400,
        "response_format",
        lambda s, j: s.client.audio.speech.create(
            model=MODEL, voice=VOICES[0], input="hi", response_format="mp3", timeout=TIMEOUT_S
        ),
    ),
    (
        "empty completion prompt",
        400,
        "prompt",
        lambda s, j: s.client.completions.create(model=MODEL, prompt="", timeout=TIMEOUT_S),
    ),
)
