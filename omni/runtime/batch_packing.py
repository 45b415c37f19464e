"""A step's scheduled requests -> one packed ragged batch (batch 1) with explicit positions.

Only the uncached tokens are fed, every request's after the previous one's in a single row; the
paged attention reads each sequence's context from the KV blocks through its block table, and a
token's KV slot is `block_table[position // block_size] * block_size + position % block_size`.
Everything is computed on the host with numpy and goes to the device in one copy
(omni/runtime/host_upload.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omni.core.scheduler_output import ScheduledRequest
from omni.runtime.attention import AttentionMetadata
from omni.runtime.host_upload import upload
from omni.runtime.stage_model import ModelInputs


@dataclass
class PackedBatch:
    model_inputs: ModelInputs
    slot_mapping: torch.Tensor  # on the host (CPU), as model_inputs.attn.slot_mapping
    sample_rows: torch.Tensor  # [num sampled] rows whose hidden states give the logits, on device
    sample_ids: list[str]


def pack_batch(
    scheduled: list[ScheduledRequest],
    block_tables: np.ndarray,
    *,
    block_size: int,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    extras: Mapping[str, Mapping[str, Any]],
    device: torch.device,
) -> PackedBatch:
    """The batch of `scheduled` (block_tables: theirs, in order, [num_seqs, width]; entries
    past a table's length are never read) on `device`; a request samples at its last fed token
    when `entry.sample`. extras: per-request stage inputs."""
    token_ids: list[int] = []
    query_lens, context_lens = [], []
    sample_rows, sample_ids = [], []
    for entry in scheduled:
        token_ids.extend(entry.token_ids)
        query_lens.append(len(entry.token_ids))
        context_lens.append(entry.num_computed_tokens + len(entry.token_ids))
        if entry.sample:
            sample_rows.append(len(token_ids) - 1)
            sample_ids.append(entry.request_id)

    num_seqs = len(scheduled)
    q_lens = np.asarray(query_lens, dtype=np.int64)
    seq_lens = np.asarray(context_lens, dtype=np.int64)
    query_start_loc = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(q_lens, out=query_start_loc[1:])
    # Positions of fed tokens: the last q_len positions of each context.
    seq_of_token = np.repeat(np.arange(num_seqs), q_lens)
    positions = (
        np.arange(len(token_ids))
        - query_start_loc[seq_of_token]
        + (seq_lens - q_lens)[seq_of_token]
    )
    bs = block_size
    slots = block_tables[seq_of_token, positions // bs] * bs + positions % bs

    uploaded = upload(
        [
            np.asarray(token_ids, dtype=np.int64),
            positions.astype(np.int64, copy=False),
            slots,
            query_start_loc,
            seq_lens,
            block_tables,
            np.asarray(sample_rows, dtype=np.int64),
        ],
        device,
    )
    input_ids, positions_t, slot_mapping, query_start_t, seq_lens_t, tables_t = uploaded[:6]
    attn = AttentionMetadata.build(
        slot_mapping=slot_mapping,
        query_start_loc=query_start_t,
        seq_lens=seq_lens_t,
        block_tables=tables_t,
        kv_caches=kv_caches,
        block_size=bs,
        max_context=int(seq_lens.max()) if num_seqs else 0,
    )
    inputs = ModelInputs(
        input_ids=input_ids,
        positions=positions_t,
        attn=attn,
        scheduled=scheduled,
        request_extras={e.request_id: extras.get(e.request_id, {}) for e in scheduled},
    )
    host_slots = slot_mapping if slot_mapping.device.type == "cpu" else torch.from_numpy(slots)
    return PackedBatch(inputs, host_slots, uploaded[6], sample_ids)
