"""The Ray backend: one StageActor per stage, placed by its config's resources, restarted on death.

Waiting (`poll`): every actor always has one outstanding `poll` call; the driver waits on all of
them (and on submits and restarting actors) at once with `ray.wait`. A dead actor makes its
outstanding call fail at once, so a killed stage surfaces within a second.

Recovery: a dead stage is reported as `StageDied` (the driver fails the requests it held, naming
it) and replaced by a fresh actor, up to `runtime.max_stage_restarts` times per stage. Submits
that arrive while the new actor loads its model are held and sent once it is ready, so requests
sent after a death succeed. Past the limit the stage stays dead and new requests fail at once.

Placement (`runtime.placement`): none lets Ray place each actor on its own; pack or spread reserve
one Ray placement group (strategy PACK or SPREAD) with a bundle per stage (its resources), and
each stage's actor, a replacement too, runs in its bundle. shutdown() removes the group.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from omni.backends.ray_placement import check_free, placement_bundles, wait_placed
from omni.backends.ray_session import RaySession, ray_error_cause
from omni.backends.transport import pack_input, unpack_event, unpack_result
from omni.config import ConfigError, OmniConfig, check_resources
from omni.config.devices import plan_gpus
from omni.host import Processor
from omni.messages import RoutedDelta, RoutedInput, StageDied, StageEvent, StageInput, StageResult

logger = logging.getLogger(__name__)

ACTOR_POLL_S = 1.0  # an actor's poll returns at least this often, even with nothing finished
SHUTDOWN_WAIT_S = 5.0  # graceful actor shutdown before ray.kill
MAX_CONCURRENCY = 4  # call threads per actor: poll + submit + abort/stats, beside the loop thread


class RayBackend:
    def __init__(self, config: OmniConfig, processors: dict[str, Processor]) -> None:
        self.config = config
        self.processors = processors
        self.timeout_s = config.runtime.request_timeout_s
        self.max_restarts = config.runtime.max_stage_restarts
        self.session = RaySession(config.runtime)
        self._lock = threading.Lock()  # guards every dict below: any thread may submit or abort
        self.actors: dict[str, Any] = {}
        self.num_restarts = {name: 0 for name in config.stage_names}
        self._polls: dict[Any, str] = {}  # outstanding poll ref -> stage
        self._calls: dict[Any, str] = {}  # outstanding submit ref -> stage
        self._starting: dict[Any, str] = {}  # ready ref of a replacement actor -> stage
        self._held: dict[
            str, list[StageInput | RoutedInput | RoutedDelta]
        ] = {}  # restarting stage -> submits
        self._dead: dict[str, str] = {}  # stage gone for good -> why
        self.pg: PlacementGroup | None = None  # runtime.placement pack/spread
        self._bundle = {name: i for i, name in enumerate(config.topological_order())}
        self.placement: dict[str, dict[str, Any]] = {}
        try:
            # Ray would leave an actor that fits nowhere pending forever: refuse up front.
            nodes = self.session.node_resources()
            num_gpus = sum(n.get("GPU", 0.0) for n in nodes)
            what = f"the Ray cluster has {num_gpus:g} GPUs ({len(nodes)} nodes)"
            self.config = config = plan_gpus(config, num_gpus=num_gpus, what=what)
            check_resources(config, nodes)
            check_free(config, self.session)
            if config.runtime.placement != "none":
                strategy = config.runtime.placement.upper()
                bundles = placement_bundles(config, list(self._bundle))
                self.pg = placement_group(list(bundles.values()), strategy=strategy)
                wait_placed(self.pg, strategy, bundles, self.session, self.timeout_s)
            for name in config.topological_order():
                self.actors[name] = self._create(name)
            self.placement = self._wait_ready()
            for name in self.actors:
                self._start_poll(name)
        except BaseException:
            self.shutdown()
            raise

    def _create(self, name: str) -> Any:
        from omni.backends.ray_actor import StageActor

        stage = self.config.stage(name)
        mine = {p: self.processors[p] for p in [stage.input_processor] if p is not None}
        res = stage.resources
        where: dict[str, Any] = {}
        if self.pg is not None:  # a replacement goes into the same bundle as the first actor
            where["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=self._bundle[name]
            )
        if not res.num_gpus:  # Ray 2.60 no longer hides the node's GPUs from such an actor
            where["runtime_env"] = {"env_vars": {"CUDA_VISIBLE_DEVICES": ""}}
        return StageActor.options(  # type: ignore[attr-defined]  # added by @ray.remote
            num_cpus=res.num_cpus,
            num_gpus=res.num_gpus or 0,
            resources=dict(res.custom) or None,
            max_concurrency=MAX_CONCURRENCY,
            **where,
            max_restarts=0,  # this backend replaces dead actors itself (see the module doc)
        ).remote(
            stage,
            mine,
            log_level=self.config.runtime.log_level,
            fetch_timeout_s=self.timeout_s,
        )

    def _wait_ready(self) -> dict[str, dict[str, Any]]:
        refs = {self.actors[name].ready.remote(): name for name in self.actors}
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=self.timeout_s)
        if pending:
            late = sorted(refs[r] for r in pending)
            raise RuntimeError(
                f"stage actor(s) {late} not ready after {self.timeout_s:g} s "
                "(runtime.request_timeout_s): model loading too slow or resources unavailable"
            )
        placement = {}
        for ref in ready:
            name = refs[ref]
            try:
                placement[name] = ray.get(ref, timeout=self.timeout_s)
            except ray.exceptions.RayError as e:  # the actor's __init__ raised
                cause = ray_error_cause(e)
                kind, sep, message = cause.partition(": ")
                if sep and kind.rsplit(".", 1)[-1] == "ConfigError":  # e.g. a KV pool too big
                    raise ConfigError(message) from e
                raise RuntimeError(f"stage {name!r} failed to start: {cause}") from e
        return placement

    def _start_poll(self, name: str) -> None:
        self._polls[self.actors[name].poll.remote(ACTOR_POLL_S)] = name

    # ---- StageBackend -------------------------------------------------------------------------
    def submit(self, stage: str, items: Sequence[StageInput | RoutedInput | RoutedDelta]) -> None:
        wire = [pack_input(item) for item in items]
        with self._lock:
            if stage in self._held:
                self._held[stage].extend(wire)
                return
            self._calls[self.actors[stage].submit.remote(wire)] = stage

    def poll(self, timeout_s: float) -> list[StageEvent]:
        with self._lock:
            refs = [*self._polls, *self._calls, *self._starting]
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout_s)
        if not ready:
            return []
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        out: list[StageEvent] = []
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

    def _on_poll(self, stage: str, ref: Any) -> list[StageEvent]:
        try:
            batch: list[StageEvent] = ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.RayError as e:  # the actor died, or its host's loop did
            return [self._replace(stage, e)]
        self._start_poll(stage)
        return [unpack_event(event) for event in batch]

    def _replace(self, stage: str, e: BaseException) -> StageDied:
        why = f"stage {stage!r}: its Ray actor died ({type(e).__name__}: {ray_error_cause(e)})"
        logger.error("%s", why)
        with contextlib.suppress(Exception):
            ray.kill(self.actors[stage], no_restart=True)
        self._calls = {r: s for r, s in self._calls.items() if s != stage}
        if self.num_restarts[stage] >= self.max_restarts:
            limit = f"runtime.max_stage_restarts={self.max_restarts}"
            self._dead[stage] = f"{why}; not restarted again ({limit})"
            return StageDied(stage, why, restarting=False)
        self.num_restarts[stage] += 1
        logger.warning("restarting stage %r (restart %d)", stage, self.num_restarts[stage])
        self.actors[stage] = self._create(stage)
        self._starting[self.actors[stage].ready.remote()] = stage
        self._held[stage] = []
        return StageDied(stage, why, restarting=True)

    def _on_restarted(self, stage: str, ref: Any) -> list[StageEvent]:
        held = self._held.pop(stage, [])
        try:
            self.placement[stage] = ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.RayError as e:
            why = f"stage {stage!r}: its replacement actor failed to start: {ray_error_cause(e)}"
            self._dead[stage] = why
            # The held requests are in flight in this stage: the driver fails them on this event.
            return [StageDied(stage, why, restarting=False)]
        self._start_poll(stage)
        if held:
            self._calls[self.actors[stage].submit.remote(held)] = stage
        return []

    def fetch(self, payloads: list[Any]) -> list[StageResult]:
        refs = [p for p in payloads if not isinstance(p, StageResult)]
        try:
            packed = iter(ray.get(refs, timeout=self.timeout_s)) if refs else iter(())
        except ray.exceptions.RayError as e:
            raise RuntimeError(f"fetching stage results failed: {ray_error_cause(e)}") from e
        return [p if isinstance(p, StageResult) else unpack_result(next(packed)) for p in payloads]

    def abort(self, stage: str, request_ids: list[str]) -> None:
        with self._lock:
            if stage in self._held:
                dropped = set(request_ids)
                self._held[stage] = [i for i in self._held[stage] if i.request_id not in dropped]
            elif stage in self.actors and stage not in self._dead:
                self.actors[stage].abort.remote(request_ids)  # fire and forget: best effort

    def stats(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            actors = {n: a for n, a in self.actors.items() if n not in self._dead | self._held}
            dead = dict(self._dead)
            dead.update({n: f"stage {n!r}: restarting" for n in self._held})
        refs = {name: actor.stats.remote() for name, actor in actors.items()}
        out: dict[str, dict[str, Any]] = {
            name: {"stage": name, "error": w} for name, w in dead.items()
        }
        for name, ref in refs.items():
            try:
                where = self.placement.get(name, {})
                out[name] = {
                    **ray.get(ref, timeout=self.timeout_s),
                    "restarts": self.num_restarts[name],
                    "node_id": where.get("node_id"),
                    "gpu_ids": where.get("gpu_ids"),
                }
            except ray.exceptions.RayError as e:
                raise RuntimeError(f"stage {name!r}: stats failed: {ray_error_cause(e)}") from e
        return {name: out[name] for name in self.config.topological_order() if name in out}

    def dead_stages(self) -> dict[str, str]:
        """Stages gone for good (a restarting stage holds its submits instead)."""
        with self._lock:
            return dict(self._dead)

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
        pg, self.pg = self.pg, None
        if pg is not None and ray.is_initialized():
            with contextlib.suppress(Exception):
                remove_placement_group(pg)
        self.session.close()
