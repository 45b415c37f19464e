"""Typed messages between the scheduler, the model runner and the engine (torch-free)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from omni.core.logprobs import TokenLogprobs
from omni.core.request import MultiModalInput
from omni.core.sampling_params import SamplingParams


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step: which tokens to feed and where their KV goes.

    Read-only for everyone but the scheduler that builds it. Not a frozen dataclass: one is
    built per running request per step, and a frozen one costs four times as much to build."""

    request_id: str
    token_ids: list[int]
    """The tokens fed this step (a prefill chunk, or the last sampled token in decode)."""
    num_computed_tokens: int
    """Tokens already in the KV cache before this step (prefix hits included): the position of
    the first fed token."""
    new_block_ids: list[int]
    """Blocks appended to the request's block table this step."""
    is_new: bool
    """First step since admission or resumption after preemption: the runner starts a fresh
    block table from `new_block_ids` (which then include the prefix-hit blocks)."""
    sample: bool
    """The chunk reaches the end of the known tokens, so a token is sampled after it."""
    sampling_params: SamplingParams | None = None
    """Set when is_new."""
    mm_inputs: tuple[MultiModalInput, ...] = ()
    """Set when is_new: the request's multimodal ranges, for the stage adapter."""
    num_output_tokens: int = 0
    """Tokens generated so far (seeded sampling draws its n-th token from seed and n)."""
    fed_codes: tuple[tuple[int, ...], ...] = ()
    """Multi-code steps (RunnerOutput.sampled_codes): the residual codes sampled with each fed
    generated token, aligned with the last len(fed_codes) entries of token_ids; () otherwise."""
    prompt_targets: tuple[int, ...] = ()
    """SamplingParams.prompt_logprobs: the prompt token that follows each of the first
    len(prompt_targets) fed tokens (their logprobs are returned); () otherwise."""
    allowed_tokens: Any = None
    """SamplingParams.json_schema or min_tokens, when the step samples: the tokens the sample
    may take, as np.packbits of bool[vocab] (Request.allowed_tokens); None otherwise."""
    penalty_prompt: Sequence[int] = ()
    """Set when is_new with SamplingParams.repetition_penalty: the prompt it penalizes."""


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest]
    num_batched_tokens: int
    preempted_request_ids: list[str] = field(default_factory=list)
    """Requests preempted since the last step: their block tables are gone (they come back with
    is_new), but their per-request inputs stay."""

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(frozen=True)
class RunnerOutput:
    sampled_token_ids: dict[str, int]
    """request_id -> the token sampled this step, for requests whose chunk had `sample`."""
    sampled_codes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Multi-code steps: request_id -> the residual codes sampled after its token in the same
    step (a talker's codec frame beyond layer 0: the token is code 0, these codes 1..G-1). The
    token stays the sequence's token (KV, stop checks, prefix keys); the codes travel with it:
    Request.output_codes, ScheduledRequest.fed_codes when it is fed, the result's
    tensors["codes"]. Empty for single-token stages."""
    sampled_logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    """request_id -> its sampled token's logprobs, for requests with SamplingParams.logprobs."""
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    """request_id -> the logprobs of its ScheduledRequest.prompt_targets, in order."""
