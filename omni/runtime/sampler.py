"""Greedy, temperature, top-k and top-p sampling over a batch of logits rows.

A seeded request draws its n-th token from a generator seeded by (seed, n) alone, so its tokens
do not depend on which other requests share the batch, nor on preemption and recomputation.

Device-generic: the logits stay on their device (a GPU stage's), the generators live there too,
and the chosen ids come back as Python ints in one device-to-host copy at the end, the step's
only synchronisation. The same seed draws different numbers on a GPU than on the CPU (each
device has its own generator algorithm); greedy rows are the argmax everywhere.
"""

from __future__ import annotations

import torch

from omni.core.sampling_params import SamplingParams

_MASK = 2**63 - 1


def _seed_for(seed: int, num_output_tokens: int) -> int:
    return (seed * 1_000_003 + num_output_tokens * 7_919 + 17) & _MASK


class Sampler:
    def __init__(self, seed: int = 0, device: torch.device | str | None = None) -> None:
        self.seed = seed
        self.device = torch.device(device if device is not None else "cpu")
        # For unseeded random requests: one stream per device the logits come from.
        self._generators: dict[torch.device, torch.Generator] = {}
        self.generator = self._generator(self.device)

    def _generator(self, device: torch.device) -> torch.Generator:
        generator = self._generators.get(device)
        if generator is None:
            generator = torch.Generator(device=device).manual_seed(self.seed)
            self._generators[device] = generator
        return generator

    def __call__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        num_output_tokens: list[int],
    ) -> list[int]:
        """logits [num_rows, vocab] float, on any device; one SamplingParams and output count
        per row. Returns the chosen ids (one device-to-host copy)."""
        logits = logits.float()
        device = logits.device
        token_ids = logits.argmax(dim=-1)
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        if random_rows:
            rows = torch.tensor(random_rows, device=device)
            probs = self._probs(logits[rows], [params[i] for i in random_rows])
            noise = torch.empty_like(probs)
            for j, i in enumerate(random_rows):
                seed = params[i].seed
                generator = (
                    self._generator(device)
                    if seed is None
                    else torch.Generator(device=device).manual_seed(
                        _seed_for(seed, num_output_tokens[i])
                    )
                )
                noise[j].exponential_(generator=generator)
            # argmax(p / E) with E ~ Exp(1) draws from p (the exponential race).
            token_ids[rows] = (probs / noise).argmax(dim=-1)
        return token_ids.tolist()

    @staticmethod
    def _probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        device = logits.device
        temperature = torch.tensor([p.temperature for p in params], device=device).unsqueeze(1)
        logits = logits / temperature
        top_k = [p.top_k for p in params]
        if any(top_k):
            vocab = logits.shape[-1]
            k = torch.tensor([min(k, vocab) if k > 0 else vocab for k in top_k], device=device)
            kth = logits.sort(dim=-1, descending=True).values.gather(1, (k - 1).unsqueeze(1))
            logits = logits.masked_fill(logits < kth, float("-inf"))
        top_p = torch.tensor([p.top_p for p in params])  # checked on the host: no sync
        if (top_p < 1).any():
            top_p = top_p.to(device)
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            sorted_probs = sorted_logits.softmax(dim=-1)
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            drop = mass_before >= top_p.unsqueeze(1)
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
        return logits.softmax(dim=-1)
