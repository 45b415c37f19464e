"""Continuous batching with chunked prefill, prefix-cache lookup and preemption by recompute.

Each step: running requests first (decodes and unfinished prefill chunks, oldest first), then
waiting ones in arrival order, all under a token budget and a sequence cap. A running request
waiting for input (its upstream stage still generating it: `Request.input_limit`) is skipped
without holding the others back; it keeps its blocks and its place. When the pool cannot
hold a running request's next tokens, the most recently admitted running request is preempted:
its blocks are freed (their cached prefix usually survives) and it waits at the front of the
queue, to be resumed later by recomputing only what the prefix cache no longer holds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from omni.core.kv_cache_manager import KVCacheManager
from omni.core.prompt_logprobs import prompt_targets, record_prompt_logprobs
from omni.core.request import Request, RequestStatus
from omni.core.scheduler_output import RunnerOutput, ScheduledRequest, SchedulerOutput


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096


# Given a request's prefix-hit block ids and the set of blocks whose rows this step will write,
# how many leading hits may be used (the stage-output cache may refuse stale rows).
HitFilter = Callable[[list[int], set[int]], int]


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache_manager: KVCacheManager,
        *,
        hit_filter: HitFilter | None = None,
    ) -> None:
        self.config = config
        self.kv = kv_cache_manager
        self.block_size = kv_cache_manager.block_size
        self.hit_filter = hit_filter
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._preempted_ids: list[str] = []
        self.num_preemptions = 0
        self.num_hit_blocks_refused = 0  # prefix hits dropped by hit_filter (recomputed)

    # ---- requests in and out ------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in this stage")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """Abort (or fail) requests between steps; their blocks are freed at once."""
        finished = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None or request.is_finished:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.status = status
            finished.append(request)
            self.release(request)
        return finished

    def release(self, request: Request) -> None:
        """Free a finished request's blocks and forget it."""
        self.kv.free(request)
        self.requests.pop(request.request_id, None)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def has_ready_work(self) -> bool:
        """Whether a step would feed anything (not every request is waiting for input)."""
        return bool(self.waiting) or any(r.is_runnable for r in self.running)

    # ---- scheduling ---------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        pending_rows: set[int] = set()  # blocks whose output rows this step's forward writes

        # Running requests, oldest first; preempt from the back when blocks run out. Once per
        # running request per step (a decode step's whole host loop): kept to plain local work.
        index = 0
        running, allocate_slots = self.running, self.kv.allocate_slots
        hit_filter, block_size = self.hit_filter, self.block_size
        while index < len(running) and budget > 0:
            request = running[index]
            num_new = min(request.num_feedable(), budget)
            if num_new <= 0:
                index += 1  # waiting for its upstream's next input
                continue
            while (new_block_ids := allocate_slots(request, num_new)) is None:
                victim = running.pop()
                self._preempt(victim)
                if victim is request:
                    break
            if new_block_ids is None:
                break  # the request preempted itself; everything after it was preempted too
            start = request.num_computed_tokens
            all_token_ids = request.all_token_ids
            entry = ScheduledRequest(
                request.request_id,
                all_token_ids[start : start + num_new],
                start,
                new_block_ids,
                False,
                start + num_new == len(all_token_ids),
                None,
                (),
                len(request.output_token_ids),
                self._fed_codes(request, start, num_new) if request.output_codes else (),
                # decode steps (past the prompt) skip the call
                prompt_targets(request, start, num_new)
                if start < request.num_prompt_tokens
                else (),
            )
            if entry.sample and not (request.constraint is None and request.stop_mask is None):
                entry.allowed_tokens = request.allowed_tokens()
            scheduled.append(entry)
            if hit_filter is not None and (start + num_new) // block_size > start // block_size:
                self._note_pending(request, num_new, pending_rows)  # it fills a block
            budget -= num_new
            index += 1

        # Waiting requests in order; stop at the first that does not fit (no overtaking). A step
        # that had to preempt admits nobody: the pool is full and the victim would come back.
        preempted_now = bool(self._preempted_ids)
        while (
            not preempted_now
            and self.waiting
            and budget > 0
            and len(self.running) < self.config.max_num_seqs
        ):
            request = self.waiting[0]
            # prompt_logprobs: every prompt position is computed, so no hit is taken.
            whole = request.sampling_params.prompt_logprobs is not None
            hit_ids, num_hit_tokens = ([], 0) if whole else self.kv.get_computed_blocks(request)
            if request.input_limit is not None:  # a hit may not end past the inputs that came
                num_within = max(request.input_limit - 1, 0) // self.block_size
                hit_ids = hit_ids[:num_within]
                num_hit_tokens = min(num_hit_tokens, num_within * self.block_size)
            num_refused = 0
            if hit_ids and self.hit_filter is not None:
                num_usable = self.hit_filter(hit_ids, pending_rows)
                num_refused = len(hit_ids) - num_usable
                hit_ids = hit_ids[:num_usable]
                num_hit_tokens = num_usable * self.block_size
            num_new = min(request.num_feedable(start=num_hit_tokens), budget)
            if num_new <= 0:
                break  # its inputs have not come yet (not reached: an input limit is >= 1)
            new_block_ids = self.kv.allocate_slots(request, num_new, num_hit_tokens, hit_ids)
            if new_block_ids is None:
                break
            self.waiting.popleft()
            self.num_hit_blocks_refused += num_refused
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit_tokens
            request.num_computed_tokens = num_hit_tokens
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append(self._entry(request, num_new, hit_ids + new_block_ids, is_new=True))
            self._note_pending(request, num_new, pending_rows)
            budget -= num_new

        preempted, self._preempted_ids = self._preempted_ids, []
        return SchedulerOutput(
            scheduled=scheduled,
            num_batched_tokens=self.config.max_num_batched_tokens - budget,
            preempted_request_ids=preempted,
        )

    def _entry(
        self, request: Request, num_new: int, block_ids: list[int], *, is_new: bool
    ) -> ScheduledRequest:
        start = request.num_computed_tokens
        sample = start + num_new == request.num_tokens
        repeats = is_new and request.sampling_params.repetition_penalty != 1
        return ScheduledRequest(
            request_id=request.request_id,
            token_ids=request.all_token_ids[start : start + num_new],
            num_computed_tokens=start,
            new_block_ids=block_ids,
            is_new=is_new,
            sample=sample,
            sampling_params=request.sampling_params if is_new else None,
            mm_inputs=request.mm_inputs if is_new else (),
            num_output_tokens=request.num_output_tokens,
            fed_codes=self._fed_codes(request, start, num_new),
            prompt_targets=prompt_targets(request, start, num_new),
            allowed_tokens=request.allowed_tokens() if sample else None,
            penalty_prompt=request.prompt_token_ids if repeats else (),
        )

    @staticmethod
    def _fed_codes(request: Request, start: int, num_new: int) -> tuple[tuple[int, ...], ...]:
        """The residual codes of the generated tokens among positions [start, start + num_new)."""
        if not request.output_codes:
            return ()
        first = max(start - request.num_prompt_tokens, 0)
        last = max(start + num_new - request.num_prompt_tokens, 0)
        return tuple(request.output_codes[first:last])

    def _note_pending(self, request: Request, num_new: int, pending_rows: set[int]) -> None:
        first = request.num_computed_tokens // self.block_size
        last = (request.num_computed_tokens + num_new) // self.block_size
        if last > first and self.hit_filter is not None:
            pending_rows.update(self.kv.get_block_ids(request.request_id)[first:last])

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        self._preempted_ids.append(request.request_id)

    # ---- results ------------------------------------------------------------------------------
    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        runner_output: RunnerOutput,
        appended: list[Request] | None = None,
    ) -> list[Request]:
        """Advance computed tokens, append sampled tokens, and return the requests that finished.

        Finished requests still hold their blocks (so their cached rows can be gathered); the
        caller hands each to `release`. appended: when given, receives every request that got
        a token (one each), in scheduling order.
        """
        finished: list[Request] = []
        requests, sampled = self.requests, runner_output.sampled_token_ids
        running = RequestStatus.RUNNING
        for entry in scheduler_output.scheduled:
            request = requests.get(entry.request_id)
            if request is None or request.status is not running:
                continue
            request.num_computed_tokens += len(entry.token_ids)
            if entry.prompt_targets:
                record_prompt_logprobs(request, entry, runner_output)
            token_id = sampled.get(entry.request_id)
            if token_id is None:
                continue
            request.append_output_token_ids(token_id)
            codes = runner_output.sampled_codes.get(entry.request_id)
            if codes is not None:
                request.output_codes.append(codes)
            logprobs = runner_output.sampled_logprobs.get(entry.request_id)
            if logprobs is not None:
                request.output_logprobs[request.num_output_tokens - 1] = logprobs
            if appended is not None:
                appended.append(request)
            status = self.stop_status(request, token_id)
            if status is not None:
                request.status = status
                finished.append(request)
        self.drop_finished(finished)
        return finished

    def drop_finished(self, finished: list[Request]) -> None:
        """Out of the running list (they keep their blocks until `release`)."""
        if finished:  # one pass over the running list, not one remove per finished request
            done = {id(request) for request in finished}
            self.running[:] = [r for r in self.running if id(r) not in done]

    def stop_status(
        self, request: Request, token_id: int, num_output: int | None = None
    ) -> RequestStatus | None:
        """Whether output token number num_output (default: the last one), token_id, ends it."""
        params = request.sampling_params
        if token_id == request.eos_token_id and not params.ignore_eos:
            return RequestStatus.FINISHED_STOPPED
        if params.stop_token_ids and token_id in params.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if num_output is None:
            num_output = len(request.output_token_ids)
        if params.max_tokens is not None and num_output >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if request.num_prompt_tokens + num_output >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None
