"""Starting a Ray pipeline's stage actors: one per replica, in its placement bundle, and waiting
until each has loaded its model (a failure names the replica; a ConfigError inside the actor,
e.g. a KV pool too big, stays a ConfigError).
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from omni.backends.ray_session import ray_error_cause
from omni.config import ConfigError, OmniConfig
from omni.host import Processor

MAX_CONCURRENCY = 4  # call threads per actor: poll + submit + abort/stats, beside the loop thread


def replica_order(config: OmniConfig) -> list[tuple[str, int]]:
    """(stage, replica index) of every actor, replica-major: each stage's first replica in
    topological order, then the second ones, ... (the placement group's bundle order, so a
    spread group alternates a stage's replicas over the nodes)."""
    order = config.topological_order()
    num = max(config.stage(name).resources.replicas for name in order)
    return [
        (name, i) for i in range(num) for name in order if i < config.stage(name).resources.replicas
    ]


def create_actor(
    config: OmniConfig,
    stage_name: str,
    processors: dict[str, Processor],
    pg: PlacementGroup | None,
    bundle_index: int,
) -> Any:
    """A stage actor for one replica; in its bundle of `pg` when there is one (a replacement
    goes into the same bundle as the actor it replaces)."""
    from omni.backends.ray_actor import StageActor

    stage = config.stage(stage_name)
    mine = {p: processors[p] for p in [stage.input_processor] if p is not None}
    res = stage.resources
    where: dict[str, Any] = {}
    if pg is not None:
        where["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=bundle_index
        )
    if not res.num_gpus:  # Ray 2.60 no longer hides the node's GPUs from such an actor
        where["runtime_env"] = {"env_vars": {"CUDA_VISIBLE_DEVICES": ""}}
    return StageActor.options(  # type: ignore[attr-defined]  # added by @ray.remote
        num_cpus=res.num_cpus,
        num_gpus=res.num_gpus or 0,
        resources=dict(res.custom) or None,
        max_concurrency=MAX_CONCURRENCY,
        **where,
        max_restarts=0,  # the backend replaces dead actors itself (ray_backend.py)
    ).remote(
        stage,
        mine,
        log_level=config.runtime.log_level,
        fetch_timeout_s=config.runtime.request_timeout_s,
    )


def wait_ready(actors: dict[str, Any], timeout_s: float) -> dict[str, dict[str, Any]]:
    """Replica name -> where it runs (StageActor.ready), once every actor has loaded."""
    refs = {actors[name].ready.remote(): name for name in actors}
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    if pending:
        late = sorted(refs[r] for r in pending)
        raise RuntimeError(
            f"stage actor(s) {late} not ready after {timeout_s:g} s "
            "(runtime.request_timeout_s): model loading too slow or resources unavailable"
        )
    placement = {}
    for ref in ready:
        name = refs[ref]
        try:
            placement[name] = ray.get(ref, timeout=timeout_s)
        except ray.exceptions.RayError as e:  # the actor's __init__ raised
            cause = ray_error_cause(e)
            kind, sep, message = cause.partition(": ")
            if sep and kind.rsplit(".", 1)[-1] == "ConfigError":  # e.g. a KV pool too big
                raise ConfigError(message) from e
            raise RuntimeError(f"stage {name!r} failed to start: {cause}") from e
    return placement
