"""GraphCache on the CPU (entries built without capturing): the least recently used shape is
dropped, a failed build turns the cache off unless required, and captures are counted."""

from __future__ import annotations

import pytest
import torch

from omni.runtime.graph_cache import GraphCache

CPU = torch.device("cpu")


def test_least_recently_used_is_dropped():
    cache: GraphCache[str] = GraphCache("test", max_graphs=2)
    built = []

    def build(key: str):
        return lambda: built.append(key) or f"entry {key}"

    assert cache.get("a", build("a"), CPU) == "entry a"
    assert cache.get("b", build("b"), CPU) == "entry b"
    assert cache.get("a", build("a"), CPU) == "entry a"  # kept: not built again; now newest
    assert cache.get("c", build("c"), CPU) == "entry c"  # drops b, the least recently used
    assert cache.get("a", build("a"), CPU) == "entry a"
    assert cache.get("b", build("b"), CPU) == "entry b"
    assert built == ["a", "b", "c", "b"] and len(cache) == 2 and cache.num_captures == 4
    assert cache.failure is None and cache.capture_s >= 0


def test_a_failed_build_turns_the_cache_off_unless_required():
    def fail() -> str:
        raise RuntimeError("operation not permitted when stream is capturing")

    cache: GraphCache[str] = GraphCache("test")
    assert cache.get("a", fail, CPU) is None
    assert cache.failure is not None and "capturing" in cache.failure
    assert cache.get("b", lambda: "entry b", CPU) is None  # off: nothing more is built
    assert len(cache) == 0 and cache.num_captures == 0
    required: GraphCache[str] = GraphCache("test", required=True)
    with pytest.raises(RuntimeError, match="capturing"):
        required.get("a", fail, CPU)
    with pytest.raises(ValueError, match="max_graphs"):
        GraphCache("test", max_graphs=0)
