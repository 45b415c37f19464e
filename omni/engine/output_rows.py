"""OutputRows: a StageEngine's bookkeeping of its requests' per-token output rows, between the
KV cache (block ids and versions) and the output cache (the rows at those blocks' slots).

It decides which prefix-cache hits are usable (the scheduler's hit filter: a hit needs its rows
too), marks the rows a step completed valid, hands a step_rows request the rows computed
since its last update, and gathers a finished request's rows. Without an output cache (the
stage keeps no outputs) every hit is usable and requests carry no rows.
"""

from __future__ import annotations

import torch

from omni.core.kv_cache_manager import KVCacheManager
from omni.core.request import Request
from omni.core.scheduler_output import SchedulerOutput
from omni.runtime.output_cache import OutputCache


class OutputRows:
    def __init__(
        self,
        kv: KVCacheManager,
        output_cache: OutputCache | None,
        *,
        block_size: int,
        outputs_cached: bool,
    ) -> None:
        """outputs_cached: whether rows may be served across requests (engine.outputs_cached)."""
        self.kv = kv
        self.output_cache = output_cache
        self.block_size = block_size
        self.outputs_cached = outputs_cached
        self._admitted_step: dict[str, int] = {}  # running request -> the step that admitted it
        # step_rows requests -> output rows reported so far (StageUpdate.tensors)
        self._rows_sent: dict[str, int] = {}
        # Output-cache writes of a step launched but not yet read (engine.async_scheduling):
        # new_rows neither reads their rows nor waits for them.
        self.writes_in_flight = 0

    def usable_hits(self, hit_block_ids: list[int], pending: set[int]) -> int:
        """The scheduler's hit filter: how many leading hit blocks have their rows as well."""
        if self.output_cache is None:
            return len(hit_block_ids)  # no outputs kept: the KV is all a hit needs
        if not self.outputs_cached:
            return 0  # rows are never served across requests: recompute the prefix
        versions = [self.kv.block_version(b) for b in hit_block_ids]
        num_usable = self.output_cache.num_valid_prefix(hit_block_ids, versions, pending)
        # Stale blocks leave the hash map so that a fresh duplicate becomes the one found.
        for block_id in hit_block_ids[num_usable:]:
            self.kv.uncache_block(block_id)
        return num_usable

    @property
    def any_step_rows(self) -> bool:
        """Whether any request reports its rows as they are computed (else new_rows is empty)."""
        return bool(self._rows_sent)

    def report_step_rows(self, request_id: str) -> None:
        """Report the request's rows as they are computed (a step_rows request)."""
        self._rows_sent[request_id] = 0

    def after_step(self, scheduler_output: SchedulerOutput, step: int) -> None:
        """Step number `step` ran: the cache's writes now belong to the next one, the requests
        it admitted remember it, and the blocks its tokens filled have valid rows."""
        if self.output_cache is not None:
            self.output_cache.step = step + 1  # the number of the step about to run
        for entry in scheduler_output.scheduled:
            if entry.is_new:
                self._admitted_step[entry.request_id] = step
        self._mark_rows_complete(scheduler_output)

    def _mark_rows_complete(self, scheduler_output: SchedulerOutput) -> None:
        if self.output_cache is None:
            return
        completed = []
        for entry in scheduler_output.scheduled:
            first = entry.num_computed_tokens // self.block_size
            last = (entry.num_computed_tokens + len(entry.token_ids)) // self.block_size
            if last > first:
                completed.extend(self.kv.get_block_ids(entry.request_id)[first:last])
        versions = [self.kv.block_version(b) for b in completed]
        self.output_cache.mark_complete(completed, versions)

    def new_rows(self, request: Request) -> dict[str, torch.Tensor]:
        """A step_rows request's rows computed since its last update. Rows sent stay sent:
        a recompute after preemption rewrites the same positions, never earlier ones again."""
        start = self._rows_sent.get(request.request_id)
        if start is None or self.output_cache is None:
            return {}
        # Fed by read steps: neither a provisional token nor the token a step launched ahead
        # feeds after a stop (its request then ends one token earlier).
        end = min(request.num_computed_tokens - request.num_provisional, request.num_tokens - 1)
        if end <= start:
            return {}
        self._rows_sent[request.request_id] = end
        block_ids = self.kv.get_block_ids(request.request_id)
        return self.output_cache.rows(block_ids, start, end, writes_in_flight=self.writes_in_flight)

    def finish(self, request: Request) -> dict[str, torch.Tensor]:
        """A finished request's rows (before its blocks are released), and forget it."""
        admitted_step = self._admitted_step.pop(request.request_id)
        self._rows_sent.pop(request.request_id, None)
        if self.output_cache is None:
            return {}
        # Every token but the last generated one was fed through the model.
        num_rows = request.num_tokens - 1
        block_ids = self.kv.get_block_ids(request.request_id)
        return self.output_cache.gather(
            block_ids,
            num_rows,
            admitted_step=admitted_step,
            num_hit_rows=max(request.num_cached_tokens, 0),
        )

    def forget(self, request_id: str) -> None:
        """The request was dropped unfinished (aborted): no rows to gather."""
        self._admitted_step.pop(request_id, None)
        self._rows_sent.pop(request_id, None)
