"""The local backend: every stage's host in this process; CPU stages stepped by one thread,
each GPU stage by a thread of its own.

One thread ("omni-stages") builds every stage's engine. Then, by `runtime.stage_threads`:
- auto (default): a stage whose engine computes on a GPU (its resolved `device`, known only
  once built) gets a loop thread of its own (`StageHost.start_loop`), so thinker, talker and
  vocoder GPU work overlaps: while one stage's thread prepares a step or waits for its sampled
  ids, another launches its kernels. The stages on the CPU keep sharing the building thread.
- shared: every stage on the building thread (what auto gives on a CPU-only machine).
- per_stage: every stage on its own thread, the CPU ones too (tests; Ray-like overlap).
A GPU stage on its own thread also launches on a CUDA stream of its own (`runtime.stage_streams`,
null: unless a stage keeps its output cache on the GPU): on one shared stream a talker step
queued behind the vocoder's DiT replays (measured on an H200: 3.8 -> 6.8 ms per code). What
crosses between stages is then host tensors only (host output caches, read after their copies'
events; waveforms and codes on the host), so no hand-off needs an event.

The CPU stages share one stepping thread, not one each: torch's OpenMP runtime keeps a thread
team per calling thread, and once a process has more OpenMP threads than cores, libgomp
throttles their spin-waiting, so every parallel region pays a wake-up (measured on 2 cores: a
vocoder pass 2x slower on a second thread while the main thread has a team). One thread doing
all of the CPU stages' torch work keeps one team, as in a plain in-process loop. That reason
does not hold for GPU work (kernels run on the device; the host threads mostly launch and
wait), hence the split. Which shared host steps next is omni/backends/stage_turns.py: a
vocoder's first chunks first, otherwise turns by stepping time, so the vocoder's long steps do
not hold back the talker's short ones.

Every wait has a timeout (IDLE_WAIT_S, the hosts' own), `shutdown` joins every thread, and a
stage whose loop dies is reported once as `StageDied`, whichever thread stepped it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from omni.backends.stage_turns import StageTurns
from omni.config import OmniConfig
from omni.config.schema import STAGE_THREADS
from omni.host import Processor, StageHost
from omni.messages import RoutedDelta, RoutedInput, StageDied, StageEvent, StageInput, StageResult

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5  # the stepping thread re-checks for shutdown at least this often
JOIN_S = 30.0  # longest wait for the stepping thread at shutdown


def own_thread(stage_threads: str, device_type: str) -> bool:
    """Whether a stage computing on `device_type` ("cpu", "cuda", ...) steps on a thread of its
    own under the `runtime.stage_threads` policy."""
    if stage_threads == "per_stage":
        return True
    return stage_threads == "auto" and device_type != "cpu"


class LocalBackend:
    def __init__(
        self,
        config: OmniConfig,
        processors: dict[str, Processor],
        *,
        stage_threads: str | None = None,
    ) -> None:
        """stage_threads: auto, shared or per_stage (see the module docstring); None takes
        `config.runtime.stage_threads`."""
        self.stage_threads = stage_threads or config.runtime.stage_threads
        if self.stage_threads not in STAGE_THREADS:
            raise ValueError(f"stage_threads must be one of {STAGE_THREADS}, got {stage_threads!r}")
        self._cond = threading.Condition()
        self._num_events = 0  # bumped by the hosts; a poll waits for it to move
        self._num_wakeups = 0  # bumped when work arrives; the stepping thread waits for it
        self._stopped = False
        self.hosts: dict[str, StageHost] = {}
        self._reported_dead: set[str] = set()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(config, processors), name="omni-stages", daemon=True
        )
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            self.shutdown()
            raise self._start_error

    def _run(self, config: OmniConfig, processors: dict[str, Processor]) -> None:
        try:
            for name in config.topological_order():
                self.hosts[name] = StageHost(
                    config.stage(name),
                    processors,
                    on_event=self._notify,
                    on_work=self._wake,
                    threaded=False,
                )
            own = [
                host
                for host in self.hosts.values()
                if own_thread(self.stage_threads, host.engine.device.type)
            ]
            streams = config.own_streams
            for host in own:
                host.start_loop(own_stream=streams)
            if own:
                shared = [name for name in self.hosts if not self.hosts[name].threaded]
                logger.info(
                    "local backend: %s step on threads of their own (%s); %s share one",
                    [host.name for host in own],
                    "GPU stages on CUDA streams of their own" if streams else "one CUDA stream",
                    shared or "none",
                )
        except BaseException as e:  # re-raised in the constructor, on the caller's thread
            self._start_error = e
            return
        finally:
            self._started.set()
        self._step_all()

    def _notify(self) -> None:
        with self._cond:
            self._num_events += 1
            self._cond.notify_all()

    def _wake(self) -> None:
        with self._cond:
            self._num_wakeups += 1
            self._cond.notify_all()

    def _step_all(self) -> None:
        """Step the hosts without a thread of their own one at a time, the one StageTurns picks
        among those with work; with no work anywhere, sleep until some arrives (returns at once
        when every host has its own thread)."""
        shared = {name: host for name, host in self.hosts.items() if not host.threaded}
        if not shared:
            return
        turns = StageTurns(shared)
        while True:
            with self._cond:
                if self._stopped:
                    return
                seen = self._num_wakeups
            hosts = [host for host in shared.values() if host.alive]
            for host in hosts:  # inputs first: a piece of codes may make a first chunk ready
                if host.has_inputs:
                    start = time.perf_counter()
                    host.run_once(step=False)
                    turns.charge(host.name, time.perf_counter() - start)
            ready = [host.name for host in hosts if host.has_work]
            urgent = [host.name for host in hosts if host.name in ready and host.has_urgent_work]
            name = turns.pick(ready, urgent)
            if name is None:
                self._wait_for_work(seen)
                continue
            start = time.perf_counter()
            shared[name].run_once()
            turns.charge(name, time.perf_counter() - start)

    def _wait_for_work(self, seen: int) -> None:
        with self._cond:
            self._cond.wait_for(
                lambda: self._num_wakeups != seen or self._stopped, timeout=IDLE_WAIT_S
            )

    # ---- StageBackend -------------------------------------------------------------------------
    def submit(self, stage: str, items: Sequence[StageInput | RoutedInput | RoutedDelta]) -> None:
        self.hosts[stage].submit(items)

    def poll(self, timeout_s: float) -> list[StageEvent]:
        with self._cond:
            seen = self._num_events
        out = self._drain()
        if not out:
            with self._cond:
                self._cond.wait_for(lambda: self._num_events != seen, timeout=timeout_s)
            out = self._drain()
        return out

    def _drain(self) -> list[StageEvent]:
        out: list[StageEvent] = []
        for name, host in list(self.hosts.items()):
            if host.alive:
                try:
                    out.extend(host.poll(0))
                    continue
                except RuntimeError:  # its loop died since `alive` was read: reported below
                    pass
            if name not in self._reported_dead:  # reported once; its requests are lost
                self._reported_dead.add(name)
                error = host.loop_error or f"stage {name!r}: its loop is gone"
                out.append(StageDied(name, error, restarting=False))
        return out

    def fetch(self, payloads: list[Any]) -> list[StageResult]:
        return list(payloads)

    def abort(self, stage: str, request_ids: list[str]) -> None:
        self.hosts[stage].abort(request_ids)

    def stats(self) -> dict[str, dict[str, Any]]:
        return {name: host.stats() for name, host in self.hosts.items()}

    def dead_stages(self) -> dict[str, str]:
        return {
            name: host.loop_error or f"stage {name!r}: its loop is gone"
            for name, host in self.hosts.items()
            if not host.alive
        }

    def shutdown(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        thread = getattr(self, "_thread", None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=JOIN_S)
        hosts, self.hosts = self.hosts, {}
        for host in hosts.values():
            host.shutdown()  # stops and joins its own loop thread, if it has one
