"""The KV cache manager: prefix lookup, atomic slot allocation, free, and statistics.

Semantics follow vLLM v1's prefix-caching design (shared/seeds/001_*.txt), plus exact matching:
a hit is verified against the block's stored content and parent, so collisions only miss.
"""

from __future__ import annotations

from omni.core.block_hash import block_extra_keys, get_hash_function, hash_request_blocks
from omni.core.block_pool import Block, BlockPool
from omni.core.prefix_cache_stats import PrefixCacheStats
from omni.core.request import Request


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_caching: bool = True,
        hash_algo: str = "xxhash",
    ) -> None:
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        get_hash_function(hash_algo)  # validates the name
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.hash_algo = hash_algo
        self.pool = BlockPool(num_blocks)
        self.stats = PrefixCacheStats()
        self._req_blocks: dict[str, list[Block]] = {}
        # How many leading blocks of each request are already cached (hashed) by us.
        self._num_cached_blocks: dict[str, int] = {}

    # ---- lookup -------------------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """(hit block ids, hit tokens) for the longest verified cached prefix; mutates no state.

        At most (num_tokens - 1) // block_size blocks, so at least one token is recomputed and
        there is always a position to sample from.
        """
        if not self.enable_caching:
            return [], 0
        hashes = hash_request_blocks(request, self.block_size, self.hash_algo)
        max_blocks = min(len(hashes), (request.num_tokens - 1) // self.block_size)
        extras = None
        if request.has_block_extras:
            extras = [block_extra_keys(request, i, self.block_size) for i in range(max_blocks)]
        hits = self.pool.longest_prefix(hashes, request.block_token_bytes, extras, max_blocks)
        hit_ids = [block.block_id for block in hits]
        return hit_ids, len(hit_ids) * self.block_size

    # ---- allocation ---------------------------------------------------------------------------
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: list[int] | None = None,
    ) -> list[int] | None:
        """Make room for `num_new_tokens` more tokens; None (and no change at all) if it can't.

        Returns only the newly allocated block ids. Touches the hit blocks, pops new ones from the
        free queue head (evicting cached ones), and caches every block full of known tokens at
        once, so that a request scheduled later in the same step can already hit it.
        """
        if not num_new_computed_tokens and not new_computed_blocks and num_new_tokens >= 0:
            # A running request's next tokens (a decode step): its blocks usually hold them.
            req_blocks = self._req_blocks.get(request.request_id)
            if req_blocks is not None:
                num_total_tokens = request.num_computed_tokens + num_new_tokens
                if num_total_tokens <= len(req_blocks) * self.block_size:
                    num_known = min(num_total_tokens, request.num_known_tokens)
                    num_cached = self._num_cached_blocks[request.request_id]
                    if self.enable_caching and num_known // self.block_size > num_cached:
                        self._cache_full_blocks(request, req_blocks, num_known)
                    return []
        if num_new_tokens < 0 or num_new_computed_tokens < 0:
            raise ValueError(
                f"num_new_tokens={num_new_tokens} and num_new_computed_tokens="
                f"{num_new_computed_tokens} must be >= 0"
            )
        hit_blocks = [self.pool.blocks[i] for i in new_computed_blocks or ()]
        if len(hit_blocks) * self.block_size != num_new_computed_tokens:
            raise ValueError(
                f"{len(hit_blocks)} computed blocks do not hold {num_new_computed_tokens} tokens"
            )
        request_id = request.request_id
        is_new = request_id not in self._req_blocks
        req_blocks = self._req_blocks.get(request_id, [])
        num_total_tokens = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        num_required = -(-num_total_tokens // self.block_size)
        num_new_blocks = max(0, num_required - len(req_blocks) - len(hit_blocks))
        # Hits nobody holds are still in the free queue: touching them uses up that capacity.
        num_free_hits = sum(1 for block in hit_blocks if block.ref_cnt == 0)
        if num_new_blocks > self.pool.num_free_blocks - num_free_hits:
            return None

        if is_new:
            self._req_blocks[request_id] = req_blocks
            self._num_cached_blocks[request_id] = 0
            if self.enable_caching and request.num_preemptions == 0:
                # A resumed request hitting its own blocks is not a new query.
                self.stats.record(request.num_tokens, num_new_computed_tokens)
        self.pool.touch(hit_blocks)
        req_blocks.extend(hit_blocks)
        if hit_blocks:
            self._num_cached_blocks[request_id] = len(req_blocks)
        new_blocks = self.pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        if self.enable_caching:
            num_known = min(num_total_tokens, request.num_known_tokens)
            self._cache_full_blocks(request, req_blocks, num_known)
        return [block.block_id for block in new_blocks]

    def _cache_full_blocks(
        self, request: Request, req_blocks: list[Block], num_tokens: int
    ) -> None:
        num_cached = self._num_cached_blocks[request.request_id]
        num_full = num_tokens // self.block_size
        if num_full <= num_cached:
            return
        hashes = hash_request_blocks(request, self.block_size, self.hash_algo)
        token_bytes = request.block_token_bytes
        size = self.block_size
        cache_block = self.pool.cache_block
        parent = req_blocks[num_cached - 1] if num_cached else None
        for index in range(num_cached, num_full):
            block = req_blocks[index]
            if block.block_hash is None:
                extras = block_extra_keys(request, index, size) if request.has_block_extras else ()
                cache_block(block, hashes[index], token_bytes[index], extras, parent)
            parent = block
        self._num_cached_blocks[request.request_id] = num_full

    def free(self, request: Request) -> None:
        """Release the request's blocks, last block first: it is the least likely to be reused."""
        blocks = self._req_blocks.pop(request.request_id, None)
        self._num_cached_blocks.pop(request.request_id, None)
        if blocks:
            self.pool.free_blocks(blocks[::-1])

    def uncache_block(self, block_id: int) -> None:
        """Take a block out of the hash map (its content stays valid for requests holding it).

        Used when a cached block cannot serve a hit (e.g. its output rows are stale), so that a
        fresh duplicate cached later becomes the one lookups find."""
        self.pool.uncache(self.pool.blocks[block_id])

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash; refused (False) while any request holds blocks."""
        return self.pool.reset_prefix_cache()

    # ---- inspection ---------------------------------------------------------------------------
    def get_block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self._req_blocks.get(request_id, ())]

    def num_blocks_held(self, request_id: str) -> int:
        return len(self._req_blocks.get(request_id, ()))

    def free_block_ids(self) -> list[int]:
        return [block.block_id for block in self.pool.free_queue]

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def block_ref_cnt(self, block_id: int) -> int:
        return self.pool.blocks[block_id].ref_cnt

    def block_hash(self, block_id: int) -> object | None:
        return self.pool.blocks[block_id].block_hash

    def block_version(self, block_id: int) -> int:
        """Grows each time the block loses its content; (block_id, version) names one content."""
        return self.pool.blocks[block_id].version

    def cached_block_ids(self) -> list[int]:
        return sorted(b.block_id for blocks in self.pool.cached.values() for b in blocks.values())
