"""Every message that crosses a boundary (user <-> driver <-> backend <-> stage host <-> engine).

All are frozen dataclasses: a message is never changed after it is sent, only replaced
(`dataclasses.replace`). Containers inside them (dicts of tensors) are owned by the receiver.

The path of one request: the user's prompt becomes a `PromptInput` (entrypoints' prompt
processor); the driver sends each root stage a `StageInput` and every later stage a `RoutedInput`
(upstream payloads + the prompt), which that stage's host turns into a `StageInput` with the
edge's input processor. A stage reports `StageUpdate`s while it generates and one `Finished`
(a `StageResult` plus an opaque payload carrying its tensors) at the end. The driver hands the
user `OmniOutput` snapshots: one after every step that advanced the request, the last with
`finished=True`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omni.core.logprobs import TokenLogprobs
from omni.core.request import MultiModalInput
from omni.core.sampling_params import SamplingParams


@dataclass(frozen=True)
class PromptInput:
    """One user request after tokenization (and, for multimodal stages, preprocessing)."""

    request_id: str
    prompt_token_ids: list[int]
    text: str | None = None
    cache_salt: str | None = None
    mm_inputs: tuple[MultiModalInput, ...] = ()
    extras: Mapping[str, Any] = field(default_factory=dict)
    """Root-stage adapter inputs (pixel values, audio features, ...)."""
    original: Any = None
    """The prompt as the user gave it (returned in OmniOutput.prompt)."""


@dataclass(frozen=True)
class StageInput:
    """One request for one stage, ready for its engine."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    mm_inputs: tuple[MultiModalInput, ...] = ()
    cache_salt: str | None = None
    extras: Mapping[str, Any] = field(default_factory=dict)
    """Adapter-specific inputs: upstream embeddings, pixel values, audio features, ..."""
    generation_key: str | None = None
    """What besides token ids determines the inputs at generated positions (see Request)."""
    input_complete: bool = True
    """False: the upstream stage is still generating this input; `InputDelta`s bring the rest
    and the engine feeds only the positions whose inputs have arrived. The one name, in every
    message and engine, for "a stage takes input while its upstream still generates" (a stage
    with `stream.enabled`, on a stream_audio request); named for the state, since the engine
    flips it once the last piece is in. Default True: input that arrives whole."""
    step_rows: bool = False
    """Report each step's new per-token output rows in StageUpdate.tensors, so a consumer taking
    this stage's output as it is generated (input_complete=False there) has them before this
    request finishes. The one name for "an engine returns per-step rows"; default False: rows
    only in the finished result."""


@dataclass(frozen=True)
class RoutedInput:
    """A request for a stage with inputs; the edge's input processor runs where the stage runs."""

    request_id: str
    upstream: Mapping[str, Any]
    """Upstream stage name -> payload of its result (opaque: the backend resolves it)."""
    prompt: PromptInput
    """The original request, as the root stages got it (without large encoder inputs)."""
    sampling_params: SamplingParams
    input_complete: bool = True
    """False: the upstream results are partial (finish_reason None) and travel by value;
    `RoutedDelta`s bring the rest (StageInput.input_complete)."""
    step_rows: bool = False
    """As StageInput.step_rows (this stage has a consumer that takes its rows as they come)."""
    rows: DeferredRows | None = None
    """The partial upstream result's per-token rows (input_complete=False), resolved where
    this stage runs into that result's tensors: they never pass through the driver."""


@dataclass(frozen=True)
class RoutedDelta:
    """The next piece of a streaming request's upstream result, for a stage already running it;
    the edge's delta processor (omni/family.py: EdgeStreaming) turns it into an InputDelta."""

    request_id: str
    piece: StageResult
    """The upstream's new tokens (and, if the edge needs rows, their per-token tensors); its
    finish_reason is set on the last piece."""
    offset: int
    """Upstream tokens sent before this piece: pieces may arrive out of order and are applied
    in order."""
    rows: DeferredRows | None = None
    """The piece's per-token rows (an edge that needs rows), resolved where this stage runs
    into piece.tensors."""


@dataclass(frozen=True)
class DeferredRows:
    """Per-token rows of one request that stay with their producer until the consumer resolves
    them (StageHost's `resolve`): the request's rows in each of `parts` (step-row payloads, see
    StageUpdate.rows) in order, then those of `finished` (a finished result's payload) from row
    `skip` on. In-process the payloads are the values themselves; under Ray, object refs."""

    parts: tuple[Any, ...] = ()
    finished: Any = None
    skip: int = 0


