"""`omni serve --model DIR` on the tiny Qwen3-Omni checkpoint (a real server subprocess, the
official `openai` client): chat with audio equals `Omni.generate` on the prompt the server builds
(text exactly, the waveform within one int16 step: both sides round the same floats); voices are
the checkpoint's `talker_config.speaker_id` names, matched case-insensitively, and pick the
speaker; `/v1/audio/speech` speaks in them; a conversation's second turn reports `cached_tokens`.
"""

from __future__ import annotations

import base64
import io
import wave

import numpy as np
import openai
import pytest
from helpers import cli_sets, on_cpu

from omni import Omni
from omni.core.sampling_params import SamplingParams
from omni.entrypoints.openai.audio_encoding import pcm16
from omni.entrypoints.openai.prompts import chat_prompt
from tools.serve_process import ServeProcess

pytestmark = pytest.mark.slow

NAME, KEY = "tiny-qwen3-omni", "test-key"
THINKER, TALKER = 6, 12
ON_CPU = on_cpu("thinker", "talker", "code2wav")
EXTRA = {"stage_sampling": {"thinker": {"ignore_eos": True}, "talker": {"max_tokens": TALKER}}}
PARAMS = [
    SamplingParams(max_tokens=THINKER, ignore_eos=True),
    SamplingParams(max_tokens=TALKER),
    SamplingParams(max_tokens=1),
]
MESSAGES = [{"role": "user", "content": "tell me about the sea and the sky, in a few words"}]


@pytest.fixture(scope="module")
def running(one_torch_thread):
    """The server and, loaded while it starts, the in-process reference."""
    from tools.make_tiny_checkpoint import ensure_checkpoint

    model_dir = str(ensure_checkpoint("qwen3_omni_moe", "tiny"))
    server = ServeProcess(
        ["--model", model_dir, "--served-model-name", NAME, "--api-key", KEY]
        + ["--set", "runtime.backend=local", *cli_sets(ON_CPU)]
    ).start()
    try:
        with Omni(model=model_dir, runtime={"backend": "local"}, **ON_CPU) as reference:
            server.wait_ready()
            client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)
            yield client, reference
    finally:
        server.stop()


def _samples(wav_bytes: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(wav_bytes)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.int32)


def _chat(client, messages, voice: str):
    return client.chat.completions.create(
        model=NAME, messages=messages, max_tokens=THINKER, modalities=["text", "audio"],
        audio={"voice": voice, "format": "wav"}, extra_body=EXTRA,
    )  # fmt: skip


def test_chat_audio_equals_omni_and_voices_pick_the_speaker(running):
    client, reference = running
    prompt = chat_prompt(reference.async_omni.prompt_processor, MESSAGES)
    refs = reference.generate(
        [prompt | {"speaker": "chelsie"}, prompt | {"speaker": "aiden"}], PARAMS, use_tqdm=False
    )
    for voice, ref in zip(("Chelsie", "AIDEN"), refs, strict=True):  # any case
        assert ref.error is None
        out = _chat(client, MESSAGES, voice)
        message = out.choices[0].message
        assert message.content == ref.stages["thinker"].text
        samples, expected = _samples(base64.b64decode(message.audio.data)), pcm16(ref.final.audio)
        assert len(samples) == len(expected) > 0
        assert np.abs(samples - expected.astype(np.int32)).max() <= 1
    assert not np.array_equal(refs[0].final.audio, refs[1].final.audio)  # the voice matters
    with pytest.raises(openai.BadRequestError, match="voices: \\['aiden', 'chelsie', 'ethan'\\]"):
        _chat(client, MESSAGES, "vivian")


def test_speech_in_each_voice(running):
    client, _ = running
    spoken = {}
    for voice in ("ethan", "Aiden"):
        response = client.audio.speech.create(
            model=NAME, voice=voice, input="hello there", response_format="wav"
        )
        spoken[voice] = _samples(response.content)
        assert len(spoken[voice]) > 0 and np.abs(spoken[voice]).max() > 1000  # audio, not silence
    assert not np.array_equal(*spoken.values())


def test_second_turn_reports_cached_tokens(running):
    client, _ = running
    messages = [{"role": "user", "content": "a new conversation about rivers and their banks"}]
    first = _chat(client, messages, "ethan")
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    reply = first.choices[0].message.content
    second = [*messages, {"role": "assistant", "content": reply},
              {"role": "user", "content": "and the mountains?"}]  # fmt: skip
    out = _chat(client, second, "ethan")
    assert out.usage.prompt_tokens_details.cached_tokens >= 16


def test_streamed_chat_audio_and_speech(running):
    """Streamed chat sends pcm16 `delta.audio` pieces as code2wav decodes its chunks; joined,
    they are the streaming path's waveform (`Omni.generate(stream_audio=True)`), which has the
    whole decode's length. Streamed raw pcm speech has the length of the unstreamed pcm."""
    client, reference = running
    prompt = chat_prompt(reference.async_omni.prompt_processor, MESSAGES)
    (ref,) = reference.generate([prompt | {"speaker": "ethan"}], PARAMS, use_tqdm=False,
                                stream_audio=True)  # fmt: skip
    (exact,) = reference.generate([prompt | {"speaker": "ethan"}], PARAMS, use_tqdm=False)
    stream = client.chat.completions.create(
        model=NAME, messages=MESSAGES, max_tokens=THINKER, modalities=["text", "audio"],
        audio={"voice": "ethan", "format": "pcm16"}, extra_body=EXTRA, stream=True,
    )  # fmt: skip
    pieces = [base64.b64decode(c.choices[0].delta.audio.data) for c in stream
              if c.choices and getattr(c.choices[0].delta.audio, "data", None)]  # fmt: skip
    assert len(pieces) >= 2  # 11 frames: chunks of 2, 4, 5
    streamed = np.frombuffer(b"".join(pieces), "<i2").astype(np.int32)
    expected = pcm16(ref.final.audio).astype(np.int32)
    assert len(streamed) == len(expected) == len(exact.final.audio) > 0
    assert np.abs(streamed - expected).max() <= 1
    body = {"model": NAME, "input": "hello there", "voice": "ethan", "response_format": "pcm"}
    whole = client.audio.speech.create(**body).read()
    with client.audio.speech.with_streaming_response.create(
        **body, extra_body={"stream_format": "audio"}
    ) as response:
        raw = response.read()
    assert len(raw) == len(whole) > 0
