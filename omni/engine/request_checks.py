"""A stage's new request: `new_request` builds it (max_tokens None made concrete, its JSON cursor
when it asks for JSON, its mask of the tokens that do not stop it when it sets min_tokens), `check_request` is what a stage refuses before it is queued, each with a
ValueError that names the request and the limit (the engine leaves itself and the other
requests untouched)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Container

import numpy as np

from omni.core.request import Request
from omni.core.sampling_params import SamplingParams
from omni.engine.json_outputs import JsonOutputs
from omni.messages import StageInput


def new_request(
    stage_input: StageInput,
    max_request_tokens: int,
    eos_token_id: int | None,
    json_outputs: JsonOutputs,
) -> Request:
    params = until_end(stage_input, max_request_tokens)
    request = Request(
        stage_input.request_id,
        stage_input.prompt_token_ids,
        mm_inputs=stage_input.mm_inputs,
        cache_salt=stage_input.cache_salt,
        generation_key=stage_input.generation_key,
        sampling_params=params,
        eos_token_id=eos_token_id,
    )
    try:
        request.constraint = json_outputs.cursor(params)
    except ValueError as e:
        raise ValueError(f"request {request.request_id!r}: {e}") from None
    if params.min_tokens > 0:
        eos = () if eos_token_id is None or params.ignore_eos else (eos_token_id,)
        stops = tuple(sorted({*params.stop_token_ids, *eos}))
        request.stop_mask = _not_stopping(json_outputs.vocab_size, stops)
    return request


@functools.lru_cache(maxsize=64)
def _not_stopping(vocab_size: int, stop_token_ids: tuple[int, ...]) -> np.ndarray:
    """np.packbits of the tokens that are not stop tokens (read only: shared by requests)."""
    allowed = np.ones(vocab_size, dtype=bool)
    allowed[[t for t in stop_token_ids if t < vocab_size]] = False
    packed = np.packbits(allowed)
    packed.flags.writeable = False
    return packed


def check_request(
    request: Request,
    *,
    stage: str,
    max_model_len: int,
    vocab_size: int,
    block_size: int,
    num_blocks: int,
    known: Container[str],
) -> None:
    """known: the request ids the stage already holds."""
    request_id = request.request_id
    if request.num_prompt_tokens > max_model_len:
        raise ValueError(
            f"request {request_id!r}: prompt of {request.num_prompt_tokens} tokens is longer "
            f"than max_model_len={max_model_len}"
        )
    prompt = request.prompt_token_ids
    if prompt and max(prompt) >= vocab_size:  # max at C speed: prompts run to 100k tokens
        bad = next(t for t in prompt if t >= vocab_size)
        raise ValueError(
            f"request {request_id!r}: token id {bad} is outside the vocabulary of "
            f"{vocab_size} (stage {stage!r})"
        )
    biased = [t for t, _ in request.sampling_params.logit_bias if t >= vocab_size]
    if biased:  # a device-side index error would end the stage
        raise ValueError(
            f"request {request_id!r}: logit_bias token id {biased[0]} is outside the vocabulary "
            f"of {vocab_size} (stage {stage!r})"
        )
    max_tokens = request.sampling_params.max_tokens
    longest = min(max_model_len, request.num_prompt_tokens + (max_tokens or max_model_len))
    num_blocks_needed = -(-longest // block_size)
    if num_blocks_needed > num_blocks:
        raise ValueError(
            f"request {request_id!r}: up to {longest} tokens need {num_blocks_needed} blocks, "
            f"but stage {stage!r} has num_blocks={num_blocks}"
        )
    if request_id in known:
        raise ValueError(f"request_id {request_id!r} is already in stage {stage!r}")


def until_end(stage_input: StageInput, max_request_tokens: int) -> SamplingParams:
    """The input's sampling params with max_tokens None (until the end of the context) made
    concrete: the room its prompt leaves in max_request_tokens (the stage's max_model_len, or
    its KV pool's tokens if fewer: a request needing more than the pool holds is refused)."""
    params = stage_input.sampling_params
    if params.max_tokens is not None:
        return params
    room = max_request_tokens - len(stage_input.prompt_token_ids)
    return dataclasses.replace(params, max_tokens=max(room, 1))
