"""TalkerStep: one talker step's inputs as host index arrays (numpy), from the scheduled entries.

What the talker feeds at position t of a request (talker_inputs.py) is
    text row of t (clamped to the last known row) + codec embedding of t's codec id, if any,
where a decode position's codec id is the fed token, the "masked" mode's positions P and P + 1
add the codec pad/bos embeddings, and other prompt positions add none. A request without state
(warm-up, a bare codec prompt) feeds only the codec embeddings of its ids at plain positions.
All of that is known on the host: the fed ids (entry.token_ids), the positions
(entry.num_computed_tokens onwards) and each request's rows in the adapter's row arena. So a step
is built as index arrays here and applied on the device with one gather (text rows), one
embedding lookup (codec ids) and one masked fill, whatever the number of requests.

Besides the inputs: the codec ids to mark in the seen-mask (each new request's prompt codec ids,
once; a generated id is marked on the device when it is sampled, so that a step may feed ids still
on the device: engine.async_scheduling), and for each sampled row its seen-mask row and penalty
group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from omni.core.scheduler_output import ScheduledRequest
from stages.qwen2_5_omni.talker_inputs import TalkerRequestState


@dataclass
class TalkerStep:
    text_index: list[int] = field(default_factory=list)  # arena row per fed token (0: none)
    codec_ids: list[int] = field(default_factory=list)  # codec id per fed token (0 if none)
    no_codec: list[bool] = field(default_factory=list)  # the token adds no codec embedding
    positions: list[np.ndarray] = field(default_factory=list)  # [3, n] per entry
    mark_slots: list[int] = field(default_factory=list)  # seen-mask rows to mark ...
    mark_ids: list[int] = field(default_factory=list)  # ... at these codec ids
    sample_ids: list[str] = field(default_factory=list)  # request of each sampled row
    sample_slots: list[int] = field(default_factory=list)  # seen-mask row (0: no penalty)
    sample_groups: list[int] = field(default_factory=list)  # index into penalties
    penalties: list[float] = field(default_factory=list)  # distinct penalty values

    def arrays(self) -> list[np.ndarray]:
        """The host arrays to upload, in the order `TalkerAdapter.forward` unpacks them."""
        positions = np.concatenate(self.positions, axis=1) if self.positions else np.zeros((3, 0))
        return [
            np.asarray(self.text_index, dtype=np.int64),
            np.asarray(self.codec_ids, dtype=np.int64),
            np.asarray(self.no_codec, dtype=np.bool_),
            positions.astype(np.int64, copy=False),
            np.asarray(self.mark_slots, dtype=np.int64),
            np.asarray(self.mark_ids, dtype=np.int64),
            np.asarray(self.sample_slots, dtype=np.int64),
            np.asarray(self.sample_groups, dtype=np.int64),
        ]


def plan_step(
    scheduled: list[ScheduledRequest],
    states: list[TalkerRequestState | None],
    text_start: Callable[[str], int],
    seen_slot: Callable[[str], int],
) -> TalkerStep:
    """states: each entry's request state (None: codec embeddings only), all of them in the
    arena before this is called; text_start: the arena row of a request's first text row;
    seen_slot: a request's seen-mask row."""
    step = TalkerStep()
    for entry, state in zip(scheduled, states, strict=True):
        ids, first, num = entry.token_ids, entry.num_computed_tokens, len(entry.token_ids)
        if state is None:
            step.text_index += [0] * num
            step.codec_ids += ids
            step.no_codec += [False] * num
            step.positions.append(np.tile(np.arange(first, first + num, dtype=np.int64), (3, 1)))
        else:
            _plan_request(step, entry, state, text_start(entry.request_id))
            slot = seen_slot(entry.request_id)
            if not state.prompt_codes_marked:
                step.mark_slots += [slot] * len(state.prompt_codec_ids)
                step.mark_ids += state.prompt_codec_ids
                state.prompt_codes_marked = True
        if entry.sample:
            step.sample_ids.append(entry.request_id)
            _plan_sample(step, entry, state, seen_slot)
    return step


def _plan_request(
    step: TalkerStep, entry: ScheduledRequest, state: TalkerRequestState, start: int
) -> None:
    ids, first, num = entry.token_ids, entry.num_computed_tokens, len(entry.token_ids)
    last_row = start + state.num_rows - 1
    num_prompt = min(max(state.prompt_len - first, 0), num)
    if num_prompt == 0:  # decode steps only (the usual entry): no prompt positions
        step.text_index += [min(start + t, last_row) for t in range(first, first + num)]
        step.codec_ids += ids
        step.no_codec += [False] * num
        delta = state.rope_delta if state.mrope is not None else 0
        t = np.arange(first + delta, first + delta + num, dtype=np.int64)
        step.positions.append(np.tile(t, (3, 1)))
        return
    step.text_index += [min(start + t, last_row) for t in range(first, first + num)]
    codec = [0] * num_prompt + ids[num_prompt:]
    no_codec = [True] * num_prompt + [False] * (num - num_prompt)
    if state.codec_prefix is not None:
        prefix_start = state.prompt_len - 2  # P: codec pad, P + 1: codec bos
        for where, codec_id in enumerate(state.codec_prefix, start=prefix_start):
            if first <= where < first + num:
                codec[where - first] = codec_id
                no_codec[where - first] = False
    step.codec_ids += codec
    step.no_codec += no_codec
    step.positions.append(state.positions(first, num))


def _plan_sample(
    step: TalkerStep,
    entry: ScheduledRequest,
    state: TalkerRequestState | None,
    seen_slot: Callable[[str], int],
) -> None:
    if state is None or state.repetition_penalty == 1.0:
        step.sample_slots.append(0)
        step.sample_groups.append(0)
        return
    if state.repetition_penalty not in step.penalties:
        step.penalties.append(state.repetition_penalty)
    step.sample_slots.append(seen_slot(entry.request_id))
    step.sample_groups.append(step.penalties.index(state.repetition_penalty))
