"""Rows of a GPU forward copied into a host cache without making the step wait: one
device-to-host copy per output and step into pinned staging, scattered on the host once landed
(omni/runtime/output_cache.py describes where this sits)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class StagedCopies:
    """A host cache fed by a GPU: each write is one device-to-host copy per output into a fresh
    pinned staging buffer, on a side CUDA stream ordered after the main stream's forward by an
    event; the staged rows are scattered into the cache on the host once that copy has landed
    (checked without waiting at the next write, waited for by `wait()`). Without a stream (a CPU
    source, in tests) the same staging and scatter run with plain copies."""

    def __init__(self, source_device: torch.device, pinned: bool) -> None:
        self.stream: Any = None
        if source_device.type == "cuda":
            self.stream = torch.cuda.Stream(device=source_device)
        self.source_device = source_device
        self.pinned = pinned
        # Staged writes, oldest first: (copy event or None, slots, [(flat cache, staged rows)]).
        # Scattered in order, so a later write of a slot wins.
        self._pending: list[tuple[Any, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]] = []

    def copy_rows(self, slots: np.ndarray, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """For each (flat cache, rows) pair: rows[i] -> flat[slots[i]], once the copy landed."""
        self._scatter(wait=False)
        index = torch.from_numpy(slots.copy())  # kept past the call: the caller may reuse slots
        staged = []
        if self.stream is None:
            for flat, rows in pairs:
                staged.append((flat, rows.detach().to(flat.dtype, copy=True)))
            self._pending.append((None, index, staged))
            return
        main = torch.cuda.current_stream(self.source_device)
        forward_done = torch.cuda.Event()
        forward_done.record(main)
        self.stream.wait_event(forward_done)
        with torch.cuda.stream(self.stream):
            for flat, rows in pairs:
                rows = rows.detach()
                rows.record_stream(self.stream)  # made on main, read here: keep it till done
                converted = rows.to(flat.dtype)  # on the side stream, allocated there
                host = torch.empty(converted.shape, dtype=flat.dtype, pin_memory=self.pinned)
                host.copy_(converted, non_blocking=True)
                staged.append((flat, host))
            done = torch.cuda.Event()
            done.record(self.stream)
        self._pending.append((done, index, staged))

    def _scatter(self, wait: bool, keep_last: int = 0) -> None:
        """Move staged rows into the cache, oldest first: all of them but the last keep_last
        writes (waiting for their copies) or, without waiting, those whose copies have landed."""
        while len(self._pending) > keep_last:
            done, slots, staged = self._pending[0]
            if done is not None:
                if wait:
                    done.synchronize()
                elif not done.query():
                    return
            # A cache allocated during the warm-up forward is an inference tensor, and reads
            # (gather at a request's end) run outside inference mode: the in-place scatter
            # must be inside it, wherever it is called from.
            with torch.inference_mode():
                for flat, host in staged:
                    flat.index_copy_(0, slots, host)
            self._pending.pop(0)

    def wait_on_device(self) -> None:
        """The source device's current stream waits (no host sync) until the last copy read its
        rows: for sources that are overwritten in place (a CUDA graph's static outputs)."""
        done = self._pending[-1][0] if self._pending else None
        if done is not None:  # events complete in stream order: the last covers the others
            torch.cuda.current_stream(self.source_device).wait_event(done)

    def wait(self, keep_last: int = 0) -> None:
        """Every staged write but the last keep_last (a step still in flight) in the cache."""
        self._scatter(wait=True, keep_last=keep_last)
