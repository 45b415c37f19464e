"""Multimodal encoder outputs by item identifier: a bounded LRU with hit/miss counters.

A prefix-cache hit may end inside an image's placeholder span; the rest of the span is then fed
and needs the image's embeddings again. Keeping each item's encoder output by its content hash
means the vision/audio tower runs once per distinct item while the entry lives, not once per
request or per chunk (the seed's "What About Multimodal Inputs?" section).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass
class EncoderCacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class EncoderCache:
    """identifier -> tensor [num_tokens, hidden], least recently used evicted first.

    Bounded by total bytes and by entry count; an entry larger than the byte budget on its own is
    not kept (the caller still uses the tensor it computed).
    """

    def __init__(self, max_bytes: int = 256 << 20, max_entries: int = 4096) -> None:
        if max_bytes < 0 or max_entries < 0:
            raise ValueError(
                f"max_bytes and max_entries must be >= 0, got {max_bytes}, {max_entries}"
            )
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.num_bytes = 0
        self.stats = EncoderCacheStats()
        self._entries: OrderedDict[str, torch.Tensor] = OrderedDict()

    def get(self, identifier: str) -> torch.Tensor | None:
        tensor = self._entries.get(identifier)
        if tensor is None:
            self.stats.misses += 1
            return None
        self._entries.move_to_end(identifier)
        self.stats.hits += 1
        return tensor

    def put(self, identifier: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if size > self.max_bytes or self.max_entries == 0:
            return
        old = self._entries.pop(identifier, None)
        if old is not None:
            self.num_bytes -= old.numel() * old.element_size()
        while self._entries and (
            self.num_bytes + size > self.max_bytes or len(self._entries) >= self.max_entries
        ):
            _, evicted = self._entries.popitem(last=False)
            self.num_bytes -= evicted.numel() * evicted.element_size()
            self.stats.evictions += 1
        self._entries[identifier] = tensor
        self.num_bytes += size

    def __contains__(self, identifier: str) -> bool:
        return identifier in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.num_bytes = 0
