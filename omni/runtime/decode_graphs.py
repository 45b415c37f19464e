"""Decode steps and short prefills padded to fixed shapes, replayed as CUDA graphs.

Two kinds of step run at a fixed shape (num_seqs, num_tokens) on static buffers (token ids,
positions, slot mapping, sequence lengths, query starts and block tables of fixed width
max_model_len / block_size):
- decode: n requests each feed one token and sample; they run at the next batch size B >= n of
  the ladder (1, 2, 4, 8, then steps of 8 up to engine.max_graph_batch): shape (B, B).
- suffix: one request feeds t tokens and samples the last (the uncached end of a prompt whose
  prefix hit the cache); it runs at the next size T > t of (16, 32, 64, 128, 256) (up to
  max_num_batched_tokens), as shape (2, T): the request, then a padding sequence of T - t.
On a GPU the adapter's `decode_forward` (the model body, no sampling) was captured once per shape
at start-up; a step fills the buffers and replays. On the CPU the same padded steps run eagerly:
the test path for everything but the capture itself.

Invariants:
- Padding tokens write their K/V to scratch slots past the pool's blocks (`num_blocks *
  block_size + i`), which the block pool never hands out and the output cache never sees, and
  attend only to scratch keys (finite: zeros or other padding keys). Their outputs are dropped:
  only the real rows reach the output cache, the logits and the sampler.
- Nothing inside a captured body reads host values that change between replays: positions
  (mrope deltas included) come from the host (the adapter's `decode_prepare`), the decode
  tile table is a static arange, a suffix's is computed on the device from its query starts.
- The host staging buffers are reused every step, once the last upload out of them has run
  (an event: with a step in flight, omni/engine/step_pipeline.py, it may still be queued).
"""

from __future__ import annotations

import bisect
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kernels.split_kv import num_sms, unsplit_context
from omni.core.scheduler_output import ScheduledRequest
from omni.runtime import attention
from omni.runtime.attention import AttentionMetadata
from omni.runtime.block_tables import BlockTables
from omni.runtime.graph_cache import capture_graph
from omni.runtime.graph_shapes import (
    Shape,
    batch_ladder,
    max_suffix_tokens,
    splits_keys,
    suffix_ladder,
)
from omni.runtime.stage_model import ModelOutputs, StageModel

logger = logging.getLogger(__name__)

IDS, SLOTS, SEQ_LENS, QUERY_STARTS, POSITIONS = range(5)  # rows of the staging buffer


@dataclass
class GraphStep:
    outputs: ModelOutputs  # the real rows only
    sample_hidden: torch.Tensor  # [num sampled, hidden]: every decode row, a suffix's last row
    host_slots: torch.Tensor  # the real rows' KV slots, on the host
    device_slots: torch.Tensor  # the same on the device


