"""The routing loop of one Omni.generate()/stream() call, the same for every backend.

Root stages get every request's StageInput. Whenever a stage finishes a request, each consumer
stage whose inputs have all finished gets a RoutedInput (payloads of the upstream results + the
original prompt); its edge's input processor runs where that stage runs. A request is complete
when the final stage finishes it, or failed as soon as any stage reports an error for it: then its
other in-flight stages are told to abort it and the other requests go on.

Results arriving for requests this call does not own (aborted, or from an earlier interrupted
call) are ignored, so a stale result can never be routed twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

from omni.config import OmniConfig
from omni.core.sampling_params import SamplingParams
from omni.inputs import PromptInput
from omni.outputs import OmniOutput, StageInput, StageResult
from omni.stage_client import Finished, RoutedInput, StageBackend

POLL_S = 0.5  # longest single wait on the backend; the no-progress timeout is checked between


class Router:
    def __init__(
        self,
        config: OmniConfig,
        backend: StageBackend,
        requests: list[PromptInput],
        params: dict[str, SamplingParams],
        decode: Callable[[str, list[int]], str | None],
    ) -> None:
        self.config = config
        self.backend = backend
        self.params = params
        self.decode = decode
        self.final = config.final_stage.name
        self.prompts = {r.request_id: r for r in requests}
        self.order = [r.request_id for r in requests]
        self.finished: dict[str, dict[str, Finished]] = {rid: {} for rid in self.prompts}
        self.inflight: dict[str, set[str]] = {rid: set() for rid in self.prompts}
        self.remaining = set(self.prompts)

    def run(self, per_stage: bool = False) -> Iterator[Any]:
        """OmniOutputs as requests complete, or (per_stage) every StageResult as it finishes."""
        timeout = self.config.runtime.request_timeout_s
        try:
            for root in self.config.root_stages:
                inputs = [self._root_input(root.name, self.prompts[rid]) for rid in self.order]
                self.backend.submit(root.name, inputs)
                for rid in self.order:
                    self.inflight[rid].add(root.name)
            last_progress = time.monotonic()
            while self.remaining:
                batch = self.backend.poll(timeout_s=POLL_S)
                if batch:
                    last_progress = time.monotonic()
                elif time.monotonic() - last_progress > timeout:
                    raise TimeoutError(
                        f"no stage finished a request for {timeout:g} s "
                        f"(runtime.request_timeout_s); unfinished: {self._unfinished()}"
                    )
                # Route the whole batch (one submit per consumer) before handing anything out.
                yield from self._handle(batch, per_stage)
        finally:
            self._abort_remaining()

    # ---- internals ----------------------------------------------------------------------------
    def _root_input(self, stage: str, r: PromptInput) -> StageInput:
        return StageInput(
            r.request_id,
            list(r.prompt_token_ids),
            self.params[stage],
            tuple(r.mm_inputs),
            r.cache_salt,
            dict(r.extras),
        )

    def _handle(self, batch: list[Finished], per_stage: bool) -> list[Any]:
        out: list[Any] = []
        routed: dict[str, list[RoutedInput]] = {}
        for item in batch:
            rid, stage = item.result.request_id, item.result.stage
            if rid not in self.remaining or stage not in self.inflight[rid]:
                continue  # stale: aborted, failed or owned by another call
            self.inflight[rid].discard(stage)
            self.finished[rid][stage] = item
            if per_stage:
                out.append(self._full([item])[stage])
            if item.result.error is not None:
                out.extend(self._complete(rid, item.result, per_stage))
                continue
            if stage == self.final:
                out.extend(self._complete(rid, None, per_stage))
                continue
            for consumer in self.config.consumers(stage):
                got = self.finished[rid]
                if all(name in got for name in consumer.inputs):
                    upstream = {name: got[name].payload for name in consumer.inputs}
                    item_in = RoutedInput(
                        rid, upstream, self._routed_prompt(rid), self.params[consumer.name]
                    )
                    routed.setdefault(consumer.name, []).append(item_in)
                    self.inflight[rid].add(consumer.name)
        for stage, items in routed.items():
            self.backend.submit(stage, items)
        return out

    def _routed_prompt(self, rid: str) -> PromptInput:
        """The request as edges see it: without the user's raw prompt (e.g. PIL images) and the
        root stage's large encoder inputs, which downstream stages never read."""
        prompt = self.prompts[rid]
        small = {k: v for k, v in prompt.extras.items() if _nbytes(v) <= ROUTED_EXTRA_MAX_BYTES}
        return dataclasses.replace(prompt, original=None, extras=small)

    def _complete(self, rid: str, error: StageResult | None, per_stage: bool) -> list[Any]:
        self.remaining.discard(rid)
        for stage in self.inflight.pop(rid, set()):
            self.backend.abort(stage, [rid])  # a sibling branch of a failed request
        items = list(self.finished.pop(rid, {}).values())  # unpin its payloads once done
        if per_stage:
            return []
        stages = self._full(items)
        final = stages[error.stage] if error is not None else stages[self.final]
        return [
            OmniOutput(
                request_id=rid,
                stages=stages,
                final=final,
                prompt=self.prompts[rid].original,
                error=error.error if error is not None else None,
            )
        ]

    def _full(self, items: list[Finished]) -> dict[str, StageResult]:
        """Fetch the payloads (tensors) of results and decode their text."""
        fetched = self.backend.fetch([i.payload for i in items])
        for result in fetched:
            if result.token_ids and result.text is None and result.error is None:
                result.text = self.decode(result.stage, result.token_ids)
        return {r.stage: r for r in fetched}

    def _unfinished(self) -> str:
        where = {rid: sorted(self.inflight.get(rid, ())) for rid in sorted(self.remaining)}
        return ", ".join(f"{rid} in {stages}" for rid, stages in list(where.items())[:8])

    def _abort_remaining(self) -> None:
        """On an error or an abandoned stream: nothing this call started keeps running."""
        for rid in list(self.remaining):
            for stage in self.inflight.get(rid, ()):
                with contextlib.suppress(Exception):  # best effort: the stage may be gone
                    self.backend.abort(stage, [rid])
        self.remaining.clear()


ROUTED_EXTRA_MAX_BYTES = 64 << 10


def _nbytes(value: Any) -> int:
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return int(getattr(value, "nbytes", 0))
