"""Server VAD: Silero VAD (the `silero-vad` package's TorchScript model, on the CPU) turned into
turn events: where speech starts and where a turn ends.

The input is cut into windows of 32 ms (768 samples at 24 kHz -> Silero's 512 at 16 kHz, each
resampled on its own so that a window's result does not depend on how the audio was split into
appends). A window whose speech probability reaches `threshold` starts speech (or continues it);
while speaking, windows under `threshold - 0.15` (Silero's own hysteresis, as its VADIterator)
count as silence, and `silence_duration_ms` of them in a row end the turn. All positions are
sample indices of the session's input at 24 kHz, multiples of a window, so whole milliseconds.

The model is stateful (an LSTM over the stream): one per connection, ~2 MB, loaded in 50 ms.
It is loaded from the package's files without importing the package, whose import sets torch's
process-wide thread count to 1 (it would slow down stages running in the server process).
"""

from __future__ import annotations

import importlib.util
import pathlib
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omni.entrypoints.openai.realtime import input_audio
from omni.entrypoints.openai.realtime.session_state import SAMPLE_RATE, TurnDetection

VAD_RATE = 16000
WINDOW = 768
"""Samples at 24 kHz per VAD window (512 at 16 kHz, 32 ms)."""
HYSTERESIS = 0.15


def load_silero() -> Any:
    """A fresh Silero VAD model (TorchScript, CPU)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "server VAD needs the silero-vad package (pip install silero-vad); or set "
            "audio.input.turn_detection to null and commit turns yourself"
        )
    path = pathlib.Path(spec.origin).parent / "data" / "silero_vad.jit"
    with warnings.catch_warnings():
        # torch 2.13 deprecates TorchScript; Silero ships its PyTorch model only as TorchScript
        # (the other files are ONNX, which would need onnxruntime).
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.load(str(path), map_location="cpu").eval()


@dataclass(frozen=True)
class VadEvent:
    kind: str
    """"speech_started" or "speech_stopped"."""
    position: int
    """Where speech started (without padding), or where the turn ends (after the silence)."""


class TurnDetector:
    def __init__(self, settings: TurnDetection, model: Any, start: int = 0) -> None:
        """settings: the session's server_vad settings; model: load_silero()'s; start: the
        session position of the first sample fed."""
        self.settings = settings
        self.model = model
        self.position = start
        """The session position of the next window's first sample."""
        self.speaking = False
        self.speech_start = 0
        self._silence_start: int | None = None
        self._pending = np.zeros(0, np.int16)

    def feed(self, samples: np.ndarray) -> list[VadEvent]:
        """The events in `samples` (int16, 24 kHz, following what was fed before)."""
        data = np.concatenate([self._pending, samples]) if self._pending.size else samples
        num_windows = data.size // WINDOW
        self._pending = data[num_windows * WINDOW :].copy()
        out: list[VadEvent] = []
        for w in range(num_windows):
            window = data[w * WINDOW : (w + 1) * WINDOW]
            event = self._step(self._probability(window))
            if event is not None:
                out.append(event)
            self.position += WINDOW
        return out

    def reset(self, position: int) -> None:
        """Forget the speech state (the buffer was committed or cleared up to `position`)."""
        self.speaking = False
        self._silence_start = None
        self.position = position
        self._pending = np.zeros(0, np.int16)

    def padded_start(self) -> int:
        """The start of the speech with prefix_padding_ms before it (never negative)."""
        padding = self.settings.prefix_padding_ms * SAMPLE_RATE // 1000
        return max(self.speech_start - padding, 0)

    def _probability(self, window: np.ndarray) -> float:
        x = torch.from_numpy(input_audio.to_rate(window, VAD_RATE))
        with torch.inference_mode():
            return float(self.model(x, VAD_RATE))

    def _step(self, p: float) -> VadEvent | None:
        s = self.settings
        if p >= s.threshold:
            self._silence_start = None
            if not self.speaking:
                self.speaking = True
                self.speech_start = self.position
                return VadEvent("speech_started", self.position)
            return None
        if not self.speaking or p >= s.threshold - HYSTERESIS:
            return None
        if self._silence_start is None:
            self._silence_start = self.position
        end = self.position + WINDOW
        if (end - self._silence_start) * 1000 >= s.silence_duration_ms * SAMPLE_RATE:
            self.speaking = False
            self._silence_start = None
            return VadEvent("speech_stopped", end)
        return None
