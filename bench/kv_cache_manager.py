"""Replays a synthetic trace through KVCacheManager: lookup + allocate + free, hashing included.

Prints microseconds per request (median and best of --repeats runs) and per block for each hash
algorithm; "vs vLLM" compares the median with vLLM's lookup + allocate + free + sha256 hashing.
Reference (ENV-FACTS.md): vLLM 0.33.0's manager on these machines needs about 130 us per request
for lookup + allocate + free, plus 110-190 us to hash a request's 64 blocks with sha256.

    .venv/bin/python bench/kv_cache_manager.py [--num-requests 10000 --num-tokens 1024 ...]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from omni.core import KVCacheManager, Request
from omni.core.block_hash import hash_request_blocks

VLLM_US_PER_REQUEST = 130.0
VLLM_SHA256_HASH_US = (110.0, 190.0)


def make_trace(args: argparse.Namespace) -> list[list[int]]:
    rng = random.Random(args.seed)
    num_shared = int(args.num_tokens * args.shared_fraction)
    prompts = []
    prefix: list[int] = []
    for index in range(args.num_requests):
        if index % args.group_size == 0:
            prefix = [rng.randrange(args.vocab) for _ in range(num_shared)]
        suffix = [rng.randrange(args.vocab) for _ in range(args.num_tokens - num_shared)]
        prompts.append(prefix + suffix)
    return prompts


def replay(
    prompts: list[list[int]], args: argparse.Namespace, hash_algo: str
) -> tuple[float, float, float]:
    """Returns (total seconds, seconds spent hashing, hit rate)."""
    blocks_per_request = -(-args.num_tokens // args.block_size)
    manager = KVCacheManager(
        num_blocks=blocks_per_request * (args.max_running + 8),
        block_size=args.block_size,
        hash_algo=hash_algo,
    )
    requests = [Request(f"r{i}", p) for i, p in enumerate(prompts)]
    # The trace's 10 M token ids are input data, not engine state: keep the cyclic GC from
    # rescanning them on every collection (it made runs vary by +-15%).
    gc.collect()
    gc.freeze()
    running: list[Request] = []
    hash_seconds = 0.0
    start = time.perf_counter()
    for request in requests:
        t0 = time.perf_counter()
        hash_request_blocks(request, args.block_size, hash_algo)
        hash_seconds += time.perf_counter() - t0
        hit_ids, num_hits = manager.get_computed_blocks(request)
        new_ids = manager.allocate_slots(request, request.num_tokens - num_hits, num_hits, hit_ids)
        if new_ids is None:
            raise RuntimeError("the pool is sized to hold every running request")
        running.append(request)
        if len(running) > args.max_running:
            manager.free(running.pop(0))
    for request in running:
        manager.free(request)
    elapsed = time.perf_counter() - start
    gc.unfreeze()
    return elapsed, hash_seconds, manager.stats.hit_rate


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--num-tokens", type=int, default=1024)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--shared-fraction", type=float, default=0.5, help="prefix shared within a group"
    )
    parser.add_argument("--group-size", type=int, default=8, help="requests sharing one prefix")
    parser.add_argument(
        "--max-running", type=int, default=32, help="requests holding blocks at once"
    )
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    prompts = make_trace(args)
    blocks_per_request = args.num_tokens // args.block_size
    print(
        f"trace: {args.num_requests} requests x {args.num_tokens} tokens, block size {args.block_size}, "
        f"{args.shared_fraction:.0%} shared in groups of {args.group_size}, median of {args.repeats}"
    )
    header = (
        f"{'hash':>7} | {'us/request':>10} | {'best':>6} | {'us/block':>8} | {'hash us/req':>11} | "
        f"{'manager us/req':>14} | {'hit rate':>8} | {'vs vLLM':>7}"
    )
    print(header)
    print("-" * len(header))
    for algo in ("xxhash", "sha256"):
        runs = [replay(prompts, args, algo) for _ in range(args.repeats)]
        total = statistics.median(r[0] for r in runs) / args.num_requests * 1e6
        best = min(r[0] for r in runs) / args.num_requests * 1e6
        hashing = statistics.median(r[1] for r in runs) / args.num_requests * 1e6
        vllm = VLLM_US_PER_REQUEST + sum(VLLM_SHA256_HASH_US) / 2
        print(
            f"{algo:>7} | {total:>10.1f} | {best:>6.1f} | {total / blocks_per_request:>8.2f} | {hashing:>11.1f} | "
            f"{total - hashing:>14.1f} | {runs[0][2]:>8.1%} | {vllm / total:>6.2f}x"
        )
    print(
        f"vLLM reference: {VLLM_US_PER_REQUEST:.0f} us/request + {VLLM_SHA256_HASH_US[0]:.0f}-"
        f"{VLLM_SHA256_HASH_US[1]:.0f} us sha256 hashing = ~{vllm:.0f} us/request"
    )


if __name__ == "__main__":
    main()
