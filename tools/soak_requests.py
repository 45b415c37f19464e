"""The request kinds of the soak (tools/soak.py), each sent with the official `openai` client
(async) to a running `omni serve`, and what each returns to compare.

Kinds (a job is one kind, one prompt of the fixed set, one variant; transcription and chat_tools
are in tools/soak_audio_text.py, the last two in tools/soak_misbehave.py):
  chat_text          chat, text out (variant: streamed or not)
  chat_audio_in      chat with a WAV in `input_audio`, text out
  chat_audio_stream  streamed chat, text + pcm16 audio out (time to first audio)
  speech             /v1/audio/speech, pcm, streamed bytes (time to first audio)
  completions        /v1/completions, text (variant: streamed or not)
  chat_choices       chat_text with n=2, logprobs (top 2) and a stop string never met: every
                     choice must answer as chat_text, its logprobs one per token
  cache_salt         chat_text with a `cache_salt` (one of four): must answer as chat_text
  chat_json          chat_text with a json_schema `response_format`: JSON of it, as its reference
  transcription      /v1/audio/transcriptions of the prompt's WAV (variant: streamed or not)
  chat_tools         chat_text with a tool, tool_choice "auto": content and calls as its reference
  responses          /v1/responses of the prompt (variant: streamed or not): must answer as chat_text
  disconnect         the client leaves mid-request (four ways, see `soak_misbehave.disconnect`)
  bad                a malformed request: must be answered with its 4xx naming the field

A good answer is compared with the reference answer of its prompt (`REFERENCE_KIND`): text
exactly; audio to the sample count and within `AUDIO_TOLERANCE` int16 steps per sample.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import time
import wave
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import openai

from omni.core.json_grammar import initial, step
from omni.core.json_schema import compile_schema

MODEL = "tiny-omni"
VOICES = ("Ethan", "Chelsie")
KINDS = {  # kind -> share of the requests
    "chat_text": 0.08, "chat_choices": 0.05, "chat_json": 0.05, "chat_audio_in": 0.08,
    "chat_audio_stream": 0.11, "speech": 0.07, "completions": 0.09, "cache_salt": 0.07,
    "transcription": 0.06, "chat_tools": 0.05, "responses": 0.05, "disconnect": 0.09,
    "bad": 0.15,
}  # fmt: skip
REFERENCE_KIND = {kind: kind for kind in KINDS if kind not in ("disconnect", "bad")} | {
    "cache_salt": "chat_text", "chat_choices": "chat_text", "responses": "chat_text"}  # fmt: skip
"""Kind -> the kind whose reference its answer must equal (disconnect and bad have none)."""
JSON_FORMAT: dict[str, Any] = {"type": "json_schema", "json_schema": {"name": "fact", "schema": {
    "type": "object", "properties": {"subject": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["n"]}}}  # fmt: skip
AUDIO_TOLERANCE = 1
"""int16 steps: the server truncates floats to int16, so a float difference far below one step
(another batch composition) can still move a sample by one."""
TIMEOUT_S = 300.0
SUBJECTS = (
    "rivers", "mountains", "the weather", "bread", "trains", "the moon", "bees", "glass",
    "clocks", "the sea", "forests", "copper", "winter", "maps", "violins", "salt", "bridges",
    "owls", "paper", "thunder", "deserts", "lanterns", "coral", "wheat",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Job:
    index: int
    kind: str
    prompt: int
    """Index into the prompt set (`prompt_text`, `prompt_wav`)."""
    variant: int


@dataclasses.dataclass(frozen=True)
class Answer:
    text: str | None = None
    audio: bytes | None = None
    """pcm16 little-endian samples."""


@dataclasses.dataclass(frozen=True)
class Reply:
    """What one kind's call returns."""

    answer: Answer | None = None
    """None for kinds without a reference (disconnect, bad)."""
    first_audio: float | None = None
    """time.perf_counter() at the first audio received."""
    left_early: bool = False
    """The client left before the response ended (disconnect)."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    job: Job
    ok: bool
    latency_s: float
    ttfa_s: float | None = None
    answer: Answer | None = None
    left_early: bool = False
    error: str | None = None


def prompt_text(prompt: int) -> str:
    subject = SUBJECTS[prompt % len(SUBJECTS)]
    return f"Question {prompt}: say something short about {subject}."


def prompt_wav(prompt: int, seconds: float = 0.5) -> bytes:
    """A real 16 kHz mono 16-bit WAV: a tone whose pitch depends on the prompt."""
    t = np.arange(int(16000 * seconds)) / 16000
    samples = (np.sin(2 * np.pi * (220 + 40 * prompt) * t) * 0.4 * 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(16000)
        f.writeframes(samples.tobytes())
    return buffer.getvalue()


def diverges(answer: Answer, reference: Answer) -> str | None:
    """Why `answer` differs from `reference` (None: it does not)."""
    if answer.text != reference.text:
        return f"text {answer.text!r} != reference {reference.text!r}"
    if (answer.audio is None) != (reference.audio is None):
        return "audio present in only one of answer and reference"
    if answer.audio is not None and reference.audio is not None:
        a = np.frombuffer(answer.audio, "<i2").astype(np.int32)
        r = np.frombuffer(reference.audio, "<i2").astype(np.int32)
        if len(a) != len(r):
            return f"{len(a)} audio samples != reference {len(r)}"
        worst = int(np.abs(a - r).max()) if len(a) else 0
        if worst > AUDIO_TOLERANCE:
            return f"audio differs by up to {worst} int16 steps (tolerance {AUDIO_TOLERANCE})"
    return None


def _messages(prompt: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": prompt_text(prompt)}]


def _audio_messages(prompt: int) -> list[dict[str, Any]]:
    data = base64.b64encode(prompt_wav(prompt)).decode()
    content = [
        {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}},
        {"type": "text", "text": "What do you hear?"},
    ]
    return [{"role": "user", "content": content}]


class Sender:
    """Sends jobs with one AsyncOpenAI client; max_tokens caps chats and completions, not speech."""

    def __init__(self, client: openai.AsyncOpenAI, max_tokens: int) -> None:
        from tools.soak_audio_text import chat_tools, responses, transcription  # build on this
        from tools.soak_misbehave import bad, disconnect

        self.client = client
        self.max_tokens = max_tokens
        self._kinds: dict[str, Callable[[Job], Awaitable[Reply]]] = {
            "chat_text": self._chat_text,
            "cache_salt": self._cache_salt,
            "chat_choices": self._chat_choices,
            "chat_json": self._chat_json,
            "chat_audio_in": self._chat_audio_in,
            "chat_audio_stream": self._chat_audio_stream,
            "speech": self._speech,
            "completions": self._completions,
            "transcription": lambda job: transcription(self, job),
            "chat_tools": lambda job: chat_tools(self, job),
            "responses": lambda job: responses(self, job),
            "disconnect": lambda job: disconnect(self, job),
            "bad": lambda job: bad(self, job),
        }

    async def send(self, job: Job) -> Outcome:
        """The job's outcome; never raises (an exception is the outcome's error)."""
        start = time.perf_counter()
        try:
            reply = await self._kinds[job.kind](job)
        except Exception as e:  # noqa: BLE001 - every failure is counted, none stops the soak
            error = f"{type(e).__name__}: {e}"[:300]
            return Outcome(job, False, time.perf_counter() - start, error=error)
        latency_s = time.perf_counter() - start
        ttfa_s = None if reply.first_audio is None else reply.first_audio - start
        return Outcome(job, True, latency_s, ttfa_s, reply.answer, reply.left_early)

    def chat(self, job: Job, **kwargs: Any) -> Any:
        """A chat request for the job's prompt; `kwargs` add or replace fields."""
        defaults: dict[str, Any] = {
            "model": MODEL,
            "messages": _messages(job.prompt),
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "timeout": TIMEOUT_S,
        }
        return self.client.chat.completions.create(**(defaults | kwargs))

    def audio_chat(self, job: Job, **kwargs: Any) -> Any:
        """A streamed chat with pcm16 audio out."""
        voice = VOICES[job.prompt % len(VOICES)]
        audio = {"voice": voice, "format": "pcm16"}
        return self.chat(job, modalities=["text", "audio"], audio=audio, stream=True, **kwargs)

    def speech(self, job: Job, **kwargs: Any) -> Any:
        """Streamed pcm speech of the job's prompt (an async context manager)."""
        return self.client.audio.speech.with_streaming_response.create(
            model=MODEL,
            voice=VOICES[job.prompt % len(VOICES)],
            input=prompt_text(job.prompt),
            response_format="pcm",
            timeout=TIMEOUT_S,
            **kwargs,
        )

    async def _chat_text(self, job: Job, **kwargs: Any) -> Reply:
        if job.variant % 2:
            text = ""
            async for chunk in await self.chat(job, stream=True, **kwargs):
                text += "".join(c.delta.content or "" for c in chunk.choices)
            return Reply(Answer(text))
        out = await self.chat(job, **kwargs)
        return Reply(Answer(out.choices[0].message.content))

    async def _cache_salt(self, job: Job) -> Reply:
        salt = f"user-{job.variant % 4}"
        return await self._chat_text(job, extra_body={"cache_salt": salt})

    async def _chat_choices(self, job: Job) -> Reply:
        asked = dict(n=2, logprobs=True, top_logprobs=2, stop=["\x00never\x00"])
        texts, counts = ["", ""], [0, 0]
        if job.variant % 2:
            async for chunk in await self.chat(job, stream=True, **asked):
                for c in chunk.choices:
                    texts[c.index] += c.delta.content or ""
                    counts[c.index] += len(c.logprobs.content) if c.logprobs else 0
        else:
            out = await self.chat(job, **asked)
            texts = [c.message.content for c in out.choices]
            counts = [len(c.logprobs.content) for c in out.choices]
        if texts[0] != texts[1] or not 0 < counts[0] == counts[1] <= self.max_tokens:
            raise AssertionError(f"greedy choices differ: {texts} with {counts} logprobs")
        return Reply(Answer(texts[0]))

    async def _chat_json(self, job: Job) -> Reply:
        reply = await self._chat_text(job, response_format=JSON_FORMAT)
        state = initial(compile_schema(JSON_FORMAT["json_schema"]["schema"]))
        for byte in (reply.answer.text or "").encode():
            if (state := step(state, byte)) is None:
                raise AssertionError(f"not JSON of the schema: {reply.answer.text!r}")
        return reply

    async def _chat_audio_in(self, job: Job) -> Reply:
        out = await self.chat(job, messages=_audio_messages(job.prompt))
        return Reply(Answer(out.choices[0].message.content))

    async def _chat_audio_stream(self, job: Job) -> Reply:
        text, audio, first_audio = "", bytearray(), None
        async for chunk in await self.audio_chat(job):
            for choice in chunk.choices:
                text += choice.delta.content or ""
                piece = getattr(choice.delta, "audio", None)
                if piece is not None and piece.data:
                    first_audio = first_audio or time.perf_counter()
                    audio += base64.b64decode(piece.data)
        return Reply(Answer(text, bytes(audio)), first_audio)

    async def _speech(self, job: Job) -> Reply:
        audio, first_audio = bytearray(), None
        async with self.speech(job) as response:
            async for piece in response.iter_bytes():
                if piece:
                    first_audio = first_audio or time.perf_counter()
                    audio += piece
        return Reply(Answer(None, bytes(audio)), first_audio)

    async def _completions(self, job: Job) -> Reply:
        kwargs: dict[str, Any] = dict(
            model=MODEL,
            prompt=prompt_text(job.prompt),
            max_tokens=self.max_tokens,
            temperature=0,
            timeout=TIMEOUT_S,
        )
        if job.variant % 2:
            text = ""
            async for chunk in await self.client.completions.create(**kwargs, stream=True):
                text += "".join(c.text for c in chunk.choices)
            return Reply(Answer(text))
        out = await self.client.completions.create(**kwargs)
        return Reply(Answer(out.choices[0].text))
