"""Where a stage runs: its torch device, dtype and memory, decided in one place.

`resolve_device` turns `engine.device` into a torch.device: "cpu" is the CPU; "cuda" is cuda:0,
which under Ray is the stage's own GPU (Ray sets CUDA_VISIBLE_DEVICES to the GPUs it assigned the
actor, so the first visible one is the stage's) and on the local backend the first GPU torch
sees; "auto" is cuda:0 when torch sees a GPU, else the CPU. A Ray actor that reserved no GPU
runs on the CPU: the backend starts it with CUDA_VISIBLE_DEVICES="" and, should a GPU be visible
anyway, "auto" there is the CPU and "cuda" an error. The driver refuses impossible requests
before anything loads (omni/config/devices.py); the engine checks again here, last, before it
loads weights.

What a CUDA stage needs besides its KV cache is measured in omni/engine/gpu_profile.py.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch

from kernels.triton_launch import HAVE_TRITON
from omni.config import StageConfig
from omni.config.validate import config_error
from omni.engine.engine import DTYPES

CPU = torch.device("cpu")


# An ar stage steps token by token, and each of its steps gates the next stage's input (a talker
# code every step, the first audio behind 10 of them); a generation stage (the vocoder's DiT and
# BigVGAN) runs long, compute-bound batches. On one GPU their kernels compete for the SMs: at
# 16 requests the H200's thinker and talker queued behind float32 DiT batches (first token
# 0.78 s, talker 3.8 -> 6.8 ms per code). A higher-priority stream lets the GPU's block
# scheduler start the ar stages' blocks first whenever SMs free up; graph replays take the
# priority of the stream they are launched on.
HIGH_PRIORITY = -1  # torch maps it into the device's range (lower number: higher priority)


# A step holding a stream's first chunk gates that request's first audio, the wait users feel:
# it goes ahead of the ar stages too (one step per request). Later chunks, which only have to
# keep ahead of playback, stay below them.
URGENT_PRIORITY = -2
_urgent_streams: dict[tuple[torch.device, int], Any] = {}


def stream_priority(kind: str) -> int:
    """The CUDA stream priority of a stage of `kind` (engine kind: ar or generation)."""
    return HIGH_PRIORITY if kind == "ar" else 0


def use_own_stream(device: torch.device, priority: int = 0) -> Any | None:
    """On a GPU: a new CUDA stream of `priority` (stream_priority), made the calling thread's
    current one (torch keeps it per thread), ordered after the work already queued on the
    thread's previous current stream and the device's default stream (where the engine was
    built, on another thread). None elsewhere. Every later launch of this thread goes to it;
    `tolist` and other syncs then wait for this thread's work only, not for another stage's."""
    if device.type != "cuda":
        return None
    stream = torch.cuda.Stream(device=device, priority=priority)
    stream.wait_stream(torch.cuda.current_stream(device))
    stream.wait_stream(torch.cuda.default_stream(device))
    torch.cuda.set_stream(stream)
    return stream


@contextlib.contextmanager
def urgent_stream(device: torch.device, urgent: bool) -> Iterator[None]:
    """With `urgent`, on a GPU: the block launches on a stream of URGENT_PRIORITY (one per
    thread), after the thread's current stream's queued work, which then waits for the block's.
    The block must end synchronised with its work (a step reading its results to the host), so
    memory it frees is never reused under the other stream's kernels. Elsewhere: nothing."""
    if not urgent or device.type != "cuda":
        yield
        return
    current = torch.cuda.current_stream(device)
    key = (device, threading.get_ident())
    stream = _urgent_streams.get(key)
    if stream is None:
        stream = _urgent_streams[key] = torch.cuda.Stream(device=device, priority=URGENT_PRIORITY)
    stream.wait_stream(current)
    try:
        with torch.cuda.stream(stream):
            yield
    finally:  # a failed step's queued work too: the thread's next launches come after it
        current.wait_stream(stream)


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
    if available and not HAVE_TRITON:  # the paged attention's CUDA kernel is Triton's
        raise config_error(
            f"stages.{config.name}.engine.device",
            f"is {requested}, and torch sees a GPU, but the triton package is missing (attention "
            "on CUDA runs a Triton kernel; torch's CUDA wheels bring it: pip install triton), "
            "or use cpu",
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


def device_stats(
    device: torch.device, dtype: torch.dtype, kv_bytes: int, output_cache: Any
) -> dict[str, Any]:
    """Where a stage runs and the memory it holds: on a GPU this process's torch allocations
    there; on the CPU the bytes of its KV and output caches (output_cache: an OutputCache or
    None)."""
    out: dict[str, Any] = {
        "device": str(device),
        "dtype": dtype_name(dtype),
        "kv_cache_bytes": kv_bytes,
    }
    if output_cache is not None:
        out["output_cache_device"] = str(output_cache.device)
    if device.type == "cuda":
        out.update(cuda_memory_stats(device))
    else:
        cache = output_cache.num_bytes if output_cache is not None else 0
        out["memory_allocated_bytes"] = kv_bytes + cache
    return out
