"""LaunchedStep: a step whose forward, logits and sampling are queued on the device; `result`
reads its sampled ids, and the logprobs of rows that ask (the step's one wait for the device).

On a GPU the ids' copy to the host is queued right behind the sampling, into pinned memory,
with an event after it: `result` waits for that event, not for the stream's end, so a step
launched after this one (engine.async_scheduling) runs on while the host reads these ids."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omni.core.logprobs import TokenLogprobs
from omni.core.scheduler_output import RunnerOutput
from omni.runtime.token_logprobs import LogprobFrames, read_logprobs


@dataclass(frozen=True)
class FedIds:
    """Token ids a step feeds from the device: `ids` (a launched step's sampled ids) at `rows`,
    one row per scheduled request, in order; a multi-code step's residual `codes` with them."""

    ids: torch.Tensor
    rows: np.ndarray
    codes: torch.Tensor | None = None


@dataclass
class LaunchedStep:
    request_ids: list[str]
    """The requests that sample, in the order of their rows in `ids`."""
    ids: torch.Tensor | None = None
    """[rows] sampled token ids on the runner's device (None: nothing samples)."""
    codes: torch.Tensor | None = None
    """[rows, codes] a multi-code step's residual codes, read in the same copy."""
    logprobs: LogprobFrames | None = None
    """The rows that asked for logprobs: logprob_frames' (frames, rows, counts)."""
    prompt_logprobs: tuple[list[str], LogprobFrames] | None = None
    """The step's requests (in scheduling order) and prompt_logprob_frames' frames, whose rows
    index them. With either kind of frames, the ids (and codes) go over as float64 (exact)
    beside them, in the same copy and read."""
    _host: torch.Tensor | None = field(default=None, repr=False)
    _copied: Any = field(default=None, repr=False)  # CUDA event after the copy to _host

    def __post_init__(self) -> None:
        blocks = self._blocks()
        if self.ids is None and not blocks:
            return
        frames = self._id_frames()
        if blocks:
            parts = [] if frames is None else [frames.double().flatten()]
            frames = torch.cat(parts + [block[0].flatten() for block in blocks])
        assert frames is not None
        if frames.device.type != "cuda":
            self._host = frames
            return
        self._host = torch.empty(frames.shape, dtype=frames.dtype, pin_memory=True)
        self._host.copy_(frames, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()

    def result(self) -> RunnerOutput:
        if self._host is None:
            return RunnerOutput(sampled_token_ids={})
        if self._copied is not None:
            self._copied.synchronize()
        frames = self._host.tolist()  # the step's ids (and codes, logprobs) on the host
        request_ids = self.request_ids
        sampled_logprobs: dict[str, TokenLogprobs] = {}
        prompt_logprobs: dict[str, list[TokenLogprobs]] = {}
        if self._blocks():
            width = 1 if self.codes is None else 1 + self.codes.shape[1]
            num_ids = 0 if self.ids is None else len(request_ids) * width
            flat, frames, offset = frames, _rows(frames[:num_ids], width), num_ids
            if self.logprobs is not None:
                block, rows, counts = self.logprobs
                read, offset = _read(flat, offset, block, counts)
                sampled_logprobs = {request_ids[j]: e for j, e in zip(rows, read, strict=True)}
            if self.prompt_logprobs is not None:
                scheduled_ids, (block, rows, counts) = self.prompt_logprobs
                read, offset = _read(flat, offset, block, counts)
                for j, entry in zip(rows, read, strict=True):
                    prompt_logprobs.setdefault(scheduled_ids[j], []).append(entry)
        if self.ids is None:  # a prompt chunk that samples nothing
            return RunnerOutput({}, {}, sampled_logprobs, prompt_logprobs)
        token_ids = dict(zip(request_ids, (f[0] for f in frames), strict=True))
        codes = {}
        if self.codes is not None:
            codes = {r: tuple(f[1:]) for r, f in zip(request_ids, frames, strict=True)}
        return RunnerOutput(token_ids, codes, sampled_logprobs, prompt_logprobs)

    def _id_frames(self) -> torch.Tensor | None:
        if self.ids is None:
            return None
        frames = self.ids.unsqueeze(1)
        return frames if self.codes is None else torch.cat([frames, self.codes], dim=1)

    def _blocks(self) -> list[LogprobFrames]:
        prompt = None if self.prompt_logprobs is None else self.prompt_logprobs[1]
        return [block for block in (self.logprobs, prompt) if block is not None]


def _rows(flat: list[Any], width: int) -> list[list[int]]:
    """Frames of `width` ids read back from float64 (exact)."""
    return [[int(v) for v in flat[i : i + width]] for i in range(0, len(flat), width)]


def _read(
    flat: list[float], offset: int, block: torch.Tensor, counts: list[int]
) -> tuple[list[TokenLogprobs], int]:
    """A block of logprob frames read from the packed copy at `offset`, and the offset after."""
    num_rows, width = block.shape
    rows = [flat[offset + i * width : offset + (i + 1) * width] for i in range(num_rows)]
    return read_logprobs(rows, counts), offset + num_rows * width
