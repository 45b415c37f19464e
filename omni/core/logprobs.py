"""TokenLogprobs: the log-probabilities returned with one sampled token (SamplingParams.logprobs).

They are the model's own: log_softmax of the raw logits in float32, before temperature,
penalties, logit bias and the top-k / top-p filters (as vLLM returns them by default, and what
transformers' `generate(output_logits=True)` gives). Torch-free: built on the host from the
step's one device-to-host copy.
"""

from __future__ import annotations

from typing import NamedTuple

MAX_LOGPROBS = 20
"""The most alternatives a request may ask for per token (OpenAI's top_logprobs bound)."""


class TokenLogprobs(NamedTuple):
    """One sampled token's log-probability and the most likely alternatives at its position."""

    logprob: float
    """log p(sampled token)."""
    top: tuple[tuple[int, float], ...]
    """The SamplingParams.logprobs most likely tokens as (token id, logprob), most likely first
    (ties by token id); empty when 0 were asked for."""
