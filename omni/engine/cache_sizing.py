"""How many KV blocks a stage gets: from `engine.num_blocks`, or from the `kv_cache_memory`
budget, checked against the memory the machine has before anything is allocated.

A block costs its KV (layers x 2 x kv heads x head dim per token) plus the rows of every cached
output (hidden size per token each), in the stage's dtype. Refusing up front matters: a
too-large pool is otherwise found out by the kernel's OOM killer, gigabytes later.
"""

from __future__ import annotations

import logging
import os

from omni.config import ConfigError, StageConfig

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
    per_token = (num_layers * 2 * num_kv_heads * head_dim + num_outputs * hidden_size) * itemsize
    return per_token * config.engine.block_size


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
