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

Sampled rows are drawn among their candidates sorted by logit: with top-k and top-p both, one
sort serves both filters (top-p's mass is counted after top-k, as transformers' warpers do); when
every sampled row has 0 < top_k <= TOP_K_CAP, `topk` of the largest of them replaces the sort of
the whole vocabulary and everything after it works on those few columns (a 152k vocabulary, top_k
50: bench/sampler.py). A row's top-k keeps exactly its first k candidates (a tie at the k-th
logit is cut by position). A seeded row draws noise for its own candidates only (its top_k, else
the vocabulary), so its draw stays independent of the batch.
"""

from __future__ import annotations

import numpy as np
import torch

from omni.core.sampling_params import SamplingParams
from omni.runtime.host_upload import upload

_MASK = 2**63 - 1
TOP_K_CAP = 1024
"""The largest top_k served by `topk` instead of a sort of the whole vocabulary."""


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
            values, candidates = self._candidates(logits, rows, temperature, chosen, top_k, top_p)
            probs = values.softmax(dim=-1)
            uniform = torch.empty_like(probs)
            if unseeded:
                uniform[: len(unseeded)].uniform_(generator=self._generator(logits.device))
            for j, i in enumerate(seeded, start=len(unseeded)):
                seed = _seed_for(params[i].seed or 0, num_output_tokens[i])
                generator = torch.Generator(device=logits.device).manual_seed(seed)
                width = min(params[i].top_k or probs.shape[1], probs.shape[1])
                uniform[j, width:] = 0.5  # past its own top-k: probability 0 whatever the noise
                uniform[j, :width].uniform_(generator=generator)
            # argmax(p / E) with E = -log(U) ~ Exp(1) draws from p (the exponential race). U is
            # in [0, 1), so E > 0 (never 0 / 0); U = 0 (E = inf) only keeps that token out of
            # this draw. uniform_ then log: exponential_ costs ~7x more on the CPU.
            picked = (probs / uniform.log_().neg_()).argmax(dim=-1)
            if candidates is not None:
                picked = candidates.gather(1, picked.unsqueeze(1)).squeeze(1)
            token_ids.index_copy_(0, rows, picked)
        return token_ids

    @staticmethod
    def _candidates(
        logits: torch.Tensor,
        rows: torch.Tensor,
        temperature: torch.Tensor,
        chosen: list[SamplingParams],
        top_k: torch.Tensor | None,
        top_p: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(float32 logits / temperature, their token ids) of the sampled rows' candidates,
        filtered columns at -inf: sorted by logit when a filter applies (ids None: the whole
        vocabulary in order)."""
        k_max = max(p.top_k for p in chosen)
        if top_k is not None and min(p.top_k for p in chosen) > 0 and k_max <= TOP_K_CAP:
            # A positive temperature keeps the order: only k columns are converted and scaled.
            # When most rows sample, topk reads the logits in place (no copy of the rows).
            many = 2 * rows.numel() >= logits.shape[0]
            source = logits if many else logits.index_select(0, rows)
            values, ids = source.topk(min(k_max, logits.shape[1]), dim=-1)  # largest first
            if many:
                values, ids = values.index_select(0, rows), ids.index_select(0, rows)
            values = values.float() / temperature.unsqueeze(1)
        else:
            values = logits.index_select(0, rows).float() / temperature.unsqueeze(1)
            if top_k is None and top_p is None:
                return values, None
            values, ids = values.sort(dim=-1, descending=True)
        if top_k is not None:
            position = torch.arange(values.shape[1], device=values.device)
            values = values.masked_fill(position >= top_k.unsqueeze(1), float("-inf"))
        if top_p is not None:
            probs = values.softmax(dim=-1)
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            mass_before = probs.cumsum(dim=-1) - probs
            values = values.masked_fill(mass_before >= top_p.unsqueeze(1), float("-inf"))
        return values, ids

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
