"""StageMemory: the size of a stage's KV pool and where its output cache lives, decided once while
its engine is built, from the loaded model's shapes and the stage's device and dtype.

On the CPU the pool comes from `engine.num_blocks` or the `kv_cache_memory` budget, and the
output cache sits in host memory. On a GPU the stage's footprint is profiled first (its weights
against the baseline taken before it loaded, the activations of one step of
max_num_batched_tokens tokens with top-k/top-p sampling of max_num_seqs rows, the adapter's
extra work and reserve, and a trial capture of its CUDA graphs: omni/engine/gpu_profile.py).
Then `engine.num_blocks` must fit in the free GPU memory beside those, or, when null, the pool
is what is left of `engine.gpu_memory_utilization` of the GPU. The output cache lives in pinned
host memory (output_cache_device: cpu) or on the GPU (cuda). The arithmetic is in
omni/engine/cache_sizing.py; this module measures what it needs and feeds it in.

A generation stage (a vocoder) has no pool; what bounds it on a GPU is its largest transient
allocation (token2wav's whole decode: the DiT's dense masks), which `limit_transient_memory`
fits into what its memory share leaves beside what it holds from start-up on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omni.config import StageConfig
from omni.engine.cache_sizing import (
    bytes_per_block,
    check_gpu_num_blocks,
    gpu_memory_utilization,
    gpu_num_blocks,
    kv_bytes_per_block,
    num_kv_blocks,
    output_bytes_per_block,
)
from omni.engine.device import CPU
from omni.engine.gpu_profile import Capture, GpuReadings, profile_stage
from omni.runtime.stage_model import StageModel


@dataclass(frozen=True)
class StageMemory:
    num_blocks: int
    """KV blocks in the stage's pool; the output cache has as many, slot for slot."""
    output_cache_device: torch.device
    """Where the output cache's rows live: the CPU, or the stage's GPU."""

    @classmethod
    def plan(
        cls,
        config: StageConfig,
        model: StageModel,
        *,
        device: torch.device,
        dtype: torch.dtype,
        max_model_len: int,
        num_outputs: int,
        baseline_bytes: int = 0,
        capture: Capture | None = None,
    ) -> StageMemory:
        """The pool and output-cache placement of a stage whose model is loaded on `device`;
        num_outputs: how many per-token outputs its output cache keeps a row of per token;
        baseline_bytes: this process's GPU allocations before the model loaded; capture: a
        trial capture of its CUDA graphs, counted in its profile (graph_plan.trial_capture)."""
        itemsize = torch.finfo(dtype).bits // 8
        if device.type == "cuda":
            output_cache_device = device if config.engine.output_cache_device == "cuda" else CPU
            num_blocks = gpu_pool_num_blocks(
                config,
                model,
                device=device,
                max_model_len=max_model_len,
                num_outputs=num_outputs,
                itemsize=itemsize,
                output_cache_device=output_cache_device,
                baseline_bytes=baseline_bytes,
                capture=capture,
            )
            return cls(num_blocks, output_cache_device)
        block_bytes = bytes_per_block(
            config,
            num_layers=model.num_layers,
            num_kv_heads=model.num_kv_heads,
            head_dim=model.head_dim,
            hidden_size=model.hidden_size,
            num_outputs=num_outputs,
            itemsize=itemsize,
        )
        return cls(num_kv_blocks(config, block_bytes, max_model_len), CPU)


def gpu_pool_num_blocks(
    config: StageConfig,
    model: StageModel,
    *,
    device: torch.device,
    max_model_len: int,
    num_outputs: int,
    itemsize: int,
    output_cache_device: torch.device,
    baseline_bytes: int = 0,
    readings: GpuReadings | None = None,
    capture: Capture | None = None,
) -> int:
    """The KV pool of a GPU stage, after profiling its footprint against baseline_bytes (its
    CUDA graphs' trial capture included): engine.num_blocks checked against the free GPU memory
    beside a step's activations, the graphs and the adapter's reserve, or sized from
    gpu_memory_utilization. The KV always counts on the GPU; the output rows there only when the
    output cache lives there, else on the host. readings: the allocator's (tests inject them)."""
    engine = config.engine
    kv_block = kv_bytes_per_block(
        config,
        num_layers=model.num_layers,
        num_kv_heads=model.num_kv_heads,
        head_dim=model.head_dim,
        itemsize=itemsize,
    )
    out_block = output_bytes_per_block(
        config,
        hidden_size=model.hidden_size,
        num_outputs=num_outputs,
        itemsize=itemsize,
    )
    on_gpu = output_cache_device.type == "cuda"
    gpu_block = kv_block + (out_block if on_gpu else 0)
    host_block = 0 if on_gpu else out_block
    footprint = profile_stage(
        model,
        block_size=engine.block_size,
        num_tokens=min(engine.resolved_max_num_batched_tokens(), max_model_len),
        num_sample_rows=engine.max_num_seqs,
        device=device,
        baseline=baseline_bytes,
        readings=readings,
        capture=capture,
    )
    if engine.num_blocks is not None:
        # Free bytes read with the allocator's cache handed back: what it holds unused would
        # otherwise count as taken (on the local backend, the other stages' cached blocks too).
        return check_gpu_num_blocks(
            config,
            num_blocks=engine.num_blocks,
            free_bytes=footprint.free_bytes,
            block_bytes=gpu_block,
            step_bytes=footprint.peak_bytes - footprint.weights_bytes,
            host_block_bytes=host_block,
            share=(gpu_memory_utilization(config), footprint.total_bytes, footprint.peak_bytes),
        )
    return gpu_num_blocks(
        config,
        total_bytes=footprint.total_bytes,
        peak_bytes=footprint.peak_bytes,
        utilization=gpu_memory_utilization(config),
        block_bytes=gpu_block,
        max_model_len=max_model_len,
        host_block_bytes=host_block,
    )


TRANSIENT_SHARE = 0.75
"""Of what a generation stage's share leaves, the part its adapter's estimate may plan for: the
rest is for the activations the estimate leaves out (token2wav's: the DiT's hidden states and
BigVGAN's)."""


def reserved_gpu_bytes(device: torch.device, readings: GpuReadings | None = None) -> int:
    """What the allocator holds on `device` once its unused cache is handed back (0 off a GPU):
    read before a generation stage loads, the baseline of `limit_transient_memory`."""
    if device.type != "cuda":
        return 0
    readings = readings or GpuReadings.of(device)
    readings.release()
    return readings.reserved()


def limit_transient_memory(
    config: StageConfig,
    model: object,
    device: torch.device,
    baseline_bytes: int,
    readings: GpuReadings | None = None,
) -> int | None:
    """On a GPU, tell an adapter with `limit_transient_bytes(n)` the bytes it may plan its
    largest transient allocation for: TRANSIENT_SHARE of gpu_memory_utilization * total less
    what the stage holds since baseline_bytes (weights, graph pools), and no more than is free.
    Returns that budget (None where nothing was limited). Call it once the stage holds all it
    keeps (its graphs captured)."""
    limit = getattr(model, "limit_transient_bytes", None)
    if device.type != "cuda" or limit is None:
        return None
    readings = readings or GpuReadings.of(device)
    held = reserved_gpu_bytes(device, readings) - baseline_bytes
    free, total = readings.mem_info()
    left = int(gpu_memory_utilization(config) * total) - held
    budget = max(0, min(int(left * TRANSIENT_SHARE), free))
    limit(budget)
    return budget
