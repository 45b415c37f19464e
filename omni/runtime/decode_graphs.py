"""Decode steps padded to a ladder of batch sizes, replayed as CUDA graphs.

A pure decode step (every scheduled request feeds one token and samples) of n requests runs at
the next batch size B >= n of the ladder (1, 2, 4, 8, then steps of 8 up to max_num_seqs) on
static buffers: token ids, positions, slot mapping, sequence lengths and block tables of
fixed width (max_model_len / block_size). On a GPU the adapter's `decode_forward` (the model
body, no sampling) was captured once per B at start-up; a step fills the buffers and replays.
On the CPU the same padded batches run eagerly (`capture=False`): the test path for everything
but the capture itself.

Invariants:
- Padding rows n..B-1 feed token 0 at position 0 with a context of one key, and write their
  K/V to scratch slots past the pool's blocks (`num_blocks * block_size + row`), which the
  block pool never hands out and the output cache never sees. Their outputs are dropped.
- Only rows [:n] leave a step: the output cache writes and the logits take views of them.
- Nothing inside the captured body reads host values that change between replays: positions
  (mrope deltas included) are computed on the host by the adapter, the tile table of the Triton
  kernel is a static arange, and the table width is fixed.
- The host staging buffers are reused every step: safe because each step ends with the
  sampler's device-to-host copy, after which the previous upload has landed.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from omni.core.scheduler_output import ScheduledRequest
from omni.runtime import attention
from omni.runtime.attention import AttentionMetadata
from omni.runtime.stage_model import ModelOutputs, StageModel

logger = logging.getLogger(__name__)


def batch_ladder(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to max_num_seqs (which is always the last)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    sizes += list(range(16, max_num_seqs, 8))
    return [*sizes, max_num_seqs]


def num_scratch_blocks(max_num_seqs: int, block_size: int) -> int:
    """KV blocks past the pool that hold the padding rows' keys (one slot per batch row)."""
    return -(-max_num_seqs // block_size)


class DecodeGraphs:
    def __init__(
        self,
        model: StageModel,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        *,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_model_len: int,
        device: torch.device,
    ) -> None:
        """kv_caches must hold num_blocks + num_scratch_blocks(max_num_seqs, block_size)
        blocks; the last ones are the padding rows' scratch."""
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.batch_sizes = batch_ladder(max_num_seqs)
        self.max_batch = self.batch_sizes[-1]
        self.scratch_slot = num_blocks * block_size  # padding row r writes slot scratch + r
        self.scratch_block = num_blocks
        self.num_position_rows = model.decode_position_rows
        max_blocks = -(-max_model_len // block_size)
        on_gpu = device.type == "cuda"
        # Rows of the int64 staging buffer: ids, slots, seq_lens, then the position rows.
        host = torch.zeros((3 + self.num_position_rows, self.max_batch), dtype=torch.int64)
        tables = torch.zeros((self.max_batch, max_blocks), dtype=torch.int64)
        self._host = host.pin_memory() if on_gpu else host
        self._host_tables = tables.pin_memory() if on_gpu else tables
        self._dev = self._host.to(device) if on_gpu else self._host
        self._dev_tables = self._host_tables.to(device) if on_gpu else self._host_tables
        self._host_np = self._host.numpy()
        self._host_tables_np = self._host_tables.numpy()
        self._query_start_loc = torch.arange(self.max_batch + 1, device=device)
        self._tile_starts = torch.arange(self.max_batch + 1, dtype=torch.int32, device=device)
        self._graphs: dict[int, Any] = {}  # batch size -> torch.cuda.CUDAGraph
        self._graph_outputs: dict[int, ModelOutputs] = {}
        self.capture_s = 0.0
        self.capture_bytes = 0
        self.num_graph_steps = 0  # replays
        self.num_padded_steps = 0  # every padded step, replayed or eager
        self.num_padded_rows = 0

    # ---- which steps ----------------------------------------------------------------------------
    def bucket(self, scheduled: list[ScheduledRequest]) -> int | None:
        """The batch size this step runs at, or None when it is not a pure decode step that
        fits the ladder (prefill chunks, new or recomputed requests, oversize batches)."""
        n = len(scheduled)
        if not 0 < n <= self.max_batch:
            return None
        for entry in scheduled:
            if entry.is_new or not entry.sample or len(entry.token_ids) != 1:
                return None
        return self.batch_sizes[int(np.searchsorted(self.batch_sizes, n))]

    # ---- one step -------------------------------------------------------------------------------
    def run(
        self, scheduled: list[ScheduledRequest], block_tables: list[list[int]], batch_size: int
    ) -> tuple[ModelOutputs, torch.Tensor, torch.Tensor] | None:
        """Run the padded decode step: (outputs of the real rows, their host slots, their device
        slots), or None when the adapter wants this step eager (decode_positions said so)."""
        n = len(scheduled)
        positions = np.fromiter((e.num_computed_tokens for e in scheduled), dtype=np.int64, count=n)
        position_rows = self.model.decode_positions(scheduled, positions)
        if position_rows is None:
            return None
        host, tables, bs = self._host_np, self._host_tables_np, self.block_size
        host[0, :n] = [e.token_ids[0] for e in scheduled]
        for row, table in enumerate(block_tables):
            tables[row, : len(table)] = table
        host[1, :n] = tables[np.arange(n), positions // bs] * bs + positions % bs
        host[2, :n] = positions + 1
        host[3:, :n] = position_rows
        # Padding rows: token 0 at position 0, one key, in its own scratch slot.
        host[:, n:batch_size] = 0
        host[1, n:batch_size] = self.scratch_slot + np.arange(n, batch_size)
        host[2, n:batch_size] = 1
        tables[n:batch_size, 0] = self.scratch_block
        host_slots = torch.from_numpy(host[1, :n].copy())
        if self._dev is not self._host:
            self._dev.copy_(self._host, non_blocking=True)
            self._dev_tables[:batch_size].copy_(self._host_tables[:batch_size], non_blocking=True)
        graph = self._graphs.get(batch_size)
        if graph is not None:
            graph.replay()
            outputs = self._graph_outputs[batch_size]
            self.num_graph_steps += 1
        else:  # the Triton path takes the graph's metadata as it is (tests force it on CPU)
            outputs = self._forward(batch_size, static=attention.uses_triton(self.device))
        self.num_padded_steps += 1
        self.num_padded_rows += batch_size - n
        real = ModelOutputs(outputs.hidden_states[:n], {k: v[:n] for k, v in outputs.extra.items()})
        return real, host_slots, self._dev[1, :n]

    def _forward(self, batch_size: int, *, static: bool) -> ModelOutputs:
        """The adapter's body on the first batch_size rows of the device buffers. static: the
        metadata a graph bakes in (no host plan); else built per step (the CPU's torch path
        needs a host plan of the step's values)."""
        b = batch_size
        dev, tables = self._dev, self._dev_tables[:b]
        if static:
            attn = AttentionMetadata(
                slot_mapping=dev[1, :b],
                query_start_loc=self._query_start_loc[: b + 1],
                seq_lens=dev[2, :b],
                block_tables=tables,
                kv_caches=self.kv_caches,
                decode_tile_starts=self._tile_starts[: b + 1],
            )
        else:
            attn = AttentionMetadata.build(
                slot_mapping=dev[1, :b],
                query_start_loc=self._query_start_loc[: b + 1],
                seq_lens=dev[2, :b],
                block_tables=tables,
                kv_caches=self.kv_caches,
                block_size=self.block_size,
            )
        return self.model.decode_forward(dev[0, :b], dev[3:, :b], attn)

    # ---- start-up -------------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every batch size, largest first, in one memory pool of this stage. Each is
        run twice before (Triton compiles, cuBLAS picks its kernels) on an all-padding batch."""
        start = time.perf_counter()
        reserved = torch.cuda.memory_reserved(self.device)
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device=self.device)
        for b in reversed(self.batch_sizes):
            self._fill_padding(b)
            self._dev.copy_(self._host)
            self._dev_tables[:b].copy_(self._host_tables[:b])
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._forward(b, static=True)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                self._graph_outputs[b] = self._forward(b, static=True)
            self._graphs[b] = graph
        torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - start
        self.capture_bytes = torch.cuda.memory_reserved(self.device) - reserved
        logger.info(
            "captured %d decode CUDA graphs (batch sizes %s) in %.2f s, %.1f MiB",
            len(self._graphs),
            self.batch_sizes,
            self.capture_s,
            self.capture_bytes / 2**20,
        )

    def _fill_padding(self, batch_size: int) -> None:
        host = self._host_np
        host[:, :batch_size] = 0
        host[1, :batch_size] = self.scratch_slot + np.arange(batch_size)
        host[2, :batch_size] = 1
        self._host_tables_np[:batch_size, 0] = self.scratch_block

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)
