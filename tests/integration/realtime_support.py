"""Shared by the /v1/realtime tests and bench/realtime.py: a speech-like test signal, pcm16
helpers, event collection with the official client, and the in-process reference turn.

The signal: Silero VAD does not take a pure tone or noise for speech (probabilities under 0.06),
but it does take a vowel-like sound: a glottal-like harmonic series (F0 around 140 Hz with
intonation) shaped by three formant resonances that move between five vowels every 150 ms, with a
syllable-rate loudness envelope (measured: above 0.5 in 96% of its 32 ms windows).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
import wave
from typing import Any

import numpy as np

from omni.entrypoints.openai.audio_encoding import pcm16

RATE = 24000
EVENT_TIMEOUT_S = 60.0  # a missing event fails the test naming it, instead of hanging
NO_VAD = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
"""A session.update turning server VAD off (turns end at input_audio_buffer.commit)."""
VOWELS = np.array(
    [(730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (570, 840, 2410)],
    dtype=np.float64,
)


def speech(seconds: float, f0: float = 140.0) -> np.ndarray:
    """int16 samples at 24 kHz that Silero VAD detects as speech."""
    t = np.arange(int(seconds * RATE)) / RATE
    pitch = f0 + 30 * np.sin(2 * np.pi * 0.7 * t) + 10 * np.sin(2 * np.pi * 3.1 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / RATE
    formants = VOWELS[(t / 0.15).astype(int) % len(VOWELS)]
    out = np.zeros_like(t)
    for k in range(1, 40):
        fk = k * pitch
        gain = sum(1 / (1 + ((fk - formants[:, j]) / (80 + 40 * j)) ** 2) for j in range(3))
        out += gain / np.sqrt(k) * (fk < RATE / 2) * np.sin(k * phase)
    out *= 0.3 + 0.7 * np.abs(np.sin(np.pi * 3 * t))
    return (out / np.abs(out).max() * 0.5 * 32767).astype("<i2")


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), "<i2")


def b64(samples: np.ndarray) -> str:
    return base64.b64encode(samples.astype("<i2").tobytes()).decode()


def wav_part(samples: np.ndarray) -> dict[str, Any]:
    """A chat message part holding `samples` as a 24 kHz WAV (what the reference is given)."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(RATE)
        f.writeframes(samples.astype("<i2").tobytes())
    data = base64.b64encode(buffer.getvalue()).decode()
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


async def append(conn: Any, samples: np.ndarray, chunk_s: float = 0.1) -> None:
    """Send samples as input_audio_buffer.append events of chunk_s seconds."""
    step = int(chunk_s * RATE)
    for start in range(0, samples.size, step):
        await conn.input_audio_buffer.append(audio=b64(samples[start : start + step]))


async def until(
    conn: Any, kind: str, allow_errors: bool = False, timeout_s: float = EVENT_TIMEOUT_S
) -> list[Any]:
    """Events (as dicts) up to and including the first of type `kind`; an AssertionError naming
    `kind` and the events so far when none comes within timeout_s of the previous one."""
    out: list[Any] = []
    while True:
        try:
            event = (await asyncio.wait_for(conn.recv(), timeout_s)).model_dump()
        except TimeoutError:
            seen = [e["type"] for e in out]
            raise AssertionError(
                f"no {kind!r} within {timeout_s} s; events so far: {seen}"
            ) from None
        out.append(event)
        if event["type"] == "error" and not allow_errors and kind != "error":
            raise AssertionError(f"unexpected error event: {event}")
        if event["type"] == kind:
            return out


@dataclasses.dataclass
class Turn:
    """One response as the client saw it."""

    text: str
    """The joined text or transcript deltas."""
    audio: np.ndarray
    """The joined audio deltas (int16)."""
    done: dict[str, Any]
    """The response.done event's response."""


def turn(events: list[dict[str, Any]]) -> Turn:
    text = "".join(
        e["delta"]
        for e in events
        if e["type"] in ("response.output_text.delta", "response.output_audio_transcript.delta")
    )
    audio = b"".join(
        base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta"
    )
    return Turn(text, np.frombuffer(audio, "<i2"), events[-1]["response"])


