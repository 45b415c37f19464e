"""What a GPU stage's memory holds besides its KV pool, measured once before the pool is sized.

A stage's share of this process's GPU allocations is measured against a baseline taken before
its adapter loads its weights. On the local backend every stage lives in one process, so the
process-wide counters also hold the earlier stages' weights, KV pools and output caches; only
the difference is this stage's own.

Readings, all of this process's torch allocations on the stage's GPU:
- baseline: allocated before the adapter loads (earlier stages' memory; 0 for a model handed to
  the engine already loaded, which then counts everything the process holds as its own);
- loaded: allocated after loading, with temporaries dropped (baseline + this stage's weights
  and buffers);
- max_allocated: the peak of one profiled step of the largest shape the scheduler can make,
  plus whatever else the adapter may run (its encoders on one item of the largest size), with a
  temporary KV pool for that step.
So weights = loaded - baseline and activations = max_allocated - loaded - temporary KV bytes
(`split_profile`). A stage whose steps are replayed as CUDA graphs also holds their memory pool
(the intermediates of the largest captured shape, each graph's outputs) and static buffers from
start-up on. Graphs bake in the addresses of the KV pool, so they can only be captured after it
is allocated; the profile therefore captures them once on a temporary pool (the trial's
`capture`), reads what the allocator reserved for them (`graph_bytes`), and drops them.
`measure_footprint` takes the readings through callables (`GpuReadings`), so the arithmetic and
its wiring are tested on the CPU; `profile_stage` is the CUDA instance.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageFootprint:
    """A GPU stage's memory besides its KV pool and output cache."""

    weights_bytes: int
    """Held between steps: what loading the adapter allocated (weights, buffers)."""
    activation_bytes: int
    """The most one step allocates on top, and frees again (activations, logits, sampling)."""
    reserved_bytes: int
    """What the adapter may come to hold between steps beyond its weights (e.g. an encoder
    cache), declared by the adapter, not measured."""
    graph_bytes: int
    """Held from start-up on by the stage's CUDA graphs (their pool, static buffers, scratch KV
    blocks), measured by a trial capture; 0 when its steps stay eager."""
    free_bytes: int
    """The GPU's free memory after profiling, with the caching allocator emptied."""
    total_bytes: int
    """The GPU's whole memory."""

    @property
    def peak_bytes(self) -> int:
        """The stage's most at any time, without its KV pool: weights, reserve, graphs and one
        step."""
        return self.weights_bytes + self.reserved_bytes + self.graph_bytes + self.activation_bytes


@dataclass(frozen=True)
class GpuReadings:
    """The allocator readings and actions a profile needs, as callables (tests inject them)."""

    allocated: Callable[[], int]
    """Bytes this process's tensors hold on the GPU now."""
    max_allocated: Callable[[], int]
    """The most `allocated` was since the last `reset_peak`."""
    reserved: Callable[[], int]
    """Bytes the allocator holds from the GPU now, CUDA graphs' private pools included."""
    reset_peak: Callable[[], None]
    release: Callable[[], None]
    """Wait for the GPU, drop unreferenced tensors and hand the allocator's unused cache back."""
    mem_info: Callable[[], tuple[int, int]]
    """(free, total) bytes of the GPU, every process's allocations counted."""

    @classmethod
    def of(cls, device: torch.device) -> GpuReadings:
        def release() -> None:
            torch.cuda.synchronize(device)
            gc.collect()
            torch.cuda.empty_cache()

        def mem_info() -> tuple[int, int]:
            free, total = torch.cuda.mem_get_info(device)
            return int(free), int(total)

        return cls(
            allocated=lambda: int(torch.cuda.memory_allocated(device)),
            max_allocated=lambda: int(torch.cuda.max_memory_allocated(device)),
            reserved=lambda: int(torch.cuda.memory_reserved(device)),
            reset_peak=lambda: torch.cuda.reset_peak_memory_stats(device),
            release=release,
            mem_info=mem_info,
        )


def allocated_bytes(device: torch.device) -> int:
    """This process's torch allocations on `device` now (0 off a GPU): a stage's baseline.
    Garbage is collected first, as the profile's readings do (GpuReadings.release): tensors
    that only a reference cycle held would otherwise count in the baseline and be gone by the
    reading after the load, which then comes out below it."""
    if device.type != "cuda":
        return 0
    gc.collect()
    return int(torch.cuda.memory_allocated(device))


