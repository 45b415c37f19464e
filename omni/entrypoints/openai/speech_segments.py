"""speech_segments: where an audio file's speech is, for the transcription formats that carry
timestamps (verbose_json, srt, vtt).

An omni model writes no timestamps, so the file is cut first: Silero VAD (the server VAD of
/v1/realtime, realtime/vad.py, with OpenAI's server_vad defaults: speech from probability 0.5,
a turn ending after 500 ms under it) finds the stretches of speech; each becomes a segment, from
300 ms before its speech starts to 300 ms after it stops, transcribed on its own. So a
segment's start and end are where its speech is in the file, to a 32 ms window. A stretch longer
than the model hears at once is cut further at quiet points (audio_chunks.split_wav). A file
with no speech found is one segment, the whole file: the model still hears it, and its
no-speech probability says what the VAD found.
"""

from __future__ import annotations

import io
import wave
from dataclasses import dataclass
from typing import Any

import numpy as np

from omni.entrypoints.openai.audio_chunks import split_wav, wav_of
from omni.entrypoints.openai.realtime import vad
from omni.entrypoints.openai.realtime.session_state import SAMPLE_RATE, TurnDetection

SETTINGS = TurnDetection()  # OpenAI's server_vad defaults
PADDING_S = SETTINGS.prefix_padding_ms / 1000  # kept around each stretch of speech


@dataclass(frozen=True)
class Segment:
    """One stretch of the file, transcribed on its own."""

    start_s: float
    """Where it starts in the file."""
    end_s: float
    """Where it ends in the file."""
    wav: bytes
    """Its frames of the file, as a WAV of the file's format."""
    no_speech_prob: float
    """1 - the VAD's mean speech probability over its windows."""


class _RecordingDetector(vad.TurnDetector):
    """The server VAD's turn detector, keeping each window's speech probability."""

    def __init__(self, model: Any) -> None:
        super().__init__(SETTINGS, model)
        self.probabilities: list[float] = []

    def _probability(self, window: np.ndarray) -> float:
        p = super()._probability(window)
        self.probabilities.append(p)
        return p


def speech_segments(data: bytes, max_seconds: float | None, model: Any = None) -> list[Segment]:
    """`data` (a checked WAV) as its speech segments, in order; `model`: vad.load_silero()'s
    (loaded here when None)."""
    with wave.open(io.BytesIO(data)) as w:
        rate, channels, width = w.getframerate(), w.getnchannels(), w.getsampwidth()
        frames = w.readframes(w.getnframes())
    samples = _mono(frames, channels, width)
    duration = samples.size / rate
    detector = _RecordingDetector(model if model is not None else vad.load_silero())
    at_24k = np.interp(
        np.arange(round(duration * SAMPLE_RATE)) * (rate / SAMPLE_RATE),
        np.arange(samples.size),
        samples,
    )
    events = detector.feed((at_24k.clip(-1.0, 1.0) * 32767).round().astype("<i2"))
    bounds, previous_end = [], 0.0
    for begin, stop in _stretches(events, duration):
        begin = max(begin - PADDING_S, previous_end)  # padding never overlaps the last one
        previous_end = min(stop + PADDING_S, duration)
        bounds.append((begin, previous_end))
    segments = []
    for begin, stop in bounds or [(0.0, duration)]:
        piece_start = begin
        size = channels * width  # bytes a frame: the segment is the file's own frames
        own = frames[round(begin * rate) * size : round(stop * rate) * size]
        for piece in split_wav(wav_of(own, rate, channels, width), max_seconds):
            end = piece_start + _frames(piece) / rate
            speech = _mean_between(detector.probabilities, piece_start, end)
            segments.append(Segment(piece_start, end, piece, 1.0 - speech))
            piece_start = end
    return segments


def _stretches(events: list[vad.VadEvent], duration: float) -> list[tuple[float, float]]:
    """(start, stop) seconds of each stretch of speech the events bound."""
    out, start = [], None
    silence = SETTINGS.silence_duration_ms * SAMPLE_RATE // 1000
    for event in events:
        if event.kind == "speech_started":
            start = event.position / SAMPLE_RATE
        elif start is not None:  # the turn ends after the silence: the speech stopped before it
            out.append((start, (event.position - silence) / SAMPLE_RATE))
            start = None
    if start is not None:  # still speaking at the end of the file
        out.append((start, duration))
    return out


def _mean_between(probabilities: list[float], start_s: float, end_s: float) -> float:
    """The mean speech probability of the VAD windows in [start_s, end_s) (0 for none)."""
    window_s = vad.WINDOW / SAMPLE_RATE
    first = int(start_s / window_s)
    span = probabilities[first : max(int(end_s / window_s), first + 1)]
    return float(np.mean(span)) if span else 0.0


def _mono(frames: bytes, channels: int, width: int) -> np.ndarray:
    """A WAV's frames as float32 in [-1, 1], the channels averaged (what the VAD hears)."""
    if width == 3:  # 24-bit: widen to 32 (the low byte zero)
        bytes3 = np.frombuffer(frames, np.uint8).reshape(-1, 3)
        zeros = np.zeros((bytes3.shape[0], 1), np.uint8)
        frames, width = np.concatenate([zeros, bytes3], axis=1).tobytes(), 4
    values = np.frombuffer(frames, {1: "u1", 2: "<i2", 4: "<i4"}[width]).astype(np.float32)
    if width == 1:
        values -= 128.0  # 8-bit WAV is unsigned
    return values.reshape(-1, channels).mean(axis=1) / np.float32(2 ** (8 * width - 1))


def _frames(data: bytes) -> int:
    with wave.open(io.BytesIO(data)) as w:
        return w.getnframes()
