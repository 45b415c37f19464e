"""Where the thinker's multimodal ranges are and their 3-row (mrope) positions, on the host."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omni.core.request import MultiModalInput
from omni.core.scheduler_output import ScheduledRequest


@dataclass
class Item:
    """One multimodal range of a request and where its encoder inputs are in the extras."""

    mm: MultiModalInput
    modality: str  # "image" | "audio"
    index: int  # position in the extras' per-modality lists


@dataclass
class MropeState:
    items: list[Item]
    positions: torch.Tensor  # [3, end of the last item]: positions of tokens up to there
    delta: int  # beyond: position p -> p + delta on all three rows


def find_items(mm_inputs: Sequence[MultiModalInput], extras: Mapping[str, Any]) -> list[Item]:
    """Match each range to its item's encoder inputs by identifier; ValueError if one is missing."""
    where: dict[str, tuple[str, int]] = {}
    for modality, key in (("image", "image_identifiers"), ("audio", "audio_identifiers")):
        for index, identifier in enumerate(extras.get(key, ())):
            where.setdefault(identifier, (modality, index))
    items = []
    for mm in sorted(mm_inputs, key=lambda m: m.offset):
        if mm.identifier not in where:
            raise ValueError(f"multimodal input {mm.identifier!r} has no encoder inputs in extras")
        items.append(Item(mm, *where[mm.identifier]))
    return items


def mrope_positions(
    items: list[Item],
    extras: Mapping[str, Any],
    merge_size: int,
    position_id_per_seconds: float,
) -> tuple[torch.Tensor, int]:
    """3-row positions of the prompt up to the end of its last item, and the delta after it.

    The same numbers as transformers' ``get_rope_index`` for bos/eos-framed items (checked by
    tests/integration/test_omni_thinker.py), computed from the ranges alone: text advances all
    rows by one; an image's tokens sit at start + (t * position_id_per_seconds, row, column)
    of its merged grid; audio advances by one per token; the next token starts after the max.
    """
    segments, cursor, next_pos = [], 0, 0
    for item in items:
        gap = item.mm.offset - cursor
        segments.append(torch.arange(next_pos, next_pos + gap).expand(3, -1))
        next_pos += gap
        if item.modality == "image":
            t, h, w = (int(x) for x in extras["image_grid_thw"][item.index])
            h, w = h // merge_size, w // merge_size
            grid = torch.stack(
                torch.meshgrid(
                    torch.arange(t) * position_id_per_seconds,
                    torch.arange(h),
                    torch.arange(w),
                    indexing="ij",
                )
            ).reshape(3, -1)
            segment = grid + next_pos
        else:
            segment = torch.arange(next_pos, next_pos + item.mm.length).expand(3, -1)
        segments.append(segment)
        next_pos = int(segment.max()) + 1
        cursor = item.mm.offset + item.mm.length
    return torch.cat(segments, dim=1).long(), next_pos - cursor


def decode_rows(
    scheduled: list[ScheduledRequest], positions: np.ndarray, state_of: Callable[[str], Any]
) -> np.ndarray | None:
    """A padded decode step's [3, n] positions (the thinkers' decode_prepare): decode tokens of
    running requests only, p on every row, shifted by the delta of a request whose rope table
    (`state_of(request_id)`: None, or with `positions` [3, P] or None and `delta`) it is past.
    None (run eagerly) for a prompt token, which needs the table and the encoders' rows."""
    if any(entry.is_new or len(entry.token_ids) != 1 for entry in scheduled):
        return None
    rows = np.repeat(positions[None], 3, axis=0)
    for i, entry in enumerate(scheduled):
        state = state_of(entry.request_id)
        if state is None or state.positions is None:
            continue  # text only: p on every row
        if positions[i] < state.positions.shape[1]:
            return None
        rows[:, i] += state.delta
    return rows
