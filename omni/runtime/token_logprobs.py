"""The log-probabilities a step returns: its sampled tokens' (SamplingParams.logprobs) and its
prompt tokens' (SamplingParams.prompt_logprobs).

Computed on the logits' device from the raw logits (before temperature, penalties, bias and
filters: omni/core/logprobs.py) as one float64 frame per token: the token's logprob, then the
top-k logprobs, then their ids (exact in float64). A prompt token's frame comes from the hidden
state of the position before it: the runner keeps every fed row of a request that asks, and its
logits are computed here, PROMPT_CHUNK rows at a time (a [rows, vocab] float32 block each). The
frames reach the host in the step's one device-to-host copy (omni/runtime/launched_step.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from omni.core.logprobs import TokenLogprobs
from omni.core.sampling_params import SamplingParams
from omni.core.scheduler_output import ScheduledRequest
from omni.runtime.host_upload import upload

PROMPT_CHUNK = 256
"""Prompt rows whose logits are computed at once (152k vocabulary: 156 MB of float32)."""

LogprobFrames = tuple[torch.Tensor, list[int], list[int]]
"""(frames [n, 1 + 2k] float64 on the device, the rows they are for, each row's own k)."""


def logprob_frames(
    logits: torch.Tensor, token_ids: torch.Tensor, params: list[SamplingParams]
) -> LogprobFrames | None:
    """The sampled tokens' frames of the rows that ask (rows: their indices among the logits'),
    None when none does. logits [rows, vocab]; token_ids [rows] sampled."""
    rows = [j for j, p in enumerate(params) if p.logprobs is not None]
    if not rows:  # the requests that ask are elsewhere in their prompts
        return None
    counts = [min(params[j].logprobs or 0, logits.shape[1]) for j in rows]
    if len(rows) != len(params):
        (index,) = upload([np.asarray(rows, dtype=np.int64)], logits.device)
        logits, token_ids = logits.index_select(0, index), token_ids.index_select(0, index)
    return frames_of(logits, token_ids, max(counts)), rows, counts


def prompt_logprob_frames(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    scheduled: list[ScheduledRequest],
    params: list[SamplingParams],
) -> LogprobFrames:
    """The prompt tokens' frames of a step's requests that ask (rows: their indices in
    `scheduled`, each repeated once per frame). hidden: every fed row of the step, in order."""
    rows: list[int] = []
    owners: list[int] = []
    targets: list[int] = []
    counts: list[int] = []
    offset = 0
    for j, (entry, p) in enumerate(zip(scheduled, params, strict=True)):
        if entry.prompt_targets:  # position offset + i is fed, prompt_targets[i] follows it
            rows.extend(range(offset, offset + len(entry.prompt_targets)))
            targets.extend(entry.prompt_targets)
            owners.extend([j] * len(entry.prompt_targets))
            counts.extend([p.prompt_logprobs or 0] * len(entry.prompt_targets))
        offset += len(entry.token_ids)
    index, target = upload(
        [np.asarray(rows, np.int64), np.asarray(targets, np.int64)], hidden.device
    )
    parts = []
    for start in range(0, len(rows), PROMPT_CHUNK):
        logits = compute_logits(hidden.index_select(0, index[start : start + PROMPT_CHUNK]))
        k = min(max(counts), logits.shape[1])  # one frame width for every chunk
        parts.append(frames_of(logits, target[start : start + PROMPT_CHUNK], k))
    return torch.cat(parts), owners, [min(c, k) for c in counts]


def frames_of(logits: torch.Tensor, token_ids: torch.Tensor, k: int) -> torch.Tensor:
    """[rows, 1 + 2k] float64: each row's logprob of its token, its top k and their ids."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    parts = [logprobs.gather(1, token_ids.unsqueeze(1))]
    if k:
        values, ids = logprobs.topk(k, dim=-1)
        # Ties by token id (topk's own order among equal values depends on its kernel).
        ids, by_id = ids.sort(dim=-1)
        values, by_value = values.gather(1, by_id).sort(dim=-1, descending=True, stable=True)
        parts += [values, ids.gather(1, by_value)]
    return torch.cat([part.double() for part in parts], dim=1)


def read_logprobs(frames: list[list[float]], counts: list[int]) -> list[TokenLogprobs]:
    """The host's TokenLogprobs of frames (a frames tensor as lists), each with its own k."""
    out = []
    for frame, count in zip(frames, counts, strict=True):
        width = (len(frame) - 1) // 2
        values, ids = frame[1 : 1 + count], frame[1 + width : 1 + width + count]
        top = tuple((int(i), v) for i, v in zip(ids, values, strict=True))
        out.append(TokenLogprobs(frame[0], top))
    return out
