"""Greedy, temperature, top-k, top-p and min-p sampling over a batch of logits rows.

A seeded request draws its n-th token from a generator seeded by (seed, n) alone, so its tokens
do not depend on which other requests share the batch, nor on preemption and recomputation.
Unseeded random rows share the sampler's generator and draw their noise in one call per group
(below).

Device-generic: the logits stay on their device (a GPU stage's), the generators live there too.
Nothing here makes the host wait for the device except the end: the per-row vectors
(rows, temperature, top_k, top_p) are built on the host and go over in one non_blocking copy
from pinned memory (omni/runtime/host_upload.py), and the chosen ids come back as Python ints in
one device-to-host copy, the step's only synchronisation. A greedy-only batch is one argmax over
the logits as they are (exact in any dtype: no float32 copy). The same seed draws different
numbers on a GPU than on the CPU (each device has its own generator algorithm); greedy rows are
the argmax everywhere.

Sampled rows go in up to three groups, by their own parameters only, so that what a row
computes never depends on the other rows (a seeded row's draw stays independent of the batch):
- top: 0 < top_k <= TOP_K_CAP. Its candidates are `topk(TOP_K_CAP)` of the row (the same width
  for every such row), largest first, ties by token id; its top-k keeps the first top_k of them
  and top-p (if set) counts the mass of those (as transformers' warpers apply them). Only these columns are
  converted, scaled and filtered: with a 152k vocabulary and Qwen's top_k 20 this is ~40x
  faster than a sort on the CPU (bench/sampler.py).
- sorted: any other top_k or a top_p: the whole vocabulary, sorted (stable: ties by token id),
  one sort for both filters.
- plain: temperature only: the whole vocabulary as it is.
A top-k keeps exactly its first k candidates (a tie at the k-th logit is cut by position). A
seeded row draws noise for its own candidates (its top_k, else the group's width). min_p comes
last (as in transformers' warpers): a candidate less likely than min_p times the most likely one
is cut, in any group.
"""

from __future__ import annotations

import numpy as np
import torch

from omni.core.sampling_params import SamplingParams
from omni.runtime.host_upload import upload
from omni.runtime.output_penalties import OutputPenalties

_MASK = 2**63 - 1
TOP_K_CAP = 256
"""The largest top_k served by `topk` (of this many columns) instead of a sort of the whole
vocabulary."""


def _seed_for(seed: int, num_output_tokens: int) -> int:
    return (seed * 1_000_003 + num_output_tokens * 7_919 + 17) & _MASK


