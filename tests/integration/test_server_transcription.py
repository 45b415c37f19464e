"""/v1/audio/transcriptions and /v1/audio/translations with the official `openai` client against
a real `omni serve` of the tiny Qwen2.5-Omni: a WAV file's text equals the Python API's thinker
reply to the same audio and instruction (json, text and streamed), the form's fields reach the
instruction, and bad requests are 400s naming the field."""

from __future__ import annotations

import base64
import dataclasses
import importlib.util
import json

import httpx
import openai
import pytest
import torch
from fastapi.testclient import TestClient
from helpers import OMNI_ON_CPU, cli_sets, on_cpu
from server_support import m4a, mp3, spoken, wav

from omni import AsyncOmni, Omni
from omni.entrypoints.media_parts import as_wav
from omni.entrypoints.openai.app import build_app
from omni.entrypoints.openai.args import ServerArgs
from omni.entrypoints.openai.audio_chunks import split_wav
from omni.entrypoints.openai.speech_segments import speech_segments
from omni.entrypoints.openai.transcription import instruction
from tools.make_tiny_checkpoint import ensure_checkpoint
from tools.serve_process import ServeProcess

pytestmark = pytest.mark.slow
NAME, MAX_TOKENS = "tiny-omni", 6
AUDIO = wav(0.5)
MP3 = mp3(0.5)
HAS_AV = importlib.util.find_spec("av") is not None  # omni's dependency; not on the GPU machine
M4A = m4a(0.5) if HAS_AV else b""
SPOKEN = spoken([0.5, 1.5, 1.2, 1.0, 0.5])  # silence, speech, silence, speech, silence
LONG = wav(31.0)  # past the 30 s the Whisper front end hears at once: two pieces


@pytest.fixture(scope="module")
def omni_dir():
    return str(ensure_checkpoint("qwen2_5_omni", "tiny"))


@pytest.fixture(scope="module")
def client(omni_dir):
    args = ["--model", omni_dir, "--served-model-name", NAME, "--max-tokens", str(MAX_TOKENS)]
    process = ServeProcess(args + ["--set", "runtime.backend=local", *cli_sets(OMNI_ON_CPU)])
    process.start()
    try:
        process.wait_ready()
        yield openai.OpenAI(base_url=process.base_url + "/v1", api_key="-", max_retries=0)
    finally:
        process.stop()


