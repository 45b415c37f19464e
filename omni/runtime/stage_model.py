"""The contract between the engines and a stage's model adapter (stages/<family>/).

An ar adapter (StageEngine, ModelRunner) is a `StageModel`; a generation adapter (GenerationEngine)
is a `GenerationModel`. Both subclass `StageModelBase`, which gives the optional hooks no-op
defaults, so the engines call them directly. What config validation knows about an adapter
without importing it (kind, text or not, outputs, accepted checkpoints) is its AdapterSpec in
its family's manifest (omni/family.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from omni.core.sampling_params import SamplingParams
from omni.core.scheduler_output import ScheduledRequest
from omni.messages import InputDelta, StageInput
from omni.runtime.attention import AttentionMetadata


@dataclass
class ModelInputs:
    """One step's packed batch: all fed tokens of all scheduled requests in a single row.

    Tensors are on the stage's device (`device`); request_extras hold what the stage received
    (CPU tensors from upstream stages), which an adapter moves to `device` where it uses them.
    Host-side facts (where each request's rows start, which positions it feeds) come from
    `scheduled` (see query_starts), so that adapters need no device-to-host read."""

    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64, absolute position of each fed token
    attn: AttentionMetadata
    scheduled: list[ScheduledRequest]  # in packing order; attn.query_start_loc delimits them
    request_extras: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # stage inputs

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    @property
    def query_starts(self) -> list[int]:
        """attn.query_start_loc on the host: request i owns rows [starts[i], starts[i + 1]) and
        feeds positions num_computed_tokens + [0, len(token_ids))."""
        starts = [0]
        for entry in self.scheduled:
            starts.append(starts[-1] + len(entry.token_ids))
        return starts


@dataclass
class ModelOutputs:
    hidden_states: torch.Tensor  # [num_tokens, hidden] last layer, after the final norm
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # other outputs of the forward


@dataclass
class DecodeInputs:
    """What a padded (CUDA-graph) step feeds besides token ids, for its n real rows."""

    positions: np.ndarray  # [decode_position_rows, n] int64, on the host
    embeds: torch.Tensor | None = None  # [n, decode_embed_dim] on the device (adapter-built rows)


class StageModelBase:
    """Base class of every stage adapter: no-op defaults for the hooks an adapter may override."""

    decode_position_rows = 1
    """Rows of the positions decode_forward takes: 1, or 3 for mrope models."""
    decode_embed_dim = 0
    """Width of the per-row inputs decode_forward takes besides ids (0: none)."""
    decode_suffixes = True
    """Whether decode_prepare may take one request's multi-token suffix (else decode only)."""
    decode_ids_on_device = False
    """Whether a decode step may feed ids that are still on the device (decode_prepare reads
    no fed id and no sampled code on the host): engine.async_scheduling may launch it ahead."""

    def decode_graph_blocker(self) -> str | None:
        """Why this model's decode steps cannot be padded and captured as CUDA graphs (None: they
        can, through decode_prepare and decode_forward). Default: no capturable body."""
        return f"adapter {type(self).__name__} has no decode_forward"

    def decode_prepare(
        self,
        scheduled: list[ScheduledRequest],
        positions: np.ndarray,
        fed_frames: torch.Tensor | None = None,
    ) -> DecodeInputs | None:
        """Eagerly, before a padded step's body runs: its n fed tokens' inputs (a decode
        batch's, or one request's suffix; any entry may be is_new) from their absolute positions,
        with any per-request bookkeeping the step needs; None runs this step eagerly instead.
        fed_frames: [n, 1 + residual codes] a multi-code step launched ahead feeds, still on the
        device (its entries' token and fed codes are placeholders then); None otherwise, and
        always for single-code models."""
        return DecodeInputs(positions[None])

    def decode_forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionMetadata,
        embeds: torch.Tensor | None = None,
    ) -> ModelOutputs:
        """The capturable body of a padded step: ids [T], positions [rows, T] and embeds
        [T, decode_embed_dim] (None when that is 0) on the device. Tensor operations only (no
        host reads, no per-request Python state): a CUDA graph replays it with other values in
        the same buffers."""
        raise NotImplementedError(self.decode_graph_blocker())

    def check_inputs(self, stage_input: StageInput) -> None:
        """Called on add_request: raise ValueError (failing this request alone) for an input the
        model cannot run. Default: accept everything."""

    def sample_codes(
        self,
        hidden_states: torch.Tensor,
        token_ids: torch.Tensor,
        request_ids: list[str],
        params: list[SamplingParams],
        num_output_tokens: list[int],
    ) -> torch.Tensor | None:
        """Multi-code steps (one step emits several codes per request, e.g. a talker's codec
        frame): after the sampler chose each sampled row's token (token_ids [R], on the device)
        from compute_logits(hidden_states [R, H]), the residual codes of those rows, [R, C] int64
        on the device, sampled batched over all R rows with each row's params; they return to
        the engine with the token (RunnerOutput.sampled_codes) and come back with it when it is
        fed (ScheduledRequest.fed_codes). num_output_tokens is empty when every row is greedy
        (nothing seeded needs it). None (the default): one token per step. Called after every
        sampling, before the ids are read: where an adapter keeps a history of sampled ids on
        the device (the Qwen2.5-Omni talker's penalty), it records them here."""
        return None

    def release(self, request_ids: list[str]) -> None:
        """Called once these requests finished or were aborted: drop their per-request state
        (e.g. mrope positions). Default: nothing to drop."""

    def input_limit(self, request_id: str) -> int | None:
        """For a request added with input_complete=False (its upstream still generating): how
        many positions have their inputs so far (None: all). Default: None."""
        return None

    def extend_inputs(self, request_id: str, delta: InputDelta) -> int | None:
        """Take more input for a streaming request; returns its new input_limit. Default: this
        adapter cannot stream (the engine refuses input_complete=False unless overridden)."""
        raise ValueError(f"adapter {type(self).__name__} takes no streamed input")

    reserved_bytes: int = 0
    """Device bytes the adapter may come to hold between steps beyond its weights (e.g. an
    encoder cache on the GPU); a GPU stage's KV sizing counts them as taken. Default: 0."""

    def profile_extra_work(self) -> None:
        """Called while a GPU stage's memory is profiled, after one forward of its largest step:
        run what else a step may run (e.g. the encoders on one item of the largest size), so
        that its activations count in the peak. Default: nothing else."""


