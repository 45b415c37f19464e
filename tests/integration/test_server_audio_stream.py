"""Streamed speech from `omni serve` (a real server subprocess, the official `openai` client):
chat completions with `stream: true` and audio send the waveform as the vocoder decodes it, in
`delta.audio` pieces of new pcm16 samples, with the text as `delta.content` and
`delta.audio.transcript`; the audio closes with an `expires_at` delta; formats other than pcm16
cannot be streamed (400 naming `audio.format`). `/v1/audio/speech`: wav and pcm, and streamed pcm
(sse events or raw bytes) from the streaming path.

The reference is `Omni.generate(..., stream_audio=True)` in this process on the prompt the server
builds, with the same per-stage sampling: the same streaming path, so the same waveform (within
one int16 step: both sides round the same floats, computed in two processes).
"""

from __future__ import annotations

import base64
import io
import json
import wave

import httpx
import numpy as np
import openai
import pytest
from helpers import OMNI_ON_CPU, cli_sets
from server_support import KEY, OMNI_NAME, SEED, THINKER, VOICE

from omni import Omni
from omni.core.sampling_params import SamplingParams
from omni.entrypoints.openai.audio_encoding import pcm16
from omni.entrypoints.openai.prompts import chat_prompt
from tools.serve_process import ServeProcess

pytestmark = pytest.mark.slow

TALKER_CODES = 96  # the vocoder's chunks of 10, then 50 codes: three pieces of waveform
SPEECH = {"modalities": ["text", "audio"], "audio": {"voice": VOICE, "format": "pcm16"}}


def _sampling(talker: int) -> dict:
    return {
        "stage_sampling": {
            "thinker": {"ignore_eos": True},
            "talker": {"max_tokens": talker, "ignore_eos": True},
            "token2wav": {"seed": SEED},
        }
    }


@pytest.fixture(scope="module")
def running(omni_dir):
    """The server and, loaded while it starts, the in-process reference."""
    server = ServeProcess(
        ["--model", omni_dir, "--served-model-name", OMNI_NAME, "--api-key", KEY]
        + ["--set", "runtime.backend=local", *cli_sets(OMNI_ON_CPU)]
    ).start()
    try:
        with Omni(model=omni_dir, runtime={"backend": "local"}, **OMNI_ON_CPU) as reference:
            server.wait_ready()
            client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)
            yield client, reference
    finally:
        server.stop()


