"""Where a stage runs: its torch device, dtype and memory, decided in one place.

`resolve_device` turns `engine.device` into a torch.device: "cpu" is the CPU; "cuda" is cuda:0,
which under Ray is the stage's own GPU (Ray sets CUDA_VISIBLE_DEVICES to the GPUs it assigned the
actor, so the first visible one is the stage's) and on the local backend the first GPU torch
sees; "auto" is cuda:0 when torch sees a GPU, else the CPU. A Ray actor that reserved no GPU
runs on the CPU: the backend starts it with CUDA_VISIBLE_DEVICES="" and, should a GPU be visible
anyway, "auto" there is the CPU and "cuda" an error. The driver refuses impossible requests
before anything loads (omni/config/devices.py); the engine checks again here, last, before it
loads weights.

`profile_peak_bytes` measures what a CUDA stage needs besides its KV cache: the weights plus the
activations of one forward of max_num_batched_tokens tokens (omni/engine/cache_sizing.py turns
that into a number of blocks).
"""

from __future__ import annotations

import gc
import logging
import sys
from typing import Any

import torch

from omni.config import StageConfig
from omni.config.validate import config_error
from omni.engine.engine import DTYPES

logger = logging.getLogger(__name__)

CPU = torch.device("cpu")


def resolve_device(config: StageConfig) -> torch.device:
    """The stage's torch device (see the module docstring); a ConfigError naming the stage and
    `stages.<name>.engine.device` when it asks for CUDA and torch sees none, or it runs in a Ray
    actor that reserved no GPU."""
    requested = config.engine.device
    if requested == "cpu":
        return CPU
    if _in_ray_actor_without_gpus():
        # Ray 2.60 no longer hides the GPUs from such an actor; the driver planned it on the CPU.
        if requested == "cuda":
            raise config_error(
                f"stages.{config.name}.engine.device",
                "is cuda, but this Ray actor reserved no GPU (resources.num_gpus)",
            )
        return CPU
    available = torch.cuda.is_available()
    if requested == "cuda" and not available:
        build = torch.version.cuda or "none (a CPU-only torch build)"
        raise config_error(
            f"stages.{config.name}.engine.device",
            f"is cuda, but torch sees no CUDA GPU in this process (torch {torch.__version__}, "
            f"CUDA {build}); use cpu or auto, or reserve a GPU with resources.num_gpus on Ray",
        )
    return torch.device("cuda", 0) if available else CPU


def _in_ray_actor_without_gpus() -> bool:
    """Whether this process is a Ray actor to which Ray assigned no GPU (the local backend's
    process, a Ray driver, is none)."""
    ray = sys.modules.get("ray")  # imported by every Ray worker; never imported here for this
    if ray is None or not ray.is_initialized():
        return False
    if ray.get_runtime_context().get_actor_id() is None:
        return False
    return not ray.get_gpu_ids()


def resolve_dtype(config: StageConfig, device: torch.device) -> torch.dtype:
    """engine.dtype, with null meaning bfloat16 on a GPU and float32 on the CPU."""
    return DTYPES[config.engine.resolved_dtype(on_gpu=device.type == "cuda")]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cuda_memory_stats(device: torch.device) -> dict[str, int]:
    """This process's torch allocations on the GPU: in tensors, and held by the allocator."""
    return {
        "memory_allocated_bytes": int(torch.cuda.memory_allocated(device)),
        "memory_reserved_bytes": int(torch.cuda.memory_reserved(device)),
    }


def free_cuda_memory(device: torch.device) -> None:
    """Return what the caching allocator holds unused (after dropping temporary tensors)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def profile_peak_bytes(
    model: Any, *, block_size: int, num_tokens: int, num_sample_rows: int, device: torch.device
) -> tuple[int, int]:
    """(peak bytes, total bytes) of the stage's GPU: the most this process's tensors took during
    one forward of `num_tokens` tokens plus the logits of `num_sample_rows` rows, with the
    weights loaded and without the KV cache of that forward (a small temporary pool, freed);
    total is the GPU's whole memory (torch.cuda.mem_get_info)."""
    from omni.runtime.model_runner import ModelRunner  # the engine layer's only runtime peek

    torch.cuda.synchronize(device)
    free_cuda_memory(device)
    torch.cuda.reset_peak_memory_stats(device)
    runner = ModelRunner(
        model,
        num_blocks=-(-num_tokens // block_size),
        block_size=block_size,
        output_cache=None,
        device=device,
    )
    kv_bytes = runner.kv_cache_bytes
    runner.profile_forward(num_tokens, num_sample_rows)
    torch.cuda.synchronize(device)
    peak = int(torch.cuda.max_memory_allocated(device)) - kv_bytes
    del runner
    free_cuda_memory(device)
    _, total = torch.cuda.mem_get_info(device)
    logger.info(
        "profiled a forward of %d tokens on %s: peak %s bytes (weights + activations), GPU %s bytes",
        num_tokens,
        device,
        f"{peak:,}",
        f"{total:,}",
    )
    return peak, int(total)


def cuda_free_bytes(device: torch.device) -> int:
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)
