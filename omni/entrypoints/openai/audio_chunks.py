"""split_wav: a WAV longer than a model hears at once (Qwen2.5-Omni's Whisper front end: 30 s) as
consecutive WAV pieces that each fit, for /v1/audio/transcriptions' `chunking_strategy` "auto".

Each cut falls at the quietest 100 ms of the last CUT_WINDOW_S seconds before the limit (RMS
over 10 ms hops), so that it is unlikely to split a word; the pieces keep the file's format and
together hold every frame once, in order."""

from __future__ import annotations

import io
import wave

import numpy as np

CUT_WINDOW_S = 5.0  # how far before the limit a cut may fall
MARGIN_S = 0.5  # under the limit: resampling to the model's rate must not round a piece over it
_SAMPLE_TYPES = {1: "u1", 2: "<i2", 4: "<i4"}


def split_wav(data: bytes, max_seconds: float | None) -> list[bytes]:
    """`data` (a checked WAV) as pieces of at most max_seconds - MARGIN_S each; [data] itself
    when it fits (or max_seconds is None: the model takes any length)."""
    with wave.open(io.BytesIO(data)) as w:
        rate, channels, width = w.getframerate(), w.getnchannels(), w.getsampwidth()
        frames = w.readframes(w.getnframes())
    num_frames = len(frames) // (channels * width)
    if max_seconds is None or num_frames <= max_seconds * rate:
        return [data]
    limit = max(int((max_seconds - MARGIN_S) * rate), 1)
    loudness = _loudness(frames, channels, width)
    pieces, start = [], 0
    while num_frames - start > limit:
        end = start + limit
        start_of_window = max(start + 1, end - int(CUT_WINDOW_S * rate))
        cut = end if loudness is None else _quietest(loudness, start_of_window, end, rate)
        pieces.append(
            wav_of(frames[start * channels * width : cut * channels * width], rate, channels, width)
        )
        start = cut
    pieces.append(wav_of(frames[start * channels * width :], rate, channels, width))
    return pieces


def _loudness(frames: bytes, channels: int, width: int) -> np.ndarray | None:
    """|amplitude| per frame, the channels averaged (None for 24-bit samples: cuts at the limit)."""
    sample_type = _SAMPLE_TYPES.get(width)
    if sample_type is None:
        return None
    samples = np.frombuffer(frames, dtype=sample_type).astype(np.float32)
    if width == 1:
        samples -= 128.0  # 8-bit WAV is unsigned
    return np.abs(samples.reshape(-1, channels).mean(axis=1))


def _quietest(loudness: np.ndarray, start: int, end: int, rate: int) -> int:
    """The middle of the quietest 100 ms (by RMS, 10 ms hops) between frames start and end."""
    window, hop = max(rate // 10, 1), max(rate // 100, 1)
    energy = np.cumsum(np.concatenate([[0.0], loudness[start:end].astype(np.float64) ** 2]))
    if end - start <= window:
        return (start + end) // 2
    begins = np.arange(0, end - start - window + 1, hop)
    rms = energy[begins + window] - energy[begins]
    return int(start + begins[int(np.argmin(rms))] + window // 2)


def wav_of(frames: bytes, rate: int, channels: int, width: int) -> bytes:
    """Raw frames as a WAV file of that format."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(frames)
    return buffer.getvalue()
