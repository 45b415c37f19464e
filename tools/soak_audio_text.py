"""The soak's kinds on the endpoints beside chat's plain text (tools/soak_requests.py has the
others): `transcription`, the prompt's WAV sent to /v1/audio/transcriptions (variant: streamed
or not; the text as its reference); `chat_tools`, chat_text with a tool and tool_choice "auto"
(variant: streamed or not): its content and calls, joined, as its reference, so that the whole
and the streamed replies must read the same calls out of the same text; and `responses`, the
prompt through /v1/responses (variant: streamed or not), which must answer as chat_text."""

from __future__ import annotations

import json
from typing import Any

from tools.soak_requests import (
    MODEL,
    TIMEOUT_S,
    Answer,
    Job,
    Reply,
    Sender,
    prompt_text,
    prompt_wav,
)

TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}]  # fmt: skip


async def transcription(sender: Sender, job: Job) -> Reply:
    audio = ("prompt.wav", prompt_wav(job.prompt))
    kwargs: dict[str, Any] = dict(model=MODEL, file=audio, timeout=TIMEOUT_S)
    if job.variant % 2:
        text = ""
        async for event in await sender.client.audio.transcriptions.create(**kwargs, stream=True):
            if event.type == "transcript.text.delta":
                text += event.delta
            elif event.type == "transcript.text.done" and event.text != text:
                raise AssertionError(f"done {event.text!r} != the deltas {text!r}")
        return Reply(Answer(text))
    out = await sender.client.audio.transcriptions.create(**kwargs)
    return Reply(Answer(out.text))


async def responses(sender: Sender, job: Job) -> Reply:
    kwargs: dict[str, Any] = dict(model=MODEL, input=prompt_text(job.prompt), temperature=0,
                                  max_output_tokens=sender.max_tokens, timeout=TIMEOUT_S)  # fmt: skip
    if job.variant % 2:
        text, done = "", None
        async for event in await sender.client.responses.create(**kwargs, stream=True):
            if event.type == "response.output_text.delta":
                text += event.delta
            elif event.type in ("response.completed", "response.incomplete"):
                done = event.response.output_text
        if done != text:
            raise AssertionError(f"the final response {done!r} != the deltas {text!r}")
        return Reply(Answer(text))
    return Reply(Answer((await sender.client.responses.create(**kwargs)).output_text))


async def chat_tools(sender: Sender, job: Job) -> Reply:
    calls: dict[int, list[str]] = {}  # index -> [name, arguments]
    if job.variant % 2:
        content = ""
        async for chunk in await sender.chat(job, tools=TOOLS, stream=True):
            for choice in chunk.choices:
                content += choice.delta.content or ""
                for call in choice.delta.tool_calls or []:
                    entry = calls.setdefault(call.index, ["", ""])
                    entry[0] += call.function.name or ""
                    entry[1] += call.function.arguments or ""
    else:
        message = (await sender.chat(job, tools=TOOLS)).choices[0].message
        content = message.content or ""
        for index, call in enumerate(message.tool_calls or []):
            calls[index] = [call.function.name, call.function.arguments]
    return Reply(Answer(json.dumps([content, [calls[i] for i in sorted(calls)]])))
