"""Whether a stage pads its decode steps (and on a GPU replays them as CUDA graphs).

`engine.cuda_graphs`: null means on for a GPU stage whose model has a capturable decode body
(`StageModel.decode_graph_blocker()` is None) and off otherwise, with the reason logged; true
demands it (a ConfigError naming the field and the reason when the model cannot), and on the CPU
runs the same padded steps eagerly; false keeps every step eager.
"""

from __future__ import annotations

import logging

import torch

from omni.config import StageConfig
from omni.config.validate import config_error

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