@dataclass(frozen=True)
class InputDelta:
    """More input for a request a stage runs with input_complete=False."""

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    """Appended to the request's prompt (e.g. a vocoder's codec codes)."""
    extras: Mapping[str, Any] = field(default_factory=dict)
    """Adapter-specific new inputs (e.g. the thinker's new hidden-state rows)."""
    finished: bool = False
    """The upstream is done: no more input will come."""


@dataclass(frozen=True)
class StageResult:
    """One stage's result for one request; partial (no tensors) in unfinished snapshots."""

    request_id: str
    stage: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    """Generated token ids (so far, in an unfinished snapshot)."""
    finish_reason: str | None
    """stopped, length, aborted or error; None while the stage is still generating."""
    num_cached_tokens: int = 0
    """Prompt tokens served by the prefix cache when the request was first scheduled."""
    tensors: Mapping[str, Any] = field(default_factory=dict)
    """Per-token outputs for every fed token (prompt + generated but the last): cached rows
    followed by fresh rows, e.g. "hidden_states" [num_tokens, D]."""
    text: str | None = None
    audio: Any = None
    sample_rate: int | None = None
    error: str | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    logprobs: list[TokenLogprobs] | None = None
    """One per generated token (so far) when SamplingParams.logprobs asked; None otherwise."""
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    """One per prompt token (None for the first) when SamplingParams.prompt_logprobs asked;
    in the finished result only."""

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class StageUpdate:
    """A request advanced in a stage's engine step: the tokens that step generated.

    Read-only once built (dataclasses.replace makes changed copies). Not frozen: one is built
    per request per step, and a frozen dataclass costs four times as much to build."""

    request_id: str
    stage: str
    new_token_ids: list[int]
    num_cached_tokens: int
    tensors: Mapping[str, Any] = field(default_factory=dict)
    """New per-token output rows (step_rows requests): rows of the positions this step
    computed, continuing those reported before."""
    audio: Any = None
    """A new waveform chunk (a streaming vocoder), continuing the chunks reported before."""
    sample_rate: int | None = None
    rows: Any = None
    """What the host makes of `tensors` before the update leaves it: a payload of its step's
    rows ({request_id: {name: rows}} for every request of the step; an object ref under Ray)
    that the driver forwards to streaming consumers (DeferredRows) without reading it."""
    num_rows: int = 0
    """How many rows `rows` holds for this request."""
    new_codes: list[tuple[int, ...]] = field(default_factory=list)
    """Multi-code stages (Request.output_codes): the residual codes of each new token, so that a
    streaming consumer gets whole frames; empty otherwise."""
    new_logprobs: list[TokenLogprobs] = field(default_factory=list)
    """SamplingParams.logprobs: those of each new token; empty otherwise."""


@dataclass(frozen=True)
class Finished:
    """A stage finished a request: a result light enough to route, and the payload with tensors
    (the result itself in-process; an object-store reference under Ray)."""

    result: StageResult
    payload: Any


@dataclass(frozen=True)
class StageDied:
    """A stage's host (one of its replicas) is gone (its actor died); requests in it are lost.
    `restarting`: a new host is on its way and will take new requests."""

    stage: str
    error: str
    restarting: bool
    request_ids: frozenset[str] | None = None
    """The requests lost with it: those its replica held (a stage with other replicas goes on);
    None: every request in the stage."""


StageEvent = StageUpdate | Finished | StageDied


@dataclass(frozen=True)
class OmniOutput:
    """One request's state across all stages: a snapshot while it runs, the result at the end."""

    request_id: str
    stages: Mapping[str, StageResult]
    final: StageResult
    """The final stage's result once finished (the failing stage's on error); in an unfinished
    snapshot, the result of the furthest stage that has started."""
    prompt: Any = None
    error: str | None = None
    finished: bool = True


@dataclass(frozen=True)
class EngineOutput:
    """What one engine step produced: progress of running requests and the finished ones."""

    updates: list[StageUpdate] = field(default_factory=list)
    finished: list[StageResult] = field(default_factory=list)
    failed: Mapping[str, Exception] = field(default_factory=dict)
    """Requests that failed alone (the others in the step are unaffected); the stage host turns
    each into an error result."""
