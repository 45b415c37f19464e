"""BlockTables: every tracked request's KV block table as one row of a preallocated host array.

A request's table only grows while it runs (the scheduler appends a block when the request
crosses a block boundary; preemption drops the whole table, and the request comes back with a
fresh one), so it is written once per block, where it is kept, and never rebuilt from Python
lists per step: a step reads its requests' tables with one indexed copy (`gather`).

Rows are reused: a released table's row goes back to a free list (its owner, the model runner,
keeps which request has which row). The array grows (doubling)
when more requests or longer tables come than it was made for; `gather` reads only the columns
the step's longest table needs. Entries past a row's length are stale, never read: a reader
bounds each row by its sequence length. Host memory only (numpy); torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class BlockTables:
    def __init__(self, num_rows: int, num_columns: int) -> None:
        """num_rows: tables held at once (more grow the array); num_columns: blocks of the
        longest table expected (a longer one grows the array)."""
        if num_rows < 1 or num_columns < 1:
            raise ValueError(
                f"num_rows={num_rows} and num_columns={num_columns} must be integers >= 1"
            )
        self.table = np.zeros((num_rows, num_columns), dtype=np.int64)
        self.lengths = np.zeros(num_rows, dtype=np.int64)  # blocks in each row's table
        self._free_rows = list(range(num_rows - 1, -1, -1))  # popped from the end: row 0 first

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def add(self, block_ids: Sequence[int]) -> int:
        """A new table holding block_ids (a request admitted or resumed); returns its row."""
        if not self._free_rows:
            self._grow(rows=2 * self.table.shape[0])
        row = self._free_rows.pop()
        self.lengths[row] = 0
        self.append(row, block_ids)
        return row

    def append(self, row: int, block_ids: Sequence[int]) -> None:
        """block_ids at the end of the row's table (the blocks a step allocated)."""
        if not block_ids:
            return
        start = int(self.lengths[row])
        end = start + len(block_ids)
        if end > self.table.shape[1]:
            self._grow(columns=max(end, 2 * self.table.shape[1]))
        self.table[row, start:end] = block_ids
        self.lengths[row] = end

    def release(self, row: int) -> None:
        """The row's table is dropped (its request finished, was aborted or preempted)."""
        self._free_rows.append(row)

    def block_ids(self, row: int) -> list[int]:
        """The row's table as a list (for inspection; steps use gather)."""
        return self.table[row, : self.lengths[row]].tolist()

    def gather(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The tables of `rows`, in order, as [len(rows), width]: width is the longest of them
        (at least 1); entries past a row's length are stale. out: an array of at least that
        shape to write them into (a step's static buffer); its first len(rows) rows and width
        columns are returned."""
        width = max(int(self.lengths[rows].max()) if rows.size else 0, 1)
        tables = self.table[rows, :width]
        if out is None:
            return tables
        out[: rows.size, :width] = tables
        return out[: rows.size, :width]

    def _grow(self, *, rows: int = 0, columns: int = 0) -> None:
        num_rows, num_columns = self.table.shape
        table = np.zeros((max(rows, num_rows), max(columns, num_columns)), dtype=np.int64)
        table[:num_rows, :num_columns] = self.table
        lengths = np.zeros(table.shape[0], dtype=np.int64)
        lengths[:num_rows] = self.lengths
        self._free_rows[:0] = range(table.shape[0] - 1, num_rows - 1, -1)
        self.table, self.lengths = table, lengths
