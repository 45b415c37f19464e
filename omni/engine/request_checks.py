"""check_request: what a stage refuses before a request is queued, each with a ValueError that
names the request and the limit (the engine leaves itself and the other requests untouched)."""

from __future__ import annotations

from collections.abc import Container

from omni.core.request import Request


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
    longest = min(max_model_len, request.num_prompt_tokens + request.sampling_params.max_tokens)
    num_blocks_needed = -(-longest // block_size)
    if num_blocks_needed > num_blocks:
        raise ValueError(
            f"request {request_id!r}: up to {longest} tokens need {num_blocks_needed} blocks, "
            f"but stage {stage!r} has num_blocks={num_blocks}"
        )
    if request_id in known:
        raise ValueError(f"request_id {request_id!r} is already in stage {stage!r}")
