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
    """The rows that asked for logprobs: logprob_frames' (frames, rows, counts), read with the ids."""
    _host: torch.Tensor | None = field(default=None, repr=False)
    _host_logprobs: torch.Tensor | None = field(default=None, repr=False)
    _copied: Any = field(default=None, repr=False)  # CUDA event after the copy to _host

    def __post_init__(self) -> None:
        if self.ids is None:
            return
        frames = self.ids.unsqueeze(1)
        if self.codes is not None:
            frames = torch.cat([frames, self.codes], dim=1)
        on_device = [frames] if self.logprobs is None else [frames, self.logprobs[0]]
        if frames.device.type != "cuda":
            self._host, self._host_logprobs = (on_device + [None])[:2]
            return
        host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in on_device]
        for pinned, tensor in zip(host, on_device, strict=True):
            pinned.copy_(tensor, non_blocking=True)
        self._host, self._host_logprobs = (host + [None])[:2]
        self._copied = torch.cuda.Event()  # after both copies
        self._copied.record()

    def result(self) -> RunnerOutput:
        if self._host is None:
            return RunnerOutput(sampled_token_ids={})
        if self._copied is not None:
            self._copied.synchronize()
        frames = self._host.tolist()  # the step's ids (and codes) on the host
        request_ids = self.request_ids
        sampled_logprobs = {}
        if self.logprobs is not None and self._host_logprobs is not None:
            _, rows, counts = self.logprobs
            read = read_logprobs(self._host_logprobs.tolist(), counts)
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
