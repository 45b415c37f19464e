"""Greedy, temperature, top-k and top-p sampling over a batch of logits rows.

A seeded request draws its n-th token from a generator seeded by (seed, n) alone, so its tokens
do not depend on which other requests share the batch, nor on preemption and recomputation.
"""

from __future__ import annotations

import torch

from omni.core.sampling_params import SamplingParams

_MASK = 2**63 - 1


def _seed_for(seed: int, num_output_tokens: int) -> int:
    return (seed * 1_000_003 + num_output_tokens * 7_919 + 17) & _MASK


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator().manual_seed(seed)  # for unseeded random requests

    def __call__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        num_output_tokens: list[int],
    ) -> list[int]:
        """logits [num_rows, vocab] float; one SamplingParams and output count per row."""
        logits = logits.float()
        token_ids = logits.argmax(dim=-1)
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        if random_rows:
            rows = torch.tensor(random_rows)
            probs = self._probs(logits[rows], [params[i] for i in random_rows])
            noise = torch.empty_like(probs)
            for j, i in enumerate(random_rows):
                seed = params[i].seed
                generator = (
                    self.generator
                    if seed is None
                    else torch.Generator().manual_seed(_seed_for(seed, num_output_tokens[i]))
                )
                noise[j].exponential_(generator=generator)
            # argmax(p / E) with E ~ Exp(1) draws from p (the exponential race).
            token_ids[rows] = (probs / noise).argmax(dim=-1)
        return token_ids.tolist()

    @staticmethod
    def _probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        temperature = torch.tensor([p.temperature for p in params]).unsqueeze(1)
        logits = logits / temperature
        top_k = [p.top_k for p in params]
        if any(top_k):
            vocab = logits.shape[-1]
            k = torch.tensor([min(k, vocab) if k > 0 else vocab for k in top_k])
            kth = logits.sort(dim=-1, descending=True).values.gather(1, (k - 1).unsqueeze(1))
            logits = logits.masked_fill(logits < kth, float("-inf"))
        top_p = torch.tensor([p.top_p for p in params])
        if (top_p < 1).any():
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            sorted_probs = sorted_logits.softmax(dim=-1)
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            drop = mass_before >= top_p.unsqueeze(1)
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
        return logits.softmax(dim=-1)
