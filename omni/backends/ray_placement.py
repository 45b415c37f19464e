"""Before a Ray pipeline's actors start: are its resources free, and its placement group placed.

Ray would leave an actor or a group that fits nowhere pending forever; these turn that into a
ConfigError within a bound (FREE_WAIT_S, or runtime.request_timeout_s for the group).
"""

from __future__ import annotations

import time
from typing import Any

from ray.util.placement_group import PlacementGroup, placement_group

from omni.config import ConfigError, OmniConfig

FREE_WAIT_S = 5.0  # how long a new pipeline waits for resources a shut-down one is freeing
_EPS = 1e-6
MIN_BUNDLE_CPU = 0.001  # a placement group bundle must not be empty: a stage asking for nothing


def check_free(config: OmniConfig, session: Any) -> None:
    """Resources held by other actors (another pipeline not shut down) would leave ours
    pending until the timeout: say so within FREE_WAIT_S. (A pipeline shut down just now may
    still be handing its resources back: Ray frees a killed actor's asynchronously.)"""
    totals: dict[str, float] = {}
    for stage in config.stages:
        for key, amount in stage.resources.as_ray_resources().items():
            totals[key] = totals.get(key, 0.0) + amount * stage.resources.replicas
    deadline = time.monotonic() + FREE_WAIT_S
    while True:
        free = session.available_resources()
        short = [k for k, amount in totals.items() if free.get(k, 0.0) + _EPS < amount]
        if not short or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if short:
        key = short[0]
        raise ConfigError(
            f"the stages request {key}={totals[key]:g} but only {free.get(key, 0.0):g} is "
            "free on the Ray cluster: other actors hold the rest (an Omni that was not shut "
            "down? call shutdown() or use it as a context manager)"
        )


def reserve(
    config: OmniConfig,
    replicas: dict[str, tuple[str, int]],
    session: Any,
    timeout_s: float,
    pgs: list[PlacementGroup],
    bundle_of: dict[str, tuple[int, int]],
) -> None:
    """Reserve the placement groups (`placement_groups`), appending each to `pgs` as soon as it
    exists (the caller removes them, also when this raises), and every replica's
    (group index, bundle index) to `bundle_of`."""
    strategy = config.runtime.placement.upper()
    for group in placement_groups(config, replicas):
        bundles = placement_bundles(config, group)
        pg = placement_group(list(bundles.values()), strategy=strategy)
        pgs.append(pg)
        wait_placed(pg, strategy, bundles, session, timeout_s)
        for i, name in enumerate(group):
            bundle_of[name] = (len(pgs) - 1, i)


def placement_groups(
    config: OmniConfig, replicas: dict[str, tuple[str, int]]
) -> list[dict[str, str]]:
    """The placement groups to reserve, each as replica name -> stage name in bundle order
    (`replicas`: replica name -> (stage, index), in the order to place them). pack: one group.
    spread: one group too, unless a stage has several replicas: then one group per stage,
    since SPREAD puts a group's bundles on distinct nodes first (while there are nodes) but
    gives no such promise for two bundles among many: a stage's replicas land on different
    nodes, and each stage's group on the nodes least used by those placed before it."""
    everything = {name: stage for name, (stage, _) in replicas.items()}
    several = any(config.stage(s).resources.replicas > 1 for s in everything.values())
    if config.runtime.placement == "pack" or not several:
        return [everything]
    groups: dict[str, dict[str, str]] = {}
    for name, stage in everything.items():
        groups.setdefault(stage, {})[name] = stage
    return [groups[stage] for stage in config.topological_order()]


def placement_bundles(config: OmniConfig, stages: dict[str, str]) -> dict[str, dict[str, float]]:
    """Replica name -> its bundle (its stage's resources, no zero entries), in the order of
    `stages` (replica name -> stage name)."""
    bundles = {}
    for name, stage in stages.items():
        wanted = config.stage(stage).resources.as_ray_resources()
        bundles[name] = wanted or {"CPU": MIN_BUNDLE_CPU}
    return bundles


def wait_placed(
    pg: PlacementGroup,
    strategy: str,
    bundles: dict[str, dict[str, float]],
    session: Any,
    timeout_s: float,
) -> None:
    """Wait for the group; else ConfigError. Soft PACK/SPREAD always fit when a placement fits
    at all, so a group that stays pending means the bundles cannot be placed on the nodes' free
    resources (fragmented: each node alone has too little). The caller removes the group."""
    if pg.wait(timeout_seconds=max(1, round(timeout_s))):
        return
    shown = ", ".join(f"{name}: {bundle}" for name, bundle in bundles.items())
    nodes = [_basic(n) for n in session.node_resources()]
    raise ConfigError(
        f"runtime.placement={strategy.lower()}: a {strategy} placement group with the "
        f"bundles {{{shown}}} could not be placed within {timeout_s:g} s "
        f"(runtime.request_timeout_s): no node has room for its share (nodes: {nodes}; "
        f"free in all: {_basic(session.available_resources())})"
    )


def _basic(resources: dict[str, float]) -> dict[str, float]:
    """CPU, GPU and custom resources, without Ray's memory and node-id bookkeeping entries."""
    hidden = ("memory", "object_store_memory")
    return {
        k: round(v, 3)
        for k, v in resources.items()
        if k not in hidden and not k.startswith(("node:", "bundle_group_")) and "_group_" not in k
    }
