"""The largest items the thinker's encoders can be given, for a GPU stage's memory profile.

A step that encodes an image or audio item runs its tower before the text model; the tower's
activations grow with the item, so the profile (omni/engine/gpu_profile.py) runs each tower once
on the largest item a prompt can bring: the image the processor resizes to at most max_pixels,
the audio of the tower's whole window (the processor's 30 s).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np

DEFAULT_MAX_PIXELS = 12_845_056  # Qwen2-VL's image processor default (3584 x 3584), as 7B ships


def largest_image_grid(max_pixels: int, patch_size: int, merge_size: int) -> tuple[int, int, int]:
    """The (t, h, w) patch grid with the most patches the image processor's resize can give one
    image (smart_resize: both sides multiples of patch_size * merge_size, their product at most
    max_pixels)."""
    factor = patch_size * merge_size
    units = max_pixels // factor**2  # merged patches that fit
    if units < 1:
        raise ValueError(f"max_pixels={max_pixels} holds no {factor}x{factor} merged patch")
    rows = math.isqrt(units)
    return 1, rows * merge_size, (units // rows) * merge_size


def max_image_pixels(model_dir: str) -> int:
    """The image processor's max_pixels in the checkpoint's preprocessor_config.json (or its
    size.longest_edge), else the default."""
    path = os.path.join(model_dir, "preprocessor_config.json")
    if not os.path.exists(path):
        return DEFAULT_MAX_PIXELS
    with open(path) as f:
        raw = json.load(f)
    size = raw.get("size") or {}
    return int(raw.get("max_pixels") or size.get("longest_edge") or DEFAULT_MAX_PIXELS)


def largest_items(config: Any, max_pixels: int) -> dict[str, dict[str, list[np.ndarray]]]:
    """Per modality, the extras (the processor's keys) of one largest item, all zeros: the
    image of largest_image_grid, the audio of 2 * max_source_positions mel frames (what the
    tower's conv stride maps onto its positions)."""
    vision, audio = config.vision_config, config.audio_config
    t, h, w = largest_image_grid(max_pixels, vision.patch_size, vision.spatial_merge_size)
    patch = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    frames = 2 * audio.max_source_positions
    return {
        "image": {
            "pixel_values": [np.zeros((t * h * w, patch), dtype=np.float32)],
            "image_grid_thw": [np.array([t, h, w])],
        },
        "audio": {
            "input_features": [np.zeros((audio.num_mel_bins, frames), dtype=np.float32)],
            "feature_attention_mask": [np.ones(frames, dtype=np.int64)],
        },
    }
