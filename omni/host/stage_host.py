"""StageHost: one stage's engine behind a thread-safe inbox and outbox, stepped by its own thread.

The host owns everything a stage does besides moving messages: converting routed inputs and
streamed pieces (the edge's processors, omni/host/input_conversion.py), queueing requests in the
engine, stepping it continuously while it has work, packing results, and turning every exception
into an error result (its engine calls: omni/host/engine_calls.py); a CUDA error ends the stage
instead (omni/host/device_errors.py): the loop stops, `poll` raises, the backend reports it dead.
Backends only move messages: the local backend calls a host directly, the Ray backend wraps the
same host in a thin actor (omni/backends/ray_actor.py) and supplies `pack`/`resolve` so that
tensors travel through the object store.

Invariants:
- Only the loop thread touches the engine's requests and steps it; callers hand work over
  through `_inbox`/`_aborts` and read events from `_outbox`, all guarded by `_cond`. `stats`
  takes `_engine_lock`, which the loop holds for a whole step.
- Calls are not ordered with respect to each other (Ray's call threads), so a submit can land
  after the abort of the same request: recently aborted ids are remembered and such a submit
  is dropped instead of run for nobody.
- A request leaves the host exactly once as a `Finished` (result or error), unless aborted.
- A streaming request's upstream pieces (`RoutedDelta`) reach the engine in upstream order, each
  once: a piece that arrives early (before its request, or before the piece ahead of it) waits.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from omni.config import StageConfig
from omni.engine import Engine, create_engine
from omni.engine.device import stream_priority, use_own_stream
from omni.host.device_errors import fatal_device_error, loop_death
from omni.host.engine_calls import EngineCalls
from omni.host.input_conversion import InputConversion, Processor
from omni.messages import (
    RoutedDelta,
    RoutedInput,
    StageEvent,
    StageInput,
    StageResult,
)

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5  # the loop re-checks for shutdown at least this often when idle
ABORTED_IDS_KEPT = 10_000  # how many recent aborts a late submit is checked against

Item = StageInput | RoutedInput | RoutedDelta


def _same(value: Any) -> Any:
    return value


def _same_list(values: list[Any]) -> list[Any]:
    return list(values)


class StageHost:
    def __init__(
        self,
        config: StageConfig,
        processors: Mapping[str, Processor],
        *,
        pack: Callable[[Any], Any] = _same,
        resolve: Callable[[list[Any]], list[Any]] = _same_list,
        on_event: Callable[[], None] | None = None,
        on_work: Callable[[], None] | None = None,
        engine: Engine | None = None,
        threaded: bool = True,
    ) -> None:
        """pack: a finished result, or a step's rows -> the payload routed to consumers
        (in-process: the value itself); resolve: payloads -> their values; on_event: called
        (from the loop) whenever events are ready, so a backend can wait on many hosts at
        once; on_work: called when work arrives. threaded=False: no loop thread of its own; the owner calls `run_once`
        (the local backend steps all its hosts from one thread). A threaded host builds its
        engine on its loop thread: the thread that loads the model is the one that steps it,
        so the process keeps one OpenMP team (see omni/backends/local.py for why it matters)."""
        self.name = config.name
        self.config = config
        self.processors = processors
        self._inputs = InputConversion(config, processors, resolve)  # and streamed pieces
        self._calls = EngineCalls(self.name, self._inputs, pack)  # exceptions -> error results
        self._on_event = on_event
        self._on_work = on_work
        self._engine_lock = threading.Lock()
        self._cond = threading.Condition()
        self._inbox: list[Item] = []
        self._aborts: list[str] = []
        self._aborted_ids: OrderedDict[str, None] = OrderedDict()
        self._outbox: list[StageEvent] = []
        self._stopped = False
        self.loop_error: str | None = None
        self._fatal_error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.stream: Any | None = None  # the loop thread's own CUDA stream (start_loop)
        if not threaded:
            self.engine = engine or create_engine(config)
            return
        failed: list[BaseException] = []
        ready = threading.Event()

        def build_then_loop() -> None:
            try:
                self.engine = engine or create_engine(config)
            except BaseException as e:  # re-raised below, on the caller's thread
                failed.append(e)
                return
            finally:
                ready.set()
            self._loop()

        self._thread = threading.Thread(target=build_then_loop, name=f"omni-{self.name}")
        self._thread.daemon = True
        self._thread.start()
        ready.wait()
        if failed:
            raise failed[0]

    def start_loop(self, own_stream: bool = False) -> None:
        """A loop thread of its own from now on, for a host built with threaded=False (the
        local backend's GPU stages); before any work is submitted. own_stream: the thread
        launches on a CUDA stream of its own (a GPU stage whose results cross to other stages
        as host tensors only: omni/config/schema.py, `runtime.stage_streams`)."""
        assert self._thread is None, f"stage {self.name!r} already has a loop thread"

        def loop() -> None:
            if own_stream:
                priority = stream_priority(self.config.kind)
                self.stream = use_own_stream(self.engine.device, priority)
            self._loop()

        self._thread = threading.Thread(target=loop, name=f"omni-{self.name}", daemon=True)
        self._thread.start()

    @property
    def threaded(self) -> bool:
        return self._thread is not None

    # ---- calls from any thread ----------------------------------------------------------------
    def submit(self, items: Sequence[Item]) -> None:
        """Queue requests. A routed item's upstream results are resolved and the edge's input
        processor runs on the caller's thread when the host has a loop thread of its own (the
        loop keeps stepping meanwhile), else at its next turn, on the thread that steps it
        (which then does all of the stage's torch work)."""
        queued: list[Item] = list(items)
        failed: list[StageResult] = []
        if self._thread is not None:
            converted, failed = self._convert(queued)
            pieces = self._inputs.with_rows([i for i in queued if isinstance(i, RoutedDelta)])
            queued = [*converted, *pieces]
        with self._cond:
            self._inbox.extend(s for s in queued if s.request_id not in self._aborted_ids)
            self._cond.notify_all()
        self._emit(failed)
        if queued and self._on_work is not None:
            self._on_work()

    def _convert(self, items: Sequence[Item]) -> tuple[list[StageInput], list[StageResult]]:
        """Stage inputs of the (routed) requests among items, and error results of those that
        failed to convert; pieces are left out."""
        accepted, failed = self._inputs.convert(items)
        return accepted, [self._calls.error(request_id, why) for request_id, why in failed]

    def poll(self, timeout_s: float) -> list[StageEvent]:
        """Every event since the last poll; waits up to timeout_s for one. Raises when the loop
        died, so a backend reports a broken stage instead of waiting on it."""
        with self._cond:
            self._cond.wait_for(lambda: self._outbox or self._stopped, timeout=timeout_s)
            if self.loop_error is not None:
                raise RuntimeError(self.loop_error)
            out, self._outbox = self._outbox, []
        return out

    def abort(self, request_ids: list[str]) -> None:
        dropped = set(request_ids)
        with self._cond:
            self._inbox = [s for s in self._inbox if s.request_id not in dropped]
            self._aborts.extend(request_ids)
            for request_id in request_ids:
                self._aborted_ids[request_id] = None
                self._inputs.end(request_id)
            while len(self._aborted_ids) > ABORTED_IDS_KEPT:
                self._aborted_ids.popitem(last=False)
            self._cond.notify_all()
        if self._on_work is not None:
            self._on_work()

    def stats(self) -> dict[str, Any]:
        with self._engine_lock:
            return {**self.engine.stats(), "num_requests": self.engine.num_requests}

    @property
    def alive(self) -> bool:
        if self._thread is not None and not self._thread.is_alive():
            return False
        return self.loop_error is None and not self._stopped

    def shutdown(self, timeout_s: float = 10.0) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout_s)

    # ---- the loop -----------------------------------------------------------------------------
    def _loop(self) -> None:
        while self.run_once(IDLE_WAIT_S):
            pass

    @property
    def has_work(self) -> bool:
        """Whether a turn of the loop would do anything now."""
        return bool(self.engine.has_ready_work or self._inbox or self._aborts)

    @property
    def has_urgent_work(self) -> bool:
        """Whether its next step should go ahead of other stages' (Engine.has_urgent_work)."""
        return self.engine.has_urgent_work

    @property
    def has_inputs(self) -> bool:
        """Whether requests, pieces or aborts wait to be handed to the engine."""
        return bool(self._inbox or self._aborts)

    def run_once(self, wait_s: float = 0.0, *, step: bool = True) -> bool:
        """One turn of the loop: take new requests and aborts, step the engine once if it has
        work, emit what came out. Waits up to wait_s for work first. step=False takes the
        inputs only (a thread shared by stages then sees what work they made). False once
        stopped or dead: the loop must never die silently, so `poll` reports why."""
        try:
            with self._cond:
                if not (self.has_work or self._stopped) and wait_s > 0:
                    self._cond.wait(timeout=wait_s)
                if self._stopped:
                    return False
                inbox, self._inbox = self._inbox, []
                aborts, self._aborts = self._aborts, []
            accepted, failed = self._convert(inbox)
            pieces = [item for item in inbox if isinstance(item, RoutedDelta)]
            calls = self._calls
            with self._engine_lock:
                if aborts:
                    self.engine.abort(aborts)  # aborted requests are not reported
                rejected, started = [], []
                for stage_input in accepted:
                    result = calls.add(self.engine, stage_input)
                    if result is not None:
                        rejected.append(result)
                    elif self._inputs.started(stage_input.request_id):
                        started.append(stage_input.request_id)  # its pieces may flow now
                rejected += calls.extend(self.engine, pieces, started)
                events: list[StageEvent] = [calls.finished(r) for r in failed + rejected]
                if step and self.engine.has_ready_work:
                    events.extend(calls.step(self.engine))
            self._emit_events(events)
            return True
        except BaseException as e:
            logger.exception("stage %r: engine loop died", self.name)
            if fatal_device_error(e) is not None:
                # Kept, never freed: freeing the failed step's tensors on a lost CUDA context
                # can abort the process (their allocator cannot record its stream events).
                self._fatal_error = e
            with self._cond:
                self.loop_error = f"stage {self.name!r}: {loop_death(e)}"
                self._stopped = True
                self._cond.notify_all()
            if self._on_event is not None:
                self._on_event()
            return False

    # ---- results ------------------------------------------------------------------------------
    def _emit(self, results: list[StageResult]) -> None:
        self._emit_events([self._calls.finished(r) for r in results])

    def _emit_events(self, events: list[StageEvent]) -> None:
        if not events:
            return
        with self._cond:
            self._outbox.extend(events)
            self._cond.notify_all()
        if self._on_event is not None:
            self._on_event()
