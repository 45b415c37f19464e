"""A request as the bookkeeping core sees it: token ids, multimodal ranges, cache keys, state."""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from omni.core.json_constraint import JsonCursor
from omni.core.logprobs import TokenLogprobs
from omni.core.sampling_params import SamplingParams


@dataclass(frozen=True)
class MultiModalInput:
    """A placeholder range [offset, offset + length) in the prompt, filled by one multimodal item.

    `identifier` is a content hash of the item: two items share it only when they are the same.
    """

    identifier: str
    offset: int
    length: int


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stopped"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "aborted"

    @property
    def finished(self) -> bool:
        return self.value in ("stopped", "length", "aborted")


class Request:
    """One sequence inside one stage. The scheduler owns its mutable state."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        *,
        mm_inputs: Iterable[MultiModalInput] = (),
        lora_id: str | None = None,
        cache_salt: str | None = None,
        generation_key: str | None = None,
        sampling_params: SamplingParams | None = None,
        eos_token_id: int | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = _check_token_ids(request_id, prompt_token_ids)
        self.mm_inputs = _check_mm_inputs(request_id, tuple(mm_inputs), len(self.prompt_token_ids))
        self.lora_id = lora_id
        self.cache_salt = cache_salt
        # What besides token ids determines the model's inputs at generated positions (e.g. a
        # talker's per-step thinker rows): keys every block holding a generated token.
        self.generation_key = generation_key
        # Whether any block can have extra keys (all four inputs above are fixed for life).
        self.has_block_extras = bool(self.mm_inputs) or any(
            key is not None for key in (lora_id, cache_salt, generation_key)
        )
        self.sampling_params = sampling_params or SamplingParams()
        self.eos_token_id = eos_token_id
        # SamplingParams.json_schema: its place in the JSON, advanced by every output token.
        self.constraint: JsonCursor | None = None
        # SamplingParams.min_tokens: np.packbits of the tokens that are not stop tokens.
        self.stop_mask: np.ndarray | None = None
        self.output_token_ids: list[int] = []
        # Multi-code steps: the residual codes sampled with each output token (same length as
        # output_token_ids once any step returned codes; RunnerOutput.sampled_codes).
        self.output_codes: list[tuple[int, ...]] = []
        # SamplingParams.logprobs: output token index -> its logprobs (RunnerOutput.sampled_logprobs).
        self.output_logprobs: dict[int, TokenLogprobs] = {}
        # SamplingParams.prompt_logprobs: prompt position (>= 1) -> its token's logprobs.
        self.prompt_logprobs: dict[int, TokenLogprobs] = {}
        self._all_token_ids = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        # Trailing output tokens that are placeholders for ids still on the device (a step in
        # flight: omni/core/provisional.py); never hashed, replaced in step order.
        self.num_provisional = 0
        self.num_cached_tokens = -1  # prefix-cache hit tokens at first scheduling; -1 = not yet
        self.status = RequestStatus.WAITING
        self.num_preemptions = 0
        # Positions whose inputs have arrived (None: all). A request whose upstream stage is still
        # generating its inputs (streaming) feeds nothing at or past this position until more come.
        self.input_limit: int | None = None
        # Memo of the full blocks' chained hashes and token bytes (block_hash.hash_request_blocks).
        self.block_hashes: list[bytes] = []
        self.block_token_bytes: list[bytes] = []
        self.block_hash_algo: str | None = None
        self.block_hash_size = 0

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt followed by the generated tokens (do not mutate; use append_output_token_ids)."""
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_known_tokens(self) -> int:
        """Tokens whose ids the host knows: all but the provisional ones."""
        return len(self._all_token_ids) - self.num_provisional

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def last_known_output(self) -> int:
        """The newest output token whose id the host has read (provisional ones come after)."""
        return self.output_token_ids[len(self.output_token_ids) - self.num_provisional - 1]

    @property
    def last_known_codes(self) -> tuple[int, ...]:
        """The residual codes of last_known_output (a multi-code stage's)."""
        return self.output_codes[len(self.output_codes) - self.num_provisional - 1]

    @property
    def last_known_logprobs(self) -> list[TokenLogprobs]:
        """The logprobs of last_known_output, as a list of one ([] when there are none)."""
        entry = self.output_logprobs.get(len(self.output_token_ids) - self.num_provisional - 1)
        return [] if entry is None else [entry]

    @property
    def logprobs(self) -> list[TokenLogprobs] | None:
        """Each output token's logprobs, when SamplingParams.logprobs asked for them."""
        if self.sampling_params.logprobs is None:
            return None
        return [self.output_logprobs[i] for i in range(len(self.output_token_ids))]

    @property
    def all_prompt_logprobs(self) -> list[TokenLogprobs | None] | None:
        """None for the first prompt token, then each later one's logprobs, when
        SamplingParams.prompt_logprobs asked for them."""
        if self.sampling_params.prompt_logprobs is None:
            return None
        return [None] + [self.prompt_logprobs[i] for i in range(1, self.num_prompt_tokens)]

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    @property
    def is_runnable(self) -> bool:
        """Whether it has a position to feed whose input has arrived."""
        return self.input_limit is None or self.num_computed_tokens < self.input_limit

    def num_feedable(self, start: int | None = None) -> int:
        """Tokens it could feed from `start` (default: num_computed_tokens) up to its last token,
        not past its input limit."""
        end = len(self._all_token_ids)
        if self.input_limit is not None:
            end = min(end, self.input_limit)
        return end - (self.num_computed_tokens if start is None else start)

    def allowed_tokens(self) -> np.ndarray | None:
        """The tokens its next sample may take, packed (None: any): its JSON's, and no stop token
        before min_tokens (unless its JSON value is whole: then only a stop may follow)."""
        mask = None if self.constraint is None else self.constraint.packed()
        if self.stop_mask is not None and self.num_output_tokens < self.sampling_params.min_tokens:
            both = self.stop_mask if mask is None else mask & self.stop_mask
            mask = both if mask is None or both.any() else mask
        return mask

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        if isinstance(token_ids, int):  # one sampled token: every decode step, every request
            self.output_token_ids.append(token_ids)
            self._all_token_ids.append(token_ids)
            if self.constraint is not None:
                self.constraint.advance(token_ids)
            return
        self.output_token_ids.extend(token_ids)
        self._all_token_ids.extend(token_ids)
        if self.constraint is not None:
            self.constraint.replay(self.output_token_ids)

    def set_output_token(self, index: int, token_id: int) -> None:
        """The real id of output token `index` (a provisional one until now)."""
        self.output_token_ids[index] = token_id
        self._all_token_ids[len(self.prompt_token_ids) + index] = token_id
        if self.constraint is not None:  # never: a constrained request is not run ahead
            self.constraint.replay(self.output_token_ids)

    def truncate_outputs(self, num_output_tokens: int) -> None:
        """Keep the first num_output_tokens outputs (those after a stop were provisional)."""
        del self.output_token_ids[num_output_tokens:]
        del self.output_codes[num_output_tokens:]
        for index in [i for i in self.output_logprobs if i >= num_output_tokens]:
            del self.output_logprobs[index]
        del self._all_token_ids[len(self.prompt_token_ids) + num_output_tokens :]
        self.num_provisional = 0
        if self.constraint is not None:
            self.constraint.replay(self.output_token_ids)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, num_tokens={self.num_tokens}, "
            f"num_computed_tokens={self.num_computed_tokens}, status={self.status.value})"
        )


