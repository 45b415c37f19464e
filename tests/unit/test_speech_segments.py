"""speech_segments and transcript_formats: the timestamped transcription formats' segments (where
the server VAD finds speech in a file) and their verbose_json, srt and vtt forms."""

from __future__ import annotations

import io
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
from helpers import wav_bytes

from omni.core.logprobs import TokenLogprobs
from omni.entrypoints.openai.realtime.vad import load_silero
from omni.entrypoints.openai.speech_segments import PADDING_S, speech_segments
from omni.entrypoints.openai.transcript_formats import segment_entries, srt, verbose_json, vtt
from omni.messages import StageResult

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from realtime_support import RATE, silence, speech  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return load_silero()


def wav(samples: np.ndarray, channels: int = 1) -> bytes:
    return wav_bytes(samples, RATE, channels)


def frames(data: bytes) -> tuple[int, int]:
    with wave.open(io.BytesIO(data)) as w:
        return w.getnframes(), w.getframerate()


def test_each_stretch_of_speech_is_a_segment_where_it_is(model):
    audio = np.concatenate(
        [silence(1.0), speech(2.0), silence(1.5), speech(1.0, 200), silence(0.7)]
    )
    segments = speech_segments(wav(audio), 30.0, model)
    assert len(segments) == 2
    # speech at 1.0-3.0 s and 4.5-5.5 s, each with PADDING_S around it; the VAD's 32 ms windows
    for segment, (start, end) in zip(segments, [(1.0, 3.0), (4.5, 5.5)], strict=True):
        assert abs(segment.start_s - (start - PADDING_S)) < 0.1, segment.start_s
        assert abs(segment.end_s - (end + PADDING_S)) < 0.1, segment.end_s
        assert segment.no_speech_prob < 0.5
        num_frames, rate = frames(segment.wav)
        assert rate == RATE and abs(num_frames / rate - (segment.end_s - segment.start_s)) < 1e-3


def test_a_file_without_speech_is_one_segment_said_to_be_silent(model):
    (segment,) = speech_segments(wav(silence(2.0)), 30.0, model)
    assert (segment.start_s, segment.end_s) == (0.0, 2.0) and segment.no_speech_prob > 0.9


def test_a_long_stretch_is_cut_into_pieces_the_model_hears_in_order(model):
    stereo = np.repeat(speech(40.0), 2)  # two channels, averaged
    segments = speech_segments(wav(stereo, 2), 30.0, model)
    assert len(segments) == 2 and segments[0].start_s == 0.0
    assert segments[0].end_s == segments[1].start_s and segments[1].end_s == pytest.approx(40.0)
    assert all(segment.end_s - segment.start_s <= 29.5 for segment in segments)
    assert sum(frames(s.wav)[0] for s in segments) == 40 * RATE


def result(text: str, token_ids: list[int], logprobs: list[float]) -> StageResult:
    entries = [TokenLogprobs(p, ()) for p in logprobs]
    return StageResult("r", "thinker", [], token_ids, "stop", text=text, logprobs=entries)


def test_verbose_json_srt_and_vtt_from_the_segments(model):
    audio = np.concatenate(
        [silence(1.0), speech(2.0), silence(1.5), speech(1.0, 200), silence(0.7)]
    )
    segments = speech_segments(wav(audio), 30.0, model)
    texts = [result(" Hello there.", [5, 6], [-0.5, -1.5]), result("General Kenobi", [7], [-0.25])]
    entries = segment_entries(segments, texts, 0.0)
    first = entries[0]
    assert (first["id"], first["text"], first["tokens"], first["avg_logprob"]) == (
        0, "Hello there.", [5, 6], -1.0)  # fmt: skip
    assert first["start"] == round(segments[0].start_s, 3) and first["seek"] == round(
        segments[0].start_s * 100
    )
    assert first["compression_ratio"] > 0 and first["temperature"] == 0.0
    body = verbose_json("transcribe", "en", 6.2, "Hello there. General Kenobi", entries)
    assert body["duration"] == 6.2 and [s["id"] for s in body["segments"]] == [0, 1]
    start, end = _clock(entries[1]["start"]), _clock(entries[1]["end"])
    assert srt(entries).split("\n\n")[1] == f"2\n{start} --> {end}\nGeneral Kenobi"
    cue = f"{start.replace(',', '.')} --> {end.replace(',', '.')}\nGeneral Kenobi"
    assert vtt(entries).startswith("WEBVTT\n\n") and vtt(entries).split("\n\n")[2] == cue
    # a segment the model said nothing for is left out, and the ids count the others
    quiet = segment_entries(segments, [result("  ", [], []), texts[1]], 0.0)
    assert [(e["id"], e["text"]) for e in quiet] == [(0, "General Kenobi")]
    assert srt([{"start": 3661.5, "end": 3662.0, "text": "x"}]) == (
        "1\n01:01:01,500 --> 01:01:02,000\nx\n\n")  # fmt: skip


def _clock(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d},{ms % 1000:03d}"
