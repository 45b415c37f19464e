"""How many KV blocks a stage gets: from `engine.num_blocks`, or from the `kv_cache_memory`
budget, checked against the memory the machine has before anything is allocated.

A block costs its KV (layers x 2 x kv heads x head dim per token) plus the rows of every cached
output (hidden size per token each), in the stage's dtype. Refusing up front matters: a
too-large pool is otherwise found out by the kernel's OOM killer, gigabytes later.

On a GPU (`gpu_num_blocks`) the pool is what is left of the stage's share of its GPU
(`engine.gpu_memory_utilization` of the GPU's total memory) once the weights and the activations
of one profiled step of max_num_batched_tokens tokens (and the adapter's declared reserve) are
counted: blocks = (utilization * total - peak) // GPU bytes per block, capped like the CPU pool at
max_num_seqs sequences of max_model_len. The KV always sits on the GPU; the output rows count
there only with `output_cache_device: cuda`. With the output cache in (pinned) host memory its
rows are bounded on the host as on the CPU path (`kv_cache_memory` of the available host
memory). Everything here is plain arithmetic on numbers the caller measured, so it is tested
without a GPU.
"""

from __future__ import annotations

import logging
import os

from omni.config import ConfigError, StageConfig
from omni.config.devices import memory_share

logger = logging.getLogger(__name__)


