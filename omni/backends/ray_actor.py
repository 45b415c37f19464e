"""StageActor: a StageHost in its own Ray actor. It only adapts the host to Ray.

The actor is threaded (max_concurrency > 1): the host's loop thread steps the engine while the
driver's calls (`submit`, `poll`, `abort`, `stats`) run on Ray's call threads, so every stage
computes at the same time as the others and a call never waits for a model step.

Finished results leave as (light result, ObjectRef): the full result, with tensors as numpy arrays
(omni/backends/transport.py), is `ray.put` by this actor, which owns it; the driver passes the ref
on to the consumer stages' actors, whose `submit` fetches it from the object store directly. A
step's per-token rows (step_rows requests) leave the same way, one object per step.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray

from omni.backends import gc_freeze
from omni.backends.transport import (
    pack,
    pack_event,
    pack_result,
    unpack,
    unpack_input,
    unpack_result,
)
from omni.config import StageConfig
from omni.host import Processor, StageHost
from omni.messages import RoutedDelta, RoutedInput, StageEvent, StageInput, StageResult


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

        logging.basicConfig(level=log_level, format=f"%(levelname)s [{config.name}] %(message)s")
        # Ray sets OMP_NUM_THREADS=1 for fractional CPUs; the stage decides its own thread count.
        torch.set_num_threads(config.num_threads)
        self.name = config.name
        self.fetch_timeout_s = fetch_timeout_s
        self.host = StageHost(config, processors, pack=self._put, resolve=self._fetch)
        gc_freeze.freeze_started()  # this actor's process serves from now on

    def ready(self) -> dict[str, Any]:
        """Where this stage runs; returns once the model is loaded."""
        import torch

        context = ray.get_runtime_context()
        return {
            "stage": self.name,
            "node_id": context.get_node_id(),
            "gpu_ids": list(ray.get_gpu_ids()),  # those Ray assigned (CUDA_VISIBLE_DEVICES)
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),  # "": none
            "pid": os.getpid(),
            "torch_threads": torch.get_num_threads(),
        }

    def submit(self, items: list[StageInput | RoutedInput | RoutedDelta]) -> None:
        self.host.submit([unpack_input(item) for item in items])

    def poll(self, timeout_s: float) -> list[StageEvent]:
        return [pack_event(event) for event in self.host.poll(timeout_s)]

    def abort(self, request_ids: list[str]) -> None:
        self.host.abort(request_ids)

    def stats(self) -> dict[str, Any]:
        return {**self.host.stats(), "pid": os.getpid()}

    def shutdown(self) -> None:
        self.host.shutdown()
        gc_freeze.release()

    # One object per result: each request's tensors are fetched (and freed) independently.
    # A step's rows ({request_id: {name: rows}}) are one object for all of its requests.
    @staticmethod
    def _put(value: StageResult | dict[str, Any]) -> Any:
        return ray.put(pack_result(value) if isinstance(value, StageResult) else pack(value))

    def _fetch(self, refs: list[Any]) -> list[Any]:
        try:
            packed = ray.get(refs, timeout=self.fetch_timeout_s)
        except (ray.exceptions.RayError, TimeoutError) as e:
            raise ValueError(
                f"stage {self.name!r}: cannot fetch upstream results: {type(e).__name__}: {e}"
            ) from e
        # Step rows as read-only views: the consumer copies only its request's rows out.
        return [
            unpack_result(r) if isinstance(r, StageResult) else unpack(r, False) for r in packed
        ]