def split_profile(
    *, baseline: int, loaded: int, max_allocated: int, kv_bytes: int
) -> tuple[int, int]:
    """(weights, activations) of a stage from its readings (see the module docstring):
    loaded - baseline, and max_allocated - loaded - kv_bytes. A ValueError naming the numbers
    when they cannot come from one profile (something else freed memory meanwhile)."""
    if not 0 <= baseline <= loaded:
        raise ValueError(f"baseline {baseline:,} bytes is not within [0, loaded={loaded:,}]")
    if max_allocated < loaded + kv_bytes:
        raise ValueError(
            f"max_allocated {max_allocated:,} bytes is below loaded {loaded:,} + the profile's "
            f"KV {kv_bytes:,}: the profile did not run on these readings"
        )
    return loaded - baseline, max_allocated - loaded - kv_bytes


Capture = Callable[[], Callable[[], None]]
"""A trial capture of a stage's CUDA graphs: captures them, returns what drops them again."""


def measure_footprint(
    readings: GpuReadings,
    *,
    baseline: int,
    run: Callable[[], int],
    reserved_bytes: int = 0,
    capture: Capture | None = None,
) -> StageFootprint:
    """Run the profile (`run`: allocates a temporary KV pool, runs the largest step, frees
    both, returns the pool's bytes) between the readings, and split them (split_profile).
    Then the trial `capture`, if any: the allocator's reserved bytes while its graphs are
    held, against before (both read with the cache handed back), are the graphs'. The free
    bytes are read last, with the graphs dropped and the allocator's cache handed back."""
    readings.release()
    loaded = readings.allocated()
    readings.reset_peak()
    kv_bytes = run()
    max_allocated = readings.max_allocated()
    graph_bytes = 0
    if capture is not None:
        readings.release()
        before = readings.reserved()
        drop = capture()
        readings.release()
        graph_bytes = max(0, readings.reserved() - before)
        drop()
        del drop  # the last reference to the trial's runner and its temporary pool
    readings.release()
    free, total = readings.mem_info()
    weights, activations = split_profile(
        baseline=baseline, loaded=loaded, max_allocated=max_allocated, kv_bytes=kv_bytes
    )
    return StageFootprint(weights, activations, reserved_bytes, graph_bytes, free, total)


def profile_stage(
    model: Any,
    *,
    block_size: int,
    num_tokens: int,
    num_sample_rows: int,
    device: torch.device,
    baseline: int,
    readings: GpuReadings | None = None,
    capture: Capture | None = None,
) -> StageFootprint:
    """The footprint of a stage whose model is loaded on `device`: one forward of num_tokens
    tokens, the logits and costliest sampling (ModelRunner.profile_forward) of num_sample_rows
    rows, then the adapter's `profile_extra_work` (e.g. its encoders on a largest item), against
    `baseline`; capture: the trial capture of its CUDA graphs (graph_plan.trial_capture), None
    when it has none."""
    from omni.runtime.model_runner import ModelRunner  # the engine layer's only runtime peek

    def run() -> int:
        runner = ModelRunner(
            model,
            num_blocks=-(-num_tokens // block_size),
            block_size=block_size,
            output_cache=None,
            device=device,
        )
        runner.profile_forward(num_tokens, num_sample_rows)
        extra = getattr(model, "profile_extra_work", None)
        if extra is not None:
            extra()
        return runner.kv_cache_bytes

    reserved = int(getattr(model, "reserved_bytes", 0))
    footprint = measure_footprint(
        readings or GpuReadings.of(device),
        baseline=baseline,
        run=run,
        reserved_bytes=reserved,
        capture=capture,
    )
    logger.info(
        "profiled a step of %d tokens on %s: weights %s bytes, activations %s, reserved %s, "
        "CUDA graphs %s; GPU %s bytes, %s free",
        num_tokens,
        device,
        f"{footprint.weights_bytes:,}",
        f"{footprint.activation_bytes:,}",
        f"{footprint.reserved_bytes:,}",
        f"{footprint.graph_bytes:,}",
        f"{footprint.total_bytes:,}",
        f"{footprint.free_bytes:,}",
    )
    return footprint