def available_memory_bytes() -> int:
    """Memory the system can give this process now without swapping (Linux MemAvailable)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def bytes_per_block(
    config: StageConfig,
    *,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    hidden_size: int,
    num_outputs: int,
    itemsize: int,
) -> int:
    """KV plus output-cache bytes of one block (both in the stage's dtype)."""
    kv = kv_bytes_per_block(
        config,
        num_layers=num_layers,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        itemsize=itemsize,
    )
    return kv + output_bytes_per_block(
        config, hidden_size=hidden_size, num_outputs=num_outputs, itemsize=itemsize
    )


def kv_bytes_per_block(
    config: StageConfig, *, num_layers: int, num_kv_heads: int, head_dim: int, itemsize: int
) -> int:
    """Key and value cache bytes of one block, all layers."""
    return num_layers * 2 * num_kv_heads * head_dim * itemsize * config.engine.block_size


def output_bytes_per_block(
    config: StageConfig, *, hidden_size: int, num_outputs: int, itemsize: int
) -> int:
    """Stage-output cache bytes of one block: a row of hidden_size per output and token."""
    return num_outputs * hidden_size * itemsize * config.engine.block_size


def num_kv_blocks(config: StageConfig, block_bytes: int, max_model_len: int) -> int:
    """engine.num_blocks if it fits in memory, else as many as kv_cache_memory holds (at most
    enough for max_num_seqs sequences of max_model_len). A ConfigError stating the bytes when the
    memory is not there."""
    engine = config.engine
    available = available_memory_bytes()
    where = f"stage {config.name!r}: stages.{config.name}.engine"
    if engine.num_blocks is not None:
        need = engine.num_blocks * block_bytes
        if need > available:
            raise ConfigError(
                f"{where}.num_blocks={engine.num_blocks} needs {need:,} bytes "
                f"({block_bytes:,} per block) but {available:,} bytes are available; lower it, "
                "or leave it null to size the pool from engine.kv_cache_memory"
            )
        return engine.num_blocks
    share = engine.kv_cache_memory <= 1
    budget = int(engine.kv_cache_memory * available) if share else int(engine.kv_cache_memory)
    if budget > available:
        raise ConfigError(
            f"{where}.kv_cache_memory={engine.kv_cache_memory:g} bytes but {available:,} bytes "
            "are available"
        )
    blocks_per_seq = -(-max_model_len // engine.block_size)
    num_blocks = min(budget // block_bytes, engine.max_num_seqs * blocks_per_seq)
    if num_blocks < blocks_per_seq:
        raise ConfigError(
            f"{where}.kv_cache_memory={engine.kv_cache_memory:g} gives {budget:,} bytes, "
            f"{num_blocks} blocks of {block_bytes:,} bytes; one sequence of max_model_len="
            f"{max_model_len} needs {blocks_per_seq}: raise kv_cache_memory or lower max_model_len"
        )
    logger.info(
        "stage %r: %d KV blocks (%s bytes) from kv_cache_memory=%g",
        config.name,
        num_blocks,
        f"{num_blocks * block_bytes:,}",
        engine.kv_cache_memory,
    )
    return int(num_blocks)


# ---- GPU --------------------------------------------------------------------------------------


def gpu_memory_utilization(config: StageConfig) -> float:
    """engine.gpu_memory_utilization; null (a StageConfig the driver did not plan, see
    omni/config/devices.py) means 0.9 of a fractional resources.num_gpus, else 0.9."""
    share = config.engine.gpu_memory_utilization
    return memory_share(config.resources.num_gpus) if share is None else share


def gpu_blocks_that_fit(
    *, total_bytes: int, peak_bytes: int, utilization: float, block_bytes: int
) -> int:
    """Blocks of block_bytes in utilization * total_bytes once peak_bytes (weights and the
    profiled forward's activations) are taken: (utilization * total - peak) // block_bytes,
    0 when the peak alone exceeds the share."""
    if block_bytes <= 0:
        raise ValueError(f"block_bytes must be > 0, got {block_bytes}")
    budget = int(utilization * total_bytes) - peak_bytes
    return max(budget, 0) // block_bytes


def gpu_num_blocks(
    config: StageConfig,
    *,
    total_bytes: int,
    peak_bytes: int,
    utilization: float,
    block_bytes: int,
    max_model_len: int,
    host_block_bytes: int = 0,
    host_available_bytes: int | None = None,
) -> int:
    """The KV pool of a GPU stage whose engine.num_blocks is null: as many blocks as fit in its
    share of the GPU (gpu_blocks_that_fit), at most enough for max_num_seqs sequences of
    max_model_len (as on the CPU), and, when host_block_bytes > 0 (the output cache in host
    memory), no more than the host's kv_cache_memory budget holds. A ConfigError stating the
    bytes when one sequence of max_model_len does not fit."""
    engine = config.engine
    where = f"stage {config.name!r}: stages.{config.name}.engine"
    blocks_per_seq = -(-max_model_len // engine.block_size)
    share = int(utilization * total_bytes)
    num_blocks = gpu_blocks_that_fit(
        total_bytes=total_bytes,
        peak_bytes=peak_bytes,
        utilization=utilization,
        block_bytes=block_bytes,
    )
    if num_blocks < blocks_per_seq:
        raise ConfigError(
            f"{where}.gpu_memory_utilization={utilization:g} of the GPU's {total_bytes:,} bytes "
            f"is {share:,} bytes; the weights and a forward of max_num_batched_tokens="
            f"{engine.resolved_max_num_batched_tokens()} take {peak_bytes:,}, leaving "
            f"{max(share - peak_bytes, 0):,} bytes: {num_blocks} KV blocks of {block_bytes:,} "
            f"bytes, but one sequence of max_model_len={max_model_len} needs {blocks_per_seq}; "
            "raise gpu_memory_utilization, or lower max_model_len or max_num_batched_tokens"
        )
    bound = "gpu_memory_utilization"
    if num_blocks > engine.max_num_seqs * blocks_per_seq:  # as on the CPU: no more than needed
        num_blocks = engine.max_num_seqs * blocks_per_seq
        bound = f"max_num_seqs={engine.max_num_seqs} sequences of max_model_len={max_model_len}"
    if host_block_bytes > 0:
        available = (
            available_memory_bytes() if host_available_bytes is None else host_available_bytes
        )
        host_blocks = _host_budget(config, available) // host_block_bytes
        if host_blocks < num_blocks:
            num_blocks, bound = host_blocks, "kv_cache_memory (the output cache in host memory)"
        if num_blocks < blocks_per_seq:
            raise ConfigError(
                f"{where}.kv_cache_memory={engine.kv_cache_memory:g} of {available:,} bytes of "
                f"host memory holds {host_blocks} blocks of output rows ({host_block_bytes:,} "
                f"bytes each); one sequence of max_model_len={max_model_len} needs "
                f"{blocks_per_seq}: raise kv_cache_memory, set output_cache_device: cuda, or "
                "lower max_model_len"
            )
    logger.info(
        "stage %r: %d KV blocks (%s bytes on the GPU%s) from %s; GPU %s bytes, share %g, "
        "peak without the pool (weights, reserve, graphs, a step) %s bytes",
        config.name,
        num_blocks,
        f"{num_blocks * block_bytes:,}",
        f", {num_blocks * host_block_bytes:,} in host memory" if host_block_bytes else "",
        bound,
        f"{total_bytes:,}",
        utilization,
        f"{peak_bytes:,}",
    )
    return int(num_blocks)


def check_gpu_num_blocks(
    config: StageConfig,
    *,
    num_blocks: int,
    free_bytes: int,
    block_bytes: int,
    step_bytes: int = 0,
    host_block_bytes: int = 0,
    host_available_bytes: int | None = None,
    share: tuple[float, int, int] | None = None,
) -> int:
    """An explicit engine.num_blocks on a GPU stage: its GPU bytes plus step_bytes (what a
    step allocates and frees again, what the adapter may come to hold and the CUDA graphs
    captured after the pool: the profile's activations, reserve and graphs) must be free now
    (weights loaded), and its host-side output rows available; share (gpu_memory_utilization, the GPU's total bytes, the stage's peak without
    its pool): the pool must also fit in the stage's share, so that stages starting at once on
    one GPU (Ray actors, each reading the same free memory) cannot take more than their shares
    together. A ConfigError stating the bytes if not."""
    where = f"stage {config.name!r}: stages.{config.name}.engine.num_blocks={num_blocks}"
    need = num_blocks * block_bytes
    if need + step_bytes > free_bytes:
        raise ConfigError(
            f"{where} needs {need:,} bytes of GPU memory ({block_bytes:,} per block), plus "
            f"{step_bytes:,} for a step's activations, the CUDA graphs and the adapter's "
            f"reserve, but {free_bytes:,} bytes are free after loading the weights; lower it, "
            "or leave it null to size the pool from engine.gpu_memory_utilization"
        )
    if share is not None:
        utilization, total_bytes, peak_bytes = share
        limit = int(utilization * total_bytes)
        if need + peak_bytes > limit:
            raise ConfigError(
                f"{where} needs {need:,} bytes of GPU memory ({block_bytes:,} per block), plus "
                f"{peak_bytes:,} for the weights, a step's activations, the CUDA graphs and the "
                "adapter's reserve: more than the stage's share, "
                f"gpu_memory_utilization={utilization:g} of {total_bytes:,} bytes ({limit:,}), "
                "which keeps it clear of the other stages on its GPU; lower num_blocks, or raise "
                "gpu_memory_utilization"
            )
    if host_block_bytes > 0:
        available = (
            available_memory_bytes() if host_available_bytes is None else host_available_bytes
        )
        host_need = num_blocks * host_block_bytes
        if host_need > available:
            raise ConfigError(
                f"{where} needs {host_need:,} bytes of host memory for the output cache "
                f"({host_block_bytes:,} per block) but {available:,} bytes are available; lower "
                "it, or set output_cache_device: cuda"
            )
    logger.info(
        "stage %r: %d KV blocks (%s bytes on the GPU) from engine.num_blocks",
        config.name,
        num_blocks,
        f"{need:,}",
    )
    return num_blocks


def _host_budget(config: StageConfig, available: int) -> int:
    memory = config.engine.kv_cache_memory
    return int(memory * available) if memory <= 1 else min(int(memory), available)
