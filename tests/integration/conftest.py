"""Ray for the integration tests: one two-node cluster for the whole session.

Starting Ray costs ~7 s on this 2-core machine and each module used to start its own (six
instances per run). Every module that needs a plain cluster shares this one (it stays connected
until the session ends); a test that needs Ray disconnected (a private instance, fake GPUs) takes
`ray_disconnected`, which reconnects afterwards. Ray is imported lazily: the GPU machine has none.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

# Custom resources the placement, pipeline and replica tests pin stages with.
HEAD_RESOURCES = {"node_a": 1.0, "fake_gpu": 2.0}
NODE_RESOURCES = {"node_b": 1.0, "fake_gpu": 2.0}


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """Two nodes of 2 CPUs each (`node_a`/`node_b`, 2 `fake_gpu` each), this process connected."""
    from ray_cluster_support import two_node_cluster

    with two_node_cluster(HEAD_RESOURCES, NODE_RESOURCES) as cluster:
        yield cluster


@pytest.fixture
def ray_disconnected() -> Iterator[None]:
    """Ray not connected for the test (it may start its own instance and shut it down), the shared
    cluster's connection restored afterwards if there was one."""
    from ray_cluster_support import disconnected_from_ray

    with disconnected_from_ray():
        yield