class Sampler:
    def __init__(self, seed: int = 0, device: torch.device | str | None = None) -> None:
        self.seed = seed
        self.device = torch.device(device if device is not None else "cpu")
        # For unseeded random requests: one stream per device the logits come from.
        self._generators: dict[torch.device, torch.Generator] = {}
        self.generator = self._generator(self.device)
        self.penalties = OutputPenalties()  # presence/frequency: what each request generated

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
        adjusted: list[str] | None = None,
    ) -> list[int]:
        """logits [num_rows, vocab] on any device, any float dtype; one SamplingParams and output
        count per row. Returns the chosen ids (one device-to-host copy). all_greedy: the caller
        knows that every row is greedy (no per-row check; num_output_tokens is then unused).
        adjusted: see `sample`."""
        chosen = self.sample(
            logits, params, num_output_tokens, all_greedy=all_greedy, adjusted=adjusted
        )
        return chosen.tolist()

    def sample(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        num_output_tokens: list[int],
        *,
        all_greedy: bool = False,
        adjusted: list[str] | None = None,
    ) -> torch.Tensor:
        """As __call__, but the chosen ids stay on the logits' device ([num_rows] int64): a
        multi-code step samples more codes from them before the step's one host copy.
        adjusted: the rows' request ids, when any row has presence or frequency penalties
        (omni/runtime/output_penalties.py) or a logit bias: both apply before any row chooses,
        greedy rows included."""
        if adjusted is not None:
            penalized = self.penalties.apply(logits, adjusted, params)
            logits = _biased(penalized, params, copied=penalized is not logits)
        token_ids = self._choose(logits, params, num_output_tokens, all_greedy)
        if adjusted is not None:
            self.penalties.record(adjusted, params, token_ids)
        return token_ids

    def _choose(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        num_output_tokens: list[int],
        all_greedy: bool,
    ) -> torch.Tensor:
        token_ids = logits.argmax(dim=-1)
        random_rows = [] if all_greedy else [i for i, p in enumerate(params) if not p.greedy]
        if not random_rows:
            return token_ids
        groups: dict[str, list[int]] = {"top": [], "sorted": [], "plain": []}
        for i in random_rows:
            groups[_group(params[i])].append(i)
        # Within a group, unseeded rows first: their noise is one draw from the shared generator.
        for name, group in groups.items():
            groups[name] = [i for i in group if params[i].seed is None] + [
                i for i in group if params[i].seed is not None
            ]
        order = [i for group in groups.values() for i in group]
        vectors = self._vectors(order, [params[i] for i in order], logits)
        start = 0
        for name, group in groups.items():
            if group:
                end = start + len(group)
                rows, temperature, top_k, top_p, min_p = (v[start:end] for v in vectors)
                chosen = [params[i] for i in group]
                # A filter no row of the group sets is a no-op: its passes are skipped.
                top_k = top_k if any(p.top_k > 0 for p in chosen) else None
                top_p = top_p if any(p.top_p < 1 for p in chosen) else None
                values, candidates = _CANDIDATES[name](logits, rows, temperature, top_k, top_p)
                if any(p.min_p > 0 for p in chosen):
                    # p / p_max < min_p, in the log domain: values - max < log(min_p)
                    floor = values.max(dim=-1, keepdim=True).values + min_p.log().unsqueeze(1)
                    values = values.masked_fill(values < floor, float("-inf"))
                picked = self._race(values, chosen, group, num_output_tokens)
                if candidates is not None:
                    picked = candidates.gather(1, picked.unsqueeze(1)).squeeze(1)
                token_ids.index_copy_(0, rows, picked)
                start = end
        return token_ids

    def _race(
        self,
        values: torch.Tensor,
        chosen: list[SamplingParams],
        row_ids: list[int],
        num_output_tokens: list[int],
    ) -> torch.Tensor:
        """Each row's draw from softmax(values): argmax(p / E) with E = -log(U) ~ Exp(1) (the
        exponential race). U is in [0, 1), so E > 0 (never 0 / 0); U = 0 (E = inf) only keeps
        that token out of this draw. uniform_ then log: exponential_ costs ~7x more on the CPU."""
        probs = values.softmax(dim=-1)
        uniform = torch.empty_like(probs)
        num_unseeded = sum(p.seed is None for p in chosen)
        if num_unseeded:
            uniform[:num_unseeded].uniform_(generator=self._generator(values.device))
        for j in range(num_unseeded, len(chosen)):
            params = chosen[j]
            seed = _seed_for(params.seed or 0, num_output_tokens[row_ids[j]])
            generator = torch.Generator(device=values.device).manual_seed(seed)
            width = min(params.top_k or probs.shape[1], probs.shape[1])
            uniform[j, width:] = 0.5  # past its own top-k: probability 0 whatever the noise
            uniform[j, :width].uniform_(generator=generator)
        return (probs / uniform.log_().neg_()).argmax(dim=-1)

    @staticmethod
    def _vectors(
        order: list[int], chosen: list[SamplingParams], logits: torch.Tensor
    ) -> list[torch.Tensor]:
        """The sampled rows' indices, temperatures, top-k (the vocabulary where unset), top-p
        and min-p on the logits' device, in one upload."""
        vocab = logits.shape[-1]
        host: list[np.ndarray] = [
            np.asarray(order, dtype=np.int64),
            np.asarray([p.temperature for p in chosen], dtype=np.float32),
            np.asarray([min(p.top_k, vocab) if p.top_k > 0 else vocab for p in chosen], np.int64),
            np.asarray([p.top_p for p in chosen], dtype=np.float32),
            np.asarray([p.min_p for p in chosen], dtype=np.float32),
        ]
        return upload(host, logits.device)


def _biased(logits: torch.Tensor, params: list[SamplingParams], copied: bool) -> torch.Tensor:
    """The logits with each row's logit_bias added (float32 when any row has one); in place
    when `copied` (the penalties' float32 copy), else in a copy."""
    entries = [(j, t, b) for j, p in enumerate(params) for t, b in p.logit_bias]
    if not entries:
        return logits
    rows, tokens, biases = zip(*entries, strict=True)
    host: list[np.ndarray] = [np.asarray(rows, np.int64), np.asarray(tokens, np.int64),
                              np.asarray(biases, np.float32)]  # fmt: skip
    row_index, token_index, bias = upload(host, logits.device)
    # Not in place on the model's logits: they may be a graph's static output.
    out = logits if copied else logits.to(torch.float32, copy=True)
    return out.index_put_((row_index, token_index), bias, accumulate=True)