@pytest.fixture(scope="module")
def expected(omni_dir):
    """ask -> the Python API's thinker text and token counts for AUDIO and that instruction."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    asks = {
        "plain": (instruction(False, None, None), AUDIO, "wav"),
        "french": (instruction(False, "fr", "Bonjour Anaïs."), AUDIO, "wav"),
        "translate": (instruction(True, None, None), AUDIO, "wav"),
        "mp3": (instruction(False, None, None), MP3, "mp3"),
    }
    segments = speech_segments(SPOKEN, None)
    assert len(segments) == 2
    asks |= {f"seg{i}": (asks["plain"][0], s.wav, "wav") for i, s in enumerate(segments)}
    if HAS_AV:  # chat's input_audio takes WAV and MP3 only, as OpenAI's: the M4A as decoded
        asks["m4a"] = (instruction(False, None, None), as_wav(M4A, "file"), "wav")
    with Omni(model=omni_dir, runtime={"backend": "local"}, **OMNI_ON_CPU) as omni:
        thinker, talker, vocoder = omni.async_omni.config.stages
        params = [
            dataclasses.replace(thinker.sampling, max_tokens=MAX_TOKENS, temperature=0.0),
            dataclasses.replace(talker.sampling, max_tokens=2),  # its codes are not compared
            vocoder.sampling,
        ]
        results = {}
        max_seconds = omni.async_omni.prompt_processor.max_audio_seconds
        pieces = split_wav(LONG, max_seconds)
        assert len(pieces) == 2
        asks |= {f"long{i}": (asks["plain"][0], piece, "wav") for i, piece in enumerate(pieces)}
        for key, (ask, data, fmt) in asks.items():
            audio = {"data": base64.b64encode(data).decode(), "format": fmt}
            content = [{"type": "input_audio", "input_audio": audio}, {"type": "text", "text": ask}]
            (out,) = omni.chat([{"role": "user", "content": content}], params,
                               use_tqdm=False)  # fmt: skip
            result = out.stages[thinker.name]
            results[key] = (result.text, len(result.prompt_token_ids), len(result.token_ids))
            results[key + " ids"] = result.token_ids
    results["segments"] = segments
    torch.set_num_threads(threads)
    return results


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the client's translations
def test_a_transcript_is_the_thinkers_reply_to_the_audio(client, expected):
    text, num_prompt, num_out = expected["plain"]
    assert num_out == MAX_TOKENS and num_prompt > 20  # the audio's tokens are in the prompt
    whole = client.audio.transcriptions.create(model=NAME, file=("a.wav", AUDIO))
    assert whole.text == text
    usage = whole.usage
    assert (usage.type, usage.input_tokens, usage.output_tokens) == ("tokens", num_prompt, num_out)
    plain = client.audio.transcriptions.create(
        model=NAME, file=("a.wav", AUDIO), response_format="text"
    )
    assert plain == text
    events = list(
        client.audio.transcriptions.create(model=NAME, file=("a.wav", AUDIO), stream=True)
    )
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert deltas and "".join(deltas) == text  # pieces may merge when the client lags
    assert events[-1].type == "transcript.text.done" and events[-1].text == text
    french = client.audio.transcriptions.create(
        model=NAME, file=("a.wav", AUDIO), language="fr", prompt="Bonjour Anaïs."
    )
    assert french.text == expected["french"][0]
    translated = client.audio.translations.create(model=NAME, file=("a.wav", AUDIO))
    assert translated.text == expected["translate"][0]
    from_mp3 = client.audio.transcriptions.create(model=NAME, file=("a.mp3", MP3))
    assert from_mp3.text == expected["mp3"][0]


def test_an_m4a_file_is_heard_as_its_decoded_sound(client, expected):
    pytest.importorskip("av")
    from_m4a = client.audio.transcriptions.create(model=NAME, file=("a.m4a", M4A))
    assert from_m4a.text == expected["m4a"][0]


def test_a_long_file_is_transcribed_in_pieces_joined_in_order(client, expected):
    (first, prompt0, out0), (second, prompt1, out1) = expected["long0"], expected["long1"]
    gap = "" if not first or not second or first[-1].isspace() or second[0].isspace() else " "
    text = first + gap + second
    whole = client.audio.transcriptions.create(model=NAME, file=("long.wav", LONG))
    assert whole.text == text
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (prompt0 + prompt1, out0 + out1)
    events = list(
        client.audio.transcriptions.create(model=NAME, file=("long.wav", LONG), stream=True)
    )
    assert "".join(e.delta for e in events if e.type == "transcript.text.delta") == text
    assert events[-1].type == "transcript.text.done" and events[-1].text == text


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the client's translations
def test_timestamped_formats_give_each_stretch_of_speech_where_it_is(client, expected):
    """verbose_json's segments: where the VAD found speech, each transcribed on its own (the
    Python API's text for that stretch); srt and vtt the same cues."""
    file = ("spoken.wav", SPOKEN)
    out = client.audio.transcriptions.create(
        model=NAME, file=file, response_format="verbose_json", timestamp_granularities=["segment"]
    )
    cues = [(s, expected[f"seg{i}"][0].strip(), expected[f"seg{i} ids"])
            for i, s in enumerate(expected["segments"])]  # fmt: skip
    cues = [cue for cue in cues if cue[1]]  # a stretch the model said nothing for is left out
    assert cues and len(out.segments) == len(cues), (cues, out.segments)
    for got, (segment, text, ids) in zip(out.segments, cues, strict=True):
        assert (got.start, got.end) == (round(segment.start_s, 3), round(segment.end_s, 3))
        assert (got.text, got.tokens) == (text, ids)
        assert got.avg_logprob < 0 and 0 <= got.no_speech_prob < 0.5
    assert out.duration == pytest.approx(4.7) and out.language == "unknown"
    assert (out.usage.type, out.usage.seconds) == ("duration", out.duration)
    assert out.text == " ".join(text for _, text, _ in cues)
    srt = client.audio.transcriptions.create(model=NAME, file=file, response_format="srt")
    first = f"1\n{_clock(cues[0][0].start_s, ',')} --> {_clock(cues[0][0].end_s, ',')}"
    assert srt.startswith(first + f"\n{cues[0][1]}\n\n")
    # no speech found (a tone): one segment, the file's own frames, so json's transcript
    tone = client.audio.transcriptions.create(
        model=NAME, file=("a.wav", AUDIO), response_format="verbose_json"
    )
    (segment,) = tone.segments
    assert (segment.start, segment.end, segment.text) == (0.0, 0.5, expected["plain"][0].strip())
    assert segment.no_speech_prob > 0.9
    french = client.audio.transcriptions.create(
        model=NAME, file=("a.wav", AUDIO), language="fr", prompt="Bonjour Anaïs.",
        response_format="verbose_json",
    )  # fmt: skip
    assert (french.language, french.text) == ("french", expected["french"][0])  # as Whisper's
    translated = client.audio.translations.create(
        model=NAME, file=("a.wav", AUDIO), response_format="verbose_json"
    )
    assert (translated.language, translated.text) == ("english", expected["translate"][0])
    vtt = client.audio.transcriptions.create(model=NAME, file=file, response_format="vtt")
    assert vtt.startswith(f"WEBVTT\n\n{_clock(cues[0][0].start_s, '.')} --> ")
    assert vtt.count(" --> ") == srt.count(" --> ") == len(cues)


