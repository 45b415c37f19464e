"""A two-node `ray.cluster_utils.Cluster` on this machine, connected to and fully torn down, and
leaving it for a while (tests/integration/conftest.py shares one cluster across the session)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import ray

from omni.backends.ray_session import wait_for_processes_gone


@contextlib.contextmanager
def two_node_cluster(
    head_resources: dict[str, float] | None = None,
    node_resources: dict[str, float] | None = None,
) -> Iterator[Any]:
    """Two nodes of 2 CPUs each (plus the given custom resources), with ray.init connected.
    Short paths (Ray's sockets live below them), and RAY_TMPDIR so that the cluster's address
    file goes there too instead of /tmp/ray; no process of it is left afterwards."""
    from ray.cluster_utils import Cluster

    assert not ray.is_initialized(), "another test left Ray connected"
    base = tempfile.mkdtemp(prefix="omni-rc-", dir="/tmp")
    old_tmpdir = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = base
    node_args = {"temp_dir": os.path.join(base, "ray")}
    head = {"num_cpus": 2, "resources": dict(head_resources or {}), **node_args}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        cluster.add_node(num_cpus=2, resources=dict(node_resources or {}), **node_args)
        cluster.wait_for_nodes(timeout=60)
        ray.init(address=cluster.address, logging_level="WARNING")
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        assert wait_for_processes_gone(base, timeout_s=15) == []
        shutil.rmtree(base, ignore_errors=True)
        if old_tmpdir is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = old_tmpdir


@contextlib.contextmanager
def disconnected_from_ray() -> Iterator[None]:
    """Ray not connected inside (a private instance may start and stop there); the connection
    this process had before, if any, restored afterwards."""
    address = ray.get_runtime_context().gcs_address if ray.is_initialized() else None
    ray.shutdown()  # a driver's shutdown: a cluster it was connected to keeps running
    try:
        yield
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if address is not None:
            ray.init(address=address, logging_level="WARNING")
