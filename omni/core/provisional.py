"""Provisional tokens: a step scheduled before the previous step's sampled ids are read.

With one decode step in flight (omni/engine/step_pipeline.py) the next step is scheduled while
the tokens it feeds are still on the device. Each request that samples in a launched step gets
a placeholder token at once (`advance`: what a synchronous update does to its computed count,
with the token's id unknown); the next step feeds it (the runner takes the real ids from the
device); once the launched step's ids are read, `resolve` writes them over the placeholders, in
step order, and runs the stop checks a synchronous update would.

Invariants:
- a request's provisional tokens are its last `num_provisional` ones; nothing hashes or caches
  them (omni/core/block_hash.py, kv_cache_manager.py count known tokens only);
- a token that stops its request drops the provisional tokens after it: their KV, written by a
  step already launched, lies past the request's end, in blocks it then releases (the device
  runs that step before any later one that reuses them);
- a multi-code stage's residual codes follow its tokens: a placeholder with each provisional
  token (`with_codes`), replaced with it;
- advance followed at once by resolve is exactly Scheduler.update_from_output.
"""

from __future__ import annotations

from dataclasses import dataclass

from omni.core.request import Request, RequestStatus
from omni.core.scheduler import Scheduler
from omni.core.scheduler_output import RunnerOutput, SchedulerOutput

PLACEHOLDER = 0  # the id a provisional token has on the host; never fed (the device's id is)
PLACEHOLDER_CODES: tuple[int, ...] = ()  # a multi-code stage's provisional residual codes


@dataclass(slots=True)
class Provisional:
    request: Request
    index: int  # in request.output_token_ids


def advance(
    scheduler: Scheduler, scheduler_output: SchedulerOutput, *, with_codes: bool = False
) -> list[Provisional]:
    """A launched step's fed tokens are computed; each request that samples gets a placeholder
    for its token (with_codes: a multi-code step's, and for its residual codes). Returns the
    placeholders, in scheduling order (the sampled rows' order)."""
    pending = []
    requests, running = scheduler.requests, RequestStatus.RUNNING
    for entry in scheduler_output.scheduled:
        request = requests.get(entry.request_id)
        if request is None or request.status is not running:
            continue
        request.num_computed_tokens += len(entry.token_ids)
        if entry.sample:
            pending.append(Provisional(request, len(request.output_token_ids)))
            request.append_output_token_ids(PLACEHOLDER)
            if with_codes:
                request.output_codes.append(PLACEHOLDER_CODES)
            request.num_provisional += 1
    return pending


def resolve(
    scheduler: Scheduler,
    pending: list[Provisional],
    runner_output: RunnerOutput,
    appended: list[Request],
) -> list[Request]:
    """The step's real ids over its placeholders; returns the requests that finished (still
    holding their blocks, as update_from_output's). appended receives each request that got a
    token, in scheduling order."""
    finished = []
    requests, sampled = scheduler.requests, runner_output.sampled_token_ids
    codes = runner_output.sampled_codes
    for item in pending:
        request = item.request
        if requests.get(request.request_id) is not request or request.is_finished:
            continue  # aborted (or failed) since its step was launched
        token_id = sampled[request.request_id]
        request.set_output_token(item.index, token_id)
        if codes:  # a multi-code step: its residual codes over their placeholder too
            request.output_codes[item.index] = codes[request.request_id]
        logprobs = runner_output.sampled_logprobs.get(request.request_id)
        if logprobs is not None:
            request.output_logprobs[item.index] = logprobs
        request.num_provisional -= 1
        appended.append(request)
        status = scheduler.stop_status(request, token_id, num_output=item.index + 1)
        if status is not None:
            request.truncate_outputs(item.index + 1)
            request.status = status
            finished.append(request)
    scheduler.drop_finished(finished)
    return finished
