"""RowArena: many keys' growing row sequences in one device buffer.

An adapter whose inputs are per-request rows (the talker's thinker-side rows) keeps them here,
so that a step reads any rows of any requests with ONE index_select over one buffer, instead of
slicing each request's own tensor and concatenating the pieces (launches per request).

Layout: row 0 is all zeros (an index of 0 reads a zero row); each key owns a contiguous segment
[start, start + capacity) of which its first `length` rows are written. An append that does not
fit moves the key's rows to a new segment of at least twice the capacity at the end of the
buffer; when the buffer has no room at its end, it is rebuilt holding only the live segments,
with as much room again. So appending n rows one by one costs O(n) copied rows in all (not the
O(n^2) of re-concatenating a request's whole tensor per append), and a segment's start can change
at any append or add: read it (`start`) when building a step's indices, after the appends.

Rows written from the host go over with non_blocking copies from pinned memory on a GPU (never a
blocking copy). Not thread-safe: one stage thread uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_ROWS = 64


@dataclass
class _Segment:
    start: int
    length: int
    capacity: int


class RowArena:
    def __init__(self, width: int, dtype: torch.dtype, device: torch.device) -> None:
        self.rows = torch.zeros(MIN_ROWS, width, dtype=dtype, device=device)
        self._end = 1  # row 0 stays zero
        self._segments: dict[str, _Segment] = {}

    def add(self, key: str, rows: torch.Tensor, spare: int = 0) -> None:
        """A new key with these rows (any device and dtype) and room for `spare` more."""
        if key in self._segments:
            raise ValueError(f"row arena: key {key!r} is already present")
        capacity = max(rows.shape[0] + spare, 1)
        self._segments[key] = _Segment(self._allocate(capacity), 0, capacity)
        self.append(key, rows)

    def append(self, key: str, rows: torch.Tensor) -> None:
        segment = self._segments[key]
        num_rows = rows.shape[0]
        if segment.length + num_rows > segment.capacity:
            self._move(key, max(2 * segment.capacity, segment.length + num_rows))
        start = segment.start + segment.length
        self._write(start, rows)
        segment.length += num_rows

    def start(self, key: str) -> int:
        """Buffer row of the key's first row (valid until the next add or append)."""
        return self._segments[key].start

    def length(self, key: str) -> int:
        return self._segments[key].length

    def release(self, key: str) -> None:
        self._segments.pop(key, None)

    def __contains__(self, key: str) -> bool:
        return key in self._segments

    @property
    def num_live_rows(self) -> int:
        """Rows held for live keys (capacity included)."""
        return sum(segment.capacity for segment in self._segments.values())

    # ---- internals -----------------------------------------------------------------------------
    def _write(self, start: int, rows: torch.Tensor) -> None:
        if rows.shape[0] == 0:
            return
        source = rows.detach().to(dtype=self.rows.dtype)
        if source.device.type == "cpu" and self.rows.device.type == "cuda":
            source = source.pin_memory()  # then the copy below does not block the host
        self.rows[start : start + rows.shape[0]].copy_(source, non_blocking=True)

    def _allocate(self, capacity: int) -> int:
        if self._end + capacity > self.rows.shape[0]:
            self._compact(capacity)
        start = self._end
        self._end += capacity
        return start

    def _move(self, key: str, capacity: int) -> None:
        """Give the key a segment of `capacity` rows, its written rows copied there."""
        start = self._allocate(capacity)  # may compact, which moves the key's segment too
        segment = self._segments[key]
        old = self.rows[segment.start : segment.start + segment.length]
        self.rows[start : start + segment.length].copy_(old)  # a new segment: no overlap
        segment.start, segment.capacity = start, capacity

    def _compact(self, extra: int) -> None:
        """Rebuild the buffer with only the live segments, packed, and room for `extra` rows
        and as much again as is live."""
        needed = 1 + self.num_live_rows + extra
        rows = self.rows.new_zeros(max(MIN_ROWS, 2 * needed), self.rows.shape[1])
        end = 1
        for segment in self._segments.values():
            length = segment.length
            rows[end : end + length].copy_(self.rows[segment.start : segment.start + length])
            segment.start = end
            end += segment.capacity
        self.rows, self._end = rows, end
