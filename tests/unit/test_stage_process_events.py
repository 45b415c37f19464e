"""The processes backend's event encoding (omni/backends/stage_process.py): plain token updates
cross the pipe as tuples, everything else as packed events, in order, and come back equal; a
host whose loop died is reported once as "died"."""

from __future__ import annotations

import pickle
import threading

import torch

from omni.backends.stage_process import _forward, decode_events, encode_events
from omni.messages import Finished, StageResult, StageUpdate


def test_events_round_trip_in_order_with_plain_updates_as_tuples():
    result = StageResult("b", "llm", [1, 2], [3], "stopped")
    events = [
        StageUpdate("a", "llm", [7], 4),
        StageUpdate("b", "llm", [3], 0, audio=torch.arange(6, dtype=torch.float32)),
        StageUpdate("c", "llm", [9], 0, new_codes=[(1, 2)]),
        Finished(result, result),
        StageUpdate("d", "llm", [11], 16),
    ]
    encoded = encode_events(events)
    assert [type(item) for item in encoded] == [
        tuple, StageUpdate, StageUpdate, Finished, tuple,
    ]  # fmt: skip
    assert encoded[0] == ("a", [7], 4)
    decoded = decode_events("llm", pickle.loads(pickle.dumps(encoded)))
    assert decoded[0] == events[0] and decoded[2] == events[2] and decoded[4] == events[4]
    assert decoded[3] == events[3]
    assert torch.equal(decoded[1].audio, events[1].audio)
    assert decoded[1].new_token_ids == [3]


class _DyingHost:
    """A host whose loop has died: poll raises, as StageHost.poll does then."""

    loop_error = "stage 'x': died of a CUDA error, which leaves its GPU context unusable: boom"

    def poll(self, timeout_s: float) -> list:
        raise RuntimeError(self.loop_error)


def test_a_dead_loop_is_sent_once_as_died_and_stops_the_process():
    sent: list[tuple] = []
    stopping = threading.Event()
    _forward(_DyingHost(), sent.append, stopping)  # returns: it does not wait on a dead loop
    assert sent == [("died", _DyingHost.loop_error)] and stopping.is_set()
