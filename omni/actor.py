"""StageActor: one stage's StageEngine in its own Ray actor, stepping continuously.

The actor is threaded (max_concurrency > 1): a background loop thread steps the engine while it
has work, and the driver's calls (`submit`, `poll`, `abort`, `stats`) run on Ray's call threads
meanwhile. So every stage computes at the same time as the others (stage B on request 1 while
stage A is on request 2), and a call never waits for a model step.

Invariants:
- Only the loop thread touches the engine's requests and steps it; other threads hand work over
  through `_inbox`/`_aborts` and read results from `_outbox`, all guarded by `_cond`; `stats`
  takes `_engine_lock`, which the loop holds for a whole step.
- Finished results leave as (light result, ObjectRef): the full result, with tensors as numpy
  arrays (omni/transport.py), is `ray.put` by this actor, which owns it; the driver passes the ref
  on to the consumer stages' actors, whose `submit` fetches it from the object store directly.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from typing import Any

import ray

from omni.config import StageConfig
from omni.outputs import StageInput, StageResult
from omni.stage_client import (
    Processor,
    RoutedInput,
    add_to_engine,
    build_stage_input,
    error_result,
    step_engine,
)
from omni.transport import light_result, pack_result, unpack_input, unpack_result

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5  # the loop re-checks for shutdown at least this often when idle
ABORTED_IDS_KEPT = 10_000  # how many recent aborts a late submit is checked against


@ray.remote
class StageActor:
    def __init__(
        self,
        config: StageConfig,
        processors: dict[str, Processor],
        *,
        log_level: str = "INFO",
        fetch_timeout_s: float = 600.0,
    ) -> None:
        import torch

        from omni.engine import create_engine

        logging.basicConfig(level=log_level, format=f"%(levelname)s [{config.name}] %(message)s")
        # Ray sets OMP_NUM_THREADS=1 for fractional CPUs; the stage decides its own thread count.
        torch.set_num_threads(config.num_threads)
        self.name = config.name
        self.config = config
        self.processors = processors
        self.fetch_timeout_s = fetch_timeout_s
        self.engine = create_engine(config)
        self._engine_lock = threading.Lock()
        self._cond = threading.Condition()
        self._inbox: list[StageInput] = []
        self._aborts: list[str] = []
        # Recently aborted ids: calls to a threaded actor are not ordered, so a submit can land
        # after the abort of the same request; it is dropped instead of run for nobody.
        self._aborted_ids: OrderedDict[str, None] = OrderedDict()
        self._outbox: list[tuple[StageResult, Any]] = []
        self._stopped = False
        self._loop_error: str | None = None
        self._thread = threading.Thread(target=self._loop, name=f"omni-{self.name}", daemon=True)
        self._thread.start()

    # ---- driver calls -------------------------------------------------------------------------
    def ready(self) -> dict[str, Any]:
        """Where this stage runs; returns once the model is loaded."""
        import torch

        context = ray.get_runtime_context()
        return {
            "stage": self.name,
            "node_id": context.get_node_id(),
            "pid": os.getpid(),
            "torch_threads": torch.get_num_threads(),
        }

    def submit(self, items: list[StageInput | RoutedInput]) -> int:
        """Queue requests. For a routed item the upstream results are fetched from the object
        store here (on a call thread, so the loop keeps stepping) and the input processor runs."""
        accepted: list[StageInput] = []
        for item in items:
            try:
                accepted.append(self._to_stage_input(item))
            except Exception as e:  # one bad item fails alone, never the whole submit
                why = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
                self._emit([error_result(item.request_id, self.name, why)])
        with self._cond:
            self._inbox.extend(s for s in accepted if s.request_id not in self._aborted_ids)
            self._cond.notify_all()
        return len(accepted)

    def poll(self, timeout_s: float) -> list[tuple[StageResult, Any]]:
        """Everything finished since the last poll; waits up to timeout_s for something."""
        with self._cond:
            self._cond.wait_for(lambda: self._outbox or self._stopped, timeout=timeout_s)
            if self._loop_error is not None:
                raise RuntimeError(self._loop_error)
            out, self._outbox = self._outbox, []
        return out

    def abort(self, request_ids: list[str]) -> None:
        dropped = set(request_ids)
        with self._cond:
            self._inbox = [s for s in self._inbox if s.request_id not in dropped]
            self._aborts.extend(request_ids)
            for request_id in request_ids:
                self._aborted_ids[request_id] = None
            while len(self._aborted_ids) > ABORTED_IDS_KEPT:
                self._aborted_ids.popitem(last=False)
            self._cond.notify_all()

    def stats(self) -> dict[str, Any]:
        with self._engine_lock:
            return {**self.engine.stats(), "pid": os.getpid()}

    def shutdown(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    # ---- internals ----------------------------------------------------------------------------
    def _to_stage_input(self, item: StageInput | RoutedInput) -> StageInput:
        item = unpack_input(item)
        if isinstance(item, StageInput):
            return item
        names = list(item.upstream)
        try:
            packed = ray.get([item.upstream[n] for n in names], timeout=self.fetch_timeout_s)
        except (ray.exceptions.RayError, TimeoutError) as e:
            raise ValueError(
                f"stage {self.name!r}: cannot fetch upstream results {names} of request "
                f"{item.request_id!r}: {type(e).__name__}: {e}"
            ) from e
        upstream = {n: unpack_result(r) for n, r in zip(names, packed, strict=True)}
        processor_name = self.config.input_processor
        processor = self.processors[processor_name]
        return build_stage_input(self.name, processor_name, processor, item, upstream)

    def _emit(self, results: list[StageResult]) -> None:
        # One object per result: each request's tensors are fetched (and freed) independently.
        finished = [(light_result(r), ray.put(pack_result(r))) for r in results]
        with self._cond:
            self._outbox.extend(finished)
            self._cond.notify_all()

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    busy = self.engine.has_unfinished
                    if not (busy or self._inbox or self._aborts or self._stopped):
                        self._cond.wait(timeout=IDLE_WAIT_S)
                    if self._stopped:
                        return
                    inbox, self._inbox = self._inbox, []
                    aborts, self._aborts = self._aborts, []
                with self._engine_lock:
                    if aborts:
                        self.engine.abort(aborts)  # aborted results are not reported
                    rejected = [add_to_engine(self.engine, s) for s in inbox]
                    results = [r for r in rejected if r is not None]
                    if self.engine.has_unfinished:
                        results.extend(step_engine(self.engine))
                if results:
                    self._emit(results)
        except BaseException as e:  # the loop must never die silently: poll reports it
            logger.exception("stage %r: engine loop died", self.name)
            with self._cond:
                self._loop_error = f"stage {self.name!r}: engine loop died: {type(e).__name__}: {e}"
                self._stopped = True
                self._cond.notify_all()
