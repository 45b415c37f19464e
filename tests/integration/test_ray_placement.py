"""Where the stage actors run: fake GPUs on a private Ray instance (each stage gets its own GPU id,
fractions may share one, too many fail at once) and `runtime.placement` pack/spread on a 2-node
cluster (one placement group, a bundle per stage; an unplaceable group is a ConfigError; shutdown
removes the group; a replacement actor goes back into its stage's bundle).

Ray is expensive here (2 cores): the fake GPUs are a private instance (disconnected from the
session's shared cluster for the class); pack/spread use the shared 2-node cluster.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time

import pytest
import ray
import ray.cloudpickle
from ray_cluster_support import disconnected_from_ray
from two_stage_support import two_stage_config

from omni.backends.ray_session import wait_for_processes_gone
from omni.config import ConfigError
from omni.entrypoints.omni import Omni

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

PROMPT = [[5, 6, 7]]
SMALL = {
    "runtime.request_timeout_s": 60,
    "stages.a.resources.num_cpus": 0.5,
    "stages.b.resources.num_cpus": 0.5,
    # Placement is about GPUs: the stages' devices follow their reservations (auto), not the
    # CPU that two_stage_config pins for equality tests. Ray's GPUs here are fake: auto is the
    # CPU inside the actors all the same.
    "stages.a.engine.device": "auto",
    "stages.b.engine.device": "auto",
}


def generate_ok(omni: Omni) -> None:
    (output,) = omni.generate(PROMPT, use_tqdm=False)
    assert output.error is None, output.error


def wait_all_free(timeout_s: float = 30) -> None:
    """Ray returns a killed actor's resources a moment later: wait for the next Omni's check."""
    total = ray.cluster_resources()
    deadline = time.monotonic() + timeout_s
    while True:
        free = ray.available_resources()
        if all(free.get(k, 0.0) >= total[k] - 1e-6 for k in ("CPU", "GPU") if k in total):
            return
        assert time.monotonic() < deadline, f"still held: {free} of {total}"
        time.sleep(0.1)


def assert_removed(pg_id: str) -> None:
    state = ray.util.placement_group_table().get(pg_id, {"state": "REMOVED"})["state"]
    assert state == "REMOVED", state


@pytest.fixture(scope="class")
def gpu_ray():
    with disconnected_from_ray():
        yield from _private_ray_with_fake_gpus()


def _private_ray_with_fake_gpus():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    temp_dir = tempfile.mkdtemp(prefix="omni-rg-", dir="/tmp")
    ray.init(
        num_cpus=2,
        num_gpus=2,
        include_dashboard=False,
        _temp_dir=temp_dir,
        logging_level=logging.WARNING,
    )
    try:
        yield
    finally:
        ray.shutdown()
        assert wait_for_processes_gone(temp_dir, timeout_s=15) == []
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def all_free_before():
    if ray.is_initialized():
        wait_all_free()


@pytest.mark.usefixtures("gpu_ray")
class TestFakeGpus:
    def test_one_gpu_each_distinct(self, qwen2_dir, llama_dir):
        gpus = {"stages.a.resources.num_gpus": 1, "stages.b.resources.num_gpus": 1}
        with Omni(two_stage_config(qwen2_dir, llama_dir, **SMALL, **gpus)) as omni:
            placement = omni.backend.placement
            assert len(placement["a"]["gpu_ids"]) == len(placement["b"]["gpu_ids"]) == 1
            assert placement["a"]["gpu_ids"] != placement["b"]["gpu_ids"]
            stats = omni.stats()
            for name in ("a", "b"):
                assert stats[name]["gpu_ids"] == placement[name]["gpu_ids"]
                assert stats[name]["node_id"] == placement[name]["node_id"]
                assert "pid" in stats[name] and stats[name]["restarts"] == 0
            generate_ok(omni)

    def test_gpu_requests_that_cannot_hold_fail_before_any_actor(self, qwen2_dir, llama_dir):
        cases = {
            "stages.a.resources.num_gpus": (
                {"stages.a.engine.device": "cuda", "stages.a.resources.num_gpus": 0},
                r"is 0 \(no GPU\), but engine.device is cuda",
            ),
            "stages.a.engine.gpu_memory_utilization": (
                {
                    "stages.a.resources.num_gpus": 0.5,
                    "stages.a.engine.gpu_memory_utilization": 0.8,
                },
                "0.8 is more than the 0.5 GPU the stage takes",
            ),
        }
        for field, (overrides, message) in cases.items():
            started = time.monotonic()
            with pytest.raises(ConfigError, match=message) as caught:
                Omni(two_stage_config(qwen2_dir, llama_dir, **{**SMALL, **overrides}))
            assert field in str(caught.value)
            assert time.monotonic() - started < 30  # refused up front, no wait for resources

    def test_half_gpus_may_share_in_a_packed_group(self, qwen2_dir, llama_dir):
        overrides = {
            **SMALL,
            "runtime.placement": "pack",
            "stages.a.resources.num_gpus": 0.5,
            "stages.b.resources.num_gpus": 0.5,
        }
        with Omni(two_stage_config(qwen2_dir, llama_dir, **overrides)) as omni:
            placement = omni.backend.placement
            for name in ("a", "b"):
                assert len(placement[name]["gpu_ids"]) == 1
                assert omni.stats()[name]["gpu_ids"] == placement[name]["gpu_ids"]
            generate_ok(omni)
            assert omni.backend.pg is not None
            pg_id = omni.backend.pg.id.hex()
        assert_removed(pg_id)

    def test_null_num_gpus_is_planned_and_zero_hides_the_gpus(self, qwen2_dir, llama_dir):
        with Omni(two_stage_config(qwen2_dir, llama_dir, **SMALL)) as omni:  # num_gpus null
            placement = omni.backend.placement
            assert [s.resources.num_gpus for s in omni.backend.config.stages] == [0.5, 0.5]
            for name in ("a", "b"):
                assert len(placement[name]["gpu_ids"]) == 1
                assert placement[name]["cuda_visible_devices"] == str(placement[name]["gpu_ids"][0])
        wait_all_free()
        cpu_b = {**SMALL, "stages.b.resources.num_gpus": 0}
        with Omni(two_stage_config(qwen2_dir, llama_dir, **cpu_b)) as omni:
            placement = omni.backend.placement
            assert omni.backend.config.stage("a").resources.num_gpus == 1.0  # all of the GPU
            assert placement["b"]["gpu_ids"] == []
            assert placement["b"]["cuda_visible_devices"] == ""  # torch there sees no GPU
            assert omni.stats()["b"]["device"] == "cpu"
            generate_ok(omni)

    def test_auto_is_the_cpu_in_an_actor_without_gpus_even_if_one_is_visible(self):
        # No CUDA_VISIBLE_DEVICES="" here: resolve_device's own guard, with torch claiming a GPU.
        no_gpu = DeviceProbe.options(num_gpus=0).remote()  # type: ignore[attr-defined]
        one_gpu = DeviceProbe.options(num_gpus=1).remote()  # type: ignore[attr-defined]
        try:
            assert ray.get(no_gpu.resolve.remote("auto"), timeout=60) == "cpu"
            refused = ray.get(no_gpu.resolve.remote("cuda"), timeout=60)
            assert "stages.a.engine.device: is cuda, but this Ray actor reserved no GPU" in refused
            assert ray.get(one_gpu.resolve.remote("auto"), timeout=60) == "cuda:0"
        finally:
            ray.kill(no_gpu)
            ray.kill(one_gpu)

    def test_too_many_gpus_fail_at_once(self, qwen2_dir, llama_dir):
        gpus = {"stages.a.resources.num_gpus": 2, "stages.b.resources.num_gpus": 1}
        started = time.monotonic()
        with pytest.raises(ConfigError, match=r"GPU=3 in total but the cluster has GPU=2"):
            Omni(two_stage_config(qwen2_dir, llama_dir, **SMALL, **gpus))
        assert time.monotonic() - started < 5
        assert ray.available_resources().get("GPU") == 2  # nothing left holding them


@ray.remote
class DeviceProbe:
    def resolve(self, device: str) -> str:
        """resolve_device of a stage asking for `device`, in an actor whose torch claims a GPU
        (as on a GPU node, where Ray 2.60 hides none from an actor that reserved none)."""
        import torch

        from omni.config import load_config
        from omni.engine.device import resolve_device

        torch.cuda.is_available = lambda: True  # this actor's process only
        stage = {"name": "a", "model": "m", "engine": {"device": device}}
        config = load_config({"stages": [stage]}, check_models=False).stages[0]
        try:
            return str(resolve_device(config))
        except ConfigError as e:
            return str(e)


@ray.remote
class Blocker:
    def ping(self) -> None:
        pass


@pytest.fixture(scope="class")
def cluster(ray_cluster):
    return ray_cluster


class TestPlacementGroups:
    def test_spread_puts_stages_on_different_nodes_and_restarts_in_the_bundle(
        self, cluster, qwen2_dir, llama_dir
    ):
        overrides = {**SMALL, "runtime.address": cluster.address, "runtime.placement": "spread"}
        with Omni(two_stage_config(qwen2_dir, llama_dir, **overrides)) as omni:
            backend = omni.backend
            placement = dict(backend.placement)
            assert placement["a"]["node_id"] != placement["b"]["node_id"]
            assert omni.stats()["b"]["node_id"] == placement["b"]["node_id"]
            generate_ok(omni)
            assert backend.pg is not None
            pg_id = backend.pg.id.hex()

            ray.kill(backend.actors["b"], no_restart=True)
            deadline = time.monotonic() + 60
            while backend.num_restarts["b"] == 0 or "b" in backend._held:
                assert time.monotonic() < deadline, "stage b was not restarted"
                time.sleep(0.2)
            assert backend.placement["b"]["pid"] != placement["b"]["pid"]
            assert backend.placement["b"]["node_id"] == placement["b"]["node_id"]
            generate_ok(omni)
        assert_removed(pg_id)

    def test_pack_puts_stages_on_one_node(self, cluster, qwen2_dir, llama_dir):
        overrides = {**SMALL, "runtime.address": cluster.address, "runtime.placement": "pack"}
        with Omni(two_stage_config(qwen2_dir, llama_dir, **overrides)) as omni:
            placement = omni.backend.placement
            assert placement["a"]["node_id"] == placement["b"]["node_id"]
            stats = omni.stats()
            assert stats["a"]["node_id"] == stats["b"]["node_id"] == placement["a"]["node_id"]
            generate_ok(omni)
            assert omni.backend.pg is not None
            pg_id = omni.backend.pg.id.hex()
        assert_removed(pg_id)

    def test_unplaceable_group_is_a_config_error(self, cluster, qwen2_dir, llama_dir):
        # 1.5 of a node's 2 CPUs held elsewhere: 2.5 CPUs are free in all, enough for the
        # stages' 1.5 + 1.0, but no node has room for the 1.0 beside the 1.5.
        blocker = Blocker.options(num_cpus=1.5).remote()  # type: ignore[attr-defined]
        ray.get(blocker.ping.remote(), timeout=60)
        overrides = {
            "runtime.address": cluster.address,
            "runtime.placement": "spread",
            "runtime.request_timeout_s": 2,
            "stages.a.resources.num_cpus": 1.5,
            "stages.b.resources.num_cpus": 1.0,
        }
        started = time.monotonic()
        try:
            with pytest.raises(ConfigError, match=r"placement=spread.*SPREAD.*'CPU': 1\.5"):
                Omni(two_stage_config(qwen2_dir, llama_dir, **overrides))
        finally:
            ray.kill(blocker)
        assert time.monotonic() - started < 15
        table = ray.util.placement_group_table()
        assert all(pg["state"] == "REMOVED" for pg in table.values()), table
