"""PipelineDriver: the always-on loop that runs every request of one pipeline.

One driver thread waits on the backend and routes what it reports; callers on any thread add
and abort requests. Both hold `_lock` only while touching the router, never while waiting, so a
new request starts in its root stages at once (the caller submits it) and the stages keep
stepping while the driver routes. Every request ends with exactly one finished snapshot: its
result, an error naming the stage, a timeout, or a shutdown, so no listener waits forever.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from omni.backends import gc_freeze
from omni.backends.backend import StageBackend
from omni.config import OmniConfig
from omni.config.devices import plan_gpus
from omni.core.sampling_params import SamplingParams
from omni.driver import deliveries
from omni.driver.request_state import Decode, Sink
from omni.driver.router import Router
from omni.host import Processor
from omni.messages import PromptInput
from omni.registry import get_input_processor

logger = logging.getLogger(__name__)

POLL_S = 0.5  # longest single wait on the backend; timeouts and shutdown are checked between
EXPIRE_EVERY_S = 1.0


def start_backend(config: OmniConfig) -> StageBackend:
    # Processors are resolved here, where they were registered, and shipped to the stages:
    # a stage actor need not import the module that registered its processor.
    processors: dict[str, Processor] = {
        s.input_processor: get_input_processor(s.input_processor)
        for s in config.stages
        if s.input_processor is not None
    }
    if config.runtime.backend in ("local", "processes"):
        import torch

        num_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        config = plan_gpus(config, num_gpus=num_gpus, what="torch sees no CUDA GPU on this machine")
        if config.runtime.backend == "processes":
            from omni.backends.process_backend import ProcessBackend

            return ProcessBackend(config, processors)
        from omni.backends.local import LocalBackend

        return LocalBackend(config, processors)
    from omni.backends.ray_backend import RayBackend

    return RayBackend(config, processors)


class PipelineDriver:
    def __init__(self, config: OmniConfig, decode: Decode) -> None:
        self.config = config
        self.backend = start_backend(config)
        self.router = Router(config, self.backend, decode)
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.error: str | None = None
        self._thread = threading.Thread(target=self._loop, name="omni-driver", daemon=True)
        self._thread.start()
        gc_freeze.freeze_started()  # the stages are built: start-up objects out of GC's way
        self._frozen = True

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
        with self._lock:
            self._check_running()
            self.router.add(
                prompt,
                params,
                sink,
                final_stage=final_stage,
                step_snapshots=step_snapshots,
                stream_audio=stream_audio,
            )

    def abort(self, request_id: str, reason: str | None = None) -> bool:
        with self._lock:
            return self.router.abort(request_id, reason)

    @property
    def num_requests(self) -> int:
        return self.router.num_requests

    def stats(self) -> dict[str, dict[str, Any]]:
        self._check_running()
        return self.backend.stats()

    def check_health(self) -> list[str]:
        """RuntimeError naming what is broken: the driver loop, a dead stage (no replica
        left), an unreachable one. Else the replicas that are down (restarting or dead) while
        their stage has others serving, each with why."""
        self._check_running()
        dead = self.backend.dead_stages()
        if dead:
            raise RuntimeError("; ".join(dead.values()))
        down = []
        for name, stats in self.backend.stats().items():  # raises naming an unreachable stage
            if "error" in stats and "/" not in name:  # a stage, not one of its replicas
                raise RuntimeError(str(stats["error"]))
            if "error" in stats:
                down.append(str(stats["error"]))
        return down

    def shutdown(self) -> None:
        """Stop the loop, end every live request with an error, then stop the stages."""
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=POLL_S * 4 + 10)
        with self._lock:
            self.router.fail_all("the pipeline was shut down")
        try:
            self.backend.shutdown()
        finally:
            if self._frozen:
                self._frozen = False
                gc_freeze.release()

    def _check_running(self) -> None:
        if self.error is not None:
            raise RuntimeError(self.error)
        if self._stopped.is_set():
            raise RuntimeError("this pipeline has been shut down")

    def _loop(self) -> None:
        timeout = self.config.runtime.request_timeout_s
        next_expire = time.monotonic() + EXPIRE_EVERY_S
        try:
            while not self._stopped.is_set():
                events = self.backend.poll(POLL_S)
                with self._lock, deliveries.batch():  # listeners woken once per batch
                    if events:
                        self.router.handle(events)
                    if time.monotonic() >= next_expire:
                        self.router.expire(timeout)
                        next_expire = time.monotonic() + EXPIRE_EVERY_S
        except BaseException as e:  # never die silently: every listener hears why
            logger.exception("omni driver loop died")
            self.error = f"the pipeline's driver loop died: {type(e).__name__}: {e}"
            with self._lock:
                self.router.fail_all(self.error)
