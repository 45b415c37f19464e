"""Shared by the `omni serve` tests: names, sampling, media samples, and the table of bad
requests (each: name, server, endpoint, body, status, the param the error must name)."""

from __future__ import annotations

import base64
import io
import wave

import numpy as np
from helpers import wav_bytes
from PIL import Image

from omni.core.sampling_params import SamplingParams

KEY = "test-key"
OMNI_NAME, LM_NAME = "tiny-omni", "tiny-lm"
THINKER, TALKER, SEED = 8, 24, 3
# The per-stage sampling every exact comparison uses, on the server through extra_body.
EXTRA = {
    "stage_sampling": {
        "thinker": {"ignore_eos": True},
        "talker": {"max_tokens": TALKER},
        "token2wav": {"seed": SEED},
    }
}
PARAMS = [
    SamplingParams(max_tokens=THINKER, ignore_eos=True),
    SamplingParams(max_tokens=TALKER, stop_token_ids=(8292, 8294)),
    SamplingParams(max_tokens=1, seed=SEED),
]
VOICE = "Ethan"


def png(seed: int = 0) -> bytes:
    image = Image.fromarray(np.random.default_rng(seed).integers(0, 256, (56, 56, 3), np.uint8))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def wav(seconds: float = 1.0) -> bytes:
    t = np.arange(int(16000 * seconds))
    samples = (np.sin(t / 9.0) * 0.4 * 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(16000)
        f.writeframes(samples.tobytes())
    return buffer.getvalue()


def mp3(seconds: float = 1.0) -> bytes:
    """The sound of `wav(seconds)` as an MP3 file."""
    import soundfile

    t = np.arange(int(16000 * seconds))
    buffer = io.BytesIO()
    soundfile.write(buffer, (np.sin(t / 9.0) * 0.4).astype(np.float32), 16000, format="MP3")
    return buffer.getvalue()


def spoken(stretches: list[float]) -> bytes:
    """A 24 kHz WAV of silence and speech-like sound (Silero VAD hears it as speech) taking
    turns, for the given seconds, silence first."""
    from realtime_support import silence, speech

    parts = [speech(s) if i % 2 else silence(s) for i, s in enumerate(stretches)]
    return wav_bytes(np.concatenate(parts), 24000)


def m4a(seconds: float = 1.0) -> bytes:
    """The sound of `wav(seconds)` as an M4A file (AAC), as a phone records speech."""
    import av

    samples = (np.sin(np.arange(int(16000 * seconds)) / 9.0) * 0.4).astype(np.float32)
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="ipod") as out:
        stream = out.add_stream("aac", rate=16000)
        stream.layout = "mono"
        for start in range(0, len(samples), 1024):
            frame = av.AudioFrame.from_ndarray(samples[None, start : start + 1024], "fltp", "mono")
            frame.sample_rate = 16000
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


