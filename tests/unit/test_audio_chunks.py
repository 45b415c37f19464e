"""split_wav: a WAV longer than the model hears at once, as pieces that fit, cut in its quiet
spots, that hold every frame once and keep the file's format."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from omni.entrypoints.openai.audio_chunks import MARGIN_S, split_wav

RATE = 8000


def wav(
    seconds: float, quiet_at: tuple[float, ...] = (), width: int = 2, channels: int = 1
) -> bytes:
    t = np.arange(int(seconds * RATE))
    tone = np.sin(t * 2 * np.pi * 300 / RATE) * 0.6
    for at in quiet_at:  # 200 ms of near silence
        tone[int(at * RATE) : int((at + 0.2) * RATE)] *= 0.001
    samples = np.repeat(tone[:, None], channels, axis=1)
    scale = {1: 127, 2: 32767, 3: 8388607, 4: 2147483647}[width]
    ints = (samples * scale).astype(np.int64) + (128 if width == 1 else 0)
    raw = b"".join(int(v).to_bytes(width, "little", signed=width > 1) for v in ints.reshape(-1))
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(RATE)
        w.writeframes(raw)
    return buffer.getvalue()


def frames(data: bytes) -> tuple[bytes, tuple[int, int, int]]:
    with wave.open(io.BytesIO(data)) as w:
        return w.readframes(w.getnframes()), (w.getframerate(), w.getnchannels(), w.getsampwidth())


def test_a_file_that_fits_is_kept_whole():
    data = wav(3.0)
    assert split_wav(data, 30.0) == [data] and split_wav(data, None) == [data]
    assert split_wav(data, 3.0) == [data]  # exactly the limit fits


@pytest.mark.parametrize(("width", "channels"), [(2, 1), (1, 2), (4, 1)])
def test_cuts_fall_in_quiet_spots_and_keep_every_frame(width, channels):
    data = wav(25.0, quiet_at=(7.0, 15.5), width=width, channels=channels)
    pieces = split_wav(data, 10.0)
    whole, params = frames(data)
    assert len(pieces) == 3 and b"".join(frames(p)[0] for p in pieces) == whole
    assert all(frames(p)[1] == params for p in pieces)
    lengths = [len(frames(p)[0]) // (channels * width) for p in pieces]
    assert max(lengths) <= (10.0 - MARGIN_S) * RATE
    cuts = np.cumsum(lengths)[:-1] / RATE
    assert 7.0 <= cuts[0] <= 7.2 and 15.5 <= cuts[1] <= 15.7, cuts


def test_24_bit_samples_are_cut_at_the_limit():
    data = wav(12.0, width=3)
    pieces = split_wav(data, 5.0)
    lengths = [len(frames(p)[0]) // 3 for p in pieces]
    assert lengths == [int(4.5 * RATE), int(4.5 * RATE), 12 * RATE - 9 * RATE]
    assert b"".join(frames(p)[0] for p in pieces) == frames(data)[0]


def snapshot(text: str, finished: bool, error: str | None = None):
    from omni.messages import OmniOutput, StageResult

    result = StageResult("r", "thinker", [1], [2] * len(text), "stopped" if finished else None,
                         text=text, error=error)  # fmt: skip
    return OmniOutput("r", {"thinker": result}, result, error=error, finished=finished)


def test_pieces_texts_join_in_order_whatever_order_their_snapshots_come():
    from omni.entrypoints.openai.transcription import Transcript

    transcript = Transcript("thinker", 3)
    sent = [
        transcript.add(1, snapshot("world", False)),  # a later piece: held
        transcript.add(0, snapshot("Hello", False)),
        transcript.add(2, snapshot(" again", True)),
        transcript.add(0, snapshot("Hello,", True)),  # the first done: the second's text goes
        transcript.add(1, snapshot("world.", True)),  # then the third's, whole
    ]
    assert sent == ["", "Hello", "", ", world", ". again"]
    assert transcript.text == "Hello, world. again"  # a space where none separates two pieces
    failed = Transcript("thinker", 1)
    with pytest.raises(Exception, match="boom"):
        failed.add(0, snapshot("", True, error="boom"))
