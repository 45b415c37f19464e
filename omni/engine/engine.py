"""The contract every stage engine meets, so that a stage host drives any kind the same way."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from omni.messages import EngineOutput, InputDelta, StageInput, StageResult

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Engine(Protocol):
    """One stage's engine. Not thread-safe: its host calls it from one thread at a time."""

    name: str
    device: torch.device
    """Where the stage computes (resolved at construction: auto becomes cpu or cuda:0)."""

    def add_request(self, stage_input: StageInput) -> None:
        """Validate and queue; a ValueError leaves the engine and other requests untouched."""

    def extend_request(self, delta: InputDelta) -> None:
        """More input for a request added with input_complete=False (ValueError if unknown)."""

    def step(self) -> EngineOutput:
        """Advance every scheduled request by one step."""

    def abort(self, request_ids: list[str]) -> list[StageResult]:
        """Drop requests (queued or running) and free what they hold."""

    def fail_all(self) -> list[StageResult]:
        """After a step raised: drop every request and whatever cache state it may have spoiled."""

    @property
    def has_unfinished(self) -> bool:
        """Whether it holds any request."""

    @property
    def has_ready_work(self) -> bool:
        """Whether a step would do anything now (some request is not waiting for input)."""

    @property
    def has_urgent_work(self) -> bool:
        """Whether its next step should go ahead of other stages' where stages share a thread:
        it gives some request its first chunk of streamed output."""

    @property
    def num_requests(self) -> int:
        """Requests queued or running."""

    def stats(self) -> dict[str, Any]: ...


def run_until_done(engine: Engine, max_steps: int = 1_000_000) -> list[StageResult]:
    """Step until every queued request finished (direct engine use: tests and benchmarks)."""
    results: list[StageResult] = []
    for _ in range(max_steps):
        if not engine.has_unfinished:
            return results
        results.extend(engine.step().finished)
    raise RuntimeError(f"stage {engine.name!r}: not done after {max_steps} steps")
