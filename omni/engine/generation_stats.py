"""GenerationStats: what a generation stage (a vocoder) counts for stats() and /metrics.

Steps, finished requests, chunks, compute time and seconds of audio; from them the real-time
factor (compute time per second of audio) and chunks per streamed request; and each recent
request's time from its arrival in the stage to its first audio (a whole request: its waveform),
summarised as p50 / p99.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FIRST_AUDIO_KEPT = 1000  # recent requests whose first-audio times the percentiles summarise


@dataclass
class GenerationStats:
    num_steps: int = 0
    num_finished: int = 0
    num_chunks: int = 0
    num_streams_done: int = 0  # streaming requests finished with all their chunks
    busy_s: float = 0.0  # time in step()
    audio_s: float = 0.0  # seconds of audio produced (whole requests and chunks)
    first_audio_s: deque[float] = field(default_factory=lambda: deque(maxlen=FIRST_AUDIO_KEPT))

    def as_dict(self) -> dict[str, Any]:
        return {
            "steps": self.num_steps,
            "finished": self.num_finished,
            "chunks": self.num_chunks,
            "busy_s": self.busy_s,
            "audio_s": self.audio_s,
            # Real-time factor: compute time per second of audio (< 1: faster than real time).
            "rtf": self.busy_s / self.audio_s if self.audio_s else None,
            "chunks_per_request": (
                self.num_chunks / self.num_streams_done if self.num_streams_done else None
            ),
            "first_audio_s_p50": self._percentile(50),
            "first_audio_s_p99": self._percentile(99),
        }

    def _percentile(self, q: float) -> float | None:
        values = self.first_audio_s
        return float(np.percentile(np.asarray(values), q)) if values else None
