"""ReplicaRouting: which replica of a stage takes a new request (runtime.replica_routing).

cache_aware (default): a request goes to the replica whose prefix cache most likely holds its
prefix. Each replica remembers (LRU, `MAX_REMEMBERED` entries) the chained hashes of the first
`AFFINITY_BLOCKS` full blocks (of `block_size` tokens, the cache salt in the first) of the prompts
it was sent; a new request goes to the replica that saw the longest run of its leading block
hashes, the least-loaded of those on a tie. Two exceptions keep the load even:
- that replica is much busier than the least-loaded one: more requests in flight by over
  `max(IMBALANCE_ABS, IMBALANCE_REL x the least-loaded one's)`; the least-loaded one takes it;
- no replica saw its first block (or its prompt has no full block): the least-loaded one.
A replica's memory is only a guess at its cache (it may have evicted the blocks since): a wrong
guess costs a prefix recompute, never a wrong result.

least_loaded: the replica with the fewest requests in flight (lowest index on a tie).
round_robin: in turn, skipping replicas that are down.

Torch-free and single-threaded: the backend calls it under its lock.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Sequence

import xxhash

AFFINITY_BLOCKS = 32  # leading full blocks hashed per prompt (512 tokens at block size 16)
IMBALANCE_ABS = 4  # in-flight requests the affinity replica may have above the least-loaded
IMBALANCE_REL = 0.5  # ... or this fraction of the least-loaded's, whichever is more
MAX_REMEMBERED = 200_000  # block hashes each replica remembers (LRU)


def prefix_hashes(
    token_ids: Sequence[int], salt: str | None, block_size: int, max_blocks: int = AFFINITY_BLOCKS
) -> list[int]:
    """Chained 64-bit hashes of the first full blocks (each covers all blocks before it); the
    salt goes into the first, so requests with different salts never share a hash."""
    hashes: list[int] = []
    parent = xxhash.xxh3_64_intdigest((salt or "").encode())
    for start in range(0, min(len(token_ids) // block_size, max_blocks) * block_size, block_size):
        block = struct.pack(f"<Q{block_size}q", parent, *token_ids[start : start + block_size])
        parent = xxhash.xxh3_64_intdigest(block)
        hashes.append(parent)
    return hashes


class ReplicaRouting:
    def __init__(self, num_replicas: int, policy: str, block_size: int) -> None:
        self.num_replicas = num_replicas
        self.policy = policy
        self.block_size = block_size
        self._seen: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_replicas)]
        self._next = 0  # round_robin's turn

    def pick(
        self, token_ids: Sequence[int], salt: str | None, loads: Sequence[int], up: Sequence[bool]
    ) -> int:
        """The replica for a new request, among those up (at least one is): loads are each
        replica's requests in flight."""
        live = [i for i in range(self.num_replicas) if up[i]]
        assert live, "no replica is up"
        least = min(live, key=lambda i: (loads[i], i))
        if self.policy == "round_robin":
            turn = next(
                i for k in range(self.num_replicas) if up[i := (self._next + k) % self.num_replicas]
            )
            self._next = (turn + 1) % self.num_replicas
            return turn
        if self.policy == "least_loaded" or self.num_replicas == 1:
            return least
        hashes = prefix_hashes(token_ids, salt, self.block_size)
        chosen = least
        matches = {i: self._matched(i, hashes) for i in live}
        best = max(matches.values(), default=0)
        if best > 0:
            affine = min((i for i in live if matches[i] == best), key=lambda i: (loads[i], i))
            if loads[affine] - loads[least] <= max(IMBALANCE_ABS, IMBALANCE_REL * loads[least]):
                chosen = affine
        self._remember(chosen, hashes)
        return chosen

    def forget(self, replica: int) -> None:
        """A replica restarted with empty caches: it holds no prefix any more."""
        self._seen[replica].clear()

    def _matched(self, replica: int, hashes: list[int]) -> int:
        seen = self._seen[replica]
        num = 0
        for h in hashes:  # chained: a block can only be cached after the ones before it
            if h not in seen:
                break
            num += 1
        return num

    def _remember(self, replica: int, hashes: list[int]) -> None:
        seen = self._seen[replica]
        for h in hashes:
            seen[h] = None
            seen.move_to_end(h)
        while len(seen) > MAX_REMEMBERED:
            seen.popitem(last=False)
