"""The Qwen3-Omni talker's residual codes: its code predictor, batched over a step's sampled rows.

A talker step samples each row's code 0 from `codec_head`; the other num_code_groups - 1 codes of
the frame come from the code predictor, as transformers' code-predictor generate makes them for
one request: the inputs [talker hidden, embedding of code 0], then one position per residual
code, each read by its own lm_head and fed back through its own embedding, with the predictor's
own small cache (sdpa). Greedy rows take the argmax; sampled rows draw with transformers'
predictor settings (top_k 50, top_p 0.8, temperature 1), seeded per request.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from omni.core.sampling_params import SamplingParams
from omni.runtime.sampler import Sampler


@torch.no_grad()
def residual_codes(
    talker: Any,
    sampler: Sampler,
    hidden_states: torch.Tensor,
    token_ids: torch.Tensor,
    params: list[SamplingParams],
    num_output_tokens: list[int],
) -> torch.Tensor:
    """[R, num_code_groups - 1] codes for the R sampled rows (hidden [R, H], code 0 [R])."""
    predictor = talker.code_predictor
    num_groups = talker.config.num_code_groups
    embeds = torch.stack([hidden_states, talker.get_input_embeddings()(token_ids)], dim=1)
    cache = DynamicCache(config=predictor.config)
    settings = [
        p if p.greedy else SamplingParams(temperature=1.0, top_k=50, top_p=0.8, seed=p.seed)
        for p in params
    ]
    codes: list[torch.Tensor] = []
    for group in range(num_groups - 1):
        if group:
            embeds = predictor.model.get_input_embeddings()[group - 1](codes[-1]).unsqueeze(1)
        out = predictor.model(inputs_embeds=embeds, past_key_values=cache, use_cache=True)
        logits = predictor.lm_head[group](out.last_hidden_state)[:, -1].float()
        # Each row's draw counter: its frames so far, then this group (seeded rows repeat).
        counts = [n * num_groups + group + 1 for n in num_output_tokens]
        codes.append(sampler.sample(logits, settings, counts))
    return torch.stack(codes, dim=1)
