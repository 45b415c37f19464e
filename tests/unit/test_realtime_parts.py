"""/v1/realtime's parts without a server: client event parsing, the input audio buffer, and the
turn detector on the real Silero VAD model (tests/integration/test_realtime.py runs the endpoint
end to end)."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from omni.entrypoints.openai.errors import OpenAIError
from omni.entrypoints.openai.realtime import events, input_audio
from omni.entrypoints.openai.realtime.session_state import TurnDetection
from omni.entrypoints.openai.realtime.vad import WINDOW, TurnDetector, load_silero

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from realtime_support import silence, speech  # noqa: E402


@pytest.mark.parametrize(
    ("message", "code", "param"),
    [
        ("not json", "invalid_json", None),
        ("[1]", "invalid_event", None),
        ('{"type": "response.frobnicate"}', "invalid_event_type", "type"),
        ('{"type": "session.update", "session": {}}', "missing_required_parameter", "session.type"),
        (
            '{"type": "session.update", "session": {"type": "realtime", "max_output_tokens": "5"}}',
            "invalid_value",
            "session.max_output_tokens",
        ),
        ('{"type": "response.cancel", "extra": 1}', "unknown_parameter", "extra"),
        ('{"type": "input_audio_buffer.append"}', "missing_required_parameter", "audio"),
    ],
)
def test_bad_events_name_the_field(message, code, param):
    with pytest.raises(events.BadEvent) as info:
        events.parse(message)
    assert (info.value.error.code, info.value.error.param) == (code, param), (
        info.value.error.message
    )


def test_event_size_limit_and_event_ids():
    big = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 100, "event_id": "e1"})
    with pytest.raises(events.BadEvent) as info:
        events.parse(big, max_bytes=50)
    assert info.value.error.code == "event_too_large"
    with pytest.raises(events.BadEvent) as info:
        events.parse('{"type": "nope", "event_id": "e7"}')
    assert info.value.event_id == "e7"
    assert events.parse(big).event_id == "e1"


def test_decode_refuses_what_is_not_pcm16():
    for data, code in (("@@", "invalid_value"), ("AAAA", "invalid_audio_format")):
        with pytest.raises(OpenAIError) as info:
            input_audio.decode(data, "audio")
        assert (info.value.code, info.value.param) == (code, "audio")
    wav_header = base64.b64encode(b"RIFF" + bytes(40)).decode()
    with pytest.raises(OpenAIError, match="WAV"):
        input_audio.decode(wav_header, "audio")
    samples = np.array([1, -2, 32767], "<i2")
    decoded = input_audio.decode(base64.b64encode(samples.tobytes()).decode(), "audio")
    assert decoded.tolist() == [1, -2, 32767]


def test_audio_buffer_positions_and_limit():
    buffer = input_audio.AudioBuffer(max_seconds=1.0)
    for start in range(0, 24000, 5000):
        buffer.append(np.arange(start, min(start + 5000, 24000)).astype(np.int16) % 1000, "a")
    with pytest.raises(OpenAIError) as info:
        buffer.append(np.zeros(1, np.int16), "a")
    assert info.value.code == "input_audio_buffer_too_large" and buffer.num_samples == 24000
    buffer.drop_before(7000)
    assert (buffer.start, buffer.end) == (7000, 24000)
    taken = buffer.take(6000, 12000)  # before the start: from the start
    assert taken.tolist() == (np.arange(7000, 12000) % 1000).tolist()
    assert (buffer.start, buffer.num_samples) == (12000, 12000)
    buffer.clear()
    assert buffer.num_samples == 0 and buffer.start == 24000


def test_turn_detector_finds_speech_whatever_the_appends():
    """Speech from 480 to 1680 ms, then silence: one start and one stop, at the same window
    positions however the audio is split into appends."""
    audio = np.concatenate([silence(0.48), speech(1.2), silence(0.8)])
    model = load_silero()
    settings = TurnDetection(silence_duration_ms=320, prefix_padding_ms=96)
    found = []
    for piece in (WINDOW, 1000, 4801, audio.size):
        model.reset_states()
        detector = TurnDetector(settings, model)
        events_seen = []
        for start in range(0, audio.size, piece):
            events_seen += detector.feed(audio[start : start + piece])
        found.append([(e.kind, e.position) for e in events_seen])
    assert all(f == found[0] for f in found), found
    (start_kind, start), (stop_kind, stop) = found[0]
    assert (start_kind, stop_kind) == ("speech_started", "speech_stopped")
    assert start % WINDOW == stop % WINDOW == 0
    assert 480 * 24 - WINDOW <= start <= 480 * 24 + 2 * WINDOW
    assert 1680 * 24 + 320 * 24 <= stop <= 1680 * 24 + 320 * 24 + 8 * WINDOW


def test_a_call_leaves_the_context_with_its_outputs():
    from omni.entrypoints.openai.realtime.context_window import leaving_items
    from omni.entrypoints.openai.realtime.conversation import Item, Part

    ask = Item("user", [Part("input_text", "weather?")])
    call = Item("assistant", [], type="function_call", call_id="c1", name="get_weather")
    other = Item("assistant", [], type="function_call", call_id="c2", name="get_time")
    output = Item("user", [], type="function_call_output", call_id="c1", output="{}")
    answer = Item("assistant", [Part("output_text", "Sunny.")])
    assert leaving_items([ask, call, other, output, answer]) == {ask.id}
    assert leaving_items([call, other, output, answer]) == {call.id, output.id}
    assert leaving_items([other, output, answer]) == {other.id}