GOOD = {"model": OMNI_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
AUDIO = {"modalities": ["text", "audio"], "audio": {"voice": VOICE, "format": "wav"}}
BAD = [
    # (name, server, path, body, status, param)
    ("missing messages", "omni", "chat", {"model": OMNI_NAME}, 400, "messages"),
    ("missing model", "omni", "chat", {"messages": GOOD["messages"]}, 400, "model"),
    ("messages not a list", "omni", "chat", {**GOOD, "messages": "hi"}, 400, "messages"),
    ("empty messages", "omni", "chat", {**GOOD, "messages": []}, 400, "messages"),
    (
        "bad role",
        "omni",
        "chat",
        {**GOOD, "messages": [{"role": "bot", "content": "x"}]},
        400,
        "messages[0].role",
    ),
    (
        "content wrong type",
        "omni",
        "chat",
        {**GOOD, "messages": [{"role": "user", "content": 5}]},
        400,
        "messages[0].content",
    ),
    ("unknown model", "omni", "chat", {**GOOD, "model": "gpt-9"}, 404, "model"),
    ("n=2 with audio", "omni", "chat", {**GOOD, **AUDIO, "n": 2}, 400, "n"),
    ("n=0", "omni", "chat", {**GOOD, "n": 0}, 400, "n"),
    ("negative max_tokens", "omni", "chat", {**GOOD, "max_tokens": -1}, 400, "max_tokens"),
    ("max_tokens as string", "omni", "chat", {**GOOD, "max_tokens": "5"}, 400, "max_tokens"),
    ("temperature too high", "omni", "chat", {**GOOD, "temperature": 7}, 400, "temperature"),
    ("unknown field", "omni", "chat", {**GOOD, "frobnicate": 1}, 400, "frobnicate"),
    (
        "bad base64 image",
        "omni",
        "chat",
        {
            **GOOD,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}
                    ],
                }
            ],
        },
        400,
        "messages[0].content[0].image_url",
    ),
    (
        "unreadable image",
        "omni",
        "chat",
        {
            **GOOD,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": data_url(b"not an image")}}
                    ],
                }
            ],
        },
        400,
        "messages[0].content[0].image_url",
    ),
    (
        "remote image",
        "omni",
        "chat",
        {
            **GOOD,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}}
                    ],
                }
            ],
        },
        400,
        "messages[0].content[0].image_url",
    ),
    (
        "local file outside",
        "omni",
        "chat",
        {
            **GOOD,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "file:///etc/hostname"}}
                    ],
                }
            ],
        },
        400,
        "messages[0].content[0].image_url",
    ),
    (
        "bad input_audio",
        "omni",
        "chat",
        {
            **GOOD,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "input_audio",
                            "input_audio": {
                                "data": base64.b64encode(b"RIFFjunk").decode(),
                                "format": "wav",
                            },
                        }
                    ],
                }
            ],
        },
        400,
        "messages[0].content[0].input_audio.data",
    ),
    (
        "unknown voice",
        "omni",
        "chat",
        {**GOOD, **AUDIO, "audio": {"voice": "alloy", "format": "wav"}},
        400,
        "audio.voice",
    ),
    (
        "audio format",
        "omni",
        "chat",
        {**GOOD, **AUDIO, "audio": {"voice": VOICE, "format": "mp3"}},
        400,
        "audio.format",
    ),
    (
        "streamed wav audio",
        "omni",
        "chat",
        {**GOOD, **AUDIO, "stream": True},
        400,
        "audio.format",
    ),
    (
        "audio without audio param",
        "omni",
        "chat",
        {**GOOD, "modalities": ["text", "audio"]},
        400,
        "audio",
    ),
    (
        "audio of a text-only pipeline",
        "lm",
        "chat",
        {**GOOD, "model": LM_NAME, **AUDIO},
        400,
        "modalities",
    ),
    (
        "unknown stage",
        "omni",
        "chat",
        {**GOOD, "stage_sampling": {"nope": {}}},
        400,
        "stage_sampling.nope",
    ),
    (
        "bad stage field",
        "omni",
        "chat",
        {**GOOD, "stage_sampling": {"talker": {"top_q": 1}}},
        400,
        "stage_sampling.talker.top_q",
    ),
    (
        "json_schema on a stage that makes codes",
        "omni",
        "chat",
        {**GOOD, "stage_sampling": {"talker": {"json_schema": '{"type": "object"}'}}},
        400,
        "stage_sampling.talker.json_schema",
    ),
    (
        "multi-token stop with audio",
        "omni",
        "chat",
        {**GOOD, **AUDIO, "stop": ["a long stop string"]},
        400,
        "stop",
    ),
    ("five stop strings", "omni", "chat", {**GOOD, "stop": list("abcde")}, 400, "stop"),
    ("cache_salt not a string", "omni", "chat", {**GOOD, "cache_salt": 3}, 400, "cache_salt"),
    ("top_k below -1", "omni", "chat", {**GOOD, "top_k": -2}, 400, "top_k"),
    ("penalty past 2", "omni", "chat", {**GOOD, "presence_penalty": 2.5}, 400, "presence_penalty"),
    ("bias past 100", "omni", "chat", {**GOOD, "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ("top_logprobs alone", "omni", "chat", {**GOOD, "top_logprobs": 2}, 400, "top_logprobs"),
    (
        "top_logprobs past 20",
        "omni",
        "chat",
        {**GOOD, "logprobs": True, "top_logprobs": 21},
        400,
        "top_logprobs",
    ),
    (
        "tools: a tool without a function",
        "lm",
        "chat",
        {**GOOD, "model": LM_NAME, "tools": [{"type": "function"}]},
        400,
        "tools[0].function",
    ),
    (
        "tools: calls (tool_choice auto, the default with tools) with audio out",
        "omni",
        "chat",
        {**GOOD, **AUDIO, "tools": [{"type": "function", "function": {"name": "f"}}]},
        400,
        "tool_choice",
    ),
    (
        "json output: an unknown format",
        "omni",
        "chat",
        {**GOOD, "response_format": {"type": "xml"}},
        400,
        "response_format.type",
    ),
    (
        "json output: a schema outside the subset",
        "omni",
        "chat",
        {
            **GOOD,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {"type": "object", "properties": {"a": {"format": "date"}}},
                },
            },
        },
        400,
        "response_format.json_schema.schema.properties.a.format",
    ),
    (
        "completions: empty prompt",
        "lm",
        "completions",
        {"model": LM_NAME, "prompt": ""},
        400,
        "prompt",
    ),
    (
        "completions: bad token id",
        "lm",
        "completions",
        {"model": LM_NAME, "prompt": [1, -2]},
        400,
        "prompt",
    ),
    (
        "completions: logprobs past 20",
        "lm",
        "completions",
        {"model": LM_NAME, "prompt": "hi", "logprobs": 21},
        400,
        "logprobs",
    ),
    (
        "speech: bad format",
        "omni",
        "speech",
        {"model": OMNI_NAME, "input": "hi", "response_format": "mp3"},
        400,
        "response_format",
    ),
    ("speech: empty input", "omni", "speech", {"model": OMNI_NAME, "input": ""}, 400, "input"),
    ("speech: text-only model", "lm", "speech", {"model": LM_NAME, "input": "hi"}, 400, "model"),
]
PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "speech": "/v1/audio/speech",
}
