"""The processes backend: every stage's host in a process of its own on this machine, spawned
and driven through a pipe (omni/backends/process_handle.py; stage_process.py is the process's
side).

It is the local backend without the shared GIL: a stage steps while the driver thread and the
caller's event loop, in this process, route and deliver what it produced (docs/gpu.md, "Stages
in processes of their own"). Devices are planned as on the local backend: every GPU stage on the
first GPU torch sees. With GPU stages, stages start one at a time, in topological order, each
sizing its caches from what is left of the GPU once the ones before it are in; without, all at
once.

Each stage's events (tensors as numpy arrays, turned back into torch tensors on arrival, as
under Ray) wake `poll`. Payloads routed between stages are the packed results themselves, so a
stage's finished result reaches its consumers through this process.

Recovery, as on Ray: a stage process that exits or whose loop dies is reported as `StageDied`
(the driver fails the requests in it, naming the stage) and replaced by a fresh process, up to
`runtime.max_stage_restarts` times per stage; work sent to it meanwhile is held and sent once
the new process is ready. Past the limit, or when the replacement fails to start, the stage is
dead: later requests fail at once. Every wait has a timeout; `shutdown` asks each process to
stop, then kills what is left.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import logging
import multiprocessing
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

from omni.backends.process_handle import ProcessHandle
from omni.backends.stage_process import decode_events
from omni.backends.transport import pack_input, unpack_result
from omni.config import OmniConfig
from omni.host import Processor
from omni.messages import (
    Finished,
    RoutedDelta,
    RoutedInput,
    StageDied,
    StageEvent,
    StageInput,
    StageResult,
)

logger = logging.getLogger(__name__)

Item = StageInput | RoutedInput | RoutedDelta


class ProcessBackend:
    def __init__(self, config: OmniConfig, processors: dict[str, Processor]) -> None:
        self.config = config
        self.processors = processors
        self.timeout_s = config.runtime.request_timeout_s
        self.max_restarts = config.runtime.max_stage_restarts
        self._context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
        self._cond = threading.Condition()  # guards every attribute below
        self._events: list[StageEvent] = []
        self._dead: dict[str, str] = {}  # stage -> why
        self._held: dict[str, list[Item]] = {}  # restarting stage -> work sent meanwhile
        self._replies: dict[int, dict[str, Any]] = {}  # stats call id -> the stage's stats
        self._call_ids = itertools.count()
        self._stopping = False
        self.num_restarts = dict.fromkeys(config.topological_order(), 0)
        self.stages: dict[str, ProcessHandle] = {}
        # A caller that exits without shutdown: stop the stages first, so that none is taken for
        # dead and replaced while the interpreter ends (multiprocessing then ends them anyway).
        self._at_exit = functools.partial(_shutdown_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)
        # A GPU stage sizes its caches from what the stages before it left of the GPU, so those
        # start one at a time; without GPU stages every process starts at once.
        one_by_one = any(s.resources.num_gpus for s in config.stages)
        try:
            for name in config.topological_order():
                self.stages[name] = self._spawn(name)
                if one_by_one:
                    self.stages[name].wait_ready(self.timeout_s)
            if not one_by_one:
                for handle in self.stages.values():
                    handle.wait_ready(self.timeout_s)
        except BaseException:
            self.shutdown()
            raise
        started = [f"{h.name} (pid {h.pid}, {h.info['device']})" for h in self.stages.values()]
        logger.info("processes backend: %s", ", ".join(started))
        on_gpu = [h.name for h in self.stages.values() if h.info["device"].startswith("cuda")]
        if len(on_gpu) > 1:
            logger.warning(
                "processes backend: stages %s share one GPU from processes of their own, so "
                "their kernels take turns (no overlap) unless NVIDIA's MPS daemon runs; "
                "runtime.backend local overlaps them (docs/gpu.md)",
                on_gpu,
            )

    def _spawn(self, name: str) -> ProcessHandle:
        stage = self.config.stage(name)
        mine = {p: self.processors[p] for p in [stage.input_processor] if p is not None}
        return ProcessHandle(
            self._context,
            stage,
            mine,
            self.config.runtime.log_level,
            on_message=lambda message: self._on_message(name, message),
            on_exit=self._on_exit,
        )

    # ---- what the stages send (their readers' threads) ----------------------------------------
    def _on_message(self, name: str, message: tuple) -> None:
        if message[0] == "events":
            events = decode_events(name, message[1])
            with self._cond:
                self._events.extend(events)
                self._cond.notify_all()
        elif message[0] == "stats":
            with self._cond:
                self._replies[message[1]] = message[2]
                self._cond.notify_all()

    def _on_exit(self, handle: ProcessHandle, why: str) -> None:
        name = handle.name
        with self._cond:
            if self._stopping or self.stages.get(name) is not handle:
                return
            restarting = self.num_restarts[name] < self.max_restarts
            logger.error("%s%s", why, "; restarting it" if restarting else "")
            if restarting:
                self.num_restarts[name] += 1
                self._held[name] = []
            else:
                limit = f"runtime.max_stage_restarts={self.max_restarts}"
                self._dead[name] = f"{why}; not restarted again ({limit})"
            self._events.append(StageDied(name, why, restarting=restarting))
            self._cond.notify_all()
        handle.stop()  # reaps it (its loop's death ends it on its own)
        if restarting:
            self._restart(name)

    def _restart(self, name: str) -> None:
        try:
            handle = self._spawn(name)
            handle.wait_ready(self.timeout_s)
        except BaseException as e:
            why = f"stage {name!r}: its replacement process failed to start: {e}"
            logger.error("%s", why)
            with self._cond:
                self._held.pop(name, None)  # their requests are failed by this StageDied
                self._dead[name] = why
                self._events.append(StageDied(name, why, restarting=False))
                self._cond.notify_all()
            return
        with self._cond:
            if self._stopping:
                held = None
            else:
                self.stages[name] = handle
                held = self._held.pop(name, [])
        if held is None:
            handle.stop()
        elif held:
            handle.send(("submit", held))

    # ---- StageBackend -------------------------------------------------------------------------
    def submit(self, stage: str, items: Sequence[Item]) -> None:
        wire = [pack_input(item) for item in items]
        with self._cond:
            why = self._dead.get(stage)
            if why is not None:  # work for a dead stage fails at once; its pieces are dropped
                for item in items:
                    if not isinstance(item, RoutedDelta):
                        error = StageResult(item.request_id, stage, [], [], "error", error=why)
                        self._events.append(Finished(error, error))
                self._cond.notify_all()
                return
            if stage in self._held:
                self._held[stage].extend(wire)
                return
            handle = self.stages.get(stage)
        if handle is not None:  # else shut down: the driver fails what is left
            handle.send(("submit", wire))

    def poll(self, timeout_s: float) -> list[StageEvent]:
        with self._cond:
            self._cond.wait_for(lambda: bool(self._events), timeout=timeout_s)
            out, self._events = self._events, []
        return out

    def fetch(self, payloads: list[Any]) -> list[StageResult]:
        return [unpack_result(payload) for payload in payloads]

    def abort(self, stage: str, request_ids: list[str]) -> None:
        with self._cond:
            if stage in self._dead:
                return
            if stage in self._held:
                dropped = set(request_ids)
                self._held[stage] = [i for i in self._held[stage] if i.request_id not in dropped]
                return
            handle = self.stages.get(stage)
        if handle is not None:
            handle.send(("abort", list(request_ids)))

    def stats(self) -> dict[str, dict[str, Any]]:
        """Each stage's, with its restarts; a dead or restarting one: why, as "error"."""
        calls: dict[str, tuple[ProcessHandle, int]] = {}
        out: dict[str, dict[str, Any]] = {}
        with self._cond:
            for name, handle in self.stages.items():
                down = self._dead.get(name) or (
                    f"stage {name!r}: restarting" if name in self._held else None
                )
                if down is not None:
                    out[name] = {"stage": name, "error": down}
                else:
                    calls[name] = (handle, next(self._call_ids))
        # Sent without the lock: the readers take it to hand over what the processes send.
        for handle, call_id in calls.values():
            handle.send(("stats", call_id))
        deadline = time.monotonic() + self.timeout_s
        for name, (_, call_id) in calls.items():
            out[name] = self._reply(name, call_id, deadline)
        return {n: {**out[n], "restarts": self.num_restarts[n]} for n in self.num_restarts}

    def _reply(self, name: str, call_id: int, deadline: float) -> dict[str, Any]:
        def answered() -> bool:
            return call_id in self._replies or name in self._dead or name in self._held

        with self._cond:
            self._cond.wait_for(answered, timeout=max(deadline - time.monotonic(), 0.0))
            reply = self._replies.pop(call_id, None)
            if reply is None:
                why = self._dead.get(name) or (
                    "restarting" if name in self._held else f"no answer in {self.timeout_s:g} s"
                )
                raise RuntimeError(f"stage {name!r}: stats failed: {why}")
            return reply

    def dead_stages(self) -> dict[str, str]:
        """Stages gone for good (a restarting one holds what it is sent)."""
        with self._cond:
            return dict(self._dead)

    def shutdown(self) -> None:
        atexit.unregister(self._at_exit)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            stages, self.stages = self.stages, {}
        for handle in stages.values():
            handle.send(("shutdown",), quiet=True)  # all asked first: they stop together
        for handle in stages.values():
            handle.stop()


def _shutdown_at_exit(backend: weakref.ref[ProcessBackend]) -> None:
    live = backend()
    if live is not None:
        live.shutdown()
