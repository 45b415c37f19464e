"""ReplicaSet: one stage's replicas as a backend sees them: which one holds each request, how
busy each is, which are up, and the stage's stats summed over them.

A request is held by one replica from the submit that starts it there until it leaves (its
Finished event, an abort, or the replica's death): every later item of it (a streamed piece,
an abort) goes to that replica, never another. New requests go where ReplicaRouting says, among
the replicas that are up (alive, not restarting); only when none is up do they go to a restarting
one (which holds them until it is ready), and when every replica is gone for good the stage is.

Torch-free and not thread-safe: the backend calls it under its lock.
"""

from __future__ import annotations

from typing import Any

from omni.backends.replica_routing import ReplicaRouting
from omni.config import StageConfig
from omni.messages import RoutedDelta, RoutedInput, StageInput

UP, RESTARTING, DEAD = "up", "restarting", "dead"


class ReplicaSet:
    def __init__(self, stage: StageConfig, policy: str) -> None:
        self.stage = stage.name
        self.num_replicas = stage.resources.replicas
        # One replica keeps the stage's name (stats, placement and logs as without replicas).
        num = self.num_replicas
        self.names = [stage.name] if num == 1 else [f"{stage.name}/{i}" for i in range(num)]
        self.state = [UP] * self.num_replicas
        self.loads = [0] * self.num_replicas  # requests each holds now
        self.holder: dict[str, int] = {}  # request_id -> the replica holding it
        # Prefix affinity only pays where there is a prefix cache to hit.
        caching = stage.engine.enable_prefix_caching and stage.kind == "ar"
        routing = policy if caching or policy != "cache_aware" else "least_loaded"
        self.routing = ReplicaRouting(self.num_replicas, routing, stage.engine.block_size)

    def route(self, item: StageInput | RoutedInput | RoutedDelta) -> int | None:
        """The replica for an item: its request's holder (a piece), else the routing's pick
        (a new request, which that replica holds from now on). None: nowhere (a piece of a
        request no replica holds any more, or the stage is dead)."""
        if isinstance(item, RoutedDelta):
            return self.holder.get(item.request_id)
        held = self.holder.get(item.request_id)
        if held is not None:  # e.g. submitted twice: keep it in one place
            return held
        up = [s == UP for s in self.state]
        if not any(up):
            up = [s == RESTARTING for s in self.state]
            if not any(up):
                return None
        if isinstance(item, StageInput):
            token_ids, salt = item.prompt_token_ids, item.cache_salt
        else:  # a later stage: its prompt begins with the request's (e.g. the talker's)
            token_ids, salt = item.prompt.prompt_token_ids, item.prompt.cache_salt
        replica = self.routing.pick(token_ids, salt, self.loads, up)
        self.holder[item.request_id] = replica
        self.loads[replica] += 1
        return replica

    def release(self, request_id: str) -> int | None:
        """The request left its replica (finished, failed, aborted): which one held it."""
        replica = self.holder.pop(request_id, None)
        if replica is not None:
            self.loads[replica] -= 1
        return replica

    def lost(self, replica: int, state: str) -> list[str]:
        """The replica died (state: restarting or dead): the requests it held, now lost."""
        self.state[replica] = state
        ids = [r for r, held in self.holder.items() if held == replica]
        for request_id in ids:
            self.release(request_id)
        self.routing.forget(replica)
        return ids

    def restarted(self, replica: int) -> None:
        self.state[replica] = UP

    @property
    def dead(self) -> bool:
        return all(s == DEAD for s in self.state)


# Ratios recomputed from the summed counters (a sum of ratios means nothing).
_RATIOS = {
    "kv_hit_rate": ("kv_hit_tokens", "kv_queried_tokens"),
    "rtf": ("busy_s", "audio_s"),
}


def summed_stats(stage: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """A stage's stats over its replicas' (those that answered): counters summed, ratios
    recomputed, other values kept where every replica agrees; `replicas` counts them."""
    out: dict[str, Any] = {"stage": stage, "replicas": len(entries)}
    keys = {k for e in entries for k in e} - {"stage", "pid", "node_id", "gpu_ids", "error"}
    for key in sorted(keys):
        values = [e[key] for e in entries if key in e]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            out[key] = sum(values)
        elif all(v == values[0] for v in values):
            out[key] = values[0]
    for key, (num, den) in _RATIOS.items():
        if key in out:
            out[key] = out[num] / out[den] if out.get(den) else None
    out.pop("kv_recent_hit_rate", None)  # a window per replica: not summable
    return out


def combined_stats(
    stages: list[ReplicaSet],
    each: dict[str, dict[str, Any]],
    down: dict[str, str],
    driver_bytes: dict[str, int],
) -> dict[str, dict[str, Any]]:
    """Every stage's entry (in `stages` order): a single replica's own; else the sum of those
    up (`replicas_down` naming the others), followed by each replica's as `stage/i`; a stage
    with none up: its error. each: replica name -> its stats (or its error); down: replica
    name -> why; driver_bytes: stage -> tensor bytes the driver received from it."""
    out: dict[str, dict[str, Any]] = {}
    for replicas in stages:
        stage, names = replicas.stage, replicas.names
        live = [each[n] for n in names if n not in down]
        if len(names) == 1:
            entry = each[stage]
        elif live:
            entry = {**summed_stats(stage, live), "replicas_down": [n for n in names if n in down]}
        else:
            entry = {"stage": stage, "error": "; ".join(down[n] for n in names)}
        out[stage] = {**entry, "driver_tensor_bytes": driver_bytes[stage]}
        if len(names) > 1:
            out.update({n: each[n] for n in names})
    return out
