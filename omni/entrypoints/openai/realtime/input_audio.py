"""Input audio of a realtime session: base64 pcm16 (24 kHz mono) -> int16 samples, the input
buffer (bounded by the thinker's own audio limit), and the forms the model and the VAD take.

The model takes a committed turn as `(waveform, 24000)`, float samples int16 / 32768 (the scale
of a 16-bit WAV), and the pipeline's prompt processor resamples it to its audio encoder's rate
(16 kHz for Qwen2.5-Omni's Whisper front end), exactly as it would the same samples sent as a
WAV to /v1/chat/completions. Silero VAD takes 16 kHz windows (`to_rate`).
"""

from __future__ import annotations

import numpy as np

from omni.entrypoints.openai.context import Context
from omni.entrypoints.openai.errors import bad_request
from omni.entrypoints.openai.prompts import decode_base64
from omni.entrypoints.openai.realtime.session_state import SAMPLE_RATE

MIN_COMMIT_MS = 100
"""A committed turn has at least this much audio (as OpenAI requires)."""


def max_seconds(ctx: Context) -> float | None:
    """The longest audio input the root stage takes (None: it takes no audio)."""
    limit = getattr(ctx.async_omni.prompt_processor, "max_audio_seconds", None)
    return None if limit is None else float(limit)


def require_audio_input(ctx: Context, param: str | None) -> float:
    """The audio limit in seconds; OpenAIError where the pipeline takes no audio."""
    limit = max_seconds(ctx)
    if limit is None:
        raise bad_request(
            f"{ctx.args.model_name!r} takes no audio input (its prompt processor is text only)",
            param,
            "unsupported_value",
        )
    return limit


def decode(data: str, param: str) -> np.ndarray:
    """base64 pcm16 little-endian mono -> int16 samples (OpenAIError naming `param`)."""
    raw = decode_base64(data, param)
    if raw[:4] == b"RIFF":
        raise bad_request(
            f"{param} is a WAV file; send raw pcm16 samples (24 kHz mono, little-endian) without "
            "a header",
            param,
            "invalid_audio_format",
        )
    if len(raw) % 2:
        raise bad_request(
            f"{param} is {len(raw)} bytes, not whole 16-bit samples: audio must be pcm16 "
            "(24 kHz mono, little-endian)",
            param,
            "invalid_audio_format",
        )
    return np.frombuffer(raw, "<i2").copy()


def waveform(samples: np.ndarray) -> tuple[np.ndarray, int]:
    """int16 samples -> what a prompt's "audio" list takes: (float waveform, sample rate)."""
    return samples.astype(np.float64) / 32768.0, SAMPLE_RATE


def to_rate(samples: np.ndarray, rate: int) -> np.ndarray:
    """int16 samples at 24 kHz -> float32 at `rate`, linearly interpolated (the prompt
    processor's resampling)."""
    x = samples.astype(np.float32) / 32768.0
    if rate == SAMPLE_RATE:
        return x
    num_out = round(x.size * rate / SAMPLE_RATE)
    times = np.arange(num_out) * (SAMPLE_RATE / rate)
    return np.interp(times, np.arange(x.size), x).astype(np.float32)


class AudioBuffer:
    """The uncommitted input audio: samples [start, end) of the session's input (sample indices
    since the connection opened, which is what the VAD events' milliseconds count). Kept as the
    appended pieces, so an append costs its own size, not the buffer's."""

    def __init__(self, max_seconds: float) -> None:
        self.max_samples = int(max_seconds * SAMPLE_RATE)
        self.start = 0
        self.num_samples = 0
        self._pieces: list[np.ndarray] = []

    @property
    def end(self) -> int:
        return self.start + self.num_samples

    def append(self, samples: np.ndarray, param: str) -> None:
        """Add samples; OpenAIError (nothing added) past the limit."""
        total = self.num_samples + samples.size
        if total > self.max_samples:
            raise bad_request(
                f"the input audio buffer would hold {total / SAMPLE_RATE:.2f} s, over the "
                f"model's audio limit of {self.max_samples / SAMPLE_RATE:g} s; commit (or clear) "
                "the buffer first",
                param,
                "input_audio_buffer_too_large",
            )
        if samples.size:
            self._pieces.append(samples)
            self.num_samples = total

    def take(self, first: int, end: int) -> np.ndarray:
        """Samples [max(first, start), end) out of the buffer; everything before `end` leaves."""
        self.drop_before(first)
        count = min(max(end - self.start, 0), self.num_samples)
        joined = np.concatenate(self._pieces) if self._pieces else np.zeros(0, np.int16)
        out, rest = joined[:count], joined[count:]
        self._pieces = [rest] if rest.size else []
        self.start += count
        self.num_samples -= count
        return out

    def drop_before(self, position: int) -> None:
        """Forget samples before `position` (silence before speech, beyond the padding)."""
        cut = min(max(position - self.start, 0), self.num_samples)
        self.start += cut
        self.num_samples -= cut
        while cut:
            head = self._pieces[0]
            if head.size <= cut:
                self._pieces.pop(0)
                cut -= head.size
            else:
                self._pieces[0] = head[cut:]
                cut = 0

    def clear(self) -> None:
        self.drop_before(self.end)


def ms(position: int) -> int:
    """A sample index at 24 kHz in whole milliseconds."""
    return position * 1000 // SAMPLE_RATE
