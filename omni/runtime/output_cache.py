"""The stage-output cache: per output name, a CPU tensor (num_blocks, block_size, D) that mirrors
the KV cache, so row = slot = block_id * block_size + offset (shared/seeds/002_*.txt).

Every fed token's output rows are written at its KV slot, so a finished request's full output is
one gather over its block table: the rows of its prefix-hit blocks (written by an earlier request)
followed by its own fresh rows. The block pool alone decides block ids; this cache only mirrors.

Validity: a block's rows may be served to another request only if they were completely written for
the block's current content. `valid_version[name][block_id]` holds the pool version at which the
block's rows were completed; the pool bumps a block's version whenever it loses its content, so a
reused block never serves the previous content's rows. A hit on a block whose rows are not valid is
refused and recomputed (the scheduler counts it), except when the block is completed by the
same step's forward ("pending"): those rows are written before any reader can finish.

Devices: the cache lives on `device` and its rows come from forwards on `source_device`.
- Both the CPU (a CPU stage): one indexed copy per output and step, as always.
- Both the GPU (a GPU stage with output_cache_device: cuda): the same indexed copy, on the GPU,
  in the forward's stream.
- A GPU stage with the cache in host memory (output_cache_device: cpu): the cache is plain host
  memory (never a copy's target, so not page-locked). Each step's rows go down in ONE
  non_blocking device-to-host copy per output, into a pinned staging buffer, on a side CUDA
  stream that first waits for an event recorded after the forward on the main stream; the
  staged rows are scattered into the cache on the host once the
  copy has landed: at a later write if its event says so (no wait), else at the next read. So
  the forward and the next step never wait for these copies; every read (gather, rows,
  synchronize) first waits for the last copy's event and scatters what is staged. A copy's
  source rows are kept from reuse by the allocator until the side stream is done with them
  (record_stream).
Whatever leaves the cache (gather, rows) is a new CPU tensor: results travel as CPU tensors.
`async_copies=True` on a CPU-only cache runs the staging path with plain copies (tests).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from omni.runtime.staged_copies import StagedCopies

logger = logging.getLogger(__name__)

CPU = torch.device("cpu")


class OutputCache:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        keep: frozenset[str] | None = None,
        *,
        device: torch.device | str | None = None,
        source_device: torch.device | str | None = None,
        async_copies: bool | None = None,
    ) -> None:
        """keep: the only output names cached (None: every per-token output discovered).
        device: where the cache lives (None: the CPU); source_device: where the forward's rows
        are (None: device). async_copies: write through staged side-stream copies; None means
        exactly when a GPU forward feeds a host cache."""
        self.keep = keep
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else CPU
        self.source_device = (
            torch.device(source_device) if source_device is not None else self.device
        )
        if async_copies is None:
            async_copies = self.device.type == "cpu" and self.source_device.type == "cuda"
        if async_copies and self.device.type != "cpu":
            raise ValueError(f"async_copies writes a host cache, not one on {self.device}")
        # The copies' staging is page-locked, so that they run asynchronously (needs CUDA). The
        # cache itself is plain host memory: no copy ever lands in it directly (staged rows are
        # scattered on the host), and pinning it would page-lock gigabytes of rows, each
        # allocation rounded up to a power of two by torch's pinned allocator (up to twice the
        # bytes the sizing planned).
        self.pinned_staging = async_copies and torch.cuda.is_available()
        self._copies = (
            StagedCopies(self.source_device, self.pinned_staging) if async_copies else None
        )
        self.caches: dict[str, torch.Tensor] = {}  # name -> (num_blocks, block_size, D)
        self._flat: dict[str, torch.Tensor] = {}  # name -> (num_blocks * block_size, D) view
        self.valid_version: dict[str, np.ndarray] = {}
        self.discovered_step: dict[str, int] = {}
        # Step that wrote each block's first row: an output discovered in a later step lacks
        # the block's earlier rows.
        self.first_write_step = np.zeros(num_blocks, dtype=np.int64)
        self.step = 0  # the engine's step counter; 0 = before serving (warm-up)
        self.num_incomplete = 0  # (request, output) pairs dropped: output discovered too late
        self.hit_rows = 0
        # Hit blocks served on the promise of this step's forward (counted per lookup).
        self.pending_hit_blocks = 0

    # ---- allocation and discovery ---------------------------------------------------------------
    def allocate(
        self, name: str, feature_shape: tuple[int, ...], dtype: torch.dtype | None = None
    ) -> None:
        shape = (self.num_blocks, self.block_size, *feature_shape)
        cache = torch.zeros(shape, dtype=dtype or self.dtype, device=self.device)
        self.caches[name] = cache
        self._flat[name] = cache.view(self.num_blocks * self.block_size, *feature_shape)
        self.valid_version[name] = np.full(self.num_blocks, -1, dtype=np.int64)
        self.discovered_step[name] = self.step
        logger.info(
            "output cache %r: shape %s %s on %s%s, %d bytes",
            name,
            tuple(shape),
            cache.dtype,
            self.device,
            " (pinned staging)" if self.pinned_staging else "",
            self.num_bytes_of(name),
        )

    def discover(
        self, outputs: dict[str, torch.Tensor], num_tokens: int
    ) -> dict[str, torch.Tensor]:
        """Split a forward's outputs into per-token ones (cached from now on) and the rest.

        A tensor is per-token when its first dimension is the step's token count. A one-token
        step cannot tell ([1, D] could be pooled), so only multi-token steps discover new names.
        The rest is returned, not cached: in a packed batch it belongs to no single request.
        """
        passthrough = {}
        for name, value in outputs.items():
            per_token = (
                isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == num_tokens
            )
            if self.keep is not None and name not in self.keep:
                continue  # not asked for: neither cached nor returned
            if name in self.caches:
                if not per_token:
                    raise RuntimeError(
                        f"output {name!r} was per-token before but has shape "
                        f"{tuple(getattr(value, 'shape', ()))} in a step of {num_tokens} tokens"
                    )
            elif per_token and num_tokens > 1:
                self.allocate(name, tuple(value.shape[1:]), value.dtype)
            else:
                passthrough[name] = value
        return passthrough

    def num_bytes_of(self, name: str) -> int:
        cache = self.caches[name]
        return cache.numel() * cache.element_size()

    @property
    def num_bytes(self) -> int:
        return sum(self.num_bytes_of(name) for name in self.caches)

    # ---- writes -------------------------------------------------------------------------------
    def write(
        self,
        slot_mapping: torch.Tensor,
        outputs: dict[str, torch.Tensor],
        *,
        device_slot_mapping: torch.Tensor | None = None,
    ) -> None:
        """Row i of each cached output goes to slot slot_mapping[i] (a CPU tensor):
        one indexed copy per output on the cache's device (device_slot_mapping: the same slots
        already there, if the caller has them), or, for a host cache fed by a GPU, one
        asynchronous copy per output into pinned staging (see the module docstring)."""
        slots = slot_mapping.cpu()
        host_slots = slots.numpy()
        starts = host_slots[host_slots % self.block_size == 0] // self.block_size
        self.first_write_step[starts] = self.step
        pairs = [(flat, outputs[name]) for name, flat in self._flat.items() if name in outputs]
        if not pairs:
            return
        if self._copies is not None:
            self._copies.copy_rows(host_slots, pairs)
            return
        if self.device.type == "cpu":
            for flat, rows in pairs:
                flat[slots] = rows.detach().to(device=self.device, dtype=flat.dtype)
            return
        index = device_slot_mapping  # a GPU cache: written in the forward's stream, no sync
        if index is None or index.device != self.device:
            index = slots.to(self.device, non_blocking=True)
        for flat, rows in pairs:
            flat.index_copy_(0, index, rows.detach().to(device=self.device, dtype=flat.dtype))

    def wait_copies_on_device(self) -> None:
        """Before the forward's output buffers are written again in place: order that after the
        pending copies out of them, on the device (no-op without asynchronous copies)."""
        if self._copies is not None:
            self._copies.wait_on_device()

    def synchronize(self, keep_last: int = 0) -> None:
        """Wait until every row written so far is in the cache (asynchronous copies landed), but
        those of the last keep_last writes (a step still in flight: its rows are not read)."""
        if self._copies is not None:
            self._copies.wait(keep_last)

    def mark_complete(self, block_ids: list[int], versions: list[int]) -> None:
        """These blocks' rows are all written for the given pool versions of their content, for
        every output known since before each block's first row was written."""
        if not block_ids:
            return
        ids = np.asarray(block_ids, dtype=np.int64)
        vers = np.asarray(versions, dtype=np.int64)
        first_written = self.first_write_step[ids]
        for name, valid in self.valid_version.items():
            # discover() runs before write() in a step, so a name found in the step that wrote
            # the block's first row has all of its rows.
            whole = first_written >= self.discovered_step[name]
            valid[ids[whole]] = vers[whole]

    # ---- reads --------------------------------------------------------------------------------
    def num_valid_prefix(self, block_ids: list[int], versions: list[int], pending: set[int]) -> int:
        """How many leading hit blocks have servable rows for every cached output."""
        for index, (block_id, version) in enumerate(zip(block_ids, versions, strict=True)):
            if block_id in pending:
                self.pending_hit_blocks += 1
                continue
            if any(valid[block_id] != version for valid in self.valid_version.values()):
                return index
        return len(block_ids)

    def gather(
        self, block_ids: list[int], num_rows: int, *, admitted_step: int, num_hit_rows: int = 0
    ) -> dict[str, torch.Tensor]:
        """A request's first `num_rows` rows in token order: one indexed copy per output.

        An output discovered at or after the step that admitted the request may lack rows for
        its prefix (hits were checked before the name existed): it is left out and counted.
        """
        self.hit_rows += num_hit_rows
        self.synchronize()
        # Whole blocks are gathered (block_size rows per index) and the tail trimmed.
        block_index = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        gathered = {}
        for name, cache in self.caches.items():
            if self.discovered_step[name] >= admitted_step:
                self.num_incomplete += 1
                logger.warning("output %r was discovered after the request started: left out", name)
                continue
            rows = cache.view(self.num_blocks, -1).index_select(0, block_index)
            gathered[name] = rows.view(-1, *cache.shape[2:])[:num_rows].cpu()
        return gathered

    def rows(
        self, block_ids: list[int], start: int, end: int, *, writes_in_flight: int = 0
    ) -> dict[str, torch.Tensor]:
        """Rows [start, end) of a request (its block table) for every cached output: a
        streaming consumer's next rows, written by forwards before the last writes_in_flight."""
        self.synchronize(writes_in_flight)
        positions = np.arange(start, end)
        table = np.asarray(block_ids, dtype=np.int64)
        slots = table[positions // self.block_size] * self.block_size + positions % self.block_size
        index = torch.from_numpy(slots).to(self.device)
        return {name: flat.index_select(0, index).cpu() for name, flat in self._flat.items()}

    def stats(self) -> dict[str, int]:
        return {
            "output_hit_rows": self.hit_rows,
            "output_pending_hit_blocks": self.pending_hit_blocks,
            "outputs_left_out": self.num_incomplete,
            "output_cache_bytes": self.num_bytes,
        }