def _messages(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _events(client: openai.OpenAI, messages: list[dict], thinker: int, talker: int) -> list:
    """(kind, value) in arrival order: ("text", str), ("transcript", str), ("audio", bytes),
    ("expires_at", int), ("finish", str)."""
    events = []
    stream = client.chat.completions.create(
        model=OMNI_NAME,
        messages=messages,
        max_tokens=thinker,
        stream=True,
        extra_body=_sampling(talker),
        **SPEECH,
    )
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        if choice.delta.content:
            events.append(("text", choice.delta.content))
        audio = choice.delta.audio
        if audio is not None:
            assert audio.id.startswith("audio-")
            if getattr(audio, "transcript", None):
                events.append(("transcript", audio.transcript))
            if getattr(audio, "data", None):
                events.append(("audio", base64.b64decode(audio.data)))
            if getattr(audio, "expires_at", None):
                events.append(("expires_at", audio.expires_at))
        if choice.finish_reason is not None:
            events.append(("finish", choice.finish_reason))
    return events


def test_streamed_audio_joins_to_the_streaming_waveform(running):
    client, reference = running
    messages = _messages("say something about trees")
    events = _events(client, messages, THINKER, TALKER_CODES)
    prompt = chat_prompt(reference.async_omni.prompt_processor.tokenizer, messages)
    params = [
        SamplingParams(max_tokens=THINKER, ignore_eos=True),
        SamplingParams(max_tokens=TALKER_CODES, ignore_eos=True, stop_token_ids=(8292, 8294)),
        SamplingParams(max_tokens=1, seed=SEED),
    ]
    (ref,) = reference.generate(
        [prompt | {"speaker": VOICE}], params, use_tqdm=False, stream_audio=True
    )
    assert ref.error is None

    pieces = [value for kind, value in events if kind == "audio"]
    assert len(pieces) > 1 and all(len(p) % 2 == 0 for p in pieces)  # whole int16 samples
    streamed = np.frombuffer(b"".join(pieces), "<i2").astype(np.int32)
    expected = pcm16(ref.final.audio).astype(np.int32)
    assert len(streamed) == len(expected) == TALKER_CODES * 480  # 480 samples per code
    assert np.abs(streamed - expected).max() <= 1
    text = "".join(value for kind, value in events if kind == "text")
    transcript = "".join(value for kind, value in events if kind == "transcript")
    assert text == transcript == ref.stages["thinker"].text
    kinds = [kind for kind, _ in events]
    # The audio closes with its expiry, after the last piece; then the finish reason.
    assert kinds[-2:] == ["expires_at", "finish"] and kinds.count("expires_at") == 1


def test_first_audio_comes_before_the_last_text(running):
    """The talker starts after the thinker's first tokens and the vocoder after its first
    codes: with a long reply, speech starts while the thinker is still writing it."""
    client, _ = running
    events = _events(client, _messages("tell me a long story"), thinker=96, talker=64)
    kinds = [kind for kind, _ in events]
    last_text = len(kinds) - 1 - kinds[::-1].index("text")
    assert kinds.index("audio") < last_text, kinds


def test_streamed_audio_must_be_pcm16(running):
    client, _ = running
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=OMNI_NAME,
            messages=_messages("hi"),
            max_tokens=2,
            stream=True,
            modalities=["text", "audio"],
            audio={"voice": VOICE, "format": "wav"},
        )
    error = info.value.body
    assert error["param"] == "audio.format" and "pcm16" in error["message"]
    # The same request without streaming is fine: the whole waveform, as a WAV.
    out = client.chat.completions.create(
        model=OMNI_NAME,
        messages=_messages("hi"),
        max_tokens=2,
        modalities=["text", "audio"],
        audio={"voice": VOICE, "format": "wav"},
        extra_body=_sampling(8),
    )
    assert base64.b64decode(out.choices[0].message.audio.data)[:4] == b"RIFF"


def test_speech(running):
    """/v1/audio/speech: wav and pcm from the exact path; pcm streamed (sse or raw) from the
    streaming path, the same length and close to the exact samples."""
    client, _ = running
    speech_url = str(client.base_url).rstrip("/") + "/audio/speech"
    wav = client.audio.speech.create(model=OMNI_NAME, input="Hello there!", voice="Chelsie")
    with wave.open(io.BytesIO(wav.read())) as w:
        assert w.getframerate() == 24000 and w.getnframes() > 0
        frames = w.getnframes()
    pcm = client.audio.speech.create(
        model=OMNI_NAME, input="Hello there!", voice="Chelsie", response_format="pcm"
    )
    pcm_bytes = pcm.read()
    assert len(pcm_bytes) == 2 * frames  # the same request, greedy: the same audio
    events = []
    with httpx.stream(
        "POST",
        speech_url,
        headers={"Authorization": f"Bearer {KEY}"},
        json={
            "model": OMNI_NAME,
            "input": "Hello there!",
            "voice": "Chelsie",
            "response_format": "pcm",
            "stream_format": "sse",
        },
        timeout=60,
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert [e["type"] for e in events][-1] == "speech.audio.done"
    data = b"".join(
        base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"
    )
    assert len(data) == 2 * frames  # streamed (pcm): the streaming path, the same length
    body = {"model": OMNI_NAME, "input": "Hello there!", "voice": "Chelsie"}
    with httpx.stream(
        "POST",
        speech_url,
        headers={"Authorization": f"Bearer {KEY}"},
        json={**body, "response_format": "pcm", "stream_format": "audio"},
        timeout=60,
    ) as r:
        assert r.headers["content-type"] == "audio/pcm"
        raw = b"".join(r.iter_bytes())
    assert len(raw) == 2 * frames
    # Streamed and exact audio of the same codes agree closely (docs/streaming.md's bound).
    streamed = np.frombuffer(raw, dtype="<i2").astype(np.float64)
    exact = np.frombuffer(pcm_bytes, dtype="<i2").astype(np.float64)
    assert np.abs(streamed - exact).max() <= 0.02 * 32767
