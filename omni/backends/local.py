"""The local backend: every stage's host in this process, each stepping on its own thread."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from omni.config import OmniConfig
from omni.host import Processor, StageHost
from omni.messages import RoutedInput, StageDied, StageEvent, StageInput, StageResult


class LocalBackend:
    def __init__(self, config: OmniConfig, processors: dict[str, Processor]) -> None:
        self._cond = threading.Condition()
        self._num_events = 0  # bumped by the hosts; a poll waits for it to move
        self.hosts: dict[str, StageHost] = {}
        self._reported_dead: set[str] = set()
        try:
            for name in config.topological_order():
                self.hosts[name] = StageHost(config.stage(name), processors, on_event=self._notify)
        except BaseException:
            self.shutdown()
            raise

    def _notify(self) -> None:
        with self._cond:
            self._num_events += 1
            self._cond.notify_all()

    def submit(self, stage: str, items: Sequence[StageInput | RoutedInput]) -> None:
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
                out.extend(host.poll(0))
            elif name not in self._reported_dead:  # reported once; its requests are lost
                self._reported_dead.add(name)
                error = host.loop_error or f"stage {name!r}: its loop thread is gone"
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
            name: host.loop_error or f"stage {name!r}: its loop thread is gone"
            for name, host in self.hosts.items()
            if not host.alive
        }

    def shutdown(self) -> None:
        hosts, self.hosts = self.hosts, {}
        for host in hosts.values():
            host.shutdown()
