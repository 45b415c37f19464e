"""Prompt logprobs (SamplingParams.prompt_logprobs): which prompt token follows each fed position
(the scheduler hands them to the runner: ScheduledRequest.prompt_targets), and recording what
the runner computed for them on the request (RunnerOutput.prompt_logprobs). A request that asks
is prefilled whole (no prefix-cache hits), so every prompt position is computed once; positions
recomputed after a preemption keep what they had. Torch-free."""

from __future__ import annotations

from omni.core.request import Request
from omni.core.scheduler_output import RunnerOutput, ScheduledRequest


def prompt_targets(request: Request, start: int, num_new: int) -> tuple[int, ...]:
    """The prompt tokens after each fed position in [start, start + num_new), for a request
    with SamplingParams.prompt_logprobs (the prompt's last position is followed by an output)."""
    if request.sampling_params.prompt_logprobs is None:
        return ()
    end = min(start + num_new, request.num_prompt_tokens - 1)
    return tuple(request.all_token_ids[start + 1 : end + 1])


def record_prompt_logprobs(
    request: Request, entry: ScheduledRequest, runner_output: RunnerOutput
) -> None:
    """The logprobs of the prompt tokens after the entry's fed positions, by position."""
    prompt = runner_output.prompt_logprobs.get(entry.request_id, [])
    for position, logprobs in enumerate(prompt, entry.num_computed_tokens + 1):
        request.prompt_logprobs.setdefault(position, logprobs)
