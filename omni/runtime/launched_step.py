"""LaunchedStep: a step whose forward, logits and sampling are queued on the device; `result`
reads its sampled ids (the step's one device-to-host copy, where the host waits for the GPU)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from omni.core.scheduler_output import RunnerOutput


@dataclass(frozen=True)
class FedIds:
    """Token ids a step feeds from the device: `ids` (a launched step's sampled ids) at `rows`,
    one row per scheduled request, in order."""

    ids: torch.Tensor
    rows: np.ndarray


@dataclass
class LaunchedStep:
    request_ids: list[str]
    """The requests that sample, in the order of their rows in `ids`."""
    ids: torch.Tensor | None = None
    """[rows] sampled token ids on the runner's device (None: nothing samples)."""
    codes: torch.Tensor | None = None
    """[rows, codes] a multi-code step's residual codes, read in the same copy."""

    def result(self) -> RunnerOutput:
        if self.ids is None:
            return RunnerOutput(sampled_token_ids={})
        request_ids = self.request_ids
        if self.codes is None:
            token_ids = self.ids.tolist()  # the step's one device-to-host copy
            return RunnerOutput(sampled_token_ids=dict(zip(request_ids, token_ids, strict=True)))
        # A multi-code step: the token and its residual codes come back in one copy.
        frames = torch.cat([self.ids.unsqueeze(1), self.codes], dim=1).tolist()
        return RunnerOutput(
            sampled_token_ids={r: f[0] for r, f in zip(request_ids, frames, strict=True)},
            sampled_codes={r: tuple(f[1:]) for r, f in zip(request_ids, frames, strict=True)},
        )
