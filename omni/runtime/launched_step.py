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

from omni.core.scheduler_output import RunnerOutput
from omni.runtime.token_logprobs import read_logprobs

LogprobFrames = tuple[torch.Tensor, list[int], list[int]]


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
    """The rows that asked for logprobs: logprob_frames' (frames, rows, counts). The ids (and
    codes) then go over as float64 (exact) beside the frames, in the same copy and read."""
    _host: torch.Tensor | None = field(default=None, repr=False)
    _copied: Any = field(default=None, repr=False)  # CUDA event after the copy to _host

    def __post_init__(self) -> None:
        if self.ids is None:
            return
        frames = self.ids.unsqueeze(1)
        if self.codes is not None:
            frames = torch.cat([frames, self.codes], dim=1)
        if self.logprobs is not None:
            frames = torch.cat([frames.double().flatten(), self.logprobs[0].flatten()])
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
        sampled_logprobs = {}
        if self.logprobs is not None:
            _, rows, counts = self.logprobs
            width = 1 if self.codes is None else 1 + self.codes.shape[1]
            frames, logprob_rows = _unpacked(frames, len(request_ids), width, len(rows))
            read = read_logprobs(logprob_rows, counts)
            sampled_logprobs = {request_ids[j]: entry for j, entry in zip(rows, read, strict=True)}
        if self.codes is None:
            token_ids = [f[0] for f in frames]
            return RunnerOutput(
                sampled_token_ids=dict(zip(request_ids, token_ids, strict=True)),
                sampled_logprobs=sampled_logprobs,
            )
        return RunnerOutput(
            sampled_token_ids={r: f[0] for r, f in zip(request_ids, frames, strict=True)},
            sampled_codes={r: tuple(f[1:]) for r, f in zip(request_ids, frames, strict=True)},
            sampled_logprobs=sampled_logprobs,
        )


def _unpacked(
    flat: list[float], num_rows: int, width: int, num_logprob_rows: int
) -> tuple[list[list[int]], list[list[float]]]:
    """A step's packed read: num_rows frames of width ids (float64, exact), then the logprob
    frames (logprob_frames' rows, all of one width)."""
    ids = [[int(v) for v in flat[i : i + width]] for i in range(0, num_rows * width, width)]
    rest = flat[num_rows * width :]
    step = len(rest) // num_logprob_rows
    return ids, [rest[i : i + step] for i in range(0, len(rest), step)]
