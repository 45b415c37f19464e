"""The block pool: every KV block preallocated, an O(1) free queue, and the hash -> block map.

Invariants (checked by tests/unit/test_block_pool_properties.py after every operation):
- a block is free (ref_cnt 0, in the free queue exactly once) or referenced (not in the queue);
- a block has a hash exactly when it is in the hash map;
- `version` grows whenever a block is handed out again or the cache is reset, so
  (block_id, version) names one content forever. Output caches and parent links rely on that.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from omni.core.block_hash import BlockHash, ExtraKeys


class Block:
    __slots__ = (
        "block_id",
        "ref_cnt",
        "block_hash",
        "token_bytes",
        "extra_keys",
        "parent",
        "parent_version",
        "version",
        "prev_free",
        "next_free",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None
        # Exact content of a cached block (token ids as little-endian uint32), for verifying
        # hits beyond the hash value.
        self.token_bytes: bytes | None = None
        self.extra_keys: ExtraKeys = ()
        self.parent: Block | None = None
        self.parent_version = 0
        self.version = 0
        self.prev_free: Block | None = None
        self.next_free: Block | None = None

    @property
    def token_ids(self) -> list[int] | None:
        """The cached content as token ids (None when the block is not cached)."""
        if self.token_bytes is None:
            return None
        return list(struct.unpack(f"<{len(self.token_bytes) // 4}I", self.token_bytes))

    def __repr__(self) -> str:
        return (
            f"Block({self.block_id}, ref_cnt={self.ref_cnt}, cached={self.block_hash is not None})"
        )


class FreeBlockQueue:
    """Doubly linked list threaded through the blocks, with sentinels: O(1) everywhere."""

    def __init__(self, blocks: list[Block]) -> None:
        self._head = Block(-1)
        self._tail = Block(-2)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> Block:
        return self.popleft_n(1)[0]

    def popleft_n(self, num_blocks: int) -> list[Block]:
        """Unlink the first `num_blocks` blocks in one splice."""
        if num_blocks > self.num_free_blocks:
            raise RuntimeError(
                f"free queue holds {self.num_free_blocks} blocks, asked for {num_blocks}: "
                "allocation was not checked against capacity"
            )
        if num_blocks == 0:
            return []
        popped = []
        block = self._head.next_free
        for _ in range(num_blocks):
            # A queued block is always linked on both sides (the tail sentinel ends the chain).
            assert block is not None
            popped.append(block)
            block = block.next_free
            popped[-1].prev_free = popped[-1].next_free = None
        assert block is not None
        self._head.next_free = block
        block.prev_free = self._head
        self.num_free_blocks -= num_blocks
        return popped

    def append(self, block: Block) -> None:
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def extend(self, blocks: list[Block]) -> None:
        """Append blocks in order, linked as one chain."""
        if not blocks:
            return
        last = self._tail.prev_free
        assert last is not None
        for block in blocks:
            last.next_free = block
            block.prev_free = last
            last = block
        last.next_free = self._tail
        self._tail.prev_free = last
        self.num_free_blocks += len(blocks)

    def remove(self, block: Block) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise RuntimeError(f"block {block.block_id} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def __iter__(self) -> Iterator[Block]:
        block = self._head.next_free
        while block is not self._tail:
            assert block is not None
            yield block
            block = block.next_free

    def __len__(self) -> int:
        return self.num_free_blocks


class BlockPool:
    """Owns all block ids. Eviction is lazy: a freed cached block keeps its hash until reused."""

    def __init__(self, num_blocks: int) -> None:
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        # hash -> {block_id: block}; dicts keep insertion order, so the first is the oldest copy.
        self.cached: dict[BlockHash, dict[int, Block]] = {}
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    def longest_prefix(
        self,
        hashes: list[BlockHash],
        token_bytes: list[bytes],
        extra_keys: list[ExtraKeys] | None,
        max_blocks: int,
    ) -> list[Block]:
        """The cached blocks holding exactly a chain's first blocks, stopping at the first miss.

        A candidate must match the hash, the content, the extra keys and its parent's identity
        (block and version), so even a full hash collision can only produce a miss, never
        another prefix's KV. Duplicates are allowed; the first inserted wins.
        """
        hits: list[Block] = []
        parent = None
        cached = self.cached
        for index in range(min(max_blocks, len(hashes))):
            candidates = cached.get(hashes[index])
            if not candidates:
                break
            content = token_bytes[index]
            extras = extra_keys[index] if extra_keys is not None else ()
            for block in candidates.values():
                if (
                    block.parent is parent
                    and (parent is None or block.parent_version == parent.version)
                    and block.token_bytes == content
                    and block.extra_keys == extras
                ):
                    break
            else:
                break
            hits.append(block)
            parent = block
        return hits

    def cache_block(
        self,
        block: Block,
        block_hash: BlockHash,
        token_bytes: bytes,
        extra_keys: ExtraKeys,
        parent: Block | None,
    ) -> None:
        if block.block_hash is not None:
            raise RuntimeError(f"block {block.block_id} is already cached")
        block.block_hash = block_hash
        block.token_bytes = token_bytes
        block.extra_keys = extra_keys
        block.parent = parent
        block.parent_version = parent.version if parent is not None else 0
        same_hash = self.cached.get(block_hash)
        if same_hash is None:
            self.cached[block_hash] = {block.block_id: block}
        else:
            same_hash[block.block_id] = block

    def touch(self, blocks: list[Block]) -> None:
        """Take a reference on hit blocks; a block nobody held leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def get_new_blocks(self, num_blocks: int) -> list[Block]:
        new_blocks = self.free_queue.popleft_n(num_blocks)
        for block in new_blocks:
            if block.block_hash is not None:  # lazy eviction happens here
                self._unmap(block)
                self.num_evictions += 1
            block.version += 1
            block.ref_cnt = 1
        return new_blocks

    def free_blocks(self, ordered_blocks: list[Block]) -> None:
        """Drop one reference each; blocks reaching 0 join the tail in the given order."""
        released = []
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                released.append(block)
        self.free_queue.extend(released)

    def uncache(self, block: Block) -> None:
        """Out of the hash map; holders keep the block and its content (same version)."""
        if block.block_hash is not None:
            self._unmap(block)

    def _unmap(self, block: Block) -> None:
        block_hash = block.block_hash
        assert block_hash is not None, "callers unmap cached blocks only"
        same_hash = self.cached[block_hash]
        del same_hash[block.block_id]
        if not same_hash:
            del self.cached[block_hash]
        block.block_hash = None
        block.token_bytes = None
        block.extra_keys = ()
        block.parent = None

    def reset_prefix_cache(self) -> bool:
        if self.num_free_blocks != len(self.blocks):
            return False
        for block in self.blocks:
            if block.block_hash is not None:
                self._unmap(block)
                block.version += 1
        return True
