"""Qwen3-Omni 3-row rope positions, by transformers' own `get_rope_index` (host, once a request).

Both the thinker (on its prompt) and the talker (on its prompt ids: the user turns' thinker ids
and nine tts_pad ids) take the positions `generate` computes. transformers uses the multimodal
table only when an image or video grid is given; an audio-only prompt gets plain positions (its
`else` branch), which calling the same function reproduces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch


def audio_token_count(num_frames: int, n_window: int) -> int:
    """Embeddings the Qwen3-Omni audio tower emits for `num_frames` mel frames (transformers'
    `_get_feat_extract_output_lengths`)."""
    chunk = n_window * 2
    leave = num_frames % chunk
    lengths = (leave - 1) // 2 + 1
    return ((lengths - 1) // 2 + 1 - 1) // 2 + 1 + (num_frames // chunk) * 13


def rope_index(
    model: Any, token_ids: Sequence[int], extras: Mapping[str, Any]
) -> tuple[torch.Tensor, int]:
    """[3, len(token_ids)] int64 positions and the delta after them; `model` is a module with
    transformers' `get_rope_index` (the thinker model or the talker)."""
    ids = torch.tensor([list(token_ids)], dtype=torch.long)
    grid = extras.get("image_grid_thw")
    image_grid = None if grid is None or len(grid) == 0 else torch.as_tensor(np.asarray(grid))
    lengths = extras.get("audio_feature_lengths")
    audio = None if lengths is None or len(lengths) == 0 else torch.as_tensor(np.asarray(lengths))
    with torch.no_grad():
        positions, deltas = model.get_rope_index(
            ids, image_grid, None, torch.ones_like(ids), False, audio, None
        )
    return positions[:, 0].long().cpu(), int(deltas.reshape(-1)[0])
