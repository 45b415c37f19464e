"""How the pipeline talks to its stages, wherever they run: in-process (local) or in Ray actors.

A backend takes work for a stage (`submit`), hands back every stage's finished requests (`poll`)
and turns a result's payload into the full StageResult (`fetch`). The routing loop
(omni/routing.py) is the same for every backend, so the backends give identical results.

Payloads are opaque to the router: the local backend's payload is the StageResult itself; the Ray
backend's is an ObjectRef of it in the object store, so tensors go from actor to actor and reach
the driver only when the user's result is assembled.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from omni.config import OmniConfig
from omni.core.sampling_params import SamplingParams
from omni.inputs import PromptInput
from omni.outputs import StageInput, StageResult

logger = logging.getLogger(__name__)

Processor = Callable[[dict[str, StageResult], PromptInput], StageInput]


@dataclass
class RoutedInput:
    """A request for a stage with inputs; the edge's input processor runs where the stage runs."""

    request_id: str
    upstream: dict[str, Any]
    """Upstream stage name -> payload of its result (see the module docstring)."""
    prompt: PromptInput
    """The original request, as the root stages got it."""
    sampling_params: SamplingParams


@dataclass
class Finished:
    """A stage finished a request: a result light enough to route, and the payload with tensors."""

    result: StageResult
    payload: Any


class StageBackend(Protocol):
    def submit(self, stage: str, items: list[StageInput | RoutedInput]) -> None:
        """Queue work; items that fail validation come back from `poll` as error results."""

    def poll(self, timeout_s: float) -> list[Finished]:
        """Results finished since the last poll; waits up to timeout_s for at least one."""

    def fetch(self, payloads: list[Any]) -> list[StageResult]:
        """The full results (tensors as torch tensors) behind payloads."""

    def abort(self, stage: str, request_ids: list[str]) -> None: ...

    def stats(self) -> dict[str, dict]: ...

    def shutdown(self) -> None: ...


def error_result(request_id: str, stage: str, error: str, prompt_token_ids=()) -> StageResult:
    return StageResult(
        request_id=request_id,
        stage=stage,
        prompt_token_ids=list(prompt_token_ids),
        token_ids=[],
        finish_reason="error",
        error=error,
    )


def build_stage_input(
    stage: str, processor_name: str, processor: Processor, item: RoutedInput, upstream: dict
) -> StageInput:
    """Run the edge's input processor; any failure names the request, the stage and the processor."""
    try:
        stage_input = processor(upstream, item.prompt)
        if not isinstance(stage_input, StageInput):
            raise TypeError(f"returned {type(stage_input).__name__}, expected StageInput")
    except Exception as e:  # a broken processor fails this request alone
        raise ValueError(
            f"input processor {processor_name!r} of stage {stage!r} failed on request "
            f"{item.request_id!r}: {type(e).__name__}: {e}"
        ) from e
    # The router owns the request id and the per-stage sampling; the processor owns the rest.
    return dataclasses.replace(
        stage_input, request_id=item.request_id, sampling_params=item.sampling_params
    )


def add_to_engine(engine: Any, stage_input: StageInput) -> StageResult | None:
    """Queue in the engine; a rejected request becomes an error result (None when accepted)."""
    try:
        engine.add_request(stage_input)
    except Exception as e:  # bad input, or an adapter hook tripping on it: this request alone
        why = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
        msg = f"stage {engine.name!r} rejected request {stage_input.request_id!r}: {why}"
        return error_result(stage_input.request_id, engine.name, msg, stage_input.prompt_token_ids)
    return None


def step_engine(engine: Any) -> list[StageResult]:
    """One engine step. A step that raises fails the requests in flight, never the stage:
    they come back as error results naming the stage, and the prefix cache is reset because
    the failed step may have registered blocks whose KV it never wrote."""
    try:
        return engine.step()
    except Exception as e:
        logger.exception("stage %r: engine step failed", engine.name)
        failed = engine.fail_all()
        why = f"{type(e).__name__}: {e}"
        return [
            dataclasses.replace(
                r,
                finish_reason="error",
                error=f"stage {engine.name!r} failed on request {r.request_id!r}: {why}",
            )
            for r in failed
        ]


class LocalBackend:
    """Every stage's engine in this process; `poll` runs one step of each busy engine."""

    def __init__(self, config: OmniConfig, order: list[str], processors: dict[str, Processor]):
        from omni.engine import create_engine

        self.config = config
        self.engines = {name: create_engine(config.stage(name)) for name in order}
        self.processors = processors
        self._pending: list[Finished] = []  # rejected requests, reported by the next poll

    def submit(self, stage: str, items: list[StageInput | RoutedInput]) -> None:
        engine = self.engines[stage]
        for item in items:
            if isinstance(item, RoutedInput):
                name = self.config.stage(stage).input_processor
                try:
                    item = build_stage_input(
                        stage, name, self.processors[name], item, item.upstream
                    )
                except ValueError as e:
                    self._report(error_result(item.request_id, stage, str(e)))
                    continue
            rejected = add_to_engine(engine, item)
            if rejected is not None:
                self._report(rejected)

    def _report(self, result: StageResult) -> None:
        self._pending.append(Finished(result, result))

    def poll(self, timeout_s: float) -> list[Finished]:
        out, self._pending = self._pending, []
        for engine in self.engines.values():
            if engine.has_unfinished:
                out.extend(Finished(r, r) for r in step_engine(engine))
        return out

    def fetch(self, payloads: list[Any]) -> list[StageResult]:
        return list(payloads)

    def abort(self, stage: str, request_ids: list[str]) -> None:
        self.engines[stage].abort(request_ids)

    def stats(self) -> dict[str, dict]:
        return {name: engine.stats() for name, engine in self.engines.items()}

    def shutdown(self) -> None:
        self.engines = {}
