"""The contract between the driver and the stages, wherever they run (in-process or in Ray actors).

A backend takes work for a stage (`submit`), hands back every stage's events (`poll`: progress,
finished requests, dead stages) and turns a finished result's payload into the full StageResult
(`fetch`). The routing (omni/driver/router.py) is the same for every backend, so the backends give
identical results. Payloads are opaque to the driver: in-process, the StageResult itself; under
Ray, an ObjectRef of it, so tensors go from stage to stage and reach the driver only when a user's
result is assembled.

Every method may be called from any thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from omni.messages import RoutedDelta, RoutedInput, StageEvent, StageInput, StageResult


class StageBackend(Protocol):
    def submit(self, stage: str, items: Sequence[StageInput | RoutedInput | RoutedDelta]) -> None:
        """Queue work; items that fail validation come back from `poll` as error results."""

    def poll(self, timeout_s: float) -> list[StageEvent]:
        """Events since the last poll; waits up to timeout_s for at least one."""

    def fetch(self, payloads: list[Any]) -> list[StageResult]:
        """The full results (tensors as torch tensors) behind payloads."""

    def abort(self, stage: str, request_ids: list[str]) -> None: ...

    def stats(self) -> dict[str, dict[str, Any]]: ...

    def dead_stages(self) -> dict[str, str]:
        """Stages gone for good -> why (a restarting stage is not dead: it holds its submits)."""

    def shutdown(self) -> None: ...
