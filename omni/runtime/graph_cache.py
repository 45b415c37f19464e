"""Capturing CUDA graphs, and keeping those captured on first use by shape.

`capture_graph` runs a function twice on a side stream (Triton compiles, cuBLAS and cuDNN pick
their kernels, lazy allocations happen), then captures it, in `thread_local` mode (other
stages' threads keep launching meanwhile), and replays it once. Every graph of the project is
captured through it (decode_graphs.py at start-up; token2wav's chunks). `GraphCache`, for graphs
whose shapes depend on what a step batches (token2wav's DiT evaluations and BigVGAN), keeps at most
`max_graphs` entries, the least recently used dropped, all captured into one memory pool; a
capture that fails is logged and turns the cache off (the caller runs eagerly from then on),
unless the stage demanded graphs (`required`). Entries are built by the caller (a graph with its
input buffers, or on the CPU the same buffers run eagerly, which is how the CPU tests check
them).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

import torch

logger = logging.getLogger(__name__)

Entry = TypeVar("Entry")


def capture_graph(run: Callable[[], Any], device: torch.device, pool: Any) -> tuple[Any, Any]:
    """(graph, what `run` returned while captured); `run` must only launch device work."""
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            run()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        output = run()
    # Replayed once here, on the inputs it was captured with: the first launch of a graph also
    # uploads it to the device (paid now, not by the first request of its shape), and a graph
    # that cannot replay fails where the caller falls back to eager steps.
    graph.replay()
    return graph, output


class GraphCache(Generic[Entry]):
    def __init__(self, what: str, *, max_graphs: int = 24, required: bool = False) -> None:
        """what: named in logs (e.g. "token2wav DiT"); required: a failed capture raises."""
        if max_graphs < 1:
            raise ValueError(f"max_graphs must be positive, got {max_graphs}")
        self.what = what
        self.max_graphs = max_graphs
        self.required = required
        self._entries: OrderedDict[Hashable, Entry] = OrderedDict()
        self.pool: Any = None  # one memory pool for every graph, made on the first GPU capture
        self.failure: str | None = None  # why a capture failed: eager from then on
        self.num_captures = 0
        self.capture_s = 0.0

    def get(self, key: Hashable, build: Callable[[], Entry], device: torch.device) -> Entry | None:
        """The entry for `key`, built now if new (`build`, which captures on a GPU); None when
        a capture failed (now or before)."""
        entry = self._entries.pop(key, None)
        if entry is None:
            if self.failure is not None:
                return None
            if len(self._entries) >= self.max_graphs:
                self._entries.popitem(last=False)
            entry = self._build(key, build, device)
            if entry is None:
                return None
        self._entries[key] = entry  # the most recently used last
        return entry

    def _build(
        self, key: Hashable, build: Callable[[], Entry], device: torch.device
    ) -> Entry | None:
        start = time.perf_counter()
        on_gpu = device.type == "cuda"
        try:
            if on_gpu and self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            entry = build()
            if on_gpu:
                torch.cuda.synchronize(device)
        except Exception as e:
            if self.required:
                raise
            self.failure = f"{type(e).__name__}: {e}"
            logger.warning("%s: capture failed, eager from now on (%s)", self.what, e)
            return None
        elapsed = time.perf_counter() - start
        self.capture_s += elapsed
        self.num_captures += 1
        logger.info(
            "%s: %s %s in %.0f ms (%d shapes kept)",
            self.what,
            key,
            "captured" if on_gpu else "buffered (eager)",
            elapsed * 1e3,
            len(self._entries) + 1,
        )
        return entry

    def __len__(self) -> int:
        return len(self._entries)
