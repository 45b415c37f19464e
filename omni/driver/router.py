"""The Router: every live request's progress across the stage graph, the same for every backend.

Root stages get a request's StageInput when it is added. Whenever a stage finishes a request, each
consumer stage whose inputs have all finished gets a RoutedInput (payloads of the upstream results
and the prompt); its edge's input processor runs where that stage runs. A request is complete when
the final stage finishes it, or failed as soon as any stage reports an error for it (or dies, or
makes no progress for runtime.request_timeout_s): its other stages are told to abort it and the
other requests go on.

After every batch of events each advanced request's sink gets one OmniOutput snapshot: per stage,
the tokens so far (partial results) or the finished result. The last snapshot has finished=True.

Data plane: the driver routes payloads (object refs under Ray) and light results only. It
fetches a stage's tensors (`backend.fetch`) only for what the caller gets back: the final
stage's result, or every stage's with runtime.return_tensors=all; other stages' results come
without tensors, which go from stage to stage (a streaming edge's rows too: stream_edges.py). Not thread-safe: the driver calls it under its lock.

Events for requests the router does not track (aborted, failed) are ignored, so a stale result can
never be routed twice. For the same reason a request id the caller reuses runs in the stages under
a fresh id (`id#N`): a stage may still hold a late abort for the id's earlier request, and that
must not drop the new one. Callers only ever see their own id.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections import OrderedDict

from omni.backends.backend import StageBackend
from omni.config import OmniConfig
from omni.core.sampling_params import SamplingParams
from omni.driver.request_state import Decode, RequestState, Sink
from omni.driver.stop_strings import stop_strings_for
from omni.driver.stream_edges import Routed, StreamEdges
from omni.messages import (
    Finished,
    OmniOutput,
    PromptInput,
    RoutedInput,
    StageDied,
    StageEvent,
    StageInput,
    StageResult,
    StageUpdate,
)

logger = logging.getLogger(__name__)

RECENT_IDS_KEPT = 20_000  # at least as many as a stage host remembers aborts (ABORTED_IDS_KEPT)


class Router:
    def __init__(self, config: OmniConfig, backend: StageBackend, decode: Decode) -> None:
        self.config = config
        self.backend = backend
        self.decode = decode
        self.final = config.final_stage.name
        self.order = config.topological_order()
        self.requests: dict[str, RequestState] = {}  # by stage id
        self._live: dict[str, str] = {}  # user id -> stage id
        self._recent: OrderedDict[str, None] = OrderedDict()  # stage ids used lately
        self._reuses = itertools.count(1)
        self._needed_memo: dict[str, set[str]] = {}
        self.streams = StreamEdges(config)
        self.return_all = config.runtime.return_tensors == "all"

    # ---- requests -----------------------------------------------------------------------------
    def add(
        self,
        prompt: PromptInput,
        params: dict[str, SamplingParams],
        sink: Sink,
        *,
        final_stage: str | None = None,
        step_snapshots: bool = True,
        stream_audio: bool = False,
    ) -> None:
        """Start a request in the root stages it needs; final_stage ends it early (e.g. text
        without speech: the stages after it never see it). stream_audio (AsyncOmni.generate's):
        its streaming edges start their consumers before the upstream has finished
        (stream_edges.py); step_snapshots (AsyncOmni.run's): a snapshot after every step. A
        ValueError if its id is live, final_stage is unknown or a stage sets stop strings it
        may not (stop_strings.py), a RuntimeError if a stage it needs is dead."""
        user_id = prompt.request_id
        if user_id in self._live:
            raise ValueError(f"request_id {user_id!r} is already running")
        final = self.final if final_stage is None else final_stage
        if final not in self.order:
            raise ValueError(f"final_stage {final!r} is not a stage; stages: {self.order}")
        needed = self._needed(final)
        stop = stop_strings_for(self.config, params, final, needed)
        dead = [why for stage, why in self.backend.dead_stages().items() if stage in needed]
        if dead:
            raise RuntimeError("; ".join(dead))
        request_id = user_id
        while request_id in self._recent:
            request_id = f"{user_id}#{next(self._reuses)}"
        self._recent[request_id] = None
        while len(self._recent) > RECENT_IDS_KEPT:
            self._recent.popitem(last=False)
        prompt = dataclasses.replace(prompt, request_id=request_id)
        tracked = RequestState(
            prompt, user_id, params, sink, final, step_snapshots=step_snapshots,
            stream_audio=stream_audio, stop=stop,
        )  # fmt: skip
        self.requests[request_id] = tracked
        self._live[user_id] = request_id
        for root in self.config.root_stages:
            if root.name not in needed:
                continue
            stage_input = StageInput(
                request_id,
                list(prompt.prompt_token_ids),
                params[root.name],
                tuple(prompt.mm_inputs),
                prompt.cache_salt,
                dict(prompt.extras),
                step_rows=stream_audio and self.streams.needs_rows(root.name, needed),
            )
            tracked.start(root.name)
            self.backend.submit(root.name, [stage_input])

    def abort(self, user_id: str, reason: str | None = None) -> bool:
        """Stop a request everywhere; False if it is not live. With a reason, its sink gets a
        last snapshot (finish_reason "aborted", error = reason); without one it hears nothing
        more (its listener is the one that left)."""
        request_id = self._live.get(user_id)
        if request_id is None:
            return False
        if reason is not None:
            self.fail(request_id, None, reason, finish_reason="aborted")
            return True
        self._drop(request_id)
        return True

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    # ---- events -------------------------------------------------------------------------------
    def handle(self, events: list[StageEvent]) -> None:
        """Route a batch of events (one submit per consumer), then send each advanced request
        one snapshot."""
        advanced: set[str] = set()
        routed: Routed = {}
        for event in events:
            if isinstance(event, StageDied):
                self._stage_died(event)
            elif isinstance(event, StageUpdate):
                if (
                    self._on_update(event, routed)
                    and self.requests[event.request_id].step_snapshots
                ):
                    advanced.add(event.request_id)
            elif self._on_finished(event, routed):
                advanced.add(event.result.request_id)
        for stage, items in routed.items():
            self.backend.submit(stage, items)
        # Every snapshot built, then all sent: a caller's event loop (request_stream.Outbox) is
        # woken once for them, not again whenever a build lets go of the GIL (detokenizing).
        snapshots = [(r, self._snapshot(r)) for r in advanced if r in self.requests]
        for request_id, output in snapshots:
            self._send(request_id, output)

    def expire(self, timeout_s: float) -> None:
        """Fail requests that made no progress for timeout_s: nothing waits forever."""
        now = time.monotonic()
        for request_id, tracked in list(self.requests.items()):
            if now - tracked.last_progress > timeout_s:
                where = sorted(tracked.inflight)
                self.fail(
                    request_id,
                    None,
                    f"request {tracked.user_id!r}: no progress in stage(s) {where} for "
                    f"{timeout_s:g} s (runtime.request_timeout_s)",
                )

    def fail(
        self, request_id: str, stage: str | None, error: str, finish_reason: str = "error"
    ) -> None:
        """End a request with an error result in `stage`, aborting it in every stage that still
        runs it. `stage` is the one that failed it (reported an error, or died): it holds the
        request no more. None (an abort, a timeout, a shutdown): the result names the earliest
        stage the request is in, and that stage is still running it, so it is aborted too."""
        tracked = self.requests.get(request_id)
        if tracked is None:
            return
        if stage is None:
            stage = min(tracked.inflight, key=self.order.index, default=tracked.final)
        else:
            tracked.inflight.discard(stage)
        self._complete(request_id, tracked.record_failure(stage, error, finish_reason))

    def fail_all(self, error: str) -> None:
        for request_id in list(self.requests):
            self.fail(request_id, None, error)

    def _on_update(self, update: StageUpdate, routed: Routed) -> bool:
        tracked = self.requests.get(update.request_id)
        if tracked is None or update.stage not in tracked.inflight:
            return False  # stale
        tracked.record_update(update)
        if tracked.stop is not None and update.stage == tracked.final:
            root = not self.config.stage(update.stage).inputs
            stopped = tracked.stop_result(root, self.decode)
            if stopped is not None:  # its result is the driver's: the stage runs it no more
                self.backend.abort(update.stage, [update.request_id])
                tracked.record_finished(stopped, None, self.decode)
                self._complete(update.request_id, None)
                return False
        if tracked.stream_audio:
            self.streams.on_update(tracked, update, self._needed(tracked.final), routed)
        return True

    def _on_finished(self, item: Finished, routed: Routed) -> bool:
        request_id, stage = item.result.request_id, item.result.stage
        tracked = self.requests.get(request_id)
        if tracked is None or stage not in tracked.inflight:
            return False  # stale: aborted, failed, or from a replaced actor
        full = item.result  # light: tokens, errors; its tensors stay with the stage
        if stage == tracked.final or self.return_all:  # the caller gets these tensors back
            (full,) = self.backend.fetch([item.payload])
        result = tracked.record_finished(full, item.payload, self.decode)
        if item.result.error is not None:
            self._complete(request_id, result)
            return False
        if tracked.final in tracked.results and not tracked.inflight:
            # Complete once every stage is done: a streamed final stage may finish before an
            # upstream one (a talker that stops early while the thinker is still writing).
            self._complete(request_id, None)
            return False
        if stage == tracked.final:
            return True
        needed = self._needed(tracked.final)
        if tracked.stream_audio:
            self.streams.on_finished(tracked, item.result, item.payload, routed)
        for consumer in self.config.consumers(stage):
            if (
                consumer.name in needed
                and consumer.name not in tracked.streamed
                and all(name in tracked.payloads for name in consumer.inputs)
            ):
                upstream = {name: tracked.payloads[name] for name in consumer.inputs}
                prompt = tracked.routed_prompt()
                routed_input = RoutedInput(
                    request_id, upstream, prompt, tracked.params[consumer.name]
                )
                routed.setdefault(consumer.name, []).append(routed_input)
                tracked.start(consumer.name)
        return True

    def _stage_died(self, event: StageDied) -> None:
        lost = event.request_ids  # None: all of the stage's (else its replica's only)
        for request_id, tracked in list(self.requests.items()):
            if event.stage in tracked.inflight and (lost is None or request_id in lost):
                self.fail(request_id, event.stage, f"request {tracked.user_id!r}: {event.error}")

    def _needed(self, final: str) -> set[str]:
        """The stages a request ending at `final` runs through: `final` and its ancestors."""
        needed = self._needed_memo.get(final)
        if needed is None:
            needed, todo = set(), [final]
            while todo:
                name = todo.pop()
                if name not in needed:
                    needed.add(name)
                    todo.extend(self.config.stage(name).inputs)
            self._needed_memo[final] = needed
        return needed

    # ---- outputs ------------------------------------------------------------------------------
    def _drop(self, request_id: str) -> RequestState:
        tracked = self.requests.pop(request_id)
        del self._live[tracked.user_id]
        for stage in tracked.inflight:
            self.backend.abort(stage, [request_id])  # e.g. a sibling branch of a failed request
        return tracked

    def _complete(self, request_id: str, error: StageResult | None) -> None:
        tracked = self._drop(request_id)
        self._send(request_id, tracked.output(self.order, error), tracked)

    def _snapshot(self, request_id: str) -> OmniOutput:
        return self.requests[request_id].snapshot(self.order, self.decode)

    def _send(
        self, request_id: str, output: OmniOutput, tracked: RequestState | None = None
    ) -> None:
        sink = (tracked or self.requests[request_id]).sink
        try:
            sink(output)
        except Exception:  # a listener that is gone (closed event loop): stop the request
            logger.exception("request %r: its listener failed; aborting it", request_id)
            if request_id in self.requests:
                self._drop(request_id)
