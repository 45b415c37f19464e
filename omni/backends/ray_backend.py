"""The Ray backend: one StageActor per stage replica, placed by its config's resources, restarted
on death.

Replicas (`resources.replicas`): each is an actor of its own with its own caches; which one takes
a request, and that every later item of it (streamed pieces, aborts) goes to the same one, is
omni/backends/replica_set.py. A stage with one replica keeps the stage's name everywhere.

Waiting (`poll`): every actor always has one outstanding `poll` call; the driver waits on all of
them (and on submits and restarting actors) at once with `ray.wait`. A dead actor makes its
outstanding call fail at once, so a killed replica surfaces within a second.

Recovery: a dead replica is reported as `StageDied` with the requests it held (the driver fails
those, naming the stage; the other replicas' go on) and replaced by a fresh actor, up to
`runtime.max_stage_restarts` times per replica. While it restarts, new requests go to the other
replicas; a stage with none up holds them and sends them once the new actor is ready. Past the
limit the replica stays dead; once every replica of a stage is, the stage is dead and new
requests needing it fail at once.

Data plane: results and step rows stay in their producer's object store, the driver routes refs;
`driver_bytes` counts the tensor bytes it did receive (`fetch`, audio chunks) per stage.

Placement (`runtime.placement`): none lets Ray place each actor on its own; pack or spread reserve
Ray placement groups (strategy PACK or SPREAD, see ray_placement.placement_groups) with a bundle
per replica (its stage's resources), and each replica's actor, a replacement too, runs in its
bundle. shutdown() removes the groups.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group

from omni.backends.ray_placement import check_free, reserve
from omni.backends.ray_session import RaySession, ray_error_cause
from omni.backends.ray_start import create_actor, replica_order, wait_ready
from omni.backends.replica_set import DEAD, RESTARTING, ReplicaSet, combined_stats
from omni.backends.transport import pack_input, tensor_bytes, unpack_event, unpack_result
from omni.config import OmniConfig, check_resources
from omni.config.devices import plan_gpus
from omni.host import Processor
from omni.messages import (
    Finished,
    RoutedDelta,
    RoutedInput,
    StageDied,
    StageEvent,
    StageInput,
    StageResult,
    StageUpdate,
)

logger = logging.getLogger(__name__)

ACTOR_POLL_S = 1.0  # an actor's poll returns at least this often, even with nothing finished
SHUTDOWN_WAIT_S = 5.0  # graceful actor shutdown before ray.kill

Item = StageInput | RoutedInput | RoutedDelta


class RayBackend:
    def __init__(self, config: OmniConfig, processors: dict[str, Processor]) -> None:
        self.config = config
        self.processors = processors
        self.timeout_s = config.runtime.request_timeout_s
        self.max_restarts = config.runtime.max_stage_restarts
        self.session = RaySession(config.runtime)
        self._lock = threading.Lock()  # guards every dict below: any thread may submit or abort
        routing = config.runtime.replica_routing
        self.replicas = {s.name: ReplicaSet(s, routing) for s in config.stages}
        self._where = {  # replica name -> (stage, index)
            self.replicas[stage].names[i]: (stage, i) for stage, i in replica_order(config)
        }
        self._bundle: dict[str, tuple[int, int]] = {}  # replica -> (group, bundle) in self.pgs
        self.actors: dict[str, Any] = {}  # replica name -> its actor
        self.num_restarts = dict.fromkeys(self._where, 0)
        self._polls: dict[Any, str] = {}  # outstanding ref -> replica: poll, submit, ready
        self._calls: dict[Any, str] = {}
        self._starting: dict[Any, str] = {}  # (of a replacement actor)
        self._held: dict[str, list[Item]] = {}  # restarting replica -> submits
        self._dead: dict[str, str] = {}  # replica gone for good -> why
        self._events: list[StageEvent] = []  # made here: errors for work no replica can take
        self.driver_bytes = dict.fromkeys(self.replicas, 0)  # tensor bytes the driver received
        self.pgs: list[PlacementGroup] = []  # runtime.placement pack/spread
        self.placement: dict[str, dict[str, Any]] = {}
        try:
            # Ray would leave an actor that fits nowhere pending forever: refuse up front.
            nodes = self.session.node_resources()
            num_gpus = sum(n.get("GPU", 0.0) for n in nodes)
            what = f"the Ray cluster has {num_gpus:g} GPUs ({len(nodes)} nodes)"
            self.config = config = plan_gpus(config, num_gpus=num_gpus, what=what)
            check_resources(config, nodes)
            check_free(config, self.session)
            if config.runtime.placement != "none":  # groups kept as made: shutdown removes them
                reserve(config, self._where, self.session, self.timeout_s, self.pgs, self._bundle)
            for name in self._where:
                self.actors[name] = self._create(name)
            self.placement = wait_ready(self.actors, self.timeout_s)
            for name in self.actors:
                self._start_poll(name)
        except BaseException:
            self.shutdown()
            raise

    @property
    def pg(self) -> PlacementGroup | None:
        """The (first) placement group: the only one but for spread with replicas."""
        return self.pgs[0] if self.pgs else None

    def _create(self, replica: str) -> Any:
        group, bundle = self._bundle.get(replica, (0, 0))
        pg = self.pgs[group] if self.pgs else None
        return create_actor(self.config, self._where[replica][0], self.processors, pg, bundle)

    def _start_poll(self, replica: str) -> None:
        self._polls[self.actors[replica].poll.remote(ACTOR_POLL_S)] = replica

    # ---- StageBackend -------------------------------------------------------------------------
    def submit(self, stage: str, items: Sequence[Item]) -> None:
        wire = [pack_input(item) for item in items]
        with self._lock:
            replicas = self.replicas[stage]
            batches: dict[str, list[Item]] = {}
            for item in wire:
                index = replicas.route(item)
                if index is not None:
                    batches.setdefault(replicas.names[index], []).append(item)
                elif not isinstance(item, RoutedDelta):  # a piece of a lost request: dropped
                    why = "; ".join(self._dead[name] for name in replicas.names)
                    error = StageResult(item.request_id, stage, [], [], "error", error=why)
                    self._events.append(Finished(error, error))
            for name, batch in batches.items():
                if name in self._held:
                    self._held[name].extend(batch)
                else:
                    self._calls[self.actors[name].submit.remote(batch)] = name

    def poll(self, timeout_s: float) -> list[StageEvent]:
        with self._lock:
            refs = [*self._polls, *self._calls, *self._starting]
            out, self._events = self._events, []
        if out or not refs:
            return out
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout_s)
        if not ready:
            return []
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        with self._lock:
            for ref in ready:
                if ref in self._calls:
                    del self._calls[ref]
                    with contextlib.suppress(ray.exceptions.RayError):
                        ray.get(ref, timeout=0)  # a dead actor shows up through its poll
                elif ref in self._starting:
                    out.extend(self._on_restarted(self._starting.pop(ref), ref))
                elif ref in self._polls:  # else: shut down meanwhile
                    out.extend(self._on_poll(self._polls.pop(ref), ref))
        return out

    def _on_poll(self, replica: str, ref: Any) -> list[StageEvent]:
        try:
            batch: list[StageEvent] = ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.RayError as e:  # the actor died, or its host's loop did
            return [self._replace(replica, e)]
        self._start_poll(replica)
        events = [unpack_event(event) for event in batch]
        stage = self._where[replica][0]
        for event in events:
            if isinstance(event, Finished):
                self.replicas[stage].release(event.result.request_id)
            elif isinstance(event, StageUpdate):
                self.driver_bytes[stage] += tensor_bytes([event.tensors, event.audio])
        return events

    def _replace(self, replica: str, e: BaseException) -> StageDied:
        stage, index = self._where[replica]
        replicas = self.replicas[stage]
        why = f"stage {replica!r}: its Ray actor died ({type(e).__name__}: {ray_error_cause(e)})"
        logger.error("%s", why)
        with contextlib.suppress(Exception):
            ray.kill(self.actors[replica], no_restart=True)
        self._calls = {r: s for r, s in self._calls.items() if s != replica}
        restarting = self.num_restarts[replica] < self.max_restarts
        lost = replicas.lost(index, RESTARTING if restarting else DEAD)
        # One replica: every request in the stage was in it (as before replicas).
        request_ids = None if replicas.num_replicas == 1 else frozenset(lost)
        if not restarting:
            limit = f"runtime.max_stage_restarts={self.max_restarts}"
            self._dead[replica] = f"{why}; not restarted again ({limit})"
            return StageDied(stage, why, restarting=False, request_ids=request_ids)
        self._held[replica] = []
        self.num_restarts[replica] += 1
        logger.warning("restarting stage %r (restart %d)", replica, self.num_restarts[replica])
        self.actors[replica] = self._create(replica)
        self._starting[self.actors[replica].ready.remote()] = replica
        return StageDied(stage, why, restarting=True, request_ids=request_ids)

    def _on_restarted(self, replica: str, ref: Any) -> list[StageEvent]:
        stage, index = self._where[replica]
        try:
            placement = ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.RayError as e:
            self._held.pop(replica, None)
            why = f"stage {replica!r}: its replacement actor failed to start: {ray_error_cause(e)}"
            self._dead[replica] = why
            lost = self.replicas[stage].lost(index, DEAD)
            request_ids = None if self.replicas[stage].num_replicas == 1 else frozenset(lost)
            # The held requests are in flight in this stage: the driver fails them on this event.
            return [StageDied(stage, why, restarting=False, request_ids=request_ids)]
        # Held from before the restart is counted until the new placement is known: whoever
        # sees the replica no longer held reads its new placement.
        self.placement[replica] = placement
        held = self._held.pop(replica, [])
        self.replicas[stage].restarted(index)
        self._start_poll(replica)
        if held:
            self._calls[self.actors[replica].submit.remote(held)] = replica
        return []

    def fetch(self, payloads: list[Any]) -> list[StageResult]:
        refs = [p for p in payloads if not isinstance(p, StageResult)]
        try:
            packed = iter(ray.get(refs, timeout=self.timeout_s)) if refs else iter(())
        except ray.exceptions.RayError as e:
            raise RuntimeError(f"fetching stage results failed: {ray_error_cause(e)}") from e
        out = [p if isinstance(p, StageResult) else unpack_result(next(packed)) for p in payloads]
        with self._lock:
            for result in out:
                self.driver_bytes[result.stage] += tensor_bytes([result.tensors, result.audio])
        return out

    def abort(self, stage: str, request_ids: list[str]) -> None:
        with self._lock:
            replicas = self.replicas[stage]
            by_replica: dict[str, list[str]] = {}
            for request_id in request_ids:
                index = replicas.release(request_id)  # None: it left the stage already
                if index is not None:
                    by_replica.setdefault(replicas.names[index], []).append(request_id)
            for name, ids in by_replica.items():
                if name in self._held:
                    dropped = set(ids)
                    self._held[name] = [i for i in self._held[name] if i.request_id not in dropped]
                elif name in self.actors and name not in self._dead:
                    self.actors[name].abort.remote(ids)  # fire and forget: best effort

    def stats(self) -> dict[str, dict[str, Any]]:
        """Each stage's; with replicas also each replica's (`stage/i`), the stage's entry then
        their sum (replicas_down lists those not answering: restarting or dead)."""
        with self._lock:
            down = {n: w for n, w in self._dead.items()}
            down.update({n: f"stage {n!r}: restarting" for n in self._held})
            actors = {n: a for n, a in self.actors.items() if n not in down}
            driver_bytes = dict(self.driver_bytes)
        refs = {name: actor.stats.remote() for name, actor in actors.items()}
        each: dict[str, dict[str, Any]] = {n: {"stage": n, "error": w} for n, w in down.items()}
        for name, ref in refs.items():
            try:
                where = self.placement.get(name, {})
                each[name] = {
                    **ray.get(ref, timeout=self.timeout_s),
                    "stage": name,
                    "restarts": self.num_restarts[name],
                    "node_id": where.get("node_id"),
                    "gpu_ids": where.get("gpu_ids"),
                }
            except ray.exceptions.RayError as e:
                raise RuntimeError(f"stage {name!r}: stats failed: {ray_error_cause(e)}") from e
        order = self.config.topological_order()
        return combined_stats([self.replicas[stage] for stage in order], each, down, driver_bytes)

    def dead_stages(self) -> dict[str, str]:
        """Stages with every replica gone for good (a restarting one holds its submits)."""
        with self._lock:
            return {
                stage: "; ".join(self._dead[n] for n in replicas.names)
                for stage, replicas in self.replicas.items()
                if replicas.dead
            }

    def shutdown(self) -> None:
        with self._lock:
            actors, self.actors = self.actors, {}
            self._polls, self._calls, self._starting, self._held = {}, {}, {}, {}
        if actors and ray.is_initialized():
            stops = [a.shutdown.remote() for a in actors.values()]
            ray.wait(stops, num_returns=len(stops), timeout=SHUTDOWN_WAIT_S)
            for actor in actors.values():
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
        pgs, self.pgs = self.pgs, []
        for pg in pgs if ray.is_initialized() else []:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)
        self.session.close()
