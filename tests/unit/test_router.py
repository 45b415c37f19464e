"""The Router on its own, with a recording backend: snapshots, routing, failures, reused ids."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from omni.config import load_config
from omni.driver.router import Router
from omni.messages import (
    Finished,
    OmniOutput,
    PromptInput,
    RoutedInput,
    StageDied,
    StageResult,
    StageUpdate,
)


class RecordingBackend:
    """Records what the router asks for; payloads are the results themselves."""

    def __init__(self) -> None:
        self.submitted: list[tuple[str, str]] = []  # (stage, request id)
        self.aborted: list[tuple[str, str]] = []
        self.dead: dict[str, str] = {}

    def submit(self, stage, items):
        self.submitted += [(stage, item.request_id) for item in items]
        self.items = list(items)

    def abort(self, stage, request_ids):
        self.aborted += [(stage, request_id) for request_id in request_ids]

    def fetch(self, payloads):
        return list(payloads)

    def dead_stages(self):
        return dict(self.dead)


@pytest.fixture
def router(join_processor):
    config = load_config(
        {
            "stages": [
                {"name": "a", "model": "m"},
                {"name": "b", "model": "m", "inputs": ["a"], "input_processor": "join"},
            ]
        },
        check_models=False,
    )
    return Router(config, RecordingBackend(), lambda stage, ids: " ".join(map(str, ids)))


def _add(router, request_id="x"):
    heard: list[OmniOutput] = []
    params = {s.name: s.sampling for s in router.config.stages}
    router.add(PromptInput(request_id, [5, 6, 7]), params, heard.append)
    return heard


def _done(request_id, stage, token_ids, error=None):
    result = StageResult(request_id, stage, [5, 6, 7], token_ids, "stopped", error=error)
    return Finished(result, result)


def test_snapshots_grow_then_route_then_finish(router):
    heard = _add(router)
    assert router.backend.submitted == [("a", "x")]
    router.handle([StageUpdate("x", "a", [1], 0)])
    router.handle([StageUpdate("x", "a", [2, 3], 0), StageUpdate("y", "a", [9], 0)])  # y: stale
    assert [s.stages["a"].token_ids for s in heard] == [[1], [1, 2, 3]]
    assert heard[-1].stages["a"].text == "1 2 3" and not heard[-1].finished
    router.handle([_done("x", "a", [1, 2, 3])])
    assert router.backend.submitted[-1] == ("b", "x")
    assert isinstance(router.backend.items[0], RoutedInput)
    router.handle([StageUpdate("x", "b", [4], 0)])
    assert heard[-1].final.stage == "b" and heard[-1].stages["a"].finished
    router.handle([_done("x", "b", [4, 8])])
    assert heard[-1].finished and heard[-1].final.token_ids == [4, 8] and heard[-1].error is None
    router.handle([_done("x", "b", [4, 8])])  # a duplicate is stale: nothing more is heard
    assert len(heard) == 5 and router.num_requests == 0


def test_an_error_in_a_stage_ends_the_request(router):
    heard = _add(router)
    router.handle([_done("x", "a", [], error="stage 'a' rejected request 'x': bad")])
    assert heard[-1].finished and heard[-1].error == "stage 'a' rejected request 'x': bad"
    assert router.backend.submitted == [("a", "x")]  # never routed on


def test_a_dead_stage_fails_what_it_held_and_the_others_go_on(router):
    heard_x, heard_y = _add(router, "x"), _add(router, "y")
    router.handle([_done("y", "a", [1])])  # y moves on to b
    router.handle([StageDied("a", "stage 'a': its Ray actor died", restarting=True)])
    assert (
        heard_x[-1].finished and heard_x[-1].error == "request 'x': stage 'a': its Ray actor died"
    )
    assert router.requests.keys() == {"y"}
    router.backend.dead = {"b": "stage 'b': gone for good"}
    with pytest.raises(RuntimeError, match="gone for good"):
        _add(router, "z")
    params = {s.name: s.sampling for s in router.config.stages}
    router.add(PromptInput("w", [5]), params, lambda out: None, final_stage="a")  # b not needed
    assert router.backend.submitted[-1] == ("a", "w")
    assert not heard_y[-1].finished


def test_abort_with_and_without_a_reason(router):
    heard = _add(router)
    assert router.abort("x") and router.backend.aborted == [("a", "x")]
    assert heard == [] and not router.abort("x")
    heard = _add(router, "y")
    assert router.abort("y", "request 'y' was aborted")
    assert heard[-1].finished and heard[-1].final.finish_reason == "aborted"
    assert router.backend.aborted[-1] == ("a", "y")  # the stage still ran it: told to stop


def test_an_abort_reaches_every_stage_running_the_request(router):
    heard = _add(router)
    router.requests["x"].inflight.add("b")  # e.g. b streams from a, which is still generating
    assert router.abort("x", "request 'x' was aborted")
    assert sorted(router.backend.aborted) == [("a", "x"), ("b", "x")]
    assert heard[-1].final.stage == "a" and heard[-1].final.finish_reason == "aborted"


def test_a_reused_id_runs_under_a_fresh_stage_id(router):
    _add(router)
    router.abort("x")  # a stage may still get this abort after a new submit of "x"
    heard = _add(router)
    assert router.backend.submitted[-1] == ("a", "x#1")
    with pytest.raises(ValueError, match="request_id 'x' is already running"):
        _add(router)
    router.handle([_done("x", "a", [1])])  # the old request's late result: stale
    assert heard == []
    router.handle([_done("x#1", "a", [1]), _done("x#1", "b", [2])])
    assert heard[-1].request_id == "x" and heard[-1].finished
    assert {r.request_id for r in heard[-1].stages.values()} == {"x"}
    assert router.abort("x") is False


def test_no_progress_expires_a_request(router):
    heard = _add(router)
    router.expire(timeout_s=60)
    assert heard == []
    router.requests["x"].last_progress -= 61
    router.expire(timeout_s=60)
    assert heard[-1].finished and "no progress in stage(s) ['a'] for 60 s" in heard[-1].error
    assert router.backend.aborted == [("a", "x")]  # the stage may yet wake up: it must not


@pytest.mark.parametrize("return_tensors", ["final", "all"])
def test_only_the_callers_tensors_are_fetched(join_processor, return_tensors):
    """The driver fetches a result's tensors only for what the caller gets back: the final
    stage's (every stage's with runtime.return_tensors all); the payload is routed as it is."""
    config = load_config(
        {
            "runtime": {"return_tensors": return_tensors},
            "stages": [
                {"name": "a", "model": "m"},
                {"name": "b", "model": "m", "inputs": ["a"], "input_processor": "join"},
            ],
        },
        check_models=False,
    )
    backend = RecordingBackend()
    fetched: list = []
    backend.fetch = lambda payloads: (fetched.extend(payloads), list(payloads))[1]
    router = Router(config, backend, lambda stage, ids: None)
    heard = _add(router)
    rows = {"hidden_states": torch.ones(3, 2)}
    full = StageResult("x", "a", [5, 6, 7], [1], "stopped", tensors=rows)
    router.handle([Finished(dataclasses.replace(full, tensors={}), full)])
    assert backend.items[0].upstream["a"] is full  # the payload goes on untouched
    assert (fetched == [full]) == (return_tensors == "all")
    assert heard[-1].stages["a"].tensors == ({} if return_tensors == "final" else rows)
    router.handle([_done("x", "b", [4])])
    assert fetched[-1].stage == "b" and heard[-1].finished