def _group(params: SamplingParams) -> str:
    if 0 < params.top_k <= TOP_K_CAP:
        return "top"
    return "sorted" if params.top_k > 0 or params.top_p < 1 else "plain"


Candidates = tuple[torch.Tensor, torch.Tensor | None]
"""(float32 logits / temperature, their token ids) of a group's rows, filtered columns at -inf;
ids None: the whole vocabulary in order."""


def _top(
    logits: torch.Tensor, rows: torch.Tensor, temperature: torch.Tensor,
    top_k: torch.Tensor | None, top_p: torch.Tensor | None,
) -> Candidates:  # fmt: skip
    # A positive temperature keeps the order: only the top columns are converted and scaled.
    # When most rows are in the group, topk reads the logits in place (no copy of the rows).
    many = 2 * rows.numel() >= logits.shape[0]
    source = logits if many else logits.index_select(0, rows)
    values, ids = source.topk(min(TOP_K_CAP, logits.shape[1]), dim=-1)  # largest first
    if many:
        values, ids = values.index_select(0, rows), ids.index_select(0, rows)
    # topk orders tied logits as its kernel does (per dtype: penalties or a bias elsewhere in the
    # batch make the logits float32): ties go by token id instead, as in the sorted group.
    ids, by_id = ids.sort(dim=-1)
    values, by_value = values.gather(1, by_id).sort(dim=-1, descending=True, stable=True)
    ids = ids.gather(1, by_value)
    return _filtered(values.float() / temperature.unsqueeze(1), top_k, top_p), ids


def _sorted(
    logits: torch.Tensor, rows: torch.Tensor, temperature: torch.Tensor,
    top_k: torch.Tensor | None, top_p: torch.Tensor | None,
) -> Candidates:  # fmt: skip
    values = logits.index_select(0, rows).float() / temperature.unsqueeze(1)
    values, ids = values.sort(dim=-1, descending=True, stable=True)
    return _filtered(values, top_k, top_p), ids


def _plain(
    logits: torch.Tensor, rows: torch.Tensor, temperature: torch.Tensor,
    top_k: torch.Tensor | None, top_p: torch.Tensor | None,
) -> Candidates:  # fmt: skip
    return logits.index_select(0, rows).float() / temperature.unsqueeze(1), None


def _filtered(
    values: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Candidates sorted largest first: past each row's top_k, then past the smallest prefix
    whose mass (of the top-k) reaches its top_p (the first always stays), at -inf."""
    if top_k is not None:
        position = torch.arange(values.shape[1], device=values.device)
        values = values.masked_fill(position >= top_k.unsqueeze(1), float("-inf"))
    if top_p is None:
        return values
    probs = values.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    # top_p 1 cuts nothing, even where rounding takes the running mass to 1.
    cut = (mass_before >= top_p.unsqueeze(1)) & (top_p < 1).unsqueeze(1)
    return values.masked_fill(cut, float("-inf"))


_CANDIDATES = {"top": _top, "sorted": _sorted, "plain": _plain}


_BIAS_TABLES: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def masked(logits: torch.Tensor, masks: list[np.ndarray | None], *, copy: bool) -> torch.Tensor:
    """The logits with each row's disallowed tokens at -inf; rows without a mask as they are. A
    mask is np.packbits of the row's allowed tokens (SamplingParams.json_schema,
    omni/core/json_constraint.py): rows and masks go over in one upload, and each packed byte
    becomes its 8 biases (0 or -inf) by one lookup on the logits' device, added to the rows.
    copy: leave `logits` as they are (logprobs read the model's own), else add in place."""
    rows = [i for i, mask in enumerate(masks) if mask is not None]
    if not rows:
        return logits
    stacked = np.stack([mask for mask in masks if mask is not None])
    packed, index = upload([stacked, np.array(rows, dtype=np.int64)], logits.device)
    key = (logits.device, logits.dtype)
    table = _BIAS_TABLES.get(key)
    if table is None:  # byte -> its 8 bits' biases, most significant first (as np.packbits)
        bits = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).astype(bool)
        table = torch.from_numpy(np.where(bits, 0.0, -np.inf)).to(logits.device, logits.dtype)
        table = _BIAS_TABLES[key] = table
    bias = table.index_select(0, packed.reshape(-1).int()).view(len(rows), -1)
    bias = bias[:, : logits.shape[1]]
    if len(rows) == logits.shape[0]:
        return logits + bias if copy else logits.add_(bias)
    out = logits.clone() if copy else logits
    return out.index_add_(0, index, bias)
