"""OpenAI's presence and frequency penalties, on the device.

For a request whose SamplingParams set either, the logit of every token it has generated so far
goes down by presence_penalty, and by frequency_penalty once per time it was generated, before
its token is chosen (greedy or sampled), as OpenAI and vLLM apply them (generated tokens only,
not the prompt). What each penalized request has generated is a row of one [slots, vocab] int32
count tensor on the logits' device, added to from the sampled ids where they are (a step
launched before its ids were read counts them too), so nothing here waits for the device. A
row lives from the request's first penalized step to its release (finished or aborted), across
preemptions: recomputing a prompt samples nothing again. The counts take vocab x 4 bytes per
penalized request running (0.6 MB at a 152k vocabulary); the stage's memory profile samples
its largest step with penalties (ModelRunner.profile_forward), so the peak it measures holds
the counts of that many requests.
"""

from __future__ import annotations

import numpy as np
import torch

from omni.core.sampling_params import SamplingParams
from omni.runtime.host_upload import upload


class OutputPenalties:
    def __init__(self) -> None:
        self.counts: torch.Tensor | None = None  # [slots, vocab] int32, grown by doubling
        self._slots: dict[str, int] = {}
        self._free: list[int] = []

    def apply(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> torch.Tensor:
        """The logits with each penalized row lowered by its request's counts (float32 when any
        row is; the same tensor when none is)."""
        rows = [j for j, p in enumerate(params) if p.penalized]
        if not rows:
            return logits
        slots = [self._slot(request_ids[j], logits) for j in rows]
        assert self.counts is not None
        host: list[np.ndarray] = [
            np.asarray(rows, dtype=np.int64),
            np.asarray(slots, dtype=np.int64),
            np.asarray([params[j].presence_penalty for j in rows], dtype=np.float32),
            np.asarray([params[j].frequency_penalty for j in rows], dtype=np.float32),
        ]
        row_index, slot_index, presence, frequency = upload(host, logits.device)
        counts = self.counts.index_select(0, slot_index).float()
        penalty = presence.unsqueeze(1) * (counts > 0) + frequency.unsqueeze(1) * counts
        # A copy: the logits may be a CUDA graph's static output, read again later.
        return logits.to(torch.float32, copy=True).index_add_(0, row_index, penalty, alpha=-1.0)

    def record(
        self, request_ids: list[str], params: list[SamplingParams], token_ids: torch.Tensor
    ) -> None:
        """Count each penalized row's chosen token (token_ids: [rows] on the counts' device)."""
        rows = [j for j, p in enumerate(params) if p.penalized]
        if not rows or self.counts is None:
            return
        slots = [self._slots[request_ids[j]] for j in rows]
        row_index, slot_index = upload(
            [np.asarray(rows, dtype=np.int64), np.asarray(slots, dtype=np.int64)],
            token_ids.device,
        )
        chosen = token_ids.index_select(0, row_index)
        ones = torch.ones_like(chosen, dtype=torch.int32)
        self.counts.index_put_((slot_index, chosen), ones, accumulate=True)

    def release(self, request_ids: list[str]) -> None:
        """Forget finished or aborted requests' counts (their rows are reused)."""
        for request_id in request_ids:
            slot = self._slots.pop(request_id, None)
            if slot is not None:
                self._free.append(slot)

    def _slot(self, request_id: str, logits: torch.Tensor) -> int:
        slot = self._slots.get(request_id)
        if slot is not None:
            return slot
        vocab = logits.shape[1]
        if self.counts is None or self.counts.shape[1] != vocab:
            self.counts = torch.zeros(4, vocab, dtype=torch.int32, device=logits.device)
            self._slots.clear()
            self._free = list(range(3, -1, -1))
        if not self._free:
            size = self.counts.shape[0]
            self.counts = torch.cat([self.counts, torch.zeros_like(self.counts)])
            self._free = list(range(2 * size - 1, size - 1, -1))
        slot = self._free.pop()
        self.counts[slot].zero_()
        self._slots[request_id] = slot
        return slot
