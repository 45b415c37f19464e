"""How the pipeline talks to a stage, wherever it runs: in-process (local) or in a Ray actor.

Both kinds take StageInput batches and hand back StageResult batches; the pipeline's routing
loop is the same for both, so the backends give identical results.
"""

from __future__ import annotations

from typing import Protocol

from omni.config import StageConfig
from omni.outputs import StageInput, StageResult


class StageClient(Protocol):
    name: str

    def submit(self, inputs: list[StageInput]) -> list[StageResult]:
        """Queue requests; those rejected by validation come back at once as error results."""

    def poll(self, timeout_s: float) -> list[StageResult]:
        """Results finished since the last poll (waits up to timeout_s for at least one)."""

    def abort(self, request_ids: list[str]) -> None: ...

    def stats(self) -> dict: ...

    def shutdown(self) -> None: ...


def error_result(stage_input: StageInput, stage: str, error: str) -> StageResult:
    return StageResult(
        request_id=stage_input.request_id,
        stage=stage,
        prompt_token_ids=list(stage_input.prompt_token_ids),
        token_ids=[],
        finish_reason="error",
        error=error,
    )


class LocalStageClient:
    """The engine in this process; `poll` runs one engine step."""

    def __init__(self, config: StageConfig) -> None:
        from omni.engine import StageEngine

        self.name = config.name
        self.engine = StageEngine(config)

    def submit(self, inputs: list[StageInput]) -> list[StageResult]:
        rejected = []
        for stage_input in inputs:
            try:
                self.engine.add_request(stage_input)
            except ValueError as e:
                rejected.append(error_result(stage_input, self.name, f"stage {self.name!r}: {e}"))
        return rejected

    def poll(self, timeout_s: float) -> list[StageResult]:
        if not self.engine.has_unfinished:
            return []
        return self.engine.step()

    def abort(self, request_ids: list[str]) -> None:
        self.engine.abort(request_ids)

    def stats(self) -> dict:
        return self.engine.stats()

    def shutdown(self) -> None:
        pass
