"""TrackedRequests: what the model runner keeps per running request, its block-table row (in
BlockTables) and its SamplingParams, with counts of what those ask for, so that a step skips the
per-row work no request needs (random sampling, penalties or a bias, logprobs, prompt logprobs,
token masks).
Host only, torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from omni.core.sampling_params import SamplingParams
from omni.core.scheduler_output import ScheduledRequest
from omni.runtime.block_tables import BlockTables


@dataclass
class RequestState:
    row: int  # of its block table in BlockTables
    sampling_params: SamplingParams


@dataclass
class Tracked:
    """A step's requests' block-table rows and sampling parameters, in scheduling order."""

    rows: np.ndarray
    params: list[SamplingParams]


class TrackedRequests:
    def __init__(self, block_tables: BlockTables) -> None:
        self.block_tables = block_tables
        self.states: dict[str, RequestState] = {}
        # Tracked requests that are not greedy (0: skip the per-row check), with penalties or a
        # logit bias, asking for logprobs, asking for prompt logprobs, with token masks (JSON,
        # min_tokens).
        self.num_random = self.num_adjusted = self.num_logprobs = self.num_prompt_logprobs = 0
        self.num_masked = 0

    def track(self, scheduled: list[ScheduledRequest]) -> Tracked:
        """Each request's new blocks into its table: a host array row, written once per block."""
        rows, params = [], []
        states, tables = self.states, self.block_tables
        for entry in scheduled:
            state = states.get(entry.request_id)
            if entry.is_new or state is None:
                if entry.sampling_params is None:  # the scheduler sets them whenever is_new
                    what = f"request {entry.request_id!r} scheduled without a block table"
                    raise RuntimeError(f"{what} or sampling params (is_new={entry.is_new})")
                self.forget(entry.request_id)
                state = RequestState(tables.add(entry.new_block_ids), entry.sampling_params)
                states[entry.request_id] = state
                self._count(state.sampling_params, 1)
            elif entry.new_block_ids:
                tables.append(state.row, entry.new_block_ids)
            rows.append(state.row)
            params.append(state.sampling_params)
        return Tracked(np.array(rows, dtype=np.int64), params)

    def forget(self, request_id: str) -> None:
        """Drop the request's block table (finished, aborted or preempted)."""
        state = self.states.pop(request_id, None)
        if state is not None:
            self.block_tables.release(state.row)
            self._count(state.sampling_params, -1)

    def _count(self, params: SamplingParams, sign: int) -> None:
        self.num_random += sign * (not params.greedy)
        self.num_adjusted += sign * params.adjusts_logits
        self.num_logprobs += sign * (params.logprobs is not None)
        self.num_prompt_logprobs += sign * (params.prompt_logprobs is not None)
        self.num_masked += sign * (params.json_schema is not None or params.min_tokens > 0)
