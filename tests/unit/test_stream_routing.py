"""Streaming edges on their own: the Router starting a consumer early and sending it pieces in
order, snapshots growing audio, and a stage host's PieceOrder putting pieces back in order."""

from __future__ import annotations

import pytest
import torch

from omni import registry
from omni.config import load_config
from omni.core.sampling_params import SamplingParams
from omni.driver.router import Router
from omni.host.input_conversion import InputConversion
from omni.host.piece_order import PieceOrder
from omni.messages import (
    Finished,
    PromptInput,
    RoutedDelta,
    RoutedInput,
    StageInput,
    StageResult,
    StageUpdate,
)
from tests.unit.test_router import RecordingBackend

STAGES = {
    "stages": [
        {"name": "a", "model": "m"},
        {
            "name": "b",
            "model": "m",
            "inputs": ["a"],
            "input_processor": "join",
            "stream": {"enabled": True},
        },
    ]
}


@pytest.fixture
def router(join_processor):
    registry.EDGE_STREAMING["join"] = registry.EdgeStreaming(2, True, "unused:delta")
    config = load_config(STAGES, check_models=False)
    backend = RecordingBackend()
    backend.log = []
    submit = backend.submit
    backend.submit = lambda stage, items: (backend.log.extend(items), submit(stage, items))
    yield Router(config, backend, lambda stage, ids: None)
    registry.EDGE_STREAMING.pop("join")


def _rows(*values):
    return {"hidden_states": torch.tensor([[float(v)] for v in values])}


def _step(tokens, *values):
    """An update as a host sends it: its step's rows as a payload (in-process: the dict)."""
    return StageUpdate("x", "a", tokens, 0, rows={"x": _rows(*values)}, num_rows=len(values))


def _consumed(rows):
    """The rows a consumer resolves from DeferredRows (in-process payloads: themselves)."""
    conversion = InputConversion(load_config(STAGES, check_models=False).stage("b"), {}, list)
    return conversion.rows("x", rows)["hidden_states"].flatten().tolist()


def _add(router, stream_audio=True):
    heard = []
    params = {s.name: s.sampling for s in router.config.stages}
    router.add(PromptInput("x", [5, 6, 7]), params, heard.append, stream_audio=stream_audio)
    return heard


def test_a_streaming_consumer_starts_early_and_gets_every_row_once_in_order(router):
    heard = _add(router)
    (root,) = router.backend.log
    assert isinstance(root, StageInput) and root.step_rows  # b needs a's rows as they come
    router.handle([_step([11], 0, 1, 2)])
    assert len(router.backend.log) == 1  # 1 token: the edge needs 2 before b can start
    router.handle([_step([12], 3)])
    first = router.backend.log[-1]
    assert isinstance(first, RoutedInput) and not first.input_complete and not first.step_rows
    partial = first.upstream["a"]
    assert partial.token_ids == [11, 12] and partial.prompt_token_ids == [5, 6, 7]
    assert partial.finish_reason is None
    # The rows travel as the producer's payloads (refs under Ray), never as tensors.
    assert partial.tensors == {} and len(first.rows.parts) == 2
    assert _consumed(first.rows) == [0, 1, 2, 3]
    router.handle([_step([13], 4)])
    piece = router.backend.log[-1]
    assert isinstance(piece, RoutedDelta) and piece.offset == 2
    assert piece.piece.token_ids == [13] and piece.piece.tensors == {}
    assert _consumed(piece.rows) == [4]
    full = StageResult("x", "a", [5, 6, 7], [11, 12, 13, 14], "stopped", tensors=_rows(*range(6)))
    light = StageResult("x", "a", [5, 6, 7], [11, 12, 13, 14], "stopped")
    router.handle([Finished(light, full)])
    last = router.backend.log[-1]
    assert isinstance(last, RoutedDelta) and last.offset == 3 and last.piece.finished
    assert last.piece.token_ids == [14] and last.rows.finished is full and last.rows.skip == 5
    assert _consumed(last.rows) == [5]
    assert sum(isinstance(i, RoutedInput) for i in router.backend.log) == 1  # not routed again
    done = StageResult("x", "b", [], [1], "stopped", audio=torch.ones(3), sample_rate=3)
    router.handle([Finished(done, done)])
    assert heard[-1].finished and heard[-1].error is None


