"""Messages between engine, actor and pipeline, and the results users get back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omni.core.request import MultiModalInput
from omni.core.sampling_params import SamplingParams


@dataclass
class StageInput:
    """One request for one stage (pipeline -> actor -> engine)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    mm_inputs: tuple[MultiModalInput, ...] = ()
    cache_salt: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    """Adapter-specific inputs: upstream embeddings, pixel values, audio features, ..."""
    generation_key: str | None = None
    """What besides token ids determines the inputs at generated positions (see Request)."""


@dataclass
class StageResult:
    """One stage's result for one request (engine -> actor -> pipeline -> user)."""

    request_id: str
    stage: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    """Generated token ids."""
    finish_reason: str
    num_cached_tokens: int = 0
    """Prompt tokens served by the prefix cache when the request was first scheduled."""
    tensors: dict[str, Any] = field(default_factory=dict)
    """Per-token outputs for every fed token (prompt + generated but the last): cached rows
    followed by fresh rows, e.g. "hidden_states" [num_tokens, D]."""
    text: str | None = None
    audio: Any = None
    sample_rate: int | None = None
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class OmniOutput:
    request_id: str
    stages: dict[str, StageResult]
    final: StageResult
    prompt: Any = None
    error: str | None = None
