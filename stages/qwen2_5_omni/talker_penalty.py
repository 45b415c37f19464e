"""SeenCodes: the talker's repetition penalty over a device-side seen-mask.

transformers' `generate` applies RepetitionPenaltyLogitsProcessor (penalty 1.05 by default) over
every codec id in the talker's sequence: its codec prompt ids and each code generated so far.
Here each running request owns one bool row of a device table [rows, codec_vocab]: its prompt
codec ids are marked by its first step (one index_put_ from the step's upload), each code it
generates right after it is sampled, from the sampled ids on the device (`mark_sampled`, so no
fed id is read on the host: a step ahead feeds ids not yet read). The sampled rows' logits are
penalized with one gather of their rows and one torch.where per distinct penalty value. No
per-row host-to-device copy and no host read. Row 0 is never marked: a sampled row without a
penalty (no request state, or penalty 1.0) reads it.

The arithmetic is transformers' (score * p where the score is negative, score / p elsewhere,
with p the same Python float), so the penalized logits are bit-identical.
"""

from __future__ import annotations

import torch

MIN_ROWS = 16


class SeenCodes:
    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.rows = torch.zeros(MIN_ROWS, vocab_size, dtype=torch.bool, device=device)
        self._true = torch.ones((), dtype=torch.bool, device=device)
        self._slots: dict[str, int] = {}
        self._free = list(range(MIN_ROWS - 1, 0, -1))  # popped from the end: 1 first

    def slot(self, key: str) -> int:
        """The key's row, given a cleared one on first use."""
        slot = self._slots.get(key)
        if slot is None:
            if not self._free:
                self._grow()
            slot = self._free.pop()
            self.rows[slot].zero_()  # a reused row: forget the previous request's codes
            self._slots[key] = slot
        return slot

    def release(self, key: str) -> None:
        slot = self._slots.pop(key, None)
        if slot is not None:
            self._free.append(slot)

    def mark(self, slots: torch.Tensor, codec_ids: torch.Tensor) -> None:
        """rows[slots[i], codec_ids[i]] = True (both on the table's device)."""
        self.rows.index_put_((slots, codec_ids), self._true)

    def mark_sampled(self, slots: torch.Tensor, token_ids: torch.Tensor) -> None:
        """Each sampled row's token into its seen row (slots [R]; rows reading row 0 write a
        False there, so row 0 stays unmarked); same as feeding it next, since a request's next
        step feeds it and its logits come after that feed."""
        self.rows.index_put_((slots, token_ids), slots != 0)

    def penalize(
        self,
        logits: torch.Tensor,
        slots: torch.Tensor,
        groups: torch.Tensor,
        penalties: list[float],
    ) -> torch.Tensor:
        """logits [R, vocab] float; slots [R]: each row's seen row (0: none); groups [R]: the
        index into `penalties` of each row's penalty (rows reading row 0 may have any)."""
        if not penalties:
            return logits
        seen = self.rows.index_select(0, slots)
        for group, penalty in enumerate(penalties):
            where = seen if len(penalties) == 1 else seen & (groups == group).unsqueeze(1)
            penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
            logits = torch.where(where, penalized, logits)
        return logits

    def _grow(self) -> None:
        old = self.rows
        num_old = old.shape[0]
        self.rows = old.new_zeros(2 * num_old, self.vocab_size)
        self.rows[:num_old].copy_(old)
        self._free.extend(range(2 * num_old - 1, num_old - 1, -1))
