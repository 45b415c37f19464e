"""The log-probabilities a step returns with its sampled tokens (SamplingParams.logprobs).

Computed on the logits' device from the raw logits (before temperature, penalties, bias and
filters: omni/core/logprobs.py) of the rows that ask, as one float64 frame per row: the sampled
token's logprob, then the row's top-k logprobs, then their ids (exact in float64). The frames
reach the host in the step's one device-to-host copy (omni/runtime/launched_step.py).
"""

from __future__ import annotations

import numpy as np
import torch

from omni.core.logprobs import TokenLogprobs
from omni.core.sampling_params import SamplingParams
from omni.runtime.host_upload import upload


def logprob_frames(
    logits: torch.Tensor, token_ids: torch.Tensor, params: list[SamplingParams]
) -> tuple[torch.Tensor, list[int], list[int]]:
    """([rows asking, 1 + 2k] float64 frames on the logits' device, those rows' indices, each
    row's own k); k is the largest asked. logits [rows, vocab]; token_ids [rows] sampled."""
    rows = [j for j, p in enumerate(params) if p.logprobs is not None]
    counts = [min(params[j].logprobs or 0, logits.shape[1]) for j in rows]
    if len(rows) != len(params):
        (index,) = upload([np.asarray(rows, dtype=np.int64)], logits.device)
        logits, token_ids = logits.index_select(0, index), token_ids.index_select(0, index)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    parts = [logprobs.gather(1, token_ids.unsqueeze(1))]
    if max(counts):
        values, ids = logprobs.topk(max(counts), dim=-1)
        # Ties by token id (topk's own order among equal values depends on its kernel).
        ids, by_id = ids.sort(dim=-1)
        values, by_value = values.gather(1, by_id).sort(dim=-1, descending=True, stable=True)
        parts += [values, ids.gather(1, by_value)]
    return torch.cat([part.double() for part in parts], dim=1), rows, counts


def read_logprobs(frames: list[list[float]], counts: list[int]) -> list[TokenLogprobs]:
    """The host's TokenLogprobs of logprob_frames' rows (frames: its tensor as lists)."""
    out = []
    for frame, count in zip(frames, counts, strict=True):
        width = (len(frame) - 1) // 2
        values, ids = frame[1 : 1 + count], frame[1 + width : 1 + width + count]
        top = tuple((int(i), v) for i, v in zip(ids, values, strict=True))
        out.append(TokenLogprobs(frame[0], top))
    return out
