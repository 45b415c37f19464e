"""How a stage's steps are sped up on a GPU: fused kernels in its decoder layers, and decode
steps padded to fixed shapes (replayed as CUDA graphs there).

`engine.fused_kernels`: null or true means installed on a GPU stage (omni/runtime/fused_layers.py
patches the fitting transformers modules of the adapter's models; never on the CPU).

`engine.cuda_graphs`: null means on for a GPU stage whose model has a capturable decode body
(`StageModel.decode_graph_blocker()` is None) and off otherwise, with the reason logged; true
demands it (a ConfigError naming the field and the reason when the model cannot), and on the CPU
runs the same padded steps eagerly; false keeps every step eager.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from omni.config import StageConfig
from omni.config.validate import config_error
from omni.runtime.fused_layers import install_fused_kernels
from omni.runtime.model_runner import ModelRunner
from omni.runtime.stage_model import ChunkJob, StageModel

logger = logging.getLogger(__name__)


def padded_decode(config: StageConfig, model: object, device: torch.device) -> bool:
    requested = config.engine.cuda_graphs
    if requested is False:
        return False
    blocker_of = getattr(model, "decode_graph_blocker", None)
    blocker = blocker_of() if blocker_of is not None else f"{type(model).__name__} is no adapter"
    if blocker is not None:
        if requested:
            raise config_error(
                f"stages.{config.name}.engine.cuda_graphs",
                f"is true, but the decode steps of this model cannot be captured: {blocker}",
            )
        if device.type == "cuda":
            logger.info(
                "stage %r: decode steps stay eager on %s (%s)", config.name, device, blocker
            )
        return False
    return requested is True or device.type == "cuda"


def capture_step_graphs(config: StageConfig, model: object, runner: ModelRunner) -> None:
    """After the warm-up (so that the graphs return every output): the padded decode steps'
    graphs, then, where those steps run, the adapter's own graphs of its step's sampling side
    (`enable_cuda_graphs(max_rows, required)` up to the decode ladder's top, e.g. a talker's
    code predictor; eager buffers on the CPU, as the padded steps there)."""
    required = config.engine.cuda_graphs is True
    runner.capture_decode_graphs(required=required)
    enable = getattr(model, "enable_cuda_graphs", None)
    if runner.decode_graphs is not None and enable is not None:
        enable(config.engine.graph_batch_limit, required=required)


def trial_capture(
    config: StageConfig,
    model: StageModel,
    device: torch.device,
    max_model_len: int,
    padded: bool | None = None,
) -> Callable[[], Callable[[], None]] | None:
    """For the memory profile (gpu_profile.Capture): this stage's step graphs captured on a
    temporary one-block pool, as capture_step_graphs will capture them on the real one, and
    what drops them (the runner, the adapter's own graphs); None when its steps stay eager.
    padded: padded_decode's answer, where the caller has it (else asked here)."""
    if device.type != "cuda" and config.engine.cuda_graphs is not True:
        return None  # eager, and nothing a trial could measure
    if not (padded_decode(config, model, device) if padded is None else padded):
        return None
    engine = config.engine

    def capture() -> Callable[[], None]:
        runner = ModelRunner(
            model,
            num_blocks=1,
            block_size=engine.block_size,
            output_cache=None,
            device=device,
            padded_decode=True,
            max_num_seqs=engine.max_num_seqs,
            max_num_batched_tokens=engine.resolved_max_num_batched_tokens(),
            max_model_len=max_model_len,
            max_graph_batch=engine.graph_batch_limit,
        )
        runner.warm_up()
        capture_step_graphs(config, model, runner)
        enable = getattr(model, "enable_cuda_graphs", None)

        def drop() -> None:
            runner.decode_graphs = None  # the graphs and their pool go with the last reference
            if enable is not None:
                enable(0)  # none kept: the real capture makes them again

        return drop

    return capture


def chunk_graphs(config: StageConfig, model: object, device: torch.device) -> bool:
    """A generation stage whose adapter can replay its chunk decode as CUDA graphs
    (`enable_cuda_graphs(max_chunks_per_step, required)`, e.g. token2wav's DiT) gets them under
    the same rules as padded_decode: null on a GPU (a failed capture falls back to eager), true
    anywhere (eager buffers on the CPU; a failed capture is an error)."""
    requested = config.engine.cuda_graphs
    enable = getattr(model, "enable_cuda_graphs", None)
    if requested is False or (requested is None and device.type != "cuda"):
        return False
    if enable is None:
        if requested:
            raise config_error(
                f"stages.{config.name}.engine.cuda_graphs",
                f"is true, but adapter {config.adapter!r} has no graphed decode",
            )
        return False
    enable(config.engine.max_num_seqs, required=requested is True)
    _warm_up_chunks(config, model, required=requested is True)
    return True


def _warm_up_chunks(config: StageConfig, model: Any, *, required: bool) -> None:
    """Decode a stream's first chunk and a steady one (codes of id 0), alone and in batches of
    2, 4, ... up to max_num_seqs, so that their graphs are captured now, at start-up, not
    within a request's first audio (as vLLM captures every batch size before serving)."""
    stream = config.stream
    if not callable(getattr(model, "chunk_defaults", None)):
        return
    left, ahead = model.chunk_defaults()
    left = left if stream.left_context is None else stream.left_context
    ahead = ahead if stream.look_ahead is None else stream.look_ahead
    first = stream.first_chunk_size
    # The second chunk of chunk_size: far enough in for its whole left context, as later ones.
    steady = first + sum(stream.ramp) + stream.chunk_size
    start = time.perf_counter()
    rows = [1 << i for i in range(config.engine.max_num_seqs.bit_length())]
    try:
        for begin, end in ((0, first), (steady, steady + stream.chunk_size)):
            job = ChunkJob((0,) * (end + ahead), begin, end, left, ahead, False, 0)
            for num_rows in rows:
                model.decode_chunks([job] * num_rows)
    except Exception as e:  # the stage still serves; a request then reports what fails
        if required:  # cuda_graphs: true, and a capture failed
            raise
        logger.warning("stage %r: chunk warm-up failed (%s)", config.name, e)
        return
    logger.info(
        "stage %r: first and steady chunks decoded at start-up, %s at once, in %.2f s",
        config.name,
        rows,
        time.perf_counter() - start,
    )


def chunk_dtype(config: StageConfig, model: object, device: torch.device) -> torch.dtype:
    """A chunk decoder's matmul precision (`stream.dtype`; null: float16 on a GPU, float32
    elsewhere), given to an adapter that takes one (`set_chunk_dtype`, e.g. token2wav); asking
    another adapter for less than float32 is a ConfigError."""
    requested = config.stream.dtype
    set_dtype = getattr(model, "set_chunk_dtype", None)
    if set_dtype is None:
        if requested not in (None, "float32"):
            raise config_error(
                f"stages.{config.name}.stream.dtype",
                f"is {requested!r}, but adapter {config.adapter!r} decodes no chunks in it",
            )
        return torch.float32
    dtype = getattr(torch, requested or ("float16" if device.type == "cuda" else "float32"))
    set_dtype(dtype)
    return dtype


def fuse_kernels(config: StageConfig, model: object, device: torch.device) -> int:
    """Install the fused forwards on the adapter's torch models; returns the modules patched.
    Before the memory profile and the capture, which must see the fused forwards."""
    if not config.engine.resolved_fused_kernels(device.type == "cuda"):
        return 0
    modules = [m for m in vars(model).values() if isinstance(m, torch.nn.Module)]
    return sum(install_fused_kernels(module) for module in modules)
