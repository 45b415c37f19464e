"""Writing a stage's waveform to a WAV file (stdlib `wave`, no audio libraries needed)."""

from __future__ import annotations

import wave
from pathlib import Path
from typing import Any

import numpy as np


def write_wav(path: str | Path, audio: Any, sample_rate: int) -> float:
    """Mono 16-bit PCM from float samples in [-1, 1] (values outside are clipped); returns the
    duration in seconds. Parent folders are created."""
    samples = np.asarray(audio.detach().cpu() if hasattr(audio, "detach") else audio)
    pcm = (np.clip(samples.astype(np.float32).reshape(-1), -1.0, 1.0) * 32767).astype("<i2")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(int(sample_rate))
        f.writeframes(pcm.tobytes())
    return len(pcm) / sample_rate
