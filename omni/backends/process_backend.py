"""The processes backend: every stage's host in a process of its own on this machine, spawned
and driven through a pipe (omni/backends/stage_process.py is the child side).

It is the local backend without the shared GIL: a stage steps while the driver thread and the
caller's event loop, in this process, route and deliver what it produced (docs/gpu.md, "Stages
in processes of their own"). Devices are planned as on the local backend: every GPU stage on the
first GPU torch sees. Stages start one at a time, in topological order, each sizing its caches
from what is left of the GPU once the ones before it are in.

Each stage has a reader thread here that receives its events (tensors as numpy arrays, turned
back into torch tensors on arrival, as under Ray) and wakes `poll`. Payloads routed between
stages are the packed results themselves, so a stage's finished result reaches its consumers
through this process. A stage process that exits or whose loop dies is reported once as
`StageDied` and never restarted: its requests fail naming it, later ones fail at once. Every
wait has a timeout; `shutdown` asks each process to stop, then kills what is left.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from omni.backends.stage_process import decode_events, serve
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
JOIN_S = 10.0  # longest wait for a stage process to stop when asked
WAIT_S = 0.5  # how often a wait re-checks that the stage process is still there


@dataclass
class _Stage:
    name: str
    process: Any  # multiprocessing's SpawnProcess
    conn: Any  # our end of the duplex pipe
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    # Held around every wait for the process: two threads reaping one child race (the loser's
    # waitpid fails, and multiprocessing then takes the reaped child for alive).
    wait_lock: threading.Lock = field(default_factory=threading.Lock)
    reader: threading.Thread | None = None
    info: dict[str, Any] = field(default_factory=dict)  # from its "ready" message


class ProcessBackend:
    def __init__(self, config: OmniConfig, processors: dict[str, Processor]) -> None:
        self.config = config
        self.timeout_s = config.runtime.request_timeout_s
        self._context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
        self._cond = threading.Condition()  # guards every attribute below
        self._events: list[StageEvent] = []
        self._dead: dict[str, str] = {}  # stage -> why
        self._replies: dict[int, dict[str, Any]] = {}  # stats call id -> the stage's stats
        self._call_ids = itertools.count()
        self._stopping = False
        self.stages: dict[str, _Stage] = {}
        try:
            for name in config.topological_order():
                self.stages[name] = self._start(config, name, processors)
        except BaseException:
            self.shutdown()
            raise
        logger.info(
            "processes backend: %s",
            ", ".join(
                f"{s.name} (pid {s.info['pid']}, {s.info['device']})" for s in self.stages.values()
            ),
        )

    def _start(self, config: OmniConfig, name: str, processors: dict[str, Processor]) -> _Stage:
        stage_config = config.stage(name)
        mine = {p: processors[p] for p in [stage_config.input_processor] if p is not None}
        conn, child_conn = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=serve,
            args=(child_conn, stage_config, mine, config.runtime.log_level),
            name=f"omni-{name}",
            daemon=True,
        )
        process.start()
        child_conn.close()  # ours closed: the child's exit shows as EOF on our end
        stage = _Stage(name, process, conn)
        deadline = time.monotonic() + self.timeout_s
        while not conn.poll(WAIT_S):
            if not process.is_alive():
                raise RuntimeError(
                    f"stage {name!r}: its process exited with code {process.exitcode} while "
                    "starting (its log above says why)"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"stage {name!r}: not started within {self.timeout_s:g} s "
                    "(runtime.request_timeout_s)"
                )
        message = conn.recv()
        if message[0] == "failed":
            process.join(timeout=JOIN_S)
            raise message[1]
        stage.info = message[1]
        stage.reader = threading.Thread(
            target=self._read, args=(stage,), name=f"omni-{name}-reader", daemon=True
        )
        stage.reader.start()
        return stage

    # ---- what the stages send ---------------------------------------------------------------
    def _read(self, stage: _Stage) -> None:
        """The stage's messages until its pipe closes; then it is dead unless we stopped it."""
        why = f"stage {stage.name!r}: its process exited"
        try:
            while True:
                message = stage.conn.recv()
                kind = message[0]
                if kind == "events":
                    events = decode_events(stage.name, message[1])
                    with self._cond:
                        self._events.extend(events)
                        self._cond.notify_all()
                elif kind == "stats":
                    with self._cond:
                        self._replies[message[1]] = message[2]
                        self._cond.notify_all()
                elif kind == "died":
                    why = message[1]
                    break
        except (EOFError, OSError):
            with self._cond:
                if self._stopping:
                    return  # shutdown's own join reaps it
            with stage.wait_lock:
                stage.process.join(timeout=WAIT_S)
                code = stage.process.exitcode
            why += "" if code is None else f" with code {code}"
        with self._cond:
            if self._stopping or stage.name in self._dead:
                return
            logger.error("%s", why)
            self._dead[stage.name] = why
            self._events.append(StageDied(stage.name, why, restarting=False))
            self._cond.notify_all()

    # ---- StageBackend -------------------------------------------------------------------------
    def submit(self, stage: str, items: Sequence[Item]) -> None:
        with self._cond:
            why = self._dead.get(stage)
            if why is not None:  # work for a dead stage fails at once; its pieces are dropped
                for item in items:
                    if not isinstance(item, RoutedDelta):
                        error = StageResult(item.request_id, stage, [], [], "error", error=why)
                        self._events.append(Finished(error, error))
                self._cond.notify_all()
                return
        self._send(stage, ("submit", [pack_input(item) for item in items]))

    def poll(self, timeout_s: float) -> list[StageEvent]:
        with self._cond:
            self._cond.wait_for(lambda: bool(self._events), timeout=timeout_s)
            out, self._events = self._events, []
        return out

    def fetch(self, payloads: list[Any]) -> list[StageResult]:
        return [unpack_result(payload) for payload in payloads]

    def abort(self, stage: str, request_ids: list[str]) -> None:
        if stage not in self._dead:
            self._send(stage, ("abort", list(request_ids)))

    def stats(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        calls = {}
        for name in self.stages:
            if name in self._dead:
                out[name] = {"stage": name, "error": self._dead[name]}
                continue
            calls[name] = call_id = next(self._call_ids)
            self._send(name, ("stats", call_id))
        deadline = time.monotonic() + self.timeout_s
        for name, call_id in calls.items():
            out[name] = self._reply(name, call_id, deadline)
        return {name: out[name] for name in self.stages}

    def _reply(self, name: str, call_id: int, deadline: float) -> dict[str, Any]:
        def answered() -> bool:
            return call_id in self._replies or name in self._dead

        with self._cond:
            self._cond.wait_for(answered, timeout=max(deadline - time.monotonic(), 0.0))
            reply = self._replies.pop(call_id, None)
            if reply is None:
                why = self._dead.get(name) or f"no answer within {self.timeout_s:g} s"
                raise RuntimeError(f"stage {name!r}: stats failed: {why}")
            return reply

    def dead_stages(self) -> dict[str, str]:
        with self._cond:
            return dict(self._dead)

    def shutdown(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        stages, self.stages = self.stages, {}
        for stage in stages.values():
            try:
                with stage.send_lock:
                    stage.conn.send(("shutdown",))
            except (OSError, ValueError):
                pass  # already gone
        for stage in stages.values():
            with stage.wait_lock:
                stage.process.join(timeout=JOIN_S)
                if stage.process.is_alive():
                    logger.warning("stage %r: did not stop within %g s; killed", stage.name, JOIN_S)
                    stage.process.kill()  # it ignores SIGTERM (stage_process.py)
                    stage.process.join(timeout=JOIN_S)
            stage.conn.close()
            if stage.reader is not None:
                stage.reader.join(timeout=JOIN_S)

    def _send(self, name: str, message: tuple) -> None:
        """To a stage's process; a pipe that broke is the reader's to report (as dead)."""
        stage = self.stages.get(name)
        if stage is None:
            raise RuntimeError(f"stage {name!r}: the pipeline has been shut down")
        try:
            with stage.send_lock:
                stage.conn.send(message)
        except (OSError, ValueError) as e:
            logger.warning("stage %r: send failed (%s); its process is gone", name, e)