def user(*parts: str | np.ndarray) -> dict[str, Any]:
    """A user chat message of text parts and spoken parts (int16 samples, as 24 kHz WAVs)."""
    content = [{"type": "text", "text": p} if isinstance(p, str) else wav_part(p) for p in parts]
    return {"role": "user", "content": content}


async def say(conn: Any, text: str, **response: Any) -> None:
    """A typed user turn, then response.create (with `response` settings, if any)."""
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await conn.conversation.item.create(item=item)
    await until(conn, "conversation.item.done")
    await conn.response.create(response=response or None)


def check(got: Turn, ref: tuple[str, np.ndarray | None, int]) -> None:
    """A turn equals its reference: text exactly, the prompt length, audio within one int16
    step (two processes round the same floats)."""
    text, audio, num_prompt = ref
    assert got.text == text
    assert got.done["usage"]["input_tokens"] == num_prompt
    if audio is not None:
        assert got.audio.size == audio.size > 0
        assert np.abs(got.audio.astype(np.int32) - audio.astype(np.int32)).max() <= 1


async def reference_turn(
    async_omni: Any,
    messages: list[dict],
    max_tokens: int,
    audio: bool,
    speaker: str | None = None,
):
    """AsyncOmni.generate on the conversation's chat prompt (framed by the pipeline's prompt
    processor, as the endpoint frames it; `speaker`: the voice, None for the model's default)
    with the stage configs' sampling and the thinker's max_tokens, as the endpoint runs it
    (audio: the streaming path; text: ending at the thinker): (text, int16 audio or None,
    prompt length)."""
    from omni.entrypoints.openai.prompts import chat_prompt

    prompt = chat_prompt(async_omni.prompt_processor, messages)
    if speaker is not None:
        prompt["speaker"] = speaker
    params = [
        dataclasses.replace(s.sampling, max_tokens=max_tokens)
        if s.name == "thinker"
        else s.sampling
        for s in async_omni.config.stages
    ]
    outputs = async_omni.generate(
        prompt, params, final_stage=None if audio else "thinker", stream_audio=audio
    )
    last = [out async for out in outputs][-1]
    assert last is not None and last.error is None, last
    thinker = last.stages["thinker"]
    wave_out = pcm16(last.final.audio) if audio else None
    return thinker.text, wave_out, thinker.num_prompt_tokens


BAD_EVENTS = [
    # (name, event, error code, error param)
    ("unknown type", {"type": "conversation.frobnicate"}, "invalid_event_type", "type"),
    ("bad base64", {"type": "input_audio_buffer.append", "audio": "@@@"}, "invalid_value", "audio"),
    (
        "odd byte count",
        {"type": "input_audio_buffer.append", "audio": "AAAA"},  # 3 bytes
        "invalid_audio_format",
        "audio",
    ),
    (
        "mu-law input",
        {
            "type": "session.update",
            "session": {**NO_VAD, "audio": {"input": {"format": {"type": "audio/pcmu"}}}},
        },
        "unsupported_value",
        "session.audio.input.format",
    ),
    (
        "16 kHz input",
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}},
            },
        },
        "unsupported_value",
        "session.audio.input.format",
    ),
    (
        "max_output_tokens 0",
        {"type": "session.update", "session": {"type": "realtime", "max_output_tokens": 0}},
        "invalid_value",
        "session.max_output_tokens",
    ),
    (
        "unknown voice",
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"output": {"voice": "alloy"}}},
        },
        "invalid_value",
        "session.audio.output.voice",
    ),
    (
        "unknown field",
        {"type": "response.create", "response": {"temperature": 0.7}},
        "unknown_parameter",
        "response.temperature",
    ),
    (
        "commit of an empty buffer",
        {"type": "input_audio_buffer.commit"},
        "input_audio_buffer_commit_empty",
        None,
    ),
    (
        "oversized",
        {"type": "input_audio_buffer.append", "audio": "A" * (8 * 1024 * 1024)},
        "event_too_large",
        None,
    ),
]