def _clock(seconds: float, separator: str) -> str:
    ms = round(round(seconds, 3) * 1000)
    hours, minutes, secs = ms // 3600000, ms // 60000 % 60, ms // 1000 % 60
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{ms % 1000:03d}"


@pytest.mark.parametrize(
    ("fields", "file", "param", "status"),
    [
        ({"response_format": "xml"}, AUDIO, "response_format", 400),
        ({"response_format": "srt", "stream": "true"}, AUDIO, "stream", 400),
        ({"timestamp_granularities[]": "segment"}, AUDIO, "timestamp_granularities[]", 400),
        ({"language": "english"}, AUDIO, "language", 400),
        ({"temperature": "hot"}, AUDIO, "temperature", 400),
        ({"temperature": "3"}, AUDIO, "temperature", 400),
        ({"stream": "maybe"}, AUDIO, "stream", 400),
        ({"timestamp_granularities[]": "word"}, AUDIO, "timestamp_granularities[]", 400),
        ({"include[]": "logprobs"}, AUDIO, "include[]", 400),
        ({"chunking_strategy": "server_vad"}, AUDIO, "chunking_strategy", 400),
        ({"voice": "x"}, AUDIO, "voice", 400),
        ({}, b"ID3 not a wav", "file", 400),
        ({}, None, "file", 400),
        ({"model": "other"}, AUDIO, "model", 404),
    ],
)
def test_bad_requests_name_the_field(client, fields, file, param, status):
    files = {} if file is None else {"file": ("a.wav", file, "audio/wav")}
    url = str(client.base_url) + "audio/transcriptions"
    reply = httpx.post(url, data={"model": NAME} | fields, files=files or None, timeout=60)
    assert reply.status_code == status, reply.text
    assert reply.json()["error"]["param"] == param, reply.text


def test_translation_fields_and_bodies_that_are_not_forms(client):
    url = str(client.base_url) + "audio/translations"
    files = {"file": ("a.wav", AUDIO, "audio/wav")}
    reply = httpx.post(url, data={"model": NAME, "language": "fr"}, files=files, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "language"
    reply = httpx.post(url, json={"model": NAME}, timeout=60)
    assert reply.status_code == 400 and "multipart/form-data" in reply.json()["error"]["message"]
    health = httpx.get(str(client.base_url).removesuffix("v1/") + "health", timeout=60)
    assert health.status_code == 200  # none of it took the server down


def test_a_model_that_hears_no_audio_is_named():
    lm_dir = str(ensure_checkpoint("qwen2", "tiny", 0))
    engine = AsyncOmni(model=lm_dir, runtime={"backend": "local"}, **on_cpu("llm"))
    try:
        with TestClient(build_app(engine, ServerArgs("lm"))) as http:
            files = {"file": ("a.wav", AUDIO, "audio/wav")}
            reply = http.post("/v1/audio/transcriptions", data={"model": "lm"}, files=files)
    finally:
        engine.shutdown()
    assert reply.status_code == 400, reply.text
    error = json.loads(reply.text)["error"]
    assert error["param"] == "model" and "does not take audio input" in error["message"]
