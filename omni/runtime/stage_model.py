"""The contract between the model runner and a stage's model adapter (stages/*.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from omni.core.scheduler_output import ScheduledRequest
from omni.runtime.attention import AttentionMetadata


@dataclass
class ModelInputs:
    """One step's packed batch: all fed tokens of all scheduled requests in a single row."""

    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64, absolute position of each fed token
    attn: AttentionMetadata
    scheduled: list[ScheduledRequest]  # in packing order; attn.query_start_loc delimits them
    request_extras: dict[str, dict] = field(default_factory=dict)  # per-request stage inputs


@dataclass
class ModelOutputs:
    hidden_states: torch.Tensor  # [num_tokens, hidden] last layer, after the final norm
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # other outputs of the forward


class StageModel(Protocol):
    """What a stage adapter provides. Adapters load HF checkpoints with our paged attention.

    An adapter that keeps per-request state (e.g. mrope positions) may also define
    `release(request_ids)`, called once those requests finished or were aborted.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    eos_token_id: int | None
    dtype: torch.dtype

    def forward(self, inputs: ModelInputs) -> ModelOutputs: ...

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor: ...
