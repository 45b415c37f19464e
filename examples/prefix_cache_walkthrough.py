"""Replays the worked example of vLLM's prefix-caching design on omni's real KVCacheManager.

10 blocks of size 4. Request 0 has a 14-token prompt and decodes; request 1 shares its first 11
tokens; both finish; request 2 (32 tokens sharing request 0's 14-token prompt but not its two
generated tokens) hits blocks 0, 1, 2 and evicts cached block 3.

(The seed says request 2 has 33 tokens sharing the first 16; that needs 9 blocks, not the 8 it
lists. The reading above is the one in which its figures add up.)
"""

from __future__ import annotations

from dataclasses import dataclass

from omni.core import KVCacheManager, Request


@dataclass
class Snapshot:
    time: int
    event: str
    block_tables: dict[str, list[int]]
    cached_block_ids: list[int]
    free_queue: list[int]
    block_contents: dict[int, list[int] | None]  # block id -> the token ids it caches


def replay() -> list[Snapshot]:
    manager = KVCacheManager(num_blocks=10, block_size=4)
    prompt0 = list(range(100, 114))  # 14 tokens
    prompt1 = prompt0[:11] + [201, 202, 203]  # shares the first 11
    req0 = Request("req0", prompt0)
    req1 = Request("req1", prompt1)
    snapshots: list[Snapshot] = []

    def snap(time: int, event: str, *requests: Request) -> None:
        tables = {r.request_id: manager.get_block_ids(r.request_id) for r in requests}
        snapshots.append(
            Snapshot(
                time,
                event,
                tables,
                manager.cached_block_ids(),
                manager.free_block_ids(),
                contents(),
            )
        )

    def contents() -> dict[int, list[int] | None]:
        return {block.block_id: block.token_ids for block in manager.pool.blocks}

    def schedule(request: Request, num_new_tokens: int) -> None:
        hit_ids, num_hit_tokens = ([], 0)
        if request.num_computed_tokens == 0:
            hit_ids, num_hit_tokens = manager.get_computed_blocks(request)
        new_ids = manager.allocate_slots(
            request, num_new_tokens - num_hit_tokens, num_hit_tokens, hit_ids
        )
        assert new_ids is not None, "the pool is large enough for the whole example"
        request.num_computed_tokens += num_new_tokens

    def decode(request: Request, token_id: int) -> None:
        request.append_output_token_ids(token_id)
        schedule(request, 1)

    schedule(req0, 14)
    snap(1, "request 0 prefills 14 tokens: 3 full blocks cached, block 3 holds 2 tokens", req0)
    request_outputs = iter([114, 115, 116])
    decode(req0, next(request_outputs))
    decode(req0, next(request_outputs))
    snap(2, "request 0 decodes two tokens: block 3 becomes full and is cached", req0)
    decode(req0, next(request_outputs))
    snap(3, "request 0 needs a slot for its next token: block 4 is allocated", req0)
    schedule(req1, 14)
    snap(4, "request 1 (14 tokens, first 11 shared) hits blocks 0 and 1 only", req0, req1)
    manager.free(req0)
    snap(5, "request 0 finishes: blocks 4, 3, 2 join the free queue (reverse order)", req1)
    manager.free(req1)
    snap(6, "request 1 finishes: blocks 6, 5, 1, 0 join the free queue")
    req2 = Request("req2", prompt0 + list(range(300, 318)))  # 32 tokens
    queue_before = manager.free_block_ids()
    hit_ids, num_hit_tokens = manager.get_computed_blocks(req2)
    snapshots.append(
        Snapshot(
            7,
            f"request 2 looks up: hits {hit_ids}",
            {},
            manager.cached_block_ids(),
            queue_before,
            contents(),
        )
    )
    manager.allocate_slots(req2, req2.num_tokens - num_hit_tokens, num_hit_tokens, hit_ids)
    req2.num_computed_tokens = req2.num_tokens
    snap(7, "request 2 allocated: hits touched, then new blocks popped from the head", req2)
    return snapshots


def main() -> None:
    print("omni prefix-cache walkthrough: 10 blocks of size 4 (vLLM design doc example)\n")
    for s in replay():
        print(f"time {s.time}: {s.event}")
        for request_id, block_ids in s.block_tables.items():
            print(f"    block table {request_id}: {block_ids}")
        print(f"    cached blocks: {s.cached_block_ids}")
        print(f"    free queue (head -> tail): {' - '.join(map(str, s.free_queue)) or '(empty)'}")
    print()


if __name__ == "__main__":
    main()