def test_audio_chunks_grow_the_snapshots_and_the_request_waits_for_every_stage(router):
    heard = _add(router)
    router.handle([_step([11, 12], 0, 1, 2, 3)])
    for value in (1.0, 2.0):
        chunk = torch.full((2,), value)
        router.handle([StageUpdate("x", "b", [], 0, audio=chunk, sample_rate=2)])
    assert heard[-1].final.stage == "b" and heard[-1].final.audio.tolist() == [1, 1, 2, 2]
    assert heard[-1].final.timings["first_audio_s"] >= 0
    done = StageResult("x", "b", [], [], "stopped", audio=torch.ones(4), sample_rate=2)
    router.handle([Finished(done, done)])  # b is done before a: the request is not yet
    assert not heard[-1].finished and router.requests["x"].inflight == {"a"}
    full = StageResult("x", "a", [5, 6, 7], [11, 12, 13], "stopped", tensors=_rows(*range(5)))
    router.handle([Finished(full, full)])
    assert heard[-1].finished and heard[-1].stages["a"].token_ids == [11, 12, 13]
    assert not isinstance(router.backend.log[-1], RoutedDelta)  # b is done: nothing sent to it


def test_without_stream_audio_the_edge_waits_for_the_whole_upstream(router):
    _add(router, stream_audio=False)
    assert not router.backend.log[0].step_rows
    router.handle([StageUpdate("x", "a", [11, 12, 13], 0)])
    assert len(router.backend.log) == 1
    full = StageResult("x", "a", [5, 6, 7], [11, 12, 13], "stopped")
    router.handle([Finished(full, full)])
    routed = router.backend.log[-1]
    assert isinstance(routed, RoutedInput) and routed.input_complete


def _piece(offset, token_ids, finished=False):
    result = StageResult("r", "a", [], token_ids, "stopped" if finished else None)
    return RoutedDelta("r", result, offset)


def test_piece_order_holds_early_pieces_and_drops_late_ones():
    order = PieceOrder()
    assert order.ready([_piece(3, [4]), _piece(5, [6], finished=True)]) == []  # not started
    order.start("r", 2)
    assert order.ready([_piece(4, [5])]) == []  # still waiting for offset 2
    released = order.ready([_piece(2, [3])])
    assert [p.offset for p in released] == [2, 3, 4, 5] and len(order) == 0
    order.end("r")
    assert order.ready([_piece(6, [7])]) == [] and len(order) == 0  # ended: dropped, not held


class RecordingEngine:
    """The Engine contract, recording what the host hands it (no model)."""

    name = "b"

    def __init__(self) -> None:
        self.added: list[StageInput] = []
        self.deltas: list = []

    def add_request(self, stage_input):
        self.added.append(stage_input)

    def extend_request(self, delta):
        if delta.request_id not in {s.request_id for s in self.added}:
            raise ValueError(f"request {delta.request_id!r} is not in stage 'b'")
        self.deltas.append(delta)

    def abort(self, request_ids):
        return []

    def fail_all(self):
        return []

    def step(self):
        raise AssertionError("nothing to step")

    has_unfinished = has_ready_work = False
    num_requests = 0

    def stats(self):
        return {}


def _delta(piece):
    from omni.messages import InputDelta

    return InputDelta(piece.request_id, list(piece.token_ids), finished=piece.finished)


def test_a_host_holds_pieces_until_its_engine_holds_the_request(join_processor, monkeypatch):
    """Ray's call threads may deliver a piece (even the last one) before the request's first
    input reaches the engine: it waits, and flows once the engine has the request."""
    from omni.host.stage_host import StageHost

    monkeypatch.setitem(
        registry.EDGE_STREAMING, "join", registry.EdgeStreaming(1, False, f"{__name__}:_delta")
    )
    config = load_config(
        {
            "stages": [
                {"name": "a", "model": "m"},
                {"name": "b", "model": "m", "inputs": ["a"], "input_processor": "join"},
            ]
        },
        check_models=False,
    ).stage("b")
    engine = RecordingEngine()
    processors = {"join": lambda upstream, prompt: StageInput(prompt.request_id, [1])}
    host = StageHost(config, processors, engine=engine, threaded=False)
    last = StageResult("r", "a", [], [8, 9], "stopped")
    host.submit([RoutedDelta("r", last, 2)])
    host.run_once()
    assert engine.deltas == [] and host.poll(0) == []  # held, not failed
    partial = StageResult("r", "a", [5], [6, 7], None)
    routed = RoutedInput(
        "r", {"a": partial}, PromptInput("r", [5]), SamplingParams(), input_complete=False
    )
    host.submit([routed])
    host.run_once()
    assert [s.request_id for s in engine.added] == ["r"] and not engine.added[0].input_complete
    assert [(d.new_token_ids, d.finished) for d in engine.deltas] == [([8, 9], True)]
    assert host.poll(0) == []
