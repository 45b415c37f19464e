"""Penalties on the tokens a request has seen, on the device: OpenAI's presence and frequency
penalties, and transformers' / vLLM's repetition penalty.

For a request whose SamplingParams set one, before its token is chosen (greedy or sampled):
- repetition_penalty: the logit of every token of its prompt or generated so far is divided by it
  where positive and multiplied by it where negative (first, on the model's logits, as
  transformers' and vLLM's);
- presence_penalty: the logit of every token it has generated goes down by it, and
  frequency_penalty: once per time it was generated (generated tokens only, not the prompt).
What each penalized request has generated is a row of one [slots, vocab] int32 count tensor on the
logits' device, added to from the sampled ids where they are (a step launched before its ids were
read counts them too), so nothing here waits for the device; its prompt is a row of a bool tensor
beside it, set from the prompt ids the runner notes when the request is admitted (`note_prompt`).
A row lives from the request's first penalized step to its release (finished or aborted), across
preemptions: recomputing a prompt samples nothing again. The rows take vocab x 5 bytes per
penalized request running (0.8 MB at a 152k vocabulary); the stage's memory profile samples its
largest step with penalties (ModelRunner.profile_forward), so the peak it measures holds the rows
of that many requests.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from omni.core.sampling_params import SamplingParams
from omni.runtime.host_upload import upload


class OutputPenalties:
    def __init__(self) -> None:
        self.counts: torch.Tensor | None = None  # [slots, vocab] int32, grown by doubling
        self.prompted: torch.Tensor | None = None  # [slots, vocab] bool: in the prompt
        self._slots: dict[str, int] = {}
        self._free: list[int] = []
        self._prompts: dict[str, Sequence[int]] = {}  # noted, their rows not yet made

    def note_prompt(self, request_id: str, prompt_token_ids: Sequence[int]) -> None:
        """The prompt of an admitted request with a repetition penalty (before its first step
        samples; a request already holding a row keeps it)."""
        if request_id not in self._slots:
            self._prompts[request_id] = prompt_token_ids

    def apply(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> torch.Tensor:
        """The logits with each penalized row penalized (float32 when any row is; the same
        tensor when none is)."""
        rows = [j for j, p in enumerate(params) if p.penalized]
        if not rows:
            return logits
        slots = [self._slot(request_ids[j], logits) for j in rows]
        assert self.counts is not None and self.prompted is not None
        host: list[np.ndarray] = [
            np.asarray(rows, dtype=np.int64),
            np.asarray(slots, dtype=np.int64),
            np.asarray([params[j].presence_penalty for j in rows], dtype=np.float32),
            np.asarray([params[j].frequency_penalty for j in rows], dtype=np.float32),
            np.asarray([params[j].repetition_penalty for j in rows], dtype=np.float32),
        ]
        row_index, slot_index, presence, frequency, repetition = upload(host, logits.device)
        counts = self.counts.index_select(0, slot_index).float()
        # A copy: the logits may be a CUDA graph's static output, read again later.
        out = logits.to(torch.float32, copy=True)
        selected = out.index_select(0, row_index)
        if any(params[j].repetition_penalty != 1 for j in rows):
            factor = repetition.unsqueeze(1)
            seen = self.prompted.index_select(0, slot_index) | (counts > 0)
            scaled = torch.where(selected > 0, selected / factor, selected * factor)
            selected = torch.where(seen, scaled, selected)
        selected -= presence.unsqueeze(1) * (counts > 0) + frequency.unsqueeze(1) * counts
        return out.index_copy_(0, row_index, selected)

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
        """Forget finished or aborted requests' rows (they are reused)."""
        for request_id in request_ids:
            self._prompts.pop(request_id, None)
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
            self.prompted = torch.zeros(4, vocab, dtype=torch.bool, device=logits.device)
            self._slots.clear()
            self._free = list(range(3, -1, -1))
        assert self.prompted is not None
        if not self._free:
            size = self.counts.shape[0]
            self.counts = torch.cat([self.counts, torch.zeros_like(self.counts)])
            self.prompted = torch.cat([self.prompted, torch.zeros_like(self.prompted)])
            self._free = list(range(2 * size - 1, size - 1, -1))
        slot = self._free.pop()
        self.counts[slot].zero_()
        self.prompted[slot].zero_()
        prompt = [t for t in self._prompts.pop(request_id, ()) if 0 <= t < vocab]
        if prompt:
            (ids,) = upload([np.asarray(prompt, dtype=np.int64)], logits.device)
            self.prompted[slot].index_fill_(0, ids, True)
        self._slots[request_id] = slot
        return slot
