"""Greedy, temperature, top-k and top-p sampling over a batch of logits rows.

A seeded request draws its n-th token from a generator seeded by (seed, n) alone, so its tokens
do not depend on which other requests share the batch, nor on preemption and recomputation.
Unseeded random rows share the sampler's generator and draw their noise in one call.

Device-generic: the logits stay on their device (a GPU stage's), the generators live there too.
Nothing here makes the host wait for the device except the end: the per-row vectors
(rows, temperature, top_k, top_p) are built on the host and go over in one non_blocking copy
from pinned memory (omni/runtime/host_upload.py), and the chosen ids come back as Python ints in
one device-to-host copy, the step's only synchronisation. A greedy-only batch is one argmax over
the logits as they are (exact in any dtype: no float32 copy). The same seed draws different
numbers on a GPU than on the CPU (each device has its own generator algorithm); greedy rows are
the argmax everywhere.
"""

from __future__ import annotations

import numpy as np
import torch

from omni.core.sampling_params import SamplingParams
from omni.runtime.host_upload import upload

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
        *,
        all_greedy: bool = False,
    ) -> list[int]:
        """logits [num_rows, vocab] on any device, any float dtype; one SamplingParams and output
        count per row. Returns the chosen ids (one device-to-host copy). all_greedy: the caller
        knows that every row is greedy (no per-row check; num_output_tokens is then unused)."""
        return self.sample(logits, params, num_output_tokens, all_greedy=all_greedy).tolist()

    def sample(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        num_output_tokens: list[int],
        *,
        all_greedy: bool = False,
    ) -> torch.Tensor:
        """As __call__, but the chosen ids stay on the logits' device ([num_rows] int64): a
        multi-code step samples more codes from them before the step's one host copy."""
        token_ids = logits.argmax(dim=-1)
        random_rows = [] if all_greedy else [i for i, p in enumerate(params) if not p.greedy]
        if random_rows:
            # Unseeded rows first: their noise is one draw from the shared generator.
            unseeded = [i for i in random_rows if params[i].seed is None]
            seeded = [i for i in random_rows if params[i].seed is not None]
            order = unseeded + seeded
            chosen = [params[i] for i in order]
            rows, temperature, top_k, top_p = self._vectors(order, chosen, logits)
            probs = self._probs(logits.index_select(0, rows).float(), temperature, top_k, top_p)
            noise = torch.empty_like(probs)
            if unseeded:
                noise[: len(unseeded)].exponential_(generator=self._generator(logits.device))
            for j, i in enumerate(seeded, start=len(unseeded)):
                seed = _seed_for(params[i].seed or 0, num_output_tokens[i])
                generator = torch.Generator(device=logits.device).manual_seed(seed)
                noise[j].exponential_(generator=generator)
            # argmax(p / E) with E ~ Exp(1) draws from p (the exponential race).
            token_ids.index_copy_(0, rows, (probs / noise).argmax(dim=-1))
        return token_ids

    @staticmethod
    def _vectors(
        order: list[int], chosen: list[SamplingParams], logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The sampled rows' indices, temperatures, top-k and top-p on the logits' device, in one
        upload; top_k / top_p are None when no row uses them (decided on the host)."""
        vocab = logits.shape[-1]
        top_k = [min(p.top_k, vocab) if p.top_k > 0 else vocab for p in chosen]
        use_top_k = any(p.top_k > 0 for p in chosen)
        use_top_p = any(p.top_p < 1 for p in chosen)
        host: list[np.ndarray] = [
            np.asarray(order, dtype=np.int64),
            np.asarray([p.temperature for p in chosen], dtype=np.float32),
            np.asarray(top_k, dtype=np.int64),
            np.asarray([p.top_p for p in chosen], dtype=np.float32),
        ]
        rows, temperature, k, p = upload(host, logits.device)
        return rows, temperature, (k if use_top_k else None), (p if use_top_p else None)

    @staticmethod
    def _probs(
        logits: torch.Tensor,
        temperature: torch.Tensor,
        top_k: torch.Tensor | None,
        top_p: torch.Tensor | None,
    ) -> torch.Tensor:
        logits = logits / temperature.unsqueeze(1)
        if top_k is not None:
            kth = logits.sort(dim=-1, descending=True).values.gather(1, (top_k - 1).unsqueeze(1))
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if top_p is not None:
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            sorted_probs = sorted_logits.softmax(dim=-1)
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            drop = mass_before >= top_p.unsqueeze(1)
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
        return logits.softmax(dim=-1)
