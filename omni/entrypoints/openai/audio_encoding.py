"""A stage's float waveform -> 16-bit PCM bytes (raw or in a WAV container), the same
conversion as omni.audio.write_wav: clip to [-1, 1], scale by 32767, truncate to int16."""

from __future__ import annotations

import io
import wave
from collections.abc import Iterator
from typing import Any

import numpy as np

CHUNK_SAMPLES = 4800  # streamed audio pieces: 0.2 s at 24 kHz


def pcm16(audio: Any) -> np.ndarray:
    samples = np.asarray(audio.detach().cpu() if hasattr(audio, "detach") else audio)
    return (np.clip(samples.astype(np.float32).reshape(-1), -1.0, 1.0) * 32767).astype("<i2")


def pcm16_bytes(audio: Any) -> bytes:
    return pcm16(audio).tobytes()


def wav_bytes(audio: Any, sample_rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(int(sample_rate))
        f.writeframes(pcm16_bytes(audio))
    return buffer.getvalue()


def encode(audio: Any, sample_rate: int, fmt: str) -> bytes:
    """fmt: "wav", or "pcm"/"pcm16" (raw little-endian int16, mono)."""
    return wav_bytes(audio, sample_rate) if fmt == "wav" else pcm16_bytes(audio)


def chunks(data: bytes, size: int = CHUNK_SAMPLES * 2) -> Iterator[bytes]:
    """Byte pieces of at most `size` (an even size keeps every piece whole samples)."""
    for start in range(0, len(data), size):
        yield data[start : start + size]