class DecodeGraphs:
    def __init__(
        self,
        model: StageModel,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        *,
        num_blocks: int,
        block_size: int,
        max_batch: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        device: torch.device,
    ) -> None:
        """kv_caches must hold num_blocks + num_scratch_blocks(...) blocks; the last ones are
        the padding tokens' scratch."""
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.batch_sizes = batch_ladder(max_batch)
        self.suffix_sizes = suffix_ladder(
            max_suffix_tokens(model, max_num_batched_tokens, max_model_len)
        )
        self.shapes: list[Shape] = [(b, b) for b in self.batch_sizes]
        self.shapes += [(2, t) for t in self.suffix_sizes]
        self.scratch_slot = num_blocks * block_size  # padding row i writes slot scratch + i
        self.scratch_block = num_blocks
        width = max(self.batch_sizes[-1] + 1, *self.suffix_sizes, 3)
        max_blocks = -(-max_model_len // block_size)
        self.bound = max_blocks * block_size  # every replay's bound of a context
        on_gpu = device.type == "cuda"
        host = torch.zeros((POSITIONS + model.decode_position_rows, width), dtype=torch.int64)
        tables = torch.zeros((self.batch_sizes[-1] + 1, max_blocks), dtype=torch.int64)
        self._host = host.pin_memory() if on_gpu else host
        self._host_tables = tables.pin_memory() if on_gpu else tables
        self._dev = self._host.to(device) if on_gpu else self._host
        self._dev_tables = self._host_tables.to(device) if on_gpu else self._host_tables
        self._host_np = self._host.numpy()
        self._host_tables_np = self._host_tables.numpy()
        # Per step constants, made once: the host's aranges and the padding rows' slots.
        self._host_arange = np.arange(width, dtype=np.int64)
        self._scratch_slots = self.scratch_slot + self._host_arange
        self._dev_slots = self._dev[SLOTS]
        self._embeds: torch.Tensor | None = None  # per-row float inputs (the talker's text rows)
        if model.decode_embed_dim:
            shape = (width, model.decode_embed_dim)
            self._embeds = torch.zeros(shape, dtype=kv_caches[0][0].dtype, device=device)
        self._arange = torch.arange(width, device=device)  # a decode step's query starts
        self._tile_starts = torch.arange(width, dtype=torch.int32, device=device)
        self._uploaded: Any = None  # CUDA event after the last step's host-to-device copies
        # (shape, long) -> torch.cuda.CUDAGraph; long: some context past unsplit_context()
        self._graphs: dict[tuple[Shape, bool], Any] = {}
        self._graph_outputs: dict[tuple[Shape, bool], ModelOutputs] = {}
        self.capture_s = 0.0
        self.capture_bytes = 0
        self.num_graph_steps = 0  # replays
        self.num_padded_steps = 0  # every padded step, replayed or eager
        self.num_padded_rows = 0
        self.num_long_steps = 0  # padded steps with a context past unsplit_context()

    # ---- which steps ----------------------------------------------------------------------------
    def shape_for(self, scheduled: list[ScheduledRequest]) -> Shape | None:
        """The shape this step runs at, or None when it is neither a decode batch that fits the
        ladder nor one request's short sampled suffix (prefill chunks, mixed steps, oversize)."""
        n = len(scheduled)
        if not 0 < n <= self.batch_sizes[-1] or not all(e.sample for e in scheduled):
            return None
        if all(len(e.token_ids) == 1 for e in scheduled):
            size = self.batch_sizes[bisect.bisect_left(self.batch_sizes, n)]
            return size, size
        t = len(scheduled[0].token_ids)
        if n == 1 and self.suffix_sizes and t < self.suffix_sizes[-1]:
            return 2, self.suffix_sizes[bisect.bisect_right(self.suffix_sizes, t)]
        return None

    # ---- one step -------------------------------------------------------------------------------
    def run(
        self,
        scheduled: list[ScheduledRequest],
        block_tables: BlockTables,
        rows: np.ndarray,
        shape: Shape,
        fed_ids: torch.Tensor | None = None,
        fed_frames: torch.Tensor | None = None,
    ) -> GraphStep | None:
        """Run the padded step at shape_for(scheduled) (rows: the requests' rows in block_tables,
        in order); None when the adapter wants it eager (its decode_prepare said so). fed_ids:
        the token ids on the device (a step scheduled before they were read); fed_frames: with
        their residual codes (a multi-code step's), for decode_prepare."""
        decode = shape[0] == shape[1]
        if decode:
            positions = np.fromiter((e.num_computed_tokens for e in scheduled), np.int64)
        else:
            entry = scheduled[0]
            positions = entry.num_computed_tokens + np.arange(len(entry.token_ids))
        prepared = self.model.decode_prepare(scheduled, positions, fed_frames)
        if prepared is None:
            return None
        n = positions.size  # real rows
        if self._uploaded is not None:  # the last step's copy out of these host buffers
            self._uploaded.synchronize()  # (queued behind a step still in flight) must be done
        host, tables, bs = self._host_np, self._host_tables_np, self.block_size
        host[:, : shape[1]] = 0
        block_tables.gather(rows, out=tables)  # one indexed copy; padding rows read column 0:
        tables[rows.size : shape[0], 0] = self.scratch_block
        host[IDS, :n] = [t for e in scheduled for t in e.token_ids]
        seqs = self._host_arange[:n] if decode else np.zeros(n, dtype=np.int64)  # token's table
        block_index, offset = np.divmod(positions, bs)
        slots = host[SLOTS, :n]
        np.multiply(tables[seqs, block_index], bs, out=slots)
        slots += offset
        host[POSITIONS:, :n] = prepared.positions
        if self._embeds is not None and prepared.embeds is not None:
            self._embeds[:n].copy_(prepared.embeds)
            self._embeds[n : shape[1]].zero_()
        num_padding = shape[1] - n
        host[SLOTS, n : shape[1]] = self._scratch_slots[:num_padding]
        if decode:  # padding rows: token 0 at position 0, one key each
            host[SEQ_LENS, :n] = positions + 1
            host[SEQ_LENS, n : shape[0]] = 1
        else:  # one padding sequence at positions 0.. over the scratch blocks, in slot order
            host[SEQ_LENS, :2] = (positions[-1] + 1, num_padding)
            host[QUERY_STARTS, :3] = (0, n, shape[1])
            host[POSITIONS:, n : shape[1]] = np.arange(num_padding)
            num_blocks = -(-num_padding // bs)
            tables[1, :num_blocks] = self.scratch_block + np.arange(num_blocks)
        host_slots = torch.from_numpy(slots.copy())
        if self._dev is not self._host:
            self._dev.copy_(self._host, non_blocking=True)
            self._dev_tables[: shape[0]].copy_(self._host_tables[: shape[0]], non_blocking=True)
            self._uploaded = self._uploaded or torch.cuda.Event()
            self._uploaded.record()  # re-recorded each step, once the last one was waited for
        if fed_ids is not None:
            self._dev[IDS, :n].copy_(fed_ids)
        long = int(positions.max()) + 1 > unsplit_context()
        key = (shape, long) if (shape, long) in self._graphs else (shape, False)
        graph = self._graphs.get(key)
        if graph is not None:
            graph.replay()
            outputs = self._graph_outputs[key]
            self.num_graph_steps += 1
        else:  # the Triton path takes the graph's metadata as it is (tests force it on CPU)
            outputs = self._forward(shape, long, static=attention.uses_triton(self.device))
        self.num_padded_steps += 1
        self.num_padded_rows += num_padding
        self.num_long_steps += long
        real = ModelOutputs(outputs.hidden_states[:n], {k: v[:n] for k, v in outputs.extra.items()})
        sample = real.hidden_states if decode else real.hidden_states[n - 1 :]
        return GraphStep(real, sample, host_slots, self._dev_slots[:n])

    def _forward(self, shape: Shape, long: bool, *, static: bool) -> ModelOutputs:
        """The adapter's body on the device buffers at this shape. long: some context may be
        past unsplit_context() (the attention may split its keys; short steps never do).
        static: the metadata a graph bakes in (no host plan); else built per step (the CPU's
        torch path needs a host plan of the step's values)."""
        num_seqs, num_tokens = shape
        dev = self._dev
        decode = num_seqs == num_tokens
        query_starts = self._arange if decode else dev[QUERY_STARTS]
        fields: dict[str, Any] = dict(
            slot_mapping=dev[SLOTS, :num_tokens],
            query_start_loc=query_starts[: num_seqs + 1],
            seq_lens=dev[SEQ_LENS, :num_seqs],
            block_tables=self._dev_tables[:num_seqs],
            kv_caches=self.kv_caches,
            max_context=self.bound if long else None,
        )
        if static:
            tile_starts = self._tile_starts[: num_seqs + 1] if decode else None
            attn = AttentionMetadata(**fields, decode_tile_starts=tile_starts)
        else:
            attn = AttentionMetadata.build(**fields, block_size=self.block_size)
        embeds = self._embeds[:num_tokens] if self._embeds is not None else None
        return self.model.decode_forward(
            dev[IDS, :num_tokens], dev[POSITIONS:, :num_tokens], attn, embeds
        )

    # ---- start-up -------------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every shape, largest first, in one memory pool of this stage. Each is run
        twice before (Triton compiles, cuBLAS picks its kernels) on all-padding inputs."""
        start = time.perf_counter()
        reserved = torch.cuda.memory_reserved(self.device)
        pool = torch.cuda.graph_pool_handle()
        kv_heads = self.kv_caches[0][0].shape[2]
        splits = {
            s: splits_keys(s, self.bound, kv_heads, num_sms(self.device)) for s in self.shapes
        }
        keys = [(s, long) for s in self.shapes for long in (False, True)[: 1 + splits[s]]]
        for shape, long in sorted(keys, key=lambda k: k[0][1], reverse=True):
            self._fill_padding(shape)
            self._dev.copy_(self._host)
            self._dev_tables.copy_(self._host_tables)
            run = functools.partial(self._forward, shape, long, static=True)
            graph, outputs = capture_graph(run, self.device, pool)
            self._graphs[shape, long], self._graph_outputs[shape, long] = graph, outputs
        torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - start
        self.capture_bytes = torch.cuda.memory_reserved(self.device) - reserved
        logger.info(
            "captured %d CUDA graphs (decode batches %s, suffixes %s) in %.2f s, %.1f MiB",
            len(self._graphs),
            self.batch_sizes,
            self.suffix_sizes,
            self.capture_s,
            self.capture_bytes / 2**20,
        )

    def _fill_padding(self, shape: Shape) -> None:
        """Every token a padding one, each in its own scratch slot, reading scratch keys."""
        num_seqs, num_tokens = shape
        host = self._host_np
        host[:, :num_tokens] = 0
        host[SLOTS, :num_tokens] = self.scratch_slot + np.arange(num_tokens)
        host[SEQ_LENS, :num_seqs] = 1
        self._host_tables_np[:, 0] = self.scratch_block
        if num_seqs != num_tokens:  # a suffix: one token, then a padding sequence of the rest
            num_blocks = -(-(num_tokens - 1) // self.block_size)
            host[SEQ_LENS, 1] = num_tokens - 1
            host[QUERY_STARTS, :3] = (0, 1, num_tokens)
            self._host_tables_np[1, :num_blocks] = self.scratch_block + np.arange(num_blocks)

    def stats(self) -> dict[str, Any]:
        return {
            "cuda_graphs": len(self._graphs),
            "graph_steps": self.num_graph_steps,
            "padded_decode_steps": self.num_padded_steps,
            "padded_rows": self.num_padded_rows,
            "long_context_steps": self.num_long_steps,
            "long_context_graphs": sum(long for _, long in self._graphs),
            "cuda_graph_capture_s": self.capture_s,
            "cuda_graph_bytes": self.capture_bytes,
        }
