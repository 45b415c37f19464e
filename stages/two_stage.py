"""A generic two-stage pipeline: causal LM A's hidden states become causal LM B's prompt embeds.

Edge `hidden_to_embeds` (A -> B): B's prompt token ids are the tokens A fed through its model
(A's prompt + A's generated tokens except the last, whose hidden state was never computed), so
they align 1:1 with the rows of A's tensors["hidden_states"]; those rows travel as
extras["prompt_embeds"].

Adapter `embeds_lm` (B): every fed token at a position < len(prompt_embeds) is embedded as the
projected upstream row; later positions (B's own generated tokens) use B's token embedding. The
projection from A's hidden size D_A to B's D_B is fixed and seeded, not learned:
W = randn(D_A, D_B, seed=PROJECTION_SEED) * rms(B's token embeddings) / sqrt(D_A), so projected
rows have about the scale of B's own embeddings. Any process builds the same W.

Padded (CUDA-graph) steps feed token embeddings only, so B takes them for decode positions alone
(`decode_prepare`): a step that feeds any prompt position (a lone short prefill, the last prompt
token after a prefix hit, a recomputed request) runs the eager forward, which adds the rows.

Prefix caching in B keys on its prompt token ids (plus cache salt and A's multimodal hashes),
not on the embeddings, which is sound because A is causal: A's hidden state at position i is a
function of A's tokens 0..i (and of the multimodal items and salt those tokens carry), so equal
token prefixes imply equal embedding prefixes. This holds as long as A's weights and sampling
are fixed for the lifetime of B's cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from omni.core.scheduler_output import ScheduledRequest
from omni.messages import PromptInput, StageInput, StageResult
from omni.runtime.stage_model import DecodeInputs, ModelInputs, ModelOutputs, StageModel
from stages.causal_lm import CausalLMAdapter

PROJECTION_SEED = 1234
RMS_ROWS = 8192  # embedding rows squared at a time when computing the projection scale
EMBEDS_KEY = "prompt_embeds"


def hidden_to_embeds(upstream: dict[str, StageResult], prompt: PromptInput) -> StageInput:
    if len(upstream) != 1:
        raise ValueError(f"expects exactly one upstream stage, got {sorted(upstream)}")
    (result,) = upstream.values()
    hidden = result.tensors.get("hidden_states")
    if hidden is None:
        raise ValueError(f"stage {result.stage!r} produced no hidden_states")
    fed = list(result.prompt_token_ids) + list(result.token_ids[:-1])
    if hidden.dim() != 2 or hidden.shape[0] != len(fed):
        raise ValueError(
            f"hidden_states of shape {tuple(hidden.shape)} do not align with the "
            f"{len(fed)} tokens stage {result.stage!r} fed"
        )
    return StageInput(
        request_id=result.request_id,
        prompt_token_ids=fed,
        mm_inputs=tuple(prompt.mm_inputs),  # A's multimodal hashes key B's prefix cache too
        cache_salt=prompt.cache_salt,
        extras={EMBEDS_KEY: hidden},
    )


class EmbedsLMAdapter(CausalLMAdapter):
    def __init__(
        self,
        model_dir: str,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__(model_dir, dtype=dtype, device=device)
        self._projections: dict[int, torch.Tensor] = {}  # upstream hidden size -> W
        # Each request's upstream rows on this stage's device, moved once (the extras the
        # engine keeps are the CPU tensors the stage received).
        self._embeds: dict[str, torch.Tensor] = {}

    def projection(self, upstream_dim: int) -> torch.Tensor:
        if upstream_dim not in self._projections:
            # Drawn on the CPU, so that every process and device builds the same W.
            generator = torch.Generator().manual_seed(PROJECTION_SEED)
            w = torch.randn(upstream_dim, self.hidden_size, generator=generator)
            table = self.model.get_input_embeddings().weight.detach()
            # The table's RMS, on its own device a slice of rows at a time: no host copy and no
            # float32 copy of the whole table (GBs on a GPU for a large vocabulary).
            squares = torch.zeros((), dtype=torch.float32, device=table.device)
            for rows in table.split(RMS_ROWS):
                squares += rows.float().pow(2).sum()
            scale = (squares.item() / table.numel()) ** 0.5 / upstream_dim**0.5
            self._projections[upstream_dim] = (w * scale).to(self.device, self.dtype)
        return self._projections[upstream_dim]

    def release(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._embeds.pop(request_id, None)

    def _upstream(self, request_id: str, upstream: torch.Tensor) -> torch.Tensor:
        embeds = self._embeds.get(request_id)
        if embeds is None:
            embeds = upstream.to(self.device, self.dtype, non_blocking=True)
            self._embeds[request_id] = embeds
        return embeds

    def check_inputs(self, stage_input: StageInput) -> None:
        """ValueError (failing this request alone) unless prompt_embeds fits the prompt."""
        embeds = stage_input.extras.get(EMBEDS_KEY)
        if embeds is None:
            return
        n = len(stage_input.prompt_token_ids)
        if not isinstance(embeds, torch.Tensor) or embeds.dim() != 2 or embeds.shape[0] != n:
            shape = tuple(embeds.shape) if isinstance(embeds, torch.Tensor) else type(embeds)
            raise ValueError(f"{EMBEDS_KEY} must be a [{n}, D] tensor, got {shape}")

    def decode_prepare(
        self,
        scheduled: list[ScheduledRequest],
        positions: np.ndarray,
        fed_frames: torch.Tensor | None = None,
    ) -> DecodeInputs | None:
        """Generated tokens only; None (eager) when an entry feeds a prompt position. A sampled
        entry ends at its last known token, so it starts inside the prompt exactly when it
        feeds more tokens than the request has generated."""
        if any(len(e.token_ids) > e.num_output_tokens for e in scheduled):
            return None
        return super().decode_prepare(scheduled, positions, fed_frames)

    def forward(self, inputs: ModelInputs) -> ModelOutputs:
        embeds = self.model.get_input_embeddings()(inputs.input_ids)
        starts = inputs.query_starts
        for i, entry in enumerate(inputs.scheduled):
            upstream = inputs.request_extras.get(entry.request_id, {}).get(EMBEDS_KEY)
            if upstream is None:
                continue
            # The entry feeds positions first, first + 1, ... (host-side: no device read); those
            # below the upstream's length take its projected rows.
            first = entry.num_computed_tokens
            num_used = min(max(upstream.shape[0] - first, 0), starts[i + 1] - starts[i])
            if num_used:
                rows = self._upstream(entry.request_id, upstream)[first : first + num_used]
                lo = starts[i]
                embeds[lo : lo + num_used] = rows @ self.projection(upstream.shape[1])
        out = self.model.model(
            inputs_embeds=embeds.unsqueeze(0),
            position_ids=inputs.positions.unsqueeze(0),
            use_cache=False,
            omni_attn=inputs.attn,
        )
        return ModelOutputs(hidden_states=out.last_hidden_state[0])


if TYPE_CHECKING:  # mypy checks the adapter against the contract its engine calls it by
    _CONTRACT: type[StageModel] = EmbedsLMAdapter