def _check_token_ids(request_id: str, token_ids: Sequence[int]) -> list[int]:
    token_ids = list(token_ids)
    if not token_ids:
        raise ValueError(f"request {request_id!r}: prompt_token_ids is empty")
    try:  # the common case, checked at C speed: unsigned 32-bit integers
        struct.pack(f"<{len(token_ids)}I", *token_ids)
        return token_ids
    except struct.error:
        pass  # find and name the offending entry below
    for index, token_id in enumerate(token_ids):
        if type(token_id) is not int:
            try:  # numpy integers are fine; floats and strings are not
                if int(token_id) != token_id or isinstance(token_id, (bool, float, str)):
                    raise TypeError
                token_ids[index] = token_id = int(token_id)
            except (TypeError, ValueError):
                raise ValueError(
                    f"request {request_id!r}: prompt_token_ids[{index}] = {token_id!r} is not an integer"
                ) from None
        if token_id < 0:
            raise ValueError(
                f"request {request_id!r}: prompt_token_ids[{index}] = {token_id} is negative"
            )
        if token_id >= 2**32:
            raise ValueError(
                f"request {request_id!r}: prompt_token_ids[{index}] = {token_id} is too large"
            )
    return token_ids


def _check_mm_inputs(
    request_id: str, mm_inputs: tuple[MultiModalInput, ...], num_prompt_tokens: int
) -> tuple[MultiModalInput, ...]:
    ordered = tuple(sorted(mm_inputs, key=lambda item: item.offset))
    previous_end = 0
    for item in ordered:
        if item.length < 1 or item.offset < 0 or item.offset + item.length > num_prompt_tokens:
            raise ValueError(
                f"request {request_id!r}: multimodal input {item.identifier!r} range "
                f"[{item.offset}, {item.offset + item.length}) is outside the prompt of "
                f"{num_prompt_tokens} tokens"
            )
        if item.offset < previous_end:
            raise ValueError(
                f"request {request_id!r}: multimodal input {item.identifier!r} at offset "
                f"{item.offset} overlaps the previous input ending at {previous_end}"
            )
        previous_end = item.offset + item.length
    return ordered
