"""A CUDA error is a stage's death, not a request's failure (omni/host/device_errors.py): which
errors are (by message, through wrapping), and a stage host that meets one, in a step, in an
engine's per-request failures or on add_request, stops its loop and reports the stage dead
(poll raises, naming the stage and the error) instead of failing the requests and going on,
as it still does for any other error. The engine here is a test double that raises on cue."""

from __future__ import annotations

import time

import pytest
import torch

from omni.config import load_config
from omni.core.sampling_params import SamplingParams
from omni.host.device_errors import fatal_device_error, loop_death
from omni.host.stage_host import StageHost
from omni.messages import EngineOutput, Finished, StageInput

ASSERT = "CUDA error: device-side assert triggered\nCompile with `TORCH_USE_CUDA_DSA`"
ILLEGAL = "CUDA error: an illegal memory access was encountered"


def _wrapped(message: str) -> BaseException:
    try:
        try:
            raise torch.AcceleratorError(message)
        except RuntimeError as e:
            raise ValueError("the adapter's own words") from e
    except ValueError as outer:
        return outer


@pytest.mark.parametrize(
    ("error", "fatal"),
    [
        (RuntimeError(ASSERT), True),
        (torch.AcceleratorError(ILLEGAL), True),
        (RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered"), True),
        (_wrapped(ILLEGAL), True),  # found through __cause__
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), False),
        (RuntimeError("CUDA error: out of memory"), False),  # the context stays usable
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"), False),
        (RuntimeError("shape mismatch"), False),
        (ValueError("request 'r': token id 9 is outside the vocabulary"), False),
    ],
)
def test_which_errors_are_fatal(error, fatal):
    assert (fatal_device_error(error) is not None) == fatal
    assert ("died of a CUDA error" in loop_death(error)) == fatal


class _Engine:
    """An engine (omni/engine/engine.py's contract) that fails the way `mode` says."""

    def __init__(self, mode: str) -> None:
        self.mode, self.name = mode, "talker"
        self.requests: list[str] = []
        self.num_fail_all = 0

    def add_request(self, stage_input: StageInput) -> None:
        if self.mode == "add":
            raise RuntimeError(ILLEGAL)
        self.requests.append(stage_input.request_id)

    def extend_request(self, delta) -> None:
        raise AssertionError("no streaming here")

    def step(self) -> EngineOutput:
        if self.mode == "step":
            raise torch.AcceleratorError(ASSERT)
        if self.mode == "plain":
            raise RuntimeError("an ordinary bug")
        # mode "failed"
        failed = {request_id: RuntimeError(ILLEGAL) for request_id in self.requests}
        self.requests = []
        return EngineOutput(failed=failed)

    def abort(self, request_ids):
        return []

    def fail_all(self):
        self.num_fail_all += 1
        from omni.messages import StageResult

        out = [StageResult(r, "talker", [], [], "aborted") for r in self.requests]
        self.requests = []
        return out

    @property
    def has_ready_work(self) -> bool:
        return bool(self.requests)

    has_unfinished = has_ready_work
    has_urgent_work = False

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    def stats(self):
        return {}


def _host(mode: str) -> tuple[StageHost, _Engine]:
    config = load_config({"stages": [{"name": "talker", "model": "m"}]}, check_models=False)
    engine = _Engine(mode)
    return StageHost(config.stages[0], {}, engine=engine), engine  # threaded, as under Ray


@pytest.mark.parametrize("mode", ["step", "failed", "add"])
def test_a_cuda_error_ends_the_stage(mode):
    host, engine = _host(mode)
    try:
        host.submit([StageInput(f"r{i}", [1, 2], SamplingParams()) for i in range(2)])
        deadline = time.monotonic() + 10
        with pytest.raises(RuntimeError) as caught:  # within the deadline: never a hang
            while time.monotonic() < deadline:
                assert host.poll(0.2) == []  # no request failed alone: the stage is dead
        message = str(caught.value)
        assert message.startswith("stage 'talker': died of a CUDA error, which leaves its GPU")
        assert "AcceleratorError" in message or "RuntimeError" in message
        assert not host.alive and engine.num_fail_all == 0  # no recovery attempted on the GPU
        host.submit([StageInput("late", [1], SamplingParams())])
        with pytest.raises(RuntimeError, match="stage 'talker': died of a CUDA error"):
            host.poll(0.2)  # refuses further work, at once
    finally:
        host.shutdown()


def test_any_other_step_error_fails_the_requests_and_the_stage_goes_on():
    host, engine = _host("plain")
    try:
        host.submit([StageInput("r0", [1], SamplingParams())])
        events: list = []
        deadline = time.monotonic() + 10
        while not events and time.monotonic() < deadline:
            events = host.poll(0.2)
        assert [type(e) for e in events] == [Finished]
        error = events[0].result.error
        assert error == "stage 'talker' failed on request 'r0': RuntimeError: an ordinary bug"
        assert host.alive and engine.num_fail_all == 1
    finally:
        host.shutdown()
