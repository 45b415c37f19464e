"""SchedulerOutput -> one packed ragged batch -> the stage model -> sampled tokens.

Only the uncached tokens are fed, as a single row (batch 1) with explicit positions; the paged
attention reads each sequence's context from the KV blocks through its block table. Logits are
computed only at the rows where a token is sampled. Every fed token's per-token outputs are
written to the stage-output cache at the token's KV slot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omni.core.sampling_params import SamplingParams
from omni.core.scheduler_output import RunnerOutput, ScheduledRequest, SchedulerOutput
from omni.runtime.attention import AttentionMetadata, allocate_kv_caches
from omni.runtime.output_cache import OutputCache
from omni.runtime.sampler import Sampler
from omni.runtime.stage_model import ModelInputs, StageModel


@dataclass
class _RequestState:
    block_ids: list[int]
    sampling_params: SamplingParams


@dataclass
class PackedBatch:
    model_inputs: ModelInputs
    slot_mapping: torch.Tensor
    sample_rows: list[int]  # row of the packed batch whose hidden state gives the logits
    sample_ids: list[str]


class ModelRunner:
    def __init__(
        self,
        model: StageModel,
        *,
        num_blocks: int,
        block_size: int,
        output_cache: OutputCache | None,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.kv_caches = allocate_kv_caches(
            model.num_layers,
            num_blocks,
            block_size,
            model.num_kv_heads,
            model.head_dim,
            model.dtype,
        )
        self.output_cache = output_cache
        self.sampler = Sampler(seed)
        self._requests: dict[str, _RequestState] = {}
        # Per-request stage inputs (upstream embeddings, pixel values, ...), kept until finished.
        self._extras: dict[str, Mapping[str, Any]] = {}

    @torch.inference_mode()
    def warm_up(self) -> None:
        """One 2-token forward before serving, so that every per-token output the stage returns
        is discovered (and its cache allocated) before any block is cached. The first blocks are
        free and uncached now; whatever this writes is overwritten on allocation."""
        block_ids = list(range(-(-2 // self.block_size)))
        entry = ScheduledRequest("__warm_up__", [0, 0], 0, block_ids, True, False, SamplingParams())
        batch = self._pack([entry])
        outputs = self.model.forward(batch.model_inputs)
        self._requests.pop(entry.request_id, None)
        if self.output_cache is not None:
            per_token = {"hidden_states": outputs.hidden_states, **outputs.extra}
            self.output_cache.discover(per_token, batch.slot_mapping.numel())

    def add_request_extras(self, request_id: str, extras: Mapping[str, Any]) -> None:
        """Per-request inputs beyond token ids (e.g. upstream hidden states), kept until release."""
        self._extras[request_id] = extras

    def release(self, request_ids: list[str]) -> None:
        """Forget finished or aborted requests at once (their inputs can be large)."""
        for request_id in request_ids:
            self._requests.pop(request_id, None)
            self._extras.pop(request_id, None)
        if request_ids:
            self.model.release(request_ids)  # adapters' per-request state

    @torch.inference_mode()
    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        for request_id in scheduler_output.preempted_request_ids:
            self._requests.pop(request_id, None)  # block table gone; inputs stay
        if scheduler_output.is_empty:
            return RunnerOutput(sampled_token_ids={})
        batch = self._pack(scheduler_output.scheduled)
        outputs = self.model.forward(batch.model_inputs)
        if self.output_cache is not None:
            per_token = {"hidden_states": outputs.hidden_states, **outputs.extra}
            self.output_cache.discover(per_token, batch.slot_mapping.numel())
            self.output_cache.write(batch.slot_mapping, per_token)
        if not batch.sample_rows:
            return RunnerOutput(sampled_token_ids={})
        logits = self.model.compute_logits(outputs.hidden_states[batch.sample_rows])
        entries = {e.request_id: e for e in scheduler_output.scheduled}
        params = [self._requests[rid].sampling_params for rid in batch.sample_ids]
        counts = [entries[rid].num_output_tokens for rid in batch.sample_ids]
        token_ids = self.sampler(logits, params, counts)
        return RunnerOutput(sampled_token_ids=dict(zip(batch.sample_ids, token_ids, strict=True)))

    def _pack(self, scheduled: list[ScheduledRequest]) -> PackedBatch:
        token_ids: list[int] = []
        query_lens, context_lens, tables = [], [], []
        sample_rows, sample_ids = [], []
        for entry in scheduled:
            state = self._requests.get(entry.request_id)
            if entry.is_new or state is None:
                if entry.sampling_params is None:  # the scheduler sets them whenever is_new
                    raise RuntimeError(
                        f"request {entry.request_id!r} scheduled without a block table "
                        f"or sampling params (is_new={entry.is_new})"
                    )
                state = _RequestState(list(entry.new_block_ids), entry.sampling_params)
                self._requests[entry.request_id] = state
            else:
                state.block_ids.extend(entry.new_block_ids)
            token_ids.extend(entry.token_ids)
            query_lens.append(len(entry.token_ids))
            context_lens.append(entry.num_computed_tokens + len(entry.token_ids))
            tables.append(state.block_ids)
            if entry.sample:
                sample_rows.append(len(token_ids) - 1)
                sample_ids.append(entry.request_id)

        num_seqs = len(scheduled)
        q_lens = np.asarray(query_lens, dtype=np.int64)
        seq_lens = np.asarray(context_lens, dtype=np.int64)
        query_start_loc = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(q_lens, out=query_start_loc[1:])
        block_tables = np.zeros((num_seqs, max(len(t) for t in tables)), dtype=np.int64)
        for row, table in enumerate(tables):
            block_tables[row, : len(table)] = table
        # Positions of fed tokens: the last q_len positions of each context.
        seq_of_token = np.repeat(np.arange(num_seqs), q_lens)
        positions = (
            np.arange(len(token_ids))
            - query_start_loc[seq_of_token]
            + (seq_lens - q_lens)[seq_of_token]
        )
        bs = self.block_size
        slots = block_tables[seq_of_token, positions // bs] * bs + positions % bs

        slot_mapping = torch.from_numpy(slots)
        attn = AttentionMetadata.build(
            slot_mapping=slot_mapping,
            query_start_loc=torch.from_numpy(query_start_loc),
            seq_lens=torch.from_numpy(seq_lens),
            block_tables=torch.from_numpy(block_tables),
            kv_caches=self.kv_caches,
            block_size=bs,
        )
        inputs = ModelInputs(
            input_ids=torch.tensor(token_ids, dtype=torch.long),
            positions=torch.from_numpy(positions),
            attn=attn,
            scheduled=scheduled,
            request_extras={e.request_id: self._extras.get(e.request_id, {}) for e in scheduled},
        )
        return PackedBatch(inputs, slot_mapping, sample_rows, sample_ids)
