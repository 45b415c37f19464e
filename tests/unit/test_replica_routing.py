"""ReplicaRouting and ReplicaSet: the prefix hit rate a routing policy gets from two replicas'
prefix caches (each a real KVCacheManager) on a shared-prefix workload, against one replica's;
the load threshold; and a request's pieces and aborts staying with the replica holding it."""

from __future__ import annotations

import random

import pytest

from omni.backends.replica_routing import IMBALANCE_ABS, ReplicaRouting, prefix_hashes
from omni.backends.replica_set import DEAD, RESTARTING, ReplicaSet, summed_stats
from omni.config import load_config
from omni.core.kv_cache_manager import KVCacheManager
from omni.core.request import Request
from omni.messages import PromptInput, RoutedDelta, RoutedInput, StageInput, StageResult

BLOCK = 16


def workload(num_groups: int = 96, per_group: int = 2, seed: int = 0) -> list[list[int]]:
    """Requests in pairs sharing a 256-token prefix (a document asked about twice), each with
    its own 64-token question, shuffled."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(256)] for _ in range(num_groups)]
    out = [p + [rng.randrange(1000) for _ in range(64)] for p in prefixes for _ in range(per_group)]
    rng.shuffle(out)
    return out


def hit_rate(policy: str, num_replicas: int) -> float:
    """Prompt tokens served from the prefix caches, over all prompt tokens: each request runs
    alone (allocated, then freed), so load plays no part."""
    routing = ReplicaRouting(num_replicas, policy, BLOCK)
    caches = [KVCacheManager(num_blocks=4096, block_size=BLOCK) for _ in range(num_replicas)]
    hits = total = 0
    for i, ids in enumerate(workload()):
        replica = routing.pick(ids, None, [0] * num_replicas, [True] * num_replicas)
        cache, request = caches[replica], Request(f"r{i}", ids)
        hit_ids, num_hits = cache.get_computed_blocks(request)
        assert cache.allocate_slots(request, len(ids) - num_hits, num_hits, hit_ids) is not None
        request.num_computed_tokens = len(ids)
        cache.free(request)
        hits, total = hits + num_hits, total + len(ids)
    return hits / total


def test_cache_aware_keeps_one_replicas_hit_rate_and_round_robin_loses_it():
    one = hit_rate("least_loaded", 1)
    aware = hit_rate("cache_aware", 2)
    round_robin = hit_rate("round_robin", 2)
    assert one == pytest.approx(0.4)  # the second of a pair hits 256 of its 320 tokens
    assert aware >= 0.9 * one, (aware, one)
    # Round-robin sends the second of a pair to the other replica about every other time.
    assert round_robin < 0.65 * one, (round_robin, one)


def test_a_much_busier_affinity_replica_loses_the_request_to_the_least_loaded():
    routing = ReplicaRouting(2, "cache_aware", BLOCK)
    ids = list(range(64))
    assert routing.pick(ids, None, [0, 0], [True, True]) == 0
    assert routing.pick(ids, None, [IMBALANCE_ABS, 0], [True, True]) == 0  # at the threshold
    assert routing.pick(ids, None, [IMBALANCE_ABS + 1, 0], [True, True]) == 1  # past it
    # Another salt is another prefix; a replica that is down is never picked.
    assert routing.pick(ids, "other", [1, 0], [True, True]) == 1
    assert routing.pick(ids, None, [0, 9], [False, True]) == 1
    # A prompt without a full block: the least-loaded replica.
    assert routing.pick(ids[: BLOCK - 1], None, [3, 2], [True, True]) == 1


def test_prefix_hashes_chain_and_salt():
    a = prefix_hashes(list(range(40)), None, BLOCK)
    assert len(a) == 2 and a == prefix_hashes(list(range(40)) + [7], None, BLOCK)
    assert prefix_hashes([99, *range(1, 40)], None, BLOCK)[1] != a[1]  # chained
    assert prefix_hashes(list(range(40)), "s", BLOCK)[0] != a[0]


def _replica_set(policy: str = "round_robin") -> ReplicaSet:
    config = load_config(
        {"stages": [{"name": "a", "model": "m", "resources": {"replicas": 2}}]},
        check_models=False,
    )
    return ReplicaSet(config.stage("a"), policy)


def test_pieces_and_aborts_stay_with_the_holding_replica_and_deaths_lose_only_its_requests():
    replicas = _replica_set()
    assert replicas.names == ["a/0", "a/1"]
    first = replicas.route(StageInput("x", [1, 2, 3]))
    prompt = PromptInput("y", [1, 2, 3])
    second = replicas.route(RoutedInput("y", {}, prompt, None))  # type: ignore[arg-type]
    assert {first, second} == {0, 1} and replicas.loads == [1, 1]
    piece = RoutedDelta("y", StageResult("y", "up", [], [4], None), 3)
    assert replicas.route(piece) == second and replicas.loads == [1, 1]
    assert replicas.route(RoutedDelta("gone", piece.piece, 0)) is None
    assert replicas.release("y") == second and replicas.route(piece) is None
    assert replicas.lost(first, RESTARTING) == ["x"] and replicas.loads == [0, 0]
    assert replicas.route(StageInput("z", [1])) == second  # not the restarting one
    replicas.lost(second, DEAD)
    assert replicas.route(StageInput("w", [1])) == first  # restarting: holds it till ready
    replicas.lost(first, DEAD)
    assert replicas.dead and replicas.route(StageInput("v", [1])) is None


def test_replicas_need_the_ray_backend_and_are_at_least_one():
    from omni.config import ConfigError

    stage = {"name": "a", "model": "m", "resources": {"replicas": 2}}
    with pytest.raises(ConfigError, match=r"stages.a.resources.replicas: is 2.*backend ray"):
        load_config({"runtime": {"backend": "local"}, "stages": [stage]}, check_models=False)
    stage["resources"] = {"replicas": 0}
    with pytest.raises(ConfigError, match=r"replicas.*>= 1, got 0"):
        load_config({"stages": [stage]}, check_models=False)


def test_summed_stats_add_counters_and_recompute_ratios():
    entries = [
        {
            "steps": 3,
            "kv_hit_tokens": 10,
            "kv_queried_tokens": 40,
            "kv_hit_rate": 0.25,
            "dtype": "f",
        },
        {
            "steps": 5,
            "kv_hit_tokens": 30,
            "kv_queried_tokens": 40,
            "kv_hit_rate": 0.75,
            "dtype": "f",
        },
    ]
    out = summed_stats("a", entries)
    assert out["steps"] == 8 and out["kv_hit_rate"] == 0.5 and out["dtype"] == "f"
    assert out["replicas"] == 2
