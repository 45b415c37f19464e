"""EngineCalls: a stage host's calls into its engine, where exceptions become error results.

Every exception a request causes (rejected by `add_request`, a streamed piece that fails, a
step that raises, a failure the engine reports itself) becomes an error `StageResult` for the
requests it concerns, never the stage's end; this is the only place that builds them. A CUDA
error is re-raised instead (omni/host/device_errors.py): it ends the stage.

The host calls these from the thread that steps the engine, under its engine lock; the engine is
passed per call because a threaded host builds it on its loop thread, after this exists.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from omni.engine import Engine
from omni.host.device_errors import fatal_device_error
from omni.host.input_conversion import InputConversion, error_message
from omni.messages import (
    EngineOutput,
    Finished,
    RoutedDelta,
    StageEvent,
    StageInput,
    StageResult,
    StageUpdate,
)

logger = logging.getLogger(__name__)


class EngineCalls:
    def __init__(self, name: str, inputs: InputConversion, pack: Callable[[Any], Any]) -> None:
        """name: the stage's; inputs: the host's input conversion (a finished request's
        streamed pieces end with it); pack: a finished result (or a step's rows) -> the payload
        routed on."""
        self.name = name
        self._inputs = inputs
        self._pack = pack

    def add(self, engine: Engine, stage_input: StageInput) -> StageResult | None:
        """Queue in the engine; a rejected request becomes an error result (None if accepted)."""
        try:
            engine.add_request(stage_input)
        except Exception as e:  # bad input, or an adapter hook tripping on it: this request alone
            if fatal_device_error(e) is not None:
                raise  # the stage's end, not this request's (omni/host/device_errors.py)
            request_id = stage_input.request_id
            why = f"stage {self.name!r} rejected request {request_id!r}: {error_message(e)}"
            return self.error(request_id, why, stage_input.prompt_token_ids)
        return None

    def extend(
        self, engine: Engine, pieces: list[RoutedDelta], started_ids: list[str]
    ) -> list[StageResult]:
        """Hand the engine every piece that is next in its request's upstream order; a piece
        that fails fails its request alone (an error result)."""
        failed = self._inputs.extend(engine, pieces, started_ids)
        return [self.error(request_id, why) for request_id, why in failed]

    def step(self, engine: Engine) -> list[StageEvent]:
        """One engine step. A step that raises fails the requests in flight, never the stage
        (but a CUDA error: device_errors.py); the engine resets its prefix cache, since the
        failed step may have registered blocks whose KV it never wrote."""
        try:
            output: EngineOutput = engine.step()
        except Exception as e:
            if fatal_device_error(e) is not None:
                raise
            logger.exception("stage %r: engine step failed", self.name)
            return [self.failed(r.request_id, e, r.prompt_token_ids) for r in engine.fail_all()]
        for error in output.failed.values():  # an engine that caught a request's error itself
            if fatal_device_error(error) is not None:
                raise error
        events: list[StageEvent] = self._rows_packed(output.updates)
        events.extend(self.finished(r) for r in output.finished)
        events.extend(self.failed(request_id, e) for request_id, e in output.failed.items())
        return events

    def _rows_packed(self, updates: list[StageUpdate]) -> list[StageEvent]:
        """The step's per-token rows leave as one payload (one object under Ray, not one per
        request): the driver forwards it to the consumers, which pick their request's rows."""
        rows = {u.request_id: dict(u.tensors) for u in updates if u.tensors}
        if not rows:
            return list(updates)
        payload = self._pack(rows)
        return [
            dataclasses.replace(
                u, tensors={}, rows=payload, num_rows=next(iter(u.tensors.values())).shape[0]
            )
            if u.tensors
            else u
            for u in updates
        ]

    # ---- results ------------------------------------------------------------------------------
    def finished(self, result: StageResult) -> Finished:
        """The event that a request left the stage (result or error)."""
        self._inputs.end(result.request_id)
        # The routed result is light (no tensors); the payload carries the whole result.
        return Finished(dataclasses.replace(result, tensors={}, audio=None), self._pack(result))

    def failed(self, request_id: str, e: BaseException, prompt_token_ids: Any = ()) -> Finished:
        why = f"stage {self.name!r} failed on request {request_id!r}: {type(e).__name__}: {e}"
        return self.finished(self.error(request_id, why, prompt_token_ids))

    def error(self, request_id: str, why: str, prompt_token_ids: Any = ()) -> StageResult:
        return StageResult(
            request_id=request_id,
            stage=self.name,
            prompt_token_ids=list(prompt_token_ids),
            token_ids=[],
            finish_reason="error",
            error=why,
        )