class StageModel(Protocol):
    """What an ar stage adapter provides (kind "ar": StageEngine and ModelRunner). Adapters load
    HF checkpoints with our paged attention, in `dtype`, on the device they are given
    (`cls(model_dir, dtype=..., device=...)`, default the CPU)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    eos_token_id: int | None
    dtype: torch.dtype

    def forward(self, inputs: ModelInputs) -> ModelOutputs:
        """Run the packed batch; `hidden_states` and every tensor in `extra` with one row per fed
        token are the per-token outputs (AdapterSpec.emits) cached and returned to the caller."""
        ...

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor: ...

    def check_inputs(self, stage_input: StageInput) -> None: ...

    def sample_codes(
        self,
        hidden_states: torch.Tensor,
        token_ids: torch.Tensor,
        request_ids: list[str],
        params: list[SamplingParams],
        num_output_tokens: list[int],
    ) -> torch.Tensor | None: ...

    def release(self, request_ids: list[str]) -> None: ...

    def input_limit(self, request_id: str) -> int | None: ...

    def extend_inputs(self, request_id: str, delta: InputDelta) -> int | None: ...

    # Read-only for the engine: an adapter may define them as attributes or as properties.
    @property
    def decode_position_rows(self) -> int: ...

    @property
    def decode_embed_dim(self) -> int: ...

    @property
    def decode_suffixes(self) -> bool: ...

    @property
    def decode_ids_on_device(self) -> bool: ...

    def decode_graph_blocker(self) -> str | None: ...

    def decode_prepare(
        self,
        scheduled: list[ScheduledRequest],
        positions: np.ndarray,
        fed_frames: torch.Tensor | None = None,
    ) -> DecodeInputs | None: ...

    def decode_forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionMetadata,
        embeds: torch.Tensor | None = None,
    ) -> ModelOutputs: ...


class GenerationModel(Protocol):
    """What a generation stage adapter provides (kind "generation": GenerationEngine), e.g. a
    vocoder: one `generate` call per request, no KV cache or sampling."""

    sample_rate: int
    """Samples per second of the waveforms `generate` returns."""

    def generate(self, stage_input: StageInput, seed: int) -> torch.Tensor:
        """The 1-D float32 waveform of one request, a CPU tensor whatever device the model runs
        on; `seed` seeds any noise it draws."""
        ...

    def check_inputs(self, stage_input: StageInput) -> None: ...


@runtime_checkable
class BatchedGenerationModel(GenerationModel, Protocol):
    """A generation adapter that decodes several whole requests in one call (its engine does so
    where engine.batch_whole_requests resolves true)."""

    def generate_batch(
        self, stage_inputs: Sequence[StageInput], seeds: Sequence[int]
    ) -> list[torch.Tensor]:
        """Each request's waveform, as `generate` gives it alone (up to float rounding where the
        batch changes the kernels' summation order), in the order of `stage_inputs`."""
        ...


@dataclass(frozen=True)
class ChunkJob:
    """One output chunk of a streaming generation request (a vocoder decoding codec codes while
    its upstream stage still generates them): decode input tokens [start, end), seeing up to
    `left_context` tokens before and `look_ahead` tokens after them."""

    token_ids: tuple[int, ...]
    """The request's input tokens so far (a vocoder: codec codes)."""
    start: int
    end: int
    """The chunk: the output of input tokens [start, end) (0 <= start < end <= len(token_ids))."""
    left_context: int
    look_ahead: int
    """Context tokens on each side that the decode also sees (clamped to the tokens there are)."""
    input_complete: bool
    """No token will follow token_ids: the sequence end is a real end, not a cut."""
    seed: int
    """The request's seed: every chunk of a request draws the same noise at the same position."""
    extras: Mapping[str, Any] = field(default_factory=dict)
    """The request's adapter inputs (StageInput.extras), e.g. a vocoder's speaker."""


@runtime_checkable
class ChunkedGenerationModel(GenerationModel, Protocol):
    """A generation adapter that can also decode a streaming request chunk by chunk (requests
    added with input_complete=False)."""

    def chunk_defaults(self) -> tuple[int, int]:
        """(left_context, look_ahead) in input tokens when the stage config leaves them null."""
        ...

    def decode_chunks(self, jobs: list[ChunkJob]) -> list[torch.Tensor]:
        """The 1-D float32 waveform (a CPU tensor) of each job's chunk, batched in one call:
        each has (end - start) * samples-per-token samples, so a request's chunks join to its
        length."""
        ...
